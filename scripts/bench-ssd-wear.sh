#!/usr/bin/env bash
# Whole-array flash wear on simulated SSDs (create --ssd-sim, docs/ssd.md
# "An array on simulated SSDs"): per mode, a fresh 256 MiB RS(4,2) array with
# 7% over-provisioning, served, written twice over with fio 4 KiB random
# writes (half duplicate blocks, a flush every 256 writes), then `stats`;
# prints the summed wear counters per mode as a markdown table.
#
# The figures are modelled counts, not timings: they do not depend on the
# machine's load (they vary by about 1% with the order in which concurrent
# requests reach the FTL).
#
# Usage: scripts/bench-ssd-wear.sh [MODE...]   (default: plain inline offline separated)
# Environment: ECDEDUP_BIN (default target/release/ecdedup, built unless
# NO_BUILD=1), SIZE (256M), WORK (a fresh temp folder), FIO_EXTRA
# (default "--dedupe_percentage=50 --fsync=256").
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
MODES=${*:-plain inline offline separated}
SIZE=${SIZE:-256M}
FIO_EXTRA=${FIO_EXTRA:---dedupe_percentage=50 --fsync=256}
if [ -z "${ECDEDUP_BIN:-}" ]; then
  [ "${NO_BUILD:-0}" = 1 ] || (cd "$repo" && cargo build --release --workspace >&2)
  ECDEDUP_BIN=$repo/target/release/ecdedup
fi
for t in fio nbdinfo python3; do command -v "$t" >/dev/null || { echo "$t is missing (scripts/install-deps.sh)" >&2; exit 1; }; done
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/ecdedup-ssd-wear.XXXXXX")}
mkdir -p "$WORK/bin"
cp "$ECDEDUP_BIN" "$(dirname "$ECDEDUP_BIN")/libecdedup_nbdkit.so" "$WORK/bin/"
B=$WORK/bin/ecdedup
PID=""
trap '[ -n "$PID" ] && kill -TERM "$PID" 2>/dev/null; wait 2>/dev/null || true' EXIT
for mode in $MODES; do
  D=$WORK/arr-$mode S=$WORK/$mode.sock
  "$B" --dir "$D" create --size "$SIZE" --ssd-sim "$mode" --ssd-op 7 >&2
  "$B" --dir "$D" serve --socket "$S" --threads 8 >"$WORK/serve-$mode.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 600); do
    [ -S "$S" ] && nbdinfo --size "nbd+unix:///?socket=$S" >/dev/null 2>&1 && break
    sleep 0.2
  done
  for seed in 1 2; do
    # shellcheck disable=SC2086
    fio --verify_state_save=0 --name="pass$seed" --ioengine=nbd --uri="nbd+unix:///?socket=$S" \
      --thread --rw=randwrite --bs=4k --size="$SIZE" --iodepth=8 --randseed="$seed" $FIO_EXTRA \
      --output="$WORK/fio-$mode-$seed.txt" >&2
  done
  "$B" --dir "$D" stats >"$WORK/stats-$mode.json"
  kill -TERM "$PID"; wait "$PID" || true; PID=""
  echo "[bench-ssd-wear] $mode done" >&2
done
python3 - "$WORK" $MODES <<'PY'
import json, sys
work, modes = sys.argv[1], sys.argv[2:]
print("| mode | host page writes | NAND programs | GC copies | erases | WA per device | erase count min/max |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for m in modes:
    ssd = json.load(open(f"{work}/stats-{m}.json"))["ssd"]
    tot = lambda k: sum(d[k] for d in ssd)
    wa = [d["write_amplification"] for d in ssd]
    print(f"| {m} | {tot('host_page_writes'):,} | {tot('nand_page_programs'):,} | {tot('gc_page_copies'):,} | "
          f"{tot('block_erases'):,} | {min(wa):.2f}–{max(wa):.2f} | {min(d['erase_count_min'] for d in ssd)}/{max(d['erase_count_max'] for d in ssd)} |")
PY
