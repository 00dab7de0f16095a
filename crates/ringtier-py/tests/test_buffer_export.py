"""The one buffer exporter (``src/buffer.rs``) as each class that hands Rust memory to Python
uses it: ``Sample``, ``RecordField`` (and a one-field ``Record``), ``PartBuffer``. Views are
one-dimensional, format ``B``, writable, counted, and keep their exporter alive."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import ringtier
from test_records import write_tfrecords


def check_view(exporter, expected: bytes):
    m = memoryview(exporter)
    assert (m.ndim, m.format, m.itemsize, m.readonly, m.nbytes) == (1, "B", 1, False, len(expected))
    assert m.tobytes() == expected
    return m


def test_a_sample_view_counts_and_outlives_the_sample(dataset):
    root, files = dataset
    loader = ringtier.Loader(root, batch_size=4, prefetch=0, shuffle=False)
    batch = next(iter(loader.epoch(0)))
    s = batch[0]
    key = s.key
    m = check_view(s, files[key])
    m[0] = (m[0] + 1) % 256
    assert s.to_bytes()[0] == m[0]
    with pytest.raises(BufferError, match="buffer view"):
        s.release()
    del batch, s
    gc.collect()
    assert m.obj.key == key and len(m) == len(files[key]), "the view keeps its sample"
    m.release()
    s = next(iter(loader.epoch(1)))[0]
    s.release()
    assert s.released and len(s) == 0
    with pytest.raises(BufferError, match="released"):
        memoryview(s)
    s.release()  # releasing twice is allowed


def test_a_record_field_exports_and_a_record_lends_its_one_field(tmp_path):
    where = write_tfrecords(tmp_path / "tf", shards=1, per_shard=3)
    rec = next(iter(ringtier.RecordLoader(tmp_path / "tf", format="tfrecord").epoch(0)))
    data = rec.to_bytes()
    assert data in where
    field = rec[""]
    m = check_view(field, data)
    r = memoryview(rec)
    assert r.obj is field and np.frombuffer(r, np.uint8).ctypes.data == np.frombuffer(m, np.uint8).ctypes.data
    del rec, field
    gc.collect()
    assert r.tobytes() == data and m.tobytes() == data


def test_a_part_buffer_counts_its_views(tiers):
    with ringtier.CheckpointStore(tiers) as store:
        store.save(1, {"x": np.arange(1000, dtype=np.int64)})
        _step, _tier, parts, _fallbacks = store.load_parts(1)
    part = dict(parts)["tensors"]
    expected = memoryview(part).tobytes()  # a view released as soon as it is gone
    assert part.views == 0 and len(part) == len(expected) >= 8000
    m = check_view(part, expected)
    a = np.frombuffer(part, np.int64, count=1000)
    assert part.views == 2 and (a == np.arange(1000)).all()
    del a
    gc.collect()
    assert part.views == 1
    m.release()
    assert part.views == 0
