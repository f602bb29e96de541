#!/usr/bin/env bash
# Installs the system packages ecdedup builds and tests against (Debian 12).
# Idempotent; run as root (or with sudo available).
set -euo pipefail
PKGS=(
  libisal-dev          # GF(2^8) erasure coding (ec_encode_data, ec_encode_data_update)
  nbdkit nbdkit-plugin-dev  # the NBD server our plugin runs inside
  libnbd-bin           # nbdinfo, nbdcopy, nbdfuse, nbdsh for tests
  fio                  # workload driver (--ioengine=nbd)
  qemu-utils           # qemu-img convert in/out tests
  fuse3                # nbdfuse needs fusermount3
  e2fsprogs            # mkfs.ext4, e2fsck for the file-system test
  pkg-config           # build helper
  build-essential      # cc + libc6-dev: the linker rustc needs, build.rs's C kernel twin, /usr/include for the ext4 tests
  mount                # losetup, mount, umount for the file-system tests
  linux-libc-dev       # /usr/include/linux: part of the tree the ext4 tests copy
  debootstrap          # scripts/capture-traces.sh app-update: a minbase Debian image
  curl                 # scripts/capture-traces.sh: source tarballs from the Debian mirror
  etcd-server          # etcd 3.4: the cluster's coordination store (crates/ecdedup-cluster); its tests start one
  etcd-client          # etcdctl: read a cluster's keys by hand (docs/cluster.md, "etcd keys")
  protobuf-compiler    # protoc: the etcd-client crate compiles etcd's gRPC protos at build time
  libprotobuf-dev      # google/protobuf/*.proto, the well-known types etcd's protos import (protoc needs them)
  iproute2             # ip netns, veth, bridge: scripts/cluster-faults.sh
  nftables             # nft: scripts/cluster-faults.sh's partitions and packet loss
  openssl              # tests/cluster_tls.rs makes a CA and certificates for etcd over TLS
)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo not found; install Rust with rustup (stable)" >&2
  exit 1
fi
