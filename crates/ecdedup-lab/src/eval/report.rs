//! The paper's figures and the markdown report.
//!
//! Paper 000 (Heo, Ahn, Kim, IEICE 2016) gives its results as ratios to
//! plain RAID-6 for RAID chunk sizes 32 KB and 1024 KB; [`paper_figures`]
//! holds every number its text states, with the sentence it comes from.
//! Where the paper gives none (other chunk sizes, absolute times), the
//! report says "not given".

use super::results::{Mode, Results, RunResult};
use ecdedup_core::dedup::Policy;
use ecdedup_core::units::format_size;
use std::fmt::Write as _;

pub use super::results::PaperFigure;

const Q_THROUGHPUT: &str = "Compared to RAID-6, RAID-6 using data deduplication shows 75% and 89% of the write performance when the chunk size is 32KB and 1024KB, respectively. But the proposed parity deduplication method shows 95% and 96% of the write performance in the same environment. (Sect. 4.2, Fig. 5)";
const Q_PARITY: &str = "In terms of the number of write operations to the parity disk, for the same chunk sizes, RAID-6 using data deduplication shows 8% and 13% fewer write operations, respectively, than RAID-6, whereas the proposed method shows 22% and 19% fewer write operations than RAID-6. (Sect. 4.2, Fig. 6)";
const Q_DRAM: &str = "RAID-6 using data deduplication uses DRAM capacity as much as 3.5% of the workload size, whereas the proposed method uses 1% of the workload size. (Sect. 4.2, Fig. 7)";
const Q_DRAM_REL: &str = "In the proposed method, DRAM usage for hash tables are 72% and 69% less than RAID-6 using data deduplication. (Sect. 4.2, Fig. 7)";
const Q_DECODE1: &str = "in case of 1 disk failure, RAID-6 using data deduplication spent 10% and 8% more time than RAID-6, respectively. While the proposed method spent 13%, 16% more time than existing RAID-6. (Sect. 4.2, Fig. 8)";
const Q_DECODE2: &str = "And in case of two disks failure, RAID-6 using data deduplication spent 4% and 5% more time than RAID-6, respectively. Whereas the proposed method spent 7%, 11% more time than traditional RAID-6. (Sect. 4.2, Fig. 8)";

const K32: u64 = 32 << 10;
const M1: u64 = 1 << 20;

/// Every figure the paper's text states.
pub fn paper_figures() -> Vec<PaperFigure> {
    let mut v = Vec::new();
    let mut add = |metric: &str, policy, chunk, value, quote: &str| {
        v.push(PaperFigure {
            metric: metric.into(),
            policy,
            chunk_bytes: chunk,
            value,
            quote: quote.into(),
        })
    };
    use Policy::{All, Parity};
    for (metric, q, vals) in [
        (
            "throughput_relative",
            Q_THROUGHPUT,
            [0.75, 0.89, 0.95, 0.96],
        ),
        ("parity_write_reduction", Q_PARITY, [0.08, 0.13, 0.22, 0.19]),
        ("decode_1_failed_extra", Q_DECODE1, [0.10, 0.08, 0.13, 0.16]),
        ("decode_2_failed_extra", Q_DECODE2, [0.04, 0.05, 0.07, 0.11]),
    ] {
        add(metric, All, Some(K32), vals[0], q);
        add(metric, All, Some(M1), vals[1], q);
        add(metric, Parity, Some(K32), vals[2], q);
        add(metric, Parity, Some(M1), vals[3], q);
    }
    add("index_dram_share", All, None, 0.035, Q_DRAM);
    add("index_dram_share", Parity, None, 0.01, Q_DRAM);
    add(
        "index_dram_vs_data_dedup",
        Parity,
        Some(K32),
        0.72,
        Q_DRAM_REL,
    );
    add(
        "index_dram_vs_data_dedup",
        Parity,
        Some(M1),
        0.69,
        Q_DRAM_REL,
    );
    v
}

/// The paper's value of `metric` for a policy at a chunk size, if stated.
pub fn paper(figs: &[PaperFigure], metric: &str, policy: Policy, chunk: u64) -> Option<f64> {
    figs.iter()
        .find(|f| {
            f.metric == metric && f.policy == policy && f.chunk_bytes.is_none_or(|c| c == chunk)
        })
        .map(|f| f.value)
}

pub fn config_name(p: Policy) -> &'static str {
    match p {
        Policy::None => "RAID-6",
        Policy::All => "RAID-6 + data dedup",
        Policy::Parity => "RAID-6 + parity dedup",
    }
}

pub fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// A reduction 1 - ours/base as "22.0% fewer" or "3.0% more".
pub fn fewer(x: f64) -> String {
    if x >= 0.0 {
        format!("{:.1}% fewer", 100.0 * x)
    } else {
        format!("{:.1}% more", -100.0 * x)
    }
}

/// A change ours/base - 1 as "+13.0%" or "-2.0%".
pub fn signed(x: f64) -> String {
    format!("{:+.1}%", 100.0 * x)
}

fn not_given() -> String {
    "not given".into()
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// Median and [min, max] of `xs` (None when empty).
fn spread(xs: &[f64]) -> Option<(f64, f64, f64)> {
    if xs.is_empty() {
        return None;
    }
    let lo = xs.iter().cloned().fold(f64::MAX, f64::min);
    let hi = xs.iter().cloned().fold(f64::MIN, f64::max);
    Some((median(xs), lo, hi))
}

/// Ratios paired by round, `base[i] / run[i]` (a throughput ratio from
/// write times of the same round), and the A/A control of the baseline,
/// `base[i] / base[i+1]`: the noise floor the first must stand out of.
fn paired_by_round(base: &[f64], run: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let pairs = base
        .iter()
        .zip(run)
        .filter_map(|(b, r)| ratio(*b, *r))
        .collect();
    let control = base.windows(2).filter_map(|w| ratio(w[0], w[1])).collect();
    (pairs, control)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One entry per (mode, chunk, policy), in first-run order: the first
/// round's counters, median times over all rounds.
pub fn summarize(runs: &[RunResult]) -> Vec<RunResult> {
    let mut out: Vec<RunResult> = Vec::new();
    for r in runs {
        if out
            .iter()
            .any(|x| x.mode == r.mode && x.chunk_bytes == r.chunk_bytes && x.policy == r.policy)
        {
            continue;
        }
        let same: Vec<&RunResult> = runs
            .iter()
            .filter(|x| x.mode == r.mode && x.chunk_bytes == r.chunk_bytes && x.policy == r.policy)
            .collect();
        let first = same.iter().min_by_key(|x| x.round).expect("one at least");
        let mut s = (*first).clone();
        s.write_seconds_rounds = same.iter().map(|x| x.write_seconds).collect();
        s.write_seconds = median(&s.write_seconds_rounds);
        s.write_mib_per_s = s.workload_bytes as f64 / (1 << 20) as f64 / s.write_seconds.max(1e-9);
        s.decode_rounds = same.iter().filter_map(|x| x.decode.clone()).collect();
        if let Some(d) = s.decode.as_mut() {
            let pick = |f: fn(&super::results::DecodeResult) -> f64| {
                median(&s.decode_rounds.iter().map(f).collect::<Vec<_>>())
            };
            d.healthy_seconds = pick(|d| d.healthy_seconds);
            d.one_failed_seconds = pick(|d| d.one_failed_seconds);
            d.two_failed_seconds = pick(|d| d.two_failed_seconds);
            d.verified = s.decode_rounds.iter().all(|d| d.verified);
        }
        out.push(s);
    }
    out
}

/// The plain RAID-6 run of the same mode and chunk size.
pub fn baseline(r: &Results, mode: Mode, chunk: u64) -> Option<&RunResult> {
    r.summary
        .iter()
        .find(|x| x.mode == mode && x.chunk_bytes == chunk && x.policy == Policy::None)
}

fn run_of(r: &Results, mode: Mode, chunk: u64, policy: Policy) -> Option<&RunResult> {
    r.summary
        .iter()
        .find(|x| x.mode == mode && x.chunk_bytes == chunk && x.policy == policy)
}

fn human(b: u64) -> String {
    super::results::format_size_approx(b)
}

fn modes(r: &Results) -> Vec<Mode> {
    let mut v = Vec::new();
    for run in &r.summary {
        if !v.contains(&run.mode) {
            v.push(run.mode);
        }
    }
    v
}

fn chunks(r: &Results, mode: Mode) -> Vec<u64> {
    let mut v = Vec::new();
    for run in r.summary.iter().filter(|x| x.mode == mode) {
        if !v.contains(&run.chunk_bytes) {
            v.push(run.chunk_bytes);
        }
    }
    v
}

/// A paper figure as text, "baseline" for plain RAID-6.
fn paper_cell(
    figs: &[PaperFigure],
    metric: &str,
    policy: Policy,
    chunk: u64,
    f: fn(f64) -> String,
) -> String {
    if policy == Policy::None {
        return "baseline".into();
    }
    paper(figs, metric, policy, chunk).map_or_else(not_given, f)
}

pub fn markdown(r: &Results) -> String {
    let mut s = String::new();
    let figs = &r.paper;
    let w = &r.workload;
    let _ = writeln!(s, "## Parity dedup (paper 000) reproduction\n");
    let _ = writeln!(s, "Command: `{}`\n", r.command);
    let _ = writeln!(
        s,
        "Host: {}, {} CPUs. Arrays: RS({},{}) over {} device files on the host's disk, served by `ecdedup serve` (nbdkit) on a Unix socket; {} over {} sub-chunks{}, {}, index bound {} entries per device; volume {}. Total run time {:.0} s.\n",
        r.host,
        r.cpus,
        r.k,
        r.m,
        r.devices,
        r.fingerprint.to_uppercase(),
        format_size(r.dedup_block_bytes as u64),
        if r.fingerprint == "sha1" {
            " (the paper's hash and chunk)"
        } else {
            " (the paper hashes with SHA-1)"
        },
        if r.verify {
            "every hit byte-compared"
        } else {
            "no byte compare"
        },
        r.index_entries_max,
        format_size(r.volume_bytes),
        r.total_seconds
    );
    let files: Vec<String> = w
        .files
        .iter()
        .map(|f| format!("`{}` ({})", f.path, human(f.bytes)))
        .collect();
    let _ = writeln!(
        s,
        "Workload: {} — {} in all. Measured duplicate content at fixed 4 KiB blocks over the whole workload (one global index, each file padded to 4 KiB): **{} of {} blocks are duplicates ({})**, {} are zero blocks. The array's dedup index is per device, so it can find at most this much (in raw mode identical blocks land on different devices unless their offsets agree modulo the stripe).\n",
        files.join(", "),
        human(w.bytes),
        w.blocks_4k - w.unique_blocks_4k,
        w.blocks_4k,
        pct(w.duplicate_ratio_4k),
        pct(w.zero_blocks_4k as f64 / w.blocks_4k.max(1) as f64)
    );
    let _ = writeln!(
        s,
        "Baselines: the paper's RAID-6 rewrites a whole RAID chunk of parity on each partial-stripe update (Table 1: it hashes all n/c sub-chunks of every parity chunk), so its savings count parity sub-chunks that did not change. Our array is a careful RAID (like Linux md): it reads and writes only the 4 KiB pages a write touches. Parity writes are therefore reported against both: **md-style** = the parity pages plain RAID-6 wrote here; **paper-style** = stripe updates × m × chunk / 4 KiB of the plain run.\n"
    );
    summary_table(&mut s, r);
    for mode in modes(r) {
        match mode {
            Mode::Fs => {
                let _ = writeln!(
                    s,
                    "### fs mode: ext4 on the volume (nbdfuse + losetup + mount), workloads extracted one after another, `sync -f` after each\n"
                );
            }
            Mode::Raw => {
                let _ = writeln!(
                    s,
                    "### raw mode: the workload files written back to back as one sequential stream (4 MiB requests, one in flight, then a flush)\n"
                );
            }
        }
        mode_tables(&mut s, r, mode);
    }
    let _ = writeln!(s, "### The paper's statements used above\n");
    let mut quotes: Vec<&str> = Vec::new();
    for f in figs {
        if !quotes.contains(&f.quote.as_str()) {
            quotes.push(&f.quote);
        }
    }
    for q in quotes {
        let _ = writeln!(s, "- \"{q}\"");
    }
    let _ = writeln!(
        s,
        "- Write throughput, parity writes and decode times are given only as ratios to RAID-6, for chunk sizes 32 KB and 1024 KB; absolute values (Figs. 5-8) are not in the text (\"not given\"). Its workload: \"a compressed 2.19GB tar file comprising of Linux kernel version 2.6.0~2.6.39 files\", on 6 virtual SSDs (Samsung 840 PRO), Jerasure RAID-6 in a KVM guest, averages of 5 runs.\n"
    );
    s
}

/// "ours (paper)" for a ratio cell.
fn with_paper(ours: Option<String>, paper: Option<String>) -> String {
    let o = ours.unwrap_or_else(|| "-".into());
    match paper {
        Some(p) => format!("{o} ({p})"),
        None => o,
    }
}

/// One row per run: every metric as ours with the paper's in brackets.
fn summary_table(s: &mut String, r: &Results) {
    let figs = &r.paper;
    let _ = writeln!(
        s,
        "### Summary: ours (paper's figure in brackets; \"n/g\" where the paper gives none)\n"
    );
    let _ = writeln!(
        s,
        "| mode | chunk | configuration | write throughput vs RAID-6 | parity pages written vs RAID-6 (md-style) | vs paper-style RAID-6 | fingerprint DRAM (index + slot → entry table), % of workload | decode, 1 failed, vs RAID-6 | decode, 2 failed, vs RAID-6 |"
    );
    let _ = writeln!(
        s,
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for mode in modes(r) {
        for c in chunks(r, mode) {
            let base = baseline(r, mode, c);
            for p in [Policy::None, Policy::All, Policy::Parity] {
                let Some(run) = run_of(r, mode, c, p) else {
                    continue;
                };
                let pap = |metric: &str, f: fn(f64) -> String| -> Option<String> {
                    if p == Policy::None {
                        return None;
                    }
                    Some(paper(figs, metric, p, c).map_or_else(|| "n/g".to_string(), f))
                };
                let thr = base.and_then(|b| ratio(b.write_seconds, run.write_seconds));
                let md = base.and_then(|b| {
                    ratio(run.parity_pages_media as f64, b.parity_pages_media as f64)
                });
                let ps = base.and_then(|b| {
                    ratio(
                        run.parity_pages_media as f64,
                        b.parity_pages_paper_baseline as f64,
                    )
                });
                let dram = (p != Policy::None).then(|| {
                    format!(
                        "{:.2}%",
                        100.0 * run.fingerprint_dram_bytes() as f64
                            / run.workload_bytes.max(1) as f64
                    )
                });
                let dec = |f: fn(&super::results::DecodeResult) -> f64| {
                    let d = run.decode.as_ref()?;
                    let b = base?.decode.as_ref()?;
                    if p == Policy::None {
                        return Some("baseline".to_string());
                    }
                    ratio(f(d), f(b)).map(|x| signed(x - 1.0))
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    mode.name(),
                    format_size(c),
                    config_name(p),
                    with_paper(thr.map(pct), pap("throughput_relative", pct)),
                    with_paper(
                        if p == Policy::None {
                            Some("baseline".into())
                        } else {
                            md.map(|x| fewer(1.0 - x))
                        },
                        pap("parity_write_reduction", fewer)
                    ),
                    ps.map_or("-".into(), |x| fewer(1.0 - x)),
                    with_paper(
                        dram,
                        pap("index_dram_share", |x| format!("{:.1}%", 100.0 * x))
                    ),
                    with_paper(
                        dec(|d| d.one_failed_seconds),
                        pap("decode_1_failed_extra", signed)
                    ),
                    with_paper(
                        dec(|d| d.two_failed_seconds),
                        pap("decode_2_failed_extra", signed)
                    ),
                );
            }
        }
    }
    let _ = writeln!(
        s,
        "\n\"md-style\": against the parity pages plain RAID-6 wrote here (only the touched pages); \"paper-style\": against stripe updates × m × chunk of the plain run (the paper's RAID-6 rewrites whole parity chunks). The paper's parity-write figure is a reduction against its RAID-6. Details per mode below.\n"
    );
}

fn mode_tables(s: &mut String, r: &Results, mode: Mode) {
    let figs = &r.paper;
    let chunks = chunks(r, mode);
    let rows = |f: &mut dyn FnMut(&RunResult, Option<&RunResult>)| {
        for &c in &chunks {
            for p in [Policy::None, Policy::All, Policy::Parity] {
                if let Some(run) = run_of(r, mode, c, p) {
                    f(run, baseline(r, mode, c));
                }
            }
        }
    };

    let _ = writeln!(
        s,
        "Write throughput (relative to plain RAID-6 at the same chunk size; {}):\n",
        if r.rounds > 1 {
            format!("median of {} rounds, [min-max] beside it", r.rounds)
        } else {
            "a single run: on a shared machine differences of several percent are noise".into()
        }
    );
    let _ = writeln!(
        s,
        "| chunk | configuration | write time (s) | MiB/s | vs RAID-6 | paper |"
    );
    let _ = writeln!(s, "| --- | --- | ---: | ---: | ---: | ---: |");
    rows(&mut |run, base| {
        let rel = base.and_then(|b| ratio(b.write_seconds, run.write_seconds));
        let spread = match spread(&run.write_seconds_rounds) {
            Some((_, lo, hi)) if run.write_seconds_rounds.len() > 1 => {
                format!(" [{lo:.1}-{hi:.1}]")
            }
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {:.1}{} | {:.1} | {} | {} |",
            format_size(run.chunk_bytes),
            config_name(run.policy),
            run.write_seconds,
            spread,
            run.write_mib_per_s,
            rel.map_or("-".into(), pct),
            paper_cell(
                figs,
                "throughput_relative",
                run.policy,
                run.chunk_bytes,
                pct
            )
        );
    });

    if r.rounds > 1 {
        let _ = writeln!(
            s,
            "\nPaired by round (plain RAID-6's write time over the configuration's in the same round, policy order rotated each round), with the A/A control (plain against plain of the next round):\n"
        );
        let _ = writeln!(
            s,
            "| chunk | configuration | vs RAID-6, paired: median [min-max] | rounds | A/A control: median [min-max] |"
        );
        let _ = writeln!(s, "| --- | --- | ---: | ---: | ---: |");
        let range = |x: Option<(f64, f64, f64)>| {
            x.map_or("-".into(), |(m, lo, hi)| {
                format!("{} [{}-{}]", pct(m), pct(lo), pct(hi))
            })
        };
        rows(&mut |run, base| {
            let Some(base) = base.filter(|_| run.policy != Policy::None) else {
                return;
            };
            let (pairs, control) =
                paired_by_round(&base.write_seconds_rounds, &run.write_seconds_rounds);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                format_size(run.chunk_bytes),
                config_name(run.policy),
                range(spread(&pairs)),
                pairs.len(),
                range(spread(&control))
            );
        });
    }

    let _ = writeln!(s, "\nWrites to parity devices, in 4 KiB pages (\"sent\" = what the array wrote to parity units; \"on media\" = what reached the devices after dedup; \"deduplicated\" = share of the sent pages stored as references):\n");
    let _ = writeln!(
        s,
        "| chunk | configuration | stripe updates (full / RMW / RCW) | parity pages sent | on media | deduplicated | vs RAID-6, md-style | paper: vs RAID-6 | vs RAID-6, paper-style |"
    );
    let _ = writeln!(
        s,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    rows(&mut |run, base| {
        let md =
            base.and_then(|b| ratio(run.parity_pages_media as f64, b.parity_pages_media as f64));
        let ps = base.and_then(|b| {
            ratio(
                run.parity_pages_media as f64,
                b.parity_pages_paper_baseline as f64,
            )
        });
        let dedup = if run.policy == Policy::None {
            "-".to_string()
        } else {
            ratio(
                run.parity_pages_referenced as f64,
                run.parity_pages_array as f64,
            )
            .map_or("-".into(), pct)
        };
        let md_cell = if run.policy == Policy::None {
            "baseline".to_string()
        } else {
            md.map_or("-".into(), |x| fewer(1.0 - x))
        };
        let ps_cell = match (run.policy, base) {
            (Policy::None, Some(b)) => format!(
                "{} ({} pages)",
                ps.map_or("-".into(), |x| fewer(1.0 - x)),
                b.parity_pages_paper_baseline
            ),
            _ => ps.map_or("-".into(), |x| fewer(1.0 - x)),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} ({} / {} / {}) | {} | {} | {} | {} | {} | {} |",
            format_size(run.chunk_bytes),
            config_name(run.policy),
            run.stripe_updates,
            run.full_stripe_writes,
            run.rmw_writes,
            run.rcw_writes,
            run.parity_pages_array,
            run.parity_pages_media,
            dedup,
            md_cell,
            paper_cell(
                figs,
                "parity_write_reduction",
                run.policy,
                run.chunk_bytes,
                fewer
            ),
            ps_cell
        );
    });

    let _ = writeln!(
        s,
        "\nWrites to data units, in 4 KiB pages (data dedup only):\n"
    );
    let _ = writeln!(
        s,
        "| chunk | configuration | data pages sent | on media | deduplicated |"
    );
    let _ = writeln!(s, "| --- | --- | ---: | ---: | ---: |");
    rows(&mut |run, _| {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            format_size(run.chunk_bytes),
            config_name(run.policy),
            run.data_pages_array,
            run.data_pages_media,
            if run.policy == Policy::All {
                ratio(
                    run.data_pages_referenced as f64,
                    run.data_pages_array as f64,
                )
                .map_or("-".into(), pct)
            } else {
                "-".into()
            }
        );
    });

    let _ = writeln!(s, "\nFingerprint DRAM of all six devices at the end of the writes: the LRU index (bounded) plus the slot → fingerprint table (one entry per fingerprinted slot, unbounded); \"% of workload\" is their sum over the workload's bytes (the paper's \"workload size\"). The block map (4 B per 4 KiB block and device, plus reference counts), which every dedup layout needs whatever it hashes, is shown apart:\n");
    let _ = writeln!(
        s,
        "| chunk | configuration | hash ops | index entries | bytes/entry | index DRAM | slot → entry table | of which before the writes | % of workload | paper | vs data dedup | paper | block map |"
    );
    let _ = writeln!(
        s,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    rows(&mut |run, _| {
        if run.policy == Policy::None {
            let _ = writeln!(
                s,
                "| {} | {} | 0 | 0 | - | 0 | 0 | - | 0 | - | - | - | 0 |",
                format_size(run.chunk_bytes),
                config_name(run.policy)
            );
            return;
        }
        let share = run.fingerprint_dram_bytes() as f64 / run.workload_bytes.max(1) as f64;
        let data = run_of(r, mode, run.chunk_bytes, Policy::All);
        let vs = match (run.policy, data) {
            (Policy::Parity, Some(d)) => ratio(
                run.fingerprint_dram_bytes() as f64,
                d.fingerprint_dram_bytes() as f64,
            )
            .map_or("-".into(), |x| fewer(1.0 - x)),
            _ => "-".into(),
        };
        let paper_vs = if run.policy == Policy::Parity {
            paper(
                figs,
                "index_dram_vs_data_dedup",
                run.policy,
                run.chunk_bytes,
            )
            .map_or_else(not_given, fewer)
        } else {
            "-".into()
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} |",
            format_size(run.chunk_bytes),
            config_name(run.policy),
            run.hash_ops,
            run.index_entries,
            run.index_bytes_per_entry,
            human(run.index_bytes),
            human(run.slot_entry_bytes),
            human(run.index_bytes_before),
            format_args!("{:.2}%", 100.0 * share),
            paper(figs, "index_dram_share", run.policy, run.chunk_bytes)
                .map_or_else(not_given, |x| format!("{:.1}%", 100.0 * x)),
            vs,
            paper_vs,
            human(run.map_bytes)
        );
    });

    if r.summary
        .iter()
        .any(|x| x.mode == mode && x.decode.is_some())
    {
        let _ = writeln!(s, "\nDecode time: sequential read-back over NBD (4 MiB requests, one in flight) of {}, healthy, with device 0 failed, and with devices 0 and 1 failed:\n",
            if mode == Mode::Fs { "the blocks ext4 has in use (from `dumpe2fs`; every configuration reads the same extents, so unwritten space, which dedup answers without I/O, is not timed)" } else { "the written range" });
        let _ = writeln!(
            s,
            "| chunk | configuration | read | healthy (s) | 1 failed (s) | vs RAID-6 | paper | 2 failed (s) | vs RAID-6 | paper |"
        );
        let _ = writeln!(
            s,
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        rows(&mut |run, base| {
            let Some(d) = &run.decode else { return };
            let bd = base.and_then(|b| b.decode.as_ref());
            let rel = |a: f64, b: Option<f64>| match (run.policy, b) {
                (Policy::None, _) => "baseline".to_string(),
                (_, Some(b)) => ratio(a, b).map_or("-".into(), |x| signed(x - 1.0)),
                _ => "-".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.2} | {:.2} | {} | {} | {:.2} | {} | {} |",
                format_size(run.chunk_bytes),
                config_name(run.policy),
                human(d.range_bytes),
                d.healthy_seconds,
                d.one_failed_seconds,
                rel(d.one_failed_seconds, bd.map(|b| b.one_failed_seconds)),
                paper_cell(
                    figs,
                    "decode_1_failed_extra",
                    run.policy,
                    run.chunk_bytes,
                    signed
                ),
                d.two_failed_seconds,
                rel(d.two_failed_seconds, bd.map(|b| b.two_failed_seconds)),
                paper_cell(
                    figs,
                    "decode_2_failed_extra",
                    run.policy,
                    run.chunk_bytes,
                    signed
                ),
            );
        });
    }
    let _ = writeln!(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_pair_write_times_of_the_same_round_and_the_control_pairs_neighbours() {
        let plain = [10.0, 12.0, 8.0];
        let other = [20.0, 12.0, 4.0];
        let (pairs, control) = paired_by_round(&plain, &other);
        assert_eq!(pairs, vec![0.5, 1.0, 2.0]);
        assert_eq!(control, vec![10.0 / 12.0, 1.5]);
        assert_eq!(spread(&pairs), Some((1.0, 0.5, 2.0)));
        assert_eq!(spread(&[]), None);
    }
}
