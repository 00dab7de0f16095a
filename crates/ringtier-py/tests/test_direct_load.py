"""``CheckpointStore.load()`` reads each chunk straight into the memory its tensors share
(``src/direct.rs``): sizes that are not multiples of a page, a bad fast copy read again from
the slow tier, a truncated fast copy (the copying load takes over), the memory Python gets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ringtier


def state(seed: int, n: int = 5):
    rng = np.random.default_rng(seed)
    # Odd sizes: the tensors part ends mid-page; one array is larger than a read (4 MiB).
    out = {f"a{i}": rng.standard_normal(1 + 777 * i).astype(np.float32) for i in range(n)}
    out["big"] = rng.integers(0, 2**31, (5 << 20) // 4 + 3, dtype=np.int32)
    out["meta"] = {"step": seed, "name": "x" * 5000}
    return out


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k])
        else:
            assert a[k] == b[k]


def part_file(root: str, step: int) -> Path:
    return next(p for p in Path(root).rglob("tensors") if f"{step:020d}" in str(p))


def test_odd_sizes_round_trip_and_the_memory_is_writable(tiers):
    with ringtier.CheckpointStore(tiers[:1]) as store:
        s = state(1)
        store.save(1, s)
        got = store.load()
        same(got, s)
        got["big"][0] = -1  # the part's memory is writable and the arrays own no copy
        at, tier, parts, fallbacks = store.load_parts(1)
        sizes = {name: len(buf) for name, buf in parts}
        assert sizes["tensors"] == part_file(tiers[0], 1).stat().st_size and fallbacks == []
        view = memoryview(dict(parts)["tensors"])
        assert not view.readonly and view.nbytes == sizes["tensors"]


def test_a_bad_fast_copy_is_read_again_from_the_slow_tier(tiers):
    with ringtier.CheckpointStore(tiers, keep_last=5) as store:
        store.save(2, state(2))
        store.drain()
    f = part_file(tiers[0], 2)
    data = bytearray(f.read_bytes())
    data[4 << 20] ^= 0x01  # in the second read
    f.write_bytes(bytes(data))
    with ringtier.CheckpointStore(tiers, read_only=True) as store:
        at, tier, parts, fallbacks = store.load_parts(2)
        assert len(fallbacks) == 1 and "checksum mismatch" in fallbacks[0], fallbacks
        same(store.load(2), state(2))


def test_a_truncated_fast_copy_falls_back_through_the_copying_load(tiers):
    with ringtier.CheckpointStore(tiers, keep_last=5) as store:
        store.save(3, state(3))
        store.drain()
    f = part_file(tiers[0], 3)
    f.write_bytes(f.read_bytes()[: 3 << 20])
    with ringtier.CheckpointStore(tiers, read_only=True) as store:
        at, tier, parts, fallbacks = store.load_parts(3)
        assert any("truncated" in x for x in fallbacks), fallbacks
        same(store.load(3), state(3))


def test_a_truncated_only_copy_is_corrupt(tiers):
    # The only copy's object is shorter than its manifest says: the direct load declines
    # before mapping anything, and the copying load reports the truncation.
    with ringtier.CheckpointStore(tiers[:1], keep_last=5) as store:
        store.save(4, state(4))
    f = part_file(tiers[0], 4)
    f.write_bytes(f.read_bytes()[:100])
    with ringtier.CheckpointStore(tiers[:1], read_only=True) as store:
        with pytest.raises(ringtier.CorruptError, match="truncated"):
            store.load(4)
