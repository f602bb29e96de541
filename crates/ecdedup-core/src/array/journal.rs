//! The parity journal: one append-only file per device, holding the partial
//! writes of stripes for which that device holds a parity unit, until replay
//! folds them into the parity (paper 004).
//!
//! - `plog` (classic parity logging) appends the parity delta
//!   `a_ji * (d_new - d_old)` for the device's parity role j.
//! - `parix` appends data values: the new value d(r) of every written block,
//!   and the original d(0) once, the first time a block is written after
//!   its parity was last materialised. Replay applies Eq. 3 of the paper:
//!   `p_j = p_j + a_ji * (d(r) - d(0))`.
//! - An invalidation mark drops everything logged for a stripe whose parity
//!   was rewritten from its data (full-stripe or reconstruct-write).
//!
//! Record (little endian), header 32 bytes, then the payload:
//! ```text
//! 0   u32 CRC32C of bytes 4..32+payload
//! 4   u8  kind: 1 data value d(r), 2 original d(0), 3 parity delta, 4 invalidate
//! 5   u8  for an invalidation, 1 when appended after its fold's parity write
//! 6   u16 role (data role for 1 and 2, parity role for 3)
//! 8   u64 stripe
//! 16  u32 first block (in the unit)
//! 20  u32 block count
//! 24  u32 payload bytes (= count * 4096, and for a data value or a
//!         parity delta of version 4 its rows' bases after them; for
//!         invalidate 0, or the parity rows' CRC32C after the write it
//!         goes with, version 3)
//! 28  u32 CRC32C of bytes 4..28 (the header alone; version 2 files)
//! ```
//! The file starts with a 32-byte header (magic `ECDDPJ01`, u32 version 4,
//! CRC32C at 28). Records start at multiples of 32 bytes. A data value
//! d(r) or a parity delta of version 4 carries, after its blocks, each
//! row's base: the CRC32C of the journal's parity block of that row when
//! the record was appended (u32), then u32 1 where it was known and 0
//! where not, padded with zeroes to a multiple of 32 bytes. Records of a
//! row that share one known base tell, at open, whether the parity block
//! holds them (it is their base with them folded in) or not (it is their
//! base) where the checksum table cannot ([`ParityJournal::row_base`]).
//! An invalidation
//! of version 3 may carry, as its payload, the CRC32C of each parity row
//! it ends as the fold (or write) it goes with left it (u32 each, the
//! payload padded with zeroes to a multiple of 32 bytes): found past the
//! synced length at open, it tells whether that parity write landed
//! without the checksum table, whose pages a flush writes before the
//! devices' syncs ([`ParityJournal::deferred_mark_crcs`]).
//!
//! Open reads every record. A record whose payload fails its checksum but
//! whose header checksum holds is skipped and its stripe reported lost; a
//! record whose header is unreadable is skipped up to the next valid record
//! (found at a 32-byte step) and the journal reported as having lost records
//! of unknown stripes. Whatever cannot be parsed at the end (a torn append)
//! is cut, and reported the same way. The array resynchronises what was
//! reported (`LostRecords`), so no acknowledged write depends on a record
//! that was dropped.
//!
//! Compaction (`compact`) rewrites the records the index still needs into
//! `PATH.compact`, syncs it, renames it over the journal and syncs the
//! folder: a crash leaves either the old file or the new one, each holding
//! the same live records (a leftover `.compact` file is removed at open).
//!
//! A journal in a file of its own (format 1: the array folder) keeps its
//! synced length beside it, in `PATH.synced` ([`SyncedRecord`]): written
//! and synced after every sync of the journal, so that an open can tell
//! the records appended after the journal's last sync (after the array's
//! last flush) from the flushed ones, as a metadata area's directory tells
//! them in format 2 ([`StorageFile::synced_len`]).
//!
//! The in-RAM index maps each logged block to where its d(0) and latest d(r)
//! (or its list of deltas) sit, so replay reads two records per block
//! instead of scanning the file.

use crate::counters::IoClass;
use crate::error::{Error, Result};
use crate::media::storage::{parent_of, read_all, OsStorage, PlacedWrite, Storage, StorageFile};
use crate::media::{Device, DeviceIo, WriteHint};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

const MAGIC: [u8; 8] = *b"ECDDPJ01";
/// Version 1 files carry no header checksum in their records; version 2
/// no parity checksums in their invalidation marks; version 3 no bases in
/// their data values and parity deltas (each read, and written without
/// them, until the file is emptied or compacted).
const VERSION: u32 = 4;
pub const HEADER_BYTES: u64 = 32;
const RECORD_HEADER_BYTES: usize = 32;
const BLOCK: usize = 4096;
/// Bytes a compaction writes at once.
const COMPACT_WRITE_BYTES: usize = 4 << 20;
/// Ids of journals opened by this process.
static NEXT_JOURNAL_ID: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Value = 1,
    Original = 2,
    Delta = 3,
    Invalidate = 4,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        match b {
            1 => Some(Kind::Value),
            2 => Some(Kind::Original),
            3 => Some(Kind::Delta),
            4 => Some(Kind::Invalidate),
            _ => None,
        }
    }
}

/// What is logged for one block of one role in one stripe.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockLog {
    /// File offset of the block's d(0) bytes (parix).
    pub original: Option<u64>,
    /// File offset of the block's latest d(r) bytes (parix).
    pub latest: Option<u64>,
    /// File offsets of parity deltas, in order (plog).
    pub deltas: Vec<u64>,
    /// The base of the latest d(r) (the parity block's CRC32C when it was
    /// appended), where its record carries a known one (version 4).
    pub latest_base: Option<u32>,
    /// The base of each delta of `deltas`, as `latest_base`.
    pub delta_bases: Vec<Option<u32>>,
}

/// Everything logged for one stripe: (role, block) → log. Ordered, so
/// that a replay reads and folds a stripe's records in the same order in
/// every process: a `HashMap`'s order is drawn per process, and the
/// replay's batched journal reads then went out in a different order each
/// run (the cluster simulator's seed 26547 replayed differently each
/// time: docs/write-hole.md).
pub type StripeLog = BTreeMap<(u16, u32), BlockLog>;

/// Where a logged block lies on a device: (device offset, bytes) runs, in
/// the block's order.
pub type DeviceRuns = Vec<(u64, usize)>;

/// Logged blocks placed: the device they lie on, and each one's runs.
pub type PlacedBlocks = (Arc<dyn Device>, Vec<DeviceRuns>);

/// Per block row of a stripe, the parity checksums carried by the marks
/// past the synced length at open that end the row, in the order they
/// were appended: `None` for a mark without them (version 2, or a mark
/// whose parity was not known).
pub type DeferredCrcs = BTreeMap<u32, Vec<Option<u32>>>;

/// The journal blocks of a stripe's log, in the log's order: d(0) and d(r)
/// of each parix entry, the deltas of each plog one; a torn entry (one of
/// d(0), d(r) without the other) has none. What a replay reads.
pub fn logged_blocks(log: &StripeLog) -> Vec<u64> {
    log.values()
        .flat_map(|e| match (e.original, e.latest) {
            (Some(o), Some(l)) => vec![o, l],
            (None, None) => e.deltas.clone(),
            _ => Vec::new(),
        })
        .collect()
}

/// Records that open could not use: their stripes' parity must be
/// recomputed from data, since what they logged is gone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LostRecords {
    /// Stripes named by a record whose payload was bad.
    pub stripes: BTreeSet<u64>,
    /// A record was unreadable down to its header: any stripe of the
    /// journal's may have lost records.
    pub unknown_stripes: bool,
}

impl LostRecords {
    pub fn is_empty(&self) -> bool {
        self.stripes.is_empty() && !self.unknown_stripes
    }
}

/// Fault injection for tests: the journal file's I/O fails on demand.
#[derive(Default)]
pub struct FaultHooks {
    /// Appends write half their bytes, then fail with ENOSPC.
    pub fail_appends: AtomicBool,
    /// Reads of logged blocks fail with EIO.
    pub fail_reads: AtomicBool,
    /// Preallocation fails with ENOSPC.
    pub fail_preallocate: AtomicBool,
    /// Syncs fail with EIO (and are latched).
    pub fail_syncs: AtomicBool,
}

#[cfg(test)]
thread_local! {
    /// Tests: every preallocation on this thread fails with ENOSPC (for
    /// journals opened inside `Array::open`, before their hooks exist).
    pub static FAIL_PREALLOCATE_ON_THIS_THREAD: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

pub struct ParityJournal {
    storage: Arc<dyn Storage>,
    file: Arc<dyn StorageFile>,
    /// The error of a failed sync: from then on the journal takes no
    /// append and is never synced again (Linux forgets a failed fsync, so
    /// a later one would report success for records that are gone).
    latched: Option<String>,
    path: PathBuf,
    /// Where the next append goes: past every append begun, finished or
    /// not.
    end: u64,
    /// Where each append begun ([`ParityJournal::begin_append`]) and
    /// not finished begins: while any is in flight the file is neither
    /// cut, emptied nor compacted, and a sync covers the bytes below the
    /// first of them (those above may not have reached the file).
    in_flight_at: BTreeSet<u64>,
    /// Where each invalidation mark appended before its parity write (a
    /// whole-stripe write's, a discard's) begins, until the caller's
    /// writes that the mark stands for are answered
    /// ([`ParityJournal::append_held`], [`ParityJournal::release_mark`]):
    /// a sync covers no byte from the first of them on, as it covers none
    /// of an append in flight. Made durable and counted synced before its
    /// parity write, a mark outlived a cut that dropped that write and
    /// ended for good the records the parity as it was lacked (the cluster
    /// simulator's seed 1767634: the failure of the other parity's device
    /// synced every device between the marks' appends and the parity
    /// writes); past the synced length at open, the mark is weighed
    /// against the parity block ([`ParityJournal::deferred_rows`]).
    held_marks: BTreeSet<u64>,
    /// A journal in a file of its own (format 1): the record of its synced
    /// length beside it. None where the storage tells it (format 2).
    synced_record: Option<SyncedRecord>,
    /// Bumped when the file is emptied or replaced: a [`FlushPoint`]
    /// taken before says nothing of it.
    file_epoch: u64,
    /// Tells this journal's appends from those of a journal it replaced.
    id: u64,
    index: HashMap<u64, StripeLog>,
    /// Per stripe whose journal held a fold's invalidation mark past the
    /// synced length at open: its log as if those marks had not been
    /// appended, and the rows they end ([`ParityJournal::deferred_rows`]).
    /// Dropped (the marks stand) by a compaction, a reset, or
    /// [`ParityJournal::settle_all_deferred`].
    deferred: HashMap<u64, (StripeLog, BTreeSet<u32>)>,
    /// Of `deferred`'s rows, those a mark appended before its parity write
    /// ends (a whole-stripe write's, a discard's, a resync's).
    deferred_before_parity: HashMap<u64, BTreeSet<u32>>,
    /// Of `deferred`'s stripes, the parity checksums their marks carry
    /// ([`ParityJournal::deferred_mark_crcs`]).
    deferred_crcs: HashMap<u64, DeferredCrcs>,
    /// Per stripe, the block rows that a record found at open and still
    /// indexed lies past the file's synced length for: appended after the
    /// journal's last sync before the stop (so after the array's last
    /// flush, which syncs every journal), found only through the length
    /// hints of a metadata area. Empty where the storage cannot tell
    /// ([`StorageFile::synced_len`]: a journal in a file of its own).
    unsynced_at_open: HashMap<u64, BTreeSet<u32>>,
    records: u64,
    /// Whether the header checksum of records is written and checked.
    header_crc: bool,
    /// The version the file's records are written in: marks carry their
    /// parity rows' checksums from version 3 on, data values and parity
    /// deltas their rows' bases from version 4 on (an older file takes
    /// them only once emptied or compacted, so that a binary of its
    /// version still reads it).
    version: u32,
    /// Whether disk space up to the bound is reserved (preallocated).
    reserved: bool,
    lost: LostRecords,
    faults: FaultHooks,
}

/// What a sync of a format 1 journal's file makes durable of it
/// ([`ParityJournal::flush_point`]).
#[derive(Clone, Copy, Debug)]
pub struct FlushPoint {
    journal: u64,
    file_epoch: u64,
    len: u64,
}

/// A mark appended before the writes it stands for, held out of every
/// sync until given back ([`ParityJournal::append_held`]).
#[derive(Debug)]
#[must_use = "a hold never given back keeps every later record from being counted synced"]
pub struct MarkHold {
    journal: u64,
    file_epoch: u64,
    offset: u64,
}

/// What a device's sync makes durable of a journal on it
/// ([`ParityJournal::sync_point`]).
#[derive(Clone)]
pub struct JournalSyncPoint {
    /// The journal's file when the point was taken.
    file: Arc<dyn StorageFile>,
    /// Its epoch then: emptied since (a reset keeps the file), the point
    /// speaks of bytes it no longer holds.
    file_epoch: u64,
    point: crate::media::storage::SyncPoint,
}

/// Whether two handles are the same open file (compared by address: the
/// vtables of two `Arc<dyn _>` of one object may differ across codegen
/// units).
fn same_file(a: &Arc<dyn StorageFile>, b: &Arc<dyn StorageFile>) -> bool {
    std::ptr::eq(Arc::as_ptr(a).cast::<u8>(), Arc::as_ptr(b).cast::<u8>())
}

/// An append begun and not yet finished: its records and where they go.
pub struct JournalWrite {
    /// The journal it was begun on ([`ParityJournal`]'s `id`).
    journal: u64,
    records: Vec<u8>,
    /// File offset of the first record.
    offset: u64,
    target: Target,
}

/// Where an append's bytes are written.
enum Target {
    /// On the device of the metadata area the journal lives in (format
    /// 2): beside the data writes of the same batch.
    Placed(PlacedWrite, Synchronous),
    /// The journal's own file (format 1), as a device of one file.
    File(OwnFile),
}

impl JournalWrite {
    /// The device writes that put the records (and, in a metadata area,
    /// the file's length hint) in place. They run on the calling thread
    /// (`pwrite`), first in their batch, not through its io_uring
    /// submission: the records are not 4 KiB-aligned, so they go through
    /// the page cache, and io_uring hands such writes to a worker thread
    /// (ext4 cannot take them without blocking), which cost 1.32x the
    /// server CPU per write of the synchronous `pwrite` (docs/benchmarks.md,
    /// "Where the CPU goes").
    ///
    /// In a metadata area the runs and the hint are one operation
    /// ([`crate::media::Op::Append`]), written in that order: on a chunk
    /// across the network one `LogAppend` message, not one per write.
    pub fn device_ios(&self) -> Vec<DeviceIo<'_>> {
        let hint = WriteHint::new(IoClass::Journal);
        match &self.target {
            Target::Placed(p, dev) => {
                let mut writes = Vec::with_capacity(p.runs.len() + 1);
                let mut done = 0usize;
                for &(at, n) in &p.runs {
                    writes.push((at, &self.records[done..done + n]));
                    done += n;
                }
                if let Some((at, h)) = &p.hint {
                    writes.push((*at, &h[..]));
                }
                let op = crate::media::Op::Append {
                    writes,
                    hint,
                    fua: false,
                };
                vec![DeviceIo { dev, op }]
            }
            Target::File(f) => vec![DeviceIo {
                dev: f,
                op: crate::media::Op::Write {
                    buf: &self.records[..],
                    offset: self.offset,
                    hint,
                    fua: false,
                },
            }],
        }
    }

    /// Bytes of records.
    pub fn record_bytes(&self) -> usize {
        self.records.len()
    }
}

/// The device of a metadata area, whose writes a batch runs on the
/// calling thread: it offers no descriptors for the ring
/// ([`Device::ring_file`] is None).
struct Synchronous(Arc<dyn Device>);

impl Device for Synchronous {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn write_hinted(&self, buf: &[u8], offset: u64, hint: WriteHint) -> std::io::Result<()> {
        self.0.write_hinted(buf, offset, hint)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.0.sync()
    }
    fn write_fua(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_fua(buf, offset)
    }
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
    /// A chunk across the network keeps its link: the append leaves with
    /// the batch's other remote writes (one round trip), as only the
    /// io_uring path is what this wrapper keeps off.
    fn link(&self) -> Option<&dyn crate::media::ChunkLink> {
        self.0.link()
    }
}

/// A file of its own seen as a device, so that a batch writes it (on the
/// calling thread, as [`Synchronous`]).
struct OwnFile(Arc<dyn StorageFile>);

impl Device for OwnFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.0.sync()
    }
    fn size(&self) -> u64 {
        self.0.len().unwrap_or(0)
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
}

fn header() -> [u8; HEADER_BYTES as usize] {
    header_version(VERSION)
}

fn header_version(version: u32) -> [u8; HEADER_BYTES as usize] {
    let mut h = [0u8; HEADER_BYTES as usize];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..].copy_from_slice(&crc.to_le_bytes());
    h
}

fn seal(out: &mut [u8]) {
    let hcrc = crc32c::crc32c(&out[4..28]);
    out[28..32].copy_from_slice(&hcrc.to_le_bytes());
    // The payload's CRC (4 KiB and more a record) by ISA-L; same values.
    let crc = crate::codec::crc32c(&out[4..]);
    out[0..4].copy_from_slice(&crc.to_le_bytes());
}

/// Encodes a mark that drops what is logged for blocks
/// `[first_block, first_block+count)` of every role of a stripe.
pub fn encode_invalidate(out: &mut Vec<u8>, stripe: u64, first_block: u32, count: u32) {
    encode_mark(out, stripe, first_block, count, Mark::BeforeParity);
}

/// Where an invalidation stands against the parity write it goes with
/// (byte 5 of its header, docs/format.md).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mark {
    /// Appended before the parity is written, or with no parity write of
    /// its own (a whole-stripe write, a discard, a resync).
    BeforeParity,
    /// Appended after the parity write of the fold that took in the
    /// records it ends (a replay): found past the journal's synced length
    /// at open, it may have outlived that write ([`ParityJournal::deferred_rows`]).
    AfterFold,
}

/// [`encode_invalidate`], saying where the mark stands.
pub fn encode_mark(out: &mut Vec<u8>, stripe: u64, first_block: u32, count: u32, mark: Mark) {
    encode_mark_with_crcs(out, stripe, first_block, count, mark, &[]);
}

/// The payload bytes of a mark carrying the CRC32C of `count` parity rows:
/// 4 a row, padded to a multiple of 32 (records start at such offsets).
fn mark_crcs_bytes(count: u32) -> u64 {
    row_fields_bytes(count, 4)
}

/// `bytes` a row of `count` rows, padded to a multiple of 32 (records
/// start at such offsets).
fn row_fields_bytes(count: u32, bytes: u64) -> u64 {
    (u64::from(count) * bytes).next_multiple_of(RECORD_HEADER_BYTES as u64)
}

/// Puts a record's header (its checksums zero, for `seal`) in `out`.
fn put_header(
    out: &mut Vec<u8>,
    kind: Kind,
    flag: u8,
    role: u16,
    (stripe, first, count): (u64, u32, u32),
    payload: usize,
) {
    out.extend_from_slice(&[0; 4]);
    out.push(kind as u8);
    out.push(flag);
    out.extend_from_slice(&role.to_le_bytes());
    out.extend_from_slice(&stripe.to_le_bytes());
    out.extend_from_slice(&first.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&(payload as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
}

/// [`encode_mark`], carrying `crcs` (empty, or one per row ended): the
/// CRC32C of each parity row after the write the mark goes with (a
/// version 3 journal; docs/format.md).
pub fn encode_mark_with_crcs(
    out: &mut Vec<u8>,
    stripe: u64,
    first_block: u32,
    count: u32,
    mark: Mark,
    crcs: &[u32],
) {
    assert!(crcs.is_empty() || crcs.len() == count as usize);
    let payload = match crcs.is_empty() {
        true => 0,
        false => mark_crcs_bytes(count) as usize,
    };
    let start = out.len();
    let flag = (mark == Mark::AfterFold) as u8;
    let at = (stripe, first_block, count);
    put_header(out, Kind::Invalidate, flag, u16::MAX, at, payload);
    let body = out.len();
    for crc in crcs {
        out.extend_from_slice(&crc.to_le_bytes());
    }
    out.resize(body + payload, 0);
    seal(&mut out[start..]);
}

/// Encodes one record into `out`.
pub fn encode(
    out: &mut Vec<u8>,
    kind: Kind,
    stripe: u64,
    role: u16,
    first_block: u32,
    payload: &[u8],
) {
    encode_with_bases(out, kind, stripe, role, first_block, payload, &[]);
}

/// The bytes after the blocks of a data value or parity delta carrying the
/// bases of `count` rows: 8 a row, padded to a multiple of 32.
fn bases_bytes(count: u32) -> u64 {
    row_fields_bytes(count, 8)
}

/// [`encode`], a data value or parity delta carrying `bases` (empty, or
/// one per block): the CRC32C of the journal's parity block of each row
/// as the record is appended, where known (a version 4 journal;
/// [`ParityJournal::row_base`]).
pub fn encode_with_bases(
    out: &mut Vec<u8>,
    kind: Kind,
    stripe: u64,
    role: u16,
    first_block: u32,
    payload: &[u8],
    bases: &[Option<u32>],
) {
    assert!(kind != Kind::Invalidate && payload.len().is_multiple_of(BLOCK));
    let count = (payload.len() / BLOCK) as u32;
    assert!(
        bases.is_empty() || (bases.len() == count as usize && kind != Kind::Original),
        "a base per row of a data value or a parity delta"
    );
    let extra = match bases.is_empty() {
        true => 0,
        false => bases_bytes(count) as usize,
    };
    let start = out.len();
    let bytes = payload.len() + extra;
    put_header(out, kind, 0, role, (stripe, first_block, count), bytes);
    out.extend_from_slice(payload);
    let tail = out.len();
    for base in bases {
        out.extend_from_slice(&base.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&u32::from(base.is_some()).to_le_bytes());
    }
    out.resize(tail + extra, 0);
    seal(&mut out[start..]);
}

struct Parsed {
    kind: Kind,
    stripe: u64,
    role: u16,
    first_block: u32,
    count: u32,
    len: usize,
    /// Where the rows' bases begin in the record (a data value or parity
    /// delta of version 4), if it carries them.
    bases_at: Option<usize>,
}

/// Why a record did not parse.
enum Bad {
    /// Its header holds (checked by its own checksum): the stripe is known.
    Payload { stripe: u64, len: usize },
    /// Nothing in it can be trusted.
    Header,
}

fn parse(b: &[u8], header_crc: bool) -> std::result::Result<Parsed, Bad> {
    parse_checking(b, header_crc, true)
}

/// As `parse`; `payload_crc` false skips the payload's checksum (for
/// records this process encoded and sealed itself a moment before: their
/// payload is checksummed once, by `seal`, not again to index them).
fn parse_checking(
    b: &[u8],
    header_crc: bool,
    payload_crc: bool,
) -> std::result::Result<Parsed, Bad> {
    if b.len() < RECORD_HEADER_BYTES {
        return Err(Bad::Header);
    }
    let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let header_ok = header_crc && u32_at(28) == crc32c::crc32c(&b[4..28]);
    if header_crc && !header_ok {
        return Err(Bad::Header);
    }
    let payload = u32_at(24) as usize;
    let count = u32_at(20);
    let kind = Kind::from_u8(b[4]).ok_or(Bad::Header)?;
    let invalidate = kind == Kind::Invalidate;
    let mark_ok = payload == 0 || payload as u64 == mark_crcs_bytes(count);
    let blocks = count as usize * BLOCK;
    let with_bases = matches!(kind, Kind::Value | Kind::Delta)
        && payload as u64 == blocks as u64 + bases_bytes(count);
    if (!invalidate && payload != blocks && !with_bases) || (invalidate && !mark_ok) {
        return Err(Bad::Header);
    }
    // The blocks `first..first + count` are numbered in u32.
    if u32_at(16).checked_add(count).is_none() {
        return Err(Bad::Header);
    }
    let stripe = u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]);
    let len = RECORD_HEADER_BYTES + payload;
    let bad_payload = || {
        if header_ok {
            Bad::Payload { stripe, len }
        } else {
            Bad::Header
        }
    };
    if b.len() < len || (payload_crc && u32_at(0) != crate::codec::crc32c(&b[4..len])) {
        return Err(bad_payload());
    }
    Ok(Parsed {
        kind,
        role: u16::from_le_bytes([b[6], b[7]]),
        stripe,
        first_block: u32_at(16),
        count,
        len,
        bases_at: with_bases.then_some(RECORD_HEADER_BYTES + blocks),
    })
}

/// Indexes the record `p`, parsed from `record` (its bytes, from its
/// header on), which lies at file offset `offset`.
fn index_record(index: &mut HashMap<u64, StripeLog>, p: &Parsed, offset: u64, record: &[u8]) {
    if p.kind == Kind::Invalidate {
        forget_in(index, p.stripe, p.first_block, p.count);
        return;
    }
    let log = index.entry(p.stripe).or_default();
    for i in 0..p.count {
        let at = offset + RECORD_HEADER_BYTES as u64 + i as u64 * BLOCK as u64;
        let base = p.bases_at.and_then(|from| {
            let from = from + 8 * i as usize;
            let u32_at = |at: usize| u32::from_le_bytes(record[at..at + 4].try_into().unwrap());
            (u32_at(from + 4) == 1).then(|| u32_at(from))
        });
        let e = log.entry((p.role, p.first_block + i)).or_default();
        match p.kind {
            Kind::Value => {
                e.latest = Some(at);
                e.latest_base = base;
            }
            Kind::Original => {
                if e.original.is_none() {
                    e.original = Some(at);
                }
            }
            Kind::Delta => {
                e.deltas.push(at);
                e.delta_bases.push(base);
            }
            Kind::Invalidate => unreachable!(),
        }
    }
}

/// Per stripe, the block rows with a logged block whose bytes end past
/// `synced` (the file's synced length at open).
fn unsynced_rows<'a>(
    logs: impl Iterator<Item = (&'a u64, &'a StripeLog)>,
    synced: u64,
) -> Vec<(u64, BTreeSet<u32>)> {
    let past = |at: &u64| at + BLOCK as u64 > synced;
    logs.filter_map(|(&stripe, log)| {
        let rows: BTreeSet<u32> = log
            .iter()
            .filter(|(_, e)| {
                e.original
                    .iter()
                    .chain(&e.latest)
                    .chain(&e.deltas)
                    .any(past)
            })
            .map(|(&(_, row), _)| row)
            .collect();
        (!rows.is_empty()).then_some((stripe, rows))
    })
    .collect()
}

fn forget_in(index: &mut HashMap<u64, StripeLog>, stripe: u64, first_block: u32, count: u32) {
    if let Some(log) = index.get_mut(&stripe) {
        let range = first_block..first_block.saturating_add(count);
        log.retain(|(_, b), _| !range.contains(b));
        if log.is_empty() {
            index.remove(&stripe);
        }
    }
}

fn compact_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".compact");
    PathBuf::from(name)
}

/// The synced length of a journal in a file of its own (format 1), kept in
/// `PATH.synced`: two 32-byte slots, at 0 and 512 (apart, so that a write
/// torn by a cut leaves the other whole), written in turn and synced after
/// every change. A slot: magic `ECDDPJS1`, u64 length at 8, u32 CRC32C at
/// 16 of the journal's 32 bytes before that length (tells this journal
/// from one that replaced it without the record: a reset cut short, or an
/// older binary), u64 sequence number at 20, u32 CRC32C of bytes 0..28
/// at 28. The slot with the higher sequence number among the intact
/// ones counts. No record (an array made before 2026-11-27, or nothing
/// recorded yet) says nothing: every record is then taken as flushed, as
/// before the record existed. A record that does not match the journal
/// counts nothing as synced: every record is then taken as appended after
/// the last flush (an I/O error where a second failure leaves nothing to
/// check a decode, never a record taken for flushed that was not).
struct SyncedRecord {
    file: Arc<dyn StorageFile>,
    /// The length last recorded durably.
    len: u64,
    /// The sequence number of the slot written last.
    seq: u64,
}

const SYNCED_MAGIC: [u8; 8] = *b"ECDDPJS1";
const SYNCED_SLOT_SPACING: u64 = 512;

impl SyncedRecord {
    fn path_for(journal: &Path) -> PathBuf {
        let mut name = journal.as_os_str().to_owned();
        name.push(".synced");
        PathBuf::from(name)
    }

    /// The record beside the journal at `path` whose bytes are `journal`,
    /// and the synced length it gives them. Created where missing, durably
    /// (its name synced: a name a cut takes away would say nothing), with
    /// the header recorded for a `fresh` journal (created just now), so
    /// that no record appended before the first flush is taken for
    /// flushed; left empty for a journal that exists without one (an
    /// array made before the record existed).
    fn open(
        storage: &Arc<dyn Storage>,
        path: &Path,
        journal: &[u8],
        fresh: bool,
    ) -> std::io::Result<(SyncedRecord, Option<u64>)> {
        let at = SyncedRecord::path_for(path);
        if !storage.exists(&at) {
            storage.create(&at, true)?.sync()?;
            storage.sync_dir(parent_of(&at))?;
        }
        let file = storage.create(&at, false)?;
        let len = file.len()?;
        let slots: Vec<(u64, u64, u32)> = (0..2u64)
            .filter_map(|i| {
                let mut bytes = [0u8; 32];
                let from = i * SYNCED_SLOT_SPACING;
                (len >= from + 32 && file.read_at(&mut bytes, from).is_ok())
                    .then(|| SyncedRecord::parse(&bytes))
                    .flatten()
            })
            .collect();
        let latest = slots.iter().max_by_key(|(seq, _, _)| *seq).copied();
        let matching = latest.and_then(|(_, synced, tail_crc)| {
            (synced <= journal.len() as u64
                && crc32c::crc32c(&journal[(synced - 32) as usize..synced as usize]) == tail_crc)
                .then_some(synced)
        });
        let synced = match (latest, matching) {
            (_, Some(synced)) => Some(synced),
            (None, None) if len == 0 => None,
            // Written and unreadable, or another journal's: nothing synced.
            _ => Some(HEADER_BYTES),
        };
        let mut record = SyncedRecord {
            file,
            len: matching.unwrap_or(0),
            seq: latest.map_or(0, |(seq, _, _)| seq),
        };
        if fresh && journal.len() as u64 == HEADER_BYTES {
            record.len = 0;
            record.set_from(&journal[..HEADER_BYTES as usize], HEADER_BYTES)?;
            return Ok((record, Some(HEADER_BYTES)));
        }
        Ok((record, synced))
    }

    /// A slot's (sequence number, length, CRC32C of the journal's 32 bytes
    /// before it), where the slot is intact.
    fn parse(bytes: &[u8; 32]) -> Option<(u64, u64, u32)> {
        let le_u32 = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap());
        if bytes[..8] != SYNCED_MAGIC || le_u32(&bytes[28..32]) != crc32c::crc32c(&bytes[..28]) {
            return None;
        }
        let len = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
        if len < HEADER_BYTES || len % 32 != 0 {
            return None;
        }
        let seq = u64::from_le_bytes(bytes[20..28].try_into().unwrap());
        Some((seq, len, le_u32(&bytes[16..20])))
    }

    /// Records `len` (durable in `journal`), unless recorded already.
    fn set(&mut self, journal: &dyn StorageFile, len: u64) -> std::io::Result<()> {
        if len == self.len || len < HEADER_BYTES {
            return Ok(());
        }
        let mut tail = [0u8; 32];
        journal.read_at(&mut tail, len - 32)?;
        self.set_from(&tail, len)
    }

    /// Records `len`, `tail` being the journal's 32 bytes before it.
    fn set_from(&mut self, tail: &[u8], len: u64) -> std::io::Result<()> {
        let seq = self.seq + 1;
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&SYNCED_MAGIC);
        bytes[8..16].copy_from_slice(&len.to_le_bytes());
        bytes[16..20].copy_from_slice(&crc32c::crc32c(tail).to_le_bytes());
        bytes[20..28].copy_from_slice(&seq.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..28]);
        bytes[28..32].copy_from_slice(&crc.to_le_bytes());
        self.file
            .write_at(&bytes, (seq % 2) * SYNCED_SLOT_SPACING)?;
        self.file.sync()?;
        self.len = len;
        self.seq = seq;
        Ok(())
    }
}

/// What a journal's bytes hold, as `open` indexes them.
struct Scan {
    index: HashMap<u64, StripeLog>,
    /// Per stripe with a mark past `marks_until`: its log as if those
    /// marks had not been appended, and the rows they end.
    deferred: HashMap<u64, (StripeLog, BTreeSet<u32>)>,
    /// Of `deferred`'s rows, those a mark appended before its parity write
    /// ends (byte 5 = 0).
    before_parity: HashMap<u64, BTreeSet<u32>>,
    /// Of `deferred`'s stripes, what their marks say the parity rows held
    /// after the write each went with.
    mark_crcs: HashMap<u64, DeferredCrcs>,
    records: u64,
    lost: LostRecords,
    /// Where the last good record ends (what follows is cut at open).
    end: usize,
}

/// The version of the journal header `bytes` begin with (1 to
/// [`VERSION`]), `None` for no header.
fn header_version_of(bytes: &[u8]) -> Option<u32> {
    let head = bytes.get(..HEADER_BYTES as usize)?;
    (1..=VERSION).find(|&v| head == &header_version(v)[..])
}

/// Whether `bytes` begin with a journal header: `Some(true)` for versions
/// 2 and later (their records' headers carry a checksum), `Some(false)`
/// for version 1, `None` for no header.
fn header_kind(bytes: &[u8]) -> Option<bool> {
    header_version_of(bytes).map(|v| v >= 2)
}

/// Walks a journal's records after its header: `on` is told each one's
/// offset and parse. Past a bad one the walk goes on after its payload
/// where its header holds, else at the next offset that parses; it stops
/// where nothing more does, and at a bad record past `synced` (the
/// journal's synced length at open, where known): that one is an append
/// the cut tore or dropped, not rot, and what follows it, appended after
/// it, may have lost an earlier record of its own blocks there (a plog
/// delta kept without the one before it folds to neither the old value
/// nor the new), so it is cut with the torn tail. Returns where the last
/// record walked ends (the start of a bad record the walk stopped at).
fn walk(
    bytes: &[u8],
    header_crc: bool,
    synced: Option<u64>,
    mut on: impl FnMut(usize, Result<&Parsed, &Bad>),
) -> usize {
    let next_valid = |from: usize| {
        let mut at = from.next_multiple_of(RECORD_HEADER_BYTES);
        while at + RECORD_HEADER_BYTES <= bytes.len() {
            if parse(&bytes[at..], header_crc).is_ok() {
                return Some(at);
            }
            at += RECORD_HEADER_BYTES;
        }
        None
    };
    let mut at = HEADER_BYTES as usize;
    while at < bytes.len() {
        match parse(&bytes[at..], header_crc) {
            Ok(p) => {
                on(at, Ok(&p));
                at += p.len;
            }
            Err(bad) => {
                on(at, Err(&bad));
                if synced.is_some_and(|synced| (at + RECORD_HEADER_BYTES) as u64 > synced) {
                    return at;
                }
                let skip_to = match bad {
                    Bad::Payload { len, .. } if at + len <= bytes.len() => Some(at + len),
                    _ => next_valid(at + RECORD_HEADER_BYTES),
                };
                match skip_to {
                    Some(next) => at = next,
                    None => break,
                }
            }
        }
    }
    at
}

/// Parses a journal's records after its header, skipping what cannot be
/// parsed (and saying so in `lost`). Every mark is applied to `index`;
/// for the stripes with a mark ending past `marks_until` (the
/// synced length at open, where known), `deferred` also holds their log
/// without those marks ([`ParityJournal::deferred_rows`]), from a second
/// walk of their records only (none where no such mark was found).
fn scan(bytes: &[u8], header_crc: bool, marks_until: Option<u64>) -> Scan {
    scan_with(bytes, header_crc, marks_until, marks_until)
}

/// [`scan`], with a bad record past `torn_past` taken as a torn tail
/// ([`walk`]): a format 1 journal's synced length. In format 2 (a
/// metadata area) a bad record is skipped wherever it lies, as before:
/// cutting there too changed the cluster simulator's seed 382026 into
/// every device failed after a takeover (not narrowed).
fn scan_with(
    bytes: &[u8],
    header_crc: bool,
    marks_until: Option<u64>,
    torn_past: Option<u64>,
) -> Scan {
    let deferred_mark = |at: usize, p: &Parsed| {
        p.kind == Kind::Invalidate && marks_until.is_some_and(|synced| (at + p.len) as u64 > synced)
    };
    let mut out = Scan {
        deferred: HashMap::new(),
        before_parity: HashMap::new(),
        mark_crcs: HashMap::new(),
        index: HashMap::new(),
        records: 0,
        lost: LostRecords::default(),
        end: HEADER_BYTES as usize,
    };
    let mut deferred_rows: HashMap<u64, BTreeSet<u32>> = HashMap::new();
    let end = walk(bytes, header_crc, torn_past, |at, parsed| match parsed {
        Ok(p) => {
            out.records += 1;
            index_record(&mut out.index, p, at as u64, &bytes[at..]);
            if deferred_mark(at, p) {
                let range = p.first_block..p.first_block.saturating_add(p.count);
                deferred_rows
                    .entry(p.stripe)
                    .or_default()
                    .extend(range.clone());
                let crcs = out.mark_crcs.entry(p.stripe).or_default();
                for (i, row) in range.clone().enumerate() {
                    let from = at + RECORD_HEADER_BYTES + 4 * i;
                    let crc = (p.len > RECORD_HEADER_BYTES).then(|| {
                        u32::from_le_bytes(bytes[from..from + 4].try_into().expect("4 bytes"))
                    });
                    crcs.entry(row).or_default().push(crc);
                }
                if bytes[at + 5] == 0 {
                    out.before_parity.entry(p.stripe).or_default().extend(range);
                }
            }
        }
        Err(Bad::Payload { stripe, .. }) => {
            out.lost.stripes.insert(*stripe);
        }
        Err(Bad::Header) => out.lost.unknown_stripes = true,
    });
    out.end = end;
    if !deferred_rows.is_empty() {
        let mut unmarked: HashMap<u64, StripeLog> = HashMap::new();
        walk(bytes, header_crc, torn_past, |at, parsed| {
            if let Ok(p) = parsed {
                if deferred_rows.contains_key(&p.stripe) && !deferred_mark(at, p) {
                    index_record(&mut unmarked, p, at as u64, &bytes[at..]);
                }
            }
        });
        for (stripe, mut rows) in deferred_rows {
            let log = unmarked.remove(&stripe).unwrap_or_default();
            // A mark written before its parity gives back only records
            // that were flushed (with their data writes) before it: a
            // record past the synced length may be one whose data write a
            // later write superseded, and a parity write that landed with
            // the bytes the parity held already (zeroes written over
            // zeroes) looks as if it had not landed (the model proptest:
            // a write, then zeroes over its stripe, a device failed, a
            // crash; the record folded into the zeroed parity, and the
            // stripe did not decode). There the mark stands.
            if let (Some(synced), Some(before)) = (marks_until, out.before_parity.get_mut(&stripe))
            {
                let late = unsynced_rows(std::iter::once((&stripe, &log)), synced);
                for row in late.into_iter().flat_map(|(_, r)| r) {
                    if before.remove(&row) {
                        rows.remove(&row);
                    }
                }
            }
            if rows.is_empty() {
                out.before_parity.remove(&stripe);
                out.mark_crcs.remove(&stripe);
                continue;
            }
            out.deferred.insert(stripe, (log, rows));
        }
    }
    out
}

/// The stripes a journal's bytes hold records for (read from a device
/// that left the array: a re-add counts them as missed). `None` where that
/// cannot be known: no valid header, or a record unreadable down to its
/// header. Records whose payload is bad still name their stripe.
pub(super) fn stripes_in(bytes: &[u8]) -> Option<BTreeSet<u64>> {
    let scan = scan(bytes, header_kind(bytes)?, None);
    if scan.lost.unknown_stripes {
        return None;
    }
    let mut stripes: BTreeSet<u64> = scan.index.into_keys().collect();
    stripes.extend(scan.lost.stripes);
    Some(stripes)
}

impl ParityJournal {
    /// Bytes appended past the journal's last sync (tests; 0 where the
    /// storage cannot tell: a journal in a file of its own).
    #[cfg(test)]
    pub(super) fn bytes_past_sync(&self) -> u64 {
        self.file
            .synced_len()
            .map_or(0, |synced| self.end.saturating_sub(synced))
    }

    /// Opens (creating if missing) a journal and rebuilds its index. What
    /// cannot be parsed is skipped or cut and reported in `take_lost`.
    pub fn open(path: &Path) -> Result<ParityJournal> {
        ParityJournal::open_in(Arc::new(OsStorage), path)
    }

    /// [`ParityJournal::open`] in `storage`.
    pub fn open_in(storage: Arc<dyn Storage>, path: &Path) -> Result<ParityJournal> {
        let io = |e| Error::io(format!("opening parity journal {}", path.display()), e);
        let stale = compact_path(path);
        if storage.exists(&stale) {
            storage.remove(&stale).map_err(io)?;
        }
        let fresh = !storage.exists(path);
        if fresh {
            // A record of the synced length of a journal that is gone
            // says nothing of the new one.
            let record = SyncedRecord::path_for(path);
            if storage.exists(&record) {
                storage.remove(&record).map_err(io)?;
            }
            // Written under a temporary name and renamed, so the journal's
            // name never points at a file without a header.
            crate::media::storage::write_atomic(storage.as_ref(), path, &header()).map_err(io)?;
        }
        let bytes = read_all(storage.as_ref(), path).map_err(io)?;
        let version = header_version_of(&bytes).ok_or_else(|| {
            Error::Corrupt(format!(
                "parity journal {} has no valid header",
                path.display()
            ))
        })?;
        let header_crc = version >= 2;
        let file = storage.open(path).map_err(io)?;
        // Format 1: the synced length from the record beside the file.
        let (synced, synced_record) = match file.synced_len() {
            Some(synced) => (Some(synced), None),
            None => {
                let (record, synced) =
                    SyncedRecord::open(&storage, path, &bytes, fresh).map_err(io)?;
                (synced, Some(record))
            }
        };
        let torn_past = synced.filter(|_| synced_record.is_some());
        let scan = scan_with(&bytes, header_crc, synced, torn_past);
        let unsynced_at_open = synced
            .map(|synced| {
                // The rows a deferred mark may give back count too.
                let deferred = scan.deferred.iter().map(|(s, (log, _))| (s, log));
                let mut rows: HashMap<u64, BTreeSet<u32>> = HashMap::new();
                for (stripe, r) in unsynced_rows(scan.index.iter().chain(deferred), synced) {
                    rows.entry(stripe).or_default().extend(r);
                }
                rows
            })
            .unwrap_or_default();
        let at = scan.end;
        let j = ParityJournal {
            storage,
            file,
            latched: None,
            path: path.to_owned(),
            end: at as u64,
            in_flight_at: BTreeSet::new(),
            held_marks: BTreeSet::new(),
            synced_record,
            file_epoch: 0,
            id: NEXT_JOURNAL_ID.fetch_add(1, Relaxed),
            index: scan.index,
            deferred: scan.deferred,
            deferred_before_parity: scan.before_parity,
            deferred_crcs: scan.mark_crcs,
            unsynced_at_open,
            records: scan.records,
            header_crc,
            version,
            reserved: false,
            lost: scan.lost,
            faults: FaultHooks::default(),
        };
        let mut j = j;
        if at != bytes.len() {
            j.file
                .set_len(j.end)
                .and_then(|_| j.file.sync())
                .map_err(io)?;
            // The records past the synced length stay past it (they were
            // appended after the last flush, and the file's sync here does
            // not make their data writes durable); the length is recorded
            // again only where the cut tail lay below it.
            let keep = synced.map_or(j.end, |synced| synced.min(j.end));
            j.record_synced(keep).map_err(io)?;
        }
        Ok(j)
    }

    /// What open could not use (once; later calls get nothing).
    pub fn take_lost(&mut self) -> LostRecords {
        std::mem::take(&mut self.lost)
    }

    /// Appends encoded records (one write) and indexes them. On an error
    /// nothing is indexed, and the bytes written past the old end are cut
    /// (best effort: whatever stays is a tail that open reports as lost).
    pub fn append(&mut self, records: &[u8]) -> std::io::Result<()> {
        self.append_at(records).map(|_| ())
    }

    /// [`ParityJournal::append`] of an invalidation mark that comes before
    /// the writes it stands for: no sync counts it synced until the
    /// returned hold is given back ([`ParityJournal::release_mark`]) once
    /// those writes are answered.
    pub fn append_held(&mut self, records: &[u8]) -> std::io::Result<MarkHold> {
        let offset = self.append_at(records)?;
        self.held_marks.insert(offset);
        Ok(MarkHold {
            journal: self.id,
            file_epoch: self.file_epoch,
            offset,
        })
    }

    /// Ends a hold of [`ParityJournal::append_held`]: the mark is synced
    /// with the next sync of the device. Nothing for a hold of a journal
    /// or file since replaced.
    pub fn release_mark(&mut self, hold: MarkHold) {
        if hold.journal == self.id && hold.file_epoch == self.file_epoch {
            self.held_marks.remove(&hold.offset);
        }
    }

    /// Where the bytes a sync may count synced end: below the first append
    /// in flight and the first mark held.
    fn sync_bound(&self) -> u64 {
        let first = |set: &BTreeSet<u64>| set.first().copied().unwrap_or(u64::MAX);
        self.end
            .min(first(&self.in_flight_at))
            .min(first(&self.held_marks))
    }

    fn append_at(&mut self, records: &[u8]) -> std::io::Result<u64> {
        let w = self.begin_append(records.to_vec())?;
        let offset = w.offset;
        let written = {
            let mut ios = w.device_ios();
            let (results, _) = crate::media::submit(&mut ios);
            results.into_iter().collect::<std::io::Result<Vec<()>>>()
        };
        self.finish_append(w, written.map(|_| ()))?;
        Ok(offset)
    }

    /// Begins an append of encoded records: reserves their place at the
    /// end and returns the write, which the caller runs (in a batch of
    /// device I/O, [`JournalWrite::device_ios`]) and hands back to
    /// [`ParityJournal::finish_append`] with its outcome; the records are
    /// indexed only then. Appends may be in flight together: each has its
    /// own range of the file.
    pub fn begin_append(&mut self, records: Vec<u8>) -> std::io::Result<JournalWrite> {
        if let Some(why) = &self.latched {
            self.reserved = false;
            return Err(std::io::Error::other(why.clone()));
        }
        let offset = self.end;
        let target = match self.file.place_write(offset, records.len() as u64) {
            Some(Err(e)) => {
                self.reserved = false;
                return Err(e);
            }
            Some(Ok(placed)) => {
                let dev = Synchronous(Arc::clone(&placed.dev));
                Target::Placed(placed, dev)
            }
            None => Target::File(OwnFile(Arc::clone(&self.file))),
        };
        self.end += records.len() as u64;
        self.in_flight_at.insert(offset);
        let mut w = JournalWrite {
            journal: self.id,
            records,
            offset,
            target,
        };
        if self.faults.fail_appends.load(Relaxed) {
            // Half the bytes reach the file, then the disk is full.
            let len = w.records.len();
            w.records.truncate(len / 2);
            let _ = crate::media::submit(&mut w.device_ios());
            w.records.resize(len, 0);
            let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
            return Err(self.fail_append(w, full));
        }
        Ok(w)
    }

    /// Ends an append begun by [`ParityJournal::begin_append`] whose write
    /// had `outcome`: indexes its records, or, on an error, indexes nothing
    /// and stops taking appends until space is reserved again; the bytes
    /// are cut when no later append was begun (otherwise they stay, a
    /// bad record that open skips and reports as lost).
    pub fn finish_append(
        &mut self,
        w: JournalWrite,
        outcome: std::io::Result<()>,
    ) -> std::io::Result<()> {
        if w.journal != self.id {
            // Begun on a journal that a replacement or a reopen has since
            // put aside: this one has no place for it.
            return Err(std::io::Error::other(
                "the parity journal was replaced during the append",
            ));
        }
        if let Err(e) = outcome {
            return Err(self.fail_append(w, e));
        }
        self.in_flight_at.remove(&w.offset);
        let end = w.offset + w.records.len() as u64;
        self.file.placed_written(end);
        let mut at = 0usize;
        while at < w.records.len() {
            // The header is checked (its own small checksum); the
            // payload was checksummed by `seal` and is checked again only
            // in debug builds.
            let p = parse_checking(&w.records[at..], true, cfg!(debug_assertions))
                .unwrap_or_else(|_| panic!("records we encoded parse"));
            self.records += 1;
            index_record(&mut self.index, &p, w.offset + at as u64, &w.records[at..]);
            if p.kind == Kind::Invalidate {
                self.forget_unsynced(p.stripe, p.first_block, p.count);
            }
            at += p.len;
        }
        Ok(())
    }

    /// An append that failed with `e`: nothing indexed, no more appends
    /// until space is reserved again ([`ParityJournal::preallocate`]);
    /// its bytes are cut when no later append was begun.
    fn fail_append(&mut self, w: JournalWrite, e: std::io::Error) -> std::io::Error {
        debug_assert!(w.journal == self.id && self.in_flight_at.contains(&w.offset));
        self.in_flight_at.remove(&w.offset);
        self.reserved = false;
        if self.in_flight_at.is_empty() && self.end == w.offset + w.records.len() as u64 {
            let _ = self.file.set_len(w.offset);
            self.end = w.offset;
        }
        e
    }

    /// Whether an append is begun and not finished, or a mark held
    /// ([`ParityJournal::append_held`]): the file stays as it is.
    pub fn appends_in_flight(&self) -> bool {
        !self.in_flight_at.is_empty() || !self.held_marks.is_empty()
    }

    pub fn has_original(&self, stripe: u64, role: u16, block: u32) -> bool {
        self.index
            .get(&stripe)
            .and_then(|l| l.get(&(role, block)))
            .is_some_and(|b| b.original.is_some())
    }

    pub fn has_stripe(&self, stripe: u64) -> bool {
        self.index.contains_key(&stripe)
    }

    pub fn stripes(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.index.keys().copied().collect();
        v.sort_unstable();
        v
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// A copy of what is logged for a stripe. Replay works from the copy and
    /// drops the entries only by logging an invalidation once the parity is
    /// written, so a replay that fails leaves the stripe pending.
    pub fn stripe_log(&self, stripe: u64) -> Option<StripeLog> {
        self.index.get(&stripe).cloned()
    }

    /// Drops from the index every logged block that `fits` refuses (a
    /// stripe past the array's end, a role that is not data, a block past
    /// the unit, a stripe this device holds no parity of: what a record
    /// whose checksum holds can still say after a bug or a foreign file).
    /// Returns the stripes that lost blocks, for the caller to check.
    /// `fits` is also told whether the block holds data values (parix's
    /// d(0)/d(r), whose role is a data role) or only parity deltas (plog's,
    /// whose role is the parity unit's).
    pub fn drop_outside(&mut self, fits: impl Fn(u64, u16, u32, bool) -> bool) -> BTreeSet<u64> {
        let mut dropped = BTreeSet::new();
        self.index.retain(|&stripe, log| {
            let before = log.len();
            log.retain(|&(role, block), entry| {
                let values = entry.original.is_some() || entry.latest.is_some();
                fits(stripe, role, block, values)
            });
            if log.len() != before {
                dropped.insert(stripe);
            }
            !log.is_empty()
        });
        dropped
    }

    /// Drops blocks of a stripe from the index only (the file keeps them):
    /// for when an invalidation cannot be logged. The caller makes sure a
    /// restart resynchronises the stripe before replaying.
    pub fn forget(&mut self, stripe: u64, first_block: u32, count: u32) {
        forget_in(&mut self.index, stripe, first_block, count);
        self.forget_unsynced(stripe, first_block, count);
    }

    /// The rows of `stripe` that an invalidation mark found past the
    /// journal's synced length at open ends. A fold writes the parity in
    /// place and then appends its mark, a whole-stripe write appends its
    /// mark and then writes the parity, none synced, and a cut may keep
    /// the mark and drop the parity write (a drive's volatile cache
    /// reorders; so does the power-loss simulator): where the parity lacks
    /// the fold, the mark ended records nothing else holds. The index
    /// applies the marks; the caller that can tell (the open's resync: the
    /// parity block against the marks' own parity checksums, version 3,
    /// or else still matching its checksum entry) gives the rows whose
    /// fold did not land their records back
    /// ([`ParityJournal::restore_deferred_rows`]).
    pub fn deferred_rows(&self, stripe: u64) -> BTreeSet<u32> {
        self.deferred
            .get(&stripe)
            .map(|(_, rows)| rows.clone())
            .unwrap_or_default()
    }

    /// Of [`ParityJournal::deferred_rows`], those a mark appended before
    /// its parity write ends (a whole-stripe write's, a discard's, a
    /// resync's): the caller gives them back only where the row's data
    /// members, which such a write rewrites too, show no sign of it.
    pub fn deferred_rows_before_parity(&self, stripe: u64) -> BTreeSet<u32> {
        self.deferred_before_parity
            .get(&stripe)
            .cloned()
            .unwrap_or_default()
    }

    /// Of [`ParityJournal::deferred_rows`], what the marks ending each row
    /// say its parity held after the write each went with (version 3),
    /// in the order they were appended. A mark is appended after its
    /// fold's parity write and before a whole-stripe write's, none
    /// synced, and a flush writes every checksum page after the devices'
    /// first syncs, then syncs again and commits the journal's length only
    /// after that (io.rs, `Array::sync_devices`): a cut
    /// may keep a table page with the fold's entry and drop the fold's
    /// parity write, or keep everything but the length, so the checksum
    /// table cannot tell whether the parity holds the write; the parity
    /// block's own checksum against these can.
    pub fn deferred_mark_crcs(&self, stripe: u64) -> DeferredCrcs {
        self.deferred_crcs.get(&stripe).cloned().unwrap_or_default()
    }

    /// Whether marks appended to this journal carry their parity rows'
    /// checksums ([`encode_mark_with_crcs`]; version 3 files).
    pub fn takes_mark_crcs(&self) -> bool {
        self.version >= 3
    }

    /// Whether data values and parity deltas appended to this journal
    /// carry their rows' bases ([`encode_with_bases`]; version 4 files).
    pub fn takes_record_bases(&self) -> bool {
        self.version >= 4
    }

    /// The base of block row `row` of `stripe`: the CRC32C of this
    /// journal's parity block of the row when its live records were
    /// appended, where every one of them (the latest d(r) of each data
    /// block, every delta) carries a known base and all are the same.
    /// Records are appended only while the parity holds none of the
    /// row's live records, and a fold or a rewrite of the parity ends
    /// them with a mark, so the parity block holds them where it is the
    /// base with them folded in, and lacks them where it is the base.
    /// None where a record carries none (an older file, a parity whose
    /// checksum was not known) or two differ (the parity changed in place
    /// under them: a degraded write).
    pub fn row_base(&self, stripe: u64, row: u32) -> Option<u32> {
        let log = self.index.get(&stripe)?;
        let mut bases = log
            .iter()
            .filter(|((_, r), _)| *r == row)
            .flat_map(|(_, e)| {
                let latest = e.latest.map(|_| e.latest_base);
                latest.into_iter().chain(e.delta_bases.iter().copied())
            });
        let first = bases.next()??;
        bases.all(|b| b == Some(first)).then_some(first)
    }

    /// Gives `rows` of `stripe` back the records a deferred fold mark ended
    /// (as if it had not been appended), and settles the stripe.
    pub fn restore_deferred_rows(&mut self, stripe: u64, rows: &BTreeSet<u32>) {
        self.deferred_before_parity.remove(&stripe);
        self.deferred_crcs.remove(&stripe);
        let Some((unmarked, _)) = self.deferred.remove(&stripe) else {
            return;
        };
        let log = self.index.entry(stripe).or_default();
        log.retain(|&(_, row), _| !rows.contains(&row));
        for (&(role, row), entry) in &unmarked {
            if rows.contains(&row) {
                log.insert((role, row), entry.clone());
            }
        }
        if log.is_empty() {
            self.index.remove(&stripe);
        }
    }

    /// The deferred marks appended after their fold's parity write stand
    /// (those appended before their parity write stay deferred): the
    /// chunk server holding this journal never restarted since they were
    /// appended, so the fold's parity write, answered before its mark was
    /// sent, is in the chunk's file (`Superblock::boot_stamp`). A row also
    /// ended by a mark written before its parity stays deferred whole.
    pub fn trust_fold_marks(&mut self) {
        let before = &self.deferred_before_parity;
        self.deferred.retain(|stripe, (_, rows)| {
            rows.retain(|row| before.get(stripe).is_some_and(|b| b.contains(row)));
            !rows.is_empty()
        });
        let deferred = &self.deferred;
        self.deferred_before_parity
            .retain(|stripe, _| deferred.contains_key(stripe));
        self.deferred_crcs
            .retain(|stripe, _| deferred.contains_key(stripe));
    }

    /// Every deferred mark stands (a stripe's alone: `restore_deferred_rows`).
    pub fn settle_all_deferred(&mut self) {
        self.deferred.clear();
        self.deferred_before_parity.clear();
        self.deferred_crcs.clear();
    }

    /// The block rows of `stripe` that a record appended after the
    /// journal's last sync before this open is still indexed for (see
    /// `unsynced_at_open`): a write not flushed at the stop, whose
    /// in-place data write the power cut may have dropped while keeping
    /// the record.
    pub fn unsynced_rows(&self, stripe: u64) -> BTreeSet<u32> {
        let (Some(rows), Some(log)) = (self.unsynced_at_open.get(&stripe), self.index.get(&stripe))
        else {
            return BTreeSet::new();
        };
        log.keys()
            .map(|&(_, row)| row)
            .filter(|row| rows.contains(row))
            .collect()
    }

    /// An invalidation (or a forget) ends what was logged before it: the
    /// rows' later records are this process's.
    fn forget_unsynced(&mut self, stripe: u64, first_block: u32, count: u32) {
        if let Some(rows) = self.unsynced_at_open.get_mut(&stripe) {
            let range = first_block..first_block.saturating_add(count);
            rows.retain(|row| !range.contains(row));
            if rows.is_empty() {
                self.unsynced_at_open.remove(&stripe);
            }
        }
    }

    /// Reads one logged block.
    pub fn read_block(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if self.faults.fail_reads.load(Relaxed) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        self.file.read_at(buf, offset)
    }

    /// Reads several blocks, each `(file offset, buffer)`: where the file
    /// lies in a device's metadata area, as one batch of device reads (one
    /// io_uring submission, or one round trip to a remote chunk, instead of
    /// one per block: a replay reads every record of a stripe); a file of
    /// its own, one `read_at` each. The first error is returned.
    pub fn read_blocks(&self, reads: &mut [(u64, &mut [u8])]) -> std::io::Result<()> {
        if self.faults.fail_reads.load(Relaxed) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        let mut placed = Vec::with_capacity(reads.len());
        for (at, buf) in reads.iter() {
            match self.file.place_read(*at, buf.len() as u64) {
                Some(p) => placed.push(p?),
                None => {
                    for (at, buf) in reads.iter_mut() {
                        self.file.read_at(buf, *at)?;
                    }
                    return Ok(());
                }
            }
        }
        let mut ios = Vec::new();
        for ((_, buf), p) in reads.iter_mut().zip(&placed) {
            let mut rest: &mut [u8] = buf;
            for &(offset, n) in &p.runs {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(n);
                ios.push(DeviceIo {
                    dev: p.dev.as_ref(),
                    op: crate::media::Op::Read { buf: head, offset },
                });
                rest = tail;
            }
        }
        let (results, _) = crate::media::submit(&mut ios);
        results.into_iter().collect()
    }

    /// Where logged blocks lie on the device of the metadata area the
    /// journal lives in (format 2): the device, and for each file offset
    /// the runs (device offset, bytes) of its `len` bytes. None for a
    /// journal in a file of its own (format 1), or for no offsets. Fails
    /// as [`ParityJournal::read_blocks`] would (past the file's end, the
    /// test hook).
    pub fn place_blocks(&self, offsets: &[u64], len: u64) -> Option<std::io::Result<PlacedBlocks>> {
        let first = self.file.place_read(*offsets.first()?, len)?;
        if self.faults.fail_reads.load(Relaxed) {
            return Some(Err(std::io::Error::from_raw_os_error(libc::EIO)));
        }
        let first = match first {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        let mut runs = Vec::with_capacity(offsets.len());
        runs.push(first.runs);
        for &at in &offsets[1..] {
            match self.file.place_read(at, len)? {
                Ok(p) => runs.push(p.runs),
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok((first.dev, runs)))
    }

    pub fn bytes(&self) -> u64 {
        self.end
    }

    /// Bytes of payload the index still needs (what a compaction keeps,
    /// without record headers).
    pub fn live_bytes(&self) -> u64 {
        self.index
            .values()
            .flat_map(|l| l.values())
            .map(|b| {
                (b.original.is_some() as u64 + b.latest.is_some() as u64 + b.deltas.len() as u64)
                    * BLOCK as u64
            })
            .sum()
    }

    /// Makes every appended record durable. A failure is latched: see
    /// [`ParityJournal::is_latched`]. The synced length it records stops
    /// below the first append in flight and the first mark held
    /// ([`ParityJournal::append_held`]): a whole sync of the file counted
    /// a held mark synced before its parity write.
    pub fn sync(&mut self) -> std::io::Result<()> {
        let bound = self.sync_bound();
        self.sync_with(|f| f.sync_below(bound))
    }

    /// Format 1: records that the journal's first `len` bytes are durable
    /// with the data writes of their records, durably, before the caller
    /// goes on; nothing in format 2 (its area's directory does).
    fn record_synced(&mut self, len: u64) -> std::io::Result<()> {
        let Some(record) = &mut self.synced_record else {
            return Ok(());
        };
        record.set(self.file.as_ref(), len)
    }

    /// Format 1 (a journal with its synced length beside it): what a sync
    /// of the journal's file issued from now on makes durable, the bytes
    /// below the first append still in flight (one placed after it may
    /// finish first), to be recorded by
    /// [`ParityJournal::record_flushed`] once the devices holding the
    /// records' data writes are synced too. None in format 2 (the
    /// devices' sync and [`ParityJournal::sync_point`] do it), or for a
    /// latched journal.
    pub fn flush_point(&self) -> Option<FlushPoint> {
        if self.latched.is_some() || self.synced_record.is_none() {
            return None;
        }
        Some(FlushPoint {
            journal: self.id,
            file_epoch: self.file_epoch,
            len: self.sync_bound(),
        })
    }

    /// Records `point` ([`ParityJournal::flush_point`]) as the journal's
    /// synced length, where the journal's file was synced after the point
    /// was taken and then the devices: a record below it was appended
    /// before a flush (or a FUA write's syncs) that made both it and its
    /// data write durable. Nothing where the file was replaced or emptied
    /// since the point. An error is latched as a failed sync is.
    pub fn record_flushed(&mut self, point: FlushPoint) -> std::io::Result<()> {
        if let Some(why) = &self.latched {
            return Err(std::io::Error::other(why.clone()));
        }
        if point.journal != self.id || point.file_epoch != self.file_epoch {
            return Ok(());
        }
        let recorded = self.record_synced(point.len);
        if let Err(e) = &recorded {
            self.latched = Some(format!(
                "recording the synced length of parity journal {} failed ({e}); it takes \
                 no more records",
                self.path.display()
            ));
            self.reserved = false;
        }
        recorded
    }

    /// What a sync of the device the journal lies on, issued from now on,
    /// makes durable of it (format 2: a flush syncs every device in one
    /// batch, [`StorageFile::sync_point`]): the records appended and
    /// finished so far. None for a journal in a file of its own, or a
    /// latched one.
    pub fn sync_point(&self) -> Option<JournalSyncPoint> {
        if self.latched.is_some() {
            return None;
        }
        let mut point = self.file.sync_point()?;
        // Not past an append still in flight: one placed after it that has
        // finished raised the file's length over its bytes, which the
        // device may not hold yet (format 1 takes the same bound:
        // [`ParityJournal::flush_point`]).
        point.len = point.len.min(self.sync_bound());
        Some(JournalSyncPoint {
            point,
            file_epoch: self.file_epoch,
            file: Arc::clone(&self.file),
        })
    }

    /// [`ParityJournal::sync`] where the caller took `point` of this
    /// journal ([`ParityJournal::sync_point`]) and then synced the device
    /// it lies on: what is left of the sync (the metadata area's
    /// directory, where the journal's length in it changed). The records
    /// counted durable are those of the point, not those finished since
    /// (they may have reached the device after its sync). Without a point,
    /// or with one of a file a compaction or a reset has since replaced or
    /// emptied: the journal's own sync ([`ParityJournal::sync`]).
    pub fn sync_after_device_sync(
        &mut self,
        point: Option<JournalSyncPoint>,
    ) -> std::io::Result<()> {
        match point {
            Some(p) if same_file(&p.file, &self.file) && p.file_epoch == self.file_epoch => {
                self.sync_with(|f| f.sync_after_device_sync(p.point))
            }
            _ => self.sync(),
        }
    }

    /// [`ParityJournal::sync_after_device_sync`] in two steps: the
    /// metadata area's directory commit made ready, its durable write left
    /// to the caller, who makes it beside other writes to the device (a
    /// flush's checksum pages) and finishes it
    /// ([`crate::media::area::PreparedCommit::finish`]), then passes the
    /// outcome to [`ParityJournal::note_prepared_sync`]. Some(Ok(None)):
    /// the sync is done (nothing of the directory changed). None: no such
    /// step for this point (another file since, a truncation since, a
    /// file outside an area, an injected sync failure): the caller calls
    /// `sync_after_device_sync`.
    pub fn prepare_sync_after_device_sync(
        &self,
        point: &JournalSyncPoint,
    ) -> Option<std::io::Result<Option<crate::media::area::PreparedCommit<'_>>>> {
        if let Some(why) = &self.latched {
            return Some(Err(std::io::Error::other(why.clone())));
        }
        if !same_file(&point.file, &self.file)
            || point.file_epoch != self.file_epoch
            || self.faults.fail_syncs.load(Relaxed)
        {
            return None;
        }
        self.file.prepare_sync_after_device_sync(point.point)
    }

    /// The outcome of a sync made ready by
    /// [`ParityJournal::prepare_sync_after_device_sync`]: a failure latches
    /// the journal as a failed sync does.
    pub fn note_prepared_sync(&mut self, synced: &std::io::Result<()>) {
        if let Err(e) = synced {
            self.latch_sync_failure(e);
        }
    }

    fn sync_with(
        &mut self,
        sync: impl FnOnce(&dyn StorageFile) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if let Some(why) = &self.latched {
            return Err(std::io::Error::other(why.clone()));
        }
        let synced = if self.faults.fail_syncs.load(Relaxed) {
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        } else {
            sync(self.file.as_ref())
        };
        if let Err(e) = &synced {
            self.latch_sync_failure(e);
        }
        synced
    }

    fn latch_sync_failure(&mut self, e: &std::io::Error) {
        if self.latched.is_none() {
            self.latched = Some(format!(
                "parity journal {} failed to sync earlier ({e}); it takes no more records",
                self.path.display()
            ));
        }
        self.reserved = false;
    }

    /// Whether a sync failed: the records appended since the sync before it
    /// may be gone from the media, so the caller keeps their stripes dirty
    /// until a resync (the journal takes no more appends).
    pub fn is_latched(&self) -> bool {
        self.latched.is_some()
    }

    /// Empties the journal when nothing in it is still needed.
    pub fn reset_if_empty(&mut self) -> std::io::Result<bool> {
        if !self.deferred.is_empty() {
            // Their records lie in the file: the marks stand first.
            return Ok(false);
        }
        if self.latched.is_some()
            || self.appends_in_flight()
            || !self.index.is_empty()
            || (self.end == HEADER_BYTES && self.version == VERSION)
        {
            return Ok(false);
        }
        self.file.set_len(HEADER_BYTES)?;
        self.file.write_at(&header(), 0)?;
        self.file.sync()?;
        self.header_crc = true;
        self.version = VERSION;
        self.end = HEADER_BYTES;
        self.file_epoch += 1;
        self.record_synced(HEADER_BYTES)?;
        Ok(true)
    }

    /// Rewrites the records the index still needs into a fresh file and
    /// renames it over this one (crash-safe: see the module comment). The
    /// new file is not preallocated: the caller reserves space after.
    pub fn compact(&mut self) -> std::io::Result<()> {
        if let Some(why) = &self.latched {
            return Err(std::io::Error::other(why.clone()));
        }
        self.deferred_before_parity.clear();
        self.deferred_crcs.clear();
        // The deferred marks stand: a compaction keeps only what the index
        // holds, so their records are gone from the file after it.
        self.deferred.clear();
        assert!(
            !self.appends_in_flight(),
            "compacting under appends in flight"
        );
        let tmp_path = compact_path(&self.path);
        let tmp = self.storage.create(&tmp_path, true)?;
        let result = self.compact_into(tmp.as_ref());
        if let Err(e) = result {
            let _ = self.storage.remove(&tmp_path);
            return Err(e);
        }
        let (end, index) = result.expect("checked");
        tmp.sync()?;
        self.storage.rename(&tmp_path, &self.path)?;
        self.storage.sync_dir(parent_of(&self.path))?;
        self.file = tmp;
        self.end = end;
        self.index = index;
        self.header_crc = true;
        self.version = VERSION;
        self.reserved = false;
        self.file_epoch += 1;
        // Format 1: the live records may include some appended after the
        // last flush, now in another order; until the next flush every
        // record counts as appended after it (an I/O error where a second
        // failure leaves nothing to check a decode, never a record taken
        // for flushed that was not; format 2 takes the whole new file as
        // synced: docs/format.md).
        self.record_synced(HEADER_BYTES)
    }

    fn compact_into(
        &self,
        tmp: &dyn StorageFile,
    ) -> std::io::Result<(u64, HashMap<u64, StripeLog>)> {
        tmp.write_at(&header(), 0)?;
        let mut end = HEADER_BYTES;
        let mut index = HashMap::new();
        let mut out: Vec<u8> = Vec::with_capacity(COMPACT_WRITE_BYTES + 2 * BLOCK);
        let mut block = vec![0u8; BLOCK];
        let write_out = |out: &mut Vec<u8>, end: &mut u64| -> std::io::Result<()> {
            tmp.write_at(out, *end)?;
            *end += out.len() as u64;
            out.clear();
            Ok(())
        };
        let mut stripes: Vec<&u64> = self.index.keys().collect();
        stripes.sort_unstable();
        for &stripe in stripes {
            let log = &self.index[&stripe];
            let mut keys: Vec<&(u16, u32)> = log.keys().collect();
            keys.sort_unstable();
            for &(role, b) in keys {
                let e = &log[&(role, b)];
                // A base not known is carried as none.
                let mut put = |kind: Kind,
                               at: u64,
                               base: Option<u32>,
                               out: &mut Vec<u8>|
                 -> std::io::Result<()> {
                    self.read_block(at, &mut block)?;
                    let start = out.len();
                    let bases: &[Option<u32>] = match base {
                        Some(_) => &[base],
                        None => &[],
                    };
                    encode_with_bases(out, kind, stripe, role, b, &block, bases);
                    let p = parse(&out[start..], true)
                        .unwrap_or_else(|_| panic!("records we encoded parse"));
                    index_record(&mut index, &p, end + start as u64, &out[start..]);
                    Ok(())
                };
                if let Some(o) = e.original {
                    put(Kind::Original, o, None, &mut out)?;
                }
                if let Some(l) = e.latest {
                    put(Kind::Value, l, e.latest_base, &mut out)?;
                }
                for (i, &d) in e.deltas.iter().enumerate() {
                    let base = e.delta_bases.get(i).copied().flatten();
                    put(Kind::Delta, d, base, &mut out)?;
                }
                if out.len() >= COMPACT_WRITE_BYTES {
                    write_out(&mut out, &mut end)?;
                }
            }
        }
        write_out(&mut out, &mut end)?;
        Ok((end, index))
    }

    /// Reserves `bytes` of disk for the journal without changing its size,
    /// so that appends within the bound never meet a full disk.
    pub fn preallocate(&mut self, bytes: u64) -> std::io::Result<()> {
        #[cfg(test)]
        let injected = FAIL_PREALLOCATE_ON_THIS_THREAD.with(|f| f.get());
        #[cfg(not(test))]
        let injected = false;
        if injected || self.faults.fail_preallocate.load(Relaxed) {
            self.reserved = false;
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        if let Some(why) = &self.latched {
            self.reserved = false;
            return Err(std::io::Error::other(why.clone()));
        }
        match self.file.reserve(bytes) {
            Ok(()) => {
                self.reserved = true;
                Ok(())
            }
            Err(e) => {
                self.reserved = false;
                Err(e)
            }
        }
    }

    /// Whether space up to the bound is reserved: appends are attempted
    /// only then (a journal that cannot grow makes writes fall back).
    pub fn is_reserved(&self) -> bool {
        self.reserved
    }

    /// The fault-injection hooks (tests).
    pub fn faults(&self) -> &FaultHooks {
        &self.faults
    }

    /// RAM of the index: entries times their size, plus the delta lists
    /// (a stripe's entries lie in B-tree nodes: counted at their size, the
    /// nodes' spare slots and links left out; a stripe's at a hash map's,
    /// one control byte each).
    pub fn index_ram_bytes(&self) -> u64 {
        let entry = std::mem::size_of::<((u16, u32), BlockLog)>() as u64;
        let stripe = std::mem::size_of::<(u64, StripeLog)>() as u64 + 1;
        self.index
            .values()
            .map(|l| {
                stripe
                    + l.len() as u64 * entry
                    + l.values()
                        .map(|b| b.deltas.capacity() as u64 * 8)
                        .sum::<u64>()
            })
            .sum()
    }

    pub fn logged_blocks(&self) -> u64 {
        self.index.values().map(|l| l.len() as u64).sum()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::os::unix::fs::FileExt;

    #[test]
    fn records_are_indexed_and_an_invalidation_drops_the_stripe() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut j = ParityJournal::open(&path).unwrap();
        let mut r = Vec::new();
        encode(&mut r, Kind::Value, 7, 1, 2, &[1u8; 8192]);
        encode(&mut r, Kind::Original, 7, 1, 2, &[0u8; 4096]);
        encode(&mut r, Kind::Value, 9, 0, 0, &[3u8; 4096]);
        j.append(&r).unwrap();
        assert!(j.has_original(7, 1, 2) && !j.has_original(7, 1, 3));
        let mut r = Vec::new();
        encode_invalidate(&mut r, 9, 0, 1);
        encode_invalidate(&mut r, 7, 3, 1);
        j.append(&r).unwrap();
        assert!(j.index[&7].contains_key(&(1, 2)) && !j.index[&7].contains_key(&(1, 3)));
        assert_eq!(j.stripes(), vec![7]);
        // Flushed: the marks lie within the synced length and stand at
        // the next open (past it they are kept back for the open's
        // resync: `a_folds_mark_past_the_synced_length_can_be_given_back_at_open`).
        flush(&mut j);
        drop(j);
        let mut j = ParityJournal::open(&path).unwrap();
        assert_eq!(j.stripes(), vec![7]);
        let log = j.stripe_log(7).unwrap();
        j.forget(7, 0, u32::MAX);
        let b = &log[&(1, 2)];
        let mut buf = vec![0u8; 4096];
        j.read_block(b.latest.unwrap(), &mut buf).unwrap();
        assert_eq!(buf, vec![1u8; 4096]);
        assert!(j.reset_if_empty().unwrap());
    }

    /// A journal's bytes: its header, then a parity delta (role 4) of
    /// each of the first `rows` rows of each stripe.
    fn deltas(stripes: &[u64], rows: u32) -> Vec<u8> {
        let mut bytes = header().to_vec();
        for &stripe in stripes {
            for row in 0..rows {
                encode(&mut bytes, Kind::Delta, stripe, 4, row, &[7u8; 4096]);
            }
        }
        bytes
    }

    /// A journal opened over `bytes`, its index and deferred marks those
    /// `found` (a scan with the synced length the test chose).
    fn opened_as(bytes: &[u8], found: Scan) -> (tempfile::TempDir, ParityJournal) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        std::fs::write(&path, bytes).unwrap();
        let mut j = ParityJournal::open(&path).unwrap();
        j.index = found.index;
        j.deferred = found.deferred;
        j.deferred_before_parity = found.before_parity;
        j.deferred_crcs = found.mark_crcs;
        (dir, j)
    }

    /// A mark past the synced length at open is applied to the index, and
    /// the log without it is kept for the caller to give back rows whose
    /// parity write did not land: a fold's mark (written after its parity)
    /// and, since 2026-11-27, a whole-stripe write's (written before its
    /// parity: the power-loss schedule 78501027 kept one and dropped the
    /// parity write); within the synced length a mark is applied for good.
    #[test]
    fn a_folds_mark_past_the_synced_length_can_be_given_back_at_open() {
        let mut bytes = deltas(&[5, 6, 7], 2);
        encode_mark(&mut bytes, 7, 0, 2, Mark::AfterFold);
        let synced = bytes.len() as u64;
        encode_mark(&mut bytes, 5, 0, 2, Mark::AfterFold);
        encode_mark(&mut bytes, 6, 0, 2, Mark::BeforeParity);
        // A record after the deferred mark: the log given back keeps it.
        encode(&mut bytes, Kind::Delta, 5, 4, 1, &[9u8; 4096]);
        let found = scan(&bytes, true, Some(synced));
        let mut indexed: Vec<u64> = found.index.keys().copied().collect();
        indexed.sort_unstable();
        assert_eq!(
            indexed,
            vec![5],
            "every mark applied; stripe 5 keeps its newer record"
        );
        assert_eq!(found.index[&5].len(), 1);
        let mut deferred: Vec<u64> = found.deferred.keys().copied().collect();
        deferred.sort_unstable();
        assert_eq!(deferred, vec![5, 6], "only the marks past the sync");
        assert_eq!(found.deferred[&6].1, BTreeSet::from([0, 1]));
        assert_eq!(found.deferred[&6].0.len(), 2, "stripe 6's two rows");
        let (unmarked, rows) = &found.deferred[&5];
        assert_eq!(rows, &BTreeSet::from([0, 1]));
        assert_eq!(unmarked[&(4, 0)].deltas.len(), 1);
        assert_eq!(
            unmarked[&(4, 1)].deltas.len(),
            2,
            "the older record and the newer"
        );
        assert!(
            scan(&bytes, true, None).deferred.is_empty(),
            "no synced length: none"
        );

        // Given back through the journal: row 0 only.
        let (_dir, mut j) = opened_as(&bytes, found);
        assert_eq!(j.deferred_rows(5), BTreeSet::from([0, 1]));
        j.restore_deferred_rows(5, &BTreeSet::from([0]));
        let log = j.stripe_log(5).unwrap();
        assert_eq!(log[&(4, 0)].deltas.len(), 1, "row 0 given back");
        assert_eq!(log[&(4, 1)].deltas.len(), 1, "row 1: the mark stands");
        assert!(j.deferred_rows(5).is_empty(), "settled");
    }

    /// A version 3 mark carries its parity rows' checksums after its write
    /// (padded to 32 bytes): the marks past the synced length give them
    /// per row, in the order appended (`None` for a mark without them);
    /// a mark without them (version 2's) still parses, and one whose
    /// payload length does not fit its row count does not.
    #[test]
    fn marks_past_the_synced_length_carry_their_parity_checksums() {
        let mut bytes = deltas(&[5, 6], 3);
        let synced = bytes.len() as u64;
        encode_mark_with_crcs(&mut bytes, 5, 0, 3, Mark::AfterFold, &[11, 12, 13]);
        assert_eq!(
            bytes.len() as u64 - synced,
            32 + 32,
            "12 bytes padded to 32"
        );
        encode(&mut bytes, Kind::Delta, 5, 4, 1, &[9u8; 4096]);
        encode_mark(&mut bytes, 5, 1, 1, Mark::AfterFold);
        encode_mark_with_crcs(&mut bytes, 6, 1, 2, Mark::BeforeParity, &[21, 22]);
        let found = scan(&bytes, true, Some(synced));
        assert_eq!(found.records, 6 + 4);
        assert!(found.lost == LostRecords::default(), "every record parses");
        let five = &found.mark_crcs[&5];
        assert_eq!(five[&0], vec![Some(11)]);
        assert_eq!(five[&1], vec![Some(12), None], "in the order appended");
        assert_eq!(five[&2], vec![Some(13)]);
        assert_eq!(found.mark_crcs[&6][&1], vec![Some(21)]);
        assert_eq!(found.mark_crcs[&6][&2], vec![Some(22)]);
        assert!(
            scan(&bytes, true, None).mark_crcs.is_empty(),
            "no synced length: no deferred mark"
        );
        let (_dir, j) = opened_as(&bytes, found);
        assert_eq!(j.deferred_mark_crcs(5)[&1], vec![Some(12), None]);
        // A payload that does not fit the count: an unusable header.
        let mut bad = Vec::new();
        encode_mark_with_crcs(&mut bad, 5, 0, 3, Mark::AfterFold, &[1, 2, 3]);
        bad[20..24].copy_from_slice(&9u32.to_le_bytes());
        let crc = crc32c::crc32c(&bad[4..28]);
        bad[28..32].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(parse(&bad, true), Err(Bad::Header)));
    }

    /// A version 2 journal is read as it is and its marks go without
    /// checksums, a version 3 journal's records without bases (a binary of
    /// that version reads the file still), until it is emptied, when it
    /// takes version 4's header.
    #[test]
    fn an_older_journal_takes_the_new_fields_once_emptied() {
        for version in [2, 3] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("j");
            let mut bytes = header_version(version).to_vec();
            encode(&mut bytes, Kind::Delta, 5, 4, 0, &[7u8; 4096]);
            std::fs::write(&path, &bytes).unwrap();
            let mut j = ParityJournal::open(&path).unwrap();
            assert_eq!(j.takes_mark_crcs(), version == 3);
            assert!(!j.takes_record_bases());
            assert_eq!(j.stripe_log(5).unwrap().len(), 1);
            assert_eq!(j.row_base(5, 0), None, "a record without a base");
            j.forget(5, 0, 1);
            assert!(j.reset_if_empty().unwrap(), "emptied");
            assert!(j.takes_mark_crcs() && j.takes_record_bases());
            assert_eq!(std::fs::read(&path).unwrap(), header().to_vec());
        }
        assert_eq!(header_version_of(&header()), Some(4));
        assert_eq!(header_kind(&header_version(2)), Some(true));
        assert_eq!(header_kind(&header_version(1)), Some(false));
        assert_eq!(
            header_version_of(&header_version(5)),
            None,
            "a newer version is refused"
        );
    }

    /// Records carry each row's base (the parity block's checksum as they
    /// were appended); a row's base is known where every live record of
    /// it carries one and all agree, and it survives a reopen and a
    /// compaction, and ends with the records.
    #[test]
    fn a_rows_base_is_known_where_its_live_records_agree() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut j = ParityJournal::open(&path).unwrap();
        let mut r = Vec::new();
        // Stripe 5 (plog): rows 0 and 1 on base 7; row 1 again, on 7.
        encode_with_bases(
            &mut r,
            Kind::Delta,
            5,
            4,
            0,
            &[1u8; 8192],
            &[Some(7), Some(7)],
        );
        encode_with_bases(&mut r, Kind::Delta, 5, 4, 1, &[2u8; 4096], &[Some(7)]);
        // Row 2: two deltas on different bases (the parity changed in
        // place under them); row 3: a base not known.
        encode_with_bases(&mut r, Kind::Delta, 5, 4, 2, &[3u8; 4096], &[Some(7)]);
        encode_with_bases(&mut r, Kind::Delta, 5, 4, 2, &[4u8; 4096], &[Some(8)]);
        encode_with_bases(&mut r, Kind::Delta, 5, 4, 3, &[5u8; 4096], &[None]);
        // Stripe 6 (parix): d(0) carries none; the latest d(r) of each
        // block counts, of every data role in the row.
        encode(&mut r, Kind::Original, 6, 0, 0, &[6u8; 4096]);
        encode_with_bases(&mut r, Kind::Value, 6, 0, 0, &[7u8; 4096], &[Some(3)]);
        encode_with_bases(&mut r, Kind::Value, 6, 0, 0, &[8u8; 4096], &[Some(9)]);
        encode_with_bases(&mut r, Kind::Value, 6, 1, 0, &[9u8; 4096], &[Some(9)]);
        // Stripe 8: a record without bases (as an older binary's).
        encode(&mut r, Kind::Delta, 8, 4, 0, &[1u8; 4096]);
        j.append(&r).unwrap();
        let expect = |j: &ParityJournal, when: &str| {
            assert_eq!(j.row_base(5, 0), Some(7), "{when}");
            assert_eq!(j.row_base(5, 1), Some(7), "{when}");
            assert_eq!(j.row_base(5, 2), None, "{when}: two bases");
            assert_eq!(j.row_base(5, 3), None, "{when}: not known");
            assert_eq!(j.row_base(5, 4), None, "{when}: no record");
            assert_eq!(j.row_base(6, 0), Some(9), "{when}: the latest d(r)");
            assert_eq!(j.row_base(8, 0), None, "{when}: none carried");
        };
        expect(&j, "appended");
        // The payload of a record with bases: its blocks, then 8 bytes a
        // row padded to 32.
        let mut one = Vec::new();
        encode_with_bases(
            &mut one,
            Kind::Delta,
            5,
            4,
            0,
            &[1u8; 8192],
            &[Some(7), None],
        );
        assert_eq!(one.len(), 32 + 8192 + 32);
        assert_eq!(
            &one[32 + 8192..32 + 8192 + 16],
            &[7, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        flush(&mut j);
        drop(j);
        let mut j = ParityJournal::open(&path).unwrap();
        expect(&j, "reopened");
        j.compact().unwrap();
        expect(&j, "compacted");
        drop(j);
        let mut j = ParityJournal::open(&path).unwrap();
        expect(&j, "reopened after the compaction");
        // A mark ends the row's records and their base; a record appended
        // after it carries the parity's new checksum.
        let mut r = Vec::new();
        encode_mark(&mut r, 5, 0, 1, Mark::AfterFold);
        j.append(&r).unwrap();
        assert_eq!(j.row_base(5, 0), None);
        let mut r = Vec::new();
        encode_with_bases(&mut r, Kind::Delta, 5, 4, 0, &[1u8; 4096], &[Some(11)]);
        j.append(&r).unwrap();
        assert_eq!(j.row_base(5, 0), Some(11));
        assert_eq!(j.row_base(5, 1), Some(7));
    }

    /// Where the journal's chunk server never restarted since its marks
    /// were appended (`Superblock::boot_stamp`), a fold's mark past the
    /// synced length stands (its parity write was answered before it was
    /// sent); a mark written before its parity stays deferred, with every
    /// row it ends (a fold's mark on such a row too).
    #[test]
    fn a_folds_mark_stands_where_its_server_never_restarted() {
        let mut bytes = deltas(&[5, 6, 8], 3);
        let synced = bytes.len() as u64;
        encode_mark(&mut bytes, 5, 0, 2, Mark::AfterFold);
        encode_mark(&mut bytes, 6, 0, 2, Mark::BeforeParity);
        encode_mark(&mut bytes, 8, 0, 1, Mark::BeforeParity);
        encode_mark(&mut bytes, 8, 0, 3, Mark::AfterFold);
        let found = scan(&bytes, true, Some(synced));
        let (_dir, mut j) = opened_as(&bytes, found);
        assert_eq!(j.deferred_rows(5), BTreeSet::from([0, 1]));
        assert_eq!(j.deferred_rows(8), BTreeSet::from([0, 1, 2]));
        j.trust_fold_marks();
        assert!(j.deferred_rows(5).is_empty(), "the fold's mark stands");
        assert!(j.stripe_log(5).unwrap().keys().all(|&(_, row)| row == 2));
        assert_eq!(j.deferred_rows(6), BTreeSet::from([0, 1]), "before parity");
        assert_eq!(j.deferred_rows_before_parity(6), BTreeSet::from([0, 1]));
        assert_eq!(
            j.deferred_rows(8),
            BTreeSet::from([0]),
            "the row a mark before parity ends, only"
        );
        // Given back as before: stripe 8's row 0 alone.
        j.restore_deferred_rows(8, &BTreeSet::from([0]));
        let log = j.stripe_log(8).unwrap();
        assert!(log.contains_key(&(4, 0)), "row 0 given back");
        assert!(!log.contains_key(&(4, 1)) && !log.contains_key(&(4, 2)));
    }

    /// A mark written before its parity past the synced length keeps back
    /// only rows whose records were all flushed: a record past the synced
    /// length may be one a later write superseded, and a parity write that
    /// landed with the bytes the parity held already looks as if it had
    /// not (the model proptest's zeroes over a written stripe). A fold's
    /// mark keeps its rows back either way.
    #[test]
    fn a_mark_before_its_parity_keeps_back_only_rows_of_flushed_records() {
        let mut bytes = header().to_vec();
        encode(&mut bytes, Kind::Delta, 8, 4, 0, &[1u8; 4096]);
        encode(&mut bytes, Kind::Delta, 9, 4, 0, &[1u8; 4096]);
        let synced = bytes.len() as u64;
        encode(&mut bytes, Kind::Delta, 8, 4, 1, &[2u8; 4096]);
        encode(&mut bytes, Kind::Delta, 9, 4, 1, &[2u8; 4096]);
        encode_mark(&mut bytes, 8, 0, 2, Mark::BeforeParity);
        encode_mark(&mut bytes, 9, 0, 2, Mark::AfterFold);
        let found = scan(&bytes, true, Some(synced));
        assert_eq!(
            found.deferred[&8].1,
            BTreeSet::from([0]),
            "row 1's record was not flushed"
        );
        assert_eq!(found.before_parity[&8], BTreeSet::from([0]));
        assert_eq!(
            found.deferred[&9].1,
            BTreeSet::from([0, 1]),
            "a fold's mark"
        );
        assert!(!found.before_parity.contains_key(&9));
    }

    /// A replay reads a stripe's logged blocks in `logged_blocks` order,
    /// batched: that order must be the same in every process (the cluster
    /// simulator's seed 26547 replayed differently each run while it
    /// followed a `HashMap`'s per-process order), so it is the entries'
    /// (role, block) order, whatever order they were logged in.
    #[test]
    fn a_stripe_log_reads_in_role_and_block_order_whatever_the_append_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut j = ParityJournal::open(&path).unwrap();
        let mut r = Vec::new();
        for role in (0..4u16).rev() {
            for block in (0..8u32).rev() {
                encode(&mut r, Kind::Delta, 5, role, block, &[block as u8; 4096]);
            }
        }
        j.append(&r).unwrap();
        drop(j);
        let j = ParityJournal::open(&path).unwrap();
        let log = j.stripe_log(5).unwrap();
        let keys: Vec<(u16, u32)> = log.keys().copied().collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(keys.len(), 32);
        assert_eq!(keys, sorted);
        let want: Vec<u64> = sorted.iter().flat_map(|k| log[k].deltas.clone()).collect();
        assert_eq!(logged_blocks(&log), want);
    }

    #[test]
    fn a_torn_journal_tail_is_cut_and_earlier_records_survive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut j = ParityJournal::open(&path).unwrap();
        let mut r = Vec::new();
        encode(&mut r, Kind::Delta, 1, 4, 0, &[5u8; 4096]);
        j.append(&r).unwrap();
        let good = j.bytes();
        let mut r2 = Vec::new();
        encode(&mut r2, Kind::Delta, 2, 4, 0, &[6u8; 4096]);
        drop(j);
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&r2[..100], good).unwrap();
        drop(f);
        let j = ParityJournal::open(&path).unwrap();
        assert_eq!(j.bytes(), good);
        assert_eq!(j.stripes(), vec![1]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), good);
        let mut j = j;
        let lost = j.take_lost();
        assert_eq!(
            lost.stripes,
            BTreeSet::from([2]),
            "the torn record's header names its stripe"
        );
    }

    /// Found while writing the `parity_journal` fuzz target (confirmed
    /// with it): a record whose blocks run past u32::MAX, its checksums
    /// valid, overflowed the block number while indexing; its header is
    /// now unusable (the journal's stripes are reported lost).
    #[test]
    fn a_record_whose_blocks_run_past_u32_max_is_an_unusable_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        drop(ParityJournal::open(&path).unwrap());
        let mut r = Vec::new();
        encode(&mut r, Kind::Value, 3, 0, u32::MAX, &[1u8; 8192]);
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&r, HEADER_BYTES).unwrap();
        drop(f);
        let mut j = ParityJournal::open(&path).unwrap();
        assert!(j.stripes().is_empty());
        assert!(j.take_lost().unknown_stripes);
    }

    /// Format 1 (a journal in a file of its own): the synced length
    /// recorded beside it after a flush tells, at the next open, the rows
    /// of records appended since (they may be torn from their data writes)
    /// from the flushed ones; no record appended before a flush counts as
    /// flushed; a record torn by a cut falls back to the other slot; a
    /// record that does not match the journal counts nothing as flushed;
    /// and a journal without one (an array made before it existed) takes
    /// every record as flushed, as before.
    #[test]
    fn a_journal_in_a_file_of_its_own_tells_records_appended_after_the_last_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let synced_path = SyncedRecord::path_for(&path);
        let delta = |stripe: u64, row: u32| {
            let mut r = Vec::new();
            encode(&mut r, Kind::Delta, stripe, 4, row, &[row as u8 + 1; 4096]);
            r
        };
        let mut j = ParityJournal::open(&path).unwrap();
        j.append(&delta(3, 0)).unwrap();
        drop(j);
        let j = ParityJournal::open(&path).unwrap();
        assert_eq!(
            j.unsynced_rows(3),
            BTreeSet::from([0]),
            "appended before any flush: not flushed"
        );
        let mut j = j;
        // A flush: the point, the file's sync, the devices' (here none),
        // then the record.
        let point = j.flush_point().expect("format 1");
        j.sync().unwrap();
        j.record_flushed(point).unwrap();
        j.append(&delta(3, 1)).unwrap();
        j.append(&delta(4, 2)).unwrap();
        drop(j);
        let j = ParityJournal::open(&path).unwrap();
        assert_eq!(j.unsynced_rows(3), BTreeSet::from([1]), "row 0 was flushed");
        assert_eq!(j.unsynced_rows(4), BTreeSet::from([2]));

        // The slot written last torn: the one before counts (row 0 only
        // flushed, as recorded there).
        let mut j = j;
        let point = j.flush_point().unwrap();
        j.sync().unwrap();
        j.record_flushed(point).unwrap();
        drop(j);
        let seq_slot = |bytes: &[u8], i: usize| {
            let at = i * SYNCED_SLOT_SPACING as usize;
            SyncedRecord::parse(bytes[at..at + 32].try_into().unwrap()).map(|(seq, ..)| seq)
        };
        let bytes = std::fs::read(&synced_path).unwrap();
        let last = (0..2).max_by_key(|&i| seq_slot(&bytes, i)).unwrap();
        let f = OpenOptions::new().write(true).open(&synced_path).unwrap();
        f.write_all_at(&[0xff; 8], last as u64 * SYNCED_SLOT_SPACING + 8)
            .unwrap();
        drop(f);
        let j = ParityJournal::open(&path).unwrap();
        assert_eq!(j.unsynced_rows(3), BTreeSet::from([1]), "the older slot");
        assert_eq!(j.unsynced_rows(4), BTreeSet::from([2]));
        drop(j);

        // A record of another journal (emptied and written again by an
        // older binary): nothing counts as flushed.
        let mut bytes = header().to_vec();
        encode(&mut bytes, Kind::Delta, 6, 4, 0, &[9u8; 4096]);
        bytes.extend_from_slice(&delta(3, 1));
        std::fs::write(&path, &bytes).unwrap();
        let j = ParityJournal::open(&path).unwrap();
        assert_eq!(
            j.unsynced_rows(6),
            BTreeSet::from([0]),
            "a record that does not match: nothing flushed"
        );
        assert_eq!(j.unsynced_rows(3), BTreeSet::from([1]));
        drop(j);

        // No record at all (made before it existed): every record flushed,
        // as before.
        std::fs::remove_file(&synced_path).unwrap();
        let j = ParityJournal::open(&path).unwrap();
        assert!(j.unsynced_rows(3).is_empty() && j.unsynced_rows(6).is_empty());
    }

    /// A bad record past the synced length is an append a cut tore or
    /// dropped, and what follows it was appended after it: cut with it (a
    /// later plog delta kept without an earlier one of its block folds to
    /// neither value: the power-loss schedule 77001080, format 1). Below
    /// the synced length a bad record is rot: skipped, the rest kept.
    #[test]
    fn a_record_after_a_hole_past_the_synced_length_is_cut_with_the_torn_tail() {
        let mut bytes = header().to_vec();
        encode(&mut bytes, Kind::Delta, 1, 4, 0, &[1u8; 4096]);
        let synced = bytes.len() as u64;
        // A hole: an append the cut dropped, then one it kept.
        bytes.resize(bytes.len() + 32 + 4096, 0);
        encode(&mut bytes, Kind::Delta, 2, 4, 0, &[2u8; 4096]);
        let found = scan(&bytes, true, Some(synced));
        assert_eq!(found.index.keys().collect::<Vec<_>>(), vec![&1]);
        assert_eq!(found.end as u64, synced, "cut at the hole");
        assert!(found.lost.unknown_stripes);
        // The same bytes all below the synced length: the hole is skipped.
        let found = scan(&bytes, true, Some(bytes.len() as u64));
        let mut stripes: Vec<u64> = found.index.keys().copied().collect();
        stripes.sort_unstable();
        assert_eq!(stripes, vec![1, 2]);
        assert_eq!(found.end, bytes.len());
        // Not known (format 1 before the record): skipped, as before.
        assert_eq!(scan(&bytes, true, None).index.len(), 2);
    }

    /// Format 2: a device's sync point stops below an append still in
    /// flight, even where one placed after it has finished (its length
    /// covered both, and a cut that kept the earlier append's record made
    /// it read as flushed at the next open: docs/format.md, "Records past
    /// the synced length"); so does format 1's flush point.
    #[test]
    fn a_sync_point_stops_below_an_append_still_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let (dev, storage, path) = journal_in_an_area(dir.path());
        let mut j = ParityJournal::open_in(Arc::clone(&storage), &path).unwrap();
        let a = j.begin_append(value(1, 0xa1)).unwrap();
        let a_at = a.offset;
        let b = j.begin_append(value(2, 0xb2)).unwrap();
        run(&b).unwrap();
        j.finish_append(b, Ok(())).unwrap();
        let point = j.sync_point().expect("format 2");
        assert_eq!(point.point.len, a_at, "not past the append in flight");
        run(&a).unwrap();
        j.finish_append(a, Ok(())).unwrap();
        dev.sync().unwrap();
        j.sync_after_device_sync(Some(point)).unwrap();
        drop(j);
        let j = ParityJournal::open_in(Arc::clone(&storage), &path).unwrap();
        assert_eq!(
            j.unsynced_rows(1),
            BTreeSet::from([0]),
            "appended after the point"
        );
        assert_eq!(j.unsynced_rows(2), BTreeSet::from([0]));

        // Format 1: the flush point takes the same bound.
        let path = dir.path().join("j1");
        let mut j = ParityJournal::open(&path).unwrap();
        let a = j.begin_append(value(1, 0xa1)).unwrap();
        let b = j.begin_append(value(2, 0xb2)).unwrap();
        run(&b).unwrap();
        j.finish_append(b, Ok(())).unwrap();
        assert_eq!(j.flush_point().unwrap().len, a.offset);
        run(&a).unwrap();
        j.finish_append(a, Ok(())).unwrap();
    }

    /// A mark held until the writes it stands for are answered
    /// ([`ParityJournal::append_held`]) is counted synced by no sync: not
    /// by a device's sync point, not by the journal's own sync, not by a
    /// sync without a point (a flush's fallback), not by one whose point
    /// came before a reset; found past the synced length at the next
    /// open, it is deferred (weighed against the parity block). Released,
    /// the next sync counts it.
    #[test]
    fn a_held_mark_is_counted_synced_by_no_sync_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let (dev, storage, path) = journal_in_an_area(dir.path());
        let mark = |stripe: u64| {
            let mut r = Vec::new();
            encode_mark(&mut r, stripe, 0, 1, Mark::BeforeParity);
            r
        };
        type Sync<'a> = &'a dyn Fn(&mut ParityJournal);
        let syncs: [(&str, Sync); 4] = [
            ("the journal's sync", &|j| j.sync().unwrap()),
            ("a sync without a point", &|j| {
                j.sync_after_device_sync(None).unwrap()
            }),
            ("a device's sync point", &|j| {
                let point = j.sync_point().unwrap();
                dev.sync().unwrap();
                j.sync_after_device_sync(Some(point)).unwrap();
            }),
            ("the prepared commit of a point", &|j| {
                let point = j.sync_point().unwrap();
                dev.sync().unwrap();
                let done = match j.prepare_sync_after_device_sync(&point) {
                    Some(Ok(Some(commit))) => {
                        let (at, bytes) = commit.write();
                        commit.device().write_at(bytes, at).unwrap();
                        commit.device().sync().unwrap();
                        Some(commit.finish(Ok(())))
                    }
                    Some(Ok(None)) => None,
                    _ => panic!("a point of this file prepares"),
                };
                if let Some(done) = done {
                    j.note_prepared_sync(&done);
                }
            }),
        ];
        for (i, (how, sync)) in syncs.iter().enumerate() {
            let stripe = i as u64 + 1;
            let mut j = ParityJournal::open_in(Arc::clone(&storage), &path).unwrap();
            j.append(&value(stripe, 0xa0 + i as u8)).unwrap();
            j.sync().unwrap();
            let hold = j.append_held(&mark(stripe)).unwrap();
            sync(&mut j);
            drop(j);
            let mut j = ParityJournal::open_in(Arc::clone(&storage), &path).unwrap();
            assert_eq!(
                j.deferred_rows(stripe),
                BTreeSet::from([0]),
                "{how}: the held mark is past the synced length"
            );
            drop(hold);
            // The mark stands from now on (as the caller's resync at open
            // decides); a new mark of the stripe, released, is synced.
            j.settle_all_deferred();
            j.append(&value(stripe, 0xb0 + i as u8)).unwrap();
            let hold = j.append_held(&mark(stripe)).unwrap();
            j.release_mark(hold);
            sync(&mut j);
            drop(j);
            let j = ParityJournal::open_in(Arc::clone(&storage), &path).unwrap();
            assert!(
                j.deferred_rows(stripe).is_empty(),
                "{how}: released, the mark is synced"
            );
        }

        // A point taken before a reset (the journal emptied) and finished
        // after a held mark was appended to the emptied file.
        let mut j = ParityJournal::open_in(Arc::clone(&storage), &path).unwrap();
        j.settle_all_deferred();
        for stripe in 1..=4 {
            let mut end = Vec::new();
            encode_mark(&mut end, stripe, 0, 1, Mark::AfterFold);
            j.append(&end).unwrap();
        }
        assert!(j.is_empty(), "every stripe ended");
        j.append(&value(9, 0xc0)).unwrap();
        j.append(&value(9, 0xc1)).unwrap();
        let mut end = Vec::new();
        encode_mark(&mut end, 9, 0, 1, Mark::AfterFold);
        j.append(&end).unwrap();
        let point = j.sync_point().unwrap();
        assert!(j.reset_if_empty().unwrap(), "emptied");
        j.append(&value(9, 0xc2)).unwrap();
        let _hold = j.append_held(&mark(9)).unwrap();
        dev.sync().unwrap();
        j.sync_after_device_sync(Some(point)).unwrap();
        drop(j);
        let j = ParityJournal::open_in(Arc::clone(&storage), &path).unwrap();
        assert_eq!(
            j.deferred_rows(9),
            BTreeSet::from([0]),
            "a point from before a reset: the held mark is past the synced length"
        );
    }

    /// A memory device whose metadata area holds a parity journal (format
    /// 2), seen through the array's metadata storage rooted at `dir`: the
    /// device, the storage and the journal's path.
    fn journal_in_an_area(dir: &Path) -> (Arc<dyn Device>, Arc<dyn Storage>, PathBuf) {
        let dev: Arc<dyn Device> = Arc::new(crate::media::MemDevice::new("d0", 8 << 20));
        let area = Arc::new(
            crate::media::area::AreaFs::format(Arc::clone(&dev), 1 << 20, 4 << 20).unwrap(),
        );
        let meta = super::super::meta::MetaStorage::new(
            OsStorage::shared(),
            dir,
            vec![Some(area)],
            vec![0],
        );
        std::fs::create_dir_all(dir.join("journal")).unwrap();
        (dev, Arc::new(meta), dir.join("journal/dev0.jrnl"))
    }

    fn run(w: &JournalWrite) -> std::io::Result<()> {
        let (results, _) = crate::media::submit(&mut w.device_ios());
        results.into_iter().collect()
    }

    fn value(stripe: u64, byte: u8) -> Vec<u8> {
        let mut r = Vec::new();
        encode(&mut r, Kind::Value, stripe, 0, 0, &[byte; 4096]);
        r
    }

    /// Appends in the same batch as data writes are begun, written and
    /// finished by request threads that run at once: each takes its own
    /// place, and they may finish in any order.
    #[test]
    fn appends_in_flight_take_their_own_places_and_finish_in_any_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut j = ParityJournal::open(&path).unwrap();
        let a = j.begin_append(value(1, 0xa1)).unwrap();
        let b = j.begin_append(value(2, 0xb2)).unwrap();
        assert!(j.appends_in_flight());
        run(&b).unwrap();
        j.finish_append(b, Ok(())).unwrap();
        assert!(
            !j.reset_if_empty().unwrap(),
            "never emptied under an append"
        );
        run(&a).unwrap();
        j.finish_append(a, Ok(())).unwrap();
        assert!(!j.appends_in_flight());
        let read = |j: &ParityJournal, stripe: u64| {
            let at = j.stripe_log(stripe).unwrap()[&(0, 0)].latest.unwrap();
            let mut buf = vec![0u8; 4096];
            j.read_block(at, &mut buf).unwrap();
            buf[0]
        };
        assert_eq!((read(&j, 1), read(&j, 2)), (0xa1, 0xb2));
        j.sync().unwrap();
        drop(j);
        let mut j = ParityJournal::open(&path).unwrap();
        assert_eq!((read(&j, 1), read(&j, 2)), (0xa1, 0xb2));
        assert!(j.take_lost().is_empty());

        // A failed append with a later one in flight leaves a hole that
        // open reports; one with none after it is cut.
        j.faults().fail_appends.store(true, Relaxed);
        let good_end = j.bytes();
        assert!(j.begin_append(value(3, 0xc3)).is_err());
        assert_eq!(j.bytes(), good_end, "cut back: nothing after it");
        j.faults().fail_appends.store(false, Relaxed);
        let c = j.begin_append(value(4, 0xd4)).unwrap();
        let d = j.begin_append(value(5, 0xe5)).unwrap();
        assert!(j
            .finish_append(c, Err(std::io::Error::from_raw_os_error(libc::EIO)))
            .is_err());
        assert!(!j.is_reserved(), "no appends until space is reserved again");
        run(&d).unwrap();
        j.finish_append(d, Ok(())).unwrap();
        assert!(!j.has_stripe(4) && j.has_stripe(5));
        // Not flushed: the hole lies past the synced length, where it is
        // a torn tail, and the append after it is cut with it.
        j.sync().unwrap();
        drop(j);
        let mut j = ParityJournal::open(&path).unwrap();
        assert!(!j.has_stripe(5), "cut with the hole before it");
        assert!(j.take_lost().unknown_stripes, "the hole is reported");
        drop(j);
        // Flushed: the append after the hole survives.
        let mut j = ParityJournal::open(&path).unwrap();
        let c = j.begin_append(value(4, 0xd4)).unwrap();
        let d = j.begin_append(value(5, 0xe5)).unwrap();
        assert!(j
            .finish_append(c, Err(std::io::Error::from_raw_os_error(libc::EIO)))
            .is_err());
        run(&d).unwrap();
        j.finish_append(d, Ok(())).unwrap();
        flush(&mut j);
        drop(j);
        let mut j = ParityJournal::open(&path).unwrap();
        assert_eq!(read(&j, 5), 0xe5, "the append after the hole survives");
        assert!(!j.has_stripe(3) && !j.has_stripe(4));
        assert!(j.take_lost().unknown_stripes, "the hole is reported");
    }

    /// Appended records are indexed without checksumming their payload
    /// again (`seal` did, once): the index they get must be the one that
    /// open, checking everything, rebuilds from the file.
    #[test]
    fn the_index_built_at_append_is_the_one_open_rebuilds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut j = ParityJournal::open(&path).unwrap();
        for s in 0..6u64 {
            let mut r = Vec::new();
            encode(&mut r, Kind::Original, s, 1, 3, &[s as u8; 8192]);
            encode(&mut r, Kind::Value, s, 1, 3, &[0x80 | s as u8; 8192]);
            encode(&mut r, Kind::Delta, s, 4, 0, &[0x40 | s as u8; 4096]);
            if s % 3 == 2 {
                encode_invalidate(&mut r, s - 1, 0, 8);
            }
            j.append(&r).unwrap();
        }
        type Logs = Vec<(u64, Vec<((u16, u32), BlockLog)>)>;
        let logs = |j: &ParityJournal| -> Logs {
            j.stripes()
                .into_iter()
                .map(|s| {
                    let mut l: Vec<_> = j.stripe_log(s).unwrap().into_iter().collect();
                    l.sort_by_key(|(k, _)| *k);
                    (s, l)
                })
                .collect()
        };
        let appended = logs(&j);
        assert_eq!(appended.len(), 4, "two stripes invalidated");
        j.sync().unwrap();
        drop(j);
        let mut j = ParityJournal::open(&path).unwrap();
        assert_eq!(logs(&j), appended);
        assert!(j.take_lost().is_empty());
    }

    fn journal_of_three_stripes(path: &Path) -> (ParityJournal, Vec<u64>) {
        let mut j = ParityJournal::open(path).unwrap();
        let mut starts = Vec::new();
        for s in 1..=3u64 {
            starts.push(j.bytes());
            let mut r = Vec::new();
            encode(&mut r, Kind::Original, s, 0, 0, &[s as u8; 4096]);
            encode(&mut r, Kind::Value, s, 0, 0, &[10 + s as u8; 4096]);
            j.append(&r).unwrap();
        }
        flush(&mut j);
        (j, starts)
    }

    /// What a flush does to a journal in a file of its own: its file
    /// synced, then (the devices synced) its synced length recorded.
    fn flush(j: &mut ParityJournal) {
        let point = j.flush_point().expect("a journal in a file of its own");
        j.sync().unwrap();
        j.record_flushed(point).unwrap();
    }

    fn flip(path: &Path, at: u64) {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    }

    #[test]
    fn a_bad_payload_in_the_middle_loses_only_its_stripe_and_later_records_survive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (j, starts) = journal_of_three_stripes(&path);
        let end = j.bytes();
        drop(j);
        flip(&path, starts[1] + 32 + 100);
        let mut j = ParityJournal::open(&path).unwrap();
        assert_eq!(j.bytes(), end, "nothing is cut");
        assert!(!j.has_original(2, 0, 0), "the bad d(0) record is skipped");
        assert!(j.has_original(3, 0, 0), "the records after it are kept");
        let lost = j.take_lost();
        assert_eq!(lost.stripes, BTreeSet::from([2]));
        assert!(!lost.unknown_stripes);
    }

    #[test]
    fn a_bad_header_in_the_middle_means_unknown_stripes_lost_and_later_records_survive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (j, starts) = journal_of_three_stripes(&path);
        drop(j);
        flip(&path, starts[1] + 9);
        let mut j = ParityJournal::open(&path).unwrap();
        assert!(j.has_stripe(3), "the next record is found again");
        assert!(j.take_lost().unknown_stripes);
    }

    #[test]
    fn compaction_keeps_exactly_the_live_blocks_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (mut j, _) = journal_of_three_stripes(&path);
        let mut r = Vec::new();
        encode(&mut r, Kind::Value, 1, 0, 0, &[99u8; 4096]);
        encode_invalidate(&mut r, 2, 0, 8);
        j.append(&r).unwrap();
        let before = j.bytes();
        j.compact().unwrap();
        assert!(j.bytes() < before);
        assert_eq!(j.bytes(), HEADER_BYTES + 4 * (32 + 4096));
        let check = |j: &ParityJournal| {
            assert_eq!(j.stripes(), vec![1, 3]);
            let log = j.stripe_log(1).unwrap();
            let mut buf = vec![0u8; 4096];
            j.read_block(log[&(0, 0)].original.unwrap(), &mut buf)
                .unwrap();
            assert_eq!(buf, vec![1u8; 4096]);
            j.read_block(log[&(0, 0)].latest.unwrap(), &mut buf)
                .unwrap();
            assert_eq!(buf, vec![99u8; 4096]);
        };
        check(&j);
        let mut r = Vec::new();
        encode(&mut r, Kind::Value, 3, 0, 1, &[7u8; 4096]);
        j.append(&r).unwrap();
        drop(j);
        std::fs::write(compact_path(&path), b"a compaction cut short").unwrap();
        let mut j = ParityJournal::open(&path).unwrap();
        check(&j);
        assert!(j.stripe_log(3).unwrap().contains_key(&(0, 1)));
        assert!(j.take_lost().is_empty());
        assert!(!compact_path(&path).exists());
    }
}
