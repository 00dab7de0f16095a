"""DataLoader workers (packed batches, the warning), the cache and materialisation from
Python (issue 28)."""

from __future__ import annotations

import collections
import gc
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import ringtier
import ringtier.torch as rt
from conftest import DATA
from ringtier.torch._packed import PackedBatch


def jpeg_dir(root: Path, n: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        shutil.copy(DATA / "tiny.jpg", root / f"{i:03d}.jpg")
    return root


# ---- PackedBatch ----------------------------------------------------------------------------


def test_packed_batch_round_trips_samples_and_pickles_as_one_tensor():
    ts = [torch.arange(n, dtype=torch.uint8) for n in (5, 0, 3, 7)]
    b = PackedBatch.pack(ts, keys=["a", "b", "c", "d"])
    assert len(b) == 4 and b.offsets == [0, 5, 5, 8, 15] and b.shape is None
    assert b.data.is_shared(), "packed in shared memory: pickling to the main process copies nothing more"
    for (k, t), want, key in zip(b, ts, "abcd"):
        assert k == key and torch.equal(t, want)
    assert torch.equal(b.sample(-1), ts[-1])
    with pytest.raises(IndexError):
        b.sample(4)
    with pytest.raises(ValueError, match="different lengths"):
        b.tensor()
    c = pickle.loads(pickle.dumps(b))
    assert c.offsets == b.offsets and torch.equal(c.data, b.data) and c.keys == b.keys


def test_packed_batch_of_one_shape_is_a_batch_tensor():
    ts = [torch.full((2, 3, 3), i, dtype=torch.uint8) for i in range(4)]
    b = PackedBatch.pack(ts)
    assert b.shape == (2, 3, 3)
    t = b.tensor()
    assert t.shape == (4, 2, 3, 3) and t.data_ptr() == b.data.data_ptr()
    assert torch.equal(t, torch.stack(ts))


def test_packed_batch_rejects_bad_offsets():
    d = torch.zeros(10, dtype=torch.uint8)
    with pytest.raises(ValueError, match="start at 0"):
        PackedBatch(d, [0, 4, 9])
    with pytest.raises(ValueError, match="not decrease"):
        PackedBatch(d, [0, 6, 4, 10])
    with pytest.raises(TypeError, match="uint8"):
        PackedBatch(torch.zeros(10), [0, 10])
    with pytest.raises(ValueError, match="keys"):
        PackedBatch(d, [0, 10], keys=["a", "b"])


# ---- workers --------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [2, 4])
def test_workers_yield_packed_batches_every_sample_once(dataset, workers):
    root, files = dataset
    ds = rt.IterableDataset(root, batch_size=16, seed=3, with_keys=True)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        seen = collections.Counter()
        for batch in DataLoader(ds, batch_size=None, num_workers=workers):
            assert isinstance(batch, PackedBatch), type(batch)
            assert 0 < len(batch) <= 16
            for key, t in batch:
                assert bytes(t.numpy()) == files[key]
                seen[key] += 1
        assert seen == collections.Counter(list(files)), f"epoch {epoch}"


@pytest.mark.parametrize("keep", [False, True])
def test_worker_slots_are_reused_only_once_released(dataset, keep):
    """Batches held by the main process keep their memory (the worker packs into other slots
    or fresh memory); dropped ones give their slot back to the worker."""
    root, files = dataset
    ds = rt.IterableDataset(root, batch_size=8, seed=5, with_keys=True)
    kept = []
    seen = {}
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        for batch in DataLoader(ds, batch_size=None, num_workers=1):
            if keep:
                kept.append(batch)  # every batch alive until the end: no slot may be reused
            else:
                seen.update((k, bytes(t.numpy())) for k, t in batch)
            del batch
    for batch in kept:
        for k, t in batch:
            assert bytes(t.numpy()) == files[k], k
            seen[k] = bytes(t.numpy())
    assert seen == files
    ring = ds._ring
    if keep:
        assert sum(ring.flags) > 0, "held batches keep their slots busy"
    kept.clear()
    gc.collect()
    assert sum(ring.flags) == 0, "every slot is free once no view of its batch is left"


def test_a_worker_takes_its_first_free_slot():
    """Slots are taken first free first, not in turn: a worker with few batches in flight
    touches few slots (each a segment whose pages are faulted in once)."""
    from ringtier.torch._packed import SLOTS_PER_WORKER, SlotRing

    ring = SlotRing()
    a, ia = ring.take(1, 1000)
    b, ib = ring.take(1, 1000)
    assert (ia, ib) == (SLOTS_PER_WORKER, SLOTS_PER_WORKER + 1)  # worker 1's first two
    assert a.numel() == 1250, "a quarter more by default, for batches whose size varies"
    ring.flags[ia] = 0  # the main process let go of the first batch
    again, i = ring.take(1, 1000)
    assert i == ia and again.data_ptr() == a.data_ptr(), "the freed slot is taken again, same segment"
    exact, j = ring.take(1, 4096, headroom=False)
    assert j == SLOTS_PER_WORKER + 2 and exact.numel() == 4096
    for k in range(SLOTS_PER_WORKER):
        ring.flags[SLOTS_PER_WORKER + k] = 1
    assert ring.take(1, 10) is None, "every slot busy: the caller falls back to fresh memory"


def test_a_sample_view_keeps_its_slot(dataset):
    root, files = dataset
    ds = rt.IterableDataset(root, batch_size=8, with_keys=True)
    views = []
    for batch in DataLoader(ds, batch_size=None, num_workers=1):
        views.append(batch[0])  # one (key, view) per batch; the batch object itself is dropped
    for k, t in views:
        assert bytes(t.numpy()) == files[k], k
    assert sum(ds._ring.flags) > 0
    views.clear()
    gc.collect()
    assert sum(ds._ring.flags) == 0


def test_zero_workers_keep_zero_copy_lists(dataset):
    root, _ = dataset
    ds = rt.IterableDataset(root, batch_size=8)
    batch = next(iter(DataLoader(ds, batch_size=None, num_workers=0)))
    assert isinstance(batch, list) and all(isinstance(t, torch.Tensor) for t in batch)


WARN_SCRIPT = """
import sys
from torch.utils.data import DataLoader
import ringtier.torch as rt
ds = rt.IterableDataset(sys.argv[1], batch_size=32)
for epoch in range(2):  # workers are started again each epoch: still one warning
    ds.set_epoch(epoch)
    n = sum(len(b) for b in DataLoader(ds, batch_size=None, num_workers=int(sys.argv[2])))
print(n)
"""


@pytest.mark.parametrize("workers", [0, 2, 4])
def test_workers_warn_once_that_zero_workers_is_fast(dataset, workers):
    import subprocess
    import sys

    root, files = dataset
    r = subprocess.run([sys.executable, "-c", WARN_SCRIPT, str(root), str(workers)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(len(files))]
    assert r.stderr.count("num_workers=0 is the fast setting") == (1 if workers else 0), r.stderr
    if workers:
        assert "RuntimeWarning" in r.stderr


def test_a_copy_of_the_dataset_warns_on_its_own(dataset):
    root, _ = dataset
    ds = rt.IterableDataset(root, batch_size=32)
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._workers_warning._flag is None


def test_decoded_batches_cross_workers_as_one_tensor(tmp_path):
    root = jpeg_dir(tmp_path / "jpg", 12)
    ds = rt.IterableDataset(root, decode=16, batch_size=4)
    batches = list(DataLoader(ds, batch_size=None, num_workers=2, pin_memory=False))
    assert sum(len(b) for b in batches) == 12
    for b in batches:
        assert b.tensor().shape == (len(b), 16, 16, 3)


def test_pin_memory_keeps_the_batch_packed(dataset):
    root, files = dataset
    ds = rt.IterableDataset(root, batch_size=32, with_keys=True)
    got = {}
    # Without CUDA, pinning is unavailable in torch; PackedBatch.pin_memory is what runs.
    for b in DataLoader(ds, batch_size=None, num_workers=2):
        p = b.pin_memory() if torch.cuda.is_available() else b
        assert isinstance(p, PackedBatch)
        got.update({k: bytes(t.numpy()) for k, t in p})
    assert got == files


# ---- record datasets ------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_batched_tfrecords_cross_workers_packed(tmp_path, workers):
    from test_records import write_tfrecords

    where = write_tfrecords(tmp_path / "tf", shards=4, per_shard=30)
    ds = rt.RecordDataset(tmp_path / "tf", format="tfrecord", batched=True, batch_size=16, with_keys=True,
                          rank=0, world_size=1)
    got = []
    for batch in DataLoader(ds, batch_size=None, num_workers=workers):
        assert isinstance(batch, PackedBatch if workers else list)
        assert 0 < len(batch) <= 16
        for key, t in batch:
            data = bytes(t.numpy())
            shard, offset = where[data]
            assert key == f"{shard}:{offset}"
            got.append(data)
    assert sorted(got) == sorted(where)


@pytest.mark.parametrize("workers", [0, 2])
def test_batched_wds_fields_are_columns(tmp_path, workers):
    from test_records import write_wds

    samples = write_wds(tmp_path / "wds", shards=3, per_shard=20)
    ds = rt.RecordDataset(tmp_path / "wds", format="wds", batched=True, batch_size=8, rank=0, world_size=1)
    got = {}
    for batch in DataLoader(ds, batch_size=None, num_workers=workers):
        assert set(batch) == {"jpg", "cls", "__key__"}
        for i, key in enumerate(batch["__key__"]):
            got[key] = {"jpg": bytes(batch["jpg"][i].numpy()), "cls": bytes(batch["cls"][i].numpy())}
    assert got == samples


def test_batched_records_bad_arguments(tmp_path):
    from test_records import write_tfrecords

    write_tfrecords(tmp_path / "tf", shards=1, per_shard=2)
    with pytest.raises(ValueError, match="positive int"):
        rt.RecordDataset(tmp_path / "tf", batched=True, batch_size=0)
    with pytest.raises(ValueError, match="raw records"):
        rt.RecordDataset(tmp_path / "tf", batched=True, transform=object())


# ---- cache ----------------------------------------------------------------------------------


def test_cache_settings_are_checked_when_made(tmp_path):
    c = ringtier.Cache(1 << 20, policy="clairvoyant")
    assert (c.policy, c.levels, c.capacity_bytes, c.lookahead_epochs) == ("clairvoyant", [("memory", 1 << 20)], 1 << 20, 3)
    assert c.total_epochs is None
    assert ringtier.Cache(1 << 20, policy="clairvoyant", total_epochs=6).total_epochs == 6
    with pytest.raises(ringtier.InvalidInputError, match="number of epochs"):
        ringtier.Cache(1 << 20, policy="clairvoyant", total_epochs=0)
    d = ringtier.Cache(levels=[("memory", 1 << 20), (str(tmp_path / "c"), 4 << 20)], policy="lru")
    assert d.levels == [("memory", 1 << 20), (str(tmp_path / "c"), 4 << 20)]
    with pytest.raises(ringtier.InvalidInputError, match="unknown cache policy"):
        ringtier.Cache(1 << 20, policy="mru")
    with pytest.raises(ringtier.InvalidInputError, match="capacity of 0"):
        ringtier.Cache(0)
    with pytest.raises(ringtier.InvalidInputError, match="needs a capacity"):
        ringtier.Cache(policy="static")
    with pytest.raises(ringtier.InvalidInputError, match="not both"):
        ringtier.Cache(1 << 20, levels=[("memory", 1)])
    with pytest.raises(ringtier.InvalidInputError, match="memory cache level must be the first"):
        ringtier.Cache(levels=[(str(tmp_path), 1 << 20), ("memory", 1 << 20)])
    with pytest.raises(ringtier.InvalidInputError, match="leaves no room"):
        ringtier.Cache(1 << 20, policy="clairvoyant", prefetch_bytes=1 << 20)
    with pytest.raises(TypeError):
        ringtier.Cache("a lot")
    assert ringtier.Cache(policy="none").levels == []
    assert ringtier.Cache(1 << 20).policy == "static", "the Rust default policy"


@pytest.mark.parametrize("policy", ["lru", "static", "clairvoyant"])
def test_a_cache_as_large_as_the_dataset_serves_the_second_epoch(dataset, policy):
    root, files = dataset
    total = sum(len(v) for v in files.values())
    loader = ringtier.Loader(root, batch_size=32, cache=ringtier.Cache(4 * total, policy=policy))
    for epoch in (0, 1):
        got = {}
        keys = loader.keys()
        for batch in loader.epoch(epoch):
            for s in batch:
                got[keys[s.index]] = s.to_bytes()
        assert got == files
        stats = loader.cache_stats()
        assert stats is not None and stats["policy"] == policy
        if epoch == 0:
            first_misses = stats["misses"]
    # The second epoch read nothing from the dataset's tier.
    assert stats["misses"] == first_misses, stats
    assert stats["hits"] >= len(files), stats
    assert stats["levels"][0]["used_bytes"] <= 4 * total


def test_cache_in_a_directory_from_a_dict(dataset, tmp_path):
    root, files = dataset
    total = sum(len(v) for v in files.values())
    cdir = tmp_path / "cache"
    ds = rt.IterableDataset(root, batch_size=64, cache={"capacity": 2 * total, "policy": "lru", "medium": str(cdir)},
                            with_keys=True)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        got = {k: bytes(t.numpy()) for batch in DataLoader(ds, batch_size=None) for k, t in batch}
        assert got == files
    stats = ds.cache_stats()
    # Directory copies are written in the background: one still being written when epoch 2
    # reads it is a miss.
    assert stats["levels"][0]["name"] == "dir" and stats["reuse_hits"] >= 0.9 * len(files), stats
    assert any(cdir.iterdir()), "the directory level holds its copies under the directory"


def test_bad_cache_arguments(dataset, tmp_path):
    root, _ = dataset
    with pytest.raises(TypeError, match="ringtier.Cache or a dict"):
        ringtier.Loader(root, cache=123)
    with pytest.raises(TypeError, match="ringtier.Cache or a dict"):
        rt.IterableDataset(root, cache="lru")
    with pytest.raises(ringtier.InvalidInputError, match="unknown cache policy"):
        rt.IterableDataset(root, cache={"capacity": 1 << 20, "policy": "fifo"})
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    with pytest.raises(ringtier.RingtierError):
        ringtier.Loader(root, cache=ringtier.Cache(1 << 20, medium=str(blocker / "under")))


def test_cache_with_workers(dataset):
    root, files = dataset
    total = sum(len(v) for v in files.values())
    ds = rt.IterableDataset(root, batch_size=16, cache=ringtier.Cache(total, policy="clairvoyant"), with_keys=True)
    got = {k: bytes(t.numpy()) for b in DataLoader(ds, batch_size=None, num_workers=2) for k, t in b}
    assert got == files


# ---- materialisation ------------------------------------------------------------------------


def test_materialize_stores_pixels_and_later_epochs_read_them(tmp_path):
    root = jpeg_dir(tmp_path / "jpg", 10)
    mdir = tmp_path / "mat"
    loader = ringtier.Loader(root, batch_size=4, decode=16, materialize=mdir)
    first = {s.index: s.to_bytes() for b in loader.epoch(0) for s in b}
    loader2 = ringtier.Loader(root, batch_size=4, decode=16, materialize=mdir)
    second = {s.index: s.to_bytes() for b in loader2.epoch(1) for s in b}
    assert first == second, "the stored pixels are the decoded ones (no random step: same bytes)"
    stored = wait_for_files(mdir, 10)
    assert all(p.stat().st_size == 16 * 16 * 3 for p in stored)


def wait_for_files(d: Path, n: int, timeout: float = 20.0) -> list:
    """The stored samples under `d` once there are `n` (they are written in the background)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        got = sorted(d.rglob("*.rgb"))
        if len(got) >= n or time.monotonic() > deadline:
            assert len(got) == n, f"{len(got)} stored samples, {n} expected"
            return got
        time.sleep(0.05)


def test_materialize_size_is_at_least_the_decoded_size(tmp_path):
    root = jpeg_dir(tmp_path / "jpg", 3)
    loader = ringtier.Loader(root, batch_size=3, decode=16, materialize=tmp_path / "m", materialize_size=32)
    assert all(len(s) == 16 * 16 * 3 for b in loader.epoch(0) for s in b)
    assert all(p.stat().st_size == 32 * 32 * 3 for p in wait_for_files(tmp_path / "m", 3))


def test_bad_materialize_arguments(dataset, tmp_path):
    root, _ = dataset
    with pytest.raises(ringtier.InvalidInputError, match="needs decode"):
        ringtier.Loader(root, materialize=tmp_path / "m")
    with pytest.raises(ValueError, match="needs decode"):
        rt.IterableDataset(root, materialize=tmp_path / "m")
    with pytest.raises(ValueError, match="without materialize"):
        rt.IterableDataset(root, decode=16, materialize_size=32)
    jroot = jpeg_dir(tmp_path / "jpg", 2)
    with pytest.raises(ringtier.InvalidInputError, match="smaller than the decoded size"):
        ringtier.Loader(jroot, decode=32, materialize=tmp_path / "m", materialize_size=16)
    with pytest.raises(ringtier.InvalidInputError, match="at least 1 pixel"):
        ringtier.Loader(jroot, decode=32, materialize=tmp_path / "m", materialize_size=0)
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    with pytest.raises(ringtier.RingtierError):
        ringtier.Loader(jroot, decode=16, materialize=blocker)


def test_materialize_with_workers(tmp_path):
    root = jpeg_dir(tmp_path / "jpg", 12)
    ds = rt.IterableDataset(root, decode=16, batch_size=4, materialize=tmp_path / "m", with_keys=True)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        n = sum(len(b) for b in DataLoader(ds, batch_size=None, num_workers=2))
        assert n == 12
    wait_for_files(tmp_path / "m", 12)
