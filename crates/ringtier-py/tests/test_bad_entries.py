"""One bad entry never stops the listing: a dangling symbolic link, a link loop, a directory
that cannot be read, a file removed or truncated between listing and reading. Under
``on_bad="skip"`` each is left out, named in one ``RuntimeWarning`` (once per dataset, also with
DataLoader workers) and counted; under ``on_bad="fail"`` the error names it.

torchvision's ``ImageFolder`` lists a dangling link and its DataLoader raises
``FileNotFoundError`` when it reaches it; ringtier leaves it out."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import pytest

import ringtier
from conftest import tfrecord, write_dataset


def read_all(loader):
    out = {}
    for batch in loader.epoch(0):
        for s in batch:
            out[s.key] = s.to_bytes()
    return out


@pytest.fixture
def bad_dataset(tmp_path: Path):
    """300 good files, a good file link, a dangling link and a link loop."""
    root = tmp_path / "ds"
    files = write_dataset(root, 300)
    (tmp_path / "target.bin").write_bytes(b"linked")
    os.symlink(tmp_path / "target.bin", root / "d0" / "linked.bin")
    files["d0/linked.bin"] = b"linked"
    os.symlink(tmp_path / "gone.bin", root / "d1" / "dead.bin")
    os.symlink(root, root / "d2" / "up")
    return root, files


def test_a_dangling_link_and_a_loop_are_left_out_and_named_once(bad_dataset):
    root, files = bad_dataset
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = ringtier.Loader(root, batch_size=32, engine="posix")
    named = [w for w in caught if "could not be listed" in str(w.message)]
    assert len(named) == 1, [str(w.message) for w in caught]
    assert named[0].category is RuntimeWarning
    msg = str(named[0].message)
    assert "2 entries" in msg and "d1/dead.bin" in msg and "broken symbolic link" in msg and "d2/up" in msg, msg
    assert sorted(k for k, _ in loader.skipped) == ["d1/dead.bin", "d2/up"]
    assert loader.skipped_summary == msg
    assert read_all(loader) == files
    # Quiet on request: the summary is still there.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = ringtier.Loader(root, batch_size=32, engine="posix", warn_skipped=False)
    assert quiet.skipped_summary == msg


def test_on_bad_fail_names_the_entry(bad_dataset):
    root, _ = bad_dataset
    with pytest.raises(ringtier.RingtierError) as e:
        ringtier.Loader(root, on_bad="fail", engine="posix")
    assert "d1/dead.bin" in str(e.value) or "d2/up" in str(e.value), str(e.value)
    os.unlink(root / "d2" / "up")
    with pytest.raises(FileNotFoundError) as e:
        ringtier.Loader(root, on_bad="fail", engine="posix")
    assert "d1/dead.bin" in str(e.value) and "broken symbolic link" in str(e.value)


def test_skipped_entries_are_counted_in_the_metric(bad_dataset):
    root, _ = bad_dataset
    # The exporter is process-wide: a process of its own.
    script = textwrap.dedent(
        f"""
        import ringtier
        ringtier.serve_metrics("127.0.0.1:0")
        ringtier.Loader({str(root)!r}, engine="posix", warn_skipped=False)
        print([l for l in ringtier.metrics_text().splitlines() if l.startswith("ringtier_loader_samples_skipped_total")])
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ringtier_loader_samples_skipped_total 2" in out.stdout, out.stdout


def test_files_removed_or_truncated_after_listing_are_skipped(tmp_path: Path):
    root = tmp_path / "ds"
    files = write_dataset(root, 200)
    for engine in ("posix", "uring"):
        # Held to the sizes listed (stat_files): a file that changed is skipped and named.
        loader = ringtier.Loader(root, batch_size=16, shuffle=False, engine=engine, stat_files=True)
        gone, short = "d0/f00000.bin", "d1/f00001.bin"
        saved = {k: (root / k).read_bytes() for k in (gone, short)}
        (root / gone).unlink()
        (root / short).write_bytes(saved[short][: len(saved[short]) // 2])
        skipped = []
        got = {}
        for batch in loader.epoch(0):
            skipped += batch.skipped
            for s in batch:
                got[s.key] = s.to_bytes()
        assert set(got) == set(files) - {gone, short}, engine
        assert any(gone in why for why in skipped) and any(short in why and "size mismatch" in why for why in skipped), skipped
        # Under "fail" each keeps its own kind: the file gone is not found (not corrupt).
        with pytest.raises(ringtier.NotFoundError) as e:
            read_all(ringtier.Loader(root, batch_size=16, engine=engine, on_bad="fail", keys=sorted(files)))
        assert gone in str(e.value), str(e.value)
        assert isinstance(e.value, FileNotFoundError)
        for k, v in saved.items():
            (root / k).write_bytes(v)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to run as nobody")
def test_a_directory_that_cannot_be_read_is_left_out():
    """chmod 000 means nothing to root: the loader runs as nobody (setpriv), on a dataset in a
    directory nobody may reach (pytest's own temporary directories are root's alone)."""
    tmp_path = Path(tempfile.mkdtemp(prefix="ringtier-nobody-"))
    try:
        _unreadable_directory(tmp_path)
    finally:
        for p in tmp_path.rglob("*"):
            if p.is_dir():
                p.chmod(0o755)
        shutil.rmtree(tmp_path)


def _unreadable_directory(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    root = tmp_path / "ds"
    files = write_dataset(root, 60)
    locked = root / "d1"
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    locked.chmod(0)
    script = textwrap.dedent(
        f"""
        import sys, warnings
        import ringtier
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = ringtier.Loader({str(root)!r}, batch_size=8, engine="posix")
        keys = sorted(s.key for b in loader.epoch(0) for s in b)
        print(len(keys), sorted(k for k, _ in loader.skipped))
        print([str(w.message) for w in caught if "could not be listed" in str(w.message)])
        try:
            ringtier.Loader({str(root)!r}, engine="posix", on_bad="fail")
        except PermissionError as e:
            print("fail:", e)
        """
    )
    env = dict(os.environ, HOME=str(tmp_path))
    out = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    locked.chmod(0o755)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    want = len([k for k in files if not k.startswith("d1/")])
    assert lines[0] == f"{want} ['d1']", out.stdout
    assert "1 entries" in lines[1] and "d1 (" in lines[1], out.stdout
    assert lines[2].startswith("fail:") and "d1" in lines[2], out.stdout


def test_torch_datasets_skip_a_dangling_link_and_warn_once_across_workers(bad_dataset):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    import ringtier.torch as rt

    root, files = bad_dataset
    for workers in (0, 2):
        ds = rt.IterableDataset(root, batch_size=32, engine="posix")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = 0
            for batch in DataLoader(ds, batch_size=None, num_workers=workers):
                got += len(batch)
        assert got == len(files), workers
        named = [w for w in caught if "could not be listed" in str(w.message)]
        # Warnings in workers reach the main process only through their stderr: count there
        # for 0 workers, and check the flag (one per dataset) otherwise.
        if workers == 0:
            assert len(named) == 1, [str(w.message) for w in caught]
        assert ds._skipped_warning._flag.value == 1


def test_image_folder_skips_a_dangling_link(tmp_path: Path):
    pytest.importorskip("torch")
    from PIL import Image

    import ringtier.torch as rt
    import ringtier.transforms as T

    root = tmp_path / "images"
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(5):
            Image.new("RGB", (40, 30), (i * 40, 10, 200)).save(root / cls / f"{i}.jpg")
    os.symlink(tmp_path / "gone.jpg", root / "a" / "dead.jpg")
    ds = rt.ImageFolder(root, T.Compose([T.Resize((16, 16)), T.ToTensor()]), batch_size=4, engine="posix")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        n = sum(len(labels) for _, labels in ds)
    assert n == 10
    assert any("a/dead.jpg" in str(w.message) for w in caught), [str(w.message) for w in caught]
    failing = rt.ImageFolder(root, T.Compose([T.Resize((16, 16)), T.ToTensor()]), batch_size=4, engine="posix", on_bad="fail")
    with pytest.raises(FileNotFoundError) as e:
        list(failing)
    assert "a/dead.jpg" in str(e.value)


def test_sizes_learned_from_the_reads_and_a_cached_listing(tmp_path: Path):
    """Without stat_files the files win: one truncated or grown after the listing is read as
    it is now. The listing is cached beside the dataset once its directories are two seconds
    old, used while they are unchanged, and never trusted over the files."""
    import time

    root = tmp_path / "ds"
    files = write_dataset(root, 120)
    first = ringtier.Loader(root, batch_size=16, engine="posix")
    assert first.listing["sizes"] == "learned" and not first.listing["from_cache"]
    assert first.listing["bytes"] <= 120 * (16 + 16) + 64
    time.sleep(2.1)
    ringtier.Loader(root, batch_size=16, engine="posix")  # lists and writes the cache
    assert (root / ".ringtier-listing").exists()
    cached = ringtier.Loader(root, batch_size=16, engine="posix")
    assert cached.listing["from_cache"] and cached.listing["sizes"] == "learned", cached.listing
    # A listing that wants sizes does not use a cache without them: it stats, and caches them.
    assert not ringtier.Loader(root, engine="posix", stat_files=True).listing["from_cache"]
    for engine in ("posix", "uring"):
        loader = ringtier.Loader(root, batch_size=16, engine=engine)
        assert loader.listing["from_cache"] and loader.listing["sizes"] == "hints", loader.listing
        assert loader.listing["max_size"] == max(len(v) for v in files.values())
        # Rewritten in place (the directory's times do not change): the files win.
        grown, short = "d0/f00000.bin", "d1/f00001.bin"
        saved = {k: (root / k).read_bytes() for k in (grown, short)}
        (root / grown).write_bytes(saved[grown] * 3 + b"x" * 70_000)
        (root / short).write_bytes(saved[short][:7])
        want = dict(files, **{grown: (root / grown).read_bytes(), short: (root / short).read_bytes()})
        assert read_all(loader) == want, engine
        for k, v in saved.items():
            (root / k).write_bytes(v)
    # A file added: its directory changed, the cache is not used.
    (root / "d2" / "new.bin").write_bytes(b"new")
    loader = ringtier.Loader(root, batch_size=16, engine="posix")
    assert not loader.listing["from_cache"] and len(loader.keys()) == 121
    assert ringtier.Loader(root, engine="posix", listing_cache=False, stat_files=True).listing["sizes"] == "exact"


def test_record_shards_skip_a_dangling_link(tmp_path: Path):
    """Shard directories too: a dangling link named like a shard and a link loop are left out
    and named in one warning under on_bad="skip"; the error names the link under "fail"."""
    root = tmp_path / "shards"
    root.mkdir()
    want = []
    for s in range(2):
        with open(root / f"part-{s}.tfrecord", "wb") as f:
            for i in range(10):
                data = os.urandom(30 + i)
                want.append(data)
                f.write(tfrecord(data))
    os.symlink(tmp_path / "gone.tfrecord", root / "part-9.tfrecord")
    os.symlink(root / "loop-b", root / "loop-a")
    os.symlink(root / "loop-a", root / "loop-b")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = ringtier.RecordLoader(root, format="tfrecord", on_bad="skip")
    named = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(named) == 1 and "part-9.tfrecord" in named[0] and "loop-a" in named[0], named
    assert loader.shards() == ["part-0.tfrecord", "part-1.tfrecord"]
    assert sorted(r.to_bytes() for r in loader.epoch(0)) == sorted(want)
    with pytest.raises(ringtier.InvalidInputError, match="loop-"):
        ringtier.RecordLoader(root, format="tfrecord")
    for loop in ("loop-a", "loop-b"):
        (root / loop).unlink()
    with pytest.raises(ringtier.NotFoundError, match="part-9.tfrecord"):
        ringtier.RecordLoader(root, format="tfrecord")

