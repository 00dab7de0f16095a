"""A node of ranks (issue 37): R ranks under ``torchrun --standalone --nproc-per-node R`` on one
machine, each with W DataLoader workers, over one data set of small files
(bench/scale/make_files.py); ringtier's ``IterableDataset`` against torchvision's
``DatasetFolder`` with a ``DistributedSampler``; cold, interleaved, one torchrun per pass.

    python bench/scale/ranks.py --dir DIR [--ranks 1,2,4] [--workers 0,2] [--repeats 3]
        [--sides ringtier,torchvision] [--verify] [--json out.json] [--md out.md]

Each pass is one epoch after ``sync; echo 3 > /proc/sys/vm/drop_caches`` (root), timed in each
rank from before its dataset is made (listing from the cache beside the data, worker start
included; imports not). ringtier: ``IterableDataset(DIR, batch_size=256, seed=1)`` through
``DataLoader(ds, batch_size=None, num_workers=W)``, rank and world from torch.distributed;
torchvision: ``DatasetFolder(DIR, loader=<read bytes>, extensions=(".bin",))`` with
``DistributedSampler(shuffle=True, seed=1)`` in ``DataLoader(batch_size=256, num_workers=W,
collate_fn=list)``.

Per pass: the node's samples/s (all ranks' samples over the slowest rank's time), CPU seconds
per 1,000 samples (every rank and its workers), peak RSS of each rank's main process and of
its largest worker; per rank, the engine threads it ran with (``RINGTIER_ENGINE_THREADS`` as
the dataset set it: the cores this process may run on, over the ranks on the node
(``LOCAL_WORLD_SIZE``) and the rank's workers).

``--verify``: after the timed passes, one more pass of ringtier per (ranks, workers) in which
every rank records each sample's key and CRC-32; the parent checks that the node read every
file of DIR exactly once, with the bytes make_files.py wrote (regenerated from its seed and
file count, which ``--seed``/``--files`` must match).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from typing import Any, Dict, List

HERE = os.path.abspath(__file__)

from _common import drop_caches, summary, write_outputs  # noqa: E402 (beside this script)


# ------------------------------------------------------------------ one rank ----------------


def rank_main(side: str, root: str, workers: int, out: str, verify: bool) -> None:
    import torch  # noqa: F401  (imported before the clock, as every side needs it)
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if side == "torchvision":
        import torchvision
        from torch.utils.data.distributed import DistributedSampler
    else:
        import ringtier.torch as rt
        from ringtier.torch._packed import PackedBatch
    dist.barrier()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    seen: List[Any] = []
    n = nbytes = 0
    if side == "torchvision":

        def read(path: str) -> bytes:
            with open(path, "rb") as f:
                return f.read()

        ds = torchvision.datasets.DatasetFolder(root, loader=read, extensions=(".bin",))
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=1)
        dl = DataLoader(ds, batch_size=256, sampler=sampler, num_workers=workers, collate_fn=list)
        for batch in dl:
            n += len(batch)
            nbytes += sum(len(b) for b, _ in batch)
    else:
        ds = rt.IterableDataset(root, batch_size=256, seed=1, with_keys=verify)
        dl = DataLoader(ds, batch_size=None, num_workers=workers)
        for batch in dl:
            if isinstance(batch, PackedBatch):
                n += len(batch.offsets) - 1
                nbytes += int(batch.offsets[-1])
                if verify:
                    data = batch.data.numpy().tobytes()
                    offs = [int(o) for o in batch.offsets]
                    seen += [(k, zlib.crc32(data[a:b]), b - a) for k, a, b in zip(batch.keys, offs, offs[1:])]
            else:
                for item in batch:
                    key, t = item if verify else (None, item)
                    n += 1
                    nbytes += t.numel()
                    if verify:
                        seen.append((key, zlib.crc32(t.numpy().tobytes()), t.numel()))
            del batch
    wall = time.perf_counter() - t0
    del dl
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    rc = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = {
        "rank": rank,
        "samples": n,
        "bytes": nbytes,
        "wall_s": wall,
        "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime) + rc.ru_utime + rc.ru_stime,
        "rss_main_mib": r1.ru_maxrss / 1024,
        "rss_worker_mib": rc.ru_maxrss / 1024,
        "engine_threads": os.environ.get("RINGTIER_ENGINE_THREADS"),
    }
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(res, f)
    if verify:
        with open(os.path.join(out, f"seen-{rank}.json"), "w") as f:
            json.dump(seen, f)
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------ the parent --------------



def one_pass(side: str, root: str, ranks: int, workers: int, verify: bool) -> Dict[str, Any]:
    drop_caches()
    with tempfile.TemporaryDirectory(prefix="ranks-") as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", HERE,
               "--rank-main", side, root, str(workers), out] + (["--verify"] if verify else [])
        env = {k: v for k, v in os.environ.items() if k != "RINGTIER_ENGINE_THREADS"}
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        outer = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{side} ranks={ranks} workers={workers} failed:\n{proc.stderr[-3000:]}")
        per_rank = [json.load(open(os.path.join(out, f"rank-{r}.json"))) for r in range(ranks)]
        seen = []
        if verify:
            for r in range(ranks):
                seen += json.load(open(os.path.join(out, f"seen-{r}.json")))
    samples = sum(r["samples"] for r in per_rank)
    slowest = max(r["wall_s"] for r in per_rank)
    cpu = sum(r["cpu_s"] for r in per_rank)
    res = {
        "samples": samples,
        "bytes": sum(r["bytes"] for r in per_rank),
        "wall_s": slowest,
        "torchrun_wall_s": outer,
        "per_s": samples / slowest,
        "cpu_s_per_1000": cpu / max(samples, 1) * 1000,
        "rss_main_mib": [r["rss_main_mib"] for r in per_rank],
        "rss_worker_mib": [r["rss_worker_mib"] for r in per_rank],
        "engine_threads": [r["engine_threads"] for r in per_rank],
    }
    if verify:
        res["seen"] = seen
    return res


def expected_files(root: str, files: int, classes: int, seed: int) -> Dict[str, Any]:
    """What make_files.py wrote, regenerated: key -> (CRC-32, size)."""
    rng = random.Random(seed)
    pool = rng.randbytes(1 << 20)
    out = {}
    for i in range(files):
        size = rng.randint(1024, 3072)
        at = rng.randrange(0, len(pool) - size)
        out[f"c{i % classes:04d}/{i:07d}.bin"] = (zlib.crc32(pool[at : at + size]), size)
    return out


def check_exactly_once(seen: List[Any], expected: Dict[str, Any]) -> Dict[str, Any]:
    counts: Dict[str, int] = {}
    bad = []
    for key, crc, size in seen:
        counts[key] = counts.get(key, 0) + 1
        if expected.get(key) != (crc, size):
            bad.append(key)
    twice = [k for k, c in counts.items() if c > 1]
    missing = [k for k in expected if k not in counts]
    return {
        "samples": len(seen),
        "distinct": len(counts),
        "expected": len(expected),
        "read_twice": len(twice),
        "missing": len(missing),
        "bytes_wrong": len(bad),
        "examples": {"twice": twice[:3], "missing": missing[:3], "wrong": bad[:3]},
        "ok": not twice and not missing and not bad and len(counts) == len(expected),
    }



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--sides", default="ringtier,torchvision")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--files", type=int, default=1_000_000, help="make_files.py --files (for --verify)")
    ap.add_argument("--classes", type=int, default=1000, help="make_files.py --classes (for --verify)")
    ap.add_argument("--seed", type=int, default=37, help="make_files.py --seed (for --verify)")
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--rank-main", nargs=4, metavar=("SIDE", "DIR", "WORKERS", "OUT"))
    a = ap.parse_args()
    if a.rank_main:
        side, root, workers, out = a.rank_main
        rank_main(side, root, int(workers), out, a.verify)
        return 0
    # The tree measured: read before the passes (a commit made while they run is not it).
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(HERE)).stdout.strip()
    except OSError:  # no git
        commit = ""
    if not a.dir:
        ap.error("--dir is required")
    ranks = [int(x) for x in a.ranks.split(",")]
    workers = [int(x) for x in a.workers.split(",")]
    sides = [s for s in a.sides.split(",") if s]
    cases = [(s, r, w) for r in ranks for w in workers for s in sides]
    runs: Dict[str, List[Dict[str, Any]]] = {f"{s} r{r} w{w}": [] for s, r, w in cases}
    for rep in range(a.repeats):
        for s, r, w in cases:
            res = one_pass(s, a.dir, r, w, False)
            runs[f"{s} r{r} w{w}"].append(res)
            print(f"repeat {rep + 1}/{a.repeats} {s:<11} ranks {r} workers {w}: {res['per_s']:9.0f} samples/s, "
                  f"{res['cpu_s_per_1000']:.3f} CPU s/1000, rank RSS {max(res['rss_main_mib']):.0f} MiB, "
                  f"engine threads {res['engine_threads']}", flush=True)
    verify = {}
    if a.verify:
        expected = expected_files(a.dir, a.files, a.classes, a.seed)
        for r in ranks:
            for w in workers:
                res = one_pass("ringtier", a.dir, r, w, True)
                verify[f"r{r} w{w}"] = check_exactly_once(res.pop("seen"), expected)
                print(f"verify ranks {r} workers {w}: {verify[f'r{r} w{w}']}", flush=True)
    table = {}
    for name, rs in runs.items():
        side, r, w = name.split()
        base = runs.get(f"{side} r1 w0")
        table[name] = {
            "per_s": summary([x["per_s"] for x in rs]),
            "cpu_s_per_1000": summary([x["cpu_s_per_1000"] for x in rs]),
            "rss_main_mib_max": max(max(x["rss_main_mib"]) for x in rs),
            "rss_worker_mib_max": max(max(x["rss_worker_mib"]) for x in rs),
            "engine_threads": rs[0]["engine_threads"],
            "x_one_rank_no_workers": summary([x["per_s"] / b["per_s"] for x, b in zip(rs, base)]) if base else None,
        }
        tv = runs.get(f"torchvision {r} {w}")
        if side == "ringtier" and tv:
            table[name]["x_torchvision_same"] = summary([x["per_s"] / t["per_s"] for x, t in zip(rs, tv)])
    report = {
        "schema": "ringtier.bench.scale.ranks/1",
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "commit": commit,
        "machine": {"nproc": os.cpu_count(), "kernel": platform.release()},
        "repeats": a.repeats,
        "table": table,
        "verify": verify,
        "raw": runs,
    }
    lines = ["| side | ranks | workers | samples/s (min / median / max) | x 1 rank, 0 workers | x torchvision | "
             "CPU s / 1,000 | rank RSS MiB | worker RSS MiB | engine threads |", "|" + "---|" * 10]
    for name, t in table.items():
        side, r, w = name.split()
        p, c = t["per_s"], t["cpu_s_per_1000"]
        # Ratios where their baseline ran in this invocation ("-" otherwise: --ranks 2,4 has no
        # one-rank pass to divide by).
        x1, xt = t["x_one_rank_no_workers"], t.get("x_torchvision_same")
        x1_text = f"{x1['median']:.2f}" if x1 else "-"
        xt_text = f"{xt['median']:.2f}" if xt else "-"
        lines.append(
            f"| {side} | {r[1:]} | {w[1:]} | {p['min']:,.0f} / {p['median']:,.0f} / {p['max']:,.0f} | "
            f"{x1_text} | {xt_text} | {c['median']:.3f} | "
            f"{t['rss_main_mib_max']:.0f} | {t['rss_worker_mib_max']:.0f} | {t['engine_threads']} |")
    for k, v in verify.items():
        lines.append(f"\nexactly once, {k}: {'ok' if v['ok'] else 'FAILED'} ({v['distinct']:,} of {v['expected']:,} "
                     f"files, {v['read_twice']} twice, {v['missing']} missing, {v['bytes_wrong']} with wrong bytes)")
    text = "\n".join(lines) + "\n"
    print(text)
    write_outputs(report, text, a.json, a.md)
    return 0 if all(v["ok"] for v in verify.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
