//! The plot, as SVG written by hand: four panels of grouped bars (one group
//! per mode and chunk size, one bar per configuration), each bar labelled
//! with its value, the paper's figure drawn across it as a black tick where
//! the paper states one. Hand-written because the figure is simple and
//! plotters (even with only its SVG backend) adds several crates and minutes
//! of compile time on a 2-core machine for no gain here.

use super::report::{baseline, config_name, paper};
use super::results::{Mode, Results, RunResult};
use ecdedup_core::dedup::Policy;
use ecdedup_core::units::format_size;
use std::fmt::Write as _;

const POLICIES: [Policy; 3] = [Policy::None, Policy::All, Policy::Parity];
const COLORS: [&str; 3] = ["#8c8c8c", "#1f77b4", "#d62728"];

struct Panel {
    title: String,
    groups: Vec<String>,
    values: Vec<[Option<f64>; 3]>,
    paper: Vec<[Option<f64>; 3]>,
    /// Values are fractions shown as percent.
    percent: bool,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn nice_step(max: f64) -> f64 {
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= raw {
            return m * mag;
        }
    }
    10.0 * mag
}

fn label(v: f64, percent: bool) -> String {
    if percent {
        let p = 100.0 * v;
        if p.abs() < 10.0 {
            format!("{p:.1}%")
        } else {
            format!("{p:.0}%")
        }
    } else {
        format!("{v:.2}")
    }
}

fn draw_panel(out: &mut String, x0: f64, y0: f64, w: f64, h: f64, p: &Panel) {
    let (left, right, top, bottom) = (58.0, 10.0, 28.0, 42.0);
    let (px, py) = (x0 + left, y0 + top);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" font-weight="bold" text-anchor="middle">{}</text>"#,
        x0 + w / 2.0,
        y0 + 16.0,
        esc(&p.title)
    );
    let mut max: f64 = 0.0;
    for row in p.values.iter().chain(&p.paper) {
        for v in row.iter().flatten() {
            max = max.max(*v);
        }
    }
    if max <= 0.0 {
        max = 1.0;
    }
    let step = nice_step(max * 1.12);
    let top_v = (max * 1.12 / step).ceil() * step;
    let y_of = |v: f64| py + ph - (v / top_v) * ph;
    // Axes and grid.
    let mut t = 0.0;
    while t <= top_v + step * 1e-6 {
        let y = y_of(t);
        let _ = writeln!(
            out,
            r##"<line x1="{px:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/>"##,
            px + pw
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">{}</text>"#,
            px - 4.0,
            y + 3.5,
            label(t, p.percent)
        );
        t += step;
    }
    let _ = writeln!(
        out,
        r##"<line x1="{px:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#000"/>"##,
        py + ph,
        px + pw,
        py + ph
    );
    let _ = writeln!(
        out,
        r##"<line x1="{px:.1}" y1="{py:.1}" x2="{px:.1}" y2="{:.1}" stroke="#000"/>"##,
        py + ph
    );
    let n = p.groups.len().max(1) as f64;
    let gw = pw / n;
    let bw = gw * 0.8 / 3.0;
    for (g, name) in p.groups.iter().enumerate() {
        let gx = px + gw * g as f64 + gw * 0.1;
        // A label may have two lines ("fs 32K\n1 failed").
        for (l, line) in name.split('\n').enumerate() {
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"#,
                px + gw * (g as f64 + 0.5),
                py + ph + 16.0 + 13.0 * l as f64,
                esc(line)
            );
        }
        for (i, color) in COLORS.iter().enumerate() {
            let bx = gx + bw * i as f64;
            if let Some(v) = p.values[g][i] {
                let y = y_of(v);
                let _ = writeln!(
                    out,
                    r#"<rect x="{bx:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"/>"#,
                    bw - 2.0,
                    (py + ph - y).max(0.0),
                    color
                );
                let _ = writeln!(
                    out,
                    r#"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle">{}</text>"#,
                    bx + bw / 2.0 - 1.0,
                    y - 3.0,
                    label(v, p.percent)
                );
            }
            if let Some(v) = p.paper[g][i] {
                let y = y_of(v);
                let _ = writeln!(
                    out,
                    r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#000" stroke-width="2.5"/>"##,
                    bx - 1.0,
                    bx + bw - 1.0
                );
                let _ = writeln!(
                    out,
                    r##"<circle cx="{:.1}" cy="{y:.1}" r="2.5" fill="#000"/>"##,
                    bx + bw / 2.0 - 1.0
                );
            }
        }
    }
}

fn groups(r: &Results) -> Vec<(Mode, u64)> {
    let mut v = Vec::new();
    for run in &r.summary {
        if !v.contains(&(run.mode, run.chunk_bytes)) {
            v.push((run.mode, run.chunk_bytes));
        }
    }
    v
}

fn run_of(r: &Results, mode: Mode, chunk: u64, p: Policy) -> Option<&RunResult> {
    r.summary
        .iter()
        .find(|x| x.mode == mode && x.chunk_bytes == chunk && x.policy == p)
}

fn panel(
    r: &Results,
    title: &str,
    percent: bool,
    value: &dyn Fn(&RunResult, Option<&RunResult>) -> Option<f64>,
    paper_value: &dyn Fn(Policy, u64) -> Option<f64>,
) -> Panel {
    let gs = groups(r);
    let mut p = Panel {
        title: title.into(),
        groups: Vec::new(),
        values: Vec::new(),
        paper: Vec::new(),
        percent,
    };
    for (mode, chunk) in gs {
        p.groups
            .push(format!("{} {}", mode.name(), format_size(chunk)));
        let base = baseline(r, mode, chunk);
        let mut vals = [None; 3];
        let mut pap = [None; 3];
        for (i, pol) in POLICIES.iter().enumerate() {
            if let Some(run) = run_of(r, mode, chunk, *pol) {
                vals[i] = value(run, base);
            }
            pap[i] = paper_value(*pol, chunk);
        }
        p.values.push(vals);
        p.paper.push(pap);
    }
    p
}

fn rel(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

pub fn plot(r: &Results) -> String {
    let figs = &r.paper;
    let parity = panel(
        r,
        "Parity pages written to media, relative to RAID-6",
        true,
        &|run, base| {
            base.and_then(|b| rel(run.parity_pages_media as f64, b.parity_pages_media as f64))
        },
        &|p, c| match p {
            Policy::None => None,
            _ => paper(figs, "parity_write_reduction", p, c).map(|x| 1.0 - x),
        },
    );
    let throughput = panel(
        r,
        "Write throughput, relative to RAID-6",
        true,
        &|run, base| base.and_then(|b| rel(b.write_seconds, run.write_seconds)),
        &|p, c| match p {
            Policy::None => None,
            _ => paper(figs, "throughput_relative", p, c),
        },
    );
    let dram = panel(
        r,
        "Fingerprint DRAM (index + slot → entry table), % of the workload",
        true,
        &|run, _| Some(run.fingerprint_dram_bytes() as f64 / run.workload_bytes.max(1) as f64),
        &|p, c| paper(figs, "index_dram_share", p, c),
    );
    let decode = {
        // One group per mode, chunk and number of failed devices.
        let mut p = Panel {
            title: "Decode (read-back) time, relative to RAID-6".into(),
            groups: Vec::new(),
            values: Vec::new(),
            paper: Vec::new(),
            percent: true,
        };
        for (mode, chunk) in groups(r) {
            let base = baseline(r, mode, chunk).and_then(|b| b.decode.as_ref());
            for (failed, metric) in [(1, "decode_1_failed_extra"), (2, "decode_2_failed_extra")] {
                p.groups.push(format!(
                    "{} {}\n{} failed",
                    mode.name(),
                    format_size(chunk),
                    failed
                ));
                let mut vals = [None; 3];
                let mut pap = [None; 3];
                for (i, pol) in POLICIES.iter().enumerate() {
                    let pick = |d: &super::results::DecodeResult| {
                        if failed == 1 {
                            d.one_failed_seconds
                        } else {
                            d.two_failed_seconds
                        }
                    };
                    if let (Some(run), Some(b)) = (run_of(r, mode, chunk, *pol), base) {
                        if let Some(d) = &run.decode {
                            vals[i] = rel(pick(d), pick(b));
                        }
                    }
                    pap[i] = match pol {
                        Policy::None => None,
                        _ => paper(figs, metric, *pol, chunk).map(|x| 1.0 + x),
                    };
                }
                p.values.push(vals);
                p.paper.push(pap);
            }
        }
        p
    };
    // Three panels in the top row, the decode panel (twice the groups)
    // across the bottom row.
    let (w, h) = (1400.0, 800.0);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(out, r##"<rect width="{w}" height="{h}" fill="#fff"/>"##);
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="22" font-size="16" font-weight="bold" text-anchor="middle">Parity dedup (paper 000) reproduction: RS({},{}), SHA-1 over 4 KiB, workload {}</text>"#,
        w / 2.0,
        r.k,
        r.m,
        esc(&super::results::format_size_approx(r.workload.bytes))
    );
    // Legend.
    let mut lx = 400.0;
    for (i, pol) in POLICIES.iter().enumerate() {
        let _ = writeln!(
            out,
            r#"<rect x="{lx:.1}" y="34" width="12" height="12" fill="{}"/><text x="{:.1}" y="44" font-size="12">{}</text>"#,
            COLORS[i],
            lx + 16.0,
            config_name(*pol)
        );
        lx += 190.0;
    }
    let _ = writeln!(
        out,
        r##"<line x1="{lx:.1}" y1="40" x2="{:.1}" y2="40" stroke="#000" stroke-width="2.5"/><circle cx="{:.1}" cy="40" r="2.5" fill="#000"/><text x="{:.1}" y="44" font-size="12">paper</text>"##,
        lx + 18.0,
        lx + 9.0,
        lx + 22.0
    );
    let ph = (h - 56.0) / 2.0;
    for (i, p) in [&parity, &throughput, &dram].iter().enumerate() {
        draw_panel(&mut out, w / 3.0 * i as f64, 56.0, w / 3.0, ph, p);
    }
    draw_panel(&mut out, 0.0, 56.0 + ph, w, ph, &decode);
    let _ = writeln!(out, "</svg>");
    out
}

/// One line of a [`line_chart`]: its name, colour and (x, y) points.
pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
}

/// A line chart with markers (paper 001's figures 4 to 7): linear axes
/// from zero, a legend under the plot. Empty series are listed but drawn
/// as nothing.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let (w, h) = (640.0, 380.0);
    let (left, right, top, bottom) = (64.0, 16.0, 32.0, 48.0 + 16.0 * series.len() as f64);
    let total_h = h + 16.0 * series.len() as f64;
    let (pw, ph) = (w - left - right, total_h - top - bottom);
    let mut x_max: f64 = 0.0;
    let mut y_max: f64 = 0.0;
    for s in series {
        for &(x, y) in &s.points {
            x_max = x_max.max(x);
            y_max = y_max.max(y);
        }
    }
    let x_step = nice_step(if x_max > 0.0 { x_max } else { 1.0 });
    let y_step = nice_step(if y_max > 0.0 { y_max * 1.1 } else { 1.0 });
    let x_top = ((x_max / x_step).ceil() * x_step).max(x_step);
    let y_top = ((y_max * 1.1 / y_step).ceil() * y_step).max(y_step);
    let x_of = |x: f64| left + pw * x / x_top;
    let y_of = |y: f64| top + ph - ph * y / y_top;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{total_h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="18" font-size="13" font-weight="bold" text-anchor="middle">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    let ticks = |top_v: f64, step: f64| {
        let n = (top_v / step).round() as usize;
        (0..=n).map(move |i| i as f64 * step)
    };
    for y in ticks(y_top, y_step) {
        let _ = writeln!(
            out,
            r##"<line x1="{left}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#ddd"/><text x="{2:.1}" y="{3:.1}" text-anchor="end">{4}</text>"##,
            y_of(y),
            left + pw,
            left - 4.0,
            y_of(y) + 4.0,
            short(y)
        );
    }
    for x in ticks(x_top, x_step) {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x_of(x),
            top + ph + 14.0,
            short(x)
        );
    }
    let _ = writeln!(
        out,
        r#"<line x1="{left}" y1="{top}" x2="{left}" y2="{0:.1}" stroke="black"/><line x1="{left}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="black"/>"#,
        top + ph,
        left + pw
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        left + pw / 2.0,
        top + ph + 30.0,
        esc(x_label)
    );
    let _ = writeln!(
        out,
        r#"<text x="14" y="{:.1}" text-anchor="middle" transform="rotate(-90 14 {:.1})">{}</text>"#,
        top + ph / 2.0,
        top + ph / 2.0,
        esc(y_label)
    );
    for (i, s) in series.iter().enumerate() {
        if !s.points.is_empty() {
            let path: Vec<String> = s
                .points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", x_of(x), y_of(y)))
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="1.5"/>"#,
                path.join(" "),
                s.color
            );
            for &(x, y) in &s.points {
                let _ = writeln!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{}"><title>{}: {} at {}</title></circle>"#,
                    x_of(x),
                    y_of(y),
                    s.color,
                    esc(&s.name),
                    short(y),
                    short(x)
                );
            }
        }
        let ly = top + ph + 48.0 + 16.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<line x1="{left}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="{2}" stroke-width="2"/><text x="{3:.1}" y="{4:.1}">{5}</text>"#,
            ly - 4.0,
            left + 24.0,
            s.color,
            left + 30.0,
            ly,
            esc(&s.name)
        );
    }
    out.push_str("</svg>\n");
    out
}

/// A tick or point value with as many digits as it needs.
fn short(v: f64) -> String {
    if v.fract() == 0.0 || v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
