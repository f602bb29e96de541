//! Partial-write policies that log instead of updating parity in place:
//! classic parity logging (`plog`) and PARIX speculative writes (`parix`),
//! and their replay.
//!
//! A partial, non-degraded stripe write under `plog` reads the old data,
//! writes the new data in place and appends the parity deltas to each parity
//! device's journal. Under `parix` it writes the new data in place without
//! reading and appends the new value d(r) to each parity journal; only when a
//! parity journal has no original d(0) for a block (the first write since
//! its parity was materialised: the paper's NEED_D0 answer) is d(0) read,
//! once, and logged first. Parity on the device is then stale until replay.
//!
//! Invariants:
//! - the parity of a stripe with journal entries is never read before the
//!   stripe is replayed (degraded reads, read-modify-write, rebuild, scrub
//!   replay first; a reader under the shared lock gets `NeedsReplay` and
//!   retries under the exclusive lock);
//! - a write that recomputes parity rows from data (reconstruct-write,
//!   full-stripe) first logs an invalidation of those rows;
//! - replay of a stripe writes its parity and then logs an invalidation, under
//!   the stripe's intent mark, so a crash in between is resynchronised;
//! - a journal never grows past its bound: a write that does not fit falls
//!   back to read-modify-write (counted) and triggers replay.

use super::checksum::zero_block_crc;
use super::io::UnitWrite;
use super::journal::{self, Kind};
use super::replay_fold::DeviceFold;
use super::store::{ChunkOp, ChunkReply, ChunkRequest};
use super::Array;
use crate::counters::{bump, IoClass};
use crate::error::{Error, Result};
use crate::media::remote::{within, Scope};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

/// Quiet time after which logged writes are replayed.
pub const IDLE_REPLAY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Bytes kept free in every journal for invalidation marks.
const JOURNAL_RESERVE_BYTES: u64 = 1 << 20;
/// The smallest journal bound `create` accepts: below it not even one
/// logged block (a 32-byte header and 4 KiB) fits beside the reserve, and
/// every partial write would silently fall back to read-modify-write.
pub const JOURNAL_BYTES_MIN: u64 = JOURNAL_RESERVE_BYTES + 2 * (32 + 4096);

/// A journal is replayed when it passes `bound / REPLAY_AT_FRACTION_OF_BOUND`.
pub const REPLAY_AT_FRACTION_OF_BOUND: u64 = 2;

/// Journal blocks a replay reads in one batch (1 MiB of 4 KiB blocks):
/// the bound on what a stripe's replay holds in RAM besides its rows.
const REPLAY_READ_BATCH: usize = 256;

/// After a replay, a journal still holding entries is compacted once it
/// passes `bound / COMPACT_AT_FRACTION_OF_BOUND` and is more than half dead.
pub const COMPACT_AT_FRACTION_OF_BOUND: u64 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum WritePolicy {
    /// Read-modify-write or reconstruct-write in place.
    #[default]
    Rmw,
    /// Classic parity logging: old data read, parity deltas journaled.
    Plog,
    /// PARIX: new data values journaled, original read once.
    Parix,
    /// 3-way replication baseline: RS(1,2), every write a full stripe.
    Replicate,
}

impl WritePolicy {
    pub fn journals(self) -> bool {
        matches!(self, WritePolicy::Plog | WritePolicy::Parix)
    }
}

impl std::str::FromStr for WritePolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<WritePolicy> {
        match s {
            "rmw" => Ok(WritePolicy::Rmw),
            "plog" => Ok(WritePolicy::Plog),
            "parix" => Ok(WritePolicy::Parix),
            "replicate" => Ok(WritePolicy::Replicate),
            _ => Err(Error::Config(format!(
                "write policy {s:?} is not one of rmw, plog, parix, replicate"
            ))),
        }
    }
}

impl std::fmt::Display for WritePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(match self {
            WritePolicy::Rmw => "rmw",
            WritePolicy::Plog => "plog",
            WritePolicy::Parix => "parix",
            WritePolicy::Replicate => "replicate",
        })
    }
}

/// A parity block read for replay.
enum StoredParity {
    /// As stored, checksum good: the logged deltas are folded into it.
    Intact(Vec<u8>),
    /// The stored block was bad; this one is encoded from current data.
    Recomputed(Vec<u8>),
    /// Bad, and the data to recompute it could not be read.
    Unavailable,
}

/// The unit of a torn write that [`Array::decode_folded_or_not`] chooses
/// by: a sector of the devices (512 bytes).
const SECTOR_BYTES: usize = 512;

/// A row's members as read (`shards`), known where `present`.
fn known_members(shards: &[Vec<u8>], present: &[bool]) -> Vec<Option<Vec<u8>>> {
    shards
        .iter()
        .zip(present)
        .map(|(s, &p)| p.then(|| s.clone()))
        .collect()
}

/// A parity's fold in a degraded replay: (parity j, its device, the
/// folded blocks by row, the records folded).
type FoldedParity = (
    usize,
    usize,
    std::collections::BTreeMap<u32, Vec<u8>>,
    usize,
);

/// The parity a row's records leave, told by their base (see
/// `Array::told_by_bases`): `before`, the parity block as read, holds the
/// records in some of its 512-byte sectors (a cut may tear a fold's
/// write) and lacks them in the others; `folded` is `before` with the
/// records folded into every sector. The one choice of sectors that,
/// unfolded, gives the base's checksum says which: the parity then is the
/// base with the records folded in once, in every sector. None where no
/// choice, or more than one, gives it (a parity changed otherwise, or a
/// checksum that two choices share). Every choice is tried where at most
/// 8 sectors differ (a 4 KiB block: 256 checksums of it), else only
/// "none" and "all". A choice matches by chance with odds of 2^-32 each.
fn parity_told_by_base(before: &[u8], folded: &[u8], base: u32) -> Option<Vec<u8>> {
    let moving: Vec<std::ops::Range<usize>> = (0..before.len())
        .step_by(SECTOR_BYTES)
        .map(|from| from..(from + SECTOR_BYTES).min(before.len()))
        .filter(|r| before[r.clone()] != folded[r.clone()])
        .collect();
    let all = (1u32 << moving.len().min(31)) - 1;
    let choices: Vec<u32> = match moving.len() <= 8 {
        true => (0..=all).collect(),
        false => vec![0, all],
    };
    let mut found: Option<Vec<u8>> = None;
    for choice in choices {
        // The block with the sectors of `choice` unfolded: the parity
        // without the records, if they were in just those sectors.
        let mut without = before.to_vec();
        for (i, r) in moving.iter().enumerate() {
            if choice & (1 << i) != 0 {
                without[r.clone()].copy_from_slice(&folded[r.clone()]);
            }
        }
        if crate::codec::crc32c(&without) != base {
            continue;
        }
        if found.is_some() {
            return None;
        }
        // Folded into every sector once.
        let mut told = before.to_vec();
        for (i, r) in moving.iter().enumerate() {
            if choice & (1 << i) == 0 {
                told[r.clone()].copy_from_slice(&folded[r.clone()]);
            }
        }
        found = Some(told);
    }
    found
}

impl Array {
    pub(super) fn parity_devices(&self, stripe: u64) -> Vec<(usize, usize)> {
        let g = &self.geo;
        (0..g.m())
            .map(|j| (j, g.place(stripe, g.k() + j).device))
            .collect()
    }

    /// Makes the parity journals of the chosen devices durable, each by
    /// its own sync ([`Array::sync_journals_with`]): format 1's, whose
    /// files are not on the devices.
    pub(super) fn sync_journals_of(&self, chosen: &[bool]) -> Result<()> {
        self.sync_journals_with(chosen, |_, store| store.journal_sync())
    }

    /// Whether the parity journals' syncs go side by side, a thread each:
    /// where every chosen device takes it (`Device::side_by_side`: chunks
    /// across the network, where each journal's sync is a round trip or
    /// two of its own), and in format 1, whose journals are files of the
    /// folder, each synced by its own `fdatasync` (a file system commits
    /// concurrent ones together).
    fn journal_syncs_side_by_side(&self, journals: &[usize]) -> bool {
        self.meta.is_none() && journals.len() > 1 || self.on_chunks_side_by_side(journals)
    }

    /// Whether every chosen device takes its work side by side with its
    /// peers' (`Device::side_by_side`: chunks across the network).
    pub(super) fn on_chunks_side_by_side(&self, chosen: &[usize]) -> bool {
        chosen.iter().all(|&d| {
            self.stores[d]
                .device()
                .is_some_and(|dev| dev.side_by_side())
        })
    }

    /// The journals of the chosen devices, each synced by `sync` (the
    /// first step of a flush: [`Array::sync_journals_and_devices`]), side
    /// by side where every chosen device takes it (`Device::side_by_side`:
    /// chunks across the network, where each journal's sync is a round
    /// trip or two of its own), else in turn. A journal whose sync fails
    /// is latched: every stripe it holds records for is pinned dirty in
    /// the intent log (durably, so the next open resyncs it from its data,
    /// which the flush's device syncs make durable), the journal takes no
    /// more appends (partial writes to its stripes go in place), and
    /// (format 2) its device is failed, or else this flush fails. Later
    /// flushes skip the latched journal and succeed: nothing they
    /// acknowledge depends on it.
    pub(super) fn sync_journals_with(
        &self,
        chosen: &[bool],
        sync: impl Fn(
                usize,
                &super::store::ChunkStore,
            ) -> std::result::Result<(), (std::io::Error, Vec<u64>)>
            + Sync,
    ) -> Result<()> {
        // Only the devices that keep a journal: a thread per device with
        // none (rmw, replicate) made a flush 1.46 times slower on loopback.
        let journals: Vec<usize> = (0..self.stores.len())
            .filter(|&d| chosen[d] && self.stores[d].has_journal())
            .collect();
        let parallel = self.journal_syncs_side_by_side(&journals);
        let synced = super::meta::side_by_side(&journals, parallel, |&d| sync(d, &self.stores[d]));
        self.journal_sync_outcomes(journals.into_iter().zip(synced))
    }

    /// Handles each journal's sync outcome (device, outcome): a failed
    /// one keeps its stripes dirty until a resync and fails the flush,
    /// unless its device is failed for it (the flush goes on without it).
    pub(super) fn journal_sync_outcomes(
        &self,
        outcomes: impl Iterator<Item = (usize, std::result::Result<(), (std::io::Error, Vec<u64>)>)>,
    ) -> Result<()> {
        let mut first_error = None;
        for (d, result) in outcomes {
            if let Err((e, stripes)) = result {
                self.warn(format!(
                    "parity journal of device {d} failed to sync ({e}): its {} stripes \
                     stay dirty until a resync, and its partial writes go in place",
                    stripes.len()
                ));
                for stripe in stripes {
                    self.intent
                        .pin(stripe)
                        .map_err(|e| Error::io("marking the write-intent log", e))?;
                }
                if self.journal_on_device_failed(d, "parity journal sync", &e) {
                    // The device is out: its parity no longer counts, and
                    // the flush goes on with the others (as for any device
                    // error), within m.
                    continue;
                }
                first_error.get_or_insert(Error::io(
                    format!("syncing the parity journal of device {d}"),
                    e,
                ));
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// When a device fails: the parity journals are synced with the
    /// superblocks that record it, so the records of partial writes made
    /// before the failure (whose data is in place and synced with the
    /// superblocks) cannot be lost by a power cut that leaves the array
    /// degraded, where parity is the only record of the missing unit.
    /// Journals busy in another thread are skipped (never wait on a lock
    /// here: this runs inside failing I/O paths).
    ///
    /// As a flush does ([`Array::sync_journals_and_devices`]): what each
    /// journal's device sync will make durable is taken, every member in
    /// service is synced (one batch: one round trip to chunks across the
    /// network), and then each journal's sync is finished (its metadata
    /// area's directory, where its length changed), side by side on
    /// chunks that take it. A committed length says its records were
    /// flushed with their data, and the next open folds them as such:
    /// committed here ahead of the records' data writes on other members
    /// (before 2026-11-28 the journals were synced first, the members
    /// only by the superblock writes after), a cut kept the records and
    /// lost the data, and the open folded them into parity whose members
    /// never held them (the cluster simulator's seed 1023612: a block
    /// decoded as bytes no write put there). A member whose sync fails is
    /// failed (that failure's own pass syncs the journals without it);
    /// where a sync fails on a full file system (the member stays in
    /// service), no journal is committed here: the next flush commits
    /// them or fails. Only the devices' data is synced, not their checksum
    /// pages (taking a table's shards could wait on the failing path
    /// itself): a block ahead of its entry after a cut reads as a mismatch
    /// and is decoded, as any unsynced write a cut kept.
    ///
    /// The members are synced whatever the write policy, journals or not,
    /// before the superblocks record the failure: the next open's degraded
    /// replay takes a row the degraded-write log does not cover as it was
    /// at the failure, durable then, and every write since as a degraded
    /// write, logged first. (The superblock writes sync each member too,
    /// one after another or side by side, each with its own write; a dedup
    /// layer passing its superblock write to its chunk as one FUA write,
    /// tried on 2026-11-28, then made the cluster simulator's seed 1167141,
    /// rmw with parity dedup, read a block wrong until this sync ran for
    /// every policy.)
    pub(super) fn sync_on_failure(&self) {
        let points: Vec<_> = self
            .stores
            .iter()
            .map(|s| s.journal_sync_point_now())
            .collect();
        if !self.sync_members_in_service() {
            return;
        }
        let all: Vec<usize> = (0..self.stores.len()).collect();
        let in_service: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&d| self.stores[d].device().is_some())
            .collect();
        let parallel = self.on_chunks_side_by_side(&in_service);
        // A journal busy in another thread when its point was to be taken
        // is skipped: a sync of it without a point would commit records
        // whose data writes on other members the syncs above may not have
        // covered, and a mark held before its parity write.
        let synced = super::meta::side_by_side(&all, parallel, |&d| match &points[d] {
            Some(point) => self.stores[d].journal_sync_after_device_sync(point.clone(), false),
            None => Ok(()),
        });
        for (d, result) in synced.into_iter().enumerate() {
            if let Err((e, stripes)) = result {
                self.warn(format!(
                    "parity journal of device {d} failed to sync ({e}); its stripes stay dirty"
                ));
                for stripe in stripes {
                    let _ = self.intent.pin(stripe);
                }
            }
        }
    }

    /// Syncs every device in service, in one batch, for
    /// [`Array::sync_on_failure`]; fails a device whose sync
    /// fails (not for a full file system). False where some device in
    /// service was left unsynced.
    fn sync_members_in_service(&self) -> bool {
        let mut reqs: Vec<ChunkRequest> = (0..self.stores.len())
            .filter(|&d| self.stores[d].device().is_some())
            .map(|d| ChunkRequest::new(d, ChunkOp::Sync))
            .collect();
        self.submit(&mut reqs);
        let mut all = true;
        for req in reqs {
            if let ChunkReply::Failed(e) = req.reply {
                let d = req.store;
                if Self::is_space_error(&e) {
                    self.warn(format!(
                        "device {d} failed to sync ({e}) on a failure: no parity \
                         journal is committed until the next flush"
                    ));
                    all = false;
                } else {
                    self.latch_failure(d, "sync on a failure", &e);
                }
            }
        }
        all
    }

    /// Stripes that some parity journal holds records for (tests, status).
    pub fn journaled_stripes(&self) -> Vec<u64> {
        let mut stripes: Vec<u64> = Vec::new();
        for store in &self.stores {
            stripes.extend(store.journal_stripes());
        }
        stripes.sort_unstable();
        stripes.dedup();
        stripes
    }

    /// Whether any parity journal of the stripe holds entries.
    pub(super) fn journal_pending(&self, stripe: u64) -> bool {
        if !self.write_policy.journals() {
            return false;
        }
        self.parity_devices(stripe)
            .iter()
            .any(|&(_, p)| self.stores[p].journal_has_stripe(stripe))
    }

    /// The parity journals of a stripe are all open and have their space
    /// reserved: only then is a write logged.
    fn journals_ready(&self, parity: &[(usize, usize)]) -> bool {
        parity.iter().all(|&(_, p)| self.stores[p].journal_ready())
    }

    /// Logs a partial stripe write. Returns false when a journal has no room
    /// or cannot grow (the caller falls back to read-modify-write). Caller
    /// holds the stripe lock exclusively and has marked the intent; the
    /// stripe is healthy.
    pub(super) fn journal_write(&self, stripe: u64, writes: &[UnitWrite]) -> Result<bool> {
        let g = self.geo;
        let block = g.block();
        let parity = self.parity_devices(stripe);
        if !self.journals_ready(&parity) {
            bump(&self.counters.array.journal_fallbacks);
            return Ok(false);
        }
        let mut news = Vec::with_capacity(writes.len());
        let mut records: Vec<Vec<u8>> = vec![Vec::new(); g.m()];
        let mut need_d0_writes = 0u64;
        // Each record carries, per row, its journal's parity block's
        // checksum as it stands (version 4): records are appended only
        // while the parity holds none of the row's live ones, so an open
        // can tell whether the parity holds them where the checksum
        // table cannot (`ParityJournal::row_base`).
        let takes_bases: Vec<bool> = parity
            .iter()
            .map(|&(_, p)| self.stores[p].journal_takes_bases())
            .collect();
        let bases = |j: usize, blocks: &std::ops::Range<u64>| -> Vec<Option<u32>> {
            if !takes_bases[j] {
                return Vec::new();
            }
            let place = g.place(stripe, g.k() + j);
            blocks
                .clone()
                .map(|row| {
                    self.expected_crc(place.device, stripe, g.checksum_index(place.row, row))
                })
                .collect()
        };
        for w in writes {
            let blocks = w.blocks(block);
            let partial = blocks != w.covered(block);
            let role16 = w.role as u16;
            // Full blocks of new data: the current blocks are read when a
            // write covers a block partly, when plog needs the old value,
            // or when a parity journal answers NEED_D0 (it has no d(0)).
            let need: Vec<Vec<bool>> = if self.write_policy == WritePolicy::Parix {
                parity
                    .iter()
                    .map(|&(_, p)| self.stores[p].journal_needs_d0(stripe, role16, blocks.clone()))
                    .collect()
            } else {
                Vec::new()
            };
            let need_d0 = need.iter().any(|n| n.iter().any(|x| *x));
            let read_current = partial || need_d0 || self.write_policy == WritePolicy::Plog;
            let current = if read_current {
                let read = || self.read_unit_blocks(stripe, w.role, blocks.clone());
                Some(match need_d0 {
                    true => within(Scope::D0, read)?,
                    false => read()?,
                })
            } else {
                None
            };
            let new = match &current {
                Some(cur) => {
                    let mut buf = cur.clone();
                    super::io::overlay(&mut buf, blocks.start * block, w);
                    buf
                }
                None => w.bytes.to_vec(),
            };
            match self.write_policy {
                WritePolicy::Parix => {
                    need_d0_writes += need_d0 as u64;
                    // d(r) goes to every parity journal as the same record
                    // where none takes bases: encoded and checksummed once,
                    // copied to the others. With bases, one record each
                    // (each carries its own parity's).
                    let shared = (!takes_bases.iter().any(|t| *t)).then(|| {
                        let mut value = Vec::with_capacity(new.len() + 32);
                        journal::encode(
                            &mut value,
                            Kind::Value,
                            stripe,
                            role16,
                            blocks.start as u32,
                            &new,
                        );
                        value
                    });
                    for (j, rec) in records.iter_mut().enumerate() {
                        if let Some(d0) = current.as_ref().filter(|_| need_d0) {
                            // Runs of blocks this journal needs d(0) for.
                            let mut i = 0;
                            while i < need[j].len() {
                                if !need[j][i] {
                                    i += 1;
                                    continue;
                                }
                                let start = i;
                                while i < need[j].len() && need[j][i] {
                                    i += 1;
                                }
                                let bytes = &d0[start * block as usize..i * block as usize];
                                journal::encode(
                                    rec,
                                    Kind::Original,
                                    stripe,
                                    role16,
                                    (blocks.start as usize + start) as u32,
                                    bytes,
                                );
                            }
                        }
                        match &shared {
                            Some(value) => rec.extend_from_slice(value),
                            None => journal::encode_with_bases(
                                rec,
                                Kind::Value,
                                stripe,
                                role16,
                                blocks.start as u32,
                                &new,
                                &bases(j, &blocks),
                            ),
                        }
                    }
                }
                WritePolicy::Plog => {
                    let old = current.as_ref().expect("plog reads the old value");
                    let delta: Vec<u8> = old.iter().zip(&new).map(|(a, b)| a ^ b).collect();
                    let mut deltas = vec![vec![0u8; delta.len()]; g.m()];
                    {
                        let mut p: Vec<&mut [u8]> =
                            deltas.iter_mut().map(|v| v.as_mut_slice()).collect();
                        self.codec.update(w.role, &delta, &mut p);
                    }
                    for (j, rec) in records.iter_mut().enumerate() {
                        journal::encode_with_bases(
                            rec,
                            Kind::Delta,
                            stripe,
                            (g.k() + j) as u16,
                            blocks.start as u32,
                            &deltas[j],
                            &bases(j, &blocks),
                        );
                    }
                }
                _ => unreachable!("journal_write under a policy that does not log"),
            }
            news.push((w.role, blocks, new));
        }
        // A degraded stripe is never journaled (the caller's rule), also
        // when a data member failed at the read of its current blocks
        // above: the write goes the degraded way, its missing units' new
        // values in the degraded-write log, synced before any device
        // write, as the resync relies on (`rows_torn_unlogged`). Logged
        // here, they lived only in journal records not yet synced, which a
        // cut could drop while it kept a data member's new block: the row
        // no longer one codeword, nothing left to tell it, and a later
        // decode from k members served a mix (the cluster simulator's seed
        // 4863, plog). Nothing is written yet.
        if self.degraded(stripe) {
            bump(&self.counters.array.journal_fallbacks);
            return Ok(false);
        }
        // All or nothing: every journal must have room before any append.
        for (&(_, p), rec) in parity.iter().zip(&records) {
            let room = self.stores[p].journal_has_room(
                rec.len() as u64 + JOURNAL_RESERVE_BYTES,
                self.journal_bytes_max,
            );
            if !room {
                bump(&self.counters.array.journal_fallbacks);
                self.replay_wanted.store(true, Relaxed);
                return Ok(false);
            }
        }
        // The appends go in the same batch as the data writes: no write
        // here is acknowledged durable before a flush or FUA syncs the
        // journals, so their order within the batch does not matter.
        let appends: Vec<ChunkRequest> = parity
            .iter()
            .zip(records)
            .map(|(&(_, p), records)| ChunkRequest::new(p, ChunkOp::LogAppend { records }))
            .collect();
        let units: Vec<(u64, usize, u64, &[u8])> = news
            .iter()
            .map(|(role, blocks, new)| (stripe, *role, blocks.start, new.as_slice()))
            .collect();
        let (_, replies) = self.write_units_with(&units, false, appends);
        let mut failed = None;
        for (&(_, p), reply) in parity.iter().zip(replies) {
            match reply {
                ChunkReply::Done => {
                    let bytes = self.stores[p].journal_bytes();
                    if bytes > self.journal_bytes_max / REPLAY_AT_FRACTION_OF_BOUND {
                        self.replay_wanted.store(true, Relaxed);
                    }
                }
                ChunkReply::Failed(e) => {
                    failed.get_or_insert((p, e));
                }
                ChunkReply::Unavailable | ChunkReply::Mismatch => {
                    failed.get_or_insert((p, std::io::Error::other("no parity journal")));
                }
            }
        }
        if let Some((p, e)) = failed {
            // Other journals hold the write's records, and this one may
            // hold part of them: none must ever be folded.
            self.warn(format!(
                "appending to the parity journal of device {p}: {e}; the write went in place, \
                 stripe {stripe}'s parity is recomputed from its data, and writes to this \
                 journal fall back to read-modify-write until it has room again"
            ));
            bump(&self.counters.array.journal_errors);
            bump(&self.counters.array.journal_fallbacks);
            // Format 2: the journal is on the device, and an append that
            // failed is a device write error, which fails the device as
            // any other does (not a full journal: that is a space error).
            // What the journal holds after it is not known: the append may
            // land later (a request the writer gave up on, still queued at
            // its server), over the place the journal's end went back to,
            // and a server that restarted may have dropped records it
            // acknowledged before. Kept in service, the device's journal
            // was folded by a later open (the unit test
            // `an_append_without_a_reply_that_lands_later_never_reaches_parity`).
            self.journal_on_device_failed(p, "parity journal append", &e);
            let rows: std::collections::BTreeSet<u64> = news
                .iter()
                .flat_map(|(_, blocks, _)| blocks.clone())
                .collect();
            return self.resync_after_failed_append(stripe, p, &rows);
        }
        bump(&self.counters.array.journal_writes);
        self.counters
            .array
            .add(&self.counters.array.need_d0, need_d0_writes);
        Ok(true)
    }

    /// After a failed append to device `p`'s journal (the new data
    /// written in place beside it, in block `rows` of its units): the
    /// stripe's region stays dirty until the next open (which resyncs it
    /// before any replay), and parity is recomputed from the data, which
    /// drops (logs an invalidation of, or forgets) everything the
    /// journals hold for it. Where it cannot be (a data member out, or
    /// lost during that resync), the other journals' records are folded
    /// into their parity and `p`'s parity lacks the write: its blocks of
    /// those rows are marked unreadable, so a decode leaves them out
    /// rather than mixing them with the rest (the cluster simulator:
    /// seed 45698, parix, a data member lost during this resync, and the
    /// next write of the stripe failed, no combination of the five
    /// members vouched for; left in, the stale parity would have decoded
    /// the missing unit wrong once the other parity was lost).
    fn resync_after_failed_append(
        &self,
        stripe: u64,
        p: usize,
        rows: &std::collections::BTreeSet<u64>,
    ) -> Result<bool> {
        self.intent
            .pin(stripe)
            .map_err(|e| Error::io("marking the write-intent log", e))?;
        if !self.resync_stripe(stripe, false) {
            self.mark_parity_rows_unreadable(stripe, p, rows);
        }
        Ok(true)
    }

    /// Marks device `p`'s parity blocks of `rows` of `stripe` unreadable
    /// (their entry the complement of their checksum) as they are on the
    /// device, in the rows whose members are not one codeword with it (a
    /// resync that could vouch for the missing units rewrote parity from
    /// them: nothing stale is left there); a write of the row replaces
    /// the mark. Nothing where `p` does not hold the stripe.
    fn mark_parity_rows_unreadable(
        &self,
        stripe: u64,
        p: usize,
        rows: &std::collections::BTreeSet<u64>,
    ) {
        let g = &self.geo;
        let Some(role) = g.role_on(stripe, p).filter(|&r| r >= g.k()) else {
            return;
        };
        let roles: Vec<usize> = (0..g.width()).collect();
        let units = self.read_units_raw(stripe, &roles);
        let Some(unit) = &units[role] else {
            return;
        };
        let place = g.place(stripe, role);
        let block = g.block() as usize;
        for &row in rows {
            if self.one_codeword_row(&units, row).is_some() {
                continue;
            }
            let at = row as usize * block;
            let crc = crate::codec::crc32c(&unit[at..at + block]);
            self.stores[p].set_checksum(g.checksum_index(place.row, row), !crc);
        }
    }

    /// Logs that parity rows `[first, first+count)` of a stripe are about to
    /// be recomputed from data, so nothing logged for them applies any more.
    /// A journal that cannot take the mark forgets the rows in RAM and the
    /// stripe's region is pinned dirty, so a restart resyncs the stripe
    /// before it replays what the file still holds.
    pub(super) fn journal_invalidate(&self, stripe: u64, first: u64, count: u64) -> Result<()> {
        self.journal_invalidate_before(stripe, first, count, MarkParity::Unknown)
            .map(drop)
    }

    /// [`Array::journal_invalidate`] before a write that leaves the parity
    /// `parity` says: each mark carries its rows' checksums, so that an
    /// open that finds the mark past its journal's sync tells from the
    /// parity block whether the write landed. The marks are held out of
    /// every sync until the returned guard is dropped: the caller keeps it
    /// until the writes the marks stand for are answered
    /// ([`journal::ParityJournal::append_held`]; test
    /// `a_whole_stripe_writes_mark_synced_by_a_failure_before_its_parity_write_never_reads_wrong`).
    pub(super) fn journal_invalidate_before(
        &self,
        stripe: u64,
        first: u64,
        count: u64,
        parity: MarkParity<'_>,
    ) -> Result<MarksHeld<'_>> {
        let before = journal::Mark::BeforeParity;
        let mut held = MarksHeld::none(self);
        for (j, p) in self.parity_devices(stripe) {
            let after = match parity {
                MarkParity::Units(units) => MarkParity::Unit(&units[j]),
                other => other,
            };
            held.take(self.invalidate_in(p, stripe, first, count, before, after)?);
        }
        Ok(held)
    }

    /// Appends to device `p`'s journal the mark that ends what it logs for
    /// rows `[first, first+count)` of `stripe`; `mark`: before its parity
    /// write, or after a fold's (docs/format.md). The mark carries its
    /// parity rows' checksums as `after` says the write leaves them (a
    /// fold's: the parity's entries, set once its writes were answered),
    /// worked out only where the journal holds the stripe and takes them:
    /// what the open's resync tells a landed write by where the mark
    /// outlived its sync ([`journal::ParityJournal::deferred_mark_crcs`]).
    pub(super) fn invalidate_in(
        &self,
        p: usize,
        stripe: u64,
        first: u64,
        count: u64,
        mark: journal::Mark,
        after: MarkParity<'_>,
    ) -> Result<MarksHeld<'_>> {
        let block = self.geo.block() as usize;
        let crcs = || -> Option<Vec<u32>> {
            match after {
                MarkParity::Unknown | MarkParity::Units(_) => None,
                MarkParity::Entries => self.parity_row_checksums(stripe, p, first, count),
                MarkParity::Unit(parity) => Some(
                    parity
                        .chunks_exact(block)
                        .take(count as usize)
                        .map(crate::codec::crc32c)
                        .collect::<Vec<u32>>(),
                )
                .filter(|c| c.len() == count as usize),
                MarkParity::Zeroes => Some(vec![zero_block_crc(block); count as usize]),
            }
        };
        let (first32, count32) = (first as u32, count as u32);
        match self.stores[p].journal_invalidate(stripe, first32, count32, mark, crcs) {
            Ok(hold) => Ok(MarksHeld {
                array: self,
                holds: hold.map(|h| (p, h)).into_iter().collect(),
            }),
            Err(e) => {
                bump(&self.counters.array.journal_errors);
                self.warn(format!(
                    "appending an invalidation to the parity journal of device {p}: {e}; \
                     stripe {stripe} will be resynchronised at the next open"
                ));
                // Format 2: a device write error, as any other fails its
                // device. Kept in service, the journal held the records the
                // mark was to cancel, and a later open that found a data
                // member out folded them into parity recomputed without
                // them (the cluster simulator, seeds 80585, 74821, 92254:
                // an invalidation the writer gave up on, which landed late
                // or never).
                self.journal_on_device_failed(p, "parity journal invalidation", &e);
                self.intent
                    .pin(stripe)
                    .map_err(|e| Error::io("marking the write-intent log", e))?;
                Ok(MarksHeld::none(self))
            }
        }
    }

    /// The checksum entries of parity rows `[first, first+count)` of
    /// `stripe` on device `p`, where every one is known.
    fn parity_row_checksums(
        &self,
        stripe: u64,
        p: usize,
        first: u64,
        count: u64,
    ) -> Option<Vec<u32>> {
        let g = &self.geo;
        let role = g.role_on(stripe, p).filter(|&r| r >= g.k())?;
        let row = g.place(stripe, role).row;
        (first..first + count)
            .map(|b| self.stores[p].checksum(g.checksum_index(row, b)))
            .collect()
    }

    /// Runs a stripe operation (the caller holds the stripe lock
    /// exclusively); when it meets parity that a journal has not reached
    /// yet (a decode inside a write), replays the stripe and runs it once
    /// more. The operations fail with `NeedsReplay` before changing anything.
    pub(super) fn with_replay<T>(&self, mut op: impl FnMut() -> Result<T>) -> Result<T> {
        match op() {
            Err(Error::NeedsReplay(s)) => {
                self.replay_stripe(s)?;
                op()
            }
            r => r,
        }
    }

    /// Folds everything logged for a stripe into its parity (Eq. 3 for parix,
    /// the sum of deltas for plog). Caller holds the stripe lock exclusively.
    /// Each parity device is replayed on its own; one that fails keeps its
    /// entries (the stripe stays pending) and the first error is returned.
    pub(super) fn replay_stripe(&self, stripe: u64) -> Result<()> {
        self.replay_stripe_as(stripe, false)
    }

    /// As `replay_stripe`, for a stripe being resynchronised (dirty at an
    /// unclean stop): its checksum entries may predate its content (table
    /// pages are written at flushes), so a degraded replay takes parity as
    /// it is on the device instead of judging it by its entry. Judged, a
    /// parity unit written since the last flush looked bad, could not be
    /// recomputed (a data unit is out) and was skipped, and the records
    /// were dropped unfolded: the missing unit decoded wrong.
    pub(super) fn replay_dirty_stripe(&self, stripe: u64) -> Result<()> {
        self.replay_stripe_as(stripe, true)
    }

    fn replay_stripe_as(&self, stripe: u64, dirty: bool) -> Result<()> {
        if !self.journal_pending(stripe) {
            return Ok(());
        }
        within(Scope::Replay, || self.replay_pending_stripe(stripe, dirty))
    }

    fn replay_pending_stripe(&self, stripe: u64, dirty: bool) -> Result<()> {
        self.intent_begin(stripe)?;
        let mut first_error = None;
        let missing = self.missing_data_roles(stripe);
        if !missing.is_empty() && self.degraded_log.is_some() {
            if let Err(e) = self.replay_degraded(stripe, &missing, dirty) {
                first_error = Some(e);
            }
        } else {
            let parity = self.parity_devices(stripe);
            // A clean stripe's journals are folded where they are first
            // (`replay_fold.rs`); what that leaves, the fold in RAM does.
            let at_devices: Vec<DeviceFold> = match dirty {
                false => self.fold_at_devices(stripe, &parity),
                true => parity.iter().map(|_| DeviceFold::NotTried).collect(),
            };
            for ((j, p), at_device) in parity.into_iter().zip(at_devices) {
                let replayed = match at_device {
                    DeviceFold::NotTried => self.replay_parity(stripe, j, p, None),
                    DeviceFold::Done => Ok(()),
                    DeviceFold::RowsLeft { rows, records } => {
                        self.replay_parity(stripe, j, p, Some((&rows, records)))
                    }
                    DeviceFold::Failed(e) => Err(e),
                };
                if let Err(e) = replayed {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.intent.end(stripe);
        match first_error {
            None => {
                bump(&self.counters.array.stripes_replayed);
                Ok(())
            }
            Some(e) => Err(e),
        }
    }

    /// Replays what device `p`'s journal holds for the stripe into parity
    /// unit `j`. The entries leave the index only when the invalidation that
    /// follows the parity write is logged (or forgotten with the region
    /// pinned), so an error before that leaves them in place.
    /// With `left`, only its rows, which a fold at the device left
    /// unwritten, and then the records of the whole unit (its count) are
    /// dropped.
    fn replay_parity(
        &self,
        stripe: u64,
        j: usize,
        p: usize,
        left: Option<(&BTreeSet<u32>, usize)>,
    ) -> Result<()> {
        let only = left.map(|(rows, _)| rows);
        let Some((folded, records)) = self.fold_parity_or_fail(stripe, j, p, false, only)? else {
            return Ok(());
        };
        let records = left.map_or(records, |(_, all)| all);
        self.write_folded_parity(stripe, j, p, &folded, records)
    }

    /// [`Array::fold_parity`], where a journal on its own device that
    /// cannot be read fails that device (format 2): its parity no longer
    /// counts, so nothing is folded into it.
    #[allow(clippy::type_complexity)]
    fn fold_parity_or_fail(
        &self,
        stripe: u64,
        j: usize,
        p: usize,
        dirty: bool,
        only: Option<&BTreeSet<u32>>,
    ) -> Result<Option<(std::collections::BTreeMap<u32, Vec<u8>>, usize)>> {
        match self.fold_parity(stripe, j, p, dirty, only) {
            Err(Error::Io { source, .. })
                if self.journal_on_device_failed(p, "parity journal read", &source) =>
            {
                // Out of service: its parity is rebuilt from data, if ever.
                self.stores[p].journal_forget(stripe);
                Ok(None)
            }
            other => other,
        }
    }

    /// A journal kept on its own device (format 2) that fails is that
    /// device failing: it is latched failed, like any other I/O error of
    /// the device. Returns whether the array goes on without it (format 2,
    /// and at most m devices out); format 1 keeps its journals in the
    /// folder, whose errors are the flush's.
    pub(super) fn journal_on_device_failed(
        &self,
        d: usize,
        what: &str,
        e: &std::io::Error,
    ) -> bool {
        if self.meta.is_none() || Array::is_space_error(e) {
            return false;
        }
        self.latch_failure(d, what, e);
        self.unavailable_count() <= self.geo.m()
    }

    /// Writes parity rows that `fold_parity` computed and drops the records
    /// folded into them.
    fn write_folded_parity(
        &self,
        stripe: u64,
        j: usize,
        p: usize,
        folded: &std::collections::BTreeMap<u32, Vec<u8>>,
        records: usize,
    ) -> Result<()> {
        let g = self.geo;
        for (row, parity) in folded {
            self.write_unit_blocks(stripe, g.k() + j, *row as u64, parity);
        }
        let fold = journal::Mark::AfterFold;
        self.invalidate_in(p, stripe, 0, g.blocks_per_unit(), fold, MarkParity::Entries)?;
        self.counters
            .array
            .records_replayed
            .fetch_add(records as u64, Relaxed);
        Ok(())
    }

    /// The parity rows of unit `j` with what device `p`'s journal holds for
    /// the stripe folded in, in RAM (rows whose parity is unavailable are
    /// left out), and the count of records; None when nothing is logged.
    /// With `only`, only those rows.
    #[allow(clippy::type_complexity)]
    pub(super) fn fold_parity(
        &self,
        stripe: u64,
        j: usize,
        p: usize,
        dirty: bool,
        only: Option<&BTreeSet<u32>>,
    ) -> Result<Option<(std::collections::BTreeMap<u32, Vec<u8>>, usize)>> {
        let g = self.geo;
        let block = g.block() as usize;
        let store = &self.stores[p];
        // In a dirty stripe, what each logged data block holds on its
        // device (see the loop below), read before the journal is held: a
        // failed read fails its device, which syncs every journal.
        let on_disk = if dirty {
            self.logged_blocks_on_disk(stripe, p, only)
        } else {
            Default::default()
        };
        // The journal is held from the lookup of where the stripe's records
        // lie until they are read: a compaction (`journal_reclaim`, at the
        // end of a replay on another thread, which holds no stripe lock)
        // moves records, and a read at an offset looked up before it would
        // fold another record's bytes into parity.
        let held = store.journal_held();
        let Some(mut log) = held.as_ref().and_then(|j| j.stripe_log(stripe)) else {
            return Ok(None);
        };
        let records = log.len();
        if let Some(only) = only {
            log.retain(|(_, row), _| only.contains(row));
        }
        if !self.holds(p, stripe) {
            drop(held);
            // Out of service: its parity is rebuilt from data, if ever.
            store.journal_forget(stripe);
            return Ok(None);
        }
        let journal_io = |e| Error::io(format!("reading the parity journal of device {p}"), e);
        // Per parity row: the delta to fold in.
        let mut rows: std::collections::BTreeMap<u32, Vec<u8>> = Default::default();
        let mut a = vec![0u8; block];
        let mut b = vec![0u8; block];
        let mut scratch = vec![vec![0u8; block]; g.m()];
        // The journal blocks the loop below reads, in its order, fetched
        // REPLAY_READ_BATCH at a time in one batch each (one round trip to
        // a remote chunk, not one per block).
        let wanted = journal::logged_blocks(&log);
        let mut loaded: std::collections::HashMap<u64, Vec<u8>> = Default::default();
        let mut fetched = 0usize;
        let mut read_block = |at: u64, buf: &mut [u8]| -> Result<()> {
            if !loaded.contains_key(&at) {
                let window = &wanted[fetched..(fetched + REPLAY_READ_BATCH).min(wanted.len())];
                fetched += window.len();
                let mut bufs: Vec<Vec<u8>> = window.iter().map(|_| vec![0u8; block]).collect();
                let mut reads: Vec<(u64, &mut [u8])> = window
                    .iter()
                    .zip(bufs.iter_mut())
                    .map(|(&o, b)| (o, b.as_mut_slice()))
                    .collect();
                match held.as_ref().map(|j| j.read_blocks(&mut reads)) {
                    Some(r) => r.map_err(journal_io)?,
                    None => {
                        return Err(Error::io(
                            format!("the parity journal of device {p}"),
                            std::io::Error::other("closed during replay"),
                        ))
                    }
                }
                loaded = window.iter().copied().zip(bufs).collect();
            }
            match loaded.get(&at) {
                Some(b) => {
                    buf.copy_from_slice(b);
                    Ok(())
                }
                None => Err(Error::io(
                    format!("the parity journal of device {p}"),
                    std::io::Error::other(format!("block at {at} read out of order in replay")),
                )),
            }
        };
        for ((role, row), entry) in &log {
            let acc = rows.entry(*row).or_insert_with(|| vec![0u8; block]);
            match (entry.original, entry.latest) {
                (Some(o), Some(l)) => {
                    read_block(o, &mut a)?;
                    read_block(l, &mut b)?;
                    self.counters.devices[p].read(IoClass::Journal, 2 * block);
                    // In a dirty stripe, parity is brought to what the data
                    // unit holds on its device, which after a power cut may
                    // be d(0), d(r) or torn between them (the in-place write
                    // was not yet durable); d(r) stands for a unit out of
                    // service. Folding d(r) over a lost in-place write would
                    // leave the row inconsistent and a missing unit decoding
                    // wrong. (In a clean stripe the device holds d(r), or
                    // rot that parity must not learn.)
                    if let Some(on_disk) = on_disk.get(&(*role, *row)) {
                        b.copy_from_slice(on_disk);
                    }
                    let delta: Vec<u8> = a.iter().zip(&b).map(|(x, y)| x ^ y).collect();
                    for s in scratch.iter_mut() {
                        s.fill(0);
                    }
                    let mut refs: Vec<&mut [u8]> =
                        scratch.iter_mut().map(|v| v.as_mut_slice()).collect();
                    self.codec.update(*role as usize, &delta, &mut refs);
                    for (x, y) in acc.iter_mut().zip(&scratch[j]) {
                        *x ^= y;
                    }
                }
                (None, None) => {
                    for &d in &entry.deltas {
                        read_block(d, &mut a)?;
                        self.counters.devices[p].read(IoClass::Journal, block);
                        for (x, y) in acc.iter_mut().zip(&a) {
                            *x ^= y;
                        }
                    }
                }
                // d(r) without d(0): a power cut tore the log of a write
                // never flushed (a flushed write's d(0) was synced with or
                // before it). That write is lost (its block reads old, as
                // an unflushed write may) and parity keeps d(0) for it;
                // the stripe's other records are folded as ever. Dropping
                // every record of the stripe instead lost flushed writes
                // of its other blocks when a unit was missing (the
                // power-loss double-fault test, parix seed 77002100).
                _ => {
                    bump(&self.counters.array.torn_journal_records);
                    self.warn(format!(
                        "parity journal of device {p}: stripe {stripe} role {role} block {row} \
                         has d(r) without d(0) (a write a power cut tore before it was flushed): \
                         left out"
                    ));
                }
            }
        }
        drop(held);
        let mut folded = std::collections::BTreeMap::new();
        for (row, delta) in rows {
            let stored = if dirty {
                self.read_parity_block_raw(stripe, j, row as u64)
            } else {
                self.read_parity_block(stripe, j, row as u64)
            };
            match stored {
                StoredParity::Intact(mut parity) => {
                    for (x, y) in parity.iter_mut().zip(&delta) {
                        *x ^= y;
                    }
                    folded.insert(row, parity);
                }
                // Encoded from the data, which already holds every logged
                // value: folding the deltas in again would be wrong.
                StoredParity::Recomputed(parity) => {
                    folded.insert(row, parity);
                }
                // Left bad: its checksum fails, so readers decode without it
                // and repair it from the rest of the row.
                StoredParity::Unavailable => {}
            }
        }
        Ok(Some((folded, records)))
    }

    /// The blocks of `stripe`'s data units that device `p`'s journal holds
    /// d(0) and d(r) for (the rows in `only`, where given), as their
    /// devices hold them now, keyed by (role, row); a unit out of service
    /// or unreadable is left out (its d(r) stands for it).
    #[allow(clippy::type_complexity)]
    fn logged_blocks_on_disk(
        &self,
        stripe: u64,
        p: usize,
        only: Option<&BTreeSet<u32>>,
    ) -> std::collections::HashMap<(u16, u32), Vec<u8>> {
        let g = self.geo;
        let mut out = std::collections::HashMap::new();
        if !self.holds(p, stripe) {
            // Nothing is folded into it (`fold_parity`): nothing to read.
            return out;
        }
        let Some(log) = self.stores[p].journal_stripe_log(stripe) else {
            return out;
        };
        for ((role, row), entry) in &log {
            if entry.original.is_none() || entry.latest.is_none() {
                continue;
            }
            if only.is_some_and(|only| !only.contains(row)) {
                continue;
            }
            let place = g.place(stripe, *role as usize);
            if !self.holds(place.device, stripe) {
                continue;
            }
            let mut block = vec![0u8; g.block() as usize];
            if self.dev_read(
                place.device,
                IoClass::Data,
                &mut block,
                g.device_offset(place.row, *row as u64),
            ) {
                out.insert((*role, *row), block);
            }
        }
        out
    }

    /// A replay while a data unit of the stripe is out of service. Writing
    /// the folded parity in place and then logging the invalidation is not
    /// idempotent: a power cut between the two would fold the same records
    /// again at the next open, and the missing unit, which lives only in
    /// parity, would decode wrong. So the folded parity is computed first,
    /// the missing data units' values are decoded from it and logged in the
    /// degraded-write log (synced), and only then is parity written: a cut
    /// at any point leaves the log to say what the missing units hold.
    ///
    /// In a dirty stripe the fold cannot be trusted for a missing unit that
    /// the journals log by value (parix): a replay before the stop may have
    /// written its folded parity and lost its invalidation to the cut, and
    /// folding the same records again cancels them out of that parity (GF
    /// addition is XOR), so the unit decoded to its d(0). There the unit's
    /// latest d(r) is its value (its write was acknowledged, or in flight
    /// at the stop), and the row's parity is recomputed from the data (see
    /// `missing_values_logged`).
    fn replay_degraded(&self, stripe: u64, missing: &[usize], dirty: bool) -> Result<()> {
        let g = self.geo;
        let block = g.block() as usize;
        // Rows with a record appended after the last flush (format 2: past
        // its journal's synced length), read before the fold ends them.
        let unsynced: BTreeSet<u32> = match dirty {
            true => self
                .parity_devices(stripe)
                .into_iter()
                .flat_map(|(_, p)| self.stores[p].journal_unsynced_rows(stripe))
                .collect(),
            false => BTreeSet::new(),
        };
        let lost_in_service = self.any_in_service_at_stop(stripe, missing);
        let mut folds: Vec<FoldedParity> = Vec::new();
        let mut rows = std::collections::BTreeSet::new();
        for (j, p) in self.parity_devices(stripe) {
            if let Some((folded, records)) = self.fold_parity_or_fail(stripe, j, p, dirty, None)? {
                rows.extend(folded.keys().copied());
                folds.push((j, p, folded, records));
            }
        }
        // Before any fold writes parity with fresh entries: the rows a
        // write in flight at the stop may have torn (a member changed
        // since the last flush; `rows_torn_unlogged`), which the resync
        // could no longer see once the folded parity matches its entry;
        // and the rows whose parity changed since then under the records
        // folded into it, which it may hold already
        // (`rows_parity_changed_under_records`, seed 52865). Only at the
        // open's resync: while serving, the missing members' entries are
        // resident and every decode is checked against them.
        let at_open = !self.serving.load(std::sync::atomic::Ordering::SeqCst);
        // `raw`: the stripe's units as read then, the parity before the
        // fold (for `unfolded_confirms`, below).
        let (torn_before, refolded, raw) = match dirty && at_open {
            true => {
                let units = self.read_stripe_raw(stripe);
                let folded_rows: Vec<(usize, Vec<u32>)> = folds
                    .iter()
                    .map(|(j, _, f, _)| (*j, f.keys().copied().collect()))
                    .collect();
                (
                    self.rows_torn_unlogged(stripe, &units),
                    self.rows_parity_changed_under_records(stripe, &units, &folded_rows),
                    units,
                )
            }
            false => (Vec::new(), Vec::new(), Vec::new()),
        };
        // Where a refolded row's records share one known base in each
        // journal whose parity changed (`row_base`, journal version 4),
        // the parity block as read says whether it holds them: it is the
        // base (a fold lacking: folded now) or the base with them folded
        // in (a fold that landed, its marks never appended or lost: taken
        // as read). Each such parity is then known, not a guess, and a row
        // whose every changed parity is told is no longer refolded (a
        // takeover that stopped a fold between its parity writes and its
        // marks left rows the spare could not tell: the cluster
        // simulator's seeds 1493177, 1502585, 1518837, 1526137, 1540481,
        // each a record of the unit lost). A parity a cut tore is the
        // base with them folded into some of its sectors
        // (`parity_told_by_base`); one changed otherwise (a whole-stripe
        // write whose mark a cut lost) is none of these, and the row
        // stays refolded.
        let mut refolded = refolded;
        for (row, refolded_row) in refolded.iter_mut().enumerate() {
            if *refolded_row && self.told_by_bases(stripe, row as u32, &raw, &mut folds) {
                *refolded_row = false;
                bump(&self.counters.array.degraded_replay_rows_told_by_base);
            }
        }
        let logged_values = match dirty {
            true => self.missing_values_logged(stripe, missing),
            false => Default::default(),
        };
        // Every journal folded is on a chunk whose server never restarted
        // since the last writer's open: none lost a mark to a cut.
        let marks_whole = folds.iter().all(|(_, p, _, _)| self.never_restarted[*p]);
        // The degraded-write log's values of the missing units, where a
        // parity journal gave none: a degraded write (or an earlier
        // degraded replay) logged each one, synced, before it wrote any
        // member, so it is the unit's content since (its old or its new
        // one where that write was in flight), which the resync after this
        // replay takes too. Decoded instead, from parity that a cut left
        // without that write, it came out as the unit's content before
        // it, logged again over the right value (the cluster simulator's
        // seed 845757 on e4481c9: a flushed block read as zeroes).
        let mut degraded_values: std::collections::BTreeMap<(u16, u32), Vec<u8>> =
            Default::default();
        if let Some(log) = &self.degraded_log {
            for &role in missing {
                for &row in &rows {
                    if logged_values.contains_key(&(role as u16, row)) {
                        continue;
                    }
                    if let Ok(Some(v)) = log.value(stripe, role, u64::from(row)) {
                        degraded_values.insert((role as u16, row), v);
                    }
                }
            }
        }
        // Rows whose parity is recomputed from the data and the logged
        // values of their missing units, instead of folded.
        let mut recomputed: std::collections::BTreeMap<u32, Vec<Vec<u8>>> = Default::default();
        let mut logged_rows = Vec::with_capacity(rows.len());
        let mut unknown_rows = 0u64;
        // Unknown rows whose fold took a record not flushed: their present
        // parity is marked unreadable once written (below), with the
        // members as read and folded.
        let mut unknowable: Vec<(u64, Vec<Vec<u8>>, Vec<bool>)> = Vec::new();
        for &row in &rows {
            let row = row as u64;
            let mut shards: Vec<Vec<u8>> = vec![vec![0u8; block]; g.width()];
            let mut present = vec![false; g.width()];
            for role in 0..g.k() {
                if missing.contains(&role) {
                    continue;
                }
                // As on the device, unverified: in a dirty region (a resync
                // after a cut) the checksum entries may predate the content.
                let place = g.place(stripe, role);
                if self.dev_read(
                    place.device,
                    IoClass::Data,
                    &mut shards[role],
                    g.device_offset(place.row, row),
                ) {
                    present[role] = true;
                }
            }
            let value_of = |role: usize| {
                let key = (role as u16, row as u32);
                logged_values
                    .get(&key)
                    .or_else(|| degraded_values.get(&key))
            };
            let values: Option<Vec<&Vec<u8>>> =
                missing.iter().map(|&role| value_of(role)).collect();
            let others_read = (0..g.k()).all(|role| missing.contains(&role) || present[role]);
            if let (Some(values), true) = (values, others_read) {
                for (&role, value) in missing.iter().zip(values) {
                    shards[role].copy_from_slice(value);
                }
                shards.truncate(g.k());
                let data: Vec<&[u8]> = shards.iter().map(|v| v.as_slice()).collect();
                recomputed.insert(row as u32, self.encode_data(&data));
                logged_rows.push((row, shards));
                continue;
            }
            for j in 0..g.m() {
                let folded = folds
                    .iter()
                    .find(|(fj, _, _, _)| *fj == j)
                    .and_then(|(_, _, f, _)| f.get(&(row as u32)));
                if let Some(parity) = folded {
                    shards[g.k() + j].copy_from_slice(parity);
                    present[g.k() + j] = true;
                } else if self.holds(g.place(stripe, g.k() + j).device, stripe) {
                    // Dirty: as on the device (its entry may predate it),
                    // and checked below with the rest of the row.
                    let stored = if dirty {
                        self.read_parity_block_raw(stripe, j, row)
                    } else {
                        self.read_parity_block(stripe, j, row)
                    };
                    if let StoredParity::Intact(parity) | StoredParity::Recomputed(parity) = stored
                    {
                        shards[g.k() + j] = parity;
                        present[g.k() + j] = true;
                    }
                }
            }
            // Some missing units' values known, not all (in the
            // degraded-write log, or a parix journal's latest d(r)): with
            // them more than k members may be known, and a decode of the
            // others is taken where they are one codeword (a spare
            // vouches), as the resync takes it. Never a decode that leaves
            // a logged value out (seed 845757, above): where none is
            // vouched, the row's members disagree with the log, and it is
            // left unknown, its present parity marked (its missing blocks
            // read as I/O errors until rewritten). A d(r) taken here as a
            // member, not only where every missing unit has one: a fold
            // while serving with that unit out, one parity's write lost to
            // a cut, and a second data member lost at the open left
            // exactly k members and nothing to vouch for them, and the row
            // was poisoned though the records' bases told both parities
            // (the cluster simulator's seed 1241874, parix; unit test
            // `a_fold_that_landed_on_one_parity_is_not_folded_again_when_a_second_member_is_lost`,
            // its cases with the record of role 3).
            if missing.iter().any(|&role| value_of(role).is_some()) {
                let mut known = known_members(&shards, &present);
                for &role in missing {
                    if let Some(value) = value_of(role) {
                        known[role] = Some(value.clone());
                    }
                }
                // In a row whose parity changed since the last flush under
                // records folded into it again (`refolded`), a spare's word
                // is no proof: a record folded twice moves every parity by
                // the same update, the members stay one codeword, and a
                // missing unit decodes as neither its old nor its new bytes
                // (seed 377381's class). There the decode of a unit the log
                // does not hold is taken only where its known entry
                // confirms it; an entry unknown leaves the row unknown. (The
                // cluster simulator's seed 63148, with the failure path's
                // journals synced after every member, logged such a decode
                // here and read it back as bytes no write put there.)
                let refolded_row = refolded.get(row as usize).copied().unwrap_or(false);
                let confirmed = |whole: &[Vec<u8>]| {
                    !(dirty && refolded_row)
                        || missing
                            .iter()
                            .filter(|&&role| value_of(role).is_none())
                            .all(|&role| {
                                self.entry_confirms(stripe, role, row, &whole[role]) == Some(true)
                            })
                };
                match self.decode_vouched_by_spare(&known) {
                    Some(mut whole) if confirmed(&whole) => {
                        whole.truncate(g.k());
                        logged_rows.push((row, whole));
                    }
                    _ => match (dirty && refolded_row)
                        .then(|| self.decode_folded_or_not(stripe, row, &known, &raw, &folds))
                        .flatten()
                    {
                        Some(data) => {
                            let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
                            recomputed.insert(row as u32, self.encode_data(&refs));
                            bump(&self.counters.array.degraded_replay_vouched_rows);
                            logged_rows.push((row, data));
                        }
                        None => {
                            unknown_rows += 1;
                            unknowable.push((row, shards, present));
                        }
                    },
                }
                continue;
            }
            // The missing units' values are checked before they are logged:
            // after a cut the members may disagree (the write hole), and a
            // value decoded from members that disagree, logged, would
            // become the parity's truth (seed 1921 of the cluster
            // simulator read a block back as neither its old nor its new
            // content). Checked against every spare member and the missing
            // units' entries where known, except in a dirty stripe with a
            // spare member: there the entries may predate writes in flight
            // at the stop (table pages are written at flushes), and the
            // spares alone vouch. Unvouched, a row is left unlogged: it
            // decodes as it can at a read, checked there, an I/O error
            // rather than a guess.
            let spare = present.iter().filter(|p| **p).count() > g.k();
            let expected: Vec<Option<u32>> = (0..g.width())
                .map(|role| {
                    let place = g.place(stripe, role);
                    (role < g.k() && missing.contains(&role) && !(dirty && spare))
                        .then(|| {
                            self.expected_crc(
                                place.device,
                                stripe,
                                g.checksum_index(place.row, row),
                            )
                        })
                        .flatten()
                })
                .collect();
            // A parity that changed since the last flush under records
            // flushed before it, with the missing data member in service at
            // the stop (so none of its writes was a degraded write), was
            // changed by what superseded them (a fold, a resync, a
            // whole-stripe write), whose mark the cut lost: folding them
            // again is wrong. A spare member cannot tell: a record of a
            // missing unit, folded twice, moves every parity by the same
            // update, so the members left stay one codeword and decode the
            // missing unit as neither its old nor its new bytes (the
            // cluster simulator's seed 377381, plog: a whole-stripe write's
            // parity landed, its mark did not, and the flushed delta of the
            // unit's earlier write was folded over it). Such a row is not
            // logged where a missing unit's known entry contradicts the
            // decode; it is left unknown (an I/O error, not a guess). An
            // entry unknown (the member's table lost with it) vetoes
            // nothing: asking for a confirming entry there turned the
            // simulator's seed 475621 (a block never written, decoded as
            // zeroes) into an I/O error. Not where the member was out
            // before (degraded writes change parity in place under records:
            // seed 1525).
            //
            // With a record appended after the last flush the entry's word
            // is not enough either way: the change may have preceded the
            // record (the fold is right, and the unit's new bytes contradict
            // its entry: seed 351546) or followed it with its mark lost (the
            // fold is wrong: seed 1323488, a whole-stripe write's parity and
            // data landed, its marks did not, and the unit's earlier delta
            // folded over them decoded as neither write). Where the server
            // of every journal folded never restarted since the last
            // writer's open (`never_restarted`), no cut dropped a mark, and
            // the records are live: the fold is right, where the choice
            // below is unambiguous (a fold whose marks were never appended
            // leaves live records too). Elsewhere it is taken
            // only on a missing unit's entry confirming a decode: the folded
            // one (the unit as flushed), or the one from the parity as it
            // was before the fold (`unfolded_confirms`: the parity then
            // described the unit as flushed, so it predates the records, and
            // they fold onto it). Otherwise, an entry unknown included (lost
            // with its member), the row is left unknown.
            let refolded_row = refolded.get(row as usize).copied().unwrap_or(false);
            let entries_confirm = |shards: &[Vec<u8>]| {
                missing.iter().all(|&role| {
                    self.entry_confirms(stripe, role, row, &shards[role]) == Some(true)
                })
            };
            let unfolded_confirms = || {
                let mut before = shards.clone();
                let mut use_ = present.clone();
                for j in 0..g.m() {
                    let at = row as usize * block;
                    match raw.get(g.k() + j).and_then(|u| u.as_ref()) {
                        Some(unit) => before[g.k() + j].copy_from_slice(&unit[at..at + block]),
                        None => use_[g.k() + j] = false,
                    }
                }
                let none = vec![None; g.width()];
                self.decode_checked(&before, &use_, &none)
                    .is_some_and(|c| entries_confirm(&c.shards))
            };
            // A fold whose marks were never appended (its writer stopped
            // between its parity writes and its marks, no cut at all) also
            // leaves live records in parity that holds them: the spare's
            // word (or no restart) is taken only where choosing each
            // changed parity folded or as read gives one row
            // (`decode_folded_or_not`): a record of a missing unit folded
            // twice or not at all is two rows, and the row stays unknown.
            let unambiguous = |decoded: &[Vec<u8>]| {
                let known = known_members(&shards, &present);
                self.decode_folded_or_not(stripe, row, &known, &raw, &folds)
                    .is_some_and(|data| data[..] == decoded[..g.k()])
            };
            let confirmed = |shards: &[Vec<u8>]| {
                !refolded_row
                    || !lost_in_service
                    || match unsynced.contains(&(row as u32)) {
                        true => {
                            (marks_whole && unambiguous(shards))
                                || entries_confirm(shards)
                                || unfolded_confirms()
                        }
                        false => {
                            let entries: Vec<Option<bool>> = missing
                                .iter()
                                .map(|&role| self.entry_confirms(stripe, role, row, &shards[role]))
                                .collect();
                            !entries.contains(&Some(false))
                                && (entries.iter().all(|e| *e == Some(true)) || unambiguous(shards))
                        }
                    }
            };
            match self.decode_checked(&shards, &present, &expected) {
                // In a dirty stripe a decode from exactly k members that
                // nothing checked may be a mix of old and new: not logged.
                Some(checked) if (checked.vouched || !dirty) && confirmed(&checked.shards) => {
                    let mut shards = checked.shards;
                    shards.truncate(g.k());
                    logged_rows.push((row, shards));
                }
                // A record appended after the last flush may be one whose
                // in-place data write the cut dropped (plog's delta, or a
                // parity journal that kept a d(r) the other lost): folded
                // against data that never took it, the row's parity would
                // decode the missing units as neither their old nor their
                // new bytes, and nothing checks that decode (cluster
                // simulator, seed 73757). A row whose records were all
                // flushed folds right (their data writes were durable
                // first) and is left to decode, unless a member changed
                // since the last flush: a write in flight (torn), or a
                // parity that may hold the records already (refolded).
                _ if dirty
                    && (unsynced.contains(&(row as u32))
                        || torn_before.get(row as usize).copied().unwrap_or(false)
                        || refolded_row) =>
                {
                    // A second chance, with the missing units' entries
                    // where known: a decode that leaves out the fewest
                    // members (the one a write in flight changed, or a
                    // parity that folded what its data never took) and
                    // gives each missing unit the checksum its entry
                    // records. The entry is of the unit's last flushed
                    // value or of a write in flight since (table pages are
                    // written at flushes), so the value logged is its old
                    // or its new content; two such decodes that disagree
                    // are a guess, and the row stays unknown. Where the
                    // missing units' entries are unknown (their pages went
                    // with them), the present data member that changed
                    // since the last flush vouches instead: left out, it
                    // decodes back to its entry, so every other member is
                    // as the row was then (not in a refolded row, below).
                    // The resync that follows recomputes the row's parity
                    // from the value logged.
                    if spare {
                        let none = vec![None; g.width()];
                        if let Some(values) = self
                            .decode_missing_vouched(stripe, row, &shards, &present, &none)
                            .or_else(|| {
                                // Not where a parity may hold the records
                                // folded into it already: a record of a
                                // missing unit folded twice moves only
                                // that unit's decode, and the changed
                                // member would still vouch.
                                (!refolded_row)
                                    .then(|| {
                                        self.decode_missing_around_changed(
                                            stripe, row, &shards, &present,
                                        )
                                    })
                                    .flatten()
                            })
                        {
                            for (role, value) in values {
                                shards[role] = value;
                            }
                            shards.truncate(g.k());
                            bump(&self.counters.array.degraded_replay_vouched_rows);
                            logged_rows.push((row, shards));
                            continue;
                        }
                    }
                    unknown_rows += 1;
                    unknowable.push((row, shards, present));
                }
                _ => {
                    unknown_rows += 1;
                }
            }
        }
        if unknown_rows > 0 {
            bump(&self.counters.array.degraded_replay_unknown_rows);
            self.warn(format!(
                "stripe {stripe}: {unknown_rows} block rows of the missing units {missing:?} \
                 cannot be told after the stop: the members left disagree and nothing \
                 vouches for a decode (an unclean stop, then a device lost before resync: \
                 docs/write-hole.md); those marked below read as I/O errors until \
                 rewritten, the others are decoded at a read, checked where a spare \
                 member or a known entry can check them, unchecked where neither can \
                 (docs/write-hole.md, \"Rows a degraded replay cannot tell\")"
            ));
        }
        // One append for every row, held until the parity is written and
        // the records invalidated: a checkpoint (which syncs the journals
        // and then drops the log) waits for that.
        let _logged = self.log_missing_rows(stripe, &logged_rows)?;
        // A parity whose journal holds nothing for the stripe (its records
        // folded and invalidated before the stop, or lost to the cut) gets
        // the recomputed rows too.
        for (j, p) in self.parity_devices(stripe) {
            if folds.iter().any(|(fj, _, _, _)| *fj == j) || !self.holds(p, stripe) {
                continue;
            }
            for (row, parity) in &recomputed {
                self.write_unit_blocks(stripe, g.k() + j, *row as u64, &parity[j]);
            }
        }
        for (j, p, mut folded, records) in folds {
            for (row, parity) in &recomputed {
                folded.insert(*row, parity[j].clone());
            }
            self.write_folded_parity(stripe, j, p, &folded, records)?;
        }
        // After the parity writes, which set fresh entries.
        for (row, shards, present) in &unknowable {
            self.mark_present_parity_unreadable(stripe, *row, shards, present);
        }
        if !unknowable.is_empty() {
            bump(&self.counters.array.degraded_replay_unflushed_rows);
            self.warn(format!(
                "stripe {stripe}: {} of those block rows folded a parity journal record \
                 appended after the last flush, whose data write the stop may have dropped, \
                 or have a member changed since then (a write in flight, or a parity that \
                 may hold the folded records already): their parity is marked unreadable, \
                 and the missing blocks read as I/O errors until rewritten",
                unknowable.len()
            ));
        }
        Ok(())
    }

    /// Whether every parity of `folds` whose block of row `row` as read
    /// (`raw`) changed since the last flush and differs from its fold is
    /// told by its journal's base for the row (see `replay_degraded`):
    /// each one told is set, in `folds`, to the parity as read where that
    /// holds the records already. Those not told are left as folded.
    fn told_by_bases(
        &self,
        stripe: u64,
        row: u32,
        raw: &[Option<Vec<u8>>],
        folds: &mut [FoldedParity],
    ) -> bool {
        let mut told = true;
        for (j, p, folded, _) in folds.iter_mut() {
            let Some(parity) = folded.get_mut(&row) else {
                continue;
            };
            let at = u64::from(row);
            let Some(before) = self.parity_changed_under_fold(stripe, at, (*j, *p), raw, parity)
            else {
                continue;
            };
            let told_parity = self.stores[*p]
                .journal_row_base(stripe, row)
                .and_then(|base| parity_told_by_base(before, parity, base));
            match told_parity {
                Some(told) => parity.copy_from_slice(&told),
                None => told = false,
            }
        }
        told
    }

    /// Parity `j`'s block of row `row` (on device `p`) as read before the
    /// fold (`raw`, the stripe's units), where it no longer matches its
    /// checksum entry (it changed since the last flush) and differs from
    /// `folded`, its fold: a parity that may hold the records already.
    /// None where it was not read, did not change, or the fold moves
    /// nothing.
    fn parity_changed_under_fold<'r>(
        &self,
        stripe: u64,
        row: u64,
        (j, p): (usize, usize),
        raw: &'r [Option<Vec<u8>>],
        folded: &[u8],
    ) -> Option<&'r [u8]> {
        let g = &self.geo;
        let block = g.block() as usize;
        let at = row as usize * block;
        let before = &raw.get(g.k() + j)?.as_ref()?[at..at + block];
        let index = g.checksum_index(g.place(stripe, g.k() + j).row, row);
        let changed = !self.stores[p].block_matches(index, before);
        (changed && before != folded).then_some(before)
    }

    /// The data of block row `row` of a refolded row (a parity changed
    /// since the last flush under the records folded into it) with more
    /// than k members `known` (the parity as folded; the missing units'
    /// values the degraded-write log holds, if any): each folded parity
    /// whose block as read (`raw`, the stripe's units before the fold) no
    /// longer matches its checksum entry (it changed since the last flush)
    /// may hold the records already (a fold's parity write that a cut
    /// kept, its marks lost; or a fold whose marks were never appended) or
    /// not (changed otherwise), and every choice of the two per such
    /// parity is decoded. One that still matches its entry holds none
    /// folded since the last flush (a fold before it made its mark durable
    /// with it): its fold is taken (with no such parity, the row as
    /// folded is the one choice). Chosen sector by sector (512 bytes: a
    /// cut may tear the parity write), and taken only where, in every
    /// sector, the choices that a spare vouches for all give one row: a
    /// record of a missing unit folded twice, or not at all, moves every
    /// parity alike, and there two choices vouch for two rows (seed
    /// 377381's class), a guess: None. (The cluster simulator's seeds
    /// 845757, 868189, 1277558 and 1316745: a fold while serving, a data
    /// member out, wrote one parity and not the other, or tore it, before
    /// a cut that lost its marks; the next open lost a second data member
    /// and refolded both parities, and the row, not one codeword, was
    /// poisoned. 1333799, whose record is of the unit lost, stays so.)
    fn decode_folded_or_not(
        &self,
        stripe: u64,
        row: u64,
        known: &[Option<Vec<u8>>],
        raw: &[Option<Vec<u8>>],
        folds: &[FoldedParity],
    ) -> Option<Vec<Vec<u8>>> {
        let g = &self.geo;
        let block = g.block() as usize;
        let varying: Vec<(usize, Vec<u8>)> = folds
            .iter()
            .filter_map(|(j, p, _, _)| {
                let folded = known[g.k() + j].as_ref()?;
                let before = self.parity_changed_under_fold(stripe, row, (*j, *p), raw, folded)?;
                Some((*j, before.to_vec()))
            })
            .collect();
        // Sector by sector: a cut may tear a parity write (some sectors
        // new, the others old), and the code is bytewise, so each sector
        // is a codeword of its own.
        let mut data = vec![vec![0u8; block]; g.k()];
        for from in (0..block).step_by(SECTOR_BYTES) {
            let to = (from + SECTOR_BYTES).min(block);
            let sector: Vec<Option<Vec<u8>>> = known
                .iter()
                .map(|m| m.as_ref().map(|v| v[from..to].to_vec()))
                .collect();
            let mut answers: Vec<Vec<Vec<u8>>> = Vec::new();
            for choice in 0..1u32 << varying.len() {
                let mut members = sector.clone();
                for (i, (j, before)) in varying.iter().enumerate() {
                    if choice & (1 << i) != 0 {
                        members[g.k() + j] = Some(before[from..to].to_vec());
                    }
                }
                if let Some(mut whole) = self.decode_vouched_by_spare(&members) {
                    whole.truncate(g.k());
                    if !answers.contains(&whole) {
                        answers.push(whole);
                    }
                }
            }
            match (answers.pop(), answers.is_empty()) {
                (Some(whole), true) => {
                    for (unit, piece) in data.iter_mut().zip(whole) {
                        unit[from..to].copy_from_slice(&piece);
                    }
                }
                _ => return None,
            }
        }
        Some(data)
    }

    /// Per (role, row) of the missing data units `missing` of a dirty
    /// stripe, the latest d(r) a parity journal holds for it (parix; plog
    /// logs deltas, which say nothing of the value). That is the unit's
    /// value: its write was acknowledged, or in flight at the stop (it may
    /// read new), and a later write of the block that logged no d(r)
    /// invalidated the records first, synced with the write where it was
    /// flushed or FUA. Where two journals disagree (a cut kept a later
    /// append in one only) either is a write since the last flush; the
    /// first parity's is taken. A record without its d(0) (torn) is left
    /// out, as the fold leaves it out.
    fn missing_values_logged(
        &self,
        stripe: u64,
        missing: &[usize],
    ) -> std::collections::BTreeMap<(u16, u32), Vec<u8>> {
        let block = self.geo.block() as usize;
        let mut values = std::collections::BTreeMap::new();
        for (_, p) in self.parity_devices(stripe) {
            if !self.holds(p, stripe) {
                continue;
            }
            let held = self.stores[p].journal_held();
            let Some(log) = held.as_ref().and_then(|j| j.stripe_log(stripe)) else {
                continue;
            };
            let wanted: Vec<((u16, u32), u64)> = log
                .iter()
                .filter(|((role, _), _)| missing.contains(&(*role as usize)))
                .filter(|(key, _)| !values.contains_key(*key))
                .filter_map(|(key, e)| e.original.and(e.latest).map(|at| (*key, at)))
                .collect();
            if wanted.is_empty() {
                continue;
            }
            let mut bufs: Vec<Vec<u8>> = wanted.iter().map(|_| vec![0u8; block]).collect();
            let mut reads: Vec<(u64, &mut [u8])> = wanted
                .iter()
                .zip(bufs.iter_mut())
                .map(|((_, at), b)| (*at, b.as_mut_slice()))
                .collect();
            // Unreadable now (the fold above read it): left to the fold.
            if held
                .as_ref()
                .is_none_or(|j| j.read_blocks(&mut reads).is_err())
            {
                continue;
            }
            drop(held);
            self.counters.devices[p].read(IoClass::Journal, wanted.len() * block);
            values.extend(wanted.into_iter().map(|(key, _)| key).zip(bufs));
        }
        values
    }

    /// A parity block as it is on the device, unverified (in a dirty
    /// stripe, whose entries may predate it); unavailable when unreadable.
    fn read_parity_block_raw(&self, stripe: u64, j: usize, row: u64) -> StoredParity {
        let g = &self.geo;
        let place = g.place(stripe, g.k() + j);
        let mut buf = vec![0u8; g.block() as usize];
        if self.holds(place.device, stripe)
            && self.dev_read(
                place.device,
                IoClass::Parity,
                &mut buf,
                g.device_offset(place.row, row),
            )
        {
            StoredParity::Intact(buf)
        } else {
            StoredParity::Unavailable
        }
    }

    /// A parity block as it is on the device, verified; a bad one is
    /// recomputed from the data (current while the stripe's data units are
    /// readable), or reported unavailable when the data cannot be read.
    fn read_parity_block(&self, stripe: u64, j: usize, row: u64) -> StoredParity {
        let g = &self.geo;
        let place = g.place(stripe, g.k() + j);
        let mut buf = vec![0u8; g.block() as usize];
        if self.dev_read(
            place.device,
            IoClass::Parity,
            &mut buf,
            g.device_offset(place.row, row),
        ) && self.stores[place.device].block_matches(g.checksum_index(place.row, row), &buf)
        {
            return StoredParity::Intact(buf);
        }
        bump(&self.counters.array.checksum_mismatches);
        let mut data = Vec::with_capacity(g.k());
        for role in 0..g.k() {
            match self.read_unit_blocks(stripe, role, row..row + 1) {
                Ok(d) => data.push(d),
                Err(_) => return StoredParity::Unavailable,
            }
        }
        let d: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
        StoredParity::Recomputed(self.encode_data(&d).swap_remove(j))
    }

    /// Replays every journal (at open, when idle, when a journal passes half
    /// its bound, before a device is rebuilt), then empties or compacts the
    /// journals. A stripe whose replay fails is resynchronised from its data
    /// when it is healthy; otherwise it stays pending and the first such
    /// error is returned after the other stripes are done. Returns stripes
    /// replayed.
    pub fn replay_all(&self, progress: Option<&super::ProgressFn>) -> Result<u64> {
        if !self.write_policy.journals() {
            return Ok(0);
        }
        within(Scope::Replay, || self.replay_every_stripe(progress))
    }

    fn replay_every_stripe(&self, progress: Option<&super::ProgressFn>) -> Result<u64> {
        self.replay_wanted.store(false, Relaxed);
        let mut stripes: Vec<u64> = Vec::new();
        for store in &self.stores {
            stripes.extend(store.journal_stripes());
        }
        stripes.sort_unstable();
        stripes.dedup();
        let total = stripes.len() as u64;
        let mut first_error = None;
        for (i, &s) in stripes.iter().enumerate() {
            if self.stopping.load(SeqCst) {
                // Closing: what is left stays logged, replayed at the next
                // open (the background replay's case: the close waits).
                break;
            }
            let _g = self.locks[Self::lock_index(s)].write().unwrap();
            if let Err(e) = self.replay_stripe(s) {
                bump(&self.counters.array.journal_errors);
                let g = &self.geo;
                let healthy = (0..g.width()).all(|r| self.holds(g.place(s, r).device, s));
                if healthy {
                    self.warn(format!(
                        "replaying stripe {s}: {e}; its parity is recomputed from its data instead"
                    ));
                    self.resync_stripe(s, false);
                } else {
                    self.warn(format!("replaying stripe {s}: {e}; it stays pending"));
                    first_error.get_or_insert(e);
                }
            }
            if let Some(p) = progress {
                if i % 64 == 0 || i as u64 + 1 == total {
                    p("replay", i as u64 + 1, total);
                }
            }
        }
        self.flush()?;
        // Each journal's reclaim (a truncation and a new reservation: a
        // discard and directory commits, a write and a sync each, several
        // round trips to a remote chunk) holds that journal's lock, so
        // partial writes to its stripes wait: side by side on chunks
        // across the network (format 1's files of the folder, local, in
        // turn).
        let journals: Vec<usize> = (0..self.stores.len())
            .filter(|&d| self.stores[d].has_journal())
            .collect();
        let parallel = self.on_chunks_side_by_side(&journals);
        super::meta::side_by_side(&journals, parallel, |&d| self.reclaim_journal(d));
        match first_error {
            None => Ok(total),
            Some(e) => Err(e),
        }
    }

    /// Gives back the space of what replay made dead: an empty journal is
    /// truncated; one still holding entries (written while the replay ran)
    /// is compacted when it has passed a quarter of its bound and more than
    /// half of it is dead. Then space up to the bound is reserved again.
    /// Failures are warnings: the journal stays unreserved, so writes fall
    /// back to read-modify-write until a later replay manages it.
    pub(super) fn reclaim_journal(&self, d: usize) {
        // A failed member's journal waits for its re-add (which restarts
        // it): trying it at each replay pass only repeated the device's
        // error (1,262 times in one degraded run's log).
        if self.stores[d].is_failed() {
            return;
        }
        let compact_above = self.journal_bytes_max / COMPACT_AT_FRACTION_OF_BOUND;
        let reclaimed = self.stores[d].journal_reclaim(compact_above, self.journal_bytes_max);
        let Some((compacted, result)) = reclaimed else {
            return;
        };
        if compacted {
            bump(&self.counters.array.journal_compactions);
        }
        if let Err(e) = result {
            bump(&self.counters.array.journal_errors);
            self.warn(format!(
                "reclaiming or reserving space for the parity journal of device {d}: {e}; \
                 writes to its stripes go in place (read-modify-write) meanwhile"
            ));
        }
    }

    /// Replays in the background: when a journal passes half its bound, a
    /// write fell back, a device failed, or the volume has been idle for
    /// `IDLE_REPLAY_AFTER` with something logged or journal space not yet
    /// given back. Stops when the array closes.
    pub fn start_background_replay(self: &std::sync::Arc<Self>) {
        if !self.write_policy.journals() {
            return;
        }
        let array = std::sync::Arc::clone(self);
        let mut slot = self.background_replay.lock().unwrap();
        if slot.is_some() || self.stopping.load(SeqCst) {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("ecdedup-replay".into())
            .spawn(move || {
                while !array.stopping.load(Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    let idle = array.idle_ms() >= IDLE_REPLAY_AFTER.as_millis() as u64;
                    // A failed member's journal waits for its re-add: its
                    // bytes would start a pass every 200 ms for nothing.
                    let (bytes, logged) = array.journal_usage_in_service();
                    // Space left behind by replays that ran elsewhere (a
                    // rebuild, degraded reads) is given back when idle too.
                    if (logged > 0 && (idle || array.replay_wanted())) || (bytes > 0 && idle) {
                        if let Err(e) = array.replay_all(None) {
                            array.warn(format!("background replay: {e}"));
                        }
                    }
                }
            });
        match spawned {
            Ok(thread) => *slot = Some(thread),
            Err(e) => self.warn(format!("cannot start the background replay: {e}")),
        }
    }

    /// (bytes, logged blocks) of the journals of members not failed: what
    /// the background replay has to give back.
    fn journal_usage_in_service(&self) -> (u64, u64) {
        self.stores
            .iter()
            .filter(|s| !s.is_failed())
            .map(|s| s.journal_usage())
            .fold((0, 0), |(b, l), (bytes, logged, _)| (b + bytes, l + logged))
    }

    /// Journal state for stats: (bytes, logged blocks, index RAM bytes).
    pub fn journal_usage(&self) -> (u64, u64, u64) {
        let mut out = (0, 0, 0);
        for store in &self.stores {
            let (bytes, logged, index) = store.journal_usage();
            out.0 += bytes;
            out.1 += logged;
            out.2 += index;
        }
        out
    }

    pub fn write_policy(&self) -> WritePolicy {
        self.write_policy
    }

    /// Whether a replay is due (a journal passed half its bound, or a write fell back).
    pub fn replay_wanted(&self) -> bool {
        self.replay_wanted.load(Relaxed)
    }
}

/// Invalidation marks appended before the writes they stand for, held out
/// of every journal sync until dropped ([`Array::journal_invalidate_before`]).
pub(super) struct MarksHeld<'a> {
    array: &'a Array,
    holds: Vec<(usize, journal::MarkHold)>,
}

impl<'a> MarksHeld<'a> {
    fn none(array: &'a Array) -> Self {
        MarksHeld {
            array,
            holds: Vec::new(),
        }
    }

    /// Takes over the holds of `other`.
    fn take(&mut self, mut other: MarksHeld<'_>) {
        self.holds.append(&mut other.holds);
    }
}

impl Drop for MarksHeld<'_> {
    fn drop(&mut self) {
        for (p, hold) in self.holds.drain(..) {
            self.array.stores[p].journal_release_mark(hold);
        }
    }
}

/// What a journal mark says its parity rows hold after the write it goes
/// with ([`Array::invalidate_in`]; docs/format.md, "Parity journals").
#[derive(Clone, Copy)]
pub(super) enum MarkParity<'a> {
    /// Not known: the mark carries no checksums.
    Unknown,
    /// The parity's checksum entries (a fold's, once its writes were
    /// answered).
    Entries,
    /// One parity unit per parity role, encoded before the mark (a
    /// whole-stripe write's).
    Units(&'a [Vec<u8>]),
    /// This device's parity unit (one of [`MarkParity::Units`]).
    Unit(&'a [u8]),
    /// Zeroes (a discarded stripe's).
    Zeroes,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A parity block as read is told against its records' base: lacking
    /// them, holding them, holding them in some sectors only (a torn
    /// fold); changed otherwise, it is not told.
    #[test]
    fn a_parity_is_told_by_its_records_base_sector_by_sector() {
        let base: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        // The records' contribution moves sectors 1, 2, 5 and 7 only.
        let mut contrib = vec![0u8; 4096];
        for s in [1usize, 2, 5, 7] {
            contrib[s * 512..(s + 1) * 512].fill(0x5a ^ s as u8);
        }
        let xor = |a: &[u8], b: &[u8]| -> Vec<u8> { a.iter().zip(b).map(|(x, y)| x ^ y).collect() };
        let right = xor(&base, &contrib);
        let crc = crate::codec::crc32c(&base);
        // As read, and folded (the records folded into it once more).
        let tell = |before: &[u8]| parity_told_by_base(before, &xor(before, &contrib), crc);
        assert_eq!(tell(&base), Some(right.clone()), "lacks them: folded");
        assert_eq!(tell(&right), Some(right.clone()), "holds them: as read");
        for held in [vec![1usize], vec![2, 7], vec![1, 2, 5]] {
            let mut torn = base.clone();
            for s in &held {
                torn[s * 512..(s + 1) * 512].copy_from_slice(&right[s * 512..(s + 1) * 512]);
            }
            assert_eq!(tell(&torn), Some(right.clone()), "held in sectors {held:?}");
        }
        let mut other = right.clone();
        other[100] ^= 1;
        assert_eq!(tell(&other), None, "changed otherwise");
    }
}
