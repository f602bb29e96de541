//! A chunk store: one device's share of the array, the half of the array
//! that goes with the chunk server owning the device once the network is
//! crossed (docs/cluster.md, "Splitting `Array`").
//!
//! A [`ChunkStore`] holds what belongs to one device and nothing about the
//! stripe it is a member of: the device handle and its member state (with
//! the rebuild cursor), its checksum table (and the table kept from before
//! a replacement), its medium read errors, its dedup layer, its parity
//! journal, its simulated-SSD wear layer and its I/O counters. The stripe
//! client ([`super::Array`]: geometry, codec, intents, stripe locks, write
//! policy, degraded log, failure latches) asks it for the protocol's ops
//! (`proto::frame::Op`), by the device's own coordinates: a byte offset on
//! the device and a checksum index (the device's block number).
//!
//! Invariants:
//! - a failed store holds no device and no dedup layer; its table and
//!   journal stay (the entries degraded writes set, the records replay
//!   drops), until a replacement resets them;
//! - a store that holds a stripe's unit (`holds`) has a table entry for
//!   every block of it that says what the device holds, whenever the
//!   stripe's lock is free (the client writes a block and its entry under
//!   the stripe lock).

use super::checksum::{ChecksumTable, DeviceSlot, DirtyPages};
use super::journal::{self, JournalSyncPoint, JournalWrite, ParityJournal, StripeLog};
use super::superblock::MemberState;
use crate::counters::{DeviceCounters, IoClass};
use crate::dedup::DedupDevice;
use crate::media::{self, BatchCost, Device, DeviceIo, WriteHint};
use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Mutex, RwLock};

pub(super) const TAG_ACTIVE: u8 = 0;
pub(super) const TAG_FAILED: u8 = 1;
pub(super) const TAG_REBUILDING: u8 = 2;

/// A store's parity journal, held ([`ChunkStore::journal_held`]).
pub(super) type JournalGuard<'a> = std::sync::MutexGuard<'a, Option<ParityJournal>>;

/// One device of the array and everything kept per device.
pub(super) struct ChunkStore {
    /// The device in service at this position (None while failed); shared
    /// with the checksum table, which reads its pages from it.
    dev: DeviceSlot,
    /// Active, failed or rebuilding (`TAG_*`).
    tag: AtomicU8,
    /// While rebuilding: the stripes below it hold current content.
    cursor: AtomicU64,
    /// The most the superblocks may record of `cursor` (u64::MAX: all of
    /// it): a rebuild that moves the cursor past stripes whose units it
    /// is still writing caps it at the first of them until they are done.
    cursor_record_cap: AtomicU64,
    table: ChecksumTable,
    /// Bytes of a checksummed block.
    block_bytes: usize,
    /// Whether `table` still says what the device's blocks hold logically
    /// where the device does not hold them (out of service since this
    /// open: degraded writes keep the entries current). False for a device
    /// already out at open, whose table could not be read: its decoded
    /// blocks are checked only against spare members.
    sums_known: AtomicBool,
    /// While the device is rebuilt: its table before the replacement, kept
    /// current by degraded writes, so each decoded unit is checked before
    /// it is written; while it is re-added (and after a re-add that
    /// failed), the entries kept while it was out (None when unknown or
    /// when neither runs).
    prior_table: Mutex<Option<ChecksumTable>>,
    /// Medium read errors since open.
    read_errors: AtomicU32,
    /// The dedup layer over the device, when the policy is not `none`.
    dedup: RwLock<Option<Arc<DedupDevice>>>,
    /// The device's parity journal (plog, parix).
    journal: Mutex<Option<ParityJournal>>,
    /// The simulated-SSD wear layer under the device (None when off).
    ssd_wear: RwLock<Option<Arc<crate::ssd::WearDevice>>>,
    /// The device's I/O counters (shared with the array's `Counters`).
    counters: Arc<DeviceCounters>,
    /// Rebuilding as a re-add (only the stripes it missed reconstructed):
    /// the superblocks record it failed until the re-add finishes, so a
    /// re-add cut short is tried again as a re-add, not finished as a
    /// full rebuild.
    re_adding: AtomicBool,
}

impl ChunkStore {
    /// A store over `slot` in `state`, with its table, dedup layer and
    /// journal as the open found them.
    pub(super) fn new(
        slot: DeviceSlot,
        state: MemberState,
        table: ChecksumTable,
        block_bytes: usize,
        dedup: Option<Arc<DedupDevice>>,
        journal: Option<ParityJournal>,
        counters: Arc<DeviceCounters>,
    ) -> ChunkStore {
        let (tag, cursor) = match state {
            MemberState::Active => (TAG_ACTIVE, 0),
            MemberState::Failed => (TAG_FAILED, 0),
            MemberState::Rebuilding { cursor } => (TAG_REBUILDING, cursor),
        };
        ChunkStore {
            dev: slot,
            tag: AtomicU8::new(tag),
            cursor: AtomicU64::new(cursor),
            cursor_record_cap: AtomicU64::new(u64::MAX),
            table,
            block_bytes,
            sums_known: AtomicBool::new(state == MemberState::Active),
            prior_table: Mutex::new(None),
            read_errors: AtomicU32::new(0),
            dedup: RwLock::new(dedup),
            journal: Mutex::new(journal),
            ssd_wear: RwLock::new(None),
            counters,
            re_adding: AtomicBool::new(false),
        }
    }

    // Member state: what the client (and, across the network, the
    // cluster's map) knows of the store.

    pub(super) fn state(&self) -> MemberState {
        match self.tag.load(SeqCst) {
            TAG_ACTIVE => MemberState::Active,
            TAG_FAILED => MemberState::Failed,
            _ => MemberState::Rebuilding {
                cursor: self
                    .cursor
                    .load(SeqCst)
                    .min(self.cursor_record_cap.load(SeqCst)),
            },
        }
    }

    /// Whether the device holds current content for `stripe`.
    pub(super) fn holds(&self, stripe: u64) -> bool {
        match self.tag.load(SeqCst) {
            TAG_ACTIVE => true,
            TAG_REBUILDING => stripe < self.cursor.load(SeqCst),
            _ => false,
        }
    }

    pub(super) fn is_failed(&self) -> bool {
        self.tag.load(SeqCst) == TAG_FAILED
    }

    pub(super) fn is_rebuilding(&self) -> bool {
        self.tag.load(SeqCst) == TAG_REBUILDING
    }

    /// The device in service, if any.
    pub(super) fn device(&self) -> Option<Arc<dyn Device>> {
        self.dev.read().unwrap().clone()
    }

    /// The rebuild cursor: stripes below it hold current content.
    pub(super) fn cursor(&self) -> u64 {
        self.cursor.load(SeqCst)
    }

    pub(super) fn set_cursor(&self, stripe: u64) {
        self.cursor.store(stripe, SeqCst);
    }

    /// Moves the cursor to `to` for the writes of stripes `from..to`
    /// (a stripe past the cursor is not written to the device), while the
    /// superblocks go on recording `from` until [`Self::record_cursor`]:
    /// a superblock written meanwhile (another device's failure) must not
    /// vouch for units not yet written.
    pub(super) fn advance_cursor_unrecorded(&self, from: u64, to: u64) {
        self.cursor_record_cap.store(from, SeqCst);
        self.cursor.store(to, SeqCst);
    }

    /// The units below the cursor are written: the superblocks may record it.
    pub(super) fn record_cursor(&self) {
        self.cursor_record_cap.store(u64::MAX, SeqCst);
    }

    /// Marks the store failed; returns whether it was in service (false:
    /// another thread failed it first).
    pub(super) fn fail(&self) -> bool {
        self.re_adding.store(false, SeqCst);
        self.tag.swap(TAG_FAILED, SeqCst) != TAG_FAILED
    }

    /// Marks the store as rebuilding by a re-add (`put_in_service` then
    /// makes it rebuilding), or not.
    pub(super) fn set_re_adding(&self, on: bool) {
        self.re_adding.store(on, SeqCst);
    }

    /// Whether it is rebuilding by a re-add: the superblocks record it
    /// failed meanwhile.
    pub(super) fn is_re_adding(&self) -> bool {
        self.re_adding.load(SeqCst) && self.tag.load(SeqCst) == TAG_REBUILDING
    }

    /// Lets go of the device and its dedup layer (after `fail`).
    pub(super) fn drop_device(&self) {
        *self.dev.write().unwrap() = None;
        *self.dedup.write().unwrap() = None;
    }

    /// Puts `dev` (blank, or a returning member) in service, rebuilding
    /// from stripe 0.
    pub(super) fn put_in_service(&self, dev: Arc<dyn Device>) {
        self.cursor.store(0, SeqCst);
        self.record_cursor();
        *self.dev.write().unwrap() = Some(dev);
        self.tag.store(TAG_REBUILDING, SeqCst);
    }

    /// A rebuild or a re-add done: active, with every entry of its table
    /// its own.
    pub(super) fn finish_rebuild(&self) {
        self.re_adding.store(false, SeqCst);
        self.tag.store(TAG_ACTIVE, SeqCst);
        *self.prior_table.lock().unwrap() = None;
        self.sums_known.store(true, SeqCst);
    }

    /// Counts a medium read error; returns how many the device has
    /// returned since open.
    pub(super) fn count_read_error(&self) -> u32 {
        self.read_errors.fetch_add(1, SeqCst) + 1
    }

    pub(super) fn set_dedup(&self, layer: Option<Arc<DedupDevice>>) {
        *self.dedup.write().unwrap() = layer;
    }

    pub(super) fn dedup_stats(&self) -> Option<crate::counters::DedupStats> {
        self.dedup.read().unwrap().as_ref().map(|l| l.stats())
    }

    /// Consistency problems of the dedup maps (None without dedup).
    pub(super) fn check_dedup(&self) -> Option<Vec<String>> {
        self.dedup.read().unwrap().as_ref().map(|l| l.check())
    }

    pub(super) fn set_wear(&self, wear: Option<Arc<crate::ssd::WearDevice>>) {
        *self.ssd_wear.write().unwrap() = wear;
    }

    pub(super) fn wear_stats(&self) -> Option<crate::ssd::SsdWearStats> {
        self.ssd_wear.read().unwrap().as_ref().map(|w| w.stats())
    }

    // Checksums (`Op::ReadChecksums`, and what a write records), by the
    // device's block number (`Geometry::checksum_index`).

    /// The recorded checksum of block `index`; None where unknown.
    pub(super) fn checksum(&self, index: u64) -> Option<u32> {
        self.table.get(index)
    }

    pub(super) fn set_checksum(&self, index: u64, crc: u32) {
        self.table.set(index, crc);
    }

    /// Whether `bytes` (one block) match the checksum of block `index`.
    pub(super) fn block_matches(&self, index: u64, bytes: &[u8]) -> bool {
        Some(crate::codec::crc32c(bytes)) == self.table.get(index)
    }

    /// Whether every block of `bytes` matches its checksum, from block
    /// `first` on.
    fn blocks_match(&self, first: u64, bytes: &[u8]) -> bool {
        (first..)
            .zip(bytes.chunks_exact(self.block_bytes))
            .all(|(index, block)| self.block_matches(index, block))
    }

    /// Records the checksums of `bytes`, written from block `first` on.
    pub(super) fn record_checksums(&self, first: u64, bytes: &[u8]) {
        for (index, block) in (first..).zip(bytes.chunks_exact(self.block_bytes)) {
            self.table.set(index, crate::codec::crc32c(block));
        }
    }

    /// After a resync: entries that still match `bytes` (from block
    /// `first` on) are kept, and so are the marks of blocks made
    /// unreadable (an entry the complement of the block's checksum:
    /// `Array::mark_unreadable`), which a write replaces; the others
    /// follow the content. Returns how many did not match.
    pub(super) fn resync_checksums(&self, first: u64, bytes: &[u8]) -> u64 {
        let mut changed = 0;
        for (index, block) in (first..).zip(bytes.chunks_exact(self.block_bytes)) {
            let crc = crate::codec::crc32c(block);
            let entry = self.table.get(index);
            if entry != Some(crc) && entry != Some(!crc) {
                changed += 1;
                self.table.set(index, crc);
            }
        }
        changed
    }

    /// The checksum block `index` of `stripe` should have, where known
    /// (`array/decode.rs`): the table's while the device holds the stripe
    /// or its entries were kept current; the table from before a
    /// replacement otherwise.
    pub(super) fn expected_checksum(&self, stripe: u64, index: u64) -> Option<u32> {
        if self.holds(stripe) {
            return self.table.get(index);
        }
        // Under the prior table's lock, which `begin_re_add` holds while
        // it moves the entries there: never the table half switched.
        let prior = self.prior_table.lock().unwrap();
        if self.sums_known.load(SeqCst) {
            return self.table.get(index);
        }
        prior.as_ref().and_then(|t| t.get(index))
    }

    /// A write or discard this device did not take: records what block
    /// `index` holds logically, so a later decode of it can be checked.
    /// Under the prior table's lock, as [`ChunkStore::expected_checksum`]:
    /// a re-add beginning meanwhile (it may, beside live I/O) finds the
    /// entry in the table it copies, or the entry lands in the copy.
    pub(super) fn note_logical_checksum(&self, index: u64, crc: u32) {
        let prior = self.prior_table.lock().unwrap();
        if self.sums_known.load(SeqCst) {
            // Out of service since this open: the table's pages are pinned
            // in RAM (a failed device's pages are never flushed).
            self.table.set(index, crc);
        } else if let Some(t) = prior.as_ref() {
            t.set(index, crc);
        }
    }

    /// A blank replacement: the table from before is kept for checking
    /// the rebuild (when its entries were current), the table itself
    /// describes zeroes.
    pub(super) fn begin_replacement(&self) {
        {
            let mut prior = self.prior_table.lock().unwrap();
            *prior = self
                .sums_known
                .swap(false, SeqCst)
                .then(|| self.table.duplicate());
        }
        self.table.reset_zeroed();
    }

    /// A failed member coming back with the data it still holds
    /// (`re-add`): its table forgets what is resident and reads its pages
    /// from the device on demand once the device is in the slot: it says
    /// what the member held when it left. Where the
    /// entries were kept current while it was out (`sums_known`), that
    /// table becomes the prior one, which checks each decode of the
    /// member's units in the stripes the re-add has not reached, and in
    /// every stripe if the member fails again before it is active: the
    /// device's own entries there predate the writes it missed (those in
    /// flight at an unclean stop, which the resync recorded from the
    /// members left), and a decode checked against them was an I/O error
    /// on a block the members agree on (cluster simulator seed 4364).
    pub(super) fn begin_re_add(&self) {
        let mut prior = self.prior_table.lock().unwrap();
        if self.sums_known.swap(false, SeqCst) {
            *prior = Some(self.table.duplicate());
        }
        // The table reads its pages from the device in the slot (every
        // store's table is opened so, with the same bound): forgetting
        // what is resident makes it the member's own table.
        self.table.forget_resident();
    }

    pub(super) fn table_ram_bytes(&self) -> u64 {
        self.table.ram_bytes()
    }

    /// The device in service and its table's dirty pages, encoded for a
    /// write in a batch with other devices' and finished by the caller
    /// ([`ChecksumTable::dirty_pages`]); None without a device.
    #[allow(clippy::type_complexity)]
    pub(super) fn dirty_checksum_pages(
        &self,
    ) -> Option<(Arc<dyn Device>, std::io::Result<DirtyPages<'_>>)> {
        let dev = self.device()?;
        let pages = self.table.dirty_pages(dev.as_ref(), &self.counters);
        Some((dev, pages))
    }

    /// Counts a sync of the device made outside a `ChunkOp::Sync` (a
    /// flush's checksum pages and the chunk's sync in one message).
    pub(super) fn note_sync(&self) {
        self.counters.sync();
    }

    /// Ends a batched write of [`ChunkStore::dirty_checksum_pages`].
    pub(super) fn finish_checksum_pages(
        &self,
        pages: DirtyPages<'_>,
        outcome: std::io::Result<()>,
    ) -> std::io::Result<()> {
        pages.finish(outcome, &self.counters)
    }

    /// Discards (zeroes) `bytes` at device offset `offset`, blocks from
    /// `first` on, and resets their checksums. None when no device is in
    /// service.
    pub(super) fn discard(
        &self,
        offset: u64,
        bytes: u64,
        first: u64,
    ) -> Option<std::io::Result<()>> {
        let dev = self.device()?;
        Some(dev.discard(offset, bytes).map(|()| {
            for index in first..first + bytes / self.block_bytes as u64 {
                self.table.set_zero(index);
            }
        }))
    }

    // The parity journal (`Op::LogAppend`, `Op::NeedD0`, `Op::Replay`).

    /// Whether the journal holds records for `stripe`.
    pub(super) fn journal_has_stripe(&self, stripe: u64) -> bool {
        self.journal
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|j| j.has_stripe(stripe))
    }

    /// The block rows of `stripe` with a record appended after the
    /// journal's last sync before the stop (`ParityJournal::unsynced_rows`;
    /// none where that is not known).
    pub(super) fn journal_unsynced_rows(&self, stripe: u64) -> BTreeSet<u32> {
        self.journal
            .lock()
            .unwrap()
            .as_ref()
            .map(|j| j.unsynced_rows(stripe))
            .unwrap_or_default()
    }

    /// Whether this device keeps a parity journal (a logging policy, and
    /// the journal not dropped with a failure).
    pub(super) fn has_journal(&self) -> bool {
        self.journal.lock().unwrap().is_some()
    }

    /// Whether the journal is open with its space reserved.
    pub(super) fn journal_ready(&self) -> bool {
        self.journal
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|j| j.is_reserved())
    }

    /// NEED_D0: for each block of `blocks` of unit `role` of `stripe`,
    /// whether the journal lacks its original value d(0).
    pub(super) fn journal_needs_d0(&self, stripe: u64, role: u16, blocks: Range<u64>) -> Vec<bool> {
        let guard = self.journal.lock().unwrap();
        blocks
            .map(|b| {
                !guard
                    .as_ref()
                    .is_some_and(|j| j.has_original(stripe, role, b as u32))
            })
            .collect()
    }

    /// Whether the journal is reserved and `bytes` more keep it within
    /// `bytes_max`.
    pub(super) fn journal_has_room(&self, bytes: u64, bytes_max: u64) -> bool {
        self.journal
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|j| j.is_reserved() && j.bytes() + bytes <= bytes_max)
    }

    /// The journal's bytes: past every append begun (0 without one).
    pub(super) fn journal_bytes(&self) -> u64 {
        self.journal
            .lock()
            .unwrap()
            .as_ref()
            .map_or(0, |j| j.bytes())
    }

    /// Logs that rows `[first, first+count)` of `stripe` no longer need
    /// what the journal holds for them (nothing when it holds nothing).
    /// When the mark cannot be appended the rows are forgotten in RAM and
    /// the error returned: the caller pins the stripe for a resync.
    /// `crcs`: each row's parity checksum after the write the mark goes
    /// with, where known (one per row), asked for only where the journal
    /// holds the stripe and takes them ([`journal::encode_mark_with_crcs`]),
    /// and not under the journal's lock (an entry's page may be read).
    pub(super) fn journal_invalidate(
        &self,
        stripe: u64,
        first: u32,
        count: u32,
        mark: journal::Mark,
        crcs: impl FnOnce() -> Option<Vec<u32>>,
    ) -> std::io::Result<Option<journal::MarkHold>> {
        let wanted = match self.journal.lock().unwrap().as_ref() {
            Some(j) if j.has_stripe(stripe) => j.takes_mark_crcs(),
            _ => return Ok(None),
        };
        let crcs = wanted.then(crcs).flatten().unwrap_or_default();
        let mut guard = self.journal.lock().unwrap();
        let Some(j) = guard.as_mut() else {
            return Ok(None);
        };
        if !j.has_stripe(stripe) {
            return Ok(None);
        }
        let mut rec = Vec::new();
        journal::encode_mark_with_crcs(&mut rec, stripe, first, count, mark, &crcs);
        // A mark before its parity write is held out of every sync until
        // the caller's writes are answered (`ParityJournal::held_marks`).
        let appended = match mark {
            journal::Mark::BeforeParity => j.append_held(&rec).map(Some),
            _ => j.append(&rec).map(|()| None),
        };
        match appended {
            Ok(hold) => {
                self.counters.write(IoClass::Journal, rec.len());
                Ok(hold)
            }
            Err(e) => {
                j.forget(stripe, first, count);
                Err(e)
            }
        }
    }

    /// Gives back a hold of [`ChunkStore::journal_invalidate`] once the
    /// writes its mark stands for are answered.
    pub(super) fn journal_release_mark(&self, hold: journal::MarkHold) {
        // A poisoned lock (a panic elsewhere, which aborts the server) is
        // left as it is: this runs in a guard's drop.
        if let Ok(mut guard) = self.journal.lock() {
            if let Some(j) = guard.as_mut() {
                j.release_mark(hold);
            }
        }
    }

    /// Whether this device's journal takes the rows' bases in its data
    /// values and parity deltas ([`journal::encode_with_bases`]).
    pub(super) fn journal_takes_bases(&self) -> bool {
        self.journal
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|j| j.takes_record_bases())
    }

    /// [`journal::ParityJournal::row_base`] of this device's journal.
    pub(super) fn journal_row_base(&self, stripe: u64, row: u32) -> Option<u32> {
        self.journal
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|j| j.row_base(stripe, row))
    }

    /// [`journal::ParityJournal::deferred_rows`] of this device's journal.
    pub(super) fn journal_deferred_rows(&self, stripe: u64) -> BTreeSet<u32> {
        self.journal
            .lock()
            .unwrap()
            .as_ref()
            .map(|j| j.deferred_rows(stripe))
            .unwrap_or_default()
    }

    /// Gives `rows` of `stripe` back what a deferred fold mark ended and
    /// settles the stripe's deferred marks (`rows` empty: they stand).
    pub(super) fn journal_deferred_rows_before_parity(&self, stripe: u64) -> BTreeSet<u32> {
        self.journal
            .lock()
            .unwrap()
            .as_ref()
            .map(|j| j.deferred_rows_before_parity(stripe))
            .unwrap_or_default()
    }

    /// [`journal::ParityJournal::deferred_mark_crcs`] of this device's journal.
    pub(super) fn journal_deferred_mark_crcs(&self, stripe: u64) -> journal::DeferredCrcs {
        self.journal
            .lock()
            .unwrap()
            .as_ref()
            .map(|j| j.deferred_mark_crcs(stripe))
            .unwrap_or_default()
    }

    pub(super) fn journal_settle_deferred(&self, stripe: u64, rows: &BTreeSet<u32>) {
        if let Some(j) = self.journal.lock().unwrap().as_mut() {
            j.restore_deferred_rows(stripe, rows);
        }
    }

    /// [`journal::ParityJournal::trust_fold_marks`] of this device's journal.
    pub(super) fn journal_trust_fold_marks(&self) {
        if let Some(j) = self.journal.lock().unwrap().as_mut() {
            j.trust_fold_marks();
        }
    }

    /// Every deferred fold mark of this device's journal stands.
    pub(super) fn journal_settle_all_deferred(&self) {
        if let Some(j) = self.journal.lock().unwrap().as_mut() {
            j.settle_all_deferred();
        }
    }

    /// Forgets what the journal holds for `stripe` (its device is out: its
    /// parity is rebuilt from data, if ever).
    pub(super) fn journal_forget(&self, stripe: u64) {
        if let Some(j) = self.journal.lock().unwrap().as_mut() {
            j.forget(stripe, 0, u32::MAX);
        }
    }

    /// Makes the journal durable. Nothing to do without a journal, or with
    /// a latched one. On an error the journal is latched, and the stripes
    /// it holds records for are returned with the error.
    pub(super) fn journal_sync(&self) -> Result<(), (std::io::Error, Vec<u64>)> {
        self.journal_sync_with(true, ParityJournal::sync)
    }

    /// What a sync of this store's device, issued from now on, makes
    /// durable of its journal (format 2: [`ParityJournal::sync_point`]);
    /// None without a journal, or for one that needs its own sync.
    pub(super) fn journal_sync_point(&self) -> Option<JournalSyncPoint> {
        self.journal.lock().unwrap().as_ref()?.sync_point()
    }

    /// [`ChunkStore::journal_sync_point`] without waiting: None where
    /// another thread holds the journal (a device failure's path never
    /// waits on a lock: [`Array::sync_on_failure`]), Some(None) without a
    /// journal or a point.
    ///
    /// [`Array::sync_on_failure`]: super::Array::sync_on_failure
    pub(super) fn journal_sync_point_now(&self) -> Option<Option<JournalSyncPoint>> {
        let guard = self.journal.try_lock().ok()?;
        Some(guard.as_ref().and_then(|j| j.sync_point()))
    }

    /// Format 1: what a sync of this store's journal file, issued from
    /// now on, makes durable ([`ParityJournal::flush_point`]).
    pub(super) fn journal_flush_point(&self) -> Option<journal::FlushPoint> {
        self.journal.lock().unwrap().as_ref()?.flush_point()
    }

    /// Format 1: records `point` as the journal's synced length, after the
    /// journal's file and this store's device were synced
    /// ([`ParityJournal::record_flushed`]).
    pub(super) fn journal_record_flushed(
        &self,
        point: journal::FlushPoint,
    ) -> Result<(), (std::io::Error, Vec<u64>)> {
        self.journal_sync_with(true, |j| j.record_flushed(point))
    }

    /// [`ChunkStore::journal_sync`] (waiting) where the caller took
    /// `point` ([`ChunkStore::journal_sync_point`]) and then synced this
    /// store's device, which holds the journal (format 2).
    /// With `wait` false, nothing where another thread holds the journal.
    pub(super) fn journal_sync_after_device_sync(
        &self,
        point: Option<JournalSyncPoint>,
        wait: bool,
    ) -> Result<(), (std::io::Error, Vec<u64>)> {
        self.journal_sync_with(wait, |j| j.sync_after_device_sync(point))
    }

    fn journal_sync_with(
        &self,
        wait: bool,
        sync: impl FnOnce(&mut ParityJournal) -> std::io::Result<()>,
    ) -> Result<(), (std::io::Error, Vec<u64>)> {
        let mut guard = if wait {
            self.journal.lock().unwrap()
        } else {
            match self.journal.try_lock() {
                Ok(guard) => guard,
                Err(_) => return Ok(()),
            }
        };
        let Some(j) = guard.as_mut() else {
            return Ok(());
        };
        if j.is_latched() {
            return Ok(());
        }
        sync(j).map_err(|e| (e, j.stripes()))
    }

    /// Stripes the journal holds records for.
    pub(super) fn journal_stripes(&self) -> Vec<u64> {
        match self.journal.lock().unwrap().as_ref() {
            Some(j) => j.stripes(),
            None => Vec::new(),
        }
    }

    /// What the journal holds for `stripe`, if anything.
    pub(super) fn journal_stripe_log(&self, stripe: u64) -> Option<StripeLog> {
        self.journal.lock().unwrap().as_ref()?.stripe_log(stripe)
    }

    /// One logged block of `len` bytes at journal offset `offset`, where
    /// it reads.
    pub(super) fn journal_logged_block(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let journal = self.journal.lock().unwrap();
        let mut buf = vec![0u8; len];
        journal.as_ref()?.read_block(offset, &mut buf).ok()?;
        Some(buf)
    }

    /// The journal, held: while a fold at the device reads its records
    /// where they lie, no compaction may move them (`journal_reclaim`
    /// waits for the guard).
    pub(super) fn journal_held(&self) -> JournalGuard<'_> {
        self.journal.lock().unwrap()
    }

    /// Where the blocks at `offsets` (`len` bytes each) of `journal`
    /// (this store's, held) lie on this store's own device, as runs
    /// (device offset, bytes): what a fold at the device reads. None when
    /// they do not lie there (a journal of format 1 in its own file; a
    /// dedup layer between the array and the device, whose offsets are
    /// not the device's; no device in service; no offsets).
    pub(super) fn journal_place_blocks(
        &self,
        journal: &ParityJournal,
        offsets: &[u64],
        len: u64,
    ) -> Option<std::io::Result<Vec<journal::DeviceRuns>>> {
        let (dev, runs) = match journal.place_blocks(offsets, len)? {
            Ok(placed) => placed,
            Err(e) => return Some(Err(e)),
        };
        let own = self.device()?;
        // The same device object: compared by address (the vtables of two
        // `Arc<dyn Device>` of one object may differ across codegen units).
        let same = std::ptr::eq(
            Arc::as_ptr(&own).cast::<u8>(),
            Arc::as_ptr(&dev).cast::<u8>(),
        );
        same.then_some(Ok(runs))
    }

    /// (bytes past the header, logged blocks, index RAM bytes).
    pub(super) fn journal_usage(&self) -> (u64, u64, u64) {
        match self.journal.lock().unwrap().as_ref() {
            Some(j) => (
                j.bytes() - journal::HEADER_BYTES,
                j.logged_blocks(),
                j.index_ram_bytes(),
            ),
            None => (0, 0, 0),
        }
    }

    /// Gives back the space replay made dead: an empty journal truncated,
    /// one past `compact_above` bytes and more than half dead compacted,
    /// then `bytes_max` reserved again. Returns whether it compacted, and
    /// the outcome; None without a journal.
    pub(super) fn journal_reclaim(
        &self,
        compact_above: u64,
        bytes_max: u64,
    ) -> Option<(bool, std::io::Result<()>)> {
        let mut guard = self.journal.lock().unwrap();
        let j = guard.as_mut()?;
        let used = j.bytes() - journal::HEADER_BYTES;
        let mut compacted = false;
        let reclaimed = if j.appends_in_flight() {
            // Writes of other stripes are appending: the file stays as it
            // is until a later reclaim.
            Ok(false)
        } else if j.is_empty() {
            j.reset_if_empty()
        } else if j.bytes() > compact_above && j.live_bytes() * 2 < used {
            compacted = true;
            j.compact().map(|()| true)
        } else {
            Ok(false)
        };
        let result = match reclaimed {
            Ok(true) => j.preallocate(bytes_max),
            Ok(false) if !j.is_reserved() => j.preallocate(bytes_max),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        };
        Some((compacted, result))
    }

    /// A fold the device ran: the checksums of the rows it folded
    /// recorded (as a write records them), and its I/O counted as the
    /// fold at the writer counted it: each row's parity read, the
    /// journal's blocks of each folded row read, each folded row written.
    fn note_fold(
        &self,
        fold: &media::fold::Fold,
        indexes: &[u64],
        answers: &[media::fold::RowAnswer],
    ) {
        use media::fold::RowAnswer;
        let block = fold.block_bytes as usize;
        for ((row, &index), answer) in fold.rows.iter().zip(indexes).zip(answers) {
            match *answer {
                RowAnswer::Folded { crc32c } => {
                    self.counters.read(IoClass::Parity, block);
                    // One read per logged entry (d(0) and d(r) together,
                    // or one delta), as the writer counted: an entry's
                    // first term starts the block (the others continue
                    // an entry split where the journal's extents meet).
                    for t in row.terms.iter().filter(|t| t.at == 0) {
                        self.counters
                            .read(IoClass::Journal, block * (1 + usize::from(t.b.is_some())));
                    }
                    self.counters.write(IoClass::Parity, block);
                    self.table.set(index, crc32c);
                }
                RowAnswer::Mismatch { .. } => self.counters.read(IoClass::Parity, block),
                RowAnswer::Unreadable => {}
            }
        }
    }

    /// A fresh journal (a replacement's).
    pub(super) fn install_journal(&self, j: ParityJournal) {
        *self.journal.lock().unwrap() = Some(j);
    }

    /// Test support: the journal itself.
    #[cfg(test)]
    pub(super) fn journal_for_test(&self) -> std::sync::MutexGuard<'_, Option<ParityJournal>> {
        self.journal.lock().unwrap()
    }
}

/// What a request asks of a chunk store: the data protocol's ops on the
/// device's own coordinates.
pub(super) enum ChunkOp<'a> {
    /// `Op::Read`: `buf.len()` bytes at device offset `offset`, counted as
    /// `class`. With `check`, every block is checked at the store against
    /// the checksums from block `check` on; with `stripe`, the store
    /// answers `Unavailable` unless it holds current content for it.
    Read {
        buf: &'a mut [u8],
        offset: u64,
        class: IoClass,
        check: Option<u64>,
        stripe: Option<u64>,
    },
    /// `Op::Write` (data or parity): `buf` at device offset `offset`; once
    /// the device takes it, the checksums from block `first` on record it.
    /// The store answers `Unavailable` unless it holds `stripe`.
    Write {
        buf: &'a [u8],
        offset: u64,
        first: u64,
        stripe: u64,
        hint: WriteHint,
        fua: bool,
    },
    /// The second half of `Op::Flush`: the device synced (its checksum
    /// pages are written first, by [`ChunkStore::flush_checksums`]).
    Sync,
    /// `Op::LogAppend`: encoded records (`journal::encode`) appended to
    /// the store's parity journal, written beside the batch's other
    /// requests and indexed once written. `Unavailable` without a journal.
    /// Not durable until the journal is synced (a flush, a FUA write).
    LogAppend { records: Vec<u8> },
    /// `Op::Replay`: a parity fold run at the device (`media::fold`),
    /// its rows' checksums recorded at blocks `indexes` (one per row) for
    /// the rows it folds; each row's answer in `answers`. The store
    /// answers `Unavailable` unless it holds `stripe`.
    Fold {
        fold: media::fold::Fold,
        indexes: Vec<u64>,
        stripe: u64,
        fua: bool,
        answers: Vec<media::fold::RowAnswer>,
    },
}

/// A store's answer to a request.
pub(super) enum ChunkReply {
    /// Done; a checked read's blocks all matched their checksums.
    Done,
    /// A checked read whose bytes arrived, with a block that failed its
    /// checksum.
    Mismatch,
    /// No device in service, or one that does not hold the stripe: nothing
    /// was done.
    Unavailable,
    /// The device failed the operation; the client latches or notes it.
    Failed(std::io::Error),
}

/// One request to store `store`, and its reply once submitted.
pub(super) struct ChunkRequest<'a> {
    pub(super) store: usize,
    pub(super) op: ChunkOp<'a>,
    pub(super) reply: ChunkReply,
    /// The device the request runs on, held while its batch runs.
    dev: Option<Arc<dyn Device>>,
    /// A `LogAppend`'s write, begun on the journal, while its batch runs.
    log: Option<JournalWrite>,
}

impl<'a> ChunkRequest<'a> {
    pub(super) fn new(store: usize, op: ChunkOp<'a>) -> ChunkRequest<'a> {
        ChunkRequest {
            store,
            op,
            reply: ChunkReply::Unavailable,
            dev: None,
            log: None,
        }
    }

    /// Puts the device operations of a request that runs (one with a
    /// device, or a journal append begun) in `ios`; returns how many.
    fn push_ios<'s>(&'s mut self, ios: &mut Vec<DeviceIo<'s>>) -> usize {
        let ChunkRequest { dev, op, log, .. } = self;
        if let Some(w) = log {
            let before = ios.len();
            ios.extend(w.device_ios());
            return ios.len() - before;
        }
        match device_io(dev, op) {
            Some(io) => {
                ios.push(io);
                1
            }
            None => 0,
        }
    }

    /// The device operation of a request that runs (one with a device).
    fn device_io(&mut self) -> Option<DeviceIo<'_>> {
        device_io(&self.dev, &mut self.op)
    }
}

/// The device operation of `op` on `dev`, if it has one.
fn device_io<'s>(
    dev: &'s Option<Arc<dyn Device>>,
    op: &'s mut ChunkOp<'_>,
) -> Option<DeviceIo<'s>> {
    {
        let dev = dev.as_deref()?;
        let op = match op {
            ChunkOp::Read { buf, offset, .. } => media::Op::Read {
                buf,
                offset: *offset,
            },
            ChunkOp::Write {
                buf,
                offset,
                hint,
                fua,
                ..
            } => media::Op::Write {
                buf,
                offset: *offset,
                hint: *hint,
                fua: *fua,
            },
            ChunkOp::Sync => media::Op::Sync,
            ChunkOp::Fold {
                fold, fua, answers, ..
            } => media::Op::Fold {
                fold,
                fua: *fua,
                answers,
            },
            ChunkOp::LogAppend { .. } => return None,
        };
        Some(DeviceIo { dev, op })
    }
}

/// How the stripe client reaches its chunk stores: a batch of requests
/// goes out, every request's reply comes back in it. The stores may be
/// in this process ([`ChunkStore`]s, below) or, later, chunk servers
/// across the network (frames of `proto::frame`, one per request, every
/// server's requests in flight at once).
pub(super) trait ChunkTransport {
    /// Runs `reqs` and fills in each reply; returns what the batch cost
    /// in device submissions and system calls.
    fn submit(&self, reqs: &mut [ChunkRequest<'_>]) -> BatchCost;
}

/// In process, the transport is a function call: the stores themselves,
/// every device's I/O in one submission (`media::submit`: one io_uring
/// batch where the devices have rings).
impl ChunkTransport for [ChunkStore] {
    fn submit(&self, reqs: &mut [ChunkRequest<'_>]) -> BatchCost {
        submit_local(self, reqs)
    }
}

fn submit_local(stores: &[ChunkStore], reqs: &mut [ChunkRequest<'_>]) -> BatchCost {
    let mut appends = false;
    for req in reqs.iter_mut() {
        let store = &stores[req.store];
        req.reply = ChunkReply::Unavailable;
        let held = match &mut req.op {
            ChunkOp::Read { stripe, .. } => stripe.is_none_or(|s| store.holds(s)),
            ChunkOp::Write { stripe, .. } | ChunkOp::Fold { stripe, .. } => store.holds(*stripe),
            ChunkOp::Sync => true,
            ChunkOp::LogAppend { records } => {
                // The journal's place for the records is taken now; its
                // lock is not held while the batch runs.
                appends = true;
                if let Some(j) = store.journal.lock().unwrap().as_mut() {
                    match j.begin_append(std::mem::take(records)) {
                        Ok(w) => req.log = Some(w),
                        Err(e) => req.reply = ChunkReply::Failed(e),
                    }
                }
                false
            }
        };
        req.dev = store.device().filter(|_| held);
    }
    // One request (a decode's or a replay's read) needs no vector.
    let (results, cost) = if let ([req], false) = (&mut *reqs, appends) {
        match req.device_io() {
            Some(io) => media::submit(&mut [io]),
            None => (Vec::new(), BatchCost::default()),
        }
    } else {
        let mut ios: Vec<DeviceIo> = Vec::with_capacity(reqs.len() + appends as usize);
        let counts: Vec<usize> = reqs.iter_mut().map(|r| r.push_ios(&mut ios)).collect();
        let (results, cost) = media::submit(&mut ios);
        drop(ios);
        // A journal append's writes (its runs, its length hint) answer
        // together: the first error, or done.
        let mut results = results.into_iter();
        let mut per_request = Vec::with_capacity(reqs.len());
        for (req, n) in reqs.iter_mut().zip(counts) {
            let mut outcome = Ok(());
            for r in results.by_ref().take(n) {
                if let (Ok(()), Err(e)) = (&outcome, r) {
                    outcome = Err(e);
                }
            }
            match req.log.take() {
                Some(w) => {
                    let store = &stores[req.store];
                    let bytes = w.record_bytes();
                    let mut guard = store.journal.lock().unwrap();
                    let finished = match guard.as_mut() {
                        Some(j) => j.finish_append(w, outcome),
                        None => Err(std::io::Error::other("the parity journal was closed")),
                    };
                    req.reply = match finished {
                        Ok(()) => {
                            store.counters.write(IoClass::Journal, bytes);
                            ChunkReply::Done
                        }
                        Err(e) => ChunkReply::Failed(e),
                    };
                }
                None if n > 0 => per_request.push(outcome),
                None => {}
            }
        }
        (per_request, cost)
    };
    let issued = reqs.iter_mut().filter(|r| r.dev.is_some());
    for (req, r) in issued.zip(results) {
        req.dev = None;
        let store = &stores[req.store];
        req.reply = match (r, &req.op) {
            (Err(e), _) => ChunkReply::Failed(e),
            (
                Ok(()),
                ChunkOp::Read {
                    buf, class, check, ..
                },
            ) => {
                store.counters.read(*class, buf.len());
                match check {
                    Some(first) if !store.blocks_match(*first, buf) => ChunkReply::Mismatch,
                    _ => ChunkReply::Done,
                }
            }
            (
                Ok(()),
                ChunkOp::Write {
                    buf, first, hint, ..
                },
            ) => {
                store.counters.write(hint.class, buf.len());
                store.record_checksums(*first, buf);
                ChunkReply::Done
            }
            (Ok(()), ChunkOp::Sync) => {
                store.counters.sync();
                ChunkReply::Done
            }
            (
                Ok(()),
                ChunkOp::Fold {
                    fold,
                    indexes,
                    answers,
                    ..
                },
            ) => {
                store.note_fold(fold, indexes, answers);
                ChunkReply::Done
            }
            (Ok(()), ChunkOp::LogAppend { .. }) => unreachable!("an append has no device"),
        };
    }
    cost
}
