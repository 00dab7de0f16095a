"""DataLoader workers at the scale of real jobs (issue 37): the same epoch at 0, 1, 2, 4 and 8
workers, for raw small files in batches and for the photo transform chain, against
torchvision's DatasetFolder at 0, 2, 4 and 8 workers and SPDL's thread pipeline, cold,
interleaved, one fresh process per pass.

    python bench/scale/workers.py [--raw DIR] [--photos DIR] [--records DIR] [--repeats 3]
        [--workers 0,1,2,4,8] [--peer-workers 0,2,4,8] [--spdl 8,16] [--dali 2,4]
        [--json out.json] [--md out.md]

``--raw DIR`` (bench/scale/make_files.py): ``ringtier.torch.IterableDataset(DIR,
batch_size=256)`` through ``DataLoader(ds, batch_size=None, num_workers=N)`` (in a worker a
batch crosses as one PackedBatch), against ``torchvision.datasets.DatasetFolder(DIR,
loader=<read bytes>, extensions=(".bin",))`` in ``DataLoader(batch_size=256, shuffle=True,
num_workers=N, collate_fn=list)``, and (``--spdl 8,16``) SPDL 0.8's ``PipelineBuilder``
(the files listed by ``os.walk``, shuffled, read by N threads, batched by 256; workers column:
its threads), and ``spdl-batched``: SPDL with the paths batched by 256 before the read stage,
one task per batch (SPDL schedules each item as a task; a task per file is its slowest form
here); (``--dali 2,4``) NVIDIA DALI's CPU pipeline (``device_id=None``: no GPU) with
``fn.readers.file(file_root=DIR, random_shuffle=True)``, batch 256, N threads. ``--records DIR`` (``ringtier gen --format tfrecord``): ``ringtier.torch.RecordDataset(DIR,
format="tfrecord", batched=True, batch_size=256)`` (in a worker a batch crosses as one
PackedBatch). ``--photos DIR`` (bench/python/make_photos.py):
``ringtier.torch.ImageFolder(DIR, transform, batch_size=64)`` with the ImageNet training
chain (RandomResizedCrop(224), RandomHorizontalFlip, ToDtype(float32, scale=True), Normalize)
through ``DataLoader(ds, batch_size=None, num_workers=N)`` (in a worker a batch is decoded
straight into shared memory the worker reuses), against torchvision's ``ImageFolder`` (PIL
decode) with the same chain from ``torchvision.transforms.v2`` in ``DataLoader(batch_size=64,
shuffle=True, num_workers=N)``, and (``--dali``) DALI's CPU pipeline: ``readers.file``,
``decoders.image`` (libjpeg-turbo), ``random_resized_crop(224)``, ``crop_mirror_normalize``
(float32, CHW, a random flip), batch 64. ringtier lists with its defaults (no stat per
file; the listing cache beside the data set, made once before the passes).

Every pass is one epoch in a fresh process after ``sync; echo 3 > /proc/sys/vm/drop_caches``
(root), timed from before the dataset is made (listing, worker start included; imports not).
Per pass: samples/s, CPU seconds (the process and its workers) per 1,000 samples, peak RSS of
the main process and of the largest worker. Ratios against ringtier's 0 workers are taken
pass by pass within a repeat.
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
from typing import Any, Dict, List, Tuple

from _common import drop_caches, summary, write_outputs  # noqa: E402 (beside this script)


def child(kind: str, side: str, root: str, workers: int) -> Dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    if side == "torchvision":
        import torchvision
    elif side in ("spdl", "spdl-batched"):
        from spdl.pipeline import PipelineBuilder  # noqa: F401 (imported before the clock)
    elif side == "dali":
        from nvidia.dali import fn, pipeline_def, types  # noqa: F401 (imported before the clock)
    else:
        import ringtier.torch as rt
        import ringtier.transforms as T
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if side in ("spdl", "spdl-batched", "dali"):
        n = spdl_epoch(root, workers, side == "spdl-batched") if side != "dali" else dali_epoch(kind, root, workers)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        return {"samples": n, "wall_s": wall, "per_s": n / wall, "cpu_s_per_1000": cpu / n * 1000,
                "rss_main_mib": r1.ru_maxrss / 1024, "rss_worker_mib": 0.0}
    if kind == "raw" and side == "torchvision":

        def read(path: str) -> bytes:
            with open(path, "rb") as f:
                return f.read()

        ds = torchvision.datasets.DatasetFolder(root, loader=read, extensions=(".bin",))
        dl = DataLoader(ds, batch_size=256, shuffle=True, num_workers=workers, collate_fn=list)
    elif kind == "raw":
        ds = rt.IterableDataset(root, batch_size=256, seed=1, rank=0, world_size=1)
        dl = DataLoader(ds, batch_size=None, num_workers=workers)
    elif kind == "records":
        ds = rt.RecordDataset(root, format="tfrecord", batched=True, batch_size=256, seed=1, rank=0, world_size=1)
        dl = DataLoader(ds, batch_size=None, num_workers=workers)
    elif side == "torchvision":
        from torchvision.transforms import v2

        tv_chain = v2.Compose([
            v2.ToImage(),
            v2.RandomResizedCrop(224, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ])
        ds = torchvision.datasets.ImageFolder(root, transform=tv_chain)
        dl = DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers)
    else:
        chain = T.Compose([
            T.RandomResizedCrop(224),
            T.RandomHorizontalFlip(),
            T.ToDtype(torch.float32, scale=True),
            T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ])
        ds = rt.ImageFolder(root, chain, batch_size=64, seed=1, rank=0, world_size=1, pin_memory=False)
        dl = DataLoader(ds, batch_size=None, num_workers=workers)
    n = 0
    for item in dl:
        if kind == "photos":
            images, labels = item
            n += int(images.shape[0])
        else:
            n += len(item)
        del item
    wall = time.perf_counter() - t0
    del dl
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    rc = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime) + rc.ru_utime + rc.ru_stime
    return {"samples": n, "wall_s": wall, "per_s": n / wall, "cpu_s_per_1000": cpu / n * 1000,
            "rss_main_mib": r1.ru_maxrss / 1024, "rss_worker_mib": rc.ru_maxrss / 1024}




def spdl_epoch(root: str, threads: int, batched: bool) -> int:
    """SPDL's thread pipeline over the files listed as torchvision lists them (os.walk),
    shuffled, read by THREADS threads: a task per file, or (batched) per 256 paths."""
    import random

    from spdl.pipeline import PipelineBuilder

    def read_file(path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def read_batch(paths: List[str]) -> List[bytes]:
        return [read_file(p) for p in paths]

    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".bin"))
    random.Random(1).shuffle(paths)
    b = PipelineBuilder().add_source(paths)
    if batched:
        b = b.aggregate(256).pipe(read_batch, concurrency=threads)
    else:
        b = b.pipe(read_file, concurrency=threads).aggregate(256)
    pipeline = b.add_sink(4).build(num_threads=threads)
    n = 0
    with pipeline.auto_stop():
        for batch in pipeline.get_iterator(timeout=600):
            n += len(batch)
            del batch
    return n


def dali_epoch(kind: str, root: str, threads: int) -> int:
    """One epoch of DALI's CPU pipeline (no GPU: ``device_id=None``) with THREADS threads."""
    from nvidia.dali import fn, pipeline_def, types

    batch = 256 if kind == "raw" else 64

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, seed=1, prefetch_queue_depth=2)
    def pipe():
        # DALI lists image extensions by default: the raw set's .bin files are named.
        filters = ["*.bin"] if kind == "raw" else ["*.jpg", "*.jpeg", "*.JPEG"]
        data, labels = fn.readers.file(file_root=root, file_filters=filters, random_shuffle=True, name="files",
                                       pad_last_batch=True)
        if kind == "raw":
            return data, labels
        images = fn.decoders.image(data, device="cpu", output_type=types.RGB)
        images = fn.random_resized_crop(images, size=224)
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW", mirror=fn.random.coin_flip(),
            mean=[0.485 * 255, 0.456 * 255, 0.406 * 255], std=[0.229 * 255, 0.224 * 255, 0.225 * 255])
        return images, labels

    p = pipe()
    p.build()
    total = p.epoch_size("files")
    n = 0
    while n < total:
        out = p.run()
        n += min(len(out[0]), total - n)
        del out
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw")
    ap.add_argument("--photos")
    ap.add_argument("--records", help="a directory of TFRecord shards (ringtier gen --format tfrecord)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", default="0,1,2,4,8")
    ap.add_argument("--peer-workers", default="0,2,4,8")
    ap.add_argument("--spdl", default="", help="SPDL thread counts (raw only; needs `pip install spdl`)")
    ap.add_argument("--dali", default="", help="DALI CPU thread counts (needs `pip install nvidia-dali-cuda130`)")
    ap.add_argument("--child", nargs=4, metavar=("KIND", "SIDE", "DIR", "WORKERS"))
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    if a.child:
        kind, side, root, w = a.child
        print(json.dumps(child(kind, side, root, int(w))))
        return 0
    configs: List[Tuple[str, str, str, int]] = []
    for kind, root in (("raw", a.raw), ("photos", a.photos), ("records", a.records)):
        if not root:
            continue
        if kind != "records":
            # The listing cache, made once (the data set's directories are older than two seconds).
            subprocess.run([sys.executable, "-c", "import ringtier, sys; ringtier.Loader(sys.argv[1])", root], check=True)
        configs += [(kind, "ringtier", root, int(w)) for w in a.workers.split(",")]
        if kind in ("raw", "photos"):
            configs += [(kind, "torchvision", root, int(w)) for w in a.peer_workers.split(",") if w]
            configs += [(kind, "dali", root, int(w)) for w in a.dali.split(",") if w]
        if kind == "raw":
            configs += [(kind, side, root, int(w)) for w in a.spdl.split(",") if w for side in ("spdl", "spdl-batched")]
    raw: Dict[str, List[Dict[str, Any]]] = {f"{k}/{s}/{w}": [] for k, s, _, w in configs}
    for r in range(a.repeats):
        for k, s, root, w in configs:
            drop_caches()
            out = subprocess.run([sys.executable, __file__, "--child", k, s, root, str(w)], capture_output=True,
                                 text=True, timeout=3600)
            if out.returncode != 0:
                raise RuntimeError(f"{k}/{s}/{w}: {out.stderr[-3000:]}")
            p = json.loads(out.stdout.strip().splitlines()[-1])
            raw[f"{k}/{s}/{w}"].append(p)
            print(f"repeat {r} {k:6s} {s:11s} {w} workers: {p['per_s']:8.0f}/s  {p['cpu_s_per_1000']:.3f} CPU s/1000  "
                  f"rss main {p['rss_main_mib']:.0f} worker {p['rss_worker_mib']:.0f} MiB", flush=True)
    res: Dict[str, Any] = {}
    for name, passes in raw.items():
        kind = name.split("/")[0]
        base = raw[f"{kind}/ringtier/0"]
        res[name] = {m: summary([p[m] for p in passes]) for m in ("per_s", "cpu_s_per_1000", "rss_main_mib",
                                                                   "rss_worker_mib")}
        res[name]["vs_ringtier_0_workers"] = summary([p["per_s"] / q["per_s"] for p, q in zip(passes, base)])
    machine = {"nproc": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
               "evict": "sync; echo 3 > /proc/sys/vm/drop_caches before every pass"}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    payload = {"schema": "ringtier-bench/workers-scale/v1", "command": " ".join(sys.argv), "commit": commit,
               "machine": machine, "repeats": a.repeats, "summary": res, "raw": raw}
    lines = ["| data | side | workers | samples/s (min / median / max) | x ringtier 0 workers (median, pass by pass) "
             "| CPU s / 1000 | peak RSS main / worker MiB |", "|---|---|---|---|---|---|---|"]
    for name, s in res.items():
        k, side, w = name.split("/")
        v = s["per_s"]
        lines.append(f"| {k} | {side} | {w} | {v['min']:,.0f} / {v['median']:,.0f} / {v['max']:,.0f} | "
                     f"{s['vs_ringtier_0_workers']['median']:.2f} | {s['cpu_s_per_1000']['median']:.3f} | "
                     f"{s['rss_main_mib']['median']:.0f} / {s['rss_worker_mib']['median']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    write_outputs(payload, text, a.json, a.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
