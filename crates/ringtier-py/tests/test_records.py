"""ringtier.RecordLoader: TFRecord and WebDataset shards written here (TFRecord framing with
both masked CRC-32Cs, tar archives from Python's tarfile), read back streamed and in a global
order through indexes, on the io_uring engine over real files."""

from __future__ import annotations

import io
import random
import struct
import tarfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest

import ringtier
from conftest import crc32c


def masked(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    n = struct.pack("<Q", len(data))
    return n + struct.pack("<I", masked(n)) + data + struct.pack("<I", masked(data))


def write_tfrecords(root: Path, shards: int, per_shard: int, seed: int = 3) -> Dict[bytes, Tuple[str, int]]:
    """Shards of records whose first 8 bytes are a unique id; returns record -> (shard, offset)."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    where: Dict[bytes, Tuple[str, int]] = {}
    for s in range(shards):
        name = f"train-{s:05d}-of-{shards:05d}.tfrecord"
        out = bytearray()
        for i in range(per_shard):
            data = struct.pack("<Q", s * 100_000 + i) + rng.randbytes(rng.randint(0, 30_000))
            where[data] = (name, len(out))
            out += tfrecord(data)
        (root / name).write_bytes(bytes(out))
    return where


def write_wds(root: Path, shards: int, per_shard: int, seed: int = 5) -> Dict[str, Dict[str, bytes]]:
    """WebDataset shards (a .jpg and a .cls per sample) written by tarfile; key -> fields."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    samples: Dict[str, Dict[str, bytes]] = {}
    for s in range(shards):
        with tarfile.open(root / f"shard-{s:06d}.tar", "w", format=tarfile.GNU_FORMAT) as tar:
            for i in range(per_shard):
                key = f"c{i % 3}/s{s:02d}_{i:04d}"
                fields = {"jpg": rng.randbytes(rng.randint(1, 20_000)), "cls": str(i % 3).encode()}
                for ext, data in fields.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                samples[key] = fields
    return samples


def read_all(loader, epoch=0, position=0) -> List:
    return list(loader.epoch(epoch, position))


@pytest.fixture
def tf(tmp_path):
    root = tmp_path / "tf"
    return root, write_tfrecords(root, shards=4, per_shard=50)


@pytest.fixture
def wds(tmp_path):
    root = tmp_path / "wds"
    return root, write_wds(root, shards=3, per_shard=40)


def test_tfrecords_stream_every_record_once_with_its_bytes(tf):
    root, where = tf
    loader = ringtier.RecordLoader(root, format="tfrecord", read_size=64 << 10, depth=4, shuffle_buffer=32)
    assert loader.format == "tfrecord" and loader.order == "stream" and len(loader.shards()) == 4
    recs = read_all(loader)
    got = [r.to_bytes() for r in recs]
    assert sorted(got) == sorted(where)
    for r in recs[:20]:
        data = r.to_bytes()
        assert (r.shard_key, r.offset) == where[data]
        assert r.size == len(data) + 16 and r.key == "" and r.names() == [""]
    # Shuffled across shard boundaries, not shard order.
    assert [where[d][0] for d in got] != sorted(where[d][0] for d in got)


def held_peak(loader, where) -> int:
    """One epoch with a consumer slower than the reads (every stage fills); every record once;
    the loader's own count of the record bytes it held at most."""
    ep = loader.epoch(0)
    got = []
    for i, r in enumerate(ep):
        if i % 8 == 0:
            time.sleep(0.002)
        got.append(r.to_bytes())
    assert sorted(got) == sorted(where)
    st = ep.stats()
    assert st["held_bytes"] == 0, st
    return st["held_peak"]


def test_memory_is_bounded_in_bytes_by_the_loaders_own_accounting(tmp_path):
    root = tmp_path / "big"
    where = write_tfrecords(root, shards=4, per_shard=160)
    total = sum(map(len, where))
    biggest = max(map(len, where))
    # Count bounds that would hold every record; byte bounds far below the set's bytes.
    kw = dict(format="tfrecord", read_size=64 << 10, depth=4, shuffle_buffer=10_000, prefetch=10_000)
    loader = ringtier.RecordLoader(root, shuffle_bytes=500_000, prefetch_bytes=200_000, **kw)
    assert (loader.shuffle_bytes, loader.prefetch_bytes) == (500_000, 200_000)
    bound = loader.memory_bound(biggest)
    held_bound = bound - loader.pool_bytes
    assert held_bound < total / 2
    peak = held_peak(loader, where)
    assert 500_000 - biggest <= peak <= held_bound, (peak, held_bound)
    # Without the byte bounds the same epoch holds far more: the bound is what keeps it down.
    loader = ringtier.RecordLoader(root, shuffle_bytes=0, prefetch_bytes=0, **kw)
    assert loader.memory_bound(biggest) is None
    assert held_peak(loader, where) > held_bound
    # The defaults: 64 MiB of shuffle buffer, 16 MiB of prefetch, a 64 MiB read pool.
    d = ringtier.RecordLoader(root, format="tfrecord")
    assert (d.shuffle_bytes, d.prefetch_bytes, d.pool_bytes >> 20) == (64 << 20, 16 << 20, 64)
    assert d.memory_bound(1 << 20) < 160 << 20


def test_records_are_writable_views_without_a_copy(tf):
    root, _ = tf
    rec = next(iter(ringtier.RecordLoader(root, format="tfrecord").epoch(0)))
    a = np.frombuffer(rec, np.uint8)
    b = np.frombuffer(rec[""], np.uint8)
    assert a.ctypes.data == b.ctypes.data and a.flags.writeable
    a[0] ^= 0xFF
    assert rec.to_bytes()[0] == a[0]
    m = memoryview(rec)
    assert m.obj is rec[""] and len(m) == len(rec)


def test_wds_samples_group_fields_by_key(wds):
    root, samples = wds
    loader = ringtier.RecordLoader(root, format="wds", read_size=32 << 10, depth=3)
    recs = read_all(loader)
    assert sorted(r.key for r in recs) == sorted(samples)
    for r in recs:
        assert sorted(r.names()) == ["cls", "jpg"] and "jpg" in r and "png" not in r
        assert r["jpg"].to_bytes() == samples[r.key]["jpg"]
        assert bytes(memoryview(r.fields["cls"])) == samples[r.key]["cls"]
    with pytest.raises(KeyError, match="no field .png."):
        recs[0]["png"]
    with pytest.raises(BufferError, match="take one with record"):
        memoryview(recs[0])


def test_shards_split_over_ranks_and_workers_exactly_once(tf):
    root, where = tf
    seen: List[bytes] = []
    for rank in range(2):
        for worker in range(2):
            loader = ringtier.RecordLoader(
                root, format="tfrecord", seed=9, rank=rank, world_size=2, worker=worker, workers=2
            )
            assert len(loader.epoch_shards(1)) == 1
            seen += [r.to_bytes() for r in loader.epoch(1)]
    assert sorted(seen) == sorted(where)


def test_seeded_and_resumable(tf):
    root, _ = tf
    mk = lambda: ringtier.RecordLoader(root, format="tfrecord", seed=4, shuffle_buffer=64)  # noqa: E731
    first = [r.to_bytes() for r in mk().epoch(2)]
    assert first == [r.to_bytes() for r in mk().epoch(2)]
    assert first != [r.to_bytes() for r in mk().epoch(3)]
    e = mk().epoch(2)
    head = [next(e).to_bytes() for _ in range(70)]
    assert e.position == 70 and e.stats()["records"] == 70
    rest = [r.to_bytes() for r in mk().epoch(2, e.position)]
    assert head + rest == first


def test_global_order_through_built_and_written_indexes(tf, tmp_path):
    root, where = tf
    # No index files: built by streaming each shard once.
    loader = ringtier.RecordLoader(root, format="tfrecord", order="global", read_size=4096, seed=1)
    assert loader.order == "global" and len(loader) == len(where)
    assert loader.read_size >= max(len(d) for d in where) + 16
    recs = read_all(loader, epoch=0)
    got = [r.to_bytes() for r in recs]
    assert sorted(got) == sorted(where)
    assert all((r.shard_key, r.offset) == where[r.to_bytes()] for r in recs)
    # A true global order: consecutive records come from different shards most of the time.
    changes = sum(1 for a, b in zip(recs, recs[1:]) if a.shard != b.shard)
    assert changes > len(recs) // 2
    # Index files in DALI's tfrecord2idx format, in another directory, named SHARD-STEM.idx.
    idx_dir = tmp_path / "idx"
    idx_dir.mkdir()
    for name in {n for n, _ in where.values()}:
        entries = sorted((off, len(d) + 16) for d, (n, off) in where.items() if n == name)
        (idx_dir / (name.split(".")[0] + ".idx")).write_text("".join(f"{o} {l}\n" for o, l in entries))
    again = ringtier.RecordLoader(root, format="tfrecord", order="global", seed=1, index_dir=idx_dir)
    assert [r.to_bytes() for r in again.epoch(0)] == got
    # Ranks split the permutation; resume skips without reading.
    parts = [
        [r.to_bytes() for r in ringtier.RecordLoader(root, format="tfrecord", order="global", rank=k, world_size=3).epoch(5)]
        for k in range(3)
    ]
    assert sorted(sum(parts, [])) == sorted(where)
    one = ringtier.RecordLoader(root, format="tfrecord", order="global", rank=1, world_size=3)
    assert len(one) == len(parts[1])
    assert [r.to_bytes() for r in one.epoch(5, 10)] == parts[1][10:]


def test_wds_global_order_reads_dalis_wds2idx(wds, tmp_path):
    root, samples = wds
    # wds2idx v1.2 lines from tarfile's member offsets: ext offset size name per member.
    for tar_path in sorted(root.glob("*.tar")):
        lines: Dict[str, List[str]] = {}
        with tarfile.open(tar_path) as tar:
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                lines.setdefault(key, []).append(f"{ext} {m.offset_data} {m.size} {m.name}")
        text = f"v1.2 {len(lines)}\n" + "".join(" ".join(v) + "\n" for v in lines.values())
        tar_path.with_suffix(".idx").write_text(text)
    loader = ringtier.RecordLoader(root, format="wds", order="global", seed=2)
    recs = read_all(loader)
    assert sorted(r.key for r in recs) == sorted(samples) and len(loader) == len(samples)
    for r in recs:
        assert r["jpg"].to_bytes() == samples[r.key]["jpg"]


def test_bad_input_names_shard_and_offset(tf, tmp_path):
    root, where = tf
    name = "train-00001-of-00004.tfrecord"
    offsets = sorted(off for n, off in where.values() if n == name)
    p = root / name
    raw = bytearray(p.read_bytes())
    raw[offsets[3] + 12] ^= 1  # a data byte of the fourth record: its data CRC fails
    p.write_bytes(bytes(raw))
    with pytest.raises(ringtier.CorruptError, match=rf"shard {name}, byte offset {offsets[3]}: .*CRC") as ei:
        read_all(ringtier.RecordLoader(root, format="tfrecord"))
    assert ei.value.kind == "corrupt"
    skipping = ringtier.RecordLoader(root, format="tfrecord", on_bad="skip")
    e = skipping.epoch(0)
    assert len(list(e)) == len(where) - 1 and e.stats()["skipped"] == 1
    # An index that does not match its shard.
    (root / f"{name}.idx").write_text("0 20\n")
    with pytest.raises(ringtier.CorruptError, match=rf"shard {name}, byte offset 0: .*does not match"):
        read_all(ringtier.RecordLoader(root, format="tfrecord", order="global"))
    (root / f"{name}.idx").write_text("0 99999999\n")
    with pytest.raises(ringtier.CorruptError, match=rf"{name}.idx, line 1: .*does not match its shard"):
        ringtier.RecordLoader(root, format="tfrecord", order="global")


def test_wrong_arguments(tf, tmp_path):
    root, _ = tf
    with pytest.raises(ringtier.NotFoundError, match="does not exist"):
        ringtier.RecordLoader(tmp_path / "nope")
    with pytest.raises(ringtier.NotFoundError, match="no wds shards"):
        ringtier.RecordLoader(root, format="wds")
    for kw, why in [
        ({"format": "parquet"}, "format must be"),
        ({"order": "random"}, "order must be"),
        ({"on_bad": "ignore"}, "on_bad must be"),
        ({"rank": 2, "world_size": 2}, "rank 2 is not below"),
        ({"worker": 1}, "worker 1 is not below"),
        ({"engine": "mmap"}, "engine must be"),
    ]:
        with pytest.raises(ringtier.InvalidInputError, match=why):
            ringtier.RecordLoader(root, **kw)
    with pytest.raises(TypeError):
        ringtier.RecordLoader(root, depth="8")
    with pytest.raises(TypeError, match="does not know its record count"):
        len(ringtier.RecordLoader(root))


def test_posix_engine(tf):
    root, where = tf
    loader = ringtier.RecordLoader(root, engine="posix", shuffle_buffer=0, shuffle_shards=False)
    got = [r.to_bytes() for r in loader.epoch(0)]
    assert got == sorted(where, key=lambda d: where[d])


def test_torch_record_dataset_splits_over_dataloader_workers(tf, wds):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from ringtier.torch import RecordDataset

    root, where = tf
    ds = RecordDataset(root, format="tfrecord", rank=0, world_size=1, seed=3, batched=True, batch_size=8)
    got = [bytes(t.numpy()) for b in DataLoader(ds, batch_size=None, num_workers=2) for t in b]
    assert sorted(got) == sorted(where)
    # One record at a time across workers: refused, saying what to write.
    single = RecordDataset(root, format="tfrecord", rank=0, world_size=1, seed=3)
    with pytest.raises(ValueError, match="batched=True"):
        list(DataLoader(single, batch_size=None, num_workers=2))
    glob = RecordDataset(
        root, format="tfrecord", order="global", rank=1, world_size=2, with_keys=True, batched=True, batch_size=8
    )
    items = [item for b in DataLoader(glob, batch_size=None, num_workers=2) for item in b]
    assert len(items) == len(glob) == len(where) // 2
    for key, t in items:
        shard, off = key.rsplit(":", 1)
        assert t.dtype == torch.uint8 and where[bytes(t.numpy())] == (shard, int(off))
    wroot, samples = wds
    wds_ds = RecordDataset(wroot, format="wds", fields=["cls"], rank=0, world_size=1, batched=True, batch_size=4)
    wds_ds.set_epoch(1)
    out = {
        key: {"cls": b["cls"][i]}
        for b in DataLoader(wds_ds, batch_size=None, num_workers=2)
        for i, key in enumerate(b["__key__"])
    }
    assert sorted(out) == sorted(samples)
    assert all(list(v) == ["cls"] and bytes(v["cls"].numpy()) == samples[k]["cls"] for k, v in out.items())
