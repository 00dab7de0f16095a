#!/usr/bin/env python3
"""ringtier.grain.FileSource against grain's own sources, cold, interleaved: every file of a
directory read once through grain.MapDataset.source(src).shuffle(seed).to_iter_dataset(
ReadOptions(num_threads=T)), the bytes counted, T swept (grain's read threads; one process).

  ringtier:     ringtier.grain.FileSource(D) (concurrent __getitem__ calls coalesced into
                batched io_uring reads)
  ringtier dataset: ringtier.grain.FileDataset(D, seed=0), a grain IterDataset read ahead by the
                engine (no grain read threads: one pass, not swept; --no-dataset to skip)
  python files: a plain source, open().read() per index (what a grain user writes for files)
  array_record: grain.sources.ArrayRecordDataSource over the same bytes packed into ArrayRecord
                files (written once before the passes; --no-array-record to skip)

Each pass in its own process under /usr/bin/time, after drop_caches (root) or posix_fadvise.
usage: PYTHONPATH=PKG target/tf-venv/bin/python bench/tensorflow/grain_sources.py --dir D
       [--threads 4,16,64] [--repeats 3] [--json OUT]
"""

import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchlib import evict, fs_type, summary  # noqa: E402

CHILD = r"""
import json, os, sys, time
import grain
side, d, threads, ar = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
t0 = time.perf_counter()
if side == "ringtier dataset":
    import ringtier.grain
    src = None
    ds = ringtier.grain.FileDataset(d, seed=0)
elif side == "ringtier":
    import ringtier.grain
    src = ringtier.grain.FileSource(d)
elif side == "python files":
    class Files:
        def __init__(self, root):
            self.root = root
            self.keys = sorted(os.path.relpath(os.path.join(p, f), root) for p, _, fs in os.walk(root) for f in fs
                               if not f.startswith("."))
        def __len__(self):
            return len(self.keys)
        def __getitem__(self, i):
            with open(os.path.join(self.root, self.keys[i]), "rb") as f:
                return f.read()
    src = Files(d)
else:
    src = grain.sources.ArrayRecordDataSource(sorted(os.path.join(ar, f) for f in os.listdir(ar)))
if src is not None:
    ds = grain.MapDataset.source(src).shuffle(seed=0).to_iter_dataset(grain.ReadOptions(num_threads=threads))
n = b = 0
for x in ds:
    n += 1
    b += len(x)
print(json.dumps({"samples": n, "bytes": b, "wall": time.perf_counter() - t0}))
"""


def pack_array_record(files, root, out, shards=16):
    from array_record.python.array_record_module import ArrayRecordWriter

    os.makedirs(out, exist_ok=True)
    writers = [ArrayRecordWriter(os.path.join(out, f"part-{i:03d}.array_record"), "group_size:1") for i in range(shards)]
    for i, f in enumerate(files):
        with open(f, "rb") as fh:
            writers[i % shards].write(fh.read())
    for w in writers:
        w.close()
    return sorted(glob.glob(os.path.join(out, "*")))


def timed(cmd):
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t:
        out = subprocess.run(["/usr/bin/time", "-o", t.name, "-f", "%e %U %S %M"] + cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{cmd[:4]} failed: {out.stderr[-3000:]}")
        _w, user, sys_, rss = t.read().split()[-4:]
    return json.loads(out.stdout.strip().splitlines()[-1]), float(user) + float(sys_), int(rss) * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--threads", default="4,16,64")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-array-record", action="store_true")
    ap.add_argument("--no-dataset", action="store_true", help="leave out ringtier.grain.FileDataset")
    ap.add_argument("--json")
    a = ap.parse_args()
    files = sorted(f for f in glob.glob(os.path.join(a.dir, "*", "*")) if os.path.isfile(f))
    total = sum(os.path.getsize(f) for f in files)
    ar_dir = a.dir.rstrip("/") + ".array_record"
    sides = ["ringtier", "python files"] + ([] if a.no_array_record else ["array_record"])
    ar_files = [] if a.no_array_record else pack_array_record(files, a.dir, ar_dir)
    root = os.geteuid() == 0
    names = [f"{s} t{t}" for s in sides for t in a.threads.split(",")]
    if not a.no_dataset:
        names.insert(0, "ringtier dataset t0")  # no grain read threads: the engine reads ahead
    runs = {n: [] for n in names}
    try:
        for r in range(a.repeats):
            for n in names:
                side, t = n.rsplit(" t", 1)
                if root:
                    subprocess.run(["sync"], check=True)
                    with open("/proc/sys/vm/drop_caches", "w") as f:
                        f.write("3\n")
                else:
                    evict(files + ar_files)
                res, cpu, rss = timed([sys.executable, "-c", CHILD, side, a.dir, t, ar_dir])
                assert res["samples"] == len(files) and res["bytes"] == total, (n, res)
                runs[n].append({"mb_per_sec": total / res["wall"] / 1e6, "cpu_seconds_per_gib": cpu / (total / 2**30),
                                "peak_rss_bytes": rss})
            print(f"repeat {r + 1}/{a.repeats}: " + ", ".join(f"{n} {v[-1]['mb_per_sec']:.0f}" for n, v in runs.items()),
                  file=sys.stderr, flush=True)
    finally:
        if ar_files:
            import shutil

            shutil.rmtree(ar_dir, ignore_errors=True)
    med = {n: statistics.median(x["mb_per_sec"] for x in v) for n, v in runs.items()}
    best_rt = max((n for n in names if n.startswith("ringtier t")), key=med.get)
    best_grain = max((n for n in names if not n.startswith("ringtier")), key=med.get)

    def pairwise(n):
        return [o["mb_per_sec"] / t["mb_per_sec"] for o, t in zip(runs[n], runs[best_grain])]

    ratio = pairwise(best_rt)
    report = {
        "schema": "ringtier.bench.grain/1",
        "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "machine": {"nproc": os.cpu_count(), "kernel": platform.release(), "filesystem": fs_type(a.dir)},
        "files": len(files), "bytes": total, "repeats": a.repeats,
        "cold": "drop_caches" if root else "posix_fadvise DONTNEED per file",
        "best_ringtier": best_rt, "best_grain_source": best_grain,
        "ringtier_over_best_grain_source_mb_per_sec": summary(ratio),
        "ringtier_dataset_over_best_grain_source_mb_per_sec": (
            None if a.no_dataset else summary(pairwise("ringtier dataset t0"))),
        "sides": {n: {"mb_per_sec": summary([x["mb_per_sec"] for x in v]),
                      "cpu_seconds_per_gib": summary([x["cpu_seconds_per_gib"] for x in v]),
                      "peak_rss_bytes_max": max(x["peak_rss_bytes"] for x in v), "runs": v} for n, v in runs.items()},
    }
    for n, v in report["sides"].items():
        print(f"{n:<20} {v['mb_per_sec']['median']:8.1f} MB/s  {v['cpu_seconds_per_gib']['median']:6.2f} CPU s/GiB")
    print(f"{best_rt} / {best_grain}: {summary(ratio)['median']:.2f}x (min {min(ratio):.2f}, max {max(ratio):.2f})")
    if not a.no_dataset:
        r = pairwise("ringtier dataset t0")
        print(f"ringtier dataset / {best_grain}: {summary(r)['median']:.2f}x (min {min(r):.2f}, max {max(r):.2f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
