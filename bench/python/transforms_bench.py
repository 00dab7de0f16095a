"""Decoded, augmented batches: ``ringtier.torch.ImageFolder`` with ``ringtier.transforms`` against
torchvision's ``ImageFolder`` with ``transforms.v2`` in a ``DataLoader`` (and NVIDIA DALI's CPU
pipeline where it runs), on the same JPEGs, cold, interleaved, pass by pass.

    python bench/python/transforms_bench.py --dir DIR [--workers 0,1,2,4] [--repeats 5]
        [--batch 64] [--size 224] [--dali [--dali-path DIR]] [--json out.json] [--md out.md]

ringtier runs at the same worker counts (``--workers``), its decode threads split over them.
The transform on every side is the ImageNet training recipe: RandomResizedCrop(224),
RandomHorizontalFlip, ToDtype(float32, scale=True), Normalize(ImageNet mean, std), batches of
64, shuffled. torchvision runs ``datasets.ImageFolder`` (PIL decode) with
``v2.Compose([RandomResizedCrop, RandomHorizontalFlip, ToImage, ToDtype, Normalize])`` in a
``DataLoader`` at each worker count of ``--workers``; ringtier runs ``ImageFolder(root,
transform=Compose([...]))`` through ``DataLoader(ds, batch_size=None, num_workers=N)`` (its own
decode threads: this process's cores, split over the workers); DALI runs ``fn.readers.file`` + ``fn.decoders.image(device="cpu")`` +
``fn.random_resized_crop`` + ``fn.crop_mirror_normalize`` on ``device_id=None`` (CPU only) with
as many threads as cores.

Each pass is one epoch in a fresh process, after ``sync; echo 3 > /proc/sys/vm/drop_caches``
(root) or posix_fadvise(DONTNEED) on every file. Configurations run interleaved (A, B, C, ...,
A, B, C, ...). Per pass: images/s over the epoch (dataset set-up and worker start included,
Python start and imports not), CPU seconds (user+sys of the process and its DataLoader
workers) per 1,000 images, and the peak memory (PSS of the process plus its workers, sampled
every 50 ms). Prints min/median/max per configuration and, pass by pass, ringtier's ratio to
torchvision's best configuration (the best median) in the same round.
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
import threading
import time
from typing import Any, Dict, List

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def image_files(root: str) -> List[str]:
    out = []
    for dirpath, _, files in os.walk(root):
        out.extend(os.path.join(dirpath, f) for f in files if f.lower().endswith((".jpg", ".jpeg")))
    return sorted(out)


def drop_caches(files: List[str]) -> str:
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        for p in files:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise"


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_pss_kib() -> int:
    """PSS of this process and its children (DataLoader workers)."""
    me = os.getpid()
    total = pss_kib(me)
    try:
        with open(f"/proc/{me}/task/{me}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except OSError:
        kids = []
    return total + sum(pss_kib(k) for k in kids)


class PeakMemory:
    """Samples the process tree's PSS every 50 ms; ``peak`` in MiB."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_pss_kib())
            self._stop.wait(0.05)

    def stop(self) -> float:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, tree_pss_kib())
        return self.peak / 1024


def consume(batches: Any) -> int:
    """Iterates (images, labels) batches; touches each image batch. Returns images seen."""
    n = 0
    for images, labels in batches:
        assert images.shape[1:] == (3, ARGS.size, ARGS.size) and len(labels) == len(images), images.shape
        n += len(images)
        float(images[0, 0, 0, 0])  # the batch is really there
    return n


def pass_torchvision(root: str, workers: int) -> int:
    import torch
    import torchvision
    from torch.utils.data import DataLoader
    from torchvision.transforms import v2

    t = v2.Compose(
        [
            v2.RandomResizedCrop(ARGS.size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )
    ds = torchvision.datasets.ImageFolder(root, transform=t)
    dl = DataLoader(ds, batch_size=ARGS.batch, shuffle=True, num_workers=workers)
    n = consume(dl)
    del dl  # workers joined: their CPU time is counted
    return n


def pass_ringtier(root: str, workers: int = 0) -> int:
    import torch
    from torch.utils.data import DataLoader

    import ringtier.torch as rt
    from ringtier import transforms as T

    t = T.Compose(
        [
            T.RandomResizedCrop(ARGS.size),
            T.RandomHorizontalFlip(),
            T.ToDtype(torch.float32, scale=True),
            T.Normalize(MEAN, STD),
        ]
    )
    # Its decode threads: this process's cores, split over the DataLoader's workers.
    ds = rt.ImageFolder(root, transform=t, batch_size=ARGS.batch, seed=1)
    dl = DataLoader(ds, batch_size=None, num_workers=workers)
    n = consume(dl)
    del dl  # workers joined: their CPU time is counted
    return n


def pass_dali(root: str) -> int:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    threads = len(os.sched_getaffinity(0))

    @pipeline_def(batch_size=ARGS.batch, num_threads=threads, device_id=None)
    def pipe():  # type: ignore[no-untyped-def]
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        images = fn.random_resized_crop(images, size=ARGS.size)
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=[m * 255 for m in MEAN],
            std=[s * 255 for s in STD],
            mirror=fn.random.coin_flip(),
        )
        return images, labels

    p = pipe()
    p.build()
    it = DALIGenericIterator([p], ["images", "labels"], reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL)
    n = consume((b[0]["images"], b[0]["labels"].view(-1)) for b in it)
    return n


def child(config: str, root: str) -> None:
    """One pass in this (fresh) process; prints its JSON line."""
    import torch  # noqa: F401  (imported before the timer: both sides pay it)

    if config.startswith("ringtier"):
        import ringtier.torch  # noqa: F401
    elif config == "dali":
        import nvidia.dali  # noqa: F401
    else:
        import torchvision  # noqa: F401
    mem = PeakMemory()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if config.startswith("ringtier-w"):
        n = pass_ringtier(root, int(config.split("-w")[1]))
    elif config.startswith("ringtier"):
        n = pass_ringtier(root)
    elif config == "dali":
        n = pass_dali(root)
    else:
        n = pass_torchvision(root, int(config.split("-w")[1]))
    secs = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    rc = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime) + rc.ru_utime + rc.ru_stime
    out = {"images": n, "seconds": secs, "cpu_seconds": cpu, "peak_mib": mem.stop()}
    if config.startswith("ringtier"):
        import ringtier

        out["decoder"] = ringtier._ringtier.JPEG_DECODER
    print(json.dumps(out))


def summary(xs: List[float]) -> Dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main() -> None:
    files = image_files(ARGS.dir)
    if not files:
        sys.exit(f"no JPEGs under {ARGS.dir}")
    total_bytes = sum(os.path.getsize(p) for p in files)
    alts = dict(a.split("=", 1) for a in ARGS.ringtier_alt)
    configs = (
        [f"torchvision-w{w}" for w in ARGS.workers]
        + [f"ringtier-w{w}" for w in ARGS.workers]
        + [f"ringtier-{name}" for name in alts]
        + (["dali"] if ARGS.dali else [])
    )
    runs: Dict[str, List[Dict[str, float]]] = {c: [] for c in configs}
    errors: Dict[str, str] = {}
    how = ""
    for r in range(ARGS.repeats):
        for c in configs:
            if c in errors:
                continue
            how = drop_caches(files)
            cmd = [sys.executable, __file__, "--child", c, "--dir", ARGS.dir, "--batch", str(ARGS.batch), "--size", str(ARGS.size)]
            env = dict(os.environ)
            extra = ARGS.dali_path if c == "dali" else alts.get(c[len("ringtier-") :]) if c.startswith("ringtier-") else None
            if extra:
                env["PYTHONPATH"] = os.pathsep.join(x for x in (extra, env.get("PYTHONPATH")) if x)
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if p.returncode != 0:
                errors[c] = (p.stderr or p.stdout).strip()[-2000:]
                print(f"{c}: failed:\n{errors[c]}", file=sys.stderr)
                continue
            one = json.loads(p.stdout.strip().splitlines()[-1])
            one["images_per_s"] = one["images"] / one["seconds"]
            one["cpu_s_per_1000"] = 1000 * one["cpu_seconds"] / one["images"]
            one["load1"] = os.getloadavg()[0]
            runs[c].append(one)
            print(
                f"round {r} {c:16s} {one['images']} images {one['images_per_s']:7.1f}/s cpu {one['cpu_s_per_1000']:.2f} s/1000 "
                f"peak {one['peak_mib']:.0f} MiB load {one['load1']:.2f}",
                flush=True,
            )
    table = {}
    for c, rs in runs.items():
        if rs:
            table[c] = {
                "images_per_s": summary([x["images_per_s"] for x in rs]),
                "cpu_s_per_1000": summary([x["cpu_s_per_1000"] for x in rs]),
                "peak_mib": summary([x["peak_mib"] for x in rs]),
                "passes": len(rs),
                "decoder": rs[0].get("decoder", ""),
            }
    tv = [c for c in table if c.startswith("torchvision")]
    best = max(tv, key=lambda c: table[c]["images_per_s"]["median"]) if tv else None
    ratios: Dict[str, Any] = {}
    if best:
        for c in [x for x in table if x.startswith("ringtier") or x == "dali"]:
            pairs = list(zip(runs[c], runs[best]))
            speed = [a["images_per_s"] / b["images_per_s"] for a, b in pairs]
            cpu = [a["cpu_s_per_1000"] / b["cpu_s_per_1000"] for a, b in pairs]
            ratios[c] = {"vs": best, "speed": summary(speed), "cpu_per_image": summary(cpu)}
        # Equal budgets: ringtier and torchvision at the same DataLoader worker count.
        for w in ARGS.workers:
            a, b = f"ringtier-w{w}", f"torchvision-w{w}"
            if a in table and b in table and b != best:  # (against the best: above)
                pairs = list(zip(runs[a], runs[b]))
                ratios[f"{a}_vs_{b}"] = {
                    "vs": b,
                    "speed": summary([x["images_per_s"] / y["images_per_s"] for x, y in pairs]),
                    "cpu_per_image": summary([x["cpu_s_per_1000"] / y["cpu_s_per_1000"] for x, y in pairs]),
                }
        rts = [c for c in table if c.startswith("ringtier-w")]
        if "dali" in table and rts:
            best_rt = max(rts, key=lambda c: table[c]["images_per_s"]["median"])
            pairs = list(zip(runs[best_rt], runs["dali"]))
            ratios[f"{best_rt}_vs_dali"] = {
                "speed": summary([a["images_per_s"] / b["images_per_s"] for a, b in pairs]),
                "cpu_per_image": summary([a["cpu_s_per_1000"] / b["cpu_s_per_1000"] for a, b in pairs]),
            }
    import ringtier
    import torch

    report = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "nproc": os.cpu_count(),
            "kernel": platform.release(),
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "jpeg_decoder": ringtier._ringtier.JPEG_DECODER,
        },
        "storage": ARGS.storage,
        "cold": how,
        "command": " ".join(sys.argv),
        "dataset": {"dir": ARGS.dir, "files": len(files), "bytes": total_bytes},
        "batch": ARGS.batch,
        "size": ARGS.size,
        "configs": table,
        "ratios": ratios,
        "errors": errors,
        "runs": runs,
    }
    text = json.dumps(report, indent=1)
    print(json.dumps({"configs": table, "ratios": ratios, "errors": list(errors)}, indent=1))
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            f.write(text)
    if ARGS.md:
        with open(ARGS.md, "w") as f:
            f.write(markdown(report))


def markdown(rep: Dict[str, Any]) -> str:
    ds = rep["dataset"]
    lines = [
        f"# Decoded, augmented batches: {ds['files']} JPEGs, {ds['bytes'] / 1e6:.0f} MB ({rep['date']})",
        "",
        f"`{rep['command']}`",
        "",
        f"Machine: {rep['machine']['nproc']} cores, {rep['machine']['mem_gib']} GiB, kernel {rep['machine']['kernel']}, "
        f"torch {rep['machine']['torch']}, ringtier decoder {rep['machine']['jpeg_decoder']}. Storage: {rep['storage']}; "
        f"cold passes ({rep['cold']}). RandomResizedCrop({rep['size']}) + flip + ToDtype(float32) + Normalize, "
        f"batches of {rep['batch']}.",
        "",
        "| configuration | images/s min / median / max | CPU s per 1,000 images (median) | peak PSS MiB (median) | passes |",
        "|---|---|---|---|---|",
    ]
    for c, t in rep["configs"].items():
        s = t["images_per_s"]
        name = f"{c} ({t['decoder']})" if t.get("decoder") else c
        lines.append(
            f"| {name} | {s['min']:.0f} / {s['median']:.0f} / {s['max']:.0f} | {t['cpu_s_per_1000']['median']:.2f} | "
            f"{t['peak_mib']['median']:.0f} | {t['passes']} |"
        )
    lines.append("")
    for c, r in rep["ratios"].items():
        vs = r.get("vs", "dali")
        sp, cp = r["speed"], r["cpu_per_image"]
        lines.append(
            f"- {c.split('_vs_')[0]} / {vs}, pass by pass: images/s {sp['min']:.2f} / {sp['median']:.2f} / {sp['max']:.2f}x, "
            f"CPU per image {cp['min']:.2f} / {cp['median']:.2f} / {cp['max']:.2f}x (min / median / max)"
        )
    for c, e in rep["errors"].items():
        lines.append(f"- {c} did not run: `{e.splitlines()[-1] if e else '?'}`")
    return "\n".join(lines) + "\n"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--workers", default="0,1,2,4", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--dali", action="store_true", help="also NVIDIA DALI's CPU pipeline")
    ap.add_argument("--dali-path", help="a directory holding DALI (pip install --target), put on the DALI pass's PYTHONPATH")
    ap.add_argument(
        "--ringtier-alt",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="another ringtier build (pip install --target DIR), run as configuration ringtier-NAME",
    )
    ap.add_argument("--storage", default="ext4 on the virtual disk (/tmp)")
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    return ap.parse_args()


ARGS = parse()

if __name__ == "__main__":
    if ARGS.child:
        child(ARGS.child, ARGS.dir)
    else:
        main()
