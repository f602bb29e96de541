#!/usr/bin/env bash
# The archive tier's layouts and chunkings on one input (issue 12, item 7):
# paper-faithful CodePlugin (fixed 8 KiB blocks, every block in the data
# sub-files) first, then the compact layout, FastCDC chunking, and both.
# RS(6,3), 8 KiB blocks (BLOCK; the stripe unit under CDC too), FastCDC
# 2/8/64 KiB, MD5, 512 MiB cache, no exchange, 24 MiB containers.
#
# Input: ../shared/workloads' W2 VM images when WL_IMAGES names them (a
# glob); otherwise IMAGES generated images of IMAGE_MIB MiB (python3, seed
# SEED): each is a run of "files" of 1..64 KiB, 65% drawn from a pool shared
# by all images (a distribution's files) and 35% fresh random bytes, each
# file starting at a multiple of ALIGN bytes (512: tar-like, so copies sit
# at shifted offsets; 4096: ext4-like, so fixed 4 KiB-aligned copies line
# up), with 10% of files zero-filled.
#
# Per variant, REPEATS times (the throughputs are the median): `archive
# create`, then `put` of every image and `seal` (timed together: put+seal
# throughput = input bytes / seconds), `get` of every image compared with
# the input, then `get` of every image to /dev/null (timed: get
# throughput), then `stats`. The CPU seconds (user + system, of the
# commands) of put+seal and of the timed get are reported too (median):
# on a shared machine they vary less than the wall time. Prints one
# markdown row per variant. The input
# and archives are in the page cache (the machine's, not a cold read);
# every sealed file is fsync'ed as in normal use.
#
#   scripts/bench-archive-layouts.sh               # defaults below
#   ALIGN=4096 scripts/bench-archive-layouts.sh
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
IMAGES=${IMAGES:-8}
IMAGE_MIB=${IMAGE_MIB:-16}
ALIGN=${ALIGN:-512}
SEED=${SEED:-12}
REPEATS=${REPEATS:-3}
BLOCK=${BLOCK:-8K}
VARIANTS=${VARIANTS:-"paper:fixed compact:fixed paper:fastcdc compact:fastcdc"}
WORK=${WORK:-$(mktemp -d /tmp/bench-archive-layouts.XXXXXX)}
log() { printf '[bench-archive-layouts %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -z "${ECDEDUP_BIN:-}" ]; then
  (cd "$REPO" && cargo build --release -p ecdedup >&2)
  ECDEDUP_BIN=$REPO/target/release/ecdedup
fi

mkdir -p "$WORK/input"
if [ -n "${WL_IMAGES:-}" ]; then
  # shellcheck disable=SC2206
  INPUTS=($WL_IMAGES)
  log "input: ${#INPUTS[@]} workload images"
else
  log "generating $IMAGES images of $IMAGE_MIB MiB (align $ALIGN, seed $SEED) in $WORK/input"
  python3 - "$WORK/input" "$IMAGES" "$IMAGE_MIB" "$ALIGN" "$SEED" <<'EOF'
import os, random, sys
out, images, mib, align, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)
def fresh(n):
    return rng.randbytes(n)
pool = [fresh(rng.randrange(1024, 65536)) for _ in range(1500)]
for i in range(images):
    size = mib << 20
    parts, at = [], 0
    while at < size:
        roll = rng.random()
        if roll < 0.10:
            f = bytes(rng.randrange(1024, 65536))
        elif roll < 0.75:
            f = pool[rng.randrange(len(pool))]
        else:
            f = fresh(rng.randrange(1024, 65536))
        pad = -len(f) % align
        parts.append(f + bytes(pad))
        at += len(f) + pad
    with open(os.path.join(out, f"vm{i}.img"), "wb") as fh:
        fh.write(b"".join(parts)[:size])
EOF
  INPUTS=("$WORK"/input/vm*.img)
fi
INPUT_BYTES=$(cat "${INPUTS[@]}" | wc -c)
log "input bytes: $INPUT_BYTES"

now() { date +%s.%N; }
rate() { python3 -c "print(f'{$1 / ($3 - $2) / 2**20:.0f}')"; }
# Runs "$@" (its output dropped) and prints its CPU seconds, user + system.
cpu_of() {
  local TIMEFORMAT='%U %S'
  { time "$@" >/dev/null 2>&1; } 2>&1 | awk '{printf "%.2f\n", $1 + $2}'
}
put_all() {
  for f in "${INPUTS[@]}"; do "$ECDEDUP_BIN" archive --dir "$arc" put "$f"; done
  "$ECDEDUP_BIN" archive --dir "$arc" seal
}
get_all() {
  for f in "${INPUTS[@]}"; do "$ECDEDUP_BIN" archive --dir "$arc" get "$(basename "$f")" -o /dev/null; done
}
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

echo "| variant | data bytes stored | parity bytes | map bytes (% of input) | stripes encoded / all | redundant blocks | redundant chunks | put+seal MiB/s | put+seal CPU s | get MiB/s | get CPU s |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for variant in $VARIANTS; do
  IFS=: read -r layout chunking <<<"$variant"
  variant="$layout $chunking"
  arc=$WORK/arc
  puts=() gets=() put_cpu=() get_cpu=()
  for _ in $(seq "$REPEATS"); do
    rm -rf "$arc"
    "$ECDEDUP_BIN" archive --dir "$arc" create --devices 9 -k 6 -m 3 --container 24M \
      --block "$BLOCK" --fingerprint md5 --cache 512M --layout "$layout" --chunking "$chunking" \
      --cdc-min 2K --cdc-avg 8K --cdc-max 64K >/dev/null
    sync
    t0=$(now)
    put_cpu+=("$(cpu_of put_all)")
    t1=$(now)
    for f in "${INPUTS[@]}"; do  # bit-exact first
      "$ECDEDUP_BIN" archive --dir "$arc" get "$(basename "$f")" -o "$WORK/out.img"
      cmp -s "$f" "$WORK/out.img" || { log "error: $f does not read back ($variant)"; exit 1; }
    done
    t2=$(now)
    get_cpu+=("$(cpu_of get_all)")
    t3=$(now)
    puts+=("$(rate "$INPUT_BYTES" "$t0" "$t1")")
    gets+=("$(rate "$INPUT_BYTES" "$t2" "$t3")")
  done
  log "$variant: put+seal MiB/s ${puts[*]} (CPU s ${put_cpu[*]}); get MiB/s ${gets[*]} (CPU s ${get_cpu[*]})"
  "$ECDEDUP_BIN" archive --dir "$arc" stats >"$WORK/stats-$layout-$chunking.json"
  python3 - "$WORK/stats-$layout-$chunking.json" "$variant" "$INPUT_BYTES" \
    "$(median "${puts[@]}")" "$(median "${gets[@]}")" \
    "$(median "${put_cpu[@]}")" "$(median "${get_cpu[@]}")" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
variant, input_bytes, put, get, put_cpu, get_cpu = sys.argv[2], int(sys.argv[3]), *sys.argv[4:8]
if variant == "paper fixed":
    print(f"| plain RS(6,3) (same containers) | {s['stored_data_bytes']:,} | {s['plain_parity_bytes']:,} "
          f"| 0 | {s['stripes']:,} / {s['stripes']:,} | | | | | | |")
chunks = f"{100 * s['redundant_chunks'] / s['chunks']:.1f}%" if s['chunks'] else "(the blocks)"
print(f"| {variant} | {s['stored_data_bytes']:,} | {s['parity_bytes']:,} "
      f"| {s['map_bytes']:,} ({100 * s['map_bytes'] / input_bytes:.2f}%) "
      f"| {s['stripes_encoded']:,} / {s['stripes']:,} "
      f"| {100 * s['redundant_blocks'] / s['blocks']:.1f}% | {chunks} | {put} | {put_cpu} | {get} | {get_cpu} |")
EOF
done
rm -rf "$WORK/arc" "$WORK/out.img"
log "done (input left in $WORK/input)"
