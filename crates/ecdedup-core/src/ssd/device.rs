//! [`SsdDevice`]: a simulated SSD as a [`Device`], so an array (or anything
//! above media) can run on it, with the FTL's counters as evidence.
//!
//! Byte offsets map to logical pages of the FTL (`offset / page_bytes`). A
//! write covering a whole page writes it; a write covering part of a page
//! reads the page, patches it and writes it back (read-modify-write, one
//! host page read and one host page write). `discard` trims the pages it
//! covers entirely and writes zeroes over the partial pages at its edges, so
//! the whole range reads as zeroes afterwards. `sync` is a no-op: the
//! simulated flash is the memory itself, and every completed write is as
//! durable as it will ever be. `write_hinted` honours `repair` (see
//! [`Ftl::write_repair`]) and passes the placement stream to the FTL
//! ([`Ftl::write_placed`]): in mode `hinted` it picks the U- or ND-region
//! (paper 003's separation decided by the writer, e.g. a
//! [`crate::media::PlacementDevice`] stacked on this device); other modes
//! count it. The data/parity class is not used for placement.
//!
//! Invariants: the device size is the FTL's logical space; a request that
//! does not fit is refused with an error before any page changes; the FTL
//! runs in contents mode, so reads return the bytes written.

use super::ftl::{Ftl, FtlConfig, FtlReport, PageData, StoreMode};
use crate::error::{Error, Result};
use crate::media::{Device, Stream, WriteHint};
use std::io;
use std::sync::Mutex;

pub struct SsdDevice {
    ftl: Mutex<Ftl>,
    name: String,
    page_bytes: u64,
    size: u64,
}

impl SsdDevice {
    /// A fresh simulated SSD; the store mode is forced to contents.
    pub fn new(name: &str, mut cfg: FtlConfig) -> Result<SsdDevice> {
        cfg.store = StoreMode::Contents;
        let ftl = Ftl::new(cfg)?;
        let page_bytes = ftl.page_bytes() as u64;
        let size = ftl.logical_pages() * page_bytes;
        Ok(SsdDevice {
            ftl: Mutex::new(ftl),
            name: name.to_owned(),
            page_bytes,
            size,
        })
    }

    /// A device of at least `size_bytes` with the given settings otherwise
    /// (`cfg.blocks` is replaced by the smallest count that holds it).
    pub fn with_size(name: &str, size_bytes: u64, mut cfg: FtlConfig) -> Result<SsdDevice> {
        let pages = size_bytes.div_ceil(cfg.page_bytes.max(1) as u64);
        let blocks = cfg.blocks_for(pages);
        cfg.blocks = u32::try_from(blocks).map_err(|_| {
            Error::Config(format!("SSD of {size_bytes} bytes needs too many blocks"))
        })?;
        SsdDevice::new(name, cfg)
    }

    /// The FTL's counters and derived figures.
    pub fn report(&self) -> FtlReport {
        self.lock().report()
    }

    /// Runs an offline dedup pass over up to `pages_max` new contents (what
    /// an idle SSD would do); returns the contents hashed.
    pub fn offline_pass(&self, pages_max: u64) -> u64 {
        self.lock().offline_pass(pages_max)
    }

    /// Direct access to the FTL (tests, consistency checks).
    pub fn with_ftl<R>(&self, f: impl FnOnce(&mut Ftl) -> R) -> R {
        f(&mut self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ftl> {
        // A panic inside the FTL is a broken invariant; the state is not
        // trusted after it, so poisoning propagates as a panic too.
        self.ftl.lock().expect("SSD simulator state poisoned")
    }

    fn range_check(&self, len: u64, offset: u64) -> io::Result<()> {
        super::device::range_check(&self.describe(), self.size, len, offset)
    }

    /// Splits `[offset, offset + len)` into (page, start in page, length).
    fn pages(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, usize, usize)> {
        super::device::split_pages(self.page_bytes, offset, len)
    }

    fn write_pages(&self, buf: &[u8], offset: u64, repair: bool, stream: Stream) -> io::Result<()> {
        self.range_check(buf.len() as u64, offset)?;
        let mut ftl = self.lock();
        let mut page = vec![0u8; self.page_bytes as usize];
        let mut done = 0;
        for (lpn, start, n) in self.pages(offset, buf.len() as u64) {
            let src = &buf[done..done + n];
            let bytes: &[u8] = if n == page.len() {
                src
            } else {
                ftl.read(lpn, &mut page);
                page[start..start + n].copy_from_slice(src);
                &page
            };
            if repair {
                ftl.write_repair(lpn, bytes);
            } else {
                ftl.write_placed(lpn, PageData::Bytes(bytes), stream);
            }
            done += n;
        }
        Ok(())
    }
}

impl Device for SsdDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.range_check(buf.len() as u64, offset)?;
        let mut ftl = self.lock();
        let mut page = vec![0u8; self.page_bytes as usize];
        let mut done = 0;
        for (lpn, start, n) in self.pages(offset, buf.len() as u64) {
            if n == page.len() {
                ftl.read(lpn, &mut buf[done..done + n]);
            } else {
                ftl.read(lpn, &mut page);
                buf[done..done + n].copy_from_slice(&page[start..start + n]);
            }
            done += n;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_pages(buf, offset, false, Stream::Unknown)
    }

    fn write_hinted(&self, buf: &[u8], offset: u64, hint: WriteHint) -> io::Result<()> {
        self.write_pages(buf, offset, hint.repair, hint.stream)
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.range_check(len, offset)?;
        let mut ftl = self.lock();
        let zero = vec![0u8; self.page_bytes as usize];
        let mut page = vec![0u8; self.page_bytes as usize];
        for (lpn, start, n) in self.pages(offset, len) {
            if n == page.len() {
                ftl.trim(lpn);
            } else {
                ftl.read(lpn, &mut page);
                if page == zero {
                    continue;
                }
                page[start..start + n].fill(0);
                ftl.write(lpn, PageData::Bytes(&page));
            }
        }
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn describe(&self) -> String {
        format!("ssd:{}", self.name)
    }
}

/// Refuses `len` bytes at `offset` beyond a device of `size` bytes.
pub(super) fn range_check(what: &str, size: u64, len: u64, offset: u64) -> io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{what}: {len} bytes at {offset} beyond the end ({size} bytes)"),
        )),
    }
}

/// Splits `[offset, offset + len)` into (page, start in page, length) for
/// pages of `page_bytes`.
pub(super) fn split_pages(
    page_bytes: u64,
    offset: u64,
    len: u64,
) -> impl Iterator<Item = (u64, usize, usize)> {
    let end = offset + len;
    let mut at = offset;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let page = at / page_bytes;
        let start = at % page_bytes;
        let n = (page_bytes - start).min(end - at);
        at += n;
        Some((page, start as usize, n as usize))
    })
}
