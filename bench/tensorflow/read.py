#!/usr/bin/env python3
"""The paper's read micro-benchmark inside TensorFlow: tf.data's own readers against
ringtier.tensorflow.dataset, on the same files, cold, interleaved, pair by pair.

Each pass runs in its own process (wall of the pass itself, user+sys CPU and peak RSS of the
process, as it measures them at its end; "pass" CPU: the pass alone, without Python's start
and TensorFlow's import), after every file is evicted from the page cache
(posix_fadvise DONTNEED per file; `--drop-caches` as root: sync + drop_caches); "delivered":
the same pass up to its last batch, without destroying the tf.data iterator (which can wait up
to about half a second for tf.data's autotuning thread, on every side alike). Per repeat:
ringtier, then tf.data at each parallelism of the sweep, so drift hits all alike.

--format files (the paper's 16,384 files; `ringtier gen --preset imagenet --dir D`):
  tf.data:  list_files(D/*/*, shuffle, seed) -> map(read_file, num_parallel_calls=k)
            -> map(strings.length) -> batch(64) -> prefetch(2)          (k swept, AUTOTUNE too)
  ringtier: ringtier.tensorflow.dataset(D, batch_size=64) (tf.string, shuffled, seeded)
            -> map(strings.length) -> prefetch(2)
--format jpeg (decode and augmentation in both: `ringtier gen --format jpeg --dir D`):
  tf.data:  list_files -> map(read_file + decode_jpeg + random crop + resize 224 + flip,
            num_parallel_calls=k) -> batch(64) -> prefetch(2)
  ringtier: dataset(D, batch_size=64, transform=RandomResizedCrop(224)+flip, uint8) -> prefetch(2)
--format tfrecord (shards; `ringtier gen --format tfrecord --shards 64 --dir D`):
  tf.data:  from_tensor_slices(shards) -> interleave(TFRecordDataset, cycle_length=k,
            num_parallel_calls=k) -> map(strings.length) -> batch(1024) -> prefetch(2)
  ringtier: dataset(D, format="tfrecord", batch_size=1024, shuffle=False) -> map(strings.length)
            -> prefetch(2)                   (both sides: shards in order, no shuffle buffer)

--format files and tfrecord: ringtier's tf.string batches made by its C++ batch op
(RINGTIER_TF_OP=on: built once before the passes, not timed); --python-crossing adds the side
"ringtier python", the same pipeline with RINGTIER_TF_OP=off (the batches cross through a Python
generator). --epochs K: K epochs per pass process (the dataset built once, a new iterator each,
cold before each); epochs 2..K are reported as "later epochs".

--ceiling adds the disk's ceiling to every repeat: fio reading the same files with O_DIRECT
(io_uring, 16 reads in flight, 1 MiB blocks; files under --opendir), cold like the others
(side "disk (fio)"; not a tf.data side). Reported: each side's rate over it, pair by pair; a
tf.data side at r of the ceiling leaves room for at most 1/r times its speed.

--malloc-parallel K runs tf.data at parallelism K once more per repeat with the glibc malloc
settings ringtier.tensorflow makes for its tf.string batches (MALLOC_MMAP_THRESHOLD_,
MALLOC_TRIM_THRESHOLD_): the same heap policy on both sides. The best tf.data side is the best
of all of them.

usage: PYTHONPATH=PKG target/tf-venv/bin/python bench/tensorflow/read.py --dir D --format files
       [--repeats 5] [--parallel 1,16,autotune] [--malloc-parallel 16] [--json OUT.json]
"""

import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import sys

BENCH_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, BENCH_DIR)
from benchlib import cold, fs_type, git_commit, summary  # noqa: E402

CHILD = r"""
import json, os, resource, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
side, fmt, d, k = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
par = tf.data.AUTOTUNE if k == "autotune" else int(k)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
c0 = cpu()
t0 = time.perf_counter()
if side == "ringtier":
    import ringtier.tensorflow as rtf
    if fmt == "files":
        ds = rtf.dataset(d, batch_size=64, seed=0).map(tf.strings.length)
    elif fmt == "jpeg":
        from ringtier import transforms as T
        ds = rtf.dataset(d, batch_size=64, seed=0, transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()]))
    else:
        # The same work as tf.data's side: the shards in order, no shuffle buffer.
        ds = rtf.dataset(d, format="tfrecord", batch_size=1024, shuffle=False).map(tf.strings.length)
else:
    if fmt in ("files", "jpeg"):
        ds = tf.data.Dataset.list_files(os.path.join(d, "*", "*"), shuffle=True, seed=0)
        if fmt == "files":
            ds = ds.map(lambda f: tf.strings.length(tf.io.read_file(f)), num_parallel_calls=par).batch(64)
        else:
            def load(f):
                img = tf.io.decode_jpeg(tf.io.read_file(f), channels=3)
                shape = tf.shape(img)
                begin, size, _ = tf.image.sample_distorted_bounding_box(
                    shape, tf.zeros([0, 0, 4]), area_range=(0.08, 1.0), aspect_ratio_range=(0.75, 1.333),
                    min_object_covered=0.0, use_image_if_no_bounding_boxes=True, seed=0)
                img = tf.slice(img, begin, size)
                img = tf.image.resize(img, (224, 224), antialias=True)
                img = tf.image.random_flip_left_right(img, seed=0)
                return tf.cast(img, tf.uint8)
            ds = ds.map(load, num_parallel_calls=par).batch(64)
    else:
        files = sorted(tf.io.gfile.glob(os.path.join(d, "*.tfrecord")))
        ds = tf.data.Dataset.from_tensor_slices(files).interleave(
            lambda f: tf.data.TFRecordDataset(f, buffer_size=4 << 20), cycle_length=(4 if k == "autotune" else int(k)),
            num_parallel_calls=par, deterministic=False).map(tf.strings.length).batch(1024)
ds = ds.prefetch(2)


def one_epoch(t0):
    n = b = 0
    it = iter(ds)
    for x in it:
        n += int(x.shape[0])
        if fmt != "jpeg":
            b += int(tf.reduce_sum(tf.cast(x, tf.int64)))
    # The last batch delivered (and the end seen); destroying the iterator can add up to about
    # half a second more: its autotuning thread (tf.data's model thread, on by default on every
    # side) finishes the wait for its next optimization, whose period doubles, before the
    # iterator is gone.
    delivered = time.perf_counter() - t0
    del it
    return n, b, delivered, time.perf_counter() - t0


n, b, delivered, wall = one_epoch(t0)
pass_cpu = cpu() - c0
# Later epochs of the same dataset in this process (--epochs): a new iterator each, as a training
# loop makes one per epoch; the files evicted before each (cold) as before the first.
later = []
if int(sys.argv[5]) > 1:
    sys.path.insert(0, sys.argv[7])  # benchlib's directory
    from benchlib import cold
    files = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs]
for _ in range(int(sys.argv[5]) - 1):
    cold(files, sys.argv[6] == "1")
    c1 = cpu()
    n2, b2, dl2, wall2 = one_epoch(time.perf_counter())
    assert (n2, b2) == (n, b), f"epoch of {n2} samples / {b2} bytes, the first had {n} / {b}"
    later.append({"wall": wall2, "delivered": dl2, "pass_cpu": cpu() - c1})
record_op = None
if side == "ringtier" and fmt in ("files", "tfrecord"):
    from ringtier import _tf_op
    record_op = _tf_op.refusal() is None and _tf_op.mode() != "off"
print(json.dumps({"later": later, "record_op": record_op, "samples": n, "payload_bytes": b, "wall": wall, "delivered": delivered, "pass_cpu": pass_cpu,
                  "proc_cpu": cpu(), "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def tuned_malloc_env():
    """The glibc malloc settings ringtier.tensorflow sets for its tf.string batches
    (ringtier._tf_data.keep_heap_for, at its smallest trim threshold), as environment variables:
    the same heap policy for a tf.data side."""
    from ringtier import _tf_data

    return {"MALLOC_MMAP_THRESHOLD_": str(_tf_data.MMAP_THRESHOLD_BYTES),
            "MALLOC_TRIM_THRESHOLD_": str(_tf_data.TRIM_THRESHOLD_BYTES[0])}


def timed(cmd, env):
    """Runs one pass; returns its report, the process's user+sys CPU (Python's start and
    TensorFlow's import included) and its peak RSS, both as the process measured them itself."""
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"{cmd} failed: {out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return res, res["proc_cpu"], res["peak_rss"]


FIO_SIDE = "disk (fio)"


def fio_pass(d, fmt, total):
    """One cold read of the dataset's files by fio, O_DIRECT io_uring at depth 16: MB/s (of
    every file under `d`, which are at least the dataset's bytes)."""
    bs = "1M" if fmt == "tfrecord" else "128k"
    cmd = ["fio", "--name=ceiling", "--rw=read", "--direct=1", "--ioengine=io_uring", "--iodepth=16",
           f"--bs={bs}", f"--opendir={d}", "--iomem_align=4096", "--output-format=json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {out.stderr[-2000:]}")
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]["read"]
    # fio leaves out each file's last partial block (a shard's last < 1 MiB): a few % of the bytes.
    if job["io_bytes"] < 0.9 * total:
        sys.exit(f"fio read {job['io_bytes']} of {total} bytes")
    return job["io_bytes"] / (job["runtime"] / 1000) / 1e6, cmd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--format", choices=["files", "jpeg", "tfrecord"], default="files")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--parallel", default="1,16,autotune")
    ap.add_argument("--malloc-parallel", default="",
                    help="tf.data parallelisms run once more with ringtier's malloc settings as MALLOC_* "
                         "environment variables (sides 'tf.data K malloc'), e.g. 16")
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--epochs", type=int, default=1,
                    help="epochs per pass process: the dataset built once, then a new iterator per "
                         "epoch, cold before each; the epochs after the first are reported as 'later'")
    ap.add_argument("--python-crossing", action="store_true",
                    help="files, tfrecord: also ringtier with RINGTIER_TF_OP=off (side 'ringtier python')")
    ap.add_argument("--ceiling", action="store_true",
                    help="also fio's O_DIRECT read of the same files each repeat (the disk's ceiling)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.format == "tfrecord":
        files = sorted(glob.glob(os.path.join(a.dir, "*.tfrecord")))
    else:
        files = sorted(f for f in glob.glob(os.path.join(a.dir, "*", "*")) if os.path.isfile(f))
    total = sum(os.path.getsize(f) for f in files)
    env = dict(os.environ)
    sides = ["ringtier"] + [f"tf.data {k}" for k in a.parallel.split(",")]
    sides += [f"tf.data {k} malloc" for k in a.malloc_parallel.split(",") if k]
    malloc_env = dict(env, **tuned_malloc_env())
    side_env = {s: malloc_env if s.endswith(" malloc") else env for s in sides}
    batch_op = None
    if a.format in ("files", "tfrecord"):
        # The batch op built (or found in the cache) before the timed passes; where it cannot be
        # built (no C++ compiler) the ringtier side reads through the Python generator, and the
        # report says so.
        probe = subprocess.run([sys.executable, "-W", "ignore", "-c",
                                "from ringtier import _tf_op; print(_tf_op.load() is not None, _tf_op.refusal())"],
                               env=env, capture_output=True, text=True, check=True)
        batch_op = probe.stdout.split()[0] == "True"
        if not batch_op:
            print(f"ringtier: the batch op is not available, the Python crossing is measured: {probe.stdout.strip()}",
                  file=sys.stderr)
        side_env["ringtier"] = dict(env, RINGTIER_TF_OP="on" if batch_op else "off")
        if a.python_crossing:
            sides.insert(1, "ringtier python")
            side_env["ringtier python"] = dict(env, RINGTIER_TF_OP="off")
    runs = {s: [] for s in sides}
    ceiling, fio_cmd = [], None
    for r in range(a.repeats):
        if a.ceiling:
            cold(files, a.drop_caches)
            mb_per_sec, fio_cmd = fio_pass(a.dir, a.format, total)
            ceiling.append(mb_per_sec)
        for s in sides:
            cold(files, a.drop_caches)
            side, k = ("ringtier", "0") if s.startswith("ringtier") else ("tf", s.split()[1])
            res, cpu, rss = timed([sys.executable, "-c", CHILD, side, a.format, a.dir, k, str(a.epochs),
                                   "1" if a.drop_caches else "0", BENCH_DIR], side_env[s])
            if s == "ringtier" and batch_op and not res["record_op"]:
                sys.exit("ringtier: the batch op was not used")
            if res["samples"] != (len(files) if a.format != "tfrecord" else res["samples"]):
                sys.exit(f"{s}: {res['samples']} samples, not {len(files)}")
            runs[s].append({"mb_per_sec": total / res["wall"] / 1e6, "images_per_sec": res["samples"] / res["wall"],
                            "wall_seconds": res["wall"], "delivered_seconds": res["delivered"],
                            "delivered_mb_per_sec": total / res["delivered"] / 1e6,
                            "cpu_seconds_per_gib": cpu / (total / 2**30),
                            "pass_cpu_seconds_per_gib": res["pass_cpu"] / (total / 2**30),
                            "later_epochs": [{"mb_per_sec": total / e["wall"] / 1e6,
                                              "delivered_mb_per_sec": total / e["delivered"] / 1e6,
                                              "pass_cpu_seconds_per_gib": e["pass_cpu"] / (total / 2**30)}
                                             for e in res["later"]],
                            "record_op": res["record_op"], "samples": res["samples"], "payload_bytes": res["payload_bytes"], "peak_rss_bytes": rss})
        print(f"repeat {r + 1}/{a.repeats}: " + (f"{FIO_SIDE} {ceiling[-1]:.0f} MB/s, " if ceiling else "") + ", ".join(f"{s} {v[-1]['mb_per_sec']:.0f} MB/s" for s, v in runs.items()),
              file=sys.stderr, flush=True)
    tf_sides = [s for s in sides if s.startswith("tf.data")]
    best = max(tf_sides, key=lambda s: statistics.median(x["mb_per_sec"] for x in runs[s]))
    ratio = [o["mb_per_sec"] / t["mb_per_sec"] for o, t in zip(runs["ringtier"], runs[best])]
    cpu_ratio = [o["cpu_seconds_per_gib"] / t["cpu_seconds_per_gib"] for o, t in zip(runs["ringtier"], runs[best])]
    pass_cpu_ratio = [o["pass_cpu_seconds_per_gib"] / t["pass_cpu_seconds_per_gib"]
                      for o, t in zip(runs["ringtier"], runs[best])]
    # The same to the last batch, without the iterator's teardown (see CHILD), against the tf.data
    # side best by that measure.
    best_delivered = max(tf_sides, key=lambda s: statistics.median(x["delivered_mb_per_sec"] for x in runs[s]))
    ratio_delivered = [o["delivered_mb_per_sec"] / t["delivered_mb_per_sec"]
                       for o, t in zip(runs["ringtier"], runs[best_delivered])]
    # Pair by pair against every tf.data side, not only the best.
    per_side = {s: summary([o["mb_per_sec"] / t["mb_per_sec"] for o, t in zip(runs["ringtier"], runs[s])])
                for s in tf_sides}
    later = None
    if a.epochs > 1:
        # The epochs after the first, pair by pair (repeat i, epoch j of each side).
        def lat(side, field):
            return [e[field] for x in runs[side] for e in x["later_epochs"]]

        best_later = max(tf_sides, key=lambda s: statistics.median(lat(s, "mb_per_sec")))
        best_later_dl = max(tf_sides, key=lambda s: statistics.median(lat(s, "delivered_mb_per_sec")))
        later = {
            "epochs_per_process": a.epochs,
            "best_tf_data": best_later,
            "ringtier_over_best_tf_data_mb_per_sec": summary(
                [o / t for o, t in zip(lat("ringtier", "mb_per_sec"), lat(best_later, "mb_per_sec"))]),
            "ringtier_over_best_tf_data_pass_cpu_per_gib": summary(
                [o / t for o, t in zip(lat("ringtier", "pass_cpu_seconds_per_gib"),
                                       lat(best_later, "pass_cpu_seconds_per_gib"))]),
            "best_tf_data_delivered": best_later_dl,
            "ringtier_over_best_tf_data_delivered_mb_per_sec": summary(
                [o / t for o, t in zip(lat("ringtier", "delivered_mb_per_sec"),
                                       lat(best_later_dl, "delivered_mb_per_sec"))]),
            "sides": {s: {"mb_per_sec": summary(lat(s, "mb_per_sec")),
                          "delivered_mb_per_sec": summary(lat(s, "delivered_mb_per_sec")),
                          "pass_cpu_seconds_per_gib": summary(lat(s, "pass_cpu_seconds_per_gib"))} for s in sides},
        }
    over_ceiling = None
    if ceiling:
        # Each side's first pass over the disk's ceiling in the same repeat.
        over_ceiling = {"command": " ".join(fio_cmd), "mb_per_sec": summary(ceiling),
                        "sides": {s: summary([x["mb_per_sec"] / c for x, c in zip(v, ceiling)]) for s, v in runs.items()}}
    import ringtier

    report = {
        "schema": "ringtier.bench.tensorflow.read/1",
        "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
        "commit": git_commit(),
        "machine": {"nproc": os.cpu_count(), "kernel": platform.release(),
                    "mem_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "filesystem": fs_type(a.dir)},
        "ringtier_jpeg_decoder": ringtier.JPEG_DECODER,
        "format": a.format, "files": len(files), "bytes": total, "repeats": a.repeats,
        "cold": "drop_caches" if a.drop_caches else "posix_fadvise DONTNEED per file",
        "best_tf_data": best,
        "ringtier_over_best_tf_data_mb_per_sec": summary(ratio),
        "ringtier_over_best_tf_data_cpu_per_gib": summary(cpu_ratio),
        "ringtier_over_best_tf_data_pass_cpu_per_gib": summary(pass_cpu_ratio),
        "ringtier_over_each_tf_data_mb_per_sec": per_side,
        "best_tf_data_delivered": best_delivered,
        "ringtier_over_best_tf_data_delivered_mb_per_sec": summary(ratio_delivered),
        "ringtier_batch_op": batch_op,
        "later_epochs": later,
        "over_disk_ceiling": over_ceiling,
        "malloc_env_of_malloc_sides": tuned_malloc_env() if a.malloc_parallel else None,
        "sides": {s: {"mb_per_sec": summary([x["mb_per_sec"] for x in v]),
                      "delivered_mb_per_sec": summary([x["delivered_mb_per_sec"] for x in v]),
                      "images_per_sec": summary([x["images_per_sec"] for x in v]),
                      "cpu_seconds_per_gib": summary([x["cpu_seconds_per_gib"] for x in v]),
                      "pass_cpu_seconds_per_gib": summary([x["pass_cpu_seconds_per_gib"] for x in v]),
                      "peak_rss_bytes_max": max(x["peak_rss_bytes"] for x in v), "runs": v} for s, v in runs.items()},
    }
    for s, v in report["sides"].items():
        m, c, pc = v["mb_per_sec"], v["cpu_seconds_per_gib"], v["pass_cpu_seconds_per_gib"]
        print(f"{s:<22} {m['min']:8.1f} {m['median']:8.1f} {m['max']:8.1f} MB/s  {c['median']:6.2f} CPU s/GiB "
              f"(pass {pc['median']:5.2f})  peak RSS {v['peak_rss_bytes_max'] / 2**20:7.1f} MiB")
    print(f"ringtier / {best}: {summary(ratio)['median']:.2f}x MB/s (min {min(ratio):.2f}, max {max(ratio):.2f}); "
          f"CPU per GiB {summary(cpu_ratio)['median']:.2f}x (pass {summary(pass_cpu_ratio)['median']:.2f}x)")
    for s, r in per_side.items():
        print(f"  ringtier / {s}: {r['median']:.2f}x (min {r['min']:.2f}, max {r['max']:.2f})")
    dm = {s: statistics.median(x["delivered_mb_per_sec"] for x in v) for s, v in runs.items()}
    print("to the last batch (no iterator teardown), median MB/s: " + ", ".join(f"{s} {m:.0f}" for s, m in dm.items()))
    print(f"ringtier / {best_delivered} to the last batch: {summary(ratio_delivered)['median']:.2f}x "
          f"(min {min(ratio_delivered):.2f}, max {max(ratio_delivered):.2f})")
    if over_ceiling is not None:
        m = over_ceiling["mb_per_sec"]
        print(f"{FIO_SIDE}: {m['min']:.0f} {m['median']:.0f} {m['max']:.0f} MB/s; first pass over it, pair by pair: "
              + ", ".join(f"{s} {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})" for s, v in over_ceiling["sides"].items()))
    if later is not None:
        print(f"epochs 2..{a.epochs} of each process (a new iterator each, cold), MB/s min / median / max "
              "(to the last batch), pass CPU s/GiB:")
        for s, v in later["sides"].items():
            m, d = v["mb_per_sec"], v["delivered_mb_per_sec"]
            print(f"  {s:<22} {m['min']:8.1f} {m['median']:8.1f} {m['max']:8.1f} ({d['median']:.0f})  "
                  f"{v['pass_cpu_seconds_per_gib']['median']:.2f}")
        r, rd = later["ringtier_over_best_tf_data_mb_per_sec"], later["ringtier_over_best_tf_data_delivered_mb_per_sec"]
        print(f"  ringtier / {later['best_tf_data']}: {r['median']:.2f}x (min {r['min']:.2f}, max {r['max']:.2f}); "
              f"pass CPU {later['ringtier_over_best_tf_data_pass_cpu_per_gib']['median']:.2f}x; to the last batch "
              f"/ {later['best_tf_data_delivered']}: {rd['median']:.2f}x (min {rd['min']:.2f}, max {rd['max']:.2f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
