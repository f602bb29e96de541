//! Every file operation of the archive tier, in one place, so that it can
//! later be routed through the store's storage interface (and a power-loss
//! simulator) without touching the rest of the tier.
//!
//! Invariants: a file written with [`write_durable`] is either absent or
//! whole under its final name: its bytes go to a temporary name in the same
//! folder, are synced, renamed over the final name, and the folder is
//! synced, so that a crash at any point leaves the old file or the new one.
//! Staging files grow by [`write_at`] and are made durable with
//! [`sync_file`] before anything that refers to their bytes is committed.
//!
//! Fault model for tests: [`fail_after_writes`] makes the n-th mutating call
//! on this thread (and every later one) fail as if the process had died
//! there, before the call touched the disk: what was written before stays,
//! nothing after it happens.

use crate::error::{Error, Result};
use std::cell::Cell;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

thread_local! {
    /// Mutating calls left before the injected crash; None: no crash planned.
    static WRITES_LEFT: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Test hook: after `writes` more mutating file operations on this thread,
/// every further one fails with an "injected crash" error (None disarms).
pub fn fail_after_writes(writes: Option<u64>) {
    WRITES_LEFT.with(|w| w.set(writes));
}

fn injected_crash(what: &str, path: &Path) -> Result<()> {
    WRITES_LEFT.with(|w| match w.get() {
        Some(0) => Err(Error::io(
            format!("{what} {}", path.display()),
            std::io::Error::other("injected crash"),
        )),
        Some(n) => {
            w.set(Some(n - 1));
            Ok(())
        }
        None => Ok(()),
    })
}

fn io(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let context = format!("{what} {}", path.display());
    move |e| Error::io(context, e)
}

/// Makes a folder's entries (creations, renames, removals) durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync folder", dir))
}

/// Creates a folder (and its parents) and syncs its parent.
pub fn create_dir(dir: &Path) -> Result<()> {
    injected_crash("create folder", dir)?;
    fs::create_dir_all(dir).map_err(io("create folder", dir))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Writes `bytes` as the whole content of `path`, atomically and durably.
pub fn write_durable(path: &Path, bytes: &[u8]) -> Result<()> {
    injected_crash("write", path)?;
    let dir = path.parent().expect("archive files live in a folder");
    let name = path.file_name().expect("a file name").to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut file = File::create(&tmp).map_err(io("create", &tmp))?;
    file.write_all(bytes).map_err(io("write", &tmp))?;
    file.sync_all().map_err(io("sync", &tmp))?;
    drop(file);
    fs::rename(&tmp, path).map_err(io("rename into", path))?;
    sync_dir(dir)
}

/// The whole content of `path`, or None when it does not exist.
pub fn read_all(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
    }
}

/// Fills `buf` from `path` at `offset`; false when the file is missing or
/// too short (a lost or truncated sub-file: the caller decodes instead).
pub fn read_at(path: &Path, offset: u64, buf: &mut [u8]) -> Result<bool> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io(format!("open {}", path.display()), e)),
    };
    match file.read_exact_at(buf, offset) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
    }
}

/// Writes `bytes` at `offset` of `path` (created if absent), not synced.
pub fn write_at(path: &Path, offset: u64, bytes: &[u8]) -> Result<()> {
    injected_crash("write", path)?;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io("open", path))?;
    file.write_all_at(bytes, offset).map_err(io("write", path))
}

/// Makes a file's bytes durable (and its creation, by syncing its folder).
pub fn sync_file(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io("sync", path))?;
    sync_dir(path.parent().expect("archive files live in a folder"))
}

/// Cuts `path` to `bytes` long (creating it empty when absent) and syncs it.
pub fn truncate(path: &Path, bytes: u64) -> Result<()> {
    injected_crash("truncate", path)?;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io("open", path))?;
    file.set_len(bytes).map_err(io("truncate", path))?;
    file.sync_all().map_err(io("sync", path))
}

/// Removes `path` if present; the folder is synced by the caller.
pub fn remove(path: &Path) -> Result<()> {
    injected_crash("remove", path)?;
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("remove {}", path.display()), e)),
    }
}

/// Names of the plain files in `dir`, sorted; None when `dir` is missing.
pub fn list_files(dir: &Path) -> Result<Option<Vec<String>>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("list {}", dir.display()), e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io("list", dir))?;
        if entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(Some(names))
}

/// Whether `path` is an existing folder.
pub fn is_dir(path: &Path) -> bool {
    path.is_dir()
}
