//! An in-memory device for tests and simulations. Cloning shares the bytes,
//! so a test can keep a handle to "the disk" across a simulated restart.

use super::Device;
use std::io;
use std::sync::{Arc, Mutex};

#[derive(Clone)]
pub struct MemDevice {
    bytes: Arc<Mutex<Vec<u8>>>,
    name: String,
}

impl MemDevice {
    pub fn new(name: &str, size: u64) -> MemDevice {
        MemDevice {
            bytes: Arc::new(Mutex::new(vec![0; size as usize])),
            name: name.to_owned(),
        }
    }

    /// Direct access for corruption tests.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        f(&mut self.bytes.lock().unwrap())
    }
}

fn range_check(len: usize, offset: u64, size: usize) -> io::Result<std::ops::Range<usize>> {
    let start =
        usize::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let end = start.checked_add(len).filter(|&e| e <= size);
    match end {
        Some(end) => Ok(start..end),
        None => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "beyond end of device",
        )),
    }
}

impl Device for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let bytes = self.bytes.lock().unwrap();
        let r = range_check(buf.len(), offset, bytes.len())?;
        buf.copy_from_slice(&bytes[r]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut bytes = self.bytes.lock().unwrap();
        let r = range_check(buf.len(), offset, bytes.len())?;
        bytes[r].copy_from_slice(buf);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.bytes.lock().unwrap().len() as u64
    }

    fn describe(&self) -> String {
        format!("mem:{}", self.name)
    }
}
