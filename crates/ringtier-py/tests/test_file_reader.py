"""ringtier.FileReader: any keys of a dataset read whole into one pool, per process: order and
repeats kept, errors per key with their kind, never waiting for buffers Python holds, files
larger than a buffer, and a forked child that makes its own."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

import ringtier


def test_reads_any_keys_in_order_with_repeats(dataset):
    root, files = dataset
    r = ringtier.FileReader(root, buffer_size=20_000, buffers=8)
    keys = sorted(files)[::7] + [sorted(files)[3]] * 2
    got = r.read(keys)
    assert [bytes(b) for b in got] == [files[k] for k in keys]
    assert all(isinstance(b, ringtier.FileBuffer) and len(b) == len(files[k]) for b, k in zip(got, keys))
    assert np.frombuffer(got[0], np.uint8).tobytes() == got[0].to_bytes() == files[keys[0]]
    assert r.engine in ("uring", "posix") and r.buffers == 8 and r.buffer_size >= 20_000
    assert "FileReader" in repr(r)


def test_holding_every_buffer_never_blocks_a_read(dataset):
    root, files = dataset
    r = ringtier.FileReader(root, buffer_size=20_000, buffers=4)
    keys = sorted(files)
    held = [r.read(keys[i : i + 10]) for i in range(0, 60, 10)]  # 60 files, 4 pooled buffers
    assert [bytes(b) for part in held for b in part] == [files[k] for k in keys[:60]]
    assert r.in_use == 4
    del held
    assert r.in_use == 0


def test_files_larger_than_a_buffer_and_sizes_as_hints(dataset):
    root, files = dataset
    r = ringtier.FileReader(root, buffer_size=4096, buffers=4)
    keys = sorted(files, key=lambda k: -len(files[k]))[:20]  # the largest, up to 20 KB
    assert [bytes(b) for b in r.read(keys)] == [files[k] for k in keys]
    sizes = [len(files[k]) // 2 for k in keys]  # wrong hints: the files win
    assert [bytes(b) for b in r.read(keys, sizes)] == [files[k] for k in keys]
    with pytest.raises(ringtier.InvalidInputError, match="one size per key"):
        r.read(keys, sizes[:1])


def test_a_missing_file_is_its_own_error(dataset):
    root, files = dataset
    r = ringtier.FileReader(root)
    k = sorted(files)[0]
    got = r.read([k, "d0/nope.bin", k])
    assert bytes(got[0]) == bytes(got[2]) == files[k]
    assert isinstance(got[1], ringtier.NotFoundError) and "nope.bin" in str(got[1])
    with pytest.raises(ringtier.NotFoundError):
        ringtier.FileReader(root / "missing")
    with pytest.raises(ringtier.InvalidInputError):
        ringtier.FileReader(root, buffers=0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_makes_its_own_reader(dataset):
    root, files = dataset
    r = ringtier.FileReader(root)
    k = sorted(files)[1]
    assert bytes(r.read([k])[0]) == files[k]
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's reader refuses; a new one reads
        code = 1
        try:
            try:
                r.read([k])
            except ringtier.ForkError:
                mine = ringtier.FileReader(root)
                os.write(wr, pickle.dumps(bytes(mine.read([k])[0])))
                code = 0
        finally:
            os._exit(code)
    os.close(wr)
    with os.fdopen(rd, "rb") as f:
        got = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert pickle.loads(got) == files[k]
