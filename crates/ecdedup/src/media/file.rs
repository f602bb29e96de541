//! A device backed by a regular file or a block device, with positioned
//! I/O (`pread`/`pwrite`), `fdatasync` as the barrier and hole punching as
//! discard on files.

use super::Device;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

pub struct FileDevice {
    file: File,
    path: PathBuf,
    size: u64,
    is_block_device: bool,
}

impl FileDevice {
    /// Opens an existing file or block device read-write.
    pub fn open(path: &Path) -> io::Result<FileDevice> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let meta = file.metadata()?;
        let is_block_device = meta.file_type().is_block_device();
        let size = if is_block_device {
            use std::io::{Seek, SeekFrom};
            let mut f = &file;
            f.seek(SeekFrom::End(0))?
        } else if meta.is_file() {
            meta.len()
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or block device",
            ));
        };
        Ok(FileDevice {
            file,
            path: path.to_owned(),
            size,
            is_block_device,
        })
    }

    /// Creates (or extends) a sparse file of `size` bytes and opens it.
    pub fn create_file(path: &Path, size: u64) -> io::Result<FileDevice> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if file.metadata()?.len() < size {
            file.set_len(size)?;
        }
        drop(file);
        FileDevice::open(path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Device for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        debug_assert!(offset + buf.len() as u64 <= self.size);
        self.file.write_all_at(buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.is_block_device {
            // BLKDISCARD does not guarantee zeroes on every device; write them.
            return super::write_zeroes(self, offset, len);
        }
        // SAFETY: fallocate on a valid fd with in-range arguments.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}
