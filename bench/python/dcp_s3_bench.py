"""torch.distributed.checkpoint straight to S3: ringtier's StorageWriter/StorageReader with one
``s3://`` tier against s3torchconnector's S3StorageWriter/S3StorageReader (AWS's connector,
the CRT client) on the same loopback S3 server, one process.

    flock /tmp/ringtier-bench.lock python bench/python/dcp_s3_bench.py --dir /dev/shm/rt-dcp-s3 \\
        [--gib 1] [--repeats 3] [--warmup 1] [--server target/release/ringtier-s3-server] [--json o.json] [--md o.md]

The server is the test kit's s3s-fs (``ringtier-s3-server``, a release build: objects are files
under --dir; on /dev/shm its disk is memory, so the disk is not the bound), started here on a free
loopback port. It runs on the same two cores: the clients' CPU (user+sys of this process, all its
threads) is the figure compared; the server's CPU per pass is recorded beside it (from
``/proc/PID/stat``), to show where the wall time goes. s3torchconnector
is given the endpoint through its S3Client (``S3ClientConfig(force_path_style=True)``) and
writes with its default part size; its reader is ``S3ReaderConstructor.dcp_optimized()``.
Each repeat runs the four passes interleaved (the order rotated), each after ``sync`` and a
page-cache drop; a save returns once the objects are complete on the server (both sides);
loads are in place into preallocated tensors. Before the timed repeats, ``--warmup`` rounds (1 by
default) run every pass once untimed: the figures are those of a job that checkpoints again
(buffer pools filled, connections open), for both clients alike.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any, Callable, Dict, List

import torch
import torch.distributed.checkpoint as dcp

from ringtier.torch.dcp import StorageReader, StorageWriter

from _report import write_report  # bench/python/_report.py (the script's own folder is on sys.path)

ACCESS_KEY, SECRET_KEY = "ringtier-test", "ringtier-test-secret"  # the test kit's server


def make_state(gib: float) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    state, used, layer = {}, 0, 0
    while used < gib * 2**30:
        w = torch.randn(1024, 4096, generator=g)
        if layer % 4 == 3:
            w = w.to(torch.bfloat16)
        state[f"layers.{layer}.weight"] = w
        state[f"layers.{layer}.bias"] = torch.randn(1024, generator=g)
        used += w.numel() * w.element_size() + 4096
        layer += 1
    return state


def evict() -> None:
    subprocess.run(["sync"], check=True)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def proc_cpu(pid: int) -> float:
    """User+sys seconds of process `pid` so far (its threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed rounds first (every client saves and loads the full state once: "
                         "buffer pools and connections as a job that checkpoints again has them)")
    ap.add_argument("--server", default="target/release/ringtier-s3-server")
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp import S3StorageReader, S3StorageWriter
    from s3torchconnector.dcp.s3_file_system import S3FileSystem
    from s3torchconnector.s3reader import S3ReaderConstructor

    if os.path.exists(args.dir):
        sys.exit(f"{args.dir} exists: give a new directory (it is removed at the end)")
    os.makedirs(os.path.join(args.dir, "s3"))
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION="us-east-1")
    server = subprocess.Popen([args.server, "--root", os.path.join(args.dir, "s3")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    results: List[Dict[str, Any]] = []
    try:
        assert server.stdout is not None
        endpoint = server.stdout.readline().strip()
        if not endpoint.startswith("http://"):
            sys.exit(f"the S3 server did not start: {endpoint!r}")
        os.mkdir(os.path.join(args.dir, "s3", "bench"))  # the bucket (s3s-fs: a directory)
        cfg = S3ClientConfig(force_path_style=True)

        def s3tc_fs(reader_constructor: Any = None) -> Any:
            # The connector's own file system, its client pointed at the loopback endpoint.
            client = S3Client("us-east-1", endpoint=endpoint, s3client_config=cfg)
            return S3FileSystem("us-east-1", s3_client=client, reader_constructor=reader_constructor)

        state = make_state(args.gib)
        total = sum(t.numel() * t.element_size() for t in state.values())
        target = {k: torch.zeros_like(v) for k, v in state.items()}
        rt_url = f"s3://bench/ringtier?endpoint={endpoint}&region=us-east-1"
        writer = StorageWriter([rt_url])
        dcp.save({"warmup": torch.ones(8)}, storage_writer=writer)  # opens the store (untimed)

        def rt_save(rep: int) -> None:
            dcp.save(state, storage_writer=writer, checkpoint_id=10 + rep)

        def rt_load(rep: int) -> None:
            with StorageReader([rt_url]) as r:
                dcp.load(target, storage_reader=r, checkpoint_id=10 + rep)

        def tc_save(rep: int) -> None:
            w = S3StorageWriter("us-east-1", f"s3://bench/s3tc/{rep}", s3client_config=cfg)
            w.fs = s3tc_fs()
            w.path = w.fs.init_path(f"s3://bench/s3tc/{rep}")
            dcp.save(state, storage_writer=w)

        def tc_load(rep: int) -> None:
            r = S3StorageReader("us-east-1", f"s3://bench/s3tc/{rep}", s3client_config=cfg,
                                reader_constructor=S3ReaderConstructor.dcp_optimized())
            r.fs = s3tc_fs(r._reader_constructor)  # the reader injects its plan's ranges into it
            r.path = r.fs.init_path(f"s3://bench/s3tc/{rep}")
            dcp.load(target, storage_reader=r)

        def check(name: str) -> None:
            bad = [k for k in state if not torch.equal(state[k], target[k])]
            if bad:
                raise AssertionError(f"{name}: {len(bad)} tensors differ after the load")
            for t in target.values():
                t.zero_()

        for rep in range(-args.warmup, args.repeats):
            saves: List[tuple] = [("ringtier dcp.save (s3:// tier)", rt_save), ("s3torchconnector S3StorageWriter", tc_save)]
            loads: List[tuple] = [("ringtier dcp.load (s3:// tier)", rt_load), ("s3torchconnector S3StorageReader", tc_load)]
            for group, kind in ((saves, "save"), (loads, "load")):
                for name, fn in group[rep % 2:] + group[: rep % 2]:
                    evict()
                    la = os.getloadavg()[0]
                    s0, c0, t0 = proc_cpu(server.pid), cpu(), time.perf_counter()
                    fn(rep)
                    secs, c = time.perf_counter() - t0, cpu() - c0
                    if rep < 0:  # a warm-up round: not recorded
                        if kind == "load":
                            check(name)
                        continue
                    results.append({"config": name, "kind": kind, "repeat": rep, "seconds": secs, "cpu_seconds": c,
                                    "server_cpu_seconds": proc_cpu(server.pid) - s0, "bytes": total,
                                    "loadavg_before": la})
                    if kind == "load":
                        check(name)
            # Free the disk for the next repeat (metadata first, as a delete goes).
            if writer._meta is not None:
                writer._meta.delete(10 + rep)
            if writer._shards is not None:
                writer._shards.delete(10 + rep)
            shutil.rmtree(os.path.join(args.dir, "s3", "bench", "s3tc", str(rep)), ignore_errors=True)
        writer.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(args.dir, ignore_errors=True)
    gib = total / 2**30
    rows: Dict[str, Any] = {}
    for name in dict.fromkeys(r["config"] for r in results):
        ps = [r for r in results if r["config"] == name]
        s = sorted(p["seconds"] for p in ps)
        rows[name] = {"min": s[0], "median": statistics.median(s), "max": s[-1],
                      "gbps_median": total / statistics.median(s) / 1e9,
                      "cpu_s_per_gib_median": statistics.median(p["cpu_seconds"] / gib for p in ps),
                      "server_cpu_s_per_gib_median": statistics.median(p["server_cpu_seconds"] / gib for p in ps)}

    def pair(a: str, b: str, key: str) -> Dict[str, float]:
        """b / a, repeat by repeat."""
        ra = {r["repeat"]: r for r in results if r["config"] == a}
        rb = {r["repeat"]: r for r in results if r["config"] == b}
        xs = sorted(rb[k][key] / ra[k][key] for k in ra if k in rb)
        return {"min": xs[0], "median": statistics.median(xs), "max": xs[-1]}

    ratios = {
        "save speed: s3torchconnector seconds / ringtier seconds": pair(
            "ringtier dcp.save (s3:// tier)", "s3torchconnector S3StorageWriter", "seconds"),
        "save CPU: ringtier / s3torchconnector": pair(
            "s3torchconnector S3StorageWriter", "ringtier dcp.save (s3:// tier)", "cpu_seconds"),
        "load speed: s3torchconnector seconds / ringtier seconds": pair(
            "ringtier dcp.load (s3:// tier)", "s3torchconnector S3StorageReader", "seconds"),
        "load CPU: ringtier / s3torchconnector": pair(
            "s3torchconnector S3StorageReader", "ringtier dcp.load (s3:// tier)", "cpu_seconds"),
    }
    fs = subprocess.run(["stat", "-f", "-c", "%T", os.path.dirname(args.dir.rstrip("/")) or "/"],
                        capture_output=True, text=True).stdout.strip()
    loads = [r["loadavg_before"] for r in results]
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "server_fs": fs,
            "loadavg_before_min_max": [min(loads), max(loads)],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "machine": f"{socket.gethostname()}, {os.cpu_count()} cores, kernel {platform.release()}, torch {torch.__version__}",
            "command": "python " + " ".join(sys.argv), "gib": gib, "repeats": args.repeats,
            "warmup_rounds": args.warmup}
    lines = ["# DCP to S3: ringtier (s3:// tier) vs s3torchconnector 1.5.0, loopback s3s-fs", "",
             f"{meta['date']}; {meta['machine']}; server: the test kit's s3s-fs ({args.server}) on loopback, "
             f"objects on {fs} ({args.dir}); {gib:.2f} GiB state, 1 process; {args.repeats} interleaved repeats after "
             f"{args.warmup} untimed warm-up round(s) of every client, "
             f"caches dropped before each pass; load average {min(loads):.1f} to {max(loads):.1f}; "
             f"peak RSS of the process (both clients, the state and its load targets) {meta['peak_rss_mib']:.0f} MiB.",
             "", f"Command: `{meta['command']}`", "",
             "| configuration | seconds min / median / max | GB/s (median) | client CPU s per GiB (median) "
             "| server CPU s per GiB (median) |",
             "|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['min']:.3f} / {r['median']:.3f} / {r['max']:.3f} | {r['gbps_median']:.2f} "
                     f"| {r['cpu_s_per_gib_median']:.2f} | {r['server_cpu_s_per_gib_median']:.2f} |")
    lines += ["", "| ratio, pair by pair | min / median / max |", "|---|---|"]
    for k, v in ratios.items():
        lines.append(f"| {k} | {v['min']:.2f} / {v['median']:.2f} / {v['max']:.2f} |")
    text = "\n".join(lines) + "\n"
    write_report(text, {"meta": meta, "rows": rows, "ratios": ratios, "passes": results}, args.json, args.md)


if __name__ == "__main__":
    main()
