#!/usr/bin/env bash
# Every check CI runs: formatting, build, lints, then the unit and
# integration tests. Run from anywhere; installs the system packages first
# (scripts/install-deps.sh, idempotent: a no-op when all are there). The integration tests (crates/ecdedup/tests/)
# start nbdkit servers, fio, qemu-img, nbdcopy, and mount ext4 through
# nbdfuse and a loop device, so they need root, /dev/fuse and loop devices.
#
# Every step runs even when an earlier one failed (a formatting slip should
# not hide a test failure), except that the tests need a build. A summary
# at the end lists each step; the exit status is non-zero if any failed.
#
# Beside the tests, the cluster fault suite's short version
# (scripts/cluster-faults.sh --short: real processes in network
# namespaces; SKIPPED, loudly, where no namespace can be made).
#
# Last, a short fuzzing run (scripts/fuzz.sh, FUZZ_SECONDS per target) when
# a nightly toolchain and cargo-fuzz are installed; without them the step is
# reported as SKIPPED (not ok). The committed fuzz seeds and crash inputs
# are replayed on stable by the tests either way (tests/fuzz_corpus.rs).
#
# Usage: scripts/test.sh [--long]
#   --long   the long schedules as well (not run by CI):
#            every crash point of the archive crash test
#            (ECDEDUP_ARCHIVE_CRASH_STRIDE=1), 100 SIGKILL rounds of the
#            crash test (CI: 12), 40 power-loss schedules per
#            configuration (CI: 8 with dedup), and 100,000 seeds of the
#            cluster simulator (CI: 2,000, plus its regression seeds;
#            about 22 minutes on a quiet 2-core machine),
#            400 double-fault power-loss schedules per policy (CI: 24);
#            docs/benchmarks.md says
#            what the long runs found
#
# Environment:
#   TEST_THREADS              parallel tests per test binary (default 2)
#   TEST_JOBS                 test binaries run side by side (default 3)
#   ECDEDUP_ARCHIVE_CRASH_STRIDE  every how many crash points the archive
#                             crash test tries (default 3; 1 with --long)
#   ECDEDUP_CRASH_ITERATIONS  SIGKILL iterations of the crash test (default 12)
#   FUZZ_SECONDS              fuzzing time per target (default 20)
set -uo pipefail
cd "$(dirname "$0")/.."

for arg in "$@"; do
  case "$arg" in
    --long)
      export ECDEDUP_ARCHIVE_CRASH_STRIDE="${ECDEDUP_ARCHIVE_CRASH_STRIDE:-1}"
      export ECDEDUP_CRASH_ITERATIONS="${ECDEDUP_CRASH_ITERATIONS:-100}"
      export ECDEDUP_POWERLOSS_SCHEDULES="${ECDEDUP_POWERLOSS_SCHEDULES:-40}"
      export ECDEDUP_SIM_SEEDS="${ECDEDUP_SIM_SEEDS:-100000}"
      # Every core for the simulator's seeds (it runs at most 4 at once
      # otherwise: a lent 16-core machine ran at a quarter of its rate).
      export ECDEDUP_SIM_WORKERS="${ECDEDUP_SIM_WORKERS:-$(nproc)}"
      export ECDEDUP_DOUBLE_FAULT_SCHEDULES="${ECDEDUP_DOUBLE_FAULT_SCHEDULES:-400}"
      ;;
    *)
      echo "usage: scripts/test.sh [--long]" >&2
      exit 2
      ;;
  esac
done

export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# CI builds a clean clone once: the incremental cache (the dev profile's
# default for the workspace's crates) is only written there, never read.
if [ -n "${CI:-}" ]; then
  export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
fi
TEST_THREADS="${TEST_THREADS:-2}"
TEST_JOBS="${TEST_JOBS:-3}"

started=$SECONDS
summary=()
failed=0
skipped=0

# skip_step NAME WHY: records a step that could not run, loudly.
skip_step() {
  echo
  echo "SKIPPED: $1 ($2)"
  summary+=("SKIPPED        $1 ($2)")
  skipped=$((skipped + 1))
}

# cpu_seconds: sets $cpu to the CPU time (user + system) of the child
# processes this shell has waited for so far, in whole seconds (bash's
# `times`, run in this shell: a subshell counts only its own children).
cpu_times=$(mktemp)
cpu=0
cpu_seconds() {
  times >"$cpu_times"
  cpu=$(awk 'NR == 2 {
    t = 0
    for (i = 1; i <= 2; i++) { split($i, p, /[ms]/); t += p[1] * 60 + p[2] }
    printf "%d\n", t
  }' "$cpu_times")
}

# run_step NAME COMMAND...: runs, times and records one step (its wall
# time, and the CPU time of its processes: on a shared machine the
# comparable figure).
run_step() {
  local name=$1
  shift
  local t0=$SECONDS c0 c1
  cpu_seconds
  c0=$cpu
  echo
  echo "==> $name"
  echo "    \$ $*"
  if "$@"; then
    cpu_seconds
    c1=$cpu
    summary+=("ok      $(printf '%5d' $((SECONDS - t0))) s  $(printf '%5d' $((c1 - c0))) s CPU  $name")
    return 0
  else
    local rc=$?
    cpu_seconds
    c1=$cpu
    summary+=("FAILED  $(printf '%5d' $((SECONDS - t0))) s  $(printf '%5d' $((c1 - c0))) s CPU  $name (exit $rc)")
    failed=1
    return $rc
  fi
}

echo "==> system packages (scripts/install-deps.sh)"
bash scripts/install-deps.sh

echo "==> environment"
rustc --version
cargo --version
for t in nbdkit fio qemu-img nbdinfo nbdcopy nbdfuse mkfs.ext4; do
  if command -v "$t" >/dev/null 2>&1; then
    printf '    %-10s %s\n' "$t" "$("$t" --version 2>&1 | head -n 1)"
  else
    printf '    %-10s MISSING (run scripts/install-deps.sh)\n' "$t"
  fi
done
echo "    nproc: $(nproc)  uid: $(id -u)  CI: ${CI:-unset}"
# Free space where the build and the tests write: a full disk fails a
# test at random (an array's create, ENOSPC), and this line says why.
df -h . "${TMPDIR:-/tmp}" 2>/dev/null | sed 's/^/    /'
if [ "$(id -u)" -ne 0 ]; then
  echo "warning: not root; the file-system tests (losetup, mount) will fail" >&2
fi

run_step "format" cargo fmt --all -- --check
# The tests: every test binary of the workspace (unit and integration),
# TEST_JOBS jobs at a time. A job is one test binary, or one module (one
# file of tests/) of a binary named in SPLIT_BY_MODULE: those binaries
# merge a package's integration-test files so that they compile and link
# once, and each file's tests still run in their own process, as before.
# Most integration tests wait on fio, nbdkit, syncs and child processes
# rather than on the CPU, so two or three jobs side by side fill the 2
# cores that one leaves half idle. Each job runs from its package's
# folder, as `cargo test` runs it, with --test-threads=TEST_THREADS; its
# output is kept whole and printed when it ends (in $test_log too, for the
# per-file times). The slowest jobs start first so that none is left
# running alone at the end.
test_log=$(mktemp)
test_dir=$(mktemp -d)
# Steps run beside the tests (start_beside, below): stopped with their
# children (the fault suite's trap then stops what it started) on any exit.
declare -A beside_pid=()
trap 'for p in "${beside_pid[@]}"; do pkill -TERM -P "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$test_log" "$test_dir" "$cpu_times"' EXIT
SLOW_FIRST="cluster fio_policies fio model ecdedup_core crash fio_dedup powerloss loopback operations archive_crash eval_codeplugin sim"
SPLIT_BY_MODULE="crates/ecdedup/tests/it.rs"

# test_binaries: "EXECUTABLE PACKAGE_DIR LABEL" per test binary, compiled by
# `cargo test --no-run` (with the build's profile, so the libraries, the
# `ecdedup` binary and the plugin are shared with the build step).
test_binaries() {
  cargo test --workspace --no-run --message-format=json-render-diagnostics |
    grep '"reason":"compiler-artifact"' | grep -E '"profile":\{[^}]*"test":true' |
    grep '"executable":"/' |
    sed -E 's/.*"manifest_path":"([^"]*)\/Cargo\.toml".*"src_path":"([^"]*)".*"executable":"([^"]*)".*/\3 \1 \2/' |
    while read -r exe pkg src; do
      echo "$exe $pkg ${src#"$PWD/"}"
    done
}

# test_jobs: "KEY EXECUTABLE PACKAGE_DIR LABEL NAMES" per job, from
# test_binaries' lines. KEY is the binary's name (less cargo's hash) or,
# for a binary in SPLIT_BY_MODULE, the module's; NAMES is "-" (every test
# of the binary) or a file of the module's test names, which the job runs
# with --exact. Every test the binary lists (`--list`) is in exactly one
# job; tests outside any module make a job of their own.
test_jobs() {
  local exe pkg src base names
  while read -r exe pkg src; do
    base=${exe##*/}
    base=${base%-*}
    if [[ " $SPLIT_BY_MODULE " != *" $src "* ]]; then
      echo "$base $exe $pkg $src -"
      continue
    fi
    names="$test_dir/names.$base"
    (cd "$pkg" && "$exe" --list --format=terse) >"$names.all" || return 1
    sed -n 's/: test$//p' "$names.all" >"$names"
    if [ ! -s "$names" ]; then
      echo "$src: its binary lists no tests" >&2
      return 1
    fi
    awk -F'::' -v base="$base" -v exe="$exe" -v pkg="$pkg" -v src="$src" -v out="$names" '
      {
        m = NF > 1 ? $1 : base
        print > (out "." m)
        if (!(m in seen)) { seen[m] = 1; order[++n] = m }
      }
      END {
        dir = src; sub(/[^\/]*$/, "", dir)
        for (i = 1; i <= n; i++) {
          m = order[i]
          print m, exe, pkg, (m == base ? src : dir m ".rs"), out "." m
        }
      }' "$names"
  done
}

run_tests() {
  local binaries="$test_dir/binaries" list="$test_dir/jobs" order="$test_dir/order" name
  test_binaries >"$binaries" || return 1
  if [ ! -s "$binaries" ]; then
    echo "no test binaries found" >&2
    return 1
  fi
  test_jobs <"$binaries" >"$list" || return 1
  # Order: the known slow ones first, then the rest as cargo listed them.
  : >"$order"
  for name in $SLOW_FIRST; do
    awk -v n="$name" '$1 == n' "$list" >>"$order"
  done
  awk 'NR == FNR { seen[$0] = 1; next } !($0 in seen)' "$order" "$list" >>"$order"
  echo "$(wc -l <"$binaries") test binaries, $(wc -l <"$order") jobs, $TEST_JOBS at a time, --test-threads=$TEST_THREADS"
  # The test binaries are listed (cargo's lock is free again): clippy
  # may start beside them, and the fault suite's short version.
  start_clippy_beside
  start_faults_beside

  local i=0 running=0 failed_bins=()
  local -A label_of=()
  local -A log_of=()
  # finish PID STATUS: prints a finished binary's output, records a failure.
  finish() {
    local log=${log_of[$1]}
    { echo "     Running ${label_of[$1]}"; cat "$log"; } | tee -a "$test_log"
    [ "$2" -eq 0 ] || failed_bins+=("${label_of[$1]} (exit $2)")
  }
  local pid status
  local key names filter
  while read -r key exe pkg src names; do
    i=$((i + 1))
    local log="$test_dir/$i.log"
    filter=()
    if [ "$names" != - ]; then
      mapfile -t filter <"$names"
      filter=(--exact "${filter[@]}")
    fi
    (cd "$pkg" && exec "$exe" --test-threads="$TEST_THREADS" "${filter[@]}") >"$log" 2>&1 &
    pid=$!
    if [ "$names" = - ]; then
      label_of[$pid]="$src ($exe)"
    else
      label_of[$pid]="$src ($exe, $((${#filter[@]} - 1)) tests: module $key)"
    fi
    log_of[$pid]=$log
    running=$((running + 1))
    if [ "$running" -ge "$TEST_JOBS" ]; then
      status=0
      wait -n -p pid "${!log_of[@]}" || status=$?
      finish "$pid" "$status"
      unset "log_of[$pid]"
      running=$((running - 1))
    fi
  done <"$order"
  while [ "$running" -gt 0 ]; do
    status=0
    wait -n -p pid "${!log_of[@]}" || status=$?
    finish "$pid" "$status"
    unset "log_of[$pid]"
    running=$((running - 1))
  done
  # The doc tests last (rustdoc compiles them: CPU, no waiting).
  status=0
  cargo test --workspace --doc >"$test_dir/doc.log" 2>&1 || status=$?
  tee -a "$test_log" <"$test_dir/doc.log"
  [ "$status" -eq 0 ] || failed_bins+=("doc-tests (exit $status)")
  if [ "${#failed_bins[@]}" -ne 0 ]; then
    echo
    echo "failed test binaries:"
    printf '    %s\n' "${failed_bins[@]}"
    return 1
  fi
}

# per_file_times: each test binary's time (libtest's "finished in"), the
# slowest first: where CI's time goes (with TEST_JOBS > 1, wall time
# shared with the binaries beside it).
per_file_times() {
  awk '
    /^ *Running / { name = $2 }
    /^ *Doc-tests / { name = "doc-tests " $2 }
    /^test result: / {
      for (i = 1; i < NF; i++) if ($i == "in") { t = $(i + 1); sub(/s$/, "", t) }
      printf "%8.1f s  %s\n", t, name
    }' "$test_log" | sort -rn | head -n 25
}

# The integration tests serve target/debug/libecdedup_nbdkit.so, which
# `cargo test` does not build: build the workspace first, with what
# `cargo test` builds (--tests --examples): with the dev-dependencies'
# features, rand_core, getrandom, uuid and io-uring build differently, so
# after a plain `cargo build` the tests compiled every workspace crate
# again. The dev and test profiles are the same
# (Cargo.toml), so the test step then compiles nothing, and clippy after
# the build reuses its build scripts and proc macros.
#
# Clippy runs beside the tests, at a lower priority: most integration
# tests wait on fio, nbdkit and syncs, and leave about a third of the 2
# cores idle (527 CPU s in 350 s of wall time, 2026-11-26), which clippy's
# 170 CPU s fill instead of adding its 90 s of wall time after the build.
# It starts once the tests' binaries are listed (`cargo test --no-run`
# and clippy take the same lock on target/), its output is printed whole
# when it ends, and the tests wait only on their own processes.
CLIPPY=(cargo clippy --workspace --all-targets -- -D warnings)
# start_beside KEY COMMAND...: runs COMMAND in the background, its output
# in $test_dir/KEY.log, in a subshell that records the command's own end
# and CPU time (bash reaps a background child when it exits, so the
# tests' step's CPU figure counts it too). finish_beside KEY NAME waits
# for it and records it as a step of its own, printing its output whole.
declare -A beside_t0=() beside_cmd=()
start_beside() {
  local key=$1 log="$test_dir/$1.log"
  shift
  [ -z "${beside_pid[$key]:-}" ] || return 0
  beside_t0[$key]=$SECONDS
  beside_cmd[$key]="$*"
  (
    rc=0
    "$@" >"$log" 2>&1 || rc=$?
    cpu_times="$log.times"
    cpu_seconds
    echo "$SECONDS $cpu" >"$log.end"
    echo "$rc" >"$log.rc"
    exit "$rc"
  ) &
  beside_pid[$key]=$!
}
finish_beside() {
  local key=$1 name=$2 log="$test_dir/$1.log" rc=0 c1=0 t1=$SECONDS line
  local pid=${beside_pid[$key]}
  # The exit status comes from the file the subshell writes: the tests'
  # `wait -n` may reap this job first, and bash then forgets it ("wait:
  # pid N is not a child of this shell", exit 127, with every scenario
  # passed: a clean clone's CI, 2026-11-27).
  wait "$pid" 2>/dev/null
  while kill -0 "$pid" 2>/dev/null; do sleep 1; done
  if [ -s "$log.rc" ]; then
    read -r rc <"$log.rc"
  else
    rc=1
    echo "(no exit status recorded: the step was killed)" >>"$log"
  fi
  [ ! -s "$log.end" ] || read -r t1 c1 <"$log.end"
  echo
  echo "==> $name"
  echo "    \$ ${beside_cmd[$key]}"
  cat "$log"
  line="$(printf '%5d' $((t1 - beside_t0[$key]))) s  $(printf '%5d' "$c1") s CPU  $name"
  if [ "$rc" -eq 0 ]; then
    summary+=("ok      $line")
  else
    summary+=("FAILED  $line (exit $rc)")
    failed=1
  fi
}
start_clippy_beside() {
  start_beside clippy nice -n 10 "${CLIPPY[@]}"
}
# The cluster fault suite's short version (scripts/cluster-faults.sh
# --short: real chunk servers, a 3-member etcd and the writer, each in a
# network namespace of its own; a chunk server killed and restarted, the
# etcd leader killed, a split-brain start; fio --verify throughout) also
# runs beside the tests: it waits on its processes (about 40 s of wall
# time and 11 CPU s quiet, 65 s at a load average of 8 to 10: 3 of 3
# passed so, docs/benchmarks.md, "CI time and the long runs"). Where the
# machine cannot make a network namespace or an nftables table (a
# container without CAP_NET_ADMIN) it is SKIPPED, loudly.
faults_skip=""
start_faults_beside() {
  [ -z "${beside_pid[faults]:-}" ] && [ -z "$faults_skip" ] || return 0
  local probe="ecdedup-ci-probe-$$"
  if ! ip netns add "$probe" >/dev/null 2>&1; then
    faults_skip="cannot create a network namespace (ip netns add): needs root and CAP_NET_ADMIN"
    return 0
  fi
  if ! ip netns exec "$probe" nft add table inet ecdprobe >/dev/null 2>&1; then
    ip netns del "$probe" 2>/dev/null
    faults_skip="nft cannot add a table in a network namespace"
    return 0
  fi
  ip netns del "$probe" 2>/dev/null
  start_beside faults env ECDEDUP_BIN="$PWD/target/debug/ecdedup" bash scripts/cluster-faults.sh --short
}
built=0
run_step "build" cargo build --workspace --lib --bins --tests --examples && built=1
if [ "$built" -eq 1 ]; then
  run_step "tests" run_tests
  if [ -n "${beside_pid[clippy]:-}" ]; then
    finish_beside clippy "clippy (beside the tests)"
  else
    run_step "clippy" "${CLIPPY[@]}"
  fi
  if [ -n "$faults_skip" ]; then
    skip_step "cluster fault suite (--short)" "$faults_skip"
  elif [ -n "${beside_pid[faults]:-}" ]; then
    finish_beside faults "cluster fault suite, short (beside the tests)"
  fi
else
  run_step "clippy" "${CLIPPY[@]}"
  skip_step tests "the build failed"
  skip_step "cluster fault suite (--short)" "the build failed"
fi

# cargo-fuzz needs nightly; rustup must not download one here.
if ! RUSTUP_AUTO_INSTALL=0 cargo +nightly --version >/dev/null 2>&1; then
  skip_step fuzz "no nightly toolchain"
elif ! RUSTUP_AUTO_INSTALL=0 cargo +nightly fuzz --version >/dev/null 2>&1; then
  skip_step fuzz "no cargo-fuzz: cargo install cargo-fuzz"
else
  run_step "fuzz (${FUZZ_SECONDS:-20} s per target)" scripts/fuzz.sh --seconds "${FUZZ_SECONDS:-20}"
fi

if [ -s "$test_log" ]; then
  echo
  echo "==> test time per file, slowest first"
  per_file_times
fi

echo
echo "==> summary ($((SECONDS - started)) s)"
for line in "${summary[@]}"; do
  echo "    $line"
done
if [ "$failed" -ne 0 ]; then
  echo "FAILED"
  exit 1
fi
if [ "$skipped" -ne 0 ]; then
  echo "all checks that ran passed; $skipped SKIPPED (see the summary)"
else
  echo "all checks passed"
fi
