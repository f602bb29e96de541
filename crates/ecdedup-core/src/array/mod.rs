//! The erasure-coded array: N devices under one RS(k,m) geometry.
//!
//! An [`Array`] is the stripe client over one chunk store per device
//! ([`store`]: the device, its checksum table, dedup layer, parity journal
//! and counters); it owns the geometry, the codec, the write-intent log,
//! the stripe locks and the write policy, and sends the stores its device
//! I/O as batches of requests. Reads touch only the data unit when it
//! is healthy and decode from the other units otherwise; writes choose
//! full-stripe encode, read-modify-write (ISA-L delta update) or
//! reconstruct-write by whichever reads less (see [`io`]). Long operations
//! (resync, scrub, rebuild) live in [`maintenance`].
//!
//! Invariants:
//! - a stripe is read or written only under its stripe lock (shared for
//!   reads, exclusive for writes and maintenance), so the checksum table and
//!   the media agree whenever a lock is free;
//! - a device that returned an I/O error is failed at once and stays failed
//!   (the error is latched, never retried) until `replace` + `rebuild`;
//! - at most m devices are unavailable, or the array refuses I/O that would
//!   need more;
//! - a region of stripes is marked dirty in the intent log, durably, before
//!   any of its stripes is written, and cleared only after a flush.
//!
//! Lock order: stripe lock, then the config lock. Nothing that holds the
//! config lock takes a stripe lock.

mod assemble;
pub mod checksum;
mod decode;
pub mod degraded_log;
mod inspect;
pub mod intent;
mod io;
pub mod journal;
pub mod layout;
mod logging;
mod maintenance;
pub mod meta;
pub mod poison;
mod readd;
mod replay_fold;
mod store;
pub mod superblock;
#[cfg(test)]
mod tests;

pub use assemble::{assemble_from_devices, config_from_devices, force_assemble, replaced_members};
pub use inspect::inspect;
pub use layout::Geometry;
pub use logging::{WritePolicy, JOURNAL_BYTES_MIN};
pub use maintenance::ScrubReport;
pub use superblock::MemberState;

use crate::codec::Codec;
use crate::counters::{Counters, IoClass, Stats};
use crate::dedup::{DedupConfig, DedupDevice, Policy};
use crate::error::{Error, Result};
use crate::fingerprint::gpu::{choose_backend, BackendChoice};
use crate::fingerprint::FingerprintBackend;
use crate::media::area::AreaFs;
use crate::media::storage::{read_all, read_file, write_atomic, OsStorage, Storage, StorageLock};
use crate::media::{Device, FileDevice};
use checksum::ChecksumTable;
use intent::IntentLog;
use layout::SUPERBLOCK_BYTES;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, RwLock};
use store::ChunkStore;
use superblock::Superblock;

/// Stripe locks are shared by stripes with the same number modulo this.
pub const STRIPE_LOCKS: usize = 1024;
pub const CONFIG_FILE: &str = "array.json";
pub const INTENT_FILE: &str = "intent.map";
pub const DEGRADED_LOG_FILE: &str = "degraded.log";
pub const LOCK_FILE: &str = "lock";
pub use poison::POISON_FILE;
pub use readd::MISSED_FILE;

/// Medium read errors a device may return (each block decoded and
/// rewritten) before it is failed: Linux md's `max_read_errors` default.
pub const READ_ERRORS_MAX: u32 = 20;

/// Reports progress of a long operation: (what, done, total).
pub type ProgressFn = Arc<dyn Fn(&str, u64, u64) + Send + Sync>;

/// `array.json`: where the devices are. Geometry and state live in the
/// superblocks; this file only names the members in position order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConfigFile {
    pub format_version: u32,
    pub array_uuid: uuid::Uuid,
    pub devices: Vec<PathBuf>,
    #[serde(default = "default_region_bytes")]
    pub intent_region_bytes: u64,
    #[serde(default)]
    pub dedup: DedupConfig,
    #[serde(default)]
    pub write_policy: WritePolicy,
    /// Bound of each device's parity journal, bytes.
    #[serde(default = "default_journal_bytes")]
    pub journal_bytes_max: u64,
    /// Quiet time before a flush marks a write-intent region clean,
    /// milliseconds (tests set it low to reach replay at open).
    #[serde(default = "default_intent_clear_quiet_ms")]
    pub intent_clear_quiet_ms: u64,
    /// Which fingerprint backend the dedup layers use (cpu, gpu, auto);
    /// `serve --fingerprint-backend` overrides it for one run.
    #[serde(default)]
    pub fingerprint_backend: BackendChoice,
    /// Wear accounting by a simulated SSD under each device (`create
    /// --ssd-sim`, off by default; see `crate::ssd::wear`).
    #[serde(default)]
    pub ssd_sim: crate::ssd::SsdSimConfig,
    /// Device I/O through the page cache or `O_DIRECT` (arrays made before
    /// this field read as buffered).
    #[serde(default)]
    pub io: crate::media::IoMode,
    /// Device files left sparse (`create --sparse`; arrays made before this
    /// field were): discard punches holes instead of zeroing in place.
    #[serde(default = "default_sparse")]
    pub sparse: bool,
    /// RAM bound of the checksum tables of all devices together, bytes
    /// (split evenly between them; see `checksum`).
    #[serde(default = "default_checksum_cache_bytes")]
    pub checksum_cache_bytes_max: u64,
}

fn default_checksum_cache_bytes() -> u64 {
    checksum::CACHE_BYTES_DEFAULT
}

fn default_sparse() -> bool {
    true
}

impl ConfigFile {
    /// How the device files of this array are opened.
    pub fn device_options(&self) -> crate::media::DeviceOptions {
        crate::media::DeviceOptions {
            io: self.io,
            sparse: self.sparse,
        }
    }
}

fn default_intent_clear_quiet_ms() -> u64 {
    intent::QUIET_BEFORE_CLEAR.as_millis() as u64
}

fn default_region_bytes() -> u64 {
    intent::REGION_BYTES_DEFAULT
}

pub const JOURNAL_BYTES_DEFAULT: u64 = 256 << 20;
pub const JOURNAL_DIR: &str = "journal";

fn default_journal_bytes() -> u64 {
    JOURNAL_BYTES_DEFAULT
}

impl ConfigFile {
    pub fn load(dir: &Path) -> Result<ConfigFile> {
        ConfigFile::load_in(&OsStorage, dir)
    }

    /// Reads `array.json` from `dir` of `storage`.
    pub fn load_in(storage: &dyn Storage, dir: &Path) -> Result<ConfigFile> {
        let bytes = ConfigFile::read_in(storage, dir)?;
        ConfigFile::parse(&bytes, &dir.join(CONFIG_FILE))
    }

    /// [`ConfigFile::load_in`] for an open, under the folder's lock: a file
    /// that does not parse (NUL bytes after a power cut, a truncated or
    /// garbled file) is recovered from the newest copy on the devices
    /// (format 2), the damaged file kept aside; what happened is pushed to
    /// `warnings`.
    fn load_or_recover(
        storage: &dyn Storage,
        dir: &Path,
        warnings: &mut Vec<String>,
    ) -> Result<ConfigFile> {
        let bytes = ConfigFile::read_in(storage, dir)?;
        match serde_json::from_slice::<ConfigFile>(&bytes) {
            Ok(_) => ConfigFile::parse(&bytes, &dir.join(CONFIG_FILE)),
            Err(e) => {
                let (cfg, warning) =
                    assemble::recover_config(storage, dir, &bytes, &e.to_string())?;
                warnings.push(warning);
                Ok(cfg)
            }
        }
    }

    /// The bytes of `array.json` in `dir`; a missing file says how to make one.
    fn read_in(storage: &dyn Storage, dir: &Path) -> Result<Vec<u8>> {
        let path = dir.join(CONFIG_FILE);
        read_all(storage, &path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::Config(format!(
                    "{} holds no array (no {CONFIG_FILE}); run `ecdedup create` first",
                    dir.display()
                ))
            } else {
                Error::io(format!("reading {}", path.display()), e)
            }
        })
    }

    /// `array.json`'s bytes, read from `path`, checked.
    fn parse(bytes: &[u8], path: &Path) -> Result<ConfigFile> {
        let cfg: ConfigFile = serde_json::from_slice(bytes).map_err(|e| {
            Error::Corrupt(format!(
                "{}: {e} (an open, by `serve` or `scrub`, recovers it from the copies \
                     on the devices of a format 2 array)",
                path.display()
            ))
        })?;
        if cfg.format_version != 1 {
            return Err(Error::Corrupt(format!(
                "{}: format version {} unknown",
                path.display(),
                cfg.format_version
            )));
        }
        Ok(cfg)
    }

    /// Writes atomically: temporary file, fsync, rename, fsync of the folder.
    pub fn store(&self, dir: &Path) -> Result<()> {
        self.store_in(&OsStorage, dir)
    }

    /// [`ConfigFile::store`] into `dir` of `storage`. A file that already
    /// holds these bytes is left alone: every rewrite is a window for a
    /// power cut, so the config is written only when it changes.
    pub fn store_in(&self, storage: &dyn Storage, dir: &Path) -> Result<()> {
        let path = dir.join(CONFIG_FILE);
        let text = serde_json::to_string_pretty(self).expect("config serialises");
        if read_all(storage, &path).ok().as_deref() == Some(text.as_bytes()) {
            return Ok(());
        }
        self.write_in(storage, dir)
    }

    /// Writes the config whatever the file holds.
    pub(crate) fn write_in(&self, storage: &dyn Storage, dir: &Path) -> Result<()> {
        let path = dir.join(CONFIG_FILE);
        let text = serde_json::to_string_pretty(self).expect("config serialises");
        write_atomic(storage, &path, text.as_bytes())
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }
}

/// What `create` needs.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// Device paths in position order; missing files are created sparse.
    pub devices: Vec<PathBuf>,
    pub k: u32,
    pub m: u32,
    pub stripe_unit_bytes: u32,
    pub volume_bytes: u64,
    pub intent_region_bytes: u64,
    pub dedup: DedupConfig,
    pub write_policy: WritePolicy,
    pub journal_bytes_max: u64,
    /// Device I/O mode (`--io`).
    pub io: crate::media::IoMode,
    /// Leave new device files sparse (`--sparse`) instead of allocating them.
    pub sparse: bool,
    /// Overwrite devices that hold a file system, LVM, a partition table
    /// (`--force`).
    pub force: bool,
    /// Where the journals, dedup maps and logs live (`--metadata`).
    pub metadata: MetadataPlacement,
}

/// Where an array's metadata (parity journals, dedup maps, the
/// write-intent map, the degraded-write and missed-write logs) lives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetadataPlacement {
    /// In a metadata area on each device (format 2): each device carries
    /// its journal and dedup maps, and a copy of the array-wide logs.
    #[default]
    Devices,
    /// In the array folder (format 1): a separate (fast) file system.
    Folder,
}

impl std::str::FromStr for MetadataPlacement {
    type Err = Error;
    fn from_str(s: &str) -> Result<MetadataPlacement> {
        match s {
            "device" | "devices" => Ok(MetadataPlacement::Devices),
            "folder" => Ok(MetadataPlacement::Folder),
            _ => Err(Error::Config(format!(
                "metadata placement {s:?}: device or folder"
            ))),
        }
    }
}

/// Most bytes the degraded-write log may take in each metadata area: it
/// holds the values written to missing units since the last flush or
/// checkpoint (a degraded write that would pass it waits for a checkpoint
/// of the log: every device synced, the records dropped).
pub const DEGRADED_LOG_AREA_BYTES_MAX: u64 = 64 << 20;

/// The degraded-write log's bound (its room in each area): twice the
/// device's data (a rewrite between flushes logs again), from 1 MiB to
/// [`DEGRADED_LOG_AREA_BYTES_MAX`], and at least twice what one stripe
/// write appends.
pub fn degraded_log_area_bytes(geo: &Geometry) -> u64 {
    let data_bytes = geo.rows_per_device() * geo.unit_bytes();
    let stripe =
        degraded_log::stripe_records_bytes_max(geo.k(), geo.m(), geo.unit_bytes(), geo.block());
    (2 * data_bytes)
        .clamp(1 << 20, DEGRADED_LOG_AREA_BYTES_MAX)
        .max(4096 + 2 * stripe)
}

/// The geometry `create` gives these options: with a metadata area on
/// each device sized for everything the options let it hold.
pub fn geometry_for(opts: &CreateOptions) -> Result<Geometry> {
    let n = opts.devices.len() as u32;
    let geo = Geometry::new(n, opts.k, opts.m, opts.stripe_unit_bytes, opts.volume_bytes)?;
    if opts.metadata == MetadataPlacement::Folder {
        return Ok(geo);
    }
    geo.with_meta_area(meta_area_bytes_for(opts, &geo))
}

/// Bytes of each device's metadata area for these options: room for
/// every file twice where it is replaced by a new copy (`NAME.tmp`), and
/// a quarter as much again for extents that do not fit end to end.
pub fn meta_area_bytes_for(opts: &CreateOptions, geo: &Geometry) -> u64 {
    use crate::media::area::{EXTENTS_OFFSET, UNIT_BYTES};
    let file = |b: u64| b.div_ceil(UNIT_BYTES) * UNIT_BYTES;
    let spr = IntentLog::stripes_per_region(geo.stripe_data_bytes(), opts.intent_region_bytes);
    let map = file(4096 + geo.stripes.div_ceil(spr));
    let mut b = 2 * map // intent.map
        + 2 * map // missed.map
        + 2 * file(256 << 10) // array.json
        + file(degraded_log_area_bytes(geo))
        + 2 * file(poison::FILE_BYTES_MAX);
    if opts.write_policy.journals() {
        b += 2 * file(opts.journal_bytes_max);
    }
    if opts.dedup.policy != Policy::None {
        let data_bytes = geo.rows_per_device() * geo.unit_bytes();
        let slots = data_bytes / opts.dedup.block_bytes.max(1) as u64;
        // Snapshot: a 4-byte map entry per slot and a fingerprint (up to
        // 32 bytes) with its slot number; the log is compacted at
        // LOG_COMPACT_BYTES.
        b += 2 * file(64 + slots * (4 + 4 + 32))
            + file(crate::dedup::LOG_COMPACT_BYTES + (16 << 20));
    }
    EXTENTS_OFFSET + b + b / 4
}

/// Bytes of a device's head read for foreign signatures (btrfs's sits at
/// 64 KiB).
const FOREIGN_HEAD_BYTES: u64 = 72 << 10;

struct ConfigState {
    file: ConfigFile,
    generation: u64,
    device_uuids: Vec<[u8; 16]>,
}

/// A long operation in progress, for `status` and progress bars.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct OpProgress {
    /// Grows with every operation, so a follower knows it sees its own.
    #[serde(default)]
    pub seq: u64,
    pub op: String,
    pub done: u64,
    pub total: u64,
    pub finished: bool,
    pub error: Option<String>,
    /// The operation's report (scrub), once finished.
    #[serde(default)]
    pub result: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceStatus {
    pub position: usize,
    pub path: PathBuf,
    #[serde(flatten)]
    pub state: MemberState,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    pub array_uuid: uuid::Uuid,
    pub devices_total: u32,
    pub k: u32,
    pub m: u32,
    pub stripe_unit_bytes: u32,
    pub block_bytes: u32,
    pub stripes: u64,
    pub volume_bytes: u64,
    pub generation: u64,
    pub health: String,
    pub write_policy: WritePolicy,
    pub dedup: DedupConfig,
    /// The fingerprint backend in use and why it was chosen, e.g. "auto: no
    /// usable GPU (...), using cpu (2 threads)"; "none" when dedup is off.
    #[serde(default)]
    pub fingerprint_backend: String,
    /// The simulated SSD under each device (`create --ssd-sim`), off by default.
    #[serde(default)]
    pub ssd_sim: crate::ssd::SsdSimConfig,
    pub devices: Vec<DeviceStatus>,
    pub dirty_regions: usize,
    /// Bytes of each device's metadata area (format 2); 0 when the
    /// metadata lives in the array folder (format 1).
    #[serde(default)]
    pub metadata_area_bytes: u64,
    /// Regions written while a device was failed (`missed.map`), which
    /// `re-add` reconstructs on it; absent when there is no such map.
    #[serde(default)]
    pub missed_regions: Option<usize>,
    /// Data blocks an unclean stop made unknowable (`poison.map`): they
    /// read as I/O errors until written whole.
    #[serde(default)]
    pub poisoned_blocks: usize,
    pub operation: Option<OpProgress>,
    pub warnings: Vec<String>,
}

pub struct Array {
    dir: PathBuf,
    /// Where every byte of the array's state is kept (the real file system,
    /// or the power-loss simulator in tests); with format 2, routed to the
    /// devices' metadata areas by `meta`.
    storage: Arc<dyn Storage>,
    /// The devices' metadata areas (format 2); None for format 1.
    meta: Option<meta::MetaStorage>,
    geo: Geometry,
    volume_bytes: u64,
    codec: Codec,
    /// One chunk store per device, in position order: the device and
    /// everything kept per device (`store.rs`). The rest of this struct is
    /// the stripe client.
    stores: Vec<ChunkStore>,
    intent: IntentLog,
    locks: Vec<RwLock<()>>,
    counters: Counters,
    config: Mutex<ConfigState>,
    operation: Mutex<Option<OpProgress>>,
    warnings: Mutex<Vec<String>>,
    /// How many of `warnings` the open gathered before the array existed:
    /// those are not printed yet ([`Array::open_warnings`]); every later
    /// one is printed as it is raised ([`Array::warn`]).
    open_warnings: usize,
    backend: Option<Arc<dyn FingerprintBackend>>,
    /// Which fingerprint backend runs and why (for `status` and the log).
    backend_why: String,
    write_policy: WritePolicy,
    journal_bytes_max: u64,
    /// Values of missing data units logged before degraded writes (closes
    /// the degraded write hole); None where it could not be opened.
    degraded_log: Option<degraded_log::DegradedLog>,
    /// Data blocks an unclean stop made unknowable: they read as I/O
    /// errors until written (`poison.rs`, docs/write-hole.md "The double
    /// fault's marks outlive it").
    poison: poison::PoisonList,
    /// Per position: the newest superblock already recorded the member as
    /// failed when this open began, so every write that reached its
    /// stripes while it was out was a degraded write, logged before it
    /// touched a device. A member missing now but not so recorded was in
    /// service at the stop, and a write in flight then was logged nowhere
    /// (`rows_torn_unlogged`, docs/write-hole.md "The double fault").
    failed_before_open: Vec<bool>,
    /// Per position: its chunk server never restarted since the writer
    /// that stamped its superblock had made every parity journal durable
    /// ([`Superblock::boot_stamp`]): nothing it acknowledged since was
    /// lost, so its parity journal holds every mark appended there (no
    /// cut dropped one). False for a local device (no boot id to compare).
    never_restarted: Vec<bool>,
    /// Per position: the newest superblock recorded the member active when
    /// this open began (it held every stripe at the stop). One failed
    /// during the open holds its blocks as the stop left them
    /// (`poison.rs`, the own-held mark).
    active_before_open: Vec<bool>,
    /// Stripes from which on no member was ever written, as its owner
    /// vouches ([`Array::set_written_extent`]: a cluster volume's size in
    /// its PG, which never shrinks), and none is written now; the array's
    /// stripe count unless set.
    written_extent: AtomicU64,
    replay_wanted: std::sync::atomic::AtomicBool,
    /// A member's link refused this writer as fenced (`media::Fenced`):
    /// said once (`latch_failure`).
    fenced: std::sync::atomic::AtomicBool,
    /// Orders the checksum tables' page writes after the devices' syncs
    /// (shared by every table: [`checksum::SyncEpochs`]).
    sync_epochs: Arc<checksum::SyncEpochs>,
    /// Device failures latched in RAM, and how many of them the superblocks
    /// record durably: a flush returns only once they are equal, so no
    /// write is acknowledged as durable while a power cut could bring a
    /// failed device (whose content is stale) back as active.
    failures_latched: AtomicU64,
    failures_durable: AtomicU64,
    /// The last superblock generation written to every member in service:
    /// a member that leaves now leaves at it (the missed map's start,
    /// `readd.rs`). Read without the config lock, which a failure may hold.
    generation_written: AtomicU64,
    /// Whether the superblocks written now carry each chunk's server boot
    /// id ([`Superblock::boot_stamp`]): set once the open has made every
    /// parity journal durable (its replay's flush), never before, so a
    /// stamp never covers a journal record appended in an earlier boot.
    boot_stamps: AtomicBool,
    /// Space errors (ENOSPC, EDQUOT) met by device writes so far; while
    /// `space_pending` holds stripes, writes are refused (reads go on).
    space_errors: AtomicU64,
    /// Stripes a space error left with parity that may not match their
    /// data: resynchronised before the next write is taken.
    space_pending: Mutex<std::collections::BTreeSet<u64>>,
    /// Milliseconds since `started` of the last client write.
    last_write_ms: AtomicU64,
    started: std::time::Instant,
    stopping: std::sync::atomic::AtomicBool,
    /// Set by a close that succeeded: the drop then flushes nothing more.
    /// (A cluster writer's wire is fenced after its close, so a flush at
    /// the drop failed every device, in memory and in warnings.)
    closed: std::sync::atomic::AtomicBool,
    /// The background replay's thread, joined by [`Array::close`] before
    /// its last flush: a fold still running after it would write parity
    /// whose checksum entries no flush persists, with the intent log
    /// already cleared (scrub then found the parity blocks mismatched).
    background_replay: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Set by `simulate_crash`: drop without flushing, as kill -9 would.
    crashed: std::sync::atomic::AtomicBool,
    /// Set once the open's resync and replay are done: a resync before
    /// it is the open's, after an unclean stop.
    serving: std::sync::atomic::AtomicBool,
    /// Whether the stores carry a simulated-SSD wear layer (`stats.ssd`
    /// is empty when not).
    ssd_sim_on: bool,
    _lock: StorageLock,
}

/// "healthy", "degraded (...)" or "failed (...)": how many members are out
/// of service against the m the code survives.
fn health(states: &[MemberState], m: usize) -> String {
    match states.iter().filter(|s| **s != MemberState::Active).count() {
        0 => "healthy".to_string(),
        x if x <= m => format!("degraded ({x} of {} devices not in service)", states.len()),
        x => format!("failed ({x} devices not in service)"),
    }
}

/// Writes zeroes over both superblock slots of a wiped device: a sparse
/// file then holds them, so a later superblock write (every open writes
/// one) cannot meet a full file system.
fn allocate_superblock_slots(dev: &dyn Device) -> std::io::Result<()> {
    for generation in 0..2 {
        dev.write_at(
            &[0u8; SUPERBLOCK_BYTES as usize],
            Superblock::slot_offset(generation),
        )?;
    }
    Ok(())
}

/// Takes the array folder's lock, or says who holds it.
pub fn lock_dir(dir: &Path) -> Result<StorageLock> {
    lock_dir_in(&OsStorage, dir)
}

/// [`lock_dir`] in `storage`.
pub fn lock_dir_in(storage: &dyn Storage, dir: &Path) -> Result<StorageLock> {
    let path = dir.join(LOCK_FILE);
    match storage.try_lock(&path) {
        Ok(Some(lock)) => Ok(lock),
        Ok(None) => Err(Error::Busy(format!(
            "array {} is in use by another process (is a server running? use its control socket, or stop it)",
            dir.display()
        ))),
        // A folder that is not there holds no array: said as an open says
        // it (`status --dir` of a wrong folder said "opening DIR/lock").
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !storage.exists(dir) => {
            Err(Error::Config(format!(
                "{} holds no array (no such folder); run `ecdedup create` first",
                dir.display()
            )))
        }
        Err(e) => Err(Error::io(format!("opening {}", path.display()), e)),
    }
}

/// A member's device with its dedup layer: where the layer runs in this
/// process, `device` is the layer and `here` the same; where it runs at
/// the chunk's server ([`layer_at_chunk`]), `device` is the chunk itself
/// and `here` None.
pub(super) struct Layered {
    pub device: Arc<dyn Device>,
    pub here: Option<Arc<DedupDevice>>,
}

#[allow(clippy::too_many_arguments)]
fn wrap_dedup(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    config: &DedupConfig,
    geo: &Geometry,
    raw: Arc<dyn Device>,
    backend: Arc<dyn FingerprintBackend>,
    position: usize,
    fresh: bool,
) -> Result<Layered> {
    if layer_at_chunk(storage, dir, position, config, geo, &raw, fresh)? {
        return Ok(Layered {
            device: raw,
            here: None,
        });
    }
    let layer = Arc::new(DedupDevice::open(
        Arc::clone(storage),
        raw,
        config.clone(),
        backend,
        geo.data_offset(),
        geo.rows_per_device() * geo.unit_bytes(),
        &dir.join(DEDUP_DIR),
        &dedup_name(position),
        fresh,
    )?);
    Ok(Layered {
        device: Arc::clone(&layer) as Arc<dyn Device>,
        here: Some(layer),
    })
}

/// Whether the dedup layer over `raw` (member `position`) runs at its
/// chunk's server: asks a chunk whose link
/// [takes it](crate::media::remote::ChunkLink::takes_dedup) to run it,
/// empty where `fresh` (a new or blank member), otherwise as it left it.
/// False for a local device, a server that takes no layer, and a chunk
/// whose server has none (not `fresh`): a chunk whose layer ran at its
/// writer before the late evening of 2026-11-29, its maps in the chunk's metadata area, whose
/// layer then runs here as before. The server's answer decides, so a
/// chunk's layer is in one place only; the link marks its requests with
/// the answer (`set_layered`), which the server checks against what it
/// holds. Where both places hold maps (a server downgraded and upgraded
/// again around a blank re-add made here), neither is trusted: an error,
/// and the member is re-added blank. A fresh start at the server removes
/// the member's maps here after it (a cut between leaves both: that
/// error, never the stale ones).
fn layer_at_chunk(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    position: usize,
    config: &DedupConfig,
    geo: &Geometry,
    raw: &Arc<dyn Device>,
    fresh: bool,
) -> Result<bool> {
    let Some(link) = raw.link().filter(|l| l.takes_dedup()) else {
        return Ok(false);
    };
    let spec = crate::proto::frame::LayerSpec {
        config: config.clone(),
        data_offset: geo.data_offset(),
        data_bytes: geo.rows_per_device() * geo.unit_bytes(),
        fresh,
    };
    let answer = link
        .send(crate::media::remote::LinkOp::Layer { spec: &spec })
        .wait()
        .map_err(|e| Error::io(format!("starting the dedup layer of {}", raw.describe()), e))?;
    let at_chunk = match answer.as_slice() {
        [1] => true,
        [0] if !fresh => false,
        other => {
            return Err(Error::Corrupt(format!(
                "{} answered a dedup layer's start with {other:?}",
                raw.describe()
            )))
        }
    };
    link.set_layered(at_chunk);
    if at_chunk {
        let here: Vec<PathBuf> =
            crate::dedup::state_files(&dir.join(DEDUP_DIR), &dedup_name(position))
                .into_iter()
                .filter(|p| storage.exists(p))
                .collect();
        if !here.is_empty() && !fresh {
            link.set_layered(false);
            return Err(Error::Corrupt(format!(
                "{} runs its dedup layer at its server, and its metadata area holds dedup \
                 maps of its own ({}): which is current cannot be told",
                raw.describe(),
                here[0].display()
            )));
        }
        for p in here {
            storage
                .remove(&p)
                .map_err(|e| Error::io(format!("removing {}", p.display()), e))?;
        }
    }
    Ok(at_chunk)
}

/// Opens a parity journal and reserves its space. A reservation that fails
/// (a full disk) is a warning, not an error: the journal keeps its records
/// and stays unreserved, so writes go in place until a replay reserves it.
fn open_journal(
    storage: &Arc<dyn Storage>,
    path: &Path,
    bytes_max: u64,
) -> Result<(journal::ParityJournal, Option<String>)> {
    if let Some(parent) = path.parent() {
        storage
            .create_dir_all(parent)
            .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
    }
    let mut j = journal::ParityJournal::open_in(Arc::clone(storage), path)?;
    let warning = j.preallocate(bytes_max).err().map(|e| {
        format!(
            "cannot reserve {bytes_max} bytes for {}: {e}; partial writes go in place \
             (read-modify-write) until a replay can reserve them",
            path.display()
        )
    });
    Ok((j, warning))
}

/// Stripes for which device `d` holds a parity unit, as ranges.
fn parity_stripe_ranges(geo: &Geometry, d: usize) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for s in 0..geo.stripes {
        if (0..geo.m()).any(|j| geo.place(s, geo.k() + j).device == d) {
            match out.last_mut() {
                Some(last) if last.1 == s => last.1 = s + 1,
                _ => out.push((s, s + 1)),
            }
        }
    }
    out
}

fn read_superblock(dev: &dyn Device) -> Result<Superblock> {
    let (a, b) = superblock_slots(dev)?;
    Superblock::newest(&a, &b)
}

/// The two superblock slots of `dev`, as read.
fn superblock_slots(dev: &dyn Device) -> Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = vec![0u8; 2 * SUPERBLOCK_BYTES as usize];
    dev.read_at(&mut buf, 0)
        .map_err(|e| Error::io(format!("reading superblock of {}", dev.describe()), e))?;
    let b = buf.split_off(SUPERBLOCK_BYTES as usize);
    Ok((buf, b))
}

/// Whether `dev` holds an ecdedup superblock (a member of some array).
pub fn has_superblock(dev: &dyn Device) -> bool {
    read_superblock(dev).is_ok()
}

/// Whether `dev` holds an ecdedup superblock, telling a device that reads
/// and holds none (`Ok(false)`: blank) from one that cannot be read (an
/// error: nothing is known of it), which [`has_superblock`] does not.
pub fn probe_superblock(dev: &dyn Device) -> Result<bool> {
    let (a, b) = superblock_slots(dev)?;
    Ok(Superblock::newest(&a, &b).is_ok())
}

/// The bytes of file `name` in a metadata area, if it is there and reads.
fn read_area_file(area: &Arc<AreaFs>, name: &str) -> Option<Vec<u8>> {
    read_file(area.open_file(name).ok()?.as_ref()).ok()
}

/// Creates a new array in `dir` over files or block devices and leaves it
/// clean and closed.
pub fn create(dir: &Path, opts: &CreateOptions) -> Result<()> {
    create_in(&OsStorage::shared(), dir, opts)
}

/// [`create`] in `storage`.
pub fn create_in(storage: &Arc<dyn Storage>, dir: &Path, opts: &CreateOptions) -> Result<()> {
    storage
        .create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let geo = geometry_for(opts)?;
    if storage.exists(&dir.join(CONFIG_FILE)) {
        return Err(Error::Config(format!(
            "{} already holds an array; remove it first or choose another --dir",
            dir.display()
        )));
    }
    refuse_duplicate_devices(&opts.devices, |p| storage.exists(p))?;
    // What this create made, removed again if it is refused.
    let mut created: Vec<PathBuf> = Vec::new();
    let r = create_devices(storage, dir, opts, &geo, &mut created);
    if r.is_err() {
        for path in created.iter().rev() {
            let _ = storage.remove(path);
            let _ = storage.sync_dir(crate::media::storage::parent_of(path));
        }
    }
    r
}

/// The identity of an existing file on the real file system: its device
/// and inode, or the device number of a block device.
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path).ok()?;
    Some(if meta.file_type().is_block_device() {
        (u64::MAX, meta.rdev())
    } else {
        (meta.dev(), meta.ino())
    })
}

/// Refuses a device named twice, by path or (for existing files and block
/// devices) by identity: the array would hold one device at two positions
/// and never open.
fn refuse_duplicate_devices(paths: &[PathBuf], exists: impl Fn(&Path) -> bool) -> Result<()> {
    let mut seen: Vec<(PathBuf, Option<(u64, u64)>)> = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let abs = link_target(path);
        let id = if exists(path) {
            file_identity(path)
        } else {
            None
        };
        if let Some(j) = seen
            .iter()
            .position(|(p, other)| *p == abs || (id.is_some() && *other == id))
        {
            return Err(Error::Device {
                path: path.clone(),
                reason: format!(
                    "named at positions {j} and {i}: each position needs a device of its own"
                ),
            });
        }
        seen.push((abs, id));
    }
    Ok(())
}

/// Opens or creates the devices of a new array and formats it; every file
/// it creates is pushed to `created`.
fn create_devices(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    opts: &CreateOptions,
    geo: &Geometry,
    created: &mut Vec<PathBuf>,
) -> Result<()> {
    let mut devices: Vec<Arc<dyn Device>> = Vec::new();
    for path in &opts.devices {
        let dev_err = |reason: String| Error::Device {
            path: path.clone(),
            reason,
        };
        let options = crate::media::DeviceOptions {
            io: opts.io,
            sparse: opts.sparse,
        };
        let dev = if storage.exists(path) {
            FileDevice::open_with(storage.as_ref(), path, options)
                .map_err(|e| dev_err(format!("cannot open: {e}")))?
        } else {
            created.push(path.clone());
            let dev =
                FileDevice::create_with(storage.as_ref(), path, geo.device_bytes_min(), options)
                    .map_err(|e| dev_err(format!("cannot create: {e}")))?;
            let parent = crate::media::storage::parent_of(path);
            storage
                .sync_dir(parent)
                .map_err(|e| dev_err(format!("cannot sync {}: {e}", parent.display())))?;
            dev
        };
        devices.push(Arc::new(dev));
    }
    format_in(storage, dir, opts, devices)
}

/// Writes a new array onto `devices` (already open, in position order) and
/// records it in `dir`. Refuses devices that are too small or that belong
/// to an array.
pub fn format(dir: &Path, opts: &CreateOptions, devices: Vec<Arc<dyn Device>>) -> Result<()> {
    format_in(&OsStorage::shared(), dir, opts, devices)
}

/// [`format`] with the array's own files in `storage`.
pub fn format_in(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    opts: &CreateOptions,
    devices: Vec<Arc<dyn Device>>,
) -> Result<()> {
    storage
        .create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let _lock = lock_dir_in(storage.as_ref(), dir)?;
    if storage.exists(&dir.join(CONFIG_FILE)) {
        return Err(Error::Config(format!(
            "{} already holds an array; remove it first or choose another --dir",
            dir.display()
        )));
    }
    let n = opts.devices.len() as u32;
    assert_eq!(devices.len(), n as usize);
    let geo = geometry_for(opts)?;
    opts.dedup.validate(opts.stripe_unit_bytes)?;
    if opts.write_policy.journals() && opts.journal_bytes_max < logging::JOURNAL_BYTES_MIN {
        return Err(Error::Config(format!(
            "a parity journal bound of {} bytes leaves no room for a record beside the \
             1 MiB reserved for invalidations; use at least {}",
            opts.journal_bytes_max,
            logging::JOURNAL_BYTES_MIN
        )));
    }
    if !opts.volume_bytes.is_multiple_of(512) {
        return Err(Error::Config(format!(
            "volume size {} is not a multiple of 512 bytes",
            opts.volume_bytes
        )));
    }
    for (i, (dev, path)) in devices.iter().zip(&opts.devices).enumerate() {
        let dev_err = |reason: String| Error::Device {
            path: path.clone(),
            reason,
        };
        if dev.size() < geo.device_bytes_min() {
            return Err(dev_err(format!(
                "holds {} bytes, but position {i} of this geometry needs {}",
                dev.size(),
                geo.device_bytes_min()
            )));
        }
        if let Ok(sb) = read_superblock(dev.as_ref()) {
            return Err(dev_err(format!(
                "already belongs to array {} (position {}); wipe its first 8 KiB to reuse it",
                uuid::Uuid::from_bytes(sb.array_uuid),
                sb.position
            )));
        }
        if !opts.force {
            let mut head = vec![0u8; (FOREIGN_HEAD_BYTES).min(dev.size()) as usize];
            dev.read_at(&mut head, 0)
                .map_err(|e| dev_err(format!("cannot read: {e}")))?;
            if let Some(what) = crate::media::storage::foreign_signature(&head) {
                return Err(dev_err(format!(
                    "holds {what}; `create --force` overwrites it"
                )));
            }
        }
    }
    let array_uuid = uuid::Uuid::new_v4();
    let member_uuids: Vec<[u8; 16]> = (0..n).map(|_| *uuid::Uuid::new_v4().as_bytes()).collect();
    for (i, dev) in devices.iter().enumerate() {
        let io = |e| Error::io(format!("initialising {}", dev.describe()), e);
        // Zero everything: parity of zeroes is zeroes, and zeroed checksum
        // entries describe zero blocks.
        dev.discard(0, geo.device_bytes_min()).map_err(io)?;
        let sb = Superblock {
            array_uuid: *array_uuid.as_bytes(),
            device_uuid: member_uuids[i],
            generation: 1,
            position: i as u32,
            geometry: geo,
            volume_bytes: opts.volume_bytes,
            states: vec![MemberState::Active; n as usize],
            member_uuids: member_uuids.clone(),
            boot_stamp: 0,
        };
        allocate_superblock_slots(dev.as_ref()).map_err(io)?;
        dev.write_at(&sb.encode(), Superblock::slot_offset(1))
            .map_err(io)?;
        dev.sync().map_err(io)?;
    }
    // With a metadata area on each device, everything below goes there.
    let storage = &match geo.meta_area_bytes {
        0 => Arc::clone(storage),
        bytes => {
            let mut areas = Vec::new();
            for dev in &devices {
                let area = AreaFs::format(Arc::clone(dev), geo.meta_area_offset(), bytes).map_err(
                    |e| {
                        Error::io(
                            format!("formatting the metadata area of {}", dev.describe()),
                            e,
                        )
                    },
                )?;
                areas.push(Some(Arc::new(area)));
            }
            meta::MetaStorage::new(Arc::clone(storage), dir, areas, (0..n as usize).collect())
                .shared()
        }
    };
    let spr = IntentLog::stripes_per_region(geo.stripe_data_bytes(), opts.intent_region_bytes);
    IntentLog::create_in(
        storage.as_ref(),
        &dir.join(INTENT_FILE),
        array_uuid.as_bytes(),
        geo.stripes,
        spr,
    )?;
    if opts.dedup.policy != Policy::None {
        for (i, dev) in devices.iter().enumerate() {
            // Empty maps: at the chunk's server where it runs the layer,
            // in the device's metadata area otherwise.
            if !layer_at_chunk(storage, dir, i, &opts.dedup, &geo, dev, true)? {
                crate::dedup::reset_state(storage.as_ref(), &dir.join(DEDUP_DIR), &dedup_name(i))?;
            }
        }
    }
    let devices_abs = opts.devices.iter().map(|p| absolute_path(p)).collect();
    ConfigFile {
        format_version: 1,
        array_uuid,
        devices: devices_abs,
        intent_region_bytes: opts.intent_region_bytes,
        dedup: opts.dedup.clone(),
        write_policy: opts.write_policy,
        journal_bytes_max: opts.journal_bytes_max,
        intent_clear_quiet_ms: default_intent_clear_quiet_ms(),
        fingerprint_backend: BackendChoice::default(),
        ssd_sim: crate::ssd::SsdSimConfig::default(),
        io: opts.io,
        sparse: opts.sparse,
        checksum_cache_bytes_max: default_checksum_cache_bytes(),
    }
    .store_in(storage.as_ref(), dir)
}

/// Records the simulated-SSD wear accounting of the array in `dir` (at
/// create); it applies from the next open.
pub fn set_ssd_sim(dir: &Path, sim: crate::ssd::SsdSimConfig) -> Result<()> {
    sim.validate()?;
    let _lock = lock_dir(dir)?;
    let mut cfg = ConfigFile::load(dir)?;
    cfg.ssd_sim = sim;
    cfg.store(dir)
}

/// Records the RAM bound of the checksum tables of the array in `dir`
/// (`create --checksum-cache`); it applies from the next open.
pub fn set_checksum_cache(dir: &Path, bytes: u64) -> Result<()> {
    let _lock = lock_dir(dir)?;
    let mut cfg = ConfigFile::load(dir)?;
    cfg.checksum_cache_bytes_max = bytes;
    cfg.store(dir)
}

/// Records which fingerprint backend the array in `dir` uses (at create;
/// checked only when the array is opened, so an array for a GPU machine can
/// be made on one without).
pub fn set_fingerprint_backend(dir: &Path, choice: BackendChoice) -> Result<()> {
    let _lock = lock_dir(dir)?;
    let mut cfg = ConfigFile::load(dir)?;
    cfg.fingerprint_backend = choice;
    cfg.store(dir)
}

/// `path` made absolute without resolving symlinks: a stable name the user
/// gave (`/dev/disk/by-id/...`) stays that name when `/dev/sdX` moves.
fn absolute_path(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// `path` made absolute, its symbolic links followed as far as they lead
/// (at most 40): a link to a file not created yet names that file, which
/// `file_identity` cannot tell (a probe named one file twice, once
/// through such a link, and `create` made an array that never opened).
fn link_target(path: &Path) -> PathBuf {
    let mut p = absolute_path(path);
    for _ in 0..40 {
        let Ok(target) = std::fs::read_link(&p) else {
            break;
        };
        p = absolute_path(&p.parent().map_or(target.clone(), |dir| dir.join(&target)));
    }
    p
}

/// Where the dedup maps live, inside the array folder.
pub const DEDUP_DIR: &str = "dedup";

fn dedup_name(position: usize) -> String {
    format!("dev{position}")
}

impl Array {
    /// Opens the array in `dir`: takes its lock, assembles the devices,
    /// resynchronises stripes left dirty by an unclean stop, and returns
    /// ready to serve.
    pub fn open(dir: &Path, progress: Option<ProgressFn>) -> Result<Array> {
        Array::open_with_backend(dir, progress, None)
    }

    /// [`Array::open`] with the fingerprint backend `fingerprint_backend`
    /// instead of the configured one (`serve --fingerprint-backend`).
    pub fn open_with_backend(
        dir: &Path,
        progress: Option<ProgressFn>,
        fingerprint_backend: Option<BackendChoice>,
    ) -> Result<Array> {
        Array::open_in(OsStorage::shared(), dir, progress, fingerprint_backend)
    }

    /// [`Array::open_with_backend`] with every file in `storage`.
    pub fn open_in(
        storage: Arc<dyn Storage>,
        dir: &Path,
        progress: Option<ProgressFn>,
        fingerprint_backend: Option<BackendChoice>,
    ) -> Result<Array> {
        let lock = lock_dir_in(storage.as_ref(), dir)?;
        let mut warnings = Vec::new();
        let cfg = ConfigFile::load_or_recover(storage.as_ref(), dir, &mut warnings)?;
        let mut devices: Vec<Option<Arc<dyn Device>>> = Vec::new();
        let mut ssd_wear = Vec::new();
        for (i, path) in cfg.devices.iter().enumerate() {
            match FileDevice::open_with(storage.as_ref(), path, cfg.device_options()) {
                Ok(d) => {
                    let (d, wear) = cfg.ssd_sim.wrap(Arc::new(d))?;
                    ssd_wear.push(wear);
                    devices.push(Some(d))
                }
                // Held by another server: refused whole, never opened
                // degraded without it.
                Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy => {
                    return Err(Error::Busy(format!("device {i}: {e}")));
                }
                Err(e) => {
                    ssd_wear.push(None);
                    warnings.push(format!(
                        "device {i} ({}) cannot be opened: {e}",
                        path.display()
                    ));
                    devices.push(None);
                }
            }
        }
        let sim_on = cfg.ssd_sim.mode.ftl_mode().is_some();
        let mut array = Array::assemble(
            storage,
            dir,
            lock,
            cfg,
            devices,
            warnings,
            progress,
            fingerprint_backend,
        )?;
        if sim_on {
            for (store, wear) in array.stores.iter().zip(ssd_wear) {
                store.set_wear(wear);
            }
            array.ssd_sim_on = true;
        }
        Ok(array)
    }

    /// Opens an array over devices the caller supplies (tests, simulators).
    pub fn open_with_devices(
        dir: &Path,
        devices: Vec<Option<Arc<dyn Device>>>,
        progress: Option<ProgressFn>,
    ) -> Result<Array> {
        let lock = lock_dir(dir)?;
        let cfg = ConfigFile::load(dir)?;
        Array::assemble(
            OsStorage::shared(),
            dir,
            lock,
            cfg,
            devices,
            Vec::new(),
            progress,
            None,
        )
    }

    /// Devices are found by their superblocks, not by where the config
    /// says they are: when the devices at the configured paths are members
    /// of this array at other positions (`/dev/sdX` names move across
    /// boots; a user swapped two files), each is put back at the position
    /// its superblock names and the config follows, durably, with a
    /// warning. Only a clean permutation is followed: two devices claiming
    /// one position (a stale member and its replacement) are left as they
    /// are, for the member checks to refuse.
    fn follow_moved_devices(
        storage: &dyn Storage,
        dir: &Path,
        cfg: &mut ConfigFile,
        devices: &mut [Option<Arc<dyn Device>>],
        warnings: &mut Vec<String>,
    ) -> Result<()> {
        let n = devices.len();
        let mut target: Vec<usize> = (0..n).collect();
        for (i, slot) in devices.iter().enumerate() {
            let Some(dev) = slot else { continue };
            if let Ok(sb) = read_superblock(dev.as_ref()) {
                if sb.array_uuid == *cfg.array_uuid.as_bytes() && (sb.position as usize) < n {
                    target[i] = sb.position as usize;
                }
            }
        }
        let mut seen = vec![false; n];
        if target
            .iter()
            .all(|&t| !std::mem::replace(&mut seen[t], true))
            && target.iter().enumerate().any(|(i, &t)| i != t)
        {
            let mut moved_devices: Vec<Option<Arc<dyn Device>>> = vec![None; n];
            let mut paths = cfg.devices.clone();
            let mut moves = Vec::new();
            for (i, &t) in target.iter().enumerate() {
                moved_devices[t] = devices[i].take();
                paths[t] = cfg.devices[i].clone();
                if i != t {
                    moves.push(format!("{} is device {t}", cfg.devices[i].display()));
                }
            }
            devices.clone_from_slice(&moved_devices);
            cfg.devices = paths;
            cfg.store_in(storage, dir)?;
            warnings.push(format!(
                "devices were found at other paths than {CONFIG_FILE} said ({}); \
                 it now lists them where they are",
                moves.join(", ")
            ));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        storage: Arc<dyn Storage>,
        dir: &Path,
        lock: StorageLock,
        cfg: ConfigFile,
        mut devices: Vec<Option<Arc<dyn Device>>>,
        mut warnings: Vec<String>,
        progress: Option<ProgressFn>,
        fingerprint_backend: Option<BackendChoice>,
    ) -> Result<Array> {
        let n = cfg.devices.len();
        if devices.len() != n {
            return Err(Error::Config(format!(
                "{} devices given, array has {n}",
                devices.len()
            )));
        }
        let mut cfg = cfg;
        Self::follow_moved_devices(storage.as_ref(), dir, &mut cfg, &mut devices, &mut warnings)?;
        let mut sbs: Vec<Option<Superblock>> = vec![None; n];
        for (i, slot) in devices.iter_mut().enumerate() {
            let Some(dev) = slot else { continue };
            match read_superblock(dev.as_ref()) {
                Ok(sb) => match inspect::foreign_member(&cfg, i, &sb) {
                    Some(why) => {
                        warnings.push(why);
                        *slot = None;
                    }
                    None => {
                        inspect::check_member(&cfg, i, &sb)?;
                        sbs[i] = Some(sb);
                    }
                },
                Err(e) => {
                    warnings.push(format!(
                        "device {i} ({}) treated as failed: {e}",
                        cfg.devices[i].display()
                    ));
                    *slot = None;
                }
            }
        }
        // Per device, whether its chunk server never restarted since the
        // writer that stamped its superblock had made every parity journal
        // durable ([`Superblock::boot_stamp`]): every journal record past
        // a journal's synced length was then appended in the boot that
        // still runs, so what the server acknowledged before it is in its
        // files ([`ChunkStore::journal_trust_fold_marks`], below).
        let never_restarted: Vec<bool> = (0..n)
            .map(|i| {
                let link_boot = devices[i].as_ref().and_then(|d| d.server_boot_id());
                sbs[i]
                    .as_ref()
                    .is_some_and(|sb| sb.boot_stamp != 0 && link_boot == Some(sb.boot_stamp))
            })
            .collect();
        // Why no superblock was readable (a file system refusing direct
        // I/O, say) is in the warnings: said with the refusal.
        let newest = inspect::newest_superblock(&sbs).map_err(|e| match e {
            Error::Unavailable(why) if !warnings.is_empty() => {
                Error::Unavailable(format!("{why}: {}", warnings.join("; ")))
            }
            e => e,
        })?;
        let geo = newest.geometry;
        if geo.devices as usize != n {
            return Err(Error::Corrupt(format!(
                "superblocks describe {} devices, {CONFIG_FILE} lists {n}",
                geo.devices
            )));
        }
        for (i, sb) in sbs.iter().enumerate() {
            if let Some(sb) = sb {
                if sb.geometry != geo {
                    return Err(Error::Corrupt(format!(
                        "device {i} disagrees with the array's geometry"
                    )));
                }
            }
        }
        let mut states = newest.states.clone();
        for (i, sb) in sbs.iter().enumerate() {
            if let Some(why) = sb
                .as_ref()
                .and_then(|sb| inspect::stale_member(sb, &newest))
            {
                if states[i] != MemberState::Failed {
                    warnings.push(format!(
                        "device {i} ({}) treated as failed: {why}",
                        cfg.devices[i].display()
                    ));
                    states[i] = MemberState::Failed;
                }
            }
        }
        for i in 0..n {
            let usable = devices[i].as_ref().is_some_and(|d| {
                if d.size() < geo.device_bytes_min() {
                    warnings.push(format!(
                        "device {i} ({}) treated as failed: holds {} bytes, needs {}",
                        cfg.devices[i].display(),
                        d.size(),
                        geo.device_bytes_min()
                    ));
                    false
                } else {
                    true
                }
            });
            if !usable && states[i] != MemberState::Failed {
                states[i] = MemberState::Failed;
            }
            if states[i] == MemberState::Failed {
                devices[i] = None;
            }
        }
        // Format 2: the metadata is on the devices; a member whose area
        // cannot be read is failed like one whose superblock cannot.
        let mut meta = None;
        let storage = match geo.meta_area_bytes {
            0 => storage,
            bytes => {
                let mut areas = Vec::with_capacity(n);
                for (i, slot) in devices.iter_mut().enumerate() {
                    let area = slot.as_ref().and_then(|dev| {
                        match AreaFs::open(Arc::clone(dev), geo.meta_area_offset(), bytes) {
                            Ok(a) => Some(Arc::new(a)),
                            Err(e) => {
                                warnings.push(format!(
                                    "device {i} ({}) treated as failed: {e}",
                                    cfg.devices[i].display()
                                ));
                                None
                            }
                        }
                    });
                    if area.is_none() && slot.is_some() {
                        *slot = None;
                        states[i] = MemberState::Failed;
                    }
                    areas.push(area);
                }
                let active = (0..n).filter(|&i| states[i] == MemberState::Active);
                let rebuilding =
                    (0..n).filter(|&i| matches!(states[i], MemberState::Rebuilding { .. }));
                let m =
                    meta::MetaStorage::new(storage, dir, areas, active.chain(rebuilding).collect());
                let shared = m.shared();
                meta = Some(m);
                shared
            }
        };
        // Settings the data on the devices depends on come from the
        // devices' copy of `array.json` where the folder's says otherwise
        // (an edit by hand: `set-policy` writes both): under a folder that
        // switched parix to rmw the journals' records were never replayed,
        // and a dedup policy changed read the layers' maps as none (a
        // probe, as a user: parity damaged, then blocks read wrong after
        // two failures). Said, and `set-policy` changes the write policy.
        // The copy read, kept for `refresh_config_copy`'s comparison (one
        // round trip to a remote chunk fewer).
        let first_copy: Option<(usize, Vec<u8>)> = meta.as_ref().and_then(|m| {
            (0..n).find_map(|d| {
                let bytes = read_area_file(&m.area(d)?, CONFIG_FILE)?;
                serde_json::from_slice::<ConfigFile>(&bytes)
                    .is_ok()
                    .then_some((d, bytes))
            })
        });
        if let Some(theirs) = first_copy
            .as_ref()
            .and_then(|(_, bytes)| serde_json::from_slice::<ConfigFile>(bytes).ok())
        {
            if theirs.dedup != cfg.dedup {
                warnings.push(format!(
                    "{CONFIG_FILE} in {} sets dedup {:?}, the devices' copy {:?}: the devices' \
                     is used (dedup is chosen at create)",
                    dir.display(),
                    cfg.dedup,
                    theirs.dedup
                ));
                cfg.dedup = theirs.dedup.clone();
            }
            if theirs.write_policy != cfg.write_policy {
                warnings.push(format!(
                    "{CONFIG_FILE} in {} sets write policy {:?}, the devices' copy {:?}: the \
                     devices' is used (`ecdedup set-policy` changes it, replaying the journals \
                     first)",
                    dir.display(),
                    cfg.write_policy,
                    theirs.write_policy
                ));
                cfg.write_policy = theirs.write_policy;
            }
        }
        let choice = fingerprint_backend.unwrap_or(cfg.fingerprint_backend);
        let (backend, backend_why) = if cfg.dedup.policy != Policy::None {
            cfg.dedup.validate(geo.stripe_unit_bytes)?;
            let (backend, why) = choose_backend(choice, None).map_err(|e| {
                Error::Config(format!(
                    "{e}; serve with --fingerprint-backend cpu (or auto) to run without a GPU"
                ))
            })?;
            (Some(backend), why)
        } else {
            (None, format!("none: dedup is off ({choice} configured)"))
        };
        let mut dedup_layers = Vec::with_capacity(n);
        for (i, slot) in devices.iter_mut().enumerate() {
            let layer = match (slot.as_ref(), &backend) {
                (Some(raw), Some(backend)) => {
                    match wrap_dedup(
                        &storage,
                        dir,
                        &cfg.dedup,
                        &geo,
                        Arc::clone(raw),
                        Arc::clone(backend),
                        i,
                        false,
                    ) {
                        Ok(layered) => Some(layered),
                        Err(e) => {
                            warnings.push(format!(
                                "device {i} treated as failed: {e}; `ecdedup replace {i}` and `rebuild` restore it from the other devices"
                            ));
                            states[i] = MemberState::Failed;
                            *slot = None;
                            None
                        }
                    }
                }
                _ => None,
            };
            let layer = layer.and_then(|Layered { device, here }| {
                *slot = Some(device);
                here
            });
            dedup_layers.push(layer);
        }
        let unusable = states.iter().filter(|s| **s == MemberState::Failed).count();
        if unusable > geo.m() {
            return Err(inspect::too_many_failed(unusable, &geo, &warnings));
        }
        let codec = Codec::new(geo.k(), geo.m()).map_err(|e| Error::Config(e.to_string()))?;
        let counters = Counters::new(n);
        let slots: Vec<checksum::DeviceSlot> = devices
            .iter()
            .map(|d| Arc::new(RwLock::new(d.clone())))
            .collect();
        let cache_bytes_per_device = cfg.checksum_cache_bytes_max / n as u64;
        let sync_epochs = checksum::SyncEpochs::new();
        let tables: Vec<ChecksumTable> = (0..n)
            .map(|i| {
                ChecksumTable::open(
                    Arc::clone(&slots[i]),
                    Arc::clone(&counters.devices[i]),
                    geo.blocks_per_device(),
                    layout::CHECKSUM_OFFSET,
                    geo.block() as usize,
                    cache_bytes_per_device,
                )
                .with_epochs(Arc::clone(&sync_epochs))
            })
            .collect();
        let spr = IntentLog::stripes_per_region(geo.stripe_data_bytes(), cfg.intent_region_bytes);
        let (intent, recovery, intent_warning) = IntentLog::open_in(
            storage.as_ref(),
            &dir.join(INTENT_FILE),
            cfg.array_uuid.as_bytes(),
            geo.stripes,
            spr,
        )?;
        warnings.extend(intent_warning);
        intent.set_quiet_before_clear(std::time::Duration::from_millis(cfg.intent_clear_quiet_ms));
        let device_uuids = inspect::member_uuids(&newest, &sbs);
        let degraded_log = match degraded_log::DegradedLog::open(
            Arc::clone(&storage),
            &dir.join(DEGRADED_LOG_FILE),
            geo.block() as usize,
            degraded_log_area_bytes(&geo),
        ) {
            Ok((log, intact)) => {
                if !intact {
                    warnings.push(format!(
                        "the degraded-write log {} was unreadable and is restarted",
                        dir.join(DEGRADED_LOG_FILE).display()
                    ));
                }
                Some(log)
            }
            Err(e) => {
                warnings.push(format!(
                    "{e}: degraded writes are not logged (a power cut while a device is out \
                     can leave its units undecodable)"
                ));
                None
            }
        };
        // Refuses the open where corrupt: the blocks it names would read as
        // their placeholder's zeroes. A copy of format 2 that fails its
        // check where other areas hold a sound one is first rewritten from
        // the copy most devices hold, as a repairing scrub would.
        let open_poison = || {
            poison::PoisonList::open(
                Arc::clone(&storage),
                &dir.join(POISON_FILE),
                geo.stripes,
                geo.k(),
                geo.blocks_per_unit(),
            )
        };
        let poison = match (open_poison(), &meta) {
            (Err(Error::Corrupt(why)), Some(m)) => {
                for p in m.check_copies_of(&[POISON_FILE], true) {
                    warnings.push(format!("opening the poison list ({why}): metadata {p}"));
                }
                open_poison()?
            }
            (r, _) => r?,
        };
        let cfg_write_policy = cfg.write_policy;
        let cfg_journal_bytes_max = cfg.journal_bytes_max;
        let mut journal_unreadable = false;
        // Members whose journal could not be read (format 2): failed once
        // the array is assembled.
        let mut journals_failed: Vec<(usize, String)> = Vec::new();
        // Stripes whose journal records were lost (a record failed its
        // checksum): resynchronised before any replay.
        let mut journal_lost: Vec<(u64, u64)> = Vec::new();
        let mut journals = Vec::with_capacity(n);
        for i in 0..n {
            // A member out of service with its metadata area (format 2)
            // took its journal with it, as it took the parity it covers.
            let journal_gone = meta.as_ref().is_some_and(|m| m.area(i).is_none());
            if !cfg_write_policy.journals() || journal_gone {
                journals.push(None);
                continue;
            }
            let path = dir.join(JOURNAL_DIR).join(format!("dev{i}.jrnl"));
            let opened = match open_journal(&storage, &path, cfg_journal_bytes_max) {
                Ok(opened) => Some(opened),
                // Format 2: the journal is on the member's own device, and
                // an I/O error reading it is that device failing, as at any
                // other read. Its parity of the stripes the journal held
                // records for lacks them, and the members left could not
                // tell it: taken for present, a degraded stripe's decode
                // met two parities that disagree (the cluster simulator,
                // seed 33331, parix: the read of a journal timed out at a
                // takeover's open). Where failing it would leave fewer than
                // k members, the journal is put aside instead (below).
                Err(e @ Error::Io { .. })
                    if meta.is_some() && unusable + journals_failed.len() < geo.m() =>
                {
                    journals_failed.push((i, e.to_string()));
                    journals.push(None);
                    continue;
                }
                Err(e) => {
                    warnings.push(format!("{e}: its logged writes are lost, so every stripe is resynchronised from its data"));
                    journal_unreadable = true;
                    // Moved aside, never deleted: a later open must not
                    // replay it over parity resynchronised meanwhile.
                    let aside =
                        path.with_extension(format!("jrnl.unreadable-{}", uuid::Uuid::new_v4()));
                    let moved = !storage.exists(&path)
                        || (storage.rename(&path, &aside).is_ok()
                            && storage
                                .sync_dir(crate::media::storage::parent_of(&path))
                                .is_ok());
                    if moved {
                        open_journal(&storage, &path, cfg_journal_bytes_max).ok()
                    } else {
                        None
                    }
                }
            };
            match opened {
                Some((mut j, warning)) => {
                    warnings.extend(warning);
                    let mut lost = j.take_lost();
                    // Records are checked against the geometry once, here:
                    // replay and resync then index devices with them.
                    let outside = j.drop_outside(|stripe, role, block, values| {
                        let roles = if values { geo.k() } else { geo.width() };
                        stripe < geo.stripes
                            && (role as usize) < roles
                            && (block as u64) < geo.blocks_per_unit()
                            && (0..geo.m()).any(|p| geo.place(stripe, geo.k() + p).device == i)
                    });
                    if !outside.is_empty() {
                        warnings.push(format!(
                            "parity journal of device {i} had records naming blocks outside \
                             its parity units ({} stripes); they are dropped",
                            outside.len()
                        ));
                        lost.stripes.extend(outside);
                    }
                    lost.stripes.retain(|&s| s < geo.stripes);
                    if !lost.is_empty() {
                        let which = if lost.unknown_stripes {
                            "of unknown stripes: every stripe it covers".to_string()
                        } else {
                            format!("{} stripes", lost.stripes.len())
                        };
                        warnings.push(format!(
                            "parity journal of device {i} had unreadable records ({which}): \
                             those stripes are resynchronised from their data"
                        ));
                        if lost.unknown_stripes {
                            journal_lost.extend(parity_stripe_ranges(&geo, i));
                        } else {
                            journal_lost.extend(lost.stripes.iter().map(|&s| (s, s + 1)));
                        }
                    }
                    journals.push(Some(j));
                }
                None => {
                    warnings.push(format!(
                        "parity journal of device {i} cannot be opened: \
                         partial writes to its stripes go in place (read-modify-write)"
                    ));
                    journals.push(None);
                }
            }
        }
        let stores = tables
            .into_iter()
            .zip(dedup_layers)
            .zip(journals)
            .enumerate()
            .map(|(i, ((table, dedup), journal))| {
                ChunkStore::new(
                    Arc::clone(&slots[i]),
                    states[i],
                    table,
                    geo.block() as usize,
                    dedup,
                    journal,
                    Arc::clone(&counters.devices[i]),
                )
            })
            .collect();
        let array = Array {
            dir: dir.to_owned(),
            storage,
            meta,
            geo,
            volume_bytes: newest.volume_bytes,
            codec,
            stores,
            intent,
            locks: (0..STRIPE_LOCKS).map(|_| RwLock::new(())).collect(),
            counters,
            config: Mutex::new(ConfigState {
                file: cfg,
                generation: newest.generation,
                device_uuids,
            }),
            operation: Mutex::new(None),
            open_warnings: warnings.len(),
            warnings: Mutex::new(warnings),
            degraded_log,
            poison,
            never_restarted: never_restarted.clone(),
            written_extent: AtomicU64::new(geo.stripes),
            failed_before_open: newest
                .states
                .iter()
                .map(|s| *s == MemberState::Failed)
                .collect(),
            active_before_open: newest
                .states
                .iter()
                .map(|s| *s == MemberState::Active)
                .collect(),
            backend,
            backend_why,
            write_policy: cfg_write_policy,
            journal_bytes_max: cfg_journal_bytes_max,
            replay_wanted: std::sync::atomic::AtomicBool::new(false),
            fenced: std::sync::atomic::AtomicBool::new(false),
            sync_epochs,
            failures_latched: AtomicU64::new(0),
            failures_durable: AtomicU64::new(0),
            generation_written: AtomicU64::new(newest.generation),
            boot_stamps: AtomicBool::new(false),
            space_errors: AtomicU64::new(0),
            space_pending: Mutex::new(std::collections::BTreeSet::new()),
            last_write_ms: AtomicU64::new(0),
            started: std::time::Instant::now(),
            stopping: std::sync::atomic::AtomicBool::new(false),
            closed: std::sync::atomic::AtomicBool::new(false),
            background_replay: Mutex::new(None),
            crashed: std::sync::atomic::AtomicBool::new(false),
            serving: std::sync::atomic::AtomicBool::new(false),
            ssd_sim_on: false,
            _lock: lock,
        };
        for (i, why) in journals_failed {
            array.latch_failure(i, "metadata area", &std::io::Error::other(why));
        }
        // Always a new generation, whether anything changed or not: the
        // generation is the event counter of `re-add` (md's), so a device
        // image copied before this open is older than any failure after it.
        // Twice, before any write of this open: a member one generation
        // behind is taken for one a cut left in the middle of a superblock
        // update (`inspect::stale_member`), and with one bump an image
        // copied while the array was stopped was exactly one behind after
        // a whole session of writes, and read as current (a probe, as a
        // user would: a third of a volume read back old, no error). Now
        // such an image is two behind; a cut between the two bumps leaves
        // members at most one apart with no write made since.
        array.persist_superblocks()?;
        array.persist_superblocks()?;
        // A poisoned block's mark (its member held it from the stop on)
        // holds only while that member stays out: one in service now (a
        // forced assembly) may have had its unit rewritten.
        let failed_before = array.failed_before_open.clone();
        array
            .poison
            .drop_own_held(|&(s, r, _)| !failed_before[geo.place(s, r as usize).device])?;
        // First the stripes an unclean stop may have left inconsistent: their
        // parity is recomputed from their data, which holds every
        // acknowledged write, and what their journals logged is dropped.
        // Checksums outside dirty regions are trustworthy, so the journals of
        // the other stripes are then replayed before serving.
        // A fold's invalidation mark past its journal's synced length is
        // deferred at open (a power cut may have kept it and dropped the
        // fold's parity write), and the resync then guesses from the
        // parity block whether the fold landed. Where the journal's server
        // never restarted since, nothing was dropped: the mark stands. (A
        // takeover without a power loss cannot tell one otherwise: the
        // cluster simulator's seed 896033 folded records again into parity
        // that held them, and a row read as I/O errors.)
        for (d, store) in array.stores.iter().enumerate() {
            if never_restarted[d] {
                store.journal_trust_fold_marks();
            }
        }
        let mut dirty = recovery.dirty_stripe_ranges;
        dirty.extend(journal_lost);
        if journal_unreadable {
            dirty = vec![(0, geo.stripes)];
        }
        array.refresh_config_copy(first_copy);
        array.resume_missed_tracking();
        if !dirty.is_empty() {
            array.resync(&dirty, progress.as_ref())?;
        }
        // A fold's mark past its journal's sync outside the dirty stripes
        // (none is expected: a fold holds its stripe's intent mark, which
        // only a flush clears, and a flush syncs the journals) stands.
        for store in &array.stores {
            store.journal_settle_all_deferred();
        }
        array.replay_all(progress.as_ref())?;
        // Every parity journal is durable now (the replay's flush): the
        // superblocks may vouch for the chunk servers' boots from here on.
        let stamps = array.write_policy.journals()
            && (0..n).any(|d| {
                array
                    .device(d)
                    .is_some_and(|dev| dev.server_boot_id().is_some())
            });
        if stamps {
            array.boot_stamps.store(true, SeqCst);
            array.persist_superblocks()?;
        }
        array.serving.store(true, SeqCst);
        Ok(array)
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    /// Format 2: the copy of `array.json` on each device in service, which
    /// `assemble` and a damaged folder copy are recovered from, is
    /// rewritten where it differs from the folder's (settings changed
    /// offline go to the folder only; a device may hold an older copy),
    /// except the write policy and the dedup settings, which the open took
    /// from the devices' copy where they differed (`assemble`).
    /// Every copy is compared, and only the copies are written: the
    /// folder's file is not rewritten by an open (every rewrite is a
    /// window for a power cut). `known`: a device's copy the open read
    /// already, not read again.
    fn refresh_config_copy(&self, known: Option<(usize, Vec<u8>)>) {
        let Some(meta) = &self.meta else { return };
        let want = serde_json::to_string_pretty(&self.config.lock().unwrap().file)
            .expect("config serialises");
        for d in 0..self.geo.devices as usize {
            let Some(area) = meta.area(d) else { continue };
            let copy = match &known {
                Some((at, bytes)) if *at == d => Some(bytes.clone()),
                _ => read_area_file(&area, CONFIG_FILE),
            };
            if copy.as_deref() == Some(want.as_bytes()) {
                continue;
            }
            if let Err(e) = area.replace_file(CONFIG_FILE, want.as_bytes()) {
                self.warn(format!(
                    "updating the copy of {CONFIG_FILE} on device {d}: {e}"
                ));
            }
        }
    }

    /// Format 2: devices whose copy of a mirrored metadata file failed are
    /// failed, as any device write error fails its device; the warning
    /// names the copy and the operation that failed.
    pub(super) fn fail_broken_metadata_copies(&self) {
        let Some(meta) = &self.meta else { return };
        for (d, what) in meta.take_broken() {
            self.latch_failure(d, "metadata area", &std::io::Error::other(what));
        }
    }

    pub fn volume_bytes(&self) -> u64 {
        self.volume_bytes
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().unwrap().clone()
    }

    /// The warnings the open gathered and did not print: what a caller
    /// prints after the open. The others (the resync's, say) were printed
    /// as they came; printed again from [`Array::warnings`], each showed
    /// twice (a new user's probe).
    pub fn open_warnings(&self) -> Vec<String> {
        let w = self.warnings.lock().unwrap();
        w[..self.open_warnings.min(w.len())].to_vec()
    }

    fn warn(&self, msg: String) {
        eprintln!("ecdedup: warning: {msg}");
        let mut w = self.warnings.lock().unwrap();
        if w.len() < 100 {
            w.push(msg);
        }
    }

    pub fn stats(&self) -> Stats {
        let table_bytes = self.stores.iter().map(|s| s.table_ram_bytes()).sum();
        let mut stats = self.counters.snapshot(table_bytes);
        stats.dedup = self.stores.iter().map(|s| s.dedup_stats()).collect();
        if self.ssd_sim_on {
            stats.ssd = self.stores.iter().map(|s| s.wear_stats()).collect();
        }
        (
            stats.journal_bytes,
            stats.journal_logged_blocks,
            stats.journal_index_bytes,
        ) = self.journal_usage();
        stats
    }

    /// Which fingerprint backend the dedup layers use, and why.
    pub fn fingerprint_backend(&self) -> &str {
        &self.backend_why
    }

    pub fn dedup_config(&self) -> DedupConfig {
        self.config.lock().unwrap().file.dedup.clone()
    }

    /// Consistency problems of the dedup maps (empty when all is well).
    pub fn check_dedup_maps(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (d, store) in self.stores.iter().enumerate() {
            if let Some(found) = store.check_dedup() {
                problems.extend(found.into_iter().map(|p| format!("device {d}: {p}")));
            }
        }
        problems
    }

    fn member_state(&self, d: usize) -> MemberState {
        self.stores[d].state()
    }

    fn unavailable_count(&self) -> usize {
        (0..self.stores.len())
            .filter(|&d| self.stores[d].is_failed())
            .count()
    }

    /// Members in service with every stripe's content (neither failed
    /// nor still being rebuilt): a cluster PG's count for its pool's
    /// min_size.
    pub fn members_complete(&self) -> usize {
        self.stores
            .iter()
            .filter(|s| !s.is_failed() && !s.is_rebuilding())
            .count()
    }

    /// Whether `device` holds current content for `stripe`.
    fn holds(&self, device: usize, stripe: u64) -> bool {
        self.stores[device].holds(stripe)
    }

    fn device(&self, d: usize) -> Option<Arc<dyn Device>> {
        self.stores[d].device()
    }

    pub fn status(&self) -> Status {
        let cfg = self.config.lock().unwrap();
        let devices: Vec<DeviceStatus> = (0..self.stores.len())
            .map(|d| DeviceStatus {
                position: d,
                path: cfg.file.devices[d].clone(),
                state: self.member_state(d),
            })
            .collect();
        let states: Vec<MemberState> = devices.iter().map(|d| d.state).collect();
        let health = health(&states, self.geo.m());
        Status {
            array_uuid: cfg.file.array_uuid,
            devices_total: self.geo.devices,
            k: self.geo.k,
            m: self.geo.m,
            stripe_unit_bytes: self.geo.stripe_unit_bytes,
            block_bytes: self.geo.block_bytes,
            stripes: self.geo.stripes,
            volume_bytes: self.volume_bytes,
            generation: cfg.generation,
            health,
            dedup: cfg.file.dedup.clone(),
            fingerprint_backend: self.backend_why.clone(),
            ssd_sim: cfg.file.ssd_sim.clone(),
            write_policy: self.write_policy,
            devices,
            dirty_regions: self.intent.dirty_regions(),
            metadata_area_bytes: self.geo.meta_area_bytes,
            missed_regions: self
                .intent
                .missed_regions()
                .map(|m| m.iter().filter(|&&r| r).count()),
            poisoned_blocks: self.poison.len(),
            operation: self.operation.lock().unwrap().clone(),
            warnings: self.warnings(),
        }
    }

    /// Writes the current member states to every usable device under a new
    /// generation. A device that fails here is failed too, and the write is
    /// repeated for the rest.
    fn persist_superblocks(&self) -> Result<()> {
        let mut cfg = self.config.lock().unwrap();
        self.persist_locked(&mut cfg)
    }

    fn persist_locked(&self, cfg: &mut ConfigState) -> Result<()> {
        let latched = self.failures_latched.load(SeqCst);
        let mut space = None;
        for _attempt in 0..=self.stores.len() {
            cfg.generation += 1;
            let states: Vec<MemberState> = (0..self.stores.len())
                .map(|d| self.member_state(d))
                .collect();
            let mut newly_failed = false;
            // Every member in service gets the new slot as one durable
            // write (`Device::write_fua`: one message to a chunk across
            // the network, where a write and a sync were two), side by
            // side where every member is such a chunk (a round trip for
            // them all, not one or two per member, one after another).
            // Members left at the old generation by a cut are as before:
            // the newest generation wins.
            let targets: Vec<(usize, Arc<dyn Device>, Vec<u8>)> = (0..self.stores.len())
                .filter(|&d| states[d] != MemberState::Failed)
                .filter_map(|d| {
                    let dev = self.device(d)?;
                    let sb = Superblock {
                        array_uuid: *cfg.file.array_uuid.as_bytes(),
                        device_uuid: cfg.device_uuids[d],
                        generation: cfg.generation,
                        position: d as u32,
                        geometry: self.geo,
                        volume_bytes: self.volume_bytes,
                        states: states.clone(),
                        member_uuids: cfg.device_uuids.clone(),
                        boot_stamp: match self.boot_stamps.load(SeqCst) {
                            true => dev.server_boot_id().unwrap_or(0),
                            false => 0,
                        },
                    };
                    Some((d, dev, sb.encode()))
                })
                .collect();
            let chosen: Vec<usize> = targets.iter().map(|(d, _, _)| *d).collect();
            let at = Superblock::slot_offset(cfg.generation);
            let results = meta::side_by_side(
                &targets,
                self.on_chunks_side_by_side(&chosen),
                |(_, dev, bytes)| dev.write_fua(bytes, at),
            );
            for ((d, _, bytes), r) in targets.iter().zip(results) {
                let d = *d;
                match r {
                    Ok(()) => {
                        self.counters.devices[d].write(IoClass::Metadata, bytes.len());
                        self.counters.devices[d].sync();
                    }
                    // A full file system under a sparse device file: the
                    // device keeps its older superblock (the other slot) and
                    // stays in service; the caller gets ENOSPC.
                    Err(e) if Self::is_space_error(&e) => {
                        self.counters.devices[d].error();
                        space.get_or_insert(e);
                    }
                    Err(e) => {
                        self.counters.devices[d].error();
                        self.set_failed(d);
                        self.warn(format!(
                            "device {d} failed while writing its superblock: {e}"
                        ));
                        newly_failed = true;
                    }
                }
            }
            if !newly_failed {
                self.generation_written.store(cfg.generation, SeqCst);
                break;
            }
        }
        if self.unavailable_count() > self.geo.m() {
            return Err(Error::Unavailable(format!(
                "{} devices failed; RS({},{}) survives at most {}",
                self.unavailable_count(),
                self.geo.k,
                self.geo.m,
                self.geo.m
            )));
        }
        if let Some(e) = space {
            return Err(Error::NoSpace(format!(
                "writing the superblocks: {e}; the file system under the array is full: \
                 free space, then try again"
            )));
        }
        self.failures_durable.fetch_max(latched, SeqCst);
        Ok(())
    }

    /// Waits until every latched device failure is on the superblocks
    /// (writing them itself if the thread that latched it has not yet).
    pub(super) fn failures_made_durable(&self) -> Result<()> {
        if self.failures_durable.load(SeqCst) < self.failures_latched.load(SeqCst) {
            self.persist_superblocks()?;
        }
        Ok(())
    }

    fn set_failed(&self, d: usize) {
        if let Some(meta) = &self.meta {
            meta.detach(d);
        }
        self.failures_latched.fetch_add(1, SeqCst);
        self.replay_wanted.store(true, SeqCst);
        self.stores[d].fail();
        self.stores[d].drop_device();
        self.track_missed_writes(true);
    }

    /// Whether an error says the space under a device ran out (the file
    /// system holding a sparse device file, or a thin device): a fault of
    /// the host, not of the device, which keeps every byte it held.
    pub(super) fn is_space_error(err: &std::io::Error) -> bool {
        matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
    }

    /// A device write of `stripe` met a full file system: the device stays
    /// in service, the stripe is pinned dirty (its parity may not match its
    /// data) and writes are refused until it is resynchronised.
    pub(super) fn note_space_error(&self, d: usize, stripe: u64, err: &std::io::Error) {
        self.counters.devices[d].error();
        let first = self.space_errors.fetch_add(1, SeqCst) == 0;
        let newly = self.space_pending.lock().unwrap().insert(stripe);
        if first || newly {
            self.warn(format!(
                "device {d} ({}): {err}: writes are refused until space is freed; \
                 reads go on, and the device stays in service",
                self.device(d).map(|x| x.describe()).unwrap_or_default()
            ));
        }
        if let Err(e) = self.intent.pin(stripe) {
            self.warn(format!("pinning stripe {stripe} after a space error: {e}"));
        }
    }

    /// A flush met a full file system (writing a checksum page, or the
    /// device's sync): as for a write ([`Array::note_space_error`]) the
    /// device stays in service, keeping every byte it held; the flush fails
    /// with ENOSPC, so nothing is acknowledged as durable, and the intent
    /// regions it would have cleared stay dirty.
    pub(super) fn note_flush_space_error(&self, d: usize, err: &std::io::Error) {
        self.counters.devices[d].error();
        self.warn(format!(
            "device {d} ({}): flush: {err}: the flush fails until space is freed; \
             the device stays in service",
            self.device(d).map(|x| x.describe()).unwrap_or_default()
        ));
    }

    /// What a flush returns after [`Array::sync_devices`] met a full file
    /// system.
    pub(super) fn flush_space_result(space: Option<std::io::Error>) -> Result<()> {
        match space {
            None => Ok(()),
            Some(e) => Err(Error::NoSpace(format!(
                "flushing the devices: {e}; the file system under the array is full: \
                 free space, then flush again"
            ))),
        }
    }

    /// Before a write: resynchronises the stripes space errors left behind
    /// (if space is back), or refuses the write.
    pub(super) fn check_space(&self) -> Result<()> {
        let pending: Vec<u64> = self.space_pending.lock().unwrap().iter().copied().collect();
        if pending.is_empty() {
            return Ok(());
        }
        for stripe in pending {
            let before = self.space_errors.load(SeqCst);
            let _g = self.locks[Self::lock_index(stripe)].write().unwrap();
            self.resync_stripe(stripe, false);
            if self.space_errors.load(SeqCst) != before {
                return Err(Error::NoSpace(
                    "the file system under the array is full; free space, then write again".into(),
                ));
            }
            self.space_pending.lock().unwrap().remove(&stripe);
        }
        self.warn("space is back: writes are taken again".into());
        Ok(())
    }

    /// A read error: a medium error (EIO, EILSEQ, EBADMSG, ENODATA: an
    /// unreadable sector) is counted, and the caller decodes the block from
    /// the others and rewrites it (the disk remaps the sector); the device
    /// fails at the [`READ_ERRORS_MAX`]th, as Linux md's `max_read_errors`.
    /// Any other error (the device gone, a bad request) fails it at once.
    pub(super) fn note_read_error(&self, d: usize, err: &std::io::Error) {
        let medium = matches!(
            err.raw_os_error(),
            Some(libc::EIO) | Some(libc::EILSEQ) | Some(libc::EBADMSG) | Some(libc::ENODATA)
        );
        let seen = self.stores[d].count_read_error();
        if !medium || seen >= READ_ERRORS_MAX {
            self.latch_failure(d, "read", err);
            return;
        }
        self.counters.devices[d].error();
        crate::counters::bump(&self.counters.array.read_errors_corrected);
        self.warn(format!(
            "device {d}: read error ({err}), {seen} of {READ_ERRORS_MAX} before it is failed; \
             the block is decoded from the others and rewritten"
        ));
    }

    /// Latches an I/O error: the device is failed from now on.
    fn latch_failure(&self, d: usize, what: &str, err: &std::io::Error) {
        self.counters.devices[d].error();
        // Counted before the tag flips: a flush that sees the device out
        // of service also sees a failure not yet durable.
        self.failures_latched.fetch_add(1, SeqCst);
        if !self.stores[d].fail() {
            self.failures_latched.fetch_sub(1, SeqCst);
            return;
        }
        if let Some(meta) = &self.meta {
            meta.detach(d);
        }
        self.stores[d].drop_device();
        self.track_missed_writes(true);
        self.replay_wanted.store(true, SeqCst);
        if crate::media::is_fenced(err) {
            // A newer writer holds the volume: every member refuses this
            // one from now on, and none of them failed. Said once; the
            // syncs and the superblocks' record of the failure, refused
            // too, are not tried (a fenced writer logged each of its
            // devices failing, and a refused sync and superblock write
            // after each: about 23 lines before it stopped).
            if !self.fenced.swap(true, SeqCst) {
                self.warn(format!(
                    "fenced ({what}: {err}): a newer writer holds the volume; this writer \
                     stops (its members are out of its service, not recorded failed)"
                ));
            }
            return;
        }
        self.warn(format!(
            "device {d} failed ({what}: {err}); continuing degraded"
        ));
        self.sync_on_failure();
        if let Err(e) = self.persist_superblocks() {
            self.warn(format!("recording the failure of device {d}: {e}"));
        }
    }

    /// Takes a device out of service by hand (`ecdedup fail`).
    pub fn fail_device(&self, d: usize) -> Result<()> {
        self.check_position(d)?;
        if self.stores[d].is_failed() {
            return Err(Error::Config(format!("device {d} is already failed")));
        }
        if self.unavailable_count() + 1 > self.geo.m() {
            return Err(Error::Config(format!(
                "failing device {d} would leave fewer than k = {} devices; refused",
                self.geo.k
            )));
        }
        self.set_failed(d);
        self.warn(format!("device {d} failed by request"));
        self.sync_on_failure();
        self.persist_superblocks()
    }

    fn check_position(&self, d: usize) -> Result<()> {
        if d >= self.stores.len() {
            return Err(Error::Config(format!(
                "no device at position {d}; the array has {}",
                self.stores.len()
            )));
        }
        Ok(())
    }

    /// Puts a blank device in place of a failed one; `rebuild` then fills it.
    /// `path` None reuses the position's current path (the file is wiped).
    pub fn replace_device(&self, d: usize, path: Option<&Path>) -> Result<()> {
        self.check_position(d)?;
        let path = match path {
            Some(p) => p.to_owned(),
            None => self.config.lock().unwrap().file.devices[d].clone(),
        };
        let dev_err = |reason: String| Error::Device {
            path: path.clone(),
            reason,
        };
        let options = self.config.lock().unwrap().file.device_options();
        let dev = if self.storage.exists(&path) {
            FileDevice::open_with(self.storage.as_ref(), &path, options)
                .map_err(|e| dev_err(format!("cannot open: {e}")))?
        } else {
            let dev = FileDevice::create_with(
                self.storage.as_ref(),
                &path,
                self.geo.device_bytes_min(),
                options,
            )
            .map_err(|e| dev_err(format!("cannot create: {e}")))?;
            let parent = crate::media::storage::parent_of(&path);
            self.storage
                .sync_dir(parent)
                .map_err(|e| dev_err(format!("cannot sync {}: {e}", parent.display())))?;
            dev
        };
        let sim = self.config.lock().unwrap().file.ssd_sim.clone();
        let (dev, wear) = sim.wrap(Arc::new(dev))?;
        self.install_replacement(d, dev, &path)?;
        if self.ssd_sim_on {
            self.stores[d].set_wear(wear);
        }
        Ok(())
    }

    /// Format 2: formats device `d`'s metadata area on `dev` and puts it in
    /// the mirror with a copy of every mirrored file (nothing in format 1).
    pub(super) fn fresh_metadata_area(
        &self,
        d: usize,
        dev: &Arc<dyn Device>,
    ) -> std::io::Result<()> {
        self.attach_metadata_area(d, dev, AreaFs::format)
    }

    /// As [`Array::fresh_metadata_area`], with the area `make` gives
    /// (`AreaFs::format`, or `AreaFs::open` to keep what else it holds).
    pub(super) fn attach_metadata_area(
        &self,
        d: usize,
        dev: &Arc<dyn Device>,
        make: fn(Arc<dyn Device>, u64, u64) -> std::io::Result<AreaFs>,
    ) -> std::io::Result<()> {
        let Some(meta) = &self.meta else {
            return Ok(());
        };
        let area = make(
            Arc::clone(dev),
            self.geo.meta_area_offset(),
            self.geo.meta_area_bytes,
        )?;
        meta.attach_new(d, Arc::new(area))
    }

    /// Gives member `d` an empty parity journal (plog, parix; nothing
    /// otherwise): a replacement, or a member re-added. A journal file left
    /// in the folder (format 1) is removed first; in format 2 the member's
    /// fresh metadata area holds none.
    pub(super) fn install_empty_journal(&self, d: usize) -> Result<()> {
        if !self.write_policy.journals() {
            return Ok(());
        }
        let path = self.dir.join(JOURNAL_DIR).join(format!("dev{d}.jrnl"));
        let _ = self.storage.remove(&path);
        let (j, warning) = open_journal(&self.storage, &path, self.journal_bytes_max)?;
        if let Some(w) = warning {
            self.warn(w);
        }
        self.stores[d].install_journal(j);
        Ok(())
    }

    /// Installs an open device as the blank replacement of failed position `d`.
    pub fn install_replacement(&self, d: usize, dev: Arc<dyn Device>, path: &Path) -> Result<()> {
        self.check_position(d)?;
        if !self.stores[d].is_failed() {
            return Err(Error::Config(format!(
                "device {d} is in service; `ecdedup fail {d}` it first"
            )));
        }
        let mut cfg = self.config.lock().unwrap();
        let dev_err = |reason: String| Error::Device {
            path: path.to_owned(),
            reason,
        };
        let need = self.geo.device_bytes_min();
        if dev.size() < need {
            return Err(dev_err(format!("holds {} bytes, needs {need}", dev.size())));
        }
        if let Ok(sb) = read_superblock(dev.as_ref()) {
            if sb.array_uuid != *cfg.file.array_uuid.as_bytes() {
                return Err(dev_err(format!(
                    "belongs to another array ({}); wipe its first 8 KiB to reuse it",
                    uuid::Uuid::from_bytes(sb.array_uuid)
                )));
            }
        }
        let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        let given = absolute_path(path);
        for (i, other) in cfg.file.devices.iter().enumerate() {
            if i != d && std::fs::canonicalize(other).unwrap_or_else(|_| other.clone()) == canonical
            {
                return Err(dev_err(format!("is already device {i} of this array")));
            }
        }
        // The position's poisoned blocks are reconstructed onto the blank
        // device (the placeholder): no later re-add of it may take them
        // as the member's own.
        self.drop_own_held_of(d)?;
        dev.discard(0, need)
            .and_then(|()| allocate_superblock_slots(dev.as_ref()))
            .map_err(|e| dev_err(format!("cannot wipe: {e}")))?;
        // Its metadata area, with a copy of every mirrored file, before
        // anything (its dedup maps, its journal) is written there.
        self.fresh_metadata_area(d, &dev)
            .map_err(|e| dev_err(format!("cannot write its metadata area: {e}")))?;
        let dev: Arc<dyn Device> = match &self.backend {
            Some(backend) => {
                let layered = wrap_dedup(
                    &self.storage,
                    &self.dir,
                    &cfg.file.dedup,
                    &self.geo,
                    dev,
                    Arc::clone(backend),
                    d,
                    true,
                )?;
                self.stores[d].set_dedup(layered.here);
                layered.device
            }
            None => dev,
        };
        // A blank device is rebuilt whole: no re-add of the position's
        // last member goes on.
        self.intent
            .set_re_adding(d, false)
            .map_err(|e| Error::io("recording a replacement in the missed-write map", e))?;
        self.stores[d].set_re_adding(false);
        self.stores[d].begin_replacement();
        self.install_empty_journal(d)?;
        cfg.device_uuids[d] = *uuid::Uuid::new_v4().as_bytes();
        cfg.file.devices[d] = given;
        cfg.file.store_in(self.storage.as_ref(), &self.dir)?;
        self.stores[d].put_in_service(dev);
        self.persist_locked(&mut cfg)
    }

    fn begin_operation(&self, op: &str, total: u64) -> Result<()> {
        let mut cur = self.operation.lock().unwrap();
        if let Some(p) = cur.as_ref() {
            if !p.finished {
                return Err(Error::Busy(format!(
                    "{} is running ({} of {})",
                    p.op, p.done, p.total
                )));
            }
        }
        let seq = cur.as_ref().map_or(1, |p| p.seq + 1);
        *cur = Some(OpProgress {
            seq,
            op: op.into(),
            done: 0,
            total,
            finished: false,
            error: None,
            result: None,
        });
        Ok(())
    }

    fn progress_operation(&self, done: u64) {
        if let Some(p) = self.operation.lock().unwrap().as_mut() {
            p.done = done;
        }
    }

    fn end_operation(&self, result: &Result<impl Serialize>) {
        if let Some(p) = self.operation.lock().unwrap().as_mut() {
            p.finished = true;
            match result {
                Err(e) => p.error = Some(e.to_string()),
                Ok(r) => {
                    p.done = p.total;
                    p.result = serde_json::to_value(r).ok();
                }
            }
        }
    }

    pub fn operation(&self) -> Option<OpProgress> {
        self.operation.lock().unwrap().clone()
    }

    /// Changes the partial-write policy (offline: the array is open here and
    /// nowhere else). Journals are replayed first, so none is left behind.
    pub fn set_write_policy(mut self, policy: WritePolicy) -> Result<()> {
        if policy == WritePolicy::Replicate || self.write_policy == WritePolicy::Replicate {
            return Err(Error::Config(
                "replicate is a geometry (RS(1,2)), chosen at create time; it cannot be switched to or from".into(),
            ));
        }
        self.replay_all(None)?;
        {
            let mut cfg = self.config.lock().unwrap();
            cfg.file.write_policy = policy;
            cfg.file.store_in(self.storage.as_ref(), &self.dir)?;
        }
        self.write_policy = policy;
        self.close()
    }

    fn idle_ms(&self) -> u64 {
        (self.started.elapsed().as_millis() as u64).saturating_sub(self.last_write_ms.load(SeqCst))
    }

    fn note_write(&self) {
        // A write after a close (a misuse) is flushed at the drop again;
        // a load, not a store, on every other write.
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            self.closed.store(false, SeqCst);
        }
        self.last_write_ms
            .store(self.started.elapsed().as_millis() as u64, SeqCst);
    }

    /// Clean shutdown: everything durable, intent map clean.
    pub fn close(&self) -> Result<()> {
        self.stopping.store(true, SeqCst);
        // The background replay stops at its next stripe; what it wrote is
        // then in the flush below, and the intent log is cleared only once
        // no fold can be between its intent and its parity write.
        let replay = self.background_replay.lock().unwrap().take();
        if let Some(thread) = replay {
            if thread.thread().id() != std::thread::current().id() && thread.join().is_err() {
                self.warn("the background replay panicked before the close".to_string());
            }
        }
        self.flush()?;
        self.intent
            .clear_all()
            .map_err(|e| Error::io("clearing the intent log", e))?;
        self.closed.store(true, SeqCst);
        Ok(())
    }
}

impl Array {
    /// Test support: stops as kill -9 would, with nothing flushed and the
    /// intent log left as it is. Every write already issued stays on the media.
    pub fn simulate_crash(self) {
        self.crashed.store(true, SeqCst);
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        if !self.crashed.load(SeqCst) && !self.closed.load(SeqCst) {
            let _ = self.flush();
        }
    }
}
