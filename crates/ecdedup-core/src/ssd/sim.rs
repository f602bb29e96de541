//! `ecdedup sim`: replays a block trace on simulated SSDs, one per dedup
//! mode, side by side, and prints their counters as markdown or JSON.
//!
//! Every SSD in a run has the same geometry (sized for the mode with the
//! most write frontiers), sees the same requests in the same order, and
//! gets its offline passes at the same idle gaps, so the modes differ only
//! in what they do inside the SSD. Trace pages are 4 KiB; with 8 KiB SSD
//! pages, each SSD page's fingerprint is composed from its two 4 KiB halves
//! (the simulator remembers every half), so a partial write is a
//! read-modify-write as on a real SSD.
//!
//! Mode `hinted` (not part of `all`) replays paper 003's separation decided
//! by a host instead of the SSD: a [`PlacementFilter`] of the default size
//! classifies each page by its trace CRC and the SSD places it by that
//! hint, as an SSD under a [`crate::media::PlacementDevice`] would.
//!
//! Idle time: a gap of at least `--idle-us` before a request runs an
//! offline pass in the offline modes, hashing as many pending pages as fit
//! in the gap at (page read + SHA-1) each, or all of them with
//! `--offline-unbounded`. Foreground GC is charged to the write that needs
//! it; there is no background GC. Request latency is the sum of its pages'
//! modelled latencies (one chip, no queueing, no parallelism).

use super::ftl::{
    sha1_digest, DedupMode, Ftl, FtlConfig, FtlReport, GcPolicy, PageData, PageFingerprint,
    StoreMode,
};
use super::latency::{LatencyHistogram, LatencyModel};
use super::trace::{
    synthetic_fingerprint, write_ecdedup_line, OnError, Synthetic, SyntheticSpec, TraceFormat,
    TraceOp, TraceReader, TraceRequest, ECDEDUP_HEADER, TRACE_PAGE_BYTES,
};
use crate::error::{Error, Result};
use crate::media::placement::{PlacementFilter, Stream, PLACEMENT_SLOTS_DEFAULT};
use crate::units::parse_size;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Logical capacity of a synthetic run when `--capacity auto`.
pub const SYNTHETIC_CAPACITY_DEFAULT: u64 = 256 << 20;
/// Requests between progress-bar updates.
const PROGRESS_EVERY: u64 = 4096;
const TAG_PREFILL: u64 = 0x7072_6566;
const TAG_AGE: u64 = 0x6167_6564;

#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// Trace file to replay (leave out with --synthetic-writes).
    pub trace: Option<PathBuf>,
    /// Trace format: ecdedup (ours, see docs/ssd.md) or fiu (the FIU dedup traces).
    #[arg(long, value_enum, default_value = "ecdedup")]
    pub format: TraceFormat,
    /// What a malformed trace line does: fail (stop, naming the line) or skip (count it).
    #[arg(long, value_enum, default_value = "fail")]
    pub on_error: OnError,
    /// Dedup inside the SSD: none, inline, offline, separated, hinted
    /// (separation by a host's CRC filter), a comma-separated list, or all
    /// (the first four side by side).
    #[arg(long, default_value = "all")]
    pub mode: String,
    /// Flash page size: 4K or 8K.
    #[arg(long, default_value = "4K")]
    pub page_size: String,
    #[arg(long, default_value_t = 128)]
    pub pages_per_block: u32,
    /// Logical (user-visible) capacity, or auto: the end of the highest
    /// request in the trace (256M for synthetic runs).
    #[arg(long, default_value = "auto")]
    pub capacity: String,
    /// Share of physical pages hidden from the logical space (0 < op < 1).
    #[arg(long, default_value_t = 0.07)]
    pub over_provisioning: f64,
    /// GC victim policy: greedy or cost-benefit.
    #[arg(long, default_value = "greedy")]
    pub gc: String,
    /// A write needing a new block runs GC until this many blocks are free.
    #[arg(long, default_value_t = super::ftl::GC_FREE_BLOCKS_MIN_DEFAULT)]
    pub gc_free_blocks: u32,
    #[arg(long, default_value_t = 50.0)]
    pub read_us: f64,
    #[arg(long, default_value_t = 500.0)]
    pub program_us: f64,
    #[arg(long, default_value_t = 3000.0)]
    pub erase_us: f64,
    /// SHA-1 of one page (paper 003: 75 us).
    #[arg(long, default_value_t = 75.0)]
    pub sha1_us: f64,
    /// CRC32 of one page (paper 003: 6 us).
    #[arg(long, default_value_t = 6.0)]
    pub crc_us: f64,
    /// A gap of at least this long before a request is idle time: the
    /// offline modes run a pass.
    #[arg(long, default_value_t = 10_000)]
    pub idle_us: u64,
    /// Let each idle pass hash every pending page, however short the gap.
    #[arg(long)]
    pub offline_unbounded: bool,
    /// Also run an unbounded pass every N host page writes (0: never), for
    /// traces without meaningful timestamps.
    #[arg(long, default_value_t = 0)]
    pub offline_every: u64,
    /// Write every logical page once with unique contents before the trace
    /// (then run a full offline pass), and count only the trace.
    #[arg(long)]
    pub prefill: bool,
    /// A request beyond the capacity: fail, skip it, or wrap (page modulo capacity).
    #[arg(long, value_enum, default_value = "fail")]
    pub out_of_range: OutOfRange,
    /// Print JSON instead of markdown.
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Replay a synthetic workload of this many random 4 KiB writes instead
    /// of a trace file.
    #[arg(long)]
    pub synthetic_writes: Option<u64>,
    /// Share of synthetic writes carrying one of a pool of popular contents.
    #[arg(long, default_value_t = 0.3)]
    pub synthetic_dup_share: f64,
    /// Popular contents in the synthetic pool.
    #[arg(long, default_value_t = 1024)]
    pub synthetic_dup_pool: u64,
    /// Synthetic writes per burst (an idle second follows each).
    #[arg(long, default_value_t = 8192)]
    pub synthetic_burst: u64,
    #[arg(long, default_value_t = 1)]
    pub synthetic_seed: u64,
    /// Save the synthetic trace here, in ecdedup format.
    #[arg(long)]
    pub save_trace: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutOfRange {
    Fail,
    Skip,
    Wrap,
}

/// How a replay runs, beyond the FTL's own configuration.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// The FTL of every SSD; `dedup` is replaced by each mode in turn.
    pub ftl: FtlConfig,
    pub modes: Vec<DedupMode>,
    pub idle_us: u64,
    pub offline_unbounded: bool,
    pub offline_every: u64,
    pub out_of_range: OutOfRange,
}

/// One simulated SSD of a replay.
struct SimSsd {
    ftl: Ftl,
    request_latency: LatencyHistogram,
    /// 8 KiB pages: the fingerprint of every 4 KiB half, by trace page.
    halves: Vec<PageFingerprint>,
    last_time_us: Option<u64>,
    writes_since_pass: u64,
    /// Mode `hinted`: the host's CRC filter that makes the hints.
    host_filter: Option<PlacementFilter>,
}

/// Figures of one SSD after a replay.
#[derive(Clone, Debug, Serialize)]
pub struct ModeSummary {
    #[serde(flatten)]
    pub ftl: FtlReport,
    /// GC page copies / those of the no-dedup SSD of the same run.
    pub gc_copies_vs_none: Option<f64>,
    /// Modelled latency of whole write requests (sum of their pages), us.
    pub request_write_latency_us_mean: f64,
    pub request_write_latency_us_p99: f64,
}

/// What a replay did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SimSummary {
    pub trace: String,
    pub requests: u64,
    pub write_requests: u64,
    pub read_requests: u64,
    pub trim_requests: u64,
    pub flush_requests: u64,
    pub trace_page_writes: u64,
    pub skipped_lines: u64,
    pub out_of_range_requests: u64,
    pub modes: Vec<ModeSummary>,
}

/// Replays requests on one SSD per mode.
pub struct Replay {
    cfg: ReplayConfig,
    ssds: Vec<SimSsd>,
    trace_pages: u64,
    zero_half: PageFingerprint,
    summary: SimSummary,
}

fn compose(a: PageFingerprint, b: PageFingerprint) -> PageFingerprint {
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(&a.digest.to_be_bytes());
    bytes[16..].copy_from_slice(&b.digest.to_be_bytes());
    PageFingerprint {
        digest: sha1_digest(&bytes),
        crc: crc32c::crc32c_combine(a.crc, b.crc, TRACE_PAGE_BYTES as usize),
    }
}

impl Replay {
    pub fn new(cfg: ReplayConfig) -> Result<Replay> {
        let mut ssds = Vec::new();
        for &mode in &cfg.modes {
            let ftl = Ftl::new(FtlConfig {
                dedup: mode,
                store: StoreMode::Fingerprints,
                ..cfg.ftl.clone()
            })?;
            let halves = if ftl.page_bytes() as u64 == TRACE_PAGE_BYTES {
                Vec::new()
            } else {
                let zero = PageFingerprint::of_bytes(&[0; TRACE_PAGE_BYTES as usize]);
                vec![zero; ftl.logical_pages() as usize * 2]
            };
            ssds.push(SimSsd {
                ftl,
                request_latency: LatencyHistogram::new(),
                halves,
                last_time_us: None,
                writes_since_pass: 0,
                host_filter: (mode == DedupMode::OfflineHinted)
                    .then(|| PlacementFilter::new(PLACEMENT_SLOTS_DEFAULT)),
            });
        }
        let trace_pages = ssds
            .first()
            .map(|s| s.ftl.logical_pages() * s.ftl.page_bytes() as u64 / TRACE_PAGE_BYTES)
            .unwrap_or(0);
        Ok(Replay {
            cfg,
            ssds,
            trace_pages,
            zero_half: PageFingerprint::of_bytes(&[0; TRACE_PAGE_BYTES as usize]),
            summary: SimSummary::default(),
        })
    }

    /// Logical bytes of every SSD.
    pub fn logical_bytes(&self) -> u64 {
        self.trace_pages * TRACE_PAGE_BYTES
    }

    /// Writes every logical page once with a unique content, runs a full
    /// offline pass, and zeroes the counters: a used SSD to start from.
    pub fn prefill(&mut self) {
        for ssd in &mut self.ssds {
            let pages = ssd.ftl.logical_pages();
            for lpn in 0..pages {
                ssd.write_synthetic(lpn, TAG_PREFILL, lpn);
            }
            ssd.settle();
        }
    }

    /// Ages every SSD after a prefill: `writes` overwrites of uniformly
    /// random logical pages with unique contents (the same sequence on
    /// every SSD), then a full offline pass, then zeroed counters. A drive
    /// written once has its spare space in free blocks, and a small trace
    /// would never make it collect garbage; an aged one is in GC's steady
    /// state, its invalid pages spread over its blocks, as a used drive is.
    pub fn age(&mut self, writes: u64, seed: u64) {
        for ssd in &mut self.ssds {
            let pages = ssd.ftl.logical_pages();
            let mut rng = seed;
            for n in 0..writes {
                let lpn = super::trace::splitmix(&mut rng) % pages;
                ssd.write_synthetic(lpn, TAG_AGE, n);
            }
            ssd.settle();
        }
    }

    /// Applies one request to every SSD.
    pub fn apply(&mut self, req: &TraceRequest) -> Result<()> {
        if req.op == TraceOp::Flush {
            // Nothing to do on flash; its arrival still ends idle time.
            self.summary.requests += 1;
            self.summary.flush_requests += 1;
            for ssd in &mut self.ssds {
                ssd.idle(req.time_us, &self.cfg);
            }
            return Ok(());
        }
        let first = req.offset / TRACE_PAGE_BYTES;
        let count = req.length / TRACE_PAGE_BYTES;
        let mut wrap = false;
        if first + count > self.trace_pages {
            match self.cfg.out_of_range {
                OutOfRange::Fail => {
                    return Err(Error::Other(format!(
                        "request at byte {} of {} bytes ends beyond the simulated capacity of {} \
                         bytes (use --capacity, or --out-of-range skip|wrap)",
                        req.offset,
                        req.length,
                        self.logical_bytes()
                    )))
                }
                OutOfRange::Skip => {
                    self.summary.out_of_range_requests += 1;
                    return Ok(());
                }
                OutOfRange::Wrap => {
                    self.summary.out_of_range_requests += 1;
                    wrap = true;
                }
            }
        }
        self.summary.requests += 1;
        match req.op {
            TraceOp::Write => {
                assert_eq!(req.pages.len() as u64, count);
                self.summary.write_requests += 1;
                self.summary.trace_page_writes += count;
            }
            TraceOp::Read => self.summary.read_requests += 1,
            TraceOp::Trim => self.summary.trim_requests += 1,
            TraceOp::Flush => unreachable!("flushes return above"),
        }
        let trace_pages = self.trace_pages;
        let page_of = |i: u64| {
            if wrap {
                (first + i) % trace_pages
            } else {
                first + i
            }
        };
        for ssd in &mut self.ssds {
            ssd.idle(req.time_us, &self.cfg);
            let mut ns = 0;
            if ssd.halves.is_empty() {
                for i in 0..count {
                    let lpn = page_of(i);
                    match req.op {
                        TraceOp::Write => {
                            let f = req.pages[i as usize];
                            let stream = ssd.hint(f.crc);
                            ns += ssd.ftl.write_placed(lpn, PageData::Fingerprint(f), stream)
                        }
                        TraceOp::Read => ns += ssd.ftl.read_fingerprint(lpn).1,
                        TraceOp::Trim => ssd.ftl.trim(lpn),
                        TraceOp::Flush => {}
                    }
                }
            } else {
                // 8 KiB pages: gather the trace pages of each SSD page.
                let mut i = 0;
                while i < count {
                    let tp = page_of(i);
                    let lpn = tp / 2;
                    let mut touched = [false; 2];
                    while i < count && page_of(i) / 2 == lpn {
                        let half = (page_of(i) % 2) as usize;
                        touched[half] = true;
                        if req.op == TraceOp::Write {
                            ssd.halves[2 * lpn as usize + half] = req.pages[i as usize];
                        }
                        i += 1;
                    }
                    match req.op {
                        TraceOp::Write => {
                            if !(touched[0] && touched[1]) {
                                ns += ssd.ftl.read_fingerprint(lpn).1;
                            }
                            let f = compose(
                                ssd.halves[2 * lpn as usize],
                                ssd.halves[2 * lpn as usize + 1],
                            );
                            let stream = ssd.hint(f.crc);
                            ns += ssd.ftl.write_placed(lpn, PageData::Fingerprint(f), stream);
                        }
                        TraceOp::Read => ns += ssd.ftl.read_fingerprint(lpn).1,
                        TraceOp::Trim => {
                            if touched[0] && touched[1] {
                                ssd.ftl.trim(lpn);
                                ssd.halves[2 * lpn as usize] = self.zero_half;
                                ssd.halves[2 * lpn as usize + 1] = self.zero_half;
                            }
                        }
                        TraceOp::Flush => {}
                    }
                }
            }
            if req.op == TraceOp::Write {
                ssd.request_latency.record(ns);
                ssd.writes_since_pass += count;
                if self.cfg.offline_every > 0 && ssd.writes_since_pass >= self.cfg.offline_every {
                    ssd.ftl.offline_pass(u64::MAX);
                    ssd.writes_since_pass = 0;
                }
            }
        }
        Ok(())
    }

    /// The figures so far.
    pub fn summary(&self) -> SimSummary {
        let mut summary = self.summary.clone();
        let none_copies = self
            .ssds
            .iter()
            .find(|s| s.ftl.config().dedup == DedupMode::None)
            .map(|s| s.ftl.counters().gc_page_copies);
        summary.modes = self
            .ssds
            .iter()
            .map(|s| {
                let copies = s.ftl.counters().gc_page_copies;
                ModeSummary {
                    ftl: s.ftl.report(),
                    gc_copies_vs_none: none_copies.map(|n| {
                        if n == 0 {
                            if copies == 0 {
                                1.0
                            } else {
                                f64::INFINITY
                            }
                        } else {
                            copies as f64 / n as f64
                        }
                    }),
                    request_write_latency_us_mean: s.request_latency.mean_ns() / 1e3,
                    request_write_latency_us_p99: s.request_latency.quantile_ns(0.99) as f64 / 1e3,
                }
            })
            .collect();
        summary
    }

    /// Each SSD's FTL (tests).
    pub fn ftls(&self) -> impl Iterator<Item = &Ftl> {
        self.ssds.iter().map(|s| &s.ftl)
    }
}

impl SimSsd {
    /// Writes logical page `lpn` with the unique synthetic content number
    /// `n` of `tag` (for 8 KiB pages, two unique halves recorded per trace
    /// page), as prefill and ageing do.
    fn write_synthetic(&mut self, lpn: u64, tag: u64, n: u64) {
        let f = if self.halves.is_empty() {
            synthetic_fingerprint(tag, n)
        } else {
            let a = synthetic_fingerprint(tag, 2 * n);
            let b = synthetic_fingerprint(tag, 2 * n + 1);
            self.halves[2 * lpn as usize] = a;
            self.halves[2 * lpn as usize + 1] = b;
            compose(a, b)
        };
        self.ftl.write(lpn, PageData::Fingerprint(f));
    }

    /// After prefill or ageing: a full offline pass, then zeroed counters.
    fn settle(&mut self) {
        self.ftl.offline_pass(u64::MAX);
        self.ftl.reset_stats();
        self.request_latency.clear();
    }

    /// The host's placement hint for a page with this CRC (mode `hinted`).
    fn hint(&self, crc: u32) -> Stream {
        self.host_filter
            .as_ref()
            .map_or(Stream::Unknown, |f| f.classify_crc(crc))
    }

    /// Runs the idle-time offline pass if the gap before `time_us` is idle.
    fn idle(&mut self, time_us: u64, cfg: &ReplayConfig) {
        let last = self
            .last_time_us
            .replace(time_us.max(self.last_time_us.unwrap_or(0)));
        let Some(last) = last else {
            return;
        };
        if !self.ftl.config().dedup.offline() || time_us < last.saturating_add(cfg.idle_us) {
            return;
        }
        let budget = if cfg.offline_unbounded {
            u64::MAX
        } else {
            let lat = self.ftl.config().latency;
            (time_us - last) * 1000 / (lat.page_read_ns + lat.sha1_page_ns).max(1)
        };
        if budget > 0 {
            self.ftl.offline_pass(budget);
        }
    }
}

fn us_to_ns(us: f64, what: &str) -> Result<u64> {
    if !(us.is_finite() && (0.0..1e12).contains(&us)) {
        return Err(Error::Config(format!("{what} {us} us is not a latency")));
    }
    Ok((us * 1000.0).round() as u64)
}

fn modes_of(text: &str) -> Result<Vec<DedupMode>> {
    if text == "all" {
        return Ok(DedupMode::ALL.to_vec());
    }
    text.split(',').map(|m| m.trim().parse()).collect()
}

/// The highest byte a trace touches (a pre-scan for `--capacity auto`).
pub fn trace_end(path: &Path, format: TraceFormat, on_error: OnError) -> Result<u64> {
    let file = File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    let mut reader = TraceReader::new(BufReader::with_capacity(1 << 20, file), format, on_error);
    let mut req = TraceRequest::default();
    let mut end = 0;
    while reader.next_into(&mut req)? {
        end = end.max(req.offset + req.length);
    }
    Ok(end)
}

fn progress_bar(len: u64, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(
            "replay [{bar:40}] {bytes}/{total_bytes} {percent}% eta {eta} {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar
}

pub fn run_sim(args: SimArgs) -> Result<()> {
    let modes = modes_of(&args.mode)?;
    let page_bytes = parse_size(&args.page_size)?;
    let page_bytes = u32::try_from(page_bytes)
        .map_err(|_| Error::Config(format!("page size {page_bytes} is not 4K or 8K")))?;
    let latency = LatencyModel {
        page_read_ns: us_to_ns(args.read_us, "--read-us")?,
        page_program_ns: us_to_ns(args.program_us, "--program-us")?,
        block_erase_ns: us_to_ns(args.erase_us, "--erase-us")?,
        sha1_page_ns: us_to_ns(args.sha1_us, "--sha1-us")?,
        crc32_page_ns: us_to_ns(args.crc_us, "--crc-us")?,
    };
    if !(0.0..=1.0).contains(&args.synthetic_dup_share) {
        return Err(Error::Config(format!(
            "--synthetic-dup-share {} is not a share between 0 and 1",
            args.synthetic_dup_share
        )));
    }
    let synthetic = args.synthetic_writes.is_some();
    if synthetic == args.trace.is_some() {
        return Err(Error::Config(
            "give either a trace file or --synthetic-writes N".into(),
        ));
    }
    let logical_bytes = if args.capacity == "auto" {
        match &args.trace {
            Some(path) => trace_end(path, args.format, args.on_error)?,
            None => SYNTHETIC_CAPACITY_DEFAULT,
        }
    } else {
        parse_size(&args.capacity)?
    }
    .max(TRACE_PAGE_BYTES);
    let mut ftl = FtlConfig {
        gc_free_blocks_min: args.gc_free_blocks,
        gc_policy: args.gc.parse::<GcPolicy>()?,
        // Size for two frontiers, so that every mode gets one geometry.
        dedup: DedupMode::OfflineSeparated,
        store: StoreMode::Fingerprints,
        latency,
        ..FtlConfig::new(page_bytes, args.pages_per_block, 1, args.over_provisioning)
    };
    // Catch bad settings before sizing with them.
    let probe = FtlConfig {
        blocks: u32::MAX / args.pages_per_block.max(1) / 2,
        ..ftl.clone()
    };
    probe.validate()?;
    let blocks = ftl.blocks_for(logical_bytes.div_ceil(page_bytes as u64));
    ftl.blocks = u32::try_from(blocks)
        .map_err(|_| Error::Config(format!("capacity {logical_bytes} needs too many blocks")))?;
    let mut replay = Replay::new(ReplayConfig {
        ftl,
        modes,
        idle_us: args.idle_us,
        offline_unbounded: args.offline_unbounded,
        offline_every: args.offline_every,
        out_of_range: args.out_of_range,
    })?;
    if args.prefill {
        replay.prefill();
    }
    let mut req = TraceRequest::default();
    let (skipped, errors) = if let Some(writes) = args.synthetic_writes {
        let spec = SyntheticSpec {
            logical_bytes: replay.logical_bytes(),
            writes,
            dup_share: args.synthetic_dup_share,
            dup_pool: args.synthetic_dup_pool,
            burst_pages: args.synthetic_burst,
            seed: args.synthetic_seed,
            ..SyntheticSpec::default()
        };
        let mut save = match &args.save_trace {
            Some(path) => {
                let f = File::create(path)
                    .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
                let mut w = BufWriter::new(f);
                writeln!(w, "{ECDEDUP_HEADER}").map_err(|e| Error::io("writing the trace", e))?;
                Some(w)
            }
            None => None,
        };
        let bar = progress_bar(writes, args.no_progress);
        for (n, r) in Synthetic::new(spec).enumerate() {
            if let Some(w) = &mut save {
                write_ecdedup_line(w, &r).map_err(|e| Error::io("writing the trace", e))?;
            }
            replay.apply(&r)?;
            if (n as u64).is_multiple_of(PROGRESS_EVERY) {
                bar.set_position(n as u64);
            }
        }
        bar.finish_and_clear();
        if let Some(mut w) = save {
            w.flush().map_err(|e| Error::io("writing the trace", e))?;
        }
        replay.summary.trace = format!("synthetic ({writes} writes)");
        (0, Vec::new())
    } else {
        let path = args.trace.as_ref().expect("checked above");
        let file =
            File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let input: Box<dyn BufRead> = Box::new(BufReader::with_capacity(1 << 20, file));
        let mut reader = TraceReader::new(input, args.format, args.on_error);
        let bar = progress_bar(len, args.no_progress);
        let mut n = 0u64;
        while reader.next_into(&mut req)? {
            replay.apply(&req)?;
            n += 1;
            if n.is_multiple_of(PROGRESS_EVERY) {
                bar.set_position(reader.bytes_read());
            }
        }
        bar.finish_and_clear();
        replay.summary.trace = path.display().to_string();
        (reader.skipped_lines(), reader.errors().to_vec())
    };
    for e in &errors {
        eprintln!("ecdedup: warning: skipped {e}");
    }
    let mut summary = replay.summary();
    summary.skipped_lines = skipped;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&summary).expect("serialises")
        );
    } else {
        print!("{}", markdown(&summary));
    }
    Ok(())
}

/// A ratio for the reports: three decimals, "inf" or "-" when undefined.
pub fn fmt_ratio(x: Option<f64>) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.3}"),
        Some(_) => "inf".into(),
        None => "-".into(),
    }
}

/// The summary as markdown: a comparison table, then every figure per mode.
pub fn markdown(s: &SimSummary) -> String {
    let mut out = String::new();
    let first = s.modes.first();
    out.push_str(&format!("# ecdedup sim: {}\n\n", s.trace));
    if let Some(m) = first {
        out.push_str(&format!(
            "{} requests ({} writes, {} reads, {} trims, {} flushes), {} page writes; \
             {} B pages, {} pages per block, {} blocks, {} logical pages, \
             over-provisioning {}, GC {}; skipped lines {}, out-of-range requests {}\n\n",
            s.requests,
            s.write_requests,
            s.read_requests,
            s.trim_requests,
            s.flush_requests,
            s.trace_page_writes,
            m.ftl.page_bytes,
            m.ftl.pages_per_block,
            m.ftl.blocks,
            m.ftl.logical_pages,
            m.ftl.over_provisioning,
            m.ftl.gc_policy.name(),
            s.skipped_lines,
            s.out_of_range_requests,
        ));
    }
    out.push_str(
        "| mode | GC page copies | vs none | NAND programs | write amp. | erases | \
         dedup skipped | offline remaps | write lat. mean us | write lat. p99 us | \
         request lat. mean us | request lat. p99 us |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for m in &s.modes {
        let c = &m.ftl.counters;
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.3} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
            m.ftl.mode,
            c.gc_page_copies,
            fmt_ratio(m.gc_copies_vs_none),
            c.nand_page_programs,
            m.ftl.write_amplification,
            c.block_erases,
            c.dedup_skipped_writes,
            c.offline_remaps,
            m.ftl.write_latency_us_mean,
            m.ftl.write_latency_us_p99,
            m.request_write_latency_us_mean,
            m.request_write_latency_us_p99,
        ));
    }
    // Every figure, one row per field, one column per mode.
    let values: Vec<serde_json::Map<String, serde_json::Value>> = s
        .modes
        .iter()
        .map(|m| match serde_json::to_value(m).expect("serialises") {
            serde_json::Value::Object(map) => map,
            _ => unreachable!("a struct serialises to an object"),
        })
        .collect();
    if let Some(keys) = values.first() {
        out.push_str("\n| figure |");
        for m in &s.modes {
            out.push_str(&format!(" {} |", m.ftl.mode));
        }
        out.push_str("\n|---|");
        out.push_str(&"---:|".repeat(s.modes.len()));
        out.push('\n');
        for key in keys.keys() {
            out.push_str(&format!("| {key} |"));
            for v in &values {
                let cell = match &v[key] {
                    serde_json::Value::Number(n) => match n.as_f64() {
                        Some(f) if n.is_f64() => format!("{f:.4}"),
                        _ => n.to_string(),
                    },
                    serde_json::Value::String(t) => t.clone(),
                    serde_json::Value::Null => "-".into(),
                    other => other.to_string(),
                };
                out.push_str(&format!(" {cell} |"));
            }
            out.push('\n');
        }
    }
    out
}
