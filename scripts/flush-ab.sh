#!/usr/bin/env bash
# A/B of a flush's latency on a loopback cluster between two builds of the
# loopback test binary (`crates/ecdedup-client/tests/loopback.rs`,
# `flush_latency_after_overwrites`: six chunk servers, an RS(4,2) pool per
# policy, parix then rmw, six random 4 KiB overwrites and a flush a round,
# the flush timed alone; its p50 and round trips per flush printed, and
# the overwrites' as POLICY_write where the test binary prints them).
#
# Sides alternate A B, B A, ... for PAIRS pairs, then AA_PAIRS pairs of A
# against A (the control: its ratio is the noise). Reports per policy the
# median B/A ratio of the p50s with its range, the A/A ratio the same
# way, and the round trips a flush on each side.
#
# Usage: A=SIDE B=SIDE scripts/flush-ab.sh
#   where each SIDE is a loopback test binary (a copy of
#   target/debug/deps/loopback-* built from one commit: `cargo test -p
#   ecdedup-client --test loopback --no-run`) or a git revision of this
#   repository (A=7f7061f B=HEAD), which the script builds in a worktree
#   of its own, ${TMPDIR:-/tmp}/flush-ab-wt-<commit>, its target folder
#   seeded from this checkout's target/debug (kept for the next run:
#   `git worktree remove --force DIR` removes one).
# Environment [defaults]: PAIRS [5], AA_PAIRS [3], ROUNDS [1000] flushes a
#   run, FUA [0] (1: time a FUA write instead of a flush), FLUSH_DEDUP
#   [none] (all | parity: the pools deduplicate; a binary from before
#   2026-11-29's evening ignores it).
# Each run starts its own etcd and servers and stops them (the test does).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
A=${A:?A=loopback test binary or git revision of the build before}
B=${B:?B=loopback test binary or git revision of the build after}
PAIRS=${PAIRS:-5}
AA_PAIRS=${AA_PAIRS:-3}
ROUNDS=${ROUNDS:-1000}
FUA=${FUA:-0}
out=$(mktemp -d "${TMPDIR:-/tmp}/flush-ab.XXXXXX")
trap 'rm -rf "$out"' EXIT

# The loopback test binary of side $1 (a file, or a revision built in a
# worktree), copied to $2.
binary_of() {
    if [ -f "$1" ]; then
        cp "$1" "$2"
        return
    fi
    local sha wt exe
    sha=$(git -C "$repo" rev-parse --verify --quiet "$1^{commit}") ||
        { echo "$1: neither a file nor a revision of $repo" >&2; exit 2; }
    wt="${TMPDIR:-/tmp}/flush-ab-wt-${sha:0:12}"
    if [ ! -d "$wt" ]; then
        git -C "$repo" worktree add --detach -f "$wt" "$sha" >&2
    fi
    if [ ! -d "$wt/target/debug" ] && [ -d "$repo/target/debug" ]; then
        echo "seeding $wt/target from $repo/target/debug" >&2
        mkdir -p "$wt/target"
        cp -a "$repo/target/debug" "$wt/target/"
    fi
    echo "building the loopback test of $1 ($sha) in $wt" >&2
    exe=$(cd "$wt" && CARGO_TARGET_DIR="$wt/target" cargo test -p ecdedup-client \
        --test loopback --no-run 2>&1 | tee /dev/stderr |
        sed -n 's/.*Executable tests\/loopback.rs (\(.*\))$/\1/p' | tail -1)
    [ -n "$exe" ] || { echo "no loopback test binary built for $1" >&2; exit 1; }
    case "$exe" in /*) ;; *) exe="$wt/$exe" ;; esac
    cp "$exe" "$2"
}
binary_of "$A" "$out/loopback-A"
binary_of "$B" "$out/loopback-B"
A="$out/loopback-A"
B="$out/loopback-B"

# One run of side $1 (a binary) into file $2: "policy p50 trips" lines.
run() {
    (cd "$repo/crates/ecdedup-client" &&
        FLUSH_ROUNDS=$ROUNDS FLUSH_FUA=$FUA "$1" --ignored flush_latency --nocapture 2>&1) |
        sed -n 's/^\([a-z_]*\): [a-zA-Z ]* p50 \([0-9]*\) us.*; \([0-9.]*\) round trips each$/\1 \2 \3/p' >"$2"
    [ "$(wc -l <"$2")" -ge 2 ] || { echo "run of $1 printed no figures" >&2; exit 1; }
}

n=0
for ((i = 0; i < PAIRS; i++)); do
    if ((i % 2 == 0)); then order="A B"; else order="B A"; fi
    for side in $order; do
        bin=$A; [ "$side" = B ] && bin=$B
        echo "pair $i: $side" >&2
        run "$bin" "$out/ab.$i.$side"
    done
done
for ((i = 0; i < AA_PAIRS; i++)); do
    for side in A C; do
        echo "A/A pair $i: $side" >&2
        run "$A" "$out/aa.$i.$side"
    done
done

python3 - "$out" "$PAIRS" "$AA_PAIRS" <<'EOF'
import statistics, sys, os
out, pairs, aa_pairs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def read(path):
    return {l.split()[0]: (float(l.split()[1]), float(l.split()[2])) for l in open(path)}
def ratios(prefix, n, x, y, policy):
    r = []
    for i in range(n):
        a, b = read(f"{out}/{prefix}.{i}.{x}"), read(f"{out}/{prefix}.{i}.{y}")
        r.append(b[policy][0] / a[policy][0])
    return r
first = read(f"{out}/ab.0.A")
print("| policy | p50 A (us) | p50 B (us) | B / A (range) | A / A (range) | round trips A; B |")
print("|---|---|---|---|---|---|")
for policy in first:
    ab = ratios("ab", pairs, "A", "B", policy)
    aa = ratios("aa", aa_pairs, "A", "C", policy) if aa_pairs else [float("nan")]
    pa = statistics.median(read(f"{out}/ab.{i}.A")[policy][0] for i in range(pairs))
    pb = statistics.median(read(f"{out}/ab.{i}.B")[policy][0] for i in range(pairs))
    ta = read(f"{out}/ab.0.A")[policy][1]
    tb = read(f"{out}/ab.0.B")[policy][1]
    print(f"| {policy} | {pa:.0f} | {pb:.0f} | **{statistics.median(ab):.2f}** ({min(ab):.2f}-{max(ab):.2f}) "
          f"| {statistics.median(aa):.2f} ({min(aa):.2f}-{max(aa):.2f}) | {ta}; {tb} |")
EOF
