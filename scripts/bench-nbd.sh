#!/usr/bin/env bash
# NBD write path benchmark: ecdedup RS(4,2) (32K stripe unit, 6 device files)
# against its peer, nbdkit's own `file` plugin serving one plain file of the
# same volume size, both on the same disk, both driven by the same fio jobs
# over a Unix socket (fio --ioengine=nbd).
#
# Method (docs/benchmarks.md explains why):
# - three servers run side by side for the whole benchmark: E (ecdedup),
#   P (nbdkit file) and a control C, a second identical server (CONTROL=peer:
#   a second nbdkit file export, the default; CONTROL=ecdedup: a second
#   ecdedup array). Each is preconditioned by one sequential write of the
#   whole volume, so reads never hit holes.
# - per job, PAIRS rounds; each round runs the three servers back to back,
#   time_based, RUNTIME seconds each (after RAMP seconds of ramp), with the
#   shared side in the middle and the order reversed every other round
#   (E P C, C P E, ... for CONTROL=peer), so every ratio compares two adjacent
#   runs and slow drift cancels.
# - reported per job: the median ratio ecdedup/peer over the rounds with its
#   min and max, and beside it the A/A control ratio (peer2/peer, or
#   ecdedup2/ecdedup), which is the noise floor: a main ratio whose range
#   overlaps the control's spread around 1.0 is not a measured difference.
# - deterministic cost: `ecdedup stats` is read before and after every
#   ecdedup run; device operations per client operation (reads and writes of
#   data, parity, checksum metadata), and the write path counters, are the
#   read-modify-write cost, independent of noise.
# - server CPU per GiB moved: each server's utime + stime over each run, per
#   GiB fio moved, with its ratio ecdedup/peer and the A/A control's.
#
# Environment (defaults in brackets):
#   PAIRS [5]  RUNTIME [10] seconds  RAMP [2] seconds  SIZE [2G]
#   THREADS [16] nbdkit worker threads (both sides)
#   CONTROL [peer] peer | ecdedup
#   PEER_CACHE []  nbdkit file's cache= option for the peer (none is not
#              O_DIRECT: see PEER_MEM)
#   RAW=1      a fourth side R: fio itself on one preallocated file of SIZE
#              (--direct=1 --ioengine=io_uring), the disk's limit in the same
#              run; reported as ecdedup/raw
#   DROP_CACHES=1  write back and drop the page cache before every run (root)
#   PEER_MEM   e.g. 256M: each nbdkit file server in its own memory cgroup
#              with that bound, its page cache included (root), so its reads
#              come mostly from the disk: `cache=none` does not bypass the
#              page cache, and with free memory a 2G image is read from it
#   LOOP=1     every side on loop devices with direct I/O over preallocated
#              files (`losetup --direct-io=on`; root): ecdedup's 6 devices,
#              the peer's file, the raw side's file; O_DIRECT, discard and
#              write-zeroes then take the block-device paths
#   CONTROL_ENV  with CONTROL=ecdedup: NAME=value words in the control
#              array's server environment only, so that the control ratio
#              ecdedup2/ecdedup is an A/B of that setting (e.g.
#              CONTROL_ENV=ECDEDUP_IO_URING=0); run again without
#              it for the A/A
#   ECDEDUP_IO_URING=0  the server's device I/O without io_uring (one
#              pread/pwrite/fdatasync per operation), for before/after counts
#   JOBS [randwrite-qd1 randwrite-qd32 randread-qd32 seqwrite-1m-qd8] the jobs to run;
#              also known: randwrite-qd1-flush64 (a flush every 64 writes),
#              randread-qd1, seqread-1m-qd8 (1 MiB sequential reads QD8),
#              seqread-1m-qd16, seqread-1m-qd32, seqread-4m-qd8 (the read sweep)
#   QUICK=1    smoke run: PAIRS=2 RUNTIME=2 RAMP=0 SIZE=256M
#   ECDEDUP_BIN  an ecdedup executable with libecdedup_nbdkit.so beside it
#                [target/release/ecdedup, built with `cargo build --release --workspace`]
#   NO_BUILD=1   do not run cargo build
#   BENCH_TMP [${TMPDIR:-/tmp}] where the array, files and sockets go
#   KEEP=1       keep the work folder (raw fio JSON, stats snapshots, runs.csv)
#   BENCH_DEADLINE  no round is started that would end after this time
#              (seconds since the epoch, shared equally by the jobs left;
#              scripts/bench-lib.sh)
#
# Output: progress on stderr, the markdown tables on stdout (also in
# WORK/summary.md). Every server started here is stopped by its PID.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)

if [ "${QUICK:-0}" = 1 ]; then
  PAIRS=${PAIRS:-2}; RUNTIME=${RUNTIME:-2}; RAMP=${RAMP:-0}; SIZE=${SIZE:-256M}
fi
PAIRS=${PAIRS:-5}
RUNTIME=${RUNTIME:-10}
RAMP=${RAMP:-2}
SIZE=${SIZE:-2G}
THREADS=${THREADS:-16}
CONTROL=${CONTROL:-peer}
JOBS=${JOBS:-randwrite-qd1 randwrite-qd32 randread-qd32 seqwrite-1m-qd8}
BENCH_TMP=${BENCH_TMP:-${TMPDIR:-/tmp}}

BENCH_NAME=bench-nbd
# shellcheck source=scripts/bench-lib.sh
. "$repo/scripts/bench-lib.sh"

case "$CONTROL" in peer|ecdedup) ;; *) die "CONTROL must be peer or ecdedup, not $CONTROL" ;; esac
[ "$PAIRS" -ge 1 ] || die "PAIRS must be at least 1"
bench_require_tools
bench_find_bin "$repo"
bench_make_work ecdedup-bench-nbd

start_ecdedup() {
  local s=$1 d=$WORK/$1 devices=() i bytes
  if [ "${LOOP:-0}" = 1 ]; then
    # The device size `create` gives its own files, learnt from a sparse
    # probe array; then 6 preallocated files of that size, each behind a
    # loop device with direct I/O.
    "$BIN" --dir "$WORK/probe" create --devices 6 -k 4 -m 2 --stripe-unit 32K --size "$SIZE" --sparse >/dev/null
    bytes=$(stat -c %s "$WORK/probe/dev0")
    rm -rf "$WORK/probe"
    mkdir -p "$WORK/loop"
    for i in 0 1 2 3 4 5; do
      fallocate -l "$bytes" "$WORK/loop/$s.dev$i"
      loop_attach "$WORK/loop/$s.dev$i"
      devices+=(--device "$LOOP_DEV")
    done
    log "creating ecdedup array $s: RS(4,2), 6 loop devices (${devices[*]}), 32K stripe unit, $SIZE"
  else
    log "creating ecdedup array $s: RS(4,2), 6 devices, 32K stripe unit, $SIZE"
  fi
  "$BIN" --dir "$d" create --devices 6 -k 4 -m 2 --stripe-unit 32K --size "$SIZE" "${devices[@]}" >&2
  serve_ecdedup "$s" "$d"
}

# fio options of a job.
job_opts() {
  case "$1" in
    randwrite-qd1)   echo "--rw=randwrite --bs=4k --iodepth=1" ;;
    randwrite-qd32)  echo "--rw=randwrite --bs=4k --iodepth=32" ;;
    randread-qd32)   echo "--rw=randread --bs=4k --iodepth=32" ;;
    randread-qd1)    echo "--rw=randread --bs=4k --iodepth=1" ;;
    seqread-1m-qd8)  echo "--rw=read --bs=1M --iodepth=8" ;;
    seqwrite-1m-qd8) echo "--rw=write --bs=1M --iodepth=8" ;;
    # The client-queue sweep of sequential reads (docs/benchmarks.md,
    # "Issue 21's goals on another machine").
    seqread-1m-qd16) echo "--rw=read --bs=1M --iodepth=16" ;;
    seqread-1m-qd32) echo "--rw=read --bs=1M --iodepth=32" ;;
    seqread-4m-qd8)  echo "--rw=read --bs=4M --iodepth=8" ;;
    # Not in the default set: a client that flushes (NBD_CMD_FLUSH) every 64 writes.
    randwrite-qd1-flush64) echo "--rw=randwrite --bs=4k --iodepth=1 --fsync=64" ;;
    *) die "unknown job $1" ;;
  esac
}

# fio's target options for server S: NBD, or the raw file.
target_opts() {
  if [ "${KIND[$1]}" = raw ]; then
    echo "--ioengine=io_uring --direct=1 --filename=${IMG[$1]}"
  else
    echo "--ioengine=nbd --uri=$(uri "$1")"
  fi
}

# run_one JOB ROUND SERVER
run_one() {
  local job=$1 round=$2 s=$3 tag out
  tag=$job.r$round.$s
  out=$WORK/fio/$tag.json
  drop_caches
  if [ "${KIND[$s]}" = ecdedup ]; then stats_snapshot "$s" "$WORK/stats/$tag.before.json"; fi
  local load_before cpu0="" cpu1=""
  load_before=$(cut -d' ' -f1 /proc/loadavg)
  # The server's CPU time (utime + stime of its process, in clock ticks)
  # over the run; none for the raw side, which has no server.
  [ "${KIND[$s]}" = raw ] || cpu0=$(cpu_ticks "${PID[$s]}")
  # shellcheck disable=SC2046
  fio --name="$job" $(target_opts "$s") --size="$SIZE" \
      $(job_opts "$job") --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" \
      --output-format=json --output="$out" >/dev/null 2>"$WORK/fio/$tag.err" \
    || die "fio $tag failed: $(tail -5 "$WORK/fio/$tag.err")"
  [ "${KIND[$s]}" = raw ] || cpu1=$(cpu_ticks "${PID[$s]}")
  if [ "${KIND[$s]}" = ecdedup ]; then stats_snapshot "$s" "$WORK/stats/$tag.after.json"; fi
  local cpu_s=""
  [ -z "$cpu0" ] || cpu_s=$(awk -v a="$cpu0" -v b="$cpu1" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f", (b - a) / hz }')
  echo "$job,$round,$s,${KIND[$s]},$load_before,$(cut -d' ' -f1 /proc/loadavg),$out,$cpu_s" >>"$WORK/runs.csv"
}

precondition() {
  local s=$1
  log "preconditioning $s: one sequential 1M write of $SIZE"
  # shellcheck disable=SC2046
  fio --name=precondition $(target_opts "$s") --size="$SIZE" \
      --rw=write --bs=1M --iodepth=8 --output-format=json \
      --output="$WORK/fio/precondition.$s.json" >/dev/null 2>"$WORK/fio/precondition.$s.err" \
    || die "precondition of $s failed: $(tail -5 "$WORK/fio/precondition.$s.err")"
}

log "work folder $WORK; PAIRS=$PAIRS RUNTIME=${RUNTIME}s RAMP=${RAMP}s SIZE=$SIZE THREADS=$THREADS CONTROL=$CONTROL"
start_ecdedup E
start_peer P
if [ "$CONTROL" = peer ]; then start_peer C; else SERVE_ENV[C]=${CONTROL_ENV:-}; start_ecdedup C; fi
SIDES=(E P C)
if [ "${RAW:-0}" = 1 ]; then start_raw R; SIDES+=(R); fi
for s in "${SIDES[@]}"; do precondition "$s"; done

# The shared side sits in the middle of a round.
if [ "$CONTROL" = peer ]; then ORDER=(E P C); else ORDER=(P E C); fi
if [ "${RAW:-0}" = 1 ]; then ORDER+=(R); fi
echo "job,round,server,kind,load_before,load_after,fio_json,cpu_s" >"$WORK/runs.csv"
njobs=$(wc -w <<<"$JOBS")
nsides=${#ORDER[@]}
log "running $njobs jobs x $PAIRS rounds x $nsides sides x $((RUNTIME + RAMP)) s (about $((njobs * PAIRS * nsides * (RUNTIME + RAMP + 1) / 60 + 1)) min)"
jobs_left=$njobs
for job in $JOBS; do
  # Under BENCH_DEADLINE each job gets an equal share of the time left.
  job_deadline=""
  [ -n "${BENCH_DEADLINE:-}" ] && job_deadline=$(( $(date +%s) + (BENCH_DEADLINE - $(date +%s)) / jobs_left ))
  jobs_left=$((jobs_left - 1))
  for round in $(seq 1 "$PAIRS"); do
    if [ "$round" -gt 1 ] && ! round_fits "$round_s" "$job_deadline"; then
      log "BENCH_DEADLINE: no time for $job round $round; its table covers $((round - 1)) rounds"
      break
    fi
    round_t0=$SECONDS
    order=("${ORDER[@]}")
    if [ $((round % 2)) = 0 ]; then
      order=(); for ((i = nsides - 1; i >= 0; i--)); do order+=("${ORDER[$i]}"); done
    fi
    for s in "${order[@]}"; do run_one "$job" "$round" "$s"; done
    log "$job round $round/$PAIRS done"
    round_s=$((SECONDS - round_t0))
  done
done

record_peak_rss "$WORK/rss.csv"
for s in "${STARTED[@]}"; do stop_server "$s"; done

python3 - "$WORK" "$CONTROL" "$PAIRS" "$RUNTIME" "$RAMP" "$SIZE" "$THREADS" <<'PY' | tee "$WORK/summary.md"
import csv, json, os, statistics, sys
work, control, pairs, runtime, ramp, size, threads = sys.argv[1:]

def fio_result(path):
    with open(path) as f:
        text = f.read()
    # fio may print notes before the JSON document.
    j = json.loads(text[text.index("{"):])["jobs"][0]
    side = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
    p50 = side.get("clat_ns", {}).get("percentile", {}).get("50.000000", 0) / 1000.0
    # fio's own CPU seconds over the job (usr + sys, percent of one CPU).
    fio_cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * j["job_runtime"] / 1000.0
    return side["iops"], side["bw_bytes"], side["lat_ns"]["mean"] / 1000.0, p50, side["io_bytes"], fio_cpu

runs = {}
cpu = {}  # server CPU seconds over a run (ticks over the whole run, ramp included)
jobs = []
for row in csv.DictReader(open(os.path.join(work, "runs.csv"))):
    if row["job"] not in jobs:
        jobs.append(row["job"])
    runs[(row["job"], int(row["round"]), row["server"])] = fio_result(row["fio_json"])
    if row.get("cpu_s"):
        cpu[(row["job"], int(row["round"]), row["server"])] = float(row["cpu_s"])

def metric(job, r):
    iops, bw = r[0], r[1]
    return bw / 1e6 if job.startswith("seq") else iops

def unit(job):
    return "MB/s" if job.startswith("seq") else "IOPS"

def spread(vals):
    return f"{statistics.median(vals):.3f} ({min(vals):.3f}–{max(vals):.3f})"

ctrl_label = "peer2/peer" if control == "peer" else "ecdedup2/ecdedup"
ctrl_ref = "P" if control == "peer" else "E"
counts = {job: len({k[1] for k in runs if k[0] == job}) for job in jobs}  # BENCH_DEADLINE may cut rounds
print(f"### Throughput, ecdedup vs nbdkit file ({max(counts.values())} rounds x {runtime} s per side, ramp {ramp} s, volume {size}, {threads} nbdkit threads)\n")
raw = any(k[2] == "R" for k in runs)
raw_head = " raw file (median) | ecdedup/raw: median (min–max) |" if raw else ""
print(f"| job | ecdedup (median) | nbdkit file (median) | ecdedup/peer: median (min–max) | A/A control {ctrl_label}: median (min–max) |{raw_head} ecdedup mean latency | ecdedup p50 latency | peer mean latency |")
print("|---|---|---|---|---|" + ("---|---|" if raw else "") + "---|---|---|")
for job in jobs:
    rounds = sorted({k[1] for k in runs if k[0] == job})
    e = [metric(job, runs[(job, r, "E")]) for r in rounds]
    p = [metric(job, runs[(job, r, "P")]) for r in rounds]
    c = [metric(job, runs[(job, r, "C")]) for r in rounds]
    ref = p if ctrl_ref == "P" else e
    ratio = [a / b for a, b in zip(e, p)]
    cratio = [a / b for a, b in zip(c, ref)]
    le = statistics.median(runs[(job, r, "E")][2] for r in rounds)
    lp = statistics.median(runs[(job, r, "P")][2] for r in rounds)
    p50 = statistics.median(runs[(job, r, "E")][3] for r in rounds)
    u = unit(job)
    raw_cells = ""
    if raw:
        w = [metric(job, runs[(job, r, "R")]) for r in rounds]
        raw_cells = f" {statistics.median(w):,.0f} {u} | {spread([a / b for a, b in zip(e, w)])} |"
    label = job if counts[job] == max(counts.values()) else f"{job} ({counts[job]} rounds)"
    print(f"| {label} | {statistics.median(e):,.0f} {u} | {statistics.median(p):,.0f} {u} | {spread(ratio)} | {spread(cratio)} |{raw_cells} {le:,.0f} µs | {p50:,.0f} µs | {lp:,.0f} µs |")

# Server CPU per GiB moved: the server's CPU seconds over the run (ramp
# included) per GiB fio moved in its measured part (ramp excluded), so the
# figure is a little high on both sides alike; the ratio is the result.
if cpu:
    print(f"\n### Server CPU per GiB moved (utime + stime of the server process over each run; ramp {ramp} s counted in the CPU, not in the bytes)\n")
    print(f"| job | ecdedup CPU s / GiB (median) | nbdkit file CPU s / GiB (median) | ecdedup/peer: median (min–max) | A/A control {ctrl_label}: median (min–max) | ecdedup cores busy (median) |" + (" raw: fio's own CPU s / GiB (median) |" if raw else ""))
    print("|---|---|---|---|---|---|" + ("---|" if raw else ""))
    def per_gib(job, r, s):
        return cpu[(job, r, s)] / (runs[(job, r, s)][4] / 2**30)
    for job in jobs:
        rounds = sorted({k[1] for k in runs if k[0] == job})
        if not all((job, r, s) in cpu and runs[(job, r, s)][4] > 0 for r in rounds for s in ("E", "P", "C")):
            continue
        e = [per_gib(job, r, "E") for r in rounds]
        p = [per_gib(job, r, "P") for r in rounds]
        c = [per_gib(job, r, "C") for r in rounds]
        ref = p if ctrl_ref == "P" else e
        busy = statistics.median(cpu[(job, r, "E")] / (float(runtime) + float(ramp)) for r in rounds)
        raw_cpu = ""
        if raw:
            w = [runs[(job, r, "R")][5] / (runs[(job, r, "R")][4] / 2**30) for r in rounds]
            raw_cpu = f" {statistics.median(w):.3f} |"
        print(f"| {job} | {statistics.median(e):.3f} | {statistics.median(p):.3f} | {spread([a / b for a, b in zip(e, p)])} | {spread([a / b for a, b in zip(c, ref)])} | {busy:.2f} |{raw_cpu}")

# Deterministic device cost, from `ecdedup stats` deltas over every ecdedup run.
def load(path):
    with open(path) as f:
        return json.load(f)

def dev_sum(st, field, classes=("data", "parity", "metadata")):
    return sum(d[field][c] for d in st["devices"] for c in classes)

servers = ["E"] + (["C"] if control == "ecdedup" else [])
print("\n### Device I/O per client request (ecdedup, from `ecdedup stats` deltas; all 6 devices)\n")
print("| job | client requests | device reads / req (data+parity) | device writes / req (data+parity) | checksum-page writes / req | device syncs / req | device submissions / req | device syscalls / req | bytes written to devices / client byte | rmw / rcw / full-stripe stripe updates per req | intent marks (per req) | client flushes |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for job in jobs:
    tot = {}
    keys = ["cw", "cr", "cwb", "crb", "rd", "wr", "wmeta", "wb", "rmw", "rcw", "full", "marks", "flushes", "syncs", "subs", "calls"]
    for k in keys:
        tot[k] = 0
    for fn in sorted(os.listdir(os.path.join(work, "stats"))):
        if not fn.startswith(job + ".") or not fn.endswith(".before.json"):
            continue
        if fn.split(".")[-3] not in servers:
            continue
        b = load(os.path.join(work, "stats", fn))
        a = load(os.path.join(work, "stats", fn.replace(".before.", ".after.")))
        d = lambda f: a["array"].get(f, 0) - b["array"].get(f, 0)  # 0: a build without the counter
        tot["cw"] += d("client_writes"); tot["cr"] += d("client_reads")
        tot["cwb"] += d("client_write_bytes"); tot["crb"] += d("client_read_bytes")
        tot["rmw"] += d("rmw_writes"); tot["rcw"] += d("rcw_writes"); tot["full"] += d("full_stripe_writes")
        tot["marks"] += d("intent_marks"); tot["flushes"] += d("client_flushes")
        tot["subs"] += d("device_submissions"); tot["calls"] += d("device_syscalls")
        tot["rd"] += dev_sum(a, "read_ops", ("data", "parity")) - dev_sum(b, "read_ops", ("data", "parity"))
        tot["wr"] += dev_sum(a, "write_ops", ("data", "parity")) - dev_sum(b, "write_ops", ("data", "parity"))
        tot["wmeta"] += dev_sum(a, "write_ops", ("metadata",)) - dev_sum(b, "write_ops", ("metadata",))
        tot["wb"] += dev_sum(a, "write_bytes") - dev_sum(b, "write_bytes")
        tot["syncs"] += sum(d["sync_ops"] for d in a["devices"]) - sum(d["sync_ops"] for d in b["devices"])
    is_write = tot["cw"] > 0
    n = tot["cw"] if is_write else tot["cr"]
    if n == 0:
        continue
    wbyte = f"{tot['wb'] / tot['cwb']:.2f}" if tot["cwb"] else "–"
    paths = f"{tot['rmw'] / n:.2f} / {tot['rcw'] / n:.2f} / {tot['full'] / n:.2f}" if is_write else "–"
    print(f"| {job} | {n:,} {'writes' if is_write else 'reads'} | {tot['rd'] / n:.2f} | {tot['wr'] / n:.2f} | {tot['wmeta'] / n:.4f} | {tot['syncs'] / n:.4f} | {tot['subs'] / n:.2f} | {tot['calls'] / n:.2f} | {wbyte} | {paths} | {tot['marks']} ({tot['marks'] / n:.4f}) | {tot['flushes']} |")

rss_path = os.path.join(work, "rss.csv")
if os.path.exists(rss_path):
    print("\n### Peak resident memory of each server process (VmHWM over the whole benchmark)\n")
    print("| server | kind | peak RSS |")
    print("|---|---|---|")
    for r in csv.DictReader(open(rss_path)):
        print(f"| {r['server']} | {r['kind']} | {int(r['peak_rss_kib']) / 1024:,.1f} MiB |")

loads = [float(r["load_before"]) for r in csv.DictReader(open(os.path.join(work, "runs.csv")))]
print(f"\n1-minute load average at the start of the runs: min {min(loads):.2f}, median {statistics.median(loads):.2f}, max {max(loads):.2f} (this machine has {os.cpu_count()} CPUs).")
PY
log "done"
