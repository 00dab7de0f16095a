"""The paper's mini-app from Python (Chien et al., PDSW 2018, experiment 2): a training loop
whose input pipeline reads small images, with and without prefetch; with prefetch, input and
compute overlap and the step no longer waits for its batch.

    python bench/python/miniapp.py --data DIR [--step-ms 0,20,40,80] [--steps 60] [--repeats 3]
        [--batch 64] [--size 96] [--json out.json] [--md out.md]

DIR is an ImageFolder of JPEGs (``ringtier gen --format jpeg --preset caltech101 --dir DIR``:
Caltech-101-sized images, median 12 KB). The loop is ``ringtier.torch.ImageFolder`` with
RandomResizedCrop(size), RandomHorizontalFlip, ToDtype(float32, scale) and Normalize (decoded
and transformed on Rust threads), in a ``DataLoader`` with 0 workers; the step is an emulated
accelerator step of ``--step-ms`` (a sleep: the CPU is left to the input pipeline, as with a
GPU). Without prefetch: ``prefetch=0, depth=0`` (each batch read and decoded when asked); with:
the defaults (2 batches read ahead, 2 decoding). Stall % = time waiting for the next batch /
loop time. Step 0 measures the pipeline alone: the rate the CPU keeps up with. Caches are
dropped before every run; runs interleave (off, on, off, on, ...) for each step time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

import torch
from torch.utils.data import DataLoader

import ringtier.torch as rt
from ringtier import transforms as T

sys.path.insert(0, os.path.dirname(__file__))
from loader_bench import cpu_seconds  # noqa: E402


def drop_caches(root: str) -> str:
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        for d, _, files in os.walk(root):
            for n in files:
                fd = os.open(os.path.join(d, n), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        return "fadvise"


def run(data: str, prefetch: bool, step_ms: float, steps: int, batch: int, size: int, seed: int) -> Dict[str, float]:
    tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True),
                    T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    opts: Dict[str, Any] = {} if prefetch else {"prefetch": 0, "depth": 0}
    ds = rt.ImageFolder(data, transform=tf, batch_size=batch, seed=seed, drop_last=True, **opts)
    dl = DataLoader(ds, batch_size=None, num_workers=0)
    done = images = 0
    wait = 0.0
    waits: List[float] = []
    first_of_epoch: List[bool] = []
    epoch = 0
    c0 = cpu_seconds()
    t_start = time.perf_counter()
    while done < steps:
        ds.set_epoch(epoch)
        it = iter(dl)
        done_in_epoch = 0
        while done < steps:
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            waited = time.perf_counter() - t0
            wait += waited
            waits.append(waited)
            first_of_epoch.append(done_in_epoch == 0)
            done_in_epoch += 1
            if step_ms > 0:
                time.sleep(step_ms / 1000)  # the accelerator's step: the CPU is free meanwhile
            done += 1
            images += x.shape[0]
        epoch += 1
    wall = time.perf_counter() - t_start
    cpu = cpu_seconds() - c0
    # The pipeline's fill: the first batch of the run (loader set-up, first reads and decodes)
    # and of each later epoch (the order of a new epoch starts there).
    fill = sum(w for w, f in zip(waits, first_of_epoch) if f)
    return {"images_per_s": images / wall, "stall_pct": 100 * wait / wall, "wall_s": wall,
            "steady_stall_pct": 100 * (wait - fill) / (wall - fill),
            "fill_s": fill, "epochs": float(sum(first_of_epoch)),
            "median_wait_ms": 1000 * statistics.median(waits),
            "cpu_ms_per_image": 1000 * cpu / images, "step_ms_loop": 1000 * wall / done}


def summary(xs: List[float]) -> Dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--step-ms", default="0,20,40,80")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    step_list = [float(s) for s in a.step_ms.split(",")]
    raw: Dict[str, List[Dict[str, float]]] = {}
    evict = ""
    for rep in range(a.repeats):
        for ms in step_list:
            for pf in (False, True):
                evict = drop_caches(a.data)
                r = run(a.data, pf, ms, a.steps, a.batch, a.size, seed=rep)
                name = f"step {ms:g} ms, prefetch {'on' if pf else 'off'}"
                raw.setdefault(name, []).append(r)
                print(f"rep {rep} {name}: {r['images_per_s']:.0f} images/s, stall {r['stall_pct']:.1f}%, steady "
                      f"{r['steady_stall_pct']:.1f}%", flush=True)
    stats = {n: {m: summary([p[m] for p in ps]) for m in ps[0]} for n, ps in raw.items()}
    nfiles = sum(len(f) for _, _, f in os.walk(a.data))
    machine = {
        "nproc": os.cpu_count(), "kernel": platform.release(), "torch": torch.__version__, "files": nfiles,
        "dir": os.path.abspath(a.data),
        "fs": subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", a.data], capture_output=True, text=True).stdout.strip(),
        "evict": evict, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "loadavg_end": os.getloadavg(),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    lines = [
        "# The mini-app from Python: stall with and without prefetch",
        "",
        f"{machine['date']}; {machine['nproc']} cores, kernel {machine['kernel']}, torch {machine['torch']}; "
        f"{nfiles} JPEGs in {machine['dir']} ({machine['fs']}); cold ({evict} before every run); batch {a.batch}, "
        f"RandomResizedCrop({a.size}) + flip + float32 + Normalize in ringtier.torch.ImageFolder, 0 workers; "
        f"{a.steps} steps per run, {a.repeats} interleaved repeats; emulated accelerator step (sleep); load average at "
        f"the end {machine['loadavg_end'][0]:.1f}; peak RSS {machine['peak_rss_mib']:.0f} MiB.",
        "",
        f"Command: `{' '.join([os.path.basename(sys.executable)] + sys.argv)}`",
        "",
        "Stall % is the share of the loop spent waiting for the next batch; steady stall % leaves out the "
        "pipeline's fill (the wait for the first batch of the run and of each later epoch: loader set-up, the "
        "first reads and decodes; median fill and epochs in the last columns).",
        "",
        "| configuration | images/s min / median / max | stall % min / median / max | steady stall % min / median / "
        "max | loop ms per step (median) | CPU ms per image (median) | fill s (median), epochs |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, s in stats.items():
        i, st = s["images_per_s"], s["stall_pct"]
        ss = s["steady_stall_pct"]
        lines.append(f"| {n} | {i['min']:.0f} / {i['median']:.0f} / {i['max']:.0f} | {st['min']:.1f} / "
                     f"{st['median']:.1f} / {st['max']:.1f} | {ss['min']:.1f} / {ss['median']:.1f} / {ss['max']:.1f} | "
                     f"{s['step_ms_loop']['median']:.1f} | {s['cpu_ms_per_image']['median']:.2f} | "
                     f"{s['fill_s']['median']:.2f}, {s['epochs']['median']:.0f} |")
    text = "\n".join(lines)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": machine, "raw": raw, "stats": stats, "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()
