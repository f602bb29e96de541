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
//! that has heard from its successor (docs/cluster.md, "Fencing").
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
//!   (the least recently used is closed; an open is cheap).

use ecdedup_core::media::fold;
use ecdedup_core::media::storage::{read_all, write_atomic};
use ecdedup_core::media::{Device, DeviceOptions, FileDevice, IoMode, Storage};
use ecdedup_core::proto::frame::{decode_append, decode_replay, encode_replay_answers, FLAG_FUA};
use ecdedup_core::proto::{chunk_parts, Header, Op, Status};
use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
}

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
}

#[derive(Default)]
struct OpenChunks {
    by_name: HashMap<(u64, u32), (Arc<FileDevice>, u64)>,
    clock: u64,
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
        if epoch <= stored {
            return Ok(stored);
        }
        let mut epochs = self.epochs.lock().unwrap();
        let now = epochs.get(&key).copied().unwrap_or(stored);
        if epoch > now {
            write_atomic(
                self.storage.as_ref(),
                &self.epoch_path(key),
                format!("{epoch}\n").as_bytes(),
            )
            .map_err(|e| io_refusal(&format!("storing the epoch of {key}"), &e))?;
            epochs.insert(key, epoch);
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
        if self.stored(Fenced::Volume(volume)).ok() == Some(REMOVED_EPOCH) {
            self.counters.epoch_refusals.fetch_add(1, Ordering::Relaxed);
            return Err((
                Status::EpochTooOld,
                format!(
                    "EPOCH_TOO_OLD: volume {volume} was removed (volume rm); this server \
                     deleted its chunks"
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

    /// The open chunk, opened from its file if it exists.
    fn chunk(&self, volume: u64, code: u32) -> Result<Arc<FileDevice>, Refusal> {
        let mut open = self.open.lock().unwrap();
        open.clock += 1;
        let clock = open.clock;
        if let Some((dev, used)) = open.by_name.get_mut(&(volume, code)) {
            *used = clock;
            return Ok(Arc::clone(dev));
        }
        let path = self.chunk_path(volume, code);
        if !self.storage.exists(&path) {
            let (pg, shard) = chunk_parts(code);
            return Err((
                Status::NotHere,
                format!("no chunk of volume {volume} PG {pg} shard {shard} here"),
            ));
        }
        let dev = FileDevice::open_with(self.storage.as_ref(), &path, self.options())
            .map_err(|e| io_refusal(&format!("opening {}", path.display()), &e))?;
        Ok(self.keep_open(&mut open, volume, code, dev, clock))
    }

    fn keep_open(
        &self,
        open: &mut OpenChunks,
        volume: u64,
        code: u32,
        dev: FileDevice,
        clock: u64,
    ) -> Arc<FileDevice> {
        while open.by_name.len() >= self.config.open_chunks_max.max(1) {
            let oldest = open
                .by_name
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(name, _)| *name);
            match oldest {
                Some(name) => open.by_name.remove(&name),
                None => break,
            };
        }
        let dev = Arc::new(dev);
        open.by_name
            .insert((volume, code), (Arc::clone(&dev), clock));
        dev
    }

    /// Opens (creating, sparse, if absent) a chunk of `size` bytes;
    /// returns whether it was made now.
    fn open_chunk(&self, volume: u64, code: u32, size: u64) -> Result<bool, Refusal> {
        if size == 0 || size > CHUNK_BYTES_MAX || !size.is_multiple_of(4096) {
            return Err(invalid(format!(
                "a chunk of {size} bytes (a multiple of 4096 up to {CHUNK_BYTES_MAX})"
            )));
        }
        match self.chunk(volume, code) {
            Ok(dev) if dev.size() == size => return Ok(false),
            Ok(dev) => {
                return Err(invalid(format!(
                    "{} is {} bytes, asked for {size}",
                    dev.describe(),
                    dev.size()
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
        self.keep_open(&mut open, volume, code, made, clock);
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
            | Op::SetEpoch => {}
            other => {
                return Err(invalid(format!(
                    "{other:?} is not served by this chunk server (the volume client keeps \
                     the parity journals' index and answers NEED_D0 itself)"
                )))
            }
        }
        self.admit_epoch(h.volume_id, h.epoch)?;
        let (volume, code) = (h.volume_id, h.pg);
        if h.op != Op::SetEpoch {
            self.admit_pg_epoch(volume, chunk_parts(code).0, h.pg_epoch)?;
        }
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
                let dev = self.chunk(volume, code)?;
                let len = u64::from(h.length);
                check_range(dev.as_ref(), h.offset, len)?;
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
                let dev = self.chunk(volume, code)?;
                let (writes, doing) = if h.op == Op::Write {
                    if h.length as usize != payload.len() {
                        return Err(invalid(format!(
                            "a write of length {} with {} bytes of payload",
                            h.length,
                            payload.len()
                        )));
                    }
                    (vec![(h.offset, payload)], "writing")
                } else {
                    let writes = decode_append(payload).map_err(invalid)?;
                    (writes, "appending to the parity journal on")
                };
                for &(offset, buf) in &writes {
                    check_range(dev.as_ref(), offset, buf.len() as u64)?;
                }
                let what = || format!("{doing} {}", dev.describe());
                for &(offset, buf) in &writes {
                    if buf.is_empty() {
                        // A barrier: what came before is durable before
                        // anything after it is made.
                        dev.sync().map_err(|e| io_refusal(&what(), &e))?;
                        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    dev.write_at(buf, offset)
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
                let dev = self.chunk(volume, code)?;
                let fold = decode_replay(payload).map_err(invalid)?;
                fold.check(dev.size()).map_err(invalid)?;
                let fua = h.flags & FLAG_FUA != 0;
                let answers = fold::run(dev.as_ref(), &fold, fua).map_err(|e| {
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
                let dev = self.chunk(volume, code)?;
                dev.sync()
                    .map_err(|e| io_refusal(&format!("syncing {}", dev.describe()), &e))?;
                self.counters.syncs.fetch_add(1, Ordering::Relaxed);
                Ok(self.boot_id.to_le_bytes().to_vec())
            }
            Op::Discard => {
                let dev = self.chunk(volume, code)?;
                let len = u64_payload(payload, "Discard")?;
                check_range(dev.as_ref(), h.offset, len)?;
                dev.discard(h.offset, len)
                    .map_err(|e| io_refusal(&format!("discarding on {}", dev.describe()), &e))?;
                Ok(self.boot_id.to_le_bytes().to_vec())
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
                true
            }
        };
        self.open
            .lock()
            .unwrap()
            .by_name
            .retain(|(v, _), _| *v != volume);
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
            for name in names {
                self.storage.remove(&folder.join(name))?;
                removed.chunks += 1;
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
}
