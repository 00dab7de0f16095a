"""torch.distributed.checkpoint with ringtier's storage against DCP's own FileSystemWriter /
FileSystemReader (thread_count swept, sync_files=True), torch.save+fsync / torch.load, and the
raw O_DIRECT write / read of the same bytes, with 1 and 2 ranks, on one directory.

    flock /tmp/ringtier-bench.lock python bench/python/dcp_bench.py --dir /tmp/rt-dcp-bench \\
        [--gib 1] [--ranks 1 2] [--repeats 3] [--threads 1 2 4] [--json o.json] [--md o.md]

Each rank holds its own 1/RANKS of a model-like state (float32 and bfloat16 tensors, --gib GiB
in all; the fqns are per rank, so each rank saves and loads its own items: a sharded
checkpoint). Ranks are processes on gloo over loopback. Every repeat runs each save
configuration once, then each load configuration once (the order rotated per repeat), every
pass cold: rank 0 runs `sync` and drops the page cache before it. A pass is timed on rank 0
from a barrier before it to a barrier after it (a save returns when durable: ringtier's on the
tier, FileSystemWriter with sync_files=True fsyncs, torch.save is followed by fsync). CPU is
user+sys of every rank's process (all its threads) over the pass, per GiB. Loads are in place
(dcp.load into preallocated tensors), torch.load makes new tensors. The raw read is
O_DIRECT of ringtier's own part files, 4 MiB reads, one thread per rank (`dd iflag=direct`):
the disk's ceiling for the same bytes. Outputs are removed when the run ends, also on failure.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

from ringtier.torch.dcp import StorageReader, StorageWriter

from _report import write_report  # bench/python/_report.py (the script's own folder is on sys.path)


def make_state(gib: float, rank: int, world: int) -> Dict[str, torch.Tensor]:
    total = int(gib * 2**30 / world)
    state: Dict[str, torch.Tensor] = {}
    g = torch.Generator().manual_seed(rank)
    layer, used = 0, 0
    while used < total:
        w = torch.randn(1024, 4096, generator=g)  # 16 MiB float32
        if layer % 4 == 3:
            w = w.to(torch.bfloat16)
        p = f"rank{rank}.layers.{layer}."
        state[p + "weight"] = w
        state[p + "bias"] = torch.randn(1024, generator=g)
        state[p + "norm"] = torch.ones(4096)
        used += sum(t.numel() * t.element_size() for k, t in state.items() if k.startswith(p))
        layer += 1
    return state


def nbytes(state: Dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def evict() -> str:
    subprocess.run(["sync"], check=True)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        return "sync only (not root)"


def raw_write(path: str, buf: mmap.mmap, n: int, chunk: int = 8 << 20) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    try:
        mv = memoryview(buf)
        for off in range(0, n, chunk):
            os.write(fd, mv[off : min(n, off + chunk)])
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def worker(rank: int, world: int, args: argparse.Namespace, port: int, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _worker(rank, world, args, out_path)
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()


def _worker(rank: int, world: int, args: argparse.Namespace, out_path: str) -> None:
    base = os.path.join(args.dir, f"ranks{world}")
    state = make_state(args.gib, rank, world)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    mine = nbytes(state)
    total = [0] * world
    dist.all_gather_object(total, mine)
    total_bytes = sum(total)
    rt_tier = os.path.join(base, "rt")
    writer = StorageWriter([rt_tier], **args.rt_options)
    # A training job keeps its writer open and saves the same state dict again and again: one
    # untimed save of the state opens the stores and pays DCP's once-per-process costs (its
    # first plan exchange unpickles for about 0.25 s here), which would otherwise fall on
    # whichever configuration runs first. Deleted before the timed passes.
    dcp.save(state, storage_writer=writer, checkpoint_id=99)
    dist.barrier()
    if writer._meta is not None:
        writer._meta.delete(99)
    dist.barrier()
    if writer._shards is not None:
        writer._shards.delete(99)
    dist.barrier()
    raw = mmap.mmap(-1, max(mine, 1) + (1 << 20))
    raw.write(b"\x5a" * min(len(raw), 64 << 20))
    steps: List[int] = []

    def rotate(xs: List[Any], i: int) -> List[Any]:
        return xs[i % len(xs):] + xs[: i % len(xs)]

    results: List[Dict[str, Any]] = []

    def timed(name: str, kind: str, repeat: int, fn: Callable[[], None]) -> None:
        if rank == 0:
            how = evict()
        else:
            how = ""
        dist.barrier()
        load0 = os.getloadavg()[0]
        c0, t0 = cpu_seconds(), time.perf_counter()
        fn()
        dist.barrier()
        secs = time.perf_counter() - t0
        cpu = [0.0] * world
        dist.all_gather_object(cpu, cpu_seconds() - c0)
        if rank == 0:
            results.append({
                "config": name, "kind": kind, "repeat": repeat, "seconds": secs, "cpu_seconds": sum(cpu),
                "bytes": total_bytes, "evict": how, "loadavg_before": load0, "loadavg_after": os.getloadavg()[0],
            })

    def rt_save(rep: int) -> Callable[[], None]:
        def run() -> None:
            dcp.save(state, storage_writer=writer, checkpoint_id=100 + rep)
            steps.append(100 + rep)
        return run

    def fs_save(threads: int, rep: int) -> Callable[[], None]:
        def run() -> None:
            w = dcp.FileSystemWriter(os.path.join(base, f"fs-t{threads}-{rep}"), sync_files=True, thread_count=threads)
            dcp.save(state, storage_writer=w)
        return run

    def torch_save(rep: int) -> Callable[[], None]:
        def run() -> None:
            p = os.path.join(base, f"torch-{rep}-rank{rank}.pt")
            torch.save(state, p)
            fsync_path(p)
        return run

    def raw_save(rep: int) -> Callable[[], None]:
        def run() -> None:
            raw_write(os.path.join(base, f"raw-rank{rank}"), raw, mine)
        return run

    def rt_load(rep: int) -> Callable[[], None]:
        def run() -> None:
            dcp.load(target, storage_reader=StorageReader([rt_tier]), checkpoint_id=100 + rep)
        return run

    def fs_load(rep: int) -> Callable[[], None]:
        def run() -> None:
            dcp.load(target, storage_reader=dcp.FileSystemReader(os.path.join(base, f"fs-t{args.threads[0]}-{rep}")))
        return run

    def torch_load(rep: int) -> Callable[[], None]:
        def run() -> None:
            got = torch.load(os.path.join(base, f"torch-{rep}-rank{rank}.pt"), weights_only=True)
            del got
        return run

    def raw_load(rep: int) -> Callable[[], None]:
        def run() -> None:
            d = os.path.join(rt_tier, "dcp", f"rank{rank:05d}", f"{100 + rep:020d}", "parts")
            for name in sorted(os.listdir(d)):
                subprocess.run(["dd", f"if={os.path.join(d, name)}", "of=/dev/null", "bs=4M", "iflag=direct",
                                "status=none"], check=True)
        return run

    def check(name: str) -> None:
        bad = [k for k in state if not torch.equal(state[k], target[k])]
        if bad:
            raise AssertionError(f"{name}: {len(bad)} tensors differ after the load (e.g. {bad[0]})")
        for t in target.values():
            t.zero_()

    for rep in range(args.repeats):
        saves = [("ringtier dcp.save", rt_save(rep))]
        saves += [(f"dcp FileSystemWriter t{t}", fs_save(t, rep)) for t in args.threads]
        saves += [("torch.save+fsync", torch_save(rep)), ("raw O_DIRECT write+fsync", raw_save(rep))]
        for name, fn in rotate(saves, rep):
            timed(name, "save", rep, fn)
        loads = [("ringtier dcp.load", rt_load(rep)), ("dcp FileSystemReader", fs_load(rep)),
                 ("torch.load", torch_load(rep)), ("raw O_DIRECT read (dd)", raw_load(rep))]
        for name, fn in rotate(loads, rep):
            timed(name, "load", rep, fn)
            if rep == 0 and name.startswith(("ringtier", "dcp")):
                check(name)
            elif name.startswith(("ringtier", "dcp")):
                for t in target.values():
                    t.zero_()
        # Free the disk for the next repeat.
        dist.barrier()
        if rank == 0:
            for entry in os.listdir(base):
                if entry.startswith(("fs-", "torch-")):
                    p = os.path.join(base, entry)
                    shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
        if writer._meta is not None:
            writer._meta.delete(100 + rep)
        dist.barrier()
        if writer._shards is not None:
            writer._shards.delete(100 + rep)
        for p in os.listdir(base):
            if p.startswith("torch-") and p.endswith(f"rank{rank}.pt"):
                os.remove(os.path.join(base, p))
        dist.barrier()
    writer.close()
    if rank == 0:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        with open(out_path, "w") as f:
            json.dump({"ranks": world, "bytes": total_bytes, "peak_rss_rank0_bytes": peak, "passes": results}, f)


def summarize(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for run in runs:
        world = run["ranks"]
        by: Dict[str, List[Dict[str, Any]]] = {}
        for p in run["passes"]:
            by.setdefault(p["config"], []).append(p)
        rows = {}
        gib = run["bytes"] / 2**30
        for name, ps in by.items():
            s = sorted(x["seconds"] for x in ps)
            rows[name] = {
                "kind": ps[0]["kind"], "seconds": [x["seconds"] for x in sorted(ps, key=lambda x: x["repeat"])],
                "min": s[0], "median": statistics.median(s), "max": s[-1],
                "gbps_median": run["bytes"] / statistics.median(s) / 1e9,
                "cpu_s_per_gib_median": statistics.median(x["cpu_seconds"] / gib for x in ps),
            }
        # Pair by pair (same repeat): baseline seconds / ringtier seconds (above 1: ringtier faster).
        def per_repeat(name: str) -> Dict[int, float]:
            return {x["repeat"]: x["seconds"] for x in by.get(name, [])}

        fs_names = [n for n in by if n.startswith("dcp FileSystemWriter")]
        fs_best = {}
        for rep in per_repeat("ringtier dcp.save"):
            fs_best[rep] = min(per_repeat(n)[rep] for n in fs_names)
        ratios = {}

        def ratio(label: str, rt: Dict[int, float], base: Dict[int, float]) -> None:
            r = sorted(base[k] / rt[k] for k in rt if k in base)
            if r:
                ratios[label] = {"min": r[0], "median": statistics.median(r), "max": r[-1], "pairs": len(r)}

        rt_save, rt_load = per_repeat("ringtier dcp.save"), per_repeat("ringtier dcp.load")
        ratio("save: DCP FileSystemWriter best thread_count / ringtier", rt_save, fs_best)
        ratio("save: torch.save+fsync / ringtier", rt_save, per_repeat("torch.save+fsync"))
        ratio("save: raw O_DIRECT write / ringtier", rt_save, per_repeat("raw O_DIRECT write+fsync"))
        ratio("load: torch.load / ringtier", rt_load, per_repeat("torch.load"))
        ratio("load: DCP FileSystemReader / ringtier", rt_load, per_repeat("dcp FileSystemReader"))
        ratio("load: raw O_DIRECT read (dd) / ringtier (fraction of the disk's read bandwidth)", rt_load,
              per_repeat("raw O_DIRECT read (dd)"))
        out[f"ranks{world}"] = {"gib": gib, "peak_rss_rank0_bytes": run["peak_rss_rank0_bytes"], "rows": rows,
                                "ratios": ratios}
    return out


def markdown(meta: Dict[str, Any], summary: Dict[str, Any]) -> str:
    lines = [f"# DCP: ringtier StorageWriter/StorageReader vs FileSystemWriter/Reader vs torch.save/load", "",
             f"{meta['date']}; {meta['machine']}; {meta['storage']}; {meta['repeats']} interleaved repeats, "
             f"every pass cold ({meta['evict']}); load average at start {meta['loadavg_start']}, "
             f"end {meta['loadavg_end']}.", "", f"Command: `{meta['command']}`", ""]
    for key, s in summary.items():
        lines += [f"## {key[5:]} rank(s), {s['gib']:.2f} GiB in all (peak RSS rank 0: "
                  f"{s['peak_rss_rank0_bytes'] / 2**30:.2f} GiB)", "",
                  "| configuration | seconds min / median / max | GB/s (median) | CPU s per GiB (median) |",
                  "|---|---|---|---|"]
        for name, r in s["rows"].items():
            lines.append(f"| {name} | {r['min']:.3f} / {r['median']:.3f} / {r['max']:.3f} | {r['gbps_median']:.2f} "
                         f"| {r['cpu_s_per_gib_median']:.2f} |")
        lines += ["", "| ratio, pair by pair (same repeat) | min / median / max |", "|---|---|"]
        for label, r in s["ratios"].items():
            lines.append(f"| {label} | {r['min']:.2f} / {r['median']:.2f} / {r['max']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="benchmark directory (created; removed at the end)")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4], help="FileSystemWriter thread_count sweep")
    ap.add_argument("--rt-options", type=json.loads, default={}, help="JSON of ringtier store options")
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args()
    if os.path.exists(args.dir):
        sys.exit(f"{args.dir} exists: give a new directory (it is removed at the end)")
    os.makedirs(args.dir)
    fs = subprocess.run(["df", "-T", args.dir], capture_output=True, text=True).stdout.splitlines()[-1].split()[1]
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": f"{socket.gethostname()}, {os.cpu_count()} cores, kernel {platform.release()}, torch {torch.__version__}",
        "storage": f"{os.path.abspath(args.dir)} ({fs})",
        "repeats": args.repeats, "loadavg_start": round(os.getloadavg()[0], 2),
        "command": "python " + " ".join(sys.argv), "rt_options": args.rt_options, "threads": args.threads,
    }
    runs = []
    try:
        for world in args.ranks:
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
                out_path = tf.name
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            os.makedirs(os.path.join(args.dir, f"ranks{world}"))
            mp.spawn(worker, args=(world, args, port, out_path), nprocs=world, join=True)
            with open(out_path) as f:
                runs.append(json.load(f))
            os.remove(out_path)
            shutil.rmtree(os.path.join(args.dir, f"ranks{world}"))
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    meta["loadavg_end"] = round(os.getloadavg()[0], 2)
    meta["evict"] = runs[0]["passes"][0]["evict"] if runs and runs[0]["passes"] else "?"
    summary = summarize(runs)
    text = markdown(meta, summary)
    write_report(text, {"meta": meta, "summary": summary, "runs": runs}, args.json, args.md)


if __name__ == "__main__":
    main()
