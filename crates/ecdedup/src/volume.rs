//! The volume: the virtual disk a client sees, mapped onto an array.
//!
//! This is the boundary where untrusted requests arrive (from the NBD
//! frontend): every offset and length is checked here once, against the
//! volume size and the request size limit; the layers below assert instead.
//! Write policies (RMW in place today; parity logging and PARIX later) are
//! chosen at this level.

use crate::array::Array;
use crate::error::{Error, Result};
use crate::fingerprint::Algorithm;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Largest single request (NBD clients send at most 32 MiB by default).
pub const REQUEST_BYTES_MAX: u64 = 64 << 20;

pub struct Volume {
    array: Arc<Array>,
    trace: Option<TraceRecorder>,
}

/// Records every request as one text line (the block-trace format read by
/// `ecdedup sim`, docs/ssd.md):
/// `TIME_US OP OFFSET LENGTH [SHA1HEX:CRC32CHEX ...]`, OP one of W, R, T
/// (trim or write-zeroes), F (flush); writes carry one fingerprint and one
/// CRC per 4 KiB page. The writer is buffered (bounded) and flushed with
/// every flush and at close.
pub struct TraceRecorder {
    out: Mutex<std::io::BufWriter<std::fs::File>>,
    start: Instant,
}

impl TraceRecorder {
    pub fn create(path: &std::path::Path) -> Result<TraceRecorder> {
        let f = std::fs::File::create(path)
            .map_err(|e| Error::io(format!("creating trace {}", path.display()), e))?;
        Ok(TraceRecorder {
            out: Mutex::new(std::io::BufWriter::with_capacity(1 << 20, f)),
            start: Instant::now(),
        })
    }

    fn record(&self, op: char, offset: u64, length: u64, data: Option<&[u8]>) {
        let mut line = format!(
            "{} {op} {offset} {length}",
            self.start.elapsed().as_micros()
        );
        if let Some(data) = data {
            for page in data.chunks(4096) {
                let fp = Algorithm::Sha1.fingerprint(page);
                line.push_str(&format!(" {fp}:{:08x}", crc32c::crc32c(page)));
            }
        }
        line.push('\n');
        let mut out = self.out.lock().unwrap();
        if let Err(e) = out.write_all(line.as_bytes()) {
            eprintln!("ecdedup: trace write failed: {e}");
        }
    }

    fn flush(&self) -> Result<()> {
        self.out
            .lock()
            .unwrap()
            .flush()
            .map_err(|e| Error::io("flushing the trace", e))
    }
}

impl Volume {
    pub fn new(array: Arc<Array>) -> Volume {
        Volume { array, trace: None }
    }

    /// A volume that records a block trace of every request.
    pub fn with_trace(array: Arc<Array>, trace: TraceRecorder) -> Volume {
        Volume {
            array,
            trace: Some(trace),
        }
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
        if let Some(t) = &self.trace {
            t.record('R', offset, buf.len() as u64, None);
        }
        self.array.read(buf, offset)
    }

    pub fn write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.validate(offset, buf.len() as u64)?;
        if let Some(t) = &self.trace {
            t.record('W', offset, buf.len() as u64, Some(buf));
        }
        self.array.write(buf, offset, fua)
    }

    /// Trim and write-zeroes both leave zeroes behind (whole stripes are
    /// discarded on the media), so reads after a trim are defined.
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.validate(offset, len)?;
        if let Some(t) = &self.trace {
            t.record('T', offset, len, None);
        }
        self.array.write_zeroes(offset, len, fua)
    }

    pub fn flush(&self) -> Result<()> {
        if let Some(t) = &self.trace {
            t.record('F', 0, 0, None);
            t.flush()?;
        }
        self.array.flush()
    }

    /// Clean shutdown: trace flushed, array closed.
    pub fn close(&self) -> Result<()> {
        if let Some(t) = &self.trace {
            t.flush()?;
        }
        self.array.close()
    }
}
