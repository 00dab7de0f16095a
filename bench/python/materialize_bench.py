"""Materialisation from Python: ``ringtier.torch.IterableDataset(decode=SIZE,
materialize=DIR)``. Epoch 1 decodes and resizes every JPEG and stores the pixels under DIR;
epoch 2 reads the stored pixels back. Against the same dataset without ``materialize``
(decode every epoch), interleaved, each epoch cold.

    python bench/python/materialize_bench.py --data DIR [--size 224] [--repeats 3]
        [--batch 64] [--store /tmp/mat] [--json out.json] [--md out.md]

A repeat: a fresh store directory; materialised epoch 1, materialised epoch 2 (a new loader,
as a new run would make), then the online epochs 1 and 2; caches dropped before every epoch
(store included). Figures: images/s, CPU ms per image (this process), peak RSS; ratios epoch 2
/ epoch 1 and materialised / online, pair by pair within a repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

import torch
from torch.utils.data import DataLoader

import ringtier.torch as rt

sys.path.insert(0, os.path.dirname(__file__))
from loader_bench import cpu_seconds  # noqa: E402
from miniapp import drop_caches  # noqa: E402


def train_transform(size: int):  # type: ignore[no-untyped-def]
    """The ImageNet training chain (``--transform``): RandomResizedCrop, flip, float32, Normalize."""
    from ringtier import transforms as T

    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True),
                      T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])


def epoch(data: str, size: int, batch: int, ep: int, store: Optional[str], transform: bool = False) -> Dict[str, float]:
    drop_caches(data)
    if store is not None and os.path.isdir(store):
        drop_caches(store)
    c0, t0 = cpu_seconds(), time.perf_counter()
    if transform:  # the split point of the transform chain (the whole image at 256, cropped each epoch)
        ds = rt.IterableDataset(data, transform=train_transform(size), batch_size=batch, seed=1, rank=0,
                                world_size=1, materialize=store, decode_threads=2)
    else:
        ds = rt.IterableDataset(data, decode=size, batch_size=batch, seed=1, rank=0, world_size=1,
                                materialize=store, decode_threads=2)
    ds.set_epoch(ep)
    n = 0
    for b in DataLoader(ds, batch_size=None):
        n += len(b)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds() - c0
    return {"images_per_s": n / wall, "wall_s": wall, "cpu_ms_per_image": 1000 * cpu / n, "images": n}


def summary(xs: List[float]) -> Dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--store", default="/tmp/ringtier-materialize-bench")
    ap.add_argument("--transform", action="store_true",
                    help="transform= (RandomResizedCrop(SIZE), flip, float32, Normalize) instead of decode=SIZE: "
                         "the store holds the chain's split point (256x256), the crop runs every epoch")
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    raw: Dict[str, List[Dict[str, float]]] = {k: [] for k in ("mat/1", "mat/2", "online/1", "online/2")}
    try:
        for rep in range(a.repeats):
            shutil.rmtree(a.store, ignore_errors=True)
            raw["mat/1"].append(epoch(a.data, a.size, a.batch, 2 * rep, a.store, a.transform))
            raw["mat/2"].append(epoch(a.data, a.size, a.batch, 2 * rep + 1, a.store, a.transform))
            raw["online/1"].append(epoch(a.data, a.size, a.batch, 2 * rep, None, a.transform))
            raw["online/2"].append(epoch(a.data, a.size, a.batch, 2 * rep + 1, None, a.transform))
            print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]['images_per_s']:.0f} images/s" for k, v in raw.items()),
                  flush=True)
    finally:
        store_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(a.store) for f in fs)
        shutil.rmtree(a.store, ignore_errors=True)
    stats = {k: {m: summary([p[m] for p in v]) for m in ("images_per_s", "cpu_ms_per_image")} for k, v in raw.items()}

    def ratio(x: str, y: str) -> Dict[str, float]:
        return summary([p["images_per_s"] / q["images_per_s"] for p, q in zip(raw[x], raw[y])])

    ratios = {"mat epoch 2 / mat epoch 1": ratio("mat/2", "mat/1"),
              "mat epoch 2 / online epoch 2": ratio("mat/2", "online/2"),
              "mat epoch 1 / online epoch 1": ratio("mat/1", "online/1")}
    nfiles = raw["mat/1"][0]["images"]
    machine = {
        "nproc": os.cpu_count(), "kernel": platform.release(), "torch": torch.__version__, "images": nfiles,
        "dir": os.path.abspath(a.data), "store": a.store, "store_bytes": store_bytes,
        "fs": subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", a.data], capture_output=True, text=True).stdout.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "loadavg_end": os.getloadavg(),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    lines = [
        "# Materialisation from Python: epoch 2 against epoch 1",
        "",
        f"{machine['date']}; {machine['nproc']} cores, kernel {machine['kernel']}; {nfiles} JPEGs in {machine['dir']} "
        f"({machine['fs']}); " + (f"transform=RandomResizedCrop({a.size}) + flip + float32 + Normalize (stored: the "
        f"whole image at 256x256 RGB; decode 2 threads, transform this process's cores)" if a.transform else
        f"decode={a.size} (decode + resize to {a.size}x{a.size} RGB, 2 decode threads)") + ", batch "
        f"{a.batch}, 0 workers; store {a.store} ({store_bytes / 1e6:.0f} MB at the end of the last repeat, removed); "
        f"cold before every epoch; {a.repeats} repeats; load average at the end {machine['loadavg_end'][0]:.1f}; peak "
        f"RSS {machine['peak_rss_mib']:.0f} MiB.",
        "",
        f"Command: `{' '.join([os.path.basename(sys.executable)] + sys.argv)}`",
        "",
        "| epoch | images/s min / median / max | CPU ms per image (median) |",
        "|---|---|---|",
    ]
    for k, s in stats.items():
        i = s["images_per_s"]
        lines.append(f"| {k} | {i['min']:.0f} / {i['median']:.0f} / {i['max']:.0f} | "
                     f"{s['cpu_ms_per_image']['median']:.2f} |")
    lines.append("")
    for k, r in ratios.items():
        lines.append(f"{k}, pair by pair: {r['min']:.2f} / {r['median']:.2f} / {r['max']:.2f}x (min / median / max).")
    text = "\n".join(lines)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": machine, "raw": raw, "stats": stats, "ratios": ratios, "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()
