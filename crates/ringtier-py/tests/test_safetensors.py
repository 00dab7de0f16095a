"""ringtier.safetensors against the ``safetensors`` package: files each writes read back by the
other, byte-identical saves, every dtype torch has, sharded models, lazy access, ``into=``, the
thread-pool engine, S3, hostile files, and CUDA reported absent."""

from __future__ import annotations

import json
import struct

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

import ringtier  # noqa: E402
from ringtier import safetensors as rs  # noqa: E402

# Every torch dtype the format has (names as the header spells them).
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "U64": getattr(torch, "uint64", None),
    "U32": getattr(torch, "uint32", None),
    "U16": getattr(torch, "uint16", None),
    "C64": torch.complex64,
    "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
    "F8_E4M3FNUZ": getattr(torch, "float8_e4m3fnuz", None),
    "F8_E5M2": getattr(torch, "float8_e5m2", None),
    "F8_E5M2FNUZ": getattr(torch, "float8_e5m2fnuz", None),
    "F8_E8M0": getattr(torch, "float8_e8m0fnu", None),
    "F4": getattr(torch, "float4_e2m1fn_x2", None),
}


def random_bytes_tensor(dtype, shape, seed):
    """A tensor of ``dtype`` whose bytes are random (any bit pattern, NaNs included)."""
    g = torch.Generator().manual_seed(seed)
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = 1
    for d in shape:
        n *= d
    raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def same(a, b):
    """Same dtype, shape and bytes (NaN-safe)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    assert bytes(a.contiguous().reshape(-1).view(torch.uint8).numpy()) == bytes(
        b.contiguous().reshape(-1).view(torch.uint8).numpy()
    )


def mixed(seed=0):
    t = {
        "embed.weight": random_bytes_tensor(torch.bfloat16, (1000, 768), seed),
        "layers.0.attn.q": random_bytes_tensor(torch.float32, (513, 129), seed + 1),
        "layers.0.norm": random_bytes_tensor(torch.float16, (768,), seed + 2),
        "step": torch.tensor(7, dtype=torch.int64),
        "empty": torch.zeros(0, 4),
        "mask": random_bytes_tensor(torch.bool, (33,), seed + 3),
        "ids": random_bytes_tensor(torch.int32, (17, 3), seed + 4),
    }
    return t


def test_every_torch_dtype_round_trips_both_ways_and_byte_identical(tmp_path):
    tensors = {}
    for i, (name, dt) in enumerate(DTYPES.items()):
        if dt is None:
            continue
        shape = (3, 4)
        tensors[f"t.{name}"] = random_bytes_tensor(dt, shape, i)
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    rs.save_file(tensors, ours, metadata={"format": "pt"})
    # Which dtypes the installed safetensors can write (0.8 writes every dtype here).
    writable = {}
    for k, v in tensors.items():
        try:
            st.save({k: v})
            writable[k] = v
        except Exception:  # noqa: BLE001 - a dtype the package lacks
            pass
    assert len(writable) >= 17, sorted(set(tensors) - set(writable))
    st.save_file(writable, theirs, metadata={"format": "pt"})
    # Byte-identical for the same dict.
    rs.save_file(writable, tmp_path / "ours2.safetensors", metadata={"format": "pt"})
    assert (tmp_path / "ours2.safetensors").read_bytes() == theirs.read_bytes()
    # Ours read by theirs, theirs by ours; and ours by ours (every dtype).
    back = st.load_file(str(tmp_path / "ours2.safetensors"))
    for k, v in writable.items():
        same(back[k], v)
    mine = rs.load_file(theirs)
    assert set(mine) == set(writable)
    for k, v in writable.items():
        same(mine[k], v)
    for k, v in rs.load_file(ours).items():
        same(v, tensors[k])


def test_mixed_model_both_ways_and_with_posix_engine(tmp_path):
    t = mixed()
    st.save_file(t, tmp_path / "a.safetensors")
    for engine in ("auto", "posix", "uring"):
        try:
            got = rs.load_file(tmp_path / "a.safetensors", engine=engine)
        except ringtier.RingtierError as e:
            assert engine == "uring", e  # io_uring refused here: only an explicit ask fails
            continue
        assert set(got) == set(t)
        for k in t:
            same(got[k], t[k])
    rs.save_file(t, tmp_path / "b.safetensors", engine="posix")
    assert (tmp_path / "b.safetensors").read_bytes() == (tmp_path / "a.safetensors").read_bytes()


def test_tensors_are_views_of_one_aligned_buffer_kept_alive(tmp_path):
    t = mixed()
    rs.save_file(t, tmp_path / "m.safetensors")
    got = rs.load_file(tmp_path / "m.safetensors")
    w = got["embed.weight"]
    del got
    import gc

    gc.collect()
    same(w, t["embed.weight"])  # the buffer lives as long as a view
    w.add_(1)  # writable, as safetensors' tensors are
    assert w.untyped_storage().data_ptr() % 8 == 0


def test_sharded_save_and_load_in_one_call(tmp_path):
    t = mixed()
    files = rs.save_sharded(t, tmp_path / "sharded", max_shard_size=1_000_000, metadata={"format": "pt"})
    assert files[-1] == rs.INDEX_FILE and len(files) >= 3, files
    index = json.loads((tmp_path / "sharded" / rs.INDEX_FILE).read_text())
    total = sum(v.numel() * v.element_size() for v in t.values())
    assert index["metadata"]["total_size"] == total
    assert set(index["weight_map"]) == set(t)
    # Each shard is a file the safetensors package reads.
    theirs = {}
    for name in sorted(set(index["weight_map"].values())):
        theirs.update(st.load_file(tmp_path / "sharded" / name))
    # One call: the index, or the directory holding it.
    for path in (tmp_path / "sharded" / rs.INDEX_FILE, tmp_path / "sharded"):
        got = rs.load_file(path)
        assert set(got) == set(t)
        for k in t:
            same(got[k], t[k])
            same(theirs[k], t[k])
    # One shard: model.safetensors, no index; a directory loads it.
    assert rs.save_sharded(t, tmp_path / "one") == ["model.safetensors"]
    same(rs.load_file(tmp_path / "one")["ids"], t["ids"])


def test_mmap_load_every_dtype_sharded_copy_on_write_and_refusals(tmp_path):
    """load_file(mmap=True): the same tensors as safetensors' (every dtype, a sharded model,
    empty tensors), views of the file's pages that a write does not reach (copy-on-write); a
    file changed since it was opened, into=, S3-only sides and bad values refused."""
    tensors = {f"t.{n}": random_bytes_tensor(dt, (5, 7), i) for i, (n, dt) in enumerate(DTYPES.items()) if dt is not None}
    tensors.update(mixed(3))
    rs.save_sharded(tensors, tmp_path / "m", max_shard_size=300_000, metadata={"format": "pt"})
    index = json.loads((tmp_path / "m" / rs.INDEX_FILE).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2
    before = {f: (tmp_path / "m" / f).read_bytes() for f in shards}
    for depth, chunk in ((None, None), (1, 4096), (7, 65536)):
        got = rs.load_file(tmp_path / "m", mmap=True, depth=depth, chunk_bytes=chunk)
        assert set(got) == set(tensors)
        for k, v in tensors.items():
            same(got[k], v)
    w = got["embed.weight"]
    del got
    import gc

    gc.collect()
    same(w, tensors["embed.weight"])  # the mapping lives as long as a view
    w.view(torch.uint8).fill_(0)  # writable, copy-on-write: the file keeps its bytes
    del w
    assert {f: (tmp_path / "m" / f).read_bytes() for f in shards} == before
    one = tmp_path / "one.safetensors"
    st.save_file(mixed(4), one)
    for k, v in rs.load_file(one, mmap=True).items():
        same(v, mixed(4)[k])
    # A file that changed size after its header was read (here: between open and map).
    model = ringtier._ringtier.SafetensorsModel(str(tmp_path), "one.safetensors")
    with open(one, "ab") as f:
        f.write(b"x" * 10)
    with pytest.raises(ringtier.CorruptError, match="changed since it was opened"):
        model.map_all()
    with pytest.raises(ringtier.InvalidInputError, match="into="):
        rs.load_file(tmp_path / "m", mmap=True, into={"ids": torch.empty(17, 3, dtype=torch.int32)})
    for bad in ("yes", 1, None):
        with pytest.raises(ringtier.InvalidInputError, match="mmap"):
            rs.load_file(tmp_path / "m", mmap=bad)
    with pytest.raises(ringtier.InvalidInputError, match="depth"):
        rs.load_file(tmp_path / "m", mmap=True, depth=0)


def test_safe_open_lazy_access(tmp_path):
    t = mixed()
    st.save_file(t, tmp_path / "m.safetensors", metadata={"k": "v"})
    with rs.safe_open(tmp_path / "m.safetensors", framework="pt") as f, st_safe_open(tmp_path / "m.safetensors") as g:
        assert f.keys() == sorted(t) == sorted(g.keys())
        assert f.metadata() == g.metadata() == {"k": "v"}
        for k in f.keys():
            same(f.get_tensor(k), g.get_tensor(k))
        with pytest.raises(ringtier.NotFoundError):
            f.get_tensor("nope")
    with pytest.raises(ringtier.UnsupportedError):
        rs.safe_open(tmp_path / "m.safetensors", framework="flax")


def st_safe_open(path):
    from safetensors import safe_open

    return safe_open(str(path), framework="pt")


def test_into_fills_caller_tensors_in_place(tmp_path):
    t = mixed()
    st.save_file(t, tmp_path / "m.safetensors")
    into = {k: torch.empty_like(v) for k, v in t.items() if k != "step"}
    ptrs = {k: v.data_ptr() for k, v in into.items()}
    out = rs.load_file(tmp_path / "m.safetensors", into=into, chunk_bytes=65536, depth=4)
    assert out is into
    for k, v in into.items():
        assert v.data_ptr() == ptrs[k]
        same(v, t[k])
    with pytest.raises(ringtier.InvalidInputError):
        rs.load_file(tmp_path / "m.safetensors", into={"ids": torch.empty(17, 3)})  # float32, file has int32
    with pytest.raises(ringtier.NotFoundError):
        rs.load_file(tmp_path / "m.safetensors", into={"ghost": torch.empty(1)})


@pytest.mark.parametrize("staging", [1, 5000, 60_000, 1 << 30])
def test_device_streaming_through_two_staging_buffers(tmp_path, staging):
    """The path of device="cuda" (two staging buffers in turn, windows of tensors read while the
    last are copied out), run with a CPU device: every tensor equal to what safetensors loads,
    whatever the window (one tensor each, a few, all at once), over shards and empty tensors."""
    t = mixed(9)
    t.update({f"more.{i}": random_bytes_tensor(torch.float16, (37, 11 + i), 20 + i) for i in range(6)})
    rs.save_sharded(t, tmp_path / "sh", max_shard_size=300_000)
    model = ringtier._ringtier.SafetensorsModel(str(tmp_path / "sh"), rs.INDEX_FILE, "auto")
    entries = model.tensors()
    got = rs._stream_to_device(model, entries, torch.device("cpu"), staging, 3, 8192)
    assert set(got) == set(t)
    for k, v in t.items():
        same(got[k], v)
    windows = rs._windows([e for e in entries if e[5] > e[4]], staging)
    assert sum(len(w) for w in windows) == sum(1 for e in entries if e[5] > e[4])
    assert all(len(w) == 1 or sum(e[5] - e[4] for e in w) <= staging for w in windows)
    with pytest.raises(ringtier.InvalidInputError, match="staging_bytes"):
        rs.load_file(tmp_path / "sh", staging_bytes=0)
    with pytest.raises(ringtier.InvalidInputError, match="meta"):
        rs.load_file(tmp_path / "sh", device="meta")


def test_into_reads_only_what_its_tensors_cover(tmp_path):
    """into= one small tensor between two large ones reads that tensor's chunk, not the whole
    file: the io_uring reads submitted, counted by the metrics (a process of its own: the
    exporter is process-wide), against a load of the whole file."""
    import subprocess
    import sys
    import textwrap

    big = {"a": torch.zeros(8 << 20, dtype=torch.uint8), "small": torch.arange(100, dtype=torch.int64),
           "z": torch.ones(8 << 20, dtype=torch.uint8)}
    st.save_file(big, str(tmp_path / "big.safetensors"))
    script = textwrap.dedent(
        f"""
        import torch, ringtier
        from ringtier import safetensors as rs
        ringtier.serve_metrics("127.0.0.1:0")
        def entries():
            return sum(float(l.split()[-1]) for l in ringtier.metrics_text().splitlines()
                       if l.startswith("ringtier_uring_submitted_entries_total"))
        path = {str(tmp_path / "big.safetensors")!r}
        out = rs.load_file(path, into={{"small": torch.empty(100, dtype=torch.int64)}}, chunk_bytes=1 << 20)
        assert torch.equal(out["small"], torch.arange(100)), out["small"]
        part = entries()
        rs.load_file(path, chunk_bytes=1 << 20)
        print(part, entries() - part)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    part, whole = (float(x) for x in out.stdout.split()[-2:])
    if whole == 0:
        pytest.skip("io_uring is refused here: no submissions to count")
    assert whole >= 16, out.stdout  # 16 MiB in 1 MiB chunks, and the header
    assert part <= 4, out.stdout  # the header, and the chunk holding the small tensor


def test_cuda_absent_is_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: bench/safetensors/gpu_check.py checks device='cuda' there")
    st.save_file({"a": torch.ones(2)}, tmp_path / "m.safetensors")
    with pytest.raises(ringtier.UnsupportedError, match="CUDA is not available"):
        rs.load_file(tmp_path / "m.safetensors", device="cuda")
    with pytest.raises(ringtier.UnsupportedError):
        rs.safe_open(tmp_path / "m.safetensors", framework="pt", device="cuda:0")


def test_save_refuses_what_safetensors_refuses(tmp_path):
    base = torch.zeros(4, 4)
    with pytest.raises(ValueError, match="non contiguous"):
        rs.save_file({"a": base.t()}, tmp_path / "x.safetensors")
    with pytest.raises(RuntimeError, match="share memory"):
        rs.save_file({"a": base, "b": base[1]}, tmp_path / "x.safetensors")
    with pytest.raises(ValueError):
        rs.save_file({"a": base}, tmp_path / "x.safetensors", metadata={"k": 1})
    with pytest.raises(ValueError):
        rs.save_file([base], tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


def write_raw(path, header, data: bytes, length=None):
    j = json.dumps(header, separators=(",", ":")).encode() if isinstance(header, dict) else header
    path.write_bytes(struct.pack("<Q", len(j) if length is None else length) + j + data)


@pytest.mark.parametrize(
    "case",
    ["length_past_file", "claim_100mb", "overlap", "past_end", "dtype_shape", "not_utf8", "not_json", "tiny"],
)
def test_hostile_files_are_corrupt_errors(tmp_path, case):
    p = tmp_path / "bad.safetensors"
    u8 = lambda a, b: {"dtype": "U8", "shape": [b - a], "data_offsets": [a, b]}  # noqa: E731
    if case == "length_past_file":
        write_raw(p, {"a": u8(0, 4)}, b"\0" * 4, length=10_000)
    elif case == "claim_100mb":
        write_raw(p, b"{}", b"", length=100_000_001)
    elif case == "overlap":
        write_raw(p, {"a": u8(0, 4), "b": u8(2, 6)}, b"\0" * 6)
    elif case == "past_end":
        write_raw(p, {"a": u8(0, 64)}, b"\0" * 8)
    elif case == "dtype_shape":
        write_raw(p, {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8)
    elif case == "not_utf8":
        write_raw(p, b'{"\xff\xfe":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0")
    elif case == "not_json":
        write_raw(p, b"{not json", b"")
    elif case == "tiny":
        p.write_bytes(b"\x01\x02")
    with pytest.raises(ringtier.CorruptError) as e:
        rs.load_file(p)
    assert isinstance(e.value, ringtier.RingtierError) and e.value.kind == "corrupt"
    with pytest.raises(ringtier.CorruptError):
        rs.safe_open(p, framework="pt")


def test_missing_file_and_bad_index(tmp_path):
    with pytest.raises(ringtier.NotFoundError):
        rs.load_file(tmp_path / "nope.safetensors")
    (tmp_path / rs.INDEX_FILE).write_text(json.dumps({"weight_map": {"a": "missing.safetensors"}}))
    with pytest.raises(ringtier.NotFoundError):
        rs.load_file(tmp_path)
    st.save_file({"b": torch.ones(1)}, tmp_path / "s.safetensors")
    (tmp_path / rs.INDEX_FILE).write_text(json.dumps({"weight_map": {"a": "s.safetensors"}}))
    with pytest.raises(ringtier.CorruptError, match="does not hold it"):
        rs.load_file(tmp_path / rs.INDEX_FILE)


@pytest.mark.skipif(not ringtier._ringtier.HAS_S3, reason="built without feature s3")
def test_s3_load_and_save(tmp_path, monkeypatch):
    from s3_servers import aws_env, servers

    for k, v in aws_env().items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    gen = servers("s3s-fs", tmp_path / "srv")
    server = next(gen)
    try:
        bucket = server.create_bucket()
        t = mixed(5)
        local = tmp_path / "m.safetensors"
        st.save_file(t, local)
        server.put(bucket, "models/m.safetensors", local.read_bytes())
        url = server.url(bucket, "models/m.safetensors")
        got = rs.load_file(url)
        for k in t:
            same(got[k], t[k])
        with rs.safe_open(url, framework="pt") as f:
            same(f.get_tensor("ids"), t["ids"])
        # Saved to S3 (a completed upload), byte-identical, read back sharded too.
        rs.save_file(t, server.url(bucket, "out/x.safetensors"))
        assert (server.root / bucket / "out" / "x.safetensors").read_bytes() == local.read_bytes()
        files = rs.save_sharded(t, server.url(bucket, "sh"), max_shard_size=1_000_000)
        assert files[-1] == rs.INDEX_FILE
        got = rs.load_file(server.url(bucket, "sh/" + rs.INDEX_FILE))
        for k in t:
            same(got[k], t[k])
        with pytest.raises(ringtier.UnsupportedError, match="mmap=True maps files"):
            rs.load_file(url, mmap=True)
        module = _module_of({k: torch.zeros_like(v) for k, v in t.items()})
        assert rs.load_model(module, url) == ([], [])
        for k, v in module.state_dict().items():
            same(v, t[k])
    finally:
        gen.close()


def _module_of(tensors):
    """A torch.nn.Module whose state_dict is ``tensors`` (as buffers: any dtype), named alike."""
    root = torch.nn.Module()
    for name, t in tensors.items():
        *path, leaf = name.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, torch.nn.Module())
            mod = getattr(mod, part)
        mod.register_buffer(leaf, t)
    return root


def test_load_model_every_dtype(tmp_path):
    t = {f"d.{name}": random_bytes_tensor(dt, (6, 4), i) for i, (name, dt) in enumerate(DTYPES.items()) if dt is not None}
    st.save_file(t, str(tmp_path / "all.safetensors"))
    module = _module_of({k: torch.zeros_like(v) for k, v in t.items()})
    assert rs.load_model(module, tmp_path / "all.safetensors", chunk_bytes=4096, depth=2) == ([], [])
    for k, v in module.state_dict().items():
        same(v, t[k])


class _Tied(torch.nn.Module):
    """A small model with a tied weight, a float64 buffer and a non-contiguous parameter."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(300, 64)
        self.proj = torch.nn.Linear(64, 300, bias=True)
        self.proj.weight = self.embed.weight  # tied: one memory under two names
        self.norm = torch.nn.LayerNorm(64)
        self.register_buffer("scale", torch.zeros(5, dtype=torch.float64))
        self.t = torch.nn.Parameter(torch.zeros(16, 8).t())  # a transposed view: not contiguous


def test_load_model_fills_the_models_own_memory_as_safetensors_does(tmp_path):
    """load_model against safetensors.torch.load_model on the same file: the same tensors, the
    same (missing, unexpected), the model's memory reused (no fresh tensors), tied names loaded
    once, a non-contiguous parameter and one of another dtype copied in, sharded files too."""
    src = _Tied()
    with torch.no_grad():
        for p in src.parameters():
            p.copy_(torch.randn_like(p))
        src.scale.copy_(torch.arange(5, dtype=torch.float64))
    st.save_model(src, str(tmp_path / "m.safetensors"))  # drops the tied duplicate as HF does
    want = {k: v.clone() for k, v in src.state_dict().items()}

    ours, theirs = _Tied(), _Tied()
    ptrs = {k: v.data_ptr() for k, v in ours.state_dict().items()}
    got = rs.load_model(ours, tmp_path / "m.safetensors", chunk_bytes=65536, depth=3)
    exp = st.load_model(theirs, str(tmp_path / "m.safetensors"))
    assert (sorted(got[0]), sorted(got[1])) == (sorted(exp[0]), sorted(exp[1])) == ([], [])
    for k, v in ours.state_dict().items():
        assert v.data_ptr() == ptrs[k], k
        same(v, want[k])
        same(v, theirs.state_dict()[k])
    assert ours.proj.weight is ours.embed.weight

    # Another dtype in the model than in the file: copied with conversion, as load_state_dict does.
    half = _Tied().to(torch.float64)
    rs.load_model(half, tmp_path / "m.safetensors")
    assert half.norm.weight.dtype == torch.float64
    assert torch.equal(half.norm.weight, want["norm.weight"].to(torch.float64))

    # Sharded, through the index, into a model already in memory.
    rs.save_sharded(dict(st.load_file(str(tmp_path / "m.safetensors"))), tmp_path / "sh", max_shard_size=40_000)
    again = _Tied()
    assert rs.load_model(again, tmp_path / "sh") == ([], [])
    for k, v in again.state_dict().items():
        same(v, want[k])


def test_save_model_writes_what_safetensors_writes_and_load_model_reads_it(tmp_path):
    """save_model of a model with a tied weight and a non-contiguous parameter: the bytes
    safetensors.torch.save_model writes, with and without the caller's metadata (the caller's
    dict left as it was); load_model fills a fresh model from it, tied names included; memory
    shared in part only is refused as safetensors refuses it."""
    m = _Tied()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p))
    rs.save_model(m, tmp_path / "ours.safetensors")
    st.save_model(m, str(tmp_path / "theirs.safetensors"))
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    mine = {"format": "pt", "proj.weight": "mine"}
    rs.save_model(m, tmp_path / "ours-meta.safetensors", metadata=mine)
    assert mine == {"format": "pt", "proj.weight": "mine"}
    st.save_model(m, str(tmp_path / "theirs-meta.safetensors"), metadata=dict(mine))
    # Several metadata keys: safetensors writes them in its process's hash order (random per
    # process), ringtier sorted; the same metadata, tensors and data bytes either way.
    ours, theirs = (tmp_path / "ours-meta.safetensors").read_bytes(), (tmp_path / "theirs-meta.safetensors").read_bytes()
    (n_ours,), (n_theirs,) = struct.unpack("<Q", ours[:8]), struct.unpack("<Q", theirs[:8])
    assert json.loads(ours[8 : 8 + n_ours]) == json.loads(theirs[8 : 8 + n_theirs])
    assert json.loads(ours[8 : 8 + n_ours])["__metadata__"] == {"format": "pt", "proj.weight": "mine"}
    assert ours[8 + n_ours :] == theirs[8 + n_theirs :]

    back = _Tied()
    assert rs.load_model(back, tmp_path / "ours.safetensors") == ([], [])
    for k, v in back.state_dict().items():
        same(v, m.state_dict()[k].contiguous())

    class Sliced(torch.nn.Module):
        def __init__(self):
            super().__init__()
            base = torch.arange(10.0)
            self.register_buffer("a", base[:6])
            self.register_buffer("b", base[4:])

    with pytest.raises(ringtier.InvalidInputError, match="none of them covers all of it"):
        rs.save_model(Sliced(), tmp_path / "sliced.safetensors")
    with pytest.raises(RuntimeError):
        st.save_model(Sliced(), str(tmp_path / "sliced-theirs.safetensors"))
    assert not (tmp_path / "sliced.safetensors").exists()
    with pytest.raises(ringtier.InvalidInputError, match="torch.nn.Module"):
        rs.save_model({"a": torch.ones(1)}, tmp_path / "x.safetensors")


def test_load_model_refuses_before_touching_the_model(tmp_path):
    """Missing and unexpected names under strict, a shape that differs, the meta device and a
    wrong type are each an InvalidInputError raised before a byte is read: the model keeps its
    weights. strict=False loads the names both have and says what it left."""
    src = _Tied()
    st.save_model(src, str(tmp_path / "m.safetensors"))
    sd = dict(st.load_file(str(tmp_path / "m.safetensors")))
    sd["extra"] = torch.ones(3)
    del sd["norm.bias"]
    st.save_file(sd, str(tmp_path / "odd.safetensors"))

    m = _Tied()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(ringtier.InvalidInputError, match=r"missing \['norm.bias'\].*unexpected \['extra'\]"):
        rs.load_model(m, tmp_path / "odd.safetensors")
    for k, v in m.state_dict().items():
        same(v, before[k])
    exp = st.load_model(_Tied(), str(tmp_path / "odd.safetensors"), strict=False)
    assert rs.load_model(m, tmp_path / "odd.safetensors", strict=False) == (list(exp[0]), list(exp[1]))
    same(m.norm.bias, before["norm.bias"])
    same(m.embed.weight, src.embed.weight.detach())

    small = _Tied()
    small.norm = torch.nn.LayerNorm(32)
    with pytest.raises(ringtier.InvalidInputError, match=r"'norm.weight' is \[32\] in the model, \[64\] in the file"):
        rs.load_model(small, tmp_path / "m.safetensors")
    with torch.device("meta"):
        meta = _Tied()
    with pytest.raises(ringtier.InvalidInputError, match="meta device"):
        rs.load_model(meta, tmp_path / "m.safetensors")
    with pytest.raises(ringtier.InvalidInputError, match="torch.nn.Module"):
        rs.load_model(dict(sd), tmp_path / "m.safetensors")
    with pytest.raises(ringtier.InvalidInputError, match="strict"):
        rs.load_model(_Tied(), tmp_path / "m.safetensors", strict="yes")
    with pytest.raises(ringtier.NotFoundError):
        rs.load_model(_Tied(), tmp_path / "ghost.safetensors")
