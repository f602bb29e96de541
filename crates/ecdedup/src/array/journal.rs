//! The parity journal: one append-only file per device, holding the partial
//! writes of stripes for which that device holds a parity unit, until replay
//! folds them into the parity (paper 004).
//!
//! - `plog` (classic parity logging) appends the parity delta
//!   `a_ji * (d_new - d_old)` for the device's parity role j.
//! - `parix` appends data values: the new value d(r) of every written block,
//!   and the original d(0) once, the first time a block is written after
//!   its parity was last materialised. Replay applies Eq. 3 of the paper:
//!   `p_j = p_j + a_ji * (d(r) - d(0))`.
//! - An invalidation mark drops everything logged for a stripe whose parity
//!   was rewritten from its data (full-stripe or reconstruct-write).
//!
//! Record (little endian), header 32 bytes, then the payload:
//! ```text
//! 0   u32 CRC32C of bytes 4..32+payload
//! 4   u8  kind: 1 data value d(r), 2 original d(0), 3 parity delta, 4 invalidate
//! 5   u8  zero
//! 6   u16 role (data role for 1 and 2, parity role for 3)
//! 8   u64 stripe
//! 16  u32 first block (in the unit)
//! 20  u32 block count
//! 24  u32 payload bytes (= count * 4096; 0 for invalidate)
//! 28  u32 zero
//! ```
//! The file starts with a 32-byte header (magic `ECDDPJ01`). Replay at open
//! stops at the first short or corrupt record and cuts the tail there.
//!
//! The in-RAM index maps each logged block to where its d(0) and latest d(r)
//! (or its list of deltas) sit, so replay reads two records per block
//! instead of scanning the file.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const MAGIC: [u8; 8] = *b"ECDDPJ01";
pub const HEADER_BYTES: u64 = 32;
const RECORD_HEADER_BYTES: usize = 32;
const BLOCK: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Value = 1,
    Original = 2,
    Delta = 3,
    Invalidate = 4,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        match b {
            1 => Some(Kind::Value),
            2 => Some(Kind::Original),
            3 => Some(Kind::Delta),
            4 => Some(Kind::Invalidate),
            _ => None,
        }
    }
}

/// What is logged for one block of one role in one stripe.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockLog {
    /// File offset of the block's d(0) bytes (parix).
    pub original: Option<u64>,
    /// File offset of the block's latest d(r) bytes (parix).
    pub latest: Option<u64>,
    /// File offsets of parity deltas, in order (plog).
    pub deltas: Vec<u64>,
}

/// Everything logged for one stripe: (role, block) → log.
pub type StripeLog = HashMap<(u16, u32), BlockLog>;

pub struct ParityJournal {
    file: File,
    path: PathBuf,
    end: u64,
    index: HashMap<u64, StripeLog>,
    records: u64,
}

fn header() -> [u8; HEADER_BYTES as usize] {
    let mut h = [0u8; HEADER_BYTES as usize];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Encodes a mark that drops what is logged for blocks
/// `[first_block, first_block+count)` of every role of a stripe.
pub fn encode_invalidate(out: &mut Vec<u8>, stripe: u64, first_block: u32, count: u32) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(Kind::Invalidate as u8);
    out.push(0);
    out.extend_from_slice(&u16::MAX.to_le_bytes());
    out.extend_from_slice(&stripe.to_le_bytes());
    out.extend_from_slice(&first_block.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    let crc = crc32c::crc32c(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Encodes one record into `out`.
pub fn encode(
    out: &mut Vec<u8>,
    kind: Kind,
    stripe: u64,
    role: u16,
    first_block: u32,
    payload: &[u8],
) {
    assert!(kind != Kind::Invalidate && payload.len().is_multiple_of(BLOCK));
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(kind as u8);
    out.push(0);
    out.extend_from_slice(&role.to_le_bytes());
    out.extend_from_slice(&stripe.to_le_bytes());
    out.extend_from_slice(&first_block.to_le_bytes());
    out.extend_from_slice(&((payload.len() / BLOCK) as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

struct Parsed {
    kind: Kind,
    stripe: u64,
    role: u16,
    first_block: u32,
    count: u32,
    len: usize,
}

fn parse(b: &[u8]) -> Option<Parsed> {
    if b.len() < RECORD_HEADER_BYTES {
        return None;
    }
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let payload = u32_at(24) as usize;
    let count = u32_at(20);
    let invalidate = b[4] == Kind::Invalidate as u8;
    if (!invalidate && payload != count as usize * BLOCK) || (invalidate && payload != 0) {
        return None;
    }
    if b.len() < RECORD_HEADER_BYTES + payload {
        return None;
    }
    let len = RECORD_HEADER_BYTES + payload;
    if u32_at(0) != crc32c::crc32c(&b[4..len]) {
        return None;
    }
    Some(Parsed {
        kind: Kind::from_u8(b[4])?,
        role: u16::from_le_bytes([b[6], b[7]]),
        stripe: u64::from_le_bytes(b[8..16].try_into().unwrap()),
        first_block: u32_at(16),
        count,
        len,
    })
}

impl ParityJournal {
    /// Opens (creating if missing) a journal and rebuilds its index. A torn
    /// tail is cut. Returns the journal and the number of records found.
    pub fn open(path: &Path) -> Result<ParityJournal> {
        let io = |e| Error::io(format!("opening parity journal {}", path.display()), e);
        if !path.exists() {
            let f = File::create(path).map_err(io)?;
            f.write_all_at(&header(), 0).map_err(io)?;
            f.sync_all().map_err(io)?;
        }
        let bytes = std::fs::read(path).map_err(io)?;
        if bytes.len() < HEADER_BYTES as usize || bytes[..HEADER_BYTES as usize] != header() {
            return Err(Error::Corrupt(format!(
                "parity journal {} has no valid header",
                path.display()
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io)?;
        let mut j = ParityJournal {
            file,
            path: path.to_owned(),
            end: HEADER_BYTES,
            index: HashMap::new(),
            records: 0,
        };
        let mut at = HEADER_BYTES as usize;
        while let Some(p) = parse(&bytes[at..]) {
            j.index_record(&p, at as u64);
            at += p.len;
        }
        j.end = at as u64;
        if at != bytes.len() {
            j.file
                .set_len(j.end)
                .and_then(|_| j.file.sync_all())
                .map_err(io)?;
        }
        Ok(j)
    }

    fn index_record(&mut self, p: &Parsed, offset: u64) {
        self.records += 1;
        if p.kind == Kind::Invalidate {
            if let Some(log) = self.index.get_mut(&p.stripe) {
                let range = p.first_block..p.first_block.saturating_add(p.count);
                log.retain(|(_, b), _| !range.contains(b));
                if log.is_empty() {
                    self.index.remove(&p.stripe);
                }
            }
            return;
        }
        let log = self.index.entry(p.stripe).or_default();
        for i in 0..p.count {
            let at = offset + RECORD_HEADER_BYTES as u64 + i as u64 * BLOCK as u64;
            let e = log.entry((p.role, p.first_block + i)).or_default();
            match p.kind {
                Kind::Value => e.latest = Some(at),
                Kind::Original => {
                    if e.original.is_none() {
                        e.original = Some(at);
                    }
                }
                Kind::Delta => e.deltas.push(at),
                Kind::Invalidate => unreachable!(),
            }
        }
    }

    /// Appends encoded records (one write) and indexes them.
    pub fn append(&mut self, records: &[u8]) -> std::io::Result<()> {
        self.file.write_all_at(records, self.end)?;
        let mut at = 0usize;
        while at < records.len() {
            let p = parse(&records[at..]).expect("records we encoded parse");
            self.index_record(&p, self.end + at as u64);
            at += p.len;
        }
        self.end += records.len() as u64;
        Ok(())
    }

    pub fn has_original(&self, stripe: u64, role: u16, block: u32) -> bool {
        self.index
            .get(&stripe)
            .and_then(|l| l.get(&(role, block)))
            .is_some_and(|b| b.original.is_some())
    }

    pub fn has_stripe(&self, stripe: u64) -> bool {
        self.index.contains_key(&stripe)
    }

    pub fn stripes(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.index.keys().copied().collect();
        v.sort_unstable();
        v
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Removes and returns what is logged for a stripe.
    pub fn take_stripe(&mut self, stripe: u64) -> Option<StripeLog> {
        self.index.remove(&stripe)
    }

    /// Reads one logged block.
    pub fn read_block(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    pub fn bytes(&self) -> u64 {
        self.end
    }

    pub fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    /// Empties the journal when nothing in it is still needed.
    pub fn reset_if_empty(&mut self) -> std::io::Result<bool> {
        if !self.index.is_empty() || self.end == HEADER_BYTES {
            return Ok(false);
        }
        self.file.set_len(HEADER_BYTES)?;
        self.file.sync_data()?;
        self.end = HEADER_BYTES;
        Ok(true)
    }

    /// Reserves `bytes` of disk for the journal without changing its size,
    /// so that appends within the bound never meet a full disk.
    pub fn preallocate(&self, bytes: u64) -> std::io::Result<()> {
        use std::os::unix::io::AsRawFd;
        // SAFETY: fallocate on a valid descriptor with in-range arguments.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                0,
                bytes as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// RAM of the index: entries times their size, plus the delta lists.
    pub fn index_ram_bytes(&self) -> u64 {
        let entry = std::mem::size_of::<((u16, u32), BlockLog)>() as u64 + 1;
        let stripe = std::mem::size_of::<(u64, StripeLog)>() as u64 + 1;
        self.index
            .values()
            .map(|l| {
                stripe
                    + l.capacity() as u64 * entry
                    + l.values()
                        .map(|b| b.deltas.capacity() as u64 * 8)
                        .sum::<u64>()
            })
            .sum()
    }

    pub fn logged_blocks(&self) -> u64 {
        self.index.values().map(|l| l.len() as u64).sum()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_indexed_and_an_invalidation_drops_the_stripe() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut j = ParityJournal::open(&path).unwrap();
        let mut r = Vec::new();
        encode(&mut r, Kind::Value, 7, 1, 2, &[1u8; 8192]);
        encode(&mut r, Kind::Original, 7, 1, 2, &[0u8; 4096]);
        encode(&mut r, Kind::Value, 9, 0, 0, &[3u8; 4096]);
        j.append(&r).unwrap();
        assert!(j.has_original(7, 1, 2) && !j.has_original(7, 1, 3));
        let mut r = Vec::new();
        encode_invalidate(&mut r, 9, 0, 1);
        encode_invalidate(&mut r, 7, 3, 1);
        j.append(&r).unwrap();
        assert!(j.index[&7].contains_key(&(1, 2)) && !j.index[&7].contains_key(&(1, 3)));
        assert_eq!(j.stripes(), vec![7]);
        drop(j);
        let mut j = ParityJournal::open(&path).unwrap();
        assert_eq!(j.stripes(), vec![7]);
        let log = j.take_stripe(7).unwrap();
        let b = &log[&(1, 2)];
        let mut buf = vec![0u8; 4096];
        j.read_block(b.latest.unwrap(), &mut buf).unwrap();
        assert_eq!(buf, vec![1u8; 4096]);
        assert!(j.reset_if_empty().unwrap());
    }

    #[test]
    fn a_torn_journal_tail_is_cut_and_earlier_records_survive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut j = ParityJournal::open(&path).unwrap();
        let mut r = Vec::new();
        encode(&mut r, Kind::Delta, 1, 4, 0, &[5u8; 4096]);
        j.append(&r).unwrap();
        let good = j.bytes();
        let mut r2 = Vec::new();
        encode(&mut r2, Kind::Delta, 2, 4, 0, &[6u8; 4096]);
        drop(j);
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&r2[..100], good).unwrap();
        drop(f);
        let j = ParityJournal::open(&path).unwrap();
        assert_eq!(j.bytes(), good);
        assert_eq!(j.stripes(), vec![1]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), good);
    }
}
