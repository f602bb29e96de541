#!/usr/bin/env bash
# Dedup overhead breakdown (paper 002, Hamandawana et al., Fig. 1): for 4 KiB
# random writes at 100% duplicate ratio through NBD, how much of each write's
# time goes to chunking, fingerprinting and the index query, measured by the
# dedup layer's own phase timers (`ecdedup stats`: chunking_ns,
# fingerprint_ns, index_ns, write_ns, summed over the array's devices).
#
# Method:
# - three kinds of run, each on a FRESH array (created, served, written,
#   stopped, removed), so every run starts from the same state:
#   D  ecdedup RS(4,2), 32K stripe unit, --dedup all, SHA-1 (the paper's),
#      verify on (SHA-1's default), --fingerprint-backend $BACKEND [cpu];
#   N  the same array with --dedup none: the peer without dedup;
#   C  a second D: the A/A control (C/D is the noise floor of D/N).
# - the job: fio --ioengine=nbd, randwrite, bs=4k, iodepth=1, one fixed
#   buffer pattern with dedupe_percentage=100 (every block identical),
#   time_based, RUNTIME seconds, no ramp (the counters cover every write).
# - PAIRS rounds of D N C, the order reversed every other round (D N C,
#   C N D, ...), so each ratio compares adjacent runs and slow drift cancels.
# - per-write phase times are counter deltas divided by the array's
#   client_writes (a 4K client write is one data block and, by RMW, m=2
#   parity blocks through the dedup layers, so 3 hashes and 3 index queries).
# - GPU column: the GPU backend is only run where BACKEND=gpu works; the
#   summary says "not measured" unless a GPU run was made.
#
# Environment (defaults in brackets):
#   PAIRS [5]  RUNTIME [15] seconds  SIZE [1G] (the paper wrote 1 GiB)
#   THREADS [16] nbdkit worker threads   BACKEND [cpu] cpu | gpu | auto
#   QUICK=1      smoke run: PAIRS=2 RUNTIME=3 SIZE=256M
#   SVG [docs/img/dedup-overhead.svg] where the stacked bar goes ("" for none)
#   ECDEDUP_BIN, NO_BUILD=1, BENCH_TMP, KEEP=1: as in bench-nbd.sh
#
# Output: progress on stderr, markdown tables on stdout (also in
# WORK/summary.md), the SVG. Every server started here is stopped by its PID.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)

if [ "${QUICK:-0}" = 1 ]; then
  PAIRS=${PAIRS:-2}; RUNTIME=${RUNTIME:-3}; SIZE=${SIZE:-256M}
fi
PAIRS=${PAIRS:-5}
RUNTIME=${RUNTIME:-15}
SIZE=${SIZE:-1G}
THREADS=${THREADS:-16}
BACKEND=${BACKEND:-cpu}
SVG=${SVG-$repo/docs/img/dedup-overhead.svg}
BENCH_TMP=${BENCH_TMP:-${TMPDIR:-/tmp}}

BENCH_NAME=bench-dedup-overhead
# shellcheck source=scripts/bench-lib.sh
. "$repo/scripts/bench-lib.sh"

case "$BACKEND" in cpu|gpu|auto) ;; *) die "BACKEND must be cpu, gpu or auto, not $BACKEND" ;; esac
[ "$PAIRS" -ge 1 ] || die "PAIRS must be at least 1"
bench_require_tools
bench_find_bin "$repo"
bench_make_work ecdedup-bench-dedup-overhead

# fresh_array S ROUND: creates and serves a fresh array of kind S.
fresh_array() {
  local s=$1 round=$2 d
  d=$WORK/$s.r$round
  local dedup=(--dedup all --fingerprint sha1 --fingerprint-backend "$BACKEND")
  [ "$s" = N ] && dedup=(--dedup none)
  "$BIN" --dir "$d" create --devices 6 -k 4 -m 2 --stripe-unit 32K --size "$SIZE" \
    "${dedup[@]}" >/dev/null
  serve_ecdedup "$s" "$d"
}

# run_one S ROUND: one fresh array, one fio run, stats before and after.
run_one() {
  local s=$1 round=$2 tag out
  tag=r$round.$s
  out=$WORK/fio/$tag.json
  fresh_array "$s" "$round"
  stats_snapshot "$s" "$WORK/stats/$tag.before.json"
  fio --name=dedup-overhead --ioengine=nbd --uri="$(uri "$s")" --size="$SIZE" \
      --rw=randwrite --bs=4k --iodepth=1 --dedupe_percentage=100 \
      --buffer_pattern=0x5aa5c33c --time_based --runtime="$RUNTIME" \
      --output-format=json --output="$out" >/dev/null 2>"$WORK/fio/$tag.err" \
    || die "fio $tag failed: $(tail -5 "$WORK/fio/$tag.err")"
  stats_snapshot "$s" "$WORK/stats/$tag.after.json"
  grep -h "fingerprint backend" "$WORK/$s.log" | head -1 >"$WORK/stats/$tag.backend.txt" || true
  stop_server "$s"
  rm -rf "${DIR[$s]}"
  echo "$round,$s,$out" >>"$WORK/runs.csv"
}

log "work folder $WORK; PAIRS=$PAIRS RUNTIME=${RUNTIME}s SIZE=$SIZE THREADS=$THREADS BACKEND=$BACKEND"
log "about $((PAIRS * 3 * (RUNTIME + 3) / 60 + 1)) min"
echo "round,server,fio_json" >"$WORK/runs.csv"
for round in $(seq 1 "$PAIRS"); do
  if [ $((round % 2)) = 1 ]; then order=(D N C); else order=(C N D); fi
  for s in "${order[@]}"; do run_one "$s" "$round"; done
  log "round $round/$PAIRS done"
done

python3 - "$WORK" "$PAIRS" "$RUNTIME" "$SIZE" "$THREADS" "$BACKEND" "$SVG" "$(machine_line)" <<'PY' | tee "$WORK/summary.md"
import csv, json, os, statistics, sys
work, pairs, runtime, size, threads, backend, svg, machine = sys.argv[1:]

def load(path):
    with open(path) as f:
        text = f.read()
    return json.loads(text[text.index("{"):])

def fio_lat_us(path):
    w = load(path)["jobs"][0]["write"]
    return w["lat_ns"]["mean"] / 1000.0, w["iops"]

PHASES = ["chunking_ns", "fingerprint_ns", "index_ns", "write_ns"]

def phases(tag):
    before = load(os.path.join(work, "stats", tag + ".before.json"))
    after = load(os.path.join(work, "stats", tag + ".after.json"))
    writes = after["array"]["client_writes"] - before["array"]["client_writes"]
    out = {"writes": writes}
    for p in PHASES + ["hash_ops", "dedup_hits", "verify_compares"]:
        total = 0
        for b, a in zip(before.get("dedup") or [], after.get("dedup") or []):
            if a is not None:
                total += a.get(p, 0) - (b or {}).get(p, 0)
        out[p] = total
    return out

runs = {}
for row in csv.DictReader(open(os.path.join(work, "runs.csv"))):
    r, s = int(row["round"]), row["server"]
    lat, iops = fio_lat_us(row["fio_json"])
    runs[(r, s)] = {"lat": lat, "iops": iops, **phases(f"r{r}.{s}")}
rounds = sorted({r for r, _ in runs})

def med(xs):
    return statistics.median(xs)

def spread(xs, fmt="{:.3f}"):
    return f"{fmt.format(med(xs))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"

def per_write_us(run, p):
    return run[p] / run["writes"] / 1000.0 if run["writes"] else float("nan")

dedup_runs = [runs[(r, s)] for r in rounds for s in ("D", "C")]
why = ""
for r in rounds:
    p = os.path.join(work, "stats", f"r{r}.D.backend.txt")
    if os.path.exists(p):
        why = open(p).read().strip().replace("ecdedup: fingerprint backend: ", "")
        break
gpu_measured = why.startswith("gpu") or "using gpu" in why

print(f"### Dedup overhead per 4 KiB random write at 100% duplicates (paper 002, Fig. 1)\n")
print(f"{machine}; fio --ioengine=nbd randwrite bs=4k iodepth=1, dedupe_percentage=100 "
      f"(one buffer pattern), {runtime} s per run on a fresh {size} RS(4,2) array, "
      f"{pairs} rounds of dedup / no-dedup / dedup (A/A); SHA-1, verify on; "
      f"fingerprint backend: {why or backend}\n")

lat_d = [runs[(r, "D")]["lat"] for r in rounds]
lat_n = [runs[(r, "N")]["lat"] for r in rounds]
lat_c = [runs[(r, "C")]["lat"] for r in rounds]
print("| write latency (fio mean) | median (min–max) |")
print("|---|---|")
print(f"| dedup all, SHA-1 (D) | {spread(lat_d, '{:.1f}')} µs |")
print(f"| dedup none (N, the peer) | {spread(lat_n, '{:.1f}')} µs |")
print(f"| D / N per round | {spread([d / n for d, n in zip(lat_d, lat_n)])} |")
print(f"| A/A control C / D per round | {spread([c / d for c, d in zip(lat_c, lat_d)])} |")
print()

rows = [("chunking", "chunking_ns"), ("fingerprinting", "fingerprint_ns"), ("index query (lookup, verify, insert)", "index_ns")]
cpu_us = {}
print(f"| phase, per client write (all devices) | {backend} backend: µs, median (min–max) over D and C runs | share of the three | {'CPU' if gpu_measured else 'GPU'} backend |")
print("|---|---|---|---|")
three = [sum(per_write_us(x, p) for _, p in rows) for x in dedup_runs]
for label, p in rows:
    vals = [per_write_us(x, p) for x in dedup_runs]
    shares = [per_write_us(x, p) / t for x, t in zip(dedup_runs, three)]
    cpu_us[p] = med(vals)
    gpu = "run BACKEND=cpu for this column" if gpu_measured else "not measured: no GPU"
    print(f"| {label} | {spread(vals, '{:.2f}')} | {med(shares) * 100:.1f}% | {gpu} |")
print(f"| sum of the three | {spread(three, '{:.2f}')} | 100% | |")
layer = [per_write_us(x, "write_ns") for x in dedup_runs]
print(f"| whole write through the dedup layers (incl. slot and log I/O) | {spread(layer, '{:.2f}')} | | |")
hashes = med([x["hash_ops"] / x["writes"] for x in dedup_runs if x["writes"]])
hits = med([x["dedup_hits"] / x["hash_ops"] for x in dedup_runs if x["hash_ops"]])
print(f"\nper client write: {hashes:.2f} blocks hashed (data + parity through RMW); "
      f"dedup hits / hashed blocks: {hits * 100:.1f}%; "
      f"client writes per run: {med([x['writes'] for x in dedup_runs]):,.0f}")
overhead = med([d - n for d, n in zip(lat_d, lat_n)])
print(f"dedup overhead in latency (D − N, median of rounds): {overhead:.1f} µs per write; "
      f"the three phases: {med(three):.2f} µs")

if svg:
    os.makedirs(os.path.dirname(svg), exist_ok=True)
    colors = {"chunking_ns": "#4e79a7", "fingerprint_ns": "#e15759", "index_ns": "#59a14f"}
    labels = {"chunking_ns": "chunking", "fingerprint_ns": "fingerprinting", "index_ns": "index query"}
    total = sum(cpu_us.values())
    W, H, x0, bw = 640, 300, 150, 420
    scale = bw / total if total > 0 else 0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{W/2}" y="22" text-anchor="middle" font-size="14">Dedup overhead per 4 KiB write, 100% duplicates (paper 002 Fig. 1)</text>',
             f'<text x="{W/2}" y="40" text-anchor="middle" fill="#555">µs per client write, median of {len(dedup_runs)} runs; SHA-1, verify on</text>']
    y = 70
    x = x0
    measured, other = ("GPU", "CPU") if gpu_measured else ("CPU", "GPU")
    parts.append(f'<text x="{x0-10}" y="{y+25}" text-anchor="end">{measured} backend</text>')
    for p in ["chunking_ns", "fingerprint_ns", "index_ns"]:
        w = cpu_us[p] * scale
        parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="40" fill="{colors[p]}"><title>{labels[p]}: {cpu_us[p]:.2f} µs</title></rect>')
        if w > 40:
            parts.append(f'<text x="{x + w/2:.1f}" y="{y+25}" text-anchor="middle" fill="white">{cpu_us[p]/total*100:.0f}%</text>')
        x += w
    parts.append(f'<text x="{x+6:.1f}" y="{y+25}">{total:.2f} µs</text>')
    y = 140
    parts.append(f'<text x="{x0-10}" y="{y+25}" text-anchor="end">{other} backend</text>')
    parts.append(f'<rect x="{x0}" y="{y}" width="{bw}" height="40" fill="none" stroke="#999" stroke-dasharray="4 3"/>')
    parts.append(f'<text x="{x0 + bw/2}" y="{y+25}" text-anchor="middle" fill="#555">not measured{": no GPU" if other == "GPU" else " in this run"}</text>')
    ly = 215
    lx = x0
    for p in ["chunking_ns", "fingerprint_ns", "index_ns"]:
        parts.append(f'<rect x="{lx}" y="{ly}" width="14" height="14" fill="{colors[p]}"/>')
        parts.append(f'<text x="{lx+20}" y="{ly+12}">{labels[p]} {cpu_us[p]:.2f} µs</text>')
        lx += 150
    parts.append(f'<text x="{x0}" y="{ly+45}" fill="#555">scripts/bench-dedup-overhead.sh; {size} RS(4,2), fio randwrite 4k qd1 dedupe_percentage=100</text>')
    parts.append("</svg>")
    with open(svg, "w") as f:
        f.write("\n".join(parts) + "\n")
    print(f"\nplot: {svg}")
PY
