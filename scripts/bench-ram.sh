#!/usr/bin/env bash
# RAM per stored byte: peak resident memory (VmHWM) of the server over a
# large sparse array, per dedup policy, and how long it takes to open.
#
# Per case (POLICY:DEVICE_BYTES, e.g. none:1T): a fresh RS(4,2) array of 6
# sparse device files of DEVICE_BYTES each (volume 4 x DEVICE_BYTES, 32 KiB
# stripe unit, --checksum-cache CHECKSUM_CACHE when set), served over NBD;
# then
# 1. a sequential 1 MiB write of the first 256 MiB (fio, QD 8);
# 2. SCATTER_MB MiB of random 4 KiB writes over the whole volume (fio, QD 8):
#    each touches checksum-table pages far apart;
#    fio then reads every one of them back and verifies it (--verify);
# 3. VmHWM of the server process (nbdkit with the plugin loaded) and
#    `ecdedup stats` (checksum_table_bytes, the dedup layers' RAM).
# open_s is from `serve` to its socket being ready (the tables and the dedup
# state are loaded then). Files live under BENCH_TMP (sparse: a few hundred
# MiB of real space per case) and are removed after each case.
#
# Environment (defaults in brackets):
#   CASES ["none:1T parity:64G parity:128G all:64G"]
#   SCATTER_MB [64]   CHECKSUM_CACHE [unset: the default, 64M]
#   THREADS [16] nbdkit worker threads
#   ECDEDUP_BIN, NO_BUILD=1, BENCH_TMP [$TMPDIR or /tmp], KEEP=1 as in
#   bench-nbd.sh
#
# Output: progress on stderr, a markdown table on stdout (also
# WORK/summary.md). Every server started here is stopped by its PID.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
BENCH_NAME=bench-ram
CASES=${CASES:-"none:1T parity:64G parity:128G all:64G"}
SCATTER_MB=${SCATTER_MB:-64}
THREADS=${THREADS:-16}
BENCH_TMP=${BENCH_TMP:-${TMPDIR:-/tmp}}
# shellcheck source=scripts/bench-lib.sh
. "$repo/scripts/bench-lib.sh"

command -v fio >/dev/null || die "fio is not installed (scripts/install-deps.sh)"
bench_find_bin "$repo"
bench_make_work bench-ram
log "work folder $WORK; CASES=$CASES SCATTER_MB=$SCATTER_MB"
echo "case,policy,device_bytes,open_s,peak_rss_kib,checksum_table_bytes,dedup_bytes" >"$WORK/results.csv"

bytes_of() { numfmt --from=iec "$1"; }

for c in $CASES; do
  policy=${c%%:*}; dev=${c#*:}
  d=$WORK/$policy-$dev
  volume=$(( $(bytes_of "$dev") * 4 ))
  args=(--devices 6 -k 4 -m 2 --stripe-unit 32K --size "$volume" --sparse --dedup "$policy")
  [ -n "${CHECKSUM_CACHE:-}" ] && args+=(--checksum-cache "$CHECKSUM_CACHE")
  log "$c: create (volume $volume bytes)"
  "$BIN" --dir "$d" create "${args[@]}" >&2
  t0=$(date +%s.%N)
  serve_ecdedup s "$d"
  t1=$(date +%s.%N)
  u=$(uri s)
  log "$c: served after $(echo "$t1 - $t0" | bc) s; writing"
  fio --name=seq --ioengine=nbd --uri="$u" --rw=write --bs=1M --iodepth=8 \
    --size=256M --output="$WORK/$policy-$dev.seq.txt" >/dev/null
  common=(--ioengine=nbd --uri="$u" --bs=4k --iodepth=8 --size="$volume"
    --io_size="${SCATTER_MB}M" --randseed=11)
  fio --name=scatter --rw=randwrite --verify=crc32c --verify_state_save=0 "${common[@]}" \
    --output="$WORK/$policy-$dev.w.txt" >/dev/null
  stats_snapshot s "$WORK/$policy-$dev.stats.json"
  record_peak_rss "$WORK/$policy-$dev.rss.csv"
  stop_server s
  python3 - "$WORK/results.csv" "$c" "$policy" "$(bytes_of "$dev")" "$(echo "$t1 - $t0" | bc)" \
    "$WORK/$policy-$dev.rss.csv" "$WORK/$policy-$dev.stats.json" <<'PY'
import csv, json, sys
out, case, policy, dev, open_s, rss_csv, stats_json = sys.argv[1:]
rss = [r for r in csv.DictReader(open(rss_csv)) if r["server"] == "s"][0]["peak_rss_kib"]
s = json.load(open(stats_json))
dedup = sum(l["index_bytes"] + l.get("slot_entry_bytes", 0) + l["map_bytes"]
            for l in s.get("dedup", []) if l)
with open(out, "a") as f:
    f.write(f"{case},{policy},{dev},{float(open_s):.2f},{rss},{s['checksum_table_bytes']},{dedup}\n")
PY
  rm -f "$d"/dev? "$d"/journal/*.jrnl
  [ "${KEEP:-0}" = 1 ] || rm -rf "$d"
done

python3 - "$WORK/results.csv" <<'PY' | tee "$WORK/summary.md"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("| dedup | devices | raw capacity | open | peak RSS | RSS per TiB raw | checksum tables | dedup layers |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    dev = int(r["device_bytes"]); raw = 6 * dev
    rss = int(r["peak_rss_kib"]) * 1024
    print(f"| {r['policy']} | 6 x {dev / 2**30:.0f} GiB | {raw / 2**40:.3g} TiB | {r['open_s']} s "
          f"| {rss / 2**20:.0f} MiB | {rss / 2**20 / (raw / 2**40):.0f} MiB "
          f"| {int(r['checksum_table_bytes']) / 2**20:.1f} MiB | {int(r['dedup_bytes']) / 2**20:.0f} MiB |")
PY
