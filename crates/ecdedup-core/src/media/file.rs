//! A device backed by a file or a block device opened through a
//! [`Storage`]: positioned I/O, the file's sync as the barrier, and hole
//! punching as discard on files. Over [`OsStorage`] it is `pread`/`pwrite`
//! and `fdatasync`; over the power-loss simulator the same code meets
//! dropped, torn and reordered writes.

use super::storage::{OsStorage, Storage, StorageFile};
use super::{Device, DeviceOptions, IoMode};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct FileDevice {
    file: Arc<dyn StorageFile>,
    path: PathBuf,
    size: u64,
    sparse: bool,
    /// Opened for `O_DIRECT` transfers: an EINVAL from a transfer is the
    /// file system refusing them ([`super::storage::direct_refused`]).
    direct: bool,
}

impl FileDevice {
    /// Opens an existing file or block device read-write.
    pub fn open(path: &Path) -> io::Result<FileDevice> {
        FileDevice::open_in(&OsStorage, path)
    }

    /// Opens an existing file or block device of `storage` read-write,
    /// buffered and sparse.
    pub fn open_in(storage: &dyn Storage, path: &Path) -> io::Result<FileDevice> {
        FileDevice::open_with(
            storage,
            path,
            DeviceOptions {
                io: IoMode::Buffered,
                sparse: true,
            },
        )
    }

    /// Opens an existing file or block device of `storage` read-write.
    pub fn open_with(
        storage: &dyn Storage,
        path: &Path,
        options: DeviceOptions,
    ) -> io::Result<FileDevice> {
        let file = storage.open_device(path, options.io == IoMode::Direct)?;
        let size = file.len()?;
        Ok(FileDevice {
            file,
            path: path.to_owned(),
            size,
            sparse: options.sparse,
            direct: options.io == IoMode::Direct,
        })
    }

    /// Creates (or extends) a sparse file of `size` bytes and opens it.
    pub fn create_file(path: &Path, size: u64) -> io::Result<FileDevice> {
        FileDevice::create_in(&OsStorage, path, size)
    }

    /// [`FileDevice::create_file`] in `storage`; the length is synced, the
    /// name is durable once the caller syncs the folder.
    pub fn create_in(storage: &dyn Storage, path: &Path, size: u64) -> io::Result<FileDevice> {
        FileDevice::create_with(
            storage,
            path,
            size,
            DeviceOptions {
                io: IoMode::Buffered,
                sparse: true,
            },
        )
    }

    /// Creates (or extends) a device file of `size` bytes, allocated unless
    /// `options.sparse`, and opens it with `options`.
    pub fn create_with(
        storage: &dyn Storage,
        path: &Path,
        size: u64,
        options: DeviceOptions,
    ) -> io::Result<FileDevice> {
        let file = storage.create(path, false)?;
        if options.sparse {
            if file.len()? < size {
                file.set_len(size)?;
            }
        } else {
            file.allocate(size)?;
        }
        file.sync()?;
        drop(file);
        FileDevice::open_with(storage, path, options)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A failed transfer: with direct I/O asked for, EINVAL is the file
    /// system refusing it (the offsets, lengths and memory the storage
    /// hands the kernel are aligned), said with the way out.
    fn transfer_error(&self, e: io::Error) -> io::Error {
        if self.direct {
            super::storage::direct_refused(e, &self.path)
        } else {
            e
        }
    }
}

impl Device for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file
            .read_at(buf, offset)
            .map_err(|e| self.transfer_error(e))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        debug_assert!(offset + buf.len() as u64 <= self.size);
        self.file
            .write_at(buf, offset)
            .map_err(|e| self.transfer_error(e))
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.sparse {
            self.file.punch(offset, len)
        } else {
            self.file.zero_range(offset, len)
        }
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn describe(&self) -> String {
        self.file.describe()
    }

    fn ring_file(&self) -> Option<super::storage::RingFile> {
        self.file.ring_file()
    }
}
