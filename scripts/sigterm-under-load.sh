#!/usr/bin/env bash
# SIGTERM to `serve` under a write load (issue 18, item 5): a fresh 256 MiB
# RS(4,2) array per try, fio 64 KiB random writes at QD16 over NBD for up to
# 60 s, SIGTERM after 3 s. One line per try: the server's exit status, how
# long it took to exit, the dirty intent regions left, whether nbdkit hit
# its `sock >= 0` assertion.
#
#   scripts/sigterm-under-load.sh [TRIES]
#   PLUGIN=/path/to/old/libecdedup_nbdkit.so scripts/sigterm-under-load.sh 15
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$REPO/target/debug/ecdedup}
PLUGIN=${PLUGIN:-$(dirname "$BIN")/libecdedup_nbdkit.so}
TRIES=${1:-5}
[ -x "$BIN" ] || { echo "no $BIN: cargo build --workspace (or set BIN)" >&2; exit 2; }
WORK=$(mktemp -d /tmp/sigterm-under-load.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
aborts=0
for i in $(seq 1 "$TRIES"); do
  D=$WORK/$i
  mkdir -p "$D"
  "$BIN" --dir "$D/arr" create --devices 6 -k 4 -m 2 --size 256M --sparse >/dev/null
  S=$D/nbd.sock
  "$BIN" --dir "$D/arr" serve --socket "$S" --plugin "$PLUGIN" >"$D/server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 600); do
    nbdinfo --size "nbd+unix:///?socket=$S" >/dev/null 2>&1 && break
    sleep 0.1
  done
  fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$S" --rw=randwrite --bs=64k \
    --iodepth=16 --size=256M --runtime=60 --time_based --verify_state_save=0 >"$D/fio.log" 2>&1 &
  load=$!
  sleep 3
  kill -TERM "$server"
  t0=$(date +%s.%N)
  wait "$server"
  rc=$?
  t1=$(date +%s.%N)
  wait "$load"
  dirty=$("$BIN" --dir "$D/arr" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["dirty_regions"])')
  asserted=$(grep -c 'Assertion' "$D/server.log")
  [ "$rc" -eq 0 ] || aborts=$((aborts + 1))
  printf 'try %d: exit %d after %.2f s, %s dirty regions, assertion: %s\n' \
    "$i" "$rc" "$(echo "$t1 - $t0" | bc)" "$dirty" "$asserted"
done
echo "unclean stops: $aborts of $TRIES"
