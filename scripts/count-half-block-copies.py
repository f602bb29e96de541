#!/usr/bin/env python3
"""Why content-defined chunks find more copies than fixed 8 KiB blocks on an
input: counts, over the files given (read as one stream of 8 KiB blocks,
file by file, a short last block kept), the 8 KiB blocks with an earlier
exact copy, the 4 KiB halves with an earlier copy, and the 8 KiB blocks
both of whose halves have an earlier copy (copies aligned to 4 KiB, e.g.
ext4's blocks, that fixed 8 KiB blocks miss). MD5, exact (one index).

    scripts/count-half-block-copies.py eval-out/codeplugin/input-nonzero/*.img
"""
import hashlib
import sys


def copied_before(seen, data):
    """Whether `data` was seen before; remembers it."""
    h = hashlib.md5(data).digest()
    if h in seen:
        return True
    seen.add(h)
    return False


def main(paths):
    seen8, seen4 = set(), set()
    n8 = red8 = halves_both = n4 = red4 = 0
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(8192):
                n8 += 1
                red8 += copied_before(seen8, block)
                halves = [h for h in (block[:4096], block[4096:]) if h]
                copied = [copied_before(seen4, h) for h in halves]
                n4 += len(halves)
                red4 += sum(copied)
                halves_both += all(copied)
    print(f"8 KiB blocks {n8}: {red8} ({red8 / n8:.1%}) with an earlier copy; "
          f"4 KiB halves {n4}: {red4} ({red4 / n4:.1%}) with an earlier copy; "
          f"8 KiB blocks whose both halves have one: {halves_both} ({halves_both / n8:.1%})")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
