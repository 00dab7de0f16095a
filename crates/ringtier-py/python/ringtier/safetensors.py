"""safetensors files read and written by ringtier's engine.

:func:`load_file` returns what ``safetensors.torch.load_file`` returns (a dict of torch
tensors: the same names, dtypes, shapes and bytes), read with O_DIRECT io_uring at depth (the
thread pool where io_uring is refused, ``engine="posix"`` on request) or with range GETs from
an ``s3://bucket/key?endpoint=...`` URL, into one page-aligned buffer per file: the tensors
are views of it, no copy is made. A sharded model (its ``model.safetensors.index.json``, or the
directory holding it) loads in one call, every shard's reads in flight together.
:func:`safe_open` reads tensors one at a time by name. :func:`save_file` writes the bytes
``safetensors.torch.save_file`` writes for the same tensors, durable when it returns (data
fsync, atomic rename, directory fsync; a completed upload on S3); :func:`save_sharded` writes
Hugging Face's sharded layout, the index last.

Headers are parsed as hostile input: a header longer than the file or than 100 MB, offsets that
overlap, leave gaps or pass the end, a dtype and shape that do not make the byte count, bad
UTF-8 or JSON are each a :class:`ringtier.CorruptError` before anything large is allocated.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Dict, Iterator, List, Mapping, Optional, Tuple, Union

from . import _ringtier
from ._types import PathLike, is_s3_url, tier_path
from .errors import InvalidInputError, NotFoundError, UnsupportedError

INDEX_FILE = "model.safetensors.index.json"
"""The index of a sharded model, as Hugging Face names it."""

_TORCH_NAMES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn_x2",
}

Device = Union[str, int, "torch.device"]  # noqa: F821


def _torch():
    import torch

    return torch


def _torch_dtype(name: str):
    torch = _torch()
    attr = _TORCH_NAMES.get(name)
    dt = getattr(torch, attr, None) if attr else None
    if dt is None:
        raise UnsupportedError(f"dtype {name} has no torch dtype in this torch ({torch.__version__})")
    return dt


def _header_dtype(dtype) -> str:
    for name, attr in _TORCH_NAMES.items():
        if getattr(_torch(), attr, None) == dtype:
            return name
    raise InvalidInputError(f"torch dtype {dtype} cannot be saved as safetensors")


def _split(path: PathLike) -> Tuple[str, str]:
    """``(root, key)``: the tier (directory or S3 prefix URL) and the object in it. A directory
    stands for its ``model.safetensors.index.json``, else its ``model.safetensors``."""
    p = tier_path(path)
    if is_s3_url(p):
        base, _, query = p.partition("?")
        rest = base[len("s3://") :]
        if "/" not in rest.strip("/"):
            raise InvalidInputError(f"{p!r} names a bucket, not an object: give s3://bucket/key?endpoint=...")
        root, _, key = rest.rstrip("/").rpartition("/")
        return "s3://" + root + ("?" + query if query else ""), key
    if os.path.isdir(p):
        for name in (INDEX_FILE, "model.safetensors"):
            if os.path.exists(os.path.join(p, name)):
                return p, name
        raise NotFoundError(f"{p} holds neither {INDEX_FILE} nor model.safetensors")
    if not os.path.exists(p):
        raise NotFoundError(f"{p} does not exist")
    root, key = os.path.split(os.path.abspath(p))
    return root, key


def _device(device: Device):
    torch = _torch()
    if isinstance(device, int):
        device = f"cuda:{device}"
    dev = torch.device(device)
    if dev.type == "meta":
        raise InvalidInputError(
            "device='meta' holds no data: load to 'cpu' or a GPU (safe_open(...).keys() lists the names alone)"
        )
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UnsupportedError(
            f"device={str(device)!r}: CUDA is not available here (torch.cuda.is_available() is False; no GPU, "
            "no driver, or a CPU-only torch). Load with device='cpu'."
        )
    return dev


def _storage_shape(dtype_name: str, shape: List[int]) -> List[int]:
    # F4 packs two values per byte: the header counts elements, torch's float4_e2m1fn_x2 bytes.
    if dtype_name == "F4" and shape:
        return shape[:-1] + [shape[-1] // 2]
    return shape


def _view(base, offset: int, nbytes: int, dtype_name: str, shape: List[int]):
    """The tensor of ``nbytes`` at ``offset`` of the uint8 tensor ``base``, as a view (a copy
    only where the file puts it at an offset its dtype cannot start at)."""
    torch = _torch()
    dt = _torch_dtype(dtype_name)
    storage = _storage_shape(dtype_name, shape)
    if nbytes == 0:
        return torch.empty(storage, dtype=dt)
    raw = base[offset : offset + nbytes]
    itemsize = torch.empty((), dtype=dt).element_size()
    if offset % itemsize:
        raw = raw.clone()
    return raw.view(dt).reshape(storage)


def _to_device(tensors: Dict[str, object], bases: List[object], dev) -> Dict[str, object]:
    """Moves CPU tensors (views of ``bases``) to ``dev``; for CUDA from page-locked memory
    (``bases`` registered with the driver for the copies), asynchronously, waited for once."""
    torch = _torch()
    if dev.type == "cpu":
        return tensors
    registered = []
    try:
        if dev.type == "cuda":
            cudart = torch.cuda.cudart()
            for b in bases:
                if b.numel() and int(cudart.cudaHostRegister(b.data_ptr(), b.numel(), 0)) == 0:
                    registered.append(b)
        out = {k: v.to(dev, non_blocking=bool(registered)) for k, v in tensors.items()}
        if dev.type == "cuda":
            torch.cuda.current_stream(dev).synchronize()
        return out
    finally:
        for b in registered:
            torch.cuda.cudart().cudaHostUnregister(b.data_ptr())


def load_file(
    filename: PathLike,
    device: Device = "cpu",
    *,
    engine: str = "auto",
    into: Optional[Dict[str, object]] = None,
    depth: Optional[int] = None,
    chunk_bytes: Optional[int] = None,
    mmap: bool = False,
    staging_bytes: Optional[int] = None,
) -> Dict[str, object]:
    """Loads a safetensors file, a sharded model's index (or a directory holding either), or an
    ``s3://bucket/key?endpoint=...`` URL into a dict of torch tensors: what
    ``safetensors.torch.load_file`` returns.

    On the CPU the tensors are views of one page-aligned buffer per file, which the reads
    filled directly (``depth`` reads of ``chunk_bytes`` in flight, over all shards: default 16
    of 8 MiB, 64 from an S3 URL); the buffer lives as long as any of its tensors.
    ``device="cuda"`` streams them to the GPU through page-locked staging buffers (below);
    without CUDA it raises :class:`~ringtier.UnsupportedError`.

    ``mmap=True`` (files only): the tensors are views of each file mapped private
    (copy-on-write) instead, its pages read into the page cache ahead of use by ``depth // 2``
    threads (default 8) taking ``chunk_bytes`` at a time: as ``safetensors`` maps a file, but
    read at depth before it returns. No fresh memory is faulted in and zeroed for the tensors,
    the least CPU per GiB (docs/SAFETENSORS.md, "CPU"); the pages stay in the page cache, and
    the file must not be truncated while a tensor is alive (a page past its new end faults
    with ``SIGBUS``, as with any mapped file). A tensor written is copied page by page.

    ``into``: a dict of CPU tensors to fill in place (each contiguous, of the file's dtype and
    shape); only those are loaded (only the parts of the files they cover are read), through
    ``depth`` buffers of one chunk (the memory used beyond them), and ``into`` is returned. Do
    not touch them while this runs.

    ``device="cuda"`` (or another device): the tensors are made on the device and filled
    through two page-locked staging buffers of ``staging_bytes`` (default
    :data:`DEVICE_STAGING_BYTES`; a tensor larger than that gets buffers of its size): while one
    buffer's tensors are copied to the device asynchronously, the next tensors are read into
    the other, so reads and copies overlap and host memory stays bounded (the two buffers and
    ``depth`` chunks), whatever the model's size.
    """
    root, key = _split(filename)
    dev = _device(device)
    if staging_bytes is not None and (isinstance(staging_bytes, bool) or not isinstance(staging_bytes, int) or staging_bytes < 1):
        raise InvalidInputError(f"staging_bytes must be a positive int, not {staging_bytes!r}")
    model = _ringtier.SafetensorsModel(root, key, engine)
    entries = model.tensors()
    if into is not None:
        if mmap:
            raise InvalidInputError("mmap=True maps the file for new tensors; into= fills yours: give one of them")
        return _load_into(model, entries, into, depth, chunk_bytes)
    torch = _torch()
    if not isinstance(mmap, bool):
        raise InvalidInputError(f"mmap must be True or False, not {mmap!r}")
    if dev.type != "cpu" and not mmap:
        return _stream_to_device(model, entries, dev, staging_bytes or DEVICE_STAGING_BYTES, depth, chunk_bytes)
    if mmap:
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
            raise InvalidInputError(f"depth must be a positive int, not {depth!r}")
        buffers = model.map_all(None if depth is None else max(1, depth // 2), chunk_bytes)
    else:
        buffers = model.read_all(depth, chunk_bytes)
    bases = [torch.frombuffer(buf, dtype=torch.uint8) if len(buf) else torch.empty(0, dtype=torch.uint8) for buf, _ in buffers]
    out: Dict[str, object] = {}
    for name, file, dtype, shape, begin, end in entries:
        out[name] = _view(bases[file], buffers[file][1] + begin, end - begin, dtype, list(shape))
    return _to_device(out, bases, dev)


DEVICE_STAGING_BYTES = 256 << 20
"""Bytes of each of the two page-locked buffers a load to a device reads through."""


_SLOT_ALIGN = 64  # each tensor's place in a staging buffer: any dtype can be viewed there


def _slot(nbytes: int) -> int:
    return -(-nbytes // _SLOT_ALIGN) * _SLOT_ALIGN


def _windows(entries, limit: int) -> List[list]:
    """``entries`` (with bytes) in consecutive groups whose slots take at most ``limit`` bytes
    (a larger tensor is a group of its own), in file and data order."""
    out: List[list] = []
    cur: list = []
    size = 0
    for e in entries:
        n = _slot(e[5] - e[4])
        if cur and size + n > limit:
            out.append(cur)
            cur, size = [], 0
        cur.append(e)
        size += n
    if cur:
        out.append(cur)
    return out


def _stream_into(model, entries, dests: Dict[str, object], staging_bytes: int, depth, chunk_bytes) -> None:
    """Fills ``dests[name]`` (tensors on any device, of any dtype and layout: ``copy_``'s
    rules) with the file's tensors through two staging buffers in turn (page-locked where a
    destination is on a GPU): window ``k + 1`` is read by a pool thread (the GIL released)
    while window ``k``'s tensors are copied out of the other buffer (asynchronously to a GPU);
    a buffer is read into again once the copies out of it are done."""
    torch = _torch()
    windows = _windows([e for e in entries if e[0] in dests and e[5] > e[4]], staging_bytes)
    if not windows:
        return
    cuda = any(dests[e[0]].device.type == "cuda" for w in windows for e in w)
    size = max(sum(_slot(e[5] - e[4]) for e in w) for w in windows)
    staging = [torch.empty(size, dtype=torch.uint8, pin_memory=cuda) for _ in range(min(2, len(windows)))]
    copied: List[list] = [[] for _ in staging]  # per buffer: events of the copies out of it

    def read(k: int) -> None:
        buf, at, targets = staging[k % len(staging)], 0, []
        for name, _, _, _, begin, end in windows[k]:
            targets.append((name, buf[at : at + end - begin].numpy()))
            at += _slot(end - begin)
        model.read_into(targets, depth, chunk_bytes)

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(staging), thread_name_prefix="ringtier-staging") as pool:
        pending = {k: pool.submit(read, k) for k in range(len(staging))}
        for k in range(len(windows)):
            pending.pop(k).result()
            b = k % len(staging)
            buf, at, devices = staging[b], 0, set()
            with torch.no_grad():
                for name, _, dtype, shape, begin, end in windows[k]:
                    src = buf[at : at + end - begin].view(_torch_dtype(dtype)).reshape(_storage_shape(dtype, list(shape)))
                    dest = dests[name]
                    dest.copy_(src, non_blocking=dest.device.type == "cuda")
                    if dest.device.type == "cuda":
                        devices.add(dest.device)
                    at += _slot(end - begin)
            copied[b] = [torch.cuda.current_stream(d).record_event() for d in devices]
            nxt = k + len(staging)
            if nxt < len(windows):
                for ev in copied[b]:
                    ev.synchronize()  # the copies out of this buffer, before it is read into
                pending[nxt] = pool.submit(read, nxt)
    for evs in copied:
        for ev in evs:
            ev.synchronize()


def _stream_to_device(model, entries, dev, staging_bytes: int, depth, chunk_bytes) -> Dict[str, object]:
    """The file's tensors made on ``dev`` and filled by :func:`_stream_into`."""
    torch = _torch()
    out: Dict[str, object] = {}
    for name, _, dtype, shape, _, _ in entries:
        out[name] = torch.empty(_storage_shape(dtype, list(shape)), dtype=_torch_dtype(dtype), device=dev)
    _stream_into(model, entries, out, staging_bytes, depth, chunk_bytes)
    return out


def _load_into(model, entries, into: Dict[str, object], depth, chunk_bytes) -> Dict[str, object]:
    torch = _torch()
    by_name = {e[0]: e for e in entries}
    targets = []
    for name, t in into.items():
        e = by_name.get(name)
        if e is None:
            raise NotFoundError(f"into[{name!r}]: no tensor {name!r} in {model.files}")
        _, _, dtype, shape, begin, end = e
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            raise InvalidInputError(f"into[{name!r}] must be a CPU torch.Tensor")
        if t.dtype != _torch_dtype(dtype) or list(t.shape) != _storage_shape(dtype, list(shape)):
            raise InvalidInputError(
                f"into[{name!r}] is {t.dtype} {list(t.shape)}, the file has {dtype} {list(shape)}"
            )
        if not t.is_contiguous():
            raise InvalidInputError(f"into[{name!r}] must be contiguous")
        if end - begin:
            targets.append((name, t.detach().reshape(-1).view(torch.uint8).numpy()))
    model.read_into(targets, depth, chunk_bytes)
    return into


def load_model(
    model,
    filename: PathLike,
    strict: bool = True,
    *,
    engine: str = "auto",
    depth: Optional[int] = None,
    chunk_bytes: Optional[int] = None,
) -> Tuple[List[str], List[str]]:
    """Loads a safetensors file, a sharded model (its index or directory) or an ``s3://`` URL
    into ``model``'s own parameters and buffers, in place: what
    ``safetensors.torch.load_model(model, filename, strict)`` does, without loading a second
    copy of the model first. Returns ``(missing, unexpected)`` as it does: the model's names the
    file lacks (a name tied to a loaded tensor's memory is not missing) and the file's names the
    model lacks.

    The reads are :func:`load_file`'s (O_DIRECT at ``depth`` chunks of ``chunk_bytes``, all
    shards at once), each chunk copied straight into the tensors it overlaps: no memory is
    allocated for the tensors, so a model already in memory (a restart, a weight update from a
    trainer) reloads at the cost of the reads and one copy. A tensor on the CPU, contiguous and
    of the file's dtype is filled where it lives; the others (another dtype, a GPU, not
    contiguous) are read through two staging buffers of :data:`DEVICE_STAGING_BYTES` in turn
    (page-locked for a GPU, the copies out of one overlapping the reads into the other) and
    copied with ``Tensor.copy_``, as ``load_state_dict`` would.

    Checked before anything is read, so a refused load leaves the model as it was: with
    ``strict``, missing or unexpected names are an :class:`~ringtier.InvalidInputError`
    (``safetensors`` raises ``RuntimeError`` after loading); a shape that differs from the file's,
    or a tensor on the ``meta`` device, is one whatever ``strict`` says. The module's
    ``load_state_dict`` hooks are not run: for a module that needs them, use :func:`load_file`
    and ``model.load_state_dict``. A read that fails part way (a file cut short since its header
    was read, an S3 server gone past the retries) raises its error and leaves the model partly
    loaded. Do not touch the model while this runs.
    """
    torch = _torch()
    if not isinstance(model, torch.nn.Module):
        raise InvalidInputError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if not isinstance(strict, bool):
        raise InvalidInputError(f"strict must be True or False, not {strict!r}")
    root, key = _split(filename)
    st = _ringtier.SafetensorsModel(root, key, engine)
    entries = {e[0]: e for e in st.tensors()}
    own = model.state_dict()
    unexpected = [n for n in entries if n not in own]
    loaded, wrong = {}, []
    for name, t in own.items():
        e = entries.get(name)
        if e is None:
            continue
        _, _, dtype, shape, _, _ = e
        if t.device.type == "meta":
            wrong.append(f"{name!r} is on the meta device (load_file, then model.load_state_dict(..., assign=True))")
        elif list(t.shape) != _storage_shape(dtype, list(shape)):
            wrong.append(f"{name!r} is {list(t.shape)} in the model, {list(shape)} in the file")
        else:
            loaded[name] = t
    if wrong:
        raise InvalidInputError(f"cannot load {filename} into {type(model).__name__}: " + "; ".join(wrong))
    spans = {_memory_span(t) for t in loaded.values()}
    missing = [n for n, t in own.items() if n not in entries and _memory_span(t) not in spans]
    if strict and (missing or unexpected):
        raise InvalidInputError(
            f"cannot load {filename} into {type(model).__name__} strictly: "
            f"missing {missing[:8]}{'...' if len(missing) > 8 else ''} ({len(missing)}), "
            f"unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''} ({len(unexpected)}); "
            "strict=False loads the names both have"
        )
    into, staged, seen = {}, {}, set()
    for name, t in loaded.items():
        if _memory_span(t) in seen:  # tied names: their memory is filled once
            continue
        seen.add(_memory_span(t))
        if t.device.type == "cpu" and t.is_contiguous() and t.dtype == _torch_dtype(entries[name][2]):
            into[name] = t
        else:
            staged[name] = t
    if into:
        _load_into(st, list(entries.values()), into, depth, chunk_bytes)
    if staged:
        _stream_into(st, list(entries.values()), staged, DEVICE_STAGING_BYTES, depth, chunk_bytes)
    return missing, unexpected


def _memory_span(t) -> Tuple[str, int, int]:
    return (str(t.device), t.data_ptr(), t.numel() * t.element_size())


class safe_open:
    """Lazy access by name, as ``safetensors.safe_open``: only the header is read when it
    opens; :meth:`get_tensor` reads one tensor (its own aligned read).

    >>> with ringtier.safetensors.safe_open("model.safetensors", framework="pt") as f:
    ...     w = f.get_tensor(f.keys()[0])
    """

    def __init__(self, filename: PathLike, framework: str = "pt", device: Device = "cpu", *, engine: str = "auto"):
        if framework not in ("pt", "torch"):
            raise UnsupportedError(f"framework={framework!r}: ringtier.safetensors returns torch tensors (framework='pt')")
        root, key = _split(filename)
        self._device = _device(device)
        self._model = _ringtier.SafetensorsModel(root, key, engine)
        self._entries = {e[0]: e for e in self._model.tensors()}

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: object) -> None:
        self._entries = {}

    def keys(self) -> List[str]:
        """The tensors' names, sorted."""
        return sorted(self._entries)

    def offset_keys(self) -> List[str]:
        """The tensors' names in file (data) order."""
        return list(self._entries)

    def metadata(self) -> Optional[Dict[str, str]]:
        """The file's ``__metadata__`` (the first shard's for a sharded model), or None."""
        return self._model.metadata(0)

    def get_tensor(self, name: str):
        """Tensor ``name``, read now."""
        e = self._entries.get(name)
        if e is None:
            raise NotFoundError(f"no tensor {name!r} in {self._model.files}")
        torch = _torch()
        _, _, dtype, shape, begin, end = e
        if end == begin:
            return _view(None, 0, 0, dtype, list(shape)).to(self._device)
        buf = self._model.read_tensor(name)
        base = torch.frombuffer(buf, dtype=torch.uint8)
        t = _view(base, 0, end - begin, dtype, list(shape))
        return _to_device({name: t}, [base], self._device)[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._entries)


def _check_tensors(tensors: Mapping[str, object]):
    """The ``(name, dtype, shape, uint8 buffer)`` list of ``tensors``, with the checks
    ``safetensors.torch.save_file`` makes (dense, contiguous, no shared memory)."""
    torch = _torch()
    if not isinstance(tensors, Mapping):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    spans = {}
    out = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise ValueError(f"Key {name!r} is invalid: tensor names are strings")
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"Key `{name}` is invalid, expected torch.Tensor but received {type(t)}")
        if t.layout != torch.strided:
            raise ValueError(f"You are trying to save a sparse tensor: `{name}`; make it dense first (`.to_dense()`)")
        if not t.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{name}`; call `.contiguous()` on it first"
            )
        t = t.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        if t.numel():
            start = t.data_ptr()
            spans.setdefault(t.untyped_storage().data_ptr(), []).append((start, start + t.nbytes, name))
        dtype = _header_dtype(t.dtype)
        shape = list(t.shape)
        if dtype == "F4" and shape:
            shape[-1] *= 2
        out.append((name, dtype, shape, t.reshape(-1).view(torch.uint8).numpy()))
    shared = []
    for areas in spans.values():
        areas.sort()
        for (_, end_a, a), (start_b, _, b) in zip(areas, areas[1:]):
            if start_b < end_a:
                shared.append({a, b})
    if shared:
        raise RuntimeError(
            f"Some tensors share memory, this will lead to duplicate memory on disk and potential differences when "
            f"loading them again: {shared}. Save clones (`.clone()`) of the shared ones."
        )
    return out


def _check_metadata(metadata: Optional[Mapping[str, str]]) -> Optional[Dict[str, str]]:
    if metadata is None:
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ValueError("metadata must be a dict of str to str")
    return dict(metadata)


def _save_root(filename: PathLike) -> Tuple[str, str]:
    p = tier_path(filename)
    if is_s3_url(p):
        return _split(p)
    root, key = os.path.split(os.path.abspath(p))
    return root, key


def save_file(
    tensors: Mapping[str, object],
    filename: PathLike,
    metadata: Optional[Mapping[str, str]] = None,
    *,
    engine: str = "auto",
    chunk_bytes: Optional[int] = None,
) -> None:
    """Saves ``tensors`` (a dict of torch tensors) as ``filename`` (a path, or an
    ``s3://bucket/key?endpoint=...`` URL): the bytes ``safetensors.torch.save_file`` writes
    for them. Durable when it returns: the data is fsynced, the file renamed into place and
    its directory fsynced (on S3: the upload completed); a crash leaves the old file or the
    new one, never a torn one. ``metadata``: a dict of str to str for the header."""
    root, key = _save_root(filename)
    _ringtier.safetensors_save(root, key, _check_tensors(tensors), _check_metadata(metadata), engine, None, "model", chunk_bytes)


def save_model(
    model,
    filename: PathLike,
    metadata: Optional[Mapping[str, str]] = None,
    force_contiguous: bool = True,
    *,
    engine: str = "auto",
) -> None:
    """Saves ``model``'s state dict as ``filename`` (a path or an ``s3://`` URL), durable as
    :func:`save_file`: the bytes ``safetensors.torch.save_model`` writes for the same model.
    Names that share memory (tied weights) are saved once, under the first in sorted order of
    those covering the whole memory; each other name goes into the metadata as
    ``{other: kept}`` (a key the caller's ``metadata`` already has is left as it is), and
    :func:`load_model` fills both again. Memory shared in part only (one name a slice of
    another's, neither covering it all) is an :class:`~ringtier.InvalidInputError`, as
    ``safetensors`` refuses it. ``force_contiguous``: non-contiguous tensors saved as their
    contiguous copies (else refused)."""
    torch = _torch()
    if not isinstance(model, torch.nn.Module):
        raise InvalidInputError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if not isinstance(force_contiguous, bool):
        raise InvalidInputError(f"force_contiguous must be True or False, not {force_contiguous!r}")
    state = dict(model.state_dict())
    meta = dict(_check_metadata(metadata) or {})
    dropped = False
    for kept, others in _tied_names(state).items():
        for other in others:
            meta.setdefault(other, kept)
            del state[other]
            dropped = True
    if force_contiguous:
        state = {k: v.contiguous() for k, v in state.items()}
    save_file(state, filename, meta if (metadata is not None or dropped) else None, engine=engine)


def _tied_names(state: Dict[str, object]) -> Dict[str, List[str]]:
    """Of each group of names whose tensors overlap in memory: the name kept (the first in
    sorted order of those covering their whole storage) and the others, sorted."""
    torch = _torch()
    by_storage: Dict[tuple, List[str]] = {}
    for name, t in state.items():
        if t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() == 0 or storage.nbytes() == 0:
            continue
        by_storage.setdefault((str(t.device), storage.data_ptr(), storage.nbytes()), []).append(name)
    out: Dict[str, List[str]] = {}
    for names in by_storage.values():
        if len(names) < 2:
            continue
        # Names whose byte ranges overlap form a group; ranges that only share a storage do not.
        spans = []
        for n in names:
            t = state[n]
            size = t.element_size()
            end = t.data_ptr() + ((t.reshape(-1)[-1].data_ptr() - t.data_ptr()) + size if t.numel() else 0)
            spans.append((t.data_ptr(), end, n))
        spans.sort()
        groups: List[List[str]] = [[spans[0][2]]]
        last_end = spans[0][1]
        for begin, end, n in spans[1:]:
            if begin >= last_end:
                groups.append([n])
            else:
                groups[-1].append(n)
            last_end = end
        for group in groups:
            if len(group) < 2:
                continue
            whole = sorted(
                n for n in group
                if state[n].data_ptr() == state[n].untyped_storage().data_ptr()
                and state[n].numel() * state[n].element_size() == state[n].untyped_storage().nbytes()
            )
            if not whole:
                raise InvalidInputError(
                    f"{sorted(group)} share memory and none of them covers all of it: save each as its own "
                    "tensor (.clone()), so that the file does not hold more than they show"
                )
            out[whole[0]] = sorted(n for n in group if n != whole[0])
    return out


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)\s*$", re.IGNORECASE)


def _parse_size(size: Union[int, str]) -> int:
    """``5GB`` (decimal) or ``5GiB`` (binary) in bytes, as ``huggingface_hub`` reads them."""
    if isinstance(size, int):
        return size
    m = _SIZE.match(size)
    if not m:
        raise InvalidInputError(f"max_shard_size={size!r}: give bytes as an int, or a size such as '5GB' or '500MiB'")
    unit = m.group(2).upper()
    base = 1024 if "I" in unit else 1000
    power = {"B": 0, "K": 1, "M": 2, "G": 3, "T": 4}[unit[0]]
    return int(float(m.group(1)) * base**power)


def save_sharded(
    tensors: Mapping[str, object],
    save_directory: PathLike,
    *,
    max_shard_size: Union[int, str] = "5GB",
    metadata: Optional[Mapping[str, str]] = None,
    filename_prefix: str = "model",
    engine: str = "auto",
) -> List[str]:
    """Saves ``tensors`` as a sharded model in ``save_directory`` (a directory, created if
    missing, or an ``s3://bucket/prefix?endpoint=...`` URL) as ``huggingface_hub`` lays it out:
    ``{prefix}-00001-of-0000N.safetensors`` shards of at most ``max_shard_size`` of tensor data
    (tensors in the dict's order; one larger than that alone in its shard), each durable before
    the next, then ``model.safetensors.index.json`` (``weight_map``, ``metadata.total_size``).
    A model that fits in one shard is saved as ``{prefix}.safetensors`` without an index.
    Returns the files written, the index last."""
    root = tier_path(save_directory)
    max_bytes = _parse_size(max_shard_size)
    if max_bytes <= 0:
        raise InvalidInputError(f"max_shard_size must be positive, not {max_shard_size!r}")
    return list(
        _ringtier.safetensors_save(
            root, "", _check_tensors(tensors), _check_metadata(metadata), engine, max_bytes, filename_prefix, None
        )
    )


__all__ = ["DEVICE_STAGING_BYTES", "INDEX_FILE", "load_file", "load_model", "safe_open", "save_model", "save_file", "save_sharded"]
