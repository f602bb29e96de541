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

/// Largest single request that carries data (NBD clients send at most
/// 32 MiB by default). Trim and write-zeroes carry none and are processed a
/// stripe at a time, so only the volume's end bounds them (`mkfs` trims the
/// whole device in requests of up to 4 GiB).
pub const REQUEST_BYTES_MAX: u64 = 64 << 20;

pub struct Volume {
    array: Arc<Array>,
    trace: Option<TraceRecorder>,
    /// The test fault of [`FAULT_PANIC_ON_WRITE_ENV`], if set.
    panic_on_write_at: Option<u64>,
}

/// Test fault: names a volume offset; a write starting there panics once
/// the array has taken it, before the client's answer. The tests of the
/// server's fail-stop on a bug (`tests/operations.rs`) set it; it is read
/// once, when the volume is made.
pub const FAULT_PANIC_ON_WRITE_ENV: &str = "ECDEDUP_TEST_PANIC_ON_WRITE_AT";

fn fault_panic_on_write_at() -> Option<u64> {
    std::env::var(FAULT_PANIC_ON_WRITE_ENV).ok()?.parse().ok()
}

/// Records a block trace of the requests that succeeded, in the format
/// `ecdedup sim` replays (`docs/ssd.md`, "Trace formats"; parsed by
/// [`crate::ssd::trace`]): one line per request,
/// `TIME_US OP OFFSET LENGTH [SHA1HEX CRC32CHEX]...`, OP one of W (write),
/// R (read), T (trim or write-zeroes), F (flush, offset and length 0).
/// TIME_US is the request's arrival, in microseconds since the recorder
/// started; a line is written when the request has succeeded, so lines of
/// concurrent requests may appear out of time order (the replay copes).
///
/// Offsets and lengths are whole 4 KiB pages. A request that covers part of
/// a page is widened to the pages it touches: a read is recorded over the
/// covering pages; an unaligned write is recorded as a write of the
/// covering pages, fingerprinted from what they hold after it (read back
/// from the array); a trim records its whole pages as T and the partial
/// pages at its edges as a write of their content after it (zeroes where it
/// trimmed). The read-back is a second, separate array read, so a
/// concurrent write to the same page between the two may lend the trace
/// that writer's bytes: the trace is a faithful record of what was written
/// where, and an approximate one of its interleaving.
///
/// The writer is buffered (1 MiB) and flushed with every flush and at
/// close. A failed trace write is latched: recording stops, a warning is
/// printed once, and [`Volume::close`] reports the error.
pub struct TraceRecorder {
    out: Mutex<TraceOut>,
    start: Instant,
}

struct TraceOut {
    writer: std::io::BufWriter<std::fs::File>,
    /// The first write error; nothing is recorded after it.
    failed: Option<String>,
}

/// The page size of trace fingerprints (the simulator's trace pages).
pub const TRACE_PAGE_BYTES: u64 = 4096;

impl TraceRecorder {
    pub fn create(path: &std::path::Path) -> Result<TraceRecorder> {
        let f = std::fs::File::create(path)
            .map_err(|e| Error::io(format!("creating trace {}", path.display()), e))?;
        let mut writer = std::io::BufWriter::with_capacity(1 << 20, f);
        writeln!(writer, "{}", crate::ssd::trace::ECDEDUP_HEADER)
            .map_err(|e| Error::io(format!("writing trace {}", path.display()), e))?;
        Ok(TraceRecorder {
            out: Mutex::new(TraceOut {
                writer,
                failed: None,
            }),
            start: Instant::now(),
        })
    }

    /// Microseconds since the recorder started: a request's arrival time.
    fn now_us(&self) -> u128 {
        self.start.elapsed().as_micros()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TraceOut> {
        // A panic while holding the lock leaves at worst a partial line.
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes one line; `pages` are whole 4 KiB pages of a write. The
    /// line (and its hashing) is built before taking the lock, so that
    /// concurrent requests hash in parallel.
    fn record(&self, time_us: u128, op: char, offset: u64, length: u64, pages: Option<&[u8]>) {
        use std::fmt::Write as _;
        let page_count = pages.map_or(0, |d| d.len() / TRACE_PAGE_BYTES as usize);
        let mut line = String::with_capacity(40 + page_count * 50);
        let _ = write!(line, "{time_us} {op} {offset} {length}");
        if let Some(data) = pages {
            debug_assert_eq!(data.len() as u64, length);
            for page in data.chunks(TRACE_PAGE_BYTES as usize) {
                let fp = Algorithm::Sha1.fingerprint(page);
                let _ = write!(line, " {fp} {:08x}", crc32c::crc32c(page));
            }
        }
        line.push('\n');
        let mut out = self.lock();
        if out.failed.is_some() {
            return;
        }
        if let Err(e) = out.writer.write_all(line.as_bytes()) {
            eprintln!("ecdedup: trace write failed, recording stops: {e}");
            out.failed = Some(e.to_string());
        }
    }

    fn flush(&self) -> Result<()> {
        let mut out = self.lock();
        if let Some(e) = &out.failed {
            return Err(Error::Other(format!("the block trace failed earlier: {e}")));
        }
        if let Err(e) = out.writer.flush() {
            out.failed = Some(e.to_string());
            return Err(Error::io("flushing the trace", e));
        }
        Ok(())
    }
}

/// The whole 4 KiB pages covering `[offset, offset + len)`: (start, length).
fn covering_pages(offset: u64, len: u64) -> (u64, u64) {
    let start = offset / TRACE_PAGE_BYTES * TRACE_PAGE_BYTES;
    let end = (offset + len).div_ceil(TRACE_PAGE_BYTES) * TRACE_PAGE_BYTES;
    (start, end - start)
}

impl Volume {
    /// Records a write that succeeded over `[offset, offset + buf.len())`;
    /// an unaligned one is widened and its pages read back.
    fn trace_write(&self, t: &TraceRecorder, time_us: u128, buf: &[u8], offset: u64) {
        let len = buf.len() as u64;
        if len == 0 {
            return;
        }
        let (start, span) = covering_pages(offset, len);
        if start == offset && span == len {
            t.record(time_us, 'W', offset, len, Some(buf));
            return;
        }
        self.trace_read_back(t, time_us, start, span);
    }

    /// Records a write of the pages `[start, start + span)` with their
    /// current content (for widened writes and trimmed page edges).
    fn trace_read_back(&self, t: &TraceRecorder, time_us: u128, start: u64, span: u64) {
        // The widened span may pass the volume's end only if the volume
        // size is not a page multiple; record what exists.
        let span = span.min(self.size().saturating_sub(start));
        if span == 0 {
            return;
        }
        let mut pages = vec![0u8; span as usize];
        match self.array.read(&mut pages, start) {
            Ok(()) => {
                let whole = span / TRACE_PAGE_BYTES * TRACE_PAGE_BYTES;
                if whole > 0 {
                    t.record(time_us, 'W', start, whole, Some(&pages[..whole as usize]));
                }
            }
            Err(e) => eprintln!("ecdedup: trace: reading back {span} bytes at {start}: {e}"),
        }
    }

    /// Records a trim that succeeded: its whole pages as T, its partial
    /// edge pages as writes of what they now hold.
    fn trace_trim(&self, t: &TraceRecorder, time_us: u128, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let end = offset + len;
        let inner_start = offset.div_ceil(TRACE_PAGE_BYTES) * TRACE_PAGE_BYTES;
        let inner_end = end / TRACE_PAGE_BYTES * TRACE_PAGE_BYTES;
        if inner_start >= inner_end {
            let (start, span) = covering_pages(offset, len);
            self.trace_read_back(t, time_us, start, span);
            return;
        }
        if inner_start > offset {
            self.trace_read_back(t, time_us, inner_start - TRACE_PAGE_BYTES, TRACE_PAGE_BYTES);
        }
        t.record(time_us, 'T', inner_start, inner_end - inner_start, None);
        if inner_end < end {
            self.trace_read_back(t, time_us, inner_end, TRACE_PAGE_BYTES);
        }
    }
}

/// Checks a request that carries `len` bytes of data against a volume of
/// `size` bytes: the request bound, then the range.
pub fn check_request(offset: u64, len: u64, size: u64) -> Result<()> {
    if len > REQUEST_BYTES_MAX {
        return Err(Error::InvalidRequest(format!(
            "request of {len} bytes exceeds the {REQUEST_BYTES_MAX}-byte limit"
        )));
    }
    check_range(offset, len, size)
}

/// Checks that `offset..offset + len` lies inside a volume of `size` bytes.
pub fn check_range(offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::OutOfRange {
            offset,
            length: len,
            size,
        }),
    }
}

impl Volume {
    pub fn new(array: Arc<Array>) -> Volume {
        Volume {
            array,
            trace: None,
            panic_on_write_at: fault_panic_on_write_at(),
        }
    }

    /// A volume that records a block trace of every request.
    pub fn with_trace(array: Arc<Array>, trace: TraceRecorder) -> Volume {
        Volume {
            array,
            trace: Some(trace),
            panic_on_write_at: fault_panic_on_write_at(),
        }
    }

    pub fn array(&self) -> &Arc<Array> {
        &self.array
    }

    pub fn size(&self) -> u64 {
        self.array.volume_bytes()
    }

    /// Checks a request that carries `len` bytes of data.
    fn validate(&self, offset: u64, len: u64) -> Result<()> {
        check_request(offset, len, self.size())
    }

    /// Checks that `offset..offset + len` lies inside the volume.
    fn validate_range(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.size())
    }

    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.validate(offset, buf.len() as u64)?;
        let Some(t) = &self.trace else {
            return self.array.read(buf, offset);
        };
        let time_us = t.now_us();
        self.array.read(buf, offset)?;
        if !buf.is_empty() {
            let (start, span) = covering_pages(offset, buf.len() as u64);
            t.record(time_us, 'R', start, span, None);
        }
        Ok(())
    }

    pub fn write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.validate(offset, buf.len() as u64)?;
        let Some(t) = &self.trace else {
            self.array.write(buf, offset, fua)?;
            self.test_fault(offset);
            return Ok(());
        };
        let time_us = t.now_us();
        self.array.write(buf, offset, fua)?;
        self.test_fault(offset);
        self.trace_write(t, time_us, buf, offset);
        Ok(())
    }

    /// The fault of [`FAULT_PANIC_ON_WRITE_ENV`].
    fn test_fault(&self, offset: u64) {
        if self.panic_on_write_at == Some(offset) {
            panic!("test fault {FAULT_PANIC_ON_WRITE_ENV}: a write at {offset}");
        }
    }

    /// Trim and write-zeroes both leave zeroes behind (whole stripes are
    /// discarded on the media), so reads after a trim are defined.
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.validate_range(offset, len)?;
        let Some(t) = &self.trace else {
            return self.array.write_zeroes(offset, len, fua);
        };
        let time_us = t.now_us();
        self.array.write_zeroes(offset, len, fua)?;
        self.trace_trim(t, time_us, offset, len);
        Ok(())
    }

    pub fn flush(&self) -> Result<()> {
        let Some(t) = &self.trace else {
            return self.array.flush();
        };
        let time_us = t.now_us();
        self.array.flush()?;
        t.record(time_us, 'F', 0, 0, None);
        t.flush()
    }

    /// Clean shutdown: trace flushed, array closed.
    pub fn close(&self) -> Result<()> {
        let traced = self.trace.as_ref().map_or(Ok(()), |t| t.flush());
        self.array.close()?;
        traced
    }
}
