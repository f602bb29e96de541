#!/usr/bin/env bash
# The embedded default: installs what is missing, builds, creates an RS(4,2)
# array of 6 files under ./data (32 KiB stripe unit, 8 GiB volume; the files
# are preallocated, 12 GiB in all, and read and written with O_DIRECT) if
# there is none yet, and serves it over NBD on ./data/nbd.sock until Ctrl-C.
# Override with DIR=..., SIZE=..., STRIPE_UNIT=..., CREATE_ARGS="--sparse"
# (or "--io buffered" on tmpfs); extra args go to `serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${DIR:-data}
bash scripts/install-deps.sh
cargo build --release --workspace
BIN=target/release/ecdedup
if [ ! -f "$DIR/array.json" ]; then
  "$BIN" --dir "$DIR" create --devices 6 -k 4 -m 2 --stripe-unit "${STRIPE_UNIT:-32K}" --size "${SIZE:-8G}" ${CREATE_ARGS:-}
fi
"$BIN" --dir "$DIR" status
echo "serving nbd+unix:///?socket=$(realpath "$DIR")/nbd.sock  (try: nbdinfo 'nbd+unix:///?socket=$(realpath "$DIR")/nbd.sock')"
exec "$BIN" --dir "$DIR" serve "$@"
