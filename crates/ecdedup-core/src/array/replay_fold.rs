//! A replay that folds the parity journal at the device that holds it
//! (`media::fold`; across the network one `Replay` message per parity
//! chunk, docs/cluster.md, "The data path"): the writer sends, per parity
//! row, where the parity is, the checksum its table says it has, and the
//! terms `c * (d(0) ^ d(r))` (parix) or the deltas (plog) by where the
//! journal's records lie on the device; the device reads, checks, folds
//! and writes, and answers each row's new checksum, which the writer
//! records as a write's.
//!
//! Only the clean, healthy path folds at the device: a stripe not being
//! resynchronised, every member holding it, a journal on the parity's own
//! device (format 2, no dedup layer between), every row's checksum known
//! and within the fold's bounds. Everything else, and every row the device
//! did not fold (its parity not the checksum expected, or unreadable), is
//! replayed by the fold in RAM (`logging.rs`), unchanged.
//!
//! The parity journals of the stripe are held from the lookup of where
//! their records lie until the device has read them: a compaction (a
//! replay's reclaim on another thread) cannot move them in between.
//!
//! Crash safety is the in-RAM fold's: the parity is written in place, not
//! synced (as `write_unit_blocks` writes it), under the stripe's intent
//! mark held by the caller, and the invalidation record is logged after;
//! a cut in between leaves the region dirty, and the next open
//! resynchronises the stripe from its data before any replay.

use super::journal::{ParityJournal, StripeLog};
use super::logging::MarkParity;
use super::store::{ChunkOp, ChunkReply, ChunkRequest, JournalGuard};
use super::Array;
use crate::counters::bump;
use crate::error::{Error, Result};
use crate::media::fold::{
    Fold, Row, RowAnswer, Term, FOLD_PARITY_BYTES_MAX, FOLD_ROWS_MAX, FOLD_TERMS_MAX,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering::Relaxed;

/// What folding at the device left of a parity unit's replay.
pub(super) enum DeviceFold {
    /// Not tried, or nothing done: the fold in RAM replays the unit.
    NotTried,
    /// Replayed (or the device failed, and the array goes on without it).
    Done,
    /// These rows were not folded (nothing written for them): the fold in
    /// RAM replays them, then the unit's records (`records`) are dropped.
    RowsLeft {
        rows: BTreeSet<u32>,
        records: usize,
    },
    Failed(Error),
}

/// A parity unit's fold, planned: its parts (each within the fold's
/// bounds) with their rows' checksum indexes and row numbers.
struct Planned {
    parts: Vec<(Fold, Vec<u64>, Vec<u32>)>,
    log: StripeLog,
}

impl Array {
    /// Folds every parity unit of a healthy `stripe` (`parity`: (j,
    /// device) as `parity_devices`) at its device where it can: every
    /// unit's fold in one batch (one round trip to the parity chunks).
    /// The caller holds the stripe lock exclusively and its intent mark.
    pub(super) fn fold_at_devices(
        &self,
        stripe: u64,
        parity: &[(usize, usize)],
    ) -> Vec<DeviceFold> {
        let g = &self.geo;
        let mut out: Vec<DeviceFold> = parity.iter().map(|_| DeviceFold::NotTried).collect();
        let healthy = (0..g.width()).all(|r| self.holds(g.place(stripe, r).device, stripe));
        if !healthy {
            return out;
        }
        // The journals held (in device order) from where their records
        // are looked up until the folds that read them there are done: a
        // compaction meanwhile (a replay's reclaim on another thread)
        // would move the records and free the places named.
        let mut order: Vec<usize> = parity.iter().map(|&(_, p)| p).collect();
        order.sort_unstable();
        order.dedup();
        let held: BTreeMap<usize, JournalGuard> = order
            .into_iter()
            .map(|p| (p, self.stores[p].journal_held()))
            .collect();
        let plans: Vec<Option<Planned>> = parity
            .iter()
            .map(|&(j, p)| self.plan_fold(stripe, j, p, held[&p].as_ref()?))
            .collect();
        let mut reqs = Vec::new();
        let mut owner = Vec::new();
        for (i, plan) in plans.iter().enumerate() {
            for (fold, indexes, _) in plan.iter().flat_map(|p| &p.parts) {
                let op = ChunkOp::Fold {
                    fold: fold.clone(),
                    indexes: indexes.clone(),
                    stripe,
                    fua: false,
                    answers: Vec::new(),
                };
                reqs.push(ChunkRequest::new(parity[i].1, op));
                owner.push(i);
            }
        }
        if reqs.is_empty() {
            return out;
        }
        self.submit(&mut reqs);
        drop(held);
        let mut replies = reqs.into_iter().zip(owner);
        // Units whose every row folded: (index, device, records), their
        // records dropped below.
        let mut folded = Vec::new();
        for (i, plan) in plans.into_iter().enumerate() {
            let Some(plan) = plan else { continue };
            let p = parity[i].1;
            let mut rows_left = BTreeSet::new();
            let mut failed = None;
            for (_, _, rows) in &plan.parts {
                let (req, _) = replies.next().expect("a reply per part");
                match req.reply {
                    ChunkReply::Done => {
                        let ChunkOp::Fold { answers, .. } = req.op else {
                            unreachable!("a fold's request")
                        };
                        for (&row, answer) in rows.iter().zip(answers) {
                            match answer {
                                RowAnswer::Folded { .. } => {
                                    bump(&self.counters.array.parity_rows_folded_at_device)
                                }
                                _ => {
                                    rows_left.insert(row);
                                }
                            }
                        }
                    }
                    // Nothing written: a device that does not fold (a
                    // chunk server without the op), or none in service.
                    ChunkReply::Unavailable | ChunkReply::Mismatch => rows_left.extend(rows),
                    ChunkReply::Failed(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                        rows_left.extend(rows)
                    }
                    ChunkReply::Failed(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
            out[i] = match failed {
                Some(e) => self.fold_failed(stripe, p, e),
                None => {
                    self.note_torn_records(stripe, p, &plan.log, &rows_left);
                    let records = plan.log.len();
                    let all_rows: usize = plan.parts.iter().map(|(_, _, rows)| rows.len()).sum();
                    if rows_left.len() == all_rows {
                        DeviceFold::NotTried
                    } else if rows_left.is_empty() {
                        folded.push((i, p, records));
                        DeviceFold::Done
                    } else {
                        DeviceFold::RowsLeft {
                            rows: rows_left,
                            records,
                        }
                    }
                }
            };
        }
        // Each journal's invalidation is an append of its own (a round
        // trip to its chunk): side by side where the chunks take it, as a
        // flush's journal syncs, not one parity after another.
        let devices: Vec<usize> = folded.iter().map(|&(_, p, _)| p).collect();
        let parallel = self.on_chunks_side_by_side(&devices);
        let dropped = super::meta::side_by_side(&folded, parallel, |&(_, p, records)| {
            self.drop_folded_records(stripe, p, records)
        });
        for (&(i, _, _), result) in folded.iter().zip(dropped) {
            if let Err(e) = result {
                out[i] = DeviceFold::Failed(e);
            }
        }
        out
    }

    /// The fold of parity unit `j` (on device `p`) of `stripe`, in the
    /// device's coordinates; None where it cannot fold at the device
    /// (nothing logged, the journal not on the parity's device, a row
    /// whose checksum is unknown, a row past the fold's bounds).
    fn plan_fold(
        &self,
        stripe: u64,
        j: usize,
        p: usize,
        journal: &ParityJournal,
    ) -> Option<Planned> {
        let g = &self.geo;
        let block = g.block();
        let store = &self.stores[p];
        let log = journal.stripe_log(stripe)?;
        let offsets = super::journal::logged_blocks(&log);
        // An error (an unreadable journal) is the fold in RAM's to meet.
        let runs = store.journal_place_blocks(journal, &offsets, block)?.ok()?;
        let mut runs = runs.into_iter();
        let place = g.place(stripe, g.k() + j);
        let mut rows: BTreeMap<u32, Vec<Term>> = BTreeMap::new();
        for ((role, row), entry) in &log {
            let terms = rows.entry(*row).or_default();
            match (entry.original, entry.latest) {
                (Some(_), Some(_)) => {
                    let (a, b) = (runs.next()?, runs.next()?);
                    let c = self.codec.coefficient(j, *role as usize);
                    terms.extend(split_terms(c, &a, Some(&b)));
                }
                (None, None) => {
                    for _ in &entry.deltas {
                        terms.extend(split_terms(1, &runs.next()?, None));
                    }
                }
                _ => {}
            }
        }
        let mut parts: Vec<(Fold, Vec<u64>, Vec<u32>)> = Vec::new();
        let rows_per_part = (FOLD_ROWS_MAX as u64).min(FOLD_PARITY_BYTES_MAX / block) as usize;
        for (row, terms) in rows {
            if terms.len() > FOLD_TERMS_MAX {
                return None;
            }
            let index = g.checksum_index(place.row, u64::from(row));
            let expected_crc32c = store.expected_checksum(stripe, index)?;
            let fits = parts.last().is_some_and(|(f, _, _)| {
                f.rows.len() < rows_per_part && f.terms() + terms.len() <= FOLD_TERMS_MAX
            });
            if !fits {
                let fold = Fold {
                    block_bytes: block as u32,
                    rows: Vec::new(),
                };
                parts.push((fold, Vec::new(), Vec::new()));
            }
            let (fold, indexes, numbers) = parts.last_mut().expect("a part");
            fold.rows.push(Row {
                parity: g.device_offset(place.row, u64::from(row)),
                expected_crc32c,
                terms,
            });
            indexes.push(index);
            numbers.push(row);
        }
        Some(Planned { parts, log })
    }

    /// A fold the device failed: a full file system fails the replay (the
    /// caller resynchronises the stripe from its data); any other error
    /// fails the device, as a journal read or parity write error in the
    /// fold in RAM does, and its records are forgotten (its parity is
    /// rebuilt from data, if ever).
    fn fold_failed(&self, stripe: u64, p: usize, e: std::io::Error) -> DeviceFold {
        if !Self::is_space_error(&e) && self.journal_on_device_failed(p, "parity fold", &e) {
            self.stores[p].journal_forget(stripe);
            return DeviceFold::Done;
        }
        DeviceFold::Failed(Error::io(
            format!("folding the parity journal of device {p} into stripe {stripe}'s parity"),
            e,
        ))
    }

    /// What the fold in RAM says of a torn entry (d(r) without d(0)),
    /// for the rows the device folded (the fold in RAM says it of the
    /// rows it replays).
    fn note_torn_records(&self, stripe: u64, p: usize, log: &StripeLog, rows_left: &BTreeSet<u32>) {
        for ((role, row), entry) in log {
            let torn = entry.original.is_some() != entry.latest.is_some();
            if torn && !rows_left.contains(row) {
                bump(&self.counters.array.torn_journal_records);
                self.warn(format!(
                    "parity journal of device {p}: stripe {stripe} role {role} block {row} \
                     has d(r) without d(0) (a write a power cut tore before it was flushed): \
                     left out"
                ));
            }
        }
    }

    /// After the fold: the stripe's records dropped (an invalidation
    /// logged), as after the fold in RAM's parity writes.
    fn drop_folded_records(&self, stripe: u64, p: usize, records: usize) -> Result<()> {
        let rows = self.geo.blocks_per_unit();
        let (fold, entries) = (super::journal::Mark::AfterFold, MarkParity::Entries);
        self.invalidate_in(p, stripe, 0, rows, fold, entries)?;
        self.counters
            .array
            .records_replayed
            .fetch_add(records as u64, Relaxed);
        Ok(())
    }
}

/// The terms of one logged block: `c * (a ^ b)` over the whole parity
/// block, split where `a`'s or `b`'s runs on the device end (a record
/// that crosses an extent of the metadata area).
fn split_terms(c: u8, a: &[(u64, usize)], b: Option<&Vec<(u64, usize)>>) -> Vec<Term> {
    // Every place a run of a or b ends, in bytes from the block's start.
    let ends = |runs: &[(u64, usize)]| -> Vec<usize> {
        runs.iter()
            .scan(0usize, |at, &(_, n)| {
                *at += n;
                Some(*at)
            })
            .collect()
    };
    let mut cuts: Vec<usize> = ends(a);
    if let Some(b) = b {
        cuts.extend(ends(b));
    }
    cuts.sort_unstable();
    cuts.dedup();
    // The device offset of byte `x` of the block in `runs`.
    let at = |runs: &[(u64, usize)], x: usize| -> u64 {
        let mut start = 0usize;
        for &(offset, n) in runs {
            if x < start + n {
                return offset + (x - start) as u64;
            }
            start += n;
        }
        unreachable!("a byte inside the block's runs")
    };
    let mut terms = Vec::with_capacity(cuts.len());
    let mut from = 0usize;
    for end in cuts {
        terms.push(Term {
            coefficient: c,
            at: from as u32,
            len: (end - from) as u32,
            a: at(a, from),
            b: b.map(|b| at(b, from)),
        });
        from = end;
    }
    terms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_split_across_extents_becomes_terms_cut_where_either_run_ends() {
        let a = [(1000u64, 100usize), (5000, 3996)];
        let b = vec![(9000u64, 4000usize), (20000, 96)];
        let terms = split_terms(7, &a, Some(&b));
        let pieces: Vec<(u32, u32, u64, Option<u64>)> =
            terms.iter().map(|t| (t.at, t.len, t.a, t.b)).collect();
        assert_eq!(
            pieces,
            vec![
                (0, 100, 1000, Some(9000)),
                (100, 3900, 5000, Some(9100)),
                (4000, 96, 8900, Some(20000)),
            ]
        );
        assert!(terms.iter().all(|t| t.coefficient == 7));
        let whole = split_terms(1, &[(64, 4096)], None);
        assert_eq!(whole.len(), 1);
        assert_eq!(
            (whole[0].at, whole[0].len, whole[0].a, whole[0].b),
            (0, 4096, 64, None)
        );
    }
}
