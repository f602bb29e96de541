//! The map-address table of one sealed batch (one container, or the n_ex
//! containers whose sub-files were exchanged together), and its on-disk
//! encoding.
//!
//! For every block of every sub-file it records the block's virtual
//! position after pseudo-shuffling (Procedure 1), the CRC-32C of its bytes
//! and whether it is redundant (holds no byte of a unique chunk), with, for
//! a redundant block under fixed chunking, the address of its source block;
//! under content-defined chunking, every chunk of each container (its
//! length, CRC-32C and, for a redundant chunk, its source chunk); for every
//! group (the k sub-files encoded together, Procedure 2) its members, the
//! number of virtual stripes encoded, the devices of its parity sub-files
//! and a CRC-32C per parity block.
//!
//! Encoding, all integers little-endian, followed by a CRC-32C of every
//! byte before it. Version 1 (`ECDAMAP1`: the paper's layout, fixed
//! chunking; written for exactly those archives, so older binaries read
//! them) has 0 in the two bytes that version 2 (`ECDAMAP2`) uses for the
//! layout and the chunking:
//! ```text
//! header   "ECDAMAP1" | k u8 | m u8 | 0 u16                       (v1)
//!          "ECDAMAP2" | k u8 | m u8 | layout u8 | chunking u8     (v2)
//!          | block_bytes u32 | batch u32 | containers u32 | groups u32 (28 bytes)
//!          layout 0: paper (data sub-files hold every block),
//!                 1: compact (only the unique blocks, in position order);
//!          chunking 0: fixed (a chunk is a block), 1: content-defined
//! container id u32 | data_bytes u64 | blocks_per_sub_file u32
//!          | k x (device u16 | group u16 | member u8 | 0 u8 u8 u8)
//!          | k x blocks_per_sub_file x entry                   (16 bytes each)
//!          | content-defined only: chunks u32 | chunks x chunk (16 bytes each)
//! entry    position u32 | crc32c u32 | source container u32 | source sub-file u8
//!          | source column u24; source container FFFFFFFF: unique; under
//!          content-defined chunking FFFFFFFE: redundant (its bytes are in its
//!          chunks' sources), and the other 4 bytes 0
//! chunk    length u32 | crc32c u32 | source container u32 (FFFFFFFF: unique)
//!          | source chunk index u32
//! group    k x (container u32 | sub-file u32) | encoded u32
//!          | m x device u32 | m x encoded x parity crc32c u32
//! ```
//! Decoding checks the checksum, every count against the bytes present,
//! every reference, that each sub-file's positions are a permutation whose
//! unique blocks hold `0..unique` and fit the group's encoded stripes, that
//! chunks tile the container's data bytes and that a block is redundant
//! exactly when no unique chunk touches it, and that the group ids (batch,
//! batch + 1, ...) fit in a u32, so a corrupt map is an error, never a
//! wrong read. References across batches (sources) are checked when used.

use ecdedup_core::error::{Error, Result};
use serde::{Deserialize, Serialize};

pub const MAGIC: &[u8; 8] = b"ECDAMAP1";
pub const MAGIC_V2: &[u8; 8] = b"ECDAMAP2";
const NO_SOURCE: u32 = u32::MAX;
/// A redundant block's source container field under content-defined
/// chunking.
const REDUNDANT_BY_CHUNKS: u32 = u32::MAX - 1;
/// Bytes of one block entry on disk.
pub const ENTRY_BYTES: usize = 16;
/// Bytes of one chunk entry on disk.
pub const CHUNK_ENTRY_BYTES: usize = 16;
/// Columns must fit the 24-bit source column field.
pub const COLUMNS_MAX: u32 = 1 << 24;

/// What the data sub-files hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// Every block, where it was written (paper 001): reads are plain reads.
    #[default]
    Paper,
    /// Only the unique blocks, in virtual-position order; a redundant block
    /// is read through its source. Each encoded stripe is the members'
    /// stored blocks at that position, zeros past a member's unique blocks.
    Compact,
}

/// How a container is cut into the units that are fingerprinted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChunkKind {
    /// A chunk is a block.
    #[default]
    Fixed,
    /// Variable chunks (FastCDC) laid end to end over the container's data
    /// bytes; blocks stay the unit of stripes.
    ContentDefined,
}

/// Where a block lives: container, sub-file and column (the paper's
/// (fid, sid, cid)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockAddress {
    pub container: u32,
    pub sub_file: u8,
    pub column: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockEntry {
    /// Virtual column after pseudo-shuffling.
    pub position: u32,
    pub crc: u32,
    /// Holds no byte of a unique chunk (fixed chunking: has a source).
    pub redundant: bool,
    /// Fixed chunking: the source block of a redundant block.
    pub source: Option<BlockAddress>,
}

/// A content-defined chunk's source: a unique chunk of a sealed container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkSource {
    pub container: u32,
    pub chunk: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkEntry {
    pub length: u32,
    pub crc: u32,
    /// The source of a redundant chunk; None for a unique chunk.
    pub source: Option<ChunkSource>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubFileMap {
    pub device: u16,
    /// Index of the group (within the batch) this sub-file is encoded in.
    pub group: u16,
    /// Its member slot in that group (0..k).
    pub member: u8,
    pub blocks: Vec<BlockEntry>,
    /// Inverse of the positions: the column at each virtual position
    /// (derived, not stored).
    pub column_at: Vec<u32>,
}

impl SubFileMap {
    pub fn unique_blocks(&self) -> u32 {
        self.blocks.iter().filter(|b| !b.redundant).count() as u32
    }

    /// Whether block `column`'s bytes are in the data sub-file.
    pub fn stored(&self, layout: Layout, column: u32) -> bool {
        layout == Layout::Paper || !self.blocks[column as usize].redundant
    }

    /// Byte offset of stored block `column` in the data sub-file.
    pub fn stored_offset(&self, layout: Layout, column: u32, block_bytes: u32) -> u64 {
        let slot = match layout {
            Layout::Paper => column,
            Layout::Compact => self.blocks[column as usize].position,
        };
        slot as u64 * block_bytes as u64
    }

    /// The column whose bytes stand at virtual stripe `position` when the
    /// group is encoded; None: zeros (past the sub-file, or, compact, past
    /// its unique blocks).
    pub fn stripe_column(&self, layout: Layout, position: u32) -> Option<u32> {
        let column = *self.column_at.get(position as usize)?;
        self.stored(layout, column).then_some(column)
    }

    /// Blocks the data sub-file holds.
    pub fn stored_blocks(&self, layout: Layout) -> u32 {
        match layout {
            Layout::Paper => self.blocks.len() as u32,
            Layout::Compact => self.unique_blocks(),
        }
    }

    /// Columns of the stored blocks in the order the data sub-file holds
    /// them.
    pub fn stored_columns(&self, layout: Layout) -> Vec<u32> {
        match layout {
            Layout::Paper => (0..self.blocks.len() as u32).collect(),
            Layout::Compact => self.column_at[..self.unique_blocks() as usize].to_vec(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerMap {
    pub id: u32,
    /// Object bytes packed into the container (the rest of its k sub-files
    /// is zero padding).
    pub data_bytes: u64,
    pub blocks_per_sub_file: u32,
    pub sub_files: Vec<SubFileMap>,
    /// Content-defined chunking: the chunks, end to end over `data_bytes`;
    /// empty under fixed chunking.
    pub chunks: Vec<ChunkEntry>,
    /// Start of each chunk in the container, and `data_bytes` last
    /// (derived, not stored).
    pub chunk_starts: Vec<u64>,
}

impl ContainerMap {
    /// Index of the chunk holding container byte `at` (< data_bytes).
    pub fn chunk_at(&self, at: u64) -> usize {
        self.chunk_starts.partition_point(|&s| s <= at) - 1
    }

    /// Starts of `chunks`, then their end.
    pub fn starts_of(chunks: &[ChunkEntry]) -> Vec<u64> {
        let mut starts = Vec::with_capacity(chunks.len() + 1);
        let mut at = 0u64;
        starts.push(0);
        for c in chunks {
            at += c.length as u64;
            starts.push(at);
        }
        starts
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMap {
    /// (container id, sub-file) of each of the k members, in member order.
    pub members: Vec<(u32, u8)>,
    /// Virtual stripes encoded: the most unique blocks of any member.
    pub encoded: u32,
    pub parity_devices: Vec<u16>,
    /// m x encoded CRC-32Cs, parity sub-file major.
    pub parity_crcs: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchMap {
    pub k: u8,
    pub m: u8,
    pub block_bytes: u32,
    pub layout: Layout,
    pub chunking: ChunkKind,
    /// The batch's id: its first container's id.
    pub batch: u32,
    pub containers: Vec<ContainerMap>,
    pub groups: Vec<GroupMap>,
}

impl BatchMap {
    /// The containers this batch's redundant blocks and chunks take their
    /// sources from (its own included), with repeats.
    pub fn source_containers(&self) -> impl Iterator<Item = u32> + '_ {
        self.containers.iter().flat_map(|c| {
            let blocks = c
                .sub_files
                .iter()
                .flat_map(|s| s.blocks.iter().filter_map(|e| e.source))
                .map(|a| a.container);
            let chunks = c
                .chunks
                .iter()
                .filter_map(|e| e.source)
                .map(|s| s.container);
            blocks.chain(chunks)
        })
    }

    /// Global id of group `g`, naming its parity files (unique because a
    /// batch has as many groups as containers).
    pub fn group_id(&self, g: usize) -> u32 {
        self.batch + g as u32
    }

    pub fn container(&self, id: u32) -> Option<&ContainerMap> {
        self.containers.iter().find(|c| c.id == id)
    }

    /// Whether this map is written as version 1.
    fn is_v1(&self) -> bool {
        self.layout == Layout::Paper && self.chunking == ChunkKind::Fixed
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.is_v1() {
            out.extend_from_slice(MAGIC);
            out.extend_from_slice(&[self.k, self.m, 0, 0]);
        } else {
            out.extend_from_slice(MAGIC_V2);
            let layout = match self.layout {
                Layout::Paper => 0,
                Layout::Compact => 1,
            };
            let chunking = match self.chunking {
                ChunkKind::Fixed => 0,
                ChunkKind::ContentDefined => 1,
            };
            out.extend_from_slice(&[self.k, self.m, layout, chunking]);
        }
        for v in [
            self.block_bytes,
            self.batch,
            self.containers.len() as u32,
            self.groups.len() as u32,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for c in &self.containers {
            out.extend_from_slice(&c.id.to_le_bytes());
            out.extend_from_slice(&c.data_bytes.to_le_bytes());
            out.extend_from_slice(&c.blocks_per_sub_file.to_le_bytes());
            for s in &c.sub_files {
                out.extend_from_slice(&s.device.to_le_bytes());
                out.extend_from_slice(&s.group.to_le_bytes());
                out.extend_from_slice(&[s.member, 0, 0, 0]);
            }
            for s in &c.sub_files {
                for b in &s.blocks {
                    out.extend_from_slice(&b.position.to_le_bytes());
                    out.extend_from_slice(&b.crc.to_le_bytes());
                    let (src, packed) = match (b.source, b.redundant) {
                        (Some(a), _) => (a.container, a.sub_file as u32 | (a.column << 8)),
                        (None, false) => (NO_SOURCE, 0),
                        (None, true) => (REDUNDANT_BY_CHUNKS, 0),
                    };
                    out.extend_from_slice(&src.to_le_bytes());
                    out.extend_from_slice(&packed.to_le_bytes());
                }
            }
            if self.chunking == ChunkKind::ContentDefined {
                out.extend_from_slice(&(c.chunks.len() as u32).to_le_bytes());
                for chunk in &c.chunks {
                    out.extend_from_slice(&chunk.length.to_le_bytes());
                    out.extend_from_slice(&chunk.crc.to_le_bytes());
                    let (src, index) = match chunk.source {
                        Some(s) => (s.container, s.chunk),
                        None => (NO_SOURCE, 0),
                    };
                    out.extend_from_slice(&src.to_le_bytes());
                    out.extend_from_slice(&index.to_le_bytes());
                }
            }
        }
        for g in &self.groups {
            for &(c, s) in &g.members {
                out.extend_from_slice(&c.to_le_bytes());
                out.extend_from_slice(&(s as u32).to_le_bytes());
            }
            out.extend_from_slice(&g.encoded.to_le_bytes());
            for &d in &g.parity_devices {
                out.extend_from_slice(&(d as u32).to_le_bytes());
            }
            for &crc in &g.parity_crcs {
                out.extend_from_slice(&crc.to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses and checks a map; `what` names it in errors.
    pub fn decode(bytes: &[u8], what: &str) -> Result<BatchMap> {
        let bad = |why: &str| Error::Corrupt(format!("archive map {what}: {why}"));
        if bytes.len() < 28 + 4 {
            return Err(bad("too short"));
        }
        let (body, tail) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_le_bytes(tail.try_into().expect("4 bytes"));
        if crc32c::crc32c(body) != stored {
            return Err(bad("checksum mismatch"));
        }
        let v2 = match &body[..8] {
            m if m == MAGIC => false,
            m if m == MAGIC_V2 => true,
            _ => return Err(bad("not an archive map (bad magic)")),
        };
        let mut r = Reader { bytes: body, at: 8 };
        let k = r.u8().ok_or_else(|| bad("truncated header"))?;
        let m = r.u8().ok_or_else(|| bad("truncated header"))?;
        let layout_code = r.u8().ok_or_else(|| bad("truncated header"))?;
        let chunking_code = r.u8().ok_or_else(|| bad("truncated header"))?;
        let layout = match (v2, layout_code) {
            (_, 0) => Layout::Paper,
            (true, 1) => Layout::Compact,
            _ => return Err(bad("unknown layout")),
        };
        let chunking = match (v2, chunking_code) {
            (_, 0) => ChunkKind::Fixed,
            (true, 1) => ChunkKind::ContentDefined,
            _ => return Err(bad("unknown chunking")),
        };
        if v2 && layout == Layout::Paper && chunking == ChunkKind::Fixed {
            return Err(bad("a version 2 map of the version 1 layout"));
        }
        let content_defined = chunking == ChunkKind::ContentDefined;
        let mut header = [0u32; 4];
        for h in &mut header {
            *h = r.u32().ok_or_else(|| bad("truncated header"))?;
        }
        let [block_bytes, batch, containers, groups] = header;
        if k == 0 || m == 0 || block_bytes == 0 || containers == 0 || groups != containers {
            return Err(bad("impossible geometry in header"));
        }
        // Groups are named batch, batch + 1, ... (`group_id`).
        if batch.checked_add(groups - 1).is_none() {
            return Err(bad("group ids run past u32::MAX"));
        }
        let truncated = || bad("truncated");
        let mut map = BatchMap {
            k,
            m,
            block_bytes,
            layout,
            chunking,
            batch,
            containers: Vec::new(),
            groups: Vec::new(),
        };
        for _ in 0..containers {
            let id = r.u32().ok_or_else(truncated)?;
            let data_bytes = r.u64().ok_or_else(truncated)?;
            let n = r.u32().ok_or_else(truncated)?;
            if n == 0 || n >= COLUMNS_MAX {
                return Err(bad("impossible sub-file length"));
            }
            if r.remaining() < (k as usize) * (8 + n as usize * ENTRY_BYTES) {
                return Err(truncated());
            }
            let mut sub_files = Vec::new();
            for _ in 0..k {
                let device = r.u16().ok_or_else(truncated)?;
                let group = r.u16().ok_or_else(truncated)?;
                let member = r.u8().ok_or_else(truncated)?;
                r.skip(3).ok_or_else(truncated)?;
                if group as u32 >= groups || member >= k {
                    return Err(bad("sub-file names an impossible group"));
                }
                sub_files.push(SubFileMap {
                    device,
                    group,
                    member,
                    blocks: Vec::with_capacity(n as usize),
                    column_at: Vec::new(),
                });
            }
            for s in &mut sub_files {
                let mut column_at = vec![u32::MAX; n as usize];
                for column in 0..n {
                    let position = r.u32().ok_or_else(truncated)?;
                    let crc = r.u32().ok_or_else(truncated)?;
                    let src = r.u32().ok_or_else(truncated)?;
                    let packed = r.u32().ok_or_else(truncated)?;
                    let slot = column_at
                        .get_mut(position as usize)
                        .filter(|c| **c == u32::MAX)
                        .ok_or_else(|| bad("positions are not a permutation"))?;
                    *slot = column;
                    let (redundant, source) = match (content_defined, src) {
                        (_, NO_SOURCE) => (false, None),
                        (true, REDUNDANT_BY_CHUNKS) => (true, None),
                        (false, src) => (
                            true,
                            Some(BlockAddress {
                                container: src,
                                sub_file: (packed & 0xFF) as u8,
                                column: packed >> 8,
                            }),
                        ),
                        (true, _) => return Err(bad("a block names a source block")),
                    };
                    if source.is_some_and(|a| a.sub_file >= k) {
                        return Err(bad("source names an impossible sub-file"));
                    }
                    s.blocks.push(BlockEntry {
                        position,
                        crc,
                        redundant,
                        source,
                    });
                }
                let unique = s.unique_blocks();
                if s.blocks
                    .iter()
                    .any(|b| !b.redundant && b.position >= unique)
                {
                    return Err(bad("a unique block is not among the leftmost positions"));
                }
                s.column_at = column_at;
            }
            if data_bytes > n as u64 * block_bytes as u64 * k as u64 {
                return Err(bad("more data bytes than the sub-files hold"));
            }
            let mut chunks = Vec::new();
            if content_defined {
                let count = r.u32().ok_or_else(truncated)?;
                if r.remaining() < count as usize * CHUNK_ENTRY_BYTES {
                    return Err(truncated());
                }
                for _ in 0..count {
                    let length = r.u32().ok_or_else(truncated)?;
                    let crc = r.u32().ok_or_else(truncated)?;
                    let src = r.u32().ok_or_else(truncated)?;
                    let chunk = r.u32().ok_or_else(truncated)?;
                    if length == 0 {
                        return Err(bad("an empty chunk"));
                    }
                    let source = (src != NO_SOURCE).then_some(ChunkSource {
                        container: src,
                        chunk,
                    });
                    chunks.push(ChunkEntry {
                        length,
                        crc,
                        source,
                    });
                }
            }
            let chunk_starts = if content_defined {
                ContainerMap::starts_of(&chunks)
            } else {
                Vec::new()
            };
            let container = ContainerMap {
                id,
                data_bytes,
                blocks_per_sub_file: n,
                sub_files,
                chunks,
                chunk_starts,
            };
            if content_defined {
                if container.chunk_starts.last() != Some(&data_bytes) {
                    return Err(bad("chunks do not cover the container's data bytes"));
                }
                let flags = redundant_blocks(
                    &container.chunks,
                    &container.chunk_starts,
                    k as usize * n as usize,
                    block_bytes,
                );
                let recorded = container
                    .sub_files
                    .iter()
                    .flat_map(|s| s.blocks.iter().map(|b| b.redundant));
                if !flags.iter().copied().eq(recorded) {
                    return Err(bad("block and chunk redundancy disagree"));
                }
            }
            map.containers.push(container);
        }
        for _ in 0..groups {
            let mut members = Vec::new();
            for _ in 0..k {
                let c = r.u32().ok_or_else(truncated)?;
                let s = r.u32().ok_or_else(truncated)?;
                if s >= k as u32 || map.container(c).is_none() {
                    return Err(bad("group member names no sub-file of this batch"));
                }
                members.push((c, s as u8));
            }
            let encoded = r.u32().ok_or_else(truncated)?;
            if encoded >= COLUMNS_MAX {
                return Err(bad("impossible encoded stripe count"));
            }
            let mut parity_devices = Vec::new();
            for _ in 0..m {
                let d = r.u32().ok_or_else(truncated)?;
                parity_devices.push(u16::try_from(d).map_err(|_| bad("impossible device"))?);
            }
            if r.remaining() < m as usize * encoded as usize * 4 {
                return Err(truncated());
            }
            let mut parity_crcs = Vec::new();
            for _ in 0..(m as usize * encoded as usize) {
                parity_crcs.push(r.u32().ok_or_else(truncated)?);
            }
            map.groups.push(GroupMap {
                members,
                encoded,
                parity_devices,
                parity_crcs,
            });
        }
        if r.remaining() != 0 {
            return Err(bad("trailing bytes"));
        }
        // Every sub-file is the member it claims to be, and its unique
        // blocks sit in encoded stripes.
        for c in &map.containers {
            for (j, s) in c.sub_files.iter().enumerate() {
                let g = &map.groups[s.group as usize];
                if g.members[s.member as usize] != (c.id, j as u8) {
                    return Err(bad("group members disagree with sub-files"));
                }
                if s.unique_blocks() > g.encoded {
                    return Err(bad("unique blocks past the group's encoded stripes"));
                }
            }
        }
        Ok(map)
    }
}

/// Under content-defined chunking, whether each of a container's `blocks`
/// (sub-file major) holds no byte of a unique chunk, given its chunks and
/// their `starts` (which end within the blocks); padding past the data
/// bytes belongs to no chunk.
pub fn redundant_blocks(
    chunks: &[ChunkEntry],
    starts: &[u64],
    blocks: usize,
    block_bytes: u32,
) -> Vec<bool> {
    let block = block_bytes as u64;
    let mut redundant = vec![true; blocks];
    for (i, chunk) in chunks.iter().enumerate() {
        if chunk.source.is_none() {
            let (start, end) = (starts[i], starts[i + 1]);
            for flag in &mut redundant[(start / block) as usize..end.div_ceil(block) as usize] {
                *flag = false;
            }
        }
    }
    redundant
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let b = self.bytes.get(self.at..self.at + N)?;
        self.at += N;
        Some(b.try_into().expect("N bytes"))
    }
    fn skip(&mut self, n: usize) -> Option<()> {
        self.bytes.get(self.at..self.at + n)?;
        self.at += n;
        Some(())
    }
    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of two one-block containers, k = 1, m = 1.
    fn two_groups(batch: u32) -> BatchMap {
        let container = |id: u32, group: u16| ContainerMap {
            id,
            data_bytes: 1,
            blocks_per_sub_file: 1,
            sub_files: vec![SubFileMap {
                device: group,
                group,
                member: 0,
                blocks: vec![BlockEntry {
                    position: 0,
                    crc: 0,
                    redundant: false,
                    source: None,
                }],
                column_at: vec![0],
            }],
            chunks: Vec::new(),
            chunk_starts: Vec::new(),
        };
        let group = |id: u32| GroupMap {
            members: vec![(id, 0)],
            encoded: 1,
            parity_devices: vec![2],
            parity_crcs: vec![0],
        };
        BatchMap {
            k: 1,
            m: 1,
            block_bytes: 512,
            layout: Layout::Paper,
            chunking: ChunkKind::Fixed,
            batch,
            containers: vec![container(7, 0), container(8, 1)],
            groups: vec![group(7), group(8)],
        }
    }

    /// Found while writing the `archive_map` fuzz target (confirmed with
    /// it): a batch id whose group ids run past u32::MAX decoded, and
    /// naming its last group's parity files overflowed.
    #[test]
    fn a_batch_whose_group_ids_run_past_u32_max_is_refused() {
        let map = two_groups(7);
        assert_eq!(BatchMap::decode(&map.encode(), "t").unwrap(), map);
        let err = BatchMap::decode(&two_groups(u32::MAX).encode(), "t").unwrap_err();
        assert!(err.to_string().contains("group ids"), "{err}");
    }
}
