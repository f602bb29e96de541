#!/usr/bin/env bash
# A/B of two builds of the server on one fio job through NBD: whether a
# change made the server faster or cheaper, measured, not asserted.
#
# Sides: A (the build before), B (the build after), C (build A again: the
# A/A control, whose ratio to A is the noise floor). Each side serves its
# own array, created once (RS(4,2), 6 device files, 32K stripe unit, SIZE,
# O_DIRECT, write policy POLICY) and warmed by one sequential 1 MiB pass.
# PAIRS rounds, each running A, B and C for RUNTIME seconds, the order
# reversed every other round (A B C, C B A, ...), so drift cancels. Per run:
# fio's bandwidth (or IOPS) and the server's CPU time (utime + stime of the
# nbdkit process from /proc, over the run) per GiB moved.
#
# Usage: A=DIR_A B=DIR_B scripts/bench-ab.sh   (each DIR holds `ecdedup` and
#        `libecdedup_nbdkit.so`, e.g. copies of target/release)
# Environment (defaults in brackets): JOB [seqwrite] seqwrite (1 MiB QD8) |
#   seqread (1 MiB QD8) |
#   randwrite (4 KiB QD32 overwrites) | randread (4 KiB QD32) |
#   flushwrite (4 KiB random overwrites QD1, a flush after each); PAIRS [5];
#   RUNTIME [10] s; SIZE [1G]; THREADS [16]; POLICY [rmw]; METADATA
#   [device] (folder: format 1, `create --metadata folder`); BENCH_TMP;
#   KEEP=1.
# Output: progress on stderr, a markdown table on stdout. Every server
# started here is stopped by its PID.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
A=${A:?A=folder of the build before}
B=${B:?B=folder of the build after}
JOB=${JOB:-seqwrite}
PAIRS=${PAIRS:-5}
RUNTIME=${RUNTIME:-10}
SIZE=${SIZE:-1G}
THREADS=${THREADS:-16}
POLICY=${POLICY:-rmw}
METADATA=${METADATA:-device}
BENCH_TMP=${BENCH_TMP:-${TMPDIR:-/tmp}}
BENCH_NAME=bench-ab
# shellcheck source=scripts/bench-lib.sh
. "$repo/scripts/bench-lib.sh"

case "$JOB" in
  seqwrite) FIO=(--rw=write --bs=1M --iodepth=8) ;;
  seqread) FIO=(--rw=read --bs=1M --iodepth=8) ;;
  randwrite) FIO=(--rw=randwrite --bs=4k --iodepth=32) ;;
  randread) FIO=(--rw=randread --bs=4k --iodepth=32) ;;
  flushwrite) FIO=(--rw=randwrite --bs=4k --iodepth=1 --fsync=1) ;;
  *) die "JOB must be seqwrite, seqread, randwrite, randread or flushwrite, not $JOB" ;;
esac
bench_require_tools
for d in "$A" "$B"; do
  [ -x "$d/ecdedup" ] && [ -f "$d/libecdedup_nbdkit.so" ] || die "$d lacks ecdedup or libecdedup_nbdkit.so"
done
ECDEDUP_BIN=$A/ecdedup
NO_BUILD=1 bench_find_bin "$repo"
bench_make_work ecdedup-bench-ab
mkdir -p "$WORK/binA" "$WORK/binB"
cp "$A/ecdedup" "$A/libecdedup_nbdkit.so" "$WORK/binA/"
cp "$B/ecdedup" "$B/libecdedup_nbdkit.so" "$WORK/binB/"
declare -A SIDEBIN=([A]=$WORK/binA/ecdedup [B]=$WORK/binB/ecdedup [C]=$WORK/binA/ecdedup)


for s in A B C; do
  BIN=${SIDEBIN[$s]}
  "$BIN" --dir "$WORK/$s" create --devices 6 -k 4 -m 2 --stripe-unit 32K --size "$SIZE" \
    --write-policy "$POLICY" --metadata "$METADATA" >/dev/null
  serve_ecdedup "$s" "$WORK/$s"
  log "warm pass on $s"
  fio --name=warm --ioengine=nbd --uri="$(uri "$s")" --rw=write --bs=1M --iodepth=8 \
    --size="$SIZE" --output=/dev/null
  stop_server "$s"
done

hz=$(getconf CLK_TCK)
echo "side,round,value,cpu_s,bytes,hwm_kib" >"$WORK/runs.csv"
for round in $(seq 1 "$PAIRS"); do
  order=(A B C)
  [ $((round % 2)) = 0 ] && order=(C B A)
  for s in "${order[@]}"; do
    BIN=${SIDEBIN[$s]}
    serve_ecdedup "$s" "$WORK/$s"
    t0=$(cpu_ticks "${PID[$s]}")
    fio --name=ab --ioengine=nbd --uri="$(uri "$s")" "${FIO[@]}" --size="$SIZE" \
      --time_based --runtime="$RUNTIME" --output-format=json --output="$WORK/fio/$s.$round.json"
    t1=$(cpu_ticks "${PID[$s]}")
    hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/${PID[$s]}/status")
    python3 - "$WORK/fio/$s.$round.json" "$s" "$round" "$(( t1 - t0 ))" "$hz" "$hwm" "$JOB" >>"$WORK/runs.csv" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side, rnd, ticks, hz, hwm = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
io = j["write"] if j["write"]["io_bytes"] else j["read"]
value = io["bw_bytes"] / 1e6 if sys.argv[7].startswith("seq") else io["iops"]
print(f"{side},{rnd},{value:.1f},{ticks / hz:.2f},{io['io_bytes']},{hwm}")
EOF
    log "round $round $s: $(tail -1 "$WORK/runs.csv")"
    stop_server "$s"
  done
done

python3 - "$WORK/runs.csv" "$JOB" <<'EOF'
import csv, statistics as st, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = {}
for r in rows:
    by.setdefault(r["side"], {})[int(r["round"])] = r
rounds = sorted(by["A"])
def spread(v):
    return f"{st.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"
def val(s, k): return float(by[s][k]["value"])
def cpu_per_gib(s, k):
    r = by[s][k]
    return float(r["cpu_s"]) / (int(r["bytes"]) / 2**30)
unit = "MB/s" if sys.argv[2] in ("seqwrite", "seqread") else "IOPS"
print(f"| {sys.argv[2]} | A (before) | B (after) | C (A again) | B / A | C / A (A/A) |")
print("|---|---|---|---|---|---|")
for name, f in ((unit, val), ("server CPU s per GiB", cpu_per_gib)):
    cols = [st.median([f(s, k) for k in rounds]) for s in "ABC"]
    print(f"| {name} | {cols[0]:.2f} | {cols[1]:.2f} | {cols[2]:.2f} | "
          f"{spread([f('B', k) / f('A', k) for k in rounds])} | "
          f"{spread([f('C', k) / f('A', k) for k in rounds])} |")
hwm = [max(int(by[s][k]["hwm_kib"]) for k in rounds) / 1024 for s in "ABC"]
print(f"| peak RSS MiB (most of any round) | {hwm[0]:.1f} | {hwm[1]:.1f} | {hwm[2]:.1f} | | |")
print(f"\n{len(rounds)} rounds; medians, ratios per round as median (min-max).")
EOF
