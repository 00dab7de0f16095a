"""ringtier.grain.FileSource under grain: every file exactly once per epoch with its bytes
(grain's threads, its batched-read protocol), shards disjoint and complete, pickling into
workers, errors."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

grain = pytest.importorskip("grain")

import ringtier  # noqa: E402
import ringtier.grain as rg  # noqa: E402


def test_is_a_grain_source_with_batched_reads(dataset):
    root, files = dataset
    from grain._src.python.dataset import base

    src = rg.FileSource(root)
    assert isinstance(src, base.RandomAccessDataSource)
    assert isinstance(src, base.SupportsBatchedReadRandomAccessDataSource)
    assert len(src) == len(files)
    assert src.keys == sorted(files)
    assert "files=300" in repr(src)


def test_every_file_once_per_epoch_through_grain_threads(dataset):
    root, files = dataset
    src = rg.FileSource(root, with_keys=True)
    ds = grain.MapDataset.source(src).shuffle(seed=3).to_iter_dataset(grain.ReadOptions(num_threads=16))
    for _ in range(2):  # two epochs
        seen = {}
        for key, data in ds:
            assert key not in seen
            assert isinstance(data, np.ndarray) and data.dtype == np.uint8
            seen[key] = data.tobytes()
        assert seen == files


def test_batched_reads_keep_order_and_duplicates(dataset):
    root, files = dataset
    src = rg.FileSource(root)
    idx = [5, 0, 299, 5, 17]
    got = src._getitems(idx)
    assert [g.tobytes() for g in got] == [files[src.keys[i]] for i in idx]
    assert src[-1].tobytes() == files[src.keys[-1]]
    with pytest.raises(IndexError):
        src[300]


def test_concurrent_getitem_is_coalesced_and_exact(dataset):
    root, files = dataset
    src = rg.FileSource(root, max_batch=16)
    reads = []
    real_read = src._read_each  # what a batch of coalesced requests reads through

    def counting(keys):
        reads.append(len(keys))
        return real_read(keys)

    src._read_each = counting  # type: ignore[method-assign]
    out = [None] * len(src)

    def worker(lo: int) -> None:
        for i in range(lo, len(src), 12):
            out[i] = src[i].tobytes()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [files[k] for k in src.keys]
    assert sum(reads) == len(src) and max(reads) <= 16


def test_reads_in_flight_bounds_concurrent_batched_reads(dataset):
    root, files = dataset
    src = rg.FileSource(root, max_batch=8, reads_in_flight=2)
    lock = threading.Lock()
    running, most, reads = [0], [0], []
    real_read = src._read_each

    def slow(keys):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            threading.Event().wait(0.002)  # a read long enough for requests to pile up
            return real_read(keys)
        finally:
            with lock:
                running[0] -= 1
                reads.append(len(keys))

    src._read_each = slow  # type: ignore[method-assign]
    out = [None] * len(src)

    def worker(lo: int) -> None:
        for i in range(lo, len(src), 16):
            out[i] = src[i].tobytes()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [files[k] for k in src.keys]
    assert sum(reads) == len(src) and max(reads) <= 8
    assert most[0] == 2, most  # two batched reads overlapped, never three
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="reads_in_flight"):
            rg.FileSource(root, reads_in_flight=bad)


def test_shards_are_disjoint_and_complete(dataset):
    root, files = dataset
    shards = [rg.FileSource(root, shard_index=i, shard_count=4) for i in range(4)]
    keys = [k for s in shards for k in s.keys]
    assert len(keys) == len(set(keys)) == len(files)
    assert {len(s) for s in shards} == {75}
    via_grain = []
    for s in shards:
        via_grain += [d.tobytes() for d in grain.MapDataset.source(s)]
    assert sorted(via_grain) == sorted(files.values())
    with pytest.raises(ValueError):
        rg.FileSource(root, shard_index=4, shard_count=4)
    with pytest.raises(ValueError):
        rg.FileSource(root, shard_index=1)


def test_pickles_for_grain_workers(dataset):
    root, files = dataset
    src = rg.FileSource(root, keys=sorted(files)[:10], with_keys=True)
    src[0]
    copy = pickle.loads(pickle.dumps(src))
    assert copy.keys == src.keys and copy[3][0] == src.keys[3]
    assert copy[3][1].tobytes() == files[src.keys[3]]


def test_a_missing_file_raises(dataset):
    root, files = dataset
    src = rg.FileSource(root, keys=["d0/f00000.bin", "d0/nope.bin"])
    assert src[0].tobytes() == files["d0/f00000.bin"]
    with pytest.raises(ringtier.RingtierError):
        src[1]
    # A failed read does not wedge the next ones.
    assert src[0].tobytes() == files["d0/f00000.bin"]


def test_a_missing_file_fails_only_its_own_request_in_a_coalesced_batch(dataset):
    """Requests coalesced into one batched read: the one whose file is gone raises, the others
    get their files (one bad file never fails the batch)."""
    from ringtier.grain import _Slot

    root, files = dataset
    keys = ["d0/f00000.bin", "d0/nope.bin", "d0/f00003.bin"]
    src = rg.FileSource(root, keys=keys, max_batch=8)
    slots = [_Slot(k) for k in keys]
    src._pending.extend(slots)  # three requests waiting together, as __getitem__ leaves them
    src._leaders = 1
    src._lead()
    assert all(s.done for s in slots) and src._leaders == 0
    assert slots[0].error is None and slots[0].value.tobytes() == files["d0/f00000.bin"]
    assert isinstance(slots[1].error, ringtier.NotFoundError), slots[1].error
    assert slots[2].error is None and slots[2].value.tobytes() == files["d0/f00003.bin"]
    with pytest.raises(ringtier.NotFoundError):  # the batched protocol raises for the bad file
        src._getitems([0, 1, 2])


def test_one_reader_per_process_and_a_forked_child_makes_its_own(dataset):
    import os

    root, files = dataset
    src = rg.FileSource(root, max_batch=4)
    assert src[0].tobytes() == files[src.keys[0]]
    reader = src.file_reader()
    src._getitems(list(range(10)))
    assert src.file_reader() is reader, "every read of a process through one reader"
    assert reader.buffer_size >= max(len(v) for v in files.values())
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # the inherited reader has no I/O threads here: the source makes a new one
        ok = False
        try:
            ok = src[5].tobytes() == files[src.keys[5]] and src.file_reader() is not reader
        finally:
            os.write(wr, b"1" if ok else b"0")
            os._exit(0)
    os.close(wr)
    with os.fdopen(rd, "rb") as f:
        got = f.read()
    os.waitpid(pid, 0)
    assert got == b"1"
    assert src[5].tobytes() == files[src.keys[5]]


# -- FileDataset: a grain IterDataset over the loader --------------------------------------


def _epoch_of(it, n=None):
    out = []
    for x in it:
        out.append(x)
        if n is not None and len(out) == n:
            break
    return out


def test_file_dataset_is_a_grain_iter_dataset_every_file_once_per_epoch(dataset):
    root, files = dataset
    ds = rg.FileDataset(root, seed=5, num_epochs=2, with_keys=True, read_batch=32)
    assert isinstance(ds, grain.IterDataset)
    assert "shard=0/1" in repr(ds)
    got = list(ds)
    assert len(got) == 2 * len(files)
    first, second = got[: len(files)], got[len(files) :]
    for epoch in (first, second):
        seen = {}
        for key, data in epoch:
            assert isinstance(data, np.ndarray) and data.dtype == np.uint8
            assert key not in seen
            seen[key] = data.tobytes()
        assert seen == files
    assert [k for k, _ in first] != [k for k, _ in second], "each epoch reshuffled"
    again = [k for k, _ in rg.FileDataset(root, seed=5, with_keys=True, read_batch=7)]
    assert again == [k for k, _ in first], "the order is the seed's, whatever the read batch"
    unshuffled = [k for k, _ in rg.FileDataset(root, shuffle=False, with_keys=True)]
    assert unshuffled == sorted(files)


def test_file_dataset_under_grain_transformations(dataset):
    root, files = dataset
    ds = rg.FileDataset(root, seed=1).map(lambda a: np.int64(a.size)).batch(64)
    sizes = np.concatenate(list(ds))
    assert sorted(sizes.tolist()) == sorted(len(v) for v in files.values())


def test_file_dataset_shards_and_grain_worker_slices_are_disjoint_and_complete(dataset):
    root, files = dataset
    keys = []
    for i in range(3):
        keys += [k for k, _ in rg.FileDataset(root, shard_index=i, shard_count=3, with_keys=True)]
    assert sorted(keys) == sorted(files)
    # grain's mp_prefetch slices the dataset in place, slice(i, None, n) per worker.
    import copy

    halves = []
    for i in range(2):
        part = copy.deepcopy(rg.FileDataset(root, shard_index=1, shard_count=2, with_keys=True))
        part.set_slice(slice(i, None, 2))
        halves.append([k for k, _ in part])
    whole = [k for k, _ in rg.FileDataset(root, shard_index=1, shard_count=2, with_keys=True)]
    assert not set(halves[0]) & set(halves[1])
    assert sorted(halves[0] + halves[1]) == sorted(whole)
    with pytest.raises(ValueError, match="slice"):
        rg.FileDataset(root).set_slice(slice(0, 10, 2))


def test_file_dataset_through_grain_worker_processes(dataset):
    root, files = dataset
    ds = rg.FileDataset(root, seed=2, with_keys=True).map(lambda kv: (kv[0], kv[1].tobytes()))
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
    got = dict(ds)
    assert got == files


def test_file_dataset_checkpoint_resumes_exactly(dataset):
    root, files = dataset
    ds = rg.FileDataset(root, seed=9, num_epochs=2, with_keys=True, read_batch=16)
    full = [k for k, _ in ds]
    for cut in (0, 1, 15, 16, 17, 299, 300, 301, 450, 599):
        it = iter(ds)
        head = [k for k, _ in _epoch_of(it, cut)] if cut else []
        state = it.get_state()
        resumed = iter(ds)
        resumed.set_state(state)
        assert resumed.get_state() == state
        tail = [k for k, _ in resumed]
        assert head + tail == full, cut
    it = iter(ds)
    with pytest.raises(ValueError, match="state"):
        it.set_state({"epoch": 0})
    with pytest.raises(ValueError, match="state"):
        it.set_state({"epoch": 0, "position": -1, "given": 0})


def test_file_dataset_checkpoints_with_grains_own_iterator_state(dataset):
    """The state goes through grain's pipeline (map, batch) and back."""
    root, files = dataset
    ds = rg.FileDataset(root, seed=4, read_batch=10).map(lambda a: a.tobytes()).batch(8, batch_fn=list)
    it = iter(ds)
    for _ in range(5):
        next(it)
    state = it.get_state()
    rest = [b for batch in it for b in batch]
    it2 = iter(ds)
    it2.set_state(state)
    assert [b for batch in it2 for b in batch] == rest


def test_file_dataset_skips_or_fails_on_a_file_removed_after_listing(dataset):
    root, files = dataset
    ds = rg.FileDataset(root, seed=0, with_keys=True, read_batch=16, prefetch=0)
    strict = rg.FileDataset(root, seed=0, with_keys=True, read_batch=16, prefetch=0, on_bad="fail")
    it, it_strict = iter(ds), iter(strict)
    first = [k for k, _ in _epoch_of(it, 16)]  # the first read batch, handed out whole
    next(it_strict)  # the same first batch read on the strict side
    gone = next(k for k in sorted(files) if k not in first)
    (root / gone).unlink()
    keys = first + [k for k, _ in it]
    assert gone not in keys and sorted(keys) == sorted(k for k in files if k != gone)
    with pytest.raises(ringtier.RingtierError, match=gone.split("/")[-1]):
        list(it_strict)


def test_file_dataset_refuses_bad_arguments(dataset, tmp_path):
    root, _ = dataset
    with pytest.raises(ringtier.NotFoundError):
        rg.FileDataset(tmp_path / "nope")
    for kw in ({"shard_index": 3, "shard_count": 3}, {"shard_index": 0}, {"num_epochs": 0}, {"read_batch": 0},
               {"hold": 0}, {"prefetch": -1}, {"on_bad": "ignore"}, {"num_epochs": True}):
        with pytest.raises(ValueError):
            rg.FileDataset(root, **kw)
    with pytest.raises(TypeError):
        rg.FileDataset(root, seed="0")


def test_file_dataset_pickles_and_holding_every_buffer_raises_not_hangs(dataset):
    root, files = dataset
    ds = rg.FileDataset(root, seed=3, with_keys=True)
    copy = pickle.loads(pickle.dumps(ds))
    assert type(copy) is type(ds) and dict((k, v.tobytes()) for k, v in copy) == files
    small = rg.FileDataset(root, read_batch=8, hold=4)
    kept = []
    with pytest.raises(ringtier.PoolExhaustedError):
        for a in small:
            kept.append(a)  # never dropped: the pool runs dry
