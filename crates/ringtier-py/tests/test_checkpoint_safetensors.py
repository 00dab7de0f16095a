"""ringtier.CheckpointStore(format="safetensors"): a step is a safetensors file (or Hugging Face's
sharded layout) that the ``safetensors`` package reads on the fast tier, on the slow tier after
the drain and on S3, and that ``load`` turns back into exactly the state saved; old-format steps
still load; bad states are refused before anything is written; a damaged file is a CorruptError."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from safetensors import safe_open

import ringtier
import ringtier.safetensors as rs

STEP_DIR = "{:020d}"


def part_path(tier: str, step: int, name: str = "model.safetensors", prefix: str = "ckpt") -> Path:
    """Where a part lies on a file tier: ``<tier>/<prefix>/<step, 20 digits>/parts/<name>``."""
    return Path(tier) / prefix / STEP_DIR.format(step) / "parts" / name


def rich_state():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.LayerNorm(4))
    net[0].to(torch.bfloat16)
    g = torch.randn(3, requires_grad=True)
    return {
        "model": net.state_dict(),  # an OrderedDict with _metadata; keys with dots
        "half": torch.randn(5, 3, dtype=torch.float16),
        "transposed": torch.arange(24, dtype=torch.float64).reshape(4, 6).t(),  # not contiguous
        "strided": torch.arange(100, dtype=torch.int16)[::3],
        "empty": torch.empty(0, 5, dtype=torch.float32),
        "scalar": torch.tensor(3.5),
        "bools": torch.tensor([True, False, True]),
        "bytes8": torch.arange(7, dtype=torch.uint8),
        "i64": torch.arange(-3, 3, dtype=torch.int64),
        "complex": torch.randn(3, dtype=torch.complex64),
        "fp8": torch.randn(4).to(torch.float8_e4m3fn),
        "grad": g,
        "nested": {"a": {"b": {"c": torch.ones(2, 2, dtype=torch.int8)}}, "empty": {}},
        "array": np.arange(12, dtype=np.float32).reshape(3, 4),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
        "npbool": np.array([True, False]),
        "npscalar": np.float64(2.25),
        "blob": b"\x00\x01binary",
        "mutable": bytearray(b"abc"),
        "nobytes": b"",
        "step": 7,
        "lr": 1e-3,
        "inf": math.inf,
        "name": "run-1",
        "flags": [True, None, (1, 2, [3])],
        "list_of_tensors": [torch.zeros(2), {"x": torch.ones(1)}],
    }


def assert_same(a, b, path="state"):
    """Same types (dict vs OrderedDict, list vs tuple, bytes vs bytearray), keys in order,
    dtypes, shapes, bytes, requires_grad, plain values."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys or their order differ"
        assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None), f"{path}: _metadata"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.requires_grad) == (b.dtype, b.shape, b.requires_grad), path
        assert a.device.type == b.device.type == "cpu", path
        assert _raw(a) == _raw(b), path
    elif isinstance(a, (np.ndarray, np.generic)):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), path
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def _raw(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()) if t.numel() else b""


def flat_tensors(state, prefix=""):
    """What the file must hold: every tensor / array / bytes by its dotted path (contiguous)."""
    out = {}
    items = state.items() if isinstance(state, dict) else enumerate(state)
    for k, v in items:
        name = f"{prefix}{k}"
        if isinstance(v, (dict, list, tuple)):
            out.update(flat_tensors(v, name + "."))
        elif isinstance(v, torch.Tensor):
            out[name] = v.detach().contiguous()
        elif isinstance(v, (np.ndarray, np.generic)):
            out[name] = torch.from_numpy(np.array(v, order="C"))  # (ascontiguousarray makes 0-d 1-d)
        elif isinstance(v, (bytes, bytearray)):
            out[name] = torch.frombuffer(bytearray(v), dtype=torch.uint8) if v else torch.empty(0, dtype=torch.uint8)
    return out


def assert_file_holds(path: Path, state) -> None:
    """The safetensors package reads the file, and it holds the state's tensors, equal."""
    got = safetensors.torch.load_file(str(path))
    want = flat_tensors(state)
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert _raw(got[name]) == _raw(t), name
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata()["format"] == "pt"


def steps_on_disk(tier: str) -> list:
    root = Path(tier) / "ckpt"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def test_round_trip_every_kind_and_the_file_is_safetensors(tiers):
    state = rich_state()
    with ringtier.CheckpointStore(tiers, format="safetensors") as store:
        assert store.format == "safetensors"
        report = store.save(3, state)
        assert report["step"] == 3 and report["bytes"] == part_path(tiers[0], 3).stat().st_size
        _, _, parts, _ = store.load_parts(3)
        assert [n for n, _ in parts] == ["model.safetensors"]
        back = store.load(3)
        assert_same(state, back)
        assert_same(state, store.load())
    assert_file_holds(part_path(tiers[0], 3), state)
    # ringtier's own reader agrees.
    mine = rs.load_file(part_path(tiers[0], 3))
    assert sorted(mine) == sorted(flat_tensors(state))
    # A state_dict at the top level gives exactly its keys: what model.load_state_dict takes.
    net = torch.nn.Linear(3, 2)
    with ringtier.CheckpointStore(tiers, prefix="m", format="safetensors") as store:
        store.save(1, net.state_dict())
    fresh = torch.nn.Linear(3, 2)
    fresh.load_state_dict(safetensors.torch.load_file(str(part_path(tiers[0], 1, prefix="m"))))
    assert torch.equal(fresh.weight, net.weight) and torch.equal(fresh.bias, net.bias)


def test_slow_tier_after_drain_holds_the_same_file_and_loads_alone(tmp_path, tiers):
    state = rich_state()
    with ringtier.CheckpointStore(tiers, format="safetensors", keep_last=1) as store:
        store.save(1, state)
        store.save(2, {"model": {"w": torch.full((3,), 2.0)}, "step": 2})
        store.drain()
    # keep_last=1: step 1 was evicted from the fast tier once drained; the slow copy is whole.
    assert not part_path(tiers[0], 1).exists()
    assert_file_holds(part_path(tiers[1], 1), state)
    assert part_path(tiers[1], 2).read_bytes() == part_path(tiers[0], 2).read_bytes()
    # A new fast tier: steps load from the slow one.
    with ringtier.CheckpointStore([str(tmp_path / "fresh"), tiers[1]], create=True) as store:
        assert_same(state, store.load(1))
        assert store.load()["step"] == 2


def test_both_formats_load_from_one_store(tiers):
    old = {"w": torch.randn(4, 4), "step": 1, "structured": np.array([(1, 2.0)], dtype=[("x", "<i4"), ("y", "<f8")])}
    new = {"w": torch.randn(4, 4), "step": 2}
    with ringtier.CheckpointStore(tiers) as store:
        assert store.format == "ringtier"
        store.save(1, old)
    with ringtier.CheckpointStore(tiers, format="safetensors") as store:
        store.save(2, new)
        assert [n for n, _ in store.load_parts(1)[2]] == ["state.json", "tensors"]
        assert_same(old, store.load(1))
        assert_same(new, store.load(2))
    with ringtier.CheckpointStore(tiers, read_only=True) as store:  # the default format reads both
        assert_same(new, store.load())
        into = {"w": torch.zeros(4, 4), "step": 0}
        assert store.load(2, into=into) is into
        assert_same(new, into)
        into = {"w": torch.zeros(4, 4), "step": 0, "structured": np.zeros(1, dtype=[("x", "<i4"), ("y", "<f8")])}
        store.load(1, into=into)
        assert_same(old, into)


def test_async_save_copies_so_the_tensors_may_change(tiers):
    w = torch.randn(64, 64)
    want = w.clone()
    with ringtier.CheckpointStore(tiers, format="safetensors") as store:
        fut = store.async_save(5, {"w": w, "note": "async"})
        w.fill_(0)  # after async_save returned: must not reach the checkpoint
        assert fut.result(timeout=60)["step"] == 5
        back = store.load(5)
    assert torch.equal(back["w"], want) and back["note"] == "async"
    assert torch.equal(safetensors.torch.load_file(str(part_path(tiers[0], 5)))["w"], want)


def test_load_into_fills_in_place_and_checks_everything_first(tiers):
    model = {"w": torch.randn(3, 4), "b": torch.randn(4).to(torch.bfloat16)}
    state = {"model": model, "arr": np.arange(3.0), "step": 9}
    with ringtier.CheckpointStore(tiers, format="safetensors") as store:
        store.save(1, state)
        w, b, arr = torch.zeros(3, 4), torch.zeros(4, dtype=torch.bfloat16), np.zeros(3)
        into = {"model": {"w": w, "b": b}, "arr": arr, "step": 0}
        store.load(1, into=into)
        assert into["model"]["w"] is w and torch.equal(w, state["model"]["w"])
        assert torch.equal(b, state["model"]["b"]) and into["arr"] is arr and arr.tolist() == [0.0, 1.0, 2.0]
        assert into["step"] == 9
        # A wrong shape (the last key): a ValueError before anything is written.
        w2 = torch.zeros(3, 4)
        bad = {"model": {"w": w2, "b": torch.zeros(5, dtype=torch.bfloat16)}, "arr": np.zeros(3), "step": 0}
        with pytest.raises(ValueError, match=r"\['b'\].*shape"):
            store.load(1, into=bad)
        assert not w2.any() and bad["step"] == 0
        with pytest.raises(ValueError, match="keys differ"):
            store.load(1, into={"model": {"w": torch.zeros(3, 4)}, "arr": np.zeros(3), "step": 0})


def test_tied_weights_are_written_once_and_load_back_tied(tiers):
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    sd = Tied().state_dict()
    assert sd["embed.weight"] is not sd["head.weight"]  # two tensors, one storage
    base = torch.arange(12.0)
    state = {"model": sd, "whole": base, "part": base[2:6]}  # a partial overlap: written twice
    with ringtier.CheckpointStore(tiers, format="safetensors") as store:
        store.save(1, state)
        back = store.load(1)
    assert back["model"]["embed.weight"] is back["model"]["head.weight"]
    assert torch.equal(back["model"]["head.weight"], sd["embed.weight"])
    assert torch.equal(back["part"], base[2:6]) and torch.equal(back["whole"], base)
    on_disk = safetensors.torch.load_file(str(part_path(tiers[0], 1)))
    # As huggingface's save_model: one name for the shared tensor (the first in the state).
    assert sorted(on_disk) == ["model.embed.weight", "part", "whole"]


def test_sharded_layout_above_max_shard_size(tmp_path, tiers):
    state = {
        "model": {f"layer{i}": {"w": torch.randn(64, 64), "b": torch.randn(64).to(torch.bfloat16)} for i in range(5)},
        "step": 3,
        "big": torch.randn(100, 100),  # 40,000 bytes: larger than a shard, a shard of its own
    }
    with ringtier.CheckpointStore(tiers, format="safetensors", max_shard_size="20KB") as store:
        store.save(1, state)
        store.save(2, {"w": torch.zeros(3)})  # under the limit: one file, no index
        store.drain()
        names = [n for n, _ in store.load_parts(1)[2]]
        assert [n for n, _ in store.load_parts(2)[2]] == ["model.safetensors"]
        assert_same(state, store.load(1))
        into = {
            "model": {
                f"layer{i}": {"w": torch.zeros(64, 64), "b": torch.zeros(64, dtype=torch.bfloat16)} for i in range(5)
            },
            "step": 0,
            "big": torch.zeros(100, 100),
        }
        assert_same(state, store.load(1, into=into))
    count = len(names) - 1
    assert count > 2 and names[-1] == "model.safetensors.index.json"
    assert names[:-1] == [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    for tier in tiers:
        parts = part_path(tier, 1).parent
        index = json.loads((parts / "model.safetensors.index.json").read_text())
        assert index["metadata"]["total_size"] == sum(t.nbytes for t in flat_tensors(state).values())
        want = flat_tensors(state)
        assert sorted(index["weight_map"]) == sorted(want)
        got = {}
        for shard in sorted(set(index["weight_map"].values())):
            got.update(safetensors.torch.load_file(str(parts / shard)))
            assert os.path.getsize(parts / shard) < 48_000
        assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
        # The directory loads as a Hugging Face sharded model (ringtier's reader follows the index).
        whole = rs.load_file(parts)
        assert all(torch.equal(whole[k], want[k]) for k in want)


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ({"a.b": torch.zeros(1), "a": {"b": torch.ones(1)}}, ValueError, r"both be the tensor 'a\.b'"),
        ({"a.": {"b": torch.zeros(1)}, "a": {".b": torch.ones(1)}}, ValueError, r"both be the tensor 'a\.\.b'"),
        ({"x": [torch.zeros(1)], "x.0": torch.ones(1)}, ValueError, r"both be the tensor 'x\.0'"),
        ({"__metadata__": torch.zeros(1)}, ValueError, "reserves"),
        ({"w": torch.zeros(2), 3: torch.zeros(1)}, TypeError, "must be strings"),
        ({"w": torch.zeros(2), "o": object()}, TypeError, r"state\['o'\].*object"),
        ({"w": torch.zeros(2), "s": {1, 2}}, TypeError, "builtins.set"),
        ({"c": torch.zeros(2, dtype=torch.complex128)}, TypeError, "no dtype for torch.complex128"),
        ({"w": torch.zeros(2), "sp": torch.eye(3).to_sparse()}, TypeError, "sparse"),
        ({"w": torch.zeros(2), "m": torch.empty(3, device="meta")}, ValueError, "meta device"),
        ({"w": torch.zeros(2), "be": np.arange(3, dtype=">f4")}, TypeError, "no dtype for numpy >f4"),
        ({"w": torch.zeros(2), "st": np.zeros(2, dtype=[("x", "<i4")])}, TypeError, "no dtype for numpy"),
        ({"w": torch.zeros(2), "obj": np.array([None, 1], dtype=object)}, TypeError, "no dtype for numpy"),
        ([torch.zeros(1)], TypeError, "must be a dict"),
    ],
)
def test_bad_states_are_refused_and_leave_no_step(tiers, bad, error, match):
    with ringtier.CheckpointStore(tiers, format="safetensors") as store:
        with pytest.raises(error, match=match):
            store.save(1, bad)
        with pytest.raises(error, match=match):
            store.async_save(1, bad)
        assert store.list() == [] and steps_on_disk(tiers[0]) == []
        # Nothing half-made blocks the step: the same step saves and loads.
        store.save(1, {"w": torch.ones(2)})
        assert torch.equal(store.load(1)["w"], torch.ones(2))


def test_plain_values_past_the_header_limit_are_refused(tiers):
    with ringtier.CheckpointStore(tiers, format="safetensors") as store:
        with pytest.raises(ringtier.InvalidInputError, match="limit of 100000000"):
            store.save(1, {"w": torch.zeros(1), "notes": "x" * 100_000_000})
        assert store.list() == [] and steps_on_disk(tiers[0]) == []


def test_keys_that_look_like_paths_are_only_names(tiers):
    state = {"../../escape": torch.ones(2), "a/b": {"..": torch.zeros(3)}, "": {"x": torch.ones(1)}}
    with ringtier.CheckpointStore(tiers, format="safetensors") as store:
        store.save(1, state)
        assert_same(state, store.load(1))
    files = sorted(str(p.relative_to(tiers[0])) for p in Path(tiers[0]).rglob("*") if p.is_file())
    assert files == [".ringtier-lock-ckpt-ckpt", "ckpt/00000000000000000001/MANIFEST.json",
                     "ckpt/00000000000000000001/parts/model.safetensors"]
    assert sorted(safetensors.torch.load_file(str(part_path(tiers[0], 1)))) == ["../../escape", ".x", "a/b..."]


def test_bad_options(tiers):
    with pytest.raises(ValueError, match="format must be one of"):
        ringtier.CheckpointStore(tiers, format="pickle")
    with pytest.raises(ValueError, match="format='safetensors' only"):
        ringtier.CheckpointStore(tiers, max_shard_size=1000)
    with pytest.raises(ValueError, match="positive"):
        ringtier.CheckpointStore(tiers, format="safetensors", max_shard_size=0)
    with pytest.raises(ValueError, match="max_shard_size"):
        ringtier.CheckpointStore(tiers, format="safetensors", max_shard_size="lots")


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_damaged_file_is_corrupt_and_the_slow_copy_serves(tmp_path, tiers):
    state = {"w": torch.randn(256, 256), "step": 1}
    with ringtier.CheckpointStore(tiers, format="safetensors", keep_last=5) as store:
        store.save(1, state)
        store.drain()
    _flip(part_path(tiers[0], 1), 50_000)  # tensor data, fast copy
    with ringtier.CheckpointStore(tiers, format="safetensors", read_only=True) as store:
        step, tier, parts, fallbacks = store.load_parts(1)
        assert tier == tiers[1] or tiers[1] in tier
        assert fallbacks and "mismatch" in " ".join(fallbacks)
        assert_same(state, store.load(1))
    # Only the damaged copy: a CorruptError.
    with ringtier.CheckpointStore([tiers[0]], read_only=True) as store:
        with pytest.raises(ringtier.CorruptError, match="mismatch"):
            store.load(1)
        with pytest.raises(ringtier.CorruptError, match="mismatch"):
            store.load(1, into={"w": torch.zeros(256, 256), "step": 0})
    _flip(part_path(tiers[0], 1), 3)  # the header's length field
    with ringtier.CheckpointStore([tiers[0]], read_only=True) as store:
        with pytest.raises(ringtier.CorruptError):
            store.load(1)


def _hostile(header: bytes, data: bytes = b"") -> bytes:
    return len(header).to_bytes(8, "little") + header + data


def _with_tree(tree, **tensors) -> bytes:
    """A header whose __metadata__ holds ``tree`` as this format's state, and ``tensors``."""
    state = json.dumps({"format": "ringtier-py-safetensors", "version": 1, "tree": tree})
    return json.dumps({"__metadata__": {"ringtier.state": state}, **tensors}).encode()


@pytest.mark.parametrize(
    "content, match",
    [
        (b"\x07", "shorter than the 8-byte"),
        ((1000).to_bytes(8, "little") + b"{}      ", "past the end"),
        ((2**60).to_bytes(8, "little") + b"{}", "more than the limit"),
        (_hostile(b'{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', bytes(8)), "takes 12 bytes"),
        (_hostile(b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', bytes(8)), "ringtier.state"),
        (_hostile(_with_tree({"d": [["x", {"t": "gone"}]]})), "no file of the checkpoint holds"),
        (
            _hostile(_with_tree({"d": [["x", {"n": "w"}]]}, w={"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}),
                     b"\0\0"),
            "no numpy dtype",
        ),
        (_hostile(_with_tree({"d": [["x", {"zz": 1}]]})), "none of the known keys"),
        (_hostile(_with_tree([1, 2])), "tree is not a dict"),
        (_hostile(json.dumps({"__metadata__": {"ringtier.state": "{nope"}}).encode()), "not JSON"),
    ],
)
def test_hostile_file_with_a_good_checksum_is_corrupt(tiers, content, match):
    """A part whose checksum is right but whose content is not a state this format wrote
    (written through the raw part API, as a tampering writer could)."""
    with ringtier.CheckpointStore(tiers) as store:
        store._store.save(1, [("model.safetensors", [content])])
        with pytest.raises(ringtier.CorruptError, match=match):
            store.load(1)
        with pytest.raises(ringtier.CorruptError, match=match):
            store.load(1, into={"x": torch.zeros(1)})
        with pytest.warns(RuntimeWarning, match="checkpoint 1 skipped"):
            assert store.load(into={"x": torch.zeros(1)}) is None


def test_hostile_shard_index_is_corrupt(tiers):
    shard = safetensors.torch.save({"w": torch.zeros(2)})
    cases = [
        ({"weight_map": {"w": "model-00002-of-00002.safetensors"}}, "does not hold"),
        ({"weight_map": {"w": "model-00001-of-00001.safetensors", "v": "model-00001-of-00001.safetensors"}}, "'v'"),
        ({"weight_map": {"w": 7}}, "not a file name"),
        ({"metadata": {}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}, "has no 'ringtier.state'"),
        ([], "no weight_map"),
    ]
    with ringtier.CheckpointStore(tiers) as store:
        for step, (index, match) in enumerate(cases, 1):
            parts = [("model-00001-of-00001.safetensors", [shard]), ("model.safetensors.index.json", [json.dumps(index)])]
            store._store.save(step, [(n, [b.encode() if isinstance(b, str) else b for b in bufs]) for n, bufs in parts])
            with pytest.raises(ringtier.CorruptError, match=match):
                store.load(step)


def test_save_writes_from_tensor_memory(tmp_path):
    """A 256 MiB tensor is saved without a second copy of it: the process's peak RSS grows by
    about the writer's chunk buffers, not by the tensor (measured in a fresh process)."""
    code = textwrap.dedent(
        f"""
        import resource, torch, ringtier
        t = torch.ones(64 << 20)  # 256 MiB, touched
        store = ringtier.CheckpointStore([{str(tmp_path / 'f')!r}], create=True, format="safetensors",
                                         chunk_bytes=4 << 20, engine="posix")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        store.save(1, {{"model": {{"w": t}}, "step": 1}})
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        store.close()
        print((after - before) // 1024)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    grew_mib = int(out.stdout.split()[-1])
    assert grew_mib < 96, f"peak RSS grew by {grew_mib} MiB saving a 256 MiB tensor"
    assert (tmp_path / "f" / "ckpt" / STEP_DIR.format(1) / "parts" / "model.safetensors").stat().st_size > 256 << 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_tensors_are_saved_from_the_host_and_load_on_the_cpu(tiers):
    state = {"w": torch.randn(8, 8, device="cuda"), "b": torch.randn(8, device="cuda").to(torch.bfloat16)}
    with ringtier.CheckpointStore(tiers, format="safetensors") as store:
        store.save(1, state)
        back = store.load(1)
    assert back["w"].device.type == "cpu" and torch.equal(back["w"], state["w"].cpu())
    assert torch.equal(back["b"], state["b"].cpu())


# --- S3: the drained object is a safetensors file -------------------------------------------

import s3_servers  # noqa: E402  (the test kit's servers, tests/s3_servers.py)


@pytest.fixture(scope="module", params=["s3s-fs", "moto"])
def server(request, tmp_path_factory):
    if not ringtier._ringtier.HAS_S3:
        pytest.skip("built without feature s3")
    yield from s3_servers.servers(request.param, tmp_path_factory.mktemp("s3"))


@pytest.fixture
def s3(server, monkeypatch):
    for k, v in s3_servers.aws_env().items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    return server


def _object_bytes(server, bucket: str, key: str) -> bytes:
    if server.root is not None:  # s3s-fs: the object is this file
        return (server.root / bucket / key).read_bytes()
    # moto: every object under the step's parts/ prefix, read by ringtier's loader (S3 GETs).
    parts, _, name = key.rpartition("/")
    loader = ringtier.Loader(server.url(bucket, parts), batch_size=8, shuffle=False)
    got = {s.key: s.to_bytes() for batch in loader.epoch(0) for s in batch}
    return got[name]


def test_drained_s3_object_is_a_safetensors_file(s3, tmp_path):
    bucket = s3.create_bucket()
    url = s3.url(bucket, "run1")
    state = rich_state()
    with ringtier.CheckpointStore([str(tmp_path / "fast"), url], create=True, format="safetensors") as store:
        store.save(4, state)
        store.drain()
    key = f"run1/ckpt/{STEP_DIR.format(4)}/parts/model.safetensors"
    blob = _object_bytes(s3, bucket, key)
    assert blob == part_path(str(tmp_path / "fast"), 4).read_bytes()
    got = safetensors.torch.load(blob)
    want = flat_tensors(state)
    assert sorted(got) == sorted(want) and all(_raw(got[k]) == _raw(want[k]) for k in want)
    # ringtier's reader over the S3 URL, and a restore from S3 alone.
    obj_url = s3.url(bucket, key)
    assert sorted(rs.load_file(obj_url)) == sorted(want)
    shutil.rmtree(tmp_path / "fast")
    with ringtier.CheckpointStore([str(tmp_path / "fast2"), url], create=True) as store:
        assert_same(state, store.load())
