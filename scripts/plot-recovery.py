#!/usr/bin/env python3
"""Plots recovery time against journal size (paper 004, Fig. 6) as SVG.

Usage: plot-recovery.py RESULTS.json OUT.svg

RESULTS.json is what scripts/bench-recovery.sh writes: {"meta": ..., "runs":
[{"policy", "ratio", "recovery_s", "rebuild_s", ...}]}. One line per policy:
the median recovery time per journal ratio J/C, with a bar from the minimum
to the maximum; the ratios are evenly spaced, as in the paper's figure.
Python standard library only.
"""
import json
import statistics
import sys
from xml.sax.saxutils import escape

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"]


def nice_max(v):
    if v <= 0:
        return 1.0
    step = 10 ** len(str(int(v))) / 10 if v >= 1 else 0.1
    for m in (1, 2, 2.5, 5, 10):
        if v <= step * m:
            return step * m
    return v


def main():
    src, out = sys.argv[1], sys.argv[2]
    with open(src) as f:
        data = json.load(f)
    runs, meta = data["runs"], data["meta"]
    ratios = sorted({r["ratio"] for r in runs})
    policies = []
    for r in runs:
        if r["policy"] not in policies:
            policies.append(r["policy"])

    series = {}
    top = 0.0
    for p in policies:
        pts = []
        for x in ratios:
            v = [r["recovery_s"] for r in runs if r["policy"] == p and r["ratio"] == x]
            if v:
                pts.append((x, statistics.median(v), min(v), max(v)))
                top = max(top, max(v))
        series[p] = pts
    ymax = nice_max(top * 1.05)

    w, h = 640, 400
    left, right, topm, bottom = 70, 20, 50, 60
    pw, ph = w - left - right, h - topm - bottom

    def xpos(x):
        i = ratios.index(x)
        return left + (i + 0.5) * pw / len(ratios)

    def ypos(y):
        return topm + ph - y / ymax * ph

    o = []
    o.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">')
    o.append(f'<rect width="{w}" height="{h}" fill="white"/>')
    title = f"Recovery time vs journal size (RS(4,2), chunk {meta['chunk_bytes'] / 2**20:.0f} MiB)"
    o.append(f'<text x="{w / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>')
    # Axes and grid.
    for i in range(6):
        y = ymax * i / 5
        yy = ypos(y)
        o.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{left + pw}" y2="{yy:.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{y:g}</text>')
    o.append(f'<line x1="{left}" y1="{topm}" x2="{left}" y2="{topm + ph}" stroke="black"/>')
    o.append(f'<line x1="{left}" y1="{topm + ph}" x2="{left + pw}" y2="{topm + ph}" stroke="black"/>')
    for x in ratios:
        xx = xpos(x)
        o.append(f'<line x1="{xx:.1f}" y1="{topm + ph}" x2="{xx:.1f}" y2="{topm + ph + 4}" stroke="black"/>')
        o.append(f'<text x="{xx:.1f}" y="{topm + ph + 18}" text-anchor="middle">{x:g}</text>')
    o.append(f'<text x="{left + pw / 2}" y="{h - 14}" text-anchor="middle">journal size J / chunk size C (J: mean per-device journal at the failure)</text>')
    o.append(f'<text transform="translate(18 {topm + ph / 2}) rotate(-90)" text-anchor="middle">recovery time (s): fail to rebuilt</text>')
    # Series.
    n = len(policies)
    for k, p in enumerate(policies):
        c = COLORS[k % len(COLORS)]
        off = (k - (n - 1) / 2) * 6
        pts = series[p]
        path = " ".join(f"{xpos(x) + off:.1f},{ypos(m):.1f}" for x, m, _, _ in pts)
        o.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        for x, m, lo, hi in pts:
            xx = xpos(x) + off
            o.append(f'<line x1="{xx:.1f}" y1="{ypos(lo):.1f}" x2="{xx:.1f}" y2="{ypos(hi):.1f}" stroke="{c}"/>')
            o.append(f'<line x1="{xx - 3:.1f}" y1="{ypos(lo):.1f}" x2="{xx + 3:.1f}" y2="{ypos(lo):.1f}" stroke="{c}"/>')
            o.append(f'<line x1="{xx - 3:.1f}" y1="{ypos(hi):.1f}" x2="{xx + 3:.1f}" y2="{ypos(hi):.1f}" stroke="{c}"/>')
            o.append(f'<circle cx="{xx:.1f}" cy="{ypos(m):.1f}" r="3.5" fill="{c}"/>')
        ly = topm + 8 + k * 18
        o.append(f'<line x1="{left + 12}" y1="{ly}" x2="{left + 36}" y2="{ly}" stroke="{c}" stroke-width="2"/>')
        o.append(f'<text x="{left + 42}" y="{ly + 4}">{escape(p)} (median, min–max)</text>')
    o.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")


if __name__ == "__main__":
    main()
