//! Long operations over whole stripes: resync after an unclean stop, scrub
//! and rebuild. Each takes one stripe lock at a time, so the volume stays
//! served while they run, and reports progress.

use super::decode::MemberRead;
use super::{Array, MemberState, ProgressFn};
use crate::counters::bump;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

/// How often a rebuild records its cursor in the superblocks.
const REBUILD_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(2);
/// Most stripes a rebuild reconstructs together (`Array::rebuild_window`).
const REBUILD_WINDOW_STRIPES: u64 = 16;
/// About the most bytes of member units a rebuild window reads at once.
const REBUILD_WINDOW_BYTES: u64 = 16 << 20;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ScrubReport {
    pub stripes: u64,
    pub checksum_mismatches: u64,
    pub repaired_blocks: u64,
    pub parity_mismatches: u64,
    /// Stripes that could not be checked fully because a member is out of service.
    pub degraded_stripes: u64,
    /// Blocks a repairing scrub could not repair: in a stripe read whole,
    /// every block of a row that failed its checksum where more failed
    /// than the parity covers; in a degraded stripe, one per row that
    /// does not decode.
    pub unrecoverable_blocks: u64,
    /// Block rows of degraded stripes decoded from exactly k members with
    /// no checksum known for the missing ones: nothing could check them.
    #[serde(default)]
    pub unchecked_rows: u64,
    /// Stripes whose parity disagrees with their data in a row where a
    /// repairing scrub could not tell which member is wrong (m = 1, or
    /// more members disagree than the others outvote): reported and left
    /// unchanged.
    #[serde(default)]
    pub unlocated_stripes: u64,
    /// Inconsistencies of the dedup maps (a block naming a slot out of
    /// range, reference counts that disagree with the map, a referenced
    /// slot on a free list, a leaked slot), one line each; a scrub that
    /// finds any fails.
    #[serde(default)]
    pub dedup_map_problems: Vec<String>,
    /// Copies of the mirrored metadata files (format 2: intent map,
    /// degraded-write and missed-write logs, settings) that differ from
    /// the copy most devices hold, are missing or cannot be read, one line
    /// each, saying what a repairing scrub did about it.
    #[serde(default)]
    pub metadata_copy_problems: Vec<String>,
    /// Of those, the copies a repairing scrub rewrote from the good copy.
    #[serde(default)]
    pub metadata_copies_repaired: u64,
}

impl Array {
    /// Reads every unit of a stripe whole, unverified, in one batch. None
    /// for a unit whose device does not hold the stripe or failed to read.
    pub(super) fn read_stripe_raw(&self, stripe: u64) -> Vec<Option<Vec<u8>>> {
        let roles: Vec<usize> = (0..self.geo.width()).collect();
        self.read_units_raw(stripe, &roles)
    }

    pub(super) fn encode_parity(&self, units: &[Option<Vec<u8>>]) -> Vec<Vec<u8>> {
        let d: Vec<&[u8]> = units[..self.geo.k()]
            .iter()
            .map(|u| u.as_deref().expect("all data present"))
            .collect();
        self.encode_data(&d)
    }

    /// The m parity pieces of k data pieces of one length (units, or one
    /// block row's blocks).
    pub(super) fn encode_data(&self, d: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut parity = vec![vec![0u8; d[0].len()]; self.geo.m()];
        let mut p: Vec<&mut [u8]> = parity.iter_mut().map(|v| v.as_mut_slice()).collect();
        self.codec.encode(d, &mut p);
        parity
    }

    /// Resynchronises dirty stripes after an unclean stop: parity from data,
    /// checksums from content. Runs before the array serves.
    pub(super) fn resync(
        &self,
        ranges: &[(u64, u64)],
        progress: Option<&ProgressFn>,
    ) -> Result<()> {
        let total: u64 = ranges.iter().map(|(a, b)| b - a).sum();
        let mut done = 0;
        let mut degraded = 0u64;
        let mismatches_before = self.counters.array.resync_checksum_mismatches.load(SeqCst);
        let restored_before = self.counters.array.resync_blocks_restored.load(SeqCst);
        for &(start, end) in ranges {
            for stripe in start..end {
                let _g = self.locks[Self::lock_index(stripe)].write().unwrap();
                if !self.resync_stripe(stripe, true) {
                    degraded += 1;
                }
                done += 1;
                if let Some(p) = progress {
                    if done % 64 == 0 || done == total {
                        p("resync", done, total);
                    }
                }
            }
        }
        let mismatches =
            self.counters.array.resync_checksum_mismatches.load(SeqCst) - mismatches_before;
        let restored = self.counters.array.resync_blocks_restored.load(SeqCst) - restored_before;
        if restored > 0 {
            self.warn(format!(
                "resync: {restored} blocks of the dirty stripes had changed since their last sync \
                 while the members around them had not, and decoded back to their recorded \
                 checksums: rewritten from the decode (corruption at rest, or an unflushed write \
                 whose every parity write the stop lost)"
            ));
        }
        if mismatches > 0 {
            self.warn(format!(
                "resync: {mismatches} blocks of the dirty stripes no longer matched their recorded \
                 checksums (writes in flight at the stop, or corruption); their checksums now follow \
                 their content"
            ));
        }
        if degraded > 0 {
            self.warn(format!(
                "{degraded} dirty stripes with a device out of service have rows the degraded-write log does not \
                 cover: rows not written while degraded since the last flush (the failure synced every \
                 device), or whose log a cut tore; they decode from parity as it is, and every decoded \
                 block is checked (docs/write-hole.md)"
            ));
        }
        self.flush()?;
        self.intent
            .clear_all()
            .map_err(|e| Error::io("clearing the write-intent log", e))?;
        Ok(())
    }

    /// Returns false when the stripe is degraded and could only be
    /// re-checksummed. `at_open`: the resync of an open, before serving
    /// (the stripe dirty at an unclean stop); else a stripe resynchronised
    /// while the array serves (after a failed journal append, a failed
    /// replay or a space error), whose writes this open saw.
    pub(super) fn resync_stripe(&self, stripe: u64, at_open: bool) -> bool {
        let g = &self.geo;
        if at_open {
            self.settle_deferred_marks(stripe);
        }
        // Covered by the degraded-write log: every missing data unit's
        // value logged, for every row. A log that holds some missing units
        // and not others (one out before the stop, logged; one lost at
        // this open, in service at the stop) does not cover the stripe:
        // the journal's records are then the only account of the other's
        // writes since the parity was last written. Taken for covered, the
        // records were dropped and parity recomputed without that unit's
        // value (the cluster simulator's seed 397781, parix: a fold's
        // parity write and its mark both lost to a cut, the unit's flushed
        // block read back as zeroes).
        let logged = || {
            self.degraded_log.as_ref().is_some_and(|l| {
                l.has_stripe(stripe)
                    && self.missing_data_roles(stripe).iter().all(|&role| {
                        (0..g.blocks_per_unit())
                            .all(|row| matches!(l.value(stripe, role, row), Ok(Some(_))))
                    })
            })
        };
        // Whole, or covered by the degraded-write log (newer than any
        // record: a replay cut short may have folded them in already),
        // parity is recomputed below from data and the log, and the
        // journal's records are dropped only then: dropped first, a member
        // lost before the recompute (a frame lost, a server gone) left
        // stale parity and no record to fold, and the lost unit decoded
        // wrong (cluster simulator seed 1253: an I/O error on a block
        // flushed long before).
        let mut drop_records = false;
        if self.journal_pending(stripe) {
            let all_held =
                (0..g.width()).all(|role| self.holds(g.place(stripe, role).device, stripe));
            if all_held || logged() {
                drop_records = true;
            } else {
                self.replay_degraded_dirty(stripe);
            }
        }
        let mut units = self.read_stripe_raw(stripe);
        bump(&self.counters.array.resync_stripes);
        let mut complete = units.iter().all(Option::is_some);
        if drop_records && !complete && !logged() {
            // A member was lost since: the records are the only account of
            // the updates parity lacks.
            drop_records = false;
            self.replay_degraded_dirty(stripe);
            units = self.read_stripe_raw(stripe);
            complete = units.iter().all(Option::is_some);
        }
        if complete {
            if at_open {
                self.restore_rotten_blocks(stripe, &mut units);
            }
            let parity = self.encode_parity(&units);
            for (j, p) in parity.iter().enumerate() {
                if units[g.k() + j].as_deref() != Some(p.as_slice()) {
                    bump(&self.counters.array.parity_mismatches);
                    self.write_unit_blocks(stripe, g.k() + j, 0, p);
                } else {
                    // One codeword now: a mark of the row as undecodable
                    // (`mark_row_undecodable`) goes with the rest.
                    self.record_checksums(stripe, g.k() + j, p);
                    let place = g.place(stripe, g.k() + j);
                    self.stores[place.device].record_checksums(g.checksum_index(place.row, 0), p);
                }
            }
            for (role, u) in units[..g.k()].iter().enumerate() {
                self.record_checksums(stripe, role, u.as_deref().unwrap());
            }
        } else {
            // Before the entries follow the content: the rows a write in
            // flight at the stop may have torn with no log of it.
            let torn = self.rows_torn_unlogged(stripe, &units);
            for (role, u) in units.iter().enumerate() {
                if let Some(u) = u {
                    self.record_checksums(stripe, role, u);
                }
            }
            // A degraded stripe: the degraded-write log says what its
            // missing data units must decode to.
            complete = self.resync_from_degraded_log(stripe, &units, &torn, at_open);
        }
        if drop_records {
            if let Err(e) = self.journal_invalidate(stripe, 0, g.blocks_per_unit()) {
                self.warn(format!("stripe {stripe}: {e}"));
            }
        }
        complete
    }

    /// The open's resync of a dirty stripe with every member read: a data
    /// block whose content no longer matches its checksum entry is either
    /// a write in flight at the stop (its entry is the one the last sync of
    /// the devices wrote, older) or corruption at rest (bit rot, a stray
    /// write). Taken as written, a block that rotted after its flush in a
    /// region the stop left dirty became the truth, its parity recomputed
    /// around it and its entry following it: wrong data for good,
    /// invisible to scrub (a new user's probe, 2026-11-30: a byte flipped
    /// with dd in a flushed block, then kill -9 while writing elsewhere in
    /// its 64 MiB intent region). So before the entries follow the content,
    /// in a row no parity-journal record names (a partial write under plog
    /// or parix logs one, its parity unchanged), such a block is decoded
    /// from every other member where they are one codeword (more than k;
    /// exactly k: unchecked but by the entry), as a write that landed
    /// whole beside the rot leaves them (a second probe: a kill -9 with an
    /// unflushed write in the rotten block's row kept the rot), else, where
    /// every parity member still matches its entry, from the members that
    /// match theirs (one codeword past k: more than one block rotten);
    /// where the decode gives back exactly what the block's entry records,
    /// the block is rewritten with it. In a row journal records name, the
    /// parity lags the data, so no decode is tried: a parix journal's
    /// latest value of the block, where one reads and its checksum is the
    /// block's entry, is written back instead (a data block and one
    /// journal's record of it damaged after a clean stop: the other
    /// journal's record holds the value). Elsewhere the block is taken as
    /// written, as before.
    ///
    /// The restore writes only a value whose checksum is the block's own
    /// entry, so it never undoes an acknowledged write: an entry on a
    /// device is at least what the device's last sync wrote (table pages
    /// go with every sync of their device: a flush, a FUA write, a sync
    /// for table pages, all of every device at once, the pages written
    /// after the devices' syncs; a page evicted since may hold a newer
    /// entry, of a write durable then), so it records the block's value
    /// at or after its last durable write; a FUA or flushed write since would have
    /// synced the entry with it. Putting the block back to that value rolls
    /// back only writes no flush covered (a write whose data landed and
    /// whose every parity write was lost), which a power cut may drop
    /// anyway. So a restore is rot, or such an unflushed write: the
    /// simulator's 44 restores in 300 seeds (no rot injected there) are
    /// all the latter. Not tried where a member is missing (the degraded-write
    /// log's rules decide there) nor while serving (entries in RAM are this
    /// open's own). A row whose other members are not one codeword and
    /// whose parity changed, or with fewer than k members matching their
    /// entries besides the block, is left as it is; so is rot in a row
    /// that journal records name with no parix record of the block (plog's
    /// records are parity deltas) until the fold (the background replay
    /// folds a stripe's records when the volume goes idle).
    fn restore_rotten_blocks(&self, stripe: u64, units: &mut [Option<Vec<u8>>]) {
        let g = &self.geo;
        let (k, width) = (g.k(), g.width());
        let block = g.block() as usize;
        let logs: Vec<(usize, crate::array::journal::StripeLog)> = self
            .parity_devices(stripe)
            .into_iter()
            .filter_map(|(_, p)| Some((p, self.stores[p].journal_stripe_log(stripe)?)))
            .collect();
        let logged_rows: std::collections::BTreeSet<u32> = logs
            .iter()
            .flat_map(|(_, log)| log.keys().map(|&(_, row)| row))
            .collect();
        // Parix: the latest value a journal holds for a data block, where
        // one reads and its checksum is the block's entry (a journal whose
        // record of it was lost, another's intact: a third probe, the data
        // block and one journal's record damaged after a clean stop).
        let logged_value = |role: usize, row: u64, entry: u32| -> Option<Vec<u8>> {
            logs.iter().find_map(|(p, log)| {
                let at = log.get(&(role as u16, row as u32))?.latest?;
                let value = self.stores[*p].journal_logged_block(at, block)?;
                (crate::codec::crc32c(&value) == entry).then_some(value)
            })
        };
        for row in 0..g.blocks_per_unit() {
            let at = row as usize * block;
            let entries: Vec<Option<u32>> = (0..width)
                .map(|role| {
                    let place = g.place(stripe, role);
                    self.expected_crc(place.device, stripe, g.checksum_index(place.row, row))
                })
                .collect();
            let crcs: Vec<u32> = units
                .iter()
                .map(|u| {
                    u.as_ref()
                        .map_or(0, |u| crate::codec::crc32c(&u[at..at + block]))
                })
                .collect();
            // A block matching its entry, or marked unreadable (the
            // complement of its checksum: `Array::mark_unreadable`).
            let matches: Vec<bool> = (0..width)
                .map(|r| {
                    units[r].is_some() && entries[r].is_some_and(|e| e == crcs[r] || e == !crcs[r])
                })
                .collect();
            let clean: Vec<bool> = (0..width)
                .map(|r| units[r].is_some() && entries[r] == Some(crcs[r]))
                .collect();
            // A write in flight changes parity with its data (rmw, a whole
            // stripe, a replica) or logs records for the row (plog, parix):
            // a row with either is taken as written, as before.
            if (0..k).all(|r| units[r].is_none() || matches[r]) {
                continue;
            }
            if logged_rows.contains(&(row as u32)) {
                for role in 0..k {
                    let Some(entry) = entries[role] else { continue };
                    if units[role].is_none() || matches[role] {
                        continue;
                    }
                    if let Some(value) = logged_value(role, row, entry) {
                        self.restore_block(stripe, role, row, &value, units);
                    }
                }
                continue;
            }
            let parity_clean = (k..width).all(|r| clean[r]);
            let read = self.row_blocks(units, row);
            for role in 0..k {
                let Some(entry) = entries[role] else { continue };
                if units[role].is_none() || matches[role] {
                    continue;
                }
                // Every other member, one codeword where more than k
                // (what a write the stop let land whole leaves); else,
                // where every parity member still matches its entry, the
                // members that match theirs (one codeword past k: more
                // than one block rotten in the row).
                let others: Vec<usize> = (0..width).filter(|&r| r != role).collect();
                let matching: Vec<usize> = others.iter().copied().filter(|&r| clean[r]).collect();
                let mut tries = vec![others];
                if parity_clean {
                    tries.push(matching);
                }
                let mut expected = vec![None; width];
                expected[role] = Some(entry);
                let decoded = tries
                    .into_iter()
                    .filter(|chosen| chosen.len() >= k)
                    .find_map(|chosen| {
                        let mut use_ = vec![false; width];
                        for &r in &chosen {
                            use_[r] = true;
                        }
                        self.try_decode(&read, &use_, &use_, &expected)
                    });
                let Some((shards, _)) = decoded else {
                    continue;
                };
                self.restore_block(stripe, role, row, &shards[role], units);
            }
        }
    }

    /// Rewrites block `row` of data unit `role` of `stripe` with `value`
    /// (its entry's), and `units` with it: parity and the entries follow
    /// it whether or not the write lands (a failed write fails the device,
    /// and the row must then decode to the entry's value, not to the rot:
    /// a review's finding).
    fn restore_block(
        &self,
        stripe: u64,
        role: usize,
        row: u64,
        value: &[u8],
        units: &mut [Option<Vec<u8>>],
    ) {
        let at = row as usize * self.geo.block() as usize;
        if let Some(unit) = units[role].as_mut() {
            unit[at..at + value.len()].copy_from_slice(value);
        }
        if self.write_unit_blocks_as(stripe, role, row, value, true) {
            bump(&self.counters.array.resync_blocks_restored);
        }
    }

    /// Before the open's resync of `stripe`: the rows a mark found past
    /// its journal's synced length ends (a fold's; since 2026-11-27 also a
    /// whole-stripe write's, a discard's or a resync's, whose mark comes
    /// before its parity write: format 1 power-loss schedule 78501027)
    /// ([`super::journal::ParityJournal::deferred_rows`]) get their records
    /// back where the parity write did not land. Where the row's last such
    /// mark carries its parity checksums (version 3) the parity block is
    /// checked against them (below: the entry may be ahead of the block,
    /// or hold the fold); elsewhere the parity block still matching its
    /// checksum entry shows it (taken for the last flush's, before the
    /// fold). There the cut kept
    /// the mark and dropped the parity write, and the records are the only
    /// account of what the parity lacks: applied, the mark left stale
    /// parity that the k members left after two losses decoded wrong
    /// (`tests/powerloss.rs`, two devices lost, parix seed 78002040).
    /// Elsewhere the marks stand: the fold landed, and folded again the
    /// records would be taken twice. (Not applying such marks at all
    /// turned three of the cluster simulator's CI seeds' reads into I/O
    /// errors: 156, 949, 1021.)
    fn settle_deferred_marks(&self, stripe: u64) {
        let g = &self.geo;
        for (j, p) in self.parity_devices(stripe) {
            let rows = self.stores[p].journal_deferred_rows(stripe);
            if rows.is_empty() {
                continue;
            }
            let role = g.k() + j;
            let unit = self.read_units_raw(stripe, &[role]).pop().flatten();
            // A mark written before its parity (a whole-stripe write's)
            // also came with data writes: where one of them landed on a
            // member left (its block no longer matches its entry), the
            // write was under way past its mark, and the mark stands.
            // Giving such rows their records back turned rows into I/O
            // errors (the cluster simulator's seeds 350687 and 351546:
            // the fold of records the data had moved past left the row
            // not one codeword). Such a mark's rows whose records were not
            // all flushed are not deferred at all (`journal::scan`).
            let before = self.stores[p].journal_deferred_rows_before_parity(stripe);
            let data: Vec<Option<Vec<u8>>> = match before.is_empty() {
                true => Vec::new(),
                false => self.read_units_raw(stripe, &(0..g.k()).collect::<Vec<_>>()),
            };
            let data_untouched = |row: u32| {
                !before.contains(&row)
                    || data.iter().enumerate().all(|(r, u)| {
                        u.as_ref()
                            .is_none_or(|u| self.unit_block_matches(stripe, r, u, row as u64))
                    })
            };
            // What the marks say the parity held after their writes
            // (version 3), where the last mark ending a row is a fold's:
            // the parity block's own checksum tells whether that fold
            // landed, where its entry cannot (a flush writes the table's
            // pages before the devices' syncs and commits the journal's
            // length after them: a cut may keep the fold's entry with or
            // without its parity write; test
            // `an_entry_ahead_of_its_fold_never_reads_wrong`).
            let crcs = self.stores[p].journal_deferred_mark_crcs(stripe);
            let block = g.block() as usize;
            let mut unreadable = Vec::new();
            let mut not_landed = Vec::new();
            let lacking: std::collections::BTreeSet<u32> = match &unit {
                Some(unit) => rows
                    .into_iter()
                    .filter(|&row| {
                        if row >= g.blocks_per_unit() as u32 {
                            return false;
                        }
                        let marks = crcs.get(&row).map(Vec::as_slice).unwrap_or_default();
                        let at = row as usize * block;
                        let crc = crate::codec::crc32c(&unit[at..at + block]);
                        // An entry may be a mark of the block as unreadable
                        // (its checksum's complement).
                        let holds = |c: u32| c == crc || c == !crc;
                        let told = match marks.split_last() {
                            Some((Some(last), earlier)) => Some((*last, earlier)),
                            _ => None,
                        };
                        if told.is_some_and(|(last, _)| holds(last)) {
                            // The parity is what the last mark's write
                            // left (a fold's, or a whole-stripe write's):
                            // the mark stands.
                            return false;
                        }
                        let told = told.filter(|_| !before.contains(&row));
                        let Some((last, earlier)) = told else {
                            return self.unit_block_matches(stripe, role, unit, row as u64)
                                && data_untouched(row);
                        };
                        if earlier.iter().flatten().any(|&c| holds(c)) {
                            // An earlier fold landed and a later one did
                            // not: which records the parity holds cannot be
                            // told from the log as a whole. The marks stand,
                            // and the parity row is not read.
                            unreadable.push((row, crc));
                            return false;
                        }
                        // Not landed (or torn): the records are given back,
                        // and the degraded replay tries the parity folded
                        // and as read, sector by sector (below: unless the
                        // fold is told exactly).
                        not_landed.push((row, last));
                        true
                    })
                    .collect(),
                None => Default::default(),
            };
            let place = g.place(stripe, role);
            for (row, crc) in unreadable {
                self.stores[p].set_checksum(g.checksum_index(place.row, row as u64), !crc);
            }
            self.stores[p].journal_settle_deferred(stripe, &lacking);
            // Where the records given back, folded into the parity as it
            // is, give the very checksum the fold's mark carries, the
            // parity is the one before the fold, whole: its entry says so
            // (an entry ahead of it says otherwise), and the degraded
            // replay folds it without weighing the parity as read.
            if let (Some(unit), false) = (&unit, not_landed.is_empty()) {
                let only: std::collections::BTreeSet<u32> =
                    not_landed.iter().map(|&(row, _)| row).collect();
                if let Ok(Some((folded, _))) = self.fold_parity(stripe, j, p, true, Some(&only)) {
                    for (row, last) in not_landed {
                        if folded
                            .get(&row)
                            .is_some_and(|f| crate::codec::crc32c(f) == last)
                        {
                            let at = row as usize * block;
                            let crc = crate::codec::crc32c(&unit[at..at + block]);
                            let index = g.checksum_index(place.row, row as u64);
                            self.stores[p].set_checksum(index, crc);
                        }
                    }
                }
            }
        }
    }

    /// A dirty stripe with a data unit out of service: parity cannot be
    /// recomputed from data, so the journal is the only record of the
    /// logged updates: it is folded into the surviving parity (dropping it
    /// would leave stale parity behind for the missing unit's decode).
    fn replay_degraded_dirty(&self, stripe: u64) {
        if let Err(e) = self.replay_dirty_stripe(stripe) {
            self.warn(format!(
                "stripe {stripe}: replaying its journal while degraded: {e}"
            ));
        }
    }

    /// Per block row of a degraded stripe read for a resync (`units`, as
    /// on the devices): whether a write in flight at the stop may have
    /// reached some members left and not others, with nothing logged that
    /// says what the missing data units held. That takes both
    /// - a missing data member that was in service at the stop (not
    ///   recorded failed before this open: lost at this open, as a server
    ///   not reached after a power cut of every server), or no
    ///   degraded-write log: a write to a stripe whose missing members
    ///   were all out already was a degraded write, its values logged and
    ///   synced before any device write, and the log's records end only
    ///   once a checkpoint synced every device, so a row the log does not
    ///   cover had no write in flight there; and
    /// - a member left whose block does not match its checksum entry,
    ///   which describes the block as of the last flush (table pages are
    ///   written at flushes, and a FUA write's with its blocks): a write
    ///   reached it since.
    ///
    /// Branch simlog took the second alone, and after a kill -9 with m
    /// members out it marked rows a degraded write had completed on
    /// (`fio_policies.rs`, the model proptest): those members were
    /// recorded failed before the open, so they no longer count.
    pub(super) fn rows_torn_unlogged(&self, stripe: u64, units: &[Option<Vec<u8>>]) -> Vec<bool> {
        let g = &self.geo;
        let lost_in_service = self.degraded_log.is_none()
            || self.any_in_service_at_stop(stripe, &self.missing_data_roles(stripe));
        (0..g.blocks_per_unit())
            .map(|row| {
                lost_in_service
                    && units.iter().enumerate().any(|(role, u)| {
                        u.as_ref()
                            .is_some_and(|u| !self.unit_block_matches(stripe, role, u, row))
                    })
            })
            .collect()
    }

    /// Whether any of `roles` of `stripe` (members missing now) was in
    /// service at the stop: lost at this open, not recorded failed before
    /// it, so its writes since the last flush were not degraded writes and
    /// the degraded-write log says nothing of them.
    pub(super) fn any_in_service_at_stop(&self, stripe: u64, roles: &[usize]) -> bool {
        roles
            .iter()
            .any(|&role| !self.failed_before_open[self.geo.place(stripe, role).device])
    }

    /// Per block row of a dirty stripe read for a degraded replay
    /// (`units`, as on the devices, before the fold writes anything):
    /// whether a parity member whose journal records the replay is about
    /// to fold into that row (`folded_rows`: per parity j, its rows) holds
    /// a block that no longer matches its checksum entry, which describes
    /// it as of the last flush (table pages are written at flushes; a
    /// member's failure writes none). Nothing writes a stripe's parity
    /// while its journals hold records for it except what supersedes
    /// them: a fold, a resync from the data, a whole-stripe write; none
    /// makes the records' end (an invalidation mark, durable at the next
    /// journal sync) durable with its parity write: a fold and a resync
    /// append the marks after writing parity, a whole-stripe write before,
    /// unsynced either way. So such a parity may already hold the
    /// records: a cut that kept its write and dropped the mark, after a
    /// data member's failure had synced the records and recorded the
    /// member out (the cluster simulator's seed 52865, plog:
    /// a resync after a failed append recomputed parity from the data, and
    /// the failure of the other parity's device, whose superblock write
    /// then lost a data member, came before the mark). Folded again, the
    /// records take the parity back to what it held before them, and the
    /// missing unit decodes from it as neither its old nor its new bytes.
    /// Unlike [`Array::rows_torn_unlogged`], it holds also where every
    /// missing member was out before this open: the failure made the
    /// records durable, not their end.
    pub(super) fn rows_parity_changed_under_records(
        &self,
        stripe: u64,
        units: &[Option<Vec<u8>>],
        folded_rows: &[(usize, Vec<u32>)],
    ) -> Vec<bool> {
        let g = &self.geo;
        let mut changed = vec![false; g.blocks_per_unit() as usize];
        for (j, rows) in folded_rows {
            let role = g.k() + j;
            let Some(unit) = &units[role] else { continue };
            for &row in rows {
                if !self.unit_block_matches(stripe, role, unit, row as u64) {
                    changed[row as usize] = true;
                }
            }
        }
        changed
    }

    /// Whether block row `row` of `unit` (member `role` of `stripe`, as
    /// read) matches its checksum entry.
    fn unit_block_matches(&self, stripe: u64, role: usize, unit: &[u8], row: u64) -> bool {
        let g = &self.geo;
        let block = g.block() as usize;
        let place = g.place(stripe, role);
        let at = row as usize * block;
        self.stores[place.device]
            .block_matches(g.checksum_index(place.row, row), &unit[at..at + block])
    }

    /// Records the checksums of a unit's content after a resync. Entries
    /// that still match are kept; a block that no longer matches (a write
    /// in flight at the stop, or bit rot: the two cannot be told apart
    /// here) is counted, and its entry follows the content.
    fn record_checksums(&self, stripe: u64, role: usize, unit: &[u8]) {
        let g = &self.geo;
        let place = g.place(stripe, role);
        let changed =
            self.stores[place.device].resync_checksums(g.checksum_index(place.row, 0), unit);
        self.counters
            .array
            .add(&self.counters.array.resync_checksum_mismatches, changed);
    }

    /// Checks every block's checksum and every stripe's parity, and
    /// (format 2) every copy of the mirrored metadata files; with
    /// `repair`, rewrites what is wrong from the redundancy.
    pub fn scrub(&self, repair: bool, progress: Option<ProgressFn>) -> Result<ScrubReport> {
        self.begin_operation(
            if repair {
                "scrub"
            } else {
                "scrub (check only)"
            },
            self.geo.stripes,
        )?;
        let r = self.scrub_inner(repair, progress);
        self.end_operation(&r);
        if repair {
            self.flush()?;
        }
        r
    }

    fn scrub_inner(&self, repair: bool, progress: Option<ProgressFn>) -> Result<ScrubReport> {
        let g = self.geo;
        let block = g.block() as usize;
        let mut report = ScrubReport::default();
        for stripe in 0..g.stripes {
            let _g = self.locks[Self::lock_index(stripe)].write().unwrap();
            // Parity is compared with data: bring it up to date first.
            self.replay_stripe(stripe)?;
            let mut units = self.read_stripe_raw(stripe);
            if units.iter().any(Option::is_none) {
                report.degraded_stripes += 1;
                self.scrub_degraded_stripe(stripe, repair, &mut report);
                report.stripes += 1;
                bump(&self.counters.array.scrubbed_stripes);
                self.progress_operation(stripe + 1);
                if let Some(p) = &progress {
                    p("scrub", stripe + 1, g.stripes);
                }
                continue;
            }
            // Per row, the blocks that failed their checksum.
            let mut bad_rows = std::collections::BTreeMap::<u64, u64>::new();
            let mut unrecoverable = false;
            for (role, unit) in units.iter().enumerate() {
                let Some(unit) = unit else { continue };
                let place = g.place(stripe, role);
                for (b, chunk) in unit.chunks_exact(block).enumerate() {
                    if !self.stores[place.device]
                        .block_matches(g.checksum_index(place.row, b as u64), chunk)
                    {
                        report.checksum_mismatches += 1;
                        *bad_rows.entry(b as u64).or_default() += 1;
                    }
                }
            }
            if repair {
                for (&b, &bad) in &bad_rows {
                    let before = self.counters.array.repaired_blocks.load(SeqCst);
                    match self.reconstruct_row(stripe, b) {
                        Ok(row) => {
                            report.repaired_blocks +=
                                self.counters.array.repaired_blocks.load(SeqCst) - before;
                            for (role, unit) in units.iter_mut().enumerate() {
                                if let Some(u) = unit {
                                    u[b as usize * block..(b as usize + 1) * block]
                                        .copy_from_slice(&row[role]);
                                }
                            }
                        }
                        Err(_) => {
                            // Every block of the row that failed: the
                            // row, counted once, said one block where
                            // three read as I/O errors (a new user's probe).
                            report.unrecoverable_blocks += bad;
                            unrecoverable = true;
                        }
                    }
                }
            }
            // Parity is checked against data known good: never re-encoded
            // from rows that could not be repaired.
            if units.iter().all(Option::is_some)
                && !unrecoverable
                && (repair || bad_rows.is_empty())
            {
                let parity = self.encode_parity(&units);
                let mut mismatch = false;
                for (j, p) in parity.iter().enumerate() {
                    if units[g.k() + j].as_deref() != Some(p.as_slice()) {
                        report.parity_mismatches += 1;
                        bump(&self.counters.array.parity_mismatches);
                        mismatch = true;
                    }
                }
                if repair && mismatch {
                    self.repair_mismatched_rows(stripe, &units, &parity, &mut report);
                }
            }
            report.stripes += 1;
            bump(&self.counters.array.scrubbed_stripes);
            self.progress_operation(stripe + 1);
            if let Some(p) = &progress {
                p("scrub", stripe + 1, g.stripes);
            }
        }
        report.dedup_map_problems = self.check_dedup_maps();
        if let Some(meta) = &self.meta {
            for p in meta.check_copies(repair) {
                report.metadata_copies_repaired += p.repaired as u64;
                self.warn(format!("scrub: metadata {p}"));
                report.metadata_copy_problems.push(p.to_string());
            }
        }
        Ok(report)
    }

    /// Repairs the rows of a whole, checksum-clean stripe whose parity
    /// (`parity`, a fresh encode of its data) disagrees with what was
    /// read: in each, the members that disagree with the others are found
    /// and rewritten (`locate_wrong_members`); parity is not assumed to be
    /// the wrong one. Where a row cannot tell, the stripe is reported and
    /// nothing of it is written.
    fn repair_mismatched_rows(
        &self,
        stripe: u64,
        units: &[Option<Vec<u8>>],
        parity: &[Vec<u8>],
        report: &mut ScrubReport,
    ) {
        let g = &self.geo;
        let block = g.block() as usize;
        let mut repairs = Vec::new();
        for b in 0..g.blocks_per_unit() as usize {
            let at = b * block..(b + 1) * block;
            let row: Vec<Vec<u8>> = units
                .iter()
                .map(|u| u.as_deref().expect("a whole stripe")[at.clone()].to_vec())
                .collect();
            if (0..g.m()).all(|j| row[g.k() + j] == parity[j][at.clone()]) {
                continue;
            }
            match self.locate_wrong_members(&row) {
                Some((wrong, shards)) => repairs.push((b as u64, wrong, shards)),
                None => {
                    report.unlocated_stripes += 1;
                    self.warn(format!(
                        "scrub: stripe {stripe} block row {b}: parity disagrees with data and no \
                         member can be told wrong (every block matches its checksum); the stripe \
                         is left unchanged"
                    ));
                    return;
                }
            }
        }
        for (b, wrong, shards) in repairs {
            if wrong.iter().any(|&role| role < g.k()) {
                self.warn(format!(
                    "scrub: stripe {stripe} block row {b}: members {wrong:?} disagree with the \
                     others (stale blocks with matching checksums); rewritten from them"
                ));
            }
            let before = self.counters.array.repaired_blocks.load(SeqCst);
            self.rewrite_wrong(stripe, b, &shards, &wrong);
            report.repaired_blocks += self.counters.array.repaired_blocks.load(SeqCst) - before;
        }
    }

    /// Scrubs a stripe with a member out of service, row by row: each row
    /// is decoded and checked against the recorded checksums and the spare
    /// members (`array/decode.rs`), so a stale unit is found as long as
    /// more than k members, or a checksum of the missing ones, can tell.
    fn scrub_degraded_stripe(&self, stripe: u64, repair: bool, report: &mut ScrubReport) {
        let c = &self.counters.array;
        for b in 0..self.geo.blocks_per_unit() {
            let mismatches = c.checksum_mismatches.load(SeqCst);
            let unverified = c.unverified_decodes.load(SeqCst);
            let repaired = c.repaired_blocks.load(SeqCst);
            match self.decode_row(stripe, b, repair) {
                Ok(row) => {
                    // Members read with a matching checksum that the row's
                    // codeword disagrees with: stale parity or data.
                    let bad_crc = (c.checksum_mismatches.load(SeqCst) - mismatches) as usize;
                    report.checksum_mismatches += bad_crc as u64;
                    report.parity_mismatches += row.wrong.len().saturating_sub(bad_crc) as u64;
                }
                Err(_) => report.unrecoverable_blocks += 1,
            }
            report.repaired_blocks += c.repaired_blocks.load(SeqCst) - repaired;
            report.unchecked_rows += c.unverified_decodes.load(SeqCst) - unverified;
        }
    }

    /// Fills every device in the rebuilding state, stripe by stripe, while
    /// the volume stays served. Resumes from the recorded cursor.
    pub fn rebuild(&self, progress: Option<ProgressFn>) -> Result<u64> {
        let targets: Vec<usize> = (0..self.stores.len())
            .filter(|&d| self.stores[d].is_rebuilding())
            .collect();
        // Recorded even when there is nothing to do, so a follower sees the outcome.
        let total = self.rebuild_extent() * targets.len().max(1) as u64;
        self.begin_operation("rebuild", total)?;
        let r = if targets.is_empty() {
            Err(Error::Config(
                "no device is waiting for a rebuild; `ecdedup replace POSITION` first".into(),
            ))
        } else {
            self.rebuild_inner(&targets, progress)
        };
        self.end_operation(&r);
        r
    }

    /// Says that no member was ever written from stripe `stripes` on, so
    /// every member reads zeroes there (a cluster volume: its chunks are
    /// created sparse, and its writes stay within its size, which never
    /// shrinks): a rebuild stops there and leaves the new member's stripes
    /// past it unwritten (zeroes, as the others'), where it reconstructed
    /// and wrote zeroes over every formatted stripe (256 GiB of a small
    /// volume's PGs, allocated on the new server). From then on a write
    /// past it is refused (out of range), so no write can land where a
    /// rebuild does not go. Set before the array takes writes (an open's
    /// own resync goes first); the owner vouches for the stripes past it.
    pub fn set_written_extent(&self, stripes: u64) {
        self.written_extent
            .store(stripes.min(self.geo.stripes), SeqCst);
    }

    /// Where a rebuild stops ([`Array::set_written_extent`]).
    pub fn rebuild_extent(&self) -> u64 {
        self.written_extent.load(SeqCst).min(self.geo.stripes)
    }

    fn rebuild_inner(&self, targets: &[usize], progress: Option<ProgressFn>) -> Result<u64> {
        let mut rebuilt = 0u64;
        let mut unreadable_blocks = 0u64;
        for (t, &d) in targets.iter().enumerate() {
            if self.stores[d].is_re_adding() {
                // A re-add that paused (fewer than k members serving a
                // stripe it missed): it goes on as a re-add.
                rebuilt += self.finish_re_add(d)?;
                continue;
            }
            let start = self.stores[d].cursor();
            let mut last_checkpoint = Instant::now();
            let window = self.rebuild_window();
            let mut stripe = start;
            // The stripes past the extent, never written, stay zeroes on
            // the new member as on the others.
            let extent = self.rebuild_extent();
            while stripe < extent {
                self.stop_if_closing("rebuild", d, stripe)?;
                let end = (stripe + window).min(extent);
                let (done_here, unreadable_here) = self.rebuild_window_of(d, stripe..end)?;
                rebuilt += done_here;
                unreadable_blocks += unreadable_here;
                let done = t as u64 * extent + end;
                self.progress_operation(done);
                if let Some(p) = &progress {
                    if stripe / 16 != end / 16 || end == extent {
                        p("rebuild", done, extent * targets.len() as u64);
                    }
                }
                self.checkpoint_cursor(&mut last_checkpoint)?;
                stripe = end;
            }
            self.stores[d].finish_rebuild();
            self.flush()?;
            self.persist_superblocks()?;
            if unreadable_blocks > 0 {
                self.warn(format!(
                    "device {d} rebuilt, but {unreadable_blocks} of its blocks could not be \
                     decoded from the others and read as I/O errors until rewritten \
                     (counter unreadable_blocks)"
                ));
            } else {
                self.warn(format!("device {d} rebuilt; redundancy restored"));
            }
        }
        Ok(rebuilt)
    }

    /// Stripes a rebuild reconstructs together: their members read in one
    /// batch and their units written in another (two round trips to remote
    /// chunks for the lot, where one stripe after another took two each),
    /// at most [`REBUILD_WINDOW_STRIPES`] and about
    /// [`REBUILD_WINDOW_BYTES`] of units read.
    fn rebuild_window(&self) -> u64 {
        let stripe_bytes = self.geo.unit_bytes() * self.geo.width() as u64;
        (REBUILD_WINDOW_BYTES / stripe_bytes.max(1)).clamp(1, REBUILD_WINDOW_STRIPES)
    }

    /// Rebuilds device `d`'s units of `stripes` (the cursor at their
    /// start), every stripe's lock held throughout (taken in lock order):
    /// the journals of each replayed, the units decoded from one batch of
    /// reads, the cursor moved past them, then the units written in one
    /// batch. The superblocks record the cursor at the window's start
    /// until every unit is written. Returns the units rebuilt and the
    /// blocks that could not be decoded (marked unreadable). An error
    /// leaves the cursor at the first stripe not rebuilt.
    fn rebuild_window_of(&self, d: usize, stripes: std::ops::Range<u64>) -> Result<(u64, u64)> {
        let g = self.geo;
        let mut order: Vec<usize> = stripes.clone().map(Self::lock_index).collect();
        order.sort_unstable();
        order.dedup();
        let _guards: Vec<_> = order
            .iter()
            .map(|&i| self.locks[i].write().unwrap())
            .collect();
        if !self.stores[d].is_rebuilding() {
            return Err(Error::Unavailable(format!(
                "device {d} failed during its rebuild"
            )));
        }
        let work: Vec<(u64, usize)> = stripes
            .clone()
            .filter_map(|s| g.role_on(s, d).map(|role| (s, role)))
            .collect();
        for &(stripe, role) in &work {
            // Fewer than k other members in service: nothing can be
            // decoded now, and rows marked unreadable would stay so after
            // the members return. The rebuild pauses here, its cursor
            // recorded, and resumes at the next `rebuild` (a writer's next
            // open, in a cluster).
            self.pause_below_k("rebuild", d, stripe, role)?;
            // Pipelined recovery: the stripe's journals are replayed, and
            // the fresh parity decodes at once.
            self.replay_stripe(stripe)?;
        }
        let units = self.reconstruct_units(&work)?;
        for (&(stripe, role), (_, unreadable)) in work.iter().zip(&units) {
            if !unreadable.is_empty() {
                // A member lost while this stripe was read.
                self.pause_below_k("rebuild", d, stripe, role)?;
            }
        }
        self.stores[d].advance_cursor_unrecorded(stripes.start, stripes.end);
        let writes: Vec<(u64, usize, u64, &[u8])> = work
            .iter()
            .zip(&units)
            .map(|(&(stripe, role), (unit, _))| (stripe, role, 0, &unit[..]))
            .collect();
        let written = self.write_units(&writes, false);
        let failed = written.iter().position(|ok| !ok);
        let took = failed.unwrap_or(work.len());
        if let Some(i) = failed {
            self.stores[d].set_cursor(work[i].0);
        }
        self.stores[d].record_cursor();
        let mut unreadable_blocks = 0;
        for (&(stripe, role), (unit, unreadable)) in work.iter().zip(&units).take(took) {
            self.mark_unreadable(stripe, role, unit, unreadable);
            unreadable_blocks += unreadable.len() as u64;
            bump(&self.counters.array.rebuilt_stripes);
        }
        if let Some(i) = failed {
            let stripe = work[i].0;
            if self.stores[d].is_rebuilding() {
                // A full file system: the device keeps what it holds and
                // this stripe is not yet its.
                return Err(Error::NoSpace(format!(
                    "rebuild of device {d} stopped at stripe {stripe}: the file system under \
                     it is full; free space and run `rebuild` again (it resumes there)"
                )));
            }
            return Err(Error::Unavailable(format!(
                "device {d} failed during its rebuild"
            )));
        }
        Ok((work.len() as u64, unreadable_blocks))
    }

    /// How many of `stripe`'s members other than `role` hold it.
    pub(super) fn others_in_service(&self, stripe: u64, role: usize) -> usize {
        let g = &self.geo;
        (0..g.width())
            .filter(|&r| r != role && self.holds(g.place(stripe, r).device, stripe))
            .count()
    }

    /// Stops a rebuild or re-add (`what`) of device `d` at `stripe` (its
    /// cursor recorded, data and checksums first) when fewer than k of the
    /// stripe's other members are in service: `Unavailable`, and the next
    /// rebuild resumes there. Ok when k or more are.
    pub(super) fn pause_below_k(
        &self,
        what: &str,
        d: usize,
        stripe: u64,
        role: usize,
    ) -> Result<()> {
        let g = &self.geo;
        let in_service = self.others_in_service(stripe, role);
        if in_service >= g.k() {
            return Ok(());
        }
        self.flush()?;
        self.persist_superblocks()?;
        Err(Error::Unavailable(format!(
            "{what} of device {d} paused at stripe {stripe} of {}: only {in_service} of the \
             other members are in service, {} needed to decode; `rebuild` resumes there",
            g.stripes,
            g.k()
        )))
    }

    /// Decodes a whole unit of `stripe` from the others, checked, per block
    /// row, so a bad row costs only itself: rows that cannot be decoded are
    /// left zero and returned. The members' units are read whole, in one
    /// batch (a rebuild across the network paid a round trip per member
    /// and block row: 80 per stripe of 64 KiB units, 3 MiB/s); where one
    /// of them fails to read, row by row as a single decode does, so a
    /// medium error costs only its rows. Caller holds the stripe lock.
    /// A rebuild or re-add of member `d` at `stripe` while the array
    /// closes: the cursor is recorded (data and checksums first) and
    /// `Unavailable` returned; the next `rebuild` (a writer's next open)
    /// resumes there.
    pub(super) fn stop_if_closing(&self, op: &str, d: usize, stripe: u64) -> Result<()> {
        if !self.stopping.load(SeqCst) {
            return Ok(());
        }
        self.flush()?;
        self.persist_superblocks()?;
        Err(Error::Unavailable(format!(
            "{op} of device {d} stopped at stripe {stripe} of {}: the array is closing; it \
             resumes there",
            self.geo.stripes
        )))
    }

    /// Records a moving cursor every [`REBUILD_CHECKPOINT_INTERVAL`]
    /// (checksums and data first, then the cursor that vouches for them).
    pub(super) fn checkpoint_cursor(&self, last: &mut Instant) -> Result<()> {
        if last.elapsed() > REBUILD_CHECKPOINT_INTERVAL {
            self.flush()?;
            self.persist_superblocks()?;
            *last = Instant::now();
        }
        Ok(())
    }

    pub(super) fn reconstruct_unit(&self, stripe: u64, role: usize) -> Result<(Vec<u8>, Vec<u64>)> {
        let mut one = self.reconstruct_units(&[(stripe, role)])?;
        Ok(one.pop().expect("one unit asked, one decoded"))
    }

    /// As [`Self::reconstruct_unit`] for units of several stripes (stripe,
    /// role), their members read in one batch (one round trip to remote
    /// chunks for the lot). Caller holds every stripe's lock.
    pub(super) fn reconstruct_units(
        &self,
        wants: &[(u64, usize)],
    ) -> Result<Vec<(Vec<u8>, Vec<u64>)>> {
        let width = self.geo.width();
        if let Some(&(stripe, _)) = wants.iter().find(|&&(s, _)| self.journal_pending(s)) {
            return Err(Error::NeedsReplay(stripe));
        }
        let reads: Vec<(u64, usize)> = wants
            .iter()
            .flat_map(|&(stripe, _)| (0..width).map(move |r| (stripe, r)))
            .collect();
        let mut units = self.read_stripe_units_raw(&reads).into_iter();
        wants
            .iter()
            .map(|&(stripe, role)| {
                let members: Vec<Option<Vec<u8>>> = units.by_ref().take(width).collect();
                self.decode_unit_from(stripe, role, members)
            })
            .collect()
    }

    /// Decodes unit `role` of `stripe` from its members' units as read
    /// raw (None: not held or not read), row by row, each row checked;
    /// where a member is missing that holds the stripe, rows are read
    /// again one by one. Returns the unit and the rows not decoded.
    fn decode_unit_from(
        &self,
        stripe: u64,
        role: usize,
        units: Vec<Option<Vec<u8>>>,
    ) -> Result<(Vec<u8>, Vec<u64>)> {
        let g = &self.geo;
        let block = g.block() as usize;
        let whole = units
            .iter()
            .enumerate()
            .all(|(r, u)| u.is_some() || !self.holds(g.place(stripe, r).device, stripe));
        let mut unit = vec![0u8; g.unit_bytes() as usize];
        let mut unreadable = Vec::new();
        for b in 0..g.blocks_per_unit() {
            let at = b as usize * block;
            let row = if whole {
                let reads = units
                    .iter()
                    .map(|u| match u {
                        Some(u) => MemberRead::Block(u[at..at + block].to_vec()),
                        None => MemberRead::NotHeld,
                    })
                    .collect();
                self.decode_row_from(stripe, b, reads, true)
                    .map(|r| r.shards)
            } else {
                self.reconstruct_row(stripe, b)
            };
            match row {
                Ok(row) => unit[at..at + block].copy_from_slice(&row[role]),
                Err(Error::DataLoss(e)) => {
                    self.warn(format!("rebuild: {e}"));
                    unreadable.push(b);
                }
                Err(e) => return Err(e),
            }
        }
        Ok((unit, unreadable))
    }

    /// Marks blocks a rebuild could not decode: their recorded checksum is
    /// made to disagree with what was written in their place, so every read
    /// of them is an I/O error (and scrub counts them) until a write
    /// replaces them; never the zeros written there.
    pub(super) fn mark_unreadable(&self, stripe: u64, role: usize, unit: &[u8], rows: &[u64]) {
        let g = &self.geo;
        let place = g.place(stripe, role);
        let block = g.block() as usize;
        for &b in rows {
            let at = b as usize * block;
            let crc = crate::codec::crc32c(&unit[at..at + block]);
            self.stores[place.device].set_checksum(g.checksum_index(place.row, b), !crc);
        }
    }

    /// The state of each member (for tests).
    pub fn member_states(&self) -> Vec<MemberState> {
        (0..self.stores.len())
            .map(|d| self.member_state(d))
            .collect()
    }
}
