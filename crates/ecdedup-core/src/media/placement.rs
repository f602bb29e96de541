//! Write-stream placement hints: paper 003's unique / possibly-duplicate
//! decision, made above the device and passed down with each write so that
//! any device that can place data by stream may use it.
//!
//! [`PlacementFilter`] is the decision: a bounded table of the CRC-32C of
//! pages written so far. A page whose CRC is not in the table is certainly
//! new to the table ([`Stream::Unique`]); one whose CRC is there may
//! duplicate a stored page ([`Stream::PossiblyDuplicate`]), to be settled by
//! a collision-free hash later (the SSD's offline pass). [`PlacementDevice`]
//! is the carrier: a [`Device`] that stacks on a device, classifies every
//! whole 4 KiB page it is asked to write, and forwards runs of pages of one
//! stream with [`Device::write_hinted`] and the stream in the hint. It works
//! wherever it is stacked: right under the array, or under the dedup layer
//! (which writes its slots with plain `write_at`).
//!
//! Who uses the hint: the simulated SSD in mode `hinted` puts unique pages
//! in its U-region and the rest in its ND-region ([`crate::ssd::SsdDevice`]);
//! [`super::FileDevice`] and [`super::MemDevice`] ignore it. On real devices
//! the stream would become an NVMe placement identifier (FDP) or stream
//! identifier (Streams directive), or a Linux write-lifetime hint
//! (`fcntl(F_SET_RW_HINT)`); `docs/ssd.md` ("The write-stream hint") says
//! what each would do with it.
//!
//! Bounds and what they cost: the table has a fixed number of slots
//! ([`PLACEMENT_SLOTS_DEFAULT`], 8 bytes each), direct-mapped by CRC. A
//! slot keeps the last CRC that hashed to it, so (1) a CRC evicted by
//! another can make a later duplicate look unique (a *false unique*: the
//! page lands in the U-region), and (2) CRCs are never removed when their
//! page is overwritten, so a new page may look possibly duplicate (a *false
//! ND*: it lands in the ND-region and the offline pass examines it). Both
//! only move a page to the other region; neither changes what is stored or
//! what dedup finds, because the SSD's offline pass in hint mode looks up
//! every page. A page written in part (not a whole, aligned 4 KiB page) is
//! [`Stream::Unknown`].

use super::{Device, WriteHint};
use crate::counters::IoClass;
use crate::fingerprint::crc32c_prefilter;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Bytes per classified page.
pub const PLACEMENT_PAGE_BYTES: u64 = 4096;
/// Default slots of a filter's CRC table (8 MiB): exact while the distinct
/// CRCs written stay well below it.
pub const PLACEMENT_SLOTS_DEFAULT: usize = 1 << 20;
/// Bounds on the slots of a filter (powers of two).
pub const PLACEMENT_SLOTS_MIN: usize = 16;
pub const PLACEMENT_SLOTS_MAX: usize = 1 << 28;

/// Where a written page should go, as far as the writer can tell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Stream {
    /// No decision (partial pages, writers that do not classify).
    #[default]
    Unknown,
    /// Certainly unique among the pages the filter has seen.
    Unique,
    /// May duplicate a page written before (same CRC).
    PossiblyDuplicate,
}

impl Stream {
    pub fn name(self) -> &'static str {
        match self {
            Stream::Unknown => "unknown",
            Stream::Unique => "unique",
            Stream::PossiblyDuplicate => "possibly-duplicate",
        }
    }
}

/// The CRC prefilter: a bounded, direct-mapped, lock-free table of the
/// CRC-32C of pages written (see the module documentation for its errors).
pub struct PlacementFilter {
    /// `(1 << 32) | crc` of the last CRC that mapped here; 0 when empty.
    slots: Box<[AtomicU64]>,
    shift: u32,
}

impl PlacementFilter {
    /// A filter of `slots` entries, rounded up to a power of two within
    /// [`PLACEMENT_SLOTS_MIN`]..=[`PLACEMENT_SLOTS_MAX`].
    pub fn new(slots: usize) -> PlacementFilter {
        let n = slots
            .clamp(PLACEMENT_SLOTS_MIN, PLACEMENT_SLOTS_MAX)
            .next_power_of_two();
        PlacementFilter {
            slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
            shift: 32 - n.trailing_zeros(),
        }
    }

    /// Classifies one page by its CRC and records the CRC.
    pub fn classify_crc(&self, crc: u32) -> Stream {
        let tag = (1u64 << 32) | crc as u64;
        // Fibonacci hashing spreads CRCs that differ in few bits.
        let slot = (crc.wrapping_mul(0x9e37_79b9) >> self.shift) as usize;
        if self.slots[slot].swap(tag, Relaxed) == tag {
            Stream::PossiblyDuplicate
        } else {
            Stream::Unique
        }
    }

    /// Classifies one whole page by its bytes (CRC-32C) and records it.
    pub fn classify(&self, page: &[u8]) -> Stream {
        self.classify_crc(crc32c_prefilter(page))
    }

    pub fn memory_bytes(&self) -> u64 {
        self.slots.len() as u64 * 8
    }
}

/// Pages a [`PlacementDevice`] forwarded, by stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlacementCounters {
    pub unique_pages: u64,
    pub possibly_duplicate_pages: u64,
    /// Partial pages (bytes not covering a whole aligned page).
    pub unknown_pages: u64,
}

/// A device that classifies every write with a [`PlacementFilter`] and
/// forwards it, split into runs of one stream, with the stream in the hint.
pub struct PlacementDevice<D> {
    inner: D,
    filter: PlacementFilter,
    unique: AtomicU64,
    possibly_duplicate: AtomicU64,
    unknown: AtomicU64,
}

impl<D: Device> PlacementDevice<D> {
    pub fn new(inner: D, slots: usize) -> PlacementDevice<D> {
        PlacementDevice {
            inner,
            filter: PlacementFilter::new(slots),
            unique: AtomicU64::new(0),
            possibly_duplicate: AtomicU64::new(0),
            unknown: AtomicU64::new(0),
        }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    pub fn counters(&self) -> PlacementCounters {
        PlacementCounters {
            unique_pages: self.unique.load(Relaxed),
            possibly_duplicate_pages: self.possibly_duplicate.load(Relaxed),
            unknown_pages: self.unknown.load(Relaxed),
        }
    }

    /// The stream of the page piece `bytes` at device offset `at`.
    fn stream_of(&self, bytes: &[u8], at: u64) -> Stream {
        let (stream, counter) = if at.is_multiple_of(PLACEMENT_PAGE_BYTES)
            && bytes.len() as u64 == PLACEMENT_PAGE_BYTES
        {
            match self.filter.classify(bytes) {
                Stream::PossiblyDuplicate => (Stream::PossiblyDuplicate, &self.possibly_duplicate),
                _ => (Stream::Unique, &self.unique),
            }
        } else {
            (Stream::Unknown, &self.unknown)
        };
        counter.fetch_add(1, Relaxed);
        stream
    }

    fn forward(&self, buf: &[u8], offset: u64, hint: WriteHint) -> io::Result<()> {
        // Split at page boundaries; merge neighbours of one stream.
        let mut run_start = 0usize;
        let mut run_stream = None;
        let mut at = 0usize;
        while at < buf.len() {
            let pos = offset + at as u64;
            let n = (PLACEMENT_PAGE_BYTES - pos % PLACEMENT_PAGE_BYTES).min((buf.len() - at) as u64)
                as usize;
            let stream = self.stream_of(&buf[at..at + n], pos);
            match run_stream {
                Some(s) if s == stream => {}
                Some(s) => {
                    self.inner.write_hinted(
                        &buf[run_start..at],
                        offset + run_start as u64,
                        WriteHint { stream: s, ..hint },
                    )?;
                    run_start = at;
                    run_stream = Some(stream);
                }
                None => run_stream = Some(stream),
            }
            at += n;
        }
        if let Some(s) = run_stream {
            self.inner.write_hinted(
                &buf[run_start..],
                offset + run_start as u64,
                WriteHint { stream: s, ..hint },
            )?;
        }
        Ok(())
    }
}

impl<D: Device> Device for PlacementDevice<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.forward(buf, offset, WriteHint::new(IoClass::Data))
    }

    fn write_hinted(&self, buf: &[u8], offset: u64, hint: WriteHint) -> io::Result<()> {
        self.forward(buf, offset, hint)
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.discard(offset, len)
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn describe(&self) -> String {
        format!("placement:{}", self.inner.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::MemDevice;
    use std::sync::Mutex;

    /// Records the hint of every write it is given.
    struct HintLog {
        inner: MemDevice,
        writes: Mutex<Vec<(u64, usize, Stream)>>,
    }

    impl Device for HintLog {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.write_hinted(buf, offset, WriteHint::new(IoClass::Data))
        }
        fn write_hinted(&self, buf: &[u8], offset: u64, hint: WriteHint) -> io::Result<()> {
            self.writes
                .lock()
                .unwrap()
                .push((offset, buf.len(), hint.stream));
            self.inner.write_at(buf, offset)
        }
        fn sync(&self) -> io::Result<()> {
            Ok(())
        }
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn describe(&self) -> String {
            "hint-log".into()
        }
    }

    fn page(fill: u8) -> Vec<u8> {
        vec![fill; PLACEMENT_PAGE_BYTES as usize]
    }

    #[test]
    fn a_second_copy_of_a_page_is_possibly_duplicate_and_a_new_page_unique() {
        let f = PlacementFilter::new(1024);
        assert_eq!(f.classify(&page(1)), Stream::Unique);
        assert_eq!(f.classify(&page(2)), Stream::Unique);
        assert_eq!(f.classify(&page(1)), Stream::PossiblyDuplicate);
        assert_eq!(f.memory_bytes(), 1024 * 8);
    }

    #[test]
    fn the_filter_is_bounded_and_forgets_evicted_crcs() {
        let f = PlacementFilter::new(1);
        assert_eq!(f.slots.len(), PLACEMENT_SLOTS_MIN);
        // More distinct CRCs than slots: some first copy is evicted, so
        // writing every CRC again finds fewer duplicates than CRCs.
        for crc in 0..1000u32 {
            f.classify_crc(crc);
        }
        let found = (0..1000u32)
            .filter(|&crc| f.classify_crc(crc) == Stream::PossiblyDuplicate)
            .count();
        assert!(found < 1000, "{found}");
    }

    #[test]
    fn a_write_is_split_into_runs_of_one_stream_and_the_hint_reaches_the_device() {
        let dev = PlacementDevice::new(
            HintLog {
                inner: MemDevice::new("hint-log", 1 << 20),
                writes: Mutex::new(Vec::new()),
            },
            1024,
        );
        let mut buf = Vec::new();
        for fill in [1, 2, 1, 1, 3] {
            buf.extend_from_slice(&page(fill));
        }
        dev.write_at(&buf, 8192).unwrap();
        // A write of 100 bytes into a page: partial, unknown.
        dev.write_at(&[7; 100], 4096 * 20 + 5).unwrap();
        let writes = dev.inner().writes.lock().unwrap().clone();
        assert_eq!(
            writes,
            vec![
                (8192, 8192, Stream::Unique),
                (8192 + 8192, 8192, Stream::PossiblyDuplicate),
                (8192 + 16384, 4096, Stream::Unique),
                (4096 * 20 + 5, 100, Stream::Unknown),
            ]
        );
        assert_eq!(
            dev.counters(),
            PlacementCounters {
                unique_pages: 3,
                possibly_duplicate_pages: 2,
                unknown_pages: 1,
            }
        );
        let mut back = vec![0; buf.len()];
        dev.read_at(&mut back, 8192).unwrap();
        assert_eq!(back, buf);
    }
}
