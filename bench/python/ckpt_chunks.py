"""`CheckpointStore.save` against a raw O_DIRECT write + fsync of the same bytes, per chunk size
and parts written at once (`chunk_bytes`, `save_parallelism`), cold, in interleaved pairs.

    python bench/python/ckpt_chunks.py --dir /nvme/bench [--configs 8:1,8:4,16:2,32:1,32:4]
        [--pairs 6] [--parts 111] [--gib 1]

Each configuration runs in its own store; per pair: drop_caches, the raw write (the same bytes
from one page-aligned buffer, 8 MiB `os.write`s, fsync), drop_caches, `save`. Prints the medians
and the save / raw ratio (min / median / max over the pairs).
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import subprocess
import time

import numpy as np

import ringtier


def drop() -> None:
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--configs", default="8:1,8:4,16:2,32:1,32:4", help="chunk MiB:parts at once, ...")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--parts", type=int, default=111)
    ap.add_argument("--gib", type=float, default=1.0)
    a = ap.parse_args()
    total = int(a.gib * (1 << 30)) // a.parts // 4096 * 4096 * a.parts
    state = {f"w{i}": np.ones(total // a.parts // 4, dtype=np.float32) for i in range(a.parts)}
    buf = mmap.mmap(-1, total)
    buf.write(b"\1" * total)
    raw_path = os.path.join(a.dir, "raw")
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {total / 2**30:.2f} GiB in {a.parts} parts; "
          f"{a.dir}; {a.pairs} cold pairs per configuration; load average {os.getloadavg()[0]:.1f}")
    for cfg in a.configs.split(","):
        chunk, lanes = (int(x) for x in cfg.split(":"))
        d = os.path.join(a.dir, f"store-{chunk}-{lanes}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        st = ringtier.CheckpointStore([d], keep_last=1, chunk_bytes=chunk << 20, save_parallelism=lanes)
        raw, save = [], []
        for step in range(a.pairs):
            drop()
            t = time.perf_counter()
            fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
            mv = memoryview(buf)
            for off in range(0, total, 8 << 20):
                os.write(fd, mv[off : off + (8 << 20)])
            os.fsync(fd)
            os.close(fd)
            raw.append(time.perf_counter() - t)
            os.unlink(raw_path)
            drop()
            t = time.perf_counter()
            st.save(step, state)
            save.append(time.perf_counter() - t)
        st.close()
        shutil.rmtree(d, ignore_errors=True)
        r = sorted(s / w for w, s in zip(raw, save))
        print(f"chunk {chunk:3d} MiB, {lanes} parts at once: raw {statistics.median(raw):.3f} s, save "
              f"{statistics.median(save):.3f} s (medians); save / raw {r[0]:.2f} / {statistics.median(r):.2f} / "
              f"{r[-1]:.2f}", flush=True)


if __name__ == "__main__":
    main()
