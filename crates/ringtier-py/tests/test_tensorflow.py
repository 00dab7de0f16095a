"""ringtier.tensorflow under TensorFlow (CPU): tf.data round trips (every sample exactly once per
epoch, shards, epochs and resume, decoded batches in both layouts, TFRecord shards TensorFlow
wrote, WebDataset shards), and the CheckpointManager (save, drain, restore, keep, a second save
of a step in progress refused, a bad newest step passed over, a SIGKILL during a save)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")

import ringtier  # noqa: E402
import ringtier.tensorflow as rtf  # noqa: E402
from ringtier import _tf_data as rtf_data  # noqa: E402
from ringtier import transforms as T  # noqa: E402

from conftest import write_dataset  # noqa: E402


def keys_of(ds) -> List[str]:
    return [k.numpy().decode() for k, _ in ds]


# -- files ------------------------------------------------------------------------------------


def test_files_every_sample_once_with_its_bytes(dataset):
    root, files = dataset
    seen: Dict[str, bytes] = {}
    for key, data in rtf.dataset(root, with_keys=True, read_batch=32):
        k = key.numpy().decode()
        assert k not in seen, f"{k} read twice in one epoch"
        seen[k] = data.numpy()
    assert seen == files


def test_files_uint8_output_shares_the_bytes(dataset):
    root, files = dataset
    got = {k.numpy().decode(): bytes(v.numpy()) for k, v in rtf.dataset(root, with_keys=True, output="uint8")}
    assert got == files
    ds = rtf.dataset(root, output="uint8")
    assert ds.element_spec == tf.TensorSpec((None,), tf.uint8)


def test_empty_and_large_files_cross_byte_identical(tmp_path):
    """0-byte files, a 5 MB file (several reads) and small ones, in every crossing: batched and
    single tf.string elements, with keys, and uint8 vectors."""
    root = tmp_path / "mix"
    rng = np.random.default_rng(5)
    files = {f"d{i % 2}/e{i}.bin": b"" for i in range(5)}
    files.update({f"d{i % 2}/s{i}.bin": rng.bytes(int(rng.integers(1, 9000))) for i in range(40)})
    files["d0/large.bin"] = rng.bytes(5 << 20)
    files["d1/zeros.bin"] = bytes(70_000)  # ends in NUL bytes: nothing may strip them
    for k, v in files.items():
        (root / k).parent.mkdir(parents=True, exist_ok=True)
        (root / k).write_bytes(v)
    for kw in ({}, {"batch_size": 7}, {"batch_size": 64, "read_batch": 8}):
        got: Dict[str, bytes] = {}
        for keys, data in rtf.dataset(root, with_keys=True, seed=1, **kw):
            pairs = zip(keys.numpy(), data.numpy()) if "batch_size" in kw else [(keys.numpy(), data.numpy())]
            for k, v in pairs:
                assert k.decode() not in got
                got[k.decode()] = v
        assert got == files, kw
        plain = rtf.dataset(root, seed=1, **kw)
        sizes = sorted(len(v) for b in plain for v in (b.numpy() if "batch_size" in kw else [b.numpy()]))
        assert sizes == sorted(len(v) for v in files.values())
    got = {k.numpy().decode(): bytes(v.numpy()) for k, v in rtf.dataset(root, with_keys=True, output="uint8")}
    assert got == files


MALLINFO = r"""
import ctypes, json, sys
from ringtier._tf_data import keep_heap_for
libc = ctypes.CDLL(None)
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
kept = keep_heap_for(1 << 20) if sys.argv[1] == "tune" else None
before = libc.mallinfo2().hblkhd
p = libc.malloc(16 << 20)
mapped = libc.mallinfo2().hblkhd - before >= 16 << 20
libc.free(p)
print(json.dumps({"kept": kept, "mmapped": mapped, "top_kept": libc.mallinfo2().keepcost >= 16 << 20}))
"""


@pytest.mark.skipif(not hasattr(os, "confstr") or not os.confstr("CS_GNU_LIBC_VERSION"), reason="glibc only")
def test_tune_malloc_keeps_freed_batch_memory_in_the_heap():
    def run(arg: str, **env: str) -> Dict[str, object]:
        e = {k: v for k, v in os.environ.items() if k not in rtf_data.MALLOC_ENV}
        e.update(env)
        out = subprocess.run([sys.executable, "-c", MALLINFO, arg], capture_output=True, text=True, env=e, check=True)
        return json.loads(out.stdout)

    # glibc's default: a 16 MiB block is mapped, and unmapped when freed.
    assert run("plain") == {"kept": None, "mmapped": True, "top_kept": False}
    # Tuned: it comes from the heap and stays there, freed, for the next batch.
    assert run("tune") == {"kept": True, "mmapped": False, "top_kept": True}
    # The user's own malloc settings are left alone; other glibc tunables are not such a choice.
    assert run("tune", MALLOC_TOP_PAD_="0")["kept"] is False
    assert run("tune", GLIBC_TUNABLES="glibc.malloc.trim_threshold=1000")["kept"] is False
    assert run("tune", GLIBC_TUNABLES="glibc.cpu.x86_rep_movsb_threshold=4096")["kept"] is True


def test_file_loader_pool_is_lazy_unless_asked(dataset, monkeypatch):
    root, _ = dataset
    made = []
    real = rtf_data.Loader

    def loader(*args, **kwargs):
        made.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(rtf_data, "Loader", loader)
    assert len(list(rtf.dataset(root, batch_size=100))) == 3
    assert made[-1]["lazy_pool"] is True
    assert len(list(rtf.dataset(root, batch_size=100, lazy_pool=False))) == 3
    assert made[-1]["lazy_pool"] is False


def test_batches_and_drop_last(dataset):
    root, files = dataset
    sizes = [int(b.shape[0]) for b in rtf.dataset(root, batch_size=64)]
    assert sizes == [64] * (len(files) // 64) + [len(files) % 64]
    sizes = [int(b.shape[0]) for b in rtf.dataset(root, batch_size=64, drop_last=True)]
    assert sizes == [64] * (len(files) // 64)


def test_each_iteration_is_the_next_epoch_and_set_epoch_replays_one(dataset):
    root, files = dataset
    src = rtf.Source(root, with_keys=True, seed=3)
    ds = src.dataset()
    e0, e1 = keys_of(ds), keys_of(ds)
    assert sorted(e0) == sorted(e1) == sorted(files)
    assert e0 != e1, "two epochs in the same order"
    assert src.epoch == 2
    src.set_epoch(1)
    assert keys_of(ds) == e1
    # repeat(): one round per epoch, each exactly once.
    src.set_epoch(0)
    both = keys_of(ds.repeat(2))
    assert both == e0 + e1
    # Another source with the same seed reads the same orders; another seed another.
    assert keys_of(rtf.dataset(root, with_keys=True, seed=3)) == e0
    assert keys_of(rtf.dataset(root, with_keys=True, seed=4)) != e0


def test_resume_from_a_position(dataset):
    root, _ = dataset
    src = rtf.Source(root, with_keys=True, seed=5)
    full = keys_of(src.dataset())
    src.set_epoch(0, position=100)
    assert keys_of(src.dataset()) == full[100:]


def test_shuffle_off_reads_in_key_order(dataset):
    root, files = dataset
    assert keys_of(rtf.dataset(root, with_keys=True, shuffle=False)) == sorted(files)


def test_shards_are_disjoint_and_cover_every_sample(dataset):
    root, files = dataset
    parts = [keys_of(rtf.dataset(root, with_keys=True, shard=(i, 3), seed=1)) for i in range(3)]
    flat = [k for p in parts for k in p]
    assert len(flat) == len(set(flat)) == len(files)
    assert set(flat) == set(files)
    assert all(abs(len(p) - len(files) / 3) <= 1 for p in parts)
    # A tf.distribute.InputContext shards the same way.
    ctx = [tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=i) for i in range(3)]
    assert [keys_of(rtf.dataset(root, with_keys=True, input_context=c, seed=1)) for c in ctx] == parts
    with pytest.raises(ValueError):
        rtf.dataset(root, shard=(3, 3))


def test_distribute_datasets_from_function(dataset):
    root, files = dataset
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    dist = strategy.distribute_datasets_from_function(
        lambda ctx: rtf.dataset(root, batch_size=50, input_context=ctx, output="bytes")
    )
    n = sum(int(strategy.experimental_local_results(b)[0].shape[0]) for b in dist)
    assert n == len(files)


def test_labels_inferred_from_class_directories(dataset):
    root, files = dataset
    src = rtf.Source(root, with_keys=True, labels="inferred")
    assert src.class_names == ["d0", "d1", "d2"]
    for key, data, label in src.dataset():
        k = key.numpy().decode()
        assert src.class_names[int(label)] == k.split("/")[0]
        assert data.numpy() == files[k]


def test_missing_directory_and_bad_arguments(tmp_path, dataset):
    root, _ = dataset
    with pytest.raises(ringtier.NotFoundError):
        rtf.dataset(tmp_path / "nope")
    with pytest.raises(ringtier.InvalidInputError):
        rtf.dataset(root, layout="HWC")
    with pytest.raises(ringtier.InvalidInputError):
        rtf.dataset(root, transform=T.Compose([T.CenterCrop(8)]))  # no batch_size
    with pytest.raises(ringtier.InvalidInputError):
        rtf.dataset(root, format="wds")
    with pytest.raises(ringtier.InvalidInputError, match="tune_malloc"):
        rtf.dataset(root, tune_malloc="yes")


# -- decoded batches --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """40 JPEGs (48x40, a gradient plus the index) in 4 class directories."""
    root = tmp_path_factory.mktemp("jpg")
    for i in range(40):
        y, x = np.mgrid[0:40, 0:48]
        img = np.stack([(x * 5 + i) % 256, (y * 6) % 256, np.full_like(x, i * 6)], -1).astype(np.uint8)
        p = root / f"c{i % 4}" / f"img{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(tf.io.encode_jpeg(img, quality=95).numpy())
    return root


def test_decoded_batches_in_both_layouts_and_dtypes(jpegs):
    chain = T.Compose([T.Resize(36), T.CenterCrop(32), T.ToDtype("float32", scale=True)])
    nhwc = list(rtf.dataset(jpegs, batch_size=16, transform=chain, shuffle=False, labels="inferred"))
    nchw = list(rtf.dataset(jpegs, batch_size=16, transform=chain, shuffle=False, labels="inferred", layout="NCHW"))
    assert [int(x.shape[0]) for x, _ in nhwc] == [16, 16, 8]
    assert nhwc[0][0].shape[1:] == (32, 32, 3) and nhwc[0][0].dtype == tf.float32
    assert nchw[0][0].shape[1:] == (3, 32, 32)
    for (a, la), (b, lb) in zip(nhwc, nchw):
        np.testing.assert_array_equal(a.numpy(), np.transpose(b.numpy(), (0, 2, 3, 1)))
        np.testing.assert_array_equal(la.numpy(), lb.numpy())
    labels = np.concatenate([lab.numpy() for _, lab in nhwc])
    # shuffle=False: key order, c0/img000, c0/img004, ..., c1/...: ten of each class in turn.
    assert labels.tolist() == [c for c in range(4) for _ in range(10)]
    # Against TensorFlow's own decode (libjpeg either way; resize kernels differ a little).
    x = nhwc[0][0].numpy()[0]
    ref = tf.image.resize(tf.io.decode_jpeg(open(jpegs / "c0" / "img000.jpg", "rb").read()), (36, 43), antialias=True)
    ref = tf.image.resize_with_crop_or_pad(ref, 32, 32).numpy() / 255.0
    assert np.abs(x - ref).mean() < 0.03
    u8 = next(iter(rtf.dataset(jpegs, batch_size=8, transform=T.Compose([T.RandomResizedCrop(24)]))))
    assert u8.dtype == tf.uint8 and u8.shape == (8, 24, 24, 3)


def test_decoded_random_crops_depend_on_seed_and_epoch_only(jpegs):
    chain = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip()])

    def epoch_images(src):
        return np.concatenate([x.numpy() for x in src.dataset()])

    a = rtf.Source(jpegs, batch_size=8, transform=chain, seed=9, shuffle=False)
    b = rtf.Source(jpegs, batch_size=8, transform=chain, seed=9, shuffle=False, decode_threads=1)
    ea, eb = epoch_images(a), epoch_images(b)
    np.testing.assert_array_equal(ea, eb)
    assert not np.array_equal(epoch_images(a), ea), "epoch 1 drew the crops of epoch 0"


def test_keras_fits_on_a_ringtier_dataset(jpegs):
    chain = T.Compose([T.Resize(20), T.CenterCrop(16), T.ToDtype("float32", scale=True)])
    ds = rtf.dataset(jpegs, batch_size=8, transform=chain, labels="inferred")
    model = tf.keras.Sequential(
        [tf.keras.Input((16, 16, 3)), tf.keras.layers.Flatten(), tf.keras.layers.Dense(4, activation="softmax")]
    )
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    hist = model.fit(ds.prefetch(2), epochs=2, verbose=0)
    assert len(hist.history["loss"]) == 2


# -- records ----------------------------------------------------------------------------------


def test_tfrecords_tensorflow_wrote_every_record_once(tmp_path):
    root = tmp_path / "tfr"
    root.mkdir()
    want = []
    for s in range(4):
        with tf.io.TFRecordWriter(str(root / f"part-{s}.tfrecord")) as w:
            for i in range(25):
                ex = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[s * 100 + i])),
                            "data": tf.train.Feature(bytes_list=tf.train.BytesList(value=[os.urandom(i * 37)])),
                        }
                    )
                )
                w.write(ex.SerializeToString())
                want.append(ex.SerializeToString())
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "data": tf.io.FixedLenFeature([], tf.string)}
    got = [r.numpy() for r in rtf.dataset(root, format="tfrecord", seed=2)]
    assert sorted(got) == sorted(want)
    ids = [int(tf.io.parse_single_example(r, spec)["id"]) for r in got]
    assert sorted(ids) == [s * 100 + i for s in range(4) for i in range(25)]
    # Shards over two pipelines, batched and parsed in the graph.
    seen = []
    for i in range(2):
        ds = rtf.dataset(root, format="tfrecord", shard=(i, 2), batch_size=10)
        for batch in ds.map(lambda b: tf.io.parse_example(b, spec)["id"]):
            seen += batch.numpy().tolist()
    assert sorted(seen) == sorted(ids)
    # In one global order through the shards' indexes (made on the fly).
    glob = [r.numpy() for r in rtf.dataset(root, format="tfrecord", order="global", seed=2)]
    assert sorted(glob) == sorted(want)
    assert len(rtf.Source(root, format="tfrecord", order="global")) == 100


def write_wds(root: Path, shards: int, per_shard: int) -> Dict[str, Dict[str, bytes]]:
    root.mkdir(parents=True)
    samples: Dict[str, Dict[str, bytes]] = {}
    for s in range(shards):
        with tarfile.open(root / f"shard-{s:03d}.tar", "w") as tar:
            for i in range(per_shard):
                key = f"s{s}/k{i:04d}"
                fields = {"bin": os.urandom(10 + i), "cls": str((s + i) % 3).encode()}
                samples[key] = fields
                for ext, data in fields.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return samples


def test_exit_with_a_live_iterator_does_not_hang(tmp_path):
    """A script that exits holding an iterator that is mid-read (a global, destroyed as the
    interpreter finalizes) exits: at exit the generators end before finalization, so no engine
    call in flight (GIL released) and no next generator step needs the GIL after it (that hung
    about one exit in four before)."""
    root = tmp_path / "tfr"
    root.mkdir()
    for s in range(4):
        with tf.io.TFRecordWriter(str(root / f"part-{s}.tfrecord")) as w:
            for i in range(300):
                w.write(os.urandom(4000 + i))
    script = textwrap.dedent(
        f"""
        import os
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        import tensorflow as tf
        import ringtier.tensorflow as rtf
        ds = rtf.dataset({str(root)!r}, format="tfrecord", batch_size=32, shuffle=False)
        ds = ds.map(tf.strings.length).prefetch(2)
        it = iter(ds)
        next(it); next(it)
        print("exiting", flush=True)
        """
    )
    for attempt in range(6):
        try:
            out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"attempt {attempt}: the process did not exit within 90 s")
        assert out.returncode == 0 and "exiting" in out.stdout, out.stderr[-2000:]


def test_webdataset_fields_every_sample_once(tmp_path):
    samples = write_wds(tmp_path / "wds", 3, 20)
    got = {}
    for batch in rtf.dataset(tmp_path / "wds", format="wds", fields=["bin", "cls"], batch_size=7):
        for k, b, c in zip(batch["__key__"].numpy(), batch["bin"].numpy(), batch["cls"].numpy()):
            assert k.decode() not in got
            got[k.decode()] = {"bin": b, "cls": c}
    assert got == samples


def test_records_batches_larger_than_a_crossing_chunk(tmp_path):
    """Records cross in chunks of read_batch and are batched in the graph: batch sizes,
    drop_last and every record once hold whatever the chunk."""
    samples = write_wds(tmp_path / "wds", 3, 20)  # 60 samples
    src = rtf.Source(tmp_path / "wds", format="wds", fields=["bin"], batch_size=25, read_batch=4)
    assert [len(c["__key__"]) for c in src.generator()] == [4] * 15  # what crosses per call
    for drop_last, sizes in ((False, [25, 25, 10]), (True, [25, 25])):
        got = {}
        ds = rtf.dataset(tmp_path / "wds", format="wds", fields=["bin"], batch_size=25, read_batch=4,
                         drop_last=drop_last)
        assert [int(b["__key__"].shape[0]) for b in ds] == sizes
        for batch in ds:
            for k, b in zip(batch["__key__"].numpy(), batch["bin"].numpy()):
                assert k.decode() not in got
                got[k.decode()] = b
        assert len(got) == sum(sizes)
        assert all(samples[k]["bin"] == v for k, v in got.items())
    root = tmp_path / "tfr"
    root.mkdir()
    want = []
    with tf.io.TFRecordWriter(str(root / "part-0.tfrecord")) as w:
        for i in range(50):
            want.append(os.urandom(i * 11))
            w.write(want[-1])
    ds = rtf.dataset(root, format="tfrecord", batch_size=16, read_batch=5, seed=4)
    batches = [b.numpy().tolist() for b in ds]
    assert [len(b) for b in batches] == [16, 16, 16, 2]
    assert sorted(r for b in batches for r in b) == sorted(want)
    # A batch of the chunk's size crosses as it is; drop_last leaves the short last one out.
    for drop_last, sizes in ((False, [16, 16, 16, 2]), (True, [16, 16, 16])):
        ds = rtf.dataset(root, format="tfrecord", batch_size=16, seed=4, drop_last=drop_last)
        assert [int(b.shape[0]) for b in ds] == sizes
    # Resumed from a position: the records after it, once.
    src = rtf.Source(root, format="tfrecord", batch_size=16, shuffle=False)
    first = [r for b in src.dataset() for r in b.numpy().tolist()]
    assert first == want
    src.set_epoch(1, position=20)
    assert [r for b in src.dataset() for r in b.numpy().tolist()] == want[20:]


# -- TFRecord through the C++ record op --------------------------------------------------------


def write_tfrecords(root: Path, shards: int, per_shard: int) -> List[bytes]:
    """Shards TensorFlow writes, records of 0 to a few thousand bytes; every record, in order."""
    root.mkdir(parents=True, exist_ok=True)
    want = []
    for s in range(shards):
        with tf.io.TFRecordWriter(str(root / f"part-{s}.tfrecord")) as w:
            for i in range(per_shard):
                want.append(os.urandom((i * 131 + s) % 5000))
                w.write(want[-1])
    return want


def run_python(code: str, env: Dict[str, str], timeout: int = 240) -> subprocess.CompletedProcess:
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full, timeout=timeout)


def test_record_op_reads_what_the_generator_reads(tmp_path, monkeypatch):
    """With the op (RINGTIER_TF_OP=on: built here or an error) and without it (off): the same
    records in the same order, batched and one at a time, sharded, resumed, across epochs."""
    from ringtier import _tf_op

    want = write_tfrecords(tmp_path / "tfr", 3, 40)

    def read(mode: str, **kw) -> List[List[bytes]]:
        monkeypatch.setenv("RINGTIER_TF_OP", mode)
        src = rtf.Source(tmp_path / "tfr", format="tfrecord", seed=3, **kw)
        assert src.uses_op() == (mode == "on")
        ds = src.dataset()
        epochs = []
        for _ in range(2):
            got = []
            for b in ds:
                got.append(b.numpy().tolist() if b.shape.rank == 1 else [b.numpy()])
            epochs.append(got)
        return epochs

    for kw in ({}, {"batch_size": 16}, {"batch_size": 16, "drop_last": True}, {"batch_size": 7, "read_batch": 3},
               {"shard": (1, 2), "batch_size": 5}, {"order": "global", "batch_size": 9}, {"shuffle": False}):
        on, off = read("on", **kw), read("off", **kw)
        assert on == off, kw
        flat = [r for b in on[0] for r in b]
        if "shard" not in kw and not kw.get("drop_last"):
            assert sorted(flat) == sorted(want), kw
        if kw.get("drop_last"):
            assert all(len(b) == 16 for b in on[0]) and len(flat) == 112
        assert on[0] != on[1] or kw.get("shuffle") is False or "shard" in kw
    assert _tf_op.refusal() is None
    # Resumed from a position, through the op.
    monkeypatch.setenv("RINGTIER_TF_OP", "on")
    src = rtf.Source(tmp_path / "tfr", format="tfrecord", batch_size=16, shuffle=False)
    src.set_epoch(1, position=50)
    assert [r for b in src.dataset() for r in b.numpy().tolist()] == want[50:]
    # Parsed and batched in the graph after it, as a user writes it.
    n = sum(int(x) for x in rtf.dataset(tmp_path / "tfr", format="tfrecord", batch_size=32)
            .map(lambda b: tf.reduce_sum(tf.strings.length(b))).as_numpy_iterator())
    assert n == sum(len(r) for r in want)


def test_batch_op_reads_the_files_the_generator_reads(dataset, tmp_path, monkeypatch):
    """Raw files through the op (RINGTIER_TF_OP=on) and through the generator (off): the same
    elements in the same order, with keys and labels gathered by index, batched or one at a
    time, drop_last, sharded, resumed, two epochs; empty files and a 3 MB one included."""
    root, files = dataset
    (root / "d0" / "empty.bin").write_bytes(b"")
    big = os.urandom(3 << 20)
    (root / "d1" / "big.bin").write_bytes(big)
    files = {**files, "d0/empty.bin": b"", "d1/big.bin": big}

    def read(mode: str, **kw) -> List[list]:
        monkeypatch.setenv("RINGTIER_TF_OP", mode)
        src = rtf.Source(root, seed=5, **kw)
        assert src.uses_op() == (mode == "on")
        ds = src.dataset()
        return [[tf.nest.map_structure(lambda t: t.numpy().tolist() if t.shape.rank else t.numpy(), x) for x in ds]
                for _ in range(2)]

    for kw in ({}, {"batch_size": 32}, {"batch_size": 32, "drop_last": True}, {"with_keys": True, "read_batch": 7},
               {"labels": "inferred", "batch_size": 16}, {"with_keys": True, "labels": "inferred"},
               {"shard": (1, 3), "batch_size": 10}, {"shuffle": False}):
        on, off = read("on", **kw), read("off", **kw)
        assert on == off, kw
        assert on[0] != on[1] or kw.get("shuffle") is False
    got = {k.decode(): d for k, d in read("on", with_keys=True)[0]}
    assert got == files
    # Labels are the class directory's index.
    for data, label in read("on", labels="inferred")[0]:
        key = next(k for k, v in files.items() if v == data)
        assert label == int(key[1])
    # Resumed from a position.
    monkeypatch.setenv("RINGTIER_TF_OP", "on")
    src = rtf.Source(root, batch_size=10, shuffle=False, with_keys=True)
    order = [k for b, _ in src.dataset() for k in b.numpy().tolist()]
    src.set_epoch(1, position=100)
    assert [k for b, _ in src.dataset() for k in b.numpy().tolist()] == order[100:]
    # A file removed after the listing: an error naming it (NotFoundError in Python and here:
    # a file gone is not corrupt data), or skipped under on_bad="skip".
    strict = rtf.dataset(root, batch_size=16, with_keys=True, on_bad="fail")
    lenient = rtf.dataset(root, batch_size=16, with_keys=True, on_bad="skip")
    (root / "d2" / "f00002.bin").unlink()
    with pytest.raises(tf.errors.NotFoundError, match="f00002.bin.*No such file"):
        for _ in strict:
            pass
    got = {k.decode() for b, _ in lenient for k in b.numpy().tolist()}
    assert got == set(files) - {"d2/f00002.bin"}


def test_record_op_errors_keep_their_kind(tmp_path, monkeypatch):
    """A corrupt record is tf.errors.DataLossError naming the shard and offset (on_bad="fail");
    skipped and the rest delivered with on_bad="skip"; the epoch's entry is gone either way."""
    from ringtier import _ringtier

    monkeypatch.setenv("RINGTIER_TF_OP", "on")
    want = write_tfrecords(tmp_path / "tfr", 2, 30)
    p = tmp_path / "tfr" / "part-1.tfrecord"
    raw = bytearray(p.read_bytes())
    off = 0
    for _ in range(5):  # the sixth record of shard 1
        (n,) = np.frombuffer(bytes(raw[off:off + 8]), "<u8")
        off += 16 + int(n)
    raw[off + 12] ^= 1  # a data byte: its CRC fails
    p.write_bytes(bytes(raw))
    raw[off + 12] ^= 1
    before = _ringtier._tf_open_epochs()
    with pytest.raises(tf.errors.DataLossError, match=r"part-1.tfrecord.*CRC"):
        for _ in rtf.dataset(tmp_path / "tfr", format="tfrecord", batch_size=8, shuffle=False):
            pass
    got = [r for b in rtf.dataset(tmp_path / "tfr", format="tfrecord", batch_size=8, on_bad="skip") for r in
           b.numpy().tolist()]
    assert len(got) == len(want) - 1 and sorted(got) == sorted(want[:35] + want[36:])
    assert _ringtier._tf_open_epochs() == before
    # A dangling link named like a shard: ringtier.NotFoundError naming it when the dataset is
    # made (the listing is done then); left out with one warning with on_bad="skip".
    p.write_bytes(bytes(raw))  # whole again
    (tmp_path / "tfr" / "part-0.tfrecord").unlink()
    os.symlink(tmp_path / "gone", tmp_path / "tfr" / "part-0.tfrecord")
    with pytest.raises(ringtier.NotFoundError, match="part-0.tfrecord"):
        rtf.dataset(tmp_path / "tfr", format="tfrecord", batch_size=8)
    with pytest.warns(RuntimeWarning, match="part-0.tfrecord"):
        skip = rtf.dataset(tmp_path / "tfr", format="tfrecord", batch_size=8, on_bad="skip")
    got = [r for b in skip for r in b.numpy().tolist()]
    assert sorted(got) == sorted(want[30:])
    assert _ringtier._tf_open_epochs() == before


def test_an_iterator_dropped_early_does_not_hold_up_the_next(tmp_path):
    """A first batch taken and the iterator dropped, then whole epochs: every record each time
    (its epoch, open with its reads done, is released by the next iteration: before, the next
    epoch could wait for ever for the read buffers it held). Two iterators at once: the newer
    reads everything, the older fails saying what happened. In a process of its own, with a
    time limit: a hang fails the test instead of the run."""
    want = write_tfrecords(tmp_path / "tfr", 3, 300)
    out = run_python(
        f"""
        import tensorflow as tf
        import ringtier.tensorflow as rtf
        ds = rtf.dataset({str(tmp_path / "tfr")!r}, format="tfrecord", batch_size=8, shuffle=False, read_size=4096)
        for _ in range(3):
            it = iter(ds)
            next(it)
            del it
            assert sum(int(b.shape[0]) for b in ds) == {len(want)}
        older = iter(ds)
        next(older)
        assert sum(int(b.shape[0]) for b in ds) == {len(want)}
        try:
            for _ in older:
                pass
            raise SystemExit("the older iterator read on")
        except tf.errors.InvalidArgumentError as e:
            assert "newer iteration" in str(e), e
        print("ok")
        """,
        {"RINGTIER_TF_OP": "on"},
        timeout=180,
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_record_op_epochs_are_released(tmp_path, monkeypatch):
    """An epoch read to its end leaves the table; iterators dropped early leave at most
    MAX_OPEN_EPOCHS open per source, and none after Source.close()."""
    from ringtier import _ringtier

    monkeypatch.setenv("RINGTIER_TF_OP", "on")
    write_tfrecords(tmp_path / "tfr", 2, 200)
    before = _ringtier._tf_open_epochs()
    ds = rtf.dataset(tmp_path / "tfr", format="tfrecord", batch_size=4)
    assert sum(int(b.shape[0]) for b in ds) == 400
    assert _ringtier._tf_open_epochs() == before
    for _ in range(rtf_data.MAX_OPEN_EPOCHS + 4):
        it = iter(ds)
        next(it)
        del it
    assert before < _ringtier._tf_open_epochs() <= before + rtf_data.MAX_OPEN_EPOCHS
    # Every epoch still gives every record.
    assert sum(int(b.shape[0]) for b in ds) == 400
    it = iter(ds)
    next(it)
    ds.ringtier_source.close()
    assert _ringtier._tf_open_epochs() == before
    with pytest.raises(tf.errors.InvalidArgumentError, match="not open in this process"):
        for _ in it:
            pass
    assert sum(int(b.shape[0]) for b in ds) == 400  # a new epoch after close


def test_record_op_reads_shards_from_s3(tmp_path, monkeypatch):
    """TFRecord shards under an S3 prefix (the test kit's s3s-fs server on loopback) through the
    op: every record once, streamed and in a global order."""
    if not ringtier._ringtier.HAS_S3:
        pytest.skip("built without feature s3")
    from s3_servers import aws_env, servers

    monkeypatch.setenv("RINGTIER_TF_OP", "on")
    want = write_tfrecords(tmp_path / "tfr", 3, 30)
    for srv in servers("s3s-fs", tmp_path):
        for k, v in aws_env().items():
            monkeypatch.setenv(k, v)
        bucket = srv.create_bucket()
        for p in (tmp_path / "tfr").iterdir():
            srv.put(bucket, f"tf/{p.name}", p.read_bytes())
        url = srv.url(bucket, "tf")
        for order in ("stream", "global"):
            src = rtf.Source(url, format="tfrecord", order=order, batch_size=16, seed=1)
            assert src.uses_op()
            got = [r for b in src.dataset() for r in b.numpy().tolist()]
            assert sorted(got) == sorted(want), order


def test_record_op_without_a_compiler(tmp_path):
    """No compiler: auto reads through Python after one RuntimeWarning that says why; on is an
    UnsupportedError naming the compiler; off says nothing. A cache directory others can write
    is not used (the op is built in a private temporary directory)."""
    root = tmp_path / "tfr"
    want = write_tfrecords(root, 2, 20)
    code = f"""
        import os, warnings
        import ringtier.tensorflow as rtf
        from ringtier import _tf_op
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            src = rtf.Source({str(root)!r}, format="tfrecord", batch_size=8)
            got = [r for b in src.dataset() for r in b.numpy().tolist()]
            got += [r for b in src.dataset() for r in b.numpy().tolist()]
        print(len(got), src.uses_op(), sum(len(r) for r in got))
        for w in caught:
            print("WARNING", w.category.__name__, str(w.message).replace(chr(10), " "))
        """
    total = 2 * sum(len(r) for r in want)
    base = {"RINGTIER_CACHE_DIR": str(tmp_path / "cache"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = run_python(code, {**base, "RINGTIER_TF_CXX": str(tmp_path / "no-such-c++"), "RINGTIER_TF_OP": "auto"})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == f"80 False {total}"
    warned = [line for line in lines if line.startswith("WARNING")]
    assert len(warned) == 1 and "RuntimeWarning" in warned[0] and "no-such-c++" in warned[0], lines
    out = run_python(code, {**base, "RINGTIER_TF_CXX": str(tmp_path / "no-such-c++"), "RINGTIER_TF_OP": "on"})
    assert out.returncode != 0 and "OpUnavailableError" in out.stderr and "no-such-c++" in out.stderr
    out = run_python(code, {**base, "RINGTIER_TF_CXX": str(tmp_path / "no-such-c++"), "RINGTIER_TF_OP": "off"})
    assert out.returncode == 0 and out.stdout.splitlines() == [f"80 False {total}"], out.stdout
    out = run_python(code, {**base, "RINGTIER_TF_OP": "maybe"})
    assert out.returncode != 0 and "RINGTIER_TF_OP must be one of" in out.stderr
    # A cache others can write: built privately for the process (in TMPDIR, removed once
    # loaded), used, nothing left there or in TMPDIR.
    shared = tmp_path / "shared"
    (shared / "tf-op").mkdir(parents=True)
    os.chmod(shared, 0o777)
    private_tmp = tmp_path / "private-tmp"
    private_tmp.mkdir()
    out = run_python(code, {**base, "RINGTIER_CACHE_DIR": str(shared), "RINGTIER_TF_OP": "on",
                            "TMPDIR": str(private_tmp)})
    assert out.returncode == 0 and out.stdout.splitlines() == [f"80 True {total}"], out.stderr[-3000:]
    assert list((shared / "tf-op").iterdir()) == []
    assert [p.name for p in private_tmp.iterdir() if p.name.startswith("ringtier-tf-op-")] == []
    # A private cache: built once, then loaded from it.
    own = tmp_path / "own"
    for _ in range(2):
        out = run_python(code, {**base, "RINGTIER_CACHE_DIR": str(own), "RINGTIER_TF_OP": "on"})
        assert out.returncode == 0 and out.stdout.splitlines() == [f"80 True {total}"], out.stderr[-3000:]
        built = sorted(p.name for p in (own / "tf-op").iterdir())
        assert len(built) == 1 and built[0].startswith("ringtier_tf_op-") and built[0].endswith(".so"), built
    assert oct((own / "tf-op").stat().st_mode & 0o777) == "0o700"


# -- checkpoints ------------------------------------------------------------------------------


def model_state(n: int = 1000):
    v = tf.Variable(tf.zeros((n, 64)))
    step = tf.Variable(0, dtype=tf.int64)
    return v, step, tf.train.Checkpoint(v=v, step=step)


def test_checkpoint_save_drain_restore(tiers, tmp_path):
    v, step, ckpt = model_state()
    with rtf.CheckpointManager(ckpt, tiers, keep_last=1) as m:
        assert m.restore_or_initialize() is None
        for s in range(3):
            v.assign(tf.fill(v.shape, float(s)))
            step.assign(s)
            rep = m.save(s)
            assert rep["step"] == s and rep["bytes"] > v.shape[0] * 64 * 4
            assert rep["blocking_seconds"] >= rep["tf_write_seconds"]
            assert sorted(rep["files"]) == ["ckpt.data-00000-of-00001", "ckpt.index"]
        m.drain()
        listed = m.store.list()
        assert [c["step"] for c in listed] == [0, 1, 2]
        assert all(any(t.endswith(tiers[1]) for t in c["tiers"]) for c in listed), listed
        # keep_last=1: only the newest is still on the fast tier.
        assert [c["step"] for c in listed if any(t.endswith(tiers[0]) for t in c["tiers"])] == [2]
        assert not os.listdir(m.staging_dir), "staging files left behind"
    v.assign(tf.zeros(v.shape))
    with rtf.CheckpointManager(ckpt, tiers) as m:
        assert m.restore_or_initialize() == 2
        m.last_status.assert_consumed()
        assert float(v[0, 0]) == 2.0 and int(step) == 2
        assert m.restore(1) == 1 and float(v[5, 5]) == 1.0
    # Only the slow tier left (the fast one lost): restores from it.
    import shutil

    shutil.rmtree(tiers[0])
    os.makedirs(tiers[0])
    v.assign(tf.zeros(v.shape))
    with rtf.CheckpointManager(ckpt, tiers) as m:
        assert m.restore() == 2 and float(v[1, 1]) == 2.0


def test_save_commits_tensorflows_own_files_without_a_second_write(tiers, tmp_path):
    """The step's parts are the very files TensorFlow wrote (same inodes, one link each):
    adopted, not copied, with wait=True and wait=False; a staging directory off the fast
    tier is copied instead (adopted_bytes 0), and both restore."""
    v, step, ckpt = model_state(5000)
    with rtf.CheckpointManager(ckpt, tiers, keep_last=3) as m:
        written: Dict[str, int] = {}
        staged = m._staged

        def spy(s: int, where: str):
            names = staged(s, where)
            for name in names:
                written[f"{s}/{name}"] = os.stat(os.path.join(where, name)).st_ino
            return names

        m._staged = spy  # type: ignore[method-assign]
        for s, wait in ((1, True), (2, False)):
            v.assign(tf.fill(v.shape, float(s)))
            rep = m.save(s, wait=wait) if wait else m.save(s, wait=False).result()
            assert rep["adopted_bytes"] == rep["bytes"] > v.shape[0] * 64 * 4, rep
        assert len(written) == 4, written
        for key, ino in written.items():
            s, name = key.split("/")
            part = Path(tiers[0]) / "tf-ckpt" / f"{int(s):020d}" / "parts" / name
            st = part.stat()
            assert (st.st_ino, st.st_nlink) == (ino, 1), f"{part} is a copy of what TensorFlow wrote"
        assert not os.listdir(m.staging_dir)
        for t, err in m.store.verify(2):
            assert err is None, (t, err)
    # TensorFlow writing off the fast tier: copied, and the step is the same kind of step.
    elsewhere = tmp_path / "elsewhere"
    with rtf.CheckpointManager(ckpt, tiers, staging_dir=elsewhere) as m:
        v.assign(tf.fill(v.shape, 3.0))
        rep = m.save(3)
        assert rep["adopted_bytes"] == 0 and rep["bytes"] > 0, rep
        v.assign(tf.zeros(v.shape))
        assert m.restore(2) == 2 and float(v[7, 7]) == 2.0
        assert m.restore() == 3 and float(v[7, 7]) == 3.0


def test_restore_or_initialize_calls_init_fn(tiers):
    _, _, ckpt = model_state(4)
    called = []
    with rtf.CheckpointManager(ckpt, tiers, init_fn=lambda: called.append(1)) as m:
        assert m.restore_or_initialize() is None
    assert called == [1]


def test_second_save_of_a_step_in_progress_is_refused(tiers):
    v, _, ckpt = model_state(20000)  # ~5 MB
    with rtf.CheckpointManager(ckpt, tiers, drain_bytes_per_sec=None) as m:
        fut = m.save(7, wait=False)
        with pytest.raises(ringtier.BusyError):
            m.save(7)
        assert fut.result()["step"] == 7
        with pytest.raises(ringtier.AlreadyExistsError):
            m.save(7)
        # step=None: the one after the newest.
        assert m.save()["step"] == 8
        assert m.steps == [7, 8]


def test_max_to_keep_deletes_old_steps_everywhere(tiers):
    _, _, ckpt = model_state(10)
    with rtf.CheckpointManager(ckpt, tiers, max_to_keep=2) as m:
        for s in range(5):
            m.save(s)
        m.drain()
        assert m.steps == [3, 4]


def test_a_bad_newest_step_is_passed_over(tiers):
    v, step, ckpt = model_state(100)
    with rtf.CheckpointManager(ckpt, tiers) as m:
        for s in (1, 2):
            v.assign(tf.fill(v.shape, float(s)))
            m.save(s)
        m.drain()
    # Bit rot in every copy of step 2's data file.
    for tier in tiers:
        for p in Path(tier).rglob("ckpt.data-00000-of-00001"):
            if "00000000000000000002" in str(p):
                b = bytearray(p.read_bytes())
                b[len(b) // 2] ^= 0xFF
                p.write_bytes(bytes(b))
    v.assign(tf.zeros(v.shape))
    with rtf.CheckpointManager(ckpt, tiers) as m:
        with pytest.warns(RuntimeWarning, match="checkpoint 2 skipped"):
            assert m.restore_or_initialize() == 1
        assert float(v[3, 3]) == 1.0


SAVER = textwrap.dedent(
    """
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    import ringtier.tensorflow as rtf
    v = tf.Variable(tf.zeros((4096, 1024)))  # 16 MiB
    step = tf.Variable(0, dtype=tf.int64)
    m = rtf.CheckpointManager(tf.train.Checkpoint(v=v, step=step), sys.argv[1:3], keep_last=2)
    s = 0
    while True:
        v.assign(tf.fill(v.shape, float(s)))
        step.assign(s)
        print("saving", s, flush=True)
        if sys.argv[3] == "wait":
            m.save(s)
        else:
            m.save(s, wait=False).result()
        print("saved", s, flush=True)
        s += 1
    """
)


@pytest.mark.parametrize("wait", ["wait", "async"])
def test_sigkill_during_a_save_leaves_the_newest_intact_step_restorable(tiers, tmp_path, wait):
    """Killed while TensorFlow writes the fourth step: synchronously (``save(s)``), or in
    TensorFlow's async thread (``save(s, wait=False)``)."""
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    p = subprocess.Popen([sys.executable, str(script), *tiers, wait], stdout=subprocess.PIPE, text=True)
    saved = []
    try:
        assert p.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            what, s = line.split()
            if what == "saved":
                saved.append(int(s))
            # Killed while saving the fourth step (after TensorFlow started writing it).
            elif int(s) == 3:
                time.sleep(0.05)
                break
        p.send_signal(signal.SIGKILL)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == -signal.SIGKILL
    assert saved[:3] == [0, 1, 2], saved
    v, step, ckpt = model_state(1)
    v = tf.Variable(tf.zeros((4096, 1024)))
    ckpt = tf.train.Checkpoint(v=v, step=step)
    with rtf.CheckpointManager(ckpt, tiers) as m:
        got = m.restore_or_initialize()
        assert got is not None and got >= saved[-1], (got, saved)
        assert int(step) == got
        np.testing.assert_array_equal(v.numpy()[::512, ::128], np.full((8, 8), float(got), np.float32))
        m.last_status.assert_consumed()
        # The writer's staging files are gone and the store saves on.
        assert m.save(got + 1)["step"] == got + 1


# -- wait=False through TensorFlow's async checkpointing ----------------------------------------


def test_wait_false_snapshots_the_variables_through_tensorflows_async_write(tiers):
    """save(wait=False) returns once TensorFlow has snapshotted the variables; updates made
    while its thread writes are not in the step (copy-on-write), and the step restores."""
    v, step, ckpt = model_state(20000)  # ~5 MB
    with rtf.CheckpointManager(ckpt, tiers) as m:
        for s in (1, 2, 3):
            v.assign(tf.fill(v.shape, float(s)))
            step.assign(s)
            fut = m.save(s, wait=False)
            for k in range(20):
                v.assign_add(tf.ones(v.shape))
                step.assign(100 + k)
            rep = fut.result()
            assert rep["tf_async"] is True and rep["step"] == s, rep
            assert rep["files"] == ["ckpt.data-00000-of-00001", "ckpt.index"]
            assert rep["adopted_bytes"] == rep["bytes"] > v.shape[0] * 64 * 4
        assert not os.listdir(m.staging_dir)
        for s in (1, 2, 3):
            assert m.restore(s) == s
            m.last_status.assert_consumed()
            assert int(step) == s
            np.testing.assert_array_equal(v.numpy()[::997, ::7], np.full((21, 10), float(s), np.float32))
    # async_write=False: TensorFlow writes before save returns.
    with rtf.CheckpointManager(ckpt, tiers, async_write=False) as m:
        assert m.save(4, wait=False).result()["tf_async"] is False


def test_async_write_takes_objects_made_after_the_first_save(tiers):
    """TensorFlow's async helper snapshots the objects it found at its first write; later
    ones (here a layer's variables, made by its first call) are read by its thread while it
    writes, values from after the save. The manager starts a new helper when the checkpoint's
    objects change, so they are snapshotted too."""
    layer = tf.keras.layers.Dense(2048)
    model = tf.Module()
    model.layer = layer
    model.bias = tf.Variable(1.0)
    ckpt = tf.train.Checkpoint(model=model)
    with rtf.CheckpointManager(ckpt, tiers) as m:
        assert m.save(1, wait=False).result()["tf_async"] is True
        layer(tf.ones((1, 1024)))  # makes the kernel (8 MiB) and the bias
        layer.kernel.assign(tf.fill(layer.kernel.shape, 5.0))
        fut = m.save(2, wait=False)
        layer.kernel.assign(tf.fill(layer.kernel.shape, 7.0))  # while TensorFlow writes
        assert fut.result()["tf_async"] is True
    layer2 = tf.keras.layers.Dense(2048)
    model2 = tf.Module()
    model2.layer = layer2
    model2.bias = tf.Variable(0.0)
    layer2(tf.ones((1, 1024)))
    with rtf.CheckpointManager(tf.train.Checkpoint(model=model2), tiers) as m:
        assert m.restore(2) == 2
        m.last_status.assert_consumed()
        assert float(model2.bias) == 1.0
        np.testing.assert_array_equal(layer2.kernel.numpy()[::97, ::101], np.full((11, 21), 5.0, np.float32))


def test_async_write_of_a_keras_model_and_its_optimizer(tiers):
    """A Keras model and its optimizer (built by the first fit, after the first save), saved
    with wait=False while the model trains on: the step holds the weights and optimizer state
    of the moment of the save."""

    def make():
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16), tf.keras.layers.Dense(4)])
        opt = tf.keras.optimizers.Adam()
        model.compile(optimizer=opt, loss="mse")
        return model, opt

    rng = np.random.default_rng(0)
    x, y = rng.random((64, 8), np.float32), rng.random((64, 4), np.float32)
    model, opt = make()
    with rtf.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=opt), tiers) as m:
        assert m.save(1, wait=False).result()["tf_async"] is True
        model.fit(x, y, epochs=2, verbose=0)
        want = [w.numpy().copy() for w in model.weights + opt.variables]
        fut = m.save(2, wait=False)
        model.fit(x, y, epochs=1, verbose=0)
        assert fut.result()["tf_async"] is True
    model2, opt2 = make()
    model2.fit(x[:8], y[:8], epochs=1, verbose=0)  # builds the optimizer's variables
    with rtf.CheckpointManager(tf.train.Checkpoint(model=model2, optimizer=opt2), tiers) as m:
        assert m.restore(2) == 2
        m.last_status.assert_consumed()
    got = [w.numpy() for w in model2.weights + opt2.variables]
    assert len(got) == len(want)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_async_write_refused_for_attributes_set_on_the_checkpoint_later(tiers):
    ckpt = tf.train.Checkpoint(v=tf.Variable(1.0))
    ckpt.w = tf.Variable(5.0)
    with rtf.CheckpointManager(ckpt, tiers) as m:
        with pytest.warns(RuntimeWarning, match="not w"):
            assert m.save(1, wait=False).result()["tf_async"] is False
    w = tf.Variable(0.0)
    fresh = tf.train.Checkpoint(v=tf.Variable(0.0), w=w)
    with rtf.CheckpointManager(fresh, tiers) as m:
        assert m.restore(1) == 1
        m.last_status.assert_consumed()
        assert float(w) == 5.0


class _Counter(tf.__internal__.tracking.Trackable):
    """State TensorFlow's async checkpointing cannot copy (no ``_copy_trackable_to_cpu``)."""

    def __init__(self) -> None:
        self.value = 0

    def _serialize_to_tensors(self):
        return {"value": tf.constant(self.value, tf.int64)}

    def _restore_from_tensors(self, restored_tensors):
        self.value = int(restored_tensors["value"])
        return tf.no_op()


def test_async_write_refused_where_tensorflow_would_leave_an_object_out(tiers):
    counter = _Counter()
    ckpt = tf.train.Checkpoint(counter=counter, v=tf.Variable(1.0))
    with rtf.CheckpointManager(ckpt, tiers) as m:
        counter.value = 7
        with pytest.warns(RuntimeWarning, match="cannot copy a _Counter"):
            rep = m.save(1, wait=False).result()
        assert rep["tf_async"] is False
        counter.value = 0
        assert m.restore(1) == 1 and counter.value == 7


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_async_write_into_a_full_fast_tier_fails_its_step_only(tmp_path):
    """TensorFlow's async thread hits ENOSPC: the future raises, the step is not committed,
    its staging files are gone, and the next save (with room again) is not given the stale
    error."""
    fast = tmp_path / "fast"
    if not _mount_tmpfs(fast, "3m"):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        slow = tmp_path / "slow"
        slow.mkdir()
        v = tf.Variable(tf.fill((1536 // 4, 1024), 1.0))  # 1.5 MiB
        ckpt = tf.train.Checkpoint(v=v)
        with rtf.CheckpointManager(ckpt, [str(fast), str(slow)], keep_last=2, drain_bytes_per_sec=None) as m:
            assert m.save(1, wait=False).result()["tf_async"] is True
            v.assign(tf.fill(v.shape, 2.0))
            with pytest.raises(RuntimeError, match="step 2"):
                m.save(2, wait=False).result()
            assert m.steps == [1]
            assert not os.listdir(m.staging_dir)
            m.drain()
            m.store.delete(1)
            v.assign(tf.fill(v.shape, 3.0))
            assert m.save(3, wait=False).result()["step"] == 3
        v.assign(tf.zeros(v.shape))
        # Restored files are staged off the small tier (they would not fit beside the step).
        with rtf.CheckpointManager(ckpt, [str(fast), str(slow)], staging_dir=tmp_path / "stage") as m:
            assert m.restore() == 3 and float(v[0, 0]) == 3.0
            m.last_status.assert_consumed()
    finally:
        subprocess.run(["umount", "-l", str(fast)], check=False)


def test_module_imports_without_importing_tensorflow():
    code = "import sys, ringtier.tensorflow; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().lower()) is False
