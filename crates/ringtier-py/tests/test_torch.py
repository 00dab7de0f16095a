"""ringtier.torch.IterableDataset under DataLoader workers, and the distributed store on one
process (world size 1) and with explicit ranks."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils.data import DataLoader

import ringtier
import ringtier.torch as rt


@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_once_per_epoch_across_workers(dataset, workers):
    root, files = dataset
    # One sample at a time without workers; batches (packed) across them.
    if workers:
        ds = rt.IterableDataset(root, batch_size=16, seed=4, with_keys=True)
    else:
        ds = rt.IterableDataset(root, read_batch=16, seed=4, with_keys=True)
    dl = DataLoader(ds, batch_size=None, num_workers=workers)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        seen = collections.Counter()
        for key, t in (item for batch in dl for item in batch) if workers else dl:
            assert isinstance(t, torch.Tensor) and t.dtype == torch.uint8
            assert bytes(t.numpy()) == files[key]
            seen[key] += 1
        assert seen == collections.Counter(list(files)), f"epoch {epoch}"


def test_one_sample_at_a_time_across_workers_is_refused_saying_what_to_write(dataset):
    root, files = dataset
    ds = rt.IterableDataset(root, read_batch=16)
    with pytest.raises(ringtier.InvalidInputError) as e:
        list(DataLoader(ds, batch_size=None, num_workers=2))
    msg = str(e.value)
    assert "yields one sample at a time" in msg and "batch_size=256" in msg and "num_workers=0" in msg, msg
    # The DataLoader batching in its workers crosses once per batch: allowed.
    got = [b for batch in DataLoader(ds, batch_size=8, num_workers=2, collate_fn=list) for b in batch]
    assert sorted(bytes(t.numpy()) for t in got) == sorted(files.values())


def test_empty_samples_are_empty_tensors(tmp_path):
    files = {f"f{i}": bytes([i]) * (i % 3) for i in range(10)}  # every third file empty
    for k, v in files.items():
        (tmp_path / k).write_bytes(v)
    ds = rt.IterableDataset(tmp_path, batch_size=4, with_keys=True)
    got = {k: t for batch in DataLoader(ds, batch_size=None) for k, t in batch}
    assert set(got) == set(files)
    for k, t in got.items():
        assert t.dtype == torch.uint8 and bytes(t.numpy()) == files[k], k


def test_ranks_times_workers_partition(dataset):
    root, files = dataset
    seen = collections.Counter()
    for rank in range(2):
        ds = rt.IterableDataset(root, batch_size=8, rank=rank, world_size=2, with_keys=True)
        for batch in DataLoader(ds, batch_size=None, num_workers=2):
            assert len(batch) <= 8
            seen.update(k for k, _ in batch)
    assert seen == collections.Counter(list(files))


def test_zero_copy_without_workers(dataset):
    root, _ = dataset
    ds = rt.IterableDataset(root, read_batch=8)
    it = iter(ds)
    t = next(it)
    loader = ds.loader()
    assert loader.held == 8  # the batch being yielded from, the tensor's buffer among them
    it.close()
    assert loader.held >= 1, "the tensor keeps its pooled buffer"
    del t
    import gc

    gc.collect()
    assert loader.held == 0


def test_decoded_batches_collate(tmp_path):
    import shutil

    from conftest import DATA

    for i in range(6):
        shutil.copy(DATA / "tiny.jpg", tmp_path / f"{i}.jpg")
    ds = rt.IterableDataset(tmp_path, decode=16, read_batch=3)
    batches = list(DataLoader(ds, batch_size=3, num_workers=0))
    assert [tuple(b.shape) for b in batches] == [(3, 16, 16, 3), (3, 16, 16, 3)]


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        rt.IterableDataset(tmp_path / "nope")
    with pytest.raises(ValueError, match="both rank and world_size"):
        rt.IterableDataset(tmp_path, rank=0)


def test_distributed_store_on_one_rank(tiers):
    store = rt.DistributedCheckpointStore(tiers, rank=0, world_size=1)
    assert store.latest() is None and store.load() is None
    store.save(1, {"w": torch.arange(4)})
    assert store.latest() == 1
    assert torch.equal(store.load()["w"], torch.arange(4))
    store.close()
    # A job of another size refuses it.
    other = rt.DistributedCheckpointStore(tiers, rank=0, world_size=1, prefix="ckpt")
    other.world_size = 2
    with pytest.raises(ValueError, match="saved by 1 ranks; this job has 2"):
        other.load(1)
    with pytest.raises(ValueError, match="not committed"):
        other.load(9)
    other.close()


def test_distributed_async_save_on_one_rank(tiers):
    store = rt.DistributedCheckpointStore(tiers, rank=0, world_size=1)
    state = {"w": torch.arange(1 << 16, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)}
    want = {k: v.clone() for k, v in state.items()}
    fut = store.async_save(1, state)
    state["w"].zero_()  # the staging copy was taken: the change is not saved
    assert fut.step == 1
    fut._local.result(timeout=60)  # this rank's shard durable ...
    assert fut.done() and store.latest() is None, "... but the step is committed only by result()"
    report = fut.result(timeout=60)
    assert report["ok"] and report["step"] == 1 and report["bytes"] > 0 and report["commit_seconds"] >= 0
    assert fut.done() and fut.result() is report
    assert store.latest() == 1
    got = store.load(1)
    assert all(torch.equal(got[k], want[k]) for k in want)
    # A failed save (the step exists) raises from result(), every time, and commits nothing.
    again = store.async_save(1, state)
    for _ in range(2):
        with pytest.raises(Exception, match="1"):
            again.result(timeout=60)
    assert [c["step"] for c in store.list()] == [1]
    store.close()


def test_distributed_store_loads_a_step_committed_before_the_group_manifest(tmp_path):
    """A step whose global manifest is the earlier format (a `{"world": ...}` state in the
    global store, as DistributedCheckpointStore wrote it before the group commit) still loads,
    with its world size checked."""
    import torch

    from ringtier.torch import CheckpointStore, DistributedCheckpointStore

    tiers = [str(tmp_path / "fast"), str(tmp_path / "slow")]
    shard = {"w": torch.arange(10, dtype=torch.float32)}
    CheckpointStore(tiers, prefix="ckpt/rank00000", create=True).save(5, shard)
    world = {"step": 5, "world_size": 1, "ranks": [{"rank": 0, "bytes": 40}]}
    CheckpointStore(tiers, prefix="ckpt/global", create=True).save(5, {"world": world})
    store = DistributedCheckpointStore(tiers, rank=0, world_size=1)
    assert torch.equal(store.load(5)["w"], shard["w"])
    assert store.latest() == 5
