//! The dedup map's persistent form: a snapshot plus an append-only log.
//!
//! Log record (little endian), 24 bytes + fingerprint:
//! ```text
//! 0   u32  CRC32C of bytes 4..24+fp_len
//! 4   u8   kind: 1 = write (block → new slot, with the slot's fingerprint),
//!               2 = reference (block → existing slot), 3 = unmap
//! 5   u8   fingerprint length (0: slot content not fingerprinted)
//! 6   u16  zero
//! 8   u64  block (dedup-block number in the device's data area)
//! 16  u64  slot
//! 24  ..   fingerprint bytes
//! ```
//! The log starts with a 32-byte header (magic `ECDDML01`, version, CRC).
//! Replay stops at the first record that is short or fails its CRC: a torn
//! tail is cut there, never skipped over. Records are idempotent
//! assignments, so replaying a log over a snapshot that already contains
//! it (a crash between snapshot rename and log truncation) ends in the same
//! state.
//!
//! Snapshot: magic `ECDDMS01`, version, block count, fingerprint length,
//! one u32 slot per block (u32::MAX = unmapped), then the count of
//! fingerprinted slots and (u32 slot, fingerprint) pairs, then a CRC32C of
//! everything before it. Written to a temporary file, synced, renamed.

use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

pub const LOG_MAGIC: [u8; 8] = *b"ECDDML01";
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"ECDDMS01";
pub const LOG_HEADER_BYTES: u64 = 32;
pub const RECORD_HEADER_BYTES: usize = 24;
pub const UNMAPPED: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    Write {
        block: u64,
        slot: u64,
        fingerprint: Option<Fingerprint>,
    },
    Reference {
        block: u64,
        slot: u64,
    },
    Unmap {
        block: u64,
    },
}

impl Record {
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let (kind, block, slot, fp) = match *self {
            Record::Write {
                block,
                slot,
                fingerprint,
            } => (1u8, block, slot, fingerprint),
            Record::Reference { block, slot } => (2, block, slot, None),
            Record::Unmap { block } => (3, block, 0, None),
        };
        let start = out.len();
        let fp_bytes = fp.as_ref().map(|f| f.as_bytes()).unwrap_or(&[]);
        out.extend_from_slice(&[0; 4]);
        out.push(kind);
        out.push(fp_bytes.len() as u8);
        out.extend_from_slice(&[0; 2]);
        out.extend_from_slice(&block.to_le_bytes());
        out.extend_from_slice(&slot.to_le_bytes());
        out.extend_from_slice(fp_bytes);
        let crc = crc32c::crc32c(&out[start + 4..]);
        out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes one record; None for a short, torn or unknown one.
    pub fn decode(b: &[u8]) -> Option<(Record, usize)> {
        if b.len() < RECORD_HEADER_BYTES {
            return None;
        }
        let fp_len = b[5] as usize;
        let len = RECORD_HEADER_BYTES + fp_len;
        if fp_len > 32 || b.len() < len {
            return None;
        }
        let crc = u32::from_le_bytes(b[0..4].try_into().unwrap());
        if crc != crc32c::crc32c(&b[4..len]) {
            return None;
        }
        let block = u64::from_le_bytes(b[8..16].try_into().unwrap());
        let slot = u64::from_le_bytes(b[16..24].try_into().unwrap());
        let rec = match b[4] {
            1 => Record::Write {
                block,
                slot,
                fingerprint: if fp_len > 0 {
                    Some(Fingerprint::from_slice(&b[24..len]).ok()?)
                } else {
                    None
                },
            },
            2 => Record::Reference { block, slot },
            3 => Record::Unmap { block },
            _ => return None,
        };
        Some((rec, len))
    }
}

fn log_header() -> [u8; LOG_HEADER_BYTES as usize] {
    let mut h = [0u8; LOG_HEADER_BYTES as usize];
    h[0..8].copy_from_slice(&LOG_MAGIC);
    h[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Creates an empty log (truncating any old one) and syncs it.
pub fn reset_log(path: &Path) -> Result<File> {
    let io = |e| Error::io(format!("writing dedup log {}", path.display()), e);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(io)?;
    f.write_all_at(&log_header(), 0).map_err(io)?;
    f.sync_all().map_err(io)?;
    Ok(f)
}

/// Reads a log: its records, the offset where valid records end, and
/// whether a torn tail was cut.
pub fn read_log(path: &Path) -> Result<(Vec<Record>, u64, bool)> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::io(format!("reading dedup log {}", path.display()), e))?;
    if bytes.len() < LOG_HEADER_BYTES as usize || bytes[..32] != log_header() {
        return Err(Error::Corrupt(format!(
            "dedup log {} has no valid header",
            path.display()
        )));
    }
    let mut records = Vec::new();
    let mut at = LOG_HEADER_BYTES as usize;
    while let Some((rec, len)) = Record::decode(&bytes[at..]) {
        records.push(rec);
        at += len;
    }
    Ok((records, at as u64, at != bytes.len()))
}

pub struct Snapshot {
    pub map: Vec<u32>,
    pub fingerprints: Vec<(u32, Fingerprint)>,
}

pub fn write_snapshot(path: &Path, snap: &Snapshot) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let io = |e| Error::io(format!("writing dedup snapshot {}", path.display()), e);
    let fp_len = snap
        .fingerprints
        .first()
        .map(|(_, f)| f.as_bytes().len())
        .unwrap_or(0);
    let mut b =
        Vec::with_capacity(32 + snap.map.len() * 4 + snap.fingerprints.len() * (4 + fp_len) + 4);
    b.extend_from_slice(&SNAPSHOT_MAGIC);
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&(fp_len as u32).to_le_bytes());
    b.extend_from_slice(&(snap.map.len() as u64).to_le_bytes());
    for s in &snap.map {
        b.extend_from_slice(&s.to_le_bytes());
    }
    b.extend_from_slice(&(snap.fingerprints.len() as u64).to_le_bytes());
    for (slot, fp) in &snap.fingerprints {
        assert_eq!(fp.as_bytes().len(), fp_len, "one algorithm per device");
        b.extend_from_slice(&slot.to_le_bytes());
        b.extend_from_slice(fp.as_bytes());
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    let mut f = File::create(&tmp).map_err(io)?;
    f.write_all(&b).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent() {
        File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    }
    Ok(())
}

pub fn read_snapshot(path: &Path, blocks: u64) -> Result<Snapshot> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::io(format!("reading dedup snapshot {}", path.display()), e))?;
    let corrupt = |why: &str| Error::Corrupt(format!("dedup snapshot {}: {why}", path.display()));
    if bytes.len() < 32 || bytes[..8] != SNAPSHOT_MAGIC {
        return Err(corrupt("no valid header"));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if u32::from_le_bytes(crc.try_into().unwrap()) != crc32c::crc32c(body) {
        return Err(corrupt("checksum mismatch"));
    }
    let fp_len = u32::from_le_bytes(body[12..16].try_into().unwrap()) as usize;
    let n = u64::from_le_bytes(body[16..24].try_into().unwrap());
    if n != blocks || fp_len > 32 {
        return Err(corrupt(&format!(
            "describes {n} blocks, the device has {blocks}"
        )));
    }
    let mut at = 24usize;
    let need = |at: usize, len: usize| {
        if at.checked_add(len).is_some_and(|end| end <= body.len()) {
            Ok(())
        } else {
            Err(corrupt("truncated"))
        }
    };
    need(at, n as usize * 4)?;
    let map = body[at..at + n as usize * 4]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    at += n as usize * 4;
    need(at, 8)?;
    let count = u64::from_le_bytes(body[at..at + 8].try_into().unwrap()) as usize;
    at += 8;
    need(at, count.saturating_mul(4 + fp_len))?;
    let mut fingerprints = Vec::with_capacity(count);
    for _ in 0..count {
        let slot = u32::from_le_bytes(body[at..at + 4].try_into().unwrap());
        let fp = Fingerprint::from_slice(&body[at + 4..at + 4 + fp_len])
            .map_err(|e| corrupt(&e.to_string()))?;
        fingerprints.push((slot, fp));
        at += 4 + fp_len;
    }
    if at != body.len() {
        return Err(corrupt("trailing bytes"));
    }
    Ok(Snapshot { map, fingerprints })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fp(n: u8) -> Fingerprint {
        Fingerprint::from_slice(&[n; 20]).unwrap()
    }

    #[test]
    fn a_torn_log_tail_is_cut_at_the_last_good_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let f = reset_log(&path).unwrap();
        let mut buf = Vec::new();
        Record::Write {
            block: 1,
            slot: 2,
            fingerprint: Some(fp(7)),
        }
        .encode_into(&mut buf);
        Record::Reference { block: 3, slot: 2 }.encode_into(&mut buf);
        let good = buf.len();
        Record::Unmap { block: 1 }.encode_into(&mut buf);
        f.write_all_at(&buf[..good + 10], LOG_HEADER_BYTES).unwrap();
        let (recs, end, torn) = read_log(&path).unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(end, LOG_HEADER_BYTES + good as u64);
        assert!(torn);
    }

    /// Found by the fuzz target `dedup_snapshot`: a fingerprint count whose
    /// byte length saturates (with a valid checksum) overflowed the bounds
    /// check; it is now a truncated snapshot.
    #[test]
    fn a_fingerprint_count_past_the_file_is_truncated_not_an_overflow() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let snap = Snapshot {
            map: vec![UNMAPPED; 4],
            fingerprints: Vec::new(),
        };
        write_snapshot(&path, &snap).unwrap();
        let mut b = std::fs::read(&path).unwrap();
        let at = 24 + 4 * 4;
        b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let end = b.len() - 4;
        let crc = crc32c::crc32c(&b[..end]);
        b[end..].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&path, &b).unwrap();
        let err = read_snapshot(&path, 4).err().expect("refused").to_string();
        assert!(err.contains("truncated"), "{err}");
    }

    #[test]
    fn a_corrupt_snapshot_is_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap");
        write_snapshot(
            &path,
            &Snapshot {
                map: vec![1, UNMAPPED, 1],
                fingerprints: vec![(1, fp(3))],
            },
        )
        .unwrap();
        let s = read_snapshot(&path, 3).unwrap();
        assert_eq!(s.map, vec![1, UNMAPPED, 1]);
        assert_eq!(s.fingerprints, vec![(1, fp(3))]);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[30] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = read_snapshot(&path, 3).err().unwrap().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
        assert!(read_snapshot(&path, 4).is_err());
    }

    proptest! {
        #[test]
        fn records_round_trip_and_any_flipped_byte_is_caught(
            kind in 0u8..3, block in any::<u64>(), slot in any::<u64>(), n in any::<u8>(), flip in 0usize..44
        ) {
            let rec = match kind {
                0 => Record::Write { block, slot, fingerprint: Some(fp(n)) },
                1 => Record::Reference { block, slot },
                _ => Record::Unmap { block },
            };
            let rec = if let Record::Unmap { block } = rec { Record::Unmap { block } } else { rec };
            let mut buf = Vec::new();
            rec.encode_into(&mut buf);
            let (back, len) = Record::decode(&buf).unwrap();
            prop_assert_eq!(len, buf.len());
            match (rec, back) {
                (Record::Unmap { block: a }, Record::Unmap { block: b }) => prop_assert_eq!(a, b),
                (a, b) => prop_assert_eq!(a, b),
            }
            let flip = flip % buf.len();
            buf[flip] ^= 0x10;
            prop_assert!(Record::decode(&buf).map(|(r, _)| r) != Some(rec));
        }
    }
}
