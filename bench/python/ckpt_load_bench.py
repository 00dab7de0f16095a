"""Checkpoint loads from Python against the disk's own read bandwidth and torch.load.

    flock /tmp/ringtier-bench.lock python bench/python/ckpt_load_bench.py --dir /work/ckl \
        [--tensors 16] [--mib 64] [--repeats 5] [--json o.json] [--md o.md]

The state is ``--tensors`` fp32 tensors of ``--mib`` MiB (16 x 64 MiB = 1 GiB), saved once by
``ringtier.CheckpointStore.save`` and once by ``torch.save``. Each repeat runs, interleaved and
each cold (``sync``; ``echo 3 > /proc/sys/vm/drop_caches`` as root):

* ``dd``: ``dd if=<the store's tensors part> of=/dev/null bs=4M iflag=direct``, the ceiling:
  the same bytes read by the disk at its own pace into a reused buffer;
* ``fio``: the same file, ``--ioengine=io_uring --direct=1 --bs=4M --iodepth=16`` (when fio is
  installed), a second ceiling;
* ``ringtier load()``: new tensors (each chunk read by O_DIRECT straight into their memory);
* ``ringtier load(into=)``: into preallocated tensors;
* ``torch.load``: the ``torch.save`` file (``weights_only=True``, no mmap).

Each load's tensors are checked against the saved ones once (outside the timing). Reported per
configuration: min/median/max seconds and GB/s, CPU seconds per GiB (this process's user+sys,
plus the child's for dd/fio), and pair by pair in the same repeat the ratio of ringtier's
bandwidth to the dd ceiling, to fio's, and to torch.load's; peak RSS; the machine's load average.
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
import time
from typing import Callable, Dict, List, Tuple

import torch

import ringtier


def evict() -> str:
    subprocess.run(["sync"], check=True)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        return "sync only (not root): NOT cold"


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def summary(xs: List[float]) -> Dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    root = os.path.join(a.dir, "ckpt-load-bench")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    try:
        run(a, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(a: argparse.Namespace, root: str) -> None:
    g = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(a.mib << 18, generator=g) for i in range(a.tensors)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    gib = nbytes / 2**30
    store = ringtier.CheckpointStore([os.path.join(root, "rt")], create=True, keep_last=1)
    store.save(1, state)
    part = next(
        os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "rt")) for f in fs if f == "tensors"
    )
    torch_file = os.path.join(root, "state.pt")
    torch.save(state, torch_file)
    os.sync()
    into = {k: torch.empty_like(v) for k, v in state.items()}
    # Each load once, checked, before timing.
    for got in (store.load(), store.load(into=into), torch.load(torch_file, weights_only=True)):
        assert all(torch.equal(got[k], state[k]) for k in state), "a load returned other bytes"
    del got
    has_fio = shutil.which("fio") is not None

    def dd() -> None:
        subprocess.run(["dd", f"if={part}", "of=/dev/null", "bs=4M", "iflag=direct"], check=True, capture_output=True)

    def fio() -> None:
        subprocess.run(
            ["fio", "--name=ceiling", f"--filename={part}", "--rw=read", "--bs=4M", "--iodepth=16",
             "--ioengine=io_uring", "--direct=1", "--iomem_align=4096", "--output-format=terse"],
            check=True, capture_output=True,
        )

    def rt_load() -> None:
        s = store.load()
        assert s is not None

    def rt_into() -> None:
        store.load(into=into)

    def torch_load() -> None:
        s = torch.load(torch_file, weights_only=True)
        assert len(s) == a.tensors

    configs: List[Tuple[str, Callable[[], None]]] = [("dd (ceiling)", dd)]
    if has_fio:
        configs.append(("fio io_uring (ceiling)", fio))
    configs += [("ringtier load()", rt_load), ("ringtier load(into=)", rt_into), ("torch.load", torch_load)]
    secs: Dict[str, List[float]] = {n: [] for n, _ in configs}
    cpu: Dict[str, List[float]] = {n: [] for n, _ in configs}
    how = ""
    loads: List[float] = []
    for rep in range(a.repeats):
        order = configs if rep % 2 == 0 else list(reversed(configs))
        for name, fn in order:
            how = evict()
            c0, k0 = cpu_self(), cpu_children()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            c = (cpu_self() - c0) + (cpu_children() - k0)
            secs[name].append(dt)
            cpu[name].append(c / gib)
        loads.append(os.getloadavg()[0])
        print(f"repeat {rep}: " + ", ".join(f"{n} {secs[n][-1]:.3f}s" for n, _ in configs), flush=True)

    def ratios(num: str, den: str) -> Dict[str, float]:
        # Bandwidth ratio num/den = den seconds / num seconds, repeat by repeat.
        return summary([d / n for n, d in zip(secs[num], secs[den])])

    out = {
        "benchmark": "ckpt_load_bench",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": {"nproc": os.cpu_count(), "kernel": platform.release(), "loadavg_1m_per_repeat": loads},
        "storage": f"ext4 on the root virtual disk ({a.dir}); cache eviction: {how}",
        "state": f"{a.tensors} fp32 tensors x {a.mib} MiB = {nbytes / 1e9:.3f} GB",
        "repeats": a.repeats,
        "seconds": {n: summary(v) for n, v in secs.items()},
        "gb_per_s": {n: summary([nbytes / 1e9 / s for s in v]) for n, v in secs.items()},
        "cpu_seconds_per_gib": {n: summary(v) for n, v in cpu.items()},
        "ratios": {
            "load() / dd": ratios("ringtier load()", "dd (ceiling)"),
            "load(into=) / dd": ratios("ringtier load(into=)", "dd (ceiling)"),
            "load() / torch.load": ratios("ringtier load()", "torch.load"),
            "load(into=) / torch.load": ratios("ringtier load(into=)", "torch.load"),
        },
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "raw_seconds": secs,
    }
    if has_fio:
        out["ratios"]["load() / fio"] = ratios("ringtier load()", "fio io_uring (ceiling)")
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    if a.md:
        lines = [
            f"# Checkpoint load from Python, {out['state']}, cold, {a.repeats} interleaved repeats",
            "",
            f"{out['date']}; {out['storage']}; nproc {os.cpu_count()}; load average per repeat "
            + ", ".join(f"{x:.1f}" for x in loads),
            "",
            "| | seconds min / median / max | GB/s median | CPU s per GiB median |",
            "|---|---|---|---|",
        ]
        for n in secs:
            s, b, c = out["seconds"][n], out["gb_per_s"][n], out["cpu_seconds_per_gib"][n]
            lines.append(f"| {n} | {s['min']:.3f} / {s['median']:.3f} / {s['max']:.3f} | {b['median']:.2f} | {c['median']:.2f} |")
        lines += ["", "| ratio (bandwidth, pair by pair) | min | median | max |", "|---|---|---|---|"]
        for n, r in out["ratios"].items():
            lines.append(f"| {n} | {r['min']:.2f} | {r['median']:.2f} | {r['max']:.2f} |")
        lines += ["", f"Peak RSS {out['peak_rss_mib']:.0f} MiB."]
        with open(a.md, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
