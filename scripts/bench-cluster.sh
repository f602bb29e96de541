#!/usr/bin/env bash
# The cluster on loopback (issue 19's first benchmark; issue 20 does the
# full set): 4 KiB random overwrites at QD1 (IOPS, p50 latency) and QD32
# (IOPS) for rmw, parix and 3-way replicate pools on the same 6 chunk
# servers (`ecdedup cluster up`, one etcd, every process on this machine),
# with the wire's messages, round trips and bytes per client write read
# from each volume client's counters before and after every run.
#
# Method: RS(4,2) (rmw, parix) and RS(1,2) (replicate), 64 KiB stripe unit,
# 4 PGs per pool, one 1 GiB volume per pool, each served by its own
# `ecdedup serve --cluster` (16 nbdkit threads); the journaled pools
# (plog, parix) with a parity journal bound of JOURNAL_MAX (256M) a shard.
# A first pass writes REGION sequentially (1 MiB, QD8) so that every
# measured write is an overwrite. Then ROUNDS rounds; per round every pool
# in turn (the order rotating each round so that drift spreads over all
# of them) waits until every volume client has been silent for QUIET_S s
# (2.5: a journaled pool's background replay, after 1 s idle, would
# otherwise run under the next pool's measurement; so its journals are
# empty), then runs, with no pause in between:
#   warm  one random 4 KiB pass over REGION at QD32, each block once: the
#         first overwrite of every block after a replay (parix: NEED_D0 on
#         each, the paper's failed speculation), measured too;
#   QD1   RUNTIME s of random 4 KiB overwrites, then
#   QD32  the same at QD32: parix's successful speculation for every block
#         whose d(0) the journals still hold (need_d0 / write says how
#         many did not: a journal past half its bound is replayed at once,
#         so JOURNAL_MAX must hold REGION's d(0)s and the runs' d(r)s).
# A run's counters are read before and after it, and once quiet again:
# the replay of what the three runs logged is shared over their writes
# ("with the replay").
# Reported: per pool the median over rounds with min-max, and per round the
# paired ratios parix/rmw and parix/replicate (median, min-max). The chunk
# servers write their chunk files with IO (direct: O_DIRECT on the file
# system under BENCH_TMP; buffered: the page cache).
#
# Usage: scripts/bench-cluster.sh  (ROUNDS=3 RUNTIME=10 REGION=256M IO=direct JOURNAL_MAX=256M
# BENCH_TMP=/var/tmp NO_BUILD=1 ECDEDUP_BIN=... KEEP=1 BENCH_DEADLINE=...)
#
# POOLS (default "rmw parix repl") may add `plog` (RS(4,2) plog) and
# `rmw2` (a second rmw pool: the A/A control, its ratio to rmw printed).
# SIM_RTT_US=N adds a SIMULATED round trip of N microseconds to every
# request the volume clients send (ECDEDUP_SIMULATED_RTT_US, the
# transport's `ClientConfig::simulated_rtt`: each reply is handed over N us
# after it came, so requests in flight together wait once): a network of
# N/2 us each way, since the kernel here has no netem. The tables say so.
# DIST (default random: uniform) is fio's --random_distribution for the measured
# QD1 and QD32 runs, e.g. DIST=zipf:1.2 for a hot set (the warm pass is
# always uniform, each block once).
set -euo pipefail
BENCH_NAME=bench-cluster
REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/bench-lib.sh
source "$REPO/scripts/bench-lib.sh"

ROUNDS=${ROUNDS:-3}
RUNTIME=${RUNTIME:-10}
REGION=${REGION:-256M}
IO=${IO:-direct}
THREADS=${THREADS:-16}
BENCH_TMP=${BENCH_TMP:-/var/tmp}
read -r -a POOLS <<<"${POOLS:-rmw parix repl}"
SIM_RTT_US=${SIM_RTT_US:-0}
JOURNAL_MAX=${JOURNAL_MAX:-256M}
DIST=${DIST:-random}
case $DIST in random|zipf:*|pareto:*|normal:*|zoned:*) ;; *) die "DIST: $DIST is not a fio random_distribution" ;; esac
for p in "${POOLS[@]}"; do
  case $p in rmw|plog|parix|repl|rmw2) ;; *) die "POOLS: unknown pool $p (rmw plog parix repl rmw2)" ;; esac
done

for tool in fio nbdkit nbdinfo python3 etcd; do
  command -v "$tool" >/dev/null || die "$tool is not installed (scripts/install-deps.sh)"
done
bench_find_bin "$REPO"
bench_make_work cluster
C=$WORK/c

cluster_cleanup() {
  local rc=$? s
  # No errexit here: under it the `(exit $rc)` below ended the trap before
  # `cleanup`, and a failed run left its volume clients running.
  set +e
  # The volume clients first: they close their arrays on their chunk servers.
  for s in "${STARTED[@]}"; do stop_server "$s"; done
  "$BIN" --dir "$C" cluster down >/dev/null 2>&1
  (exit $rc)  # cleanup keeps the work folder of a failed run
  cleanup
}
trap cluster_cleanup EXIT

log "cluster up in $C (6 chunk servers, io $IO)"
out=$("$BIN" --dir "$C" cluster up --servers 6 --no-serve --pool rmw --volume v \
  --policy rmw --pgs 4 --size 1G --io "$IO")
ETCD=$(printf '%s\n' "$out" | sed -n 's/^etcd //p')
[ -n "$ETCD" ] || die "cluster up printed no etcd endpoint: $out"
for p in "${POOLS[@]}"; do
  case $p in
    rmw) continue ;;  # made by cluster up
    repl) "$BIN" pool --etcd "$ETCD" create repl --policy replicate --copies 3 --pgs 4 >/dev/null ;;
    rmw2) "$BIN" pool --etcd "$ETCD" create rmw2 --policy rmw --pgs 4 >/dev/null ;;
    *) "$BIN" pool --etcd "$ETCD" create "$p" --policy "$p" --pgs 4 --journal-max "$JOURNAL_MAX" >/dev/null ;;
  esac
  "$BIN" volume --etcd "$ETCD" create "$p/v" --size 1G >/dev/null
done
if [ "$SIM_RTT_US" != 0 ]; then
  log "SIMULATED network: every request of the volume clients waits $SIM_RTT_US us more (ECDEDUP_SIMULATED_RTT_US)"
fi

for p in "${POOLS[@]}"; do
  KIND[$p]=cluster; DIR[$p]=$WORK/state-$p; SOCK[$p]=$WORK/$p.sock
  ECDEDUP_SIMULATED_RTT_US=$SIM_RTT_US \
    "$BIN" --dir "${DIR[$p]}" serve --cluster "$ETCD" --volume "$p/v" --key "$C/cluster.key" \
    --socket "${SOCK[$p]}" --threads "$THREADS" >"$WORK/$p.log" 2>&1 &
  PID[$p]=$!; _note_started "$p"
done
for p in "${POOLS[@]}"; do
  for _ in $(seq 1 600); do
    kill -0 "${PID[$p]}" 2>/dev/null || die "serve $p exited: $(tail -5 "$WORK/$p.log")"
    nbdinfo --size "nbd+unix:///?socket=${SOCK[$p]}" >/dev/null 2>&1 && break
    sleep 0.2
  done
done

stats() {  # the wire counters and NEED_D0s of pool $1 as JSON
  python3 - "${DIR[$1]}/stats.sock" <<'EOF'
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
data = b""
while True:
    b = s.recv(65536)
    if not b: break
    data += b
v = json.loads(data)
w = v["wire"]
w["need_d0"] = v["need_d0"]
print(json.dumps(w))
EOF
}

fio_run() {  # pool, name, extra args...
  local p=$1 name=$2; shift 2
  fio --name="$name" --ioengine=nbd --uri="nbd+unix:///?socket=${SOCK[$p]}" --thread \
    --size="$REGION" --output-format=json "$@" >"$WORK/fio/$p-$name.json"
}

for p in "${POOLS[@]}"; do
  log "warm pass: $p"
  fio_run "$p" warm-seq --rw=write --bs=1m --iodepth=8
done

# Waits until no pool's volume client has sent a message for QUIET_S
# seconds (at most 300 s): a journaled pool replays its journals after 1 s
# idle (checked every 200 ms), and a replay left running would load the
# chunk servers under the next pool's measured run.
QUIET_S=${QUIET_S:-2.5}
quiesce() {
  python3 - "$QUIET_S" "${POOLS[@]/#/${WORK}/state-}" <<'EOF'
import json, socket, sys, time
quiet, dirs = float(sys.argv[1]), sys.argv[2:]
def messages():
    out = []
    for d in dirs:
        s = socket.socket(socket.AF_UNIX); s.connect(d + "/stats.sock")
        data = b""
        while True:
            b = s.recv(65536)
            if not b: break
            data += b
        out.append(json.loads(data)["wire"]["messages"])
    return out
last, since, t0 = messages(), time.monotonic(), time.monotonic()
while time.monotonic() - since < quiet and time.monotonic() - t0 < 300:
    time.sleep(0.5)
    now = messages()
    if now != last:
        last, since = now, time.monotonic()
EOF
}

RESULTS=$WORK/results.jsonl
: >"$RESULTS"
for r in $(seq 1 "$ROUNDS"); do
  if [ "$r" -gt 1 ] && ! round_fits "$round_s"; then
    log "BENCH_DEADLINE: no time for round $r; the tables cover $((r - 1)) rounds"
    break
  fi
  round_t0=$SECONDS
  shift_by=$(( (r - 1) % ${#POOLS[@]} ))
  order=("${POOLS[@]:$shift_by}" "${POOLS[@]:0:$shift_by}")
  for p in "${order[@]}"; do
    # The journals were replayed while the pool idled: the warm pass is
    # the first overwrite of every block after a replay (parix: NEED_D0
    # on each), and QD1 and QD32 follow at once, while the journals hold
    # every block's d(0) if JOURNAL_MAX is large enough (need_d0 says).
    quiesce
    snap=("$(stats "$p")")
    fio_run "$p" "r$r-warm" --rw=randwrite --bs=4k --iodepth=32 --randseed=$((r * 100 + 7))
    snap+=("$(stats "$p")")
    for qd in 1 32; do
      fio_run "$p" "r$r-qd$qd" --rw=randwrite --bs=4k --iodepth="$qd" --time_based \
        --runtime="$RUNTIME" --randseed=$((r * 100 + qd)) --random_distribution="$DIST"
      snap+=("$(stats "$p")")
    done
    quiesce  # the replay of what the three runs logged, shared out over their writes
    snap+=("$(stats "$p")")
    python3 - "$p" "$r" "$WORK/fio" "${snap[@]}" >>"$RESULTS" <<'EOF'
import json, sys
p, r, fio = sys.argv[1:4]
s = [json.loads(x) for x in sys.argv[4:]]  # before warm, after warm, after QD1, after QD32, quiet
keys = ("messages", "round_trips", "bytes_out", "bytes_in", "need_d0")
runs = []
for i, (name, qd) in enumerate((("warm", "warm"), ("qd1", 1), ("qd32", 32))):
    text = open(f"{fio}/{p}-r{r}-{name}.json").read()
    job = json.loads(text[text.index("{"):])["jobs"][0]["write"]  # fio may print notes first
    runs.append((qd, job, {k: s[i + 1][k] - s[i][k] for k in keys}))
total = sum(job["total_ios"] for _, job, _ in runs)
replay = {k: s[4][k] - s[3][k] for k in ("messages", "round_trips")}
for qd, job, d in runs:
    n = job["total_ios"]
    print(json.dumps({
        "pool": p, "round": int(r), "qd": qd, "iops": job["iops"],
        "p50_us": job["clat_ns"]["percentile"]["50.000000"] / 1000,
        "writes": n,
        "messages_per_write": d["messages"] / n, "round_trips_per_write": d["round_trips"] / n,
        "wire_bytes_per_write": (d["bytes_out"] + d["bytes_in"]) / n,
        "need_d0_per_write": d["need_d0"] / n,
        "messages_per_write_with_replay": d["messages"] / n + replay["messages"] / total,
        "round_trips_per_write_with_replay": d["round_trips"] / n + replay["round_trips"] / total,
    }))
EOF
    log "round $r $p: $(tail -3 "$RESULTS" | tr '\n' ' ')"
  done
  round_s=$((SECONDS - round_t0))
done

if [ "$SIM_RTT_US" != 0 ]; then
  echo "SIMULATED network: ${SIM_RTT_US} us added to every request's round trip (ECDEDUP_SIMULATED_RTT_US; $((SIM_RTT_US / 2)) us each way)"
else
  echo "loopback, no added delay"
fi
echo "measured writes: random_distribution=$DIST over $REGION"
python3 - "$RESULTS" "${POOLS[*]}" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
pools = sys.argv[2].split()
def med(xs):
    return f"{statistics.median(xs):,.1f} ({min(xs):,.1f}-{max(xs):,.1f})"
print("| pool | QD1 IOPS | QD1 p50 us | QD32 IOPS | messages / write (QD32) | round trips / write (QD32) | wire bytes / write (QD32) | need_d0 / write (QD1; QD32) | messages; round trips / write with the replay (QD32) | first overwrite after a replay (warm pass, QD32): IOPS; messages; round trips; need_d0 / write |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for p in pools:
    q1 = [x for x in rows if x["pool"] == p and x["qd"] == 1]
    q32 = [x for x in rows if x["pool"] == p and x["qd"] == 32]
    qw = [x for x in rows if x["pool"] == p and x["qd"] == "warm"]
    print(f"| {p} | {med([x['iops'] for x in q1])} | {med([x['p50_us'] for x in q1])} | "
          f"{med([x['iops'] for x in q32])} | {med([x['messages_per_write'] for x in q32])} | "
          f"{med([x['round_trips_per_write'] for x in q32])} | {med([x['wire_bytes_per_write'] for x in q32])} | "
          f"{statistics.median([x['need_d0_per_write'] for x in q1]):.2f}; "
          f"{statistics.median([x['need_d0_per_write'] for x in q32]):.2f} | "
          f"{statistics.median([x['messages_per_write_with_replay'] for x in q32]):.1f}; "
          f"{statistics.median([x['round_trips_per_write_with_replay'] for x in q32]):.1f} | "
          f"{med([x['iops'] for x in qw])}; {statistics.median([x['messages_per_write'] for x in qw]):.1f}; "
          f"{statistics.median([x['round_trips_per_write'] for x in qw]):.1f}; "
          f"{statistics.median([x['need_d0_per_write'] for x in qw]):.2f} |")
pairs = [(a, b) for a, b in (("parix", "rmw"), ("parix", "repl"), ("plog", "rmw"),
                              ("parix", "plog"), ("rmw2", "rmw")) if a in pools and b in pools]
def paired(a, b, qd, key):
    ratios = []
    for r in sorted({x["round"] for x in rows}):
        xa = [x for x in rows if x["pool"] == a and x["qd"] == qd and x["round"] == r]
        xb = [x for x in rows if x["pool"] == b and x["qd"] == qd and x["round"] == r]
        if xa and xb:
            ratios.append(xa[0][key] / xb[0][key])
    return ratios
for qd in (1, 32, "warm"):
    for a, b in pairs:
        ratios = paired(a, b, qd, "iops")
        note = " (A/A control)" if a == "rmw2" else ""
        where = "QD32, first overwrite after a replay" if qd == "warm" else f"QD{qd}"
        print(f"{a}/{b} IOPS at {where}{note}: median {statistics.median(ratios):.2f} "
              f"(min {min(ratios):.2f}, max {max(ratios):.2f}) over {len(ratios)} rounds")
for a, b in pairs:
    ratios = paired(a, b, 1, "p50_us")
    note = " (A/A control)" if a == "rmw2" else ""
    print(f"{a}/{b} QD1 p50 latency{note}: median {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}) over {len(ratios)} rounds")
EOF
