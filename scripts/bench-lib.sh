# Shared shell helpers of the NBD benchmarks (bench-nbd.sh, bench-policies.sh,
# bench-recovery.sh). Sourced, not run. The caller sets BENCH_NAME (the log
# prefix) and `set -euo pipefail` before sourcing.
#
# Servers are named by a short key S; per key the associative arrays hold
# PID[S] (the server's process: nbdkit, which `ecdedup serve` execs),
# SOCK[S] (its NBD Unix socket), DIR[S] (the array folder, empty for a peer)
# and KIND[S] (ecdedup or peer). Every server started here is stopped by its
# PID (SIGTERM, then wait), never by name.

log() { printf '[%s %s] %s\n' "$BENCH_NAME" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# nbdkit's file plugin: its name (nbdkit looks in its compiled-in plugin
# folder) or a path to nbdkit-file-plugin.so (scripts/device-bench.sh
# carries one to a machine without nbdkit).
NBDKIT_FILE_PLUGIN=${NBDKIT_FILE_PLUGIN:-file}

# Checks for fio, nbdkit (with its file plugin) and python3.
bench_require_tools() {
  local tool
  for tool in fio nbdkit python3; do
    command -v "$tool" >/dev/null || die "$tool is not installed (scripts/install-deps.sh installs fio and nbdkit)"
  done
  nbdkit "$NBDKIT_FILE_PLUGIN" --version >/dev/null 2>&1 || die "nbdkit has no file plugin ($NBDKIT_FILE_PLUGIN)"
}

# Sets ECDEDUP_BIN (building the workspace unless NO_BUILD=1 or ECDEDUP_BIN
# is given) and PLUGIN (libecdedup_nbdkit.so beside it).
bench_find_bin() {
  local repo=$1
  if [ -z "${ECDEDUP_BIN:-}" ]; then
    if [ "${NO_BUILD:-0}" != 1 ]; then
      log "building (cargo build --release --workspace)"
      (cd "$repo" && cargo build --release --workspace >&2)
    fi
    ECDEDUP_BIN=$repo/target/release/ecdedup
  fi
  [ -x "$ECDEDUP_BIN" ] || die "$ECDEDUP_BIN is not an executable"
  PLUGIN=$(dirname "$ECDEDUP_BIN")/libecdedup_nbdkit.so
  [ -f "$PLUGIN" ] || die "$PLUGIN is missing (build the workspace: cargo build --release --workspace)"
}

# Creates the work folder WORK under BENCH_TMP (prefix $1) with a private
# copy of the binaries in WORK/bin (BIN is the ecdedup there): other builds
# of the tree may replace target/release while a benchmark runs, and the
# server and the `stats` client must stay the same version. Installs the
# cleanup traps.
bench_make_work() {
  WORK=$(mktemp -d "$BENCH_TMP/$1.XXXXXX")
  mkdir -p "$WORK/bin" "$WORK/fio" "$WORK/stats"
  cp "$ECDEDUP_BIN" "$PLUGIN" "$WORK/bin/"
  BIN=$WORK/bin/ecdedup
  trap cleanup EXIT
  trap 'exit 130' INT TERM
}

declare -A PID SOCK DIR KIND IMG
# SERVE_ENV[S]: extra NAME=value words for ecdedup server S's environment.
declare -A SERVE_ENV
STARTED=()
CGROUPS=()
# Loop devices attached by loop_attach (LOOP=1), detached at exit.
LOOPS=()

# loop_attach FILE: attaches a loop device with direct I/O over FILE
# (`losetup --direct-io=on`: the loop driver reads and writes FILE with
# O_DIRECT, so the page cache holds neither side) and sets LOOP_DEV to its
# path (not printed: a command substitution's subshell would lose LOOPS). With
# LOOP=1 the servers' devices and images are such loop devices, so that
# O_DIRECT, discard and write-zeroes take the block-device paths (issue 21,
# item 3); needs root.
loop_attach() {
  local dev
  dev=$(losetup --find --show --direct-io=on "$1") || die "losetup of $1 failed (LOOP=1 needs root and loop devices)"
  LOOPS+=("$dev")
  LOOP_DEV=$dev
}

stop_server() {
  local s=$1 p=${PID[$1]:-}
  [ -n "$p" ] || return 0
  if kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  fi
  PID[$s]=""
}

cleanup() {
  local rc=$? s
  for s in "${STARTED[@]}"; do stop_server "$s"; done
  for s in "${LOOPS[@]}"; do losetup -d "$s" 2>/dev/null || log "warning: could not detach $s"; done
  for s in "${CGROUPS[@]}"; do rmdir "$s" 2>/dev/null || log "warning: could not remove cgroup $s"; done
  rm -rf "$WORK/loop"
  if [ "${KEEP:-0}" = 1 ] || [ $rc -ne 0 ]; then
    # Keep results, drop the bulky volumes (device files, parity journals, images).
    rm -f "$WORK"/*/dev? "$WORK"/*/journal/*.jrnl "$WORK"/*.img 2>/dev/null || true
    log "work folder kept: $WORK"
  else
    rm -rf "$WORK"
  fi
  exit $rc
}

wait_ready() {
  local s=$1 i
  for i in $(seq 1 600); do
    kill -0 "${PID[$s]}" 2>/dev/null || die "server $s exited early; log: $WORK/$s.log: $(tail -5 "$WORK/$s.log")"
    if [ -S "${SOCK[$s]}" ] && { [ "${KIND[$s]}" != ecdedup ] || [ -S "${DIR[$s]}/control.sock" ]; }; then
      return 0
    fi
    sleep 0.1
  done
  die "server $s did not open ${SOCK[$s]} within 60 s"
}

_note_started() {
  local s=$1 x
  for x in "${STARTED[@]}"; do [ "$x" = "$s" ] && return 0; done
  STARTED+=("$s")
}

# serve_ecdedup S DIR: serves the array already created in DIR as server S.
serve_ecdedup() {
  local s=$1 d=$2
  KIND[$s]=ecdedup; DIR[$s]=$d; SOCK[$s]=$WORK/$s.sock
  rm -f "${SOCK[$s]}"  # a stale socket would look ready
  # shellcheck disable=SC2086
  env ${SERVE_ENV[$s]:-} "$BIN" --dir "$d" serve --socket "${SOCK[$s]}" --threads "$THREADS" >"$WORK/$s.log" 2>&1 &
  PID[$s]=$!; _note_started "$s"
  wait_ready "$s"
}

# start_peer S: nbdkit's file plugin serving a fresh sparse file of SIZE
# bytes; PEER_CACHE (none, or unset for the page cache) is its cache= option.
start_peer() {
  local s=$1 f=$WORK/$1.img
  if [ "${LOOP:-0}" = 1 ]; then
    mkdir -p "$WORK/loop"
    fallocate -l "$SIZE" "$WORK/loop/$s.img"
    loop_attach "$WORK/loop/$s.img"
    f=$LOOP_DEV
  else
    truncate -s "$SIZE" "$f"
  fi
  IMG[$s]=$f
  KIND[$s]=peer; DIR[$s]=""; SOCK[$s]=$WORK/$s.sock
  rm -f "${SOCK[$s]}"  # a stale socket would look ready
  local cache=() cg=""
  [ -n "${PEER_CACHE:-}" ] && cache=("cache=$PEER_CACHE")
  if [ -n "${PEER_MEM:-}" ]; then memory_cgroup "$s" "$PEER_MEM"; cg=$MEMCG; fi
  # In its memory cgroup from its first instruction (PEER_MEM), so every
  # page of its file it caches counts there.
  ( if [ -n "$cg" ]; then echo "$BASHPID" >"$cg/cgroup.procs"; fi
    exec nbdkit --foreground --threads "$THREADS" --unix "${SOCK[$s]}" "$NBDKIT_FILE_PLUGIN" "$f" "${cache[@]}" ) >"$WORK/$s.log" 2>&1 &
  PID[$s]=$!; _note_started "$s"
  wait_ready "$s"
}

# memory_cgroup S LIMIT: a fresh memory cgroup for server S whose memory,
# page cache included, is bounded by LIMIT (e.g. 256M): cgroup v2's
# memory.max where the unified hierarchy has the memory controller, else
# v1's memory.limit_in_bytes. Its folder in MEMCG; removed at exit. Root.
memory_cgroup() {
  local s=$1 limit=$2 root="" cg v2
  # cgroup v2 where its root offers the memory controller to children
  # (enabled here if it is not yet), else v1's memory hierarchy.
  for v2 in /sys/fs/cgroup /sys/fs/cgroup/unified; do
    grep -qw memory "$v2/cgroup.controllers" 2>/dev/null || continue
    grep -qw memory "$v2/cgroup.subtree_control" 2>/dev/null \
      || echo +memory >"$v2/cgroup.subtree_control" 2>/dev/null || continue
    root=$v2; break
  done
  if [ -z "$root" ] && [ -d /sys/fs/cgroup/memory ]; then root=/sys/fs/cgroup/memory; fi
  [ -n "$root" ] || die "PEER_MEM: no memory cgroup controller here"
  cg=$root/$BENCH_NAME-$$-$s
  mkdir "$cg" || die "PEER_MEM: cannot make $cg (root?)"
  CGROUPS+=("$cg")
  if [ -e "$cg/memory.max" ]; then
    echo "$limit" >"$cg/memory.max"
  else
    echo "$limit" >"$cg/memory.limit_in_bytes"
  fi || die "PEER_MEM: cannot set the limit of $cg to $limit"
  MEMCG=$cg
}

# start_raw S: no server: fio itself on one preallocated file of SIZE bytes
# (O_DIRECT, io_uring), the disk's own limit in the same run.
start_raw() {
  local s=$1
  KIND[$s]=raw; DIR[$s]=""; SOCK[$s]=""
  if [ "${LOOP:-0}" = 1 ]; then
    mkdir -p "$WORK/loop"
    fallocate -l "$SIZE" "$WORK/loop/$s.img"
    loop_attach "$WORK/loop/$s.img"
    IMG[$s]=$LOOP_DEV
  else
    fallocate -l "$SIZE" "$WORK/$s.img"
    IMG[$s]=$WORK/$s.img
  fi
}

# drop_caches: when DROP_CACHES=1, writes back and drops the page cache
# (needs root), so no run reads what an earlier one left in memory.
drop_caches() {
  [ "${DROP_CACHES:-0}" = 1 ] || return 0
  sync
  echo 3 >/proc/sys/vm/drop_caches || die "cannot drop caches (DROP_CACHES=1 needs root)"
}

# sync_files S: fsync every file of server S (its device files and parity
# journals, or its image), so its writeback does not run into the next
# measurement.
sync_files() {
  local s=$1
  if [ "${KIND[$s]}" = peer ] || [ "${KIND[$s]}" = raw ]; then
    python3 -c 'import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.close(fd)' "${IMG[$s]:-$WORK/$s.img}"
  else
    python3 -c 'import glob, os, sys
d = sys.argv[1]
for p in sorted(glob.glob(d + "/dev?") + glob.glob(d + "/journal/*.jrnl")):
    fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.close(fd)' "${DIR[$s]}"
  fi
}

uri() { echo "nbd+unix:///?socket=${SOCK[$1]}"; }

# BENCH_DEADLINE (seconds since the epoch; unset: none; scripts/device-bench.sh
# sets it to fit a lent machine's time): a script starts no round that would
# end after it, so that its tables still cover the rounds done.
# round_fits LAST_ROUND_S [DEADLINE]: whether one more round as long as the
# last one ends by DEADLINE [BENCH_DEADLINE].
round_fits() {
  local deadline=${2:-${BENCH_DEADLINE:-}}
  [ -n "$deadline" ] || return 0
  [ $(($(date +%s) + $1)) -le "$deadline" ]
}

# record_peak_rss FILE: appends "server,kind,peak_rss_kib" for every running
# server: VmHWM of its process (nbdkit with the plugin loaded), the peak
# resident set since it started. Call it before stopping the servers.
record_peak_rss() {
  local f=$1 s p hwm
  [ -s "$f" ] || echo "server,kind,peak_rss_kib" >"$f"
  for s in "${STARTED[@]}"; do
    p=${PID[$s]:-}
    [ -n "$p" ] && [ -r "/proc/$p/status" ] || continue
    hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$p/status")
    echo "$s,${KIND[$s]},${hwm:-0}" >>"$f"
  done
}

# A process's CPU time so far (utime + stime), in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

stats_snapshot() { "$BIN" --dir "${DIR[$1]}" stats >"$2"; }

# A line describing the machine (for the reports).
machine_line() {
  local cpu mem
  cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
  mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
  echo "$(nproc) CPUs ($cpu), $mem RAM, kernel $(uname -r), $(fio --version), nbdkit $(nbdkit --version | awk '{print $2}')"
}
