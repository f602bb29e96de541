//! The power-loss simulator: a [`Storage`] held in memory that remembers,
//! per file, every write made since that file's last sync, and at a
//! simulated power cut decides the fate of each one on its own, from a seed
//! (TigerBeetle's `testing/storage.zig` is the model).
//!
//! Fault model, stronger than a process kill (after which the kernel still
//! holds every write):
//! - each unsynced write (and each unsynced truncate or extension) is
//!   dropped, kept, or torn: cut into 512-byte or 4 KiB sectors (one size
//!   per crash) of which each is kept or dropped on its own;
//! - the writes a file keeps reach the media in their issue order or, in
//!   about half of the crashes, in a shuffled order, so a later write to the
//!   same bytes can be overtaken by an earlier one;
//! - files are independent: one file's unsynced writes can survive while
//!   another's written earlier are lost (the orderings that kill a store
//!   whose map reaches the disk before the data it points at);
//! - names (create, rename, remove) of a folder not synced since are kept
//!   or reverted together, folder by folder; folders themselves are durable
//!   at once (a simplification: the store creates them once, at create);
//! - after a failed `sync` (injected), the file's unsynced writes stay
//!   visible to reads but never reach the media, and the next `sync`
//!   succeeds: Linux's behaviour since "fsyncgate", which a store must latch.
//!
//! A crash also bumps the storage's epoch: handles opened before it fail
//! every call with `EIO`, so a crashed array cannot write after the power
//! is gone. The store is then opened again on the same storage.
//!
//! A full file system is modelled by a budget of allocated 4 KiB pages over
//! all files ([`PowerLossStorage::set_capacity_bytes`]): a write to a page
//! never written (a hole of a sparse file) allocates it, `reserve`
//! allocates a range, hole punching and truncation free pages; a write
//! that needs a page past the budget fails with ENOSPC.

use super::storage::{parent_of, Storage, StorageFile, StorageLock};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// One write or length change not yet synced.
#[derive(Clone, Debug)]
enum Pending {
    Write {
        offset: u64,
        bytes: Vec<u8>,
    },
    /// Zeroes over a range (a punched hole), kept compact: device files
    /// are large and are punched whole.
    Zero {
        offset: u64,
        len: u64,
    },
    SetLen(u64),
}

/// What happens to one unsynced write at a power cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Drop,
    Keep,
    /// Each sector of this many bytes kept or dropped on its own.
    Tear {
        sector_bytes: u64,
    },
}

/// Pages of the capacity model.
const PAGE_BYTES: u64 = 4096;

#[derive(Default)]
struct InodeData {
    /// Allocated pages (see the module comment).
    pages: BTreeSet<u64>,
    /// What the media holds.
    durable: Sparse,
    /// What reads see: `durable` with `pending` applied in order.
    volatile: Sparse,
    pending: Vec<Pending>,
}

/// A file's bytes, sparse: a length and the 4 KiB pages that hold a
/// non-zero byte (an absent page reads as zeroes). Pages are shared
/// between copies and copied on write, so the volatile image's copy of the
/// durable one at a power cut costs a reference per page, and a device
/// file's untouched gigabytes cost nothing. Bytes past `len` in the last
/// page are kept zero, so an extension reads zeroes.
#[derive(Clone, Default, Debug, PartialEq, Eq)]
struct Sparse {
    len: u64,
    pages: BTreeMap<u64, Arc<[u8; PAGE]>>,
}

/// Page size of [`Sparse`].
const PAGE: usize = PAGE_BYTES as usize;
/// A page of zeroes, to compare with.
static ZERO_PAGE: [u8; PAGE] = [0; PAGE];

impl Sparse {
    /// Calls `each(page index, offset in the page, range of the caller's
    /// buffer)` for the pages that `[offset, offset+len)` touches.
    fn spans(offset: u64, len: usize, mut each: impl FnMut(u64, usize, std::ops::Range<usize>)) {
        let mut at = 0usize;
        while at < len {
            let pos = offset + at as u64;
            let in_page = (pos % PAGE_BYTES) as usize;
            let n = (PAGE - in_page).min(len - at);
            each(pos / PAGE_BYTES, in_page, at..at + n);
            at += n;
        }
    }

    /// Copies `[offset, offset+buf.len())` into `buf` (the caller checks
    /// the length).
    fn read(&self, offset: u64, buf: &mut [u8]) {
        Self::spans(offset, buf.len(), |page, in_page, r| {
            let n = r.len();
            match self.pages.get(&page) {
                Some(p) => buf[r].copy_from_slice(&p[in_page..in_page + n]),
                None => buf[r].fill(0),
            }
        });
    }

    fn write(&mut self, offset: u64, bytes: &[u8]) {
        Self::spans(offset, bytes.len(), |page, in_page, r| {
            let src = &bytes[r];
            match self.pages.get_mut(&page) {
                Some(p) => Arc::make_mut(p)[in_page..in_page + src.len()].copy_from_slice(src),
                // Zeroes over a hole stay a hole (compared with a zero
                // page: memcmp, not a byte loop, which was a third of the
                // cluster simulator's time at the workspace's opt-level).
                None if src == &ZERO_PAGE[..src.len()] => {}
                None => {
                    let mut p = [0u8; PAGE];
                    p[in_page..in_page + src.len()].copy_from_slice(src);
                    self.pages.insert(page, Arc::new(p));
                }
            }
        });
        self.len = self.len.max(offset + bytes.len() as u64);
    }

    fn zero(&mut self, offset: u64, len: u64) {
        let (first, end) = (offset.div_ceil(PAGE_BYTES), (offset + len) / PAGE_BYTES);
        if first < end {
            let whole: Vec<u64> = self.pages.range(first..end).map(|(&p, _)| p).collect();
            for p in whole {
                self.pages.remove(&p);
            }
        }
        // The partial pages at either end.
        for page in [offset / PAGE_BYTES, (offset + len) / PAGE_BYTES] {
            let start = (page * PAGE_BYTES).max(offset);
            let stop = ((page + 1) * PAGE_BYTES).min(offset + len);
            if start < stop {
                if let Some(p) = self.pages.get_mut(&page) {
                    let base = page * PAGE_BYTES;
                    Arc::make_mut(p)[(start - base) as usize..(stop - base) as usize].fill(0);
                }
            }
        }
        self.len = self.len.max(offset + len);
    }

    fn set_len(&mut self, len: u64) {
        if len < self.len {
            let _ = self.pages.split_off(&len.div_ceil(PAGE_BYTES));
            let tail = (len % PAGE_BYTES) as usize;
            if tail != 0 {
                if let Some(p) = self.pages.get_mut(&(len / PAGE_BYTES)) {
                    Arc::make_mut(p)[tail..].fill(0);
                }
            }
        }
        self.len = len;
    }

    fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len as usize];
        self.read(0, &mut v);
        v
    }
}

struct Inode {
    id: u64,
    data: Mutex<InodeData>,
}

#[derive(Default)]
struct Faults {
    /// Paths (by suffix) whose next sync fails with EIO.
    fail_next_sync: Vec<String>,
    /// Paths (by suffix) whose writes fail with EIO.
    fail_writes: Vec<String>,
}

struct State {
    epoch: u64,
    names: BTreeMap<PathBuf, Arc<Inode>>,
    durable_names: BTreeMap<PathBuf, Arc<Inode>>,
    dirs: BTreeSet<PathBuf>,
    locks: HashSet<PathBuf>,
    faults: Faults,
    capacity_bytes: Option<u64>,
}

struct Shared {
    state: Mutex<State>,
    /// Pages allocated over all files.
    pages_allocated: AtomicU64,
    next_inode: AtomicU64,
    crashes: AtomicU64,
    writes_lost: AtomicU64,
}

/// The power-loss simulator (see the module comment).
#[derive(Clone)]
pub struct PowerLossStorage {
    shared: Arc<Shared>,
}

/// What one power cut did, for the test's report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashReport {
    pub pending_writes: u64,
    pub dropped: u64,
    pub kept: u64,
    pub torn: u64,
    pub reordered_files: u64,
}

fn power_lost() -> io::Error {
    io::Error::other("power lost (simulated): handle from before the crash")
}

fn apply(buf: &mut Sparse, op: &Pending) {
    match op {
        Pending::Write { offset, bytes } => buf.write(*offset, bytes),
        Pending::Zero { offset, len } => buf.zero(*offset, *len),
        Pending::SetLen(len) => buf.set_len(*len),
    }
}

impl Default for PowerLossStorage {
    fn default() -> Self {
        PowerLossStorage::new()
    }
}

impl PowerLossStorage {
    pub fn new() -> PowerLossStorage {
        PowerLossStorage {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    epoch: 0,
                    names: BTreeMap::new(),
                    durable_names: BTreeMap::new(),
                    dirs: BTreeSet::new(),
                    locks: HashSet::new(),
                    faults: Faults::default(),
                    capacity_bytes: None,
                }),
                next_inode: AtomicU64::new(1),
                pages_allocated: AtomicU64::new(0),
                crashes: AtomicU64::new(0),
                writes_lost: AtomicU64::new(0),
            }),
        }
    }

    pub fn shared(&self) -> Arc<dyn Storage> {
        Arc::new(self.clone())
    }

    /// A full file system: writes and reservations that would allocate
    /// pages past `bytes` in all fail with ENOSPC. `None` lifts the limit.
    pub fn set_capacity_bytes(&self, bytes: Option<u64>) {
        // (A budget below what is allocated refuses every new page.)
        self.shared.state.lock().unwrap().capacity_bytes = bytes;
    }

    /// The next `sync` of a file whose path ends with `suffix` fails with
    /// EIO and loses that file's unsynced writes (they stay visible to reads).
    pub fn fail_next_sync(&self, suffix: &str) {
        let mut st = self.shared.state.lock().unwrap();
        st.faults.fail_next_sync.push(suffix.to_owned());
    }

    /// Every write to a file whose path ends with `suffix` fails with EIO
    /// until [`PowerLossStorage::heal`].
    pub fn fail_writes(&self, suffix: &str) {
        let mut st = self.shared.state.lock().unwrap();
        st.faults.fail_writes.push(suffix.to_owned());
    }

    /// Lifts every injected fault.
    pub fn heal(&self) {
        self.shared.state.lock().unwrap().faults = Faults::default();
    }

    /// Bytes allocated over all files (the capacity model's use).
    pub fn allocated_bytes(&self) -> u64 {
        self.shared.pages_allocated.load(SeqCst) * PAGE_BYTES
    }

    /// Power cuts so far.
    pub fn crashes(&self) -> u64 {
        self.shared.crashes.load(SeqCst)
    }

    /// Writes not synced at the moment of a crash, over all crashes.
    pub fn writes_lost(&self) -> u64 {
        self.shared.writes_lost.load(SeqCst)
    }

    /// Unsynced writes right now, over all files.
    pub fn pending_writes(&self) -> u64 {
        let st = self.shared.state.lock().unwrap();
        let mut seen = HashSet::new();
        st.names
            .values()
            .chain(st.durable_names.values())
            .filter(|i| seen.insert(i.id))
            .map(|i| i.data.lock().unwrap().pending.len() as u64)
            .sum()
    }

    /// Cuts the power: every unsynced write meets a fate drawn from `seed`
    /// (dropped, kept or torn, each a third of the time; shuffled order in
    /// half of the crashes).
    pub fn crash(&self, seed: u64) -> CrashReport {
        let mut rng = StdRng::seed_from_u64(seed);
        let sector_bytes = if rng.gen_bool(0.5) { 512 } else { 4096 };
        let shuffle = rng.gen_bool(0.5);
        self.crash_with(seed, shuffle, |_, _| match rng.gen_range(0..3) {
            0 => Fate::Drop,
            1 => Fate::Keep,
            _ => Fate::Tear { sector_bytes },
        })
    }

    /// Cuts the power with each unsynced write's fate chosen by `fate(path,
    /// index of the write among the file's unsynced ones)`, for tests that
    /// stage one ordering (a map kept while the data it points at is lost).
    /// `shuffle` applies each file's kept writes in a random order from
    /// `seed`. Folders keep their unsynced names when `seed` says so.
    pub fn crash_with(
        &self,
        seed: u64,
        shuffle: bool,
        mut fate: impl FnMut(&Path, usize) -> Fate,
    ) -> CrashReport {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
        let mut st = self.shared.state.lock().unwrap();
        let mut report = CrashReport::default();
        // Names: each folder with unsynced changes keeps all or none.
        let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
        for (p, i) in st.names.iter() {
            if st.durable_names.get(p).map(|d| d.id) != Some(i.id) {
                dirs.insert(parent_of(p).to_owned());
            }
        }
        for p in st.durable_names.keys() {
            if !st.names.contains_key(p) {
                dirs.insert(parent_of(p).to_owned());
            }
        }
        for dir in dirs {
            let commit = rng.gen_bool(0.5);
            let in_dir = |p: &Path| parent_of(p) == dir.as_path();
            if commit {
                commit_dir(&mut st, &dir);
            } else {
                let revert: Vec<(PathBuf, Arc<Inode>)> = st
                    .durable_names
                    .iter()
                    .filter(|(p, _)| in_dir(p))
                    .map(|(p, i)| (p.clone(), Arc::clone(i)))
                    .collect();
                st.names.retain(|p, _| !in_dir(p));
                st.names.extend(revert);
            }
        }
        // Contents: every inode still named after the cut.
        let mut seen = HashSet::new();
        let inodes: Vec<(PathBuf, Arc<Inode>)> = st
            .names
            .iter()
            .filter(|(_, i)| seen.insert(i.id))
            .map(|(p, i)| (p.clone(), Arc::clone(i)))
            .collect();
        for (path, inode) in inodes {
            let mut d = inode.data.lock().unwrap();
            let pending = std::mem::take(&mut d.pending);
            report.pending_writes += pending.len() as u64;
            let mut kept: Vec<Pending> = Vec::new();
            for (n, op) in pending.into_iter().enumerate() {
                match fate(&path, n) {
                    Fate::Drop => report.dropped += 1,
                    Fate::Keep => {
                        report.kept += 1;
                        kept.push(op);
                    }
                    Fate::Tear { sector_bytes } => match op {
                        Pending::Write { offset, bytes } => {
                            report.torn += 1;
                            let mut at = 0usize;
                            while at < bytes.len() {
                                // Sectors are aligned to the file, as on media.
                                let sector_end = ((offset + at as u64) / sector_bytes + 1)
                                    * sector_bytes
                                    - offset;
                                let end = (sector_end as usize).min(bytes.len());
                                if rng.gen_bool(0.5) {
                                    kept.push(Pending::Write {
                                        offset: offset + at as u64,
                                        bytes: bytes[at..end].to_vec(),
                                    });
                                }
                                at = end;
                            }
                        }
                        Pending::Zero { offset, len } => {
                            report.torn += 1;
                            let mut at = offset;
                            while at < offset + len {
                                let end =
                                    ((at / sector_bytes + 1) * sector_bytes).min(offset + len);
                                if rng.gen_bool(0.5) {
                                    kept.push(Pending::Zero {
                                        offset: at,
                                        len: end - at,
                                    });
                                }
                                at = end;
                            }
                        }
                        other => {
                            report.kept += 1;
                            kept.push(other);
                        }
                    },
                }
            }
            if shuffle && kept.len() > 1 {
                kept.shuffle(&mut rng);
                report.reordered_files += 1;
            }
            for op in &kept {
                apply(&mut d.durable, op);
            }
            // Shares the durable image's pages (copied on a later write).
            d.volatile = d.durable.clone();
        }
        // Files that lost their name are gone with their content.
        st.durable_names = st.names.clone();
        st.locks.clear();
        st.faults = Faults::default();
        st.epoch += 1;
        self.shared.crashes.fetch_add(1, SeqCst);
        self.shared
            .writes_lost
            .fetch_add(report.pending_writes - report.kept, SeqCst);
        report
    }

    /// Takes folder `path` away with everything under it, at once and for
    /// good, as when a device is pulled out (tests): its files and their
    /// pages, their names durable or not, its sub-folders.
    pub fn remove_dir_all(&self, path: &Path) {
        let mut st = self.shared.state.lock().unwrap();
        let mut gone: BTreeMap<u64, Arc<Inode>> = BTreeMap::new();
        for (p, i) in st.names.iter().chain(st.durable_names.iter()) {
            if p.starts_with(path) {
                gone.insert(i.id, Arc::clone(i));
            }
        }
        st.names.retain(|p, _| !p.starts_with(path));
        st.durable_names.retain(|p, _| !p.starts_with(path));
        st.dirs.retain(|d| !d.starts_with(path));
        for inode in gone.values() {
            let pages = std::mem::take(&mut inode.data.lock().unwrap().pages);
            self.shared
                .pages_allocated
                .fetch_sub(pages.len() as u64, SeqCst);
        }
    }

    /// Bytes a reader sees in `path` now (tests).
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.shared.state.lock().unwrap();
        let inode = st.names.get(path)?;
        let data = inode.data.lock().unwrap().volatile.to_vec();
        Some(data)
    }

    fn handle(&self, path: &Path, inode: Arc<Inode>, epoch: u64) -> Arc<dyn StorageFile> {
        Arc::new(SimFile {
            shared: Arc::clone(&self.shared),
            inode,
            epoch,
            path: path.to_owned(),
        })
    }
}

fn commit_dir(st: &mut State, dir: &Path) {
    let in_dir = |p: &Path| parent_of(p) == dir;
    let now: Vec<(PathBuf, Arc<Inode>)> = st
        .names
        .iter()
        .filter(|(p, _)| in_dir(p))
        .map(|(p, i)| (p.clone(), Arc::clone(i)))
        .collect();
    st.durable_names.retain(|p, _| !in_dir(p));
    st.durable_names.extend(now);
}

struct SimFile {
    shared: Arc<Shared>,
    inode: Arc<Inode>,
    epoch: u64,
    path: PathBuf,
}

impl SimFile {
    fn live(&self) -> io::Result<std::sync::MutexGuard<'_, State>> {
        let st = self.shared.state.lock().unwrap();
        if st.epoch != self.epoch {
            return Err(power_lost());
        }
        Ok(st)
    }

    fn matches(list: &[String], path: &Path) -> bool {
        let p = path.to_string_lossy();
        list.iter().any(|s| p.ends_with(s.as_str()))
    }

    /// Allocates the pages of `[offset, offset+len)`, or fails with ENOSPC
    /// (allocating nothing) when the budget cannot hold them.
    fn allocate(&self, st: &State, d: &mut InodeData, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let (first, end) = (offset / PAGE_BYTES, (offset + len).div_ceil(PAGE_BYTES));
        let new: Vec<u64> = (first..end).filter(|p| !d.pages.contains(p)).collect();
        if new.is_empty() {
            return Ok(());
        }
        let used = self.shared.pages_allocated.load(SeqCst);
        if let Some(cap) = st.capacity_bytes {
            if (used + new.len() as u64) * PAGE_BYTES > cap {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
        }
        self.shared
            .pages_allocated
            .fetch_add(new.len() as u64, SeqCst);
        d.pages.extend(new);
        Ok(())
    }

    /// Frees the whole pages inside `[offset, end)`.
    fn free(&self, d: &mut InodeData, offset: u64, end: u64) {
        let (first, last) = (offset.div_ceil(PAGE_BYTES), end / PAGE_BYTES);
        if first >= last {
            return;
        }
        let gone: Vec<u64> = d.pages.range(first..last).copied().collect();
        for p in &gone {
            d.pages.remove(p);
        }
        self.shared
            .pages_allocated
            .fetch_sub(gone.len() as u64, SeqCst);
    }

    fn push(&self, op: Pending) -> io::Result<()> {
        let st = self.live()?;
        if SimFile::matches(&st.faults.fail_writes, &self.path) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let mut d = self.inode.data.lock().unwrap();
        match &op {
            Pending::Write { offset, bytes } => {
                self.allocate(&st, &mut d, *offset, bytes.len() as u64)?
            }
            Pending::Zero { offset, len } => self.allocate(&st, &mut d, *offset, *len)?,
            Pending::SetLen(len) => self.free(&mut d, len.next_multiple_of(PAGE_BYTES), u64::MAX),
        }
        apply(&mut d.volatile, &op);
        d.pending.push(op);
        Ok(())
    }
}

impl StorageFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let _st = self.live()?;
        let d = self.inode.data.lock().unwrap();
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|end| end > d.volatile.len)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the file",
            ));
        }
        d.volatile.read(offset, buf);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.push(Pending::Write {
            offset,
            bytes: buf.to_vec(),
        })
    }

    fn len(&self) -> io::Result<u64> {
        let _st = self.live()?;
        Ok(self.inode.data.lock().unwrap().volatile.len)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.push(Pending::SetLen(len))
    }

    fn sync(&self) -> io::Result<()> {
        let mut st = self.live()?;
        let mut d = self.inode.data.lock().unwrap();
        let path = self.path.to_string_lossy().into_owned();
        if let Some(i) = st
            .faults
            .fail_next_sync
            .iter()
            .position(|s| path.ends_with(s.as_str()))
        {
            st.faults.fail_next_sync.remove(i);
            // The kernel marks the pages clean: they never reach the media,
            // and reads keep seeing them until they are evicted.
            self.shared
                .writes_lost
                .fetch_add(d.pending.len() as u64, SeqCst);
            d.pending.clear();
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let pending = std::mem::take(&mut d.pending);
        for op in &pending {
            apply(&mut d.durable, op);
        }
        Ok(())
    }

    fn reserve(&self, len: u64) -> io::Result<()> {
        let st = self.live()?;
        let mut d = self.inode.data.lock().unwrap();
        self.allocate(&st, &mut d, 0, len)
    }

    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        let st = self.live()?;
        let mut d = self.inode.data.lock().unwrap();
        let end = (offset + len).min(d.volatile.len);
        if end <= offset {
            return Ok(());
        }
        // Zeroes, as an unsynced write (a punch not yet durable can be
        // lost too), without allocating; whole pages are freed.
        let op = Pending::Zero {
            offset,
            len: end - offset,
        };
        apply(&mut d.volatile, &op);
        d.pending.push(op);
        self.free(&mut d, offset, end);
        drop(st);
        Ok(())
    }

    /// Zeroes written, kept as one compact op (not the default's buffers
    /// of zeroes: a dedup map log's room is tens of MiB), allocated as a
    /// write would be.
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.push(Pending::Zero { offset, len })
    }

    fn describe(&self) -> String {
        format!("{} (simulated)", self.path.display())
    }
}

impl Storage for PowerLossStorage {
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let st = self.shared.state.lock().unwrap();
        let inode = st
            .names
            .get(path)
            .cloned()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let epoch = st.epoch;
        drop(st);
        Ok(self.handle(path, inode, epoch))
    }

    fn create(&self, path: &Path, truncate: bool) -> io::Result<Arc<dyn StorageFile>> {
        let mut st = self.shared.state.lock().unwrap();
        if !st.dirs.contains(parent_of(path)) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        let epoch = st.epoch;
        let inode = match st.names.get(path) {
            Some(i) => Arc::clone(i),
            None => {
                let inode = Arc::new(Inode {
                    id: self.shared.next_inode.fetch_add(1, SeqCst),
                    data: Mutex::new(InodeData::default()),
                });
                st.names.insert(path.to_owned(), Arc::clone(&inode));
                inode
            }
        };
        drop(st);
        let f = self.handle(path, inode, epoch);
        if truncate {
            f.set_len(0)?;
        }
        Ok(f)
    }

    fn exists(&self, path: &Path) -> bool {
        let st = self.shared.state.lock().unwrap();
        st.names.contains_key(path) || st.dirs.contains(path)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut st = self.shared.state.lock().unwrap();
        st.names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.shared.state.lock().unwrap();
        let inode = st
            .names
            .remove(from)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        st.names.insert(to.to_owned(), inode);
        Ok(())
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut st = self.shared.state.lock().unwrap();
        let mut p = Some(path);
        while let Some(dir) = p {
            if dir.as_os_str().is_empty() {
                break;
            }
            st.dirs.insert(dir.to_owned());
            p = dir.parent();
        }
        st.dirs.insert(PathBuf::from("."));
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut st = self.shared.state.lock().unwrap();
        if !st.dirs.contains(path) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        commit_dir(&mut st, path);
        Ok(())
    }

    fn try_lock(&self, path: &Path) -> io::Result<Option<StorageLock>> {
        let mut st = self.shared.state.lock().unwrap();
        if !st.locks.insert(path.to_owned()) {
            return Ok(None);
        }
        Ok(Some(Box::new(SimLock {
            shared: Arc::clone(&self.shared),
            path: path.to_owned(),
            epoch: st.epoch,
        })))
    }

    fn list_files(&self, path: &Path) -> io::Result<Vec<String>> {
        let st = self.shared.state.lock().unwrap();
        if !st.dirs.contains(path) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        // `names` is ordered by path, so the names of one folder come sorted.
        Ok(st
            .names
            .keys()
            .filter(|p| parent_of(p) == path)
            .filter_map(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .collect())
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.shared.state.lock().unwrap().dirs.contains(path)
    }
}

struct SimLock {
    shared: Arc<Shared>,
    path: PathBuf,
    epoch: u64,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock().unwrap();
        if st.epoch == self.epoch {
            st.locks.remove(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn storage() -> PowerLossStorage {
        let s = PowerLossStorage::new();
        s.create_dir_all(Path::new("/a")).unwrap();
        s
    }

    #[test]
    fn synced_writes_survive_every_crash_and_unsynced_ones_may_not() {
        for seed in 0..64 {
            let s = storage();
            let f = s.create(Path::new("/a/f"), true).unwrap();
            f.write_at(&[1u8; 8192], 0).unwrap();
            f.sync().unwrap();
            s.sync_dir(Path::new("/a")).unwrap();
            f.write_at(&[2u8; 8192], 4096).unwrap();
            s.crash(seed);
            let bytes = s.read_file(Path::new("/a/f")).unwrap();
            assert!(bytes[..4096].iter().all(|&b| b == 1));
            assert!(bytes[4096..8192].iter().all(|&b| b == 1 || b == 2));
            // Past the synced end: the new bytes or the zeroes of a hole.
            assert!(bytes[8192..].iter().all(|&b| b == 0 || b == 2));
            assert!(f.write_at(&[3], 0).is_err(), "old handles are dead");
        }
    }

    #[test]
    fn every_fate_occurs_over_many_seeds() {
        let mut seen_old = false;
        let mut seen_new = false;
        let mut seen_torn = false;
        for seed in 0..200 {
            let s = storage();
            let f = s.create(Path::new("/a/f"), true).unwrap();
            f.write_at(&[1u8; 8192], 0).unwrap();
            f.sync().unwrap();
            s.sync_dir(Path::new("/a")).unwrap();
            f.write_at(&[2u8; 8192], 0).unwrap();
            s.crash(seed);
            let b = s.read_file(Path::new("/a/f")).unwrap();
            let ones = b.iter().filter(|&&x| x == 1).count();
            match ones {
                8192 => seen_old = true,
                0 => seen_new = true,
                _ => seen_torn = true,
            }
        }
        assert!(seen_old && seen_new && seen_torn);
    }

    #[test]
    fn a_name_not_synced_may_vanish_and_a_synced_one_stays() {
        let mut vanished = false;
        for seed in 0..32 {
            let s = storage();
            let f = s.create(Path::new("/a/kept"), true).unwrap();
            f.sync().unwrap();
            s.sync_dir(Path::new("/a")).unwrap();
            let g = s.create(Path::new("/a/new"), true).unwrap();
            g.write_at(b"x", 0).unwrap();
            g.sync().unwrap();
            s.crash(seed);
            assert!(s.exists(Path::new("/a/kept")));
            vanished |= !s.exists(Path::new("/a/new"));
        }
        assert!(vanished);
    }

    #[test]
    fn a_listing_shows_the_names_of_now_and_a_cut_may_revert_the_unsynced_ones() {
        let s = storage();
        s.create_dir_all(Path::new("/a/sub")).unwrap();
        s.create(Path::new("/a/b"), true).unwrap();
        s.sync_dir(Path::new("/a")).unwrap();
        s.create(Path::new("/a/sub/x"), true).unwrap();
        s.create(Path::new("/a/a"), true).unwrap();
        assert_eq!(s.list_files(Path::new("/a")).unwrap(), vec!["a", "b"]);
        assert!(s.is_dir(Path::new("/a/sub")) && !s.is_dir(Path::new("/a/b")));
        let e = s.list_files(Path::new("/none")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let mut reverted = false;
        for seed in 0..32 {
            let s = storage();
            s.create(Path::new("/a/b"), true).unwrap();
            s.sync_dir(Path::new("/a")).unwrap();
            s.create(Path::new("/a/a"), true).unwrap();
            s.crash(seed);
            let names = s.list_files(Path::new("/a")).unwrap();
            assert!(names == ["a", "b"] || names == ["b"], "{names:?}");
            reverted |= names == ["b"];
        }
        assert!(reverted);
    }

    #[test]
    fn a_removed_folder_is_gone_with_its_files_and_their_pages() {
        let s = storage();
        s.create_dir_all(Path::new("/a/d/e")).unwrap();
        let f = s.create(Path::new("/a/d/f"), true).unwrap();
        f.write_at(&[1u8; 8192], 0).unwrap();
        f.sync().unwrap();
        s.sync_dir(Path::new("/a/d")).unwrap();
        s.create(Path::new("/a/keep"), true).unwrap();
        s.remove_dir_all(Path::new("/a/d"));
        assert!(!s.exists(Path::new("/a/d/f")) && !s.is_dir(Path::new("/a/d/e")));
        assert_eq!(s.allocated_bytes(), 0);
        s.crash(1);
        assert!(!s.exists(Path::new("/a/d/f")), "and stays gone after a cut");
        assert!(s.is_dir(Path::new("/a")));
    }

    #[test]
    fn a_failed_sync_loses_the_writes_but_reads_still_see_them() {
        let s = storage();
        let f = s.create(Path::new("/a/j"), true).unwrap();
        f.sync().unwrap();
        s.sync_dir(Path::new("/a")).unwrap();
        f.write_at(b"record", 0).unwrap();
        s.fail_next_sync("/j");
        assert!(f.sync().is_err());
        let mut b = [0u8; 6];
        f.read_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"record");
        f.sync().unwrap();
        s.crash_with(1, false, |_, _| Fate::Keep);
        assert_eq!(s.read_file(Path::new("/a/j")).unwrap(), Vec::<u8>::new());
    }

    /// What a file held before the sparse image: a byte vector with the
    /// ops applied in order (the model the tests below compare against).
    fn apply_to_vec(v: &mut Vec<u8>, op: &Pending) {
        let (offset, end) = match op {
            Pending::Write { offset, bytes } => (*offset as usize, *offset as usize + bytes.len()),
            Pending::Zero { offset, len } => (*offset as usize, (*offset + *len) as usize),
            Pending::SetLen(len) => return v.resize(*len as usize, 0),
        };
        if v.len() < end {
            v.resize(end, 0);
        }
        match op {
            Pending::Write { bytes, .. } => v[offset..end].copy_from_slice(bytes),
            _ => v[offset..end].fill(0),
        }
    }

    /// Random writes (some of zeroes), zeroed ranges, punches and length
    /// changes over a few pages, some synced, then a cut that keeps or
    /// drops each unsynced op by its index, or tears it: the sparse image
    /// reads as a byte vector given the same ops, before and after the cut
    /// (dropped ops leave the synced bytes, kept ones land in order).
    #[test]
    fn the_sparse_image_reads_as_a_byte_vector_given_the_same_ops_across_cuts() {
        for seed in 0..48 {
            let mut rng = StdRng::seed_from_u64(seed);
            let s = storage();
            let f = s.create(Path::new("/a/f"), true).unwrap();
            s.sync_dir(Path::new("/a")).unwrap();
            let (mut durable, mut volatile) = (Vec::new(), Vec::new());
            let mut unsynced: Vec<Pending> = Vec::new();
            for _ in 0..40 {
                let offset = rng.gen_range(0..6 * PAGE_BYTES + 100);
                let len = rng.gen_range(0..2 * PAGE_BYTES + 7);
                let op = match rng.gen_range(0..5) {
                    0 | 1 => {
                        let bytes: Vec<u8> = if rng.gen_bool(0.3) {
                            vec![0; len as usize]
                        } else {
                            (0..len).map(|_| rng.gen_range(1..=255)).collect()
                        };
                        f.write_at(&bytes, offset).unwrap();
                        Pending::Write { offset, bytes }
                    }
                    2 => {
                        f.zero_range(offset, len).unwrap();
                        Pending::Zero { offset, len }
                    }
                    3 => {
                        f.punch(offset, len).unwrap();
                        let end = (offset + len).min(volatile.len() as u64);
                        if end <= offset {
                            continue;
                        }
                        Pending::Zero {
                            offset,
                            len: end - offset,
                        }
                    }
                    _ => {
                        let len = rng.gen_range(0..6 * PAGE_BYTES + 100);
                        f.set_len(len).unwrap();
                        Pending::SetLen(len)
                    }
                };
                apply_to_vec(&mut volatile, &op);
                unsynced.push(op);
                if rng.gen_bool(0.2) {
                    f.sync().unwrap();
                    for op in unsynced.drain(..) {
                        apply_to_vec(&mut durable, &op);
                    }
                }
                assert_eq!(f.len().unwrap(), volatile.len() as u64);
                assert!(
                    s.read_file(Path::new("/a/f")).unwrap() == volatile,
                    "seed {seed}"
                );
                let (at, n) = (rng.gen_range(0..=volatile.len()), rng.gen_range(0..9000));
                let mut buf = vec![7u8; n];
                match f.read_at(&mut buf, at as u64) {
                    Ok(()) => assert!(buf[..] == volatile[at..at + n], "seed {seed}"),
                    Err(_) => assert!(at + n > volatile.len(), "seed {seed}"),
                }
            }
            let keep = rng.gen::<u64>();
            s.crash_with(seed, false, |_, n| {
                if keep >> (n % 64) & 1 == 1 {
                    Fate::Keep
                } else {
                    Fate::Drop
                }
            });
            for (n, op) in unsynced.iter().enumerate() {
                if keep >> (n % 64) & 1 == 1 {
                    apply_to_vec(&mut durable, op);
                }
            }
            assert!(
                s.read_file(Path::new("/a/f")).unwrap() == durable,
                "seed {seed}"
            );
        }
    }

    /// A torn cut keeps each sector of an unsynced write or zeroing whole
    /// or not at all, also where they cross pages the synced image holds
    /// and pages it never held.
    #[test]
    fn a_torn_cut_keeps_whole_sectors_of_each_unsynced_write() {
        let mut seen = [false; 2];
        for seed in 0..32 {
            let s = storage();
            let f = s.create(Path::new("/a/f"), true).unwrap();
            f.write_at(&[1u8; 3 * PAGE], 0).unwrap();
            f.sync().unwrap();
            s.sync_dir(Path::new("/a")).unwrap();
            f.write_at(&[2u8; 3 * PAGE], 2 * PAGE_BYTES).unwrap();
            f.zero_range(512, 1024).unwrap();
            s.crash_with(seed, false, |_, _| Fate::Tear { sector_bytes: 512 });
            let b = s.read_file(Path::new("/a/f")).unwrap();
            for (i, sector) in b.chunks(512).enumerate() {
                let v = sector[0];
                assert!(sector.iter().all(|&x| x == v), "seed {seed} sector {i}");
                let allowed: &[u8] = match i {
                    1 | 2 => &[0, 1],
                    0..=15 => &[1],
                    16..=23 => &[1, 2],
                    _ => &[0, 2],
                };
                assert!(allowed.contains(&v), "seed {seed} sector {i}: {v}");
                if (16..24).contains(&i) {
                    seen[(v == 2) as usize] = true;
                }
            }
        }
        assert!(seen[0] && seen[1]);
    }

    /// A file's length costs nothing and a cut copies only written pages:
    /// a 64 GiB device file with two pages written (a byte vector would
    /// need 128 GiB for its two images).
    #[test]
    fn a_huge_sparse_file_holds_only_its_written_pages() {
        let s = storage();
        let f = s.create(Path::new("/a/dev"), true).unwrap();
        let size = 64u64 << 30;
        f.set_len(size).unwrap();
        f.zero_range(1 << 20, 80 << 20).unwrap();
        f.write_at(&[5u8; 4096], size - 4096).unwrap();
        f.sync().unwrap();
        s.sync_dir(Path::new("/a")).unwrap();
        f.write_at(&[6u8; 4096], 0).unwrap();
        s.crash_with(3, false, |_, _| Fate::Keep);
        let f = s.open(Path::new("/a/dev")).unwrap();
        assert_eq!(f.len().unwrap(), size);
        let mut b = [9u8; 8192];
        f.read_at(&mut b, size - 8192).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 0) && b[4096..].iter().all(|&x| x == 5));
        f.read_at(&mut b, 0).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 6) && b[4096..].iter().all(|&x| x == 0));
        let d = f_pages(&s, "/a/dev");
        assert_eq!(d, 2, "pages held");
    }

    /// Pages the volatile image holds for `path`.
    fn f_pages(s: &PowerLossStorage, path: &str) -> usize {
        let st = s.shared.state.lock().unwrap();
        let inode = st.names.get(Path::new(path)).unwrap();
        let n = inode.data.lock().unwrap().volatile.pages.len();
        n
    }

    #[test]
    fn a_full_file_system_refuses_new_pages_with_enospc_and_punching_frees_them() {
        let s = storage();
        s.set_capacity_bytes(Some(8192));
        let f = s.create(Path::new("/a/f"), true).unwrap();
        // A sparse file: its length costs nothing, its written pages do.
        f.set_len(1 << 20).unwrap();
        f.write_at(&[0u8; 4096], 0).unwrap();
        f.write_at(&[0u8; 4096], 65536).unwrap();
        let e = f.write_at(&[0u8; 1], 4096).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        f.write_at(&[1u8; 10], 0).unwrap();
        f.punch(65536, 4096).unwrap();
        f.write_at(&[2u8; 1], 4096).unwrap();
    }
}
