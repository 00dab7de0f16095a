#!/usr/bin/env python3
"""Streaming WebDataset tar shards: ringtier's record reader against a plain Python `tarfile`
reader in DataLoader-style worker processes (the `webdataset` package's pattern: shards split
across workers, each worker streams its shards with `tarfile` in stream mode and groups the
members sharing a key into samples, samples sent back to the parent through a queue), cold,
interleaved, worker count swept. Standard library only.

`--hog N` keeps N busy-looping processes running through every pass (CPU contention for both
sides); on tmpfs (`/dev/shm`) the data are in memory and both sides are parse-bound;
`--order global` reads ringtier's samples in one global random order through the shards'
indexes. ringtier's cold `cat` pass of the same shards is reported too. The tarfile workers
send back (key, size), not the bytes: a lower bound on what `webdataset` + DataLoader costs.

usage: python3 bench/wds_tarfile_vs_ringtier.py --dir SHARDS --ringtier BIN [--repeats 3]
       [--workers 1,2,4] [--order stream|global] [--hog N] [--json OUT.json]
"""

import argparse
import glob
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tarfile
import tempfile

from benchlib import evict, fs_type, hogs, summary
import time
import subprocess


PY_CHILD = r"""
import json, sys, time
import ringtier
t0 = time.perf_counter()
loader = ringtier.RecordLoader(sys.argv[1], format="wds", order=sys.argv[2], depth=int(sys.argv[3]),
                               read_size=4 << 20, seed=int(sys.argv[4]))
n = b = 0
for rec in loader.epoch(int(sys.argv[4])):
    n += 1
    b += len(rec)
print(json.dumps({"records": n, "payload_bytes": b, "wall": time.perf_counter() - t0}))
"""


def worker(shards, q):
    """One DataLoader worker: its shards, streamed, samples grouped by key."""
    for path in shards:
        with tarfile.open(path, mode="r|") as tar:
            key, sample = None, {}
            for m in tar:
                if not m.isfile():
                    continue
                base = m.name.rsplit("/", 1)
                dot = base[-1].find(".")
                k = m.name[: len(m.name) - len(base[-1]) + dot] if dot >= 0 else m.name
                data = tar.extractfile(m).read()
                if k != key and sample:
                    q.put((key, sum(len(v) for v in sample.values())))
                    sample = {}
                key = k
                sample[m.name[len(k) + 1:]] = data
            if sample:
                q.put((key, sum(len(v) for v in sample.values())))
    q.put(None)


def tarfile_pass(files, workers):
    t0 = time.perf_counter()
    q = mp.Queue(maxsize=256)
    procs = [mp.Process(target=worker, args=(files[w::workers], q)) for w in range(workers)]
    for p in procs:
        p.start()
    done, n, b = 0, 0, 0
    while done < workers:
        item = q.get()
        if item is None:
            done += 1
            continue
        n += 1
        b += item[1]
    for p in procs:
        p.join()
    return n, b, time.perf_counter() - t0


def cpu_children():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def cpu_self():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--ringtier", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--order", choices=["stream", "global"], default="stream")
    ap.add_argument("--hog", type=int, default=0)
    ap.add_argument("--python-path", help="a directory holding the ringtier package (release build): adds "
                    "ringtier.RecordLoader iterated from Python as a side")
    ap.add_argument("--json")
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.dir, "*.tar")))
    busy = hogs(a.hog)
    try:
        run(a, files)
    finally:
        for h in busy:
            h.kill()
            h.wait()


def run(a, files):
    total = sum(os.path.getsize(f) for f in files)
    widths = [int(x) for x in a.workers.split(",")]
    runs = {"ringtier": []}
    if a.python_path:
        runs["ringtier from Python"] = []
    runs.update({f"tarfile, {w} workers": [] for w in widths})
    cats = []
    for r in range(a.repeats):
        evict(files)
        with tempfile.NamedTemporaryFile(suffix=".json") as j:
            out = subprocess.run([a.ringtier, "bench", "read", "--dir", a.dir, "--format", "wds", "--repeats", "1",
                                  "--record-order", a.order, "--depths", str(a.depth), "--read-size", "4m", "--json", j.name],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(out.stderr[-2000:])
            rep = json.load(open(j.name))
        p = rep["ringtier"]["runs"][0]
        cats.append({"mb_per_sec": total / rep["cat"]["runs"][0]["wall_seconds"] / 1e6})
        runs["ringtier"].append({"mb_per_sec": total / p["wall_seconds"] / 1e6,
                                 "cpu_seconds_per_gib": p["cpu_seconds"] / (total / 2**30),
                                 "records": p["records"]})
        if a.python_path:
            evict(files)
            c0 = cpu_children()
            out = subprocess.run([sys.executable, "-c", PY_CHILD, a.dir, a.order, str(a.depth), str(r)],
                                 capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=a.python_path))
            if out.returncode != 0:
                sys.exit(f"ringtier from Python failed: {out.stderr[-2000:]}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            runs["ringtier from Python"].append({"mb_per_sec": total / res["wall"] / 1e6,
                                                 "cpu_seconds_per_gib": (cpu_children() - c0) / (total / 2**30),
                                                 "records": res["records"]})
        for w in widths:
            evict(files)
            c0 = cpu_children() + cpu_self()
            n, _, wall = tarfile_pass(files, w)
            cpu = cpu_children() + cpu_self() - c0
            runs[f"tarfile, {w} workers"].append({"mb_per_sec": total / wall / 1e6,
                                                  "cpu_seconds_per_gib": cpu / (total / 2**30), "records": n})
        print(f"repeat {r + 1}/{a.repeats}: " + ", ".join(
            f"{k} {v[-1]['mb_per_sec']:.0f} MB/s" for k, v in runs.items()) + f", cat {cats[-1]['mb_per_sec']:.0f} MB/s",
            file=sys.stderr)
    best = max((k for k in runs if k.startswith("tarfile")),
               key=lambda k: statistics.median(x["mb_per_sec"] for x in runs[k]))
    ratio = [o["mb_per_sec"] / t["mb_per_sec"] for o, t in zip(runs["ringtier"], runs[best])]
    cpu_ratio = [o["cpu_seconds_per_gib"] / t["cpu_seconds_per_gib"] for o, t in zip(runs["ringtier"], runs[best])]
    cat_ratio = [o["mb_per_sec"] / c["mb_per_sec"] for o, c in zip(runs["ringtier"], cats)]
    report = {"schema": "ringtier.bench.wds-tarfile/2", "dir": a.dir, "filesystem": fs_type(a.dir),
              "shards": len(files), "bytes": total, "repeats": a.repeats, "order": a.order, "hogs": a.hog,
              "best_tarfile": best, "cat_mb_per_sec": summary([c["mb_per_sec"] for c in cats]),
              "ringtier_over_cat_mb_per_sec": summary(cat_ratio),
              "python_over_best_mb_per_sec": summary(
                  [o["mb_per_sec"] / t["mb_per_sec"] for o, t in zip(runs["ringtier from Python"], runs[best])])
              if a.python_path else None,
              "ringtier_over_best_mb_per_sec": summary(ratio), "ringtier_over_best_cpu_per_gib": summary(cpu_ratio),
              "sides": {k: {"mb_per_sec": summary([x["mb_per_sec"] for x in v]),
                            "cpu_seconds_per_gib": summary([x["cpu_seconds_per_gib"] for x in v]), "runs": v}
                        for k, v in runs.items()}}
    for k, s in report["sides"].items():
        m, c = s["mb_per_sec"], s["cpu_seconds_per_gib"]
        print(f"{k:<20} {m['min']:8.1f} {m['median']:8.1f} {m['max']:8.1f} MB/s  {c['median']:6.2f} CPU s/GiB")
    print(f"ringtier / {best}: {summary(ratio)['median']:.2f} (min {min(ratio):.2f}, max {max(ratio):.2f}); "
          f"CPU per GiB {summary(cpu_ratio)['median']:.2f}; ringtier / cat {summary(cat_ratio)['median']:.2f} "
          f"(cat {summary([c['mb_per_sec'] for c in cats])['median']:.0f} MB/s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
