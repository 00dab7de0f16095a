"""``materialize=DIR`` with ``transform=`` (the transform chain's split point), ``cache=`` on the
record datasets, and ``pin_memory=True`` on a CPU-only torch (issue 28)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import ringtier
import ringtier.torch as rt
from ringtier import transforms as T
from test_records import write_tfrecords, write_wds
from test_transforms import write_jpegs
from test_workers_cache import wait_for_files as stored_files

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def by_key(ds: rt.IterableDataset, epoch: int, workers: int = 0) -> Dict[str, torch.Tensor]:
    ds.set_epoch(epoch)
    out: Dict[str, torch.Tensor] = {}
    for keys, images in DataLoader(ds, batch_size=None, num_workers=workers):
        out.update({k: images[i].clone() for i, k in enumerate(keys)})
    return out


def stored_pixels(mdir: Path, side: int, n: int) -> Dict[int, bytes]:
    """Sample index -> its stored split-point pixels (files named by dataset index)."""
    files = stored_files(mdir, n)
    out = {int(p.stem): p.read_bytes() for p in files}
    assert all(len(b) == side * side * 3 for b in out.values())
    return out


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    write_jpegs(root, {"a": 6, "b": 5})
    return root


# ---- materialize= with transform= -----------------------------------------------------------


def test_deterministic_chain_stores_its_crop_and_matches_the_online_result(photos, tmp_path):
    chain = T.Compose([T.Resize(48), T.CenterCrop(32), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)])
    online = by_key(rt.IterableDataset(photos, transform=chain, batch_size=4, with_keys=True), 0)
    mdir = tmp_path / "m"
    ds = rt.IterableDataset(photos, transform=chain, batch_size=4, with_keys=True, materialize=mdir)
    first = by_key(ds, 0)
    stored_files(mdir, 11)
    second = by_key(ds, 1)
    assert first.keys() == online.keys() == second.keys() and len(first) == 11
    for k in online:
        assert first[k].shape == (3, 32, 32) and first[k].dtype == torch.float32
        assert torch.equal(first[k], second[k]), "no random step: every epoch the same pixels"
        # The stored crop is uint8; online the chain resamples in float: at most a level apart.
        levels = ((first[k] - online[k]).abs() * torch.tensor(STD).view(3, 1, 1) * 255).max()
        assert float(levels) <= 1.01, (k, float(levels))
    # The crop itself is stored (32x32, the aspect kept), not the squashed image.
    assert all(p.stat().st_size == 32 * 32 * 3 for p in mdir.rglob("*.rgb"))


def test_random_chain_stores_the_whole_image_and_draws_the_crop_each_epoch(photos, tmp_path):
    chain = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToDtype(torch.uint8)])
    mdir = tmp_path / "m"
    ds = rt.IterableDataset(photos, transform=chain, batch_size=4, with_keys=True, materialize=mdir,
                            materialize_size=40, seed=5)
    e0 = by_key(ds, 0)
    pixels = stored_pixels(mdir, 40, 11)
    e1 = by_key(ds, 1)
    assert len(e0) == len(e1) == len(pixels) == 11
    assert any(not torch.equal(e0[k], e1[k]) for k in e0), "augmentations still vary by epoch"
    # Every epoch (the one that stored them too) is the chain after the split, on the stored
    # pixels, drawn from (seed, epoch, index).
    pipe = T.compile_transform(chain, seed=5, threads=1)
    keys = ringtier.Loader(photos).keys()
    for epoch, got in ((0, e0), (1, e1)):
        for index, px in pixels.items():
            want = pipe.apply_rgb(px, 40, 40, index=index, epoch=epoch)
            t = torch.frombuffer(want, dtype=torch.uint8).view(want.shape)[0]
            assert torch.equal(got[keys[index]], t), (epoch, keys[index])
    # A fresh dataset over the same store repeats epoch 0 exactly.
    again = rt.IterableDataset(photos, transform=chain, batch_size=3, with_keys=True, materialize=mdir,
                               materialize_size=40, seed=5)
    assert all(torch.equal(v, e0[k]) for k, v in by_key(again, 0).items())


def test_later_epochs_read_the_store_not_the_jpegs(photos, tmp_path):
    chain = T.Compose([T.RandomResizedCrop(16), T.ToDtype(torch.float32, scale=True)])
    mdir = tmp_path / "m"
    ds = rt.IterableDataset(photos, transform=chain, batch_size=4, with_keys=True, materialize=mdir)
    assert len(by_key(ds, 0)) == 11
    stored_files(mdir, 11)
    for p in photos.rglob("*.jpg"):  # same sizes, no longer JPEGs
        p.write_bytes(b"\0" * p.stat().st_size)
    fresh = rt.IterableDataset(photos, transform=chain, batch_size=4, with_keys=True, materialize=mdir)
    assert len(by_key(fresh, 1)) == 11, "every sample came from the store"
    online = rt.IterableDataset(photos, transform=chain, batch_size=4, with_keys=True)
    assert len(by_key(online, 1)) == 0, "the JPEGs themselves are gone (skipped as corrupt)"


def test_split_with_workers_stores_every_sample_once(photos, tmp_path):
    chain = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True)])
    mdir = tmp_path / "m"
    ds = rt.IterableDataset(photos, transform=chain, batch_size=3, with_keys=True, materialize=mdir)
    e0 = by_key(ds, 0, workers=2)
    stored_files(mdir, 11)
    e1 = by_key(ds, 1, workers=2)
    assert len(e0) == len(e1) == 11
    # The default stored side is the larger of 256 and the output.
    assert all(p.stat().st_size == 256 * 256 * 3 for p in mdir.rglob("*.rgb"))


def test_image_folder_materializes_the_split_point(photos, tmp_path):
    import torchvision

    chain = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToDtype(torch.uint8)])
    mdir = tmp_path / "m"
    ds = rt.ImageFolder(photos, transform=chain, batch_size=4, seed=2, materialize=mdir, materialize_size=48)
    tv = torchvision.datasets.ImageFolder(str(photos))
    epochs = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        images, labels = zip(*DataLoader(ds, batch_size=None))
        epochs.append(torch.cat(images))
        assert sorted(torch.cat(labels).tolist()) == sorted(tv.targets)
        if epoch == 0:
            assert all(p.stat().st_size == 48 * 48 * 3 for p in stored_files(mdir, 11))
    assert epochs[0].shape == (11, 3, 24, 24) and not torch.equal(epochs[0], epochs[1])
    with pytest.raises(ringtier.InvalidInputError, match="give transform="):
        rt.ImageFolder(photos, materialize=mdir)


def test_split_arguments_are_checked(photos, tmp_path):
    det = T.Compose([T.Resize(48), T.CenterCrop(32)])
    rand = T.Compose([T.RandomResizedCrop(32)])
    with pytest.raises(ringtier.InvalidInputError, match="deterministic up to its crop"):
        next(iter(rt.IterableDataset(photos, transform=det, materialize=tmp_path / "m", materialize_size=64)))
    with pytest.raises(ringtier.InvalidInputError, match="smaller than the transform's output"):
        next(iter(rt.IterableDataset(photos, transform=rand, materialize=tmp_path / "m", materialize_size=16)))
    pipe = T.compile_transform(rand, threads=1)
    with pytest.raises(ringtier.InvalidInputError, match="without materialize"):
        ringtier.Loader(photos, materialize_for=pipe)
    with pytest.raises(ringtier.InvalidInputError, match="leave decode=None"):
        ringtier.Loader(photos, decode=32, materialize=tmp_path / "m", materialize_for=pipe)
    with pytest.raises(ringtier.InvalidInputError, match="stored pixels"):
        pipe.submit([b"\0" * 10], [0], 0, None, pixels=8)
    with pytest.raises(ValueError, match="file datasets"):
        rt.RecordDataset(photos, format="wds", transform=rand, materialize=tmp_path / "m")


# ---- cache= on record datasets --------------------------------------------------------------


def settle(loader, total: int, timeout: float = 20.0) -> dict:
    """The cache's totals once `total` bytes of shards are held and ready (admitted in the
    background: `used_bytes` counts a copy from its reservation, `ready_bytes` once written)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = loader.cache_stats()
        if sum(lv["ready_bytes"] for lv in stats["levels"]) >= total or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


@pytest.mark.parametrize("policy", ["lru", "static", "clairvoyant"])
@pytest.mark.parametrize("fmt", ["tfrecord", "wds"])
def test_a_cache_as_large_as_the_shards_serves_the_second_epoch(tmp_path, policy, fmt):
    root = tmp_path / fmt
    (write_tfrecords if fmt == "tfrecord" else write_wds)(root, 4, 20)
    total = sum(p.stat().st_size for p in root.iterdir())
    loader = ringtier.RecordLoader(root, format=fmt, read_size=1 << 16, cache=ringtier.Cache(2 * total, policy=policy))

    def records(epoch: int) -> List[bytes]:
        return sorted(r.to_bytes() if fmt == "tfrecord" else r.key.encode() + r["jpg"].to_bytes() for r in loader.epoch(epoch))

    first = records(0)
    stats = settle(loader, total)
    assert stats["policy"] == policy and stats["levels"][0]["used_bytes"] == total, stats
    misses = stats["misses"]
    assert records(1) == first and len(first) == 80
    after = loader.cache_stats()
    assert after["misses"] == misses, "the second epoch read nothing from the shards' tier"
    assert after["hits"] > stats["hits"], after


def test_record_dataset_cache_in_a_directory_with_workers(tmp_path):
    root = tmp_path / "tf"
    where = write_tfrecords(root, 4, 20)
    cdir = tmp_path / "cache"
    ds = rt.RecordDataset(
        root, cache={"capacity": 64 << 20, "policy": "lru", "medium": str(cdir)}, read_size=1 << 16, batched=True
    )
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        got = [bytes(t.numpy()) for b in DataLoader(ds, batch_size=None, num_workers=2) for t in b]
        assert sorted(got) == sorted(where)
    assert ds.cache_stats() is None, "the workers' caches are theirs; none in this process"
    ds.set_epoch(2)
    assert sorted(bytes(t.numpy()) for b in ds for t in b) == sorted(where)
    stats = ds.cache_stats()
    assert stats is not None and stats["levels"][0]["name"] == "dir", stats


def test_record_cache_arguments(tmp_path):
    root = tmp_path / "tf"
    write_tfrecords(root, 2, 5)
    with pytest.raises(ringtier.InvalidInputError, match="use static"):
        ringtier.RecordLoader(root, order="global", cache=ringtier.Cache(1 << 20, policy="clairvoyant"))
    loader = ringtier.RecordLoader(root, order="global", cache=ringtier.Cache(1 << 20, policy="static"))
    assert len(list(loader.epoch(0))) == 10
    with pytest.raises(TypeError, match="ringtier.Cache or a dict"):
        rt.RecordDataset(root, cache="lru")
    with pytest.raises(TypeError, match="ringtier.Cache or a dict"):
        ringtier.RecordLoader(root, cache=3)
    assert ringtier.RecordLoader(root).cache_stats() is None
    node = ringtier.Cache(1 << 20, policy="static", node_dir=str(tmp_path / "node"), local_ranks=2)
    with pytest.raises(ringtier.InvalidInputError, match="give its Cache no node_dir"):
        ringtier.RecordLoader(root, cache=node)
    assert not (tmp_path / "node").exists(), "a refused cache leaves nothing behind"


# ---- pin_memory on a CPU-only torch ---------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only path")
def test_pin_memory_without_cuda(photos):
    from ringtier.torch.images import resolve_pin

    chain = T.Compose([T.Resize((16, 16)), T.ToDtype(torch.float32, scale=True)])
    # The default asks torch: no CUDA, no pinning; the pipeline's own buffer, no copy.
    assert resolve_pin(None) is False and resolve_pin(False) is False
    with pytest.raises(ringtier.InvalidInputError, match="needs CUDA"):
        resolve_pin(True)
    ds = rt.IterableDataset(photos, transform=chain, batch_size=4)
    # DataLoader(pin_memory=True) on a CPU-only torch warns and passes batches through as they
    # are: the same tensors, over the pipeline's memory (no second copy).
    with pytest.warns(UserWarning, match="pin_memory"):
        batches = list(DataLoader(ds, batch_size=None, pin_memory=True))
    assert sum(len(b) for b in batches) == 11
    assert all(not b.is_pinned() for b in batches)
    ref = list(DataLoader(rt.IterableDataset(photos, transform=chain, batch_size=4), batch_size=None))
    assert all(torch.equal(a, b) for a, b in zip(batches, ref))
    # Each batch is a view of the pipeline's exported buffer, not a copy the DataLoader made.
    assert all(b.untyped_storage().nbytes() == b.numel() * b.element_size() for b in batches)


def test_pinned_output_is_chosen_when_cuda_is_available_and_written_in_place(photos, monkeypatch):
    """The path a CUDA machine takes, on this one: ``pin_memory=None`` asks CUDA, each batch is
    allocated pinned (here: recorded, then allocated plainly) and decoded into in place; the
    dataset yields that very tensor, so a DataLoader's pin_memory finds it pinned and does not
    copy it again."""
    chain = T.Compose([T.Resize((16, 16)), T.ToDtype(torch.float32, scale=True)])
    made = []
    real_empty = torch.empty

    def empty(*args, pin_memory=False, **kw):
        t = real_empty(*args, **kw)
        if pin_memory:
            made.append(t)
        return t

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "empty", empty)
    batches = list(rt.IterableDataset(photos, transform=chain, batch_size=4))
    assert len(made) == len(batches) == 3
    for out, b in zip(made, batches):
        assert b.data_ptr() == out.data_ptr(), "the batch is the pinned tensor itself, written in place"
    ref = list(rt.IterableDataset(photos, transform=chain, batch_size=4, pin_memory=False))
    assert all(torch.equal(a, b) for a, b in zip(batches, ref))


# ---- lazy read buffers (DataLoader workers) --------------------------------------------------


@pytest.mark.parametrize("engine", ["uring", "posix"])
def test_lazy_pool_reads_every_sample(tmp_path, engine):
    from conftest import write_dataset

    files = write_dataset(tmp_path / "ds", 40)
    eager = ringtier.Loader(tmp_path / "ds", batch_size=8, engine=engine)
    lazy = ringtier.Loader(tmp_path / "ds", batch_size=8, engine=engine, lazy_pool=True)
    assert lazy.pool_buffers == eager.pool_buffers
    for epoch in (0, 1):  # the second epoch reuses buffers the first faulted in
        keys = lazy.keys()
        got = {keys[s.index]: s.to_bytes() for b in lazy.epoch(epoch) for s in b}
        assert got == files


def test_workers_read_every_sample_through_their_lazy_pools(tmp_path, monkeypatch):
    from conftest import write_dataset
    import ringtier.torch.data as data

    made = []
    real = data.Loader

    def spy(*args, **kw):
        made.append(kw.get("lazy_pool"))
        return real(*args, **kw)

    monkeypatch.setattr(data, "Loader", spy)

    files = write_dataset(tmp_path / "ds", 40)
    ds = rt.IterableDataset(tmp_path / "ds", batch_size=8, with_keys=True)
    got = {k: bytes(t.numpy()) for b in DataLoader(ds, batch_size=None, num_workers=2) for k, t in b}
    assert got == files
    assert made == [], "the workers (forked) made their own loaders; this process none"
    next(iter(ds))
    assert made == [False], "outside a worker the pool is faulted in and registered"
