"""Checkpoints from Python: ringtier's save / async_save / load against torch.save / torch.load
and torch.distributed.checkpoint (DCP) save / async_save / load, and a raw O_DIRECT write of the
same bytes, on one directory (the fast tier).

    python bench/python/ckpt_bench.py --dir /nvme/bench [--gib 1] [--repeats 5] [--json o.json] [--md o.md]

The state is a model-like dict of float32 and bfloat16 tensors totalling --gib GiB. Each
repeat runs every configuration once, interleaved; before each one `sync` and, as root, the
page cache is dropped (loads are cold). Every output is removed after its pass. Figures:
blocking seconds (what the training loop waits for: until `save` returns; for the async
variants until the call returns, and separately until durable), and load seconds. ringtier's
store here has the one tier (durable on it = the guarantee the raw write gives: data fsynced),
open for the whole run as in a training job (an untimed first async_save touches its staging
buffer), each repeat saving new steps.
torch.save and DCP do not fsync; "torch.save+fsync" adds it.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import ringtier


def make_state(gib: float) -> Dict[str, torch.Tensor]:
    total = int(gib * 2**30)
    state: Dict[str, torch.Tensor] = {}
    g = torch.Generator().manual_seed(0)
    layer, used = 0, 0
    while used < total:
        w = torch.randn(2048, 4096, generator=g)  # 32 MiB float32
        if layer % 4 == 3:
            w = w.to(torch.bfloat16)
        state[f"layers.{layer}.weight"] = w
        state[f"layers.{layer}.bias"] = torch.randn(2048, generator=g)
        state[f"layers.{layer}.norm"] = torch.ones(4096)
        used += sum(t.numel() * t.element_size() for k, t in state.items() if k.startswith(f"layers.{layer}."))
        layer += 1
    return state


def state_bytes(state: Dict[str, torch.Tensor]) -> int:
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--slow", help="a slow tier's directory (bench/python/ckpt_slow_tier.sh makes one): adds the "
                    "burst buffer (fast + slow) against torch.save straight to it")
    ap.add_argument("--only-slow", action="store_true", help="with --slow: only the slow-tier comparisons")
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)

    state = make_state(a.gib)
    nbytes = state_bytes(state)
    padded = (nbytes + 4095) // 4096 * 4096
    rawbuf = mmap.mmap(-1, padded)
    off = 0
    for t in state.values():
        b = t.contiguous().view(-1).view(torch.uint8).numpy()
        rawbuf[off : off + b.nbytes] = b.tobytes()
        off += b.nbytes

    def fresh(name: str) -> str:
        p = os.path.join(a.dir, name)
        shutil.rmtree(p, ignore_errors=True)
        os.makedirs(p)
        return p

    results: Dict[str, List[float]] = {}

    def record(name: str, seconds: float) -> None:
        results.setdefault(name, []).append(seconds)

    def timed(fn: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    how = ""
    load_start = os.getloadavg()[0]
    rt_dir = fresh("rt")
    store = ringtier.CheckpointStore([rt_dir])
    store.async_save(0, state).result()  # warm-up: the staging buffer's first touch
    burst = None
    if a.slow:
        burst_fast = fresh("burst-fast")
        burst_slow = os.path.join(a.slow, "burst")
        shutil.rmtree(burst_slow, ignore_errors=True)
        os.makedirs(burst_slow)
        burst = ringtier.CheckpointStore([burst_fast, burst_slow], keep_last=1)
    for rep in range(a.repeats):
        if a.slow:
            # The fast tier's raw write of the same bytes (the blocking save's yardstick).
            d = fresh("raw")
            how = evict()
            record("raw O_DIRECT write+fsync", timed(lambda: raw_write(os.path.join(d, "blob"), rawbuf, padded)))
            shutil.rmtree(d)
            # The burst buffer: durable on the fast tier, drained to the slow one in the
            # background, against torch.save straight to the slow tier. First with the drain
            # idle, then at once a second save while the first one drains (the drain gives way
            # to it); then the drain is waited for (untimed) so that the next pass starts quiet.
            how = evict()
            record("ringtier save, fast+slow (burst)", timed(lambda: burst.save(2 * rep + 1, state)))
            record("ringtier save while the previous one drains", timed(lambda: burst.save(2 * rep + 2, state)))
            burst.drain()
            # The slowest tier keeps every step: delete this repeat's, or it fills up.
            burst.delete(2 * rep + 1)
            burst.delete(2 * rep + 2)
            sd = os.path.join(a.slow, "torch")
            shutil.rmtree(sd, ignore_errors=True)
            os.makedirs(sd)
            spath = os.path.join(sd, "ckpt.pt")

            def slow_save_fsync() -> None:
                with open(spath, "wb") as f:
                    torch.save(state, f)
                    f.flush()
                    os.fsync(f.fileno())

            evict()
            record("torch.save+fsync to slow", timed(slow_save_fsync))
            os.unlink(spath)
            evict()
            record("torch.save to slow (+sync after, untimed)", timed(lambda: torch.save(state, spath)))
            shutil.rmtree(sd)
            if a.only_slow:
                print(f"repeat {rep}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in results.items()), flush=True)
                continue
        # raw O_DIRECT write + fsync of the same bytes (already timed above with --slow)
        if not a.slow:
            d = fresh("raw")
            how = evict()
            record("raw O_DIRECT write+fsync", timed(lambda: raw_write(os.path.join(d, "blob"), rawbuf, padded)))
            shutil.rmtree(d)

        # ringtier save (blocking until durable) and load (cold); one store for the run (a
        # training job keeps its store open: the async staging buffer is reused)
        evict()
        record("ringtier save", timed(lambda: store.save(2 * rep + 1, state)))
        evict()
        loaded: Dict[str, object] = {}
        record("ringtier load", timed(lambda: loaded.update(store.load(2 * rep + 1))))
        assert torch.equal(loaded["layers.0.weight"], state["layers.0.weight"])  # type: ignore[arg-type]
        loaded.clear()
        evict()
        into = {k: torch.empty_like(v) for k, v in state.items()}
        record("ringtier load (in place)", timed(lambda: store.load(2 * rep + 1, into=into)))
        assert torch.equal(into["layers.0.weight"], state["layers.0.weight"])
        del into
        # async_save: blocking = until it returns; durable = until result()
        evict()
        t0 = time.perf_counter()
        fut = store.async_save(2 * rep + 2, state)
        record("ringtier async_save (blocking)", time.perf_counter() - t0)
        fut.result()
        record("ringtier async_save (until durable)", time.perf_counter() - t0)

        # torch.save / torch.load
        d = fresh("torch")
        path = os.path.join(d, "ckpt.pt")
        evict()
        record("torch.save", timed(lambda: torch.save(state, path)))
        os.unlink(path)
        evict()

        def save_fsync() -> None:
            with open(path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())

        record("torch.save+fsync", timed(save_fsync))
        evict()
        record("torch.load", timed(lambda: torch.load(path, weights_only=True)))
        shutil.rmtree(d)

        # DCP save / async_save / load
        d = fresh("dcp")
        evict()
        record("dcp.save", timed(lambda: dcp.save(state, checkpoint_id=os.path.join(d, "s"))))
        evict()
        target = {k: torch.empty_like(v) for k, v in state.items()}
        record("dcp.load (in place)", timed(lambda: dcp.load(target, checkpoint_id=os.path.join(d, "s"))))
        del target
        evict()
        t0 = time.perf_counter()
        f = dcp.async_save(state, checkpoint_id=os.path.join(d, "a"))
        record("dcp.async_save (blocking)", time.perf_counter() - t0)
        f.result()
        record("dcp.async_save (until done)", time.perf_counter() - t0)
        shutil.rmtree(d)
        print(f"repeat {rep}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in results.items()), flush=True)

    store.close()
    shutil.rmtree(rt_dir)
    if burst is not None:
        burst.close()
        shutil.rmtree(burst_fast)
        shutil.rmtree(burst_slow)
    raw = statistics.median(results.get("raw O_DIRECT write+fsync", [float("nan")]))
    ts = statistics.median(results.get("torch.save", results.get("torch.save+fsync to slow", [float("nan")])))
    tl = statistics.median(results.get("torch.load", [float("nan")]))
    fs = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", a.dir], capture_output=True, text=True).stdout.strip()
    machine = {
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "torch": torch.__version__,
        "dir": os.path.abspath(a.dir),
        "fs": fs,
        "bytes": nbytes,
        "tensors": len(state),
        "evict": how,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    lines = [
        "# Python checkpoints: ringtier vs torch.save / torch.load vs DCP, one fast tier",
        "",
        f"{machine['date']}; {machine['nproc']} cores, kernel {machine['kernel']}, torch {machine['torch']}; "
        f"state {nbytes / 2**30:.2f} GiB in {len(state)} tensors (float32, every 4th weight bfloat16); "
        f"{machine['dir']} ({fs}); {how} before every pass; {a.repeats} interleaved repeats; load average "
        f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end.",
        "",
        f"Command: `{' '.join([os.path.basename(sys.executable)] + sys.argv)}`",
        "",
        f"| configuration | seconds min / median / max | GB/s (median) | x raw write | x {'torch.save' if 'torch.save' in results else 'torch.save+fsync to slow'} |",
        "|---|---|---|---|---|",
    ]
    for name, xs in results.items():
        if not xs:
            continue
        med = statistics.median(xs)
        lines.append(
            f"| {name} | {min(xs):.3f} / {med:.3f} / {max(xs):.3f} | {nbytes / med / 1e9:.2f} | "
            f"{med / raw:.2f} | {med / ts:.2f} |"
        )
    lines.append("")
    for name in ("ringtier load", "ringtier load (in place)"):
        if name in results:
            lines.append(f"Load: {name} median / torch.load median = "
                         f"{statistics.median(results[name]) / tl:.2f} (below 1 is faster).")
    if a.slow:
        raws = results["raw O_DIRECT write+fsync"]
        for name in ("ringtier save, fast+slow (burst)", "ringtier save while the previous one drains"):
            r = sorted(x / y for x, y in zip(results[name], raws[-len(results[name]):]))
            lines.append(f"Blocking, pair by pair: {name} / raw O_DIRECT write of the same bytes to the fast tier = "
                         f"{r[0]:.2f} / {statistics.median(r):.2f} / {r[-1]:.2f} (min / median / max; the target "
                         "is at most 1.2).")
        b = statistics.median(results["ringtier save, fast+slow (burst)"])
        for base in ("torch.save+fsync to slow", "torch.save to slow (+sync after, untimed)"):
            lines.append(f"Burst buffer: {base} median / ringtier save (fast+slow) median = "
                         f"{statistics.median(results[base]) / b:.2f}x. Slow tier: {a.slow} "
                         f"({os.environ.get('SLOW_TIER_DESC', 'as given')}).")
    text = "\n".join(lines)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": machine, "seconds": results, "args": vars(a)}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
