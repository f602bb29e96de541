#!/usr/bin/env bash
# One data set's dedup through the cluster, per dedup mode, against the
# single-machine array: the same bytes (the first BYTES of DATA) copied
# with nbdcopy into
#   - a loopback cluster (`cluster up`: etcd and 6 chunk servers), one pool
#     per dedup mode (none, parity, all), RS(4,2) rmw, 64 KiB stripe unit,
#     one PG each (so a PG's array is the single machine's, shard for
#     device), one volume each; the dedup layers run at the chunk servers,
#     and each server reports its layers per volume (`server/<id>/space`,
#     `volumes`), which `cluster status --json` sums;
#   - a single-machine array of the same geometry and each dedup mode
#     (`ecdedup create --devices 6`), its layers in the array's process,
#     read from `ecdedup stats` (`dedup`, per device).
# One data path: the same layer code over the same stripes, so each
# mode's blocks mapped and slots used should match between the two.
#
# Usage: DATA=FILE scripts/cluster-dedup.sh
# Environment [defaults]: BYTES [256M] (a multiple of 256 KiB: whole
#   stripes), ECDEDUP_BIN (else a release build, as bench-nbd.sh),
#   NO_BUILD=1, BENCH_TMP [/tmp], KEEP=1.
# Output: a markdown table on stdout (also WORK/summary.md); progress on
# stderr. Every process started is stopped by its PID (`cluster down`
# stops the cluster's).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
DATA=${DATA:?DATA=a file to copy (e.g. a workload of ../shared/workloads)}
BYTES=${BYTES:-256M}
THREADS=${THREADS:-8}
BENCH_TMP=${BENCH_TMP:-${TMPDIR:-/tmp}}
BENCH_NAME=cluster-dedup
# shellcheck source=scripts/bench-lib.sh
. "$repo/scripts/bench-lib.sh"

command -v nbdcopy >/dev/null || die "nbdcopy is not installed (scripts/install-deps.sh: libnbd-bin)"
command -v python3 >/dev/null || die "python3 is not installed"
bench_find_bin "$repo"
bench_make_work ecdedup-cluster-dedup
trap 'rc=$?; "$BIN" cluster down --dir "$WORK/c" >/dev/null 2>&1 || true; (exit $rc); cleanup' EXIT

bytes=$(numfmt --from=iec "$BYTES")
[ $((bytes % 262144)) = 0 ] || die "BYTES ($BYTES) is not a multiple of 256 KiB"
head -c "$bytes" "$DATA" >"$WORK/data.bin"
[ "$(stat -c %s "$WORK/data.bin")" = "$bytes" ] || die "$DATA holds fewer than $BYTES bytes"
log "work folder $WORK; $BYTES of $DATA"

MODES=(none parity all)

# The cluster: etcd, 6 chunk servers, one pool per mode.
"$BIN" cluster up --dir "$WORK/c" --servers 6 --pool pnone --dedup none --pgs 1 \
  --volume v --size 1G --no-serve >"$WORK/cluster-up.log" 2>&1 ||
  die "cluster up failed: $(tail -5 "$WORK/cluster-up.log")"
etcd=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["etcd"])' "$WORK/c/cluster.json")
for mode in parity all; do
  "$BIN" pool --etcd "$etcd" create "p$mode" --dedup "$mode" --pgs 1 >/dev/null
  "$BIN" volume --etcd "$etcd" create "p$mode/v" --size 1G >/dev/null
done

# serve_cluster S POOL: the volume POOL/v served as S.
serve_cluster() {
  local s=$1 pool=$2
  KIND[$s]=cluster; DIR[$s]=$WORK/c/$s; SOCK[$s]=$WORK/$s.sock
  rm -f "${SOCK[$s]}"
  "$BIN" --dir "${DIR[$s]}" serve --cluster "$etcd" --volume "$pool/v" \
    --key "$WORK/c/cluster.key" --socket "${SOCK[$s]}" --threads "$THREADS" \
    >"$WORK/$s.log" 2>&1 &
  PID[$s]=$!; _note_started "$s"
  wait_ready "$s"
}

copy_into() {
  local s=$1 t0 t1
  t0=$(date +%s.%N)
  nbdcopy --flush "$WORK/data.bin" "$(uri "$s")" || die "nbdcopy into $s failed"
  t1=$(date +%s.%N)
  log "$s: $BYTES copied in $(python3 -c "print(f'{$t1 - $t0:.1f}')") s"
}

for mode in "${MODES[@]}"; do
  serve_cluster "c$mode" "p$mode"
  copy_into "c$mode"
  stop_server "c$mode"
done
# The servers report their layers with their space, every 10 s: a report
# may have been taken during the last copy, so the figures are read once
# they hold still across two reads more than a report apart.
log "waiting for the servers' space reports to settle"
figures() {
  "$BIN" cluster status --dir "$WORK/c" --json >"$WORK/status.json"
  python3 - "$WORK/status.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
vols = {p["name"]: p["volumes"][0].get("dedup") for p in s["pools"]}
print(json.dumps([vols.get("pparity"), vols.get("pall")], sort_keys=True))
PY
}
before=$(figures)
for _ in $(seq 1 12); do
  sleep 11
  now=$(figures)
  if [ "$now" = "$before" ] && python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if all(x and x["chunks"] == 6 for x in d) else 1)' "$now"; then
    break
  fi
  before=$now
done

# The single machine, each mode.
for mode in "${MODES[@]}"; do
  d=$WORK/one-$mode
  "$BIN" --dir "$d" create --devices 6 -k 4 -m 2 --stripe-unit 64K --size 1G --sparse \
    --dedup "$mode" --write-policy rmw >/dev/null
  serve_ecdedup "s$mode" "$d"
  copy_into "s$mode"
  "$BIN" --dir "$d" stats >"$WORK/stats-$mode.json"
  stop_server "s$mode"
done

python3 - "$WORK" "$BYTES" "$DATA" <<'PY' | tee "$WORK/summary.md"
import hashlib, json, os, sys
work, size, data = sys.argv[1:]
status = json.load(open(os.path.join(work, "status.json")))
vols = {p["name"][1:]: p["volumes"][0] for p in status["pools"]}
print(f"{size} of `{os.path.basename(data)}`, RS(4,2) rmw, 64 KiB stripe unit, 4 KiB dedup blocks\n")
print("| dedup | where | layers | blocks mapped | slots used | mapped / slots | reference writes (parity) |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for mode in ("none", "parity", "all"):
    d = vols[mode].get("dedup")
    if d:
        print(f"| {mode} | cluster, at the chunk servers | {d['chunks']} | {d['mapped_blocks']:,} | "
              f"{d['slots_used']:,} | {d['mapped_blocks'] / max(d['slots_used'], 1):.3f} | "
              f"{d['reference_writes']:,} ({d['reference_parity_writes']:,}) |")
    else:
        print(f"| {mode} | cluster, at the chunk servers | 0 | - | - | - | - |")
    st = json.load(open(os.path.join(work, f"stats-{mode}.json")))
    layers = [x for x in (st.get("dedup") or []) if x]
    if layers:
        m = sum(x["mapped_blocks"] for x in layers)
        sl = sum(x["slots_used"] for x in layers)
        refs = sum(x["reference_writes"] for x in layers)
        prefs = sum(x["reference_parity_writes"] for x in layers)
        print(f"| {mode} | single machine | {len(layers)} | {m:,} | {sl:,} | {m / max(sl, 1):.3f} | {refs:,} ({prefs:,}) |")
    else:
        print(f"| {mode} | single machine | 0 | - | - | - | - |")

# What the data holds: 4 KiB blocks that repeat an earlier block anywhere,
# and on the same device if each 64 KiB unit went to device `unit mod 4`
# (the data devices of RS(4,2) without parity's rotation): what a dedup
# over the whole volume could find, against one per device.
seen, per_device = set(), [set() for _ in range(4)]
blocks = anywhere = same_device = 0
with open(os.path.join(work, "data.bin"), "rb") as f:
    while block := f.read(4096):
        h = hashlib.blake2b(block, digest_size=16).digest()
        device = per_device[(blocks // 16) % 4]
        anywhere += h in seen
        same_device += h in device
        seen.add(h)
        device.add(h)
        blocks += 1
print(f"\n{blocks:,} data blocks of 4 KiB: {anywhere:,} ({anywhere / blocks:.1%}) repeat an "
      f"earlier block anywhere, {same_device:,} ({same_device / blocks:.1%}) one on the same "
      f"device (unit mod 4)")
PY
