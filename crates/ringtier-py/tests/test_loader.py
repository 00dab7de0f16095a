"""ringtier.Loader: every sample once, zero-copy buffers, the pool, sharding, resume, errors."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import shutil
import time

import numpy as np
import pytest

import ringtier
from conftest import DATA, write_manifest


def read_epoch(loader, epoch=0, position=0):
    out = []
    for batch in loader.epoch(epoch, position):
        for s in batch:
            out.append((s.key, s.to_bytes()))
    return out


def test_every_sample_once_with_the_files_bytes(dataset):
    root, files = dataset
    loader = ringtier.Loader(root, batch_size=16, seed=3)
    assert len(loader) == len(files)
    got = read_epoch(loader)
    assert sorted(k for k, _ in got) == sorted(files)
    for k, data in got:
        assert data == files[k], k


def test_samples_are_writable_views_of_the_pooled_buffer(dataset):
    torch = pytest.importorskip("torch")

    root, files = dataset
    loader = ringtier.Loader(root, batch_size=8)
    batch = next(iter(loader.epoch(0)))
    s = batch[0]
    a = np.frombuffer(s, dtype=np.uint8)
    t = torch.frombuffer(s, dtype=torch.uint8)
    assert a.flags.writeable
    assert bytes(a) == files[s.key]
    old = int(a[0])
    a[0] = (old + 1) % 256
    assert int(t[0]) == a[0], "numpy and torch see the same memory"
    assert s.to_bytes()[0] == a[0]
    assert a.ctypes.data == t.data_ptr(), "no copy"


def test_buffers_return_to_the_pool_when_python_lets_go(dataset):
    root, _ = dataset
    loader = ringtier.Loader(root, batch_size=8, prefetch=1)
    epoch = loader.epoch(0)
    batch = next(epoch)
    assert loader.held == len(batch)
    s = batch[0]
    view = np.frombuffer(s, dtype=np.uint8)
    with pytest.raises(BufferError):
        s.release()
    del view
    s.release()
    assert s.released
    assert loader.held == len(batch) - 1
    with pytest.raises(ringtier.ClosedError):
        s.to_bytes()
    del batch, s
    gc.collect()
    assert loader.held == 0


def test_holding_more_than_the_pool_is_an_error_not_a_hang(dataset):
    root, _ = dataset
    loader = ringtier.Loader(root, batch_size=8, prefetch=1, hold=4)
    kept = []
    t0 = time.monotonic()
    with pytest.raises(ringtier.PoolExhaustedError, match="Python holds"):
        for batch in loader.epoch(0):
            kept.extend(batch)
    assert time.monotonic() - t0 < 10
    assert len(kept) <= loader.pool_buffers
    # Letting go makes the loader usable again.
    kept.clear()
    gc.collect()
    assert len(read_epoch(loader)) == len(loader)


def test_copies_do_not_hold_buffers(dataset):
    root, files = dataset
    loader = ringtier.Loader(root, batch_size=8, prefetch=1, hold=0)
    kept = [np.array(s) for batch in loader.epoch(0) for s in batch]
    assert len(kept) == len(files)


def test_ranks_partition_the_epoch(dataset):
    root, files = dataset
    seen = []
    for rank in range(3):
        loader = ringtier.Loader(root, batch_size=10, rank=rank, world_size=3, seed=5)
        keys = [k for k, _ in read_epoch(loader, epoch=2)]
        assert len(keys) == len(loader)
        seen.extend(keys)
    assert sorted(seen) == sorted(files)


def test_seeded_shuffle(dataset):
    root, _ = dataset
    a = [k for k, _ in read_epoch(ringtier.Loader(root, batch_size=32, seed=9), epoch=1)]
    b = [k for k, _ in read_epoch(ringtier.Loader(root, batch_size=7, seed=9), epoch=1)]
    c = [k for k, _ in read_epoch(ringtier.Loader(root, batch_size=32, seed=9), epoch=2)]
    plain = [k for k, _ in read_epoch(ringtier.Loader(root, batch_size=32, shuffle=False))]
    assert a == b
    assert a != c
    assert plain == sorted(plain)


def test_resume_mid_epoch(dataset):
    root, _ = dataset
    loader = ringtier.Loader(root, batch_size=10, seed=1)
    full = [k for k, _ in read_epoch(loader, epoch=4)]
    epoch = loader.epoch(4)
    for _ in range(7):
        next(epoch)
    pos = epoch.position
    assert pos == 70
    rest = [k for k, _ in read_epoch(loader, epoch=4, position=pos)]
    assert rest == full[pos:]
    with pytest.raises(ValueError, match="past the end"):
        loader.epoch(4, len(full) + 1)


def test_manifest_keys_stats_and_verify(tmp_path):
    root = tmp_path / "gen"
    root.mkdir()
    files = {f"s{i}.bin": os.urandom(100 + i) for i in range(20)}
    for k, v in files.items():
        (root / k).write_bytes(v)
    shutil.copy(DATA / "tiny.jpg", root / "not-in-manifest.jpg")
    manifest = write_manifest(root, files)
    # The manifest (given as its file) lists the samples: the extra file is not one.
    loader = ringtier.Loader(manifest, batch_size=5, shuffle=False)
    epoch = loader.epoch(0)
    got = [(s.key, s.to_bytes()) for b in epoch for s in b]
    assert dict(got) == files
    stats = epoch.stats()
    assert stats["samples"] == 20 and stats["bytes"] == sum(map(len, files.values()))
    # verify=True checks CRC-32C: a file changed in place (same size) is skipped and named.
    (root / "s3.bin").write_bytes(bytes(103))
    skipped = [why for b in ringtier.Loader(root, batch_size=5, verify=True).epoch(0) for why in b.skipped]
    assert len(skipped) == 1 and "s3.bin" in skipped[0] and "checksum" in skipped[0]
    # keys= reads only those.
    some = sorted(files)[:4]
    assert sorted(k for k, _ in read_epoch(ringtier.Loader(root, keys=some))) == some


def test_decoded_images(tmp_path):
    root = tmp_path / "img"
    root.mkdir()
    for i in range(5):
        shutil.copy(DATA / "tiny.jpg", root / f"i{i}.jpg")
    (root / "bad.jpg").write_bytes(b"not a jpeg")
    loader = ringtier.Loader(root, batch_size=3, decode=32)
    samples = [s for b in loader.epoch(0) for s in b]
    assert len(samples) == 5
    for s in samples:
        assert s.shape == (32, 32, 3)
        assert len(s) == 32 * 32 * 3
        img = np.frombuffer(s, np.uint8).reshape(s.shape)
        assert img.std() > 0
    with pytest.raises(ringtier.CorruptError, match="bad.jpg"):
        for _ in ringtier.Loader(root, batch_size=3, decode=32, on_bad="fail").epoch(0):
            pass


def test_bad_input(tmp_path, dataset):
    root, _ = dataset
    missing = tmp_path / "missing"
    for exc in (FileNotFoundError, ValueError, ringtier.NotFoundError):
        with pytest.raises(exc, match="does not exist"):
            ringtier.Loader(missing)
    with pytest.raises(ValueError, match="engine"):
        ringtier.Loader(root, engine="nope")
    with pytest.raises(ValueError, match="rank"):
        ringtier.Loader(root, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch size"):
        ringtier.Loader(root, batch_size=0)
    with pytest.raises(TypeError):
        ringtier.Loader(root, batch_size="8")
    with pytest.raises(ringtier.NotFoundError):
        ringtier.Dataset(missing)


def test_posix_engine(dataset):
    root, files = dataset
    got = read_epoch(ringtier.Loader(root, batch_size=16, engine="posix"))
    assert dict(got) == files


def _child_uses_inherited(loader, q):
    try:
        loader.epoch(0)
        q.put("no error")
    except ringtier.ForkError as e:
        # A loader created here works.
        fresh = ringtier.Loader(loader_root, batch_size=16)
        n = sum(len(b) for b in fresh.epoch(0))
        q.put(f"ForkError {n}: {e}")


loader_root = None


def test_an_engine_inherited_through_fork_raises(dataset):
    global loader_root
    root, files = dataset
    loader_root = str(root)
    loader = ringtier.Loader(root, batch_size=16)
    next(iter(loader.epoch(0)))  # the engine's threads are running
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_uses_inherited, args=(loader, q))
    p.start()
    msg = q.get(timeout=60)
    p.join(timeout=60)
    assert msg.startswith(f"ForkError {len(files)}:"), msg
    assert "inherited through fork()" in msg
    assert "create it in the process that uses it" in msg.lower()
    # The parent's loader still works.
    assert len(read_epoch(loader)) == len(files)


def test_ctrl_c_while_waiting_for_a_batch(dataset, sigint_raises):
    """A wait for a batch runs Python's signal handlers: SIGINT raises KeyboardInterrupt at
    once (here the reader is blocked on a full pool, a wait that would otherwise end in
    PoolExhaustedError after half a second), and the epoch goes on afterwards."""
    import signal
    import threading

    root, files = dataset
    loader = ringtier.Loader(root, batch_size=8, prefetch=1, hold=0)
    epoch = loader.epoch(0)
    kept = []
    while loader.held + 8 <= loader.pool_buffers:
        kept.extend(next(epoch))
    sent = []

    def interrupt():
        time.sleep(0.05)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt).start()
    with pytest.raises(KeyboardInterrupt):
        try:
            while True:
                kept.extend(next(epoch))
        finally:
            caught = time.monotonic()
    assert caught - sent[0] < 1.0, f"KeyboardInterrupt after {caught - sent[0]:.3f} s"
    n = len(kept)
    kept.clear()
    gc.collect()
    rest = sum(len(b) for b in epoch)
    assert n + rest == len(files), "the interrupted wait lost no batch"
