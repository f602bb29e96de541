//! [`WearDevice`]: flash-wear accounting stacked on any [`Device`], so a
//! whole array's wear can be measured under real I/O (`ecdedup create
//! --ssd-sim MODE`).
//!
//! The inner device (a file or block device) holds the data; every read
//! passes through untouched. Every write and discard that succeeds on the
//! inner device is then fed, 4 KiB page by 4 KiB page, into an FTL in
//! fingerprints store mode ([`StoreMode::Fingerprints`]): each page is
//! described by a 128-bit BLAKE3 digest and its CRC-32C, never by its
//! bytes, so the simulation costs tens of bytes of RAM per 4 KiB of device.
//! GC copies, erases, write amplification and the wear spread therefore
//! come from the array's real write stream, with the FTL dedup mode the
//! configuration names (paper 003's modes; `plain` = no dedup in the SSD).
//! A write that covers part of a page reads the whole page back from the
//! inner device after the write, to fingerprint what the page now holds.
//! Placement hints ([`WriteHint::stream`]) reach the FTL (mode `hinted`
//! places by them) and the inner device alike. `sync` runs the offline
//! dedup pass of the offline modes over every content written since the
//! last one: a flush is the idle point an SSD would use.
//!
//! Geometry: 4 KiB pages; 256 pages per block, halved (down to 16) while
//! the device would have fewer than 256 blocks; the block count is the
//! smallest that holds the device with the configured over-provisioning
//! and leaves GC its spare blocks ([`FtlConfig::blocks_for`]), so small
//! devices get more spare space than asked (the stats report the
//! effective share).
//!
//! Invariants: the FTL starts empty at every open, so the counters cover
//! one open of the array (one `serve` session: the experiment's unit), and
//! its logical space covers the whole inner device, so every request the
//! range check admits maps to FTL pages. The FTL sees a write only after
//! the inner device accepted it; concurrent writes to one page may be
//! recorded in either order (the counters stay exact; only which content
//! an offline pass believes the page holds may differ).

use super::ftl::{DedupMode, Ftl, FtlConfig, FtlReport, PageData, PageFingerprint, StoreMode};
use crate::error::{Error, Result};
use crate::fingerprint::crc32c_prefilter;
use crate::media::{Device, Stream, WriteHint};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

/// Page size of the simulated flash.
pub const WEAR_PAGE_BYTES: u32 = 4096;
/// Pages per block on large devices.
pub const WEAR_PAGES_PER_BLOCK_MAX: u32 = 256;
/// Pages per block never go below this on small devices.
pub const WEAR_PAGES_PER_BLOCK_MIN: u32 = 16;
/// Below this many blocks the pages per block are halved.
const BLOCKS_WANTED_MIN: u64 = 256;
/// Default over-provisioning, percent of physical pages.
pub const SSD_OP_PERCENT_DEFAULT: f64 = 7.0;

/// Whether the array's devices carry a simulated SSD, and its dedup mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SsdSimMode {
    /// No simulation (the default).
    #[default]
    Off,
    /// An FTL without dedup.
    Plain,
    Inline,
    Offline,
    Separated,
    Hinted,
}

impl SsdSimMode {
    /// The FTL dedup mode, None when off.
    pub fn ftl_mode(self) -> Option<DedupMode> {
        match self {
            SsdSimMode::Off => None,
            SsdSimMode::Plain => Some(DedupMode::None),
            SsdSimMode::Inline => Some(DedupMode::Inline),
            SsdSimMode::Offline => Some(DedupMode::Offline),
            SsdSimMode::Separated => Some(DedupMode::OfflineSeparated),
            SsdSimMode::Hinted => Some(DedupMode::OfflineHinted),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SsdSimMode::Off => "none",
            SsdSimMode::Plain => "plain",
            SsdSimMode::Inline => "inline",
            SsdSimMode::Offline => "offline",
            SsdSimMode::Separated => "separated",
            SsdSimMode::Hinted => "hinted",
        }
    }
}

impl fmt::Display for SsdSimMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SsdSimMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<SsdSimMode> {
        match s {
            "none" | "off" => Ok(SsdSimMode::Off),
            "plain" => Ok(SsdSimMode::Plain),
            "inline" => Ok(SsdSimMode::Inline),
            "offline" => Ok(SsdSimMode::Offline),
            "separated" => Ok(SsdSimMode::Separated),
            "hinted" => Ok(SsdSimMode::Hinted),
            _ => Err(Error::Config(format!(
                "--ssd-sim {s:?} is not one of none, plain, inline, offline, separated, hinted"
            ))),
        }
    }
}

/// A device as the array uses it, and its wear layer (None when off).
pub type Wrapped = (Arc<dyn Device>, Option<Arc<WearDevice>>);

/// The `ssd_sim` entry of `array.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SsdSimConfig {
    #[serde(default)]
    pub mode: SsdSimMode,
    /// Share of physical pages hidden from the logical space, percent.
    #[serde(default = "default_op_percent")]
    pub over_provisioning_percent: f64,
}

fn default_op_percent() -> f64 {
    SSD_OP_PERCENT_DEFAULT
}

impl Default for SsdSimConfig {
    fn default() -> SsdSimConfig {
        SsdSimConfig {
            mode: SsdSimMode::Off,
            over_provisioning_percent: SSD_OP_PERCENT_DEFAULT,
        }
    }
}

impl SsdSimConfig {
    /// Refuses over-provisioning outside (0, 90] percent.
    pub fn validate(&self) -> Result<()> {
        let op = self.over_provisioning_percent;
        if !(op > 0.0 && op <= 90.0) {
            return Err(Error::Config(format!(
                "--ssd-op {op} is not a percentage in (0, 90]"
            )));
        }
        Ok(())
    }

    /// The FTL geometry for a device of `size_bytes` (None when off).
    pub fn ftl_config(&self, size_bytes: u64) -> Result<Option<FtlConfig>> {
        let Some(mode) = self.mode.ftl_mode() else {
            return Ok(None);
        };
        self.validate()?;
        let pages = size_bytes.div_ceil(WEAR_PAGE_BYTES as u64).max(1);
        let mut ppb = WEAR_PAGES_PER_BLOCK_MAX;
        while ppb > WEAR_PAGES_PER_BLOCK_MIN && pages / (ppb as u64) < BLOCKS_WANTED_MIN {
            ppb /= 2;
        }
        let mut cfg = FtlConfig::new(
            WEAR_PAGE_BYTES,
            ppb,
            1,
            self.over_provisioning_percent / 100.0,
        );
        cfg.dedup = mode;
        cfg.store = StoreMode::Fingerprints;
        cfg.blocks = u32::try_from(cfg.blocks_for(pages)).map_err(|_| {
            Error::Config(format!(
                "simulated SSD of {size_bytes} bytes needs too many blocks"
            ))
        })?;
        cfg.validate()?;
        Ok(Some(cfg))
    }

    /// Stacks a [`WearDevice`] on `inner` when the simulation is on;
    /// returns the device to use and the wear layer (None when off).
    pub fn wrap(&self, inner: Arc<dyn Device>) -> Result<Wrapped> {
        match self.ftl_config(inner.size())? {
            None => Ok((inner, None)),
            Some(cfg) => {
                let wear = Arc::new(WearDevice::new(inner, cfg)?);
                Ok((Arc::clone(&wear) as Arc<dyn Device>, Some(wear)))
            }
        }
    }
}

pub use crate::counters::SsdWearStats;

impl SsdWearStats {
    fn from_report(r: &FtlReport, device_pages: u64) -> SsdWearStats {
        let c = &r.counters;
        SsdWearStats {
            mode: r.mode.name().to_owned(),
            pages_per_block: r.pages_per_block,
            blocks: r.blocks,
            over_provisioning: r.over_provisioning,
            spare_share: 1.0 - device_pages as f64 / r.physical_pages.max(1) as f64,
            host_page_writes: c.host_page_writes,
            host_page_trims: c.host_page_trims,
            nand_page_programs: c.nand_page_programs,
            gc_page_copies: c.gc_page_copies,
            block_erases: c.block_erases,
            dedup_skipped_writes: c.dedup_skipped_writes,
            offline_remaps: c.offline_remaps,
            offline_passes: c.offline_passes,
            pending_pages: r.pending_pages,
            mapped_logical_pages: r.mapped_logical_pages,
            valid_pages: r.valid_pages,
            dedup_ratio: r.dedup_ratio,
            write_amplification: r.write_amplification,
            erase_count_min: r.erase_count_min,
            erase_count_max: r.erase_count_max,
            erase_count_mean: r.erase_count_mean,
            wear_spread: r.wear_spread,
            write_latency_us_mean: r.write_latency_us_mean,
            write_latency_us_p99: r.write_latency_us_p99,
            memory_bytes: r.memory_bytes,
        }
    }
}

/// Wear accounting over an inner device; see the module documentation.
pub struct WearDevice {
    inner: Arc<dyn Device>,
    ftl: Mutex<Ftl>,
    page_bytes: u64,
    size: u64,
}

impl WearDevice {
    /// Wear accounting for `inner` with the FTL `cfg` (store mode forced to
    /// fingerprints); refuses an FTL smaller than the device.
    pub fn new(inner: Arc<dyn Device>, mut cfg: FtlConfig) -> Result<WearDevice> {
        cfg.store = StoreMode::Fingerprints;
        let ftl = Ftl::new(cfg)?;
        let page_bytes = ftl.page_bytes() as u64;
        let size = inner.size();
        if ftl.logical_pages() * page_bytes < size {
            return Err(Error::Config(format!(
                "simulated SSD of {} pages cannot hold {} ({size} bytes)",
                ftl.logical_pages(),
                inner.describe()
            )));
        }
        Ok(WearDevice {
            inner,
            ftl: Mutex::new(ftl),
            page_bytes,
            size,
        })
    }

    /// The device's counters and derived figures.
    pub fn stats(&self) -> SsdWearStats {
        SsdWearStats::from_report(&self.report(), self.size.div_ceil(self.page_bytes))
    }

    /// The FTL's full report.
    pub fn report(&self) -> FtlReport {
        self.lock().report()
    }

    /// Direct access to the FTL (tests, consistency checks).
    pub fn with_ftl<R>(&self, f: impl FnOnce(&mut Ftl) -> R) -> R {
        f(&mut self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ftl> {
        // A panic inside the FTL is a broken invariant; the state is not
        // trusted after it, so poisoning propagates as a panic too.
        self.ftl.lock().expect("SSD wear simulator state poisoned")
    }

    fn range_check(&self, len: u64, offset: u64) -> io::Result<()> {
        super::device::range_check(&self.describe(), self.size, len, offset)
    }

    /// Splits `[offset, offset + len)` into (page, start in page, length).
    fn pages(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, usize, usize)> {
        super::device::split_pages(self.page_bytes, offset, len)
    }

    /// The fingerprint of what page `lpn` of the inner device holds now
    /// (zeroes past its end).
    fn fingerprint_inner(&self, lpn: u64, page: &mut [u8]) -> io::Result<PageFingerprint> {
        let at = lpn * self.page_bytes;
        let n = (self.size - at).min(self.page_bytes) as usize;
        page[n..].fill(0);
        self.inner.read_at(&mut page[..n], at)?;
        Ok(fingerprint(page))
    }

    /// Feeds a completed write of `len` bytes at `offset` (bytes `buf`, or
    /// zeroes when None) to the FTL.
    fn record(&self, buf: Option<&[u8]>, offset: u64, len: u64, stream: Stream) -> io::Result<()> {
        let mut page = vec![0u8; self.page_bytes as usize];
        let mut prints = Vec::new();
        let mut done = 0;
        for (lpn, _start, n) in self.pages(offset, len) {
            let fp = if n as u64 == self.page_bytes {
                // A whole page discarded (no bytes) is a trim.
                buf.map(|b| fingerprint(&b[done..done + n]))
            } else {
                Some(self.fingerprint_inner(lpn, &mut page)?)
            };
            prints.push((lpn, fp));
            done += n;
        }
        let mut ftl = self.lock();
        for (lpn, fp) in prints {
            match fp {
                Some(fp) => {
                    ftl.write_placed(lpn, PageData::Fingerprint(fp), stream);
                }
                None => ftl.trim(lpn),
            }
        }
        Ok(())
    }
}

/// A page's identity: BLAKE3 (first 128 bits) and CRC-32C.
fn fingerprint(page: &[u8]) -> PageFingerprint {
    PageFingerprint {
        digest: PageFingerprint::digest_from_bytes(blake3::hash(page).as_bytes()),
        crc: crc32c_prefilter(page),
    }
}

impl Device for WearDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.range_check(buf.len() as u64, offset)?;
        self.inner.write_at(buf, offset)?;
        self.record(Some(buf), offset, buf.len() as u64, Stream::Unknown)
    }

    fn write_hinted(&self, buf: &[u8], offset: u64, hint: WriteHint) -> io::Result<()> {
        self.range_check(buf.len() as u64, offset)?;
        self.inner.write_hinted(buf, offset, hint)?;
        self.record(Some(buf), offset, buf.len() as u64, hint.stream)
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()?;
        let mut ftl = self.lock();
        let pending = ftl.pending_pages() as u64;
        if pending > 0 {
            ftl.offline_pass(pending);
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.range_check(len, offset)?;
        self.inner.discard(offset, len)?;
        self.record(None, offset, len, Stream::Unknown)
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn describe(&self) -> String {
        format!("ssd-wear:{}", self.inner.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::FileDevice;

    fn wear_over_file(mode: SsdSimMode, bytes: u64) -> (tempfile::TempDir, Arc<WearDevice>) {
        let dir = tempfile::tempdir().expect("temporary folder");
        let file = FileDevice::create_file(&dir.path().join("dev"), bytes).expect("device file");
        let cfg = SsdSimConfig {
            mode,
            over_provisioning_percent: 7.0,
        };
        let (_, wear) = cfg.wrap(Arc::new(file)).expect("wrap");
        (dir, wear.expect("the simulation is on"))
    }

    #[test]
    fn off_wraps_nothing() {
        let dir = tempfile::tempdir().expect("temporary folder");
        let file = FileDevice::create_file(&dir.path().join("dev"), 1 << 20).expect("file");
        let (dev, wear) = SsdSimConfig::default().wrap(Arc::new(file)).expect("wrap");
        assert!(wear.is_none());
        assert!(!dev.describe().starts_with("ssd-wear"));
    }

    #[test]
    fn every_page_written_is_counted_and_reads_come_from_the_file() {
        let (_dir, wear) = wear_over_file(SsdSimMode::Separated, 4 << 20);
        let pages = (4u64 << 20) / 4096;
        let mut written = 0u64;
        // Three passes over the device, 64 KiB at a time: overwrites force GC.
        for pass in 0..3u8 {
            for chunk in 0..pages / 16 {
                let buf: Vec<u8> = (0..16 * 4096)
                    .map(|i| (i as u64 / 4096 + chunk * 16) as u8 ^ pass)
                    .collect();
                wear.write_at(&buf, chunk * 16 * 4096).expect("write");
                written += 16;
            }
            wear.sync().expect("sync");
        }
        // A partial page: one more host page write (of the whole page).
        wear.write_at(&[7u8; 100], 4096 * 3 + 10)
            .expect("partial write");
        written += 1;
        let mut back = vec![0u8; 4096];
        wear.read_at(&mut back, 4096 * 3).expect("read");
        assert_eq!(&back[10..110], &[7u8; 100][..]);
        wear.with_ftl(|f| f.check()).expect("the FTL is consistent");
        let s = wear.stats();
        assert_eq!(s.host_page_writes, written);
        assert_eq!(
            s.nand_page_programs,
            s.host_page_writes - s.dedup_skipped_writes + s.gc_page_copies
        );
        assert!(
            s.block_erases > 0,
            "three passes over the flash erase blocks: {s:?}"
        );
        assert!(s.write_amplification > 0.0);
    }

    #[test]
    fn a_discard_trims_whole_pages_and_rewrites_partial_ones() {
        let (_dir, wear) = wear_over_file(SsdSimMode::Plain, 1 << 20);
        wear.write_at(&[1u8; 3 * 4096], 0).expect("write");
        wear.discard(100, 2 * 4096).expect("discard");
        let s = wear.stats();
        // Pages 0 and 2 partially discarded (rewritten), page 1 trimmed.
        assert_eq!(s.host_page_writes, 3 + 2);
        assert_eq!(s.host_page_trims, 1);
        wear.with_ftl(|f| f.check()).expect("the FTL is consistent");
    }

    #[test]
    fn a_request_past_the_end_is_refused_before_the_file_grows() {
        let (_dir, wear) = wear_over_file(SsdSimMode::Plain, 1 << 20);
        let err = wear
            .write_at(&[0u8; 4096], 1 << 20)
            .expect_err("past the end");
        assert!(err.to_string().contains("beyond the end"), "{err}");
        assert_eq!(wear.size(), 1 << 20);
    }

    #[test]
    fn bad_modes_and_over_provisioning_are_refused_with_the_flag_named() {
        let e = "wild".parse::<SsdSimMode>().expect_err("bad mode");
        assert!(e.to_string().contains("--ssd-sim"), "{e}");
        let cfg = SsdSimConfig {
            mode: SsdSimMode::Plain,
            over_provisioning_percent: 0.0,
        };
        let e = cfg.ftl_config(1 << 20).expect_err("no spare");
        assert!(e.to_string().contains("--ssd-op"), "{e}");
    }

    #[test]
    fn a_config_without_the_entry_is_off() {
        let cfg: SsdSimConfig = serde_json::from_str("{}").expect("parse");
        assert_eq!(cfg, SsdSimConfig::default());
    }
}
