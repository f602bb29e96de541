//! `ecdedup eval block-separation` (paper 003): replays block traces
//! captured from real activity on an ecdedup volume (`serve --trace`, see
//! `scripts/capture-traces.sh`) on simulated SSDs in the paper's four modes
//! (no dedup, inline, offline, offline with block separation), plus the
//! separation decided by a host's placement hint, and reports GC page
//! copies normalised to no dedup and the modelled write latency, beside
//! the paper's figures; writes `block-separation.md`, `.json` and `.svg`.
//!
//! Every SSD of one trace has the same geometry (4 KiB pages, 128 pages per
//! block, 7% over-provisioning, the logical space the trace touches), starts
//! full and aged (every logical page written once with unique contents,
//! then `--age` logical spaces of random unique overwrites, then an offline
//! pass: a used drive in GC's steady state, so that GC runs from the first
//! write of even a small trace), and
//! sees the trace in order; the offline modes run their idle-time pass in
//! every gap of at least `--idle-us`, as long as the gap allows (see
//! [`ecdedup_core::ssd::sim`]). Everything reported is a deterministic function of
//! the trace files and the options.

use ecdedup_core::error::{Error, Result};
use ecdedup_core::ssd::sim::{
    fmt_ratio, trace_end, ModeSummary, OutOfRange, Replay, ReplayConfig, SimSummary,
};
use ecdedup_core::ssd::trace::{OnError, TraceFormat, TraceReader, TraceRequest};
use ecdedup_core::ssd::{DedupMode, FtlConfig, LatencyModel, StoreMode};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::fmt::Write as _;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

/// Requests between progress-bar updates.
const PROGRESS_EVERY: u64 = 4096;

/// The modes compared, in table order.
pub const MODES: [DedupMode; 5] = [
    DedupMode::None,
    DedupMode::Inline,
    DedupMode::Offline,
    DedupMode::OfflineSeparated,
    DedupMode::OfflineHinted,
];

/// Paper 003, section 3 and Figure 2 (its text gives only these).
pub const PAPER_COPIES_FEWER_MIN: f64 = 0.20;
pub const PAPER_COPIES_FEWER_MAX: f64 = 0.61;

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Trace files (ecdedup format) to replay; each file's stem names its
    /// workload. Capture them with scripts/capture-traces.sh.
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// Folder for block-separation.{md,json,svg}.
    #[arg(long, default_value = "eval-out/block-separation")]
    pub out: PathBuf,
    #[arg(long, default_value_t = 128)]
    pub pages_per_block: u32,
    /// Share of physical pages hidden from the logical space.
    #[arg(long, default_value_t = 0.07)]
    pub over_provisioning: f64,
    /// A gap of at least this long before a request is idle time.
    #[arg(long, default_value_t = 10_000)]
    pub idle_us: u64,
    /// Also run an unbounded offline pass every N host page writes (0: never).
    #[arg(long, default_value_t = 0)]
    pub offline_every: u64,
    /// Start from an empty drive instead of a full, aged one.
    #[arg(long)]
    pub no_prefill: bool,
    /// Aging after the prefill: random overwrites with unique contents,
    /// in logical spaces (1.0 = as many page writes as logical pages).
    #[arg(long, default_value_t = 1.0)]
    pub age: f64,
    /// What a malformed trace line does: fail or skip.
    #[arg(long, value_enum, default_value = "fail")]
    pub on_error: OnError,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// One workload's replay.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadResult {
    pub workload: String,
    pub trace: String,
    pub trace_bytes: u64,
    pub logical_bytes: u64,
    pub summary: SimSummary,
}

#[derive(Clone, Debug, Serialize)]
pub struct Results {
    pub pages_per_block: u32,
    pub over_provisioning: f64,
    pub idle_us: u64,
    pub prefill: bool,
    pub age: f64,
    pub workloads: Vec<WorkloadResult>,
}

fn workload_name(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    name.strip_suffix(".trace").unwrap_or(&name).to_string()
}

/// Replays every trace; `bar` advances by trace bytes.
pub fn replay_all(opts: &Options, bar: &ProgressBar) -> Result<Results> {
    if !(0.0..=100.0).contains(&opts.age) {
        return Err(Error::Config(format!(
            "--age {} is not 0 to 100 logical spaces",
            opts.age
        )));
    }
    let mut workloads = Vec::new();
    for path in &opts.traces {
        let workload = workload_name(path);
        bar.set_message(workload.clone());
        let logical_bytes = trace_end(path, TraceFormat::Ecdedup, opts.on_error)?.max(4096);
        let base = FtlConfig {
            // Size for two frontiers, so that every mode gets one geometry.
            dedup: DedupMode::OfflineSeparated,
            store: StoreMode::Fingerprints,
            latency: LatencyModel::default(),
            ..FtlConfig::new(4096, opts.pages_per_block, 1, opts.over_provisioning)
        };
        // Catch bad settings before sizing with them.
        FtlConfig {
            blocks: u32::MAX / opts.pages_per_block.max(1) / 2,
            ..base.clone()
        }
        .validate()?;
        let blocks = base.blocks_for(logical_bytes.div_ceil(4096));
        let blocks = u32::try_from(blocks).map_err(|_| {
            Error::Config(format!(
                "{workload}: {logical_bytes} bytes need too many blocks"
            ))
        })?;
        let mut replay = Replay::new(ReplayConfig {
            ftl: FtlConfig { blocks, ..base },
            modes: MODES.to_vec(),
            idle_us: opts.idle_us,
            offline_unbounded: false,
            offline_every: opts.offline_every,
            out_of_range: OutOfRange::Fail,
        })?;
        if !opts.no_prefill {
            replay.prefill();
            bar.set_message(format!("{workload} (aging)"));
            replay.age(
                (opts.age * replay.logical_bytes() as f64 / 4096.0) as u64,
                1,
            );
            bar.set_message(workload.clone());
        }
        let file =
            File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let trace_bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
        let start = bar.position();
        let mut reader = TraceReader::new(
            BufReader::with_capacity(1 << 20, file),
            TraceFormat::Ecdedup,
            opts.on_error,
        );
        let mut req = TraceRequest::default();
        let mut n = 0u64;
        while reader.next_into(&mut req)? {
            replay.apply(&req)?;
            n += 1;
            if n.is_multiple_of(PROGRESS_EVERY) {
                bar.set_position(start + reader.bytes_read());
                super::proc::check_interrupted()?;
            }
        }
        bar.set_position(start + trace_bytes);
        for e in reader.errors() {
            bar.suspend(|| eprintln!("ecdedup: warning: {workload}: skipped {e}"));
        }
        let mut summary = replay.summary();
        summary.trace = path.display().to_string();
        summary.skipped_lines = reader.skipped_lines();
        workloads.push(WorkloadResult {
            workload,
            trace: path.display().to_string(),
            trace_bytes,
            logical_bytes: replay.logical_bytes(),
            summary,
        });
    }
    Ok(Results {
        pages_per_block: opts.pages_per_block,
        over_provisioning: opts.over_provisioning,
        idle_us: opts.idle_us,
        prefill: !opts.no_prefill,
        age: if opts.no_prefill { 0.0 } else { opts.age },
        workloads,
    })
}

fn mode_label(m: DedupMode) -> &'static str {
    match m {
        DedupMode::None => "no dedup",
        DedupMode::Inline => "inline",
        DedupMode::Offline => "offline",
        DedupMode::OfflineSeparated => "offline + separation",
        DedupMode::OfflineHinted => "offline + separation by host hint",
    }
}

fn find(w: &WorkloadResult, mode: DedupMode) -> Option<&ModeSummary> {
    w.summary.modes.iter().find(|m| m.ftl.mode == mode)
}

/// Separated (or hinted) GC copies as "x% fewer" than plain offline's.
fn fewer_than_offline(w: &WorkloadResult, mode: DedupMode) -> String {
    let (Some(off), Some(m)) = (find(w, DedupMode::Offline), find(w, mode)) else {
        return "-".into();
    };
    let (a, b) = (
        off.ftl.counters.gc_page_copies as f64,
        m.ftl.counters.gc_page_copies as f64,
    );
    if a == 0.0 {
        return "- (no copies)".into();
    }
    let fewer = 1.0 - b / a;
    if fewer >= 0.0 {
        format!("{:.1}% fewer", 100.0 * fewer)
    } else {
        format!("{:.1}% more", -100.0 * fewer)
    }
}

/// The report: one table row per workload and mode.
pub fn markdown(r: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "SSD: 4 KiB pages, {} pages per block, over-provisioning {}, greedy GC, \
         {}; idle gap {} us; latencies: read 50 us, program 500 us, erase 3 ms, \
         SHA-1 75 us, CRC32 6 us (paper 003's hash costs).\n",
        r.pages_per_block,
        r.over_provisioning,
        if r.prefill {
            format!(
                "starts full and aged (every logical page written once, then {} \
                 logical space(s) of random unique overwrites, then an offline pass)",
                r.age
            )
        } else {
            "starts empty".to_string()
        },
        r.idle_us
    );
    out.push_str(
        "| workload | mode | GC page copies | vs no dedup | vs plain offline | paper (vs plain offline) \
         | write lat. mean us | write lat. p99 us | NAND programs | erases | dedup (skipped + remapped) |\n\
         |---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|\n",
    );
    for w in &r.workloads {
        for m in &w.summary.modes {
            let mode = m.ftl.mode;
            let c = &m.ftl.counters;
            let (vs_offline, paper) = match mode {
                DedupMode::OfflineSeparated => (
                    fewer_than_offline(w, mode),
                    format!(
                        "{:.0}-{:.0}% fewer",
                        100.0 * PAPER_COPIES_FEWER_MIN,
                        100.0 * PAPER_COPIES_FEWER_MAX
                    ),
                ),
                DedupMode::OfflineHinted => (fewer_than_offline(w, mode), "-".into()),
                DedupMode::Inline => ("-".into(), "longest latency".into()),
                _ => ("-".into(), "-".into()),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {} | {} | {} |",
                w.workload,
                mode_label(mode),
                c.gc_page_copies,
                fmt_ratio(m.gc_copies_vs_none),
                vs_offline,
                paper,
                m.request_write_latency_us_mean,
                m.request_write_latency_us_p99,
                c.nand_page_programs,
                c.block_erases,
                c.dedup_skipped_writes + c.offline_remaps,
            );
        }
    }
    out.push('\n');
    for w in &r.workloads {
        let s = &w.summary;
        let _ = writeln!(
            out,
            "- {}: {} requests ({} writes, {} reads, {} trims, {} flushes), {} page writes, \
             logical space {}, trace {}",
            w.workload,
            s.requests,
            s.write_requests,
            s.read_requests,
            s.trim_requests,
            s.flush_requests,
            s.trace_page_writes,
            ecdedup_core::units::format_size(w.logical_bytes),
            ecdedup_core::units::format_size(w.trace_bytes),
        );
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

const COLORS: [&str; 5] = ["#8c8c8c", "#ff7f0e", "#1f77b4", "#d62728", "#9467bd"];

/// Two panels of grouped bars (one group per workload, one bar per mode):
/// GC page copies normalised to no dedup, and mean request write latency.
pub fn svg(r: &Results) -> String {
    let groups = r.workloads.len().max(1);
    let (panel_w, panel_h) = ((groups * 170 + 80) as f64, 260.0);
    let (w, h) = (panel_w * 2.0 + 20.0, panel_h + 70.0);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    type Metric = fn(&ModeSummary) -> f64;
    let panels: [(&str, Metric); 2] = [
        ("GC page copies / no dedup", |m| {
            m.gc_copies_vs_none.filter(|v| v.is_finite()).unwrap_or(0.0)
        }),
        ("mean write latency (us, model)", |m| {
            m.request_write_latency_us_mean
        }),
    ];
    for (p, (title, metric)) in panels.iter().enumerate() {
        let x0 = p as f64 * (panel_w + 20.0);
        let (left, top, bottom) = (50.0, 30.0, 40.0);
        let (pw, ph) = (panel_w - left - 10.0, panel_h - top - bottom);
        let max = r
            .workloads
            .iter()
            .flat_map(|wl| wl.summary.modes.iter().map(metric))
            .fold(0.0f64, f64::max)
            .max(1e-9)
            * 1.15;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="18" font-size="13" font-weight="bold">{}</text>"#,
            x0 + left,
            esc(title)
        );
        let _ = writeln!(
            out,
            r#"<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="black"/><line x1="{0}" y1="{2}" x2="{3}" y2="{2}" stroke="black"/>"#,
            x0 + left,
            top,
            top + ph,
            x0 + left + pw
        );
        for t in 0..=4 {
            let v = max * t as f64 / 4.0;
            let y = top + ph - ph * t as f64 / 4.0;
            let _ = writeln!(
                out,
                r##"<text x="{}" y="{}" text-anchor="end">{:.2}</text><line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/>"##,
                x0 + left - 4.0,
                y + 4.0,
                v,
                x0 + left,
                x0 + left + pw
            );
        }
        let group_w = pw / groups as f64;
        for (g, wl) in r.workloads.iter().enumerate() {
            let gx = x0 + left + g as f64 * group_w;
            let bars = wl.summary.modes.len().max(1) as f64;
            let bar_w = (group_w - 20.0) / bars;
            for (i, m) in wl.summary.modes.iter().enumerate() {
                let v = metric(m);
                let bh = ph * v / max;
                let bx = gx + 10.0 + i as f64 * bar_w;
                let _ = writeln!(
                    out,
                    r#"<rect x="{bx:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{}"><title>{}: {v:.3}</title></rect>"#,
                    top + ph - bh,
                    bar_w - 2.0,
                    COLORS[i % COLORS.len()],
                    esc(mode_label(m.ftl.mode))
                );
                let _ = writeln!(
                    out,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="9">{}</text>"#,
                    bx + bar_w / 2.0 - 1.0,
                    top + ph - bh - 3.0,
                    if v >= 100.0 {
                        format!("{v:.0}")
                    } else {
                        format!("{v:.2}")
                    }
                );
            }
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
                gx + group_w / 2.0,
                top + ph + 16.0,
                esc(&wl.workload)
            );
        }
    }
    for (i, m) in MODES.iter().enumerate() {
        let x = 50.0 + i as f64 * 150.0;
        let y = h - 18.0;
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{y}">{}</text>"#,
            y - 9.0,
            COLORS[i],
            x + 14.0,
            esc(mode_label(*m))
        );
    }
    out.push_str("</svg>\n");
    out
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

pub fn run(opts: Options) -> Result<()> {
    super::proc::install_interrupt_handler();
    let mut total = 0;
    for t in &opts.traces {
        total += std::fs::metadata(t)
            .map_err(|e| Error::io(format!("reading {}", t.display()), e))?
            .len();
    }
    let bar = if opts.no_progress {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "block-separation [{bar:40}] {bytes}/{total_bytes} {percent}% eta {eta} {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar
    };
    let results = replay_all(&opts, &bar)?;
    bar.finish_and_clear();
    std::fs::create_dir_all(&opts.out)
        .map_err(|e| Error::io(format!("creating {}", opts.out.display()), e))?;
    let md = markdown(&results);
    write_file(&opts.out.join("block-separation.md"), &md)?;
    write_file(&opts.out.join("block-separation.svg"), &svg(&results))?;
    let json = serde_json::to_string_pretty(&results).expect("results serialise");
    write_file(&opts.out.join("block-separation.json"), &json)?;
    print!("{md}");
    eprintln!(
        "ecdedup: wrote {}/block-separation.{{md,json,svg}}",
        opts.out.display()
    );
    Ok(())
}
