"""State dicts to safetensors parts and back: the checkpoint store's ``format="safetensors"``.

A state (a dict of tensors, numpy arrays, bytes and plain values, nested) becomes one part,
``model.safetensors``, a safetensors file:

* every tensor, numpy array and bytes value is a tensor of the file, named by its path in the
  state joined with ``"."`` as Hugging Face names a nested state dict (``{"model": {"w": t}}``
  gives ``model.w``; a list's items are numbered: ``opt.0``); bytes are ``U8`` vectors;
* ``__metadata__`` holds ``"format": "pt"`` (what ``transformers`` asks of a file) and
  ``"ringtier.state"``: the tree as JSON (key order, which tensor is where, what kind of value
  each was: a torch tensor, a numpy array or scalar, bytes or bytearray; ``requires_grad``; the
  plain values: str, int, float, bool, None, lists and tuples of them; an ``OrderedDict``'s
  ``_metadata``).

With ``max_shard_size``, a state whose tensors take more becomes Hugging Face's sharded layout
instead: parts ``model-00001-of-0000N.safetensors`` (tensors in the state's order, a new shard
when the next does not fit, one larger than the limit alone: ``huggingface_hub``'s rule) and
``model.safetensors.index.json`` (``weight_map``, ``metadata.total_size``, and the tree as
``metadata["ringtier.state"]``).

The file's header and layout come from the engine (``ringtier_safetensors::Layout``, the
bytes the ``safetensors`` package writes for the same tensors); the part is the header
followed by the tensors' own memory, so contiguous CPU tensors are not copied to be saved. The
same tensor twice in a state (tied weights: one storage, offset, shape, strides and dtype) is
written once and loaded back as one tensor at both places.

Loading parses each file's header as hostile input (``ringtier_safetensors::Header::parse``),
checks the tree against it, and builds tensors over the loaded part's buffer (no copy).
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Mapping, MutableMapping, Optional, Tuple

import numpy as np

from . import _ringtier
from .errors import CorruptError
from ._state_dict_codec import TreeWalker, check_same_keys, contiguous_bytes, describe, path_text
from .safetensors import _TORCH_NAMES, _view

FORMAT = "ringtier-py-safetensors"
VERSION = 1
MODEL_PART = "model.safetensors"
INDEX_PART = "model.safetensors.index.json"
STATE_KEY = "ringtier.state"
"""The ``__metadata__`` key (and, sharded, the index's ``metadata`` key) holding the tree."""

# safetensors dtype <-> numpy dtype (little-endian; the format has no others).
_NUMPY = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "F16": np.dtype("<f2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "F32": np.dtype("<f4"),
    "C64": np.dtype("<c8"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F64": np.dtype("<f8"),
}
_FROM_NUMPY = {(v.kind, v.itemsize): k for k, v in _NUMPY.items()}


def _numpy_name(dtype: np.dtype) -> Optional[str]:
    """The safetensors dtype of a numpy dtype, or None (big-endian, structured, object, ...)."""
    if dtype.fields is not None or dtype.subdtype is not None:
        return None
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder != "little"):
        return None
    return _FROM_NUMPY.get((dtype.kind, dtype.itemsize))


def _torch_dtype_names(torch: Any) -> Dict[Any, str]:
    out = {}
    for name, attr in _TORCH_NAMES.items():
        dt = getattr(torch, attr, None)
        if dt is not None:
            out[dt] = name
    return out


class _Tensor:
    """One tensor of the file to write."""

    __slots__ = ("name", "dtype", "shape", "buf", "nbytes")

    def __init__(self, name: str, dtype: str, shape: List[int], buf: Any, nbytes: int) -> None:
        self.name, self.dtype, self.shape, self.buf, self.nbytes = name, dtype, shape, buf, nbytes


class _Encoder(TreeWalker):
    def __init__(self) -> None:
        self.tensors: List[_Tensor] = []
        self.owner: Dict[str, List[str]] = {}  # tensor name -> the state path that took it
        self.aliases: Dict[Tuple[Any, ...], str] = {}
        self._torch_names: Optional[Dict[Any, str]] = None

    def _name(self, path: List[str]) -> str:
        name = ".".join(path)
        if name == "__metadata__":
            raise ValueError(
                f"{path_text(path)}: a tensor would be named '__metadata__' in model.safetensors, a name the format "
                "reserves; rename the key"
            )
        if name in self.owner:
            raise ValueError(
                f"{path_text(path)} and {path_text(self.owner[name])} would both be the tensor {name!r} in "
                "model.safetensors (keys are joined with '.'); rename one, or save with the default format"
            )
        self.owner[name] = path
        return name

    def _add(self, path: List[str], dtype: str, shape: List[int], buf: Any, nbytes: int) -> str:
        name = self._name(path)
        self.tensors.append(_Tensor(name, dtype, shape, buf if nbytes else None, nbytes))
        return name

    def raw(self, mv: memoryview, mutable: bool, path: List[str]) -> Dict[str, Any]:
        name = self._add(path, "U8", [mv.nbytes], mv, mv.nbytes)
        return {"b": name, "a": 1} if mutable else {"b": name}

    def tensor(self, torch: Any, t: Any, path: List[str]) -> Dict[str, Any]:
        if t.layout != torch.strided or t.is_nested:
            raise TypeError(
                f"cannot save {path_text(path)} as safetensors: {t.layout} tensors are not supported (only dense ones)"
            )
        if t.is_quantized:
            raise TypeError(f"cannot save {path_text(path)} as safetensors: quantized tensors are not supported")
        if t.device.type == "meta":
            raise ValueError(f"cannot save {path_text(path)}: a tensor on the meta device has no data")
        if self._torch_names is None:
            self._torch_names = _torch_dtype_names(torch)
        dtype = self._torch_names.get(t.dtype)
        if dtype is None:
            raise TypeError(
                f"cannot save {path_text(path)} as safetensors: the format has no dtype for {t.dtype} (save it with "
                "the default format, or convert it)"
            )
        node: Dict[str, Any] = {}
        if t.requires_grad:
            node["g"] = 1
        alias = None
        if t.device.type == "cpu" and t.numel():
            alias = (
                t.untyped_storage().data_ptr(),
                t.storage_offset(),
                tuple(t.shape),
                tuple(t.stride()),
                t.dtype,
                bool(t.requires_grad),
                t.is_conj(),
                t.is_neg(),
            )
            name = self.aliases.get(alias)
            if name is not None:
                node["t"] = name
                return node
        src, flat = contiguous_bytes(torch, t)
        shape = list(src.shape)
        if dtype == "F4" and shape:
            shape[-1] *= 2  # the header counts F4 elements, torch's float4_e2m1fn_x2 bytes
        nbytes = flat.numel()
        name = self._add(path, dtype, shape, flat.numpy() if nbytes else None, nbytes)
        if alias is not None:
            self.aliases[alias] = name
        node["t"] = name
        return node

    def array(self, a: Any, path: List[str]) -> Dict[str, Any]:
        scalar = isinstance(a, np.generic)
        arr = np.asarray(a)
        dtype = _numpy_name(arr.dtype)
        if dtype is None:
            raise TypeError(
                f"cannot save {path_text(path)} as safetensors: the format has no dtype for numpy {arr.dtype.str} "
                "(bool, integers, float16/32/64, complex64, little-endian; save it with the default format)"
            )
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        flat = arr.reshape(-1).view(np.uint8)
        name = self._add(path, dtype, list(arr.shape), flat, flat.nbytes)
        return {"n": name, "s": 1} if scalar else {"n": name}


def _tree_json(tree: Dict[str, Any]) -> str:
    return json.dumps({"format": FORMAT, "version": VERSION, "tree": tree}, allow_nan=True, separators=(",", ":"))


def _file(tensors: List[_Tensor], metadata: Dict[str, str]) -> List[Any]:
    """One safetensors file as buffers end to end: the engine's header, then the tensors'
    bytes in its order."""
    prefix, order = _ringtier.safetensors_layout([(t.name, t.dtype, t.shape, t.nbytes) for t in tensors], metadata)
    bufs: List[Any] = [prefix]
    bufs.extend(tensors[i].buf for i in order if tensors[i].nbytes)
    return bufs


def plan_shards(sizes: List[int], max_bytes: int) -> List[List[int]]:
    """Tensors (indexes into ``sizes``, in order) grouped into shards of at most ``max_bytes``
    of data, by ``huggingface_hub``'s rule (``ringtier_safetensors::plan_shards``): a tensor
    that does not fit starts the next shard; one larger than the limit has a shard alone."""
    shards: List[List[int]] = []
    current: List[int] = []
    used = 0
    for i, n in enumerate(sizes):
        if n > max_bytes:
            shards.append([i])
            continue
        if current and used + n > max_bytes:
            shards.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current or not shards:
        shards.append(current)
    return shards


def encode(state: Mapping[str, Any], max_shard_bytes: Optional[int] = None) -> List[Tuple[str, List[Any]]]:
    """The parts of ``state``: ``[("model.safetensors", [header, tensor buffers...])]``, or
    with ``max_shard_bytes`` and more tensor bytes than that, the shards and the index. Every
    check (types, names, dtypes) is made before a part is returned: a bad state saves nothing."""
    if not isinstance(state, Mapping):
        raise TypeError(f"a checkpoint state must be a dict (a state_dict), not a {type(state).__name__}")
    enc = _Encoder()
    tree_json = _tree_json(enc.node(state, []))
    tensors = enc.tensors
    total = sum(t.nbytes for t in tensors)
    if max_shard_bytes is None or total <= max_shard_bytes:
        return [(MODEL_PART, _file(tensors, {"format": "pt", STATE_KEY: tree_json}))]
    shards = plan_shards([t.nbytes for t in tensors], max_shard_bytes)
    count = len(shards)
    parts: List[Tuple[str, List[Any]]] = []
    weight_map: Dict[str, str] = {}
    for s, members in enumerate(shards):
        name = f"model-{s + 1:05d}-of-{count:05d}.safetensors"
        parts.append((name, _file([tensors[i] for i in members], {"format": "pt"})))
        for i in members:
            weight_map[tensors[i].name] = name
    index = {"metadata": {"total_size": total, STATE_KEY: tree_json}, "weight_map": weight_map}
    parts.append((INDEX_PART, [(json.dumps(index, indent=2, sort_keys=True) + "\n").encode()]))
    return parts


def is_safetensors_step(names: List[str]) -> bool:
    """Whether a step with parts ``names`` was saved in this format."""
    return MODEL_PART in names or INDEX_PART in names


class _Entry:
    __slots__ = ("buf", "start", "end", "dtype", "shape")

    def __init__(self, buf: Any, start: int, end: int, dtype: str, shape: List[int]) -> None:
        self.buf, self.start, self.end, self.dtype, self.shape = buf, start, end, dtype, shape


def _corrupt(what: str) -> CorruptError:
    return CorruptError(f"checkpoint in safetensors format: {what}")


def _read_tree(text: Any, where: str) -> Dict[str, Any]:
    if not isinstance(text, str):
        raise _corrupt(f"{where} has no {STATE_KEY!r} (a safetensors file not saved by ringtier.CheckpointStore)")
    try:
        meta = json.loads(text)
    except ValueError as e:
        raise _corrupt(f"{where}: {STATE_KEY!r} is not JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        got = (meta.get("format"), meta.get("version")) if isinstance(meta, dict) else type(meta).__name__
        raise _corrupt(f"{where}: unknown state format {got!r}")
    tree = meta.get("tree")
    if not isinstance(tree, dict) or "d" not in tree:
        raise _corrupt(f"{where}: the state's tree is not a dict")
    return tree


def _file_entries(name: str, buf: Any, entries: Dict[str, _Entry]) -> Optional[Dict[str, str]]:
    data_start, metadata, rows = _ringtier.safetensors_parse(buf)
    for tname, dtype, shape, begin, end in rows:
        if tname in entries:
            raise _corrupt(f"tensor {tname!r} is in two files ({name} and another shard)")
        entries[tname] = _Entry(buf, data_start + begin, data_start + end, dtype, list(shape))
    return metadata


def _parse(parts: List[Tuple[str, Any]]) -> Tuple[Dict[str, Any], Dict[str, _Entry]]:
    by_name = dict(parts)
    entries: Dict[str, _Entry] = {}
    if MODEL_PART in by_name:
        metadata = _file_entries(MODEL_PART, by_name[MODEL_PART], entries)
        return _read_tree((metadata or {}).get(STATE_KEY), MODEL_PART), entries
    if INDEX_PART not in by_name:
        raise _corrupt(f"neither {MODEL_PART} nor {INDEX_PART} among the parts ({', '.join(by_name)})")
    try:
        index = json.loads(bytes(memoryview(by_name[INDEX_PART])))
    except ValueError as e:
        raise _corrupt(f"{INDEX_PART} is not JSON ({e})") from None
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise _corrupt(f"{INDEX_PART} has no weight_map")
    weight_map = index["weight_map"]
    if not all(isinstance(f, str) for f in weight_map.values()):
        raise _corrupt(f"{INDEX_PART}: a weight_map value is not a file name")
    for f in sorted(set(weight_map.values())):
        if f not in by_name:
            raise _corrupt(f"{INDEX_PART} names the shard {f!r}, which the checkpoint does not hold")
        _file_entries(f, by_name[f], entries)
    for tname, f in weight_map.items():
        e = entries.get(tname)
        if e is None or e.buf is not by_name[f]:
            raise _corrupt(f"{INDEX_PART} puts tensor {tname!r} in {f}, which does not hold it")
    metadata = index.get("metadata")
    return _read_tree(metadata.get(STATE_KEY) if isinstance(metadata, dict) else None, INDEX_PART), entries


class _Decoder:
    def __init__(self, entries: Dict[str, _Entry]) -> None:
        self.entries = entries
        self.built: Dict[Tuple[str, str], Any] = {}
        self.bases: Dict[int, Any] = {}

    def _entry(self, name: Any) -> _Entry:
        e = self.entries.get(name) if isinstance(name, str) else None
        if e is None:
            raise _corrupt(f"the state names the tensor {name!r}, which no file of the checkpoint holds")
        return e

    def torch_tensor(self, name: Any, grad: bool) -> Any:
        key = ("t", name)
        if key in self.built:
            return self.built[key]
        import torch

        e = self._entry(name)
        base = self.bases.get(id(e.buf))
        if base is None:
            base = torch.frombuffer(e.buf, dtype=torch.uint8) if len(e.buf) else torch.empty(0, dtype=torch.uint8)
            self.bases[id(e.buf)] = base
        t = _view(base, e.start, e.end - e.start, e.dtype, e.shape)
        if grad:
            t.requires_grad_(True)
        self.built[key] = t
        return t

    def _raw(self, e: _Entry) -> np.ndarray:
        return np.frombuffer(e.buf, dtype=np.uint8)[e.start : e.end] if e.end > e.start else np.empty(0, np.uint8)

    def array(self, name: Any, scalar: bool) -> Any:
        e = self._entry(name)
        dtype = _NUMPY.get(e.dtype)
        if dtype is None:
            raise _corrupt(f"tensor {name!r} is {e.dtype}, which is no numpy dtype, but the state says numpy")
        a = self._raw(e).view(dtype).reshape(e.shape)
        if scalar:
            if e.shape:
                raise _corrupt(f"tensor {name!r} has shape {e.shape}, but the state says a numpy scalar")
            return a[()]
        return a

    def raw_bytes(self, name: Any, mutable: bool) -> Any:
        e = self._entry(name)
        if e.dtype != "U8" or len(e.shape) != 1:
            raise _corrupt(f"tensor {name!r} is {e.dtype} {e.shape}, but the state says bytes (a U8 vector)")
        raw = self._raw(e).tobytes()
        return bytearray(raw) if mutable else raw

    def node(self, node: Any) -> Any:
        if not isinstance(node, dict):
            raise _corrupt(f"a node of the state's tree is a {type(node).__name__}")
        if "d" in node:
            d: MutableMapping[str, Any] = OrderedDict() if node.get("o") else {}
            for item in node["d"]:
                if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                    raise _corrupt("a dict of the state's tree has a bad item")
                d[item[0]] = self.node(item[1])
            if "m" in node and isinstance(d, OrderedDict):
                d._metadata = node["m"]  # type: ignore[attr-defined]
            return d
        if "t" in node:
            return self.torch_tensor(node["t"], bool(node.get("g")))
        if "n" in node:
            return self.array(node["n"], bool(node.get("s")))
        if "b" in node:
            return self.raw_bytes(node["b"], bool(node.get("a")))
        if "l" in node:
            return [self.node(v) for v in node["l"]]
        if "u" in node:
            return tuple(self.node(v) for v in node["u"])
        if "v" in node:
            return node["v"]
        raise _corrupt(f"a node of the state's tree has none of the known keys: {sorted(node)}")


def decode(parts: List[Tuple[str, Any]]) -> Any:
    """The state of a loaded step's parts: tensors and arrays are views of the parts' buffers."""
    tree, entries = _parse(parts)
    return _Decoder(entries).node(tree)


def fill(parts: List[Tuple[str, Any]], into: MutableMapping[str, Any]) -> Any:
    """Copies a loaded step's values into ``into`` (its tensors and arrays in place, other
    values replaced). Keys, dtypes and shapes are all checked before anything is written."""
    tree, entries = _parse(parts)
    dec = _Decoder(entries)
    writes: List[Callable[[], None]] = []
    torch = sys.modules.get("torch")

    def plan(node: Dict[str, Any], target: Any, path: List[str], parent: Any, key: Any) -> None:
        if "d" in node:
            check_same_keys(node, target, path)
            for k, v in node["d"]:
                plan(v, target[k], path + [k], target, k)
            return
        value = dec.node(node)
        if torch is not None and isinstance(target, torch.Tensor):
            if not isinstance(value, torch.Tensor) or value.dtype != target.dtype or value.shape != target.shape:
                raise ValueError(
                    f"{path_text(path)}: the checkpoint holds {describe(value)}, the target is {describe(target)}"
                )

            def copy_tensor(t: Any = target, v: Any = value) -> None:
                with torch.no_grad():
                    t.copy_(v)

            writes.append(copy_tensor)
            return
        if isinstance(target, np.ndarray) and isinstance(value, np.ndarray):
            if value.dtype != target.dtype or value.shape != target.shape:
                raise ValueError(
                    f"{path_text(path)}: the checkpoint holds {describe(value)}, the target is {describe(target)}"
                )
            writes.append(lambda t=target, v=value: np.copyto(t, v))
            return
        writes.append(lambda p=parent, k=key, v=value: p.__setitem__(k, v))

    plan(tree, into, [], None, None)
    for w in writes:
        w()
    return into
