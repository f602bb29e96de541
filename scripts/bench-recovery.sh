#!/usr/bin/env bash
# Recovery time against parity-journal size (paper 004, PARIX, Fig. 6), for
# the logging policies parix and plog: RS(4,2), 32 KiB stripe unit, 6 device
# files, served over NBD.
#
# Definitions:
# - chunk C = SIZE / k: the bytes of stripe units every device holds (each
#   of the k+m devices holds one unit of every stripe, data or parity by
#   rotation, so each holds SIZE/k). It is the paper's chunk: there an
#   EC(4,2) group is 6 chunks of 64 MiB, one per server. SIZE = 256M gives
#   C = 64 MiB, the paper's chunk size.
# - journal size J = journal_bytes / (k+m): the mean bytes per device
#   journal (`journal_bytes` of `ecdedup stats`, all device journals, record
#   headers included: 32 bytes per 4 KiB block). The paper's J is the journal
#   of one parity chunk. Target J/C in RATIOS; J/C = 1 means each device's
#   journal holds as many bytes as the device holds stripe units.
#
# Method, per (repetition, ratio, policy), the ratios forward in odd
# repetitions and backward in even ones, the policies alternating:
# 1. a fresh array (create, serve), filled by one sequential 1 MiB write of
#    the whole volume (full-stripe writes: nothing logged), its files fsync'ed;
# 2. random 4 KiB writes (fio, QD WRITE_QD, a new random seed per fio run)
#    until journal_bytes reaches the target (within 1%): a few fio runs, each
#    sized from the journal bytes per write seen so far, back to back (the
#    gaps are a stats query and a fio start, well under the 1 s of idle
#    after which the server replays by itself; the report checks that
#    nothing was replayed before the failure);
# 3. at once: fail device FAIL_DEVICE, replace it (the same file, wiped),
#    rebuild; the requests go to the server's control socket, as the CLI
#    sends them, and the rebuild is followed by polling its status every
#    10 ms (`ecdedup rebuild` polls every 300 ms, too coarse here).
#    Recovery time = from the fail request to the rebuild's end; the
#    rebuild time alone is reported too. The failure also asks the server's
#    background thread to replay the journals, so replay runs both there and
#    in the rebuild (stripe by stripe, pipelined, as in the paper): the
#    recovery time includes all of it.
# 4. counters: records_replayed, stripes_replayed, device reads and writes
#    during recovery (stats before the failure and after the rebuild).
#
# Environment (defaults in brackets):
#   POLICIES [parix plog]   RATIOS [0 0.1 0.2 0.4 0.8 1.6 3.2]   REPS [5]
#   SIZE [256M] volume (C = SIZE/4)   WRITE_QD [32]   FAIL_DEVICE [0]
#   JOURNAL_MAX [auto: 2.2 x max ratio x C + 1 MiB, rounded up to 64 MiB,
#              at least 256M] a journal passing half its bound is replayed
#              at once, so the bound must exceed twice the largest target
#   THREADS [16] nbdkit worker threads
#   QUICK=1    smoke run: SIZE=64M REPS=1 RATIOS="0 0.4 3.2"
#   ECDEDUP_BIN, NO_BUILD=1, BENCH_TMP, KEEP=1 as in bench-nbd.sh
#   RESULTS [$BENCH_TMP/bench-recovery-DATE] results.json, summary.md,
#              recovery.svg
#   CODE [git HEAD + count of changed files, at the start] what was built
#
# Output: progress on stderr, the markdown table on stdout (also in
# RESULTS/summary.md), the plot in RESULTS/recovery.svg. Every server started
# here is stopped by its PID.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)

if [ "${QUICK:-0}" = 1 ]; then
  SIZE=${SIZE:-64M}; REPS=${REPS:-1}; RATIOS=${RATIOS:-0 0.4 3.2}
fi
POLICIES=${POLICIES:-parix plog}
RATIOS=${RATIOS:-0 0.1 0.2 0.4 0.8 1.6 3.2}
REPS=${REPS:-5}
SIZE=${SIZE:-256M}
WRITE_QD=${WRITE_QD:-32}
FAIL_DEVICE=${FAIL_DEVICE:-0}
THREADS=${THREADS:-16}
BENCH_TMP=${BENCH_TMP:-${TMPDIR:-/tmp}}
RESULTS=${RESULTS:-$BENCH_TMP/bench-recovery-$(date +%Y%m%d-%H%M%S)}
K=4; M=2
CODE=${CODE:-$(cd "$repo" && echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown) + $(git status --porcelain 2>/dev/null | grep -c . || true) changed files")}

BENCH_NAME=bench-recovery
# shellcheck source=scripts/bench-lib.sh
. "$repo/scripts/bench-lib.sh"

for p in $POLICIES; do
  case "$p" in plog|parix|rmw) ;; *) die "POLICIES: $p is not plog, parix or rmw" ;; esac
done
[ "$REPS" -ge 1 ] || die "REPS must be at least 1"

bytes() {
  local v=$1 n=${1%[KkMmGg]}
  case "$v" in *[Kk]) echo $((n << 10)) ;; *[Mm]) echo $((n << 20)) ;; *[Gg]) echo $((n << 30)) ;; *) echo "$v" ;; esac
}
SIZE_BYTES=$(bytes "$SIZE")
[ $((SIZE_BYTES % (K * 32768))) = 0 ] || die "SIZE must be a multiple of 128K"
CHUNK=$((SIZE_BYTES / K))
if [ -z "${JOURNAL_MAX:-}" ]; then
  JOURNAL_MAX=$(python3 -c 'import sys
c, rs = int(sys.argv[1]), [float(x) for x in sys.argv[2:]]
need = 2.2 * max(rs) * c + (1 << 20)
mib64 = 64 << 20
print(max(256 << 20, -(-int(need) // mib64) * mib64))' "$CHUNK" $RATIOS)
fi

bench_require_tools
bench_find_bin "$repo"
mkdir -p "$RESULTS"
bench_make_work ecdedup-bench-recovery
mkdir -p "$WORK/runs"

# The driver: journal fill, failure, replacement, rebuild, timing.
cat >"$WORK/driver.py" <<'PY'
import json, socket, subprocess, sys, time

(d, uri, size, target, fail_dev, qd, out, policy, fio_dir) = sys.argv[1:]
size, target, fail_dev, qd = int(size), int(target), int(fail_dev), int(qd)
blocks = size // 4096

def req(r):
    s = socket.socket(socket.AF_UNIX)
    s.connect(d + "/control.sock")
    s.sendall((json.dumps(r) + "\n").encode())
    line = s.makefile().readline()
    s.close()
    resp = json.loads(line)
    if resp.get("response") == "error":
        raise SystemExit(f"server answered {r}: {resp}")
    return resp

def stats():
    return req({"request": "stats"})

def dev_sum(st, field, cls):
    return sum(x[field][cls] for x in st["devices"])

s0 = stats()
jb = s0["journal_bytes"]
# Journal bytes per 4 KiB write, first guess: parix's first write of a
# block logs d(0) and d(1) in both parity journals (later ones d(r) only);
# plog logs a delta in both.
cost = (4 if policy == "parix" else 2) * (4096 + 32)
fio_runs = []
# Gaps without writes between fio runs, bounded from above: from one fio's
# exit to the next one's start, plus the next one's own start-up and
# teardown (its wall time less its job runtime).
gaps = []
last_exit = None
it = 0
tol = max(target // 100, 2 * cost)
while target > 0 and target - jb > tol and it < 60:
    it += 1
    n = max(1, min(blocks, int((target - jb) / cost)))
    spawn = time.monotonic()
    r = subprocess.run(["fio", f"--name=jfill{it}", "--ioengine=nbd", f"--uri={uri}", "--rw=randwrite",
                        "--bs=4k", f"--iodepth={qd}", f"--size={size}", f"--number_ios={n}",
                        f"--randseed={it}", "--output-format=json", f"--output={fio_dir}/jfill{it}.json"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    exited = time.monotonic()
    if r.returncode != 0:
        raise SystemExit(f"fio failed: {r.stderr[-500:]}")
    with open(f"{fio_dir}/jfill{it}.json") as f:
        text = f.read()
    job_s = json.loads(text[text.index("{"):])["jobs"][0]["job_runtime"] / 1000
    if last_exit is not None:
        gaps.append(spawn - last_exit + (exited - spawn - job_s))
    last_exit = exited
    st = stats()
    grown = st["journal_bytes"] - jb
    if grown > 0:
        cost = grown / n
    jb = st["journal_bytes"]
    fio_runs.append({"ios": n, "journal_bytes": jb, "wall_s": exited - spawn, "job_s": job_s})

before = stats()
t0 = time.monotonic()
if last_exit is not None:
    gaps.append(t0 - last_exit)
req({"request": "fail", "position": fail_dev})
t1 = time.monotonic()
req({"request": "replace", "position": fail_dev, "path": None})
t2 = time.monotonic()
started = req({"request": "rebuild"})
after_seq = started["after_seq"]
t_empty = None
polls = 0
while True:
    st = req({"request": "status"})
    polls += 1
    op = st.get("operation")
    if op and op["seq"] > after_seq and op["finished"]:
        break
    if t_empty is None and polls % 3 == 0:
        if stats()["journal_logged_blocks"] == 0:
            t_empty = time.monotonic()
    time.sleep(0.01)
t3 = time.monotonic()
if op.get("error"):
    raise SystemExit(f"rebuild failed: {op['error']}")
end = stats()
if t_empty is None and end["journal_logged_blocks"] == 0:
    t_empty = t3
time.sleep(2.5)
idle = stats()

a0, a1 = before["array"], end["array"]
res = {
    "policy": policy,
    "target_journal_bytes": target,
    "fill_fio_runs": fio_runs,
    "fill_gaps_max_s": max(gaps) if gaps else 0.0,
    "fill_client_writes": a0["client_writes"] - s0["array"]["client_writes"],
    "fill_need_d0": a0["need_d0"] - s0["array"]["need_d0"],
    "replayed_before_fail": a0["stripes_replayed"] - s0["array"]["stripes_replayed"],
    "fallbacks_before_fail": a0["journal_fallbacks"] - s0["array"]["journal_fallbacks"],
    "journal_bytes_at_fail": before["journal_bytes"],
    "journal_logged_blocks_at_fail": before["journal_logged_blocks"],
    "journal_index_bytes_at_fail": before["journal_index_bytes"],
    "fail_s": t1 - t0,
    "replace_s": t2 - t1,
    "rebuild_s": t3 - t2,
    "recovery_s": t3 - t0,
    "journals_empty_after_s": (t_empty - t0) if t_empty is not None else None,
    "records_replayed": a1["records_replayed"] - a0["records_replayed"],
    "stripes_replayed": a1["stripes_replayed"] - a0["stripes_replayed"],
    "rebuilt_stripes": a1["rebuilt_stripes"] - a0["rebuilt_stripes"],
    "journal_bytes_after_rebuild": end["journal_bytes"],
    "journal_logged_blocks_after_rebuild": end["journal_logged_blocks"],
    "journal_bytes_after_idle": idle["journal_bytes"],
    "status_polls": polls,
}
for field in ("read_ops", "write_ops", "read_bytes", "write_bytes"):
    for cls in ("data", "parity", "metadata", "journal"):
        res[f"recovery_dev_{field}_{cls}"] = dev_sum(end, field, cls) - dev_sum(before, field, cls)
with open(out, "w") as f:
    json.dump(res, f, indent=1)
print(f"J/C target reached: journal_bytes {before['journal_bytes']} (target {target}), "
      f"recovery {t3 - t0:.3f} s, rebuild {t3 - t2:.3f} s, records replayed {res['records_replayed']}", file=sys.stderr)
PY

# run_one REP RATIO POLICY
run_one() {
  local rep=$1 ratio=$2 pol=$3 s=A d=$WORK/A tag target
  tag=$pol.j$ratio.r$rep
  target=$(python3 -c 'import sys; print(int(float(sys.argv[1]) * int(sys.argv[2]) * int(sys.argv[3])))' "$ratio" "$CHUNK" $((K + M)))
  rm -rf "$d"
  "$BIN" --dir "$d" create --devices $((K + M)) -k $K -m $M --stripe-unit 32K --size "$SIZE" \
    --write-policy "$pol" --journal-max "$JOURNAL_MAX" >/dev/null
  serve_ecdedup "$s" "$d"
  fio --name=fill --ioengine=nbd --uri="$(uri "$s")" --rw=write --bs=1M --iodepth=8 --size="$SIZE" \
      --output-format=json --output="$WORK/runs/$tag.fill.json" >/dev/null 2>"$WORK/runs/$tag.fill.err" \
    || die "fill of $tag failed: $(tail -5 "$WORK/runs/$tag.fill.err")"
  sync_files "$s"
  local load_before
  load_before=$(cut -d' ' -f1 /proc/loadavg)
  mkdir -p "$WORK/runs/$tag.fio"
  python3 "$WORK/driver.py" "$d" "$(uri "$s")" "$SIZE_BYTES" "$target" "$FAIL_DEVICE" "$WRITE_QD" \
      "$WORK/runs/$tag.json" "$pol" "$WORK/runs/$tag.fio" 2>"$WORK/runs/$tag.err" \
    || die "recovery run $tag failed: $(tail -5 "$WORK/runs/$tag.err")"
  python3 -c 'import json, sys
p = sys.argv[1]; r = json.load(open(p))
r.update(rep=int(sys.argv[2]), ratio=float(sys.argv[3]), chunk_bytes=int(sys.argv[4]), load_before=float(sys.argv[5]))
json.dump(r, open(p, "w"), indent=1)' "$WORK/runs/$tag.json" "$rep" "$ratio" "$CHUNK" "$load_before"
  log "$tag: $(tail -1 "$WORK/runs/$tag.err")"
  stop_server "$s"
  rm -rf "$d"
}

read -r -a ratios <<<"$RATIOS"
read -r -a policies <<<"$POLICIES"
log "work folder $WORK, results in $RESULTS"
log "SIZE=$SIZE (chunk C = $CHUNK bytes) RATIOS=$RATIOS POLICIES=$POLICIES REPS=$REPS JOURNAL_MAX=$JOURNAL_MAX WRITE_QD=$WRITE_QD FAIL_DEVICE=$FAIL_DEVICE"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
for rep in $(seq 1 "$REPS"); do
  if [ $((rep % 2)) = 1 ]; then rs=("${ratios[@]}"); else rs=(); for ((i = ${#ratios[@]} - 1; i >= 0; i--)); do rs+=("${ratios[$i]}"); done; fi
  n=0
  for ratio in "${rs[@]}"; do
    n=$((n + 1))
    if [ $(((n + rep) % 2)) = 0 ]; then ps=("${policies[@]}"); else ps=(); for ((i = ${#policies[@]} - 1; i >= 0; i--)); do ps+=("${policies[$i]}"); done; fi
    for pol in "${ps[@]}"; do run_one "$rep" "$ratio" "$pol"; done
  done
  log "repetition $rep/$REPS done"
done
finished=$(date -u +%Y-%m-%dT%H:%M:%SZ)

python3 - "$WORK" "$RESULTS" "$SIZE" "$CHUNK" "$JOURNAL_MAX" "$WRITE_QD" "$FAIL_DEVICE" "$started" "$finished" \
  "$CODE" "$(machine_line)" <<'PY' | tee "$RESULTS/summary.md"
import glob, json, os, statistics, sys
(work, results, size, chunk, jmax, qd, fail_dev, started, finished, code, machine) = sys.argv[1:]
chunk = int(chunk)
runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(work, "runs", "*.json")))
        if not p.endswith((".fill.json",))]
runs = [r for r in runs if "recovery_s" in r]
meta = {"started": started, "finished": finished, "code": code, "machine": machine,
        "volume": size, "chunk_bytes": chunk, "journal_max": jmax, "write_qd": int(qd), "fail_device": int(fail_dev),
        "geometry": "RS(4,2), 32K stripe unit, 6 device files",
        "definitions": {"chunk": "volume / k: stripe-unit bytes per device",
                        "journal_ratio": "journal_bytes / (k+m) / chunk: mean per-device journal over chunk"}}
with open(os.path.join(results, "results.json"), "w") as f:
    json.dump({"meta": meta, "runs": runs}, f, indent=1)

def cell(v, fmt):
    v = [x for x in v if x is not None]
    if not v:
        return "–"
    if len(v) == 1:
        return fmt.format(v[0])
    return f"{fmt.format(statistics.median(v))} ({fmt.format(min(v))}–{fmt.format(max(v))})"

policies = []
for r in runs:
    if r["policy"] not in policies:
        policies.append(r["policy"])
ratios = sorted({r["ratio"] for r in runs})
reps = len({r["rep"] for r in runs})
print(f"### Recovery time vs journal size (volume {size}, chunk C = {chunk / 2**20:.0f} MiB, {reps} repetitions; median (min–max))\n")
print("J = journal_bytes / 6 (mean per-device journal) at the failure. Recovery = fail request to rebuild end; rebuild = the rebuild alone. "
      "Journals empty = from the failure until no journal holds a logged block (replay by the rebuild and the background thread).\n")
print("| policy | J/C target | J/C at failure | journal at failure (MiB, all devices) | client writes to fill | recovery (s) | rebuild alone (s) | journals empty after (s) | records replayed | stripes replayed | journal reads during recovery | replayed before failure |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for pol in policies:
    for ratio in ratios:
        rs = [r for r in runs if r["policy"] == pol and r["ratio"] == ratio]
        if not rs:
            continue
        g = lambda k: [r[k] for r in rs]
        jc = [r["journal_bytes_at_fail"] / 6 / chunk for r in rs]
        print(f"| {pol} | {ratio:g} | {cell(jc, '{:.3f}')} | {cell([x / 2**20 for x in g('journal_bytes_at_fail')], '{:,.0f}')} | "
              f"{cell(g('fill_client_writes'), '{:,.0f}')} | {cell(g('recovery_s'), '{:.2f}')} | {cell(g('rebuild_s'), '{:.2f}')} | "
              f"{cell(g('journals_empty_after_s'), '{:.2f}')} | {cell(g('records_replayed'), '{:,.0f}')} | {cell(g('stripes_replayed'), '{:,.0f}')} | "
              f"{cell(g('recovery_dev_read_ops_journal'), '{:,.0f}')} | {sum(g('replayed_before_fail'))} |")

# Relative to J = 0.
print("\n| policy | " + " | ".join(f"J/C = {x:g}" for x in ratios) + " |")
print("|---|" + "---|" * len(ratios))
for pol in policies:
    base = [r["recovery_s"] for r in runs if r["policy"] == pol and r["ratio"] == 0]
    row = [f"{pol}: recovery time / recovery time at J = 0 (medians)"]
    for ratio in ratios:
        v = [r["recovery_s"] for r in runs if r["policy"] == pol and r["ratio"] == ratio]
        row.append(f"{statistics.median(v) / statistics.median(base):.2f}" if v and base else "–")
    print("| " + " | ".join(row) + " |")

# Journal index RAM against what the journals hold at the failure.
print("\n### Journal index RAM per logged byte at the failure\n")
print("Logged bytes = logged blocks x 4 KiB (blocks the index can locate); journal bytes = the journal files' records (headers and superseded records included).\n")
print("| policy | J/C target | logged MiB (median) | index MiB (median) | index bytes / logged byte: median (min–max) | index bytes / journal byte: median (min–max) |")
print("|---|---|---|---|---|---|")
for pol in policies:
    for ratio in ratios:
        rs = [r for r in runs if r["policy"] == pol and r["ratio"] == ratio and r["journal_logged_blocks_at_fail"]]
        if not rs:
            continue
        lb = [r["journal_logged_blocks_at_fail"] * 4096 for r in rs]
        ib = [r["journal_index_bytes_at_fail"] for r in rs]
        print(f"| {pol} | {ratio:g} | {statistics.median(lb) / 2**20:,.1f} | {statistics.median(ib) / 2**20:,.2f} | "
              f"{cell([i / l for i, l in zip(ib, lb)], '{:.4f}')} | "
              f"{cell([r['journal_index_bytes_at_fail'] / r['journal_bytes_at_fail'] for r in rs if r['journal_bytes_at_fail']], '{:.4f}')} |")

loads = [r["load_before"] for r in runs]
stale = [r for r in runs if r["journal_bytes_after_idle"] > 0]
print(f"\nPer failure: fail request median {statistics.median(r['fail_s'] for r in runs):.2f} s, replace {statistics.median(r['replace_s'] for r in runs):.2f} s. "
      f"Longest time without writes between journal-filling fio runs, or from the last one to the failure (upper bound): {max(r['fill_gaps_max_s'] for r in runs):.2f} s. "
      f"Fallbacks before failure: {sum(r['fallbacks_before_fail'] for r in runs)}.")
print(f"Journal bytes left after the rebuild and 2.5 s idle (no logged blocks): nonzero in {len(stale)} of {len(runs)} runs"
      + (f" (median {statistics.median(r['journal_bytes_after_idle'] for r in stale) / 2**20:,.0f} MiB)." if stale else "."))
print(f"\n1-minute load average at the start of the runs: min {min(loads):.2f}, median {statistics.median(loads):.2f}, max {max(loads):.2f} ({os.cpu_count()} CPUs).")
print(f"\nMachine: {machine}. Code: {code}. Run {started} – {finished}.")
PY
python3 "$repo/scripts/plot-recovery.py" "$RESULTS/results.json" "$RESULTS/recovery.svg"
log "done; results in $RESULTS (plot: $RESULTS/recovery.svg)"
