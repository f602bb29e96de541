//! The map-address table of one sealed batch (one container, or the n_ex
//! containers whose sub-files were exchanged together), and its on-disk
//! encoding.
//!
//! For every block of every sub-file it records the block's virtual
//! position after pseudo-shuffling (Procedure 1), the CRC-32C of its bytes
//! and, for a redundant block, the address of its source block; for every
//! group (the k sub-files encoded together, Procedure 2) its members, the
//! number of virtual stripes encoded, the devices of its parity sub-files
//! and a CRC-32C per parity block. Nothing in the data sub-files moves.
//!
//! Encoding, all integers little-endian, followed by a CRC-32C of every
//! byte before it:
//! ```text
//! header   "ECDAMAP1" | k u8 | m u8 | 0 u16 | block_bytes u32 | batch u32
//!          | containers u32 | groups u32                       (28 bytes)
//! container id u32 | data_bytes u64 | blocks_per_sub_file u32
//!          | k x (device u16 | group u16 | member u8 | 0 u8 u8 u8)
//!          | k x blocks_per_sub_file x entry                   (16 bytes each)
//! entry    position u32 | crc32c u32 | source container u32 (FFFFFFFF: unique)
//!          | source sub-file u8 | source column u24
//! group    k x (container u32 | sub-file u32) | encoded u32
//!          | m x device u32 | m x encoded x parity crc32c u32
//! ```
//! Decoding checks the checksum, every count against the bytes present,
//! every reference, that each sub-file's positions are a permutation and
//! that the group ids (batch, batch + 1, ...) fit in a u32, so a corrupt map
//! is an error, never a wrong read.

use crate::error::{Error, Result};

pub const MAGIC: &[u8; 8] = b"ECDAMAP1";
const NO_SOURCE: u32 = u32::MAX;
/// Bytes of one block entry on disk.
pub const ENTRY_BYTES: usize = 16;
/// Columns must fit the 24-bit source column field.
pub const COLUMNS_MAX: u32 = 1 << 24;

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
    /// The source block of a redundant block; None for a unique block.
    pub source: Option<BlockAddress>,
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
        self.blocks.iter().filter(|b| b.source.is_none()).count() as u32
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
    /// The batch's id: its first container's id.
    pub batch: u32,
    pub containers: Vec<ContainerMap>,
    pub groups: Vec<GroupMap>,
}

impl BatchMap {
    /// Global id of group `g`, naming its parity files (unique because a
    /// batch has as many groups as containers).
    pub fn group_id(&self, g: usize) -> u32 {
        self.batch + g as u32
    }

    pub fn container(&self, id: u32) -> Option<&ContainerMap> {
        self.containers.iter().find(|c| c.id == id)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.push(self.k);
        out.push(self.m);
        out.extend_from_slice(&0u16.to_le_bytes());
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
                    let (src, packed) = match b.source {
                        Some(a) => (a.container, a.sub_file as u32 | (a.column << 8)),
                        None => (NO_SOURCE, 0),
                    };
                    out.extend_from_slice(&src.to_le_bytes());
                    out.extend_from_slice(&packed.to_le_bytes());
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
        if &body[..8] != MAGIC {
            return Err(bad("not an archive map (bad magic)"));
        }
        let mut r = Reader { bytes: body, at: 8 };
        let k = r.u8().ok_or_else(|| bad("truncated header"))?;
        let m = r.u8().ok_or_else(|| bad("truncated header"))?;
        r.u16().ok_or_else(|| bad("truncated header"))?;
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
                    let source = (src != NO_SOURCE).then_some(BlockAddress {
                        container: src,
                        sub_file: (packed & 0xFF) as u8,
                        column: packed >> 8,
                    });
                    if source.is_some_and(|a| a.sub_file >= k) {
                        return Err(bad("source names an impossible sub-file"));
                    }
                    s.blocks.push(BlockEntry {
                        position,
                        crc,
                        source,
                    });
                }
                s.column_at = column_at;
            }
            if data_bytes > n as u64 * block_bytes as u64 * k as u64 {
                return Err(bad("more data bytes than the sub-files hold"));
            }
            map.containers.push(ContainerMap {
                id,
                data_bytes,
                blocks_per_sub_file: n,
                sub_files,
            });
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
        // Every sub-file is the member it claims to be.
        for c in &map.containers {
            for (j, s) in c.sub_files.iter().enumerate() {
                let g = &map.groups[s.group as usize];
                if g.members[s.member as usize] != (c.id, j as u8) {
                    return Err(bad("group members disagree with sub-files"));
                }
            }
        }
        Ok(map)
    }
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
                    source: None,
                }],
                column_at: vec![0],
            }],
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
