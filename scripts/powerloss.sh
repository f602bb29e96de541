#!/usr/bin/env bash
# The power-loss model tests at scale: the array's (crates/ecdedup/tests/powerloss.rs)
# and the archive tier's (crates/ecdedup/tests/archive_powerloss.rs).
#   scripts/powerloss.sh            as CI runs them (array: 40 schedules x 8 cuts per write
#                                   policy without dedup, 16 under each of 4 dedup modes:
#                                   3,328 cuts; archive: 200 schedules x 8 cuts: 1,600 cuts)
#   scripts/powerloss.sh --long     array: 640 schedules per configuration (4 write policies x
#                                   5 dedup modes): 102,400 power cuts; archive: 12,500
#                                   schedules: 100,000 power cuts
#   scripts/powerloss.sh --archive [--long]   the archive tier's test alone
#   SCHEDULES=N scripts/powerloss.sh  N schedules per array configuration: 160 N cuts
#   ARCHIVE_SCHEDULES=N scripts/powerloss.sh  N archive schedules: 8 N cuts
# Prints one line per array configuration (write policy, dedup mode, verify):
# schedules, power cuts, unsynced writes at the cuts, device failures, map
# records the dedup layers refused at reopen, and failures (wrong blocks,
# unreadable blocks, scrub findings), and one line for the archive (cuts,
# those inside a call, what the interrupted calls left, the leftovers scrub
# found and reclaimed); the figures in docs/benchmarks.md ("Power loss",
# "Archive power loss") come from here.
set -euo pipefail
cd "$(dirname "$0")/.."
# Both files' tests are modules of the `it` test binary (crates/ecdedup/tests/it.rs);
# a filter is a substring of a test's name: `powerloss::` picks both files' tests.
filter=powerloss::
if [ "${1:-}" = "--archive" ]; then
  filter=archive_powerloss::
  shift
fi
if [ "${1:-}" = "--long" ]; then
  export ECDEDUP_POWERLOSS_SCHEDULES=640
  export ECDEDUP_ARCHIVE_POWERLOSS_SCHEDULES=12500
fi
if [ -n "${SCHEDULES:-}" ]; then
  export ECDEDUP_POWERLOSS_SCHEDULES="$SCHEDULES"
fi
if [ -n "${ARCHIVE_SCHEDULES:-}" ]; then
  export ECDEDUP_ARCHIVE_POWERLOSS_SCHEDULES="$ARCHIVE_SCHEDULES"
fi
cargo test --release -p ecdedup --test it -- "$filter" --test-threads="$(nproc)" --nocapture 2>&1 \
  | tee /dev/stderr | grep -E '^powerloss:|^archive powerloss:|^test result'
