//! The dedup/remap layer: one per device, between the array and the media.
//!
//! A [`DedupDevice`] is itself a [`Device`]. Below `data_offset` (the
//! array's superblocks and checksum table) it passes I/O through. The data
//! area is cut into dedup blocks of `block_bytes`; each maps to a physical
//! *slot* of the same size in the backing device's data area, or to nothing
//! (reads as zeroes). Identical content shares one slot, with a reference
//! count. Which writes are fingerprinted is the [`Policy`]: `all` (every
//! block), `parity` (only parity units, hashed in sub-chunks of
//! `block_bytes`: paper 000's method). A write whose fingerprint is in the
//! index becomes a *reference*: a 28-byte log record instead of a data write.
//!
//! Invariants:
//! - a slot holding a fingerprinted block is never overwritten while
//!   another block refers to it or while the index offers it: new content
//!   goes to a fresh slot (copy on write), so an index entry always
//!   describes its slot's bytes. With `verify` on, a block's own slot that
//!   no other block shares is rewritten in place, its entry withdrawn
//!   first under the lock; a record a crash leaves vouching for the old
//!   bytes is then harmless, since every hit is byte-compared;
//! - an unfingerprinted slot with one reference is overwritten in place (no
//!   map change, no record), but not while the record that took its count
//!   down to one may still be lost (a power loss keeps slot bytes and cuts
//!   the log back to its last sync): such slots are marked until the next
//!   sync; a slot shared by several blocks reopens marked fingerprinted
//!   even if the snapshot dropped its (evicted) fingerprint;
//! - reference counts are derived from the map on load, never stored, so no
//!   crash can leak a slot or leave a count that disagrees with the map;
//! - a slot freed by an overwrite or unmap is reused only after the log
//!   record that freed it is durable (`sync`), so a crash never leaves a
//!   block pointing at a slot that has since been given other content;
//! - a sync writes the slots first, then a sync record, then syncs the log;
//!   every record carries the CRC32C of the content it maps, and a record
//!   after the last sync record is believed at open only when its slot
//!   holds that content (`replay.rs`), so a power loss that keeps a record
//!   and loses its slot write leaves the block on its older content, never
//!   on another block's or stale bytes;
//! - every file the layer keeps (map log, snapshot) goes through the
//!   array's [`Storage`];
//! - the index is bounded; eviction loses dedup opportunities, nothing else.
//!
//! The array's stripe locks guarantee that no two requests touch the same
//! dedup block at once; the layer's own mutex protects its tables.

pub mod index;
pub mod log;
mod replay;

use crate::counters::IoClass;
use crate::error::{Error, Result};
use crate::fingerprint::{Algorithm, Fingerprint, FingerprintBackend};
use crate::media::storage::{Storage, StorageFile};
use crate::media::{Device, WriteHint};
use index::FingerprintIndex;
use log::{Record, Snapshot, UNMAPPED};
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// Log bytes after which a sync writes a snapshot and starts a new log.
pub const LOG_COMPACT_BYTES: u64 = 64 << 20;

/// Log bytes past which a write first syncs the map (and so compacts it),
/// as a flush would: however long a writer goes without flushing, the log
/// stays within its room in a metadata area (the compaction bound + 16
/// MiB), since past it a request appends only its own records (tens of
/// bytes per block). An eighth above the compaction bound.
fn log_sync_bytes(compact_bytes: u64) -> u64 {
    compact_bytes + compact_bytes / 8
}
/// Longest a write waits for a slot held by writes in flight (`place`).
const SLOT_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(60);
/// Default bound of the fingerprint index, in entries per device.
pub const INDEX_ENTRIES_DEFAULT: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    None,
    All,
    Parity,
}

impl std::str::FromStr for Policy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Policy> {
        match s {
            "none" => Ok(Policy::None),
            "all" => Ok(Policy::All),
            "parity" => Ok(Policy::Parity),
            _ => Err(Error::Config(format!(
                "dedup policy {s:?} is not one of none, all, parity"
            ))),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(match self {
            Policy::None => "none",
            Policy::All => "all",
            Policy::Parity => "parity",
        })
    }
}

/// Dedup settings of an array, chosen at create time (in `array.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupConfig {
    pub policy: Policy,
    /// Dedup block (the sub-chunk c of paper 000): a multiple of 4 KiB that
    /// divides the stripe unit.
    pub block_bytes: u32,
    pub algorithm: Algorithm,
    /// Bound of the fingerprint index, entries per device.
    pub index_entries_max: u64,
    /// Byte-compare a block with the slot it would reference.
    pub verify: bool,
}

impl Default for DedupConfig {
    fn default() -> Self {
        DedupConfig {
            policy: Policy::None,
            block_bytes: 4096,
            algorithm: Algorithm::Sha256,
            index_entries_max: INDEX_ENTRIES_DEFAULT,
            verify: false,
        }
    }
}

impl DedupConfig {
    pub fn validate(&self, stripe_unit_bytes: u32) -> Result<()> {
        let b = self.block_bytes;
        if b < 4096
            || !b.is_multiple_of(4096)
            || !stripe_unit_bytes.is_multiple_of(b)
            || b > 1 << 20
        {
            return Err(Error::Config(format!(
                "dedup block {b} must be a multiple of 4 KiB, at most 1 MiB, that divides the stripe unit ({stripe_unit_bytes})"
            )));
        }
        if self.index_entries_max == 0 || self.index_entries_max > index::MAX_ENTRIES as u64 {
            return Err(Error::Config(format!(
                "index bound must be between 1 and {} entries",
                index::MAX_ENTRIES
            )));
        }
        if self.policy != Policy::None && !self.algorithm.cryptographic() && !self.verify {
            return Err(Error::Config(format!(
                "{} fingerprints match by chance: they need the byte compare (--verify on or auto)",
                self.algorithm
            )));
        }
        Ok(())
    }

    /// Whether a write of this class is fingerprinted.
    pub fn hashes(&self, class: IoClass) -> bool {
        match self.policy {
            Policy::None => false,
            Policy::All => class != IoClass::Metadata,
            Policy::Parity => class == IoClass::Parity,
        }
    }
}

/// Counters of one device's dedup layer.
#[derive(Default)]
struct Counters {
    physical_writes: AtomicU64,
    physical_write_bytes: AtomicU64,
    physical_parity_writes: AtomicU64,
    reference_writes: AtomicU64,
    reference_parity_writes: AtomicU64,
    log_bytes: AtomicU64,
    hash_ops: AtomicU64,
    hash_parity_ops: AtomicU64,
    hash_bytes: AtomicU64,
    dedup_hits: AtomicU64,
    dedup_parity_hits: AtomicU64,
    verify_compares: AtomicU64,
    verify_mismatches: AtomicU64,
    unmaps: AtomicU64,
    refused_records: AtomicU64,
    snapshots: AtomicU64,
    log_syncs: AtomicU64,
    /// Write-path phase timers (paper 002, Fig. 1); see `DedupStats`.
    chunking_ns: AtomicU64,
    fingerprint_ns: AtomicU64,
    index_ns: AtomicU64,
    write_ns: AtomicU64,
}

/// Adds the nanoseconds since `since` to `counter`.
fn add_ns(counter: &AtomicU64, since: std::time::Instant) {
    counter.fetch_add(since.elapsed().as_nanos() as u64, Relaxed);
}

pub use crate::counters::DedupStats;

struct State {
    /// Dedup block → slot.
    map: Vec<u32>,
    refs: Vec<u32>,
    /// Per slot: its index entry, or [`NOT_FINGERPRINTED`], or
    /// [`EVICTED`] (fingerprinted, so never overwritten in place, but its
    /// fingerprint left the bounded index and RAM).
    slot_entry: Vec<u32>,
    free: Vec<u32>,
    pending_free: Vec<u32>,
    /// Slots whose reference count fell (and stayed above zero) since the
    /// log was last synced, one bit each: the records that say so may
    /// not survive a power loss, so on disk the slot may still be shared,
    /// and it must not be overwritten in place until the next sync.
    dropped: Marks,
    /// Blocks with a map record appended since the last sync record. An
    /// in-place overwrite of such a block appends a record too: replay
    /// checks the block's last record after the sync against its slot's
    /// bytes, which the overwrite changed (`replay.rs`).
    logged: Marks,
    index: FingerprintIndex,
    log_end: u64,
    /// Log bytes known durable: a sync with nothing appended since skips
    /// the log's fdatasync.
    log_synced: u64,
    log: Arc<dyn StorageFile>,
    /// Moves at every change of the map or of a slot's count
    /// ([`State::assign`], [`State::decref`]): the key of `space_seen`.
    generation: u64,
    /// The last [`DedupDevice::space`] scan, with the generation it saw.
    space_seen: Option<(u64, (u64, u64))>,
}

/// One bit per slot or block, all cleared at once (at a sync).
struct Marks {
    words: Vec<u64>,
    any: bool,
}

impl Marks {
    fn new(bits: u64) -> Marks {
        Marks {
            words: vec![0; bits.div_ceil(64) as usize],
            any: false,
        }
    }

    fn set(&mut self, i: u64) {
        self.words[(i / 64) as usize] |= 1 << (i % 64);
        self.any = true;
    }

    fn get(&self, i: u64) -> bool {
        self.words[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn clear(&mut self) {
        if self.any {
            self.words.fill(0);
            self.any = false;
        }
    }

    fn ram_bytes(&self) -> u64 {
        self.words.capacity() as u64 * 8
    }
}

/// `slot_entry` of a slot whose content was not fingerprinted (it may be
/// overwritten in place while it has one reference).
const NOT_FINGERPRINTED: u32 = u32::MAX;
/// `slot_entry` of a fingerprinted slot that is not in the index.
const EVICTED: u32 = u32::MAX - 1;

impl State {
    /// Blocks of the data area mapped.
    fn mapped_blocks(&self) -> u64 {
        self.map.iter().filter(|s| **s != UNMAPPED).count() as u64
    }

    /// Slots holding at least one block's content.
    fn slots_used(&self) -> u64 {
        self.refs.iter().filter(|r| **r > 0).count() as u64
    }

    fn decref(&mut self, slot: u32) {
        self.generation += 1;
        let r = &mut self.refs[slot as usize];
        assert!(*r > 0, "slot {slot} released more often than referenced");
        *r -= 1;
        if *r == 0 {
            self.forget(slot);
            self.pending_free.push(slot);
        } else {
            self.dropped.set(slot as u64);
        }
    }

    /// Whether the slot's count fell since the last log sync (so it may
    /// still be shared on disk).
    fn dropped(&self, slot: u32) -> bool {
        self.dropped.get(slot as u64)
    }

    /// Whether new content may go over the block's own slot `cur`: it
    /// holds no fingerprint anyone could be offered, no other block refers
    /// to it, and none did in a record not yet durable.
    fn own_in_place(&self, cur: u32) -> bool {
        cur != UNMAPPED
            && self.refs[cur as usize] == 1
            && !self.fingerprinted(cur)
            && !self.dropped(cur)
    }

    /// Whether the slot's content was fingerprinted (then it is copied on
    /// write, never overwritten in place).
    fn fingerprinted(&self, slot: u32) -> bool {
        self.slot_entry[slot as usize] != NOT_FINGERPRINTED
    }

    /// The slot's fingerprint, if it is in the index.
    fn fingerprint_of(&self, slot: u32) -> Option<Fingerprint> {
        match self.slot_entry[slot as usize] {
            NOT_FINGERPRINTED | EVICTED => None,
            e => Some(
                Fingerprint::from_slice(self.index.key(e)).expect("index keys are 1 to 32 bytes"),
            ),
        }
    }

    /// Withdraws the slot's index entry, keeping it marked fingerprinted.
    fn withdraw(&mut self, slot: u32) {
        let e = self.slot_entry[slot as usize];
        if e != NOT_FINGERPRINTED && e != EVICTED {
            self.index.remove(e);
            self.slot_entry[slot as usize] = EVICTED;
        }
    }

    /// Withdraws the slot's index entry and marks it not fingerprinted.
    fn forget(&mut self, slot: u32) {
        self.withdraw(slot);
        self.slot_entry[slot as usize] = NOT_FINGERPRINTED;
    }

    /// Offers `slot`, holding content `fp`, for dedup: the most recently
    /// used index entry. A slot that loses its entry (the evicted one, or
    /// the previous holder of the same fingerprint after a verify
    /// mismatch) stays marked fingerprinted.
    fn offer(&mut self, fp: &Fingerprint, slot: u32, parity: bool) {
        self.withdraw(slot);
        let ins = self.index.insert(fp.as_bytes(), slot, parity);
        if let Some(d) = ins.displaced {
            self.slot_entry[d as usize] = EVICTED;
        }
        self.slot_entry[slot as usize] = ins.entry;
    }

    /// Points `block` at `slot` (which the caller has already counted).
    fn assign(&mut self, block: u64, slot: u32) {
        self.generation += 1;
        let old = std::mem::replace(&mut self.map[block as usize], slot);
        if old != UNMAPPED {
            self.decref(old);
        }
    }

    /// Encodes a map record for `append`, marking its block logged.
    fn encode(&mut self, rec: &Record, out: &mut Vec<u8>) {
        if let Record::Write { block, .. }
        | Record::Reference { block, .. }
        | Record::Unmap { block } = *rec
        {
            self.logged.set(block);
        }
        rec.encode_into(out);
    }

    /// Appends a sync record and makes the log durable. Only once the
    /// slots every record points at are durable: the sync record vouches
    /// for every record before it (`replay.rs`).
    fn sync_log(&mut self) -> io::Result<()> {
        let mut rec = Vec::with_capacity(log::RECORD_HEADER_BYTES);
        Record::Sync.encode_into(&mut rec);
        self.append(&rec)?;
        self.log.sync()?;
        self.log_synced = self.log_end;
        Ok(())
    }

    fn append(&mut self, records: &[u8]) -> io::Result<()> {
        self.log.write_at(records, self.log_end)?;
        self.log_end += records.len() as u64;
        Ok(())
    }
}

/// A hasher for keys that are uniform already (fingerprint prefixes): the
/// key is the hash.
#[derive(Default)]
struct PrefixHasher(u64);

impl std::hash::Hasher for PrefixHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// What one dedup block of a request becomes (`DedupDevice::write_batch`).
#[derive(Clone, Copy)]
enum Plan {
    /// A hit on the slot the block maps already: nothing changes.
    Keep,
    /// A hit on another slot (counted at planning, so it stays).
    Reference(u32),
    /// The content of the earlier block `from` of the request: a reference
    /// to its fresh slot (filled in at allocation).
    Local { from: usize, slot: u32 },
    /// New content to a fresh slot (filled in at allocation).
    Fresh(u32),
    /// Unfingerprinted content over the block's own slot.
    InPlace(u32),
    /// New fingerprinted content over the block's own slot, which no
    /// other block shares (verify on only; its index entry was withdrawn
    /// at planning).
    Rewrite(u32),
}

pub struct DedupDevice {
    /// Where the map's files live (the array's storage).
    storage: Arc<dyn Storage>,
    inner: Arc<dyn Device>,
    config: DedupConfig,
    backend: Arc<dyn FingerprintBackend>,
    data_offset: u64,
    block: u64,
    blocks: u64,
    log_path: PathBuf,
    snapshot_path: PathBuf,
    state: Mutex<State>,
    /// Signalled when a write completes while `slot_waiters` > 0: a write
    /// that found no free slot waits for slots other writes hold only
    /// while they are in flight (see `place`).
    slot_freed: std::sync::Condvar,
    slot_waiters: AtomicU64,
    counters: Counters,
    /// [`LOG_COMPACT_BYTES`]; smaller in tests.
    log_compact_bytes: AtomicU64,
}

/// Starts an empty map for a device (at create and on replacement): the
/// snapshot removed, an empty log renamed into place, the folder synced
/// (which makes both names durable).
pub fn reset_state(storage: &dyn Storage, state_dir: &Path, name: &str) -> Result<()> {
    storage
        .create_dir_all(state_dir)
        .map_err(|e| Error::io(format!("creating {}", state_dir.display()), e))?;
    reset_files(storage, state_dir, name)?;
    Ok(())
}

/// The files a layer's map lives in (`state_dir` of its storage, the
/// name it was opened with): its log, then its snapshot.
pub fn state_files(state_dir: &Path, name: &str) -> [PathBuf; 2] {
    [
        state_dir.join(format!("{name}.log")),
        state_dir.join(format!("{name}.snap")),
    ]
}

/// Removes `<name>.snap` and replaces `<name>.log` by an empty log.
fn reset_files(
    storage: &dyn Storage,
    state_dir: &Path,
    name: &str,
) -> Result<Arc<dyn StorageFile>> {
    let [log_path, snapshot] = state_files(state_dir, name);
    if storage.exists(&snapshot) {
        storage
            .remove(&snapshot)
            .map_err(|e| Error::io(format!("removing {}", snapshot.display()), e))?;
    }
    log::reset_log(storage, &log_path)
}

/// The content checksum a map record carries: CRC32C of the block's bytes,
/// checked against the slot at replay (`replay.rs`).
fn content_crc(chunk: &[u8]) -> Option<u32> {
    Some(crate::codec::crc32c(chunk))
}

fn io_err(e: Error) -> io::Error {
    io::Error::other(e.to_string())
}

impl DedupDevice {
    /// Tests: compacts the log past `bytes` instead of [`LOG_COMPACT_BYTES`].
    #[cfg(test)]
    pub(crate) fn set_log_compact_bytes(&self, bytes: u64) {
        self.log_compact_bytes.store(bytes, Relaxed);
    }

    /// Opens (or, with `fresh`, starts empty) the dedup layer of a device
    /// whose data area starts at `data_offset` and holds `data_bytes`. Its
    /// map lives in `state_dir` of `storage` as `<name>.snap` and
    /// `<name>.log`.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        storage: Arc<dyn Storage>,
        inner: Arc<dyn Device>,
        config: DedupConfig,
        backend: Arc<dyn FingerprintBackend>,
        data_offset: u64,
        data_bytes: u64,
        state_dir: &Path,
        name: &str,
        fresh: bool,
    ) -> Result<DedupDevice> {
        assert!(config.policy != Policy::None);
        let block = config.block_bytes as u64;
        assert!(data_offset.is_multiple_of(block) && data_bytes.is_multiple_of(block));
        let blocks = data_bytes / block;
        if blocks >= UNMAPPED as u64 {
            return Err(Error::Config(format!(
                "a device of {blocks} dedup blocks is too large (2^32-1 at most)"
            )));
        }
        storage
            .create_dir_all(state_dir)
            .map_err(|e| Error::io(format!("creating {}", state_dir.display()), e))?;
        let [log_path, snapshot_path] = state_files(state_dir, name);
        let (map, fps, records, log_end, log_version) = if fresh {
            reset_files(storage.as_ref(), state_dir, name)?;
            (
                vec![UNMAPPED; blocks as usize],
                Vec::new(),
                Vec::new(),
                log::LOG_HEADER_BYTES,
                log::LOG_VERSION,
            )
        } else {
            let (map, fps) = if storage.exists(&snapshot_path) {
                let s = log::read_snapshot(storage.as_ref(), &snapshot_path, blocks)?;
                (s.map, s.fingerprints)
            } else {
                (vec![UNMAPPED; blocks as usize], Vec::new())
            };
            if !storage.exists(&log_path) {
                return Err(Error::Corrupt(format!(
                    "dedup log {} is missing",
                    log_path.display()
                )));
            }
            let contents = log::read_log(storage.as_ref(), &log_path)?;
            if contents.torn {
                // Cut the tail, so that no stale record beyond it can ever
                // line up with a later append and be replayed.
                storage
                    .open(&log_path)
                    .and_then(|f| f.set_len(contents.end).and_then(|_| f.sync()))
                    .map_err(|e| {
                        Error::io(
                            format!("cutting the torn tail of {}", log_path.display()),
                            e,
                        )
                    })?;
            }
            (map, fps, contents.records, contents.end, contents.version)
        };
        let log = storage
            .open(&log_path)
            .map_err(|e| Error::io(format!("opening {}", log_path.display()), e))?;
        // What an earlier process wrote but did not sync may still be only
        // in the page cache: make it durable (slots, then records) before
        // anything builds on it, e.g. reusing a slot an unsynced record
        // freed.
        inner
            .sync()
            .and_then(|_| log.sync())
            .map_err(|e| Error::io(format!("syncing {}", log_path.display()), e))?;
        // Slots in the order they were last written or referenced, oldest
        // first: the snapshot's fingerprints (persisted least recent first),
        // then the log's records. Refilling the index in this order keeps
        // (approximately: a hit that changed no mapping is not logged) the
        // recency it had, so a bounded index keeps the fingerprints most
        // recently used rather than arbitrary ones.
        // The fingerprints are gathered in a transient table (open only),
        // then offered to the bounded index.
        let key_bytes = config.algorithm.digest_bytes();
        let bad =
            |what: String| Error::Corrupt(format!("dedup map {}: {what}", log_path.display()));
        let mut slot_bytes = vec![0u8; block as usize];
        let replayed = replay::replay(
            map,
            fps,
            &records,
            key_bytes,
            &mut |slot| {
                inner
                    .read_at(&mut slot_bytes, data_offset + slot as u64 * block)
                    .map_err(|e| Error::io(format!("reading slot {slot} to check the map"), e))?;
                Ok(crate::codec::crc32c(&slot_bytes))
            },
            &bad,
        )?;
        drop(records);
        let replay::Replayed {
            map,
            recency,
            mut slot_fp,
            unsynced_records,
            refused_records,
        } = replayed;
        // The snapshot's fingerprints name slots read from disk: checked
        // here, before they index the per-slot tables below.
        if let Some(s) = slot_fp.keys().find(|&&s| s as u64 >= blocks) {
            return Err(bad(format!(
                "snapshot holds a fingerprint of slot {s} of {blocks}"
            )));
        }
        let mut refs = vec![0u32; blocks as usize];
        for &s in &map {
            if s != UNMAPPED {
                if s as u64 >= blocks {
                    return Err(bad(format!("block maps to slot {s} of {blocks}")));
                }
                refs[s as usize] += 1;
            }
        }
        slot_fp.retain(|s, _| refs[*s as usize] > 0);
        if let Some((s, fp)) = slot_fp
            .iter()
            .find(|(_, fp)| fp.as_bytes().len() != key_bytes)
        {
            return Err(bad(format!(
                "snapshot gives slot {s} a {}-byte fingerprint, {} uses {key_bytes}",
                fp.as_bytes().len(),
                config.algorithm
            )));
        }
        let mut slot_entry = vec![NOT_FINGERPRINTED; blocks as usize];
        for &s in slot_fp.keys() {
            slot_entry[s as usize] = EVICTED;
        }
        // Ascending allocation: pop from the end of a descending list.
        let free = (0..blocks as u32)
            .rev()
            .filter(|&s| refs[s as usize] == 0)
            .collect();
        // A slot more than one block refers to is marked fingerprinted
        // (copied on write) even when the snapshot no longer holds its
        // fingerprint (evicted before the snapshot).
        for (s, e) in slot_entry.iter_mut().enumerate() {
            if refs[s] >= 2 && *e == NOT_FINGERPRINTED {
                *e = EVICTED;
            }
        }
        let mut state = State {
            dropped: Marks::new(blocks),
            logged: Marks::new(blocks),
            map,
            refs,
            slot_entry,
            free,
            pending_free: Vec::new(),
            index: FingerprintIndex::new(key_bytes, config.index_entries_max as usize),
            log_end,
            log_synced: log_end,
            log,
            generation: 0,
            space_seen: None,
        };
        let parity = config.policy == Policy::Parity;
        for slot in recency {
            if let Some(fp) = slot_fp.get(&slot) {
                state.offer(fp, slot, parity);
            }
        }
        drop(slot_fp);
        let dev = DedupDevice {
            storage,
            inner,
            config,
            backend,
            data_offset,
            block,
            blocks,
            log_path,
            snapshot_path,
            state: Mutex::new(state),
            slot_freed: std::sync::Condvar::new(),
            slot_waiters: AtomicU64::new(0),
            counters: Counters::default(),
            log_compact_bytes: AtomicU64::new(LOG_COMPACT_BYTES),
        };
        dev.counters.refused_records.store(refused_records, Relaxed);
        let mut st = dev.state.lock().unwrap();
        if refused_records > 0 || log_version != log::LOG_VERSION {
            // The refused records must never be replayed as they stand
            // (a sync record after them would vouch for them), and an old
            // log is not appended to: the map as replayed becomes a
            // snapshot, with a new, empty log.
            dev.compact(&mut st)?;
        } else if unsynced_records > 0 {
            // Every record after the last sync record was borne out, and
            // the slots were synced above: a sync record says so.
            st.sync_log()
                .map_err(|e| Error::io(format!("syncing {}", dev.log_path.display()), e))?;
        }
        drop(st);
        Ok(dev)
    }

    fn slot_offset(&self, slot: u32) -> u64 {
        self.data_offset + slot as u64 * self.block
    }

    /// A free slot, making pending frees durable first if that is all that
    /// is left. None means every slot holds exactly one block's content
    /// (slots = blocks, so then the writer's own slot has one reference and
    /// is overwritten in place).
    fn alloc(&self, st: &mut State) -> io::Result<Option<u32>> {
        if st.free.is_empty() && !st.pending_free.is_empty() {
            self.sync_locked(st)?;
        }
        Ok(st.free.pop())
    }

    /// Writes a new slot, or the block's own slot in place when no slot is
    /// free. Records nothing; returns the slot and whether it is new.
    ///
    /// With no free slot and no slot of its own (the block is unmapped or
    /// shares its slot), it waits: there are as many slots as blocks, so
    /// an unmapped or sharing block means some slot is unreferenced, and
    /// one that is neither free nor pending is held by another write in
    /// flight (a fresh slot whose block still holds its old one), which
    /// lets one go when it commits. A bound on the wait turns a broken
    /// count into an error instead of a hang.
    fn place(
        &self,
        block: u64,
        chunk: &[u8],
        mut st: std::sync::MutexGuard<'_, State>,
    ) -> io::Result<(u32, bool)> {
        let started = std::time::Instant::now();
        let found = loop {
            let found = self.alloc(&mut st)?;
            let own = st.map[block as usize];
            if found.is_some() || (own != UNMAPPED && st.refs[own as usize] == 1) {
                break found;
            }
            if started.elapsed() > SLOT_WAIT_MAX {
                return Err(io::Error::other(format!(
                    "no free slot for block {block} after {} s (every slot referenced)",
                    SLOT_WAIT_MAX.as_secs()
                )));
            }
            self.slot_waiters.fetch_add(1, Relaxed);
            st = self
                .slot_freed
                .wait_timeout(st, std::time::Duration::from_millis(20))
                .unwrap()
                .0;
            self.slot_waiters.fetch_sub(1, Relaxed);
        };
        match found {
            Some(slot) => {
                st.refs[slot as usize] = 1;
                drop(st);
                let written = self.inner.write_at(chunk, self.slot_offset(slot));
                if let Err(e) = written {
                    let mut st = self.state.lock().unwrap();
                    st.refs[slot as usize] = 0;
                    st.generation += 1;
                    st.free.push(slot);
                    return Err(e);
                }
                Ok((slot, true))
            }
            None => {
                let slot = st.map[block as usize];
                assert!(
                    slot != UNMAPPED && st.refs[slot as usize] == 1,
                    "a full map has one reference per slot"
                );
                let fingerprinted = st.fingerprinted(slot);
                if fingerprinted {
                    // The slot stops vouching for its old fingerprint before
                    // its bytes change, durably: without the sync, a crash
                    // could keep the old fingerprint in the persisted map
                    // while the slot holds new bytes, and a later write of
                    // the old content would become a reference to the wrong
                    // bytes. Only a full device takes this path.
                    st.forget(slot);
                    self.log(
                        &mut st,
                        Record::Write {
                            block,
                            slot: slot as u64,
                            fingerprint: None,
                            // The block stays on its slot: nothing to check.
                            content: None,
                        },
                    )?;
                }
                if fingerprinted || st.dropped(slot) {
                    // Slots first, then the log (as every sync), so that
                    // no other write's record gets ahead of its bytes; this
                    // also makes durable whatever released the slot's other
                    // references.
                    self.sync_locked(&mut st)?;
                }
                drop(st);
                self.inner.write_at(chunk, self.slot_offset(slot))?;
                Ok((slot, false))
            }
        }
    }

    /// Makes every write so far durable: the slots' bytes first, then the
    /// map records that point at them (a record durable before its slot's
    /// bytes would, after a power loss, map a block, and offer a
    /// fingerprint, for bytes that never reached the media).
    fn sync_locked(&self, st: &mut State) -> io::Result<()> {
        self.inner.sync()?;
        if st.log_end != st.log_synced {
            st.sync_log()?;
            self.counters.log_syncs.fetch_add(1, Relaxed);
            self.counters
                .log_bytes
                .fetch_add(log::RECORD_HEADER_BYTES as u64, Relaxed);
        }
        // Every record appended so far is durable: counts that fell are
        // durable too, and the sync record vouches for every record.
        st.dropped.clear();
        st.logged.clear();
        let pending = std::mem::take(&mut st.pending_free);
        st.free.extend(pending);
        if st.log_end > self.log_compact_bytes.load(Relaxed) {
            self.compact(st).map_err(io_err)?;
        }
        Ok(())
    }

    /// Writes a snapshot of the map and starts an empty log.
    fn compact(&self, st: &mut State) -> Result<()> {
        // The index's entries, least recently used first, so that a reopen
        // refills the index in its recency order. Evicted fingerprints are
        // not kept (their RAM is what the bound saves): after a reopen
        // their slots count as not fingerprinted, which is safe, as no
        // persisted record then vouches for their bytes.
        let fingerprints: Vec<(u32, Fingerprint)> = st
            .index
            .least_recent_first()
            .into_iter()
            .map(|e| {
                let slot = st.index.slot(e);
                (
                    slot,
                    st.fingerprint_of(slot).expect("an index entry's slot"),
                )
            })
            .collect();
        log::write_snapshot(
            self.storage.as_ref(),
            &self.snapshot_path,
            &Snapshot {
                map: st.map.clone(),
                fingerprints,
            },
        )?;
        st.log = log::reset_log(self.storage.as_ref(), &self.log_path)?;
        st.log_end = log::LOG_HEADER_BYTES;
        st.log_synced = st.log_end;
        self.counters.snapshots.fetch_add(1, Relaxed);
        self.counters
            .log_bytes
            .fetch_add(st.map.len() as u64 * 4, Relaxed);
        Ok(())
    }

    /// Content of one dedup block (zeroes when unmapped).
    fn read_block(&self, block: u64, buf: &mut [u8]) -> io::Result<()> {
        let slot = self.state.lock().unwrap().map[block as usize];
        if slot == UNMAPPED {
            buf.fill(0);
            Ok(())
        } else {
            self.inner.read_at(buf, self.slot_offset(slot))
        }
    }

    fn write_data_area(&self, buf: &[u8], offset: u64, class: IoClass) -> io::Result<()> {
        let r = self.write_data_area_inner(buf, offset, class);
        if self.slot_waiters.load(Relaxed) > 0 {
            // Under the lock, so that a waiter between its check and its
            // wait cannot miss it.
            let _st = self.state.lock().unwrap();
            self.slot_freed.notify_all();
        }
        r
    }

    fn write_data_area_inner(&self, buf: &[u8], offset: u64, class: IoClass) -> io::Result<()> {
        let started = std::time::Instant::now();
        {
            // The log's bound: a sync first (see `log_sync_bytes`).
            let mut st = self.state.lock().unwrap();
            if st.log_end > log_sync_bytes(self.log_compact_bytes.load(Relaxed)) {
                self.sync_locked(&mut st)?;
            }
        }
        let rel = offset - self.data_offset;
        let block = self.block as usize;
        let first = rel / self.block;
        let last = (rel + buf.len() as u64).div_ceil(self.block);
        // Whole dedup blocks: merge a partial head or tail with current content.
        let mut whole;
        let bytes: &[u8] = if rel.is_multiple_of(self.block) && buf.len().is_multiple_of(block) {
            buf
        } else {
            whole = vec![0u8; ((last - first) * self.block) as usize];
            self.read_block(first, &mut whole[..block])?;
            if last - first > 1 {
                let tail = whole.len() - block;
                self.read_block(last - 1, &mut whole[tail..])?;
            }
            let at = (rel - first * self.block) as usize;
            whole[at..at + buf.len()].copy_from_slice(buf);
            &whole
        };
        let chunks: Vec<&[u8]> = bytes.chunks_exact(block).collect();
        add_ns(&self.counters.chunking_ns, started);
        if self.config.hashes(class) {
            let mut fps = Vec::with_capacity(chunks.len());
            let hashing = std::time::Instant::now();
            self.backend
                .fingerprint_batch(self.config.algorithm, &chunks, &mut fps)
                .map_err(io::Error::other)?;
            add_ns(&self.counters.fingerprint_ns, hashing);
            self.counters
                .hash_ops
                .fetch_add(chunks.len() as u64, Relaxed);
            if class == IoClass::Parity {
                self.counters
                    .hash_parity_ops
                    .fetch_add(chunks.len() as u64, Relaxed);
            }
            self.counters
                .hash_bytes
                .fetch_add(bytes.len() as u64, Relaxed);
            if !self.write_batch(first, bytes, Some(&fps), class)? {
                for (i, (chunk, fp)) in chunks.iter().zip(&fps).enumerate() {
                    self.write_hashed(first + i as u64, chunk, *fp, class)?;
                }
            }
        } else if !self.write_batch(first, bytes, None, class)? {
            for (i, chunk) in chunks.iter().enumerate() {
                self.write_plain(first + i as u64, chunk, class)?;
            }
        }
        add_ns(&self.counters.write_ns, started);
        Ok(())
    }

    /// Writes the whole dedup blocks `bytes`, starting at `first`, as one
    /// batch (`fps`: their fingerprints, None when not fingerprinted):
    /// under one lock, every block is planned (index lookup, verify,
    /// reference, in place or fresh slot) and the fresh slots it needs are
    /// allocated (ascending, so that they tend to be consecutive); then,
    /// unlocked, runs of consecutive slots are written with one `write_at`
    /// each; then, under one lock, the map is updated and all the records
    /// are appended with one write. Records are appended only after the
    /// slots' bytes are written, as on the per-block path, and a slot
    /// enters the index only then. Returns false, having changed nothing
    /// but the index (recency, and the entries of slots it planned to
    /// rewrite, withdrawn), when there are not enough free slots (a full
    /// device): the caller then goes block by block, overwriting in place
    /// where it must.
    ///
    /// A block whose content an earlier block of the request is writing
    /// becomes a reference to that block's fresh slot, as it would block by
    /// block. Unlike block by block, a hit on a slot that an earlier block
    /// of the request stops using keeps that slot (it is counted before the
    /// earlier block lets go of it).
    fn write_batch(
        &self,
        first: u64,
        bytes: &[u8],
        fps: Option<&[Fingerprint]>,
        class: IoClass,
    ) -> io::Result<bool> {
        let block = self.block as usize;
        let n = bytes.len() / block;
        let chunk = |i: usize| &bytes[i * block..(i + 1) * block];
        let parity = class == IoClass::Parity;
        let planning = std::time::Instant::now();
        let mut st = self.state.lock().unwrap();
        let mut plans = Vec::with_capacity(n);
        // Fingerprint (its first 8 bytes, already uniform, so not hashed
        // again) → the block of this request that writes it to a fresh
        // slot (block by block, that slot would be the index's entry). A
        // prefix shared by two different fingerprints only misses a dedup:
        // the full fingerprints are compared.
        let mut local: std::collections::HashMap<
            u64,
            usize,
            std::hash::BuildHasherDefault<PrefixHasher>,
        > = Default::default();
        let (mut hits, mut compares, mut mismatches, mut fresh) = (0u64, 0u64, 0u64, 0usize);
        // Slots that earlier blocks of this request will reference: never
        // rewritten in place by a later one.
        let mut referenced: Vec<u32> = Vec::new();
        for i in 0..n {
            let b = first + i as u64;
            let cur = st.map[b as usize];
            let plan = match fps {
                None => {
                    if st.own_in_place(cur) {
                        Plan::InPlace(cur)
                    } else {
                        Plan::Fresh(UNMAPPED)
                    }
                }
                Some(fps) => {
                    let fp = fps[i];
                    let found = match local.get(&fp.prefix_u64()) {
                        Some(&j) if fps[j] == fp => Some(Plan::Local {
                            from: j,
                            slot: UNMAPPED,
                        }),
                        _ => st.index.get(fp.as_bytes()).map(|s| {
                            if s == cur {
                                Plan::Keep
                            } else {
                                Plan::Reference(s)
                            }
                        }),
                    };
                    let same = match found {
                        None => false,
                        Some(_) if !self.config.verify => true,
                        Some(Plan::Local { from, .. }) => {
                            compares += 1;
                            chunk(from) == chunk(i)
                        }
                        Some(Plan::Keep) | Some(Plan::Reference(_)) => {
                            let s = match found {
                                Some(Plan::Reference(s)) => s,
                                _ => cur,
                            };
                            compares += 1;
                            let mut existing = vec![0u8; block];
                            self.inner.read_at(&mut existing, self.slot_offset(s))?;
                            existing == chunk(i)
                        }
                        Some(_) => false,
                    };
                    match found {
                        Some(plan) if same => {
                            hits += 1;
                            if let Plan::Reference(s) = plan {
                                referenced.push(s);
                            }
                            plan
                        }
                        _ => {
                            if found.is_some() {
                                mismatches += 1;
                            }
                            local.insert(fp.prefix_u64(), i);
                            if self.config.verify
                                && cur != UNMAPPED
                                && st.refs[cur as usize] == 1
                                && !st.dropped(cur)
                                && !referenced.contains(&cur)
                            {
                                // The block's own slot, shared with no one:
                                // rewritten in place (as a plain RAID does),
                                // not copied. Its entry leaves the index
                                // now, under the lock, so no write can start
                                // referring to the old bytes; a crash may
                                // leave a record vouching for them, which
                                // the byte compare then refuses.
                                st.withdraw(cur);
                                Plan::Rewrite(cur)
                            } else {
                                Plan::Fresh(UNMAPPED)
                            }
                        }
                    }
                }
            };
            if matches!(plan, Plan::Fresh(_)) {
                fresh += 1;
            }
            plans.push(plan);
        }
        if st.free.len() < fresh && !st.pending_free.is_empty() {
            self.sync_locked(&mut st)?;
        }
        if st.free.len() < fresh {
            return Ok(false);
        }
        // The free list is popped from its end (ascending on a fresh map).
        let at = st.free.len() - fresh;
        let mut slots: Vec<u32> = st.free.drain(at..).collect();
        slots.sort_unstable();
        let mut slots = slots.into_iter();
        let mut slot_of = vec![UNMAPPED; n];
        // (slot, block of the request) of every slot write.
        let mut writes: Vec<(u32, usize)> = Vec::with_capacity(n);
        for i in 0..n {
            match plans[i] {
                Plan::Fresh(_) => {
                    let s = slots.next().unwrap_or(UNMAPPED);
                    st.refs[s as usize] = 1;
                    slot_of[i] = s;
                    plans[i] = Plan::Fresh(s);
                    writes.push((s, i));
                }
                Plan::InPlace(s) => writes.push((s, i)),
                Plan::Rewrite(s) => {
                    slot_of[i] = s;
                    writes.push((s, i));
                }
                Plan::Reference(s) => st.refs[s as usize] += 1,
                Plan::Local { from, .. } => {
                    let s = slot_of[from];
                    st.refs[s as usize] += 1;
                    plans[i] = Plan::Local { from, slot: s };
                }
                Plan::Keep => {}
            }
        }
        drop(st);
        if fps.is_some() {
            add_ns(&self.counters.index_ns, planning);
        }
        writes.sort_unstable();
        let mut k = 0;
        while k < writes.len() {
            let mut e = k + 1;
            while e < writes.len() && writes[e].0 == writes[e - 1].0 + 1 {
                e += 1;
            }
            let run = &writes[k..e];
            let gathered;
            let buf: &[u8] = if run.windows(2).all(|w| w[1].1 == w[0].1 + 1) {
                &bytes[run[0].1 * block..(run[run.len() - 1].1 + 1) * block]
            } else {
                let mut v = Vec::with_capacity(run.len() * block);
                for &(_, i) in run {
                    v.extend_from_slice(chunk(i));
                }
                gathered = v;
                &gathered
            };
            if let Err(err) = self.inner.write_at(buf, self.slot_offset(run[0].0)) {
                // Nothing refers to the fresh slots: back to the free list
                // (their bytes may have changed; no record names them).
                let mut st = self.state.lock().unwrap();
                for plan in &plans {
                    match *plan {
                        Plan::Fresh(s) => {
                            st.refs[s as usize] = 0;
                            st.generation += 1;
                            st.free.push(s);
                        }
                        Plan::Reference(s) => st.decref(s),
                        // A reference to a slot being rewritten in place:
                        // that slot stays its own block's (the count goes
                        // back to 1; a fresh slot's count was reset above
                        // or will be below).
                        Plan::Local { from, slot } if matches!(plans[from], Plan::Rewrite(_)) => {
                            st.refs[slot as usize] -= 1
                        }
                        _ => {}
                    }
                }
                return Err(err);
            }
            k = e;
        }
        let committing = std::time::Instant::now();
        let mut st = self.state.lock().unwrap();
        let mut rec = Vec::with_capacity(n * (log::RECORD_HEADER_BYTES + 32));
        for (i, plan) in plans.iter().enumerate() {
            let b = first + i as u64;
            let content = content_crc(chunk(i));
            let record = match *plan {
                Plan::Keep => None,
                Plan::InPlace(s) => st.logged.get(b).then_some(Record::Write {
                    block: b,
                    slot: s as u64,
                    fingerprint: None,
                    content,
                }),
                Plan::Reference(s) | Plan::Local { slot: s, .. } => {
                    st.assign(b, s);
                    Some(Record::Reference {
                        block: b,
                        slot: s as u64,
                        content,
                    })
                }
                Plan::Rewrite(s) => {
                    let fp = fps.expect("a rewrite is fingerprinted")[i];
                    st.offer(&fp, s, parity);
                    Some(Record::Write {
                        block: b,
                        slot: s as u64,
                        fingerprint: Some(fp),
                        content,
                    })
                }
                Plan::Fresh(s) => {
                    st.assign(b, s);
                    let fingerprint = fps.map(|fps| fps[i]);
                    if let Some(fp) = fingerprint {
                        st.offer(&fp, s, parity);
                    }
                    Some(Record::Write {
                        block: b,
                        slot: s as u64,
                        fingerprint,
                        content,
                    })
                }
            };
            if let Some(record) = record {
                st.encode(&record, &mut rec);
            }
        }
        if fps.is_some() {
            add_ns(&self.counters.index_ns, committing);
        }
        if !rec.is_empty() {
            st.append(&rec)?;
            self.counters.log_bytes.fetch_add(rec.len() as u64, Relaxed);
        }
        drop(st);
        let c = &self.counters;
        let physical = writes.len() as u64;
        c.physical_writes.fetch_add(physical, Relaxed);
        c.physical_write_bytes
            .fetch_add(physical * self.block, Relaxed);
        c.dedup_hits.fetch_add(hits, Relaxed);
        c.reference_writes.fetch_add(hits, Relaxed);
        if parity {
            c.physical_parity_writes.fetch_add(physical, Relaxed);
            c.dedup_parity_hits.fetch_add(hits, Relaxed);
            c.reference_parity_writes.fetch_add(hits, Relaxed);
        }
        c.verify_compares.fetch_add(compares, Relaxed);
        c.verify_mismatches.fetch_add(mismatches, Relaxed);
        Ok(true)
    }

    fn write_hashed(
        &self,
        block: u64,
        chunk: &[u8],
        fp: Fingerprint,
        class: IoClass,
    ) -> io::Result<()> {
        let lookup = std::time::Instant::now();
        let mut st = self.state.lock().unwrap();
        let hit = st.index.get(fp.as_bytes());
        add_ns(&self.counters.index_ns, lookup);
        if let Some(slot) = hit {
            let verifying = std::time::Instant::now();
            let same = if self.config.verify {
                self.counters.verify_compares.fetch_add(1, Relaxed);
                let mut existing = vec![0u8; chunk.len()];
                self.inner.read_at(&mut existing, self.slot_offset(slot))?;
                existing == chunk
            } else {
                true
            };
            add_ns(&self.counters.index_ns, verifying);
            if same {
                if st.map[block as usize] != slot {
                    st.refs[slot as usize] += 1;
                    st.assign(block, slot);
                    self.log(
                        &mut st,
                        Record::Reference {
                            block,
                            slot: slot as u64,
                            content: content_crc(chunk),
                        },
                    )?;
                }
                self.counters.dedup_hits.fetch_add(1, Relaxed);
                if class == IoClass::Parity {
                    self.counters.dedup_parity_hits.fetch_add(1, Relaxed);
                }
                self.counters.reference_writes.fetch_add(1, Relaxed);
                if class == IoClass::Parity {
                    self.counters.reference_parity_writes.fetch_add(1, Relaxed);
                }
                return Ok(());
            }
            self.counters.verify_mismatches.fetch_add(1, Relaxed);
        }
        // New content: a fresh slot, never the one in place (copy on write),
        // unless no slot is free.
        let (slot, new) = self.place(block, chunk, st)?;
        let mut st = self.state.lock().unwrap();
        if new {
            st.assign(block, slot);
        }
        let inserting = std::time::Instant::now();
        st.offer(&fp, slot, class == IoClass::Parity);
        add_ns(&self.counters.index_ns, inserting);
        self.log(
            &mut st,
            Record::Write {
                block,
                slot: slot as u64,
                fingerprint: Some(fp),
                content: content_crc(chunk),
            },
        )?;
        self.count_physical(chunk.len(), class);
        Ok(())
    }

    fn write_plain(&self, block: u64, chunk: &[u8], class: IoClass) -> io::Result<()> {
        let st = self.state.lock().unwrap();
        let cur = st.map[block as usize];
        if st.own_in_place(cur) {
            drop(st);
            self.inner.write_at(chunk, self.slot_offset(cur))?;
            let mut st = self.state.lock().unwrap();
            if st.logged.get(block) {
                // The block's record since the sync names its old content.
                self.log(
                    &mut st,
                    Record::Write {
                        block,
                        slot: cur as u64,
                        fingerprint: None,
                        content: content_crc(chunk),
                    },
                )?;
            }
        } else {
            let (slot, new) = self.place(block, chunk, st)?;
            let mut st = self.state.lock().unwrap();
            if new {
                st.assign(block, slot);
            }
            self.log(
                &mut st,
                Record::Write {
                    block,
                    slot: slot as u64,
                    fingerprint: None,
                    content: content_crc(chunk),
                },
            )?;
        }
        self.count_physical(chunk.len(), class);
        Ok(())
    }

    /// Appends one map record and counts its bytes.
    fn log(&self, st: &mut State, rec: Record) -> io::Result<()> {
        let mut buf = Vec::with_capacity(log::RECORD_HEADER_BYTES + 32);
        st.encode(&rec, &mut buf);
        st.append(&buf)?;
        self.counters.log_bytes.fetch_add(buf.len() as u64, Relaxed);
        Ok(())
    }

    fn count_physical(&self, bytes: usize, class: IoClass) {
        self.counters.physical_writes.fetch_add(1, Relaxed);
        self.counters
            .physical_write_bytes
            .fetch_add(bytes as u64, Relaxed);
        if class == IoClass::Parity {
            self.counters.physical_parity_writes.fetch_add(1, Relaxed);
        }
    }

    /// Before a repaired block is written: a slot whose fingerprint matches
    /// the good bytes was corrupted at rest, so its bytes are restored in
    /// place (fixing every block that refers to it); any other fingerprinted
    /// slot under the range stops being offered for dedup.
    fn restore(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let rel = offset - self.data_offset;
        if !rel.is_multiple_of(self.block) || !buf.len().is_multiple_of(self.block as usize) {
            return Ok(());
        }
        for (i, chunk) in buf.chunks_exact(self.block as usize).enumerate() {
            let block = rel / self.block + i as u64;
            let mut st = self.state.lock().unwrap();
            let slot = st.map[block as usize];
            if slot == UNMAPPED {
                continue;
            }
            // A slot out of the index has no fingerprint in RAM to check
            // against: the repair then goes to a fresh slot (copy on
            // write), and the other blocks sharing it are repaired when
            // they are read.
            let Some(fp) = st.fingerprint_of(slot) else {
                continue;
            };
            let mut good = Vec::with_capacity(1);
            self.backend
                .fingerprint_batch(self.config.algorithm, &[chunk], &mut good)
                .map_err(io::Error::other)?;
            if good[0] == fp {
                drop(st);
                self.inner.write_at(chunk, self.slot_offset(slot))?;
                self.count_physical(chunk.len(), IoClass::Data);
            } else {
                st.withdraw(slot);
            }
        }
        Ok(())
    }

    /// RAM the layer holds now: its map, reference counts, free lists,
    /// bitmaps, slot entries and fingerprint index (what
    /// [`DedupStats::map_bytes`], `slot_entry_bytes` and `index_bytes`
    /// add up to), without [`Self::stats`]'s walk over the map.
    pub fn ram_bytes(&self) -> u64 {
        let st = self.state.lock().unwrap();
        (st.map.capacity() * 4 + st.refs.capacity() * 4) as u64
            + (st.free.capacity() + st.pending_free.capacity()) as u64 * 4
            + st.dropped.ram_bytes()
            + st.logged.ram_bytes()
            + st.slot_entry.capacity() as u64 * 4
            + st.index.ram_bytes()
    }

    /// The write counters of [`Self::stats`] alone (no walk over the map):
    /// (physical writes, reference writes, of those parity, blocks
    /// fingerprinted, log bytes).
    pub fn write_counts(&self) -> [u64; 5] {
        let c = &self.counters;
        [
            c.physical_writes.load(Relaxed),
            c.reference_writes.load(Relaxed),
            c.reference_parity_writes.load(Relaxed),
            c.hash_ops.load(Relaxed),
            c.log_bytes.load(Relaxed),
        ]
    }

    /// Blocks of the data area mapped (written and not discarded), and
    /// slots they use: what the layer saves is their difference. One scan
    /// of the maps, made again only after they changed (a block pointed
    /// elsewhere, a slot's count dropped): an idle layer's costs nothing.
    pub fn space(&self) -> (u64, u64) {
        let mut st = self.state.lock().unwrap();
        if let Some((seen, space)) = st.space_seen {
            if seen == st.generation {
                return space;
            }
        }
        let space = (st.mapped_blocks(), st.slots_used());
        st.space_seen = Some((st.generation, space));
        space
    }

    pub fn stats(&self) -> DedupStats {
        let st = self.state.lock().unwrap();
        let c = &self.counters;
        let index_bytes = st.index.ram_bytes();
        let entries = st.index.len() as u64;
        let parity_entries = st.index.parity_entries() as u64;
        let map_bytes = (st.map.capacity() * 4 + st.refs.capacity() * 4) as u64
            + (st.free.capacity() + st.pending_free.capacity()) as u64 * 4
            + st.dropped.ram_bytes()
            + st.logged.ram_bytes();
        let slot_entry_bytes = st.slot_entry.capacity() as u64 * 4;
        DedupStats {
            policy: self.config.policy.to_string(),
            algorithm: self.config.algorithm.to_string(),
            block_bytes: self.block,
            physical_writes: c.physical_writes.load(Relaxed),
            physical_write_bytes: c.physical_write_bytes.load(Relaxed),
            physical_parity_writes: c.physical_parity_writes.load(Relaxed),
            reference_writes: c.reference_writes.load(Relaxed),
            reference_parity_writes: c.reference_parity_writes.load(Relaxed),
            log_bytes: c.log_bytes.load(Relaxed),
            hash_ops: c.hash_ops.load(Relaxed),
            hash_parity_ops: c.hash_parity_ops.load(Relaxed),
            hash_bytes: c.hash_bytes.load(Relaxed),
            dedup_hits: c.dedup_hits.load(Relaxed),
            dedup_parity_hits: c.dedup_parity_hits.load(Relaxed),
            verify_compares: c.verify_compares.load(Relaxed),
            verify_mismatches: c.verify_mismatches.load(Relaxed),
            unmaps: c.unmaps.load(Relaxed),
            refused_records: c.refused_records.load(Relaxed),
            snapshots: c.snapshots.load(Relaxed),
            log_syncs: c.log_syncs.load(Relaxed),
            mapped_blocks: st.mapped_blocks(),
            slots_used: st.slots_used(),
            index_entries: entries,
            index_capacity: st.index.capacity() as u64,
            index_evictions: st.index.evictions(),
            index_bytes,
            index_parity_entries: parity_entries,
            index_parity_bytes: (index_bytes * parity_entries)
                .checked_div(entries)
                .unwrap_or(0),
            index_bytes_per_entry: if entries > 0 {
                index_bytes as f64 / entries as f64
            } else {
                0.0
            },
            slot_entry_bytes,
            slot_fingerprints: st
                .slot_entry
                .iter()
                .filter(|&&e| e != NOT_FINGERPRINTED)
                .count() as u64,
            map_bytes,
            chunking_ns: c.chunking_ns.load(Relaxed),
            fingerprint_ns: c.fingerprint_ns.load(Relaxed),
            index_ns: c.index_ns.load(Relaxed),
            write_ns: c.write_ns.load(Relaxed),
        }
    }

    /// Checks the map against itself: every mapped block names a slot in
    /// range, counts match, no free slot is referenced. Returns problems.
    pub fn check(&self) -> Vec<String> {
        let st = self.state.lock().unwrap();
        let mut problems = Vec::new();
        let mut refs = vec![0u32; self.blocks as usize];
        for (b, &s) in st.map.iter().enumerate() {
            if s != UNMAPPED {
                if s as u64 >= self.blocks {
                    problems.push(format!("block {b} maps to slot {s} out of range"));
                    continue;
                }
                refs[s as usize] += 1;
            }
        }
        if refs != st.refs {
            problems.push("reference counts disagree with the map".into());
        }
        for &s in st.free.iter().chain(&st.pending_free) {
            if refs[s as usize] != 0 {
                problems.push(format!("slot {s} is free but referenced"));
            }
        }
        let listed = st.free.len() + st.pending_free.len();
        let unused = refs.iter().filter(|r| **r == 0).count();
        if listed != unused {
            problems.push(format!(
                "{unused} slots unused but {listed} on the free lists (leak)"
            ));
        }
        let mut entries = 0usize;
        for (s, &e) in st.slot_entry.iter().enumerate() {
            if e == NOT_FINGERPRINTED {
                continue;
            }
            if refs[s] == 0 {
                problems.push(format!("free slot {s} is marked fingerprinted"));
            }
            if e != EVICTED {
                entries += 1;
                if !st.index.holds(e) || st.index.slot(e) != s as u32 {
                    problems.push(format!("slot {s}'s index entry points elsewhere"));
                }
            }
        }
        if entries != st.index.len() {
            problems.push(format!(
                "{} index entries but {entries} slots point at one",
                st.index.len()
            ));
        }
        problems.extend(st.index.check());
        problems
    }
}

impl Device for DedupDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if offset < self.data_offset {
            assert!(
                offset + buf.len() as u64 <= self.data_offset,
                "I/O straddles the data area"
            );
            return self.inner.read_at(buf, offset);
        }
        let rel = offset - self.data_offset;
        let end = rel + buf.len() as u64;
        if end > self.blocks * self.block {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read beyond the data area",
            ));
        }
        if buf.is_empty() {
            return Ok(());
        }
        // The slots under the range, under one lock; then one read per run
        // of blocks whose slots are consecutive (a sequential layout reads
        // as one request, as it would without the layer).
        let first = rel / self.block;
        let last = end.div_ceil(self.block);
        let slots: Vec<u32> = {
            let st = self.state.lock().unwrap();
            st.map[first as usize..last as usize].to_vec()
        };
        let mut k = 0usize;
        while k < slots.len() {
            let mut e = k + 1;
            let unmapped = slots[k] == UNMAPPED;
            while e < slots.len()
                && if unmapped {
                    slots[e] == UNMAPPED
                } else {
                    slots[e] == slots[e - 1].wrapping_add(1)
                }
            {
                e += 1;
            }
            // Bytes of buf covered by blocks first+k .. first+e.
            let from = ((first + k as u64) * self.block).max(rel);
            let to = ((first + e as u64) * self.block).min(end);
            let part = &mut buf[(from - rel) as usize..(to - rel) as usize];
            if unmapped {
                part.fill(0);
            } else {
                let within = from - (first + k as u64) * self.block;
                self.inner
                    .read_at(part, self.slot_offset(slots[k]) + within)?;
            }
            k = e;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_hinted(buf, offset, WriteHint::new(IoClass::Data))
    }

    fn write_hinted(&self, buf: &[u8], offset: u64, hint: WriteHint) -> io::Result<()> {
        if offset < self.data_offset {
            assert!(
                offset + buf.len() as u64 <= self.data_offset,
                "I/O straddles the data area"
            );
            return self.inner.write_hinted(buf, offset, hint);
        }
        if offset + buf.len() as u64 > self.data_offset + self.blocks * self.block {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "write beyond the data area",
            ));
        }
        if hint.repair {
            self.restore(buf, offset)?;
        }
        self.write_data_area(buf, offset, hint.class)
    }

    fn sync(&self) -> io::Result<()> {
        let mut st = self.state.lock().unwrap();
        self.sync_locked(&mut st)
    }

    /// Below the data area (a superblock, a metadata area: bytes the layer
    /// passes through) while the layer holds nothing unsynced of its own
    /// (no map record past the log's sync, no slot waiting to be freed, no
    /// reference count or block marked since the sync, no compaction
    /// due), its sync would be the lower device's alone: the write goes to
    /// the lower device as one FUA write (one message to a chunk across
    /// the network, where the write and the layer's sync were two). That
    /// is the write and the sync it replaces where the lower device's FUA
    /// write syncs the device as it writes, as every device here does (a
    /// file or a chunk: the write, then `fdatasync`; a superblock update
    /// of a volume without dedup relies on the same).
    /// Otherwise, as any device: the write, then the layer's whole sync.
    /// (Passing every such write on as FUA, the layer's own sync skipped,
    /// was tried on 2026-11-28 and not kept: docs/cluster.md.)
    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if offset + buf.len() as u64 <= self.data_offset {
            let st = self.state.lock().unwrap();
            let clean = st.log_end == st.log_synced
                && st.pending_free.is_empty()
                && !st.dropped.any
                && !st.logged.any
                && st.log_end <= self.log_compact_bytes.load(Relaxed);
            if clean {
                // Under the state lock, as the layer's sync runs.
                return self.inner.write_fua(buf, offset);
            }
        }
        self.write_at(buf, offset)?;
        self.sync()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = offset + len;
        if offset < self.data_offset {
            let meta_end = end.min(self.data_offset);
            self.inner.discard(offset, meta_end - offset)?;
            if end <= self.data_offset {
                return Ok(());
            }
        }
        let start = offset.max(self.data_offset) - self.data_offset;
        let stop = (end - self.data_offset).min(self.blocks * self.block);
        // Partial blocks at the edges keep their slot, with zeroes written in.
        let first_whole = start.div_ceil(self.block);
        let last_whole = stop / self.block;
        if first_whole > last_whole {
            let zero = vec![0u8; (stop - start) as usize];
            return self.write_data_area(&zero, self.data_offset + start, IoClass::Data);
        }
        if start < first_whole * self.block {
            let zero = vec![0u8; (first_whole * self.block - start) as usize];
            self.write_data_area(&zero, self.data_offset + start, IoClass::Data)?;
        }
        if last_whole * self.block < stop {
            let zero = vec![0u8; (stop - last_whole * self.block) as usize];
            self.write_data_area(
                &zero,
                self.data_offset + last_whole * self.block,
                IoClass::Data,
            )?;
        }
        let mut st = self.state.lock().unwrap();
        let mut rec = Vec::new();
        for block in first_whole..last_whole {
            if st.map[block as usize] != UNMAPPED {
                st.assign(block, UNMAPPED);
                st.encode(&Record::Unmap { block }, &mut rec);
                self.counters.unmaps.fetch_add(1, Relaxed);
            }
        }
        if !rec.is_empty() {
            st.append(&rec)?;
            self.counters.log_bytes.fetch_add(rec.len() as u64, Relaxed);
        }
        Ok(())
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn describe(&self) -> String {
        format!("dedup({}):{}", self.config.policy, self.inner.describe())
    }

    /// The lower device's server: what this layer acknowledged is there
    /// while that server runs (a slot's bytes are written before the map
    /// record that points at them, the record before the write is
    /// answered, and a writer's open believes a record past the log's
    /// last sync where the slot holds the bytes it names: `replay.rs`).
    /// Without it, a dedup volume's superblocks were never stamped, and
    /// every takeover deferred the fold marks of servers that never
    /// restarted (the cluster simulator's seed 1023501: a whole-stripe
    /// write's parity, the same bytes as before the fold, taken for the
    /// fold's lost write, and the records given back over it).
    fn server_boot_id(&self) -> Option<u64> {
        self.inner.server_boot_id()
    }

    /// As its lower device: the layer takes calls from several threads
    /// (its state is under a lock), so where its chunk takes work side by
    /// side with its peers', so does the layer (a dedup volume's superblock
    /// writes and parity journals' syncs went one chunk after another
    /// before).
    fn side_by_side(&self) -> bool {
        self.inner.side_by_side()
    }
}

#[cfg(test)]
mod tests;
