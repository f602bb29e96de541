#!/usr/bin/env bash
# Fuzzes the parsers of on-disk input (fuzz/, cargo-fuzz + libFuzzer), one
# target after another, and prints one line of figures per target:
#
#   scripts/fuzz.sh                     # every target, 20 s each (what CI runs)
#   scripts/fuzz.sh --seconds 60        # every target, 60 s each
#   scripts/fuzz.sh --runs 1000000 trace superblock   # 10^6 executions each
#
# Needs a nightly toolchain (`rustup toolchain install nightly`) and
# cargo-fuzz (`cargo install cargo-fuzz`); exits 3 without them, so that
# scripts/test.sh can report the step as skipped. The working corpus grows
# in fuzz/corpus/TARGET (not in git); the committed seeds
# (fuzz/seeds/TARGET) are read as a second corpus. A crash leaves its
# input in fuzz/artifacts/TARGET and fails the script; copy the input to
# fuzz/regressions/TARGET once the parser is fixed (the stable test
# tests/fuzz_corpus.rs replays that folder).
#
# Built optimised (-O) with debug assertions (-a), so arithmetic overflow
# and `debug_assert!` fail a run as a panic does, and with AddressSanitizer
# (cargo-fuzz's default).
#
# Environment: FUZZ_JOBS parallel fuzzing processes per target (default 1).
set -uo pipefail
cd "$(dirname "$0")/.."

TARGETS=(superblock meta_area intent_map parity_journal degraded_log config dedup_log dedup_snapshot trace archive_map frame poison_list)
# Inputs may be larger than libFuzzer's 4 KiB default where a record's
# payload is a 4 KiB block (journal) or a slot is 4 KiB (superblock pairs).
declare -A MAX_LEN=([superblock]=8192 [meta_area]=69632 [intent_map]=8192 [parity_journal]=20480)

seconds=20
runs=""
chosen=()
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    -h|--help) sed -n 2,24p "$0"; exit 0 ;;
    *) chosen+=("$1"); shift ;;
  esac
done
[ ${#chosen[@]} -eq 0 ] && chosen=("${TARGETS[@]}")

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: no nightly toolchain (rustup toolchain install nightly)" >&2
  exit 3
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz: cargo-fuzz is not installed (cargo install cargo-fuzz)" >&2
  exit 3
fi

cargo +nightly fuzz build -O -a || exit 1

failed=0
printf '%-16s %12s %10s %8s %10s  %s\n' target executions exec/s seconds corpus result
for t in "${chosen[@]}"; do
  mkdir -p "fuzz/corpus/$t"
  log=$(mktemp)
  limit=(-max_total_time="$seconds")
  [ -n "$runs" ] && limit=(-runs="$runs")
  jobs=()
  [ "${FUZZ_JOBS:-1}" -gt 1 ] && jobs=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS")
  t0=$SECONDS
  cargo +nightly fuzz run -O -a "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
    "${limit[@]}" -max_len="${MAX_LEN[$t]:-4096}" -rss_limit_mb=2048 \
    "${jobs[@]}" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | awk '{s+=$2} END {print s+0}')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | awk '{s+=$2} END {print s+0}')
  corpus=$(find "fuzz/corpus/$t" -type f | wc -l)
  result=ok
  if [ $rc -ne 0 ]; then
    result="CRASH (exit $rc): see fuzz/artifacts/$t and the log below"
    failed=1
  fi
  printf '%-16s %12s %10s %8s %10s  %s\n' "$t" "$execs" "$rate" $((SECONDS - t0)) "$corpus" "$result"
  if [ $rc -ne 0 ]; then
    grep -v '^#' "$log" | tail -n 40
  fi
  rm -f "$log"
done
exit $failed
