#!/usr/bin/env bash
# Where the server's CPU goes (issue 21, item 1): samples the nbdkit process
# serving an ecdedup array while fio drives it over NBD, draws one flame graph
# per job and prints, per job, the share of samples in each cost category.
#
# Jobs (fio --ioengine=nbd over a Unix socket, time_based):
#   seqwrite-1m-qd8     1 MiB sequential writes, QD8, array E (RS(4,2) rmw)
#   seqread-1m-qd8      1 MiB sequential reads, QD8, array E (not in the default JOBS)
#   randwrite-qd32-rmw  4 KiB random overwrites, QD32, array E (after the warm pass)
#   randwrite-qd32-parix 4 KiB random overwrites, QD32, array X (RS(4,2) parix,
#                       after the warm pass)
#   randread-qd32       4 KiB random reads, QD32, array E
# Both arrays: 6 device files, k=4 m=2, 32K stripe unit, SIZE bytes, O_DIRECT.
# The warm pass is one sequential 1 MiB write of the whole volume per array,
# so overwrites overwrite and reads never hit holes.
#
# Per job: fio starts, after RAMP seconds `perf record -e cpu-clock` samples
# the server process (nbdkit, which `ecdedup serve` execs; -p PID, all its
# threads) for PERF_SECONDS, then fio stops. cpu-clock is a software event:
# this VM exposes no hardware counters. The samples are folded with
# inferno-collapse-perf and drawn with inferno-flamegraph into
# OUT/profile-JOB.svg (widths are CPU time: each cpu-clock sample counts its
# period in ns); the folded stacks stay in the work folder.
#
# Categories (the table). Samples are weighted by their cpu-clock period, so
# the shares are shares of the server's CPU time. Each folded stack is read
# from its leaf toward its root; at each frame the specific rules below are
# tried in order, and the first frame that matches one decides the sample's
# category. So a memset called by the journal counts as memset, a futex wait
# in the intent map as locks, a socket send that wakes the reader as NBD, and
# the generic kernel work (syscall entry, ...) of a system call made under a
# journal frame as journal.
# Kernel frames carry inferno's `_[k]` suffix.
#   encode (ISA-L)      ec_encode_data*, gf_*vect*, gf_*mad*, ec_init_tables,
#                       encode*, Codec / codec:: frames
#   CRC32C / checksums  crc32*, checksum* (any case)
#   memset (user)       memset (not a kernel frame)
#   memcpy/memmove (user) memcpy, memmove (not a kernel frame)
#   allocation          malloc, free, realloc, calloc, _int_malloc, _int_free,
#                       __rust_alloc/dealloc/realloc, alloc::raw_vec,
#                       alloc::alloc, mmap, munmap, brk, page faults
#   intent map          frames whose name contains `intent` (any case; not
#                       kernel frames)
#   journal             frames whose name contains `journal` (any case; not
#                       kernel frames: ext4's own journal is file system I/O)
#   locks/futex, scheduling  futex, pthread_mutex/cond, __lll_lock,
#                       parking_lot, Mutex, Condvar, RwLock, schedule,
#                       __switch_to, finish_task_switch, try_to_wake_up, ttwu,
#                       pick_next_task, sched_* (not *_blk_mq_sched_*),
#                       enqueue_task, dequeue_task
#   NBD/nbdkit + socket copies  kernel socket frames (unix_stream_*, sock_*,
#                       skb_*, *_datagram_*, __sys_sendto/recvfrom/sendmsg/
#                       recvmsg) and libc's send/recv wrappers
#   io_uring / syscalls io_uring*, io_submit*, io_wq*, iou*, blk*, *bio*,
#                       iomap*, ext4_*, jbd2*, xfs_*, virtblk*, nvme*, virtqueue*
# A stack that no frame of matches falls back, in this order, to:
#   io_uring / syscalls any kernel frame in the stack (the rest of the kernel:
#                       syscall entry, interrupts, timers)
#   engine, other       any frame of the engine (ecdedup_core::*,
#                       ecdedup_nbdkit::*): its own computation
#   NBD/nbdkit + socket copies  any frame in nbdkit (its binary has no
#                       symbols: `[nbdkit]`): nbdkit's own request handling
#   other               none of the above (libc, std, unresolved frames)
# The rules are the RULES table in the python step below.
#
# Environment (defaults in brackets):
#   SIZE [1G]           volume size of each array
#   THREADS [16]        nbdkit worker threads
#   RAMP [2]            seconds of fio before sampling starts
#   PERF_SECONDS [8]    seconds sampled per job
#   FREQ [999]          samples per second per CPU (perf -F)
#   CALLGRAPH [dwarf]   perf --call-graph mode: dwarf (the release build has
#                       line tables, debug = 1; glibc and the engine have no
#                       frame pointers, so `fp`, which is `perf record -g`,
#                       cuts user stacks after the leaf) or fp
#   JOBS [seqwrite-1m-qd8 randwrite-qd32-rmw randwrite-qd32-parix randread-qd32]
#   OUT [docs/img]      where the SVGs go (OUT/profile-JOB.svg)
#   MINWIDTH [0.3]      inferno-flamegraph --minwidth (percent of the samples):
#                       frames narrower than this are left out, which keeps
#                       each SVG small
#   ECDEDUP_BIN         an ecdedup executable with libecdedup_nbdkit.so beside it
#                       [target/release/ecdedup, built with cargo build --release --workspace]
#   NO_BUILD=1          do not run cargo build
#   BENCH_TMP [${TMPDIR:-/tmp}]  where the arrays, sockets and perf data go;
#                       needs about 3 x SIZE free (two arrays of 6 preallocated
#                       devices, 1.5 x SIZE each) plus up to ~150 MB of perf
#                       data per job with dwarf stacks
#   KEEP=1              keep the work folder (perf.data, folded stacks, fio JSON)
#   SUMMARY_FROM=DIR    only print the table again from a kept work folder
#                       (its folded stacks; same PERF_SECONDS), e.g. after
#                       changing the rules
#
# Needs: perf (linux-perf), fio, nbdkit, python3, and inferno
# (`cargo install inferno`). perf must be allowed to attach to the server:
# root, or kernel.perf_event_paranoid <= 1 for a process of the same user.
#
# Output: progress on stderr; on stdout a markdown table (also in
# WORK/summary.md) with, per job, the throughput, the 1-minute load average
# before and after sampling, the sample count and the category shares.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)

SIZE=${SIZE:-1G}
THREADS=${THREADS:-16}
RAMP=${RAMP:-2}
PERF_SECONDS=${PERF_SECONDS:-8}
FREQ=${FREQ:-999}
CALLGRAPH=${CALLGRAPH:-dwarf}
JOBS=${JOBS:-seqwrite-1m-qd8 randwrite-qd32-rmw randwrite-qd32-parix randread-qd32}
OUT=${OUT:-$repo/docs/img}
MINWIDTH=${MINWIDTH:-0.3}
BENCH_TMP=${BENCH_TMP:-${TMPDIR:-/tmp}}

BENCH_NAME=profile
# shellcheck source=scripts/bench-lib.sh
. "$repo/scripts/bench-lib.sh"

summarize() {
python3 - "$1" "$PERF_SECONDS" <<'PY'
import csv, json, os, re, sys
work, perf_s = sys.argv[1], float(sys.argv[2])

# (category, regex on one frame name), tried leaf first: see the header comment.
RULES = [
    ("encode (ISA-L)", re.compile(r"ec_encode_data|gf_\w*vect|gf_\w*mad|ec_init_tables|\bencode|Codec|codec::", re.I)),
    ("CRC32C / checksums", re.compile(r"crc32|checksum", re.I)),
    ("memset (user)", re.compile(r"^(?!.*_\[k\]$).*memset")),
    ("memcpy/memmove (user)", re.compile(r"^(?!.*_\[k\]$).*(memcpy|memmove)")),
    ("allocation", re.compile(r"\b_?_?(lib)?c?(malloc|free|realloc|calloc)\b|_int_malloc|_int_free|malloc_consolidate|__rust_alloc|__rust_dealloc|__rust_realloc|alloc::raw_vec|alloc::alloc|^(__x64_sys_)?(mmap|munmap|brk)|do_mmap|__do_munmap|exc_page_fault|do_anonymous_page")),
    ("intent map", re.compile(r"^(?!.*_\[k\]$).*intent", re.I)),
    ("journal", re.compile(r"^(?!.*_\[k\]$).*journal", re.I)),
    ("locks/futex, scheduling", re.compile(r"futex|pthread_mutex|pthread_cond|__lll_lock|lll_lock|parking_lot|Mutex|Condvar|RwLock|\bschedule|__schedule|__switch_to|finish_task_switch|try_to_wake_up|ttwu|pick_next_task|^sched_|dequeue_task|enqueue_task")),
    ("NBD/nbdkit + socket copies", re.compile(r"unix_stream|^sock_|^__sock_|skb_|_datagram_|__sys_(sendto|recvfrom|sendmsg|recvmsg)|^(__libc_)?(__)?(send|recv)(msg|to|from)?$")),
    ("io_uring / syscalls", re.compile(r"io_uring|io_submit|io_wq|^iou|^_*blk|bio|iomap|^_*ext4_|jbd2|^_*xfs_|virtblk|virtqueue|nvme")),
]
FALLBACK = [
    ("io_uring / syscalls", re.compile(r"_\[k\]$")),
    ("engine, other", re.compile(r"ecdedup")),
    ("NBD/nbdkit + socket copies", re.compile(r"^\[nbdkit\]$")),
]
CATS = list(dict.fromkeys([c for c, _ in RULES] + ["engine, other", "other"]))

def classify(frames):
    for f in reversed(frames):  # leaf first
        for cat, rx in RULES:
            if rx.search(f):
                return cat
    for cat, rx in FALLBACK:
        if any(rx.search(f) for f in frames):
            return cat
    return "other"

rows = list(csv.DictReader(open(os.path.join(work, "jobs.csv"))))
table = []
for r in rows:
    job = r["job"]
    counts = {c: 0 for c in CATS}
    total = 0
    with open(os.path.join(work, "perf", job + ".folded")) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n = int(n)
            frames = stack.split(";")[1:]  # the first frame is the thread name
            counts[classify(frames)] += n
            total += n
    with open(os.path.join(work, "fio", job + ".json")) as f:
        text = f.read()
    j = json.loads(text[text.index("{"):])["jobs"][0]
    side = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
    tput = f"{side['bw_bytes'] / 1e6:,.0f} MB/s" if job.startswith("seq") else f"{side['iops']:,.0f} IOPS"
    log = open(os.path.join(work, "perf", job + ".record.log")).read()
    m = re.search(r"\((\d+) samples\)", log)
    lost = re.search(r"lost (\d+) chunks", log)
    nsamples = f"{int(m.group(1)):,}" if m else "?"
    if lost:
        nsamples += f" ({lost.group(1)} chunks lost)"
    table.append((job, tput, r["load_before"], r["load_after"], total, counts, side["iops"], nsamples))

print("| category | " + " | ".join(t[0] for t in table) + " |")
print("|---|" + "---|" * len(table))
print("| throughput while sampled | " + " | ".join(t[1] for t in table) + " |")
print("| load average (1 min) before / after | " + " | ".join(f"{t[2]} / {t[3]}" for t in table) + " |")
print("| samples | " + " | ".join(t[7] for t in table) + " |")
# cpu-clock periods are nanoseconds of CPU time.
print(f"| server CPU while sampled (cores busy over {perf_s} s) | " + " | ".join(f"{t[4] / 1e9 / perf_s:.2f}" for t in table) + " |")
# CPU time per request: the sampled CPU share over the request rate of the
# whole fio run (ramp and tail included, so an approximation).
print("| server CPU per request (µs) | " + " | ".join(f"{t[4] / 1e3 / perf_s / max(t[6], 1e-9):,.0f}" for t in table) + " |")
for c in CATS:
    print(f"| {c} | " + " | ".join(f"{100.0 * t[5][c] / max(t[4], 1):.1f}%" for t in table) + " |")
PY
}

if [ -n "${SUMMARY_FROM:-}" ]; then
  [ -f "$SUMMARY_FROM/jobs.csv" ] || die "$SUMMARY_FROM has no jobs.csv (run with KEEP=1)"
  summarize "$SUMMARY_FROM"
  exit 0
fi

bench_require_tools
command -v perf >/dev/null || die "perf is not installed (apt-get install linux-perf)"
for tool in inferno-collapse-perf inferno-flamegraph; do
  command -v "$tool" >/dev/null || die "$tool is not installed: cargo install inferno (puts it in ~/.cargo/bin)"
done
case "$CALLGRAPH" in dwarf|fp) ;; *) die "CALLGRAPH must be dwarf or fp, not $CALLGRAPH" ;; esac
bench_find_bin "$repo"
bench_make_work ecdedup-profile
mkdir -p "$WORK/perf" "$OUT"

# create_array S POLICY: creates and serves an RS(4,2) array with POLICY.
create_array() {
  local s=$1 policy=$2 d=$WORK/$1
  log "creating array $s: RS(4,2), 6 devices, 32K stripe unit, $SIZE, write policy $policy"
  "$BIN" --dir "$d" create --devices 6 -k 4 -m 2 --stripe-unit 32K --size "$SIZE" \
    --write-policy "$policy" >&2
  serve_ecdedup "$s" "$d"
}

warm() {
  local s=$1
  log "warm pass on $s: one sequential 1M write of $SIZE"
  fio --name=warm --ioengine=nbd --uri="$(uri "$s")" --size="$SIZE" \
      --rw=write --bs=1M --iodepth=8 --output-format=json \
      --output="$WORK/fio/warm.$s.json" >/dev/null 2>"$WORK/fio/warm.$s.err" \
    || die "warm pass of $s failed: $(tail -5 "$WORK/fio/warm.$s.err")"
}

# job_server JOB: the array a job runs on; job_opts JOB: its fio options.
job_server() {
  case "$1" in
    randwrite-qd32-parix) echo X ;;
    seqwrite-1m-qd8|seqread-1m-qd8|randwrite-qd32-rmw|randread-qd32) echo E ;;
    *) die "unknown job $1" ;;
  esac
}
job_opts() {
  case "$1" in
    seqwrite-1m-qd8) echo "--rw=write --bs=1M --iodepth=8" ;;
    seqread-1m-qd8) echo "--rw=read --bs=1M --iodepth=8" ;;
    randwrite-qd32-rmw|randwrite-qd32-parix) echo "--rw=randwrite --bs=4k --iodepth=32" ;;
    randread-qd32) echo "--rw=randread --bs=4k --iodepth=32" ;;
    *) die "unknown job $1" ;;
  esac
}

cg_opts() { if [ "$CALLGRAPH" = dwarf ]; then echo "--call-graph dwarf,16384"; else echo "-g"; fi; }

profile_job() {
  local job=$1 s p fio_pid load_before load_after
  s=$(job_server "$job"); p=${PID[$s]}
  log "$job on $s (nbdkit pid $p): fio for $((RAMP + PERF_SECONDS + 2)) s, perf from second $RAMP for $PERF_SECONDS s"
  # shellcheck disable=SC2046
  fio --name="$job" --ioengine=nbd --uri="$(uri "$s")" --size="$SIZE" $(job_opts "$job") \
      --time_based --runtime=$((RAMP + PERF_SECONDS + 2)) \
      --output-format=json --output="$WORK/fio/$job.json" >/dev/null 2>"$WORK/fio/$job.err" &
  fio_pid=$!
  sleep "$RAMP"
  load_before=$(cut -d' ' -f1 /proc/loadavg)
  # shellcheck disable=SC2046
  perf record -e cpu-clock -F "$FREQ" $(cg_opts) -p "$p" -o "$WORK/perf/$job.data" \
    -- sleep "$PERF_SECONDS" >"$WORK/perf/$job.record.log" 2>&1 \
    || { kill "$fio_pid" 2>/dev/null || true; die "perf record failed: $(tail -5 "$WORK/perf/$job.record.log")"; }
  load_after=$(cut -d' ' -f1 /proc/loadavg)
  wait "$fio_pid" || die "fio $job failed: $(tail -5 "$WORK/fio/$job.err")"
  echo "$job,$s,${KIND[$s]},$load_before,$load_after" >>"$WORK/jobs.csv"
  log "$job: folding stacks"
  perf script -i "$WORK/perf/$job.data" --no-inline 2>"$WORK/perf/$job.script.err" \
    | inferno-collapse-perf --all >"$WORK/perf/$job.folded"
  [ -s "$WORK/perf/$job.folded" ] || die "no samples for $job (see $WORK/perf/$job.script.err)"
  inferno-flamegraph --minwidth "$MINWIDTH" --countname "ns of CPU" \
    --title "ecdedup server (nbdkit) CPU, $job, cpu-clock, $(date -u +%F)" \
    <"$WORK/perf/$job.folded" >"$OUT/profile-$job.svg"
  [ "${KEEP:-0}" = 1 ] || rm -f "$WORK/perf/$job.data"  # hundreds of MB with dwarf stacks
  log "$job: $OUT/profile-$job.svg ($(du -k "$OUT/profile-$job.svg" | cut -f1) KiB)"
}

log "work folder $WORK; SIZE=$SIZE THREADS=$THREADS RAMP=${RAMP}s PERF_SECONDS=${PERF_SECONDS}s FREQ=$FREQ CALLGRAPH=$CALLGRAPH"
need_x=0
for job in $JOBS; do
  job_opts "$job" >/dev/null  # an unknown job stops here, before any server starts
  if [ "$(job_server "$job")" = X ]; then need_x=1; fi
done
create_array E rmw
warm E
if [ "$need_x" = 1 ]; then create_array X parix; warm X; fi
echo "job,server,kind,load_before,load_after" >"$WORK/jobs.csv"
for job in $JOBS; do profile_job "$job"; done
for s in "${STARTED[@]}"; do stop_server "$s"; done

summarize "$WORK" | tee "$WORK/summary.md"
log "done"
