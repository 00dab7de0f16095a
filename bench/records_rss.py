"""What the peak RSS of a process streaming shards through `ringtier.RecordLoader` is made of
(issue 18): each configuration runs in its own fresh process, which reports its RSS after the
imports (the interpreter + numpy [+ torch] baseline), after creating the loader (the read pool
is allocated and touched then), and its peak over one full epoch, plus the loader's own
accounting of the record bytes it held (`stats()`, where the build has it).

    python bench/records_rss.py --dir /data/tf16 [--torch] [--config 'shuffle_buffer=256'] \
        [--arena-max 1] --repeats 2 --json out.json

Each configuration is a comma-separated list of RecordLoader keyword arguments (integers);
the default set sweeps the shuffle buffer and the prefetch. The data should be in the page
cache or not, as you want: the script does not evict (RSS does not depend on it).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, sys, time
def rss():
    vals = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                vals[k] = int(v.split()[0]) * 1024
    return vals
args = json.loads(sys.argv[1])
import numpy
if args["torch"]:
    import torch
import ringtier
out = {"after_imports": rss()["VmRSS"]}
loader = ringtier.RecordLoader(args["dir"], format=args["format"], order=args["order"], **args["kwargs"])
out["after_loader"] = rss()["VmRSS"]
out["pool_bytes"] = loader.pool_bytes
t0 = time.perf_counter()
ep = loader.epoch(0)
n = b = biggest = 0
for rec in ep:
    if args["format"] == "wds":
        size = len(rec)
    else:
        size = numpy.frombuffer(rec, numpy.uint8).size
    b += size
    biggest = max(biggest, size)
    n += 1
out["seconds"] = time.perf_counter() - t0
out["records"] = n
out["bytes"] = b
out["stats"] = {k: v for k, v in ep.stats().items()}
out["largest_record"] = biggest
for k in ("shuffle_bytes", "prefetch_bytes"):
    if hasattr(loader, k):
        out[k] = getattr(loader, k)
if hasattr(loader, "memory_bound"):
    out["memory_bound"] = loader.memory_bound(biggest)
out["peak_rss"] = rss()["VmHWM"]
print(json.dumps(out))
"""


def parse_kwargs(text):
    kw = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        k, _, v = part.partition("=")
        kw[k.strip()] = int(v)
    return kw


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--format", default="tfrecord", choices=["tfrecord", "wds"])
    ap.add_argument("--order", default="stream", choices=["stream", "global"])
    ap.add_argument("--torch", action="store_true", help="import torch in the measured process too")
    ap.add_argument("--config", action="append", help="RecordLoader kwargs, e.g. 'shuffle_buffer=256,prefetch=64'")
    ap.add_argument("--arena-max", type=int, default=0, help="MALLOC_ARENA_MAX for the measured process (0: unset)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--python-path", default="", help="prepended to PYTHONPATH (a ringtier build to measure)")
    ap.add_argument("--json")
    a = ap.parse_args()
    configs = a.config or ["", "shuffle_buffer=256", "shuffle_buffer=0", "shuffle_buffer=0,prefetch=1"]
    env = dict(os.environ)
    if a.python_path:
        env["PYTHONPATH"] = a.python_path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if a.arena_max:
        env["MALLOC_ARENA_MAX"] = str(a.arena_max)
    base = {"dir": a.dir, "format": a.format, "order": a.order, "torch": a.torch}
    rows = {c: [] for c in configs}
    for r in range(a.repeats):
        for c in configs:  # interleaved: every configuration once per repeat
            arg = json.dumps(dict(base, kwargs=parse_kwargs(c)))
            p = subprocess.run([sys.executable, "-c", CHILD, arg], env=env, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"configuration {c!r} failed:\n{p.stderr}")
            res = json.loads(p.stdout.strip().splitlines()[-1])
            rows[c].append(res)
            mib = lambda v: v / (1 << 20)
            print(
                f"repeat {r + 1} [{c or 'defaults'}]: imports {mib(res['after_imports']):.0f} MiB, "
                f"loader {mib(res['after_loader']):.0f} MiB (pool {mib(res['pool_bytes']):.0f}), "
                f"peak {mib(res['peak_rss']):.0f} MiB, {res['bytes'] / res['seconds'] / 1e6:.0f} MB/s, "
                f"stats {res['stats']}" + (f", bound {mib(res['memory_bound']):.0f} MiB" if res.get("memory_bound") else ""),
                flush=True,
            )
    report = {
        "schema": "ringtier.bench.records_rss/1",
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "storage": a.dir,
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "load": os.getloadavg()},
        "torch": a.torch,
        "malloc_arena_max": a.arena_max or None,
        "configs": {
            c or "defaults": {
                "peak_rss_bytes": {
                    "min": min(x["peak_rss"] for x in v),
                    "median": statistics.median(x["peak_rss"] for x in v),
                    "max": max(x["peak_rss"] for x in v),
                },
                "runs": v,
            }
            for c, v in rows.items()
        },
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
