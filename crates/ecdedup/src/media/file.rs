//! A device backed by a file or a block device opened through a
//! [`Storage`]: positioned I/O, the file's sync as the barrier, and hole
//! punching as discard on files. Over [`OsStorage`] it is `pread`/`pwrite`
//! and `fdatasync`; over the power-loss simulator the same code meets
//! dropped, torn and reordered writes.

use super::storage::{OsStorage, Storage, StorageFile};
use super::Device;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct FileDevice {
    file: Arc<dyn StorageFile>,
    path: PathBuf,
    size: u64,
}

impl FileDevice {
    /// Opens an existing file or block device read-write.
    pub fn open(path: &Path) -> io::Result<FileDevice> {
        FileDevice::open_in(&OsStorage, path)
    }

    /// Opens an existing file or block device of `storage` read-write.
    pub fn open_in(storage: &dyn Storage, path: &Path) -> io::Result<FileDevice> {
        let file = storage.open(path)?;
        let size = file.len()?;
        Ok(FileDevice {
            file,
            path: path.to_owned(),
            size,
        })
    }

    /// Creates (or extends) a sparse file of `size` bytes and opens it.
    pub fn create_file(path: &Path, size: u64) -> io::Result<FileDevice> {
        FileDevice::create_in(&OsStorage, path, size)
    }

    /// [`FileDevice::create_file`] in `storage`; the length is synced, the
    /// name is durable once the caller syncs the folder.
    pub fn create_in(storage: &dyn Storage, path: &Path, size: u64) -> io::Result<FileDevice> {
        let file = storage.create(path, false)?;
        if file.len()? < size {
            file.set_len(size)?;
            file.sync()?;
        }
        drop(file);
        FileDevice::open_in(storage, path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Device for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        debug_assert!(offset + buf.len() as u64 <= self.size);
        self.file.write_at(buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.file.punch(offset, len)
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn describe(&self) -> String {
        self.file.describe()
    }
}
