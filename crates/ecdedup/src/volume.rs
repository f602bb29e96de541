//! The volume: the virtual disk a client sees, mapped onto an array.
//!
//! This is the boundary where untrusted requests arrive (from the NBD
//! frontend): every offset and length is checked here once, against the
//! volume size and the request size limit; the layers below assert instead.
//! Write policies (RMW in place today; parity logging and PARIX later) are
//! chosen at this level.

use crate::array::Array;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Largest single request (NBD clients send at most 32 MiB by default).
pub const REQUEST_BYTES_MAX: u64 = 64 << 20;

pub struct Volume {
    array: Arc<Array>,
}

impl Volume {
    pub fn new(array: Arc<Array>) -> Volume {
        Volume { array }
    }

    pub fn array(&self) -> &Arc<Array> {
        &self.array
    }

    pub fn size(&self) -> u64 {
        self.array.volume_bytes()
    }

    fn validate(&self, offset: u64, len: u64) -> Result<()> {
        if len > REQUEST_BYTES_MAX {
            return Err(Error::InvalidRequest(format!(
                "request of {len} bytes exceeds the {REQUEST_BYTES_MAX}-byte limit"
            )));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(Error::OutOfRange {
                offset,
                length: len,
                size: self.size(),
            }),
        }
    }

    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.validate(offset, buf.len() as u64)?;
        self.array.read(buf, offset)
    }

    pub fn write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.validate(offset, buf.len() as u64)?;
        self.array.write(buf, offset, fua)
    }

    /// Trim and write-zeroes both leave zeroes behind (whole stripes are
    /// discarded on the media), so reads after a trim are defined.
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.validate(offset, len)?;
        self.array.write_zeroes(offset, len, fua)
    }

    pub fn flush(&self) -> Result<()> {
        self.array.flush()
    }
}
