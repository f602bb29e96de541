#!/usr/bin/env bash
# Peak disk use of each module of the `it` test binary, run alone: the
# file system's used space sampled every 0.5 s while the module runs,
# minus what it was at the start (MB). Usage, from the repository root
# after `cargo build --workspace && cargo test -p ecdedup --test it --no-run`:
#   scripts/disk-peak.sh crash fio model ...
# (docs/benchmarks.md, "Stop 38 did not land: CI ran out of disk").
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(cargo test -q -p ecdedup --test it --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -x "$bin" ] || { echo "disk-peak: no it test binary (build it first)" >&2; exit 1; }
export PATH="$PWD/target/debug:$PATH"
cd crates/ecdedup
for m in "$@"; do
  base=$(df -B1M --output=used . | tail -n 1)
  "$bin" --test-threads=2 "$m::" >/dev/null 2>&1 &
  pid=$!
  peak=0
  while kill -0 "$pid" 2>/dev/null; do
    used=$(df -B1M --output=used . | tail -n 1)
    [ $((used - base)) -gt "$peak" ] && peak=$((used - base))
    sleep 0.5
  done
  wait "$pid"
  echo "$m peak_mb=$peak rc=$?"
done
