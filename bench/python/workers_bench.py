"""ringtier.torch.IterableDataset under DataLoader workers: 0 workers against 2 and 4, batches
packed (one shared-memory tensor + offsets per batch, what the dataset yields in a worker
since issue 28), and the per-sample crossing it replaced (the dataset yielding single
samples: one shared-memory tensor per sample), on the same files, cold, interleaved.

    python bench/python/workers_bench.py --dir DIR [--workers 0,2,4] [--repeats 5]
        [--per-sample 2] [--batch 64] [--json out.json] [--md out.md]

Every pass reads every file of DIR's manifest once, in a seeded shuffled order, after
`sync; echo 3 > /proc/sys/vm/drop_caches` (root) or posix_fadvise(DONTNEED) on every file. A
pass is one epoch timed from before the dataset and DataLoader are made (worker start and each
worker's loader set-up included), as a training script's first epoch. Per pass: MB/s, CPU
seconds per GiB (this process and its workers), peak RSS of the main process and of the
largest worker. Ratios against 0 workers are taken pair by pair within a repeat.
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
from typing import Any, Dict, List, Tuple

import torch
from torch.utils.data import DataLoader

import ringtier.torch as rt

sys.path.insert(0, os.path.dirname(__file__))
from loader_bench import cpu_seconds, drop_caches, manifest_keys  # noqa: E402


def epoch_pass(dl: DataLoader, per_sample: bool) -> Tuple[int, int]:
    n = nbytes = 0
    for item in dl:
        if per_sample:
            n += 1
            nbytes += item.numel()
        elif isinstance(item, rt.PackedBatch):
            n += len(item)
            nbytes += item.data.numel()
        else:
            n += len(item)
            nbytes += sum(t.numel() for t in item)
        del item
    return n, nbytes


def one_pass(root: str, keys: List[str], workers: int, batch: int, per_sample: bool, epoch: int,
             steady: bool, records: bool = False, n_expected: int = 0) -> Dict[str, float]:
    """The first epoch, timed from before the dataset and DataLoader are made; with `steady`,
    a second cold epoch through the same DataLoader (workers persistent), timed alone."""
    c0, t0 = cpu_seconds(), time.perf_counter()
    if records:  # TFRecord shards: RecordDataset, one record at a time or batched
        ds = rt.RecordDataset(root, format="tfrecord", batched=not per_sample, batch_size=batch, seed=1, rank=0,
                              world_size=1)
    elif per_sample:
        ds = rt.IterableDataset(root, read_batch=batch, seed=1, rank=0, world_size=1)
    else:
        ds = rt.IterableDataset(root, batch_size=batch, seed=1, rank=0, world_size=1)
    want = n_expected or len(keys)
    ds.set_epoch(2 * epoch)
    dl = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=steady and workers > 0)
    n, nbytes = epoch_pass(dl, per_sample)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds() - c0
    assert n == want, (n, want)
    first = {"first_mb_s": nbytes / wall / 1e6, "first_cpu_s_per_gib": cpu / (nbytes / 2**30)}
    if steady:
        drop_caches(root, keys)
        ds.set_epoch(2 * epoch + 1)
        c0, t0 = cpu_seconds(), time.perf_counter()
        n, nbytes = epoch_pass(dl, per_sample)
        wall = time.perf_counter() - t0
        cpu = cpu_seconds() - c0
        assert n == want, (n, want)
    del dl
    return {
        **first,
        "wall_s": wall,
        "mb_s": nbytes / wall / 1e6,
        "cpu_s_per_gib": cpu / (nbytes / 2**30),
        "bytes": nbytes,
        "rss_main_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_worker_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def summary(xs: List[float]) -> Dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--workers", default="0,2,4", help="worker counts, packed batches (0: lists of views)")
    ap.add_argument("--per-sample", default="2", help="worker counts with per-sample crossing ('' for none)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--first-epoch-only", action="store_true",
                    help="time only the first epoch (set-up and worker start included); by default a second, "
                         "steady epoch through the same DataLoader (persistent workers) is the headline")
    ap.add_argument("--records", type=int, default=0,
                    help="DIR holds TFRecord shards of this many records (ringtier gen --format tfrecord): "
                         "RecordDataset(batched=True) against one record at a time")
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    if a.records:
        keys = sorted(f for f in os.listdir(a.dir) if f.endswith((".tfrecord", ".tfrecords")))
    else:
        keys = manifest_keys(a.dir)
    configs = [(f"packed/{w}" if int(w) else "0 workers", int(w), False) for w in a.workers.split(",")]
    configs += [(f"per-sample/{w}", int(w), True) for w in a.per_sample.split(",") if w]
    raw: Dict[str, List[Dict[str, float]]] = {c[0]: [] for c in configs}
    evict = ""
    for rep in range(a.repeats):
        for name, w, per_sample in configs:
            evict = drop_caches(a.dir, keys)
            r = one_pass(a.dir, keys, w, a.batch, per_sample, rep, steady=not a.first_epoch_only,
                         records=bool(a.records), n_expected=a.records)
            raw[name].append(r)
            print(f"rep {rep} {name:14s}: {r['mb_s']:7.1f} MB/s {r['cpu_s_per_gib']:5.2f} CPU s/GiB (first epoch "
                  f"{r['first_mb_s']:7.1f} MB/s)", flush=True)
    base = "0 workers"
    metrics = ("mb_s", "cpu_s_per_gib", "wall_s", "first_mb_s", "first_cpu_s_per_gib")
    stats = {n: {m: summary([p[m] for p in ps]) for m in metrics} for n, ps in raw.items()}
    pairs = {
        n: {
            "mb_s": summary([p["mb_s"] / q["mb_s"] for p, q in zip(raw[n], raw[base])]),
            "cpu_s_per_gib": summary([p["cpu_s_per_gib"] / q["cpu_s_per_gib"] for p, q in zip(raw[n], raw[base])]),
            "first_mb_s": summary([p["first_mb_s"] / q["first_mb_s"] for p, q in zip(raw[n], raw[base])]),
        }
        for n in raw
        if n != base
    }
    machine: Dict[str, Any] = {
        "nproc": os.cpu_count(),
        "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
        "kernel": platform.release(),
        "torch": torch.__version__,
        "files": len(keys),
        "bytes": raw[base][0]["bytes"],
        "dir": os.path.abspath(a.dir),
        "fs": subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", a.dir], capture_output=True, text=True).stdout.strip(),
        "evict": evict,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "loadavg_end": os.getloadavg(),
    }
    lines = [
        "# ringtier.torch." + ("RecordDataset (TFRecord shards)" if a.records else "IterableDataset")
        + " under DataLoader workers",
        "",
        f"{machine['date']}; {machine['nproc']} cores, {machine['mem_gib']:.0f} GiB, kernel {machine['kernel']}, torch "
        f"{machine['torch']}; {machine['files']} {'TFRecord shards, ' + str(a.records) + ' records' if a.records else 'files'}, {machine['bytes'] / 1e9:.2f} GB in {machine['dir']} "
        f"({machine['fs']}); cold ({machine['evict']} before every pass); batch {a.batch}; {a.repeats} interleaved "
        f"repeats; " + ("a pass is one epoch from before the DataLoader is made (worker start included)"
                      if a.first_epoch_only else
                      "headline: a steady epoch (the second through the same DataLoader, workers persistent, each "
                      "worker's loader made once), cold like the first; last column: the first epoch, from before "
                      "the DataLoader is made (worker start and loader set-up included)") +
        f"; load average at the end {machine['loadavg_end'][0]:.1f}.",
        "",
        f"Command: `{' '.join([os.path.basename(sys.executable)] + sys.argv)}`",
        "",
        "| configuration | MB/s min / median / max | x 0 workers, pair by pair (min / median / max) | CPU s/GiB "
        "min / median / max | CPU x 0 workers (median) | first epoch MB/s (median), x 0 workers pair by pair |",
        "|---|---|---|---|---|---|",
    ]
    for n, s in stats.items():
        m, c = s["mb_s"], s["cpu_s_per_gib"]
        pr = pairs.get(n)
        ratio = f"{pr['mb_s']['min']:.2f} / {pr['mb_s']['median']:.2f} / {pr['mb_s']['max']:.2f}" if pr else "1"
        cr = f"{pr['cpu_s_per_gib']['median']:.2f}" if pr else "1"
        f1 = s["first_mb_s"]["median"]
        fr = (f"{pr['first_mb_s']['min']:.2f} / {pr['first_mb_s']['median']:.2f} / {pr['first_mb_s']['max']:.2f}"
              if pr else "1")
        lines.append(f"| {n} | {m['min']:.0f} / {m['median']:.0f} / {m['max']:.0f} | {ratio} | "
                     f"{c['min']:.2f} / {c['median']:.2f} / {c['max']:.2f} | {cr} | {f1:.0f}, {fr} |")
    rss_main = max(p["rss_main_mib"] for ps in raw.values() for p in ps)
    rss_worker = max(p["rss_worker_mib"] for ps in raw.values() for p in ps)
    lines += ["", f"Peak RSS: main process {rss_main:.0f} MiB, largest worker {rss_worker:.0f} MiB."]
    text = "\n".join(lines)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": machine, "raw": raw, "stats": stats, "pairs": pairs, "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()
