#!/usr/bin/env python3
"""Streaming TFRecord shards: ringtier's record reader against tf.data, cold, interleaved.

Each pass runs in its own process under /usr/bin/time (wall, user+sys CPU, peak RSS), after
every shard is evicted from the page cache (posix_fadvise DONTNEED). Order per repeat:
ringtier, then tf.data at each interleave width, so drift hits all alike.

  ringtier: `ringtier bench read --format tfrecord --repeats 1` (its own ringtier pass; the
            cat pass it also runs is reported separately and kept out of the CPU figures by
            taking ringtier's own wall and CPU from its JSON)
  tf.data:  Dataset.from_tensor_slices(shards).interleave(TFRecordDataset, cycle_length=k,
            num_parallel_calls=k) -> map(tf.strings.length) -> batch(1024), every record's
            bytes counted (TFRecordDataset checks the CRCs as ringtier does)

Needs tensorflow-cpu (`python3 -m venv bench/.venv-tf && bench/.venv-tf/bin/pip install
tensorflow-cpu`); not needed by CI.

Options for the ceiling questions: `--order global` reads ringtier's records in one global
random order through the shards' indexes (`ringtier index`), against tf.data streaming with
its own shuffle buffer (`--tf-shuffle N`, records; 0: none); `--hog N` keeps N busy-looping
processes running through every pass (CPU contention, the same for both sides). On tmpfs
(`/dev/shm`) the data are in memory and every side is parse-bound. ringtier's `cat` pass (cold,
the same shards) is reported too.

usage: bench/.venv-tf/bin/python bench/tfdata_vs_ringtier.py --dir SHARDS --ringtier BIN
       [--repeats 3] [--interleave 1,4,16] [--order stream|global] [--tf-shuffle N] [--hog N]
       [--depth 8] [--json OUT.json]
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchlib import evict, fs_type, hogs, summary

TF_CHILD = r"""
import json, sys, time, glob, os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
files = sorted(glob.glob(os.path.join(sys.argv[1], "*.tfrecord")))
k = int(sys.argv[2])
shuffle = int(sys.argv[3])
t0 = time.perf_counter()
ds = tf.data.Dataset.from_tensor_slices(files)
if shuffle:
    ds = ds.shuffle(len(files), seed=0)
ds = ds.interleave(lambda f: tf.data.TFRecordDataset(f, buffer_size=4 << 20), cycle_length=k,
                   num_parallel_calls=(k if k > 1 else None), deterministic=False)
if shuffle:
    ds = ds.shuffle(shuffle, seed=0)
ds = ds.map(tf.strings.length, num_parallel_calls=tf.data.AUTOTUNE).batch(1024).prefetch(2)
n = b = 0
for x in ds:
    n += int(x.shape[0]); b += int(tf.reduce_sum(tf.cast(x, tf.int64)))
print(json.dumps({"records": n, "payload_bytes": b, "wall": time.perf_counter() - t0}))
"""


PY_CHILD = r"""
import json, sys, time
import ringtier
t0 = time.perf_counter()
loader = ringtier.RecordLoader(sys.argv[1], format=sys.argv[2], order=sys.argv[3], depth=int(sys.argv[4]),
                               read_size=4 << 20, seed=int(sys.argv[5]))
n = b = 0
for rec in loader.epoch(int(sys.argv[5])):
    n += 1
    b += len(rec)
print(json.dumps({"records": n, "payload_bytes": b, "wall": time.perf_counter() - t0}))
"""


def python_pass(a, fmt, repeat):
    """ringtier.RecordLoader iterated from Python, in its own process (PYTHONPATH=--python-path)."""
    env = dict(os.environ, PYTHONPATH=a.python_path)
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t:
        cmd = [sys.executable, "-c", PY_CHILD, a.dir, fmt, a.order, str(a.depth), str(repeat)]
        out = subprocess.run(["/usr/bin/time", "-o", t.name, "-f", "%e %U %S %M"] + cmd,
                             capture_output=True, text=True, env=env)
        if out.returncode != 0:
            sys.exit(f"ringtier from Python failed: {out.stderr[-2000:]}")
        wall, user, sys_, rss = t.read().split()[-4:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return res, float(user) + float(sys_), int(rss) * 1024


def timed(cmd):
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t:
        out = subprocess.run(["/usr/bin/time", "-o", t.name, "-f", "%e %U %S %M"] + cmd,
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{cmd[0]} failed: {out.stderr[-2000:]}")
        wall, user, sys_, rss = t.read().split()[-4:]
    return out.stdout, float(wall), float(user) + float(sys_), int(rss) * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--ringtier", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--interleave", default="1,4,16")
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--order", choices=["stream", "global"], default="stream")
    ap.add_argument("--tf-shuffle", type=int, default=0)
    ap.add_argument("--hog", type=int, default=0)
    ap.add_argument("--python-path", help="a directory holding the ringtier package (release build): adds "
                    "ringtier.RecordLoader iterated from Python as a side")
    ap.add_argument("--json")
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.dir, "*.tfrecord")))
    busy = hogs(a.hog)
    try:
        run(a, files)
    finally:
        for h in busy:
            h.kill()
            h.wait()


def run(a, files):
    total = sum(os.path.getsize(f) for f in files)
    widths = [int(x) for x in a.interleave.split(",")]
    runs = {"ringtier": []}
    if a.python_path:
        runs["ringtier from Python"] = []
    runs.update({f"tf.data interleave {k}": [] for k in widths})
    cats = []
    for r in range(a.repeats):
        evict(files)
        with tempfile.NamedTemporaryFile(suffix=".json") as j:
            timed([a.ringtier, "bench", "read", "--dir", a.dir, "--format", "tfrecord", "--repeats", "1",
                   "--record-order", a.order, "--depths", str(a.depth), "--read-size", "4m", "--json", j.name])
            rep = json.load(open(j.name))
        p = rep["ringtier"]["runs"][0]
        c = rep["cat"]["runs"][0]
        cats.append({"mb_per_sec": total / c["wall_seconds"] / 1e6})
        runs["ringtier"].append({"mb_per_sec": total / p["wall_seconds"] / 1e6,
                                 "cpu_seconds_per_gib": p["cpu_seconds"] / (total / 2**30),
                                 "records": p["records"], "peak_rss_bytes": rep["peak_rss_bytes"]})
        if a.python_path:
            evict(files)
            res, cpu, rss = python_pass(a, "tfrecord", r)
            runs["ringtier from Python"].append({"mb_per_sec": total / res["wall"] / 1e6,
                                                 "cpu_seconds_per_gib": cpu / (total / 2**30),
                                                 "records": res["records"], "peak_rss_bytes": rss})
        for k in widths:
            evict(files)
            out, wall, cpu, rss = timed([sys.executable, "-c", TF_CHILD, a.dir, str(k), str(a.tf_shuffle)])
            res = json.loads(out.strip().splitlines()[-1])
            # The pass's own wall time (TensorFlow's import excluded); CPU of the whole process.
            runs[f"tf.data interleave {k}"].append({"mb_per_sec": total / res["wall"] / 1e6,
                                                    "cpu_seconds_per_gib": cpu / (total / 2**30),
                                                    "records": res["records"], "peak_rss_bytes": rss})
        print(f"repeat {r + 1}/{a.repeats}: " + ", ".join(
            f"{n} {v[-1]['mb_per_sec']:.0f} MB/s" for n, v in runs.items()) + f", cat {cats[-1]['mb_per_sec']:.0f} MB/s",
            file=sys.stderr)
    best_tf = max((n for n in runs if n.startswith("tf.data")),
                  key=lambda n: statistics.median(x["mb_per_sec"] for x in runs[n]))
    ratio = [o["mb_per_sec"] / t["mb_per_sec"] for o, t in zip(runs["ringtier"], runs[best_tf])]
    cpu_ratio = [o["cpu_seconds_per_gib"] / t["cpu_seconds_per_gib"] for o, t in zip(runs["ringtier"], runs[best_tf])]
    cat_ratio = [o["mb_per_sec"] / c["mb_per_sec"] for o, c in zip(runs["ringtier"], cats)]
    report = {"schema": "ringtier.bench.tfdata/2", "dir": a.dir, "filesystem": fs_type(a.dir), "shards": len(files),
              "bytes": total, "repeats": a.repeats, "order": a.order, "tf_shuffle": a.tf_shuffle, "hogs": a.hog,
              "depth": a.depth, "best_tf_data": best_tf,
              "cat_mb_per_sec": summary([c["mb_per_sec"] for c in cats]),
              "ringtier_over_cat_mb_per_sec": summary(cat_ratio),
              "ringtier_over_best_tf_data_mb_per_sec": summary(ratio),
              "ringtier_over_best_tf_data_cpu_per_gib": summary(cpu_ratio),
              "python_over_best_tf_data_mb_per_sec": summary(
                  [o["mb_per_sec"] / t["mb_per_sec"] for o, t in zip(runs["ringtier from Python"], runs[best_tf])])
              if a.python_path else None,
              "sides": {n: {"mb_per_sec": summary([x["mb_per_sec"] for x in v]),
                            "cpu_seconds_per_gib": summary([x["cpu_seconds_per_gib"] for x in v]),
                            "peak_rss_bytes_max": max(x["peak_rss_bytes"] for x in v), "runs": v}
                        for n, v in runs.items()}}
    for n, s in report["sides"].items():
        m, c = s["mb_per_sec"], s["cpu_seconds_per_gib"]
        print(f"{n:<22} {m['min']:8.1f} {m['median']:8.1f} {m['max']:8.1f} MB/s  "
              f"{c['median']:6.2f} CPU s/GiB  peak RSS {s['peak_rss_bytes_max'] / 2**20:7.1f} MiB")
    print(f"ringtier / {best_tf}: {summary(ratio)['median']:.2f} MB/s (min {min(ratio):.2f}, max {max(ratio):.2f}); "
          f"CPU per GiB {summary(cpu_ratio)['median']:.2f}; ringtier / cat {summary(cat_ratio)['median']:.2f} "
          f"(cat {summary([c['mb_per_sec'] for c in cats])['median']:.0f} MB/s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
