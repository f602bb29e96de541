//! The degraded-write log: what closes the degraded write hole.
//!
//! While a device is out of service, the data unit it held lives only in
//! the stripe's parity. A stripe write then updates the surviving data and
//! parity units; a power cut in the middle leaves them disagreeing, and the
//! missing unit, decoded from them, comes out wrong, including blocks the
//! torn write never touched that were flushed long before. Resync cannot
//! help: the missing unit's content is exactly what it cannot read.
//!
//! So before a degraded stripe write touches any device, the value every
//! missing data unit will have after the write (its current content, with
//! the write laid over it where the write covers it) is appended here and
//! synced (a partial parity log in the spirit of Linux md's PPL, which is
//! RAID-5 only). Resync of a dirty stripe with a missing unit then
//! recomputes the surviving parity from the surviving data and the logged
//! value, so the missing unit decodes to that value: the old or the new
//! content, never a mix of two stripes' states.
//!
//! Records are only needed until the devices they describe are durable: a
//! checkpoint syncs every device and then ends the log's generation (one
//! synced header write), and records of an older generation are ignored at
//! open. A flush is a checkpoint; so is an append that would take the log
//! past its bound (`bytes_max`) or that meets a full space: the write waits
//! for the checkpoint instead of failing, as a journal's writers wait for
//! its checkpoint. A checkpoint holds new appends back and waits for every
//! stripe write whose records are logged ([`Logged`], held until the
//! stripe's devices are written), so it never drops a record whose stripe
//! is still being written.
//!
//! File layout (little endian): a 32-byte header (magic `ECDDDW01`, u32
//! version 1, u64 generation, zeros, u32 CRC32C of bytes 0..28 at 28); then
//! records starting at multiples of 8 bytes:
//! ```text
//! 0   u32 CRC32C of bytes 4..40+payload
//! 4   u32 payload bytes (count * block)
//! 8   u64 generation
//! 16  u64 stripe
//! 24  u32 role (a data role)
//! 28  u32 first block in the unit
//! 32  u32 block count
//! 36  u32 zero
//! 40  payload
//! ```
//! A record that fails its checksum ends the log (a torn append: its stripe
//! writes had not started, since devices are written only after the sync),
//! as does one whose blocks run past u32::MAX (never written).
//! A record with role `u32::MAX` and no payload is a tombstone: it drops
//! every earlier record of its stripe (written before a healthy write to a
//! stripe that still has records, as after a rebuild passed it).

use crate::error::{Error, Result};
use crate::media::storage::{read_all, write_atomic, Storage, StorageFile};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

const MAGIC: [u8; 8] = *b"ECDDDW01";
const VERSION: u32 = 1;
const HEADER_BYTES: u64 = 32;
const RECORD_HEADER_BYTES: usize = 40;
/// One record's payload: the blocks of one unit (a sanity bound).
const PAYLOAD_BYTES_MAX: u64 = 1 << 30;
const TOMBSTONE: u32 = u32::MAX;
/// The file grows in steps of this many bytes (zeroes past the records,
/// which end the log at open): appends below its length change no length,
/// so each is one durable write per copy (a FUA write to a chunk), where
/// one that lengthened the file cost a write, a length hint, a sync and a
/// directory commit. The first step is taken at open.
const GROW_BYTES: u64 = 64 << 10;

/// The most bytes one stripe write appends in one call: every block of
/// every data unit that can be missing (at most m), each in a record of
/// its own (a degraded journal replay logs row by row). A log bound below
/// this plus the header could never take a write; the array's bound is
/// at least twice it.
pub fn stripe_records_bytes_max(k: usize, m: usize, unit_bytes: u64, block: u64) -> u64 {
    let blocks = unit_bytes / block;
    let record = (RECORD_HEADER_BYTES as u64 + block).next_multiple_of(8);
    k.min(m) as u64 * blocks * record
}

/// Where a logged value sits and what it was: (stripe, role, block) ->
/// (file offset, CRC-32C of the block as logged). The value is read back
/// from whichever copy of a mirrored log comes first then, which may not
/// be the copy the index was read from (see [`DegradedLog::value`]).
type Index = HashMap<(u64, u32, u32), (u64, u32)>;

struct Inner {
    file: Arc<dyn StorageFile>,
    generation: u64,
    end: u64,
    index: Index,
    /// Appends whose stripe writes are still under way ([`Logged`]).
    writers: u32,
    /// A checkpoint is under way: appends wait for it.
    checkpointing: bool,
}

pub struct DegradedLog {
    storage: Arc<dyn Storage>,
    path: PathBuf,
    block: usize,
    /// The file's bound (header and records): an append that would pass
    /// it checkpoints first.
    bytes_max: u64,
    inner: Mutex<Inner>,
    /// Signalled when a checkpoint ends or the last writer finishes.
    changed: Condvar,
}

/// Records appended for one stripe write: held until the write's device
/// I/O is done, so that a checkpoint waits for it.
#[must_use = "hold it until the stripe's devices are written"]
pub struct Logged<'a> {
    log: &'a DegradedLog,
}

impl Drop for Logged<'_> {
    fn drop(&mut self) {
        let mut inner = self.log.lock();
        inner.writers -= 1;
        if inner.writers == 0 {
            self.log.changed.notify_all();
        }
    }
}

fn header(generation: u64) -> [u8; HEADER_BYTES as usize] {
    let mut h = [0u8; HEADER_BYTES as usize];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&generation.to_le_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

fn parse_header(b: &[u8]) -> Option<u64> {
    let h = b.get(..HEADER_BYTES as usize)?;
    if h[0..8] != MAGIC || u32::from_le_bytes(h[8..12].try_into().ok()?) != VERSION {
        return None;
    }
    if u32::from_le_bytes(h[28..32].try_into().ok()?) != crc32c::crc32c(&h[..28]) {
        return None;
    }
    Some(u64::from_le_bytes(h[12..20].try_into().ok()?))
}

/// One parsed record: (stripe, role, first block, count, payload offset, length).
struct Parsed {
    generation: u64,
    stripe: u64,
    role: u32,
    first: u32,
    count: u32,
    payload_at: usize,
    len: usize,
}

fn parse_record(b: &[u8], at: usize, block: usize) -> Option<Parsed> {
    let h = b.get(at..at + RECORD_HEADER_BYTES)?;
    let payload = u32::from_le_bytes(h[4..8].try_into().ok()?) as usize;
    let count = u32::from_le_bytes(h[32..36].try_into().ok()?);
    let role = u32::from_le_bytes(h[24..28].try_into().ok()?);
    let tombstone = role == TOMBSTONE && payload == 0 && count == 0;
    if !tombstone && (payload != count as usize * block || count == 0) {
        return None;
    }
    // The blocks `first..first + count` are numbered in u32.
    u32::from_le_bytes(h[28..32].try_into().ok()?).checked_add(count)?;
    let end = at.checked_add(RECORD_HEADER_BYTES)?.checked_add(payload)?;
    let whole = b.get(at..end)?;
    if u32::from_le_bytes(h[0..4].try_into().ok()?) != crate::codec::crc32c(&whole[4..]) {
        return None;
    }
    Some(Parsed {
        generation: u64::from_le_bytes(h[8..16].try_into().ok()?),
        stripe: u64::from_le_bytes(h[16..24].try_into().ok()?),
        role,
        first: u32::from_le_bytes(h[28..32].try_into().ok()?),
        count,
        payload_at: at + RECORD_HEADER_BYTES,
        len: (end - at).next_multiple_of(8),
    })
}

impl DegradedLog {
    /// Opens (creating if missing) the log and indexes the records of its
    /// current generation. An unreadable header starts a new generation:
    /// the records it held are then unknown, which the caller learns from
    /// `Ok(false)` (it resyncs as before the log existed).
    ///
    /// `bytes_max` bounds the file (see [`stripe_records_bytes_max`]); the
    /// space for it is reserved at once where the storage can (a metadata
    /// area allocates it, a file system `fallocate`s it), so that appends
    /// below it do not meet a full space; where it cannot, an append that
    /// does is met with a checkpoint.
    pub fn open(
        storage: Arc<dyn Storage>,
        path: &Path,
        block: usize,
        bytes_max: u64,
    ) -> Result<(DegradedLog, bool)> {
        let io = |e| {
            Error::io(
                format!("opening the degraded-write log {}", path.display()),
                e,
            )
        };
        let bytes = if storage.exists(path) {
            read_all(storage.as_ref(), path).map_err(io)?
        } else {
            Vec::new()
        };
        let (generation, intact) = match parse_header(&bytes) {
            Some(g) => (g, true),
            None => {
                let fresh = bytes.is_empty();
                write_atomic(storage.as_ref(), path, &header(1)).map_err(io)?;
                (1, fresh)
            }
        };
        let mut index = Index::new();
        let mut at = HEADER_BYTES as usize;
        if intact {
            while let Some(p) = parse_record(&bytes, at, block) {
                if p.generation == generation && p.role == TOMBSTONE {
                    index.retain(|&(s, _, _), _| s != p.stripe);
                } else if p.generation == generation {
                    for b in 0..p.count {
                        let at = p.payload_at + b as usize * block;
                        let crc = crate::codec::crc32c(&bytes[at..at + block]);
                        index.insert((p.stripe, p.role, p.first + b), (at as u64, crc));
                    }
                }
                at += p.len;
            }
        }
        let file = storage.open(path).map_err(io)?;
        // Best effort: without the reservation a full space is met by a
        // checkpoint at append time instead.
        let _ = file.reserve(bytes_max);
        // The first growth step, zeroes past what the file holds (nothing
        // there is read: the records end before it). Best effort too:
        // without it the first appends lengthen the file.
        if let Ok(len) = file.len() {
            let step = GROW_BYTES.min(bytes_max);
            if len < step {
                let _ = file.write_durable(&vec![0u8; (step - len) as usize], len);
            }
        }
        let log = DegradedLog {
            storage,
            path: path.to_owned(),
            block,
            bytes_max,
            inner: Mutex::new(Inner {
                file,
                generation,
                end: if intact { at as u64 } else { HEADER_BYTES },
                index,
                writers: 0,
                checkpointing: false,
            }),
            changed: Condvar::new(),
        };
        Ok((log, intact))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }

    /// Waits until no checkpoint is under way.
    fn lock_idle(&self) -> MutexGuard<'_, Inner> {
        let mut inner = self.lock();
        while inner.checkpointing {
            inner = self.changed.wait(inner).unwrap();
        }
        inner
    }

    /// Appends the records `encode` gives for the current generation at
    /// the end and syncs them, checkpointing first when they would pass
    /// the bound or meet a full space (and the log holds records a
    /// checkpoint can drop). Returns with `inner` locked, no checkpoint
    /// under way, and the records durable at the returned offset (their
    /// length not yet added to `end`).
    fn append<'a>(
        &'a self,
        encode: &dyn Fn(u64) -> Vec<u8>,
        make_durable: &dyn Fn() -> Result<()>,
    ) -> Result<(MutexGuard<'a, Inner>, u64, u64)> {
        let appending = |e| Error::io("appending to the degraded-write log", e);
        let mut inner = self.lock_idle();
        loop {
            let out = encode(inner.generation);
            let at = inner.end;
            let empty = at == HEADER_BYTES;
            let len = out.len() as u64;
            if at + len <= self.bytes_max || empty {
                // One durable write: a FUA write per copy below the
                // file's durable length (one round trip to a chunk). One
                // that lengthens the file takes it to the next growth
                // step (zeroes after the records), so the appends after
                // it do not.
                let mut out = out;
                let file_len = inner.file.len().map_err(appending)?;
                if at + len > file_len {
                    let grown = (at + len)
                        .next_multiple_of(GROW_BYTES)
                        .min(self.bytes_max.max(at + len));
                    out.resize((grown - at) as usize, 0);
                }
                match inner.file.write_durable(&out, at) {
                    Ok(()) => return Ok((inner, at, len)),
                    Err(e) if empty || !super::Array::is_space_error(&e) => {
                        return Err(appending(e))
                    }
                    Err(_) => {}
                }
            }
            inner = self.checkpoint_locked(inner, make_durable)?;
        }
    }

    /// Makes the logged stripes durable with `make_durable` (which syncs
    /// every device) and drops their records: appends wait meanwhile, and
    /// it starts once every stripe write with records logged is done.
    fn checkpoint_locked<'a>(
        &'a self,
        mut inner: MutexGuard<'a, Inner>,
        make_durable: &dyn Fn() -> Result<()>,
    ) -> Result<MutexGuard<'a, Inner>> {
        inner.checkpointing = true;
        while inner.writers > 0 {
            inner = self.changed.wait(inner).unwrap();
        }
        drop(inner);
        let durable = make_durable();
        let mut inner = self.lock();
        let r = durable.and_then(|()| {
            Self::end_generation_locked(&mut inner)
                .map_err(|e| Error::io("ending the degraded-write log's generation", e))
        });
        inner.checkpointing = false;
        self.changed.notify_all();
        r.map(|()| inner)
    }

    /// A checkpoint: `make_durable` syncs every device, and then the
    /// records it made needless are dropped. With no records, it only runs
    /// `make_durable` (and appends go on meanwhile).
    pub fn checkpoint(&self, make_durable: &dyn Fn() -> Result<()>) -> Result<()> {
        let inner = self.lock_idle();
        if inner.end == HEADER_BYTES && inner.index.is_empty() && inner.writers == 0 {
            drop(inner);
            return make_durable();
        }
        self.checkpoint_locked(inner, make_durable).map(drop)
    }

    /// Appends the values of missing data units, `(role, first block,
    /// bytes)`, for one stripe and syncs them: only then may the stripe's
    /// devices be written, and the caller holds the returned [`Logged`]
    /// until they are. A full log is checkpointed first with
    /// `make_durable` (see [`DegradedLog::checkpoint`]); the caller holds
    /// no other [`Logged`] (the checkpoint would wait for it).
    pub fn log(
        &self,
        stripe: u64,
        values: &[(usize, u64, &[u8])],
        make_durable: &dyn Fn() -> Result<()>,
    ) -> Result<Logged<'_>> {
        let encode = |generation| self.encode(stripe, values, generation);
        let (mut inner, at, len) = self.append(&encode, make_durable)?;
        // Index only once durable.
        let mut pos = 0usize;
        for &(role, first, bytes) in values {
            let payload_at = at + (pos + RECORD_HEADER_BYTES) as u64;
            for (b, value) in bytes.chunks_exact(self.block).enumerate() {
                inner.index.insert(
                    (stripe, role as u32, first as u32 + b as u32),
                    (
                        payload_at + (b * self.block) as u64,
                        crate::codec::crc32c(value),
                    ),
                );
            }
            pos += (RECORD_HEADER_BYTES + bytes.len()).next_multiple_of(8);
        }
        inner.end = at + len;
        inner.writers += 1;
        Ok(Logged { log: self })
    }

    /// The records of `values` (see [`DegradedLog::log`]) in `generation`.
    fn encode(&self, stripe: u64, values: &[(usize, u64, &[u8])], generation: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for &(role, first, bytes) in values {
            assert!(bytes.len().is_multiple_of(self.block) && !bytes.is_empty());
            assert!((bytes.len() as u64) < PAYLOAD_BYTES_MAX);
            let start = out.len();
            out.extend_from_slice(&[0u8; 4]);
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(&generation.to_le_bytes());
            out.extend_from_slice(&stripe.to_le_bytes());
            out.extend_from_slice(&(role as u32).to_le_bytes());
            out.extend_from_slice(&(first as u32).to_le_bytes());
            out.extend_from_slice(&((bytes.len() / self.block) as u32).to_le_bytes());
            out.extend_from_slice(&[0u8; 4]);
            out.extend_from_slice(bytes);
            let crc = crate::codec::crc32c(&out[start + 4..]);
            out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
            out.resize(out.len().next_multiple_of(8), 0);
        }
        out
    }

    /// The logged value of one block of a missing unit, if any: as it was
    /// logged (its checksum), from a copy of the log that holds it so. The
    /// copy read at open indexed it; a copy read now may have missed the
    /// record (a cut between the copies' writes, its writer unanswered)
    /// and hold an older generation's bytes there, or zeroes: taken for
    /// the value, they would decode a flushed block as its old content
    /// (docs/write-hole.md, "A logged value read from a copy that missed
    /// it"). No copy holding it as logged: an error, which callers take
    /// for a value not known.
    pub fn value(&self, stripe: u64, role: usize, block: u64) -> std::io::Result<Option<Vec<u8>>> {
        let inner = self.inner.lock().unwrap();
        let Some(&(at, crc)) = inner.index.get(&(stripe, role as u32, block as u32)) else {
            return Ok(None);
        };
        let mut buf = vec![0u8; self.block];
        let check = |b: &[u8]| crate::codec::crc32c(b) == crc;
        if inner.file.read_at_accepted(&mut buf, at, &check)? {
            return Ok(Some(buf));
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{}: no copy holds the logged value of stripe {stripe} unit {role} block \
                 {block} as it was logged",
                self.path.display()
            ),
        ))
    }

    /// Drops every record of `stripe`, durably (a tombstone; or a
    /// checkpoint, which drops every record, where the log is full).
    pub fn forget_stripe(&self, stripe: u64, make_durable: &dyn Fn() -> Result<()>) -> Result<()> {
        let encode = |generation: u64| {
            let mut out = Vec::with_capacity(RECORD_HEADER_BYTES);
            out.extend_from_slice(&[0u8; 8]);
            out.extend_from_slice(&generation.to_le_bytes());
            out.extend_from_slice(&stripe.to_le_bytes());
            out.extend_from_slice(&TOMBSTONE.to_le_bytes());
            out.extend_from_slice(&[0u8; 12]);
            let crc = crc32c::crc32c(&out[4..]);
            out[0..4].copy_from_slice(&crc.to_le_bytes());
            out
        };
        let (mut inner, at, len) = self.append(&encode, make_durable)?;
        inner.index.retain(|&(s, _, _), _| s != stripe);
        inner.end = at + len;
        Ok(())
    }

    /// Whether any record is held for `stripe`.
    pub fn has_stripe(&self, stripe: u64) -> bool {
        self.inner
            .lock()
            .unwrap()
            .index
            .keys()
            .any(|&(s, _, _)| s == stripe)
    }

    /// After every device is durable: starts a new generation, so no record
    /// written so far is used again. Costs a synced header write, and only
    /// when records were appended since the last one. The file keeps its
    /// length: the older records stay until appends overwrite them (open
    /// skips them by their generation, and stops at the first bytes that
    /// are not a whole record, as a torn overwrite leaves), so appends
    /// below the file's high-water mark change no length, and their sync
    /// costs no directory commit of a metadata area (two round trips per
    /// copy across the network). Until 2026-11-28 it was cut back to its
    /// header here, and every degraded write's append grew it again.
    fn end_generation_locked(inner: &mut Inner) -> std::io::Result<()> {
        if inner.end == HEADER_BYTES && inner.index.is_empty() {
            return Ok(());
        }
        let next = inner.generation + 1;
        inner.file.write_at(&header(next), 0)?;
        inner.file.sync()?;
        inner.generation = next;
        inner.end = HEADER_BYTES;
        inner.index.clear();
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }
}

impl super::Array {
    /// Data roles of `stripe` whose devices do not hold it.
    pub(super) fn missing_data_roles(&self, stripe: u64) -> Vec<usize> {
        let g = &self.geo;
        (0..g.k())
            .filter(|&r| !self.holds(g.place(stripe, r).device, stripe))
            .collect()
    }

    /// Before a degraded write of block rows `first..first+len/block` of
    /// `stripe` touches a device: logs the missing data units' values after
    /// the write (`data[role]` holds every data role's new run). Hold the
    /// result until the stripe's devices are written.
    pub(super) fn log_missing_units(
        &self,
        stripe: u64,
        first: u64,
        data: &[Vec<u8>],
    ) -> Result<Option<Logged<'_>>> {
        let rows = [(first, data)];
        self.log_missing_rows(stripe, &rows)
    }

    /// [`Array::log_missing_units`] for several runs of one stripe at once
    /// (`(first block, data)` each), in one append.
    pub(super) fn log_missing_rows<D: AsRef<[Vec<u8>]>>(
        &self,
        stripe: u64,
        runs: &[(u64, D)],
    ) -> Result<Option<Logged<'_>>> {
        let Some(log) = &self.degraded_log else {
            return Ok(None);
        };
        let mut missing = self.missing_data_roles(stripe);
        loop {
            if missing.is_empty() || runs.is_empty() {
                return Ok(None);
            }
            let values: Vec<(usize, u64, &[u8])> = runs
                .iter()
                .flat_map(|(first, data)| {
                    missing
                        .iter()
                        .map(move |&r| (r, *first, data.as_ref()[r].as_slice()))
                })
                .collect();
            let logged = log.log(stripe, &values, &|| self.make_everything_durable())?;
            // A copy of the log that missed the record is its device's
            // failure, on the superblocks before the stripe is written, as
            // for the intent map's mark (`Array::intent_begin`): left in
            // service, its copy, first in read order, was read at the next
            // open without the record, the row was not covered, and the
            // missing unit decoded from members a cut had torn (the
            // cluster simulator, seed 277285 with the row reads batched: a
            // flushed, never written block read as neither zeroes nor any
            // write).
            self.fail_broken_metadata_copies();
            // A data member failed by this append (its copy missed the
            // record, or the superblock write recording that failed it) is
            // missing too, its value in no record: logged again with the
            // others until the missing set holds still. Unlogged, the
            // writes to come (a degraded write's, a degraded replay's
            // fold) left its value in parity alone, and a cut that tore
            // them left it unknowable at the next open, which had it out
            // before the stop and took the row for covered (the cluster
            // simulator: seed 699593's stripe 27 at c165a25, where only
            // the degraded write logged again; seed 739109's stripe 26 at
            // a8b7e99, a plog replay's append failing the member of a
            // block flushed before, poisoned at the next open).
            let now = self.missing_data_roles(stripe);
            if now == missing {
                return Ok(Some(logged));
            }
            // One `Logged` at a time: a checkpoint the next append may
            // need waits for every one held.
            drop(logged);
            missing = now;
        }
    }

    /// Before a healthy write of `stripe`: records logged while it was
    /// degraded no longer describe it.
    pub(super) fn forget_degraded_records(&self, stripe: u64) -> Result<()> {
        match &self.degraded_log {
            Some(log) if log.has_stripe(stripe) => {
                log.forget_stripe(stripe, &|| self.make_everything_durable())
            }
            _ => Ok(()),
        }
    }

    /// Resync of a dirty stripe with a missing data unit: where the log
    /// holds the missing units' values for a block row, the surviving
    /// parity is recomputed from the surviving data and those values, so
    /// the missing units decode to them. Returns whether every row with a
    /// missing data unit was covered (the stripe is consistent).
    /// `torn`: per row, whether a write in flight at the stop may have torn
    /// it unlogged ([`Array::rows_torn_unlogged`]); `at_open`: the resync
    /// of an open ([`Array::resync_stripe`]).
    pub(super) fn resync_from_degraded_log(
        &self,
        stripe: u64,
        units: &[Option<Vec<u8>>],
        torn: &[bool],
        at_open: bool,
    ) -> bool {
        let g = &self.geo;
        let missing = self.missing_data_roles(stripe);
        let unlogged = vec![None; g.width()];
        let uncovered_rows = |rows: std::ops::Range<u64>| {
            for row in rows {
                let torn = torn[row as usize];
                self.note_missing_from_codeword(stripe, row, units, torn, at_open, &unlogged);
            }
        };
        let Some(log) = &self.degraded_log else {
            uncovered_rows(0..g.blocks_per_unit());
            return false;
        };
        if missing.is_empty() && units[..g.k()].iter().any(Option::is_none) {
            return self.resync_unreadable_data(stripe, units);
        }
        if missing.is_empty() {
            // Only parity is out: the data is all here, so the surviving
            // parity is recomputed from it (a later data failure decodes
            // from that parity).
            let parity = self.encode_parity(units);
            for (j, p) in parity.iter().enumerate() {
                if let Some(u) = &units[g.k() + j] {
                    if u != p {
                        crate::counters::bump(&self.counters.array.parity_mismatches);
                        self.write_unit_blocks(stripe, g.k() + j, 0, p);
                    }
                }
            }
            return true;
        }
        if !log.has_stripe(stripe) {
            uncovered_rows(0..g.blocks_per_unit());
            return false;
        }
        let block = g.block() as usize;
        let mut covered_all = true;
        for row in 0..g.blocks_per_unit() {
            let at = row as usize * block;
            let mut known: Vec<Option<Vec<u8>>> = units
                .iter()
                .map(|u| u.as_ref().map(|u| u[at..at + block].to_vec()))
                .collect();
            for (role, unit) in known.iter_mut().enumerate().take(g.k()) {
                if unit.is_none() {
                    if let Ok(Some(v)) = log.value(stripe, role, row) {
                        *unit = Some(v);
                    }
                }
            }
            let data: Vec<Vec<u8>> = if known[..g.k()].iter().all(Option::is_some) {
                known.into_iter().take(g.k()).flatten().collect()
            } else if let Some(shards) = self.decode_vouched_by_spare(&known) {
                // The log holds some missing units' values, not all: with
                // them more than k members are known, and where they are
                // one codeword the decode of the others is vouched for.
                shards.into_iter().take(g.k()).collect()
            } else {
                covered_all = false;
                // The log holds some missing units' values, not all (a
                // member lost at this open was in service at the stop), and
                // with them the members known are not one codeword: a
                // write in flight at the stop may have reached some members
                // and not others. The logged values are still what their
                // units hold, so the decode of the row from the members
                // left is checked against them: one that gives a logged
                // unit another value is refused, and the row is marked
                // (`mark_row_undecodable`). Unchecked (a device out before
                // this open keeps no entries to note them in), the members
                // left, data holding a write whose parity the cut dropped,
                // decoded both missing units as neither their old nor
                // their new bytes (the cluster simulator, seed 232517 with
                // a batched row decode: plog, one member out and logged, a
                // second lost at the open).
                let logged: Vec<Option<u32>> = (0..g.width())
                    .map(|role| {
                        (role < g.k() && units[role].is_none())
                            .then(|| known[role].as_deref().map(crc32c::crc32c))
                            .flatten()
                    })
                    .collect();
                let torn = torn[row as usize];
                self.note_missing_from_codeword(stripe, row, units, torn, at_open, &logged);
                continue;
            };
            // The missing units hold what the log says: their entries,
            // which may predate it (table pages are written at flushes),
            // follow, so their decode checks against the logged value.
            for &role in &missing {
                let place = g.place(stripe, role);
                self.note_logical_crc(
                    place.device,
                    g.checksum_index(place.row, row),
                    crate::codec::crc32c(&data[role]),
                );
            }
            let parity = self.encode_data(&data.iter().map(Vec::as_slice).collect::<Vec<_>>());
            for (j, p) in parity.iter().enumerate() {
                if let Some(u) = &units[g.k() + j] {
                    if u[at..at + block] != p[..] {
                        crate::counters::bump(&self.counters.array.parity_mismatches);
                        self.write_unit_blocks(stripe, g.k() + j, row, p);
                    }
                }
            }
        }
        covered_all
    }
}

impl super::Array {
    /// A row of a dirty stripe with a missing data unit that the
    /// degraded-write log does not cover: the missing units' entries may
    /// predate writes in flight at the stop (table pages are written at
    /// flushes), while the members left may all hold the newer value. When
    /// more than k members are left and they are one codeword, the
    /// missing units' entries follow what they decode to, as the present
    /// members' entries follow their content; otherwise the entries stay
    /// and every decode is checked against them. (The cluster simulator,
    /// seed 1079: two replicas of three held an acknowledged, unflushed
    /// write, the third was lost during the next writer's resync, and its
    /// entry from the last flush failed every read of the block.)
    ///
    /// When the members left are not one codeword (a data member holds a
    /// write in flight at the stop that parity lacks, or parity one that a
    /// data member lacks), the resync's rule still holds: data is the
    /// truth and parity follows it. The missing units' values are taken
    /// from the decode that leaves out the fewest present members and that
    /// their known entries vouch for (one answer, or none is taken), and
    /// parity is recomputed from the present data as it is and those
    /// values. Left as it was, the row decoded the missing unit from a
    /// combination that left a present data member out as "stale" and
    /// rewrote it from parity: a block already read back as the newer
    /// write went back to the older one (the cluster simulator, seed 910).
    ///
    /// With exactly k members left, see [`Array::mark_row_undecodable`]:
    /// no spare member can check a decode of the missing units, and the
    /// members may be a mix of old and new (a write in flight at the stop
    /// reached some, or tore one), which decodes to neither.
    /// Where a missing data unit's entry was unknown (its member out at the
    /// open, its table with it), such a decode was served unchecked
    /// (`unverified_decodes`) as neither its old nor its new bytes; where it
    /// was known, only until the next open, which knew it no more (the
    /// cluster simulator, shared-story seeds 322, 1603, 1169, 1653 and
    /// others). `logged`: the checksums of the missing units' values the
    /// degraded-write log holds, as [`Array::mark_row_undecodable`] takes
    /// them.
    pub(super) fn note_missing_from_codeword(
        &self,
        stripe: u64,
        row: u64,
        units: &[Option<Vec<u8>>],
        torn: bool,
        at_open: bool,
        logged: &[Option<u32>],
    ) {
        let g = &self.geo;
        let present: Vec<bool> = units.iter().map(Option::is_some).collect();
        let have = present.iter().filter(|p| **p).count();
        if have < g.k() {
            return;
        }
        let read = self.row_blocks(units, row);
        if have == g.k() {
            self.mark_row_undecodable(stripe, row, &read, &present, torn, logged);
            return;
        }
        let no_sums = vec![None; g.width()];
        if let Some((shards, true)) = self.try_decode(&read, &present, &present, &no_sums) {
            for role in (0..g.k()).filter(|&r| !present[r]) {
                let place = g.place(stripe, role);
                self.note_logical_crc(
                    place.device,
                    g.checksum_index(place.row, row),
                    crate::codec::crc32c(&shards[role]),
                );
            }
            return;
        }
        let Some(missing) = self.decode_missing_vouched(stripe, row, &read, &present, logged)
        else {
            if at_open {
                self.mark_row_unknowable(stripe, row, &read, &present);
            }
            return;
        };
        let mut data = read[..g.k()].to_vec();
        for (role, value) in missing {
            data[role] = value;
        }
        let parity = self.encode_data(&data.iter().map(Vec::as_slice).collect::<Vec<_>>());
        for (j, p) in parity.iter().enumerate() {
            if present[g.k() + j] && read[g.k() + j] != *p {
                crate::counters::bump(&self.counters.array.parity_mismatches);
                self.write_unit_blocks(stripe, g.k() + j, row, p);
            }
        }
    }

    /// A dirty stripe with every data member in service and one of them
    /// unreadable at the resync (a medium error): each row whose members
    /// read are one codeword, spare members vouching, has the unreadable
    /// blocks rewritten from it, as a read rewrites a block it decoded;
    /// other rows are left to the checked decode of later reads. Returns
    /// whether every row was. (Parity was recomputed from the data units
    /// read, the unreadable one taken for present: a panic.)
    fn resync_unreadable_data(&self, stripe: u64, units: &[Option<Vec<u8>>]) -> bool {
        let g = &self.geo;
        let present: Vec<bool> = units.iter().map(Option::is_some).collect();
        let mut all = true;
        for row in 0..g.blocks_per_unit() {
            match self.one_codeword_row(units, row) {
                Some(shards) => {
                    for role in (0..g.k()).filter(|&r| !present[r]) {
                        self.write_unit_blocks(stripe, role, row, &shards[role]);
                    }
                }
                _ => all = false,
            }
        }
        all
    }

    /// A row of a dirty stripe with exactly k members left: nothing spare
    /// checks it but the entries of its missing data members. The present
    /// parity's blocks of the row are marked unreadable (their entry the
    /// complement of their checksum, as a rebuild marks a block it could
    /// not decode), durably with the tables, so the missing blocks read as
    /// I/O errors until a write of the row recomputes its parity, when
    /// either
    /// - a missing member's known entry refuses the decode (the members
    ///   disagree after the stop, or the entry predates a write in flight):
    ///   this open's reads fail already ([`Array::decode_checked`]), but
    ///   the next open, with those members out and their tables gone with
    ///   them, decoded the row from exactly k members unchecked and served
    ///   the guess (cluster simulator seed 1653: a block neither its old
    ///   nor its new bytes after a rebuild wrote parity from that decode);
    /// - or the row may be `torn` by a write in flight at the stop that
    ///   nothing logged ([`Array::rows_torn_unlogged`]: a missing member
    ///   was in service then, and a member left changed since the last
    ///   flush) and the missing members' entries are not all known and
    ///   vouching: the k members left may mix the write's old and new
    ///   units, which decode to neither (cluster simulator seeds 322, 767,
    ///   4863: a power cut of every server, two members not reached at the
    ///   next open, their tables with them, and the guess served
    ///   unchecked).
    ///
    /// `read`: the row's blocks, `present`: the members left, `logged`:
    /// per role, the checksum of the value the degraded-write log holds
    /// for a missing data unit (None elsewhere), taken where the unit's
    /// entry is unknown.
    fn mark_row_undecodable(
        &self,
        stripe: u64,
        row: u64,
        read: &[Vec<u8>],
        present: &[bool],
        torn: bool,
        logged: &[Option<u32>],
    ) {
        let g = &self.geo;
        let mut expected = vec![None; g.width()];
        let mut known_all = true;
        for role in (0..g.k()).filter(|&r| !present[r]) {
            let place = g.place(stripe, role);
            expected[role] = self
                .expected_crc(place.device, stripe, g.checksum_index(place.row, row))
                .or(logged[role]);
            known_all &= expected[role].is_some();
        }
        let any_known = expected.iter().any(Option::is_some);
        if !any_known && !torn {
            // Nothing to check the row against, and nothing to suspect.
            return;
        }
        let decode = self.try_decode(read, present, present, &expected);
        let refused = any_known && decode.is_none();
        let vouched = known_all && matches!(decode, Some((_, true)));
        if !refused && (!torn || vouched) {
            return;
        }
        self.mark_present_parity_unreadable(stripe, row, read, present);
        self.warn(format!(
            "stripe {stripe} block row {row}: the {} members left cannot vouch for its missing \
             data ({}; an unclean stop, then members lost before resync: docs/write-hole.md, \
             \"The double fault\"); its parity there is marked unreadable, and the missing \
             blocks read as I/O errors until rewritten",
            g.k(),
            if refused {
                "they decode it to values its recorded checksums refuse"
            } else {
                "a write was in flight there at the stop, and nothing logged it"
            }
        ));
    }

    /// A row of a dirty stripe with more than k members left that are not
    /// one codeword, and no decode of its missing data units that their
    /// known entries vouch for (`decode_missing_vouched`): the members left
    /// disagree after the stop (a write in flight reached some of them, a
    /// journal record one parity member folded and the other lost), and
    /// which of them is stale cannot be told, so the missing units cannot
    /// be known. This open's reads of them fail already (no combination is
    /// vouched for), but only while a spare member is left: once a second
    /// member is lost (a frame, a server), or at the next open with the
    /// missing members out before it and their tables gone with them,
    /// exactly k members remain, one of them perhaps the stale one, and
    /// their decode was served unchecked as neither the old nor the new
    /// bytes (the cluster simulator, shared-story seed 22012: plog, a
    /// power cut of every server with a write in flight, one member not
    /// reached at the next open, whose degraded replay folded the record
    /// of one parity member and not the other's, lost at the cut; a second
    /// member lost during that open; the open after decoded the first
    /// member's never-written block from the two parities that disagree).
    /// So the present parity of the row is marked unreadable, as
    /// [`Array::mark_row_undecodable`] does with exactly k left: the
    /// missing blocks read as I/O errors at every later open too, until a
    /// write of the row recomputes its parity. Nothing readable is lost:
    /// every present member reads as it is, and a decode from k of these
    /// members that leaves out a present member gives that member a value
    /// other than its own (they are not one codeword), so it was refused
    /// wherever its entry was known and wrong wherever not. With k = 1
    /// (replication) each member is a whole copy, an old or a new write
    /// of the block, and a decode from it is never a mix: nothing marked.
    ///
    /// Only at the resync of an open (`at_open` of
    /// [`Array::resync_stripe`]): a stripe resynchronised while serving,
    /// after a journal append failed with a data member out, is not one
    /// codeword because the parity whose append failed lacks the write
    /// (the other parity folded it), and a decode without that parity is
    /// right: marked, a block the k members left decoded right read as an
    /// I/O error (the cluster simulator, seed 678, parix).
    fn mark_row_unknowable(&self, stripe: u64, row: u64, read: &[Vec<u8>], present: &[bool]) {
        let g = &self.geo;
        if g.k() < 2 {
            return;
        }
        self.mark_present_parity_unreadable(stripe, row, read, present);
        self.warn(format!(
            "stripe {stripe} block row {row}: the {} members left are not one codeword and \
             nothing vouches for a decode of its missing data (an unclean stop, then a member \
             lost before resync: docs/write-hole.md, \"The double fault\"); its parity there is \
             marked unreadable, and the missing blocks read as I/O errors until rewritten",
            present.iter().filter(|p| **p).count()
        ));
    }

    /// A row whose missing data units nothing can tell (the double fault):
    /// their blocks are poisoned ([`super::poison`]), and the row's present
    /// parity is recomputed from the present data and a placeholder
    /// (zeroes) for each of them, so the row is one codeword again and a
    /// member lost later decodes right; the missing blocks read as I/O
    /// errors until written. Where that cannot be done (no degraded-write
    /// log, a data member present but unreadable, the list full or
    /// failing), the present parity blocks are marked unreadable instead
    /// (their entry the complement of their checksum, as a rebuild marks a
    /// block it could not decode), written with the tables at the next
    /// flush: the missing blocks read as I/O errors too, but the row keeps
    /// no redundancy until a write of it replaces the marks.
    pub(super) fn mark_present_parity_unreadable(
        &self,
        stripe: u64,
        row: u64,
        read: &[Vec<u8>],
        present: &[bool],
    ) {
        if self.poison_row(stripe, row, read, present) {
            return;
        }
        let g = &self.geo;
        for role in (g.k()..g.width()).filter(|&r| present[r]) {
            let place = g.place(stripe, role);
            let crc = crate::codec::crc32c(&read[role]);
            self.stores[place.device].set_checksum(g.checksum_index(place.row, row), !crc);
        }
    }

    /// [`Array::mark_present_parity_unreadable`]'s poison: the list first
    /// (durable), then the placeholder's values in the degraded-write log
    /// (synced: a cut before the parity is written leaves the resync to
    /// recompute it from them), then the parity. Returns whether it was
    /// done. Not under replication (k = 1): each copy left is a whole
    /// copy of the block, kept as it is (the marks make it unread), where
    /// a placeholder would overwrite it.
    fn poison_row(&self, stripe: u64, row: u64, read: &[Vec<u8>], present: &[bool]) -> bool {
        let g = &self.geo;
        let missing: Vec<usize> = (0..g.k()).filter(|&r| !present[r]).collect();
        let Some(log) = &self.degraded_log else {
            return false;
        };
        // A missing unit whose value the log holds (a degraded write
        // logged it before the stop) is known, and keeps that value: only
        // the others are poisoned. Where the log holds every missing
        // unit's value, nothing is: the resync that follows a degraded
        // replay recomputes the row's parity from them, replacing the
        // marks (poisoned, the logged value was lost to the placeholder:
        // `tests/powerloss.rs`, plog seed 12000051, a block written while
        // its member was out read as an I/O error). Where it held some and
        // not others, the marks stayed, and the simulator's seed 664700
        // lost a row's flushed blocks to a member lost later.
        if g.k() < 2
            || missing.is_empty()
            || missing
                .iter()
                .any(|&r| self.holds(g.place(stripe, r).device, stripe))
        {
            return false;
        }
        let Ok(logged) = missing
            .iter()
            .map(|&r| log.value(stripe, r, row))
            .collect::<std::io::Result<Vec<Option<Vec<u8>>>>>()
        else {
            return false;
        };
        if logged.iter().all(Option::is_some) {
            return false;
        }
        let unknown: Vec<usize> = missing
            .iter()
            .zip(&logged)
            .filter(|(_, v)| v.is_none())
            .map(|(&r, _)| r)
            .collect();
        // A member in service at the stop and missing at this open (before
        // any client write) holds the block as the stop left it: marked,
        // its re-add may take that block back where its own checksum
        // vouches for it (`poison.rs`).
        let opening = !self.serving.load(std::sync::atomic::Ordering::SeqCst);
        let entries: Vec<(super::poison::Entry, bool)> = unknown
            .iter()
            .map(|&r| {
                let d = g.place(stripe, r).device;
                let held = opening && self.active_before_open[d] && self.stores[d].is_failed();
                ((stripe, r as u32, row as u32), held)
            })
            .collect();
        if let Err(e) = self.poison.add(&entries) {
            self.warn(format!(
                "stripe {stripe} block row {row}: {e}; its parity is marked unreadable instead"
            ));
            return false;
        }
        // A re-add reconstructs the missing units here (the placeholder),
        // never keeping a stale block the parity no longer describes.
        if let Err(e) = self
            .intent
            .mark_missed_stripes(Some(&std::collections::BTreeSet::from([stripe])))
        {
            self.warn(format!(
                "stripe {stripe}: recording it in the missed-write map: {e}"
            ));
        }
        let block = g.block() as usize;
        let mut data: Vec<Vec<u8>> = read[..g.k()].to_vec();
        for (&r, v) in missing.iter().zip(&logged) {
            data[r] = match v {
                Some(v) => v.clone(),
                None => vec![0u8; block],
            };
        }
        let _logged = match self.log_missing_rows(stripe, &[(row, &data[..])]) {
            Ok(logged) => logged,
            Err(e) => {
                self.warn(format!(
                    "stripe {stripe} block row {row}: logging its placeholder: {e}; its parity \
                     is marked unreadable too"
                ));
                return false;
            }
        };
        let parity = self.encode_data(&data.iter().map(Vec::as_slice).collect::<Vec<_>>());
        for (j, p) in parity.iter().enumerate() {
            if present[g.k() + j] {
                self.write_unit_blocks(stripe, g.k() + j, row, p);
            }
        }
        for &r in &missing {
            let place = g.place(stripe, r);
            let crc = crate::codec::crc32c(&data[r]);
            self.note_logical_crc(place.device, g.checksum_index(place.row, row), crc);
        }
        self.counters
            .array
            .add(&self.counters.array.poisoned_blocks, unknown.len() as u64);
        self.warn(format!(
            "stripe {stripe} block row {row}: the blocks of units {unknown:?} there are \
             poisoned (unknowable after an unclean stop and a member lost before resync: \
             docs/write-hole.md); they read as I/O errors until written, and the row's parity \
             is recomputed around them so its other blocks keep their redundancy"
        ));
        true
    }

    /// A whole-stripe discard while degraded: the missing data units will
    /// read as zeroes, logged first like any degraded write.
    pub(super) fn log_discarded_missing_units(&self, stripe: u64) -> Result<Option<Logged<'_>>> {
        if self.missing_data_roles(stripe).is_empty() {
            return self.forget_degraded_records(stripe).map(|()| None);
        }
        let unit = self.geo.unit_bytes() as usize;
        let zeroes = vec![vec![0u8; unit]; self.geo.k()];
        self.log_missing_units(stripe, 0, &zeroes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::PowerLossStorage;
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

    /// A simulated folder `/a` and the log's path in it.
    fn scratch() -> (PowerLossStorage, Arc<dyn Storage>, &'static Path) {
        let sim = PowerLossStorage::new();
        let storage = sim.shared();
        storage.create_dir_all(Path::new("/a")).unwrap();
        (sim, storage, Path::new("/a/degraded.log"))
    }

    /// The devices are in memory here: nothing to sync.
    fn durable() -> Result<()> {
        Ok(())
    }

    /// Issue 18 item 3: the log held every degraded write since the last
    /// flush, so a writer that did not flush filled its space and got
    /// ENOSPC. Now an append past the bound checkpoints the log (devices
    /// synced, records dropped) and goes on: writes wait, never fail.
    #[test]
    fn appends_past_the_bound_checkpoint_the_log_and_never_fail() {
        let (sim, storage, path) = scratch();
        let bytes_max = 64 << 10;
        let (log, _) = DegradedLog::open(Arc::clone(&storage), path, 4096, bytes_max).unwrap();
        let checkpoints = AtomicU32::new(0);
        let count = || {
            checkpoints.fetch_add(1, SeqCst);
            Ok(())
        };
        let v = vec![5u8; 8192];
        for stripe in 0..100u64 {
            drop(log.log(stripe, &[(0, 0, &v), (1, 2, &v)], &count).unwrap());
            assert!(log.lock().file.len().unwrap() <= bytes_max);
            assert!(log.has_stripe(stripe), "the new records are kept");
        }
        // 100 appends of 16,464 bytes, 3 to a 64 KiB log.
        assert_eq!(checkpoints.load(SeqCst), 33);
        assert!(
            !log.has_stripe(98),
            "the last checkpoint dropped the records before 99"
        );
        log.forget_stripe(99, &count).unwrap();
        drop(log.log(200, &[(0, 0, &v)], &count).unwrap());
        assert_eq!(checkpoints.load(SeqCst), 33);
        // What the log holds since the last checkpoint survives a cut.
        drop(log);
        sim.crash(3);
        let (log, _) = DegradedLog::open(storage, path, 4096, bytes_max).unwrap();
        assert!(log.has_stripe(200) && !log.has_stripe(99) && !log.has_stripe(98));
    }

    /// A checkpoint drops records only once no stripe write that logged
    /// them is still under way: it waits for every [`Logged`].
    #[test]
    fn a_checkpoint_waits_for_the_stripe_writes_whose_records_it_drops() {
        let (_sim, storage, path) = scratch();
        let (log, _) = DegradedLog::open(storage, path, 4096, 1 << 20).unwrap();
        let synced = std::sync::atomic::AtomicBool::new(false);
        let writing = log.log(1, &[(0, 0, &[1u8; 4096])], &durable).unwrap();
        std::thread::scope(|s| {
            let checkpoint = s.spawn(|| {
                log.checkpoint(&|| {
                    synced.store(true, SeqCst);
                    Ok(())
                })
            });
            // Give the checkpoint every chance to run early: it must not.
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!synced.load(SeqCst), "synced before the write was done");
            assert!(log.has_stripe(1));
            drop(writing);
            checkpoint.join().unwrap().unwrap();
        });
        assert!(synced.load(SeqCst) && !log.has_stripe(1));
    }

    #[test]
    fn logged_values_are_found_until_the_generation_ends_and_survive_a_reopen() {
        let (sim, storage, path) = scratch();
        let (log, intact) = DegradedLog::open(Arc::clone(&storage), path, 4096, 1 << 20).unwrap();
        assert!(intact);
        let v = vec![7u8; 8192];
        drop(log.log(3, &[(1, 2, &v)], &durable).unwrap());
        assert_eq!(log.value(3, 1, 3).unwrap().unwrap(), vec![7u8; 4096]);
        assert!(log.value(3, 1, 4).unwrap().is_none());
        drop(log);
        sim.crash(9);
        let (log, _) = DegradedLog::open(Arc::clone(&storage), path, 4096, 1 << 20).unwrap();
        assert_eq!(log.value(3, 1, 2).unwrap().unwrap(), vec![7u8; 4096]);
        log.checkpoint(&durable).unwrap();
        assert!(log.value(3, 1, 2).unwrap().is_none());
        drop(log);
        sim.crash(10);
        let (log, _) = DegradedLog::open(storage, path, 4096, 1 << 20).unwrap();
        assert!(
            !log.has_stripe(3),
            "records of an ended generation are ignored"
        );
    }

    /// Found while writing the `degraded_log` fuzz target (confirmed with
    /// it): a record whose blocks run past u32::MAX overflowed the block
    /// number at open; it now ends the log like any invalid record.
    #[test]
    fn a_record_whose_blocks_run_past_u32_max_ends_the_log() {
        let (_sim, storage, path) = scratch();
        let (log, _) = DegradedLog::open(Arc::clone(&storage), path, 8, 1 << 20).unwrap();
        drop(log.log(3, &[(1, 0, &[7u8; 16])], &durable).unwrap());
        drop(log);
        let mut bytes = read_all(storage.as_ref(), path).unwrap();
        let at = HEADER_BYTES as usize;
        bytes[at + 28..at + 32].copy_from_slice(&u32::MAX.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[at + 4..at + 56]);
        bytes[at..at + 4].copy_from_slice(&crc.to_le_bytes());
        write_atomic(storage.as_ref(), path, &bytes).unwrap();
        let (log, intact) = DegradedLog::open(storage, path, 8, 1 << 20).unwrap();
        assert!(intact && !log.has_stripe(3));
    }
}
