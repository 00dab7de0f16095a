"""Input pipeline: ringtier.torch.IterableDataset against PyTorch's DataLoader over a
map-style dataset that reads each file with open().read(), on the same files, cold.

    python bench/python/loader_bench.py --dir /data/inet [--workers 0,1,2,4,8] [--repeats 3]
        [--ringtier-workers 0,2] [--batch 64] [--json out.json] [--md out.md]

Every pass reads every file of the directory's manifest once, in a seeded shuffled order, in
batches of 64, after `sync; echo 3 > /proc/sys/vm/drop_caches` (root) or, without root,
posix_fadvise(DONTNEED) on every file. Configurations run interleaved (A, B, C, A, B, C, ...).
Per pass: wall seconds, MB/s, CPU seconds (this process and its DataLoader workers: getrusage,
and /proc for workers still running) per GiB. A pass times a configuration's first epoch (set-up
included) and then a second, steady epoch through the same objects (`--first-epoch-only` skips
it); the headline figures are the steady epoch's. Prints min/median/max per configuration and each configuration's ratio to
the DataLoader's best median.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Tuple

import torch
from torch.utils.data import DataLoader, Dataset

import ringtier.torch as rt

MANIFEST = ".ringtier-manifest.tsv"


def manifest_keys(root: str) -> List[str]:
    keys = []
    with open(os.path.join(root, MANIFEST)) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            keys.append(line.split("\t")[0])
    return keys


def drop_caches(root: str, keys: List[str]) -> str:
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        for k in keys:
            fd = os.open(os.path.join(root, k), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise"


class OpenReadDataset(Dataset):  # type: ignore[type-arg]
    """What a PyTorch user writes: one file per item, open().read()."""

    def __init__(self, root: str, keys: List[str]) -> None:
        self.paths = [os.path.join(root, k) for k in keys]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.paths[i], "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)


def pack(samples: List[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """A batch as one tensor of the samples end to end plus their lengths: one shared-memory
    transfer per batch from a DataLoader worker instead of one per sample."""
    lengths = torch.tensor([t.numel() for t in samples], dtype=torch.int64)
    return torch.cat(samples), lengths


def live_children_cpu() -> float:
    """CPU seconds of this process's children still running (persistent DataLoader workers),
    which RUSAGE_CHILDREN counts only once they are reaped."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids = f.read().split()
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def cpu_seconds() -> float:
    """This process, its reaped children and its running children."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime + live_children_cpu()


def run_cli(cli: str, root: str, depth: int) -> Dict[str, float]:
    """One cold pass of `ringtier bench read` (uring-direct, one ring, the loader's depth)."""
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"rt-bench-read-{os.getpid()}.json")
    cmd = [cli, "bench", "read", "--dir", root, "--engines", "uring-direct", "--depths", str(depth), "--repeats", "1",
           "--json", out]
    subprocess.run(cmd, check=True, capture_output=True)
    with open(out) as f:
        d = json.load(f)
    os.unlink(out)
    p = d["points"][0]
    mb_s = p["mb_per_sec"]["median"] if "mb_per_sec" in p else d["headline"]["best_overall"]["mb_per_sec_median"]
    nbytes = d["dataset"]["bytes"]
    return {"wall_s": nbytes / 1e6 / mb_s, "mb_s": mb_s, "cpu_s_per_gib": p["cpu_seconds_per_gib"]["median"],
            "bytes": nbytes}


def epoch_pass(dl: DataLoader, packed: bool, n_keys: int, what: str) -> Tuple[int, int]:
    """Iterates one epoch of `dl`; returns (samples, bytes)."""
    n = nbytes = 0
    for b in dl:
        if packed:
            nbytes += b[0].numel()
            n += b[1].numel()
        else:
            for t in b:
                nbytes += t.numel()
                n += 1
    assert n == n_keys, (what, n, n_keys)
    return n, nbytes


def run_pass(
    kind: str, workers: int, root: str, keys: List[str], batch: int, epoch: int, packed: bool, prefetch: int = 2,
    steady: bool = True,
) -> Dict[str, float]:
    """One configuration's pass: its first epoch, timed from before the dataset and DataLoader
    are made (the loader's set-up, DataLoader workers' start), then, with `steady`, one more
    cold epoch through the same objects (what every later epoch of a training run costs:
    ringtier's loader is made once per process; DataLoader workers persist, as
    `persistent_workers=True` keeps them). The headline figures are the steady epoch's."""
    collate = pack if packed else list
    c0, t0 = cpu_seconds(), time.perf_counter()
    if kind == "dataloader":
        g = torch.Generator().manual_seed(epoch)
        dl = DataLoader(
            OpenReadDataset(root, keys), batch_size=batch, shuffle=True, generator=g, num_workers=workers,
            collate_fn=collate, persistent_workers=steady and workers > 0,
        )
    else:
        ds = rt.IterableDataset(root, batch_size=batch, seed=1, rank=0, world_size=1, prefetch=prefetch)
        ds.set_epoch(2 * epoch)
        dl = DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=collate,
                        persistent_workers=steady and workers > 0)
    _, nbytes = epoch_pass(dl, packed, len(keys), f"{kind}/{workers}")
    wall = time.perf_counter() - t0
    cpu = cpu_seconds() - c0
    out = {"first_wall_s": wall, "first_mb_s": nbytes / wall / 1e6, "first_cpu_s_per_gib": cpu / (nbytes / 2**30),
           "bytes": nbytes}
    if steady:
        drop_caches(root, keys)
        if kind != "dataloader":
            ds.set_epoch(2 * epoch + 1)
        c0, t0 = cpu_seconds(), time.perf_counter()
        _, nbytes = epoch_pass(dl, packed, len(keys), f"{kind}/{workers}")
        wall = time.perf_counter() - t0
        cpu = cpu_seconds() - c0
    del dl
    out.update({"wall_s": wall, "mb_s": nbytes / wall / 1e6, "cpu_s_per_gib": cpu / (nbytes / 2**30)})
    return out


def summary(xs: List[float]) -> Dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--workers", default="0,1,2,4,8")
    ap.add_argument("--ringtier-workers", default="0,2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prefetch", type=int, default=2, help="ringtier's batches read ahead")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--packed", action="store_true",
                    help="collate each batch into one tensor + lengths (one transfer per batch from a worker)")
    ap.add_argument("--first-epoch-only", action="store_true",
                    help="time only each configuration's first epoch, set-up included (the default also times a "
                         "second, steady epoch through the same loader / persistent workers and reports both)")
    ap.add_argument("--cli", help="the ringtier binary: adds `ringtier bench read` (uring-direct, depth 32) passes")
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    keys = manifest_keys(a.dir)
    configs = [("ringtier", int(w)) for w in a.ringtier_workers.split(",")]
    configs += [("dataloader", int(w)) for w in a.workers.split(",")]
    if a.cli:
        configs.insert(0, ("bench-read", 32))
    raw: Dict[str, List[Dict[str, float]]] = {f"{k}/{w}": [] for k, w in configs}
    evict = ""
    for rep in range(a.repeats):
        for kind, w in configs:
            evict = drop_caches(a.dir, keys)
            if kind == "bench-read":
                r = run_cli(a.cli, a.dir, w)
            else:
                r = run_pass(kind, w, a.dir, keys, a.batch, epoch=rep, packed=a.packed, prefetch=a.prefetch,
                             steady=not a.first_epoch_only)
            raw[f"{kind}/{w}"].append(r)
            first = "" if kind == "bench-read" else f"  (first epoch {r['first_mb_s']:7.1f} MB/s)"
            print(f"rep {rep} {kind:10s} conc {w}: {r['mb_s']:8.1f} MB/s  {r['cpu_s_per_gib']:6.2f} CPU s/GiB{first}",
                  flush=True)
    stats = {
        name: {
            m: summary([p[m] for p in passes])
            for m in ("wall_s", "mb_s", "cpu_s_per_gib", "first_wall_s", "first_mb_s", "first_cpu_s_per_gib")
            if m in passes[0]
        }
        for name, passes in raw.items()
    }
    dl_names = [n for n in stats if n.startswith("dataloader/")]
    best_dl = max(dl_names, key=lambda n: stats[n]["mb_s"]["median"])
    best_cpu = min(dl_names, key=lambda n: stats[n]["cpu_s_per_gib"]["median"])
    machine = {
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "files": len(keys),
        "bytes": raw[next(iter(raw))][0]["bytes"],
        "dir": os.path.abspath(a.dir),
        "fs": subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", a.dir], capture_output=True, text=True).stdout.strip(),
        "evict": evict,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "loadavg": os.getloadavg(),
    }
    lines = [
        f"# Python input pipeline: ringtier IterableDataset vs DataLoader + open().read()",
        "",
        f"{machine['date']}; {machine['nproc']} cores, kernel {machine['kernel']}, torch {machine['torch']}; "
        f"{machine['files']} files, {machine['bytes'] / 1e9:.2f} GB in {machine['dir']} ({machine['fs']}); "
        f"cold ({machine['evict']} before every pass); batch {a.batch}; {a.repeats} interleaved repeats; collate: "
        f"{'one packed tensor + lengths per batch' if a.packed else 'a list of one tensor per sample'}; "
        f"load average at the end {os.getloadavg()[0]:.1f} (other work on the machine).",
        "",
        f"Command: `{' '.join([os.path.basename(sys.executable)] + sys.argv)}`",
        "",
        ("Headline figures: " + ("each configuration's first epoch, its set-up included (`--first-epoch-only`)."
                                 if a.first_epoch_only else
                                 "a steady epoch, the second through the same objects (ringtier's loader made once per "
                                 "process; DataLoader workers persistent), cold like the first; the last column is the "
                                 "first epoch, timed from before the dataset and DataLoader are made (set-up and worker "
                                 "start included).")),
        "",
        "| configuration | MB/s min / median / max | x best DataLoader | CPU s/GiB min / median / max | x DataLoader's lowest "
        "| first epoch MB/s min / median / max |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in stats.items():
        m, c = s["mb_s"], s["cpu_s_per_gib"]
        lines.append(
            f"| {name} workers | {m['min']:.0f} / {m['median']:.0f} / {m['max']:.0f} | "
            f"{m['median'] / stats[best_dl]['mb_s']['median']:.2f} | {c['min']:.2f} / {c['median']:.2f} / {c['max']:.2f} | "
            f"{c['median'] / stats[best_cpu]['cpu_s_per_gib']['median']:.2f} | "
            + (f"{s['first_mb_s']['min']:.0f} / {s['first_mb_s']['median']:.0f} / {s['first_mb_s']['max']:.0f} |"
               if "first_mb_s" in s and not a.first_epoch_only else "- |")
        )
    lines += ["", f"Best DataLoader by throughput: {best_dl}; lowest CPU per GiB: {best_cpu}."]
    # Ratios pair by pair: each ringtier pass against the baseline's pass of the same repeat.
    pairs: Dict[str, Dict[str, float]] = {}
    for name in stats:
        if not name.startswith("ringtier/"):
            continue
        against = [(best_dl, f"the best DataLoader ({best_dl} workers)")]
        if "bench-read/32" in stats:
            against.append(("bench-read/32", "`ringtier bench read` (uring-direct, depth 32, one thread, no Python)"))
        for ref, what in against:
            r = [p["mb_s"] / q["mb_s"] for p, q in zip(raw[name], raw[ref])]
            c = [p["cpu_s_per_gib"] / q["cpu_s_per_gib"] for p, q in zip(raw[name], raw[ref])]
            pairs[f"{name} / {ref}"] = {"mb_s": summary(r), "cpu_s_per_gib": summary(c)}
            lines.append(
                f"{name} workers against {what}, pair by pair (min / median / max): throughput "
                f"{min(r):.2f} / {statistics.median(r):.2f} / {max(r):.2f}x, CPU per GiB "
                f"{min(c):.2f} / {statistics.median(c):.2f} / {max(c):.2f}x."
            )
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
