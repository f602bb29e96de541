#!/usr/bin/env bash
# Captures the block traces of `ecdedup eval block-separation` (paper 003):
# real activity on ext4 over an ecdedup volume (serve --trace, nbdfuse,
# losetup, mkfs.ext4, mount), one trace per workload, recorded by the
# volume's trace recorder (format: docs/ssd.md, "Trace formats").
#
#   scripts/capture-traces.sh [WORKLOAD...]
#
# Workloads (default: all three):
#   kernel-build   unpack two C source trees (libzstd 1.5.4, Lua 5.4.4, the
#                  Debian orig tarballs) and build both with make -j2: the
#                  kernel-compile-like workload (many small files written,
#                  object files and libraries created, rewritten, deleted)
#   app-update     copy a debootstrap'ed Debian bookworm minbase image onto
#                  the volume, then inside it (chroot) add bookworm-updates
#                  and the security archive, apt-get update, apt-get
#                  upgrade, and install a few packages (application update)
#   npm-versions   extract six successive typescript releases (5.0 to 5.5)
#                  over one another in one folder, as a package upgrade does
#
# Environment: TRACES (output folder, default /work/traces; keep it out of
# git), VOLUME_SIZE (default 1G), ECDEDUP_BIN and PLUGIN (default: the
# release build of this tree under $CARGO_TARGET_DIR or target/), CACHE
# (downloads, default $TRACES/cache). Needs root (losetup, mount, chroot),
# nbdkit, nbdfuse (libnbd-bin), debootstrap, npm, curl, make, gcc.
# Downloads come from the Debian mirror apt uses and the npm registry.
#
# Every process this script starts is stopped by its PID on exit, the
# mount, loop device and FUSE mount are undone, and the binaries run from a
# private copy (so a rebuild of the tree cannot change them mid-capture).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
TRACES=${TRACES:-/work/traces}
CACHE=${CACHE:-$TRACES/cache}
VOLUME_SIZE=${VOLUME_SIZE:-1G}
target=${CARGO_TARGET_DIR:-$repo/target}
ECDEDUP_BIN=${ECDEDUP_BIN:-$target/release/ecdedup}
PLUGIN=${PLUGIN:-$target/release/libecdedup_nbdkit.so}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WORKLOADS=("$@")
((${#WORKLOADS[@]})) || WORKLOADS=(kernel-build app-update npm-versions)

log() { printf '%s capture: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (losetup, mount, chroot)"
for t in nbdkit nbdfuse nbdinfo losetup mkfs.ext4 fusermount3 make gcc curl; do
  command -v "$t" >/dev/null || die "$t is missing (scripts/install-deps.sh)"
done
[ -x "$ECDEDUP_BIN" ] || die "$ECDEDUP_BIN is missing (cargo build --release --workspace)"
[ -f "$PLUGIN" ] || die "$PLUGIN is missing (cargo build --release --workspace)"
mkdir -p "$TRACES" "$CACHE"

# ---- downloads (cached) ------------------------------------------------------
fetch() { # URL FILE
  [ -s "$2" ] && return 0
  curl -sSfL --retry 3 -o "$2.part" "$1" || die "cannot download $1"
  mv "$2.part" "$2"
}
prepare() {
  case $1 in
    kernel-build)
      fetch "$DEBIAN_MIRROR/pool/main/libz/libzstd/libzstd_1.5.4+dfsg2.orig.tar.xz" "$CACHE/libzstd_1.5.4+dfsg2.orig.tar.xz"
      fetch "$DEBIAN_MIRROR/pool/main/l/lua5.4/lua5.4_5.4.4.orig.tar.gz" "$CACHE/lua5.4_5.4.4.orig.tar.gz" ;;
    app-update)
      command -v debootstrap >/dev/null || die "debootstrap is missing (apt-get install debootstrap)"
      if [ ! -s "$CACHE/bookworm-minbase.tar" ]; then
        log "debootstrap --variant=minbase bookworm (once, cached)"
        rm -rf "$CACHE/bookworm-minbase"
        debootstrap --variant=minbase bookworm "$CACHE/bookworm-minbase" "$DEBIAN_MIRROR" > "$CACHE/debootstrap.log" 2>&1 \
          || die "debootstrap failed: $(tail -3 "$CACHE/debootstrap.log")"
        tar -C "$CACHE/bookworm-minbase" -cf "$CACHE/bookworm-minbase.tar" .
      fi ;;
    npm-versions)
      command -v npm >/dev/null || die "npm is missing"
      mkdir -p "$CACHE/npm"
      for v in 5.0.4 5.1.6 5.2.2 5.3.3 5.4.5 5.5.4; do
        [ -s "$CACHE/npm/typescript-$v.tgz" ] || (cd "$CACHE/npm" && npm pack --silent "typescript@$v" >/dev/null)
      done ;;
    *) die "unknown workload $1 (kernel-build, app-update, npm-versions)" ;;
  esac
}

# ---- the stack: server, nbdfuse, loop, ext4 ------------------------------------
WORK=""; SERVER_PID=""; FUSE_PID=""; LOOP=""; MNT=""; CHROOT_PROC=""
cleanup() {
  set +e
  [ -n "$CHROOT_PROC" ] && mountpoint -q "$CHROOT_PROC" && umount "$CHROOT_PROC"
  CHROOT_PROC=""
  [ -n "$MNT" ] && mountpoint -q "$MNT" && { umount "$MNT" || umount -l "$MNT"; }
  MNT=""
  [ -n "$LOOP" ] && losetup -d "$LOOP"
  LOOP=""
  if [ -n "$FUSE_PID" ]; then
    fusermount3 -u "$WORK/fuse" 2>/dev/null || fusermount3 -u -z "$WORK/fuse" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$FUSE_PID" 2>/dev/null || break; sleep 0.1; done
    kill "$FUSE_PID" 2>/dev/null; wait "$FUSE_PID" 2>/dev/null
  fi
  FUSE_PID=""
  if [ -n "$SERVER_PID" ]; then
    kill -TERM "$SERVER_PID" 2>/dev/null
    for _ in $(seq 600); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null
  fi
  SERVER_PID=""
  [ -n "$WORK" ] && rm -rf "$WORK"
  WORK=""
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_stack() { # NAME
  WORK=$(mktemp -d "$TRACES/.capture-$1.XXXXXX")
  mkdir -p "$WORK/bin" "$WORK/fuse" "$WORK/mnt"
  cp "$ECDEDUP_BIN" "$PLUGIN" "$WORK/bin/"
  local bin=$WORK/bin/ecdedup
  "$bin" --dir "$WORK/array" create --devices 6 -k 4 -m 2 --stripe-unit 32K --size "$VOLUME_SIZE" > "$WORK/create.log" 2>&1 \
    || die "create failed: $(cat "$WORK/create.log")"
  "$bin" --dir "$WORK/array" serve --socket "$WORK/nbd.sock" --trace "$TRACES/$1.trace.part" \
    --plugin "$WORK/bin/libecdedup_nbdkit.so" > "$WORK/serve.log" 2>&1 &
  SERVER_PID=$!
  local uri="nbd+unix:///?socket=$WORK/nbd.sock"
  for _ in $(seq 600); do
    [ -S "$WORK/nbd.sock" ] && nbdinfo --size "$uri" >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || die "serve exited: $(tail -5 "$WORK/serve.log")"
    sleep 0.1
  done
  nbdfuse -P "$WORK/fuse.pid" "$WORK/fuse" "$uri" &
  FUSE_PID=$!
  for _ in $(seq 600); do [ -s "$WORK/fuse.pid" ] && [ -e "$WORK/fuse/nbd" ] && break; sleep 0.1; done
  [ -e "$WORK/fuse/nbd" ] || die "nbdfuse did not come up"
  LOOP=$(losetup --find --show "$WORK/fuse/nbd")
  mkfs.ext4 -q -F -E nodiscard "$LOOP"
  mount "$LOOP" "$WORK/mnt"
  MNT=$WORK/mnt
}

stop_stack() { # NAME
  sync
  umount "$MNT"; MNT=""
  losetup -d "$LOOP"; LOOP=""
  cleanup_server_only
  mv "$TRACES/$1.trace.part" "$TRACES/$1.trace"
  log "$1: $(grep -c ' W ' "$TRACES/$1.trace") write lines, $(du -h "$TRACES/$1.trace" | cut -f1) -> $TRACES/$1.trace"
  cleanup
}
cleanup_server_only() {
  fusermount3 -u "$WORK/fuse"
  wait "$FUSE_PID" 2>/dev/null || true; FUSE_PID=""
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" || die "serve exited uncleanly: $(tail -5 "$WORK/serve.log")"
  SERVER_PID=""
}

# ---- the workloads ---------------------------------------------------------------
run_kernel_build() {
  local m=$MNT
  mkdir -p "$m/src"
  tar -C "$m/src" -xf "$CACHE/libzstd_1.5.4+dfsg2.orig.tar.xz"
  tar -C "$m/src" -xzf "$CACHE/lua5.4_5.4.4.orig.tar.gz"
  sync
  local zstd lua
  zstd=$(find "$m/src" -maxdepth 1 -type d -name '*zstd*' | head -1)
  lua=$(find "$m/src" -maxdepth 1 -type d -name 'lua*' | head -1)
  make -C "$zstd/lib" -j2 > "$m/zstd-lib.log" 2>&1
  make -C "$zstd/programs" -j2 zstd > "$m/zstd-programs.log" 2>&1
  sync
  make -C "$lua" -j2 posix > "$m/lua.log" 2>&1 || make -C "$lua/src" -j2 posix > "$m/lua.log" 2>&1
  sync
  # A rebuild after `make clean`, as a developer's edit-compile loop does.
  make -C "$zstd/lib" clean > /dev/null 2>&1
  make -C "$zstd/lib" -j2 > "$m/zstd-lib2.log" 2>&1
}

run_app_update() {
  local root=$MNT/debian
  mkdir -p "$root"
  tar -C "$root" -xf "$CACHE/bookworm-minbase.tar"
  sync
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  cat > "$root/etc/apt/sources.list" <<EOF
deb $DEBIAN_MIRROR bookworm main
deb $DEBIAN_MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
  CHROOT_PROC=$root/proc
  mount -t proc proc "$CHROOT_PROC"
  local env=(env DEBIAN_FRONTEND=noninteractive LC_ALL=C)
  chroot "$root" "${env[@]}" apt-get update -q > "$MNT/apt-update.log" 2>&1
  chroot "$root" "${env[@]}" apt-get -y -q upgrade > "$MNT/apt-upgrade.log" 2>&1
  sync
  chroot "$root" "${env[@]}" apt-get -y -q install --no-install-recommends \
    python3 perl curl git > "$MNT/apt-install.log" 2>&1
  chroot "$root" "${env[@]}" apt-get clean
  umount "$CHROOT_PROC"; CHROOT_PROC=""
}

run_npm_versions() {
  local app=$MNT/app/node_modules/typescript
  mkdir -p "$app"
  for v in 5.0.4 5.1.6 5.2.2 5.3.3 5.4.5 5.5.4; do
    # An upgrade replaces the package: old files go, new ones come.
    rm -rf "$app"; mkdir -p "$app"
    tar -C "$app" --strip-components=1 -xzf "$CACHE/npm/typescript-$v.tgz"
    sync
  done
}

for w in "${WORKLOADS[@]}"; do
  prepare "$w"
  log "$w: capturing on a $VOLUME_SIZE volume"
  t0=$SECONDS
  start_stack "$w"
  case $w in
    kernel-build) run_kernel_build ;;
    app-update) run_app_update ;;
    npm-versions) run_npm_versions ;;
  esac
  stop_stack "$w"
  log "$w: done in $((SECONDS - t0)) s"
done
