#!/usr/bin/env python3
"""The paper's burst-buffer experiment around TensorFlow's own saver: how long a
tf.train.Checkpoint save blocks the training loop, interleaved per repeat:

  tf -> slow:      checkpoint.write() straight into the slow tier, then fsync of its files and
                   directory (what TensorFlow users do with a slow file system)
  tf -> fast:      the same into the fast tier
  raw fast write:  the same bytes written with O_DIRECT (8 MiB page-aligned chunks) into the fast
                   tier and fsynced: the floor of a durable write there
  burst buffer:    ringtier.tensorflow.CheckpointManager([fast, slow]).save(step): TensorFlow
                   writes into the staging directory on the fast tier, its files are committed
                   in place as a step of the store (adopted: checksummed, fsynced, renamed;
                   durable on return, not written again); the drain to the slow tier runs after
                   and is timed on its own (drain_seconds, not blocking)
  burst buffer wait=False:
                   the same with save(step, wait=False): returns once TensorFlow's own async
                   checkpointing has snapshotted the variables (copy-on-write); TensorFlow's
                   thread writes the files and the commit follows in the background. The copy
                   is paid by the next update of the variable: every side is followed by one
                   training update (v += 1), timed, and the wait=False side's blocking is also
                   reported with its update's extra time over the median update after the
                   synchronous sides ("wait=False + its next update")

The slow tier is whatever --slow is: bench/tensorflow/ckpt_blkio.sh makes it a loop-mounted
ext4 throttled by cgroup v1 blkio to 1/R of the fast tier's O_DIRECT write bandwidth.

usage: PYTHONPATH=PKG target/tf-venv/bin/python bench/tensorflow/ckpt.py --fast DIR --slow DIR
       [--mib 256] [--repeats 5] [--slowdown R] [--json OUT]
"""

import argparse
import json
import mmap
import os
import platform
import shutil
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchlib import fs_type, git_commit, summary  # noqa: E402

import tensorflow as tf  # noqa: E402

import ringtier.tensorflow as rtf  # noqa: E402


def fsync_tree(d):
    for name in os.listdir(d):
        fd = os.open(os.path.join(d, name), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    fd = os.open(d, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def tf_write(ckpt, d):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    t0 = time.perf_counter()
    ckpt.write(os.path.join(d, "ckpt"))
    fsync_tree(d)
    return time.perf_counter() - t0


def raw_write(path, nbytes, chunk=8 << 20):
    buf = mmap.mmap(-1, chunk)
    buf.write(os.urandom(4096) * (chunk // 4096))
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    try:
        left = nbytes
        while left > 0:
            os.write(fd, buf)
            left -= chunk
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(os.path.dirname(path), os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fast", required=True)
    ap.add_argument("--slow", required=True)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--slowdown", type=float, default=None, help="recorded in the report")
    ap.add_argument("--slow-kind", default="", help="recorded in the report")
    ap.add_argument("--json")
    a = ap.parse_args()
    n = a.mib << 20
    v = tf.Variable(tf.random.uniform((n // 4 // 1024, 1024)))
    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(v=v, step=step)
    for d in (a.fast, a.slow):
        os.makedirs(d, exist_ok=True)
    bb = [os.path.join(a.fast, "bb"), os.path.join(a.slow, "bb")]
    for d in bb:
        shutil.rmtree(d, ignore_errors=True)
    manager = rtf.CheckpointManager(ckpt, bb, keep_last=1, max_to_keep=2)
    runs = {"tf -> slow": [], "tf -> fast": [], "raw fast write": [], "burst buffer": [],
            "burst buffer wait=False": []}
    drains, parts, durable, async_parts = [], [], [], []
    updates = {k: [] for k in runs}
    one = tf.ones_like(v)

    def update(side):
        # One training update right after the save returned (the copy-on-write copy, if any).
        t = time.perf_counter()
        v.assign_add(one)
        float(v[0, 0])  # the update has run
        updates[side].append(time.perf_counter() - t)

    for r in range(a.repeats):
        v.assign_add(tf.ones_like(v))
        step.assign(r)
        runs["tf -> slow"].append(tf_write(ckpt, os.path.join(a.slow, "tf")))
        update("tf -> slow")
        runs["tf -> fast"].append(tf_write(ckpt, os.path.join(a.fast, "tf")))
        update("tf -> fast")
        runs["raw fast write"].append(raw_write(os.path.join(a.fast, "raw.bin"), n))
        update("raw fast write")
        t0 = time.perf_counter()
        rep = manager.save(2 * r)
        wall = time.perf_counter() - t0
        update("burst buffer")
        runs["burst buffer"].append(rep["blocking_seconds"])
        # save_wall_seconds: the call as the training loop waits for it, max_to_keep's pruning
        # of old steps included (blocking_seconds ends when the step is durable).
        parts.append({"tf_write_seconds": rep["tf_write_seconds"], "commit_seconds": rep["commit_seconds"],
                      "save_wall_seconds": wall, "adopted_bytes": rep.get("adopted_bytes", 0)})
        t0 = time.perf_counter()
        manager.drain()
        drains.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fut = manager.save(2 * r + 1, wait=False)
        runs["burst buffer wait=False"].append(time.perf_counter() - t0)
        update("burst buffer wait=False")
        arep = fut.result()
        durable.append(time.perf_counter() - t0)
        async_parts.append({k: arep[k] for k in ("tf_write_seconds", "tf_background_write_seconds", "commit_seconds")})
        async_parts[-1]["tf_async"] = arep["tf_async"]
        manager.drain()
        print(f"repeat {r + 1}/{a.repeats}: " + ", ".join(f"{k} {x[-1]:.2f} s" for k, x in runs.items())
              + f", drain {drains[-1]:.2f} s", file=sys.stderr, flush=True)
    manager.close()
    for d in bb + [os.path.join(a.fast, "tf"), os.path.join(a.slow, "tf")]:
        shutil.rmtree(d, ignore_errors=True)
    os.remove(os.path.join(a.fast, "raw.bin"))
    slow_over_bb = [s / b for s, b in zip(runs["tf -> slow"], runs["burst buffer"])]
    bb_over_raw = [b / w for b, w in zip(runs["burst buffer"], runs["raw fast write"])]
    bb_over_tf_fast = [b / w for b, w in zip(runs["burst buffer"], runs["tf -> fast"])]
    slow_over_async = [s / b for s, b in zip(runs["tf -> slow"], runs["burst buffer wait=False"])]
    async_over_raw = [b / w for b, w in zip(runs["burst buffer wait=False"], runs["raw fast write"])]
    # The update after a synchronous save copies nothing: its median is the update's own time.
    plain_update = statistics.median(updates["tf -> fast"] + updates["raw fast write"] + updates["burst buffer"])
    async_effective = [b + max(0.0, u - plain_update)
                       for b, u in zip(runs["burst buffer wait=False"], updates["burst buffer wait=False"])]
    effective_over_raw = [b / w for b, w in zip(async_effective, runs["raw fast write"])]
    slow_over_effective = [s / b for s, b in zip(runs["tf -> slow"], async_effective)]
    report = {
        "schema": "ringtier.bench.tensorflow.ckpt/1",
        "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
        "commit": git_commit(),
        "machine": {"nproc": os.cpu_count(), "kernel": platform.release(),
                    "fast_filesystem": fs_type(a.fast), "slow_filesystem": fs_type(a.slow)},
        "slow_tier": a.slow_kind, "slowdown": a.slowdown, "checkpoint_bytes": rep["bytes"], "repeats": a.repeats,
        "tf_slow_over_burst_buffer_blocking": summary(slow_over_bb),
        "burst_buffer_over_raw_fast_write": summary(bb_over_raw),
        "burst_buffer_over_tf_fast_write": summary(bb_over_tf_fast),
        "tf_slow_over_burst_buffer_wait_false_blocking": summary(slow_over_async),
        "burst_buffer_wait_false_seconds_to_durable": summary(durable),
        "burst_buffer_wait_false_over_raw_fast_write": summary(async_over_raw),
        "burst_buffer_wait_false_plus_update_seconds": summary(async_effective),
        "burst_buffer_wait_false_plus_update_over_raw_fast_write": summary(effective_over_raw),
        "tf_slow_over_burst_buffer_wait_false_plus_update": summary(slow_over_effective),
        "burst_buffer_wait_false_parts": {k: summary([p[k] for p in async_parts]) for k in async_parts[0]
                                          if k != "tf_async"},
        "burst_buffer_wait_false_tf_async": [p["tf_async"] for p in async_parts],
        "update_after_seconds": {k: summary(x) for k, x in updates.items()},
        "burst_buffer_parts": {k: summary([p[k] for p in parts]) for k in parts[0]},
        "drain_seconds": summary(drains),
        "sides": {k: {"seconds": summary(x), "mb_per_sec": summary([rep["bytes"] / s / 1e6 for s in x]), "runs": x}
                  for k, x in runs.items()},
    }
    for k, s in report["sides"].items():
        print(f"{k:<16} {s['seconds']['median']:7.3f} s  ({s['mb_per_sec']['median']:7.1f} MB/s)")
    print(f"tf -> slow / burst buffer: {summary(slow_over_bb)['median']:.2f}x (min {min(slow_over_bb):.2f}); "
          f"burst buffer / raw fast write: {summary(bb_over_raw)['median']:.2f}x; "
          f"burst buffer / tf -> fast: {summary(bb_over_tf_fast)['median']:.2f}x; "
          f"tf -> slow / burst buffer wait=False: {summary(slow_over_async)['median']:.2f}x; drain {statistics.median(drains):.2f} s")
    print(f"burst buffer wait=False / raw fast write: {summary(async_over_raw)['median']:.2f}x; "
          f"with its next update's extra time: {summary(effective_over_raw)['median']:.2f}x "
          f"(min {min(effective_over_raw):.2f}, max {max(effective_over_raw):.2f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
