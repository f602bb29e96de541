//! Where an array's metadata lives when its devices carry it (format 2,
//! `create --metadata device`, the default): a [`Storage`] that routes the
//! array folder's metadata names to the metadata areas of the devices
//! ([`crate::media::area`]), so the intent log, journal, dedup and
//! degraded-log code keeps naming paths and stays unchanged.
//!
//! Routes, by the path's name inside the array folder:
//! - `journal/devN.*`, `dedup/devN.*`: device N's own area (its parity
//!   journal, its dedup map log and snapshot);
//! - `intent.map*`, `degraded.log*`, `missed.map*`: mirrored, one copy in
//!   the area of every device in service;
//! - `array.json*`: the folder (primary) and a mirrored copy, from which
//!   `assemble` rebuilds a lost folder;
//! - anything else (the lock, sockets, device files): the folder.
//!
//! Mirrors: every write and sync goes to every copy whose device is in
//! service; a read comes from the first copy in the preference order
//! (members in service by position, then members being rebuilt) that
//! answers it. A copy whose write or read fails is dropped from the
//! mirror and its device reported,
//! with what failed ([`MetaStorage::take_broken`]), for the array to fail
//! and say so, as any device I/O error does; the call fails only when no
//! copy took it. A full space
//! (ENOSPC, EDQUOT: sparse device files on a full file system, or a full
//! area) fails the call and drops no copy: it is the host's fault, and the
//! array refuses writes until space is back, as for data. A replacement's
//! area gets a copy of every mirrored file before it is put in service.
//!
//! Checks ([`MetaStorage::check_copies`], run by `status` and `scrub`):
//! every copy of every mirrored file is read and compared with the copy
//! most devices hold (the first in read order on a tie); a copy that
//! differs, is missing or cannot be read is reported, and a repairing
//! check rewrites it from that copy. Writes to mirrored files wait while
//! one file's copies are compared, so a check never sees a write half
//! applied.
//!
//! Failure analysis: every copy obeys the storage contract on its own (its
//! writes and syncs come in the same order), so the copy read at open is
//! one that a crash could have left on a single file system. A copy
//! dropped after a write error is its device's failure, put on the
//! superblocks at the next flush, and for the intent map before the
//! write whose mark the copy missed goes out (`Array::intent_begin`):
//! read at the next open while in service, that copy left the stripes
//! concerned without a resync, their checksum entries older than their
//! blocks (the cluster simulator, seed 1116). The gap left: a copy of the
//! degraded-write log or the missed-write map dropped since the last
//! flush may be read at the next open without its last records; a
//! stripe whose record it lacks is resynchronised as one the log does
//! not cover, every decode of it checked. A read after open may come
//! from another copy than the open read (the first one's device failed
//! since): bytes the caller can check are read with
//! [`StorageFile::read_at_accepted`], which tries the copies in turn (a
//! degraded-write log's values: docs/write-hole.md, "A logged value read
//! from a copy that missed it").

use crate::media::area::AreaFs;
use crate::media::storage::{StorageFile, StorageLock};
use crate::media::{RingFile, Storage};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Names mirrored on every device.
const MIRRORED: [&str; 4] = [
    super::INTENT_FILE,
    super::DEGRADED_LOG_FILE,
    super::MISSED_FILE,
    super::POISON_FILE,
];

/// The files whose copies [`MetaStorage::check_copies`] compares: the
/// mirrored ones and the copy of the settings (temporary names are
/// transient and not compared).
const CHECKED: [&str; 5] = [
    super::INTENT_FILE,
    super::DEGRADED_LOG_FILE,
    super::MISSED_FILE,
    super::POISON_FILE,
    super::CONFIG_FILE,
];

/// One copy of a mirrored file that a check found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyProblem {
    /// Position of the device holding the bad copy.
    pub device: usize,
    pub name: String,
    /// What is wrong, and (after a repairing check) what was done.
    pub what: String,
    /// Rewritten from the good copy by a repairing check.
    pub repaired: bool,
}

impl std::fmt::Display for CopyProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "device {}: its copy of {} {}",
            self.device, self.name, self.what
        )
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Route {
    Folder,
    Device(usize, String),
    Mirror(String),
    FolderAndMirror(String),
    /// A folder that exists only inside the areas (`journal`, `dedup`).
    AreaFolder,
}

struct Shared {
    base: Arc<dyn Storage>,
    dir: PathBuf,
    areas: Vec<RwLock<Option<Arc<AreaFs>>>>,
    /// Positions in the order mirrored copies are read.
    order: RwLock<Vec<usize>>,
    /// Devices whose copy of a mirrored file failed a write or sync, with
    /// what failed.
    broken: Mutex<BTreeMap<usize, String>>,
    /// Held shared by every change to mirrored copies, exclusively while a
    /// check compares one file's copies or a new area gets its copies.
    copy_writes: RwLock<()>,
    /// How many times each device's area was put in service by
    /// [`MetaStorage::attach_new`]: a mirrored file opened before then
    /// opens the new copy at its next write.
    attached: Vec<AtomicU64>,
}

/// The array's storage when its devices carry the metadata.
#[derive(Clone)]
pub struct MetaStorage {
    shared: Arc<Shared>,
}

impl MetaStorage {
    /// `areas[d]`: device d's area (None while it is out of service);
    /// `order`: positions whose copies are read first.
    pub fn new(
        base: Arc<dyn Storage>,
        dir: &Path,
        areas: Vec<Option<Arc<AreaFs>>>,
        order: Vec<usize>,
    ) -> MetaStorage {
        MetaStorage {
            shared: Arc::new(Shared {
                base,
                dir: dir.to_owned(),
                attached: areas.iter().map(|_| AtomicU64::new(0)).collect(),
                areas: areas.into_iter().map(RwLock::new).collect(),
                order: RwLock::new(order),
                broken: Mutex::new(BTreeMap::new()),
                copy_writes: RwLock::new(()),
            }),
        }
    }

    pub fn shared(&self) -> Arc<dyn Storage> {
        Arc::new(self.clone())
    }

    /// Device `d` left service: its area is not written any more.
    pub fn detach(&self, d: usize) {
        if let Some(slot) = self.shared.areas.get(d) {
            *slot.write().unwrap() = None;
        }
    }

    /// Puts a freshly formatted area in service for device `d`, after
    /// copying every mirrored file into it (durably).
    pub fn attach_new(&self, d: usize, area: Arc<AreaFs>) -> io::Result<()> {
        // No mirrored write between the copy and the attach: it would miss
        // the new copy.
        let _quiet = self.shared.copy_writes.write().unwrap();
        for name in self.mirrored_names() {
            // Read from the first copy that holds the file, not through
            // `open_mirror`, which fails every copy without it: a
            // temporary file an atomic rewrite left on one area (its
            // rename never reached it) then failed every other device in
            // service at the next re-add (the cluster simulator's seed
            // 396583: array.json.tmp on one area, five devices failed).
            let Some(from) = self
                .copies()
                .into_iter()
                .find_map(|(_, a)| a.open_file(&name).ok())
            else {
                continue;
            };
            let len = from.len()?;
            let to = area.create_file(&name, true)?;
            let mut at = 0u64;
            let mut buf = vec![0u8; 1 << 20];
            while at < len {
                let n = (len - at).min(buf.len() as u64) as usize;
                from.read_at(&mut buf[..n], at)?;
                to.write_at(&buf[..n], at)?;
                at += n as u64;
            }
            to.sync()?;
        }
        area.commit()?;
        *self.shared.areas[d].write().unwrap() = Some(area);
        self.shared.attached[d].fetch_add(1, Ordering::SeqCst);
        let mut order = self.shared.order.write().unwrap();
        if !order.contains(&d) {
            order.push(d);
        }
        Ok(())
    }

    /// Devices whose mirrored copy failed since the last call, each with
    /// what failed (as "writing its copy of intent.map: ...").
    pub fn take_broken(&self) -> Vec<(usize, String)> {
        std::mem::take(&mut *self.shared.broken.lock().unwrap())
            .into_iter()
            .collect()
    }

    /// The bytes of mirrored file `name` in the primary area, if any.
    pub fn area_copy(&self, name: &str) -> Option<Vec<u8>> {
        let (_, area) = self.copies().into_iter().next()?;
        let f = area.open_file(name).ok()?;
        let mut b = vec![0u8; usize::try_from(f.len().ok()?).ok()?];
        f.read_at(&mut b, 0).ok()?;
        Some(b)
    }

    /// The area of device `d`, if in service.
    pub fn area(&self, d: usize) -> Option<Arc<AreaFs>> {
        self.shared.areas.get(d)?.read().unwrap().clone()
    }

    /// Mirrored names present in the primary copy.
    fn mirrored_names(&self) -> Vec<String> {
        match self.copies().first() {
            Some((_, a)) => a
                .list()
                .into_iter()
                .filter(|n| {
                    matches!(
                        self.route_name(n),
                        Route::Mirror(_) | Route::FolderAndMirror(_)
                    )
                })
                .collect(),
            None => Vec::new(),
        }
    }

    /// Areas in service, in read order.
    fn copies(&self) -> Vec<(usize, Arc<AreaFs>)> {
        let order = self.shared.order.read().unwrap();
        let mut out: Vec<(usize, Arc<AreaFs>)> = Vec::new();
        let rest = (0..self.shared.areas.len()).filter(|d| !order.contains(d));
        for d in order.iter().copied().chain(rest) {
            if let Some(a) = self.area(d) {
                out.push((d, a));
            }
        }
        out
    }

    fn route(&self, path: &Path) -> Route {
        match path.strip_prefix(&self.shared.dir) {
            Ok(rel) => match rel.to_str() {
                Some(name) => self.route_name(name),
                None => Route::Folder,
            },
            Err(_) => Route::Folder,
        }
    }

    fn route_name(&self, name: &str) -> Route {
        if name == super::JOURNAL_DIR || name == super::DEDUP_DIR {
            return Route::AreaFolder;
        }
        if name == super::CONFIG_FILE || name.strip_prefix(super::CONFIG_FILE) == Some(".tmp") {
            return Route::FolderAndMirror(name.to_owned());
        }
        if MIRRORED.iter().any(|m| {
            name == *m
                || name
                    .strip_prefix(m)
                    .is_some_and(|rest| rest.starts_with('.'))
        }) {
            return Route::Mirror(name.to_owned());
        }
        for folder in [super::JOURNAL_DIR, super::DEDUP_DIR] {
            let Some(file) = name
                .strip_prefix(folder)
                .and_then(|r| r.strip_prefix("/dev"))
            else {
                continue;
            };
            let digits: String = file.chars().take_while(|c| c.is_ascii_digit()).collect();
            let rest = &file[digits.len()..];
            if let Ok(d) = digits.parse::<usize>() {
                if d < self.shared.areas.len() && rest.starts_with('.') && !digits.is_empty() {
                    return Route::Device(d, name.to_owned());
                }
            }
        }
        Route::Folder
    }

    fn out_of_service(d: usize) -> io::Error {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("device {d} is out of service: its metadata area cannot be used"),
        )
    }

    fn device_area(&self, d: usize) -> io::Result<Arc<AreaFs>> {
        self.area(d).ok_or_else(|| Self::out_of_service(d))
    }

    /// Drops device `d`'s copies from the mirror after `what` failed;
    /// the array fails the device at its next flush and says so there
    /// (nothing is failed yet, so nothing is printed here).
    fn mark_broken(&self, d: usize, what: String, e: &io::Error) {
        self.shared
            .broken
            .lock()
            .unwrap()
            .entry(d)
            .or_insert_with(|| format!("{what}: {e}"));
        self.detach(d);
    }

    /// Compares every copy of every mirrored file (and of the settings)
    /// on the devices in service with the copy most of them hold; with
    /// `repair`, rewrites each copy that differs, is missing or cannot be
    /// read from that one (durably). Returns every bad copy found.
    pub fn check_copies(&self, repair: bool) -> Vec<CopyProblem> {
        self.check_copies_of(&CHECKED, repair)
    }

    /// [`MetaStorage::check_copies`] for the files `names` only.
    pub fn check_copies_of(&self, names: &[&str], repair: bool) -> Vec<CopyProblem> {
        let mut problems = Vec::new();
        for &name in names {
            let _quiet = self.shared.copy_writes.write().unwrap();
            let copies = self.copies();
            // Each copy: Ok(Some(bytes)), Ok(None) when missing, or Err.
            let read: Vec<(usize, CopyRead)> = copies
                .iter()
                .map(|(d, area)| (*d, read_copy(area, name)))
                .collect();
            let mut groups: Vec<(&Vec<u8>, Vec<usize>)> = Vec::new();
            for (d, r) in &read {
                if let Ok(Some(bytes)) = r {
                    match groups.iter_mut().find(|(b, _)| *b == bytes) {
                        Some((_, ds)) => ds.push(*d),
                        None => groups.push((bytes, vec![*d])),
                    }
                }
            }
            // The copy most devices hold; on a tie, the first read (the
            // one the array reads). No copy anywhere: the file is absent.
            let Some((good, holders)) = groups
                .iter()
                .enumerate()
                .max_by_key(|(i, (_, ds))| (ds.len(), std::cmp::Reverse(*i)))
                .map(|(_, g)| g.clone())
            else {
                continue;
            };
            for (d, r) in &read {
                let what = match r {
                    Ok(Some(bytes)) if bytes == good => continue,
                    Ok(Some(bytes)) => format!(
                        "differs from the copy on devices {holders:?} ({} bytes, theirs {})",
                        bytes.len(),
                        good.len()
                    ),
                    Ok(None) => format!("is missing (devices {holders:?} hold one)"),
                    Err(e) => format!("cannot be read ({e})"),
                };
                let area = &copies.iter().find(|(a, _)| a == d).expect("read above").1;
                let (what, repaired) = match repair.then(|| rewrite_copy(area, name, good)) {
                    None => (what, false),
                    Some(Ok(())) => (format!("{what}; rewritten from theirs"), true),
                    Some(Err(e)) => (format!("{what}; rewriting it failed: {e}"), false),
                };
                problems.push(CopyProblem {
                    device: *d,
                    name: name.to_owned(),
                    what,
                    repaired,
                });
            }
        }
        problems
    }

    fn open_mirror(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        let copies = self.copies();
        let Some((_, primary)) = copies.first() else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no device in service holds the array's metadata",
            ));
        };
        if !primary.exists(name) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{name} not in the metadata areas"),
            ));
        }
        let mut files = Vec::new();
        for (d, area) in &copies {
            match area.open_file(name) {
                Ok(f) => files.push((*d, f)),
                Err(e) => self.mark_broken(*d, format!("opening its copy of {name}"), &e),
            }
        }
        Ok(Arc::new(MirrorFile::new(
            self,
            None,
            name.to_owned(),
            files,
        )))
    }

    fn create_mirror(
        &self,
        name: &str,
        truncate: bool,
    ) -> io::Result<Vec<(usize, Arc<dyn StorageFile>)>> {
        let _writes = self.shared.copy_writes.read().unwrap();
        let mut files = Vec::new();
        let mut last_err = None;
        for (d, area) in self.copies() {
            match area.create_file(name, truncate) {
                Ok(f) => files.push((d, f)),
                // A full space is the host's fault, not the device's.
                Err(e) if is_space_error(&e) => return Err(e),
                Err(e) => {
                    self.mark_broken(d, format!("creating its copy of {name}"), &e);
                    last_err = Some(e);
                }
            }
        }
        if files.is_empty() {
            return Err(last_err.unwrap_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    "no device in service holds the metadata",
                )
            }));
        }
        Ok(files)
    }

    /// Applies `op` to every copy; Ok when at least one took it (the
    /// others are dropped and their devices reported).
    /// Runs `op` on every area in service, side by side (as
    /// [`MirrorFile::each`]'s copies).
    fn each_area(
        &self,
        what: &str,
        op: impl Fn(&Arc<AreaFs>) -> io::Result<()> + Sync,
    ) -> io::Result<()> {
        let _writes = self.shared.copy_writes.read().unwrap();
        let mut ok = false;
        let mut first_err = None;
        let copies = self.copies();
        let parallel = copies.iter().all(|(_, a)| a.side_by_side());
        let results = side_by_side(&copies, parallel, |(_, area)| op(area));
        for ((d, _), result) in copies.into_iter().zip(results) {
            match result {
                Ok(()) => ok = true,
                Err(e) if is_space_error(&e) => return Err(e),
                Err(e) if e.kind() == io::ErrorKind::NotFound => first_err = first_err.or(Some(e)),
                Err(e) => {
                    self.mark_broken(d, what.to_owned(), &e);
                    first_err = Some(e);
                }
            }
        }
        match (ok, first_err) {
            (true, _) | (false, None) => Ok(()),
            (false, Some(e)) => Err(e),
        }
    }
}

/// A mirrored file: `base` (the folder's copy, primary when present) and
/// the copies in device areas.
struct MirrorFile {
    meta: MetaStorage,
    base: Option<Arc<dyn StorageFile>>,
    copies: Mutex<Copies>,
    name: String,
}

/// The area copies a mirrored file writes, and the attach count of each
/// device when its copy was opened.
struct Copies {
    files: Vec<(usize, Arc<dyn StorageFile>)>,
    seen: Vec<u64>,
}

impl MirrorFile {
    fn new(
        meta: &MetaStorage,
        base: Option<Arc<dyn StorageFile>>,
        name: String,
        files: Vec<(usize, Arc<dyn StorageFile>)>,
    ) -> MirrorFile {
        let seen = meta
            .shared
            .attached
            .iter()
            .map(|a| a.load(Ordering::SeqCst))
            .collect();
        MirrorFile {
            meta: meta.clone(),
            base,
            copies: Mutex::new(Copies { files, seen }),
            name,
        }
    }

    /// Opens the copy of each area attached since this file was opened
    /// (a replaced or re-added device), so that it gets every later write.
    fn follow_attached(&self, copies: &mut Copies) {
        for (d, attached) in self.meta.shared.attached.iter().enumerate() {
            let now = attached.load(Ordering::SeqCst);
            if copies.seen[d] == now {
                continue;
            }
            copies.seen[d] = now;
            copies.files.retain(|(e, _)| *e != d);
            if let Some(area) = self.meta.area(d) {
                match area.open_file(&self.name) {
                    Ok(f) => copies.files.push((d, f)),
                    Err(e) => {
                        self.meta
                            .mark_broken(d, format!("opening its copy of {}", self.name), &e)
                    }
                }
            }
        }
    }
}

impl MirrorFile {
    /// Runs `op` on the folder copy (whose error is the call's) and on
    /// every area copy (a failing one is dropped). The area copies are
    /// written side by side, a thread each, where their devices take it
    /// ([`AreaFs::side_by_side`]: on a cluster each is a chunk across the
    /// network), and one after another an intent mark or a
    /// degraded-write record took a round trip (or a device sync) per
    /// copy where one for all does. A cut during the call may leave any
    /// subset of the copies with the new bytes, as one between two
    /// sequential copies left a prefix: the caller has not been answered,
    /// and `status` and `scrub` compare the copies
    /// ([`MetaStorage::check_copies`]).
    fn each(&self, op: impl Fn(&dyn StorageFile) -> io::Result<()> + Sync) -> io::Result<()> {
        if let Some(b) = &self.base {
            op(b.as_ref())?;
        }
        let _writes = self.meta.shared.copy_writes.read().unwrap();
        let mut guard = self.copies.lock().unwrap();
        self.follow_attached(&mut guard);
        let copies = &mut guard.files;
        let mut parallel = true;
        copies.retain(|(d, _)| match self.meta.area(*d) {
            Some(area) => {
                parallel &= area.side_by_side();
                true
            }
            None => false,
        });
        let mut results = side_by_side(copies, parallel, |(_, f)| op(f.as_ref())).into_iter();
        let mut first_err = None;
        copies.retain(|(d, _)| {
            match results.next().expect("one result per copy") {
                Ok(()) => true,
                // A full space is the host's fault, not the device's.
                Err(e) if is_space_error(&e) => {
                    first_err.get_or_insert(e);
                    true
                }
                Err(e) => {
                    self.meta
                        .mark_broken(*d, format!("writing its copy of {}", self.name), &e);
                    first_err.get_or_insert(e);
                    false
                }
            }
        });
        if let Some(e) = first_err.take_if(|e| is_space_error(e)) {
            return Err(e);
        }
        if copies.is_empty() && self.base.is_none() {
            return Err(first_err.unwrap_or_else(|| {
                io::Error::other(format!("{}: no device in service holds a copy", self.name))
            }));
        }
        Ok(())
    }

    /// Runs `op` on the folder copy where there is one (its error is the
    /// call's), else on the first area copy in read order that takes it:
    /// a copy that fails is dropped and its device reported, as a failed
    /// write's is, and the next copy is tried. Before, the first copy's
    /// error was the call's: a degraded-write log whose first copy did not
    /// answer was left unopened, its records neither used nor ended by
    /// the flushes that made them needless, and the next open replayed
    /// them over newer writes (the cluster simulator, seed 90621: wrong
    /// data).
    fn read_first(&self, mut op: impl FnMut(&dyn StorageFile) -> io::Result<()>) -> io::Result<()> {
        if let Some(b) = &self.base {
            return op(b.as_ref());
        }
        self.read_copies(|f| op(f).map(|()| true)).map(drop)
    }

    /// Runs `op` on the area copies in read order until one returns
    /// `Ok(true)` (then `Ok(true)`); `Ok(false)` says the copy answered
    /// without what the caller wants (it lags), and the next is tried
    /// (`Ok(false)` when every copy that answered did so). A copy whose
    /// `op` fails is dropped and its device reported, as a failed write's
    /// is; the first such error is the call's where no copy answered.
    fn read_copies(
        &self,
        mut op: impl FnMut(&dyn StorageFile) -> io::Result<bool>,
    ) -> io::Result<bool> {
        let mut guard = self.copies.lock().unwrap();
        self.follow_attached(&mut guard);
        let mut answered = false;
        let mut first_err = None;
        for (d, f) in guard.files.clone() {
            if self.meta.area(d).is_none() {
                continue;
            }
            match op(f.as_ref()) {
                Ok(true) => return Ok(true),
                Ok(false) => answered = true,
                // A full space is the host's fault, not the device's.
                Err(e) if is_space_error(&e) => return Err(e),
                Err(e) => {
                    self.meta
                        .mark_broken(d, format!("reading its copy of {}", self.name), &e);
                    guard.files.retain(|(c, _)| *c != d);
                    first_err.get_or_insert(e);
                }
            }
        }
        match (answered, first_err) {
            (true, _) => Ok(false),
            (false, Some(e)) => Err(e),
            (false, None) => Err(io::Error::other(format!(
                "{}: no device in service holds a copy",
                self.name
            ))),
        }
    }
}

/// `op` on each of `items`, a scoped thread each where there are several
/// and `parallel` (their devices take it: [`AreaFs::side_by_side`],
/// `Device::side_by_side`), else in turn; the results in `items`' order.
/// Each thread's operations count for the caller's purpose
/// (`remote::within`: a replay's appends are the replay's). A panic in
/// `op` is raised again here.
pub(super) fn side_by_side<T: Sync, R: Send>(
    items: &[T],
    parallel: bool,
    op: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    if items.len() < 2 || !parallel {
        return items.iter().map(op).collect();
    }
    let op = &op;
    let scope = crate::media::remote::current_scope();
    let run = move |c: &T| match scope {
        Some(scope) => crate::media::remote::within(scope, || op(c)),
        None => op(c),
    };
    let run = &run;
    std::thread::scope(|s| {
        let running: Vec<_> = items.iter().map(|c| s.spawn(move || run(c))).collect();
        running
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

impl StorageFile for MirrorFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_first(|f| f.read_at(buf, offset))
    }
    /// The folder's copy where there is one, then the area copies in read
    /// order, until one's bytes are accepted. A copy that holds other
    /// bytes there, or ends before them, lags (it missed a write a cut
    /// left on the others) and stays in the mirror; one whose read fails
    /// otherwise is dropped and its device reported, as in `read_first`.
    fn read_at_accepted(
        &self,
        buf: &mut [u8],
        offset: u64,
        accept: &dyn Fn(&[u8]) -> bool,
    ) -> io::Result<bool> {
        if let Some(b) = &self.base {
            if b.read_at(buf, offset).is_ok() && accept(buf) {
                return Ok(true);
            }
        }
        let taken = self.read_copies(|f| match f.read_at(buf, offset) {
            Ok(()) => Ok(accept(buf)),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
            Err(e) => Err(e),
        });
        match taken {
            // The folder's copy answered.
            Err(e) if self.base.is_some() && !is_space_error(&e) => Ok(false),
            r => r,
        }
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.each(|f| f.write_at(buf, offset))
    }
    fn len(&self) -> io::Result<u64> {
        let mut len = 0;
        self.read_first(|f| {
            len = f.len()?;
            Ok(())
        })?;
        Ok(len)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.each(|f| f.set_len(len))
    }
    fn sync(&self) -> io::Result<()> {
        self.each(|f| f.sync())
    }
    fn write_durable(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.each(|f| f.write_durable(buf, offset))
    }
    fn reserve(&self, len: u64) -> io::Result<()> {
        self.each(|f| f.reserve(len))
    }
    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        self.each(|f| f.punch(offset, len))
    }
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.each(|f| f.zero_range(offset, len))
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        self.each(|f| f.allocate(len))
    }
    fn ring_file(&self) -> Option<RingFile> {
        None
    }
    fn describe(&self) -> String {
        format!("{} (mirrored on the devices)", self.name)
    }
}

impl Storage for MetaStorage {
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        match self.route(path) {
            Route::Folder | Route::AreaFolder => self.shared.base.open(path),
            Route::Device(d, name) => self.device_area(d)?.open_file(&name),
            Route::Mirror(name) => self.open_mirror(&name),
            Route::FolderAndMirror(name) => {
                let base = self.shared.base.open(path)?;
                let copies = self
                    .copies()
                    .into_iter()
                    .filter_map(|(d, a)| a.open_file(&name).ok().map(|f| (d, f)))
                    .collect();
                Ok(Arc::new(MirrorFile::new(self, Some(base), name, copies)))
            }
        }
    }

    fn open_device(&self, path: &Path, direct: bool) -> io::Result<Arc<dyn StorageFile>> {
        self.shared.base.open_device(path, direct)
    }

    fn create(&self, path: &Path, truncate: bool) -> io::Result<Arc<dyn StorageFile>> {
        match self.route(path) {
            Route::Folder | Route::AreaFolder => self.shared.base.create(path, truncate),
            Route::Device(d, name) => self.device_area(d)?.create_file(&name, truncate),
            Route::Mirror(name) => {
                let copies = self.create_mirror(&name, truncate)?;
                Ok(Arc::new(MirrorFile::new(self, None, name, copies)))
            }
            Route::FolderAndMirror(name) => {
                let base = self.shared.base.create(path, truncate)?;
                let copies = self.create_mirror(&name, truncate).unwrap_or_default();
                Ok(Arc::new(MirrorFile::new(self, Some(base), name, copies)))
            }
        }
    }

    fn exists(&self, path: &Path) -> bool {
        match self.route(path) {
            Route::Folder | Route::FolderAndMirror(_) => self.shared.base.exists(path),
            Route::AreaFolder => true,
            Route::Device(d, name) => self.area(d).is_some_and(|a| a.exists(&name)),
            Route::Mirror(name) => self.copies().first().is_some_and(|(_, a)| a.exists(&name)),
        }
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        match self.route(path) {
            Route::Folder | Route::AreaFolder => self.shared.base.remove(path),
            Route::Device(d, name) => self.device_area(d)?.remove(&name),
            Route::Mirror(name) => {
                if !self.exists(path) {
                    return Err(io::Error::from(io::ErrorKind::NotFound));
                }
                self.each_area(&format!("removing its copy of {name}"), |a| {
                    a.remove(&name).or_else(ignore_not_found)
                })
            }
            Route::FolderAndMirror(name) => {
                self.shared.base.remove(path)?;
                self.each_area(&format!("removing its copy of {name}"), |a| {
                    a.remove(&name).or_else(ignore_not_found)
                })
            }
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        match (self.route(from), self.route(to)) {
            (Route::Folder, Route::Folder) => self.shared.base.rename(from, to),
            (Route::Device(d, a), Route::Device(e, b)) if d == e => {
                self.device_area(d)?.rename(&a, &b)
            }
            (Route::Mirror(a), Route::Mirror(b)) => {
                if !self.exists(from) {
                    return Err(io::Error::from(io::ErrorKind::NotFound));
                }
                self.each_area(&format!("renaming its copy of {a}"), |area| {
                    area.rename(&a, &b)
                })
            }
            (Route::FolderAndMirror(a), Route::FolderAndMirror(b)) => {
                self.shared.base.rename(from, to)?;
                self.each_area(&format!("renaming its copy of {a}"), |area| {
                    area.rename(&a, &b).or_else(ignore_not_found)
                })
            }
            (f, t) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot rename {f:?} to {t:?} across metadata places"),
            )),
        }
    }

    /// A file in the areas is replaced in each with one durable write and
    /// one directory commit (`AreaFs::replace_file`), the copies side by
    /// side where their devices take it, where the temporary file's way
    /// (create, grow, write, sync, rename, commit) took 9 round trips a
    /// copy to a chunk across the network (docs/format.md).
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        match self.route(path) {
            Route::Folder | Route::AreaFolder => self.shared.base.write_atomic(path, bytes),
            Route::Device(d, name) => self.device_area(d)?.replace_file(&name, bytes),
            Route::Mirror(name) => self.each_area(&format!("replacing its copy of {name}"), |a| {
                a.replace_file(&name, bytes)
            }),
            Route::FolderAndMirror(name) => {
                self.shared.base.write_atomic(path, bytes)?;
                self.each_area(&format!("replacing its copy of {name}"), |a| {
                    a.replace_file(&name, bytes)
                })
            }
        }
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        match self.route(path) {
            Route::AreaFolder => Ok(()),
            _ => self.shared.base.create_dir_all(path),
        }
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let inside = path.starts_with(&self.shared.dir);
        if inside {
            // Names in the areas: every area commits what changed.
            self.each_area("committing its metadata directory", |a| a.commit())?;
        }
        match self.route(path) {
            Route::AreaFolder => Ok(()),
            _ => self.shared.base.sync_dir(path),
        }
    }

    fn try_lock(&self, path: &Path) -> io::Result<Option<StorageLock>> {
        self.shared.base.try_lock(path)
    }
}

fn is_space_error(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// One copy as read: its bytes, None when missing, or why it cannot be read.
type CopyRead = std::result::Result<Option<Vec<u8>>, String>;

/// The bytes of `name` in `area`: None when it has no such file.
fn read_copy(area: &Arc<AreaFs>, name: &str) -> CopyRead {
    if !area.exists(name) {
        return Ok(None);
    }
    let f = area.open_file(name).map_err(|e| e.to_string())?;
    let len = f.len().map_err(|e| e.to_string())?;
    let len = usize::try_from(len).map_err(|_| format!("{len} bytes"))?;
    let mut b = vec![0u8; len];
    f.read_at(&mut b, 0).map_err(|e| e.to_string())?;
    Ok(Some(b))
}

/// Makes `name` in `area` hold `bytes`, durably. The file is rewritten in
/// place (not replaced), so handles the array holds on it see the result.
fn rewrite_copy(area: &Arc<AreaFs>, name: &str, bytes: &[u8]) -> io::Result<()> {
    let f = area.create_file(name, false)?;
    f.write_at(bytes, 0)?;
    f.set_len(bytes.len() as u64)?;
    f.sync()?;
    area.commit()
}

fn ignore_not_found(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::{Device, MemDevice, OsStorage};

    fn meta(n: usize) -> (tempfile::TempDir, MetaStorage, Vec<Arc<dyn Device>>) {
        meta_over(
            (0..n)
                .map(|i| Arc::new(MemDevice::new(&format!("d{i}"), 8 << 20)) as Arc<dyn Device>)
                .collect(),
        )
    }

    /// A metadata storage over `devs`, each with a fresh area.
    fn meta_over(
        devs: Vec<Arc<dyn Device>>,
    ) -> (tempfile::TempDir, MetaStorage, Vec<Arc<dyn Device>>) {
        let dir = tempfile::tempdir().unwrap();
        let n = devs.len();
        let areas = devs
            .iter()
            .map(|d| {
                Some(Arc::new(
                    AreaFs::format(Arc::clone(d), 1 << 20, 4 << 20).unwrap(),
                ))
            })
            .collect();
        let m = MetaStorage::new(OsStorage::shared(), dir.path(), areas, (0..n).collect());
        (dir, m, devs)
    }

    #[test]
    fn names_route_to_their_device_or_to_every_device() {
        let (dir, m, _) = meta(3);
        let p = |s: &str| dir.path().join(s);
        assert_eq!(
            m.route(&p("journal/dev2.jrnl")),
            Route::Device(2, "journal/dev2.jrnl".into())
        );
        assert_eq!(
            m.route(&p("dedup/dev0.snap.tmp")),
            Route::Device(0, "dedup/dev0.snap.tmp".into())
        );
        assert_eq!(m.route(&p("dedup/dev3.log")), Route::Folder, "no device 3");
        assert_eq!(
            m.route(&p("intent.map.tmp")),
            Route::Mirror("intent.map.tmp".into())
        );
        assert_eq!(m.route(&p("intent.mapx")), Route::Folder);
        assert_eq!(
            m.route(&p("array.json")),
            Route::FolderAndMirror("array.json".into())
        );
        assert_eq!(m.route(&p("lock")), Route::Folder);
        assert_eq!(m.route(&p("dev0")), Route::Folder);
        assert_eq!(
            m.route(Path::new("/elsewhere/journal/dev0.jrnl")),
            Route::Folder
        );
    }

    #[test]
    fn a_mirrored_file_survives_on_any_device_and_a_replacement_gets_a_copy() {
        let (dir, m, devs) = meta(3);
        let path = dir.path().join("intent.map");
        crate::media::storage::write_atomic(&m, &path, b"marks").unwrap();
        for d in 0..3 {
            assert_eq!(m.area(d).unwrap().list(), vec!["intent.map"]);
        }
        // Device 0 leaves: reads come from device 1, writes skip device 0.
        m.detach(0);
        let f = m.open(&path).unwrap();
        f.write_at(b"M", 0).unwrap();
        f.sync().unwrap();
        assert_eq!(
            crate::media::storage::read_all(&m, &path).unwrap(),
            b"Marks"
        );
        // Its replacement gets the current copy before it serves.
        let fresh = Arc::new(AreaFs::format(Arc::clone(&devs[0]), 1 << 20, 4 << 20).unwrap());
        m.attach_new(0, fresh).unwrap();
        m.detach(1);
        m.detach(2);
        assert_eq!(
            crate::media::storage::read_all(&m, &path).unwrap(),
            b"Marks"
        );
    }

    /// A temporary file an atomic rewrite left on one area only (its
    /// rename never reached it) is no reason to fail the others when a
    /// replacement's area is filled: before, the fill opened it as a
    /// mirrored file, and every copy without it failed its device (the
    /// cluster simulator's seed 396583: five devices failed at a re-add).
    #[test]
    fn a_leftover_temporary_file_on_one_area_fails_no_device_when_another_is_attached() {
        let (dir, m, devs) = meta(3);
        let path = dir.path().join("array.json");
        crate::media::storage::write_atomic(&m, &path, b"config").unwrap();
        let stale = m
            .area(0)
            .unwrap()
            .create_file("array.json.tmp", true)
            .unwrap();
        stale.write_at(b"half", 0).unwrap();
        stale.sync().unwrap();
        m.area(0).unwrap().commit().unwrap();
        m.detach(2);
        let fresh = Arc::new(AreaFs::format(Arc::clone(&devs[2]), 1 << 20, 4 << 20).unwrap());
        m.attach_new(2, fresh).unwrap();
        assert_eq!(m.take_broken(), vec![], "no copy is failed");
        assert_eq!(
            crate::media::storage::read_all(&m, &path).unwrap(),
            b"config"
        );
    }

    #[test]
    fn a_mirrored_file_whose_first_copy_cannot_be_read_is_read_from_the_next() {
        use crate::media::{FaultPlan, FaultyDevice};
        use std::sync::atomic::Ordering::SeqCst;
        let plan = FaultPlan::new();
        let first: Arc<dyn Device> = Arc::new(FaultyDevice::new(
            MemDevice::new("d0", 8 << 20),
            Arc::clone(&plan),
        ));
        let others =
            (1..3).map(|i| Arc::new(MemDevice::new(&format!("d{i}"), 8 << 20)) as Arc<dyn Device>);
        let (dir, m, _) = meta_over(std::iter::once(first).chain(others).collect());
        let path = dir.path().join("degraded.log");
        crate::media::storage::write_atomic(&m, &path, b"records").unwrap();
        // Device 0's server stops answering: its copy comes first in read
        // order, and the file reads whole from device 1 all the same.
        let f = m.open(&path).unwrap();
        plan.dead.store(true, SeqCst);
        assert_eq!(
            crate::media::storage::read_file(f.as_ref()).unwrap(),
            b"records"
        );
        let broken = m.take_broken();
        assert_eq!(broken.len(), 1, "{broken:?}");
        assert_eq!(broken[0].0, 0);
        assert!(
            broken[0].1.contains("reading its copy of degraded.log"),
            "{broken:?}"
        );
        // Its copy is out of the mirror: writes go on to the others.
        f.write_at(b"R", 0).unwrap();
        f.sync().unwrap();
        assert_eq!(
            crate::media::storage::read_all(&m, &path).unwrap(),
            b"Records"
        );
    }

    /// A degraded-write log indexes its records from the copy read at
    /// open, and reads a logged value later from whichever copy comes
    /// first then. A copy that missed the record (a cut between the
    /// copies' writes, the writer unanswered) keeps at its place the bytes
    /// of an older generation's record (a checkpoint keeps the file's
    /// length), or zeroes where the file was grown past them: read from
    /// it once the first copy's device left, the block's old content was
    /// taken for its logged value (found reading the code; no simulator
    /// seed is known to have hit it). Each value is now checked against
    /// the checksum it was logged with, and read from a copy that holds
    /// it so; where none does, it is not known.
    #[test]
    fn a_logged_value_is_read_only_from_a_copy_that_holds_it_as_logged() {
        use crate::array::degraded_log::DegradedLog;
        let (dir, m, _) = meta(3);
        let storage: Arc<dyn Storage> = Arc::new(m.clone());
        let path = dir.path().join(super::super::DEGRADED_LOG_FILE);
        let durable = || Ok(());
        let (log, _) = DegradedLog::open(Arc::clone(&storage), &path, 4096, 1 << 20).unwrap();
        let (old, new) = (vec![1u8; 4096], vec![2u8; 4096]);
        drop(log.log(5, &[(0, 0, &old)], &durable).unwrap());
        // A new generation: the old record stays in every copy's bytes.
        log.checkpoint(&durable).unwrap();
        let copy = |d: usize| {
            m.area(d)
                .unwrap()
                .open_file(super::super::DEGRADED_LOG_FILE)
                .unwrap()
        };
        let before = crate::media::storage::read_file(copy(1).as_ref()).unwrap();
        drop(log.log(5, &[(0, 0, &new)], &durable).unwrap());
        // Copy 1 missed that append: its bytes as they were.
        copy(1).write_at(&before, 0).unwrap();
        drop(log);
        // The next open reads copy 0, which holds the record.
        let (log, _) = DegradedLog::open(Arc::clone(&storage), &path, 4096, 1 << 20).unwrap();
        assert!(log.value(5, 0, 0).unwrap() == Some(new.clone()));
        // Device 0 leaves: copy 1 comes first, and copy 2 holds the value.
        m.detach(0);
        let got = log.value(5, 0, 0).unwrap();
        assert!(
            got.as_deref() != Some(&old[..]),
            "the older generation's bytes were taken for the logged value"
        );
        assert!(
            got == Some(new),
            "the value is read from the copy that holds it as logged"
        );
        // No copy left holds it: not known, never the older record's bytes.
        copy(2).write_at(&before, 0).unwrap();
        assert!(
            !matches!(log.value(5, 0, 0), Ok(Some(_))),
            "a value no copy holds as logged is not known"
        );
        assert_eq!(m.take_broken(), vec![], "a copy that lags fails no device");
    }

    #[test]
    fn a_mirrored_file_open_across_a_replacement_writes_the_new_copy_too() {
        let (dir, m, devs) = meta(3);
        let path = dir.path().join("intent.map");
        crate::media::storage::write_atomic(&m, &path, b"marks").unwrap();
        // The server holds the file open while device 2 fails (a write
        // meanwhile drops its copy) and is replaced.
        let f = m.open(&path).unwrap();
        m.detach(2);
        f.write_at(b"M", 0).unwrap();
        let fresh = Arc::new(AreaFs::format(Arc::clone(&devs[2]), 1 << 20, 4 << 20).unwrap());
        m.attach_new(2, fresh).unwrap();
        f.write_at(b"W", 0).unwrap();
        f.sync().unwrap();
        assert!(
            m.check_copies(false).is_empty(),
            "{:?}",
            m.check_copies(false)
        );
        // The new copy alone holds the write.
        m.detach(0);
        m.detach(1);
        assert_eq!(
            crate::media::storage::read_all(&m, &path).unwrap(),
            b"Warks"
        );
    }

    /// A device whose sync, once the group is armed, waits (up to a
    /// minute) until every device of its group is inside a sync at once:
    /// met only when the copies of a mirrored file are synced side by side.
    struct Rendezvous {
        mem: MemDevice,
        group: Arc<Group>,
        size: usize,
    }

    /// (devices inside a sync, met, armed), and its wake-up.
    type Group = (std::sync::Mutex<(usize, bool, bool)>, std::sync::Condvar);

    impl Device for Rendezvous {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.mem.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.mem.write_at(buf, offset)
        }
        fn sync(&self) -> io::Result<()> {
            let (lock, cv) = &*self.group;
            let mut g = lock.lock().unwrap();
            if !g.2 {
                return self.mem.sync();
            }
            g.0 += 1;
            if g.0 == self.size {
                g.1 = true;
                cv.notify_all();
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while !g.1 && std::time::Instant::now() < deadline {
                g = cv
                    .wait_timeout(g, std::time::Duration::from_secs(1))
                    .unwrap()
                    .0;
            }
            g.0 -= 1;
            self.mem.sync()
        }
        fn size(&self) -> u64 {
            self.mem.size()
        }
        fn describe(&self) -> String {
            self.mem.describe()
        }
        fn side_by_side(&self) -> bool {
            true
        }
    }

    /// The copies of a mirrored file are synced side by side, not one
    /// after another (a round trip each to remote chunks).
    #[test]
    fn a_mirrored_files_copies_are_synced_side_by_side() {
        let group = Arc::new((
            std::sync::Mutex::new((0, false, false)),
            std::sync::Condvar::new(),
        ));
        let devs = (0..3)
            .map(|i| {
                Arc::new(Rendezvous {
                    mem: MemDevice::new(&format!("d{i}"), 8 << 20),
                    group: Arc::clone(&group),
                    size: 3,
                }) as Arc<dyn Device>
            })
            .collect();
        let (dir, m, _) = meta_over(devs);
        let f = m.create(&dir.path().join("degraded.log"), true).unwrap();
        f.write_at(b"record", 0).unwrap();
        group.0.lock().unwrap().2 = true;
        f.sync().unwrap();
        assert!(
            group.0.lock().unwrap().1,
            "the three copies' syncs never overlapped"
        );
        assert_eq!(
            crate::media::storage::read_all(&m, &dir.path().join("degraded.log")).unwrap(),
            b"record"
        );
    }
}
