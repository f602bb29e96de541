//! The archive tier: objects (files, volume images) sealed into fixed-size,
//! erasure-coded containers with deduplication before encoding (CodePlugin,
//! paper 001), beside the live array. Design and on-disk format:
//! docs/archive.md.
//!
//! The path of an object: `put` appends its bytes to the open container's
//! staging file in the archive folder; a full container (or `seal`) is
//! sealed in a batch of 1 (no exchange) or n_ex containers: its blocks are
//! fingerprinted and looked up in the [`cache::FingerprintCache`]
//! (container.rs), pseudo-shuffled (shuffle.rs, Procedure 1), the batch's
//! sub-files regrouped (exchange.rs, Procedure 2), only the virtual stripes
//! holding a unique block are encoded, and the k data sub-files, the m
//! parity sub-files of each group and the batch's map-address table
//! (map.rs) are written; reads go to the untouched data sub-files and
//! decode (recover.rs) when a device is missing or a checksum fails;
//! scrub.rs checks and repairs everything; gc.rs copies the live bytes out
//! of mostly dead batches so that they can be deleted. Beyond the paper, two create
//! options (recorded in archive.json and in every map): the compact layout
//! stores only the unique blocks, and FastCDC chunking (chunking.rs) finds
//! duplicates by content-defined chunks while blocks stay the stripe unit.
//!
//! Invariants:
//! - A batch is visible exactly when its map file exists under `maps/`; the
//!   map is renamed into place only after every sub-file and parity file it
//!   names is durable, and deleted before them.
//! - The catalog (`catalog.json`: objects, the open container and its
//!   committed length, the full containers waiting for a batch) is replaced
//!   atomically, last, by every `put`, `rm`, `seal` and `gc`; an object exists
//!   exactly when the catalog names it. What a crash leaves beyond the
//!   catalog (staging bytes past the committed length, containers sealed
//!   for an object whose `put` never committed) is cut back at open or
//!   reclaimed by `scrub --repair`; what open reconciles (containers the
//!   catalog calls open or pending that a map says are sealed) it commits
//!   at once, before anything can reclaim the batch that said so.
//! - Every block of a sealed container is either unique (holds a byte of a
//!   unique chunk), in an encoded virtual stripe of its group, or redundant:
//!   its bytes are in unique source blocks or chunks;
//!   a batch is kept while any live object or any live batch's redundant
//!   block refers to it, so a source keeps its protection.
//! - After an error in a mutating call the store is latched: every later
//!   call fails until it is opened again (which reconciles the disk).
//! - Every device in place holds copies of the config and of the catalog
//!   (written before each commit), and m + 1 devices a copy of each map
//!   (durable before the folder's map): a lost folder is made again from
//!   them (assemble.rs), less the unsealed container.
//! - All file I/O goes through disk.rs, over the `Arc<dyn Storage>` the
//!   archive was opened on (the real file system, or the power-loss
//!   simulator in tests).

pub mod assemble;
mod cache;
pub mod chunking;
mod container;
pub mod disk;
pub mod exchange;
pub mod gc;
pub mod map;
mod meta;
mod recover;
mod scrub;
pub mod shuffle;
pub mod source;

pub use chunking::Chunking;
pub use gc::{GcReport, GC_LIVE_BELOW_PERCENT_DEFAULT};
pub use map::Layout;
pub use scrub::ScrubReport;

use cache::FingerprintCache;
use disk::Disk;
use ecdedup_core::codec::Codec;
use ecdedup_core::error::{Error, Result};
use ecdedup_core::fingerprint::{Algorithm, CpuBackend, Fingerprint, FingerprintBackend};
use ecdedup_core::media::storage::StorageLock;
use ecdedup_core::media::{OsStorage, Storage};
use map::{BatchMap, BlockAddress, ChunkKind};
use meta::Checked;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const CONFIG_FILE: &str = "archive.json";
const CATALOG_FILE: &str = "catalog.json";
const CACHE_FILE: &str = "fpcache.bin";
const LOCK_FILE: &str = "archive.lock";
/// Written by `create` before the first device marker and removed once the
/// config is durable: the uuid whose markers a repeated `create` may
/// overwrite after a crash.
const CREATING_FILE: &str = "creating.json";
const MAPS_DIR: &str = "maps";
const STAGING_DIR: &str = "staging";
const DEVICE_MARKER: &str = "archive-device.json";
/// `archive.json` version 1: the paper's layout and fixed chunking (no
/// `layout` or `chunking` field); version 2 records both. An archive with
/// the defaults is still written as version 1, so older binaries open it.
const FORMAT_VERSION_V1: u32 = 1;
const FORMAT_VERSION: u32 = 2;
/// Longest object name, in bytes.
pub const NAME_BYTES_MAX: usize = 1024;
/// Bytes `put` reads from its source at a time.
const PUT_BUFFER_BYTES_MAX: usize = 8 << 20;
pub const CONTAINER_BYTES_DEFAULT: u64 = 300 << 20;
pub const BLOCK_BYTES_DEFAULT: u32 = 8 << 10;
pub const CACHE_BYTES_DEFAULT: u64 = 512 << 20;

/// What `create` is given.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub k: usize,
    pub m: usize,
    /// Device folders in position order; empty: `device_count` folders
    /// `dev0`, `dev1`, ... inside the archive folder.
    pub devices: Vec<PathBuf>,
    pub device_count: usize,
    pub container_bytes: u64,
    pub block_bytes: u32,
    pub fingerprint: Algorithm,
    pub cache_bytes: u64,
    /// Containers whose sub-files are exchanged (Procedure 2); 0 or 1: none.
    pub exchange: u32,
    /// Byte-compare a block with its source on a fingerprint hit; None:
    /// on unless the fingerprint is strong (SHA-256, BLAKE3).
    pub verify: Option<bool>,
    /// What the data sub-files hold: every block (paper) or only the
    /// unique ones (compact).
    pub layout: Layout,
    /// Fixed blocks (paper) or FastCDC chunks.
    pub chunking: Chunking,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            k: 6,
            m: 3,
            devices: Vec::new(),
            device_count: 9,
            container_bytes: CONTAINER_BYTES_DEFAULT,
            block_bytes: BLOCK_BYTES_DEFAULT,
            fingerprint: Algorithm::Md5,
            cache_bytes: CACHE_BYTES_DEFAULT,
            exchange: 0,
            verify: None,
            layout: Layout::Paper,
            chunking: Chunking::Fixed,
        }
    }
}

/// `archive.json`: fixed at create.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ArchiveConfig {
    pub version: u32,
    pub uuid: String,
    pub k: usize,
    pub m: usize,
    /// Device folders; relative ones are inside the archive folder.
    pub devices: Vec<PathBuf>,
    pub container_bytes: u64,
    pub block_bytes: u32,
    pub fingerprint: Algorithm,
    pub cache_bytes: u64,
    pub exchange: u32,
    pub verify: bool,
    #[serde(default)]
    pub layout: Layout,
    #[serde(default)]
    pub chunking: Chunking,
    /// Grows with every rewrite of a changed config (`assemble`): a copy
    /// of a higher generation is the newer (0 in archives made before it).
    #[serde(default)]
    pub generation: u64,
}

impl ArchiveConfig {
    /// Containers sealed together.
    pub fn batch_containers(&self) -> usize {
        self.exchange.max(1) as usize
    }

    /// The kind of chunks its maps record.
    pub fn chunk_kind(&self) -> ChunkKind {
        match self.chunking {
            Chunking::Fixed => ChunkKind::Fixed,
            Chunking::Fastcdc { .. } => ChunkKind::ContentDefined,
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |s: String| Err(Error::Config(s));
        if !(FORMAT_VERSION_V1..=FORMAT_VERSION).contains(&self.version) {
            return bad(format!("archive format version {} unknown", self.version));
        }
        if self.version == FORMAT_VERSION_V1
            && (self.layout != Layout::Paper || self.chunking != Chunking::Fixed)
        {
            return bad("a version 1 archive names a layout or chunking it cannot have".into());
        }
        self.chunking.validate()?;
        Codec::new(self.k, self.m).map_err(|e| Error::Config(e.to_string()))?;
        if self.k > 255 {
            return bad("k must be at most 255 for an archive".into());
        }
        if self.devices.len() < self.k + self.m || self.devices.len() > u16::MAX as usize {
            return bad(format!(
                "RS({},{}) needs at least {} devices, got {}",
                self.k,
                self.m,
                self.k + self.m,
                self.devices.len()
            ));
        }
        if self.block_bytes < 512 || !self.block_bytes.is_power_of_two() {
            return bad(format!(
                "block size {} must be a power of two, at least 512 bytes",
                self.block_bytes
            ));
        }
        let stripe_bytes = self.k as u64 * self.block_bytes as u64;
        if self.container_bytes == 0 || !self.container_bytes.is_multiple_of(stripe_bytes) {
            return bad(format!(
                "container size {} must be a positive multiple of k x block = {stripe_bytes}",
                self.container_bytes
            ));
        }
        if self.container_bytes / stripe_bytes >= map::COLUMNS_MAX as u64 {
            return bad("container too large for its block size".into());
        }
        if self.exchange > 64 {
            return bad(format!("exchange {} exceeds 64 containers", self.exchange));
        }
        if !self.fingerprint.cryptographic() && !self.verify {
            return bad("a crc32c fingerprint needs verify".into());
        }
        Ok(())
    }
}

/// A run of an object's bytes inside one container.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Extent {
    pub container: u32,
    /// Offset in the container's data (its sub-files concatenated).
    pub offset: u64,
    pub length: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ObjectRecord {
    pub size: u64,
    pub extents: Vec<Extent>,
}

/// `catalog.json`.
#[derive(Clone, Debug, Serialize, Deserialize, Default)]
struct Catalog {
    /// The container `put` appends to, and its committed length.
    open_container: u32,
    open_bytes: u64,
    /// Full containers waiting for their batch (exchange).
    pending: Vec<u32>,
    next_container: u32,
    objects: BTreeMap<String, ObjectRecord>,
    /// Lifetime fingerprint-cache counters, carried across processes (a
    /// seal whose catalog write a crash prevented is not counted).
    #[serde(default)]
    cache_counters: CacheCounters,
    /// Grows with every save: `assemble` takes the newest of the copies
    /// on the devices.
    #[serde(default)]
    generation: u64,
}

impl Catalog {
    /// The highest container id in `sealed`, the pending list or the open
    /// container (0: none): ids above it are free.
    fn newest_container<'a>(&self, sealed: impl Iterator<Item = &'a u32>) -> u32 {
        sealed
            .copied()
            .chain(self.pending.iter().copied())
            .chain(std::iter::once(self.open_container))
            .max()
            .unwrap_or(0)
    }
}

/// Fingerprint-cache counters over the archive's life.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, Default, PartialEq, Eq)]
struct CacheCounters {
    hits: u64,
    misses: u64,
    evictions: u64,
}

/// Reports the progress of a long call: (phase, done, total), in the
/// phase's own unit (bytes, stripes or blocks).
pub type ProgressFn = ecdedup_core::array::ProgressFn;

/// Time this process spent sealing, by phase (for `eval codeplugin`; not
/// part of `stats`, which reports the archive, not one process).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct SealTimings {
    /// Fingerprinting every block (part of `preprocess_ns`).
    pub fingerprint_ns: u64,
    /// Dedup before encoding: fingerprints, cache lookups and byte
    /// compares, pseudo-shuffling and sub-file exchange.
    pub preprocess_ns: u64,
    /// Reed-Solomon encoding of the virtual stripes that hold a unique block.
    pub encode_ns: u64,
    /// Durable writes of data sub-files, parity and map.
    pub write_ns: u64,
    /// Bytes of the containers sealed (object bytes and zero padding).
    pub container_bytes: u64,
}

/// One line of `ls`.
#[derive(Clone, Debug, Serialize)]
pub struct ObjectInfo {
    pub name: String,
    pub size: u64,
    /// Bytes still in unsealed containers.
    pub unsealed_bytes: u64,
    /// Of its sealed blocks (whole blocks touched), how many are redundant.
    pub blocks: u64,
    pub redundant_blocks: u64,
}

/// `stats`: the archive's state; the cache counters are over the archive's
/// life (docs/archive.md, "Counters").
#[derive(Clone, Debug, Default, Serialize)]
pub struct ArchiveStats {
    pub objects: u64,
    pub object_bytes: u64,
    pub batches: u64,
    pub containers_sealed: u64,
    pub containers_unsealed: u64,
    pub unsealed_bytes: u64,
    pub sealed_data_bytes: u64,
    pub blocks: u64,
    pub unique_blocks: u64,
    pub redundant_blocks: u64,
    /// Virtual stripes over all sealed containers (what plain RS encodes).
    pub stripes: u64,
    pub stripes_encoded: u64,
    pub parity_bytes: u64,
    /// Parity plain RS(k,m) would store for the same containers.
    pub plain_parity_bytes: u64,
    pub parity_saving_percent: f64,
    pub map_bytes: u64,
    pub cache_entries: u64,
    pub cache_bytes: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_evictions: u64,
    /// Bytes of the data sub-files on the devices (compact: unique blocks).
    pub stored_data_bytes: u64,
    /// Content-defined chunking: chunks, and those with a source.
    pub chunks: u64,
    pub redundant_chunks: u64,
}

/// Where a container's bytes are.
enum Location<'a> {
    Sealed(&'a BatchMap),
    Staging,
}

pub struct ArchiveStore {
    dir: PathBuf,
    /// Every file operation goes through here.
    disk: Disk,
    config: ArchiveConfig,
    codec: Codec,
    /// Hashes each sealed container's blocks (or chunks) in one batch: the
    /// CPU backend unless [`ArchiveStore::set_fingerprint_backend`] gave
    /// another (a GPU's, through `choose_backend`).
    backend: Arc<dyn FingerprintBackend>,
    catalog: Catalog,
    /// Sealed batches by batch id.
    batches: BTreeMap<u32, BatchMap>,
    /// Sealed container id → batch id.
    container_batch: HashMap<u32, u32>,
    cache: FingerprintCache,
    /// Devices whose folder is missing at open.
    missing_devices: Vec<usize>,
    /// Set by a failed mutating call (see the module invariants).
    latched: Option<String>,
    /// What this open recovered from the devices' copies (a folder file
    /// that failed its checksum), one line each: said by the commands, so
    /// damage to the folder is never mended unseen.
    recovered: Vec<String>,
    /// The batch `gc` is rewriting: no new block takes a source from it.
    dying_batch: Option<u32>,
    progress: Option<ProgressFn>,
    timings: SealTimings,
    _lock: StorageLock,
}

fn staging_name(id: u32) -> String {
    format!("c{id:08x}.data")
}

fn sub_file_name(container: u32, sub_file: u8) -> String {
    format!("c{container:08x}.{sub_file}")
}

fn parity_name(group_id: u32, parity: usize) -> String {
    format!("p{group_id:08x}.{parity}")
}

fn map_name(batch: u32) -> String {
    format!("b{batch:08x}.map")
}

/// `creating.json`: the archive a create in progress is making.
#[derive(Serialize, Deserialize)]
struct Creating {
    archive: String,
}

#[derive(Serialize, Deserialize)]
struct DeviceMarker {
    archive: String,
    position: usize,
}

fn lock(disk: &Disk, dir: &Path) -> Result<StorageLock> {
    disk.try_lock(&dir.join(LOCK_FILE))?.ok_or_else(|| {
        Error::Busy(format!(
            "archive {} is open in another process",
            dir.display()
        ))
    })
}

impl ArchiveStore {
    /// Creates an archive in `dir` (which must not hold one) on the real
    /// file system and opens it.
    pub fn create(dir: &Path, options: &CreateOptions) -> Result<ArchiveStore> {
        ArchiveStore::create_in(OsStorage::shared(), dir, options)
    }

    /// Opens the archive in `dir` on the real file system.
    pub fn open(dir: &Path) -> Result<ArchiveStore> {
        ArchiveStore::open_in(OsStorage::shared(), dir)
    }

    /// Creates an archive in `dir` of `storage` (which must not hold one)
    /// and opens it.
    pub fn create_in(
        storage: Arc<dyn Storage>,
        dir: &Path,
        options: &CreateOptions,
    ) -> Result<ArchiveStore> {
        let disk = Disk::new(storage);
        let devices: Vec<PathBuf> = if options.devices.is_empty() {
            (0..options.device_count)
                .map(|i| PathBuf::from(format!("dev{i}")))
                .collect()
        } else {
            options.devices.clone()
        };
        let defaults = options.layout == Layout::Paper && options.chunking == Chunking::Fixed;
        let config = ArchiveConfig {
            version: if defaults {
                FORMAT_VERSION_V1
            } else {
                FORMAT_VERSION
            },
            uuid: uuid::Uuid::new_v4().to_string(),
            k: options.k,
            m: options.m,
            devices,
            container_bytes: options.container_bytes,
            block_bytes: options.block_bytes,
            fingerprint: options.fingerprint,
            cache_bytes: options.cache_bytes,
            exchange: options.exchange,
            verify: options.verify.unwrap_or(!options.fingerprint.strong()),
            layout: options.layout,
            chunking: options.chunking,
            generation: 1,
        };
        config.validate()?;
        if disk.exists(&dir.join(CONFIG_FILE)) {
            return Err(Error::Config(format!(
                "{} already holds an archive",
                dir.display()
            )));
        }
        disk.create_dir(dir)?;
        let _lock = lock(&disk, dir)?;
        // A create of this folder that a crash interrupted: its markers
        // (and nothing else) may be overwritten.
        let creating_path = dir.join(CREATING_FILE);
        let interrupted: Option<Creating> = read_json(&disk, &creating_path)?;
        for device in &config.devices {
            let path = dir.join(device);
            let files = disk.list_files(&path)?.unwrap_or_default();
            let ours = |name: &String| {
                [DEVICE_MARKER, CONFIG_FILE, CATALOG_FILE]
                    .iter()
                    .any(|f| name == f || name == &disk::temporary_name(f))
            };
            let left_by_interrupted_create = interrupted.as_ref().is_some_and(|c| {
                files.iter().all(ours)
                    && read_json::<DeviceMarker>(&disk, &path.join(DEVICE_MARKER))
                        .ok()
                        .flatten()
                        .is_none_or(|m| m.archive == c.archive)
            });
            if !files.is_empty() && !left_by_interrupted_create {
                return Err(Error::Device {
                    path,
                    reason: "is not empty; an archive device must start empty".into(),
                });
            }
        }
        write_json(
            &disk,
            &creating_path,
            &Creating {
                archive: config.uuid.clone(),
            },
        )?;
        let catalog = Catalog {
            next_container: 1,
            ..Default::default()
        };
        for (position, device) in config.devices.iter().enumerate() {
            write_marker(&disk, &dir.join(device), &config.uuid, position)?;
            meta::write(&disk, &dir.join(device).join(CONFIG_FILE), &config)?;
            meta::write(&disk, &dir.join(device).join(CATALOG_FILE), &catalog)?;
        }
        disk.create_dir(&dir.join(MAPS_DIR))?;
        disk.create_dir(&dir.join(STAGING_DIR))?;
        meta::write(&disk, &dir.join(CATALOG_FILE), &catalog)?;
        // The config last: a crash before it leaves no archive.
        meta::write(&disk, &dir.join(CONFIG_FILE), &config)?;
        disk.remove(&creating_path)?;
        disk.sync_dir(dir)?;
        drop(_lock);
        ArchiveStore::open_in(Arc::clone(disk.storage()), dir)
    }

    /// Opens the archive in `dir` of `storage`, reconciling what a crash
    /// left behind.
    pub fn open_in(storage: Arc<dyn Storage>, dir: &Path) -> Result<ArchiveStore> {
        let disk = Disk::new(storage);
        let config_path = dir.join(CONFIG_FILE);
        let creating_path = dir.join(CREATING_FILE);
        let mut recovered = Vec::new();
        let (config, legacy, config_recovered) = match meta::read(&disk, &config_path)? {
            Checked::Good(c) => (c, false, false),
            // Made before metadata checksums: its files are believed
            // without one until this open writes them again.
            Checked::Legacy(c) => (c, true, false),
            Checked::Bad(why) => {
                let config = recover_config(&disk, dir, &why)?;
                recovered.push(format!(
                    "{}: {why}; taken from the devices' copies (generation {}) and written again",
                    config_path.display(),
                    config.generation
                ));
                (config, false, true)
            }
            Checked::Missing => {
                let hint = if disk.exists(&creating_path) {
                    " (a create was interrupted: run create again)"
                } else {
                    ""
                };
                return Err(Error::Config(format!(
                    "no archive in {}{hint}",
                    dir.display()
                )));
            }
        };
        config.validate()?;
        let _lock = lock(&disk, dir)?;
        // A create that a crash stopped after its config was durable.
        if disk.exists(&creating_path) {
            disk.remove(&creating_path)?;
            disk.sync_dir(dir)?;
        }
        let mut missing_devices = Vec::new();
        for (position, device) in config.devices.iter().enumerate() {
            let path = dir.join(device);
            if !disk.is_dir(&path) {
                missing_devices.push(position);
                continue;
            }
            let marker: Option<DeviceMarker> = read_json(&disk, &path.join(DEVICE_MARKER))?;
            match marker {
                Some(m) if m.archive == config.uuid && m.position == position => {}
                // An empty folder (a replacement, or one whose repair a
                // crash stopped before its marker was durable) is a missing
                // device: `scrub --repair` writes it.
                None if disk
                    .list_files(&path)?
                    .unwrap_or_default()
                    .iter()
                    .all(|n| n == &disk::temporary_name(DEVICE_MARKER)) =>
                {
                    missing_devices.push(position);
                }
                _ => {
                    return Err(Error::Device {
                        path,
                        reason: format!(
                            "is not device {position} of archive {} (foreign or blank device)",
                            config.uuid
                        ),
                    })
                }
            }
        }
        let codec = Codec::new(config.k, config.m).map_err(|e| Error::Config(e.to_string()))?;
        let backend: Arc<dyn FingerprintBackend> =
            Arc::new(CpuBackend::new(None).map_err(|e| Error::Other(e.to_string()))?);
        let (mut catalog, catalog_recovered) =
            load_catalog(&disk, dir, &config, &missing_devices, legacy)?;
        if let Some(why) = &catalog_recovered {
            recovered.push(format!(
                "{}: {why}; taken from the devices' copies (generation {}) and written again",
                dir.join(CATALOG_FILE).display(),
                catalog.generation
            ));
        }
        let catalog_recovered = catalog_recovered.is_some();
        let mut batches = BTreeMap::new();
        let mut container_batch = HashMap::new();
        for name in disk.list_files(&dir.join(MAPS_DIR))?.unwrap_or_default() {
            if !name.ends_with(".map") || name.starts_with('.') {
                continue;
            }
            let map = load_map(&disk, dir, &config, &name, &mut recovered)?;
            for c in &map.containers {
                container_batch.insert(c.id, map.batch);
            }
            batches.insert(map.batch, map);
        }
        validate_catalog(&catalog, &config, &batches, &container_batch)?;
        // Reconcile: containers sealed by a put or seal whose catalog
        // write never happened.
        let committed = (
            catalog.pending.clone(),
            catalog.open_container,
            catalog.next_container,
        );
        catalog
            .pending
            .retain(|id| !container_batch.contains_key(id));
        let newest = catalog.newest_container(container_batch.keys());
        catalog.next_container = catalog.next_container.max(newest + 1);
        if container_batch.contains_key(&catalog.open_container) {
            catalog.open_container = catalog.next_container;
            catalog.next_container += 1;
            catalog.open_bytes = 0;
        }
        // Committed before anything else: a batch that justified the
        // reconciliation may be reclaimed (it holds no live object), after
        // which the old catalog would name a sealed container as open or
        // pending with no staging file left, and reuse its id.
        if committed
            != (
                catalog.pending.clone(),
                catalog.open_container,
                catalog.next_container,
            )
        {
            catalog.generation += 1;
            meta::write(&disk, &dir.join(CATALOG_FILE), &catalog)?;
        }
        let staging = dir.join(STAGING_DIR);
        for name in disk.list_files(&staging)?.unwrap_or_default() {
            let path = staging.join(&name);
            let id = name
                .strip_prefix('c')
                .and_then(|n| n.strip_suffix(".data"))
                .and_then(|n| u32::from_str_radix(n, 16).ok());
            match id {
                Some(id) if id == catalog.open_container => {
                    disk.truncate(&path, catalog.open_bytes)?
                }
                Some(id) if catalog.pending.contains(&id) => {}
                _ => disk.remove(&path)?,
            }
        }
        let mut cache = FingerprintCache::new(config.cache_bytes);
        load_cache(&disk, &dir.join(CACHE_FILE), config.fingerprint, &mut cache)?;
        // Loading inserts; the counters are the archive's, not the load's.
        cache.hits = catalog.cache_counters.hits;
        cache.misses = catalog.cache_counters.misses;
        cache.evictions = catalog.cache_counters.evictions;
        cache.retain_containers(|c| container_batch.contains_key(&c));
        let mut store = ArchiveStore {
            dir: dir.to_path_buf(),
            disk,
            config,
            codec,
            backend,
            catalog,
            batches,
            container_batch,
            cache,
            missing_devices,
            latched: None,
            recovered,
            dying_batch: None,
            progress: None,
            timings: SealTimings::default(),
            _lock,
        };
        // Copies a crash left behind or ahead of the committed catalog (or
        // that a repair left out, or that fail their checksum) are brought
        // up to date; a folder catalog taken from a device copy is
        // committed again.
        store.refresh_catalog_copies(catalog_recovered)?;
        // A folder config taken from the devices, or a legacy archive's
        // config, is written again with its checksum (the devices' copies
        // first, the folder's last), after the catalog: a legacy config
        // is what lets a catalog without a checksum be read, so a crash
        // between the two must not leave the config upgraded alone. Otherwise a device's bad config copy
        // is left for `scrub`, which reports it as damage and repairs it.
        if legacy || config_recovered {
            store.refresh_config_copies(true)?;
        }
        Ok(store)
    }

    /// Rewrites each config copy on the devices in place that is not the
    /// config's checked bytes, and the folder's when `folder` (or when it
    /// differs). Returns the copies rewritten.
    fn refresh_config_copies(&mut self, folder: bool) -> Result<u64> {
        let good = meta::encode(&self.config);
        let mut rewritten = 0;
        let mut paths: Vec<PathBuf> = (0..self.config.devices.len())
            .filter(|p| !self.missing_devices.contains(p))
            .map(|p| self.device_dir(p).join(CONFIG_FILE))
            .collect();
        // The folder's last: the devices hold the config before the
        // folder says it is the archive's.
        paths.push(self.dir.join(CONFIG_FILE));
        let last = paths.len() - 1;
        for (i, path) in paths.iter().enumerate() {
            let differs = self.disk.read_all(path).ok().flatten().as_deref() != Some(&good[..]);
            if differs || (i == last && folder) {
                self.disk.write_durable(path, &good)?;
                rewritten += 1;
            }
        }
        Ok(rewritten)
    }

    /// Whether a device in place lacks a copy of the committed catalog,
    /// and the highest generation among the copies.
    fn catalog_copies_stale(&self) -> Result<(bool, u64)> {
        let committed = meta::encode(&self.catalog);
        let mut stale = false;
        let mut newest = 0;
        for position in 0..self.config.devices.len() {
            if self.missing_devices.contains(&position) {
                continue;
            }
            let path = self.device_dir(position).join(CATALOG_FILE);
            // A corrupt or unreadable copy is a stale one; only a copy
            // that passes its checksum says which generations are taken.
            let copy = self.disk.read_all(&path).ok().flatten();
            stale |= copy.as_deref() != Some(&committed[..]);
            if let Some(c) = copy.and_then(|b| meta::decode::<Catalog>(&b).usable(true)) {
                newest = newest.max(c.generation);
            }
        }
        Ok((stale, newest))
    }

    /// Commits the catalog again, copies first, under a generation above
    /// every copy's (a copy ahead of the commit, left by a call cut before
    /// it, must never tie with the committed catalog for `assemble`).
    /// Returns whether the copies were stale.
    fn refresh_catalog_copies(&mut self, force: bool) -> Result<bool> {
        let (stale, newest) = self.catalog_copies_stale()?;
        if stale || force {
            self.catalog.generation = self.catalog.generation.max(newest);
            self.save_catalog()?;
        }
        Ok(stale)
    }

    pub fn config(&self) -> &ArchiveConfig {
        &self.config
    }

    /// Hashes every container sealed from now on with `backend` (any
    /// backend gives the same fingerprints, so the archive's contents do not
    /// depend on it; only the speed does).
    pub fn set_fingerprint_backend(&mut self, backend: Arc<dyn FingerprintBackend>) {
        self.backend = backend;
    }

    /// Has `seal` (and the seals inside `put`) and `scrub` report progress.
    pub fn set_progress(&mut self, progress: Option<ProgressFn>) {
        self.progress = progress;
    }

    fn report_progress(&self, phase: &str, done: u64, total: u64) {
        if let Some(p) = &self.progress {
            p(phase, done, total);
        }
    }

    /// Time this process has spent sealing, by phase.
    pub fn seal_timings(&self) -> SealTimings {
        self.timings
    }

    /// Device positions whose folder was missing at open.
    pub fn missing_devices(&self) -> &[usize] {
        &self.missing_devices
    }

    /// The folder's metadata files this open found damaged and took from
    /// the devices' copies, one line each.
    pub fn recovered(&self) -> &[String] {
        &self.recovered
    }

    fn device_dir(&self, device: usize) -> PathBuf {
        self.dir.join(&self.config.devices[device])
    }

    fn staging_path(&self, id: u32) -> PathBuf {
        self.dir.join(STAGING_DIR).join(staging_name(id))
    }

    fn check_latch(&self) -> Result<()> {
        match &self.latched {
            Some(why) => Err(Error::Unavailable(format!(
                "an earlier call failed ({why}); open the archive again"
            ))),
            None => Ok(()),
        }
    }

    /// Runs a mutating step, latching the store if it fails.
    fn latching<T>(&mut self, step: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.check_latch()?;
        let result = step(self);
        if let Err(e) = &result {
            self.latched = Some(e.to_string());
        }
        result
    }

    /// Copies the catalog to every device in place (for `assemble`), then
    /// commits it: the archive folder's copy is the commit, so a call that
    /// fails before it leaves the object as it was (a copy ahead of the
    /// commit is rewritten at the next open).
    fn save_catalog(&mut self) -> Result<()> {
        self.catalog.cache_counters = CacheCounters {
            hits: self.cache.hits,
            misses: self.cache.misses,
            evictions: self.cache.evictions,
        };
        self.catalog.generation += 1;
        self.write_catalog_copies()?;
        meta::write(&self.disk, &self.dir.join(CATALOG_FILE), &self.catalog)
    }

    /// The catalog's copy on every device in place.
    fn write_catalog_copies(&self) -> Result<()> {
        for position in 0..self.config.devices.len() {
            if !self.missing_devices.contains(&position) {
                let path = self.device_dir(position).join(CATALOG_FILE);
                meta::write(&self.disk, &path, &self.catalog)?;
            }
        }
        Ok(())
    }

    /// The devices that hold a copy of batch `batch`'s map: m + 1 of them,
    /// rotated by the batch id, so that any m lost devices leave one.
    fn map_copy_paths(&self, batch: u32) -> Vec<PathBuf> {
        map_copy_paths(&self.dir, &self.config, batch)
    }

    fn save_cache(&self) -> Result<()> {
        let mut out = Vec::new();
        for (fp, a) in self.cache.oldest_first() {
            out.push(fp.as_bytes().len() as u8);
            out.extend_from_slice(fp.as_bytes());
            out.extend_from_slice(&a.container.to_le_bytes());
            out.push(a.sub_file);
            out.extend_from_slice(&a.column.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        self.disk.write_durable(&self.dir.join(CACHE_FILE), &out)
    }

    /// Stores `source`'s bytes as object `name`; the object exists once this
    /// returns, and not at all if it fails or the process dies first.
    pub fn put(&mut self, name: &str, source: &mut dyn Read) -> Result<ObjectRecord> {
        self.check_latch()?;
        if name.is_empty() || name.len() > NAME_BYTES_MAX || name.contains(['\0', '\n']) {
            return Err(Error::InvalidRequest(format!(
                "object name {name:?}: 1 to {NAME_BYTES_MAX} bytes, no NUL or newline"
            )));
        }
        if self.catalog.objects.contains_key(name) {
            return Err(Error::InvalidRequest(format!("object {name:?} exists")));
        }
        self.latching(|store| store.put_inner(name, source))
    }

    fn put_inner(&mut self, name: &str, source: &mut dyn Read) -> Result<ObjectRecord> {
        let container_bytes = self.config.container_bytes;
        let mut buffer = vec![0u8; (container_bytes as usize).min(PUT_BUFFER_BYTES_MAX)];
        let mut record = ObjectRecord {
            size: 0,
            extents: Vec::new(),
        };
        loop {
            let got = read_full(source, &mut buffer)?;
            if got == 0 {
                break;
            }
            self.append(&buffer[..got], &mut record.extents)?;
            record.size += got as u64;
        }
        if self.catalog.open_bytes > 0 {
            self.disk
                .sync_file(&self.staging_path(self.catalog.open_container))?;
        }
        self.catalog
            .objects
            .insert(name.to_string(), record.clone());
        self.save_catalog()?;
        Ok(record)
    }

    /// Appends `bytes` to the open container (closing each that fills,
    /// which seals its batch once complete) and records where they went in
    /// `extents`. Nothing is committed: the caller syncs the open
    /// container's staging file and saves the catalog.
    fn append(&mut self, mut bytes: &[u8], extents: &mut Vec<Extent>) -> Result<()> {
        while !bytes.is_empty() {
            let space = self.config.container_bytes - self.catalog.open_bytes;
            if space == 0 {
                self.close_open_container()?;
                continue;
            }
            let take = (space as usize).min(bytes.len());
            let id = self.catalog.open_container;
            let offset = self.catalog.open_bytes;
            self.disk
                .write_at(&self.staging_path(id), offset, &bytes[..take])?;
            match extents.last_mut() {
                Some(e) if e.container == id && e.offset + e.length == offset => {
                    e.length += take as u64
                }
                _ => extents.push(Extent {
                    container: id,
                    offset,
                    length: take as u64,
                }),
            }
            self.catalog.open_bytes += take as u64;
            bytes = &bytes[take..];
        }
        Ok(())
    }

    /// Moves the open container to the pending list; seals the batch when
    /// it is complete.
    fn close_open_container(&mut self) -> Result<()> {
        self.move_open_to_pending()?;
        if self.catalog.pending.len() >= self.config.batch_containers() {
            self.seal_pending()?;
        }
        Ok(())
    }

    /// The open container's staging file synced and the container moved
    /// to the pending list; a new, empty container is open.
    fn move_open_to_pending(&mut self) -> Result<()> {
        let id = self.catalog.open_container;
        self.disk.sync_file(&self.staging_path(id))?;
        self.catalog.pending.push(id);
        self.catalog.open_container = self.catalog.next_container;
        self.catalog.next_container += 1;
        self.catalog.open_bytes = 0;
        Ok(())
    }

    fn seal_pending(&mut self) -> Result<()> {
        let ids = std::mem::take(&mut self.catalog.pending);
        for chunk in ids.chunks(self.config.batch_containers()) {
            self.seal_batch(chunk)?;
        }
        Ok(())
    }

    /// Seals the open container (if it holds bytes) and every pending one.
    pub fn seal(&mut self) -> Result<()> {
        self.latching(|store| {
            store.seal_open_and_pending()?;
            store.save_catalog()
        })
    }

    /// Seals the open container (if it holds bytes) and every pending
    /// one, without saving the catalog.
    fn seal_open_and_pending(&mut self) -> Result<()> {
        if self.catalog.open_bytes > 0 {
            self.move_open_to_pending()?;
        }
        self.seal_pending()
    }

    pub fn object(&self, name: &str) -> Result<&ObjectRecord> {
        self.catalog
            .objects
            .get(name)
            .ok_or_else(|| Error::InvalidRequest(format!("no object {name:?}")))
    }

    fn location(&self, container: u32) -> Location<'_> {
        match self.container_batch.get(&container) {
            Some(b) => Location::Sealed(&self.batches[b]),
            None => Location::Staging,
        }
    }

    /// Fills `buf` with object `name`'s bytes from `offset`.
    pub fn read(&self, name: &str, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_latch()?;
        let record = self.object(name)?;
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|end| end > record.size) {
            return Err(Error::OutOfRange {
                offset,
                length: buf.len() as u64,
                size: record.size,
            });
        }
        let mut object_at = 0u64;
        let mut filled = 0usize;
        for extent in &record.extents {
            let (start, stop) = (object_at, object_at + extent.length);
            object_at = stop;
            let want_start = offset + filled as u64;
            if filled == buf.len() {
                break;
            }
            if stop <= want_start {
                continue;
            }
            let take = ((stop - want_start) as usize).min(buf.len() - filled);
            let in_container = extent.offset + (want_start - start);
            self.read_container(
                extent.container,
                in_container,
                &mut buf[filled..filled + take],
            )?;
            filled += take;
        }
        assert_eq!(filled, buf.len(), "extents cover the object");
        Ok(())
    }

    /// The whole object.
    pub fn get(&self, name: &str) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; self.object(name)?.size as usize];
        self.read(name, 0, &mut buf)?;
        Ok(buf)
    }

    fn read_container(&self, container: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        match self.location(container) {
            Location::Staging => {
                let path = self.staging_path(container);
                if !self.disk.read_at(&path, offset, buf)? {
                    return Err(Error::Corrupt(format!(
                        "staging file {} is shorter than the catalog says",
                        path.display()
                    )));
                }
                Ok(())
            }
            // The compact layout (and content-defined chunks) read block
            // by block through the map; the paper layout's sub-files hold
            // every block in place, read by spans.
            Location::Sealed(map)
                if map.layout != map::Layout::Paper
                    || self.config.chunk_kind() != ChunkKind::Fixed =>
            {
                self.read_sealed(container, offset, buf, 0)
            }
            Location::Sealed(map) => {
                let block = self.config.block_bytes as u64;
                let c = map.container(container).expect("indexed container");
                let sub_file_bytes = c.blocks_per_sub_file as u64 * block;
                let mut done = 0usize;
                while done < buf.len() {
                    let at = offset + done as u64;
                    let within = at % sub_file_bytes;
                    let take = ((sub_file_bytes - within) as usize).min(buf.len() - done);
                    self.read_span(
                        container,
                        (at / sub_file_bytes) as u8,
                        within,
                        &mut buf[done..done + take],
                    )?;
                    done += take;
                }
                Ok(())
            }
        }
    }

    /// Objects, by name.
    pub fn list(&self) -> Vec<ObjectInfo> {
        let block = self.config.block_bytes as u64;
        self.catalog
            .objects
            .iter()
            .map(|(name, record)| {
                let mut info = ObjectInfo {
                    name: name.clone(),
                    size: record.size,
                    unsealed_bytes: 0,
                    blocks: 0,
                    redundant_blocks: 0,
                };
                for e in &record.extents {
                    match self.location(e.container) {
                        Location::Staging => info.unsealed_bytes += e.length,
                        Location::Sealed(map) => {
                            let c = map.container(e.container).expect("indexed");
                            let n = c.blocks_per_sub_file as u64;
                            if e.length == 0 {
                                continue;
                            }
                            // Within the container (validate_catalog), so
                            // every block is in the map.
                            for b in e.offset / block..=(e.offset + e.length - 1) / block {
                                let entry = c
                                    .sub_files
                                    .get((b / n) as usize)
                                    .and_then(|s| s.blocks.get((b % n) as usize));
                                info.blocks += 1;
                                info.redundant_blocks += entry.is_some_and(|e| e.redundant) as u64;
                            }
                        }
                    }
                }
                info
            })
            .collect()
    }

    /// Deletes object `name` and reclaims the batches nothing refers to.
    pub fn remove(&mut self, name: &str) -> Result<()> {
        self.check_latch()?;
        self.object(name)?;
        self.latching(|store| {
            store.catalog.objects.remove(name);
            store.save_catalog()?;
            store.collect_garbage()?;
            Ok(())
        })
    }

    /// Batches still needed: those holding a byte of a live object, and
    /// (transitively) those holding the source of a needed batch's
    /// redundant block.
    fn live_batches(&self) -> BTreeSet<u32> {
        let mut live: BTreeSet<u32> = self
            .catalog
            .objects
            .values()
            .flat_map(|r| r.extents.iter())
            .filter_map(|e| self.container_batch.get(&e.container).copied())
            .collect();
        let mut todo: Vec<u32> = live.iter().copied().collect();
        while let Some(b) = todo.pop() {
            for src in self.batches[&b].source_containers() {
                if let Some(&sb) = self.container_batch.get(&src) {
                    if live.insert(sb) {
                        todo.push(sb);
                    }
                }
            }
        }
        live
    }

    /// Deletes dead batches: the map first (the batch is gone), then its
    /// files. Returns the containers reclaimed.
    fn collect_garbage(&mut self) -> Result<u64> {
        let live = self.live_batches();
        let dead: Vec<u32> = self
            .batches
            .keys()
            .filter(|b| !live.contains(b))
            .copied()
            .collect();
        let mut reclaimed = 0;
        let mut folders = BTreeSet::new();
        // Newest first: a redundant block's source is in its own batch or
        // one sealed before it (batch ids grow in sealing order), so a cut
        // part way leaves no batch whose sources are gone (its redundant
        // blocks would be unrecoverable with a device out).
        for b in dead.into_iter().rev() {
            let map = self.batches.remove(&b).expect("listed");
            self.disk
                .remove(&self.dir.join(MAPS_DIR).join(map_name(b)))?;
            self.disk.sync_dir(&self.dir.join(MAPS_DIR))?;
            for c in &map.containers {
                self.container_batch.remove(&c.id);
                reclaimed += 1;
            }
            for path in self.batch_files(&map) {
                let folder = path.parent().expect("device files live in a folder");
                if self.disk.is_dir(folder) {
                    self.disk.remove(&path)?;
                    folders.insert(folder.to_path_buf());
                }
            }
        }
        // The space is reclaimed for good (a cut before this leaves the
        // files as orphans, which scrub finds and removes).
        for folder in &folders {
            self.disk.sync_dir(folder)?;
        }
        if reclaimed > 0 {
            let sealed = &self.container_batch;
            self.cache.retain_containers(|c| sealed.contains_key(&c));
            self.save_cache()?;
        }
        Ok(reclaimed)
    }

    /// Every data and parity file a batch has on the devices.
    fn batch_files(&self, map: &BatchMap) -> Vec<PathBuf> {
        let mut files = self.map_copy_paths(map.batch);
        for c in &map.containers {
            for (j, s) in c.sub_files.iter().enumerate() {
                files.push(
                    self.device_dir(s.device as usize)
                        .join(sub_file_name(c.id, j as u8)),
                );
            }
        }
        for (g, group) in map.groups.iter().enumerate() {
            for (i, &d) in group.parity_devices.iter().enumerate() {
                files.push(
                    self.device_dir(d as usize)
                        .join(parity_name(map.group_id(g), i)),
                );
            }
        }
        files
    }

    pub fn stats(&self) -> ArchiveStats {
        let block = self.config.block_bytes as u64;
        let m = self.config.m as u64;
        let mut s = ArchiveStats {
            objects: self.catalog.objects.len() as u64,
            object_bytes: self.catalog.objects.values().map(|r| r.size).sum(),
            batches: self.batches.len() as u64,
            cache_entries: self.cache.entries() as u64,
            cache_bytes: self.cache.bytes(),
            cache_hits: self.cache.hits,
            cache_misses: self.cache.misses,
            cache_evictions: self.cache.evictions,
            ..Default::default()
        };
        s.containers_unsealed = self.catalog.pending.len() as u64;
        s.unsealed_bytes = self.catalog.pending.len() as u64 * self.config.container_bytes;
        if self.catalog.open_bytes > 0 {
            s.containers_unsealed += 1;
            s.unsealed_bytes += self.catalog.open_bytes;
        }
        for map in self.batches.values() {
            s.map_bytes += map.encode().len() as u64;
            for c in &map.containers {
                s.containers_sealed += 1;
                s.sealed_data_bytes += c.data_bytes;
                s.stripes += c.blocks_per_sub_file as u64;
                for sub in &c.sub_files {
                    s.blocks += sub.blocks.len() as u64;
                    s.unique_blocks += sub.unique_blocks() as u64;
                    s.stored_data_bytes += sub.stored_blocks(self.config.layout) as u64 * block;
                }
                s.chunks += c.chunks.len() as u64;
                s.redundant_chunks += c.chunks.iter().filter(|e| e.source.is_some()).count() as u64;
            }
            s.stripes_encoded += map.groups.iter().map(|g| g.encoded as u64).sum::<u64>();
        }
        s.redundant_blocks = s.blocks - s.unique_blocks;
        s.parity_bytes = s.stripes_encoded * m * block;
        s.plain_parity_bytes = s.stripes * m * block;
        if s.plain_parity_bytes > 0 {
            s.parity_saving_percent =
                100.0 * (1.0 - s.parity_bytes as f64 / s.plain_parity_bytes as f64);
        }
        s
    }
}

/// The devices that hold a copy of batch `batch`'s map: m + 1 of them,
/// rotated by the batch id, so that any m lost devices leave one.
fn map_copy_paths(dir: &Path, config: &ArchiveConfig, batch: u32) -> Vec<PathBuf> {
    let n = config.devices.len();
    (0..=config.m)
        .map(|i| {
            dir.join(&config.devices[(batch as usize + i) % n])
                .join(map_name(batch))
        })
        .collect()
}

/// The config, from the copies on the devices, when the folder's fails
/// (`why`). The devices are looked for where the folder's config names
/// them, if it still parses, else at the default `dev0`, `dev1`, ...; the
/// good copy of the highest generation is taken, with each device where
/// it was found.
fn recover_config(disk: &Disk, dir: &Path, why: &str) -> Result<ArchiveConfig> {
    let folder = dir.join(CONFIG_FILE);
    let named: Option<Vec<PathBuf>> = disk
        .read_all(&folder)?
        .and_then(|b| serde_json::from_slice::<ArchiveConfig>(&b).ok())
        .map(|c| c.devices);
    let candidates: Vec<PathBuf> = named.unwrap_or_else(|| {
        (0..)
            .map(|i| PathBuf::from(format!("dev{i}")))
            .take_while(|d| disk.is_dir(&dir.join(d)))
            .collect()
    });
    let mut best: Option<ArchiveConfig> = None;
    let mut found: Vec<(usize, PathBuf)> = Vec::new();
    for device in &candidates {
        let path = dir.join(device);
        let marker = read_json::<DeviceMarker>(disk, &path.join(DEVICE_MARKER))
            .ok()
            .flatten();
        let copy = meta::read::<ArchiveConfig>(disk, &path.join(CONFIG_FILE))?.usable(false);
        let (Some(marker), Some(copy)) = (marker, copy) else {
            continue;
        };
        if marker.archive != copy.uuid || marker.position >= copy.devices.len() {
            continue;
        }
        if best.as_ref().is_some_and(|b| b.uuid != copy.uuid) {
            return Err(Error::Corrupt(format!(
                "{}: {why}, and the devices' copies are of different archives",
                folder.display()
            )));
        }
        found.push((marker.position, device.clone()));
        if best.as_ref().is_none_or(|b| copy.generation > b.generation) {
            best = Some(copy);
        }
    }
    let mut config = best.ok_or_else(|| {
        Error::Corrupt(format!(
            "{}: {why}, and no device holds a good copy (move it aside and run `archive assemble`)",
            folder.display()
        ))
    })?;
    for (position, device) in found {
        config.devices[position] = device;
    }
    Ok(config)
}

/// The committed catalog: the folder's, or when it fails its checksum
/// (or is missing), the good copy of the highest generation on the devices
/// in place (then why the folder's was not taken: it must be committed
/// again).
fn load_catalog(
    disk: &Disk,
    dir: &Path,
    config: &ArchiveConfig,
    missing_devices: &[usize],
    legacy: bool,
) -> Result<(Catalog, Option<String>)> {
    let folder = dir.join(CATALOG_FILE);
    let checked = meta::read::<Catalog>(disk, &folder)?;
    let Some(why) = checked.fault(legacy) else {
        return Ok((checked.usable(legacy).expect("no fault"), None));
    };
    let mut best: Option<Catalog> = None;
    for (position, device) in config.devices.iter().enumerate() {
        if missing_devices.contains(&position) {
            continue;
        }
        let path = dir.join(device).join(CATALOG_FILE);
        let copy = match disk.read_all(&path) {
            Ok(Some(bytes)) => meta::decode::<Catalog>(&bytes).usable(legacy),
            _ => None,
        };
        if let Some(c) = copy {
            if best.as_ref().is_none_or(|b| c.generation > b.generation) {
                best = Some(c);
            }
        }
    }
    match best {
        Some(c) => Ok((c, Some(why.to_string()))),
        None => Err(Error::Corrupt(format!(
            "{}: {why}, and no device holds a good copy",
            folder.display()
        ))),
    }
}

/// A map that decodes with its CRC and agrees with the archive's config.
fn check_map(config: &ArchiveConfig, bytes: &[u8], name: &str) -> Result<BatchMap> {
    let map = BatchMap::decode(bytes, name)?;
    if map.k as usize != config.k
        || map.m as usize != config.m
        || map.block_bytes != config.block_bytes
    {
        return Err(Error::Corrupt(format!(
            "archive map {name}: geometry differs from the archive's"
        )));
    }
    if map.layout != config.layout || map.chunking != config.chunk_kind() {
        return Err(Error::Corrupt(format!(
            "archive map {name}: layout or chunking differs from the archive's"
        )));
    }
    if map_name(map.batch) != name {
        return Err(Error::Corrupt(format!(
            "archive map {name}: holds batch {}",
            map.batch
        )));
    }
    Ok(map)
}

/// Map `name` of the folder; when it fails its checks, a good copy from
/// the devices replaces it (the batch exists: its map is in the folder),
/// said in `recovered`.
fn load_map(
    disk: &Disk,
    dir: &Path,
    config: &ArchiveConfig,
    name: &str,
    recovered: &mut Vec<String>,
) -> Result<BatchMap> {
    let path = dir.join(MAPS_DIR).join(name);
    let bytes = disk.read_all(&path)?.unwrap_or_default();
    let folder_error = match check_map(config, &bytes, name) {
        Ok(map) => return Ok(map),
        Err(e) => e,
    };
    let batch = name
        .strip_prefix('b')
        .and_then(|n| n.strip_suffix(".map"))
        .and_then(|n| u32::from_str_radix(n, 16).ok());
    for copy in batch.map_or_else(Vec::new, |b| map_copy_paths(dir, config, b)) {
        let Ok(Some(bytes)) = disk.read_all(&copy) else {
            continue;
        };
        if let Ok(map) = check_map(config, &bytes, name) {
            disk.write_durable(&path, &bytes)?;
            recovered.push(format!(
                "{}: {folder_error}; taken from {} and written again",
                path.display(),
                copy.display()
            ));
            return Ok(map);
        }
    }
    Err(Error::Corrupt(format!(
        "{folder_error}; no device holds a good copy"
    )))
}

/// Checks the catalog's structure against the maps and the config: every
/// extent lies within a sealed container's data bytes or a staged
/// container's committed bytes, and each object's extents add up to its
/// size; so no read or listing goes out of bounds, whatever its content.
fn validate_catalog(
    catalog: &Catalog,
    config: &ArchiveConfig,
    batches: &BTreeMap<u32, BatchMap>,
    container_batch: &HashMap<u32, u32>,
) -> Result<()> {
    let bad = |what: String| Err(Error::Corrupt(format!("archive catalog: {what}")));
    if catalog.open_bytes > config.container_bytes {
        return bad(format!(
            "the open container holds {} bytes, more than a container's {}",
            catalog.open_bytes, config.container_bytes
        ));
    }
    let mut pending = BTreeSet::new();
    for &id in &catalog.pending {
        if id == catalog.open_container || !pending.insert(id) {
            return bad(format!("container {id} is listed twice as unsealed"));
        }
    }
    for (name, record) in &catalog.objects {
        let mut size = 0u64;
        for (i, e) in record.extents.iter().enumerate() {
            let limit = match container_batch.get(&e.container) {
                Some(b) => {
                    batches[b]
                        .container(e.container)
                        .expect("indexed container")
                        .data_bytes
                }
                None if e.container == catalog.open_container => catalog.open_bytes,
                None if pending.contains(&e.container) => config.container_bytes,
                None => {
                    return bad(format!(
                        "object {name:?} extent {i}: container {} is neither sealed nor staged",
                        e.container
                    ))
                }
            };
            let end = e.offset.checked_add(e.length);
            if end.is_none_or(|end| end > limit) {
                return bad(format!(
                    "object {name:?} extent {i}: bytes {}+{} past the {limit} bytes of container {}",
                    e.offset, e.length, e.container
                ));
            }
            size = size.saturating_add(e.length);
        }
        if size != record.size {
            return bad(format!(
                "object {name:?}: its extents hold {size} bytes, its size is {}",
                record.size
            ));
        }
    }
    Ok(())
}

fn write_marker(disk: &Disk, path: &Path, uuid: &str, position: usize) -> Result<()> {
    disk.create_dir(path)?;
    write_json(
        disk,
        &path.join(DEVICE_MARKER),
        &DeviceMarker {
            archive: uuid.to_string(),
            position,
        },
    )
}

fn write_json<T: Serialize>(disk: &Disk, path: &Path, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(value).expect("serializable");
    disk.write_durable(path, &bytes)
}

fn read_json<T: for<'de> Deserialize<'de>>(disk: &Disk, path: &Path) -> Result<Option<T>> {
    match disk.read_all(path)? {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Corrupt(format!("{}: {e}", path.display()))),
    }
}

/// Reads until `buf` is full or the source ends; the bytes read.
fn read_full(source: &mut dyn Read, buf: &mut [u8]) -> Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match source.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("read the object's source", e)),
        }
    }
    Ok(got)
}

/// Loads a saved cache; a missing or corrupt file is an empty cache (it is
/// only a cache).
fn load_cache(
    disk: &Disk,
    path: &Path,
    algorithm: Algorithm,
    cache: &mut FingerprintCache,
) -> Result<()> {
    let Some(bytes) = disk.read_all(path)? else {
        return Ok(());
    };
    if bytes.len() < 4 {
        return Ok(());
    }
    let (body, tail) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(tail.try_into().expect("4 bytes")) {
        return Ok(());
    }
    let digest = algorithm.digest_bytes();
    let record = 1 + digest + 9;
    for r in body.chunks(record) {
        if r.len() != record || r[0] as usize != digest {
            return Ok(());
        }
        let Ok(fp) = Fingerprint::from_slice(&r[1..1 + digest]) else {
            return Ok(());
        };
        let at = 1 + digest;
        cache.insert(
            fp,
            BlockAddress {
                container: u32::from_le_bytes(r[at..at + 4].try_into().expect("4")),
                sub_file: r[at + 4],
                column: u32::from_le_bytes(r[at + 5..at + 9].try_into().expect("4")),
            },
        );
    }
    Ok(())
}
