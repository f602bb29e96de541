#!/usr/bin/env bash
# The power-loss model tests (crates/ecdedup/tests/powerloss.rs) at scale.
#   scripts/powerloss.sh            as CI runs them (70 schedules x 8 cuts per write policy)
#   scripts/powerloss.sh --long     3,200 schedules per policy: 102,400 power cuts
#   SCHEDULES=N scripts/powerloss.sh
# Prints one line per configuration: schedules, power cuts, unsynced writes
# at the cuts and device failures; any wrong or unreadable block fails the
# run. The figures in docs/benchmarks.md come from here.
set -euo pipefail
cd "$(dirname "$0")/.."
schedules="${SCHEDULES:-70}"
if [ "${1:-}" = "--long" ]; then
  schedules=3200
fi
export ECDEDUP_POWERLOSS_SCHEDULES="$schedules"
cargo test --release -p ecdedup --test powerloss -- --test-threads="$(nproc)" --nocapture 2>&1 \
  | tee /dev/stderr | grep -E '^powerloss:|^test result'
