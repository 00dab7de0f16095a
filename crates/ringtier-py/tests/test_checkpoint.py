"""ringtier.CheckpointStore from Python: state dicts round-trip byte-identical, async saves,
in-place loads, the burst buffer's tiers, Ctrl-C, bad input."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

import ringtier


def model_state():
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10)
    )
    net[3].to(torch.bfloat16)
    sd = net.state_dict()
    return {
        "model": sd,
        "transposed": torch.arange(24, dtype=torch.float64).reshape(4, 6).t(),  # not contiguous
        "strided": torch.arange(100, dtype=torch.int16)[::3],
        "empty": torch.empty(0, 5, dtype=torch.float16),
        "scalar": torch.tensor(3.5),
        "bools": torch.tensor([True, False, True]),
        "complex": torch.randn(3, dtype=torch.complex64),
        "nested": {"a": {"b": {"c": torch.ones(2, 2, dtype=torch.int8)}}, "empty": {}},
        "array": np.arange(12, dtype=np.float32).reshape(3, 4),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
        "npscalar": np.float64(2.25),
        "structured": np.array([(1, 2.0)], dtype=[("x", "<i4"), ("y", "<f8")]),
        "blob": b"\x00\x01binary",
        "mutable": bytearray(b"abc"),
        "step": 7,
        "lr": 1e-3,
        "name": "run-1",
        "flags": [True, None, (1, 2)],
    }


def assert_same(a, b, path="state"):
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), f"{path}: {type(a)} vs {type(b)}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys/order differ"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.contiguous().view(-1).view(torch.uint8).tolist() == b.contiguous().view(-1).view(torch.uint8).tolist() if a.numel() else True, path
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def test_state_dict_round_trips_byte_identical(tiers):
    state = model_state()
    with ringtier.CheckpointStore(tiers) as store:
        report = store.save(10, state)
        assert report["step"] == 10 and report["tier"].endswith("fast") and not report["wrote_through"]
        back = store.load(10)
    assert_same(state, back)
    assert isinstance(back["model"], OrderedDict)
    assert back["model"]._metadata == state["model"]._metadata
    # The loaded tensors are writable and a model accepts them.
    back["transposed"][0, 0] = 99.0
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10)
    )
    net[3].to(torch.bfloat16)
    net.load_state_dict(back["model"])


def test_load_in_place(tiers):
    state = model_state()
    with ringtier.CheckpointStore(tiers) as store:
        store.save(1, state)
        target = model_state()
        for t in target["model"].values():
            t.zero_()
        target["array"][:] = 0
        ptrs = {k: t.data_ptr() for k, t in target["model"].items()}
        out = store.load(1, into=target)
        assert out is target
        assert_same(state, target)
        assert {k: t.data_ptr() for k, t in target["model"].items()} == ptrs, "filled in place"
        wrong = model_state()
        wrong["model"]["0.weight"] = torch.zeros(1)
        with pytest.raises(ValueError, match="0.weight"):
            store.load(1, into=wrong)
        missing = model_state()
        del missing["lr"]
        with pytest.raises(ValueError, match="lr"):
            store.load(1, into=missing)


def test_async_save_takes_a_copy(tiers):
    w = torch.arange(1_000_000, dtype=torch.float32)
    with ringtier.CheckpointStore(tiers) as store:
        fut = store.async_save(5, {"w": w})
        w.fill_(-1)  # allowed as soon as async_save returned
        report = fut.result(timeout=60)
        assert fut.done() and report["step"] == 5
        assert torch.equal(store.load(5)["w"], torch.arange(1_000_000, dtype=torch.float32))
        # The staging buffer is reused; a failing save reports through the future.
        fut = store.async_save(5, {"w": w})
        with pytest.raises(ringtier.RingtierError, match="already exists"):
            fut.result(timeout=60)


def test_list_latest_verify_drain_and_fallback(tiers):
    with ringtier.CheckpointStore(tiers, keep_last=1) as store:
        assert store.latest() is None and store.load() is None
        for step in (1, 2, 3):
            store.save(step, {"x": torch.full((1000,), float(step))})
        store.drain()
        stats = store.drain_stats()
        assert stats["checkpoints"] == 3 and stats["backlog_bytes"] == 0
        listed = store.list()
        assert [c["step"] for c in listed] == [1, 2, 3]
        assert len(listed[-1]["tiers"]) == 2 and len(listed[0]["tiers"]) == 1  # evicted from fast
        assert store.latest() == 3
        assert [err for _, err in store.verify(3)] == [None, None]
        assert torch.equal(store.load()["x"], torch.full((1000,), 3.0))
    # Corrupt the fast copy: verify names it, load falls back to the slow one.
    part = next(Path(tiers[0]).rglob("00000000000000000003/parts/tensors"))
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    with ringtier.CheckpointStore(tiers, keep_last=1) as store:
        errs = dict(store.verify(3))
        assert errs[next(iter(errs))] is not None and "checksum" in errs[next(iter(errs))]
        assert torch.equal(store.load(3)["x"], torch.full((1000,), 3.0))


def test_one_writer_and_read_only(tiers):
    with ringtier.CheckpointStore(tiers) as store:
        store.save(1, {"a": b"x"})
        with pytest.raises(ringtier.BusyError, match="open elsewhere"):
            ringtier.CheckpointStore(tiers)
        ro = ringtier.CheckpointStore(tiers, read_only=True)
        assert ro.latest() == 1 and ro.load(1)["a"] == b"x"
        with pytest.raises(ringtier.UnsupportedError, match="read-only"):
            ro.save(2, {"a": b"y"})
        ro.close()


def test_bad_input(tiers, tmp_path):
    store = ringtier.CheckpointStore(tiers)
    with pytest.raises(TypeError, match="neither a tensor, a numpy array nor bytes"):
        store.save(1, {"obj": object()})
    with pytest.raises(TypeError, match="neither a tensor"):
        store.save(1, {"set": {1, 2}})
    with pytest.raises(TypeError, match="must be strings"):
        store.save(1, {"state": {0: torch.zeros(1)}})
    with pytest.raises(TypeError, match="must be a dict"):
        store.save(1, [torch.zeros(1)])
    with pytest.raises(TypeError, match="numpy arrays of Python objects"):
        store.save(1, {"o": np.array([object()])})
    with pytest.raises(ValueError, match="negative"):
        store.save(-1, {})
    with pytest.raises(TypeError, match="step must be an int"):
        store.save("1", {})
    assert store.latest() is None, "nothing was written by the failed saves"
    with pytest.raises(ringtier.NotFoundError):
        store.load(42)
    store.close()
    store.close()
    assert store.closed
    for call in (lambda: store.save(1, {}), lambda: store.load(1), store.list, store.latest, store.drain):
        with pytest.raises(ValueError, match="closed"):
            call()
    for exc in (FileNotFoundError, ValueError):
        with pytest.raises(exc, match="does not exist"):
            ringtier.CheckpointStore([tmp_path / "nope", tiers[1]])
    with pytest.raises(TypeError, match="list of directories"):
        ringtier.CheckpointStore(tiers[0])
    with pytest.raises(ValueError, match="on_full"):
        ringtier.CheckpointStore(tiers, on_full="never")
    created = ringtier.CheckpointStore([tmp_path / "new-fast", tmp_path / "new-slow"], create=True)
    created.save(1, {"a": b"1"})
    created.close()


def test_ctrl_c_during_a_long_save_raises_promptly_and_leaves_nothing(tiers, sigint_raises):
    big = {"w": torch.ones(768 << 20, dtype=torch.uint8)}  # 768 MiB
    store = ringtier.CheckpointStore(tiers)
    raised_at = []

    def interrupt():
        time.sleep(0.05)
        raised_at.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt).start()
    with pytest.raises(KeyboardInterrupt):
        try:
            store.save(1, big)
        finally:
            caught = time.monotonic()
    assert caught - raised_at[0] < 1.0, f"KeyboardInterrupt took {caught - raised_at[0]:.3f} s"
    assert store.latest() is None, "the interrupted save is not committed"
    store.close()
    # Reopening recovers: the partial checkpoint is gone, the step can be saved again.
    store = ringtier.CheckpointStore(tiers)
    leftovers = [p for p in Path(tiers[0]).rglob("*") if p.is_file() and "lock" not in p.name]
    assert leftovers == []
    store.save(1, {"w": torch.ones(10)})
    assert store.latest() == 1
    store.close()


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_bad_newest_step_is_skipped_quarantined_and_deleted(tiers):
    with ringtier.CheckpointStore(tiers, keep_last=5) as store:
        for step in (1, 2):
            store.save(step, {"x": torch.full((1000,), float(step))})
        store.drain()
    # Step 3's only copy (its drain never ran) gets a flipped byte.
    with ringtier.CheckpointStore(tiers[:1], keep_last=5) as fast_alone:
        fast_alone.save(3, {"x": torch.full((1000,), 3.0)})
    _flip(next(Path(tiers[0]).rglob("00000000000000000003/parts/tensors")), 100)
    ro = ringtier.CheckpointStore(tiers, read_only=True)
    with pytest.warns(RuntimeWarning, match="checkpoint 3 skipped"):
        state = ro.load()
    assert torch.equal(state["x"], torch.full((1000,), 2.0))
    assert [s for s, _ in ro.skipped] == [3] and "mismatch" in ro.skipped[0][1]
    into = {"x": torch.zeros(1000)}
    with pytest.warns(RuntimeWarning, match="checkpoint 3 skipped"):
        ro.load(into=into)
    assert torch.equal(into["x"], torch.full((1000,), 2.0))
    with pytest.raises(ringtier.CorruptError):
        ro.load(3)
    ro.close()
    # A writable open drains: step 3 is quarantined, the drain is not wedged.
    with ringtier.CheckpointStore(tiers, keep_last=5) as store:
        store.drain()
        q = store.quarantined()
        assert [c["step"] for c in q] == [3] and "checksum mismatch" in q[0]["reason"]
        assert [c["step"] for c in store.list()] == [1, 2]
        with pytest.raises(ringtier.RingtierError, match="quarantined"):
            store.save(3, {"x": torch.zeros(1)})
        store.delete(3)
        assert store.quarantined() == []
        store.delete(1)
        assert [c["step"] for c in store.list()] == [2]
        with pytest.raises(ringtier.NotFoundError):
            store.delete(1)
        store.save(3, {"x": torch.full((4,), 9.0)})
        assert torch.equal(store.load()["x"], torch.full((4,), 9.0)) and store.skipped == []


def test_two_async_saves_of_one_step_do_not_race(tiers):
    big = {"x": torch.arange(4 << 20, dtype=torch.float32)}
    other = {"x": torch.zeros(4 << 20, dtype=torch.float32)}
    with ringtier.CheckpointStore(tiers) as store:
        f1 = store.async_save(5, big)
        f2 = store.async_save(5, other)
        outcomes = []
        for f, state in ((f1, big), (f2, other)):
            try:
                f.result()
                outcomes.append(("ok", state))
            except ringtier.BusyError as e:
                assert "already being saved" in str(e)
                outcomes.append(("busy", None))
            except ringtier.RingtierError as e:  # the first finished before the second began
                assert "already exists" in str(e)
                outcomes.append(("exists", None))
        winners = [s for kind, s in outcomes if kind == "ok"]
        assert len(winners) == 1, outcomes
        assert torch.equal(store.load(5)["x"], winners[0]["x"])
