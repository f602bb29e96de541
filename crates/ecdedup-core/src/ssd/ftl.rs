//! A page-mapped flash translation layer with dedup inside it: the core of
//! the SSD simulator (paper 003).
//!
//! The flash is `blocks` erase blocks of `pages_per_block` pages of 4 or
//! 8 KiB. A page is programmed once between erases; an overwrite goes to a
//! fresh page at a *write frontier* (the open block of a region) and the old
//! page becomes invalid. Garbage collection (GC) picks a closed block,
//! copies its valid pages to a frontier and erases it. Over-provisioning
//! hides a share of the physical pages from the logical space so that GC
//! always finds invalid pages to reclaim.
//!
//! Dedup is a two-level map: a logical page maps to a *content* (a stored
//! page's worth of bytes, numbered by a `u32`), and a content maps to the
//! one physical page that holds it. Logical pages with equal bytes share one
//! content, with a reference count; GC moves a content by changing one
//! entry, whatever the number of logical pages that share it. A content, and
//! its physical page, is released when its count reaches zero.
//!
//! Modes ([`DedupMode`]): `None`; `Inline` (SHA-1 on the write path, a hit
//! maps to the existing content with no program); `Offline` (no hashing on
//! writes, an idle-time pass hashes new contents and remaps duplicates);
//! `OfflineSeparated` (a CRC filter on the write path sends contents whose
//! CRC no stored content has, certainly unique, to the U-region and the
//! rest to the ND-region; the offline pass remaps duplicates as in
//! `Offline`, and only ND-region contents need a lookup); `OfflineHinted`
//! (as `OfflineSeparated`, but the region comes from the writer's
//! [`Stream`] hint instead of the FTL's own filter: unique to the U-region,
//! possibly duplicate or unknown to the ND-region; since a host's filter
//! may be wrong, the offline pass looks up every content).
//!
//! Invariants (checked by [`Ftl::check`], which the tests call after every
//! step):
//! - every physical page is free (erased), valid (holds one live content)
//!   or invalid; a block's valid count equals its valid pages;
//! - a live content's reference count equals the logical pages mapping to it;
//! - every block is free, open (a region's frontier), or closed, and
//!   free + open + closed = `blocks`; a closed block sits in the bucket list
//!   of its valid count;
//! - the fingerprint index holds exactly the contents flagged indexed, the
//!   CRC table counts every live content's CRC (separated mode), and a
//!   content awaiting the offline pass has exactly one reference;
//! - NAND page programs = host page writes - dedup-skipped writes + GC page
//!   copies (a repair rewrite counts as a host page write).
//!
//! GC progress is guaranteed by construction: [`FtlConfig::validate`] refuses
//! a geometry whose spare pages could leave GC without a victim (see
//! `docs/ssd.md`, "Why GC always progresses").

use super::index::{digest_hash, prefetch, CrcTable, DigestIndex};
use super::latency::{LatencyHistogram, LatencyModel};
use crate::error::{Error, Result};
use crate::fingerprint::{crc32c_prefilter, Algorithm};
use crate::media::Stream;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;

/// Page sizes the FTL accepts.
pub const PAGE_BYTES_ALLOWED: [u32; 2] = [4096, 8192];
/// Bounds of pages per erase block.
pub const PAGES_PER_BLOCK_MIN: u32 = 2;
pub const PAGES_PER_BLOCK_MAX: u32 = 4096;
/// The default number of free blocks below which a write runs GC first.
pub const GC_FREE_BLOCKS_MIN_DEFAULT: u32 = 2;
/// Bound on physical pages (8 TiB of 4 KiB pages): page and content numbers
/// are `u32`, and the lookup tables need twice as many positions.
pub const PHYSICAL_PAGES_MAX: u64 = 1 << 31;
/// Bound on the bytes a contents-mode FTL allocates for page data.
pub const CONTENTS_BYTES_MAX: u64 = 256 << 30;

/// How far ahead GC and the offline pass prefetch, in pages.
const PREFETCH_AHEAD: usize = 8;

/// "No page", "no content", "no block".
const NONE: u32 = u32::MAX;

// Content flags.
/// `digests[content]` holds this content's digest.
const F_DIGEST: u8 = 1;
/// The content is in the fingerprint index.
const F_INDEXED: u8 = 2;
/// The content awaits the offline pass.
const F_PENDING: u8 = 4;
/// The content number is in the pending queue (perhaps from an earlier life).
const F_LISTED: u8 = 8;
/// Written to the U-region by the CRC filter (separated mode).
const F_U_BORN: u8 = 16;

// Block states.
const B_FREE: u8 = 0;
const B_OPEN: u8 = 1;
const B_CLOSED: u8 = 2;
const B_VICTIM: u8 = 3;

/// Region numbers: the U-region (certainly unique; the only region outside
/// separated mode) and the ND-region (not determined).
pub const REGION_U: usize = 0;
pub const REGION_ND: usize = 1;

/// Where dedup happens inside the SSD.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DedupMode {
    None,
    Inline,
    Offline,
    #[serde(rename = "separated")]
    OfflineSeparated,
    /// Separation by the writer's placement hint ([`Stream`]).
    #[serde(rename = "hinted")]
    OfflineHinted,
}

impl DedupMode {
    pub const ALL: [DedupMode; 4] = [
        DedupMode::None,
        DedupMode::Inline,
        DedupMode::Offline,
        DedupMode::OfflineSeparated,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DedupMode::None => "none",
            DedupMode::Inline => "inline",
            DedupMode::Offline => "offline",
            DedupMode::OfflineSeparated => "separated",
            DedupMode::OfflineHinted => "hinted",
        }
    }

    /// Whether an idle-time pass does the dedup.
    pub fn offline(self) -> bool {
        matches!(
            self,
            DedupMode::Offline | DedupMode::OfflineSeparated | DedupMode::OfflineHinted
        )
    }

    /// Write frontiers (regions) the mode uses.
    pub fn regions(self) -> u32 {
        match self {
            DedupMode::OfflineSeparated | DedupMode::OfflineHinted => 2,
            DedupMode::None | DedupMode::Inline | DedupMode::Offline => 1,
        }
    }
}

impl fmt::Display for DedupMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DedupMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<DedupMode> {
        match s {
            "none" => Ok(DedupMode::None),
            "inline" => Ok(DedupMode::Inline),
            "offline" => Ok(DedupMode::Offline),
            "separated" | "offline-separated" => Ok(DedupMode::OfflineSeparated),
            "hinted" | "offline-hinted" => Ok(DedupMode::OfflineHinted),
            _ => Err(Error::Config(format!(
                "dedup mode {s:?} is not one of none, inline, offline, separated, hinted"
            ))),
        }
    }
}

/// How GC picks its victim among closed blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GcPolicy {
    /// The block with the fewest valid pages (ties: the most recently closed).
    Greedy,
    /// The block with the highest (1 - u) / 2u × age, u its valid share and
    /// age the NAND programs since its last program (Rosenblum and Ousterhout).
    CostBenefit,
}

impl GcPolicy {
    pub fn name(self) -> &'static str {
        match self {
            GcPolicy::Greedy => "greedy",
            GcPolicy::CostBenefit => "cost-benefit",
        }
    }
}

impl FromStr for GcPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<GcPolicy> {
        match s {
            "greedy" => Ok(GcPolicy::Greedy),
            "cost-benefit" => Ok(GcPolicy::CostBenefit),
            _ => Err(Error::Config(format!(
                "GC policy {s:?} is not one of greedy, cost-benefit"
            ))),
        }
    }
}

/// What the simulator keeps of each page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreMode {
    /// The bytes: a real device (see `SsdDevice`).
    Contents,
    /// Only a 128-bit digest and a CRC per content (trace replay).
    Fingerprints,
}

/// The identity of one page's content in trace-only mode: a digest
/// (the first 16 bytes of a fingerprint, SHA-1 by default) and a CRC.
/// Equal contents must have equal fingerprints; the CRC is what the
/// separated mode's filter sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageFingerprint {
    pub digest: u128,
    pub crc: u32,
}

impl PageFingerprint {
    /// SHA-1 (first 128 bits) and CRC-32C of the bytes.
    pub fn of_bytes(bytes: &[u8]) -> PageFingerprint {
        PageFingerprint {
            digest: sha1_digest(bytes),
            crc: crc32c_prefilter(bytes),
        }
    }

    /// A digest from fingerprint bytes: the first 16, zero-padded.
    pub fn digest_from_bytes(bytes: &[u8]) -> u128 {
        let mut d = [0u8; 16];
        let n = bytes.len().min(16);
        d[..n].copy_from_slice(&bytes[..n]);
        u128::from_be_bytes(d)
    }
}

/// SHA-1 of a page, truncated to 128 bits.
pub fn sha1_digest(bytes: &[u8]) -> u128 {
    PageFingerprint::digest_from_bytes(Algorithm::Sha1.fingerprint(bytes).as_bytes())
}

/// One page written by the host.
#[derive(Clone, Copy, Debug)]
pub enum PageData<'a> {
    /// The page's bytes (exactly `page_bytes`).
    Bytes(&'a [u8]),
    /// Its fingerprint only (fingerprints store mode).
    Fingerprint(PageFingerprint),
}

/// Everything that defines a simulated SSD.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FtlConfig {
    pub page_bytes: u32,
    pub pages_per_block: u32,
    pub blocks: u32,
    /// Share of physical pages hidden from the logical space, 0 < op < 1.
    pub over_provisioning: f64,
    /// A write that needs a new block first runs GC until this many blocks
    /// are free (at least 2).
    pub gc_free_blocks_min: u32,
    pub gc_policy: GcPolicy,
    pub dedup: DedupMode,
    pub store: StoreMode,
    pub latency: LatencyModel,
}

impl FtlConfig {
    /// A configuration with greedy GC, no dedup, fingerprints store mode and
    /// the default latencies.
    pub fn new(
        page_bytes: u32,
        pages_per_block: u32,
        blocks: u32,
        over_provisioning: f64,
    ) -> FtlConfig {
        FtlConfig {
            page_bytes,
            pages_per_block,
            blocks,
            over_provisioning,
            gc_free_blocks_min: GC_FREE_BLOCKS_MIN_DEFAULT,
            gc_policy: GcPolicy::Greedy,
            dedup: DedupMode::None,
            store: StoreMode::Fingerprints,
            latency: LatencyModel::default(),
        }
    }

    pub fn physical_pages(&self) -> u64 {
        self.blocks as u64 * self.pages_per_block as u64
    }

    /// floor(physical pages × (1 - over-provisioning)).
    pub fn logical_pages(&self) -> u64 {
        (self.physical_pages() as f64 * (1.0 - self.over_provisioning)).floor() as u64
    }

    /// Physical pages GC needs beyond the logical space: more than
    /// (gc_free_blocks_min - 1 + regions) blocks' worth (see module docs).
    pub fn spare_pages_min(&self) -> u64 {
        (self.gc_free_blocks_min as u64 - 1 + self.dedup.regions() as u64)
            * self.pages_per_block as u64
            + 1
    }

    /// The smallest block count whose logical space holds `logical_pages`
    /// and whose spare space satisfies GC, for this configuration's other
    /// settings.
    pub fn blocks_for(&self, logical_pages: u64) -> u64 {
        let ppb = self.pages_per_block as u64;
        let mut blocks = (logical_pages as f64 / (1.0 - self.over_provisioning) / ppb as f64)
            .ceil()
            .max(1.0) as u64;
        loop {
            let cfg = FtlConfig {
                blocks: blocks.min(u32::MAX as u64) as u32,
                ..self.clone()
            };
            let logical = cfg.logical_pages();
            if logical >= logical_pages && cfg.physical_pages() - logical >= cfg.spare_pages_min() {
                return blocks;
            }
            blocks += 1.max(blocks / 64);
            if blocks > u32::MAX as u64 {
                return blocks;
            }
        }
    }

    /// Refuses geometries the FTL cannot run: odd page sizes, block sizes out
    /// of bounds, too little over-provisioning for GC to progress, more pages
    /// than 32-bit page numbers hold.
    pub fn validate(&self) -> Result<()> {
        let fail = |msg: String| Err(Error::Config(format!("SSD geometry: {msg}")));
        if !PAGE_BYTES_ALLOWED.contains(&self.page_bytes) {
            return fail(format!(
                "page size {} bytes is not 4096 or 8192",
                self.page_bytes
            ));
        }
        if !(PAGES_PER_BLOCK_MIN..=PAGES_PER_BLOCK_MAX).contains(&self.pages_per_block) {
            return fail(format!(
                "{} pages per block is outside {PAGES_PER_BLOCK_MIN}..={PAGES_PER_BLOCK_MAX}",
                self.pages_per_block
            ));
        }
        if !(self.over_provisioning > 0.0 && self.over_provisioning < 1.0) {
            return fail(format!(
                "over-provisioning {} is not a share strictly between 0 and 1",
                self.over_provisioning
            ));
        }
        if self.gc_free_blocks_min < 2 {
            return fail(format!(
                "GC free-block threshold {} is below 2 (GC itself needs a free block)",
                self.gc_free_blocks_min
            ));
        }
        let physical = self.physical_pages();
        if physical > PHYSICAL_PAGES_MAX {
            return fail(format!(
                "{physical} physical pages exceed the bound of {PHYSICAL_PAGES_MAX} \
                 (32-bit page numbers with room for the tables' hash positions)"
            ));
        }
        let logical = self.logical_pages();
        if logical == 0 {
            return fail("the logical space is empty".into());
        }
        let spare = physical - logical;
        let needed = self.spare_pages_min();
        if spare < needed {
            return fail(format!(
                "over-provisioning {:.4} leaves {spare} spare pages ({:.2} blocks of {}); \
                 GC with {} free blocks minimum and {} write frontier(s) needs at least \
                 {needed}, i.e. more than {} spare blocks (add blocks or over-provisioning)",
                self.over_provisioning,
                spare as f64 / self.pages_per_block as f64,
                self.pages_per_block,
                self.gc_free_blocks_min,
                self.dedup.regions(),
                self.gc_free_blocks_min - 1 + self.dedup.regions(),
            ));
        }
        if self.store == StoreMode::Contents {
            let bytes = physical * self.page_bytes as u64;
            if bytes > CONTENTS_BYTES_MAX || usize::try_from(bytes).is_err() {
                return fail(format!(
                    "contents mode would hold {bytes} bytes of pages, over the bound of \
                     {CONTENTS_BYTES_MAX}; use fingerprints mode"
                ));
            }
        }
        Ok(())
    }
}

/// What the FTL has done; every field only grows (until `reset_stats`).
///
/// What counts as what: a *host page write* is one page the host asked to
/// write (a request of n pages is n); it becomes either a NAND program or a
/// *dedup-skipped write* (inline hit, no program). A *GC page copy* is one
/// valid page moved by GC: one NAND read plus one NAND program. Hence
/// `nand_page_programs = host_page_writes - dedup_skipped_writes +
/// gc_page_copies`. Offline remaps never program: they invalidate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FtlCounters {
    pub host_page_writes: u64,
    pub host_page_reads: u64,
    pub host_page_trims: u64,
    pub nand_page_programs: u64,
    /// Host reads of mapped pages, GC copy reads and offline-pass reads.
    pub nand_page_reads: u64,
    /// One per GC victim.
    pub block_erases: u64,
    pub gc_page_copies: u64,
    /// Inline hits: host page writes that mapped to a stored content.
    pub dedup_skipped_writes: u64,
    /// Digest hits whose bytes differed (contents mode compares bytes).
    pub dedup_verify_mismatches: u64,
    /// SHA-1 computations on the write path (inline mode).
    pub inline_page_hashes: u64,
    /// CRC computations on the write path (separated mode).
    pub crc_computations: u64,
    /// Separated and hinted modes: host programs placed in each region.
    pub u_region_page_writes: u64,
    pub nd_region_page_writes: u64,
    /// Host page writes that carried a placement hint (unique or possibly
    /// duplicate), whatever the mode.
    pub hinted_page_writes: u64,
    pub offline_passes: u64,
    /// Contents hashed by offline passes (one page read + one SHA-1 each).
    pub offline_page_hashes: u64,
    /// Of those, the ones looked up in the index: all in offline mode, the
    /// ND-region ones in separated mode (a U-region content is inserted).
    pub offline_page_lookups: u64,
    /// Duplicates found by offline passes: a logical page remapped to a
    /// stored content and its own physical page invalidated.
    pub offline_remaps: u64,
    /// Host page writes that were repairs (`write_repair`).
    pub repair_writes: u64,
}

/// A snapshot of the FTL's counters with the figures derived from them.
#[derive(Clone, Debug, Serialize)]
pub struct FtlReport {
    pub mode: DedupMode,
    pub gc_policy: GcPolicy,
    pub page_bytes: u32,
    pub pages_per_block: u32,
    pub blocks: u32,
    pub logical_pages: u64,
    pub physical_pages: u64,
    pub over_provisioning: f64,
    #[serde(flatten)]
    pub counters: FtlCounters,
    /// NAND page programs / host page writes (0 without writes).
    pub write_amplification: f64,
    /// Lifetime erases per block (not reset by `reset_stats`).
    pub erase_count_min: u32,
    pub erase_count_mean: f64,
    pub erase_count_max: u32,
    pub erase_count_stddev: f64,
    /// Wear spread: max / mean erase count (1 = perfectly even; 0 before
    /// any erase).
    pub wear_spread: f64,
    /// Modelled latency of host page writes, microseconds.
    pub write_latency_us_mean: f64,
    pub write_latency_us_p99: f64,
    pub write_latency_us_max: f64,
    pub free_blocks: u64,
    pub u_region_blocks: u64,
    pub nd_region_blocks: u64,
    pub mapped_logical_pages: u64,
    /// Valid physical pages = stored contents.
    pub valid_pages: u64,
    /// Mapped logical pages / valid pages (1 without dedup).
    pub dedup_ratio: f64,
    /// Contents still awaiting the offline pass.
    pub pending_pages: u64,
    /// Modelled time offline passes spent (page read + SHA-1 each), us.
    pub offline_busy_us: f64,
    /// Bytes the simulator holds for this SSD.
    pub memory_bytes: u64,
}

/// One stored content (24 bytes).
#[derive(Clone, Copy, Debug)]
struct Content {
    /// Physical page holding it (NONE when free).
    ppn: u32,
    refs: u32,
    /// The logical page that wrote it; meaningful while `F_PENDING`.
    owner: u32,
    crc: u32,
    /// [`digest_hash`] of its digest while `F_INDEXED`, so that releasing
    /// it reads no digest.
    hash: u32,
    flags: u8,
}

const _: () = assert!(std::mem::size_of::<Content>() == 24);

#[derive(Clone, Copy, Debug)]
struct Frontier {
    block: u32,
    next_page: u32,
}

const NO_FRONTIER: Frontier = Frontier {
    block: NONE,
    next_page: 0,
};

/// The simulated flash and its translation layer.
pub struct Ftl {
    cfg: FtlConfig,
    ppb: u32,
    page_bytes: usize,
    logical: u32,
    // Maps.
    l2c: Vec<u32>,
    p2c: Vec<u32>,
    contents: Vec<Content>,
    digests: Vec<u128>,
    free_contents: Vec<u32>,
    // Blocks.
    valid: Vec<u32>,
    erases: Vec<u32>,
    state: Vec<u8>,
    region: Vec<u8>,
    last_program: Vec<u64>,
    bucket_head: Vec<u32>,
    bucket_prev: Vec<u32>,
    bucket_next: Vec<u32>,
    closed_blocks: u32,
    free: VecDeque<u32>,
    frontier: [Frontier; 2],
    region_blocks: [u64; 2],
    // Dedup.
    index: Option<DigestIndex>,
    crcs: CrcTable,
    pending: VecDeque<u32>,
    /// Page bytes by physical page (contents mode), else empty.
    data: Vec<u8>,
    // Figures.
    counters: FtlCounters,
    write_latency: LatencyHistogram,
    mapped: u64,
    clock: u64,
    gc_ns: u64,
    offline_busy_ns: u64,
}

impl Ftl {
    /// A fresh, erased SSD; fails on a geometry [`FtlConfig::validate`] refuses.
    pub fn new(cfg: FtlConfig) -> Result<Ftl> {
        cfg.validate()?;
        let physical = cfg.physical_pages() as usize;
        let logical = cfg.logical_pages() as u32;
        let blocks = cfg.blocks as usize;
        let ppb = cfg.pages_per_block;
        let index = match cfg.dedup {
            DedupMode::None => None,
            _ => Some(DigestIndex::new(physical)),
        };
        let crcs = if cfg.dedup == DedupMode::OfflineSeparated {
            CrcTable::new(physical)
        } else {
            CrcTable::default()
        };
        let data = match cfg.store {
            StoreMode::Contents => vec![0u8; physical * cfg.page_bytes as usize],
            StoreMode::Fingerprints => Vec::new(),
        };
        Ok(Ftl {
            ppb,
            page_bytes: cfg.page_bytes as usize,
            logical,
            l2c: vec![NONE; logical as usize],
            p2c: vec![NONE; physical],
            contents: vec![
                Content {
                    ppn: NONE,
                    refs: 0,
                    owner: NONE,
                    crc: 0,
                    hash: 0,
                    flags: 0,
                };
                physical
            ],
            digests: vec![0; physical],
            free_contents: (0..physical as u32).rev().collect(),
            valid: vec![0; blocks],
            erases: vec![0; blocks],
            state: vec![B_FREE; blocks],
            region: vec![0; blocks],
            last_program: vec![0; blocks],
            bucket_head: vec![NONE; ppb as usize + 1],
            bucket_prev: vec![NONE; blocks],
            bucket_next: vec![NONE; blocks],
            closed_blocks: 0,
            free: (0..cfg.blocks).collect(),
            frontier: [NO_FRONTIER; 2],
            region_blocks: [0; 2],
            index,
            crcs,
            pending: VecDeque::new(),
            data,
            counters: FtlCounters::default(),
            write_latency: LatencyHistogram::new(),
            mapped: 0,
            clock: 0,
            gc_ns: 0,
            offline_busy_ns: 0,
            cfg,
        })
    }

    pub fn config(&self) -> &FtlConfig {
        &self.cfg
    }

    pub fn logical_pages(&self) -> u64 {
        self.logical as u64
    }

    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    pub fn counters(&self) -> &FtlCounters {
        &self.counters
    }

    /// Contents awaiting the offline pass.
    pub fn pending_pages(&self) -> usize {
        self.pending.len()
    }

    #[inline]
    fn lpn_index(&self, lpn: u64) -> usize {
        assert!(
            lpn < self.logical as u64,
            "logical page {lpn} beyond the {} of the SSD",
            self.logical
        );
        lpn as usize
    }

    // ----- host operations -------------------------------------------------

    /// Writes one logical page; returns its modelled latency in nanoseconds
    /// (hashing on the write path, foreground GC, the program).
    pub fn write(&mut self, lpn: u64, data: PageData<'_>) -> u64 {
        let lpn = self.lpn_index(lpn);
        self.write_inner(lpn, data, true, Stream::Unknown)
    }

    /// As [`Ftl::write`], with the writer's placement hint: mode `hinted`
    /// places the page by it; the other modes count it and ignore it.
    pub fn write_placed(&mut self, lpn: u64, data: PageData<'_>, stream: Stream) -> u64 {
        let lpn = self.lpn_index(lpn);
        self.write_inner(lpn, data, true, stream)
    }

    /// Writes bytes that replace content found corrupt. If the logical page
    /// shares a content whose digest the bytes match, the shared content is
    /// rewritten to a fresh physical page (every sharer sees the repaired
    /// bytes); otherwise the page is written without looking for a
    /// duplicate, so it never refers to a possibly corrupt copy.
    /// Contents mode only.
    pub fn write_repair(&mut self, lpn: u64, bytes: &[u8]) -> u64 {
        assert_eq!(self.cfg.store, StoreMode::Contents, "repair needs contents");
        let lpn = self.lpn_index(lpn);
        self.counters.repair_writes += 1;
        let c = self.l2c[lpn];
        if c != NONE {
            let content = self.contents[c as usize];
            if content.refs > 1
                && content.flags & F_DIGEST != 0
                && self.digests[c as usize] == sha1_digest(bytes)
            {
                self.counters.host_page_writes += 1;
                let region = self.gc_region(c);
                self.gc_ns = 0;
                self.ensure_host_frontier(region);
                let old_ppn = self.contents[c as usize].ppn;
                let ppn = self.place(region, c);
                self.contents[c as usize].ppn = ppn;
                self.store_bytes(ppn, bytes);
                self.invalidate(old_ppn);
                let ns = self.gc_ns + self.cfg.latency.page_program_ns;
                self.write_latency.record(ns);
                return ns;
            }
        }
        self.write_inner(lpn, PageData::Bytes(bytes), false, Stream::Unknown)
    }

    fn write_inner(
        &mut self,
        lpn: usize,
        data: PageData<'_>,
        dedup_lookup: bool,
        stream: Stream,
    ) -> u64 {
        self.counters.host_page_writes += 1;
        if stream != Stream::Unknown {
            self.counters.hinted_page_writes += 1;
        }
        let lat = self.cfg.latency;
        let mode = self.cfg.dedup;
        let mut ns = 0;
        let old = self.l2c[lpn];
        let given = match data {
            PageData::Bytes(bytes) => {
                assert_eq!(bytes.len(), self.page_bytes, "a write is one whole page");
                if self.cfg.store == StoreMode::Fingerprints {
                    Some(PageFingerprint::of_bytes(bytes))
                } else {
                    None
                }
            }
            PageData::Fingerprint(f) => {
                assert_eq!(
                    self.cfg.store,
                    StoreMode::Fingerprints,
                    "contents mode needs the bytes"
                );
                Some(f)
            }
        };
        let mut digest = given.map(|f| f.digest);
        let mut index_it = false;
        if mode == DedupMode::Inline {
            ns += lat.sha1_page_ns;
            self.counters.inline_page_hashes += 1;
            let d = match (digest, data) {
                (Some(d), _) => d,
                (None, PageData::Bytes(bytes)) => sha1_digest(bytes),
                (None, PageData::Fingerprint(_)) => unreachable!(),
            };
            digest = Some(d);
            let index = self.index.as_ref().expect("inline mode has an index");
            match index.find(d, &self.digests) {
                Some(hit) if dedup_lookup => {
                    if self.same_bytes(hit, data) {
                        self.counters.dedup_skipped_writes += 1;
                        if hit != old {
                            self.contents[hit as usize].refs += 1;
                            self.set_map(lpn, hit);
                            if old != NONE {
                                self.deref(old);
                            }
                        }
                        self.write_latency.record(ns);
                        return ns;
                    }
                    self.counters.dedup_verify_mismatches += 1;
                }
                Some(_) => {}
                None => index_it = true,
            }
        }
        if old != NONE {
            self.set_map(lpn, NONE);
            self.deref(old);
        }
        let mut crc = given.map_or(0, |f| f.crc);
        let mut region = REGION_U;
        if mode == DedupMode::OfflineSeparated {
            ns += lat.crc32_page_ns;
            self.counters.crc_computations += 1;
            if let PageData::Bytes(bytes) = data {
                crc = crc32c_prefilter(bytes);
            }
            // Counted now (the content is created below, GC in between
            // leaves the table alone): one probe decides and counts.
            if self.crcs.add(crc) {
                region = REGION_ND;
                self.counters.nd_region_page_writes += 1;
            } else {
                self.counters.u_region_page_writes += 1;
            }
        } else if mode == DedupMode::OfflineHinted {
            // The writer decided; with no decision, let the pass look.
            if stream == Stream::Unique {
                self.counters.u_region_page_writes += 1;
            } else {
                region = REGION_ND;
                self.counters.nd_region_page_writes += 1;
            }
        }
        self.gc_ns = 0;
        self.ensure_host_frontier(region);
        let c = self
            .free_contents
            .pop()
            .expect("a content per physical page");
        let ppn = self.place(region, c);
        ns += self.gc_ns + lat.page_program_ns;
        let listed = self.contents[c as usize].flags & F_LISTED;
        let mut flags = listed;
        if let Some(d) = digest {
            self.digests[c as usize] = d;
            flags |= F_DIGEST;
        }
        self.contents[c as usize] = Content {
            ppn,
            refs: 1,
            owner: lpn as u32,
            crc,
            hash: 0,
            flags,
        };
        if let PageData::Bytes(bytes) = data {
            if self.cfg.store == StoreMode::Contents {
                self.store_bytes(ppn, bytes);
            }
        }
        if index_it {
            self.index_insert(c);
        }
        if mode.offline() {
            if region == REGION_U && mode.regions() == 2 {
                self.contents[c as usize].flags |= F_U_BORN;
            }
            self.mark_pending(c);
        }
        self.set_map(lpn, c);
        self.write_latency.record(ns);
        ns
    }

    /// Reads one logical page into `buf` (zeroes if unmapped); returns its
    /// modelled latency. Contents mode only.
    pub fn read(&mut self, lpn: u64, buf: &mut [u8]) -> u64 {
        assert_eq!(self.cfg.store, StoreMode::Contents, "read needs contents");
        assert_eq!(buf.len(), self.page_bytes);
        let lpn = self.lpn_index(lpn);
        self.counters.host_page_reads += 1;
        let c = self.l2c[lpn];
        if c == NONE {
            buf.fill(0);
            return 0;
        }
        self.counters.nand_page_reads += 1;
        let at = self.contents[c as usize].ppn as usize * self.page_bytes;
        buf.copy_from_slice(&self.data[at..at + self.page_bytes]);
        self.cfg.latency.page_read_ns
    }

    /// Reads one logical page's fingerprint (None if unmapped); returns it
    /// with the modelled latency. Fingerprints mode only.
    pub fn read_fingerprint(&mut self, lpn: u64) -> (Option<PageFingerprint>, u64) {
        assert_eq!(self.cfg.store, StoreMode::Fingerprints);
        let lpn = self.lpn_index(lpn);
        self.counters.host_page_reads += 1;
        let c = self.l2c[lpn];
        if c == NONE {
            return (None, 0);
        }
        self.counters.nand_page_reads += 1;
        let content = &self.contents[c as usize];
        debug_assert!(content.flags & F_DIGEST != 0);
        let f = PageFingerprint {
            digest: self.digests[c as usize],
            crc: content.crc,
        };
        (Some(f), self.cfg.latency.page_read_ns)
    }

    /// Unmaps one logical page (it reads as zeroes / unmapped afterwards).
    pub fn trim(&mut self, lpn: u64) {
        let lpn = self.lpn_index(lpn);
        self.counters.host_page_trims += 1;
        let c = self.l2c[lpn];
        if c != NONE {
            self.set_map(lpn, NONE);
            self.deref(c);
        }
    }

    /// The offline dedup pass: hashes up to `pages_max` contents written since
    /// the last pass, oldest first; a content whose digest is indexed has its
    /// logical page remapped to the indexed content and its own physical page
    /// invalidated; any other is indexed. Returns the contents hashed. Does
    /// nothing outside the offline modes.
    pub fn offline_pass(&mut self, pages_max: u64) -> u64 {
        if !self.cfg.dedup.offline() {
            return 0;
        }
        self.counters.offline_passes += 1;
        let lat = self.cfg.latency;
        let mut hashed = 0;
        while hashed < pages_max {
            // Fetch ahead: the records and digests of contents a few places
            // down the queue, and the index slots of nearer ones.
            if let Some(&ahead) = self.pending.get(PREFETCH_AHEAD) {
                prefetch(&self.contents, ahead as usize);
                prefetch(&self.digests, ahead as usize);
            }
            if let (Some(&near), Some(index)) =
                (self.pending.get(PREFETCH_AHEAD / 2), self.index.as_ref())
            {
                index.prefetch(self.digests[near as usize]);
            }
            let Some(c) = self.pending.pop_front() else {
                break;
            };
            let ci = c as usize;
            self.contents[ci].flags &= !F_LISTED;
            if self.contents[ci].flags & F_PENDING == 0 {
                continue; // released since it was listed
            }
            self.contents[ci].flags &= !F_PENDING;
            hashed += 1;
            self.counters.offline_page_hashes += 1;
            self.counters.nand_page_reads += 1;
            self.offline_busy_ns += lat.page_read_ns + lat.sha1_page_ns;
            if self.contents[ci].flags & F_DIGEST == 0 {
                let at = self.contents[ci].ppn as usize * self.page_bytes;
                self.digests[ci] = sha1_digest(&self.data[at..at + self.page_bytes]);
                self.contents[ci].flags |= F_DIGEST;
            }
            if self.contents[ci].flags & F_U_BORN == 0 || self.cfg.dedup == DedupMode::OfflineHinted
            {
                self.counters.offline_page_lookups += 1;
            }
            let index = self.index.as_ref().expect("offline modes have an index");
            match index.find(self.digests[ci], &self.digests) {
                None => self.index_insert(c),
                Some(hit) => {
                    if !self.same_contents(c, hit) {
                        self.counters.dedup_verify_mismatches += 1;
                        continue;
                    }
                    let owner = self.contents[ci].owner as usize;
                    assert!(
                        self.contents[ci].refs == 1 && self.l2c[owner] == c,
                        "a content awaiting the pass has its one writer"
                    );
                    self.contents[hit as usize].refs += 1;
                    self.l2c[owner] = hit;
                    self.deref(c);
                    self.counters.offline_remaps += 1;
                }
            }
        }
        hashed
    }

    // ----- internals -------------------------------------------------------

    #[inline]
    fn set_map(&mut self, lpn: usize, c: u32) {
        let old = self.l2c[lpn];
        if old == NONE && c != NONE {
            self.mapped += 1;
        } else if old != NONE && c == NONE {
            self.mapped -= 1;
        }
        self.l2c[lpn] = c;
    }

    /// Whether stored content `c` holds exactly these bytes (always true for
    /// fingerprints: the digest is the identity there).
    fn same_bytes(&self, c: u32, data: PageData<'_>) -> bool {
        match (self.cfg.store, data) {
            (StoreMode::Contents, PageData::Bytes(bytes)) => {
                let at = self.contents[c as usize].ppn as usize * self.page_bytes;
                self.data[at..at + self.page_bytes] == *bytes
            }
            _ => true,
        }
    }

    fn same_contents(&self, a: u32, b: u32) -> bool {
        if self.cfg.store == StoreMode::Fingerprints {
            return true;
        }
        let pa = self.contents[a as usize].ppn as usize * self.page_bytes;
        let pb = self.contents[b as usize].ppn as usize * self.page_bytes;
        self.data[pa..pa + self.page_bytes] == self.data[pb..pb + self.page_bytes]
    }

    fn store_bytes(&mut self, ppn: u32, bytes: &[u8]) {
        let at = ppn as usize * self.page_bytes;
        self.data[at..at + self.page_bytes].copy_from_slice(bytes);
    }

    /// Indexes content `c` under `digests[c]`.
    fn index_insert(&mut self, c: u32) {
        let index = self.index.as_mut().expect("dedup modes have an index");
        index.insert(c, &self.digests);
        let content = &mut self.contents[c as usize];
        content.hash = digest_hash(self.digests[c as usize]);
        content.flags |= F_INDEXED;
    }

    fn mark_pending(&mut self, c: u32) {
        let flags = &mut self.contents[c as usize].flags;
        *flags |= F_PENDING;
        if *flags & F_LISTED == 0 {
            *flags |= F_LISTED;
            self.pending.push_back(c);
        }
    }

    /// Drops one reference; at zero the content and its page are released.
    #[inline]
    fn deref(&mut self, c: u32) {
        let content = &mut self.contents[c as usize];
        debug_assert!(content.refs > 0);
        content.refs -= 1;
        if content.refs > 0 {
            return;
        }
        let Content {
            ppn,
            crc,
            hash,
            flags,
            ..
        } = *content;
        content.ppn = NONE;
        content.flags = flags & F_LISTED;
        self.invalidate(ppn);
        if flags & F_INDEXED != 0 {
            let index = self.index.as_mut().expect("indexed implies an index");
            index.remove_hashed(c, hash);
        }
        if self.cfg.dedup == DedupMode::OfflineSeparated {
            self.crcs.remove(crc);
        }
        self.free_contents.push(c);
    }

    /// Marks a physical page invalid.
    #[inline]
    fn invalidate(&mut self, ppn: u32) {
        self.p2c[ppn as usize] = NONE;
        let b = ppn / self.ppb;
        let v = self.valid[b as usize];
        if self.state[b as usize] == B_CLOSED {
            self.bucket_remove(b, v);
            self.bucket_insert(b, v - 1);
        }
        self.valid[b as usize] = v - 1;
    }

    #[inline]
    fn bucket_insert(&mut self, b: u32, v: u32) {
        let head = self.bucket_head[v as usize];
        self.bucket_next[b as usize] = head;
        self.bucket_prev[b as usize] = NONE;
        if head != NONE {
            self.bucket_prev[head as usize] = b;
        }
        self.bucket_head[v as usize] = b;
    }

    #[inline]
    fn bucket_remove(&mut self, b: u32, v: u32) {
        let prev = self.bucket_prev[b as usize];
        let next = self.bucket_next[b as usize];
        if prev != NONE {
            self.bucket_next[prev as usize] = next;
        } else {
            self.bucket_head[v as usize] = next;
        }
        if next != NONE {
            self.bucket_prev[next as usize] = prev;
        }
    }

    fn open_block(&mut self, region: usize) {
        let b = self.free.pop_front().expect("a free block to open");
        debug_assert_eq!(self.valid[b as usize], 0);
        self.state[b as usize] = B_OPEN;
        self.region[b as usize] = region as u8;
        self.region_blocks[region] += 1;
        self.frontier[region] = Frontier {
            block: b,
            next_page: 0,
        };
    }

    /// Programs content `c` at `region`'s frontier, which has room.
    #[inline]
    fn place(&mut self, region: usize, c: u32) -> u32 {
        let f = &mut self.frontier[region];
        let b = f.block;
        debug_assert!(b != NONE);
        let ppn = b * self.ppb + f.next_page;
        f.next_page += 1;
        let full = f.next_page == self.ppb;
        if full {
            *f = NO_FRONTIER;
        }
        self.p2c[ppn as usize] = c;
        self.valid[b as usize] += 1;
        self.counters.nand_page_programs += 1;
        self.clock += 1;
        self.last_program[b as usize] = self.clock;
        if full {
            self.state[b as usize] = B_CLOSED;
            self.closed_blocks += 1;
            self.bucket_insert(b, self.valid[b as usize]);
        }
        ppn
    }

    /// Makes sure `region` has a frontier with room, running GC first when
    /// a new block is needed and too few are free.
    fn ensure_host_frontier(&mut self, region: usize) {
        if self.frontier[region].block != NONE {
            return;
        }
        while (self.free.len() as u32) < self.cfg.gc_free_blocks_min {
            self.gc_once();
        }
        if self.frontier[region].block == NONE {
            self.open_block(region);
        }
    }

    /// The region GC copies content `c` to: in separated mode, a content
    /// still awaiting the pass that the filter sent to the ND-region stays
    /// there; everything else (U-born, or examined by the pass and kept)
    /// goes to the U-region.
    #[inline]
    fn gc_region(&self, c: u32) -> usize {
        if self.cfg.dedup.regions() == 1 {
            return REGION_U;
        }
        let flags = self.contents[c as usize].flags;
        if flags & F_PENDING != 0 && flags & F_U_BORN == 0 {
            REGION_ND
        } else {
            REGION_U
        }
    }

    /// A region with room for one GC copy, preferring `region`.
    fn gc_frontier(&mut self, region: usize) -> usize {
        if self.frontier[region].block != NONE {
            return region;
        }
        if !self.free.is_empty() {
            self.open_block(region);
            return region;
        }
        let other = 1 - region;
        assert!(
            self.frontier[other].block != NONE,
            "GC has no room for a copy: the geometry check is broken"
        );
        other
    }

    fn pick_victim(&self) -> Option<u32> {
        match self.cfg.gc_policy {
            GcPolicy::Greedy => self.bucket_head[..self.ppb as usize]
                .iter()
                .copied()
                .find(|&b| b != NONE),
            GcPolicy::CostBenefit => {
                let mut best = None;
                let mut best_score = f64::NEG_INFINITY;
                for b in 0..self.cfg.blocks {
                    if self.state[b as usize] != B_CLOSED {
                        continue;
                    }
                    let v = self.valid[b as usize];
                    if v == self.ppb {
                        continue;
                    }
                    if v == 0 {
                        return Some(b);
                    }
                    let age = (self.clock - self.last_program[b as usize]) as f64 + 1.0;
                    let u = v as f64 / self.ppb as f64;
                    let score = (1.0 - u) / (2.0 * u) * age;
                    if score > best_score {
                        best_score = score;
                        best = Some(b);
                    }
                }
                best
            }
        }
    }

    /// Collects one victim: copies its valid pages, erases it.
    fn gc_once(&mut self) {
        let victim = self
            .pick_victim()
            .expect("GC found no block with an invalid page: the geometry check is broken");
        let v = self.valid[victim as usize];
        self.bucket_remove(victim, v);
        self.closed_blocks -= 1;
        self.state[victim as usize] = B_VICTIM;
        let lat = self.cfg.latency;
        let base = victim * self.ppb;
        for ppn in base..base + self.ppb {
            // Fetch the record of a content a few pages down the victim.
            let ahead = ppn as usize + PREFETCH_AHEAD;
            if ahead < (base + self.ppb) as usize && self.p2c[ahead] != NONE {
                prefetch(&self.contents, self.p2c[ahead] as usize);
            }
            let c = self.p2c[ppn as usize];
            if c == NONE {
                continue;
            }
            let wanted = self.gc_region(c);
            let region = self.gc_frontier(wanted);
            let dst = self.place(region, c);
            self.contents[c as usize].ppn = dst;
            self.p2c[ppn as usize] = NONE;
            self.valid[victim as usize] -= 1;
            if !self.data.is_empty() {
                let (from, to) = (
                    ppn as usize * self.page_bytes,
                    dst as usize * self.page_bytes,
                );
                self.data.copy_within(from..from + self.page_bytes, to);
            }
            self.counters.gc_page_copies += 1;
            self.counters.nand_page_reads += 1;
            self.gc_ns += lat.page_read_ns + lat.page_program_ns;
        }
        debug_assert_eq!(self.valid[victim as usize], 0);
        self.state[victim as usize] = B_FREE;
        self.erases[victim as usize] += 1;
        self.region_blocks[self.region[victim as usize] as usize] -= 1;
        self.free.push_back(victim);
        self.counters.block_erases += 1;
        self.gc_ns += lat.block_erase_ns;
    }

    // ----- figures ---------------------------------------------------------

    /// Zeroes the counters and the latency histogram (after a prefill, say);
    /// the flash state and the per-block erase counts stay.
    pub fn reset_stats(&mut self) {
        self.counters = FtlCounters::default();
        self.write_latency.clear();
        self.offline_busy_ns = 0;
    }

    /// The histogram of modelled host page write latencies.
    pub fn write_latency(&self) -> &LatencyHistogram {
        &self.write_latency
    }

    /// Bytes held by the simulator's tables (and page data in contents mode).
    pub fn memory_bytes(&self) -> u64 {
        let vec = |cap: usize, size: usize| (cap * size) as u64;
        vec(self.l2c.capacity(), 4)
            + vec(self.p2c.capacity(), 4)
            + vec(self.contents.capacity(), std::mem::size_of::<Content>())
            + vec(self.digests.capacity(), 16)
            + vec(self.free_contents.capacity(), 4)
            + vec(self.valid.capacity(), 4)
            + vec(self.erases.capacity(), 4)
            + vec(self.state.capacity(), 1)
            + vec(self.region.capacity(), 1)
            + vec(self.last_program.capacity(), 8)
            + vec(self.bucket_head.capacity(), 4)
            + vec(self.bucket_prev.capacity(), 4)
            + vec(self.bucket_next.capacity(), 4)
            + vec(self.free.capacity(), 4)
            + self.index.as_ref().map_or(0, |i| i.memory_bytes())
            + self.crcs.memory_bytes()
            + vec(self.pending.capacity(), 4)
            + vec(self.data.capacity(), 1)
            + self.write_latency.memory_bytes()
    }

    pub fn report(&self) -> FtlReport {
        let c = self.counters;
        let n = self.erases.len() as f64;
        let mean = self.erases.iter().map(|&e| e as f64).sum::<f64>() / n;
        let var = self
            .erases
            .iter()
            .map(|&e| (e as f64 - mean).powi(2))
            .sum::<f64>()
            / n;
        let min = self.erases.iter().copied().min().unwrap_or(0);
        let max = self.erases.iter().copied().max().unwrap_or(0);
        let valid_pages = (self.contents.len() - self.free_contents.len()) as u64;
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        FtlReport {
            mode: self.cfg.dedup,
            gc_policy: self.cfg.gc_policy,
            page_bytes: self.cfg.page_bytes,
            pages_per_block: self.cfg.pages_per_block,
            blocks: self.cfg.blocks,
            logical_pages: self.logical as u64,
            physical_pages: self.cfg.physical_pages(),
            over_provisioning: self.cfg.over_provisioning,
            counters: c,
            write_amplification: ratio(c.nand_page_programs, c.host_page_writes),
            erase_count_min: min,
            erase_count_mean: mean,
            erase_count_max: max,
            erase_count_stddev: var.sqrt(),
            wear_spread: if mean > 0.0 { max as f64 / mean } else { 0.0 },
            write_latency_us_mean: self.write_latency.mean_ns() / 1e3,
            write_latency_us_p99: self.write_latency.quantile_ns(0.99) as f64 / 1e3,
            write_latency_us_max: self.write_latency.max_ns() as f64 / 1e3,
            free_blocks: self.free.len() as u64,
            u_region_blocks: self.region_blocks[REGION_U],
            nd_region_blocks: self.region_blocks[REGION_ND],
            mapped_logical_pages: self.mapped,
            valid_pages,
            dedup_ratio: ratio(self.mapped, valid_pages),
            pending_pages: self
                .contents
                .iter()
                .filter(|c| c.flags & F_PENDING != 0)
                .count() as u64,
            offline_busy_us: self.offline_busy_ns as f64 / 1e3,
            memory_bytes: self.memory_bytes(),
        }
    }

    /// Recomputes every invariant of the module documentation from scratch;
    /// the first violation found is the error. O(size): for tests.
    pub fn check(&self) -> std::result::Result<(), String> {
        let blocks = self.cfg.blocks as usize;
        let ppb = self.ppb as usize;
        // Physical pages against contents.
        let mut valid = vec![0u32; blocks];
        for (ppn, &c) in self.p2c.iter().enumerate() {
            if c == NONE {
                continue;
            }
            valid[ppn / ppb] += 1;
            let content = &self.contents[c as usize];
            if content.ppn as usize != ppn {
                return Err(format!(
                    "page {ppn} holds content {c} located at {}",
                    content.ppn
                ));
            }
            if content.refs == 0 {
                return Err(format!("page {ppn} holds released content {c}"));
            }
        }
        if valid != self.valid {
            return Err("block valid counts disagree with the page map".into());
        }
        // Logical pages against reference counts.
        let mut refs = vec![0u32; self.contents.len()];
        let mut mapped = 0;
        for &c in &self.l2c {
            if c != NONE {
                refs[c as usize] += 1;
                mapped += 1;
            }
        }
        if mapped != self.mapped {
            return Err(format!(
                "{mapped} logical pages mapped, counter says {}",
                self.mapped
            ));
        }
        let mut crc_counts = std::collections::HashMap::new();
        let mut indexed = 0;
        for (i, content) in self.contents.iter().enumerate() {
            if content.refs != refs[i] {
                return Err(format!(
                    "content {i} counts {} references, the map holds {}",
                    content.refs, refs[i]
                ));
            }
            if content.refs == 0 {
                if content.ppn != NONE || content.flags & !F_LISTED != 0 {
                    return Err(format!("released content {i} keeps a page or flags"));
                }
                continue;
            }
            if content.ppn == NONE || self.p2c[content.ppn as usize] != i as u32 {
                return Err(format!("live content {i} has no page"));
            }
            if content.flags & F_INDEXED != 0 {
                indexed += 1;
                let index = self.index.as_ref().ok_or("indexed without an index")?;
                if index.find(self.digests[i], &self.digests) != Some(i as u32) {
                    return Err(format!("indexed content {i} not found by its digest"));
                }
            }
            if content.flags & F_PENDING != 0 {
                if content.flags & F_LISTED == 0 {
                    return Err(format!("pending content {i} is not in the queue"));
                }
                if content.refs != 1 || self.l2c[content.owner as usize] != i as u32 {
                    return Err(format!("pending content {i} is not owned by its writer"));
                }
            }
            if self.cfg.store == StoreMode::Fingerprints && content.flags & F_DIGEST == 0 {
                return Err(format!("content {i} has no digest in fingerprints mode"));
            }
            *crc_counts.entry(content.crc).or_insert(0u32) += 1;
        }
        let live = self.contents.len() - self.free_contents.len();
        if let Some(index) = &self.index {
            if index.len() != indexed {
                return Err(format!(
                    "index holds {} entries, {indexed} flagged",
                    index.len()
                ));
            }
            for c in index.contents() {
                if self.contents[c as usize].flags & F_INDEXED == 0 {
                    return Err(format!("index holds unflagged content {c}"));
                }
            }
        }
        if self.cfg.dedup == DedupMode::OfflineSeparated {
            if crc_counts.len() != self.crcs.len()
                || crc_counts
                    .iter()
                    .any(|(&crc, &n)| self.crcs.count(crc) != n)
            {
                return Err("CRC table disagrees with the live contents".into());
            }
        } else if !self.crcs.is_empty() {
            return Err("CRC table in use outside separated mode".into());
        }
        let listed = self
            .contents
            .iter()
            .filter(|c| c.flags & F_LISTED != 0)
            .count();
        if listed != self.pending.len() {
            return Err(format!(
                "{listed} contents flagged listed, {} in the queue",
                self.pending.len()
            ));
        }
        if refs.iter().filter(|&&r| r > 0).count() != live {
            return Err("free-content list disagrees with the live contents".into());
        }
        // Blocks.
        let (mut free, mut open, mut closed) = (0, 0, 0);
        let mut region_blocks = [0u64; 2];
        for b in 0..blocks {
            match self.state[b] {
                B_FREE => {
                    free += 1;
                    if self.valid[b] != 0 {
                        return Err(format!("free block {b} holds valid pages"));
                    }
                }
                B_OPEN => {
                    open += 1;
                    region_blocks[self.region[b] as usize] += 1;
                    let f = self.frontier[self.region[b] as usize];
                    if f.block != b as u32 {
                        return Err(format!("open block {b} is no region's frontier"));
                    }
                    let written = f.next_page as usize;
                    if (written..ppb).any(|i| self.p2c[b * ppb + i] != NONE) {
                        return Err(format!("open block {b} holds pages past its frontier"));
                    }
                }
                B_CLOSED => {
                    closed += 1;
                    region_blocks[self.region[b] as usize] += 1;
                }
                s => return Err(format!("block {b} in state {s} between operations")),
            }
        }
        if free != self.free.len() || closed != self.closed_blocks as usize {
            return Err("block state counts disagree with the free pool or closed count".into());
        }
        if free + open + closed != blocks {
            return Err("free + open + closed != blocks".into());
        }
        if region_blocks != self.region_blocks {
            return Err("region block counts disagree".into());
        }
        let mut in_buckets = 0;
        for v in 0..=ppb {
            let mut b = self.bucket_head[v];
            let mut prev = NONE;
            while b != NONE {
                in_buckets += 1;
                if self.state[b as usize] != B_CLOSED || self.valid[b as usize] as usize != v {
                    return Err(format!("block {b} misfiled in GC bucket {v}"));
                }
                if self.bucket_prev[b as usize] != prev {
                    return Err(format!("GC bucket {v} links broken at block {b}"));
                }
                prev = b;
                b = self.bucket_next[b as usize];
            }
        }
        if in_buckets != closed {
            return Err(format!(
                "{in_buckets} blocks in GC buckets, {closed} closed"
            ));
        }
        // Counter identity.
        let c = &self.counters;
        if c.nand_page_programs + c.dedup_skipped_writes != c.host_page_writes + c.gc_page_copies {
            return Err(format!(
                "programs {} + skipped {} != host writes {} + GC copies {}",
                c.nand_page_programs, c.dedup_skipped_writes, c.host_page_writes, c.gc_page_copies
            ));
        }
        Ok(())
    }
}
