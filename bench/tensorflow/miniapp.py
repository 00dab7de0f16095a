#!/usr/bin/env python3
"""The paper's AlexNet mini-app in Keras: a training loop over small JPEGs (Caltech-101-like,
`ringtier gen --preset caltech101 --format jpeg`), with the input pipeline's prefetcher on and
off, for tf.data's own pipeline and for ringtier.tensorflow.dataset. Per step it times the wait
for the next batch (stall) and the train step (a tf.function, synchronized); stall % = wait /
(wait + compute) over the measured steps (the first `--warmup` steps are left out).

  tf.data:  list_files(shuffle) -> map(read_file + decode_jpeg + resize + central crop,
            num_parallel_calls=AUTOTUNE) -> batch -> [prefetch(AUTOTUNE)]
  ringtier: ringtier.tensorflow.dataset(D, transform=Resize+CenterCrop, labels="inferred")
            -> [prefetch(AUTOTUNE)]     (prefetch off: the loader's own read-ahead stays)

The model: AlexNet's layer shapes scaled to --size pixels (5 conv, 3 dense), SGD.
usage: PYTHONPATH=PKG target/tf-venv/bin/python bench/tensorflow/miniapp.py --dir D
       [--steps 40] [--warmup 5] [--batch 64] [--size 64] [--repeats 3] [--json OUT]
"""

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchlib import fs_type, git_commit, summary  # noqa: E402

import tensorflow as tf  # noqa: E402

import ringtier.tensorflow as rtf  # noqa: E402
from ringtier import transforms as T  # noqa: E402


def alexnet(size, classes):
    L = tf.keras.layers
    return tf.keras.Sequential([
        tf.keras.Input((size, size, 3)),
        L.Rescaling(1 / 255.0),
        L.Conv2D(48, 11, strides=4, padding="same", activation="relu"), L.MaxPooling2D(3, 2, padding="same"),
        L.Conv2D(128, 5, padding="same", activation="relu"), L.MaxPooling2D(3, 2, padding="same"),
        L.Conv2D(192, 3, padding="same", activation="relu"),
        L.Conv2D(192, 3, padding="same", activation="relu"),
        L.Conv2D(128, 3, padding="same", activation="relu"), L.MaxPooling2D(3, 2, padding="same"),
        L.Flatten(), L.Dense(1024, activation="relu"), L.Dense(1024, activation="relu"), L.Dense(classes),
    ])


def tf_pipeline(d, batch, size, classes):
    names = sorted(e for e in os.listdir(d) if os.path.isdir(os.path.join(d, e)))
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(names, list(range(len(names)))), -1)

    def load(f):
        img = tf.io.decode_jpeg(tf.io.read_file(f), channels=3)
        img = tf.image.resize(img, (size + size // 8, size + size // 8), antialias=True)
        img = tf.cast(tf.image.resize_with_crop_or_pad(img, size, size), tf.uint8)
        label = table.lookup(tf.strings.split(f, os.sep)[-2])
        return img, tf.cast(label, tf.int64)

    ds = tf.data.Dataset.list_files(os.path.join(d, "*", "*"), shuffle=True, seed=0)
    return ds.map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(batch, drop_remainder=True)


def run(side, prefetch, a, classes):
    if side == "tf.data":
        ds = tf_pipeline(a.dir, a.batch, a.size, classes)
    else:
        chain = T.Compose([T.Resize(a.size + a.size // 8), T.CenterCrop(a.size)])
        ds = rtf.dataset(a.dir, batch_size=a.batch, drop_last=True, transform=chain, labels="inferred")
    if prefetch:
        ds = ds.prefetch(tf.data.AUTOTUNE)
    ds = ds.repeat()
    model = alexnet(a.size, classes)
    opt = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    it = iter(ds)
    wait = compute = 0.0
    t_start = None
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            wait = compute = 0.0
            t_start = time.perf_counter()
        t0 = time.perf_counter()
        x, y = next(it)
        t1 = time.perf_counter()
        float(train_step(x, y))
        t2 = time.perf_counter()
        wait += t1 - t0
        compute += t2 - t1
    wall = time.perf_counter() - t_start
    return {"stall_percent": 100 * wait / (wait + compute), "wait_seconds": wait, "compute_seconds": compute,
            "images_per_sec": a.steps * a.batch / wall, "step_seconds": wall / a.steps}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    classes = len([e for e in os.listdir(a.dir) if os.path.isdir(os.path.join(a.dir, e))])
    sides = [(s, p) for s in ("tf.data", "ringtier") for p in (True, False)]
    runs = {f"{s} prefetch {'on' if p else 'off'}": [] for s, p in sides}
    for r in range(a.repeats):
        for s, p in sides:
            runs[f"{s} prefetch {'on' if p else 'off'}"].append(run(s, p, a, classes))
        print(f"repeat {r + 1}/{a.repeats}: " + ", ".join(
            f"{k} stall {v[-1]['stall_percent']:.1f}% {v[-1]['images_per_sec']:.0f} img/s" for k, v in runs.items()),
            file=sys.stderr, flush=True)
    report = {
        "schema": "ringtier.bench.tensorflow.miniapp/1",
        "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
        "commit": git_commit(),
        "machine": {"nproc": os.cpu_count(), "kernel": platform.release(), "filesystem": fs_type(a.dir)},
        "files": sum(len(fs) for _, _, fs in os.walk(a.dir)), "classes": classes, "batch": a.batch, "size": a.size,
        "steps": a.steps, "warmup": a.warmup, "repeats": a.repeats,
        "note": "warm page cache after the first pass; CPU-only: input and compute share the 2 cores",
        "sides": {k: {m: summary([x[m] for x in v]) for m in v[0]} | {"runs": v} for k, v in runs.items()},
    }
    for k, v in report["sides"].items():
        print(f"{k:<22} stall {v['stall_percent']['median']:5.1f}%  {v['images_per_sec']['median']:7.1f} img/s  "
              f"step {v['step_seconds']['median'] * 1e3:6.1f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
