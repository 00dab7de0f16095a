"""Errors keep their kind in Python: each engine error kind (``ringtier_core::ErrorKind``) is
raised as exactly one class, a ``ringtier.RingtierError`` and the matching builtin, with
``kind``, ``temporary`` and ``errno``. Each kind is triggered for real where Python can reach
it; every kind goes through the table ``src/errors.rs`` raises with (``_from_kind``)."""

from __future__ import annotations

import errno
import io
import os
import pickle
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import ringtier
from ringtier import errors

# kind -> (class, the builtin it also is). `ringtier_core::ErrorKind::as_str` names the kinds.
EXPECTED = {
    "not_found": (ringtier.NotFoundError, FileNotFoundError),
    "already_exists": (ringtier.AlreadyExistsError, FileExistsError),
    "invalid_key": (ringtier.InvalidKeyError, ValueError),
    "invalid_input": (ringtier.InvalidInputError, ValueError),
    "misaligned": (ringtier.MisalignedError, ValueError),
    "out_of_range": (ringtier.OutOfRangeError, ValueError),
    "no_space": (ringtier.NoSpaceError, OSError),
    "permission_denied": (ringtier.PermissionDeniedError, PermissionError),
    "unsupported": (ringtier.UnsupportedError, io.UnsupportedOperation),
    "corrupt": (ringtier.CorruptError, OSError),
    "resource_exhausted": (ringtier.ResourceExhaustedError, OSError),
    "shutdown": (ringtier.ShutdownError, RuntimeError),
    "busy": (ringtier.BusyError, BlockingIOError),
    "io": (ringtier.IoError, OSError),
}

DOCS = Path(__file__).resolve().parents[3] / "docs" / "PYTHON.md"


def check(exc: BaseException, kind: str, errno_: object = None) -> None:
    """`exc` is the class of `kind`, its builtin and a RingtierError, with that kind and errno."""
    cls, builtin = EXPECTED[kind]
    assert type(exc) is cls, f"{kind}: {type(exc).__name__}, not {cls.__name__}: {exc}"
    assert isinstance(exc, ringtier.RingtierError) and isinstance(exc, builtin)
    assert exc.kind == kind and exc.temporary is False
    assert exc.errno == errno_, f"{kind}: errno {exc.errno}: {exc}"


# The table.


def test_every_kind_is_one_class_with_its_builtin_base():
    assert dict(errors.CLASS_BY_KIND) == {k: cls for k, (cls, _) in EXPECTED.items()}
    assert len(set(errors.CLASS_BY_KIND.values())) == len(EXPECTED), "two kinds share a class"
    for kind, (cls, builtin) in EXPECTED.items():
        assert issubclass(cls, ringtier.RingtierError) and issubclass(cls, builtin), cls
        assert cls.kind == kind
        assert getattr(ringtier, cls.__name__) is cls and cls.__name__ in ringtier.__all__
        assert cls.__name__ in errors.__all__
    # The classes that existed keep their bases.
    assert issubclass(ringtier.NotFoundError, ValueError)
    assert issubclass(ringtier.UnsupportedError, ValueError) and issubclass(ringtier.UnsupportedError, OSError)
    for narrower in (ringtier.InvalidKeyError, ringtier.MisalignedError, ringtier.OutOfRangeError):
        assert issubclass(narrower, ringtier.InvalidInputError)
    assert issubclass(ringtier.ClosedError, ValueError) and issubclass(ringtier.ForkError, RuntimeError)
    assert issubclass(ringtier.PoolExhaustedError, ringtier.ResourceExhaustedError)
    assert issubclass(ringtier.PoolExhaustedError, BufferError)


@pytest.mark.parametrize("kind", sorted(EXPECTED))
@pytest.mark.parametrize("code", [None, errno.EIO])
def test_each_kind_is_raised_as_its_class_with_kind_temporary_and_errno(kind, code):
    cls, builtin = EXPECTED[kind]
    exc = errors._from_kind(kind, f"what went wrong ({kind})", True, code)
    assert type(exc) is cls and isinstance(exc, builtin) and isinstance(exc, ringtier.RingtierError)
    assert (exc.kind, exc.temporary, exc.errno) == (kind, True, code)
    assert f"what went wrong ({kind})" in str(exc)
    if code is not None and isinstance(exc, OSError):
        assert str(exc).startswith(f"[Errno {code}] ") and exc.strerror == f"what went wrong ({kind})"
    with pytest.raises(builtin):
        raise exc
    # Pickling (multiprocessing, a DataLoader's error report) keeps the class and the fields.
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls and (back.kind, back.temporary, back.errno, str(back)) == (kind, True, code, str(exc))


def test_a_kind_this_version_does_not_know_is_a_plain_ringtier_error():
    exc = errors._from_kind("a_new_kind", "news", False, None)
    assert type(exc) is ringtier.RingtierError and exc.kind == "a_new_kind"


def test_errors_raised_by_python_have_errno_none():
    for exc in (ringtier.InvalidInputError("x"), ringtier.NotFoundError("x"), ringtier.CorruptError("x")):
        assert exc.errno is None and exc.temporary is False


def test_the_docs_table_is_the_mapping():
    if not DOCS.exists():
        pytest.skip("docs/PYTHON.md is not here (an installed test run)")
    rows = re.findall(r"^\| `(\w+)` \| `ringtier\.(\w+)` \| ([^|]+) \|", DOCS.read_text(), re.M)
    assert {kind: name for kind, name, _ in rows} == {k: cls.__name__ for k, (cls, _) in EXPECTED.items()}
    for kind, _, bases in rows:
        assert EXPECTED[kind][1].__name__ in bases, (kind, bases)


# Each kind, triggered for real.


def test_not_found(tiers, tmp_path):
    with ringtier.CheckpointStore(tiers) as store:
        with pytest.raises(FileNotFoundError, match="no committed copy of checkpoint 42") as e:
            store.load(42)
    check(e.value, "not_found")
    assert isinstance(e.value, ValueError)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "a").write_bytes(b"a")
    with pytest.raises(ringtier.NotFoundError) as e:
        list(ringtier.Loader(tmp_path / "ds", keys=["missing"], batch_size=1, on_bad="fail").epoch(0))
    check(e.value, "not_found", errno.ENOENT)


def test_already_exists_a_step_saved_twice(tiers):
    with ringtier.CheckpointStore(tiers) as store:
        store.save(1, {"a": b"x"})
        with pytest.raises(FileExistsError, match="checkpoint 1 already exists") as e:
            store.save(1, {"a": b"y"})
    check(e.value, "already_exists")


def test_invalid_key_with_a_dot_dot(tiers, dataset):
    root, _ = dataset
    with pytest.raises(ValueError, match="'..' component") as e:
        list(ringtier.Loader(root, keys=["../outside"], batch_size=1, on_bad="fail").epoch(0))
    check(e.value, "invalid_key")
    with pytest.raises(ringtier.InvalidInputError, match="'..' component") as e:
        ringtier.CheckpointStore(tiers, prefix="../up")
    check(e.value, "invalid_key")


def test_invalid_input_a_bad_argument():
    with pytest.raises(ValueError, match="capacity of 0") as e:
        ringtier.Cache(0)
    check(e.value, "invalid_input")


def test_out_of_range_a_position_past_the_end(dataset):
    root, files = dataset
    loader = ringtier.Loader(root, batch_size=10)
    with pytest.raises(ValueError, match="past the end") as e:
        loader.epoch(0, len(files) + 1)
    check(e.value, "out_of_range")


def test_no_space_a_checkpoint_larger_than_the_fast_tier(tiers):
    with ringtier.CheckpointStore(tiers, fast_capacity_bytes=4096) as store:
        with pytest.raises(OSError, match="larger than the fast tier's capacity") as e:
            store.save(1, {"a": b"x" * 100_000})
    check(e.value, "no_space", errno.ENOSPC)


def test_permission_denied_a_link_inside_a_store_tier(tiers, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, Path(tiers[0]) / "ckpt")  # the store's prefix directory, a link
    with pytest.raises(PermissionError, match="symbolic link") as e:
        with ringtier.CheckpointStore(tiers) as store:
            store.save(1, {"a": b"x"})
    check(e.value, "permission_denied")
    assert list(elsewhere.iterdir()) == [], "nothing was written through the link"


def test_unsupported_saving_through_a_read_only_store(tiers):
    with ringtier.CheckpointStore(tiers) as store:
        store.save(1, {"a": b"x"})
    with ringtier.CheckpointStore(tiers, read_only=True) as ro:
        with pytest.raises(io.UnsupportedOperation, match="read-only") as e:
            ro.save(2, {"a": b"y"})
    check(e.value, "unsupported")


def test_corrupt_a_flipped_byte(tiers):
    with ringtier.CheckpointStore(tiers[:1]) as store:
        store.save(1, {"a": b"x" * 10_000})
    part = next(Path(tiers[0]).rglob("00000000000000000001/parts/tensors"))
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    with ringtier.CheckpointStore(tiers[:1], read_only=True) as ro:
        with pytest.raises(OSError, match="checksum mismatch") as e:
            ro.load(1)
    check(e.value, "corrupt")


RESOURCE_EXHAUSTED_CHILD = textwrap.dedent(
    """
    import resource, sys
    import ringtier
    # The engine and a small lazy pool first (io_uring refused: nothing to show here).
    try:
        ringtier.Loader(sys.argv[1], batch_size=1, lazy_pool=True, engine="uring")
    except ringtier.RingtierError as e:
        print("SKIP", e)
        sys.exit(0)
    vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
        ringtier.Loader(sys.argv[1], batch_size=1 << 14, lazy_pool=True, engine="uring")  # a 640 MiB pool
    except ringtier.RingtierError as e:
        print(type(e).__name__, e.kind, isinstance(e, OSError), e)
    else:
        print("NO ERROR")
    """
)


def test_resource_exhausted_a_pool_the_address_space_limit_refuses(tmp_path):
    (tmp_path / "a").write_bytes(b"a" * 1000)
    out = subprocess.run(
        [sys.executable, "-c", RESOURCE_EXHAUSTED_CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("SKIP"):
        pytest.skip(f"io_uring refused here: {out.stdout}")
    assert out.stdout.startswith("ResourceExhaustedError resource_exhausted True "), out.stdout
    assert "cannot map" in out.stdout


def test_resource_exhausted_python_holding_the_loaders_pool(dataset):
    root, _ = dataset
    loader = ringtier.Loader(root, batch_size=8, prefetch=1, hold=4)
    kept = []
    t0 = time.monotonic()
    with pytest.raises(ringtier.ResourceExhaustedError, match="Python holds") as e:
        for batch in loader.epoch(0):
            kept.extend(batch)
    assert time.monotonic() - t0 < 10
    assert type(e.value) is ringtier.PoolExhaustedError and isinstance(e.value, BufferError)
    assert e.value.kind == "resource_exhausted" and e.value.errno is None


def test_busy_a_store_opened_twice_for_writing(tiers):
    with ringtier.CheckpointStore(tiers):
        with pytest.raises(BlockingIOError, match="open elsewhere") as e:
            ringtier.CheckpointStore(tiers)
    check(e.value, "busy")


def test_io_a_link_loop_in_a_dataset(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    (root / "a").write_bytes(b"a")
    os.symlink("loop", root / "loop")
    with pytest.raises(OSError, match="symbolic links") as e:
        list(ringtier.Loader(root, keys=["loop"], batch_size=1, on_bad="fail").epoch(0))
    check(e.value, "io", errno.ELOOP)


# misaligned (Direct I/O alignment: the engine aligns every buffer Python can reach) and
# shutdown (an engine thread stopping under a pending request) have no trigger from Python;
# they are checked through the table above, as every kind is.


def test_python_only_kinds_keep_their_classes(tiers):
    store = ringtier.CheckpointStore(tiers)
    store.close()
    with pytest.raises(ValueError, match="closed") as e:
        store.latest()
    assert type(e.value) is ringtier.ClosedError and e.value.kind == "closed" and e.value.errno is None
