"""The first batch of a many-small-files data set (issue 37): how long a training script
waits, cold, from making the dataset to holding its first batch, and what the listing costs
in memory, for ringtier's three ways of listing against torchvision's DatasetFolder.

    python bench/scale/first_batch.py --dir DIR [--repeats 5] [--batch 256]
        [--sides stat,dirents,cached,torchvision] [--epoch] [--json out.json] [--md out.md]

DIR is made by bench/scale/make_files.py (1,000 class directories of 1-3 KB files). Sides:

- ``stat``: ``ringtier.torch.IterableDataset(DIR, batch_size=B, stat_files=True,
  listing_cache=False)``: every file stat'd (what the loader did before issue 37);
- ``dirents``: ``stat_files=False, listing_cache=False``: directories read with ``getdents``
  and ``d_type``, no stat per file, sizes learned from the reads (the buffers sized by 256
  stats);
- ``cached``: ``listing_cache=True`` with ``DIR/.ringtier-listing`` current (made once before
  the passes): the listing read from one file after checking every directory's times;
- ``torchvision``: ``torchvision.datasets.DatasetFolder(DIR, loader=<read bytes>,
  extensions=(".bin",))`` in ``DataLoader(batch_size=B, shuffle=True, num_workers=0,
  collate_fn=list)``.

Each ringtier side is ``DataLoader(ds, batch_size=None, num_workers=0)``. Every pass is a
fresh process, after ``sync; echo 3 > /proc/sys/vm/drop_caches`` (page cache, dentries and
inodes: a cold listing needs all three gone; root only), sides interleaved A, B, C, D, A, ...
A pass times from before the dataset is made to the first batch in hand (imports excluded),
and reports the process's CPU seconds, the resident memory after imports and at the first
batch, and (ringtier) the listing's own bytes. ``--epoch`` reads the rest of the epoch too and
reports files/s for the whole pass. Ratios are taken against torchvision pair by pair.
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

SIDES = ("stat", "dirents", "cached", "torchvision")

from _common import drop_caches, summary, write_outputs  # noqa: E402 (beside this script)


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def child(side: str, root: str, batch: int, epoch: bool) -> Dict[str, Any]:
    import torch  # noqa: F401  (imported before the clock starts, as a script would)
    from torch.utils.data import DataLoader

    if side == "torchvision":
        import torchvision
    else:
        import ringtier.torch as rt
    rss0 = rss_mib()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    listing_bytes = None
    if side == "torchvision":

        def read(path: str) -> bytes:
            with open(path, "rb") as f:
                return f.read()

        ds = torchvision.datasets.DatasetFolder(root, loader=read, extensions=(".bin",))
        dl = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=0, collate_fn=list)
        count = lambda b: len(b)  # noqa: E731
    else:
        ds = rt.IterableDataset(
            root, batch_size=batch, seed=1, rank=0, world_size=1, stat_files=side == "stat", listing_cache=side == "cached"
        )
        dl = DataLoader(ds, batch_size=None, num_workers=0)
        count = lambda b: len(b)  # noqa: E731
    it = iter(dl)
    first = next(it)
    t_first = time.perf_counter() - t0
    rss_first = rss_mib()
    n = count(first)
    if side != "torchvision":
        info = ds.loader().listing
        listing_bytes = info["bytes"]
        assert info["from_cache"] == (side == "cached"), info
    del first
    out: Dict[str, Any] = {"first_batch_s": t_first, "rss_imports_mib": rss0, "rss_first_batch_mib": rss_first,
                           "listing_bytes": listing_bytes}
    if epoch:
        for b in it:
            n += count(b)
        out["epoch_s"] = time.perf_counter() - t0
        out["files"] = n
        out["files_per_s"] = n / out["epoch_s"]
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    out["cpu_s"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out



def run_pass(side: str, a: argparse.Namespace) -> Dict[str, Any]:
    drop_caches()
    cmd = [sys.executable, __file__, "--child", side, "--dir", a.dir, "--batch", str(a.batch)] + (["--epoch"] if a.epoch else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{side}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--epoch", action="store_true")
    ap.add_argument("--child")
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.dir, a.batch, a.epoch)))
        return 0
    sides = a.sides.split(",")
    files = sum(len(os.listdir(os.path.join(a.dir, d))) for d in os.listdir(a.dir) if not d.startswith("."))
    if "cached" in sides:
        # The cache, made once (the directories are older than the two-second window).
        subprocess.run([sys.executable, "-c", "import ringtier, sys; l = ringtier.Loader(sys.argv[1]); "
                        "l2 = ringtier.Loader(sys.argv[1]); assert l2.listing['from_cache'], l2.listing", a.dir],
                       check=True, timeout=3600)
    raw: Dict[str, List[Dict[str, Any]]] = {s: [] for s in sides}
    for r in range(a.repeats):
        for s in sides:
            raw[s].append(run_pass(s, a))
            p = raw[s][-1]
            print(f"repeat {r} {s:12s} first batch {p['first_batch_s']:7.2f} s  cpu {p['cpu_s']:6.2f} s  "
                  f"rss {p['rss_first_batch_mib'] - p['rss_imports_mib']:7.1f} MiB over imports"
                  + (f"  epoch {p['epoch_s']:.1f} s {p['files_per_s']:.0f} files/s" if a.epoch else ""), flush=True)
    res: Dict[str, Any] = {}
    for s in sides:
        res[s] = {k: summary([p[k] for p in raw[s]]) for k in ("first_batch_s", "cpu_s", "rss_first_batch_mib",
                                                                  "peak_rss_mib")}
        res[s]["rss_over_imports_mib"] = summary([p["rss_first_batch_mib"] - p["rss_imports_mib"] for p in raw[s]])
        if raw[s][0].get("listing_bytes") is not None:
            res[s]["listing_bytes_per_file"] = raw[s][0]["listing_bytes"] / files
        if a.epoch:
            res[s]["files_per_s"] = summary([p["files_per_s"] for p in raw[s]])
        if "torchvision" in sides and s != "torchvision":
            res[s]["first_batch_vs_torchvision"] = summary(
                [p["first_batch_s"] / q["first_batch_s"] for p, q in zip(raw[s], raw["torchvision"])])
    machine = {"nproc": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
               "fs": subprocess.run(["stat", "-f", "-c", "%T", a.dir], capture_output=True, text=True).stdout.strip(),
               "evict": "sync; echo 3 > /proc/sys/vm/drop_caches before every pass"}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    payload = {"schema": "ringtier-bench/first-batch/v1", "command": " ".join(sys.argv), "commit": commit,
               "machine": machine, "files": files, "batch": a.batch, "repeats": a.repeats, "summary": res, "raw": raw}
    lines = [f"# First batch, {files:,} files of 1-3 KB in 1,000 directories, cold, batch {a.batch}", "",
             "| side | first batch s (min/median/max) | vs torchvision | CPU s | RSS over imports MiB | listing B/file |"
             + (" files/s |" if a.epoch else ""),
             "|---|---|---|---|---|---|" + ("---|" if a.epoch else "")]
    for s in sides:
        f = res[s]["first_batch_s"]
        vs = res[s].get("first_batch_vs_torchvision")
        lines.append(f"| {s} | {f['min']:.2f} / {f['median']:.2f} / {f['max']:.2f} | "
                     + (f"{vs['median']:.3f}x |" if vs else "- |")
                     + f" {res[s]['cpu_s']['median']:.2f} | {res[s]['rss_over_imports_mib']['median']:.0f} | "
                     + (f"{res[s]['listing_bytes_per_file']:.1f} |" if "listing_bytes_per_file" in res[s] else "- |")
                     + (f" {res[s]['files_per_s']['median']:,.0f} |" if a.epoch else ""))
    text = "\n".join(lines) + "\n"
    print(text)
    write_outputs(payload, text, a.json, a.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
