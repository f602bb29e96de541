#!/usr/bin/env bash
# Parity saved by the archive tier against plain RS(6,3), by exchange width
# and chunking, on the files given (counts only: `archive stats` is exact,
# no timing). 300 MiB containers, 8 KiB blocks, MD5, 512 MiB cache, the
# paper layout (compact saves data bytes, not parity).
#
#   scripts/archive-parity-sweep.sh FILE...
#   VARIANTS="0:fixed 4:fixed 4:fastcdc" scripts/archive-parity-sweep.sh eval-out/codeplugin/input-nonzero/*.img
#
# Prints one markdown row per variant: exchange, chunking, parity saving,
# stripes encoded / all, map bytes (% of the input), redundant blocks.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$REPO/target/release/ecdedup}
VARIANTS=${VARIANTS:-"0:fixed 2:fixed 4:fixed 8:fixed 0:fastcdc 4:fastcdc"}
WORK=${WORK:-$(mktemp -d /tmp/archive-parity-sweep.XXXXXX)}
[ $# -gt 0 ] || { echo "usage: $0 FILE..." >&2; exit 2; }
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p ecdedup (or set BIN)" >&2; exit 2; }
trap 'rm -rf "$WORK/arc"' EXIT
input=$(cat "$@" | wc -c)
echo "| exchange | chunking | parity saving | stripes encoded / all | map bytes (% of input) | redundant blocks / blocks |"
echo "|---:|---|---:|---:|---:|---:|"
for v in $VARIANTS; do
  ex=${v%%:*} chunking=${v#*:}
  rm -rf "$WORK/arc"
  "$BIN" archive --dir "$WORK/arc" create --devices 9 -k 6 -m 3 --exchange "$ex" --chunking "$chunking" >/dev/null
  for f in "$@"; do "$BIN" archive --dir "$WORK/arc" put "$f" --name "$(basename "$f")" >/dev/null; done
  "$BIN" archive --dir "$WORK/arc" seal
  "$BIN" archive --dir "$WORK/arc" stats | INPUT=$input EX=$ex CH=$chunking python3 -c '
import json, os, sys
s = json.load(sys.stdin)
print("| %s | %s | %.1f%% | %d / %d | %d (%.3f%%) | %d / %d |" % (os.environ["EX"], os.environ["CH"],
      s["parity_saving_percent"], s["stripes_encoded"], s["stripes"], s["map_bytes"],
      100.0 * s["map_bytes"] / int(os.environ["INPUT"]), s["redundant_blocks"], s["blocks"]))'
done
