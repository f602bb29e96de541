//! Where `archive put` reads a volume from, besides a file: a stopped
//! array, read through [`Volume`] as the NBD plugin reads it, or a running
//! server, read over NBD by libnbd's `nbdcopy` into a pipe.
//!
//! Both are `Read`ers that fail rather than end early: a source that
//! stops short of the volume's size, or an `nbdcopy` that exits with an
//! error, makes the last `read` return an error, so `put` fails before it
//! commits the object (the archive stays as it was, see the module
//! invariants in mod.rs).

use ecdedup_core::error::{Error, Result};
use ecdedup_core::volume::{Volume, REQUEST_BYTES_MAX};
use std::io::{self, Read};
use std::process::{Child, ChildStdout, Command, Stdio};

/// The volume of an array opened offline, read front to back.
pub struct VolumeSource {
    volume: Volume,
    offset: u64,
}

impl VolumeSource {
    pub fn new(volume: Volume) -> VolumeSource {
        VolumeSource { volume, offset: 0 }
    }

    pub fn size(&self) -> u64 {
        self.volume.size()
    }

    /// Closes the array cleanly (it was only read, but open may have
    /// replayed journals).
    pub fn close(self) -> Result<()> {
        self.volume.close()
    }
}

impl Read for VolumeSource {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.size() - self.offset;
        let take = (buf.len() as u64).min(left).min(REQUEST_BYTES_MAX) as usize;
        if take == 0 {
            return Ok(0);
        }
        self.volume
            .read(&mut buf[..take], self.offset)
            .map_err(|e| io::Error::other(format!("read the volume at {}: {e}", self.offset)))?;
        self.offset += take as u64;
        Ok(take)
    }
}

/// A volume served over NBD at `uri`, streamed by `nbdcopy URI -`. Its
/// size comes from `nbdinfo --size` first, which also gives a clear error
/// when nothing answers at `uri`.
pub struct NbdSource {
    uri: String,
    child: Child,
    stdout: ChildStdout,
    size: u64,
    read: u64,
    finished: bool,
}

impl NbdSource {
    pub fn open(uri: &str) -> Result<NbdSource> {
        let info = Command::new("nbdinfo")
            .args(["--size", uri])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::io("run nbdinfo (package libnbd-bin)", e))?;
        if !info.status.success() {
            return Err(Error::Other(format!(
                "no NBD export at {uri}: {}",
                String::from_utf8_lossy(&info.stderr).trim()
            )));
        }
        let text = String::from_utf8_lossy(&info.stdout);
        let size = text.trim().parse::<u64>().map_err(|_| {
            Error::Other(format!(
                "nbdinfo --size {uri} printed {:?}, not a size",
                text.trim()
            ))
        })?;
        let mut child = Command::new("nbdcopy")
            .args(["--", uri, "-"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // Inherited: a pipe nobody drains could block it.
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| Error::io("run nbdcopy (package libnbd-bin)", e))?;
        let stdout = child.stdout.take().expect("piped");
        Ok(NbdSource {
            uri: uri.to_string(),
            child,
            stdout,
            size,
            read: 0,
            finished: false,
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// At the pipe's end: nbdcopy must have succeeded and sent exactly the
    /// export's size.
    fn finish(&mut self) -> io::Result<()> {
        self.finished = true;
        let status = self.child.wait()?;
        if !status.success() {
            return Err(io::Error::other(format!(
                "nbdcopy {} failed ({status}; its message is above)",
                self.uri
            )));
        }
        if self.read != self.size {
            return Err(io::Error::other(format!(
                "nbdcopy {} sent {} bytes, the export has {}",
                self.uri, self.read, self.size
            )));
        }
        Ok(())
    }
}

impl Read for NbdSource {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.finished || buf.is_empty() {
            return Ok(0);
        }
        let n = self.stdout.read(buf)?;
        if n == 0 {
            self.finish()?;
        }
        self.read += n as u64;
        if self.read > self.size {
            return Err(io::Error::other(format!(
                "nbdcopy {} sent more than the export's {} bytes",
                self.uri, self.size
            )));
        }
        Ok(n)
    }
}

impl Drop for NbdSource {
    /// A put that stopped early: nbdcopy is stopped and reaped.
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
