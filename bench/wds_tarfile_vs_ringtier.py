#!/usr/bin/env python3
"""Streaming WebDataset tar shards: ringtier's record reader against a plain Python `tarfile`
reader in DataLoader-style worker processes (the `webdataset` package's pattern: shards split
across workers, each worker streams its shards with `tarfile` in stream mode and groups the
members sharing a key into samples, samples sent back to the parent through a queue), cold,
interleaved, worker count swept. Standard library only.

usage: python3 bench/wds_tarfile_vs_ringtier.py --dir SHARDS --ringtier BIN [--repeats 3]
       [--workers 1,2,4] [--json OUT.json]
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
import time
import subprocess


def evict(files):
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


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


def summary(v):
    return {"min": min(v), "median": statistics.median(v), "max": max(v)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--ringtier", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--json")
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.dir, "*.tar")))
    total = sum(os.path.getsize(f) for f in files)
    widths = [int(x) for x in a.workers.split(",")]
    runs = {"ringtier": []}
    runs.update({f"tarfile, {w} workers": [] for w in widths})
    for r in range(a.repeats):
        evict(files)
        with tempfile.NamedTemporaryFile(suffix=".json") as j:
            out = subprocess.run([a.ringtier, "bench", "read", "--dir", a.dir, "--format", "wds", "--repeats", "1",
                                  "--depths", str(a.depth), "--read-size", "4m", "--json", j.name],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(out.stderr[-2000:])
            rep = json.load(open(j.name))
        p = rep["ringtier"]["runs"][0]
        runs["ringtier"].append({"mb_per_sec": total / p["wall_seconds"] / 1e6,
                                 "cpu_seconds_per_gib": p["cpu_seconds"] / (total / 2**30),
                                 "records": p["records"]})
        for w in widths:
            evict(files)
            c0 = cpu_children() + cpu_self()
            n, _, wall = tarfile_pass(files, w)
            cpu = cpu_children() + cpu_self() - c0
            runs[f"tarfile, {w} workers"].append({"mb_per_sec": total / wall / 1e6,
                                                  "cpu_seconds_per_gib": cpu / (total / 2**30), "records": n})
        print(f"repeat {r + 1}/{a.repeats}: " + ", ".join(
            f"{k} {v[-1]['mb_per_sec']:.0f} MB/s" for k, v in runs.items()), file=sys.stderr)
    best = max((k for k in runs if k != "ringtier"),
               key=lambda k: statistics.median(x["mb_per_sec"] for x in runs[k]))
    ratio = [o["mb_per_sec"] / t["mb_per_sec"] for o, t in zip(runs["ringtier"], runs[best])]
    cpu_ratio = [o["cpu_seconds_per_gib"] / t["cpu_seconds_per_gib"] for o, t in zip(runs["ringtier"], runs[best])]
    report = {"schema": "ringtier.bench.wds-tarfile/1", "dir": a.dir, "shards": len(files), "bytes": total,
              "repeats": a.repeats, "best_tarfile": best,
              "ringtier_over_best_mb_per_sec": summary(ratio), "ringtier_over_best_cpu_per_gib": summary(cpu_ratio),
              "sides": {k: {"mb_per_sec": summary([x["mb_per_sec"] for x in v]),
                            "cpu_seconds_per_gib": summary([x["cpu_seconds_per_gib"] for x in v]), "runs": v}
                        for k, v in runs.items()}}
    for k, s in report["sides"].items():
        m, c = s["mb_per_sec"], s["cpu_seconds_per_gib"]
        print(f"{k:<20} {m['min']:8.1f} {m['median']:8.1f} {m['max']:8.1f} MB/s  {c['median']:6.2f} CPU s/GiB")
    print(f"ringtier / {best}: {summary(ratio)['median']:.2f} (min {min(ratio):.2f}, max {max(ratio):.2f}); "
          f"CPU per GiB {summary(cpu_ratio)['median']:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
