//! The dedup map's persistent form: a snapshot plus an append-only log.
//!
//! Log record, version 2 (little endian), 28 bytes + fingerprint:
//! ```text
//! 0   u32  CRC32C of bytes 4..28+fp_len
//! 4   u8   kind: 1 = write (block -> new slot, with the slot's fingerprint),
//!               2 = reference (block -> existing slot), 3 = unmap,
//!               4 = sync (every record before it, and the slot bytes they
//!               point at, were durable when it was appended)
//! 5   u8   fingerprint length (0: slot content not fingerprinted)
//! 6   u8   flags: bit 0 = bytes 24..28 hold the content checksum
//! 7   u8   zero
//! 8   u64  block (dedup-block number in the device's data area)
//! 16  u64  slot
//! 24  u32  CRC32C of the block_bytes the record maps the block to (the
//!          slot's content), or zero without flag bit 0
//! 28  ..   fingerprint bytes
//! ```
//! Only a write record that leaves the block on its slot (the full-device
//! path withdrawing a fingerprint before an in-place overwrite) carries no
//! content checksum. Version 1 records (24 bytes: no content checksum, no
//! sync record, bytes 6..8 zero) are still read, as vouched for, and the
//! log is rewritten in version 2 at open.
//!
//! The log starts with a 32-byte header (magic `ECDDML01`, u32 version at
//! 8, zeros, CRC32C of bytes 0..28 at 28).
//! Replay stops at the first record that is short or fails its CRC: a torn
//! tail is cut there, never skipped over. Records are idempotent
//! assignments, so replaying a log over a snapshot that already contains
//! it (a crash between the snapshot's replacement and the log's) ends in the same
//! state. Records after the last sync record are checked against the slot
//! bytes they point at before they are believed (`dedup/replay.rs`).
//!
//! Snapshot: magic `ECDDMS01`, version, block count, fingerprint length,
//! one u32 slot per block (u32::MAX = unmapped), then the count of
//! fingerprinted slots and (u32 slot, fingerprint) pairs, then a CRC32C of
//! everything before it. Replaced whole, atomically and durably
//! ([`Storage::write_atomic`]).
//!
//! Every byte goes through the array's [`Storage`], so the power-loss
//! simulator meets the maps as it meets the devices.

use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::media::storage::{read_all, write_atomic, Storage, StorageFile};
use std::path::Path;
use std::sync::Arc;

pub const LOG_MAGIC: [u8; 8] = *b"ECDDML01";
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"ECDDMS01";
pub const LOG_HEADER_BYTES: u64 = 32;
/// The log version this build writes (records with a content checksum).
pub const LOG_VERSION: u32 = 2;
/// The oldest log version this build reads.
pub const LOG_VERSION_MIN: u32 = 1;
pub const RECORD_HEADER_BYTES: usize = 28;
/// Record header of version 1 logs.
const RECORD_HEADER_BYTES_V1: usize = 24;
/// Flag: bytes 24..28 hold the content checksum.
const FLAG_CONTENT: u8 = 1;
pub const UNMAPPED: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    Write {
        block: u64,
        slot: u64,
        fingerprint: Option<Fingerprint>,
        /// CRC32C of the slot's bytes as written (None: version 1, or a
        /// record that leaves the block on its slot).
        content: Option<u32>,
    },
    Reference {
        block: u64,
        slot: u64,
        /// CRC32C of the slot's bytes (None: version 1).
        content: Option<u32>,
    },
    Unmap {
        block: u64,
    },
    /// Everything before this record was durable when it was appended.
    Sync,
}

impl Record {
    /// Encodes the record in the current version.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let (kind, block, slot, fp, content) = match *self {
            Record::Write {
                block,
                slot,
                fingerprint,
                content,
            } => (1u8, block, slot, fingerprint, content),
            Record::Reference {
                block,
                slot,
                content,
            } => (2, block, slot, None, content),
            Record::Unmap { block } => (3, block, 0, None, None),
            Record::Sync => (4, 0, 0, None, None),
        };
        let start = out.len();
        let fp_bytes = fp.as_ref().map(|f| f.as_bytes()).unwrap_or(&[]);
        out.extend_from_slice(&[0; 4]);
        out.push(kind);
        out.push(fp_bytes.len() as u8);
        out.push(if content.is_some() { FLAG_CONTENT } else { 0 });
        out.push(0);
        out.extend_from_slice(&block.to_le_bytes());
        out.extend_from_slice(&slot.to_le_bytes());
        out.extend_from_slice(&content.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(fp_bytes);
        debug_assert_eq!(out.len() - start, RECORD_HEADER_BYTES + fp_bytes.len());
        let crc = crc32c::crc32c(&out[start + 4..]);
        out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes one record of a log of `version`; None for a short, torn or
    /// unknown one.
    pub fn decode(b: &[u8], version: u32) -> Option<(Record, usize)> {
        let header = if version == 1 {
            RECORD_HEADER_BYTES_V1
        } else {
            RECORD_HEADER_BYTES
        };
        if b.len() < header {
            return None;
        }
        let fp_len = b[5] as usize;
        let len = header + fp_len;
        if fp_len > 32 || b.len() < len {
            return None;
        }
        let crc = u32::from_le_bytes(b[0..4].try_into().unwrap());
        if crc != crc32c::crc32c(&b[4..len]) {
            return None;
        }
        let block = u64::from_le_bytes(b[8..16].try_into().unwrap());
        let slot = u64::from_le_bytes(b[16..24].try_into().unwrap());
        let content = (version > 1 && b[6] & FLAG_CONTENT != 0)
            .then(|| u32::from_le_bytes(b[24..28].try_into().unwrap()));
        let rec = match b[4] {
            1 => Record::Write {
                block,
                slot,
                fingerprint: if fp_len > 0 {
                    Some(Fingerprint::from_slice(&b[header..len]).ok()?)
                } else {
                    None
                },
                content,
            },
            2 => Record::Reference {
                block,
                slot,
                content,
            },
            3 => Record::Unmap { block },
            4 if version > 1 => Record::Sync,
            _ => return None,
        };
        Some((rec, len))
    }
}

fn log_header(version: u32) -> [u8; LOG_HEADER_BYTES as usize] {
    let mut h = [0u8; LOG_HEADER_BYTES as usize];
    h[0..8].copy_from_slice(&LOG_MAGIC);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// What [`read_log`] found.
pub struct LogContents {
    pub records: Vec<Record>,
    /// Offset where the valid records end.
    pub end: u64,
    /// Whether bytes follow `end` (a torn tail, to be cut).
    pub torn: bool,
    pub version: u32,
}

/// Replaces the log by an empty one, durably and atomically
/// ([`Storage::write_atomic`]: a crash leaves the old log or the empty
/// one), and opens it.
pub fn reset_log(storage: &dyn Storage, path: &Path) -> Result<Arc<dyn StorageFile>> {
    let io = |e| Error::io(format!("writing dedup log {}", path.display()), e);
    write_atomic(storage, path, &log_header(LOG_VERSION)).map_err(io)?;
    storage.open(path).map_err(io)
}

/// Reads a log of version 1 or 2.
pub fn read_log(storage: &dyn Storage, path: &Path) -> Result<LogContents> {
    let bytes = read_all(storage, path)
        .map_err(|e| Error::io(format!("reading dedup log {}", path.display()), e))?;
    let version = bytes
        .get(8..12)
        .map(|v| u32::from_le_bytes(v.try_into().unwrap()))
        .unwrap_or(0);
    if bytes.len() < LOG_HEADER_BYTES as usize || bytes[..32] != log_header(version) {
        return Err(Error::Corrupt(format!(
            "dedup log {} has no valid header",
            path.display()
        )));
    }
    if !(LOG_VERSION_MIN..=LOG_VERSION).contains(&version) {
        return Err(Error::Corrupt(format!(
            "dedup log {} is version {version}; this build reads versions \
             {LOG_VERSION_MIN} to {LOG_VERSION}",
            path.display()
        )));
    }
    let mut records = Vec::new();
    let mut at = LOG_HEADER_BYTES as usize;
    while let Some((rec, len)) = Record::decode(&bytes[at..], version) {
        records.push(rec);
        at += len;
    }
    Ok(LogContents {
        records,
        end: at as u64,
        torn: at != bytes.len(),
        version,
    })
}

pub struct Snapshot {
    pub map: Vec<u32>,
    pub fingerprints: Vec<(u32, Fingerprint)>,
}

/// Replaces the snapshot atomically and durably (see [`write_atomic`]).
pub fn write_snapshot(storage: &dyn Storage, path: &Path, snap: &Snapshot) -> Result<()> {
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
    write_atomic(storage, path, &b).map_err(io)
}

pub fn read_snapshot(storage: &dyn Storage, path: &Path, blocks: u64) -> Result<Snapshot> {
    let bytes = read_all(storage, path)
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
    use crate::media::OsStorage;
    use proptest::prelude::*;

    fn fp(n: u8) -> Fingerprint {
        Fingerprint::from_slice(&[n; 20]).unwrap()
    }

    #[test]
    fn a_torn_log_tail_is_cut_at_the_last_good_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let f = reset_log(&OsStorage, &path).unwrap();
        let mut buf = Vec::new();
        Record::Write {
            block: 1,
            slot: 2,
            fingerprint: Some(fp(7)),
            content: Some(0xabcd),
        }
        .encode_into(&mut buf);
        Record::Reference {
            block: 3,
            slot: 2,
            content: Some(0xabcd),
        }
        .encode_into(&mut buf);
        Record::Sync.encode_into(&mut buf);
        let good = buf.len();
        Record::Unmap { block: 1 }.encode_into(&mut buf);
        f.write_at(&buf[..good + 10], LOG_HEADER_BYTES).unwrap();
        let log = read_log(&OsStorage, &path).unwrap();
        assert_eq!(log.records.len(), 3);
        assert_eq!(log.records[2], Record::Sync);
        assert_eq!(log.end, LOG_HEADER_BYTES + good as u64);
        assert!(log.torn);
        assert_eq!(log.version, LOG_VERSION);
    }

    /// A version 1 record, as the previous build wrote it.
    fn v1_record(kind: u8, block: u64, slot: u64, fp: Option<Fingerprint>) -> Vec<u8> {
        let fp_bytes = fp.as_ref().map(|f| f.as_bytes()).unwrap_or(&[]);
        let mut r = vec![0u8; 4];
        r.extend_from_slice(&[kind, fp_bytes.len() as u8, 0, 0]);
        r.extend_from_slice(&block.to_le_bytes());
        r.extend_from_slice(&slot.to_le_bytes());
        r.extend_from_slice(fp_bytes);
        let crc = crc32c::crc32c(&r[4..]);
        r[..4].copy_from_slice(&crc.to_le_bytes());
        r
    }

    #[test]
    fn a_version_1_log_is_read_without_content_checksums_and_a_newer_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut bytes = log_header(1).to_vec();
        bytes.extend(v1_record(1, 1, 2, Some(fp(7))));
        bytes.extend(v1_record(2, 3, 2, None));
        bytes.extend(v1_record(3, 1, 0, None));
        std::fs::write(&path, &bytes).unwrap();
        let log = read_log(&OsStorage, &path).unwrap();
        assert_eq!(log.version, 1);
        assert!(!log.torn);
        assert_eq!(
            log.records,
            vec![
                Record::Write {
                    block: 1,
                    slot: 2,
                    fingerprint: Some(fp(7)),
                    content: None
                },
                Record::Reference {
                    block: 3,
                    slot: 2,
                    content: None
                },
                Record::Unmap { block: 1 },
            ]
        );
        std::fs::write(&path, log_header(3)).unwrap();
        let err = read_log(&OsStorage, &path).err().unwrap().to_string();
        assert!(err.contains("is version 3"), "{err}");
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
        let os = crate::media::OsStorage::shared();
        write_snapshot(os.as_ref(), &path, &snap).unwrap();
        let mut b = std::fs::read(&path).unwrap();
        let at = 24 + 4 * 4;
        b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let end = b.len() - 4;
        let crc = crc32c::crc32c(&b[..end]);
        b[end..].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&path, &b).unwrap();
        let err = read_snapshot(os.as_ref(), &path, 4)
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("truncated"), "{err}");
    }

    #[test]
    fn a_corrupt_snapshot_is_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap");
        write_snapshot(
            &OsStorage,
            &path,
            &Snapshot {
                map: vec![1, UNMAPPED, 1],
                fingerprints: vec![(1, fp(3))],
            },
        )
        .unwrap();
        let s = read_snapshot(&OsStorage, &path, 3).unwrap();
        assert_eq!(s.map, vec![1, UNMAPPED, 1]);
        assert_eq!(s.fingerprints, vec![(1, fp(3))]);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[30] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = read_snapshot(&OsStorage, &path, 3)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
        assert!(read_snapshot(&OsStorage, &path, 4).is_err());
    }

    proptest! {
        #[test]
        fn records_round_trip_and_any_flipped_byte_is_caught(
            kind in 0u8..4, block in any::<u64>(), slot in any::<u64>(), n in any::<u8>(),
            content in proptest::option::of(any::<u32>()), flip in 0usize..48
        ) {
            let rec = match kind {
                0 => Record::Write { block, slot, fingerprint: Some(fp(n)), content },
                1 => Record::Reference { block, slot, content },
                2 => Record::Unmap { block },
                _ => Record::Sync,
            };
            let mut buf = Vec::new();
            rec.encode_into(&mut buf);
            let (back, len) = Record::decode(&buf, LOG_VERSION).unwrap();
            prop_assert_eq!(len, buf.len());
            prop_assert_eq!(rec, back);
            let flip = flip % buf.len();
            buf[flip] ^= 0x10;
            prop_assert!(Record::decode(&buf, LOG_VERSION).map(|(r, _)| r) != Some(rec));
        }
    }
}
