//! Every file operation of the archive tier, in one place, through the
//! store's [`Storage`] interface: [`Disk`] wraps the `Arc<dyn Storage>` an
//! archive is opened on, so the same code runs over the real file system
//! ([`ecdedup_core::media::OsStorage`]) and over the power-loss simulator
//! ([`ecdedup_core::media::PowerLossStorage`]), under the strict POSIX contract
//! written down in `media/storage.rs`.
//!
//! Invariants: a file written with [`Disk::write_durable`] is either absent
//! or whole under its final name: its bytes go to a temporary name
//! (`.NAME.tmp`) in the same folder, are synced, renamed over the final
//! name, and the folder is synced, so that a crash at any point leaves the
//! old file or the new one (and maybe the temporary, which scrub reclaims).
//! Staging files grow by [`Disk::write_at`] and are made durable with
//! [`Disk::sync_file`] (the file, then its folder) before anything that
//! refers to their bytes is committed. A removal is durable only after the
//! caller syncs the folder ([`Disk::sync_dir`]).
//!
//! Fault model for tests, besides the simulator: [`fail_after_writes`]
//! makes the n-th mutating call on this thread (and every later one) fail
//! as if the process had died there, before the call touched the disk:
//! what was written before stays, nothing after it happens.

use ecdedup_core::error::{Error, Result};
use ecdedup_core::media::{Storage, StorageFile};
use std::cell::Cell;
use std::io::ErrorKind;
use std::path::Path;
use std::sync::Arc;

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

/// The name `write_durable` writes `name`'s bytes under before the rename.
pub fn temporary_name(name: &str) -> String {
    format!(".{name}.tmp")
}

/// Whether `name` is a temporary of [`Disk::write_durable`] (a crash
/// between its creation and its rename leaves one).
pub fn is_temporary(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

/// The archive's file operations over one [`Storage`].
#[derive(Clone)]
pub struct Disk {
    storage: Arc<dyn Storage>,
}

impl Disk {
    pub fn new(storage: Arc<dyn Storage>) -> Disk {
        Disk { storage }
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// Makes a folder's entries (creations, renames, removals) durable.
    pub fn sync_dir(&self, dir: &Path) -> Result<()> {
        self.storage.sync_dir(dir).map_err(io("sync folder", dir))
    }

    /// Creates a folder (and its parents) and syncs its parent.
    pub fn create_dir(&self, dir: &Path) -> Result<()> {
        injected_crash("create folder", dir)?;
        self.storage
            .create_dir_all(dir)
            .map_err(io("create folder", dir))?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            self.sync_dir(parent)?;
        }
        Ok(())
    }

    /// Writes `bytes` as the whole content of `path`, atomically and durably.
    pub fn write_durable(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        injected_crash("write", path)?;
        let dir = path.parent().expect("archive files live in a folder");
        let name = path.file_name().expect("a file name").to_string_lossy();
        let tmp = dir.join(temporary_name(&name));
        let file = self
            .storage
            .create(&tmp, true)
            .map_err(io("create", &tmp))?;
        file.write_at(bytes, 0).map_err(io("write", &tmp))?;
        file.sync().map_err(io("sync", &tmp))?;
        drop(file);
        self.storage
            .rename(&tmp, path)
            .map_err(io("rename into", path))?;
        self.sync_dir(dir)
    }

    /// Whether `path` names a file or folder.
    pub fn exists(&self, path: &Path) -> bool {
        self.storage.exists(path)
    }

    fn open(&self, path: &Path) -> Result<Option<Arc<dyn StorageFile>>> {
        match self.storage.open(path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("open {}", path.display()), e)),
        }
    }

    /// The whole content of `path`, or None when it does not exist.
    pub fn read_all(&self, path: &Path) -> Result<Option<Vec<u8>>> {
        let Some(file) = self.open(path)? else {
            return Ok(None);
        };
        let len = file.len().map_err(io("read", path))?;
        let len = usize::try_from(len).map_err(|_| {
            Error::io(
                format!("read {}", path.display()),
                std::io::Error::other("file too large to read"),
            )
        })?;
        let mut bytes = vec![0u8; len];
        file.read_at(&mut bytes, 0).map_err(io("read", path))?;
        Ok(Some(bytes))
    }

    /// Fills `buf` from `path` at `offset`; false when the file is missing
    /// or too short (a lost or truncated sub-file: the caller decodes
    /// instead).
    pub fn read_at(&self, path: &Path, offset: u64, buf: &mut [u8]) -> Result<bool> {
        let Some(file) = self.open(path)? else {
            return Ok(false);
        };
        match file.read_at(buf, offset) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(false),
            Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
        }
    }

    /// Writes `bytes` at `offset` of `path` (created if absent), not synced.
    pub fn write_at(&self, path: &Path, offset: u64, bytes: &[u8]) -> Result<()> {
        injected_crash("write", path)?;
        let file = self.storage.create(path, false).map_err(io("open", path))?;
        file.write_at(bytes, offset).map_err(io("write", path))
    }

    /// Makes a file's bytes durable (and its creation, by syncing its
    /// folder).
    pub fn sync_file(&self, path: &Path) -> Result<()> {
        let file = self.storage.open(path).map_err(io("open", path))?;
        file.sync().map_err(io("sync", path))?;
        self.sync_dir(path.parent().expect("archive files live in a folder"))
    }

    /// Cuts `path` to `bytes` long (creating it empty when absent) and
    /// syncs it.
    pub fn truncate(&self, path: &Path, bytes: u64) -> Result<()> {
        injected_crash("truncate", path)?;
        let file = self.storage.create(path, false).map_err(io("open", path))?;
        file.set_len(bytes).map_err(io("truncate", path))?;
        file.sync().map_err(io("sync", path))
    }

    /// Removes `path` if present; the folder is synced by the caller.
    pub fn remove(&self, path: &Path) -> Result<()> {
        injected_crash("remove", path)?;
        match self.storage.remove(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("remove {}", path.display()), e)),
        }
    }

    /// Names of the plain files in `dir`, sorted; None when `dir` is
    /// missing.
    pub fn list_files(&self, dir: &Path) -> Result<Option<Vec<String>>> {
        match self.storage.list_files(dir) {
            Ok(names) => Ok(Some(names)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("list {}", dir.display()), e)),
        }
    }

    /// Whether `path` is an existing folder.
    pub fn is_dir(&self, path: &Path) -> bool {
        self.storage.is_dir(path)
    }

    /// Takes the exclusive lock `path` for this process; `Ok(None)` when
    /// another holder has it. The lock is held until the value is dropped.
    pub fn try_lock(
        &self,
        path: &Path,
    ) -> Result<Option<ecdedup_core::media::storage::StorageLock>> {
        self.storage.try_lock(path).map_err(io("lock", path))
    }
}
