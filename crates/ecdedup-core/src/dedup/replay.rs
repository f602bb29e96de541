//! Replay of a dedup map log at open: the snapshot's map, then the log's
//! records, of which only those the slot bytes bear out are believed.
//!
//! Between two syncs a power loss can keep a map record and lose the slot
//! write it points at (the kernel wrote the log page back, not the slot's),
//! so a record is evidence of a mapping only once the slot holds the
//! content the record names. The log says which records need the check: a
//! sync record is appended (and synced with the log) only after the
//! device's slots were synced, so every record before the last sync record
//! points at durable bytes and is replayed as it stands. A record after it
//! carries the CRC32C of its block's content, and is believed only when
//! the slot's bytes have that checksum; otherwise the block falls back to
//! its previous record after the sync, or to its mapping at the sync.
//!
//! The fallback is safe because a slot a block let go of is reused only
//! after the next sync (`pending_free`), so the previous slot still holds
//! what it held at the sync (or what this block itself wrote there in
//! place: its own old, new or torn bytes, all of which a write not yet
//! flushed may leave). Reference counts are counted from the resulting map,
//! so they follow the fallback. A fingerprint is kept only for a slot no
//! unbelieved write record touched, or that a believed one vouches for.
//!
//! Cost: one slot read per checked record that is a block's latest (more
//! only where a check fails), bounded by the writes since the last sync.

use super::log::{Record, UNMAPPED};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use std::collections::HashMap;

/// The map and fingerprints a replay ends with.
pub(super) struct Replayed {
    /// Dedup block → slot.
    pub map: Vec<u32>,
    /// Slots in the order they were last written or referenced, oldest
    /// first (the snapshot's fingerprints, then the believed records).
    pub recency: Vec<u32>,
    /// Fingerprints of slots whose content they describe.
    pub slot_fp: HashMap<u32, Fingerprint>,
    /// Records after the last sync record.
    pub unsynced_records: u64,
    /// Of those, records that the slot bytes did not bear out.
    pub refused_records: u64,
}

/// Checks every record against the device's geometry and the
/// fingerprint length; `bad` names the log in the error.
fn validate(
    records: &[Record],
    blocks: u64,
    key_bytes: usize,
    bad: &dyn Fn(String) -> Error,
) -> Result<()> {
    for rec in records {
        let (block, slot, fingerprint) = match *rec {
            Record::Write {
                block,
                slot,
                fingerprint,
                ..
            } => (block, slot, fingerprint),
            Record::Reference { block, slot, .. } => (block, slot, None),
            Record::Unmap { block } => (block, 0, None),
            Record::Sync => continue,
        };
        if block >= blocks || slot >= blocks {
            return Err(bad(format!(
                "record names block {block} slot {slot} of {blocks}"
            )));
        }
        if let Some(fp) = fingerprint.filter(|fp| fp.as_bytes().len() != key_bytes) {
            return Err(bad(format!(
                "record holds a {}-byte fingerprint, the array uses {key_bytes}",
                fp.as_bytes().len()
            )));
        }
    }
    Ok(())
}

impl Replayed {
    fn apply(&mut self, rec: &Record) {
        match *rec {
            Record::Write {
                block,
                slot,
                fingerprint,
                ..
            } => {
                self.map[block as usize] = slot as u32;
                match fingerprint {
                    Some(fp) => {
                        self.recency.push(slot as u32);
                        self.slot_fp.insert(slot as u32, fp);
                    }
                    None => {
                        self.slot_fp.remove(&(slot as u32));
                    }
                }
            }
            Record::Reference { block, slot, .. } => {
                self.map[block as usize] = slot as u32;
                self.recency.push(slot as u32);
            }
            Record::Unmap { block } => self.map[block as usize] = UNMAPPED,
            Record::Sync => {}
        }
    }
}

/// Replays `records` over the snapshot's `map` and `fingerprints`.
/// `slot_crc(slot)` reads a slot and returns the CRC32C of its bytes.
pub(super) fn replay(
    map: Vec<u32>,
    fingerprints: Vec<(u32, Fingerprint)>,
    records: &[Record],
    key_bytes: usize,
    slot_crc: &mut dyn FnMut(u32) -> Result<u32>,
    bad: &dyn Fn(String) -> Error,
) -> Result<Replayed> {
    let blocks = map.len() as u64;
    validate(records, blocks, key_bytes, bad)?;
    let mut out = Replayed {
        map,
        recency: fingerprints.iter().map(|(s, _)| *s).collect(),
        slot_fp: fingerprints.into_iter().collect(),
        unsynced_records: 0,
        refused_records: 0,
    };
    let synced = records
        .iter()
        .rposition(|r| *r == Record::Sync)
        .map_or(0, |i| i + 1);
    for rec in &records[..synced] {
        out.apply(rec);
    }
    let tail = &records[synced..];
    out.unsynced_records = tail.len() as u64;
    // Each block's records after the sync, in log order.
    let mut by_block: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, rec) in tail.iter().enumerate() {
        let block = match *rec {
            Record::Write { block, .. }
            | Record::Reference { block, .. }
            | Record::Unmap { block } => block,
            Record::Sync => unreachable!("no sync record after the last one"),
        };
        by_block.entry(block).or_default().push(i);
    }
    let mut crc_of: HashMap<u32, u32> = HashMap::new();
    let mut believed = vec![false; tail.len()];
    for indexes in by_block.values() {
        for &i in indexes.iter().rev() {
            let (slot, content) = match tail[i] {
                Record::Write { slot, content, .. } | Record::Reference { slot, content, .. } => {
                    (slot as u32, content)
                }
                _ => (UNMAPPED, None),
            };
            let holds = match content {
                None => true,
                Some(want) => {
                    let have = match crc_of.get(&slot) {
                        Some(&c) => c,
                        None => {
                            let c = slot_crc(slot)?;
                            crc_of.insert(slot, c);
                            c
                        }
                    };
                    have == want
                }
            };
            if holds {
                believed[i] = true;
                break;
            }
            out.refused_records += 1;
        }
    }
    for (i, rec) in tail.iter().enumerate() {
        if let Record::Write { slot, .. } = *rec {
            // Written since the sync: the slot's old fingerprint no longer
            // describes it unless a believed record says so again.
            out.slot_fp.remove(&(slot as u32));
        }
        if believed[i] {
            out.apply(rec);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(n: u8) -> Fingerprint {
        Fingerprint::from_slice(&[n; 32]).unwrap()
    }

    fn write(block: u64, slot: u64, content: u32) -> Record {
        Record::Write {
            block,
            slot,
            fingerprint: Some(fp(content as u8)),
            content: Some(content),
        }
    }

    fn run(records: &[Record], slots: &[u32]) -> Replayed {
        let map = vec![UNMAPPED; slots.len()];
        let bad = |why: String| Error::Corrupt(why);
        replay(
            map,
            Vec::new(),
            records,
            32,
            &mut |s| Ok(slots[s as usize]),
            &bad,
        )
        .unwrap()
    }

    #[test]
    fn records_before_the_last_sync_are_believed_without_a_look_at_the_slots() {
        // Slot 0 holds content 9, not the 1 its record names.
        let r = run(&[write(0, 0, 1), Record::Sync], &[9, 0]);
        assert_eq!(r.map[0], 0);
        assert_eq!((r.unsynced_records, r.refused_records), (0, 0));
    }

    #[test]
    fn a_record_whose_slot_lacks_its_content_falls_back_to_the_block_s_previous_mapping() {
        // Block 0: slot 0 at the sync, then slot 1 (lost), then slot 2 (lost).
        // Block 1: a reference to slot 2 (lost too), then nothing.
        let records = [
            write(0, 0, 5),
            Record::Sync,
            write(0, 1, 6),
            write(0, 2, 7),
            Record::Reference {
                block: 1,
                slot: 2,
                content: Some(7),
            },
        ];
        let r = run(&records, &[5, 0, 0]);
        assert_eq!(r.map[..2], [0, UNMAPPED]);
        assert_eq!((r.unsynced_records, r.refused_records), (3, 3));
        assert_eq!(r.slot_fp.get(&0), Some(&fp(5)));
        assert!(!r.slot_fp.contains_key(&2), "no fingerprint for lost bytes");
        // Slot 1 did reach the media: block 0 stops there.
        let r = run(&records, &[5, 6, 0]);
        assert_eq!(r.map[..2], [1, UNMAPPED]);
        assert_eq!(r.refused_records, 2);
        assert_eq!(r.slot_fp.get(&1), Some(&fp(6)));
    }

    #[test]
    fn an_unmap_and_a_record_without_content_checksum_are_believed_as_they_stand() {
        let records = [
            write(0, 0, 5),
            Record::Sync,
            Record::Unmap { block: 0 },
            Record::Write {
                block: 1,
                slot: 1,
                fingerprint: None,
                content: None,
            },
        ];
        let r = run(&records, &[5, 3]);
        assert_eq!(r.map[..2], [UNMAPPED, 1]);
        assert_eq!(r.refused_records, 0);
    }
}
