//! Reading a sealed block, and decoding it when its sub-file is missing or
//! its checksum fails (paper 001, section 3.2): a redundant block is read
//! from its source block (content-defined chunking: from its chunks'
//! sources); a unique block is decoded from its virtual stripe (the blocks
//! at its position in every member of its group, found through the map,
//! and the group's parity at that position), with any missing member that
//! is redundant taken from its own source first. In the compact layout a
//! redundant block is not stored: it is always read through its sources,
//! and a stripe's member past its unique blocks is zeros.
//!
//! Invariants: every block handed back matches the CRC-32C its map
//! recorded at seal time, or the call fails with `DataLoss`; recursion
//! through sources is bounded by [`SOURCE_DEPTH_MAX`].

use super::map::{BatchMap, BlockAddress, ChunkSource, ContainerMap};
use super::{parity_name, sub_file_name, ArchiveStore};
use ecdedup_core::error::{Error, Result};

/// Sources followed in a row before a block is given up as lost (a source
/// is a unique block, so one hop is what a healthy map needs; the bound
/// stops cycles through stripes that are themselves being decoded).
const SOURCE_DEPTH_MAX: u32 = 4;

impl ArchiveStore {
    fn sealed_map(&self, container: u32) -> Result<&BatchMap> {
        self.container_batch
            .get(&container)
            .map(|b| &self.batches[b])
            .ok_or_else(|| Error::Corrupt(format!("container {container} is not sealed")))
    }

    /// The bytes of a sealed block, decoded when needed.
    pub(super) fn read_block(&self, a: BlockAddress) -> Result<Vec<u8>> {
        self.read_block_at_depth(a, 0)
    }

    fn read_block_at_depth(&self, a: BlockAddress, depth: u32) -> Result<Vec<u8>> {
        if let Some(bytes) = self.read_block_raw(a)? {
            return Ok(bytes);
        }
        self.recover_block(a, depth)
    }

    /// Fills `buf` from byte `offset` of one sealed sub-file. The whole
    /// blocks it covers are read from the device in one request straight
    /// into `buf` and each is checked against its CRC-32C; a block that is
    /// missing or fails, and a partial block at either end, is read (and
    /// decoded) on its own by [`Self::read_block`]. Same bytes as reading
    /// block by block, one request per span instead of one per block.
    pub(super) fn read_span(
        &self,
        container: u32,
        sub_file: u8,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let block = self.config.block_bytes as u64;
        let map = self.sealed_map(container)?;
        let c = map.container(container).expect("indexed");
        let sub = c.sub_files.get(sub_file as usize).ok_or_else(|| {
            Error::Corrupt(format!("container {container} has no sub-file {sub_file}"))
        })?;
        if offset + buf.len() as u64 > sub.blocks.len() as u64 * block {
            return Err(Error::Corrupt(format!(
                "read past sub-file {sub_file} of container {container}"
            )));
        }
        let address = |at: u64| BlockAddress {
            container,
            sub_file,
            column: (at / block) as u32,
        };
        let head = (((block - offset % block) % block) as usize).min(buf.len());
        let (head_buf, rest) = buf.split_at_mut(head);
        let whole_bytes = rest.len() / block as usize * block as usize;
        let (whole_buf, tail_buf) = rest.split_at_mut(whole_bytes);
        if !head_buf.is_empty() {
            let bytes = self.read_block(address(offset))?;
            let within = (offset % block) as usize;
            head_buf.copy_from_slice(&bytes[within..within + head_buf.len()]);
        }
        let whole_at = offset + head as u64;
        if !whole_buf.is_empty() {
            let path = self
                .device_dir(sub.device as usize)
                .join(sub_file_name(container, sub_file));
            let read = self.disk.read_at(&path, whole_at, whole_buf)?;
            for (i, stored) in whole_buf.chunks_mut(block as usize).enumerate() {
                let a = address(whole_at + i as u64 * block);
                if !read || ecdedup_core::codec::crc32c(stored) != sub.blocks[a.column as usize].crc
                {
                    stored.copy_from_slice(&self.read_block(a)?);
                }
            }
        }
        if !tail_buf.is_empty() {
            let bytes = self.read_block(address(whole_at + whole_bytes as u64))?;
            tail_buf.copy_from_slice(&bytes[..tail_buf.len()]);
        }
        Ok(())
    }

    /// The block as stored, or None when missing or failing its checksum.
    pub(super) fn read_block_raw(&self, a: BlockAddress) -> Result<Option<Vec<u8>>> {
        let map = self.sealed_map(a.container)?;
        let c = map.container(a.container).expect("indexed");
        let sub = c
            .sub_files
            .get(a.sub_file as usize)
            .ok_or_else(|| Error::Corrupt(format!("block address {a:?} names no sub-file")))?;
        let entry = sub
            .blocks
            .get(a.column as usize)
            .ok_or_else(|| Error::Corrupt(format!("block address {a:?} names no column")))?;
        let layout = self.config.layout;
        if !sub.stored(layout, a.column) {
            return Ok(None);
        }
        let block = self.config.block_bytes;
        let path = self
            .device_dir(sub.device as usize)
            .join(sub_file_name(a.container, a.sub_file));
        let mut bytes = vec![0u8; block as usize];
        let offset = sub.stored_offset(layout, a.column, block);
        let read = self.disk.read_at(&path, offset, &mut bytes)?;
        Ok((read && ecdedup_core::codec::crc32c(&bytes) == entry.crc).then_some(bytes))
    }

    /// Fills `buf` with a sealed container's bytes from `offset` (in its
    /// data, sub-files concatenated), block by block.
    pub(super) fn read_sealed(
        &self,
        container: u32,
        offset: u64,
        buf: &mut [u8],
        depth: u32,
    ) -> Result<()> {
        let block = self.config.block_bytes as u64;
        let map = self.sealed_map(container)?;
        let c = map.container(container).expect("indexed container");
        let sub_file_bytes = c.blocks_per_sub_file as u64 * block;
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let address = BlockAddress {
                container,
                sub_file: (at / sub_file_bytes) as u8,
                column: ((at % sub_file_bytes) / block) as u32,
            };
            let bytes = self.read_block_at_depth(address, depth)?;
            let within = (at % block) as usize;
            let take = (block as usize - within).min(buf.len() - done);
            buf[done..done + take].copy_from_slice(&bytes[within..within + take]);
            done += take;
        }
        Ok(())
    }

    /// A redundant block's bytes from its source (fixed chunking) or its
    /// chunks' sources (content-defined), checked against its CRC-32C;
    /// None when it is not redundant or a source cannot be read.
    fn block_from_sources(&self, c: &ContainerMap, a: BlockAddress, depth: u32) -> Option<Vec<u8>> {
        let sub = &c.sub_files[a.sub_file as usize];
        let entry = sub.blocks[a.column as usize];
        if !entry.redundant {
            return None;
        }
        let bytes = match entry.source {
            Some(source) => self.read_block_at_depth(source, depth + 1).ok()?,
            None => {
                // Content-defined: every chunk touching the block is
                // redundant (checked at decode); padding past the data
                // bytes is zeros.
                let block = self.config.block_bytes as u64;
                let start =
                    (a.sub_file as u64 * c.blocks_per_sub_file as u64 + a.column as u64) * block;
                let end = (start + block).min(c.data_bytes);
                let mut bytes = vec![0u8; block as usize];
                let mut at = start;
                while at < end {
                    let i = c.chunk_at(at);
                    let chunk = c.chunks[i];
                    let chunk_end = c.chunk_starts[i + 1].min(end);
                    let source = chunk.source?;
                    let (src_container, src_start) =
                        self.chunk_source_start(source, chunk.length).ok()?;
                    let within = at - c.chunk_starts[i];
                    let out = &mut bytes[(at - start) as usize..(chunk_end - start) as usize];
                    self.read_sealed(src_container, src_start + within, out, depth + 1)
                        .ok()?;
                    at = chunk_end;
                }
                bytes
            }
        };
        (ecdedup_core::codec::crc32c(&bytes) == entry.crc).then_some(bytes)
    }

    /// Where a chunk's source starts (container, offset in its data),
    /// checking that it is a unique chunk of the same length.
    pub(super) fn chunk_source_start(
        &self,
        source: ChunkSource,
        length: u32,
    ) -> Result<(u32, u64)> {
        let map = self.sealed_map(source.container)?;
        let c = map.container(source.container).expect("indexed");
        match c.chunks.get(source.chunk as usize) {
            Some(chunk) if chunk.source.is_none() && chunk.length == length => {
                Ok((source.container, c.chunk_starts[source.chunk as usize]))
            }
            _ => Err(Error::Corrupt(format!(
                "chunk source {source:?} is not a unique chunk of {length} bytes"
            ))),
        }
    }

    /// Decodes a block whose stored copy is missing or corrupt.
    pub(super) fn recover_block(&self, a: BlockAddress, depth: u32) -> Result<Vec<u8>> {
        let lost = || Error::DataLoss(format!("block {a:?} cannot be recovered"));
        if depth > SOURCE_DEPTH_MAX {
            return Err(lost());
        }
        let map = self.sealed_map(a.container)?;
        let c = map.container(a.container).expect("indexed");
        let sub = &c.sub_files[a.sub_file as usize];
        let entry = sub.blocks[a.column as usize];
        if let Some(bytes) = self.block_from_sources(c, a, depth) {
            return Ok(bytes);
        }
        let group = &map.groups[sub.group as usize];
        if entry.position >= group.encoded {
            return Err(lost());
        }
        let shards = self.decode_stripe(map, sub.group as usize, entry.position, depth)?;
        let bytes = shards
            .into_iter()
            .nth(sub.member as usize)
            .expect("k shards");
        if ecdedup_core::codec::crc32c(&bytes) != entry.crc {
            return Err(lost());
        }
        Ok(bytes)
    }

    /// The k data blocks of virtual stripe `position` of group `g`.
    pub(super) fn decode_stripe(
        &self,
        map: &BatchMap,
        g: usize,
        position: u32,
        depth: u32,
    ) -> Result<Vec<Vec<u8>>> {
        let (k, m) = (self.config.k, self.config.m);
        let block = self.config.block_bytes as usize;
        let group = &map.groups[g];
        assert!(position < group.encoded, "only encoded stripes decode");
        let mut shards = vec![vec![0u8; block]; k + m];
        let mut present = vec![false; k + m];
        for (i, &(cid, j)) in group.members.iter().enumerate() {
            let c = map.container(cid).expect("decoded map");
            let sub = &c.sub_files[j as usize];
            let Some(column) = sub.stripe_column(map.layout, position) else {
                present[i] = true; // zeros past a shorter sub-file (or its unique blocks)
                continue;
            };
            let address = BlockAddress {
                container: cid,
                sub_file: j,
                column,
            };
            if let Some(bytes) = self.read_block_raw(address)? {
                shards[i] = bytes;
                present[i] = true;
            } else if let Some(bytes) = self.block_from_sources(c, address, depth) {
                shards[i] = bytes;
                present[i] = true;
            }
        }
        for i in 0..m {
            let path = self
                .device_dir(group.parity_devices[i] as usize)
                .join(parity_name(map.group_id(g), i));
            let shard = &mut shards[k + i];
            if self
                .disk
                .read_at(&path, position as u64 * block as u64, shard)?
                && ecdedup_core::codec::crc32c(shard)
                    == group.parity_crcs[i * group.encoded as usize + position as usize]
            {
                present[k + i] = true;
            }
        }
        let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|s| &mut s[..]).collect();
        self.codec.reconstruct(&mut refs, &present).map_err(|e| {
            Error::DataLoss(format!(
                "stripe {position} of group {} in batch {}: {e}",
                g, map.batch
            ))
        })?;
        shards.truncate(k);
        Ok(shards)
    }
}
