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
from conftest import tfrecord


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


def batches_of(epoch, n: int, max_bytes: int = 0) -> List[Tuple[List[str], List[bytes]]]:
    """Every batch of ``epoch`` as (keys, records), each packed into a buffer of its exact size."""
    out = []
    while (b := epoch.next_batch(n, max_bytes)) is not None:
        buf = bytearray(b.nbytes() + 5)
        offsets = b.pack_into(buf)
        assert len(offsets) == len(b) + 1 and offsets[0] == 0 and offsets[-1] == b.nbytes()
        assert buf[b.nbytes() :] == bytearray(5), "nothing past the batch's bytes"
        out.append((b.keys(), [bytes(buf[offsets[i] : offsets[i + 1]]) for i in range(len(b))]))
    assert epoch.next_batch(n) is None, "the end stays the end"
    return out


def test_record_batches_hold_the_records_in_the_same_order(tf):
    root, where = tf
    mk = lambda **kw: ringtier.RecordLoader(root, format="tfrecord", seed=4, shuffle_buffer=64, **kw)  # noqa: E731
    records = list(mk().epoch(2))
    want = [(f"{r.shard_key}:{r.offset}", r.to_bytes()) for r in records]
    for n in (1, 7, 64, 1000):
        e = mk().epoch(2)
        got = batches_of(e, n)
        assert all(len(k) == n for k, _ in got[:-1]) and 0 < len(got[-1][0]) <= n
        assert [(k, d) for keys, data in got for k, d in zip(keys, data)] == want, n
        s = e.stats()
        assert (e.position, s["records"], s["bytes"]) == (len(where), len(where), sum(map(len, where)))
        assert s["held_bytes"] == 0
    # Records one by one (the first wait takes more than one into Python), then a batch: the
    # same order; then a resume from the position.
    e = mk().epoch(2)
    head = [(f"{r.shard_key}:{r.offset}", r.to_bytes()) for r in (next(e) for _ in range(3))]
    b = e.next_batch(10)
    buf = bytearray(b.nbytes())
    o = b.pack_into(buf)
    assert head + list(zip(b.keys(), (bytes(buf[o[i] : o[i + 1]]) for i in range(len(b))))) == want[:13]
    assert e.position == 13
    assert [x for keys, data in batches_of(mk().epoch(2, e.position), 16) for x in zip(keys, data)] == want[13:]
    # A byte bound: the record that reaches it ends the batch, whole.
    bound = 40_000
    got = batches_of(mk().epoch(2), 1000, bound)
    assert all(sum(map(len, data[:-1])) < bound for _, data in got)
    assert [d for _, data in got for d in data] == [d for _, d in want]
    # Global order through indexes: the same.
    g = lambda: ringtier.RecordLoader(root, format="tfrecord", order="global", seed=1)  # noqa: E731
    assert [d for _, data in batches_of(g().epoch(3), 9) for d in data] == [r.to_bytes() for r in g().epoch(3)]


def test_record_batches_pack_only_into_a_writable_buffer_large_enough(tf, wds):
    root, _ = tf
    e = ringtier.RecordLoader(root, format="tfrecord").epoch(0)
    b = e.next_batch(20)
    assert b.names() == [""] and "records=20" in repr(b)
    small = bytearray(b.nbytes() - 1)
    with pytest.raises(ringtier.InvalidInputError, match=f"take {b.nbytes()} bytes, the buffer has {len(small)}"):
        b.pack_into(small)
    assert small == bytearray(len(small)), "nothing written"
    with pytest.raises(ringtier.InvalidInputError, match="writable"):
        b.pack_into(bytes(b.nbytes()))
    with pytest.raises(TypeError, match="buffer protocol"):
        b.pack_into([0] * b.nbytes())
    with pytest.raises(ringtier.InvalidInputError, match="at least 1"):
        e.next_batch(0)
    arr = np.zeros(b.nbytes(), dtype=np.uint8)
    o = b.pack_into(arr)
    first = [r.to_bytes() for r, _ in zip(ringtier.RecordLoader(root, format="tfrecord").epoch(0), range(20))]
    assert [arr[o[i] : o[i + 1]].tobytes() for i in range(20)] == first
    # WebDataset: one column per field, keys the sample keys; a sample without a field: empty.
    wroot, samples = wds
    e = ringtier.RecordLoader(wroot, format="wds", seed=1).epoch(0)
    seen = {}
    while (b := e.next_batch(16)) is not None:
        assert b.names() == ["jpg", "cls"] and b.nbytes() == b.nbytes("jpg") + b.nbytes("cls")
        assert b.nbytes("txt") == 0 and b.pack_into(bytearray(0), "txt") == [0] * (len(b) + 1)
        cols = {}
        for f in ("jpg", "cls"):
            buf = bytearray(b.nbytes(f))
            cols[f] = (buf, b.pack_into(buf, f))
        for i, k in enumerate(b.keys()):
            seen[k] = {f: bytes(buf[o[i] : o[i + 1]]) for f, (buf, o) in cols.items()}
    assert seen == samples


def test_record_batches_as_bytes_per_record_and_per_field(tf, wds):
    root, where = tf
    mk = lambda: ringtier.RecordLoader(root, format="tfrecord", seed=2)  # noqa: E731
    want = [r.to_bytes() for r in mk().epoch(1)]
    got = []
    e = mk().epoch(1)
    while (b := e.next_batch(13)) is not None:
        data = b.field_bytes()
        assert isinstance(data, list) and all(type(d) is bytes for d in data) and len(data) == len(b)
        assert b.field_bytes("") == data  # a TFRecord's one field is unnamed
        assert b.field_bytes("nope") == [b""] * len(b)
        got += data
    assert got == want and sorted(got) == sorted(where)
    # WebDataset: one list per field, b"" where a sample lacks it; None: all fields end to end.
    wroot, samples = wds
    e = ringtier.RecordLoader(wroot, format="wds", seed=1).epoch(0)
    seen = {}
    while (b := e.next_batch(16)) is not None:
        cols = {f: b.field_bytes(f) for f in ("jpg", "cls", "txt")}
        assert cols["txt"] == [b""] * len(b)
        whole = b.field_bytes()
        for i, k in enumerate(b.keys()):
            seen[k] = {f: cols[f][i] for f in ("jpg", "cls")}
            assert whole[i] == cols["jpg"][i] + cols["cls"][i]
    assert seen == samples


def test_record_batches_count_skipped_records_and_raise_after_the_records_before_an_error(tf):
    root, where = tf
    name = "train-00002-of-00004.tfrecord"
    offsets = sorted(off for n, off in where.values() if n == name)
    p = root / name
    raw = bytearray(p.read_bytes())
    raw[offsets[5] + 12] ^= 1
    p.write_bytes(bytes(raw))
    e = ringtier.RecordLoader(root, format="tfrecord", on_bad="skip").epoch(0)
    got = [d for _, data in batches_of(e, 32) for d in data]
    assert len(got) == len(set(got)) == len(where) - 1 and e.stats()["skipped"] == 1
    e = ringtier.RecordLoader(root, format="tfrecord", shuffle_buffer=0, shuffle_shards=False).epoch(0)
    delivered = []
    with pytest.raises(ringtier.CorruptError, match=rf"shard {name}, byte offset {offsets[5]}"):
        while (b := e.next_batch(1000)) is not None:
            buf = bytearray(b.nbytes())
            o = b.pack_into(buf)
            delivered += [bytes(buf[o[i] : o[i + 1]]) for i in range(len(b))]
    # Shards in order, records in shard order: shards 0 and 1 and the five records before the
    # bad one, all delivered (the error came with the call after their batch).
    assert delivered == sorted(where, key=lambda d: where[d])[: 50 * 2 + 5]
    assert e.position == len(delivered)


def dataloader_items(ds, workers: int) -> List[Tuple[str, bytes]]:
    """(key, bytes) of every record a batched TFRecord dataset with keys yields."""
    from torch.utils.data import DataLoader

    out = []
    for b in DataLoader(ds, batch_size=None, num_workers=workers):
        out += [(k, bytes(t.numpy())) for k, t in b]
    return out


@pytest.mark.parametrize("order", ["stream", "global"])
def test_batched_dataset_yields_the_records_and_keys_of_the_per_record_form(tf, order):
    pytest.importorskip("torch")
    from ringtier.torch import RecordDataset
    from ringtier.torch._packed import PackedBatch

    root, where = tf
    opts = dict(format="tfrecord", order=order, rank=0, world_size=1, seed=3, with_keys=True)
    per_record = RecordDataset(root, **opts)
    batched = RecordDataset(root, batched=True, batch_size=16, **opts)
    for epoch in (0, 1):
        per_record.set_epoch(epoch)
        batched.set_epoch(epoch)
        want = [(k, bytes(t.numpy())) for k, t in per_record]
        assert sorted(d for _, d in want) == sorted(where)
        assert all(where[d] == (k.rsplit(":", 1)[0], int(k.rsplit(":", 1)[1])) for k, d in want)
        # No workers: the same records in the same order.
        assert dataloader_items(batched, 0) == want
        # Two workers: each worker's records in its reader's order, every record once.
        got = dataloader_items(batched, 2)
        assert sorted(got) == sorted(want) and len(set(got)) == len(where)
        for w in range(2):
            reader = ringtier.RecordLoader(
                root, format="tfrecord", order=order, seed=3, worker=w, workers=2
            ).epoch(epoch)
            mine = [(f"{r.shard_key}:{r.offset}", r.to_bytes()) for r in reader]
            assert [x for x in got if x in set(mine)] == mine, (epoch, w)
    # The batches crossed packed, in the workers' slots.
    from torch.utils.data import DataLoader

    for b in DataLoader(batched, batch_size=None, num_workers=2):
        assert isinstance(b, PackedBatch) and len(b) <= 16 and b.keys is not None


def test_batched_webdataset_from_workers_matches_the_per_record_form(wds, tmp_path):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from ringtier.torch import RecordDataset

    root, samples = wds
    # One more shard whose samples lack the cls field, and one with an extra txt field.
    extra = {}
    with tarfile.open(root / "shard-000009.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(10):
            key = f"x/s{i:03d}"
            fields = {"jpg": bytes([i]) * (i * 100 + 1)} if i % 2 else {"jpg": b"j" * i, "txt": b"t" * (i + 1)}
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            extra[key] = fields
    everything = {**samples, **extra}
    per_record = RecordDataset(root, format="wds", rank=0, world_size=1, seed=2, with_keys=True)
    per_record.set_epoch(1)
    want = {key: {n: bytes(t.numpy()) for n, t in item.items()} for key, item in per_record}
    assert want == everything
    batched = RecordDataset(root, format="wds", rank=0, world_size=1, seed=2, batched=True, batch_size=8)
    batched.set_epoch(1)
    for workers in (0, 2):
        got = {}
        for b in DataLoader(batched, batch_size=None, num_workers=workers):
            for i, key in enumerate(b["__key__"]):
                assert key not in got
                # A column of a field the sample lacks holds an empty record for it.
                fields = {n: bytes(b[n][i].numpy()) for n in b if n != "__key__"}
                assert all(not d for n, d in fields.items() if n not in everything[key])
                got[key] = {n: d for n, d in fields.items() if n in everything[key]}
        assert got == want, workers


def test_batched_dataset_skips_and_fails_across_workers(tf):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from ringtier.torch import RecordDataset

    root, where = tf
    name = "train-00003-of-00004.tfrecord"
    off = sorted(o for n, o in where.values() if n == name)[7]
    p = root / name
    raw = bytearray(p.read_bytes())
    raw[off + 12] ^= 1
    p.write_bytes(bytes(raw))
    skip = RecordDataset(root, rank=0, world_size=1, batched=True, batch_size=8, on_bad="skip")
    got = [bytes(t.numpy()) for b in DataLoader(skip, batch_size=None, num_workers=2) for t in b]
    assert len(got) == len(set(got)) == len(where) - 1
    fail = RecordDataset(root, rank=0, world_size=1, batched=True, batch_size=8)
    with pytest.raises(ringtier.CorruptError, match=rf"{name}, byte offset {off}"):
        list(DataLoader(fail, batch_size=None, num_workers=2))
