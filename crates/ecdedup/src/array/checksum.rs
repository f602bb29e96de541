//! Per-block CRC32C tables, one per device, held whole in RAM (4 bytes per
//! 4 KiB block: 0.1% of the device) and written back page by page.
//!
//! On disk an entry stores `crc ^ ZERO_BLOCK_CRC`, so a zero-filled area
//! (a fresh sparse file, a punched hole) describes all-zero blocks: creating
//! an array writes no table, and a discard needs no table rewrite beyond the
//! entries it resets. Entries changed since the last flush are tracked per
//! 4 KiB table page; the write-intent log covers them until they are flushed
//! (see docs/format.md).

use crate::counters::{DeviceCounters, IoClass};
use crate::media::Device;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

const ENTRIES_PER_PAGE: u64 = 1024;
const PAGE_BYTES: usize = 4096;

/// CRC32C of an all-zero block of `block_bytes`.
pub fn zero_block_crc(block_bytes: usize) -> u32 {
    static ZERO_4K: OnceLock<u32> = OnceLock::new();
    assert_eq!(block_bytes, 4096);
    *ZERO_4K.get_or_init(|| crc32c::crc32c(&[0u8; 4096]))
}

pub struct ChecksumTable {
    entries: Vec<AtomicU32>,
    dirty_pages: Vec<AtomicU64>,
    offset: u64,
    zero_crc: u32,
}

impl ChecksumTable {
    /// A table for `blocks` blocks, every entry describing a zero block.
    pub fn new_zeroed(blocks: u64, offset: u64, block_bytes: usize) -> ChecksumTable {
        let zero_crc = zero_block_crc(block_bytes);
        let pages = blocks.div_ceil(ENTRIES_PER_PAGE);
        ChecksumTable {
            entries: (0..blocks).map(|_| AtomicU32::new(zero_crc)).collect(),
            dirty_pages: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            offset,
            zero_crc,
        }
    }

    /// Loads the table from a device.
    pub fn load(
        dev: &dyn Device,
        counters: &DeviceCounters,
        blocks: u64,
        offset: u64,
        block_bytes: usize,
    ) -> io::Result<ChecksumTable> {
        let table = ChecksumTable::new_zeroed(blocks, offset, block_bytes);
        let bytes = (blocks * 4).div_ceil(PAGE_BYTES as u64) * PAGE_BYTES as u64;
        let mut buf = vec![0u8; (1 << 20).min(bytes as usize)];
        let mut done = 0u64;
        while done < bytes {
            let n = (bytes - done).min(buf.len() as u64) as usize;
            dev.read_at(&mut buf[..n], offset + done)?;
            counters.read(IoClass::Metadata, n);
            for (j, chunk) in buf[..n].chunks_exact(4).enumerate() {
                let i = done / 4 + j as u64;
                if i < blocks {
                    let stored = u32::from_le_bytes(chunk.try_into().unwrap());
                    table.entries[i as usize].store(stored ^ table.zero_crc, Relaxed);
                }
            }
            done += n as u64;
        }
        Ok(table)
    }

    pub fn get(&self, index: u64) -> u32 {
        self.entries[index as usize].load(Relaxed)
    }

    pub fn set(&self, index: u64, crc: u32) {
        self.entries[index as usize].store(crc, Relaxed);
        self.mark_dirty(index / ENTRIES_PER_PAGE);
    }

    pub fn set_zero(&self, index: u64) {
        self.set(index, self.zero_crc);
    }

    /// Every entry back to "zero block", all pages dirty (a wiped device).
    pub fn reset_zeroed(&self) {
        for e in &self.entries {
            e.store(self.zero_crc, Relaxed);
        }
        for w in &self.dirty_pages {
            w.store(u64::MAX, Relaxed);
        }
    }

    /// A copy of the entries in RAM, with no page dirty: what a replaced
    /// device's blocks should decode to until the rebuild rewrites them.
    pub fn duplicate(&self) -> ChecksumTable {
        ChecksumTable {
            entries: self
                .entries
                .iter()
                .map(|e| AtomicU32::new(e.load(Relaxed)))
                .collect(),
            dirty_pages: self.dirty_pages.iter().map(|_| AtomicU64::new(0)).collect(),
            offset: self.offset,
            zero_crc: self.zero_crc,
        }
    }

    pub fn ram_bytes(&self) -> u64 {
        (self.entries.len() * 4 + self.dirty_pages.len() * 8) as u64
    }

    /// Writes every page changed since the last flush. A page's dirty bit is
    /// cleared before its entries are read, so a concurrent `set` re-marks it.
    pub fn flush(&self, dev: &dyn Device, counters: &DeviceCounters) -> io::Result<()> {
        for page in self.take_dirty_pages() {
            dev.write_at(&page.bytes, page.offset)
                .inspect_err(|_| self.mark_dirty(page.page))?;
            counters.write(IoClass::Metadata, page.bytes.len());
        }
        Ok(())
    }

    /// The images of every dirty page, clearing their dirty marks: the
    /// caller writes them (in one batch with other devices' pages) and
    /// calls [`ChecksumTable::mark_dirty`] for each page whose write failed.
    pub fn take_dirty_pages(&self) -> Vec<DirtyPage> {
        let mut out = Vec::new();
        for (word_index, word) in self.dirty_pages.iter().enumerate() {
            let bits = word.swap(0, Relaxed);
            for bit in (0..64).filter(|b| bits & (1 << b) != 0) {
                let page = word_index as u64 * 64 + bit;
                if page < self.pages() {
                    out.push(DirtyPage {
                        page,
                        offset: self.offset + page * PAGE_BYTES as u64,
                        bytes: self.page_image(page),
                    });
                }
            }
        }
        out
    }

    /// Marks a page dirty again (its write failed).
    pub fn mark_dirty(&self, page: u64) {
        self.dirty_pages[(page / 64) as usize].fetch_or(1 << (page % 64), Relaxed);
    }

    fn pages(&self) -> u64 {
        (self.entries.len() as u64).div_ceil(ENTRIES_PER_PAGE)
    }

    fn page_image(&self, page: u64) -> Vec<u8> {
        let mut buf = vec![0u8; PAGE_BYTES];
        let first = page * ENTRIES_PER_PAGE;
        let last = (first + ENTRIES_PER_PAGE).min(self.entries.len() as u64);
        for (i, out) in (first..last).zip(buf.chunks_exact_mut(4)) {
            let stored = self.entries[i as usize].load(Relaxed) ^ self.zero_crc;
            out.copy_from_slice(&stored.to_le_bytes());
        }
        buf
    }
}

/// A checksum page to write: its number, device offset and bytes.
pub struct DirtyPage {
    pub page: u64,
    pub offset: u64,
    pub bytes: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::MemDevice;

    #[test]
    fn a_zeroed_area_describes_zero_blocks_and_flushed_entries_reload() {
        let dev = MemDevice::new("t", 64 << 10);
        let c = DeviceCounters::default();
        let t = ChecksumTable::load(&dev, &c, 3000, 8192, 4096).unwrap();
        assert_eq!(t.get(2999), crc32c::crc32c(&[0u8; 4096]));
        t.set(1500, 0xdead_beef);
        t.set(7, 1);
        t.flush(&dev, &c).unwrap();
        let u = ChecksumTable::load(&dev, &c, 3000, 8192, 4096).unwrap();
        assert_eq!(u.get(1500), 0xdead_beef);
        assert_eq!(u.get(7), 1);
        assert_eq!(u.get(8), zero_block_crc(4096));
    }
}
