//! `ecdedup re-add N`: brings back a member whose failure was transient (a
//! cable, a controller reset) and whose data is still there, resyncing only
//! what it missed.
//!
//! While any member is out of service the intent log also keeps the
//! *missed map* (`missed.map`, [`IntentLog::track_missed_in`]): every
//! region written since, plus those dirty as the member left (writes in
//! flight then). Flushes never clear it. A re-added member keeps its data
//! and its checksum table; each stripe of a missed region gets its unit on
//! the member reconstructed from the others, every other stripe is taken
//! as it is. The member is rebuilding meanwhile (its cursor vouches for the
//! stripes before it, as in `rebuild`), and the missed map's header
//! records that it is a re-add (cleared when it finishes, and by a
//! replacement of the position), so a re-add cut short (a crash, a close,
//! a pause below k) goes on as a re-add at the next `rebuild`, past its
//! cursor reconstructing only what it missed (before 2026-11-27 it was
//! rebuilt whole from there: 524,288 stripes a PG in the fault suite's
//! writer trials). A member that failed during its re-add may be re-added
//! again (its own superblock says rebuilding; the map vouches for what it
//! missed since it first left). Each decode of its
//! units past the cursor is checked against the entries the array kept
//! for it while it was out, not its own table's, which predate what it
//! missed. The map is removed
//! once no member is failed.
//!
//! Fewer than k other members in service (a second server down during
//! the re-add): nothing can be decoded, and a unit marked unreadable for
//! that would stay so after the members return. Where the entries kept
//! while the member was out vouch for its own unit (every block matches:
//! it missed no write there) the unit is kept as it is; otherwise the
//! re-add pauses at that stripe as a rebuild does (`Unavailable`, its
//! cursor recorded, the member rebuilding, nothing marked), and the next
//! `rebuild` resumes it there as a re-add (in a cluster, the writer's next
//! open). Those
//! entries are known only for a member that failed since the array's
//! open: after a restart, a re-add below k always pauses.
//!
//! Under `plog` and `parix` the member's own parity journal is read before
//! anything is written to it: its records pending when it left are deltas
//! for its parity units that no replay folded while it was out, so the
//! regions of every stripe it holds records for are set in the missed map
//! (durably, before the member's area and journal are rewritten: a re-add
//! that fails after that and is tried again still knows them); their
//! units are reconstructed from the others, after their journals'
//! records for the stripe are replayed, and the member starts with an
//! empty journal. A journal that cannot be read whole (no header, a
//! record unreadable down to its header) sets every region.
//!
//! Under dedup the member's data is reachable only through its dedup maps
//! (in its metadata area, or the array folder under format 1): they are
//! opened as an open after a crash opens them, and its reconstructed
//! units are written through them like any write; a member whose maps
//! cannot be opened is re-added blank and every stripe reconstructed on it
//! (a rebuild in place, with a warning). `replicate` is RS(1,2) and needs
//! nothing of its own.
//!
//! It also runs while the array serves (`re_add_device`, which a cluster
//! writer calls when a server returns): see there. Limit: the `re-add`
//! command runs on a stopped array.

use super::poison::Entry;
use super::{journal, read_superblock, Array, MemberState, JOURNAL_DIR};
use crate::counters::bump;
use crate::error::{Error, Result};
use crate::media::area::AreaFs;
use crate::media::storage::read_all;
use crate::media::{Device, FileDevice};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Instant;

/// The missed map, in the array folder.
pub const MISSED_FILE: &str = "missed.map";

impl Array {
    /// A member left service: keeps the missed map from now on (a warning
    /// where it cannot be written: `re-add` then resyncs every stripe).
    /// Takes no array lock: it runs where a member fails, the config lock
    /// held or not.
    pub(super) fn track_missed_writes(&self, history_known: bool) {
        if let Err(e) = self.intent.track_missed_in(
            self.storage.as_ref(),
            &self.dir.join(MISSED_FILE),
            history_known,
            self.generation_written.load(SeqCst),
        ) {
            self.warn(format!(
                "{e}: a re-added device will be resynchronised in full"
            ));
        }
    }

    /// At open: keeps the missed map while a member is failed or
    /// rebuilding (a missing map means the member left before anything was
    /// tracked: every region counts as missed), and removes one that no
    /// such member needs any more (its members were replaced and rebuilt).
    pub(super) fn resume_missed_tracking(&self) {
        let path = self.dir.join(MISSED_FILE);
        // A rebuilding member may be a re-add cut short, which the map's
        // regions (and its record of the re-add) let go on as a re-add.
        let rebuilding = self.stores.iter().any(|s| s.is_rebuilding());
        if self.unavailable_count() > 0 || rebuilding {
            let known = self.storage.exists(&path);
            self.track_missed_writes(known);
            // A re-add cut short by the last stop goes on as a re-add.
            for (d, store) in self.stores.iter().enumerate() {
                if store.is_rebuilding() && self.intent.re_adding(d) {
                    store.set_re_adding(true);
                }
            }
        } else if let Err(e) = self
            .intent
            .stop_tracking_missed_in(self.storage.as_ref(), &path)
        {
            self.warn(e.to_string());
        }
    }

    /// Brings failed member `d` back with the data it still holds and
    /// reconstructs only the stripes of regions written while it was out;
    /// returns how many stripe units were reconstructed.
    pub fn re_add(&mut self, d: usize) -> Result<u64> {
        let cfg = self.re_add_allowed(d)?;
        let path = cfg.devices[d].clone();
        let raw = FileDevice::open_with(self.storage.as_ref(), &path, cfg.device_options())
            .map_err(|e| Error::Device {
                path: path.clone(),
                reason: format!("cannot be opened: {e}"),
            })?;
        self.re_add_device(d, Arc::new(raw))
    }

    /// Whether failed member `d` may be re-added; returns the settings.
    fn re_add_allowed(&self, d: usize) -> Result<super::ConfigFile> {
        self.check_position(d)?;
        if !self.stores[d].is_failed() {
            return Err(Error::Config(format!("device {d} is not failed")));
        }
        Ok(self.config.lock().unwrap().file.clone())
    }

    /// [`Array::re_add`] with the member's device already open (a chunk
    /// across the network, for the volume client).
    ///
    /// It may run while the array serves (a cluster writer re-adding a
    /// returning server's shard): the member is *rebuilding* meanwhile, so
    /// writes to stripes its cursor has not passed leave it out and mark
    /// their regions in the missed map, which each stripe is checked
    /// against under its lock when the cursor reaches it. It runs as the
    /// array's one operation (`Busy` while a rebuild or another re-add
    /// runs), and stops at the next stripe when the array closes, its
    /// cursor recorded: the member stays rebuilding and the next `rebuild`
    /// (a writer's next open) goes on with the re-add from there.
    pub fn re_add_device(&self, d: usize, raw: Arc<dyn Device>) -> Result<u64> {
        self.begin_operation("re-add", self.geo.stripes)?;
        let r = self.re_add_device_inner(d, raw);
        self.end_operation(&r);
        r
    }

    fn re_add_device_inner(&self, d: usize, raw: Arc<dyn Device>) -> Result<u64> {
        let cfg = self.re_add_allowed(d)?;
        let path = cfg.devices[d].clone();
        let dev_err = |reason: String| Error::Device {
            path: path.clone(),
            reason,
        };
        let chunk = Arc::clone(&raw);
        let unanswered = || {
            chunk.link().filter(|l| l.unanswered()).map(|l| {
                dev_err(format!(
                    "a request to {} went unanswered (it may still land there, after the \
                     re-add's writes): this writer does not take the shard back; the next \
                     writer of the volume does, whose epoch the server stores first and which \
                     refuses that request (docs/cluster.md, \"A request without its reply\")",
                    l.describe()
                ))
            })
        };
        if let Some(e) = unanswered() {
            return Err(e);
        }
        let sb = read_superblock(raw.as_ref())?;
        super::inspect::check_member(&cfg, d, &sb)?;
        // Its own superblock lists it active, or rebuilding by a re-add
        // that it failed during (the missed map records that re-add, and
        // covers what it missed since it first left).
        let own = sb.states.get(d);
        let re_added_before =
            matches!(own, Some(MemberState::Rebuilding { .. })) && self.intent.re_adding(d);
        if own != Some(&MemberState::Active) && !re_added_before {
            return Err(dev_err(
                "its own superblock does not list it active (it was being rebuilt): \
                 `rebuild` it instead"
                    .into(),
            ));
        }
        self.check_left_at_missed_start(d, &sb)?;
        if raw.size() < self.geo.device_bytes_min() {
            return Err(dev_err(format!(
                "holds {} bytes, needs {}",
                raw.size(),
                self.geo.device_bytes_min()
            )));
        }
        // Its parity journal as it left it, read before anything is written
        // to the member (None: every stripe it holds parity of).
        let logged = if self.write_policy.journals() {
            self.journal_stripes_left_on(d, &raw)
        } else {
            Some(BTreeSet::new())
        };
        // Its journal is gone once its area is rewritten (below): those
        // stripes go into the missed map first, durably, so that a re-add
        // that fails after that and is tried again (finding an empty
        // journal) still reconstructs them.
        self.mark_missed(d, logged.as_ref())?;
        let (dev, wear) = cfg.ssd_sim.wrap(raw)?;
        // Format 2: its area holds copies of the mirrored files and its
        // journal, stale since it left: current copies before it serves
        // (a fresh area, unless its dedup maps are kept in it).
        let dev = self.re_add_metadata(d, dev)?;
        // A request of the steps above that went unanswered (the journal
        // read, an area write) may land after the writes to come: the
        // cluster simulator's seed 383995, where the open's zeroing of the
        // dedup map log's tail, late, erased the records the re-add's
        // writes logged there, and blocks flushed since read as zeroes.
        if let Some(e) = unanswered() {
            return Err(e);
        }
        self.install_empty_journal(d)?;
        // The member's own table, read from the device once it is in the
        // slot (below); the entries kept while it was out check the
        // stripes the cursor has not passed.
        self.stores[d].begin_re_add();
        if self.ssd_sim_on {
            self.stores[d].set_wear(wear);
        }
        self.config.lock().unwrap().device_uuids[d] = sb.device_uuid;
        // Rebuilding by a re-add, also for the next open: a re-add cut
        // short (a close, a writer killed, a pause below k) resumes as a
        // re-add there, not as a full rebuild.
        self.intent.set_re_adding(d, true).map_err(|e| {
            Error::io(
                format!("recording the re-add of device {d} in the missed-write map"),
                e,
            )
        })?;
        self.stores[d].set_re_adding(true);
        self.stores[d].put_in_service(dev);
        self.persist_superblocks()?;
        let own = self.own_held_blocks(d)?;
        self.finish_re_add_with(d, &own)
    }

    /// Member `d`'s own blocks of the poisoned rows marked as held by it
    /// from the stop on (`poison.rs`), each where the member's own
    /// checksum table (read from the device) vouches for it: the block's
    /// last value, or the one before a write in flight at the stop. Read
    /// before any unit of the member is reconstructed; the marks of its
    /// entries are then dropped, durably, whatever was found, since its
    /// units hold the re-add's reconstruction from here on (a re-add cut
    /// short and tried again would otherwise read the placeholder as the
    /// member's own).
    fn own_held_blocks(&self, d: usize) -> Result<BTreeMap<Entry, Vec<u8>>> {
        let g = &self.geo;
        let of_d = |&(stripe, role, _): &Entry| g.place(stripe, role as usize).device == d;
        let mut kept = BTreeMap::new();
        let marked: Vec<Entry> = self.poison.own_held().into_iter().filter(of_d).collect();
        if marked.is_empty() {
            return Ok(kept);
        }
        // Only an image the missed map's start vouches for (its
        // superblock no older: `check_left_at_missed_start`) is the member
        // as it left; without a known start any image passes (every stripe
        // is reconstructed), an older copy among them, whose own blocks
        // and table agree on stale bytes.
        let image_known = self.intent.missed_since_generation().is_some();
        if let Some(dev) = self.stores[d].device().filter(|_| image_known) {
            for (stripe, role, row) in marked {
                let place = g.place(stripe, role as usize);
                let mut block = vec![0u8; g.block() as usize];
                let read = dev.read_at(&mut block, g.device_offset(place.row, row as u64));
                if read.is_ok()
                    && self.stores[d].block_matches(g.checksum_index(place.row, row as u64), &block)
                {
                    kept.insert((stripe, role, row), block);
                }
            }
        }
        self.drop_own_held_of(d)?;
        Ok(kept)
    }

    /// Drops, durably, the marks of the poisoned blocks on position `d`
    /// (its unit is about to hold a reconstruction: a re-add's, or a
    /// replacement's rebuild).
    pub(super) fn drop_own_held_of(&self, d: usize) -> Result<()> {
        let g = &self.geo;
        self.poison
            .drop_own_held(|&(stripe, role, _)| g.place(stripe, role as usize).device == d)
    }

    /// After member `d`'s unit of `stripe` (`role`) was reconstructed, the
    /// placeholder in its poisoned rows: each of `own` there (the member's
    /// own block, vouched for) is written back through the write path
    /// (its intent marked, the row's parity updated around it, its
    /// poison ended), the stripe's lock held. A row the decode left
    /// unreadable, or one written since, is left as it is.
    fn restore_own_held(
        &self,
        stripe: u64,
        role: usize,
        own: &BTreeMap<Entry, Vec<u8>>,
        unreadable: &[u64],
    ) {
        let g = &self.geo;
        let first = (stripe, role as u32, 0);
        let last = (stripe, role as u32, u32::MAX);
        for (&(_, _, row), block) in own.range(first..=last) {
            let row = row as u64;
            if unreadable.contains(&row) || !self.poison.contains(stripe, role, row) {
                continue;
            }
            let within = role as u64 * g.unit_bytes() + row * g.block();
            match self.write_piece(stripe, within, block) {
                Ok(()) => bump(&self.counters.array.poisoned_blocks_restored),
                Err(e) => self.warn(format!(
                    "stripe {stripe} unit {role} block row {row}: writing back the re-added \
                     member's own block: {e}; it stays poisoned"
                )),
            }
        }
    }

    /// Walks re-added member `d` (rebuilding, `re_adding`) from its cursor
    /// over every stripe, reconstructing what it missed, then puts it in
    /// service; returns how many units were reconstructed. Run by a re-add,
    /// and by `rebuild` for a re-add that paused.
    pub(super) fn finish_re_add(&self, d: usize) -> Result<u64> {
        self.finish_re_add_with(d, &BTreeMap::new())
    }

    /// [`Array::finish_re_add`], writing back `own` (the member's own
    /// vouched blocks of its poisoned rows) as their stripes are passed.
    fn finish_re_add_with(&self, d: usize, own: &BTreeMap<Entry, Vec<u8>>) -> Result<u64> {
        let resynced = self.resync_missed(d, own)?;
        self.stores[d].finish_rebuild();
        self.flush()?;
        self.persist_superblocks()?;
        if self.stores[d].is_failed() {
            return Err(Error::Unavailable(format!(
                "device {d} failed as its re-add finished"
            )));
        }
        if let Err(e) = self.intent.set_re_adding(d, false) {
            self.warn(format!(
                "device {d} re-added, but the missed-write map still says it is being re-added: \
                 {e}"
            ));
        }
        if self.unavailable_count() == 0 {
            self.intent
                .stop_tracking_missed_in(self.storage.as_ref(), &self.dir.join(MISSED_FILE))?;
        }
        self.warn(format!(
            "device {d} re-added; {resynced} stripe units it missed were reconstructed"
        ));
        Ok(resynced)
    }

    /// Refuses a member whose superblock does not prove it left at or
    /// after the generation the missed map starts from (md's event
    /// counter): an older image (a copy put back, a disk from before an
    /// earlier failure) missed writes the map does not cover, and its
    /// checksums match its stale data, so nothing would find them. One
    /// newer than the array's is from another copy of the array. Without a
    /// known start every stripe is reconstructed, so any image will do.
    fn check_left_at_missed_start(&self, d: usize, sb: &super::Superblock) -> Result<()> {
        let Some(since) = self.intent.missed_since_generation() else {
            return Ok(());
        };
        let current = self.config.lock().unwrap().generation;
        let why = if sb.generation < since {
            format!(
                "its superblock is of generation {}, older than generation {since}, from which \
                 the missed-write map covers what it missed: the image is stale (a copy put \
                 back, or a disk from before an earlier failure) and would return old data",
                sb.generation
            )
        } else if sb.generation > current {
            format!(
                "its superblock is of generation {}, newer than the array's ({current}): it \
                 comes from another copy of the array",
                sb.generation
            )
        } else {
            return Ok(());
        };
        Err(Error::Device {
            path: self.config.lock().unwrap().file.devices[d].clone(),
            reason: format!(
                "cannot be re-added: {why}; use `ecdedup replace {d}` and `rebuild` (a full \
                 reconstruction)"
            ),
        })
    }

    /// Moves the cursor of rebuilding member `d` over every stripe,
    /// reconstructing its unit where the stripe's region is in the missed
    /// map (every stripe past its end; the regions its journal held
    /// records for are in it too). Where fewer than k other members hold a missed stripe, see
    /// [`Array::resync_unit`]: the re-add may pause there (`Unavailable`,
    /// the member left rebuilding at that stripe).
    fn resync_missed(&self, d: usize, own: &BTreeMap<Entry, Vec<u8>>) -> Result<u64> {
        let g = self.geo;
        let mut resynced = 0u64;
        let mut last_checkpoint = Instant::now();
        for stripe in self.stores[d].cursor()..g.stripes {
            self.stop_if_closing("re-add", d, stripe)?;
            let guard = self.locks[Self::lock_index(stripe)].write().unwrap();
            if !self.stores[d].is_rebuilding() {
                return Err(Error::Unavailable(format!(
                    "device {d} failed while it was re-added"
                )));
            }
            let role = g.role_on(stripe, d);
            // Checked now, under the stripe's lock: a write while the
            // re-add runs marks its region before it writes.
            let was_missed = self.intent.region_missed(self.intent.region_of(stripe));
            // Decoded before the cursor passes the stripe: until then the
            // member's stale unit takes no part in a decode.
            let unit = match role {
                Some(role) if was_missed => {
                    // The others' journals first (plog, parix): their
                    // parity then decodes at once, as in a rebuild.
                    self.replay_stripe(stripe)?;
                    self.resync_unit(d, stripe, role)?.map(|unit| (role, unit))
                }
                _ => None,
            };
            self.stores[d].set_cursor(stripe + 1);
            if let Some((role, (unit, unreadable))) = unit {
                self.put_missed_unit(d, stripe, role, &unit)?;
                self.mark_unreadable(stripe, role, &unit, &unreadable);
                resynced += 1;
                self.restore_own_held(stripe, role, own, &unreadable);
            }
            drop(guard);
            self.progress_operation(stripe + 1);
            self.checkpoint_cursor(&mut last_checkpoint)?;
        }
        Ok(resynced)
    }

    /// The unit of re-added member `d` (`role`) in missed `stripe`:
    /// decoded from the others where k of them hold the stripe, with the
    /// rows no combination of them decodes to their checksums (returned,
    /// to be marked unreadable). Below k nothing can be decoded, and rows
    /// marked for that would stay unreadable after the members return (the
    /// fault suite's rebuild-interrupted: a second server down during a
    /// re-add): None where the member's own unit matches, block by block,
    /// the entries the array kept for it while it was out (it missed no
    /// write there, and is kept as it is), or where the members in service
    /// and the own units of every member being re-added are more than k
    /// and one codeword ([`Array::own_units_vouched`]); else the re-add
    /// pauses here as a rebuild does, marking nothing, and `rebuild`
    /// resumes it.
    fn resync_unit(
        &self,
        d: usize,
        stripe: u64,
        role: usize,
    ) -> Result<Option<(Vec<u8>, Vec<u64>)>> {
        let k = self.geo.k();
        if self.others_in_service(stripe, role) >= k {
            let (unit, unreadable) = self.reconstruct_unit(stripe, role)?;
            // Rows left undecoded with k members serving are truly lost;
            // with fewer (one failed during the read), only unavailable.
            if unreadable.is_empty() || self.others_in_service(stripe, role) >= k {
                return Ok(Some((unit, unreadable)));
            }
        }
        if self.own_unit_current(d, stripe, role) || self.own_units_vouched(d, stripe, role) {
            return Ok(None);
        }
        self.pause_below_k("re-add", d, stripe, role)?;
        // k members serve again (none can return during a re-add).
        self.reconstruct_unit(stripe, role).map(Some)
    }

    /// Whether every block of re-added member `d`'s own unit of `stripe`
    /// reads and matches the entry the array kept for it while it was out
    /// (unknown, so never, where the member was already out at the open).
    /// Its own table's entries for them are set to match.
    fn own_unit_current(&self, d: usize, stripe: u64, role: usize) -> bool {
        let Some((unit, current)) = self.unit_as_held(stripe, role) else {
            return false;
        };
        if current {
            let g = &self.geo;
            let first = g.checksum_index(g.place(stripe, role).row, 0);
            self.stores[d].record_checksums(first, &unit);
        }
        current
    }

    /// Unit `role` of `stripe` as its member's device holds it (read
    /// there, whatever the member's state), and whether every block of it
    /// matches the entry the array keeps for it; None where it cannot be
    /// read.
    fn unit_as_held(&self, stripe: u64, role: usize) -> Option<(Vec<u8>, bool)> {
        let g = &self.geo;
        let place = g.place(stripe, role);
        let store = &self.stores[place.device];
        let dev = store.device()?;
        let mut unit = vec![0u8; g.unit_bytes() as usize];
        dev.read_at(&mut unit, g.device_offset(place.row, 0)).ok()?;
        let first = g.checksum_index(place.row, 0);
        let matches = (first..)
            .zip(unit.chunks_exact(g.block() as usize))
            .all(|(index, block)| {
                store.expected_checksum(stripe, index) == Some(crate::codec::crc32c(block))
            });
        Some((unit, matches))
    }

    /// Where fewer than k other members serve `stripe` and re-added
    /// member `d`'s entries there are unknown: whether its own unit is
    /// current all the same, a spare vouching. The members in service
    /// (each block matching its entry) and the own units of every member
    /// being re-added (`d`'s among them, each as its device holds it),
    /// more than k in all, must be one codeword: a unit that missed a
    /// write there would not fit the members that took it (any k members
    /// fix the codeword), so then no write `d` missed reached the stripe,
    /// and its unit is kept (its own table's entries set to match).
    /// Without it, three members lagging at one stripe (a new member
    /// rebuilding, two re-added after a second failure whose region was
    /// written while they were out) paused every re-add and the rebuild
    /// there at every open, every device back, and the stripes from there
    /// on read as I/O errors for good (the fault suite's
    /// rebuild-interrupted, PG 0 from stripe 720 on; unit test
    /// `three_members_lagging_at_a_stripe_go_on_where_a_spare_vouches_for_their_own_units`).
    fn own_units_vouched(&self, d: usize, stripe: u64, role: usize) -> bool {
        let g = &self.geo;
        let mut known: Vec<Option<Vec<u8>>> = vec![None; g.width()];
        for (r, member) in known.iter_mut().enumerate() {
            let device = g.place(stripe, r).device;
            let store = &self.stores[device];
            let serving = self.holds(device, stripe);
            let re_adding = store.is_rebuilding() && store.is_re_adding();
            if !(serving || re_adding) {
                continue;
            }
            match self.unit_as_held(stripe, r) {
                Some((_, false)) if serving => return false,
                Some((unit, _)) => *member = Some(unit),
                None => return false,
            }
        }
        if known[role].is_none() {
            return false;
        }
        let Some(whole) = self.decode_vouched_by_spare(&known) else {
            return false;
        };
        let one = known
            .iter()
            .zip(&whole)
            .all(|(k, w)| k.as_ref().is_none_or(|k| k == w));
        if one {
            let place = g.place(stripe, role);
            let unit = known[role].as_ref().expect("known");
            self.stores[d].record_checksums(g.checksum_index(place.row, 0), unit);
        }
        one
    }

    /// Records the regions of `stripes` (None: every region) in the
    /// missed map, durably, before member `d` is rewritten. A mirrored
    /// copy of the map that missed the record (format 2) fails its device
    /// here, on the superblocks, before the member is rewritten: left in
    /// service, it could be read first at the next open after a cut, and a
    /// re-add tried again would find neither the member's journal (gone
    /// with the rewrite) nor the record, and keep the member's stale
    /// parity of those stripes (as for the intent map, seed 1116, and the
    /// degraded-write log, seed 277285).
    fn mark_missed(&self, d: usize, stripes: Option<&BTreeSet<u64>>) -> Result<()> {
        self.intent.mark_missed_stripes(stripes).map_err(|e| {
            Error::io(
                format!(
                    "recording what device {d} must have reconstructed in the missed-write map"
                ),
                e,
            )
        })?;
        self.fail_broken_metadata_copies();
        Ok(())
    }

    /// Member `d`'s metadata and dedup layer for its return over `dev`;
    /// returns the device the member serves through (its dedup layer, if
    /// any).
    ///
    /// Without dedup, a format 2 member gets a fresh metadata area with
    /// current copies of the mirrored files (all it held there is stale,
    /// its journal read before). With dedup, the data on the member is
    /// reachable only through its dedup maps (in its area, or in the array
    /// folder under format 1): they are opened as an open after a crash
    /// opens them, the area kept with only its mirrored copies rewritten.
    /// Where they cannot be opened (an area or map that does not read
    /// back), the member starts blank, as a replacement does, and every
    /// region is marked missed first: a rebuild in place, with a warning.
    fn re_add_metadata(&self, d: usize, dev: Arc<dyn Device>) -> Result<Arc<dyn Device>> {
        let path = self.config.lock().unwrap().file.devices[d].clone();
        let dev_err = |reason: String| Error::Device {
            path: path.clone(),
            reason,
        };
        let fresh_area = |dev: &Arc<dyn Device>| {
            self.fresh_metadata_area(d, dev)
                .map_err(|e| dev_err(format!("cannot write its metadata area: {e}")))
        };
        let Some(backend) = &self.backend else {
            fresh_area(&dev)?;
            return Ok(dev);
        };
        let cfg = self.config.lock().unwrap().file.dedup.clone();
        let layer = |dev: Arc<dyn Device>, fresh: bool| {
            super::wrap_dedup(
                &self.storage,
                &self.dir,
                &cfg,
                &self.geo,
                dev,
                Arc::clone(backend),
                d,
                fresh,
            )
        };
        // Format 2: its own area, opened as it left it, its copies of the
        // mirrored files rewritten (its dedup maps stay).
        let kept = self
            .attach_metadata_area(d, &dev, AreaFs::open)
            .map_err(|e| format!("its metadata area: {e}"))
            .and_then(|()| {
                layer(Arc::clone(&dev), false).map_err(|e| format!("its dedup maps: {e}"))
            });
        let layer = match kept {
            Ok(layer) => layer,
            Err(why) => {
                self.warn(format!(
                    "device {d}: {why}; it is re-added blank and every stripe is reconstructed \
                     on it"
                ));
                self.mark_missed(d, None)?;
                fresh_area(&dev)?;
                layer(dev, true)?
            }
        };
        self.stores[d].set_dedup(layer.here);
        Ok(layer.device)
    }

    /// The stripes member `d`'s parity journal held records for when it
    /// left, read from `raw` (format 2: its metadata area) or the array
    /// folder (format 1); None where the journal cannot be read whole.
    fn journal_stripes_left_on(&self, d: usize, raw: &Arc<dyn Device>) -> Option<BTreeSet<u64>> {
        let name = format!("{JOURNAL_DIR}/dev{d}.jrnl");
        let read = if self.meta.is_some() {
            AreaFs::open(
                Arc::clone(raw),
                self.geo.meta_area_offset(),
                self.geo.meta_area_bytes,
            )
            .map(Arc::new)
            .and_then(|area| {
                if !area.exists(&name) {
                    return Ok(None);
                }
                let file = area.open_file(&name)?;
                let mut bytes = vec![0u8; file.len()? as usize];
                file.read_at(&mut bytes, 0)?;
                Ok(Some(bytes))
            })
        } else {
            let path = self.dir.join(&name);
            if self.storage.exists(&path) {
                read_all(self.storage.as_ref(), &path).map(Some)
            } else {
                Ok(None)
            }
        };
        let (stripes, why) = match read {
            // Never created: it held nothing.
            Ok(None) => (Some(BTreeSet::new()), String::new()),
            Ok(Some(bytes)) => (journal::stripes_in(&bytes), String::new()),
            Err(e) => (None, format!(" (it cannot be read: {e})")),
        };
        if stripes.is_none() {
            self.warn(format!(
                "device {d}: what its parity journal held when it left is unknown{why}: every \
                 stripe it holds parity of is reconstructed"
            ));
        }
        stripes
    }

    /// Writes a reconstructed unit to the member being re-added.
    fn put_missed_unit(&self, d: usize, stripe: u64, role: usize, unit: &[u8]) -> Result<()> {
        if self.write_unit_blocks(stripe, role, 0, unit) {
            return Ok(());
        }
        Err(Error::Unavailable(format!(
            "device {d} failed while it was re-added"
        )))
    }
}
