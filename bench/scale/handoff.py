"""What a batch costs to cross from a DataLoader worker to the main process (issue 37), with no
reading at all: a worker yields BATCHES ``PackedBatch`` es of RECORDS x BYTES bytes (a record
batch's shape: 256 records of about 2.1 KB) from its shared-memory slots, the main process
counts them and drops them.

    python bench/scale/handoff.py [--batches 3907] [--records 256] [--bytes 2100] [--workers 1]
        [--repeats 5] [--json out.json] [--md out.md]

Sides, interleaved, each pass a fresh process:

- ``reference``: a slot crosses by reference (the worker's pid and descriptor; the main process
  opens ``/proc/PID/fd/N``), what ``ringtier.torch`` does once the main process has checked it
  can;
- ``torch``: the same batches with that check made to fail, so every slot crosses the torch
  way (its descriptor passed through multiprocessing's resource sharer);
- ``no-tensor``: the offsets list alone (no tensor): the DataLoader's own cost per item.

Per pass: microseconds per batch (wall time of the whole loop over BATCHES, the workers' start
included) and the main process's CPU seconds; ratios against ``torch`` pair by pair.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from typing import Any, Dict, List

SIDES = ("reference", "torch", "no-tensor")

from _common import summary, write_outputs  # noqa: E402 (beside this script)


def child(side: str, batches: int, records: int, nbytes: int, workers: int) -> Dict[str, Any]:
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    from ringtier.torch import _packed
    from ringtier.torch._packed import PackedBatch, SlotRing

    if side == "torch":

        def refused(ref: Any) -> Any:
            raise PermissionError("by reference refused for this side")

        _packed._open_segment = refused  # type: ignore[assignment]
    total = records * nbytes
    offsets = [i * nbytes for i in range(records + 1)]

    class Batches(IterableDataset):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.ring = SlotRing()

        def __iter__(self) -> Any:
            info = get_worker_info()
            for _ in range(info.id, batches, info.num_workers):
                if side == "no-tensor":
                    yield (offsets,)
                else:
                    yield PackedBatch.filled(total, lambda mem: offsets, ring=self.ring, worker=info.id)

    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    n = 0
    for b in DataLoader(Batches(), batch_size=None, num_workers=workers):
        n += 1
        del b
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    assert n == batches, (n, batches)
    return {"batches": n, "wall_s": wall, "us_per_batch": wall / n * 1e6,
            "main_cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)}



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=3907)
    ap.add_argument("--records", type=int, default=256)
    ap.add_argument("--bytes", type=int, default=2100)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--child", metavar="SIDE")
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.batches, a.records, a.bytes, a.workers)))
        return 0
    print(f"{a.batches} batches of {a.records} x {a.bytes} bytes, {a.workers} worker(s), {a.repeats} repeats; "
          f"{os.cpu_count()} cores, {platform.release()}", flush=True)
    raw: Dict[str, List[Dict[str, Any]]] = {s: [] for s in SIDES}
    for r in range(a.repeats):
        for side in SIDES:
            out = subprocess.run(
                [sys.executable, __file__, "--child", side, "--batches", str(a.batches), "--records", str(a.records),
                 "--bytes", str(a.bytes), "--workers", str(a.workers)],
                capture_output=True, text=True, timeout=600,
            )
            if out.returncode != 0:
                raise RuntimeError(f"{side}: {out.stderr[-3000:]}")
            p = json.loads(out.stdout.strip().splitlines()[-1])
            raw[side].append(p)
            print(f"repeat {r} {side:9s}: {p['us_per_batch']:6.0f} us/batch, main CPU {p['main_cpu_s']:.2f} s", flush=True)
    res = {}
    for side, passes in raw.items():
        res[side] = {m: summary([p[m] for p in passes]) for m in ("us_per_batch", "main_cpu_s")}
        res[side]["vs_torch"] = summary([p["us_per_batch"] / q["us_per_batch"] for p, q in zip(passes, raw["torch"])])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    machine = {"nproc": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()}
    payload = {"schema": "ringtier-bench/handoff/v1", "command": " ".join(sys.argv), "commit": commit,
               "machine": machine, "config": {k: getattr(a, k) for k in ("batches", "records", "bytes", "workers")},
               "repeats": a.repeats, "summary": res, "raw": raw}
    lines = ["| side | us per batch (min / median / max) | x torch (median, pass by pass) | main CPU s (median) |",
             "|---|---|---|---|"]
    for side, s in res.items():
        v = s["us_per_batch"]
        lines.append(f"| {side} | {v['min']:,.0f} / {v['median']:,.0f} / {v['max']:,.0f} | "
                     f"{s['vs_torch']['median']:.2f} | {s['main_cpu_s']['median']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    write_outputs(payload, text, a.json, a.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
