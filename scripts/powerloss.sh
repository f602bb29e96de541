#!/usr/bin/env bash
# The power-loss model tests (crates/ecdedup/tests/powerloss.rs) at scale.
#   scripts/powerloss.sh            as CI runs them (40 schedules x 8 cuts per write policy
#                                   without dedup, 16 under each of 4 dedup modes: 3,328 cuts)
#   scripts/powerloss.sh --long     640 schedules per configuration (4 write policies x
#                                   5 dedup modes): 102,400 power cuts
#   SCHEDULES=N scripts/powerloss.sh  N schedules per configuration: 160 N cuts
# Prints one line per configuration (write policy, dedup mode, verify):
# schedules, power cuts, unsynced writes at the cuts, device failures, map
# records the dedup layers refused at reopen, and failures (wrong blocks,
# unreadable blocks, scrub findings); the figures in docs/benchmarks.md
# ("Power loss") come from here.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--long" ]; then
  export ECDEDUP_POWERLOSS_SCHEDULES=640
elif [ -n "${SCHEDULES:-}" ]; then
  export ECDEDUP_POWERLOSS_SCHEDULES="$SCHEDULES"
fi
cargo test --release -p ecdedup --test powerloss -- --test-threads="$(nproc)" --nocapture 2>&1 \
  | tee /dev/stderr | grep -E '^powerloss:|^test result'
