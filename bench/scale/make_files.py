"""Makes the many-small-files data set of issue 37: N files of 1-3 KB (seeded random bytes)
in 1,000 class directories, as ImageNet's layout is, for the first-batch and workers
benchmarks. Nothing of it is stored in the repository: make it, measure, remove it.

    python bench/scale/make_files.py DIR [--files 1000000] [--classes 1000] [--seed 37]

Writes DIR/cNNNN/NNNNNNN.bin (class i % classes), then syncs. Sizes are uniform in
[1024, 3072] bytes; the bytes are a cheap seeded pattern (not compressible to nothing).
Prints the total and the time taken. Refuses a DIR that already has files.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=37)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    if any(os.scandir(a.dir)):
        print(f"{a.dir} is not empty", file=sys.stderr)
        return 1
    rng = random.Random(a.seed)
    pool = rng.randbytes(1 << 20)
    t0 = time.perf_counter()
    for c in range(a.classes):
        os.mkdir(os.path.join(a.dir, f"c{c:04d}"))
    total = 0
    for i in range(a.files):
        size = rng.randint(1024, 3072)
        at = rng.randrange(0, len(pool) - size)
        path = os.path.join(a.dir, f"c{i % a.classes:04d}", f"{i:07d}.bin")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, pool[at : at + size])
        finally:
            os.close(fd)
        total += size
        if i and i % 100_000 == 0:
            print(f"{i} files, {time.perf_counter() - t0:.0f} s", flush=True)
    os.sync()
    print(f"{a.files} files, {total / 1e9:.2f} GB, in {a.classes} directories, {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
