#!/usr/bin/env bash
# The benchmarks that want more cores, run on a lent machine (16 cores, no
# Rust toolchain, no nbdkit, fio or etcd, no network) with the same scripts
# as here: everything they run is built and collected here first.
#
# Usage, on the build machine (Debian 12, x86-64), from the repository root:
#   scripts/device-bench.sh --prepare .devbench   # release build; ecdedup,
#       # its nbdkit plugin, Debian's nbdkit (+ its file plugin), fio,
#       # nbdinfo and etcd, and every shared library they need except
#       # glibc's own, packed into .devbench/bundle.tar.gz (about 45 MB;
#       # DIR must be inside the repository and git-ignored, so that it
#       # travels only when named as a carried path)
#   scripts/device-bench.sh --check .devbench     # the bundle's libraries
#       # resolve inside it (also done by --prepare and by every run)
# and on the lent machine, from a copy of the repository root:
#   OUT=results scripts/device-bench.sh .devbench
#
# The run unpacks the bundle (UNPACK [/tmp/ecdedup-devbench-bundle]), puts
# its bin/ first on PATH (fio, nbdkit and nbdinfo are wrappers that set
# LD_LIBRARY_PATH to the bundle's lib/ for themselves alone, so the host's
# own programs keep the host's libraries; etcd needs glibc alone; libisal, which
# ecdedup needs, is the only library put on LD_LIBRARY_PATH for all), and
# runs the steps below in this order, each under its own time limit, each
# only if it fits in what is left of BUDGET_S [540] seconds (a step that
# fails, times out or is skipped does not stop the next one). The arrays,
# chunk files and sockets go to WORK_ROOT [REPO/.devbench-work, the disk
# under the repository; the first of it, /var/tmp and /tmp that takes an
# O_DIRECT write], whose file system and device env.txt names.
#
#   cluster     scripts/bench-cluster.sh: 6 chunk servers + etcd on
#               loopback, 4 KiB overwrites QD1 and QD32 on rmw, parix and
#               replicate pools: IOPS, p50, messages, round trips and wire
#               bytes per write, paired parix/rmw and parix/repl ratios,
#               each pool's first overwrite after a replay measured apart
#               (issues 19/20). CL_ROUNDS [5] CL_RUNTIME [3] s
#               CL_REGION [32M] CL_JOURNAL_MAX [256M] (each parity journal
#               must hold the region's d(0)s and the runs' records)
#   nbd-core    scripts/bench-nbd.sh, issue 21's A/B: ecdedup RS(4,2) rmw
#               (E) against `nbdkit file cache=none` (P), a second one as
#               the A/A control (C) and fio io_uring O_DIRECT on one file (R,
#               the disk), 1 MiB sequential write QD8 and 4 KiB random write
#               QD32. PAIRS [5] RUNTIME [3] s RAMP [1] s SIZE [1G]
#   policies-core  scripts/bench-policies.sh: 4 KiB overwrites QD32 on rmw
#               (R), parix (X), replicate (T) and a second rmw (C, the A/A
#               control), fresh arrays per round: parix/rmw, parix/replicate.
#               PAIRS, RUNTIME as above; regions 32M/64M; JOURNAL_MAX [2048M,
#               1024M where the work folder has under 24 GiB free]
#   nbd-rest    (optional) issue 21's other rows: 1 MiB sequential read QD8,
#               4 KiB random read QD1 and QD32, random write QD1
#   policies-qd1   (optional) the overwrites at QD1 (p50)
# SKIP="nbd-rest policies-qd1" leaves steps out; ONLY="cluster" runs only
# those named (an optional step named there runs over what fits, as a
# priority step does, instead of needing 3 of its rounds to fit).
#
# Time: the three priority steps share BUDGET_S in proportion to their
# estimates (fixed start + rounds x seconds per round, scaled by how much
# slower than estimated the steps so far ran); each script gets its share
# as BENCH_DEADLINE and starts no round that would end past it, so it still
# prints its tables, over fewer rounds (the table says how many); a hard
# `timeout` 15 s past the share backs that. An optional step runs only if 3
# of its rounds fit in what is left. With the defaults the priority steps
# are estimated at about 8 minutes on a quiet 16-core machine (5 rounds of
# 3 s per side, not the 10 s of the 2-core runs: 10 s does not fit).
#
# Output, under OUT [REPO/devbench-results] (at most 8 files, so the lent
# machine's tool brings every one back):
#   env.txt     nproc, lscpu, free, df, uname, the work folder's file system
#               and block device (rotational, model), O_DIRECT probe, tool
#               versions, the bundle's manifest and library check
#   steps.txt   each step: command, limit, rc, seconds (or why skipped)
#   summary.md  each step's tables as its script printed them
#   logs.txt    each step's progress (stderr)
#   raw.tar.gz  the runs behind the tables: runs.csv, results, fio JSON,
#               `ecdedup stats` snapshots, server logs
# Every server a step starts is stopped by its PID by the step's script;
# after each step, any process still running whose command line names that
# step's own work folder (a chunk server or etcd of a step that was killed)
# is stopped by its PID.
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
GLIBC_LIBS='^(libc|libm|libpthread|libdl|librt|libresolv|libutil|libanl|libmvec|ld-linux-x86-64)\.so'

die() { echo "device-bench: $*" >&2; exit 1; }

# check_tree TREE: every program and plugin of an unpacked bundle finds each
# shared library it needs inside TREE/lib, or is glibc's own. Prints one
# line per program and "bundle check: ok" (else the offenders, rc 1).
check_tree() {
  local t=$1 f bad=0 line lib path
  for f in "$t"/libexec/* "$t"/plugins/* "$t"/bin/etcd; do
    while read -r line; do
      case "$line" in
        *"not found"*) echo "MISSING for $(basename "$f"): $line"; bad=1; continue ;;
      esac
      lib=$(awk '{print $1}' <<<"$line")
      path=$(awk '$2 == "=>" {print $3}' <<<"$line")
      [ -n "$path" ] || continue
      if [[ "$lib" =~ $GLIBC_LIBS ]]; then continue; fi
      case "$path" in
        "$t"/lib/*) ;;
        *) echo "OUTSIDE the bundle for $(basename "$f"): $line"; bad=1 ;;
      esac
    done < <(LD_LIBRARY_PATH="$t/lib" ldd "$f" 2>&1)
    echo "$(basename "$f"): $(LD_LIBRARY_PATH="$t/lib" ldd "$f" 2>/dev/null | grep -c '=>') libraries resolved"
  done
  [ $bad = 0 ] && echo "bundle check: ok"
  return $bad
}

wrapper() { # wrapper TREE NAME: bin/NAME runs libexec/NAME with the bundle's libraries
  cat >"$1/bin/$2" <<EOF
#!/bin/sh
# Runs the bundle's $2 with the bundle's shared libraries (scripts/device-bench.sh).
d=\$(dirname "\$(readlink -f "\$0")")/..
LD_LIBRARY_PATH="\$d/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$d/libexec/$2" "\$@"
EOF
  chmod +x "$1/bin/$2"
}

prepare() {
  local dir=$1 stage t plugindir
  cd "$repo" || exit 1
  mkdir -p "$dir" && dir=$(cd "$dir" && pwd)
  case "$dir/" in "$repo"/*) ;; *) die "$dir is not inside the repository ($repo): the lent machine gets only the repository and its carried paths" ;; esac
  if command -v git >/dev/null && git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$repo" check-ignore -q "$dir" || die "$dir is not git-ignored: add it to .gitignore (it must travel only as a carried path)"
  fi
  for t in nbdkit fio nbdinfo etcd; do
    command -v "$t" >/dev/null || die "$t is not installed (scripts/install-deps.sh)"
  done
  if [ "${NO_BUILD:-0}" != 1 ]; then
    cargo build --release -p ecdedup --bin ecdedup -p ecdedup-nbdkit || exit 1
  fi
  stage=$(mktemp -d "${TMPDIR:-/tmp}/devbench-stage.XXXXXX")
  mkdir -p "$stage"/{bin,libexec,lib,lib-isal,plugins}
  cp target/release/ecdedup target/release/libecdedup_nbdkit.so "$stage/libexec/"
  strip --strip-debug "$stage/libexec/ecdedup" "$stage/libexec/libecdedup_nbdkit.so"
  for t in nbdkit fio nbdinfo; do
    cp -L "$(command -v "$t")" "$stage/libexec/$t"
    wrapper "$stage" "$t"
  done
  cp -L "$(command -v etcd)" "$stage/bin/etcd"  # Debian's: Go, linked to glibc alone
  plugindir=$(nbdkit --dump-config | sed -n 's/^plugindir=//p')
  cp -L "$plugindir/nbdkit-file-plugin.so" "$stage/plugins/"
  # Every library they need, glibc's own excepted (the host's are used).
  for t in "$stage"/libexec/* "$stage"/plugins/*; do
    ldd "$t" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
  done | sort -u | while read -r lib path; do
    [[ "$lib" =~ $GLIBC_LIBS ]] || cp -L "$path" "$stage/lib/$lib"
  done
  local isal
  isal=$(cd "$stage/lib" && ls libisal.so.*) || die "ecdedup does not link libisal"
  ln -s "../lib/$isal" "$stage/lib-isal/$isal"
  {
    echo "bundle made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(. /etc/os-release && echo "$PRETTY_NAME")"
    echo "code: $(git rev-parse --short HEAD 2>/dev/null || echo unknown) + $(git status --porcelain --untracked-files=no 2>/dev/null | grep -c . || true) changed tracked files"
    echo "ecdedup: $("$stage/libexec/ecdedup" --version 2>&1 | head -1)"
    echo "nbdkit: $(nbdkit --version)"
    echo "fio: $(fio --version)"
    echo "nbdinfo: $(nbdinfo --version 2>&1 | head -1)"
    echo "etcd: $(etcd --version | head -1)"
    echo "files:"
    (cd "$stage" && find . -type f -printf '%8s %p\n' | sort -k2)
  } >"$stage/MANIFEST.txt"
  check_tree "$stage" >"$stage/CHECK.txt" || { cat "$stage/CHECK.txt"; die "the bundle's libraries do not resolve inside it"; }
  rm -f "$dir/bundle.tar.gz"
  tar czf "$dir/bundle.tar.gz" -C "$stage" . || exit 1
  cp "$stage/MANIFEST.txt" "$dir/"
  rm -rf "$stage"
  du -sh "$dir"
  local kib
  kib=$(du -sk "$dir" | cut -f1)
  [ "$kib" -le $((60 * 1024)) ] || echo "device-bench: warning: $dir is over 60 MiB; the lent machine takes 64 MiB with the repository" >&2
}

unpack() { # unpack DIR TREE
  rm -rf "$2" && mkdir -p "$2" || exit 1
  tar xzf "$1/bundle.tar.gz" -C "$2" || die "cannot unpack $1/bundle.tar.gz into $2"
}

case "${1:-}" in
  --prepare)
    prepare "${2:?usage: device-bench.sh --prepare DIR}"
    exit 0 ;;
  --check)
    t=$(mktemp -d "${TMPDIR:-/tmp}/devbench-check.XXXXXX")
    unpack "${2:?usage: device-bench.sh --check DIR}" "$t"
    check_tree "$t"; rc=$?
    rm -rf "$t"
    exit $rc ;;
  ""|-h|--help)
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2 ;;
esac

# ---- the run, on the lent machine ----
bundle=$(cd "$1" && pwd) || die "no bundle folder $1"
[ -f "$bundle/bundle.tar.gz" ] || die "$bundle/bundle.tar.gz is missing (scripts/device-bench.sh --prepare $1, here)"
T0=$SECONDS
BUDGET_S=${BUDGET_S:-540}
OUT=${OUT:-$repo/devbench-results}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
: >"$OUT/steps.txt"; : >"$OUT/summary.md"; : >"$OUT/logs.txt"
B=${UNPACK:-${TMPDIR:-/tmp}/ecdedup-devbench-bundle}
unpack "$bundle" "$B"
B=$(cd "$B" && pwd)

export PATH="$B/bin:$PATH"
export LD_LIBRARY_PATH="$B/lib-isal${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# glibc's libgcc_s comes from the host; carried only where the host lacks it.
if ! ldconfig -p 2>/dev/null | grep -q 'libgcc_s.so.1 '; then
  cp "$B/lib/libgcc_s.so.1" "$B/lib-isal/" 2>/dev/null
fi
export NBDKIT_FILE_PLUGIN="$B/plugins/nbdkit-file-plugin.so"
export ECDEDUP_BIN="$B/libexec/ecdedup" NO_BUILD=1 KEEP=1
export CODE
CODE="bundle: $(sed -n 's/^code: //p' "$B/MANIFEST.txt")"
for t in nbdkit fio nbdinfo etcd; do
  case "$(command -v "$t")" in "$B"/*) ;; *) die "$t resolves to $(command -v "$t"), not into the bundle $B" ;; esac
done

# The work folder: the disk under the repository, where it takes O_DIRECT.
direct_ok() { mkdir -p "$1" 2>/dev/null && dd if=/dev/zero of="$1/.direct-probe" bs=4096 count=1 oflag=direct 2>/dev/null; local rc=$?; rm -f "$1/.direct-probe"; return $rc; }
WORK_NOTE=""
if [ -n "${WORK_ROOT:-}" ]; then
  direct_ok "$WORK_ROOT" || WORK_NOTE="WARNING: $WORK_ROOT takes no O_DIRECT write"
else
  for w in "$repo/.devbench-work" /var/tmp/ecdedup-devbench-work /tmp/ecdedup-devbench-work; do
    if direct_ok "$w"; then WORK_ROOT=$w; break; fi
    WORK_NOTE="$WORK_NOTE $w takes no O_DIRECT write;"
  done
  [ -n "${WORK_ROOT:-}" ] || die "no work folder takes O_DIRECT:$WORK_NOTE"
fi
rm -rf "${WORK_ROOT:?}"/step-* && mkdir -p "$WORK_ROOT" && WORK_ROOT=$(cd "$WORK_ROOT" && pwd)
# DROP_CACHES=1 where this user may drop the page cache (root, a writable /proc/sys).
DROP=0
if [ "$(id -u)" = 0 ] && sync && { echo 1 >/proc/sys/vm/drop_caches; } 2>/dev/null; then DROP=1; fi

env_report() {
  echo "== date"; date -u
  echo "== uname"; uname -a
  echo "== nproc"; nproc
  echo "== lscpu"; lscpu 2>&1
  echo "== free -g"; free -g 2>&1
  echo "== loadavg"; cat /proc/loadavg
  echo "== work folder: $WORK_ROOT ${WORK_NOTE:+($WORK_NOTE)}"
  echo "O_DIRECT: $(direct_ok "$WORK_ROOT" && echo yes || echo no)"
  df -h "$WORK_ROOT" /tmp 2>&1
  findmnt -T "$WORK_ROOT" 2>&1 || grep -E " $(stat -c %m "$WORK_ROOT" 2>/dev/null) " /proc/mounts
  local src dev
  src=$(findmnt -n -o SOURCE -T "$WORK_ROOT" 2>/dev/null)
  echo "source device: ${src:-unknown}"
  dev=$(basename "$(readlink -f "${src:-/nonexistent}")")
  for d in "/sys/class/block/$dev" "/sys/class/block/$dev/.."; do
    [ -e "$d/queue/rotational" ] || continue
    echo "$dev: rotational=$(cat "$d/queue/rotational") scheduler=$(cat "$d/queue/scheduler" 2>/dev/null) model=$(cat "$d/device/model" 2>/dev/null | xargs) size=$(($(cat "$d/size") / 2097152)) GiB nr_requests=$(cat "$d/queue/nr_requests" 2>/dev/null)"
    break
  done
  echo "== lsblk"; lsblk -o NAME,TYPE,SIZE,ROTA,SCHED,MODEL,MOUNTPOINT 2>&1
  echo "== root: $(id -u) (DROP_CACHES=$DROP)"
  echo "== tools (from the bundle at $B)"
  for t in ecdedup nbdkit fio nbdinfo etcd python3; do echo "$t: $(command -v "$t" || echo "$B/libexec/$t")"; done
  "$B/libexec/ecdedup" --version 2>&1 | head -1
  nbdkit --version; nbdkit "$NBDKIT_FILE_PLUGIN" --version 2>&1 | tail -1
  fio --version; nbdinfo --version 2>&1 | head -1; etcd --version | head -1; python3 --version
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "== bundle check (here)"; check_tree "$B"
  echo "== manifest"; cat "$B/MANIFEST.txt"
}
env_report >"$OUT/env.txt" 2>&1

# Stops by PID whatever still runs with this step's work folder in its
# command line (a chunk server or etcd, in their own process groups, after
# their step's script was killed at its limit).
reap() {
  local dir=$1 p pids=()
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = $$ ] && continue
    { tr '\0' ' ' <"/proc/$p/cmdline" | grep -qF "$dir"; } 2>/dev/null && pids+=("$p")
  done
  [ ${#pids[@]} = 0 ] && return
  echo "   stopping leftover processes of $dir: ${pids[*]}" | tee -a "$OUT/steps.txt"
  kill -TERM "${pids[@]}" 2>/dev/null; sleep 2; kill -KILL "${pids[@]}" 2>/dev/null
}

# The steps, in order. Per step: 1 if it runs only when time is left, its
# fixed seconds (start, warm-up) and seconds per round on a quiet 16-core
# machine (estimates), the variable that sets its rounds, its environment
# and its script.
P=${PAIRS:-5}; R=${RUNTIME:-3}; RAMP=${RAMP:-1}; SIZE=${SIZE:-1G}
CR=${CL_ROUNDS:-5}; CT=${CL_RUNTIME:-3}; CREG=${CL_REGION:-32M}; CJMAX=${CL_JOURNAL_MAX:-256M}
# Each parity journal must hold a warm pass and a run without a replay.
avail_gib=$(df -Pk "$WORK_ROOT" | awk 'NR == 2 {print int($4 / 1048576)}')
JMAX=${JOURNAL_MAX:-$([ "${avail_gib:-0}" -ge 24 ] && echo 2048M || echo 1024M)}
STEPS=(cluster nbd-core policies-core nbd-rest policies-qd1)
# The nbdkit file peer's page cache bounded (bench-nbd.sh PEER_MEM, since
# 2026-11-28: unbounded, it read its image from memory, faster than the
# disk) where this machine has a memory cgroup controller; unbounded where
# not (PEER_MEM= forces that).
PMEM=${PEER_MEM-$( { grep -qw memory /sys/fs/cgroup/cgroup.controllers \
  || grep -qw memory /sys/fs/cgroup/unified/cgroup.controllers \
  || [ -d /sys/fs/cgroup/memory ]; } 2>/dev/null && echo 256M)}
declare -A OPTIONAL FIXED PER ROUNDS_VAR ROUNDS_MAX ENVS SHOWN SCRIPT
def() { # def NAME OPTIONAL FIXED_S PER_ROUND_S ROUNDS_VAR ROUNDS_MAX SCRIPT ENV...
  local n=$1
  OPTIONAL[$n]=$2; FIXED[$n]=$3; PER[$n]=$4; ROUNDS_VAR[$n]=$5; ROUNDS_MAX[$n]=$6; SCRIPT[$n]=$repo/scripts/$7
  shift 7
  ENVS[$n]=$(printf '%q ' "$@")  # for eval
  local a shown=()
  for a in "$@"; do [[ "$a" == *" "* ]] && a="${a%%=*}=\"${a#*=}\""; shown+=("$a"); done
  SHOWN[$n]="${shown[*]}"
}
# 3 pools x (a warm pass of CL_REGION, QD1, QD32, two settles) per round.
def cluster 0 60 $((6 * CT + 24)) ROUNDS "$CR" bench-cluster.sh \
  RUNTIME="$CT" REGION="$CREG" JOURNAL_MAX="$CJMAX" IO=direct
# 2 jobs x 4 sides (E P C R) per round; 4 volumes preconditioned.
def nbd-core 0 20 $((8 * (R + RAMP) + 4)) PAIRS "$P" bench-nbd.sh \
  JOBS="seqwrite-1m-qd8 randwrite-qd32" RAW=1 PEER_CACHE=none PEER_MEM="$PMEM" DROP_CACHES=$DROP RUNTIME="$R" RAMP="$RAMP" SIZE="$SIZE"
# 4 servers per round, each a warm pass, the run and a settle (parix's replay).
def policies-core 0 5 $((4 * R + 12)) PAIRS "$P" bench-policies.sh \
  JOBS=ow-qd32 SERVERS="R X T C" CONTROL=rmw FW_QD1_SIZE=32M FW_QD32_SIZE=64M JOURNAL_MAX="$JMAX" \
  PEER_CACHE=none DROP_CACHES=$DROP RUNTIME="$R"
def nbd-rest 1 20 $((16 * (R + RAMP) + 8)) PAIRS "$P" bench-nbd.sh \
  JOBS="seqread-1m-qd8 randread-qd1 randread-qd32 randwrite-qd1" RAW=1 PEER_CACHE=none PEER_MEM="$PMEM" DROP_CACHES=$DROP \
  RUNTIME="$R" RAMP="$RAMP" SIZE="$SIZE"
def policies-qd1 1 5 $((4 * R + 10)) PAIRS "$P" bench-policies.sh \
  JOBS=ow-qd1 SERVERS="R X T C" CONTROL=rmw FW_QD1_SIZE=32M FW_QD32_SIZE=64M JOURNAL_MAX="$JMAX" \
  PEER_CACHE=none DROP_CACHES=$DROP RUNTIME="$R"

selected() { # selected NAME: not left out by ONLY or SKIP
  { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; } && [[ " ${SKIP:-} " != *" $1 "* ]]
}

# How much slower than estimated this machine ran the steps so far, in
# percent (100 until a step has run; held within 70..300).
EST_DONE=0; ACTUAL_DONE=0
slowdown() {
  local f=100
  [ "$EST_DONE" -gt 0 ] && f=$((ACTUAL_DONE * 100 / EST_DONE))
  [ $f -lt 70 ] && f=70; [ $f -gt 300 ] && f=300
  echo $f
}

est_full() { # est_full NAME: seconds for all its rounds, at this machine's pace so far
  echo $(( (FIXED[$1] + ROUNDS_MAX[$1] * PER[$1]) * $(slowdown) / 100 ))
}

# named NAME: ONLY names it (an optional step named there counts as a
# priority step: asked for, it runs over what fits).
named() { [[ " ${ONLY:-} " == *" $1 "* ]]; }

# slice_for NAME LEFT_S: the seconds step NAME may take (0: skip it). The
# priority steps still to run share what is left in proportion to their
# estimates; an optional step takes what is left if 3 of its rounds fit.
slice_for() {
  local n=$1 left=$2 m go=0 sum=0 mine
  if [ "${OPTIONAL[$n]}" = 1 ] && ! named "$n"; then
    local three=$(( (FIXED[$n] + 3 * PER[$n]) * $(slowdown) / 100 ))
    [ $((three * 6 / 5 + 20)) -le "$left" ] && echo $((left - 5)) || echo 0
    return
  fi
  for m in "${STEPS[@]}"; do
    [ "$m" = "$n" ] && go=1
    if [ $go = 1 ] && { [ "${OPTIONAL[$m]}" = 0 ] || named "$m"; } && selected "$m"; then sum=$((sum + $(est_full "$m"))); fi
  done
  mine=$(est_full "$n")
  echo $(( (left - 5) * mine / sum ))
}

run_step() {
  local n=$1 left slice deadline limit est wdir t0 rc took
  selected "$n" || { echo "== $n: left out (ONLY/SKIP)" | tee -a "$OUT/steps.txt"; return; }
  left=$((BUDGET_S - (SECONDS - T0)))
  slice=$(slice_for "$n" "$left")
  est=$(est_full "$n")
  if [ "$slice" -lt 40 ]; then
    echo "== $n: skipped: ${left} s of BUDGET_S=$BUDGET_S are left; it needs about $est s for ${ROUNDS_MAX[$n]} rounds" | tee -a "$OUT/steps.txt"
    return
  fi
  # No round starts that would end within 20 s of the slice's end (the
  # tables and the servers' stop); the hard limit is 15 s past it.
  deadline=$(( $(date +%s) + slice - 20 ))
  limit=$((slice + 15)); [ $limit -gt "$left" ] && limit=$left
  wdir="$WORK_ROOT/step-$n"
  mkdir -p "$wdir"
  local cmd="${ROUNDS_VAR[$n]}=${ROUNDS_MAX[$n]} ${SHOWN[$n]} scripts/$(basename "${SCRIPT[$n]}")"
  echo "== $n (at +$((SECONDS - T0)) s; estimate $est s at $(slowdown)% of the nominal pace; rounds until +$((SECONDS - T0 + slice - 20)) s; limit $limit s): $cmd" | tee -a "$OUT/steps.txt"
  {
    echo "## $n"
    echo
    echo "\`$cmd\` on $(nproc) CPUs, work folder $WORK_ROOT ($(findmnt -n -o FSTYPE,SOURCE -T "$WORK_ROOT" 2>/dev/null | xargs)), 1-min load $(cut -d' ' -f1 /proc/loadavg) at the start, rounds cut at $((slice - 20)) s (BENCH_DEADLINE)"
    echo
  } >>"$OUT/summary.md"
  echo "===== $n: $cmd" >>"$OUT/logs.txt"
  t0=$SECONDS
  eval "env ${ENVS[$n]} ${ROUNDS_VAR[$n]}=${ROUNDS_MAX[$n]} BENCH_DEADLINE=$deadline BENCH_TMP=\"\$wdir\" \
    RESULTS=\"\$wdir/results\" timeout -k 15 $limit bash \"\${SCRIPT[\$n]}\"" >"$wdir/stdout.md" 2>>"$OUT/logs.txt"
  rc=$?
  took=$((SECONDS - t0))
  cat "$wdir/stdout.md" >>"$OUT/summary.md"
  echo >>"$OUT/summary.md"
  if [ $rc != 0 ]; then
    echo "(step $n: rc=$rc$([ $rc -ge 124 ] && echo ", stopped at its limit of $limit s"); a table missing above is from a step that did not finish: logs.txt says how far it got)" >>"$OUT/summary.md"
    echo >>"$OUT/summary.md"
  fi
  reap "$wdir"
  # Rounds cut by the deadline (the fewest of a step's jobs) count for the pace.
  local cut rounds=${ROUNDS_MAX[$n]}
  cut=$(sed -n "/^===== $n:/,\$p" "$OUT/logs.txt" | grep -oE 'covers? [0-9]+ rounds' | grep -oE '[0-9]+' | sort -n | head -1)
  [ -n "$cut" ] && rounds=$cut
  echo "== $n: rc=$rc in $took s${cut:+; BENCH_DEADLINE cut it to $cut of ${ROUNDS_MAX[$n]} rounds}" | tee -a "$OUT/steps.txt"
  EST_DONE=$((EST_DONE + FIXED[$n] + rounds * PER[$n])); ACTUAL_DONE=$((ACTUAL_DONE + took))
  # Drop the bulky files (device files, chunk files, journals, images, binaries).
  find "$wdir" -type f -size +4M -delete 2>/dev/null
}

for n in "${STEPS[@]}"; do run_step "$n"; done

# The runs behind the tables, small files only.
(cd "$WORK_ROOT" && find . -type f \( -name '*.csv' -o -name '*.json' -o -name '*.jsonl' -o -name '*.md' \
  -o -name '*.log' -o -name '*.err' \) -size -4M -print0 | tar czf "$OUT/raw.tar.gz" --null -T -)
[ "${KEEP_WORK:-0}" = 1 ] || rm -rf "${WORK_ROOT:?}"/step-*
rm -rf "$B"
echo "== all steps done in $((SECONDS - T0)) s (BUDGET_S=$BUDGET_S); results in $OUT" | tee -a "$OUT/steps.txt"
