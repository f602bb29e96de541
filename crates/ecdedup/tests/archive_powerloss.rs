//! Power loss in the archive tier: random `put`, `rm`, `seal`, `gc` and
//! `scrub --repair` calls (and at the end of each schedule the archive
//! folder lost and assembled again from the devices) through the real archive code over the power-loss
//! simulator (`media/powerloss.rs`), with the power cut at a random storage
//! operation (a write, a sync, a create, a rename, a removal: whichever
//! comes n-th), after which every unsynced write is dropped, kept or torn
//! and reordered, and every folder's unsynced names are kept or reverted.
//! Besides the cuts ([`Hazards`]): in a fifth of the rounds a file's next
//! sync fails with EIO (the store must latch), and in a tenth a device
//! folder is taken away and the round starts with the `scrub --repair`
//! that writes it again, under the same cut.
//!
//! The oracle, after every reopen:
//! - every object whose `put` returned `Ok` reads back bit-exact, and every
//!   object whose `rm` returned `Ok` is gone (each call commits the catalog
//!   durably before it returns, so each `Ok` is a sync point);
//! - the object of an interrupted `put` or `rm` is wholly there (bit-exact)
//!   or wholly absent; an interrupted `seal` or scrub changes no object;
//!   no other name appears;
//! - `scrub` (check only) finds nothing unrecoverable and, unless a device
//!   is out, no bad block and no bad parity block: only leftovers (orphan
//!   files, unreferenced containers) that it can reclaim; only the device
//!   taken away may be missing, and every object reads back (decoded)
//!   while it is;
//! - after `scrub --repair` (every other reopen, and at the end), a second
//!   scrub finds nothing at all, and nothing is leaked: the archive folder
//!   holds only its config, catalog and cache, `maps/` exactly one map per
//!   batch, `staging/` exactly the unsealed bytes, and every device file is
//!   named by a map (scrub's orphan count).
//!
//! `ECDEDUP_ARCHIVE_POWERLOSS_SCHEDULES=N` sets the schedule count
//! (`scripts/powerloss.sh --long` runs many more);
//! `ECDEDUP_ARCHIVE_POWERLOSS_SEED=S` replays one schedule.

use ecdedup::archive::{ArchiveStore, CreateOptions};
use ecdedup::media::storage::StorageLock;
use ecdedup::media::{PowerLossStorage, Storage, StorageFile};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use crate::support;

const BLOCK_BYTES: usize = 512;
const K: usize = 3;
const M: usize = 2;
const DEVICES: usize = 6;
/// Four stripes of k blocks.
const CONTAINER_BYTES: u64 = (K * BLOCK_BYTES * 4) as u64;
/// Power cuts per schedule.
const CUTS: u64 = 8;
/// Schedules in CI: 200 x 8 = 1,600 cuts.
const SCHEDULES_DEFAULT: u64 = 200;
/// Calls made between two cuts, at most.
const CALLS_MAX: u64 = 6;
/// The power goes after a number of storage operations drawn below this
/// (a `put` that seals a batch takes a hundred or more).
const OPS_BEFORE_CUT_MAX: u64 = 240;
/// Objects kept at most (more and the schedule removes instead).
const OBJECTS_MAX: usize = 10;
/// Distinct blocks the planted duplicates are drawn from.
const POOL_BLOCKS: usize = 6;

/// Rounds in which one file's next sync fails with EIO.
const SYNC_FAULT_PROBABILITY: f64 = 0.2;
/// Which file's: the staging file, the temporaries of the catalog, the
/// cache, a map, data sub-file or parity file 0 or 1.
const SYNC_FAULT_SUFFIXES: [&str; 6] = [
    ".data",
    "catalog.json.tmp",
    "fpcache.bin.tmp",
    ".map.tmp",
    ".0.tmp",
    ".1.tmp",
];

/// Of the calls drawn as `seal`, the share made `gc` instead, and its
/// threshold (high, so most batches with a dead byte are rewritten).
const GC_PROBABILITY: f64 = 0.5;
const GC_LIVE_BELOW_PERCENT: f64 = 90.0;

/// Rounds that start by taking a device away.
const DEVICE_LOSS_PROBABILITY: f64 = 0.1;

/// No cut armed.
const UNARMED: u64 = u64::MAX;

/// A storage whose power goes after a set number of mutating operations:
/// that operation and every later one fails before it reaches the
/// simulator (reads still work, as they would from the page cache of a
/// process that has not noticed yet). The test then cuts the simulator's
/// power, which decides what the unsynced writes and names become.
struct CutStorage {
    inner: Arc<dyn Storage>,
    switch: Arc<Switch>,
}

struct Switch {
    /// Mutating operations left before the cut; UNARMED: none planned.
    left: AtomicU64,
    /// Mutating operations that reached the simulator, over all time.
    done: AtomicU64,
    /// A disk that lies: file and folder syncs return Ok and do nothing
    /// (to prove the oracle catches what such a disk loses).
    lying: AtomicBool,
}

impl Switch {
    fn step(&self) -> io::Result<()> {
        let r = self.left.fetch_update(SeqCst, SeqCst, |n| match n {
            UNARMED => Some(UNARMED),
            0 => None,
            n => Some(n - 1),
        });
        match r {
            Ok(_) => {
                self.done.fetch_add(1, SeqCst);
                Ok(())
            }
            Err(_) => Err(io::Error::other("power cut (simulated)")),
        }
    }

    fn arm(&self, ops: Option<u64>) {
        self.left.store(ops.unwrap_or(UNARMED), SeqCst);
    }

    fn fired(&self) -> bool {
        self.left.load(SeqCst) == 0
    }
}

struct CutFile {
    inner: Arc<dyn StorageFile>,
    switch: Arc<Switch>,
}

impl StorageFile for CutFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.switch.step()?;
        self.inner.write_at(buf, offset)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.switch.step()?;
        self.inner.set_len(len)
    }
    fn sync(&self) -> io::Result<()> {
        self.switch.step()?;
        if self.switch.lying.load(SeqCst) {
            return Ok(());
        }
        self.inner.sync()
    }
    fn reserve(&self, len: u64) -> io::Result<()> {
        self.switch.step()?;
        self.inner.reserve(len)
    }
    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        self.switch.step()?;
        self.inner.punch(offset, len)
    }
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.switch.step()?;
        self.inner.zero_range(offset, len)
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        self.switch.step()?;
        self.inner.allocate(len)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

impl CutStorage {
    fn wrap(&self, f: Arc<dyn StorageFile>) -> Arc<dyn StorageFile> {
        Arc::new(CutFile {
            inner: f,
            switch: Arc::clone(&self.switch),
        })
    }
}

impl Storage for CutStorage {
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        Ok(self.wrap(self.inner.open(path)?))
    }
    fn create(&self, path: &Path, truncate: bool) -> io::Result<Arc<dyn StorageFile>> {
        self.switch.step()?;
        Ok(self.wrap(self.inner.create(path, truncate)?))
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.switch.step()?;
        self.inner.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.switch.step()?;
        self.inner.rename(from, to)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.switch.step()?;
        self.inner.create_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.switch.step()?;
        if self.switch.lying.load(SeqCst) {
            return Ok(());
        }
        self.inner.sync_dir(path)
    }
    fn try_lock(&self, path: &Path) -> io::Result<Option<StorageLock>> {
        self.inner.try_lock(path)
    }
    fn list_files(&self, path: &Path) -> io::Result<Vec<String>> {
        self.inner.list_files(path)
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.inner.is_dir(path)
    }
}

fn dir() -> PathBuf {
    PathBuf::from("/sim/archive")
}

fn options(exchange: u32) -> CreateOptions {
    support::archive::options(K, M, BLOCK_BYTES, DEVICES, CONTAINER_BYTES, exchange)
}

/// The call a cut interrupted, and what it may leave.
#[derive(Debug)]
enum Interrupted {
    /// Wholly there or wholly absent.
    Put(String, Vec<u8>),
    /// Still there (bit-exact) or gone.
    Rm(String, Vec<u8>),
    /// No object changes.
    Other,
}

/// What a run saw, for the summary line and docs.
#[derive(Default, Debug)]
struct Tally {
    schedules: u64,
    cuts: u64,
    /// Cuts that fell inside a call (the rest fell between calls).
    cuts_inside_calls: u64,
    puts_kept: u64,
    puts_lost: u64,
    rms_kept: u64,
    rms_done: u64,
    /// `gc` calls made (finished or cut).
    gcs: u64,
    /// Batches the finished ones rewrote.
    gc_batches_rewritten: u64,
    /// Folders lost and assembled from the devices, and the objects with
    /// unsealed bytes that went with them.
    assembled: u64,
    objects_lost_with_folder: u64,
    unsynced_writes_at_cuts: u64,
    /// Leftovers scrub found right after a reopen (reclaimable).
    orphan_files: u64,
    unreferenced_containers: u64,
    repairs: u64,
    /// Rounds in which a file's next sync was set to fail, and calls that
    /// failed on it (the store latched, then the power went).
    sync_faults_armed: u64,
    calls_failed_by_sync: u64,
    /// Devices taken away (each made again by a repair under the cuts).
    devices_lost: u64,
}

/// An object of `blocks` whole blocks plus a tail, with planted
/// duplicates: blocks of a small pool (within and across containers) and
/// blocks of objects already stored.
fn object_bytes(rng: &mut StdRng, pool: &[Vec<u8>], stored: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let blocks = rng.gen_range(0..=3 * CONTAINER_BYTES as usize / BLOCK_BYTES);
    let mut out = Vec::new();
    for _ in 0..blocks {
        match rng.gen_range(0..4) {
            0 => out.extend_from_slice(&pool[rng.gen_range(0..pool.len())]),
            1 if !stored.is_empty() => {
                let o = stored.values().nth(rng.gen_range(0..stored.len())).unwrap();
                let whole = o.len() / BLOCK_BYTES;
                if whole > 0 {
                    let b = rng.gen_range(0..whole) * BLOCK_BYTES;
                    out.extend_from_slice(&o[b..b + BLOCK_BYTES]);
                } else {
                    out.extend_from_slice(&pool[0]);
                }
            }
            _ => {
                let mut b = vec![0u8; BLOCK_BYTES];
                rng.fill(&mut b[..]);
                out.extend_from_slice(&b);
            }
        }
    }
    let tail = rng.gen_range(0..BLOCK_BYTES);
    let mut t = vec![0u8; tail];
    rng.fill(&mut t[..]);
    out.extend_from_slice(&t);
    out
}

fn open(storage: &Arc<dyn Storage>, what: &str) -> ArchiveStore {
    ArchiveStore::open_in(Arc::clone(storage), &dir())
        .unwrap_or_else(|e| panic!("{what}: open after the power cut failed: {e}"))
}

/// Checks the reopened archive against the model (see the module comment)
/// and settles the interrupted call.
fn check(
    store: &mut ArchiveStore,
    model: &mut BTreeMap<String, Vec<u8>>,
    interrupted: Option<Interrupted>,
    lost: Option<usize>,
    what: &str,
    tally: &mut Tally,
) {
    assert!(
        store.missing_devices().iter().all(|&d| Some(d) == lost),
        "{what}: devices {:?} missing, lost: {lost:?}",
        store.missing_devices()
    );
    let names: Vec<String> = store.list().into_iter().map(|o| o.name).collect();
    let settled = match interrupted {
        Some(Interrupted::Put(name, bytes)) => Some((true, name, bytes)),
        Some(Interrupted::Rm(name, bytes)) => Some((false, name, bytes)),
        Some(Interrupted::Other) | None => None,
    };
    if let Some((put, name, bytes)) = settled {
        let there = names.contains(&name);
        if there {
            model.insert(name, bytes);
        }
        let counter = match (put, there) {
            (true, true) => &mut tally.puts_kept,
            (true, false) => &mut tally.puts_lost,
            (false, true) => &mut tally.rms_kept,
            (false, false) => &mut tally.rms_done,
        };
        *counter += 1;
    }
    let expected: Vec<String> = model.keys().cloned().collect();
    assert_eq!(names, expected, "{what}: the objects differ");
    for (name, bytes) in model.iter() {
        let got = store
            .get(name)
            .unwrap_or_else(|e| panic!("{what}: get {name}: {e}"));
        assert!(got == *bytes, "{what}: object {name} reads back wrong");
    }
    let report = store
        .scrub(false)
        .unwrap_or_else(|e| panic!("{what}: scrub: {e}"));
    assert_eq!(report.unrecoverable_blocks, 0, "{what}: {report:?}");
    if lost.is_none() {
        assert_eq!(
            (report.bad_blocks, report.bad_parity_blocks),
            (0, 0),
            "{what}: scrub after the reopen: {report:?}"
        );
    }
    tally.orphan_files += report.orphan_files;
    tally.unreferenced_containers += report.unreferenced_containers;
}

/// `scrub --repair`, then: a second scrub finds nothing, and nothing is
/// leaked (see the module comment).
fn repair_and_check_leaks(store: &mut ArchiveStore, storage: &Arc<dyn Storage>, what: &str) {
    let repair = store
        .scrub(true)
        .unwrap_or_else(|e| panic!("{what}: scrub --repair: {e}"));
    assert_eq!(repair.unrecoverable_blocks, 0, "{what}: {repair:?}");
    let after = store.scrub(false).unwrap();
    assert_eq!(
        after,
        ecdedup::archive::ScrubReport {
            blocks_checked: after.blocks_checked,
            parity_blocks_checked: after.parity_blocks_checked,
            ..Default::default()
        },
        "{what}: scrub after scrub --repair"
    );
    let list = |d: &Path| storage.list_files(d).unwrap();
    let root = list(&dir());
    assert!(
        root.iter()
            .all(|n| ["archive.json", "catalog.json", "fpcache.bin"].contains(&n.as_str())),
        "{what}: leaked in the archive folder: {root:?}"
    );
    let stats = store.stats();
    let maps = list(&dir().join("maps"));
    assert_eq!(maps.len() as u64, stats.batches, "{what}: maps {maps:?}");
    assert!(maps
        .iter()
        .all(|n| n.ends_with(".map") && !n.starts_with('.')));
    let staging: u64 = list(&dir().join("staging"))
        .iter()
        .map(|n| {
            storage
                .open(&dir().join("staging").join(n))
                .unwrap()
                .len()
                .unwrap()
        })
        .sum();
    assert_eq!(
        staging, stats.unsealed_bytes,
        "{what}: staging bytes against unsealed bytes"
    );
}

/// At the end of a schedule: the archive folder is lost (everything but
/// the device folders), `assemble` makes it again from the devices'
/// copies, and every committed object reads back bit-exact except those
/// with bytes in the unsealed container, which it must name as lost; a
/// repair then leaves nothing to find.
fn lose_folder_and_assemble(
    store: ArchiveStore,
    sim: &PowerLossStorage,
    storage: &Arc<dyn Storage>,
    model: &BTreeMap<String, Vec<u8>>,
    what: &str,
    tally: &mut Tally,
) {
    let unsealed: Vec<String> = store
        .list()
        .into_iter()
        .filter(|o| o.unsealed_bytes > 0)
        .map(|o| o.name)
        .collect();
    drop(store);
    for name in storage.list_files(&dir()).unwrap() {
        storage.remove(&dir().join(name)).unwrap();
    }
    sim.remove_dir_all(&dir().join("maps"));
    sim.remove_dir_all(&dir().join("staging"));
    let devices: Vec<PathBuf> = (0..DEVICES)
        .rev()
        .map(|d| dir().join(format!("dev{d}")))
        .collect();
    let report = ArchiveStore::assemble_in(Arc::clone(storage), &dir(), &devices)
        .unwrap_or_else(|e| panic!("{what}: assemble: {e}"));
    assert_eq!(report.objects_lost, unsealed, "{what}: {report:?}");
    let mut store = open(storage, what);
    for (name, bytes) in model {
        if !unsealed.contains(name) {
            assert!(
                store.get(name).ok().as_ref() == Some(bytes),
                "{what}: {name} after assemble"
            );
        }
    }
    assert_eq!(store.list().len() + unsealed.len(), model.len(), "{what}");
    repair_and_check_leaks(&mut store, storage, &format!("{what}, assembled"));
    tally.assembled += 1;
    tally.objects_lost_with_folder += unsealed.len() as u64;
}

/// A fresh simulator, its power switch, and the storage through both.
fn simulated() -> (PowerLossStorage, Arc<Switch>, Arc<dyn Storage>) {
    let sim = PowerLossStorage::new();
    let switch = Arc::new(Switch {
        left: AtomicU64::new(UNARMED),
        done: AtomicU64::new(0),
        lying: AtomicBool::new(false),
    });
    let storage: Arc<dyn Storage> = Arc::new(CutStorage {
        inner: sim.shared(),
        switch: Arc::clone(&switch),
    });
    (sim, switch, storage)
}

/// What a schedule throws at the archive besides power cuts.
#[derive(Clone, Copy, Debug)]
struct Hazards {
    /// A file's next sync fails (EIO) in some rounds.
    sync_faults: bool,
    /// A device folder is taken away in some rounds, and `scrub --repair`
    /// (under the same power cuts) makes it again.
    device_loss: bool,
    /// Every sync does nothing (the harness must then fail).
    lying: bool,
}

const ALL_HAZARDS: Hazards = Hazards {
    sync_faults: true,
    device_loss: true,
    lying: false,
};

/// Power cuts alone: the schedules as they were when the seeds below
/// found their bugs.
const CUTS_ONLY: Hazards = Hazards {
    sync_faults: false,
    device_loss: false,
    lying: false,
};

fn run_schedule(seed: u64, tally: &mut Tally) {
    run_schedule_on(seed, ALL_HAZARDS, tally)
}

/// One schedule.
fn run_schedule_on(seed: u64, hazards: Hazards, tally: &mut Tally) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = StdRng::seed_from_u64(seed ^ 0x5eed_fa17);
    // Whether a drawn `seal` is a `gc` instead (its own generator, as
    // `faults`, for the same reason).
    let mut gcs = StdRng::seed_from_u64(seed ^ 0x6c_0117);
    let exchange = [0, 2, 4][rng.gen_range(0..3)];
    let story = format!("seed {seed} (exchange {exchange})");
    let (sim, switch, storage) = simulated();
    drop(ArchiveStore::create_in(Arc::clone(&storage), &dir(), &options(exchange)).unwrap());
    switch.lying.store(hazards.lying, SeqCst);
    let pool: Vec<Vec<u8>> = (0..POOL_BLOCKS)
        .map(|_| {
            let mut b = vec![0u8; BLOCK_BYTES];
            rng.fill(&mut b[..]);
            b
        })
        .collect();
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut interrupted: Option<Interrupted> = None;
    // The device taken away and not yet repaired.
    let mut lost: Option<usize> = None;
    let mut next_name = 0u64;
    for cut in 0..=CUTS {
        let what = format!("{story}, after cut {cut}");
        let mut store = open(&storage, &what);
        if trace() {
            let l = |d: &str| storage.list_files(&dir().join(d)).unwrap_or_default();
            eprintln!(
                "{what}: reopened: {} unsealed bytes, staging {:?}, maps {:?}, catalog {}",
                store.stats().unsealed_bytes,
                l("staging"),
                l("maps"),
                String::from_utf8_lossy(&sim.read_file(&dir().join("catalog.json")).unwrap())
                    .replace(char::is_whitespace, "")
            );
        }
        check(
            &mut store,
            &mut model,
            interrupted.take(),
            lost,
            &what,
            tally,
        );
        if cut % 2 == 1 || cut == CUTS {
            repair_and_check_leaks(&mut store, &storage, &what);
            tally.repairs += 1;
            lost = None;
        }
        if cut == CUTS {
            lose_folder_and_assemble(store, &sim, &storage, &model, &what, tally);
            break;
        }
        // A device pulled out: every object still reads back (decoded),
        // and the round starts with the repair that makes it again.
        if hazards.device_loss && lost.is_none() && faults.gen_bool(DEVICE_LOSS_PROBABILITY) {
            let d = faults.gen_range(0..DEVICES);
            drop(store);
            sim.remove_dir_all(&dir().join(format!("dev{d}")));
            lost = Some(d);
            tally.devices_lost += 1;
            store = open(&storage, &what);
            assert_eq!(store.missing_devices(), [d], "{what}");
            let what = format!("{what}, device {d} lost");
            check(&mut store, &mut model, None, lost, &what, tally);
        }
        // Calls until the power goes; in some rounds a file's next sync
        // fails first (EIO), which must latch the store (drawn from their
        // own generator, so the schedules of the seeds below stay as they
        // were when they found their bugs).
        switch.arm(Some(rng.gen_range(0..OPS_BEFORE_CUT_MAX)));
        let sync_fault = (hazards.sync_faults && faults.gen_bool(SYNC_FAULT_PROBABILITY))
            .then(|| SYNC_FAULT_SUFFIXES[faults.gen_range(0..SYNC_FAULT_SUFFIXES.len())]);
        if let Some(suffix) = sync_fault {
            sim.fail_next_sync(suffix);
            tally.sync_faults_armed += 1;
        }
        for i in 0..rng.gen_range(1..=CALLS_MAX) {
            let drawn = rng.gen_range(0..10);
            let call = if lost.is_some() && i == 0 { 9 } else { drawn };
            let (result, attempt) = if call < 5 && model.len() < OBJECTS_MAX {
                next_name += 1;
                let name = format!("o{next_name}");
                let bytes = object_bytes(&mut rng, &pool, &model);
                let r = store.put(&name, &mut &bytes[..]).map(|_| ());
                if r.is_ok() {
                    let got = store.get(&name).unwrap();
                    assert!(
                        got == bytes,
                        "{what}: {name} reads back wrong before the cut"
                    );
                    model.insert(name, bytes);
                    (r, None)
                } else {
                    (r, Some(Interrupted::Put(name, bytes)))
                }
            } else if call < 8 && !model.is_empty() {
                let name = model
                    .keys()
                    .nth(rng.gen_range(0..model.len()))
                    .unwrap()
                    .clone();
                let r = store.remove(&name);
                match r {
                    Ok(()) => {
                        model.remove(&name);
                        (r, None)
                    }
                    Err(_) => {
                        let bytes = model.remove(&name).unwrap();
                        (r, Some(Interrupted::Rm(name, bytes)))
                    }
                }
            } else if call < 9 && gcs.gen_bool(GC_PROBABILITY) {
                tally.gcs += 1;
                let r = store
                    .gc(GC_LIVE_BELOW_PERCENT)
                    .map(|report| tally.gc_batches_rewritten += report.batches_rewritten);
                (r, Some(Interrupted::Other))
            } else if call < 9 {
                (store.seal(), Some(Interrupted::Other))
            } else {
                let r = store.scrub(true).map(|_| ());
                if r.is_ok() {
                    lost = None;
                }
                (r, Some(Interrupted::Other))
            };
            if trace() {
                eprintln!(
                    "{what}: call {call} -> {result:?}, {} ops done, {} objects",
                    switch.done.load(SeqCst),
                    model.len()
                );
            }
            if let Err(e) = result {
                if switch.fired() {
                    tally.cuts_inside_calls += 1;
                } else {
                    assert!(
                        sync_fault.is_some(),
                        "{what}: a call failed with the power on: {e}"
                    );
                    tally.calls_failed_by_sync += 1;
                }
                interrupted = attempt;
                break;
            }
        }
        // The power goes (inside a call, or now between calls).
        switch.arm(None);
        drop(store);
        tally.unsynced_writes_at_cuts += sim.crash(rng.gen()).pending_writes;
        tally.cuts += 1;
    }
    tally.schedules += 1;
}

/// Replaying one seed prints every call.
fn trace() -> bool {
    std::env::var_os("ECDEDUP_ARCHIVE_POWERLOSS_SEED").is_some()
}

fn schedules() -> u64 {
    std::env::var("ECDEDUP_ARCHIVE_POWERLOSS_SCHEDULES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SCHEDULES_DEFAULT)
}

#[test]
fn power_cuts_during_put_rm_seal_and_repair_lose_nothing_committed_and_leak_nothing() {
    let mut tally = Tally::default();
    match std::env::var("ECDEDUP_ARCHIVE_POWERLOSS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => run_schedule(seed, &mut tally),
        None => {
            for s in 0..schedules() {
                run_schedule(s, &mut tally);
            }
        }
    }
    // One line that scripts/powerloss.sh collects.
    println!(
        "archive powerloss: schedules={} cuts={} inside_calls={} unsynced_writes_at_cuts={} \
         interrupted_puts_kept={} interrupted_puts_lost={} interrupted_rms_kept={} \
         interrupted_rms_done={} gcs={} gc_batches_rewritten={} assembled={} objects_lost_with_folder={} orphan_files_found={} unreferenced_containers_found={} \
         repairs={} sync_faults_armed={} calls_failed_by_sync={} devices_lost={} failures=0",
        tally.schedules,
        tally.cuts,
        tally.cuts_inside_calls,
        tally.unsynced_writes_at_cuts,
        tally.puts_kept,
        tally.puts_lost,
        tally.rms_kept,
        tally.rms_done,
        tally.gcs,
        tally.gc_batches_rewritten,
        tally.assembled,
        tally.objects_lost_with_folder,
        tally.orphan_files,
        tally.unreferenced_containers,
        tally.repairs,
        tally.sync_faults_armed,
        tally.calls_failed_by_sync,
        tally.devices_lost,
    );
    assert!(
        tally.cuts_inside_calls > 0,
        "the cuts must fall inside calls"
    );
    if tally.schedules > 20 {
        assert!(
            tally.gc_batches_rewritten > 0,
            "the schedules must call gc, and some gc must rewrite a batch"
        );
    }
}

/// Schedules that found a bug, replayed in CI; each failed before its fix.
/// - 6: a cut between the catalog's temporary and its rename left
///   `.catalog.json.tmp` in the archive folder, which nothing reported or
///   removed (a leak); scrub now counts the temporaries of the archive
///   folder and `maps/` as orphan files and `--repair` removes them.
/// - 78: a put sealed container 1 and died before its catalog write; open
///   moved the open container on in memory but left the old catalog
///   naming container 1 open with 3,042 bytes; `scrub --repair` reclaimed
///   the batch (no object needs it), and after the next cut the catalog
///   named a container with neither a map nor a staging file: `seal`
///   failed ("open .../staging/c00000001.data: entity not found"), and
///   container ids could be reused. Open now commits what it reconciles.
/// - 45 (all hazards): device 3 was taken away, and the cut stopped its
///   repair after the folder was made but before the marker was durable;
///   open then refused the archive ("is not device 3 ... foreign or blank
///   device"). Open now takes a folder holding nothing (but the marker's
///   temporary) for a missing device, which `scrub --repair` writes.
/// - 4347 (all hazards): `rm` reclaimed dead batches oldest first and the
///   cut stopped it after batch 1, leaving dead batches 3 and 4 whose
///   redundant blocks' sources were in batch 1; with device 5 taken away
///   scrub found a block unrecoverable. Reclaiming goes newest first now.
/// - 214 (all hazards, with the folder assembled at the end): a put was
///   cut after its catalog copies on the devices (ahead of the commit)
///   and before the commit; the reopen's reconcile committed a catalog of
///   the same generation as those copies, so the copies were taken for
///   current and `assemble` chose one naming the uncommitted object's
///   bytes as lost. Open now compares the copies' content and commits
///   above every copy's generation.
#[test]
fn schedules_that_found_bugs_run_clean() {
    for (seed, hazards) in [
        (6, CUTS_ONLY),
        (78, CUTS_ONLY),
        (45, ALL_HAZARDS),
        (4347, ALL_HAZARDS),
        (214, ALL_HAZARDS),
    ] {
        let mut tally = Tally::default();
        run_schedule_on(seed, hazards, &mut tally);
        assert_eq!(tally.cuts, CUTS);
    }
}

/// The harness can fail: over a disk whose syncs do nothing, committed
/// objects are lost at the cuts, and the oracle says so.
#[test]
fn a_disk_that_ignores_syncs_is_caught() {
    let caught = (0..8).any(|seed| {
        std::panic::catch_unwind(|| {
            run_schedule_on(
                seed,
                Hazards {
                    lying: true,
                    ..CUTS_ONLY
                },
                &mut Tally::default(),
            )
        })
        .is_err()
    });
    assert!(
        caught,
        "eight schedules over a lying disk passed the oracle"
    );
}

/// A cut at each storage operation of `create` in turn (each under 4
/// crash seeds) leaves either no archive, and `create` then succeeds, or a
/// whole empty one; either way the archive then stores and seals an object
/// and leaks nothing.
#[test]
fn a_power_cut_during_create_leaves_no_archive_or_a_whole_one() {
    let object: Vec<u8> = (0..3 * CONTAINER_BYTES as usize)
        .map(|i| (i * 7 / 512) as u8)
        .collect();
    let mut completed = false;
    for cut in 0u64.. {
        for seed in 0..4 {
            let what = format!("cut at operation {cut} of create, crash seed {seed}");
            let (sim, switch, storage) = simulated();
            switch.arm(Some(cut));
            let created = ArchiveStore::create_in(Arc::clone(&storage), &dir(), &options(2));
            completed |= created.is_ok() && !switch.fired();
            drop(created);
            switch.arm(None);
            sim.crash(seed);
            let mut store = match ArchiveStore::open_in(Arc::clone(&storage), &dir()) {
                Ok(store) => store,
                Err(ecdedup::Error::Config(_)) => {
                    ArchiveStore::create_in(Arc::clone(&storage), &dir(), &options(2))
                        .unwrap_or_else(|e| panic!("{what}: create again: {e}"))
                }
                Err(e) => panic!("{what}: open: {e}"),
            };
            assert!(store.list().is_empty(), "{what}");
            store.put("o", &mut &object[..]).unwrap();
            store.seal().unwrap();
            assert!(store.get("o").unwrap() == object, "{what}");
            repair_and_check_leaks(&mut store, &storage, &what);
        }
        if completed {
            break;
        }
    }
}

/// After a create that died just before its config, a device holding a
/// file of its own besides the marker is still refused; without it the
/// create goes through.
#[test]
fn after_an_interrupted_create_a_device_with_other_files_is_still_refused() {
    let (_, switch, storage) = simulated();
    drop(ArchiveStore::create_in(Arc::clone(&storage), &dir(), &options(0)).unwrap());
    // The config's durable write and the intent's removal are the last
    // seven operations of a create.
    let create_ops = switch.done.load(SeqCst);
    let (sim, switch, storage) = simulated();
    switch.arm(Some(create_ops - 7));
    assert!(ArchiveStore::create_in(Arc::clone(&storage), &dir(), &options(0)).is_err());
    switch.arm(None);
    sim.crash_with(1, false, |_, _| ecdedup::media::powerloss::Fate::Keep);
    let stranger = dir().join("dev0").join("someone-elses");
    storage.create(&stranger, true).unwrap();
    match ArchiveStore::create_in(Arc::clone(&storage), &dir(), &options(0)) {
        Err(ecdedup::Error::Device { reason, .. }) => assert!(reason.contains("not empty")),
        other => panic!("expected a refused device, got {:?}", other.err()),
    }
    storage.remove(&stranger).unwrap();
    let mut store = ArchiveStore::create_in(Arc::clone(&storage), &dir(), &options(0)).unwrap();
    repair_and_check_leaks(&mut store, &storage, "create after an interrupted one");
}
