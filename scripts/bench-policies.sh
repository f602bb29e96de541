#!/usr/bin/env bash
# Partial-write policies over NBD (paper 004, PARIX, Figs. 4 and 5): 4 KiB
# random writes, QD1 latency (p50/p99) and QD32 IOPS, first writes and
# overwrites reported apart, for the ecdedup policies rmw, plog, parix and
# replicate (RS(1,2): 3 copies) and for nbdkit's own file plugin, all in one
# run on the same machine, plus an A/A control (a second server identical to
# one of them). RS(4,2) with a 32 KiB stripe unit over 6 device files for
# rmw, plog and parix; replicate is RS(1,2) over the same 6 device files
# (every block on 3 of them, rotating); fio --ioengine=nbd over a Unix socket.
#
# Method (docs/benchmarks.md, "Partial-write policies (paper 004)"):
# - per round, every server is created afresh (a fresh volume: nothing
#   written) and served; the volume has two regions, A (FW_QD1_SIZE, at
#   offset 0) and B (FW_QD32_SIZE, after A).
# - jobs, in this order within a round, each run on every server in turn
#   (order R L X T P C, reversed every other round, so drift cancels):
#     fw-qd1   first writes: one random pass over region A (each block
#              written exactly once: fio randwrite with its random map,
#              --norandommap=0, --size=region), QD1: latency p50/p99.
#     fw-qd32  first writes: one random pass over region B, QD32: IOPS.
#     ow-qd1   overwrites of region A, QD1, time_based RUNTIME s.
#     ow-qd32  overwrites of region B, QD32, time_based RUNTIME s.
#   An overwrite run is preceded (no pause in between) by one unmeasured
#   random pass over its region at QD32, the warm pass: journals are
#   replayed between runs (the server idles while the others run), and a
#   parix overwrite is read-free only while its parity journal still holds
#   the block's d(0) (the paper's PBS-2, successful speculation). The warm
#   pass itself, the first overwrite of every block after a replay, is the
#   paper's PBS-1 (failed speculation); its IOPS and device cost are
#   reported too.
# - after every run the server settles before the next one starts: a logging
#   server replays its journals (it does so by itself after 1 s idle; the
#   script waits until `journal_logged_blocks` and `journal_bytes` are 0),
#   and the files of the server are fsync'ed, so no server's background work
#   or writeback runs into another's measurement.
# - `ecdedup stats` is read right before and after every measured run (and
#   before the warm pass): device reads and writes per client write, by
#   class, and the write-path counters are deterministic.
# - reported: per server and job the median over rounds with min–max; per
#   round paired ratios (parix/rmw, parix/plog, parix/replicate and the A/A
#   control), median (min–max).
#
# Environment (defaults in brackets):
#   PAIRS [5] rounds   RUNTIME [10] seconds per overwrite run
#   FW_QD1_SIZE [128M] region A   FW_QD32_SIZE [256M] region B
#   JOURNAL_MAX [1536M] bound of each parity journal (plog, parix): a
#              journal that passes half of it is replayed at once, so it must
#              hold a warm pass plus RUNTIME s of overwrites (8 KiB of journal
#              per 4 KiB write at QD32, over 6 journals). Journals are
#              preallocated: 2 x 6 x JOURNAL_MAX of disk.
#   THREADS [16] nbdkit worker threads (every server)
#   CONTROL [rmw] the A/A control C: a second server of this policy (rmw,
#              plog, parix, replicate) or peer (a second nbdkit file)
#   JOBS [fw-qd1 fw-qd32 ow-qd1 ow-qd32]
#   SERVERS [R L X T P C] the servers to run, a subset of R (rmw), L (plog),
#              X (parix), T (replicate), P (nbdkit file), C (the control)
#   QUICK=1    smoke run: PAIRS=2 RUNTIME=2 FW_QD1_SIZE=8M FW_QD32_SIZE=32M JOURNAL_MAX=256M
#   ECDEDUP_BIN  an ecdedup executable with libecdedup_nbdkit.so beside it
#                [target/release/ecdedup, built with `cargo build --release --workspace`]
#   NO_BUILD=1   do not run cargo build
#   BENCH_TMP [${TMPDIR:-/tmp}] where the arrays, files and sockets go
#   RESULTS [$BENCH_TMP/bench-policies-DATE] where results.json (every run:
#              fio results, counter deltas), runs.csv and summary.md are kept
#   CODE [git HEAD + count of changed files, at the start] what was built
#   KEEP=1       keep the work folder too (raw fio JSON, stats snapshots)
#   PEER_CACHE [] nbdkit file's cache= option for the peer (none: O_DIRECT)
#   DROP_CACHES=1 write back and drop the page cache before every run (root)
#   BENCH_DEADLINE  no round is started that would end after this time
#              (seconds since the epoch; scripts/bench-lib.sh)
#
# Output: progress on stderr, the markdown tables on stdout (also in
# RESULTS/summary.md). Every server started here is stopped by its PID.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)

if [ "${QUICK:-0}" = 1 ]; then
  PAIRS=${PAIRS:-2}; RUNTIME=${RUNTIME:-2}; FW_QD1_SIZE=${FW_QD1_SIZE:-8M}
  FW_QD32_SIZE=${FW_QD32_SIZE:-32M}; JOURNAL_MAX=${JOURNAL_MAX:-256M}
fi
PAIRS=${PAIRS:-5}
RUNTIME=${RUNTIME:-10}
FW_QD1_SIZE=${FW_QD1_SIZE:-128M}
FW_QD32_SIZE=${FW_QD32_SIZE:-256M}
JOURNAL_MAX=${JOURNAL_MAX:-1536M}
THREADS=${THREADS:-16}
CONTROL=${CONTROL:-rmw}
JOBS=${JOBS:-fw-qd1 fw-qd32 ow-qd1 ow-qd32}
BENCH_TMP=${BENCH_TMP:-${TMPDIR:-/tmp}}
RESULTS=${RESULTS:-$BENCH_TMP/bench-policies-$(date +%Y%m%d-%H%M%S)}
CODE=${CODE:-$(cd "$repo" && echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown) + $(git status --porcelain 2>/dev/null | grep -c . || true) changed files")}

BENCH_NAME=bench-policies
# shellcheck source=scripts/bench-lib.sh
. "$repo/scripts/bench-lib.sh"

case "$CONTROL" in rmw|plog|parix|replicate|peer) ;; *) die "CONTROL must be rmw, plog, parix, replicate or peer, not $CONTROL" ;; esac
[ "$PAIRS" -ge 1 ] || die "PAIRS must be at least 1"
for job in $JOBS; do
  case "$job" in fw-qd1|fw-qd32|ow-qd1|ow-qd32) ;; *) die "unknown job $job" ;; esac
done
for s in ${SERVERS:-}; do
  case "$s" in R|L|X|T|P|C) ;; *) die "SERVERS: unknown server $s (R L X T P C)" ;; esac
done

bytes() { # 64M -> bytes (K, M, G suffixes, powers of 2)
  local v=$1 n=${1%[KkMmGg]}
  case "$v" in *[Kk]) echo $((n << 10)) ;; *[Mm]) echo $((n << 20)) ;; *[Gg]) echo $((n << 30)) ;; *) echo "$v" ;; esac
}
A_BYTES=$(bytes "$FW_QD1_SIZE")
B_BYTES=$(bytes "$FW_QD32_SIZE")
# Regions must be whole stripes of every geometry (RS(4,2) 32K unit: 128 KiB).
[ $((A_BYTES % (128 << 10))) = 0 ] && [ $((B_BYTES % (128 << 10))) = 0 ] \
  || die "FW_QD1_SIZE and FW_QD32_SIZE must be multiples of 128K"
SIZE=$((A_BYTES + B_BYTES))

bench_require_tools
bench_find_bin "$repo"
mkdir -p "$RESULTS"
bench_make_work ecdedup-bench-policies
mkdir -p "$WORK/warm"

# Servers: key -> policy (peer: nbdkit file).
declare -A POLICY=([R]=rmw [L]=plog [X]=parix [T]=replicate [P]=peer [C]=$CONTROL)
ORDER=(R L X T P C)
if [ -n "${SERVERS:-}" ]; then
  read -r -a ORDER <<<"$SERVERS"
  [ "${#ORDER[@]}" -ge 1 ] || die "SERVERS names no server"
fi

start_server() {
  local s=$1 pol=${POLICY[$1]} d=$WORK/$1
  if [ "$pol" = peer ]; then
    start_peer "$s"
    return
  fi
  rm -rf "$d"
  "$BIN" --dir "$d" create --devices 6 -k 4 -m 2 --stripe-unit 32K --size "$SIZE" \
    --write-policy "$pol" --journal-max "$JOURNAL_MAX" >/dev/null
  serve_ecdedup "$s" "$d"
}

remove_server() {
  local s=$1
  stop_server "$s"
  if [ "${KIND[$s]}" = peer ]; then rm -f "$WORK/$s.img"; else rm -rf "${DIR[$s]}"; fi
}

journal_state() { # prints "bytes logged_blocks"
  "$BIN" --dir "${DIR[$1]}" stats | python3 -c 'import json, sys
s = json.load(sys.stdin); print(s["journal_bytes"], s["journal_logged_blocks"])'
}

# Waits until a logging server has replayed its journals (it replays by
# itself after 1 s without writes), then syncs the server's files.
settle() {
  local s=$1 pol=${POLICY[$1]} t0 st i
  t0=$(date +%s.%N)
  if [ "$pol" = plog ] || [ "$pol" = parix ]; then
    for i in $(seq 1 2400); do
      st=$(journal_state "$s")
      [ "$st" = "0 0" ] && break
      sleep 0.25
    done
    [ "$st" = "0 0" ] || log "warning: server $s did not empty its journals within 600 s (journal_bytes, logged blocks: $st)"
  fi
  sync_files "$s"
  echo "$(python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.2f}')" "$t0")"
}

region() { # JOB -> "offset size"
  case "$1" in
    *-qd1) echo "0 $A_BYTES" ;;
    *-qd32) echo "$A_BYTES $B_BYTES" ;;
  esac
}

# fio_run OUT NAME QD OFFSET SIZE [extra fio options...]
fio_run() {
  local out=$1 name=$2 qd=$3 off=$4 size=$5
  shift 5
  fio --name="$name" --ioengine=nbd --uri="$(uri "$s")" --rw=randwrite --bs=4k \
      --iodepth="$qd" --offset="$off" --size="$size" --lat_percentiles=1 \
      --output-format=json --output="$out" "$@" >/dev/null 2>"${out%.json}.err" \
    || die "fio $name on $s failed: $(tail -5 "${out%.json}.err")"
}

# run_one JOB ROUND SERVER
run_one() {
  local job=$1 round=$2 s=$3 tag out warm qd off size load_before settle_s
  tag=$job.r$round.$s
  out=$WORK/fio/$tag.json
  warm=""
  qd=${job##*-qd}
  read -r off size <<<"$(region "$job")"
  drop_caches
  load_before=$(cut -d' ' -f1 /proc/loadavg)
  if [ "${job%%-*}" = ow ]; then
    warm=$WORK/warm/$tag.json
    [ "${KIND[$s]}" = ecdedup ] && stats_snapshot "$s" "$WORK/stats/$tag.warm.json"
    fio_run "$warm" "warm-$job" 32 "$off" "$size" --norandommap=0 --randseed=$((2000 + round))
    [ "${KIND[$s]}" = ecdedup ] && stats_snapshot "$s" "$WORK/stats/$tag.before.json"
    fio_run "$out" "$job" "$qd" "$off" "$size" --time_based --runtime="$RUNTIME" --randseed=$((3000 + round))
  else
    [ "${KIND[$s]}" = ecdedup ] && stats_snapshot "$s" "$WORK/stats/$tag.before.json"
    fio_run "$out" "$job" "$qd" "$off" "$size" --norandommap=0 --randseed=$((1000 + round))
  fi
  [ "${KIND[$s]}" = ecdedup ] && stats_snapshot "$s" "$WORK/stats/$tag.after.json"
  local load_after
  load_after=$(cut -d' ' -f1 /proc/loadavg)
  settle_s=$(settle "$s")
  echo "$job,$round,$s,${KIND[$s]},${POLICY[$s]},$load_before,$load_after,$settle_s,$out,$warm" >>"$WORK/runs.csv"
}

njobs=$(wc -w <<<"$JOBS")
log "work folder $WORK, results in $RESULTS"
log "PAIRS=$PAIRS RUNTIME=${RUNTIME}s regions A=$FW_QD1_SIZE B=$FW_QD32_SIZE (volume $SIZE bytes) JOURNAL_MAX=$JOURNAL_MAX THREADS=$THREADS CONTROL=$CONTROL JOBS=$JOBS"
log "disk: journals preallocate 2-3 x 6 x $JOURNAL_MAX; volumes up to $((SIZE * 10 / 1048576)) MiB per round"
echo "job,round,server,kind,policy,load_before,load_after,settle_s,fio_json,warm_json" >"$WORK/runs.csv"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
for round in $(seq 1 "$PAIRS"); do
  if [ "$round" -gt 1 ] && ! round_fits "$round_s"; then
    log "BENCH_DEADLINE: no time for round $round; the tables cover $((round - 1)) rounds"
    break
  fi
  round_t0=$SECONDS
  if [ $((round % 2)) = 1 ]; then order=("${ORDER[@]}"); else order=(); for ((i = ${#ORDER[@]} - 1; i >= 0; i--)); do order+=("${ORDER[$i]}"); done; fi
  log "round $round/$PAIRS: fresh servers, order ${order[*]}"
  for s in "${ORDER[@]}"; do start_server "$s"; done
  for job in $JOBS; do
    for s in "${order[@]}"; do run_one "$job" "$round" "$s"; done
    log "round $round: $job done"
  done
  for s in "${ORDER[@]}"; do remove_server "$s"; done
  round_s=$((SECONDS - round_t0))
done
finished=$(date -u +%Y-%m-%dT%H:%M:%SZ)

cp "$WORK/runs.csv" "$RESULTS/"
python3 - "$WORK" "$RESULTS" "$CONTROL" "$PAIRS" "$RUNTIME" "$FW_QD1_SIZE" "$FW_QD32_SIZE" "$JOURNAL_MAX" "$THREADS" \
  "$started" "$finished" "$CODE" "$(machine_line)" <<'PY' | tee "$RESULTS/summary.md"
import csv, json, os, statistics, sys
(work, results, control, pairs, runtime, a_size, b_size, jmax, threads,
 started, finished, code, machine) = sys.argv[1:]

NAMES = {"R": "rmw", "L": "plog", "X": "parix", "T": "replicate", "P": "nbdkit file", "C": f"control ({control}, 2nd)"}
SERVERS = ["R", "L", "X", "T", "P", "C"]
POLICY_OF = {"R": "rmw", "L": "plog", "X": "parix", "T": "replicate", "P": "peer", "C": control}
TWIN = {"rmw": "R", "plog": "L", "parix": "X", "replicate": "T", "peer": "P"}[control]
CLASSES = ("data", "parity", "metadata", "journal")

def fio_result(path):
    with open(path) as f:
        text = f.read()
    j = json.loads(text[text.index("{"):])["jobs"][0]["write"]
    pct = j["lat_ns"].get("percentile", {})
    return {
        "iops": j["iops"],
        "ios": j["total_ios"],
        "runtime_ms": j["runtime"],
        "lat_mean_us": j["lat_ns"]["mean"] / 1e3,
        "lat_p50_us": pct.get("50.000000", 0) / 1e3,
        "lat_p99_us": pct.get("99.000000", 0) / 1e3,
        "lat_p999_us": pct.get("99.900000", 0) / 1e3,
    }

def load(path):
    with open(path) as f:
        return json.load(f)

def delta(before, after):
    """Counter deltas between two `ecdedup stats` snapshots."""
    b, a = load(before), load(after)
    out = {k: a["array"][k] - b["array"][k] for k in a["array"]}
    for field in ("read_ops", "write_ops", "read_bytes", "write_bytes"):
        for c in CLASSES:
            out[f"dev_{field}_{c}"] = sum(d[field][c] for d in a["devices"]) - sum(d[field][c] for d in b["devices"])
    out["journal_bytes_after"] = a["journal_bytes"]
    out["journal_logged_blocks_after"] = a["journal_logged_blocks"]
    out["journal_index_bytes_after"] = a["journal_index_bytes"]
    return out

runs = []
for row in csv.DictReader(open(os.path.join(work, "runs.csv"))):
    tag = f'{row["job"]}.r{row["round"]}.{row["server"]}'
    r = {"job": row["job"], "round": int(row["round"]), "server": row["server"], "name": NAMES[row["server"]],
         "policy": row["policy"], "load_before": float(row["load_before"]), "load_after": float(row["load_after"]),
         "settle_s": float(row["settle_s"])}
    r.update(fio_result(row["fio_json"]))
    st = os.path.join(work, "stats", tag)
    if row["kind"] == "ecdedup":
        r["counters"] = delta(st + ".before.json", st + ".after.json")
    if row["warm_json"]:
        r["warm"] = fio_result(row["warm_json"])
        if row["kind"] == "ecdedup":
            r["warm"]["counters"] = delta(st + ".warm.json", st + ".before.json")
    runs.append(r)

meta = {"started": started, "finished": finished, "code": code, "machine": machine,
        "rounds": len({r["round"] for r in runs}), "runtime_s": int(runtime), "region_qd1": a_size, "region_qd32": b_size,
        "journal_max": jmax, "nbdkit_threads": int(threads), "control": control,
        "geometry": "RS(4,2), 32K stripe unit, 6 device files (replicate: RS(1,2) over the same 6 device files, each block on 3 of them)"}
with open(os.path.join(results, "results.json"), "w") as f:
    json.dump({"meta": meta, "runs": runs}, f, indent=1)

jobs = []
for r in runs:
    if r["job"] not in jobs:
        jobs.append(r["job"])
get = {(r["job"], r["round"], r["server"]): r for r in runs}
SERVERS = [s for s in SERVERS if any(r["server"] == s for r in runs)]  # SERVERS may name a subset
rounds = sorted({r["round"] for r in runs})

def vals(job, s, key, warm=False):
    out = []
    for rd in rounds:
        r = get.get((job, rd, s))
        if r is None:
            continue
        out.append((r["warm"] if warm else r)[key])
    return out

def cell(v, fmt="{:,.0f}"):
    if not v:
        return "–"
    if len(v) == 1:
        return fmt.format(v[0])
    return f"{fmt.format(statistics.median(v))} ({fmt.format(min(v))}–{fmt.format(max(v))})"

have = lambda j: j in jobs
print(f"### 4 KiB random writes over NBD: first writes and overwrites ({len(rounds)} rounds; overwrite runs {runtime} s; regions: QD1 {a_size}, QD32 {b_size}; {threads} nbdkit threads)\n")
print("Median over rounds (min–max). Latency: fio total latency (submission to completion), µs. First writes: one pass over a never-written region (each block once).\n")
hdr = ["server"]
if have("fw-qd1"): hdr += ["first write QD1 p50", "first write QD1 p99"]
if have("fw-qd32"): hdr += ["first write QD32 IOPS"]
if have("ow-qd1"): hdr += ["overwrite QD1 p50", "overwrite QD1 p99"]
if have("ow-qd32"): hdr += ["overwrite QD32 IOPS", "overwrite after replay (warm pass) QD32 IOPS"]
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for s in SERVERS:
    row = [NAMES[s]]
    if have("fw-qd1"): row += [cell(vals("fw-qd1", s, "lat_p50_us"), "{:,.1f}"), cell(vals("fw-qd1", s, "lat_p99_us"), "{:,.1f}")]
    if have("fw-qd32"): row += [cell(vals("fw-qd32", s, "iops"))]
    if have("ow-qd1"): row += [cell(vals("ow-qd1", s, "lat_p50_us"), "{:,.1f}"), cell(vals("ow-qd1", s, "lat_p99_us"), "{:,.1f}")]
    if have("ow-qd32"): row += [cell(vals("ow-qd32", s, "iops")), cell(vals("ow-qd32", s, "iops", warm=True))]
    print("| " + " | ".join(row) + " |")

# Paired ratios per round (adjacent runs of the same job).
pairs_def = [("parix / rmw", "X", "R"), ("parix / plog", "X", "L"), ("parix / replicate", "X", "T"),
             ("plog / rmw", "L", "R"), ("replicate / rmw", "T", "R"),
             (f"A/A control: {NAMES['C']} / {NAMES[TWIN]}", "C", TWIN)]
metrics = []
if have("fw-qd1"): metrics.append(("first write QD1 p50 latency", "fw-qd1", "lat_p50_us", False))
if have("fw-qd32"): metrics.append(("first write QD32 IOPS", "fw-qd32", "iops", False))
if have("ow-qd1"): metrics.append(("overwrite QD1 p50 latency", "ow-qd1", "lat_p50_us", False))
if have("ow-qd32"): metrics.append(("overwrite QD32 IOPS", "ow-qd32", "iops", False))
if have("ow-qd32"): metrics.append(("overwrite after replay QD32 IOPS", "ow-qd32", "iops", True))
print("\n### Paired ratios per round: median (min–max)\n")
print("A ratio compares two runs of the same job in the same round. Latency ratios below 1 and IOPS ratios above 1 favour the first-named server.\n")
print("| ratio | " + " | ".join(m[0] for m in metrics) + " |")
print("|---|" + "---|" * len(metrics))
for label, a, b in pairs_def:
    row = [label]
    for _, job, key, warm in metrics:
        ra = []
        for rd in rounds:
            x, y = get.get((job, rd, a)), get.get((job, rd, b))
            if x and y:
                vx = (x["warm"] if warm else x)[key]
                vy = (y["warm"] if warm else y)[key]
                if vy:
                    ra.append(vx / vy)
        row.append(cell(ra, "{:.2f}"))
    print("| " + " | ".join(row) + " |")

# Deterministic device cost per client write.
print("\n### Device I/O per client write (ecdedup, from `ecdedup stats` deltas over the measured runs, all rounds; all devices)\n")
print("Reads and writes are device operations of 4 KiB blocks or runs of blocks (a journal append of d(0) and d(r) for one block counts once). `data+parity` are the volume's device files, `journal` the parity journals (appends; replay reads).\n")
print("| server | phase | client writes | reads: data | reads: parity | reads: journal | writes: data+parity | writes: journal | bytes to devices+journals / client byte | need_d0 / write | rmw / rcw / full-stripe per write | journal fallbacks | stripes replayed |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
phases = []
for job in jobs:
    phases.append((job, job, False))
    if job.startswith("ow"):
        phases.append((f"{job} warm pass (first overwrite after replay)", job, True))
for s in SERVERS:
    if NAMES[s] == "nbdkit file" or (s == "C" and control == "peer"):
        continue
    for label, job, warm in phases:
        tot = {}
        for rd in rounds:
            r = get.get((job, rd, s))
            if not r:
                continue
            c = (r["warm"] if warm else r).get("counters")
            if not c:
                continue
            for k, v in c.items():
                if not k.endswith("_after"):
                    tot[k] = tot.get(k, 0) + v
        n = tot.get("client_writes", 0)
        if not n:
            continue
        wb = sum(tot[f"dev_write_bytes_{c}"] for c in CLASSES)
        print(f"| {NAMES[s]} | {label} | {n:,} | {tot['dev_read_ops_data'] / n:.2f} | {tot['dev_read_ops_parity'] / n:.2f} | "
              f"{tot['dev_read_ops_journal'] / n:.2f} | {(tot['dev_write_ops_data'] + tot['dev_write_ops_parity']) / n:.2f} | "
              f"{tot['dev_write_ops_journal'] / n:.2f} | {wb / tot['client_write_bytes']:.2f} | {tot['need_d0'] / n:.3f} | "
              f"{tot['rmw_writes'] / n:.2f} / {tot['rcw_writes'] / n:.2f} / {tot['full_stripe_writes'] / n:.2f} | "
              f"{tot['journal_fallbacks']} | {tot['stripes_replayed']} |")

# Journal index RAM against what the journals hold, right after each
# measured overwrite run (before the settle replays them).
print("\n### Journal index RAM per logged byte (plog, parix; at the end of each measured run, before replay)\n")
print("Logged bytes = logged blocks x 4 KiB (the blocks the index can locate); journal bytes = the journal files' records, headers and superseded records included. "
      "The index holds one entry per logged (stripe, role, block): where its d(0) and latest d(r), or its deltas, sit.\n")
print("| server | job | logged MiB (median) | index KiB (median) | index bytes / logged byte: median (min–max) | index bytes / journal byte: median (min–max) |")
print("|---|---|---|---|---|---|")
for s in SERVERS:
    if POLICY_OF.get(s) not in ("plog", "parix"):
        continue
    for job in jobs:
        ratios, per_journal, logged, index = [], [], [], []
        for rd in rounds:
            r = get.get((job, rd, s))
            c = r.get("counters") if r else None
            if not c or not c["journal_logged_blocks_after"]:
                continue
            lb = c["journal_logged_blocks_after"] * 4096
            logged.append(lb / 2**20)
            index.append(c["journal_index_bytes_after"] / 1024)
            ratios.append(c["journal_index_bytes_after"] / lb)
            if c["journal_bytes_after"]:
                per_journal.append(c["journal_index_bytes_after"] / c["journal_bytes_after"])
        if ratios:
            print(f"| {NAMES[s]} | {job} | {statistics.median(logged):,.1f} | {statistics.median(index):,.0f} | "
                  f"{cell(ratios, '{:.4f}')} | {cell(per_journal, '{:.4f}')} |")

loads = [r["load_before"] for r in runs]
settles = [r["settle_s"] for r in runs]
print(f"\n1-minute load average at the start of the runs: min {min(loads):.2f}, median {statistics.median(loads):.2f}, max {max(loads):.2f} ({os.cpu_count()} CPUs). "
      f"Settle time between runs (journal replay, fsync): median {statistics.median(settles):.1f} s, max {max(settles):.1f} s.")
print(f"\nMachine: {machine}. Code: {code}. Run {started} – {finished}.")
PY
log "done; results in $RESULTS"
