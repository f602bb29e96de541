#!/usr/bin/env bash
# The GPU machine's checks (issue 22), in one run, from binaries built
# elsewhere: a GPU machine lent for minutes has no Rust toolchain, no nbdkit
# and no fio, so everything it runs is prepared here first.
#
# Usage, on the build machine (Debian 12, x86-64):
#   scripts/gpu-run.sh --prepare DIR   # builds release binaries, copies them
#                                      # and the shared libraries they need
#                                      # (libisal) into DIR
# and on the GPU machine, from the repository root:
#   OUT=results scripts/gpu-run.sh DIR
#
# SKIP="archive dedup" leaves those steps out; BACKENDS [cpu,gpu,gpu-all]
# picks the dedup step's sides; ROUNDS [5], SECONDS_PER_RUN [2].
#
# What the run does, each step under its own time limit, each step's output
# in its own file under $OUT (a step that fails or times out does not stop
# the next one):
#   env.txt        nvidia-smi, driver and CUDA versions, where libnvrtc is
#   tests.txt      the GPU backend's unit tests (the three that skip without
#                  a GPU run here), incl. start-up self-test on every lane
#   bench-gpu.txt  benches/gpu.rs: pinned H2D bandwidth, GPU SHA-1/SHA-256/
#                  MD5 end to end 4 KiB..256 MiB, the CPU backend on all
#                  cores on the same batches, the crossover measured at start
#   dedup.txt      benches/dedup_overhead.rs: chunking/fingerprint/index per
#                  4 KiB write at QD1 and QD32, cpu vs gpu vs gpu-all
#   archive.txt    an archive put+seal of the same input with each backend:
#                  wall time, peak RSS, and whether the outputs are identical
#
# NVRTC: cudarc's cuda-12080 bindings look for libnvrtc.so and
# libnvrtc.so.12 (docs/gpu.md); a CUDA 13-only machine gets a libnvrtc.so
# symlink in a private folder put first on LD_LIBRARY_PATH.
set -uo pipefail

if [ "${1:-}" = --prepare ]; then
  dir=${2:?usage: gpu-run.sh --prepare DIR}
  repo=$(cd "$(dirname "$0")/.." && pwd)
  cd "$repo" || exit 1
  cargo bench -p ecdedup-core --no-run --bench gpu --bench dedup_overhead || exit 1
  cargo build --release -p ecdedup --bin ecdedup || exit 1
  cargo test -p ecdedup-core --lib --no-run || exit 1
  rm -rf "$dir" && mkdir -p "$dir/lib"
  newest() { find "$1" -maxdepth 1 -type f -name "$2" ! -name '*.d' -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2; }
  cp "$(newest target/release/deps 'gpu-*')" "$dir/bench-gpu"
  cp "$(newest target/release/deps 'dedup_overhead-*')" "$dir/bench-dedup"
  cp "$(newest target/debug/deps 'ecdedup_core-*')" "$dir/core-tests"
  cp target/release/ecdedup "$dir/ecdedup"
  strip --strip-debug "$dir"/* 2>/dev/null
  for b in "$dir"/bench-gpu "$dir"/ecdedup; do
    ldd "$b" | awk '/isal/ {print $3}'
  done | sort -u | while read -r lib; do cp -L "$lib" "$dir/lib/"; done
  du -sh "$dir"
  exit 0
fi

bin=$(cd "${1:?usage: gpu-run.sh DIR (from --prepare)}" && pwd)
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
work=${WORK:-/tmp/ecdedup-gpu-run}
rm -rf "$work" && mkdir -p "$work/nvrtc"

# The libraries: libisal carried; libnvrtc from the toolkit or pip.
nvrtc=$( (ls /usr/local/cuda/lib64/libnvrtc.so* 2>/dev/null;
          find /usr /opt -name 'libnvrtc.so*' 2>/dev/null) | grep -v builtins | head -1)
libpath="$bin/lib"
if [ -n "$nvrtc" ]; then
  ln -sf "$nvrtc" "$work/nvrtc/libnvrtc.so"
  libpath="$work/nvrtc:$(dirname "$nvrtc"):$libpath"
fi
for d in /usr/local/nvidia/lib64 /usr/local/cuda/lib64; do
  [ -d "$d" ] && libpath="$libpath:$d"
done
export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

step() { # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  case " ${SKIP:-} " in *" $name "*) echo "== $name: skipped (SKIP)" | tee -a "$OUT/steps.txt"; return;; esac
  echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/steps.txt"
  local t0=$SECONDS
  timeout -k 10 "$limit" bash -c '"$@"' _ "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
  tail -5 "$OUT/$name.txt"
}

env_report() {
  date -u; uname -a; nproc; free -g
  nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv
  nvcc --version 2>/dev/null | tail -2
  echo "libnvrtc: ${nvrtc:-none found}"; ls -l "$work/nvrtc"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$bin/bench-gpu"
  df -h "$work" /tmp; findmnt -T "$work" || true
}
export work bin nvrtc
export -f env_report
step env 60 env_report

# The GPU tests (they skip loudly without a GPU; here they must run).
step tests 150 "$bin/core-tests" fingerprint::gpu --test-threads=4

# GPU vs CPU table, H2D bandwidth, crossover.
step bench-gpu 240 "$bin/bench-gpu" --bench

# Dedup overhead per 4 KiB write (paper 002 Fig. 1), verify off (the
# paper trusts SHA-1); O_DIRECT where the file system takes it.
io=direct
dd if=/dev/zero of="$work/direct-probe" bs=4096 count=1 oflag=direct 2>/dev/null || io=buffered
step dedup 200 "$bin/bench-dedup" --bench --backends "${BACKENDS:-cpu,gpu,gpu-all}" --rounds "${ROUNDS:-5}" \
  --seconds "${SECONDS_PER_RUN:-2}" --qd 1,32 --size 1G --verify off --io "$io" --dir "$work"

# Archive seal of the same input with each backend.
archive() {
  python3 - "$work/input.img" <<'EOF'
import os, random, sys
random.seed(22)
pool = [os.urandom(8192) for _ in range(4096)]
with open(sys.argv[1], 'wb') as f:
    for _ in range(160000):  # 1.25 GiB of 8 KiB blocks, about half repeated
        f.write(pool[random.randrange(len(pool))] if random.random() < 0.5 else os.urandom(8192))
EOF
  ls -l "$work/input.img"
  for b in cpu gpu; do
    a=$work/arc-$b
    "$bin/ecdedup" archive --dir "$a" create --devices 9 -k 6 -m 3 --container 300M >/dev/null || return 1
    echo "-- $b: put"
    /usr/bin/time -f "$b put: %e s wall, %U s user, %S s sys, peak RSS %M KB" \
      "$bin/ecdedup" archive --dir "$a" --fingerprint-backend "$b" put "$work/input.img" --name img
    /usr/bin/time -f "$b seal: %e s wall, %U s user, %S s sys, peak RSS %M KB" \
      "$bin/ecdedup" archive --dir "$a" --fingerprint-backend "$b" seal
    "$bin/ecdedup" archive --dir "$a" stats > "$work/stats-$b.json"
    python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print({k: v for k, v in s.items() if not isinstance(v, (dict, list))})" "$work/stats-$b.json"
    (cd "$a" && find . -path './dev*' -type f ! -name '*.json' -print0 | sort -z | xargs -0 sha256sum) > "$work/sums-$b.txt"
    wc -l < "$work/sums-$b.txt"
  done
  if cmp -s "$work/sums-cpu.txt" "$work/sums-gpu.txt"; then
    echo "IDENTICAL: every device file of the cpu and gpu archives has the same bytes"
  else
    echo "DIFFERENT device files:"; diff "$work/sums-cpu.txt" "$work/sums-gpu.txt" | head -20
  fi
  "$bin/ecdedup" archive --dir "$work/arc-gpu" get img -o "$work/out.img" && cmp "$work/input.img" "$work/out.img" && echo "get from the gpu archive: bit-exact"
}
export -f archive
step archive 150 archive
rm -rf "$work"
echo "== all steps done" | tee -a "$OUT/steps.txt"
