//! The chunk server's protocol logic: requests in, replies out, over a
//! [`Storage`]; no sockets, no clocks (the cluster simulator drives it
//! directly, the daemon through the transport).
//!
//! Each request names a chunk by (volume id, `pg` field = PG << 8 | shard)
//! and carries the writer's epoch of the volume. The server keeps the
//! highest epoch it has seen per volume, durably (`epochs/v<ID>` in its
//! first data folder, written atomically before anything acts on a higher
//! epoch), and refuses any request with a lower one: `EpochTooOld`. A
//! writer that has been taken over can therefore land nothing on a server
//! that has heard from its successor: by its push, or from etcd through
//! the daemon's follower of the writer keys ([`ChunkServer::raise_epoch`];
//! docs/cluster.md, "Fencing").
//!
//! A request for a chunk also carries the epoch of its PG's record in
//! etcd that its sender acts on (`pg_epoch`; bumped by every re-placement
//! of the PG). The server keeps the highest per (volume, PG) the same way
//! (`epochs/v<ID>.pg<PG>`) and refuses a request with a lower one:
//! `PgEpochTooOld`, naming both (docs/cluster.md, "Where the PG epoch
//! travels").
//!
//! Invariants:
//! - a request is checked whole (op, epoch, chunk, bounds) before any byte
//!   of a chunk is touched; a bad one gets `Invalid` with the reason;
//! - a write acknowledged with FUA, or followed by an acknowledged `Flush`
//!   of its chunk, is durable;
//! - once [`ChunkServer::fence`] is called (the lease could not be
//!   renewed), every request is refused with `Io`: nothing more is
//!   acknowledged;
//! - open chunks are bounded by [`ChunkServerConfig::open_chunks_max`]
//!   (the least recently used is closed; an open is cheap);
//! - a chunk with a dedup layer (`Op::Layer`, since the late evening of 2026-11-29) is read
//!   and written through it, always: its spec is stored beside the chunk
//!   (`pg<PG>-s<SHARD>.layer`) before the layer's first answer, and every
//!   open of the chunk opens the layer from its maps beside it
//!   (`pg<PG>-s<SHARD>.map.log`, `.map.snap`), or refuses its data area
//!   where they do not open; one layer object per chunk at a time
//!   (opened under the open-chunk lock; closed by the open-chunk bounds
//!   only when no request holds it and after its sync, a failed sync
//!   leaving the chunk with a fault that refuses every request but its
//!   `Open`; replaced only by a fresh start, which waits for the
//!   volume's requests in flight and discards the layer's content); a
//!   read or write across the start of its data area, or any request
//!   past its end, is refused (`Invalid`), never passed to it (a
//!   discard across the start is the layer's to take); a request marked
//!   `FLAG_LAYERED` for a chunk without a layer, or unmarked on the data
//!   area of a chunk with one, is refused (`Io`).

use ecdedup_cluster::keys::VolumeDedup;
use ecdedup_core::counters::{DedupStats, IoClass};
use ecdedup_core::dedup::DedupDevice;
use ecdedup_core::fingerprint::{CpuBackend, FingerprintBackend};
use ecdedup_core::media::fold;
use ecdedup_core::media::storage::{read_all, write_atomic};
use ecdedup_core::media::{Device, DeviceOptions, FileDevice, IoMode, Storage, WriteHint};
use ecdedup_core::proto::frame::{
    decode_append, decode_layer, decode_replay, encode_replay_answers, LayerSpec, FLAG_FUA,
    FLAG_LAYERED, FLAG_METADATA, FLAG_PARITY, FLAG_REPAIR,
};
use ecdedup_core::proto::{chunk_parts, Header, Op, Status};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Largest chunk the server creates (1 PiB: a bound, not a reservation).
pub const CHUNK_BYTES_MAX: u64 = 1 << 50;

#[derive(Clone, Debug)]
pub struct ChunkServerConfig {
    /// The data folders (one per device or file system); a chunk lives in
    /// `dirs[hash % len]`.
    pub dirs: Vec<PathBuf>,
    /// How chunk files are read and written.
    pub io: IoMode,
    /// Chunks kept open at once.
    pub open_chunks_max: usize,
    /// RAM the dedup layers of the open chunks may hold together (their
    /// maps and fingerprint indexes: about 16 bytes per dedup block of a
    /// chunk's data area, plus the index; each counted as it was when
    /// opened, its index growing after within its own bound); past it
    /// the least recently used layered chunk is closed (synced first).
    /// One layer over the bound is still opened, alone.
    pub layers_ram_max: u64,
}

/// [`ChunkServerConfig::layers_ram_max`] by default: 4 GiB (the maps of
/// about 15 chunks of 64 GiB, the data share of a 256 GiB PG of RS(4,2),
/// fewer with full indexes: a server holding more of them at once closes
/// and reopens layers).
pub const LAYERS_RAM_MAX_DEFAULT: u64 = 4 << 30;

/// Counts for the server's status and tests.
#[derive(Debug, Default)]
pub struct ChunkCounters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub syncs: AtomicU64,
    /// Parity folds run (`Replay`), and their rows folded.
    pub folds: AtomicU64,
    pub rows_folded: AtomicU64,
    pub epoch_refusals: AtomicU64,
    /// Requests refused for an older PG epoch than stored.
    pub pg_epoch_refusals: AtomicU64,
    pub invalid: AtomicU64,
    /// Volumes whose chunks this server deleted (`volume rm`).
    pub volumes_removed: AtomicU64,
    /// Chunk files deleted with them.
    pub chunks_removed: AtomicU64,
    /// Dedup layers started (`Op::Layer` with `fresh`).
    pub layers_started: AtomicU64,
    /// Dedup layers closed (the open-chunk bounds, a new start).
    pub layers_closed: AtomicU64,
    /// Open chunks kept over the bound because their layer's sync failed.
    pub layer_sync_failures: AtomicU64,
}

/// The epoch stored for a removed volume: above every writer's, so every
/// later request for it is refused, and final (ids are never reused).
pub const REMOVED_EPOCH: u64 = u64::MAX;

/// What [`ChunkServer::remove_volume`] deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    pub chunks: u64,
    /// Bytes the file system had allocated to them.
    pub bytes: u64,
}

pub struct ChunkServer {
    storage: Arc<dyn Storage>,
    config: ChunkServerConfig,
    open: Mutex<OpenChunks>,
    /// Highest epoch per volume and PG epoch per (volume, PG), as stored.
    epochs: Mutex<HashMap<Fenced, u64>>,
    fenced: AtomicBool,
    /// Chosen at random when the server starts: every reply that
    /// acknowledges a change carries it, so a client notices a restart
    /// (and the unsynced writes a crash may have lost) between two of its
    /// requests.
    boot_id: u64,
    pub counters: ChunkCounters,
    /// The fingerprint backend of the dedup layers (made at the first).
    backend: std::sync::OnceLock<Arc<dyn FingerprintBackend>>,
    /// The counters of the dedup layers closed since the server started.
    closed_dedup: Mutex<ecdedup_cluster::keys::ServerDedup>,
    /// Per layered chunk closed since the start: its write counts summed
    /// over its closes, and its space at the last one (mapped blocks,
    /// slots used); one entry per chunk, dropped with its volume.
    closed_chunks: Mutex<HashMap<(u64, u32), ClosedLayer>>,
    /// Volumes whose epoch was raised in memory only ([`Self::raise_epoch`]
    /// for a volume without a file): their first request stores it.
    epochs_unsaved: Mutex<BTreeSet<u64>>,
    /// The etcd revision of the last whole read of the writer keys
    /// ([`Self::apply_writer_keys`]): a volume this server holds no epoch
    /// of had no writer then, so a request for it at an epoch up to this
    /// is refused (0: no read, as in tests and the simulator).
    epoch_floor: AtomicU64,
    /// Held while a chunk is made (`Open`) or its layer started
    /// (`Layer`): neither runs beside another.
    layout: Mutex<()>,
    /// Per volume: requests being served hold it shared, a raise of the
    /// volume's epoch or a fresh start of a layer alone (`serve`).
    gates: Mutex<HashMap<u64, Arc<RwLock<()>>>>,
}

/// A request's hold on its volume's gate (one of the two), released
/// when it is dropped.
struct Turn<'a> {
    _shared: Option<std::sync::RwLockReadGuard<'a, ()>>,
    _alone: Option<std::sync::RwLockWriteGuard<'a, ()>>,
}

#[derive(Default)]
struct OpenChunks {
    by_name: HashMap<(u64, u32), (Arc<Chunk>, u64)>,
    clock: u64,
}

/// An open chunk: its file, and the dedup layer over it where it has one.
struct Chunk {
    file: Arc<FileDevice>,
    layer: Layer,
    /// Set when this chunk's layer may have lost what it acknowledged (its
    /// sync failed as it was to be closed; a fresh start failed, maybe
    /// after its maps were reset): every request but its `Open` and a
    /// fresh start (`Op::Layer`) is refused with it, and the chunk stays
    /// open (a reopen would not know).
    fault: Mutex<Option<String>>,
}

/// A chunk's dedup layer, as its files say.
enum Layer {
    /// No spec stored: the chunk is read and written as it is.
    None,
    Open {
        layer: Arc<DedupDevice>,
        spec: LayerSpec,
        /// The layer's RAM when opened (its maps; its index grows within
        /// its own bound).
        ram: u64,
    },
    /// A spec is stored but the layer does not open (its maps, or the spec
    /// itself, do not read back): its data area is refused (`Io`), bytes
    /// before it pass through (where the spec is known), and a fresh start
    /// makes it blank.
    Unreadable {
        spec: Option<LayerSpec>,
        why: String,
    },
}

impl Chunk {
    fn new(file: Arc<FileDevice>, layer: Layer) -> Chunk {
        Chunk {
            file,
            layer,
            fault: Mutex::new(None),
        }
    }

    /// The open layer, if any.
    fn layer(&self) -> Option<&Arc<DedupDevice>> {
        match &self.layer {
            Layer::Open { layer, .. } => Some(layer),
            _ => None,
        }
    }

    /// Whether a layer's spec is stored for this chunk (open or not).
    fn layered(&self) -> bool {
        !matches!(self.layer, Layer::None)
    }

    /// RAM its dedup layer held when opened (0 without one).
    fn layer_ram(&self) -> u64 {
        match &self.layer {
            Layer::Open { ram, .. } => *ram,
            _ => 0,
        }
    }

    /// What requests read and write: the layer where there is one.
    fn dev(&self) -> &dyn Device {
        match &self.layer {
            Layer::Open { layer, .. } => layer.as_ref(),
            _ => self.file.as_ref(),
        }
    }

    /// Refuses every request while the chunk has a fault.
    fn check_fault(&self) -> Result<(), Refusal> {
        match self.fault.lock().unwrap().as_ref() {
            Some(why) => Err((Status::Io, format!("{}: {why}", self.file.describe()))),
            None => Ok(()),
        }
    }

    /// Checks `[offset, offset + len)` against the chunk's size and, with
    /// a layer, that it lies before the layer's data area or inside it;
    /// an unreadable layer's data area is refused.
    fn check_range(&self, offset: u64, len: u64) -> Result<(), Refusal> {
        check_range(self.file.as_ref(), offset, len)?;
        let spec = match &self.layer {
            Layer::None => return Ok(()),
            Layer::Open { spec, .. } => spec,
            Layer::Unreadable { spec: None, why } => {
                return Err((Status::Io, format!("{}: {why}", self.file.describe())))
            }
            Layer::Unreadable {
                spec: Some(spec),
                why,
            } => {
                if offset.saturating_add(len) > spec.data_offset {
                    return Err((Status::Io, format!("{}: {why}", self.file.describe())));
                }
                spec
            }
        };
        match spec.takes_range(offset, len) {
            true => Ok(()),
            false => Err(invalid(format!(
                "[{offset}, +{len}) crosses the edge of the dedup layer's data area \
                 ([{}, +{})) on {}",
                spec.data_offset,
                spec.data_bytes,
                self.file.describe()
            ))),
        }
    }

    /// [`Self::check_range`] and [`Self::check_layered`].
    fn check(&self, layered: bool, offset: u64, len: u64) -> Result<(), Refusal> {
        self.check_range(offset, len)?;
        self.check_layered(layered, offset, len)
    }

    /// Checks a discard of `[offset, offset + len)`: as any range, except
    /// that a layer takes one across its data area's start.
    fn check_discard(&self, offset: u64, len: u64) -> Result<(), Refusal> {
        check_range(self.file.as_ref(), offset, len)?;
        let Layer::Open { spec, .. } = &self.layer else {
            return self.check_range(offset, len);
        };
        match offset + len <= spec.data_offset + spec.data_bytes {
            true => Ok(()),
            false => Err(invalid(format!(
                "a discard of [{offset}, +{len}) past the end of the dedup layer's data area \
                 ([{}, +{})) on {}",
                spec.data_offset,
                spec.data_bytes,
                self.file.describe()
            ))),
        }
    }

    /// Checks that a writer reaches `[offset, offset + len)` through a
    /// layer here exactly when the chunk has one (`expected`: the frame's
    /// `FLAG_LAYERED`): a writer that decided otherwise (a layer's spec
    /// gone, or back, behind its back) must not read remapped bytes raw or
    /// raw bytes through a map. Bytes before the data area are the same
    /// either way (the layer passes them through), so a writer reads them
    /// before it knows (its superblocks and metadata area, at open).
    fn check_layered(&self, expected: bool, offset: u64, len: u64) -> Result<(), Refusal> {
        let data_offset = match &self.layer {
            Layer::Open { spec, .. }
            | Layer::Unreadable {
                spec: Some(spec), ..
            } => Some(spec.data_offset),
            _ => None,
        };
        let touches_data = data_offset.is_none_or(|at| offset.saturating_add(len) > at);
        match (expected, self.layered()) {
            (true, false) => Err((
                Status::Io,
                format!(
                    "{} has no dedup layer here, but its writer reads it through one",
                    self.file.describe()
                ),
            )),
            (false, true) if touches_data => Err((
                Status::Io,
                format!(
                    "{} has a dedup layer here, but its writer reads its data area without one",
                    self.file.describe()
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// What an epoch fences: a volume's writers (the frame's `epoch`), or the
/// placements of one PG of a volume (a request's `pg_epoch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Fenced {
    Volume(u64),
    Pg(u64, u32),
}

impl std::fmt::Display for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fenced::Volume(v) => write!(f, "volume {v}"),
            Fenced::Pg(v, pg) => write!(f, "volume {v} PG {pg}"),
        }
    }
}

/// A refusal: the status and the reason (the reply's payload).
type Refusal = (Status, String);

fn invalid(reason: impl Into<String>) -> Refusal {
    (Status::Invalid, reason.into())
}

fn io_refusal(what: &str, e: &io::Error) -> Refusal {
    let status = match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => Status::NoSpace,
        _ => Status::Io,
    };
    (status, format!("{what}: {e}"))
}

fn u64_payload(payload: &[u8], what: &str) -> Result<u64, Refusal> {
    let bytes: [u8; 8] = payload.try_into().map_err(|_| {
        invalid(format!(
            "{what}: a payload of {} bytes, not 8",
            payload.len()
        ))
    })?;
    Ok(u64::from_le_bytes(bytes))
}

impl ChunkServer {
    pub fn new(storage: Arc<dyn Storage>, config: ChunkServerConfig) -> io::Result<ChunkServer> {
        if config.dirs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a chunk server needs at least one data folder",
            ));
        }
        for dir in &config.dirs {
            storage.create_dir_all(&dir.join("chunks"))?;
        }
        storage.create_dir_all(&config.dirs[0].join("epochs"))?;
        Ok(ChunkServer {
            storage,
            config,
            open: Mutex::new(OpenChunks::default()),
            epochs: Mutex::new(HashMap::new()),
            fenced: AtomicBool::new(false),
            boot_id: {
                use std::hash::{BuildHasher, Hasher};
                std::collections::hash_map::RandomState::new()
                    .build_hasher()
                    .finish()
                    | 1
            },
            counters: ChunkCounters::default(),
            backend: std::sync::OnceLock::new(),
            closed_dedup: Mutex::new(Default::default()),
            closed_chunks: Mutex::new(HashMap::new()),
            epochs_unsaved: Mutex::new(BTreeSet::new()),
            epoch_floor: AtomicU64::new(0),
            layout: Mutex::new(()),
            gates: Mutex::new(HashMap::new()),
        })
    }

    /// Stops acknowledging anything (the lease is lost).
    pub fn fence(&self) {
        self.fenced.store(true, Ordering::SeqCst);
    }

    /// This run's boot id (see the field).
    pub fn boot_id(&self) -> u64 {
        self.boot_id
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// The highest epoch stored for `volume` (0: none).
    pub fn epoch(&self, volume: u64) -> io::Result<u64> {
        self.stored(Fenced::Volume(volume))
    }

    /// The highest PG epoch stored for PG `pg` of `volume` (0: none).
    pub fn pg_epoch(&self, volume: u64, pg: u32) -> io::Result<u64> {
        self.stored(Fenced::Pg(volume, pg))
    }

    /// Raises writer epoch `epoch` of `volume` as a `SetEpoch` at that
    /// epoch would, without a request: the daemon's follower of the
    /// writer keys in etcd calls it for each new writer (and at the
    /// start, for every writer key) before it says so in etcd, so a
    /// server that a new writer's push missed refuses the old writer as
    /// soon as it has heard of the new one from etcd (docs/cluster.md,
    /// "Fencing"). Takes the volume's gate alone: returns once every
    /// request admitted at a lower epoch has finished. Stored durably for
    /// a volume this server has an epoch of; for any other (most of a big
    /// cluster's volumes, on a given server) in memory only, where the
    /// daemon's read of every writer key before it serves stands in for
    /// the file after a restart, and a request at that epoch stores it.
    /// Returns whether the epoch rose; a removed volume stays removed.
    /// A damaged epoch file leaves the volume as it is: refused whole
    /// (every request's admission reads the file), which fences any old
    /// writer as well; the others go on.
    pub fn raise_epoch(&self, volume: u64, epoch: u64) -> io::Result<bool> {
        self.raise_epoch_as(volume, epoch, true)
    }

    /// [`Self::raise_epoch`], in memory only unless `durable` (and the
    /// volume has an epoch file).
    fn raise_epoch_as(&self, volume: u64, epoch: u64, durable: bool) -> io::Result<bool> {
        let key = Fenced::Volume(volume);
        let stored = |key| match self.stored(key) {
            Err(e) if e.kind() == io::ErrorKind::InvalidData => Ok(u64::MAX),
            other => other,
        };
        if epoch == 0 || stored(key)? >= epoch {
            return Ok(false);
        }
        let gate = self.gate(volume);
        let _alone = gate.write().unwrap_or_else(|p| p.into_inner());
        let before = stored(key)?;
        if before >= epoch {
            return Ok(false);
        }
        if before == 0 || !durable {
            // No file (`stored` read none), or not asked for one. Checked
            // again under the map's lock: a removal (which takes no gate)
            // may have stored REMOVED_EPOCH since.
            let mut epochs = self.epochs.lock().unwrap();
            if epochs.get(&key).copied().unwrap_or(before) >= epoch {
                return Ok(false);
            }
            epochs.insert(key, epoch);
            self.epochs_unsaved.lock().unwrap().insert(volume);
            return Ok(true);
        }
        self.raise(key, epoch)
            .map_err(|(_, reason)| io::Error::other(reason))?;
        Ok(true)
    }

    /// The writer keys as etcd held them at `revision`, read whole (at
    /// the daemon's start, after its registration, and again when its
    /// watch reloads after a compaction): `keys` gives each volume that
    /// has a writer then, with its epoch (its key's creation revision),
    /// raised to it. No other volume had a writer at `revision`, so any
    /// writer of it at an epoch up to `revision` has lost its key (taken
    /// over, expired, released) and is refused: every other volume this
    /// server knows of is raised to `revision`, and so is, as a floor,
    /// every volume it does not know yet ([`Self::raise_epoch`] each).
    /// Returns how many epochs rose.
    pub fn apply_writer_keys(&self, revision: u64, keys: &[(u64, u64)]) -> io::Result<usize> {
        let mut raised = 0;
        let keyed: BTreeSet<u64> = keys.iter().map(|&(v, _)| v).collect();
        for &(volume, epoch) in keys {
            raised += usize::from(self.raise_epoch(volume, epoch)?);
        }
        self.epoch_floor.fetch_max(revision, Ordering::SeqCst);
        // In memory: every whole read (each start, each reload) raises
        // them again, and a file written per idle volume at each start
        // would hold requests back (they wait for this).
        for volume in self.known_volumes()? {
            if !keyed.contains(&volume) {
                raised += usize::from(self.raise_epoch_as(volume, revision, false)?);
            }
        }
        Ok(raised)
    }

    /// Every volume this server holds an epoch of, stored or in memory.
    fn known_volumes(&self) -> io::Result<BTreeSet<u64>> {
        let mut known: BTreeSet<u64> = self.volumes_here()?.into_iter().collect();
        known.extend(self.epochs.lock().unwrap().keys().filter_map(|k| match k {
            Fenced::Volume(v) => Some(*v),
            Fenced::Pg(..) => None,
        }));
        Ok(known)
    }

    fn stored(&self, key: Fenced) -> io::Result<u64> {
        if let Some(e) = self.epochs.lock().unwrap().get(&key) {
            return Ok(*e);
        }
        let path = self.epoch_path(key);
        let stored = match read_all(self.storage.as_ref(), &path) {
            Ok(bytes) => parse_epoch(&bytes).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} is damaged: the server refuses {key} until it is repaired \
                         (write the newest epoch into it)",
                        path.display()
                    ),
                )
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        self.epochs.lock().unwrap().insert(key, stored);
        Ok(stored)
    }

    fn epoch_path(&self, key: Fenced) -> PathBuf {
        let name = match key {
            Fenced::Volume(volume) => format!("v{volume}"),
            Fenced::Pg(volume, pg) => format!("v{volume}.pg{pg}"),
        };
        self.config.dirs[0].join("epochs").join(name)
    }

    /// Compares `epoch` with the one stored for `key`, storing it durably
    /// first when it is higher (under the map's lock: two raises are
    /// stored in order). Returns the highest epoch now stored: the caller
    /// refuses the request when that is above `epoch`.
    fn raise(&self, key: Fenced, epoch: u64) -> Result<u64, Refusal> {
        let stored = self
            .stored(key)
            .map_err(|e| io_refusal(&format!("reading the epoch of {key}"), &e))?;
        let unsaved = |key: Fenced| match key {
            Fenced::Volume(v) => self.epochs_unsaved.lock().unwrap().contains(&v),
            Fenced::Pg(..) => false,
        };
        if epoch < stored || (epoch == stored && !unsaved(key)) {
            return Ok(stored);
        }
        let mut epochs = self.epochs.lock().unwrap();
        let now = epochs.get(&key).copied().unwrap_or(stored);
        // An epoch raised in memory only is stored at its first request.
        if epoch > now || (epoch == now && unsaved(key)) {
            write_atomic(
                self.storage.as_ref(),
                &self.epoch_path(key),
                format!("{epoch}\n").as_bytes(),
            )
            .map_err(|e| io_refusal(&format!("storing the epoch of {key}"), &e))?;
            epochs.insert(key, epoch);
            if let Fenced::Volume(v) = key {
                self.epochs_unsaved.lock().unwrap().remove(&v);
            }
            return Ok(epoch);
        }
        Ok(now)
    }

    /// Admits `epoch` for `volume`: refused below the stored one; stored
    /// durably first when above it.
    fn admit_epoch(&self, volume: u64, epoch: u64) -> Result<(), Refusal> {
        if epoch == 0 {
            return Err(invalid("epoch 0: a writer's epoch is at least 1"));
        }
        // One read for both checks below (every request passes here).
        let known = self.stored(Fenced::Volume(volume)).ok();
        if known == Some(REMOVED_EPOCH) {
            self.counters.epoch_refusals.fetch_add(1, Ordering::Relaxed);
            return Err((
                Status::EpochTooOld,
                format!(
                    "EPOCH_TOO_OLD: volume {volume} was removed (volume rm); this server \
                     deleted its chunks"
                ),
            ));
        }
        let floor = self.epoch_floor.load(Ordering::SeqCst);
        if epoch <= floor && known == Some(0) {
            self.counters.epoch_refusals.fetch_add(1, Ordering::Relaxed);
            return Err((
                Status::EpochTooOld,
                format!(
                    "EPOCH_TOO_OLD: volume {volume} had no writer at etcd revision {floor}, \
                     when this server read the writer keys, and this request carries epoch \
                     {epoch}, created before that (its writer's key is gone)"
                ),
            ));
        }
        let stored = self.raise(Fenced::Volume(volume), epoch)?;
        if epoch < stored {
            self.counters.epoch_refusals.fetch_add(1, Ordering::Relaxed);
            return Err((
                Status::EpochTooOld,
                format!(
                    "EPOCH_TOO_OLD: volume {volume} is written at epoch {stored}, this \
                     request carries {epoch} (a newer writer took the volume over)"
                ),
            ));
        }
        Ok(())
    }

    /// Admits PG epoch `epoch` for PG `pg` of `volume` (a request for one
    /// of its chunks): refused below the stored one; stored durably first
    /// when above it (docs/cluster.md, "Where the PG epoch travels").
    fn admit_pg_epoch(&self, volume: u64, pg: u32, epoch: u32) -> Result<(), Refusal> {
        if epoch == 0 {
            return Err(invalid(format!(
                "PG epoch 0 in a request for a chunk of volume {volume} PG {pg}: a PG's epoch \
                 is at least 1 (a sender of protocol version 2 names the epoch of the PG \
                 record it acts on)"
            )));
        }
        let stored = self.raise(Fenced::Pg(volume, pg), u64::from(epoch))?;
        if u64::from(epoch) < stored {
            self.counters
                .pg_epoch_refusals
                .fetch_add(1, Ordering::Relaxed);
            return Err((
                Status::PgEpochTooOld,
                format!(
                    "PG_EPOCH_TOO_OLD: volume {volume} PG {pg} is at PG epoch {stored} on this \
                     server, this request carries {epoch} (the PG was re-placed: its record \
                     in etcd names its servers now)"
                ),
            ));
        }
        Ok(())
    }

    fn chunk_path(&self, volume: u64, code: u32) -> PathBuf {
        let (pg, shard) = chunk_parts(code);
        let dirs = &self.config.dirs;
        let at = (volume as usize)
            .wrapping_mul(31)
            .wrapping_add(pg as usize * 7 + shard as usize)
            % dirs.len();
        dirs[at]
            .join("chunks")
            .join(format!("v{volume}"))
            .join(format!("pg{pg}-s{shard}.chunk"))
    }

    fn options(&self) -> DeviceOptions {
        DeviceOptions {
            io: self.config.io,
            sparse: true,
        }
    }

    /// Where the dedup layer of a chunk keeps its spec, and the name its
    /// maps take beside the chunk.
    fn layer_paths(&self, volume: u64, code: u32) -> (PathBuf, PathBuf, String) {
        let chunk = self.chunk_path(volume, code);
        let folder = chunk
            .parent()
            .expect("a chunk path has a folder")
            .to_owned();
        let stem = chunk
            .file_stem()
            .expect("a chunk path has a name")
            .to_string_lossy()
            .into_owned();
        (
            folder.join(format!("{stem}.layer")),
            folder,
            format!("{stem}.map"),
        )
    }

    /// The fingerprint backend of every layer (made at the first layer's
    /// open; one thread: the request's own).
    fn backend(&self) -> Result<Arc<dyn FingerprintBackend>, Refusal> {
        if let Some(b) = self.backend.get() {
            return Ok(Arc::clone(b));
        }
        let cpu = CpuBackend::new(Some(1))
            .map_err(|e| (Status::Io, format!("starting the fingerprint backend: {e}")))?;
        Ok(Arc::clone(self.backend.get_or_init(|| Arc::new(cpu))))
    }

    /// Opens the dedup layer of `spec` over `file` (`spec.fresh`: empty,
    /// its maps reset).
    fn open_layer(
        &self,
        volume: u64,
        code: u32,
        file: &Arc<FileDevice>,
        spec: &LayerSpec,
    ) -> Result<Arc<DedupDevice>, Refusal> {
        let (_, folder, name) = self.layer_paths(volume, code);
        let layer = DedupDevice::open(
            Arc::clone(&self.storage),
            Arc::clone(file) as Arc<dyn Device>,
            spec.config.clone(),
            self.backend()?,
            spec.data_offset,
            spec.data_bytes,
            &folder,
            &name,
            spec.fresh,
        )
        .map_err(|e| {
            (
                Status::Io,
                format!("opening the dedup layer of {}: {e}", file.describe()),
            )
        })?;
        Ok(Arc::new(layer))
    }

    /// The layer a chunk's files describe: none without a spec; open, or
    /// unreadable with the reason (a spec that does not read back or
    /// parse, maps that do not open). Only a spec that is absent means
    /// no layer: an error reading it is not taken for its absence.
    fn stored_layer(&self, volume: u64, code: u32, file: &Arc<FileDevice>) -> Layer {
        let (spec_path, _, _) = self.layer_paths(volume, code);
        let bytes = match read_all(self.storage.as_ref(), &spec_path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Layer::None,
            Err(e) => {
                return Layer::Unreadable {
                    spec: None,
                    why: format!("its dedup layer's spec {}: {e}", spec_path.display()),
                }
            }
        };
        let spec =
            match decode_layer(&bytes).and_then(|spec| spec.check(file.size()).map(|()| spec)) {
                Ok(spec) => spec,
                Err(why) => {
                    return Layer::Unreadable {
                        spec: None,
                        why: format!("its dedup layer's spec {}: {why}", spec_path.display()),
                    }
                }
            };
        match self.open_layer(volume, code, file, &spec) {
            Ok(layer) => {
                let ram = layer.ram_bytes();
                Layer::Open { layer, spec, ram }
            }
            Err((_, why)) => Layer::Unreadable {
                spec: Some(spec),
                why,
            },
        }
    }

    /// The open chunk, opened from its file if it exists (with its dedup
    /// layer, where its spec is stored beside it).
    fn chunk(&self, volume: u64, code: u32) -> Result<Arc<Chunk>, Refusal> {
        let mut open = self.open.lock().unwrap();
        open.clock += 1;
        let clock = open.clock;
        if let Some((chunk, used)) = open.by_name.get_mut(&(volume, code)) {
            *used = clock;
            return Ok(Arc::clone(chunk));
        }
        let path = self.chunk_path(volume, code);
        if !self.storage.exists(&path) {
            let (pg, shard) = chunk_parts(code);
            return Err((
                Status::NotHere,
                format!("no chunk of volume {volume} PG {pg} shard {shard} here"),
            ));
        }
        let file = Arc::new(
            FileDevice::open_with(self.storage.as_ref(), &path, self.options())
                .map_err(|e| io_refusal(&format!("opening {}", path.display()), &e))?,
        );
        let layer = self.stored_layer(volume, code, &file);
        let chunk = Arc::new(Chunk::new(file, layer));
        self.keep_open(&mut open, volume, code, Arc::clone(&chunk), clock);
        Ok(chunk)
    }

    /// Puts `chunk` in the open table (where no other chunk of its name
    /// is), closing the least recently used while the table is full or,
    /// for a chunk with a dedup layer, while the layers' RAM would pass
    /// its bound (then layered chunks only). A chunk some request still
    /// holds is not closed, nor one with a fault; a layer whose sync fails
    /// as it is closed gives its chunk a fault and stays (closing it then
    /// would drop what it acknowledged, and the next flush, on a fresh
    /// descriptor, would not hear of the failure). The table then holds
    /// more than its bounds until they can be closed.
    fn keep_open(
        &self,
        open: &mut OpenChunks,
        volume: u64,
        code: u32,
        chunk: Arc<Chunk>,
        clock: u64,
    ) {
        let mut by_age: Vec<((u64, u32), u64, u64)> = open
            .by_name
            .iter()
            .map(|(name, (c, used))| (*name, *used, c.layer_ram()))
            .collect();
        by_age.sort_by_key(|&(_, used, _)| used);
        let need = chunk.layer_ram();
        let mut ram: u64 = by_age.iter().map(|&(_, _, r)| r).sum();
        for (name, _, held_ram) in by_age {
            let over_count = open.by_name.len() >= self.config.open_chunks_max.max(1);
            let over_ram = need > 0 && ram + need > self.config.layers_ram_max;
            if !over_count && !over_ram {
                break;
            }
            if !over_count && held_ram == 0 {
                continue;
            }
            let (held, _) = &open.by_name[&name];
            if Arc::strong_count(held) > 1 || held.fault.lock().unwrap().is_some() {
                continue;
            }
            if let Some(layer) = held.layer() {
                if let Err(e) = layer.sync() {
                    self.counters
                        .layer_sync_failures
                        .fetch_add(1, Ordering::Relaxed);
                    *held.fault.lock().unwrap() = Some(format!(
                        "its dedup layer's sync failed as it was to be closed ({e}): what it \
                         acknowledged since its last sync may be lost"
                    ));
                    continue;
                }
                self.note_closed(name, layer);
            }
            ram -= held_ram;
            open.by_name.remove(&name);
        }
        open.by_name.entry((volume, code)).or_insert((chunk, clock));
    }

    /// Volume `volume`'s gate (see `serve`).
    fn gate(&self, volume: u64) -> Arc<RwLock<()>> {
        let mut gates = self.gates.lock().unwrap();
        Arc::clone(gates.entry(volume).or_default())
    }

    /// The chunk a request names, refused while it has a fault.
    fn chunk_for(&self, h: &Header) -> Result<Arc<Chunk>, Refusal> {
        let chunk = self.chunk(h.volume_id, h.pg)?;
        chunk.check_fault()?;
        Ok(chunk)
    }

    /// Adds a closing layer's counters to the server's totals, and to
    /// its chunk's (`name`: volume, chunk code), with its space now.
    fn note_closed(&self, name: (u64, u32), layer: &DedupDevice) {
        let counts = layer.write_counts();
        add_dedup(&mut self.closed_dedup.lock().unwrap(), counts);
        let space = layer.space();
        let mut closed = self.closed_chunks.lock().unwrap();
        closed.entry(name).or_default().add(counts, space);
        self.counters.layers_closed.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs a dedup layer over a chunk (`Op::Layer`): `spec.fresh` makes
    /// it empty (its maps reset, then its spec stored: a cut between
    /// leaves the spec before, over empty maps, and the writer that asked
    /// asks again), whatever the chunk had (a layer whose maps do not
    /// open, a fault); otherwise the chunk's own layer must be the one
    /// asked for, and open. Returns whether the chunk's layer runs here
    /// (false: it has none, and none was asked made). Under the server's
    /// layout lock, so no `Open` of the chunk runs meanwhile.
    fn attach_layer(&self, volume: u64, code: u32, spec: &LayerSpec) -> Result<bool, Refusal> {
        let _layout = self.layout.lock().unwrap();
        let chunk = self.chunk(volume, code)?;
        spec.check(chunk.file.size()).map_err(invalid)?;
        if !spec.fresh {
            chunk.check_fault()?;
            return match &chunk.layer {
                Layer::None => Ok(false),
                Layer::Open { spec: stored, .. } if stored.same_layer(spec) => Ok(true),
                Layer::Open { spec: stored, .. } => Err(invalid(format!(
                    "the dedup layer of {} is {stored:?}, not the one asked for ({spec:?})",
                    chunk.file.describe()
                ))),
                Layer::Unreadable { why, .. } => {
                    Err((Status::Io, format!("{}: {why}", chunk.file.describe())))
                }
            };
        }
        // No request holds the layer this replaces: the volume's gate is
        // this request's alone (`serve`), and only requests hold chunks.
        let mut open = self.open.lock().unwrap();
        let (spec_path, _, _) = self.layer_paths(volume, code);
        let stored = LayerSpec {
            fresh: false,
            ..spec.clone()
        };
        let started = self
            .open_layer(volume, code, &chunk.file, spec)
            .and_then(|layer| {
                write_atomic(
                    self.storage.as_ref(),
                    &spec_path,
                    &ecdedup_core::proto::frame::encode_layer(&stored),
                )
                .map_err(|e| io_refusal(&format!("writing {}", spec_path.display()), &e))?;
                Ok(layer)
            });
        let layer = match started {
            Ok(layer) => layer,
            Err(refusal) => {
                // Its maps may be reset under the layer in service: that
                // layer must answer nothing more (the chunk stays open,
                // with a fault, until a fresh start succeeds).
                *chunk.fault.lock().unwrap() = Some(format!(
                    "a fresh start of its dedup layer failed: {}",
                    refusal.1
                ));
                return Err(refusal);
            }
        };
        open.clock += 1;
        let clock = open.clock;
        let ram = layer.ram_bytes();
        let fresh = Arc::new(Chunk::new(
            Arc::clone(&chunk.file),
            Layer::Open {
                layer,
                spec: stored,
                ram,
            },
        ));
        if let Some((old, _)) = open.by_name.remove(&(volume, code)) {
            if let Some(layer) = old.layer() {
                self.note_closed((volume, code), layer);
            }
        }
        self.keep_open(&mut open, volume, code, fresh, clock);
        self.counters.layers_started.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// The dedup layers' counters since the server started: every open
    /// layer's, and those of the layers closed before.
    pub fn dedup_totals(&self) -> ecdedup_cluster::keys::ServerDedup {
        let layers = self.open_layers();
        let mut t = self.closed_dedup.lock().unwrap().clone();
        t.layers_open = layers.len() as u64;
        for (_, layer) in &layers {
            add_dedup(&mut t, layer.write_counts());
            t.layers_ram_bytes += layer.ram_bytes();
        }
        t
    }

    /// Every dedup layer open now, by (volume, chunk).
    fn open_layers(&self) -> Vec<((u64, u32), Arc<DedupDevice>)> {
        layers_in(&self.open.lock().unwrap())
    }

    /// The dedup layers of each volume: those open now, and those closed
    /// since the start as they were at their close.
    pub fn dedup_by_volume(&self) -> BTreeMap<u64, VolumeDedup> {
        // The open layers and the closed ones' counts at one moment (a
        // layer closes under the open-chunk lock).
        let (layers, mut chunks) = {
            let open = self.open.lock().unwrap();
            (layers_in(&open), self.closed_chunks.lock().unwrap().clone())
        };
        for (name, layer) in layers {
            chunks
                .entry(name)
                .or_default()
                .add(layer.write_counts(), layer.space());
        }
        let mut out: BTreeMap<u64, VolumeDedup> = BTreeMap::new();
        for ((volume, _), c) in chunks {
            let v = out.entry(volume).or_default();
            let [physical, references, parity_references, _, _] = c.counts;
            v.chunks += 1;
            v.mapped_blocks += c.space.0;
            v.slots_used += c.space.1;
            v.physical_writes += physical;
            v.reference_writes += references;
            v.reference_parity_writes += parity_references;
        }
        out
    }

    /// The counters of every dedup layer open now, by (volume, chunk).
    pub fn dedup_stats(&self) -> Vec<((u64, u32), DedupStats)> {
        let layers = self.open_layers();
        let mut out: Vec<_> = layers
            .into_iter()
            .map(|(name, l)| (name, l.stats()))
            .collect();
        out.sort_by_key(|(name, _)| *name);
        out
    }

    /// Opens (creating, sparse, if absent) a chunk of `size` bytes;
    /// returns whether it was made now.
    fn open_chunk(&self, volume: u64, code: u32, size: u64) -> Result<bool, Refusal> {
        if size == 0 || size > CHUNK_BYTES_MAX || !size.is_multiple_of(4096) {
            return Err(invalid(format!(
                "a chunk of {size} bytes (a multiple of 4096 up to {CHUNK_BYTES_MAX})"
            )));
        }
        // One chunk made at a time, and no layer started meanwhile: two
        // `Open`s of a new chunk side by side make it once.
        let _layout = self.layout.lock().unwrap();
        match self.chunk(volume, code) {
            Ok(chunk) if chunk.file.size() == size => return Ok(false),
            Ok(chunk) => {
                return Err(invalid(format!(
                    "{} is {} bytes, asked for {size}",
                    chunk.file.describe(),
                    chunk.file.size()
                )))
            }
            Err((Status::NotHere, _)) => {}
            Err(refusal) => return Err(refusal),
        }
        let path = self.chunk_path(volume, code);
        let parent = path.parent().expect("a chunk path has a folder");
        self.storage
            .create_dir_all(parent)
            .map_err(|e| io_refusal(&format!("creating {}", parent.display()), &e))?;
        // A new chunk has no dedup layer: what a chunk of the same name
        // left (none should: ids are never reused) goes first, made
        // durable with the chunk's name below.
        let (spec_path, folder, name) = self.layer_paths(volume, code);
        let [log, snapshot] = ecdedup_core::dedup::state_files(&folder, &name);
        for stale in [spec_path, log, snapshot] {
            if self.storage.exists(&stale) {
                self.storage
                    .remove(&stale)
                    .map_err(|e| io_refusal(&format!("removing {}", stale.display()), &e))?;
            }
        }
        let made = FileDevice::create_with(self.storage.as_ref(), &path, size, self.options())
            .and_then(|dev| {
                dev.sync()?;
                self.storage.sync_dir(parent)?;
                Ok(dev)
            })
            .map_err(|e| io_refusal(&format!("creating {}", path.display()), &e))?;
        let mut open = self.open.lock().unwrap();
        open.clock += 1;
        let clock = open.clock;
        let chunk = Arc::new(Chunk::new(Arc::new(made), Layer::None));
        self.keep_open(&mut open, volume, code, chunk, clock);
        Ok(true)
    }

    /// Answers one request: the reply's status and payload (the reason,
    /// as text, for a refusal).
    pub fn handle(&self, h: &Header, payload: &[u8]) -> (Status, Vec<u8>) {
        match self.serve(h, payload) {
            Ok(reply) => (Status::Ok, reply),
            Err((status, reason)) => {
                if status == Status::Invalid {
                    self.counters.invalid.fetch_add(1, Ordering::Relaxed);
                }
                (status, reason.into_bytes())
            }
        }
    }

    fn serve(&self, h: &Header, payload: &[u8]) -> Result<Vec<u8>, Refusal> {
        if self.is_fenced() {
            return Err((
                Status::Io,
                "this chunk server lost its etcd lease and is stopping".into(),
            ));
        }
        match h.op {
            Op::Open
            | Op::Read
            | Op::Write
            | Op::LogAppend
            | Op::Replay
            | Op::Flush
            | Op::Discard
            | Op::Layer
            | Op::SetEpoch => {}
            other => {
                return Err(invalid(format!(
                    "{other:?} is not served by this chunk server (the volume client keeps \
                     the parity journals' index and answers NEED_D0 itself)"
                )))
            }
        }
        // Served under its volume's gate, shared; a request that raises
        // the volume's epoch (a new writer's `SetEpoch`, or its first
        // request where the push missed this server) takes it alone, so
        // every request admitted at the lower epoch has finished before
        // the raise is answered, and none of them lands after the new
        // writer's first change (docs/cluster.md, "Fencing"). A fresh
        // start of a chunk's dedup layer takes it alone too: no request
        // may hold the layer it replaces (a member being set up while the
        // writer serves takes its mirrored metadata writes meanwhile).
        let gate = self.gate(h.volume_id);
        let raises = self
            .stored(Fenced::Volume(h.volume_id))
            .map_or(true, |stored| h.epoch > stored);
        // A `Layer`'s spec, read once.
        let layer_spec = (h.op == Op::Layer).then(|| decode_layer(payload));
        let starts_layer = matches!(&layer_spec, Some(Ok(spec)) if spec.fresh);
        let _turn = match raises || starts_layer {
            true => Turn {
                _shared: None,
                _alone: Some(gate.write().unwrap_or_else(|p| p.into_inner())),
            },
            false => Turn {
                _shared: Some(gate.read().unwrap_or_else(|p| p.into_inner())),
                _alone: None,
            },
        };
        self.admit_epoch(h.volume_id, h.epoch)?;
        let (volume, code) = (h.volume_id, h.pg);
        if h.op != Op::SetEpoch {
            self.admit_pg_epoch(volume, chunk_parts(code).0, h.pg_epoch)?;
        }
        // The writer reaches this chunk through a layer here.
        let layered = h.flags & FLAG_LAYERED != 0;
        match h.op {
            Op::SetEpoch => Ok(self.boot_id.to_le_bytes().to_vec()),
            Op::Open => {
                let size = u64_payload(payload, "Open")?;
                let made = self.open_chunk(volume, code, size)?;
                let mut reply = size.to_le_bytes().to_vec();
                reply.push(u8::from(made));
                reply.extend_from_slice(&self.boot_id.to_le_bytes());
                Ok(reply)
            }
            Op::Read => {
                let chunk = self.chunk_for(h)?;
                let len = u64::from(h.length);
                chunk.check(layered, h.offset, len)?;
                let dev = chunk.dev();
                let mut buf = vec![0u8; h.length as usize];
                dev.read_at(&mut buf, h.offset)
                    .map_err(|e| io_refusal(&format!("reading {}", dev.describe()), &e))?;
                self.counters.reads.fetch_add(1, Ordering::Relaxed);
                self.counters.bytes_read.fetch_add(len, Ordering::Relaxed);
                Ok(buf)
            }
            Op::Write | Op::LogAppend => {
                // A write, or a parity-journal append (the records' runs,
                // then the journal's length hint): every write checked
                // before any is made, then made in order, answered
                // together.
                let chunk = self.chunk_for(h)?;
                let (writes, doing, hint) = if h.op == Op::Write {
                    if h.length as usize != payload.len() {
                        return Err(invalid(format!(
                            "a write of length {} with {} bytes of payload",
                            h.length,
                            payload.len()
                        )));
                    }
                    (vec![(h.offset, payload)], "writing", write_hint(h.flags)?)
                } else {
                    let writes = decode_append(payload).map_err(invalid)?;
                    let hint = WriteHint::new(IoClass::Journal);
                    (writes, "appending to the parity journal on", hint)
                };
                for &(offset, buf) in &writes {
                    chunk.check(layered, offset, buf.len() as u64)?;
                }
                let dev = chunk.dev();
                let what = || format!("{doing} {}", dev.describe());
                for &(offset, buf) in &writes {
                    if buf.is_empty() {
                        // A barrier: what came before is durable before
                        // anything after it is made.
                        dev.sync().map_err(|e| io_refusal(&what(), &e))?;
                        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    dev.write_hinted(buf, offset, hint)
                        .map_err(|e| io_refusal(&what(), &e))?;
                }
                if h.flags & FLAG_FUA != 0 {
                    dev.sync().map_err(|e| io_refusal(&what(), &e))?;
                    self.counters.syncs.fetch_add(1, Ordering::Relaxed);
                }
                self.counters.writes.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .bytes_written
                    .fetch_add(payload.len() as u64, Ordering::Relaxed);
                Ok(self.boot_id.to_le_bytes().to_vec())
            }
            Op::Replay => {
                // A replay's parity fold (`media::fold`): checked whole
                // against the chunk before any byte is read; rows whose
                // parity is not the checksum the writer expects are
                // answered so and left as they are.
                let chunk = self.chunk_for(h)?;
                let fold = decode_replay(payload).map_err(invalid)?;
                fold.check(chunk.file.size()).map_err(invalid)?;
                let block = u64::from(fold.block_bytes);
                for row in &fold.rows {
                    chunk.check(layered, row.parity, block)?;
                    for t in &row.terms {
                        chunk.check(layered, t.a, u64::from(t.len))?;
                        if let Some(b) = t.b {
                            chunk.check(layered, b, u64::from(t.len))?;
                        }
                    }
                }
                let dev = chunk.dev();
                let fua = h.flags & FLAG_FUA != 0;
                let answers = fold::run(dev, &fold, fua).map_err(|e| {
                    io_refusal(&format!("folding parity on {}", dev.describe()), &e)
                })?;
                let folded = answers
                    .iter()
                    .filter(|a| matches!(a, fold::RowAnswer::Folded { .. }))
                    .count();
                self.counters.folds.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .rows_folded
                    .fetch_add(folded as u64, Ordering::Relaxed);
                if fua {
                    self.counters.syncs.fetch_add(1, Ordering::Relaxed);
                }
                let mut reply = self.boot_id.to_le_bytes().to_vec();
                reply.extend_from_slice(&encode_replay_answers(&answers));
                Ok(reply)
            }
            Op::Flush => {
                let chunk = self.chunk_for(h)?;
                chunk.check_layered(layered, 0, 0)?;
                let dev = chunk.dev();
                dev.sync()
                    .map_err(|e| io_refusal(&format!("syncing {}", dev.describe()), &e))?;
                self.counters.syncs.fetch_add(1, Ordering::Relaxed);
                Ok(self.boot_id.to_le_bytes().to_vec())
            }
            Op::Discard => {
                // A layer takes a discard across its data area's start.
                let chunk = self.chunk_for(h)?;
                let len = u64_payload(payload, "Discard")?;
                chunk.check_discard(h.offset, len)?;
                chunk.check_layered(layered, h.offset, len)?;
                let dev = chunk.dev();
                dev.discard(h.offset, len)
                    .map_err(|e| io_refusal(&format!("discarding on {}", dev.describe()), &e))?;
                Ok(self.boot_id.to_le_bytes().to_vec())
            }
            Op::Layer => {
                let spec = layer_spec.expect("read for a Layer").map_err(invalid)?;
                let here = self.attach_layer(volume, code, &spec)?;
                let mut reply = self.boot_id.to_le_bytes().to_vec();
                reply.push(u8::from(here));
                Ok(reply)
            }
            _ => unreachable!("ops checked above"),
        }
    }

    /// The volumes this server has heard of (an epoch stored), removed
    /// ones included.
    pub fn volumes_here(&self) -> io::Result<Vec<u64>> {
        let names = match self.storage.list_files(&self.config.dirs[0].join("epochs")) {
            Ok(names) => names,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        Ok(names
            .iter()
            .filter_map(|n| n.strip_prefix('v')?.parse().ok())
            .collect())
    }

    /// Deletes every chunk of `volume` and refuses every later request
    /// for it: the volume was removed from the cluster (ids are never
    /// reused). The refusal is stored first (its epoch becomes
    /// [`REMOVED_EPOCH`]), so a writer that outlived its lease can land
    /// nothing after this; then the chunk files go. Idempotent: a second
    /// call deletes what a racing request may have made meanwhile.
    pub fn remove_volume(&self, volume: u64) -> io::Result<Removed> {
        let newly = {
            let mut epochs = self.epochs.lock().unwrap();
            let key = Fenced::Volume(volume);
            if epochs.get(&key) == Some(&REMOVED_EPOCH) {
                false
            } else {
                write_atomic(
                    self.storage.as_ref(),
                    &self.epoch_path(key),
                    format!("{REMOVED_EPOCH}\n").as_bytes(),
                )?;
                epochs.insert(key, REMOVED_EPOCH);
                self.epochs_unsaved.lock().unwrap().remove(&volume);
                true
            }
        };
        {
            let mut open = self.open.lock().unwrap();
            for (name, (chunk, _)) in open.by_name.iter().filter(|((v, _), _)| *v == volume) {
                if let Some(layer) = chunk.layer() {
                    self.note_closed(*name, layer);
                }
            }
            open.by_name.retain(|(v, _), _| *v != volume);
            // Its layers are gone: not counted for it any more (the
            // server's totals keep what they did).
            self.closed_chunks
                .lock()
                .unwrap()
                .retain(|(v, _), _| *v != volume);
        }
        // Its PG epochs: no request for it is served any more.
        let epochs = self.config.dirs[0].join("epochs");
        let pg_files = format!("v{volume}.pg");
        for name in self.storage.list_files(&epochs)? {
            if name.starts_with(&pg_files) {
                self.storage.remove(&epochs.join(name))?;
            }
        }
        self.epochs
            .lock()
            .unwrap()
            .retain(|key, _| !matches!(key, Fenced::Pg(v, _) if *v == volume));
        let mut removed = Removed::default();
        for dir in &self.config.dirs {
            let chunks = dir.join("chunks");
            let folder = chunks.join(format!("v{volume}"));
            let names = match self.storage.list_files(&folder) {
                Ok(names) => names,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            removed.bytes += du(&folder);
            // The chunks and their dedup layers' files.
            for name in names {
                self.storage.remove(&folder.join(&name))?;
                removed.chunks += u64::from(name.ends_with(".chunk"));
            }
            match self.storage.remove_dir(&folder) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Unsupported => {}
                Err(e) => return Err(e),
            }
            self.storage.sync_dir(&chunks)?;
        }
        if newly {
            self.counters
                .volumes_removed
                .fetch_add(1, Ordering::Relaxed);
        }
        self.counters
            .chunks_removed
            .fetch_add(removed.chunks, Ordering::Relaxed);
        Ok(removed)
    }

    /// Deletes the chunks of every volume this server has heard of whose
    /// id is below `next` and not in `live` (a consistent read of etcd:
    /// such a volume was removed, and its id is never given again).
    /// `cluster` names the etcd cluster the ids come from: the first call
    /// stores it in the first data folder, and a later call from another
    /// cluster (a server pointed at the wrong etcd or cluster name) deletes
    /// nothing and says why.
    pub fn remove_volumes_not_in(
        &self,
        cluster: &str,
        live: &BTreeSet<u64>,
        next: u64,
    ) -> io::Result<Vec<(u64, Removed)>> {
        let path = self.config.dirs[0].join("cluster");
        match read_all(self.storage.as_ref(), &path) {
            Ok(bytes) if bytes == format!("{cluster}\n").as_bytes() => {}
            Ok(bytes) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} names cluster {:?}, but this server is registered in {cluster:?}: \
                         no chunk is deleted (start it with its own cluster's etcd, or \
                         remove that file if the data folders were moved on purpose)",
                        path.display(),
                        String::from_utf8_lossy(&bytes).trim_end()
                    ),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => write_atomic(
                self.storage.as_ref(),
                &path,
                format!("{cluster}\n").as_bytes(),
            )?,
            Err(e) => return Err(e),
        }
        let mut removed = Vec::new();
        for volume in self.volumes_here()? {
            if volume < next && !live.contains(&volume) {
                let r = self.remove_volume(volume)?;
                if r != Removed::default() {
                    removed.push((volume, r));
                }
            }
        }
        Ok(removed)
    }

    /// Space of each data folder: (folder, bytes free, bytes used by chunks
    /// as the file system counts them).
    pub fn space(&self) -> Vec<(PathBuf, u64, u64)> {
        self.config
            .dirs
            .iter()
            .map(|d| {
                let (free, _) = fs_space(d).unwrap_or((0, 0));
                (d.clone(), free, du(&d.join("chunks")))
            })
            .collect()
    }
}

fn parse_epoch(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let line = text.strip_suffix('\n')?;
    if line.is_empty() || !line.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    line.parse().ok()
}

/// The dedup layers of the chunks open in `open`, by (volume, chunk).
fn layers_in(open: &OpenChunks) -> Vec<((u64, u32), Arc<DedupDevice>)> {
    open.by_name
        .iter()
        .filter_map(|(name, (c, _))| Some((*name, c.layer()?.clone())))
        .collect()
}

/// A layered chunk's counts over its closes ([`ChunkServer::note_closed`]).
#[derive(Clone, Copy, Debug, Default)]
struct ClosedLayer {
    /// [`DedupDevice::write_counts`], summed.
    counts: [u64; 5],
    /// [`DedupDevice::space`] at the last close.
    space: (u64, u64),
}

impl ClosedLayer {
    /// One more instance of the chunk's layer: its write counts added,
    /// its space the chunk's now.
    fn add(&mut self, counts: [u64; 5], space: (u64, u64)) {
        for (sum, n) in self.counts.iter_mut().zip(counts) {
            *sum += n;
        }
        self.space = space;
    }
}

/// Adds a layer's write counts ([`DedupDevice::write_counts`]) to a
/// server's totals.
fn add_dedup(t: &mut ecdedup_cluster::keys::ServerDedup, counts: [u64; 5]) {
    let [physical, references, parity_references, hashed, log] = counts;
    t.physical_writes += physical;
    t.reference_writes += references;
    t.reference_parity_writes += parity_references;
    t.hash_ops += hashed;
    t.log_bytes += log;
}

/// What a `Write`'s flags say of its bytes, for a dedup layer.
fn write_hint(flags: u16) -> Result<WriteHint, Refusal> {
    let class = match (flags & FLAG_PARITY != 0, flags & FLAG_METADATA != 0) {
        (false, false) => IoClass::Data,
        (true, false) => IoClass::Parity,
        (false, true) => IoClass::Metadata,
        (true, true) => return Err(invalid("a write flagged both parity and metadata")),
    };
    Ok(WriteHint {
        repair: flags & FLAG_REPAIR != 0,
        ..WriteHint::new(class)
    })
}

fn check_range(dev: &dyn Device, offset: u64, len: u64) -> Result<(), Refusal> {
    match offset.checked_add(len) {
        Some(end) if end <= dev.size() => Ok(()),
        _ => Err(invalid(format!(
            "[{offset}, +{len}) is past the end of {} ({} bytes)",
            dev.describe(),
            dev.size()
        ))),
    }
}

/// (bytes free, bytes in all) of the file system holding `dir`.
fn fs_space(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some((st.f_bavail as u64 * frsize, st.f_blocks as u64 * frsize))
}

/// Bytes allocated to the files under `dir` (sparse chunks count what
/// they hold).
fn du(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => du(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ecdedup_core::media::OsStorage;
    use ecdedup_core::proto::chunk_code;

    fn server(dir: &Path) -> ChunkServer {
        ChunkServer::new(
            OsStorage::shared(),
            ChunkServerConfig {
                dirs: vec![dir.join("a"), dir.join("b")],
                io: IoMode::Buffered,
                open_chunks_max: 2,
                layers_ram_max: LAYERS_RAM_MAX_DEFAULT,
            },
        )
        .unwrap()
    }

    fn req(op: Op, volume: u64, epoch: u64, offset: u64, payload: &[u8]) -> Header {
        let mut h = Header::request(op, 1, payload);
        h.volume_id = volume;
        h.epoch = epoch;
        h.pg = chunk_code(3, 1);
        h.pg_epoch = 1;
        h.offset = offset;
        h
    }

    fn call(s: &ChunkServer, h: Header, payload: &[u8]) -> (Status, Vec<u8>) {
        s.handle(&h, payload)
    }

    #[test]
    fn chunks_are_made_written_read_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let s = server(dir.path());
        let size = (1u64 << 20).to_le_bytes();
        let (st, reply) = call(&s, req(Op::Open, 7, 5, 0, &size), &size);
        assert_eq!(st, Status::Ok);
        assert_eq!(reply[8], 1, "made now");
        assert_eq!(reply[9..], s.boot_id().to_le_bytes(), "the boot id");
        let (_, reply) = call(&s, req(Op::Open, 7, 5, 0, &size), &size);
        assert_eq!(reply[8], 0, "found the second time");
        let data = vec![0xabu8; 8192];
        let (st, _) = call(&s, req(Op::Write, 7, 5, 4096, &data), &data);
        assert_eq!(st, Status::Ok);
        let mut h = req(Op::Read, 7, 5, 4096, &[]);
        h.length = 8192;
        let (st, got) = call(&s, h, &[]);
        assert_eq!((st, got), (Status::Ok, data.clone()));
        // Past the end: refused, nothing read.
        let mut h = req(Op::Read, 7, 5, (1 << 20) - 4096, &[]);
        h.length = 8192;
        assert_eq!(call(&s, h, &[]).0, Status::Invalid);
        // A chunk never opened is not here.
        let mut h = req(Op::Read, 8, 5, 0, &[]);
        h.length = 4096;
        assert_eq!(call(&s, h, &[]).0, Status::NotHere);
        // Other ops of the protocol are refused with a reason.
        let (st, why) = call(&s, req(Op::NeedD0, 7, 5, 0, &[]), &[]);
        assert_eq!(st, Status::Invalid);
        assert!(String::from_utf8_lossy(&why).contains("not served"));
    }

    #[test]
    fn a_log_append_makes_its_writes_in_order_and_a_malformed_one_makes_none() {
        use ecdedup_core::proto::frame::encode_append;
        let dir = tempfile::tempdir().unwrap();
        let s = server(dir.path());
        let size = (1u64 << 20).to_le_bytes();
        assert_eq!(call(&s, req(Op::Open, 7, 5, 0, &size), &size).0, Status::Ok);
        let records = vec![0x11u8; 4096 + 32];
        let append = encode_append(&[(8192, &records), (8192 + 32, &[0x22; 32])]);
        let (st, reply) = call(&s, req(Op::LogAppend, 7, 5, 8192, &append), &append);
        assert_eq!(st, Status::Ok);
        assert_eq!(
            reply,
            s.boot_id().to_le_bytes(),
            "the boot id, as every change"
        );
        assert_eq!(s.counters.syncs.load(Ordering::Relaxed), 0, "no sync asked");
        // With FUA (a flush's checksum pages and the chunk's sync in one
        // message): the chunk synced after the writes, before the answer.
        let pages = encode_append(&[(65536, &[0x44; 4096]), (131072, &[0x55; 4096])]);
        let mut h = req(Op::LogAppend, 7, 5, 65536, &pages);
        h.flags |= ecdedup_core::proto::frame::FLAG_FUA;
        assert_eq!(call(&s, h, &pages).0, Status::Ok);
        assert_eq!(s.counters.syncs.load(Ordering::Relaxed), 1, "synced once");
        let mut h = req(Op::Read, 7, 5, 8192, &[]);
        h.length = 4096 + 32;
        let (_, back) = call(&s, h, &[]);
        assert!(back[..32].iter().all(|&b| b == 0x11), "the records first");
        assert!(
            back[32..64].iter().all(|&b| b == 0x22),
            "then the hint over them"
        );
        assert!(back[64..].iter().all(|&b| b == 0x11));
        // One write past the chunk's end: refused, and nothing written.
        let bad = encode_append(&[(0, &[0x33; 16]), (1 << 20, &[0x33; 16])]);
        let (st, why) = call(&s, req(Op::LogAppend, 7, 5, 0, &bad), &bad);
        assert_eq!(st, Status::Invalid);
        assert!(String::from_utf8_lossy(&why).contains("past the end"));
        let mut h = req(Op::Read, 7, 5, 0, &[]);
        h.length = 16;
        assert_eq!(call(&s, h, &[]).1, vec![0u8; 16]);
        let (st, why) = call(&s, req(Op::LogAppend, 7, 5, 0, &[1, 2]), &[1, 2]);
        assert_eq!(st, Status::Invalid);
        assert!(String::from_utf8_lossy(&why).contains("cut short"));
    }

    /// A barrier in a `LogAppend` (a flush's pages, then a journal's
    /// directory commit): the chunk syncs there, and a write after it is
    /// made only once the writes before it are durable: where that sync
    /// fails, nothing after it is written.
    #[test]
    fn a_log_append_barrier_syncs_before_the_writes_after_it() {
        use ecdedup_core::media::batch::BARRIER;
        use ecdedup_core::media::powerloss::PowerLossStorage;
        use ecdedup_core::proto::frame::encode_append;
        let media = PowerLossStorage::new();
        let s = ChunkServer::new(
            media.shared(),
            ChunkServerConfig {
                dirs: vec![PathBuf::from("/chunks/a")],
                io: IoMode::Buffered,
                open_chunks_max: 2,
                layers_ram_max: LAYERS_RAM_MAX_DEFAULT,
            },
        )
        .unwrap();
        let size = (1u64 << 20).to_le_bytes();
        assert_eq!(call(&s, req(Op::Open, 7, 5, 0, &size), &size).0, Status::Ok);
        let read = |at: u64| {
            let mut h = req(Op::Read, 7, 5, at, &[]);
            h.length = 4096;
            call(&s, h, &[]).1
        };
        let (page, slot) = ([0x44u8; 4096], [0x66u8; 4096]);
        let append = encode_append(&[(65536, &page), BARRIER, (8192, &slot)]);
        let mut h = req(Op::LogAppend, 7, 5, 65536, &append);
        h.flags |= FLAG_FUA;
        assert_eq!(call(&s, h, &append).0, Status::Ok);
        assert_eq!(
            s.counters.syncs.load(Ordering::Relaxed),
            2,
            "the barrier's and the FUA's"
        );
        assert_eq!(media.pending_writes(), 0);
        assert_eq!((read(65536), read(8192)), (page.to_vec(), slot.to_vec()));
        // The barrier's sync fails: the write after it is never made.
        media.fail_next_sync("");
        let (page, slot) = ([0x45u8; 4096], [0x67u8; 4096]);
        let append = encode_append(&[(65536, &page), BARRIER, (8192, &slot)]);
        let mut h = req(Op::LogAppend, 7, 5, 65536, &append);
        h.flags |= FLAG_FUA;
        assert_eq!(call(&s, h, &append).0, Status::Io);
        assert_eq!(
            read(8192),
            [0x66u8; 4096].to_vec(),
            "not written after a failed barrier"
        );
        // A barrier first, last, or at an offset: malformed.
        for bad in [
            encode_append(&[BARRIER, (0, &[1; 8])]),
            encode_append(&[(0, &[1; 8]), BARRIER]),
            encode_append(&[(0, &[1; 8]), (8, &[]), (16, &[1; 8])]),
            encode_append(&[(0, &[1; 8]), BARRIER, BARRIER, (16, &[1; 8])]),
        ] {
            let (st, why) = call(&s, req(Op::LogAppend, 7, 5, 0, &bad), &bad);
            assert_eq!(st, Status::Invalid, "{}", String::from_utf8_lossy(&why));
        }
    }

    #[test]
    fn a_replay_folds_parity_at_the_chunk_and_a_malformed_or_stale_one_writes_nothing() {
        use ecdedup_core::media::fold::{Fold, Row, RowAnswer, Term};
        use ecdedup_core::proto::frame::{decode_replay_answers, encode_replay};
        let dir = tempfile::tempdir().unwrap();
        let s = server(dir.path());
        let size = (1u64 << 20).to_le_bytes();
        assert_eq!(call(&s, req(Op::Open, 7, 5, 0, &size), &size).0, Status::Ok);
        // Parity at 0, d(0) and d(r) of a logged block at 8192 and 12288.
        let parity = vec![0x0fu8; 4096];
        let (d0, dr) = (vec![0x33u8; 4096], vec![0x35u8; 4096]);
        for (at, bytes) in [(0u64, &parity), (8192, &d0), (12288, &dr)] {
            assert_eq!(
                call(&s, req(Op::Write, 7, 5, at, bytes), bytes).0,
                Status::Ok
            );
        }
        let fold = Fold {
            block_bytes: 4096,
            rows: vec![Row {
                parity: 0,
                expected_crc32c: ecdedup_core::codec::crc32c(&parity),
                terms: vec![Term {
                    coefficient: 2,
                    at: 0,
                    len: 4096,
                    a: 8192,
                    b: Some(12288),
                }],
            }],
        };
        let payload = encode_replay(&fold);
        let replay = |payload: &[u8]| {
            let mut h = req(Op::Replay, 7, 5, 0, payload);
            h.flags = FLAG_FUA;
            call(&s, h, payload)
        };
        let read_parity = || {
            let mut h = req(Op::Read, 7, 5, 0, &[]);
            h.length = 4096;
            call(&s, h, &[]).1
        };
        // 0x0f ^ 2 * (0x33 ^ 0x35) = 0x0f ^ 2 * 0x06 = 0x0f ^ 0x0c.
        let folded = vec![0x03u8; 4096];
        let (st, reply) = replay(&payload);
        assert_eq!(st, Status::Ok, "{}", String::from_utf8_lossy(&reply));
        assert_eq!(reply[..8], s.boot_id().to_le_bytes(), "the boot id first");
        let crc32c = ecdedup_core::codec::crc32c(&folded);
        assert_eq!(
            decode_replay_answers(&reply[8..], 1).unwrap(),
            vec![RowAnswer::Folded { crc32c }]
        );
        assert_eq!(read_parity(), folded);
        // The same fold again (a duplicated frame): a mismatch, nothing
        // written.
        let (st, reply) = replay(&payload);
        assert_eq!(st, Status::Ok);
        assert_eq!(
            decode_replay_answers(&reply[8..], 1).unwrap(),
            vec![RowAnswer::Mismatch { crc32c }]
        );
        assert_eq!(read_parity(), folded);
        // Malformed payloads and ranges past the chunk: refused with the
        // reason, nothing written.
        let mut past_end = fold.clone();
        past_end.rows[0].terms[0].b = Some(1 << 20);
        past_end.rows[0].expected_crc32c = crc32c;
        for (bad, why) in [
            (payload[..payload.len() - 3].to_vec(), "cut short"),
            (vec![0u8; 3], "cut short"),
            (encode_replay(&past_end), "past the end"),
            (payload[..8].to_vec(), "cut short"),
        ] {
            let (st, reason) = replay(&bad);
            assert_eq!(st, Status::Invalid);
            let reason = String::from_utf8_lossy(&reason).into_owned();
            assert!(reason.contains(why), "{reason}");
            assert_eq!(read_parity(), folded);
        }
        assert_eq!(s.counters.folds.load(Ordering::Relaxed), 2);
        assert_eq!(s.counters.rows_folded.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn an_older_epoch_is_refused_after_a_newer_one_even_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = server(dir.path());
            let size = (1u64 << 20).to_le_bytes();
            assert_eq!(call(&s, req(Op::Open, 7, 5, 0, &size), &size).0, Status::Ok);
            assert_eq!(call(&s, req(Op::SetEpoch, 7, 9, 0, &[]), &[]).0, Status::Ok);
            let data = vec![1u8; 4096];
            let (st, why) = call(&s, req(Op::Write, 7, 5, 0, &data), &data);
            assert_eq!(st, Status::EpochTooOld);
            assert!(String::from_utf8_lossy(&why).contains("EPOCH_TOO_OLD"));
            // Another volume is not affected.
            assert_eq!(call(&s, req(Op::SetEpoch, 8, 1, 0, &[]), &[]).0, Status::Ok);
        }
        let s = server(dir.path());
        assert_eq!(s.epoch(7).unwrap(), 9, "stored durably");
        let data = vec![1u8; 4096];
        assert_eq!(
            call(&s, req(Op::Write, 7, 8, 0, &data), &data).0,
            Status::EpochTooOld
        );
        assert_eq!(
            call(&s, req(Op::Write, 7, 9, 0, &data), &data).0,
            Status::Ok
        );
        // A damaged epoch file refuses the volume instead of admitting all.
        std::fs::write(dir.path().join("a/epochs/v7"), b"garbage").unwrap();
        let s = server(dir.path());
        assert_eq!(
            call(&s, req(Op::Write, 7, 9, 0, &data), &data).0,
            Status::Io
        );
    }

    #[test]
    fn an_older_pg_epoch_is_refused_after_a_newer_one_even_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let size = (1u64 << 20).to_le_bytes();
        let data = vec![1u8; 4096];
        let at = |op, pg_epoch, payload: &[u8]| {
            let mut h = req(op, 7, 5, 0, payload);
            h.pg_epoch = pg_epoch;
            h
        };
        {
            let s = server(dir.path());
            assert_eq!(call(&s, at(Op::Open, 1, &size), &size).0, Status::Ok);
            assert_eq!(call(&s, at(Op::Write, 1, &data), &data).0, Status::Ok);
            // The PG re-placed: its writer opens the chunk at epoch 2.
            assert_eq!(call(&s, at(Op::Open, 2, &size), &size).0, Status::Ok);
            // A sender still at epoch 1 is refused, naming both epochs...
            let (st, why) = call(&s, at(Op::Write, 1, &data), &data);
            assert_eq!(st, Status::PgEpochTooOld);
            let why = String::from_utf8_lossy(&why).into_owned();
            assert!(
                why.contains("PG_EPOCH_TOO_OLD")
                    && why.contains("PG 3 is at PG epoch 2")
                    && why.contains("carries 1"),
                "{why}"
            );
            assert_eq!(s.counters.pg_epoch_refusals.load(Ordering::Relaxed), 1);
            // ... whatever it asks for; the current sender is not.
            assert_eq!(
                call(&s, at(Op::Flush, 1, &[]), &[]).0,
                Status::PgEpochTooOld
            );
            assert_eq!(call(&s, at(Op::Write, 2, &data), &data).0, Status::Ok);
            // Another PG of the volume, and another volume, keep their own.
            let mut h = at(Op::Open, 1, &size);
            h.pg = chunk_code(4, 1);
            assert_eq!(call(&s, h, &size).0, Status::Ok);
            // PG epoch 0 (no epoch named) is malformed.
            let (st, why) = call(&s, at(Op::Write, 0, &data), &data);
            assert_eq!(st, Status::Invalid);
            assert!(String::from_utf8_lossy(&why).contains("PG epoch 0"));
        }
        let s = server(dir.path());
        assert_eq!(s.pg_epoch(7, 3).unwrap(), 2, "stored durably");
        assert_eq!(s.pg_epoch(7, 4).unwrap(), 1);
        assert_eq!(
            call(&s, at(Op::Write, 1, &data), &data).0,
            Status::PgEpochTooOld
        );
        let mut h = at(Op::Read, 2, &[]);
        h.length = 4096;
        assert_eq!(call(&s, h, &[]), (Status::Ok, data));
        // A volume epoch too old is refused as such first.
        assert_eq!(call(&s, req(Op::SetEpoch, 7, 6, 0, &[]), &[]).0, Status::Ok);
        assert_eq!(call(&s, at(Op::Write, 1, &[]), &[]).0, Status::EpochTooOld);
    }

    #[test]
    fn a_removed_volume_loses_its_chunks_and_is_refused_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let size = (1u64 << 20).to_le_bytes();
        let data = vec![0x5au8; 8192];
        {
            let s = server(dir.path());
            // Chunks of volume 7 in both data folders, and one of volume 8.
            for (volume, shard) in [(7, 0), (7, 1), (7, 2), (7, 3), (8, 0)] {
                let mut h = req(Op::Open, volume, 5, 0, &size);
                h.pg = chunk_code(3, shard);
                assert_eq!(call(&s, h, &size).0, Status::Ok);
                let mut h = req(Op::Write, volume, 5, 0, &data);
                h.pg = chunk_code(3, shard);
                assert_eq!(call(&s, h, &data).0, Status::Ok);
            }
            assert_eq!(s.volumes_here().unwrap(), vec![7, 8]);
            // Volume 8 is live, 9 not yet given: only 7 goes.
            let live = BTreeSet::from([8]);
            let removed = s.remove_volumes_not_in("c1", &live, 10).unwrap();
            assert_eq!(removed.len(), 1);
            let (volume, removed) = removed[0];
            assert_eq!((volume, removed.chunks), (7, 4));
            assert!(removed.bytes >= 4 * 8192, "{removed:?}");
            for d in ["a", "b"] {
                assert!(!dir.path().join(d).join("chunks/v7").exists());
            }
            // An open chunk of it is not served from the cache either.
            let mut h = req(Op::Read, 7, 5, 0, &[]);
            h.length = 4096;
            let (st, why) = call(&s, h, &[]);
            assert_eq!(st, Status::EpochTooOld);
            assert!(String::from_utf8_lossy(&why).contains("was removed"));
            // Again: nothing left, counted once.
            assert_eq!(s.remove_volume(7).unwrap(), Removed::default());
            assert_eq!(s.counters.volumes_removed.load(Ordering::Relaxed), 1);
            assert_eq!(s.counters.chunks_removed.load(Ordering::Relaxed), 4);
        }
        // After a restart, even a writer with a newer epoch is refused, and
        // volume 8 is untouched.
        let s = server(dir.path());
        assert_eq!(
            call(&s, req(Op::Open, 7, 99, 0, &size), &size).0,
            Status::EpochTooOld
        );
        // Ids from another etcd cluster delete nothing.
        let why = s
            .remove_volumes_not_in("c2", &BTreeSet::new(), 10)
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("\"c1\"") && why.contains("no chunk is deleted"),
            "{why}"
        );
        assert!(!dir.path().join("a/chunks/v7").exists());
        assert!(!dir.path().join("b/chunks/v7").exists());
        let mut h = req(Op::Read, 8, 5, 0, &[]);
        h.pg = chunk_code(3, 0);
        h.length = 8192;
        assert_eq!(call(&s, h, &[]), (Status::Ok, data));
    }

    #[test]
    fn a_fenced_server_acknowledges_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let s = server(dir.path());
        let size = (1u64 << 20).to_le_bytes();
        assert_eq!(call(&s, req(Op::Open, 7, 5, 0, &size), &size).0, Status::Ok);
        s.fence();
        let data = vec![1u8; 4096];
        assert_eq!(
            call(&s, req(Op::Write, 7, 5, 0, &data), &data).0,
            Status::Io
        );
    }

    #[test]
    fn open_chunks_are_bounded_and_reopen_on_use() {
        let dir = tempfile::tempdir().unwrap();
        let s = server(dir.path());
        let size = (1u64 << 20).to_le_bytes();
        for v in 1..=4 {
            assert_eq!(call(&s, req(Op::Open, v, 1, 0, &size), &size).0, Status::Ok);
            let data = vec![v as u8; 4096];
            assert_eq!(
                call(&s, req(Op::Write, v, 1, 0, &data), &data).0,
                Status::Ok
            );
        }
        assert!(s.open.lock().unwrap().by_name.len() <= 2);
        for v in 1..=4 {
            let mut h = req(Op::Read, v, 1, 0, &[]);
            h.length = 4096;
            let (st, got) = call(&s, h, &[]);
            assert_eq!((st, got), (Status::Ok, vec![v as u8; 4096]));
        }
    }

    /// Layer spec of the tests: parity-only dedup over a 1 MiB chunk's
    /// bytes from 64 KiB on.
    fn parity_layer(fresh: bool) -> LayerSpec {
        LayerSpec {
            config: ecdedup_core::dedup::DedupConfig {
                policy: ecdedup_core::dedup::Policy::Parity,
                ..Default::default()
            },
            data_offset: 64 << 10,
            data_bytes: (1 << 20) - (64 << 10),
            fresh,
        }
    }

    fn layer(s: &ChunkServer, volume: u64, spec: &LayerSpec) -> (Status, Vec<u8>) {
        let payload = ecdedup_core::proto::frame::encode_layer(spec);
        call(s, req(Op::Layer, volume, 1, 0, &payload), &payload)
    }

    fn write(s: &ChunkServer, volume: u64, at: u64, data: &[u8], flags: u16) -> Status {
        let mut h = req(Op::Write, volume, 1, at, data);
        h.flags |= flags;
        call(s, h, data).0
    }

    fn read(s: &ChunkServer, volume: u64, at: u64, len: u32, flags: u16) -> (Status, Vec<u8>) {
        let mut h = req(Op::Read, volume, 1, at, &[]);
        h.length = len;
        h.flags |= flags;
        call(s, h, &[])
    }

    /// A writer that reaches the chunk through a layer at its server.
    const L: u16 = FLAG_LAYERED;

    /// Block `at` of chunk `volume` reads as 4 KiB of `byte`.
    fn assert_block(s: &ChunkServer, volume: u64, at: u64, byte: u8) {
        let (st, got) = read(s, volume, at, 4096, L);
        assert_eq!(st, Status::Ok, "{}", String::from_utf8_lossy(&got));
        let wrong = got.iter().filter(|b| **b != byte).count();
        assert_eq!(
            wrong, 0,
            "block {at}: {wrong} bytes are not {byte:#x} (the first is {:#x})",
            got[0]
        );
    }

    /// A server with a chunk of volume 7 open at epoch 5, a request of
    /// that volume in flight (played by holding the volume's gate as a
    /// request holds it), and `raise` run beside it: asserts that `raise`
    /// waits for the request, then returns its result and the server.
    fn waits_for_a_request_in_flight<T: Send + 'static>(
        dir: &Path,
        raise: impl FnOnce(&ChunkServer) -> T + Send + 'static,
    ) -> (T, Arc<ChunkServer>) {
        let s = Arc::new(server(dir));
        let size = (1u64 << 20).to_le_bytes();
        assert_eq!(call(&s, req(Op::Open, 7, 5, 0, &size), &size).0, Status::Ok);
        let gate = s.gate(7);
        let in_flight = gate.read().unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let raising = {
            let (s, done) = (Arc::clone(&s), Arc::clone(&done));
            std::thread::spawn(move || {
                let r = raise(&s);
                done.store(true, Ordering::SeqCst);
                r
            })
        };
        // Time for the raise to run, were it not to wait.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            !done.load(Ordering::SeqCst),
            "the raise waited for the request in flight"
        );
        drop(in_flight);
        (raising.join().unwrap(), s)
    }

    /// A new writer's epoch push waits for the requests the server
    /// admitted at the older epoch: once it is answered, none of them
    /// can still land (they ran before it).
    #[test]
    fn an_epoch_push_waits_for_the_requests_admitted_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let (st, s) = waits_for_a_request_in_flight(dir.path(), |s| {
            call(s, req(Op::SetEpoch, 7, 6, 0, &[]), &[]).0
        });
        assert_eq!(st, Status::Ok);
        assert_eq!(s.epoch(7).unwrap(), 6);
        let data = vec![1u8; 4096];
        let (st, _) = call(&s, req(Op::Write, 7, 5, 0, &data), &data);
        assert_eq!(st, Status::EpochTooOld);
    }

    /// An epoch heard of from etcd (`raise_epoch`, no request) fences the
    /// old writer as a push does: after the requests it admitted, durably
    /// (across a restart), never lowering, never reviving a removed volume.
    #[test]
    fn an_epoch_raised_from_etcd_fences_the_old_writer_as_a_push_does() {
        let dir = tempfile::tempdir().unwrap();
        let (rose, s) = waits_for_a_request_in_flight(dir.path(), |s| s.raise_epoch(7, 9).unwrap());
        assert!(rose, "the epoch rose");
        let size = (1u64 << 20).to_le_bytes();
        let data = vec![1u8; 4096];
        let (st, why) = call(&s, req(Op::Write, 7, 5, 0, &data), &data);
        assert_eq!(st, Status::EpochTooOld, "{}", String::from_utf8_lossy(&why));
        // Never lowered; idempotent.
        assert!(!s.raise_epoch(7, 8).unwrap());
        assert!(!s.raise_epoch(7, 9).unwrap());
        assert_eq!(s.epoch(7).unwrap(), 9);
        // Stored: a restart still refuses the old writer.
        drop(s);
        let s = server(dir.path());
        assert_eq!(s.epoch(7).unwrap(), 9);
        assert_eq!(
            call(&s, req(Op::Write, 7, 5, 0, &data), &data).0,
            Status::EpochTooOld
        );
        assert_eq!(
            call(&s, req(Op::Write, 7, 9, 0, &data), &data).0,
            Status::Ok
        );
        // A volume heard of first from etcd is fenced as well, in memory
        // only (no file per volume of the cluster on every server).
        assert!(s.raise_epoch(8, 4).unwrap());
        assert!(!dir.path().join("a/epochs/v8").exists());
        // Its first request at that epoch stores it (the volume's chunks
        // are found, and freed at its removal, by that file).
        assert_eq!(call(&s, req(Op::Open, 8, 4, 0, &size), &size).0, Status::Ok);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a/epochs/v8")).unwrap(),
            "4\n"
        );
        assert_eq!(
            call(&s, req(Op::Open, 8, 3, 0, &size), &size).0,
            Status::EpochTooOld
        );
        // A removed volume stays removed.
        s.remove_volume(7).unwrap();
        assert!(!s.raise_epoch(7, 12).unwrap());
        assert_eq!(s.epoch(7).unwrap(), REMOVED_EPOCH);
    }

    /// A whole read of the writer keys (`apply_writer_keys`): a volume
    /// with a key gets its epoch; a known volume without one, and as a
    /// floor every volume not known yet, refuses any writer of an epoch
    /// up to the read (its key is gone); a damaged epoch file leaves its
    /// volume refused and the others applied.
    #[test]
    fn a_read_of_the_writer_keys_fences_every_writer_whose_key_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let s = server(dir.path());
        let size = (1u64 << 20).to_le_bytes();
        // Volume 7 written at epoch 5, volume 8 at epoch 6.
        assert_eq!(call(&s, req(Op::Open, 7, 5, 0, &size), &size).0, Status::Ok);
        assert_eq!(call(&s, req(Op::Open, 8, 6, 0, &size), &size).0, Status::Ok);
        // Volume 9's epoch file is damaged.
        std::fs::write(dir.path().join("a/epochs/v9"), b"garbage").unwrap();
        // At revision 40 only volume 8 has a writer, of epoch 30.
        assert!(s.apply_writer_keys(40, &[(8, 30)]).unwrap() >= 2);
        let refused = |v: u64, epoch: u64| call(&s, req(Op::Open, v, epoch, 0, &size), &size).0;
        assert_eq!(
            refused(7, 5),
            Status::EpochTooOld,
            "volume 7's writer lost its key"
        );
        let file7 = || std::fs::read_to_string(dir.path().join("a/epochs/v7")).unwrap();
        assert_eq!(file7(), "5\n", "a whole read's raise is kept in memory");
        assert_eq!(
            refused(7, 40),
            Status::Ok,
            "a writer created at the read's revision"
        );
        assert_eq!(file7(), "40\n", "stored at its first request");
        assert_eq!(refused(8, 6), Status::EpochTooOld);
        assert_eq!(refused(8, 30), Status::Ok);
        // A volume unknown here: its writers of epochs up to 40 are gone.
        assert_eq!(refused(10, 39), Status::EpochTooOld);
        assert_eq!(
            refused(10, 41),
            Status::Ok,
            "a writer created after the read"
        );
        // The damaged file: still refused whole, nothing else held back.
        assert_eq!(refused(9, 50), Status::Io);
        assert!(s.apply_writer_keys(60, &[(9, 55)]).is_ok());
    }

    /// A fresh start of a chunk's layer waits for the requests of its
    /// volume in flight (the writer's mirrored metadata writes reach a
    /// member being set up while it serves), where it refused before.
    #[test]
    fn a_fresh_layer_start_waits_for_the_requests_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(server(dir.path()));
        let size = (1u64 << 20).to_le_bytes();
        assert_eq!(call(&s, req(Op::Open, 7, 1, 0, &size), &size).0, Status::Ok);
        assert_eq!(layer(&s, 7, &parity_layer(true)).0, Status::Ok);
        // A request in flight: its turn at the gate, and the chunk it
        // holds (released in that order's reverse, as `serve` does).
        let gate = s.gate(7);
        let turn = gate.read().unwrap();
        let held = s.chunk(7, chunk_code(3, 1)).unwrap();
        let started = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || layer(&s, 7, &parity_layer(true)).0)
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(held);
        drop(turn);
        assert_eq!(started.join().unwrap(), Status::Ok);
    }

    /// The layers' RAM bound closes the least recently used layered chunk
    /// (its maps synced first) and the next use opens it again from them.
    #[test]
    fn dedup_layers_past_their_ram_bound_are_closed_and_reopen_on_use() {
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkServer::new(
            OsStorage::shared(),
            ChunkServerConfig {
                dirs: vec![dir.path().join("a")],
                io: IoMode::Buffered,
                open_chunks_max: 16,
                layers_ram_max: 1,
            },
        )
        .unwrap();
        let size = (1u64 << 20).to_le_bytes();
        for v in [7, 8, 9] {
            assert_eq!(call(&s, req(Op::Open, v, 1, 0, &size), &size).0, Status::Ok);
            assert_eq!(layer(&s, v, &parity_layer(true)).0, Status::Ok);
            let block = vec![v as u8; 4096];
            assert_eq!(write(&s, v, 64 << 10, &block, FLAG_PARITY | L), Status::Ok);
            assert_eq!(write(&s, v, 128 << 10, &block, FLAG_PARITY | L), Status::Ok);
        }
        let t = s.dedup_totals();
        eprintln!(
            "one open layer over a 1 MiB chunk's {} dedup blocks: {} bytes of RAM",
            (960u64 << 10) / 4096,
            t.layers_ram_bytes
        );
        assert_eq!(t.layers_open, 1, "{t:?}");
        assert!(t.layers_ram_bytes > 0, "{t:?}");
        assert_eq!(
            t.reference_parity_writes, 3,
            "closed layers' counts kept: {t:?}"
        );
        for v in [7, 8, 9, 7] {
            assert_block(&s, v, 64 << 10, v as u8);
            assert_block(&s, v, 128 << 10, v as u8);
        }
        assert!(s.counters.layers_closed.load(Ordering::Relaxed) >= 5);
        assert_eq!(s.dedup_totals().layers_open, 1);
        // Per volume: each volume's one chunk, open or closed, with its
        // two blocks mapped to one slot; a removed volume is dropped.
        let per = s.dedup_by_volume();
        assert_eq!(per.keys().copied().collect::<Vec<_>>(), vec![7, 8, 9]);
        for v in per.values() {
            assert_eq!(
                (v.chunks, v.mapped_blocks, v.slots_used),
                (1, 2, 1),
                "{per:?}"
            );
            assert_eq!((v.physical_writes, v.reference_parity_writes), (1, 1));
        }
        s.remove_volume(8).unwrap();
        assert_eq!(
            s.dedup_by_volume().keys().copied().collect::<Vec<_>>(),
            vec![7, 9]
        );
    }

    /// A chunk's dedup layer runs at its server: parity with the same
    /// bytes is stored once, data never fingerprinted (parity-only
    /// dedup); its maps outlive the chunk's close (the open-chunk bound)
    /// and the server's restart, every open of the chunk reads through
    /// them; a second start must ask for the same layer, a chunk without
    /// one says so; a range across the data area's start is refused.
    #[test]
    fn a_dedup_layer_runs_at_the_chunk_and_outlives_its_close_and_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let size = (1u64 << 20).to_le_bytes();
        let parity = vec![0x5au8; 4096];
        let data = vec![0x5au8; 4096];
        {
            let s = server(dir.path());
            for v in [7, 8] {
                assert_eq!(call(&s, req(Op::Open, v, 1, 0, &size), &size).0, Status::Ok);
            }
            let (st, reply) = layer(&s, 7, &parity_layer(true));
            assert_eq!((st, &reply[8..]), (Status::Ok, &[1u8][..]));
            assert_eq!(&reply[..8], s.boot_id().to_le_bytes());
            // A chunk without a layer, not asked to make one: none.
            let (st, reply) = layer(&s, 8, &parity_layer(false));
            assert_eq!((st, &reply[8..]), (Status::Ok, &[0u8][..]));
            for at in [64 << 10, 128 << 10] {
                assert_eq!(write(&s, 7, at, &parity, FLAG_PARITY | L), Status::Ok);
            }
            assert_eq!(write(&s, 7, 192 << 10, &data, L), Status::Ok);
            // Below the data area, passed through (a journal's bytes).
            assert_eq!(write(&s, 7, 8192, &data, FLAG_METADATA | L), Status::Ok);
            // A writer that disagrees on the layer: refused in the data
            // area, both ways; below it the bytes are the same either way.
            assert_eq!(write(&s, 7, 256 << 10, &data, 0), Status::Io);
            assert_eq!(read(&s, 8, 64 << 10, 4096, L).0, Status::Io);
            assert_eq!(read(&s, 7, 8192, 4096, 0), (Status::Ok, data.clone()));
            let stats = s.dedup_stats();
            assert_eq!(stats.len(), 1, "{stats:?}");
            let st = &stats[0].1;
            assert_eq!(
                (st.reference_parity_writes, st.hash_ops, st.physical_writes),
                (1, 2, 2),
                "the second parity block refers to the first; data is not fingerprinted"
            );
            // Across the data area's start: refused, nothing written.
            let two = vec![1u8; 8192];
            assert_eq!(write(&s, 7, (64 << 10) - 4096, &two, L), Status::Invalid);
            let (st, _) = read(&s, 7, (64 << 10) - 4096, 8192, L);
            assert_eq!(st, Status::Invalid);
            // Another layer than the chunk's: refused.
            let mut other = parity_layer(false);
            other.config.block_bytes = 8192;
            assert_eq!(layer(&s, 7, &other).0, Status::Invalid);
            // A malformed spec: refused.
            let (st, why) = call(&s, req(Op::Layer, 7, 1, 0, b"{"), b"{");
            assert_eq!(st, Status::Invalid, "{}", String::from_utf8_lossy(&why));
            let mut flush = req(Op::Flush, 7, 1, 0, &[]);
            flush.flags |= L;
            assert_eq!(call(&s, flush, &[]).0, Status::Ok);
            // Two more chunks close chunk 7 (the bound is 2).
            for v in [9, 10] {
                assert_eq!(call(&s, req(Op::Open, v, 1, 0, &size), &size).0, Status::Ok);
            }
            assert!(!s
                .open
                .lock()
                .unwrap()
                .by_name
                .contains_key(&(7, chunk_code(3, 1))));
            // Its counters outlive it in the server's totals.
            let t = s.dedup_totals();
            assert_eq!(
                (t.layers_open, t.reference_parity_writes, t.hash_ops),
                (0, 1, 2)
            );
            for at in [64 << 10, 128 << 10, 192 << 10] {
                assert_block(&s, 7, at, 0x5a);
            }
        }
        let s = server(dir.path());
        assert_eq!(layer(&s, 7, &parity_layer(false)).0, Status::Ok);
        for at in [64 << 10, 128 << 10, 192 << 10, 8192] {
            assert_block(&s, 7, at, 0x5a);
        }
        assert_block(&s, 7, 256 << 10, 0);
        // Started afresh: empty.
        assert_eq!(layer(&s, 7, &parity_layer(true)).0, Status::Ok);
        assert_block(&s, 7, 64 << 10, 0);
    }

    /// A layer whose maps do not read back refuses its data area (never
    /// read raw) and passes the bytes before it through, until a fresh
    /// start makes it blank; a discard past the data area's end and a
    /// range across its start never reach the layer.
    #[test]
    fn an_unreadable_layer_is_refused_until_started_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let size = (1u64 << 20).to_le_bytes();
        let half = LayerSpec {
            data_bytes: 512 << 10,
            ..parity_layer(true)
        };
        let block = vec![0x77u8; 4096];
        {
            let s = server(dir.path());
            assert_eq!(call(&s, req(Op::Open, 7, 1, 0, &size), &size).0, Status::Ok);
            assert_eq!(layer(&s, 7, &half).0, Status::Ok);
            let discard = |at: u64, len: u64| {
                let n = len.to_le_bytes();
                let mut h = req(Op::Discard, 7, 1, at, &n);
                h.flags |= L;
                call(&s, h, &n).0
            };
            assert_eq!(
                discard(640 << 10, 64 << 10),
                Status::Invalid,
                "past the end"
            );
            assert_eq!(discard((64 << 10) + 4096, 512 << 10), Status::Invalid);
            assert_eq!(discard(0, 576 << 10), Status::Ok, "across the start");
            assert_eq!(write(&s, 7, 64 << 10, &block, L), Status::Ok);
            assert_eq!(write(&s, 7, 8192, &block, FLAG_METADATA | L), Status::Ok);
            let mut flush = req(Op::Flush, 7, 1, 0, &[]);
            flush.flags |= L;
            assert_eq!(call(&s, flush, &[]).0, Status::Ok);
        }
        let maps = ["a", "b"]
            .iter()
            .filter_map(|d| std::fs::read_dir(dir.path().join(d).join("chunks/v7")).ok())
            .flatten()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().ends_with(".map.log"))
            .expect("the layer's map log beside the chunk");
        std::fs::write(&maps, b"not a map log").unwrap();
        let s = server(dir.path());
        let (st, why) = read(&s, 7, 64 << 10, 4096, L);
        assert_eq!(st, Status::Io, "{}", String::from_utf8_lossy(&why));
        assert_eq!(read(&s, 7, 8192, 4096, L), (Status::Ok, block.clone()));
        assert_eq!(read(&s, 7, 8192, 4096, 0), (Status::Ok, block.clone()));
        assert_eq!(
            layer(
                &s,
                7,
                &LayerSpec {
                    fresh: false,
                    ..half.clone()
                }
            )
            .0,
            Status::Io
        );
        assert_eq!(layer(&s, 7, &half).0, Status::Ok);
        assert_block(&s, 7, 64 << 10, 0);
    }
}
