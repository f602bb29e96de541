//! Sealing a batch of containers: dedup before encoding, pseudo-shuffling,
//! sub-file exchange, encoding of the virtual stripes that hold a unique
//! block, and the durable write of sub-files, parity and map.
//!
//! A container's data (object bytes, zero-padded to a whole number of
//! stripes of k blocks) is cut into k contiguous sub-files of n blocks each;
//! block (j, l) is column l of sub-file j, at byte (j n + l) x block of the
//! container. Under fixed chunking a block is also the unit of dedup; under
//! content-defined chunking the container's data bytes are cut into FastCDC
//! chunks (chunking.rs), each chunk is unique or redundant, and a block is
//! unique when any of its bytes is in a unique chunk. The paper's layout
//! writes every block to its sub-file; the compact layout only the unique
//! ones, in virtual-position order. Order of durability: data sub-files and
//! parity files (each written to a temporary name, synced, renamed), then
//! the map (the commit: the batch is visible from then on), then the
//! staging files go.
//!
//! The fingerprint cache names a source by a [`BlockAddress`]: under
//! content-defined chunking its `column` is the source chunk's index in its
//! container (and `sub_file` 0).

use super::chunking::{self, Chunking};
use super::exchange::{self, SubFileCount};
use super::map::{
    self, BatchMap, BlockAddress, BlockEntry, ChunkEntry, ChunkSource, ContainerMap, GroupMap,
    SubFileMap,
};
use super::shuffle::pseudo_shuffle;
use super::{map_name, parity_name, sub_file_name, ArchiveStore, MAPS_DIR, STAGING_DIR};
use ecdedup_core::error::{Error, Result};
use ecdedup_core::fingerprint::Fingerprint;
use std::ops::Range;
use std::time::Instant;

fn elapsed_ns(since: Instant) -> u64 {
    since.elapsed().as_nanos().min(u64::MAX as u128) as u64
}

/// One container's bytes while it is sealed.
struct Staged {
    id: u32,
    data_bytes: u64,
    blocks_per_sub_file: usize,
    bytes: Vec<u8>,
    /// Content-defined chunks, once cut.
    chunks: Vec<Range<usize>>,
}

impl Staged {
    fn block(&self, sub_file: usize, column: usize, block_bytes: usize) -> &[u8] {
        let at = (sub_file * self.blocks_per_sub_file + column) * block_bytes;
        &self.bytes[at..at + block_bytes]
    }
}

impl ArchiveStore {
    /// Seals containers `ids` (staging files, in order) as one batch.
    pub(super) fn seal_batch(&mut self, ids: &[u32]) -> Result<()> {
        let k = self.config.k;
        let m = self.config.m;
        let block = self.config.block_bytes as usize;
        let device_count = self.config.devices.len();
        if let Some(&d) = self.missing_devices.first() {
            return Err(Error::Unavailable(format!(
                "archive device {d} is missing: `archive scrub --repair` restores it before sealing"
            )));
        }
        let mut staged = Vec::new();
        for &id in ids {
            let path = self.staging_path(id);
            let mut bytes = self.disk.read_all(&path)?.ok_or_else(|| {
                Error::Corrupt(format!("staging file {} is missing", path.display()))
            })?;
            let data_bytes = bytes.len() as u64;
            let n = bytes.len().div_ceil(k * block).max(1);
            bytes.resize(n * k * block, 0);
            staged.push(Staged {
                id,
                data_bytes,
                blocks_per_sub_file: n,
                bytes,
                chunks: Vec::new(),
            });
        }

        // Dedup before encoding: fingerprints, cache lookups, sources.
        let preprocess_start = Instant::now();
        let mut containers = Vec::new();
        // Progress in bytes, each phase from its total: the batch's
        // container bytes (dedup), the bytes of the stripes encoded
        // (encode), the sub-file and parity bytes (write).
        let dedup_total: u64 = staged.iter().map(|c| c.bytes.len() as u64).sum();
        let mut deduplicated = 0u64;
        self.report_progress("seal: dedup", 0, dedup_total);
        for ci in 0..staged.len() {
            self.timings.container_bytes += staged[ci].bytes.len() as u64;
            let container = match self.config.chunking {
                Chunking::Fixed => self.dedup_fixed(&staged, ci)?,
                cdc @ Chunking::Fastcdc { .. } => {
                    let c = &staged[ci];
                    staged[ci].chunks = chunking::cut(&cdc, &c.bytes[..c.data_bytes as usize]);
                    self.dedup_content_defined(&staged, ci)?
                }
            };
            containers.push(container);
            deduplicated += staged[ci].bytes.len() as u64;
            self.report_progress("seal: dedup", deduplicated, dedup_total);
        }

        // Procedure 2, then placement: group g's members and parity on
        // k + m distinct devices, rotated by the group's id.
        let counts: Vec<SubFileCount> = containers
            .iter()
            .enumerate()
            .flat_map(|(ci, c)| {
                c.sub_files
                    .iter()
                    .enumerate()
                    .map(move |(j, s)| SubFileCount {
                        container_index: ci,
                        sub_file: j as u8,
                        unique: s.unique_blocks(),
                    })
            })
            .collect();
        let batch = ids[0];
        let mut map = BatchMap {
            k: k as u8,
            m: m as u8,
            block_bytes: block as u32,
            layout: self.config.layout,
            chunking: self.config.chunk_kind(),
            batch,
            containers,
            groups: Vec::new(),
        };
        let groups = exchange::exchange(&counts, k);
        self.timings.preprocess_ns += elapsed_ns(preprocess_start);
        let encode_start = Instant::now();
        let stripe_bytes = (k * block) as u64;
        let encode_total: u64 = groups
            .iter()
            .map(|members| members.iter().map(|s| s.unique).max().unwrap_or(0) as u64)
            .sum::<u64>()
            * stripe_bytes;
        let mut encoded_bytes = 0u64;
        self.report_progress("seal: encode", 0, encode_total);
        let zero = vec![0u8; block];
        let mut parity_files = Vec::new();
        for (g, members) in groups.into_iter().enumerate() {
            let group_id = map.group_id(g) as usize;
            let encoded = members.iter().map(|s| s.unique).max().unwrap_or(0);
            for (i, s) in members.iter().enumerate() {
                let sub = &mut map.containers[s.container_index].sub_files[s.sub_file as usize];
                sub.device = ((group_id + i) % device_count) as u16;
                sub.group = g as u16;
                sub.member = i as u8;
            }
            let parity_devices: Vec<u16> = (0..m)
                .map(|i| ((group_id + k + i) % device_count) as u16)
                .collect();
            let mut parity = vec![vec![0u8; encoded as usize * block]; m];
            let mut parity_crcs = vec![0u32; m * encoded as usize];
            for position in 0..encoded as usize {
                let data: Vec<&[u8]> = members
                    .iter()
                    .map(|s| {
                        let c = &staged[s.container_index];
                        let sub = &map.containers[s.container_index].sub_files[s.sub_file as usize];
                        match sub.stripe_column(map.layout, position as u32) {
                            Some(column) => c.block(s.sub_file as usize, column as usize, block),
                            None => &zero[..],
                        }
                    })
                    .collect();
                let mut out: Vec<&mut [u8]> = parity
                    .iter_mut()
                    .map(|p| &mut p[position * block..(position + 1) * block])
                    .collect();
                self.codec.encode(&data, &mut out);
                for (i, p) in out.iter().enumerate() {
                    parity_crcs[i * encoded as usize + position] = ecdedup_core::codec::crc32c(p);
                }
            }
            for (i, bytes) in parity.into_iter().enumerate() {
                let path = self
                    .device_dir(parity_devices[i] as usize)
                    .join(parity_name(group_id as u32, i));
                parity_files.push((path, bytes));
            }
            map.groups.push(GroupMap {
                members: members
                    .iter()
                    .map(|s| (staged[s.container_index].id, s.sub_file))
                    .collect(),
                encoded,
                parity_devices,
                parity_crcs,
            });
            encoded_bytes += encoded as u64 * stripe_bytes;
            self.report_progress("seal: encode", encoded_bytes, encode_total);
        }

        self.timings.encode_ns += elapsed_ns(encode_start);

        // Durable: sub-files, parity, then the map (the commit).
        let write_start = Instant::now();
        let write_total: u64 = map
            .containers
            .iter()
            .flat_map(|c| c.sub_files.iter())
            .map(|sub| sub.stored_blocks(map.layout) as u64 * block as u64)
            .chain(parity_files.iter().map(|(_, bytes)| bytes.len() as u64))
            .sum();
        let mut written = 0u64;
        self.report_progress("seal: write", 0, write_total);
        for (c, cm) in staged.iter().zip(&map.containers) {
            let sub_file_bytes = c.blocks_per_sub_file * block;
            for (j, sub) in cm.sub_files.iter().enumerate() {
                let path = self
                    .device_dir(sub.device as usize)
                    .join(sub_file_name(c.id, j as u8));
                match map.layout {
                    map::Layout::Paper => self.disk.write_durable(
                        &path,
                        &c.bytes[j * sub_file_bytes..(j + 1) * sub_file_bytes],
                    )?,
                    map::Layout::Compact => {
                        let mut stored = Vec::with_capacity(sub.unique_blocks() as usize * block);
                        for column in sub.stored_columns(map.layout) {
                            stored.extend_from_slice(c.block(j, column as usize, block));
                        }
                        self.disk.write_durable(&path, &stored)?;
                    }
                }
                written += sub.stored_blocks(map.layout) as u64 * block as u64;
                self.report_progress("seal: write", written, write_total);
            }
        }
        for (path, bytes) in &parity_files {
            self.disk.write_durable(path, bytes)?;
            written += bytes.len() as u64;
            self.report_progress("seal: write", written, write_total);
        }
        let encoded = map.encode();
        debug_assert!(BatchMap::decode(&encoded, "new").is_ok_and(|d| d == map));
        // The copies on m + 1 devices (for `assemble`) before the one in
        // the archive folder, which makes the batch exist.
        for path in self.map_copy_paths(batch) {
            self.disk.write_durable(&path, &encoded)?;
        }
        self.disk
            .write_durable(&self.dir.join(MAPS_DIR).join(map_name(batch)), &encoded)?;
        self.timings.write_ns += elapsed_ns(write_start);
        for c in &map.containers {
            self.container_batch.insert(c.id, batch);
        }
        self.batches.insert(batch, map);
        for &id in ids {
            self.disk.remove(&self.staging_path(id))?;
        }
        self.disk.sync_dir(&self.dir.join(STAGING_DIR))?;
        self.save_cache()
    }

    /// The map of staged container `ci` under fixed chunking: each block is
    /// looked up by its fingerprint.
    fn dedup_fixed(&mut self, staged: &[Staged], ci: usize) -> Result<ContainerMap> {
        let (k, block) = (self.config.k, self.config.block_bytes as usize);
        let c = &staged[ci];
        let chunks: Vec<&[u8]> = c.bytes.chunks(block).collect();
        let fingerprints = self.fingerprints(c.id, &chunks)?;
        let n = c.blocks_per_sub_file;
        let mut blocks = Vec::with_capacity(k * n);
        for (b, (bytes, fp)) in chunks.iter().zip(fingerprints).enumerate() {
            let here = BlockAddress {
                container: c.id,
                sub_file: (b / n) as u8,
                column: (b % n) as u32,
            };
            let mut source = self.cache_lookup(fp, &staged[..=ci]);
            if let Some(a) = source {
                if self.config.verify && !self.same_bytes(a, bytes, &staged[..=ci])? {
                    source = None;
                }
            }
            if source.is_none() {
                self.cache.insert(fp, here);
            }
            blocks.push(BlockEntry {
                position: 0,
                crc: ecdedup_core::codec::crc32c(bytes),
                redundant: source.is_some(),
                source,
            });
        }
        Ok(shuffled(c, blocks, None, k))
    }

    /// The map of staged container `ci` under content-defined chunking:
    /// each chunk is looked up by its fingerprint, and a block is redundant
    /// when no unique chunk touches it.
    fn dedup_content_defined(&mut self, staged: &[Staged], ci: usize) -> Result<ContainerMap> {
        let (k, block) = (self.config.k, self.config.block_bytes as usize);
        let c = &staged[ci];
        let pieces: Vec<&[u8]> = c.chunks.iter().map(|r| &c.bytes[r.clone()]).collect();
        let fingerprints = self.fingerprints(c.id, &pieces)?;
        let mut chunks = Vec::with_capacity(pieces.len());
        for (i, (bytes, fp)) in pieces.iter().zip(fingerprints).enumerate() {
            let mut source = self.cache_lookup(fp, &staged[..=ci]).map(|a| ChunkSource {
                container: a.container,
                chunk: a.column,
            });
            if let Some(s) = source {
                if self.config.verify && !self.same_chunk(s, bytes, &staged[..=ci])? {
                    source = None;
                }
            }
            if source.is_none() {
                let here = BlockAddress {
                    container: c.id,
                    sub_file: 0,
                    column: i as u32,
                };
                self.cache.insert(fp, here);
            }
            chunks.push(ChunkEntry {
                length: bytes.len() as u32,
                crc: ecdedup_core::codec::crc32c(bytes),
                source,
            });
        }
        let starts = ContainerMap::starts_of(&chunks);
        let count = k * c.blocks_per_sub_file;
        let redundant = map::redundant_blocks(&chunks, &starts, count, block as u32);
        let blocks = c
            .bytes
            .chunks(block)
            .zip(redundant)
            .map(|(bytes, redundant)| BlockEntry {
                position: 0,
                crc: ecdedup_core::codec::crc32c(bytes),
                redundant,
                source: None,
            })
            .collect();
        Ok(shuffled(c, blocks, Some(chunks), k))
    }

    fn fingerprints(&mut self, container: u32, chunks: &[&[u8]]) -> Result<Vec<Fingerprint>> {
        let mut out = Vec::with_capacity(chunks.len());
        let start = Instant::now();
        self.backend
            .fingerprint_batch(self.config.fingerprint, chunks, &mut out)
            .map_err(|e| Error::Other(format!("fingerprint container {container}: {e}")))?;
        self.timings.fingerprint_ns += elapsed_ns(start);
        Ok(out)
    }

    /// A cached source that is still there: sealed (and not in the batch
    /// `gc` is rewriting), or earlier in this batch.
    fn cache_lookup(&mut self, fp: Fingerprint, batch: &[Staged]) -> Option<BlockAddress> {
        self.cache.get(&fp).filter(|a| {
            let sealed = self.container_batch.get(&a.container);
            sealed.is_some_and(|&b| Some(b) != self.dying_batch)
                || batch.iter().any(|s| s.id == a.container)
        })
    }

    /// Whether source chunk `s` holds exactly `bytes`. A source that cannot
    /// be read is not a match.
    fn same_chunk(&self, s: ChunkSource, bytes: &[u8], batch: &[Staged]) -> Result<bool> {
        if let Some(c) = batch.iter().find(|c| c.id == s.container) {
            return Ok(c
                .chunks
                .get(s.chunk as usize)
                .is_some_and(|r| &c.bytes[r.clone()] == bytes));
        }
        let Ok((container, start)) = self.chunk_source_start(s, bytes.len() as u32) else {
            return Ok(false);
        };
        let mut theirs = vec![0u8; bytes.len()];
        Ok(self.read_sealed(container, start, &mut theirs, 0).is_ok() && theirs == bytes)
    }

    /// Whether the block at `a` holds exactly `bytes` (the byte compare on
    /// a fingerprint hit). A source that cannot be read is not a match.
    fn same_bytes(&self, a: BlockAddress, bytes: &[u8], batch: &[Staged]) -> Result<bool> {
        let block = self.config.block_bytes as usize;
        if let Some(c) = batch.iter().find(|c| c.id == a.container) {
            return Ok(c.block(a.sub_file as usize, a.column as usize, block) == bytes);
        }
        Ok(self.read_block(a).is_ok_and(|b| b == bytes))
    }
}

/// A container's map from its blocks (sub-file major): each sub-file's
/// blocks pseudo-shuffled (Procedure 1), unique ones leftmost; `chunks`
/// under content-defined chunking.
fn shuffled(
    c: &Staged,
    mut blocks: Vec<BlockEntry>,
    chunks: Option<Vec<ChunkEntry>>,
    k: usize,
) -> ContainerMap {
    let n = c.blocks_per_sub_file;
    assert_eq!(blocks.len(), k * n);
    let mut sub_files = Vec::with_capacity(k);
    for _ in 0..k {
        let blocks: Vec<BlockEntry> = blocks.drain(..n).collect();
        let unique: Vec<bool> = blocks.iter().map(|b| !b.redundant).collect();
        let (positions, _) = pseudo_shuffle(&unique);
        let mut column_at = vec![0u32; n];
        let mut blocks = blocks;
        for (l, (entry, &p)) in blocks.iter_mut().zip(&positions).enumerate() {
            entry.position = p;
            column_at[p as usize] = l as u32;
        }
        sub_files.push(SubFileMap {
            device: 0,
            group: 0,
            member: 0,
            blocks,
            column_at,
        });
    }
    let chunk_starts = chunks
        .as_deref()
        .map_or(Vec::new(), ContainerMap::starts_of);
    ContainerMap {
        id: c.id,
        data_bytes: c.data_bytes,
        blocks_per_sub_file: n as u32,
        sub_files,
        chunks: chunks.unwrap_or_default(),
        chunk_starts,
    }
}
