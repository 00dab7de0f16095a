"""ringtier.CheckpointStore.commit_files / staging: files another library wrote committed as a
step without a second write (the part is the file written: same inode), copied where they do
not lie on the fast tier, and links, FIFOs and failed writes refused with nothing committed.
Needs neither torch nor TensorFlow."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ringtier


def part(tiers, step: int, name: str, prefix: str = "ckpt") -> Path:
    return Path(tiers[0]) / prefix / f"{step:020d}" / "parts" / name


def load(store, step):
    at, _tier, parts, _fallbacks = store.load_parts(step)
    assert at == step
    return {name: bytes(memoryview(buf)) for name, buf in parts}


FILES = {"model.bin": os.urandom(3 << 20) + b"tail", "meta.json": b'{"step": 1}', "empty": b""}


def write(d, files=FILES):
    os.makedirs(d, exist_ok=True)
    inodes = {}
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        inodes[name] = os.stat(os.path.join(d, name)).st_ino
    return inodes


def test_staged_files_are_adopted_not_copied(tiers):
    with ringtier.CheckpointStore(tiers) as store:
        with store.staging(1) as staged:
            assert Path(staged.path).is_relative_to(tiers[0])
            inodes = write(staged.path)
        rep = staged.report
        assert rep is not None and rep["step"] == 1
        assert rep["adopted_bytes"] == rep["bytes"] == sum(map(len, FILES.values()))
        for name, ino in inodes.items():
            st = part(tiers, 1, name).stat()
            assert (st.st_ino, st.st_nlink) == (ino, 1), f"{name} was copied"
        assert not os.path.exists(staged.path)
        assert load(store, 1) == FILES
        # One copy per tier the step is on: the fast one, and the slow one once the background
        # drain got there (on tmpfs it often has by now).
        checked = store.verify(1)
        assert all(err is None for _, err in checked), checked
        assert 1 <= len(checked) <= len(tiers), checked
        # commit_files with a subset of a directory's files, the rest left alone.
        d = store.staging_dir()
        write(d)
        rep = store.commit_files(2, d, ["model.bin"])
        assert rep["adopted_bytes"] == len(FILES["model.bin"])
        assert sorted(os.listdir(d)) == ["empty", "meta.json"]
        store.drain()
        assert [c["step"] for c in store.list()] == [1, 2]
        with pytest.raises(ringtier.AlreadyExistsError):
            store.commit_files(2, d, ["meta.json"])
    # What a killed writer left staged is removed when a store opens for writing.
    leftover = Path(d)
    assert leftover.exists()
    with ringtier.CheckpointStore(tiers) as store:
        assert not leftover.exists()
        assert load(store, 2) == {"model.bin": FILES["model.bin"]}


def test_files_off_the_fast_tier_are_copied(tiers, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    write(elsewhere)
    with ringtier.CheckpointStore(tiers) as store:
        rep = store.commit_files(1, elsewhere)
        assert rep["adopted_bytes"] == 0 and rep["bytes"] == sum(map(len, FILES.values()))
        assert sorted(os.listdir(elsewhere)) == sorted(FILES), "copied files stay"
        assert load(store, 1) == FILES
        assert part(tiers, 1, "model.bin").stat().st_ino != (elsewhere / "model.bin").stat().st_ino


@pytest.mark.parametrize("where", ["fast", "elsewhere"])
def test_links_fifos_and_missing_files_commit_nothing(tiers, tmp_path, where):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret")
    with ringtier.CheckpointStore(tiers) as store:
        d = Path(store.staging_dir()) if where == "fast" else tmp_path / "elsewhere"
        write(d)
        (d / "link").symlink_to(outside)
        with pytest.raises(PermissionError, match="link"):
            store.commit_files(1, d)
        os.remove(d / "link")
        os.mkfifo(d / "fifo")
        with pytest.raises(FileNotFoundError, match="not a regular file"):
            store.commit_files(1, d)
        os.remove(d / "fifo")
        with pytest.raises(FileNotFoundError):
            store.commit_files(1, d, ["model.bin", "missing"])
        assert store.list() == []
        assert sorted(os.listdir(d)) == sorted(FILES), "nothing moved"
        assert outside.read_bytes() == b"secret"
        # The directory itself a link under the fast tier is refused too.
        if where == "fast":
            (Path(tiers[0]) / "linked").symlink_to(d)
            with pytest.raises(PermissionError, match="linked"):
                store.commit_files(1, Path(tiers[0]) / "linked")
        assert store.commit_files(1, d)["step"] == 1
        assert load(store, 1) == FILES


def test_a_failed_write_commits_nothing(tiers):
    with ringtier.CheckpointStore(tiers, prefix="p") as store:
        with pytest.raises(RuntimeError, match="the saver failed"):
            with store.staging(1) as staged:
                write(staged.path)
                raise RuntimeError("the saver failed")
        assert staged.report is None and not os.path.exists(staged.path)
        assert store.list() == []
        with pytest.raises(ValueError):
            store.commit_files(-1, staged.path)
