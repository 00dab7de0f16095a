"""State dicts to checkpoint parts and back.

A state (a dict of tensors, numpy arrays, bytes and plain values, nested) becomes two parts:

* ``state.json``: the tree (key order kept), each tensor's dtype, shape and place in ``tensors``,
  and the plain values (str, int, float, bool, None, lists and tuples of them);
* ``tensors``: every tensor's bytes end to end, each starting at a multiple of 64 bytes,
  written from the tensor's own memory where it is a contiguous CPU tensor (a non-contiguous
  or GPU tensor is made contiguous on the CPU first).

Loading builds tensors over one buffer holding ``tensors`` (no copy per tensor), or copies
into the tensors of a given state dict in place.
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Tuple

import numpy as np

FORMAT = "ringtier-py-state"
VERSION = 1
META_PART = "state.json"
DATA_PART = "tensors"
ALIGN = 64
_ZEROS = bytes(ALIGN)


def _torch() -> Any:
    """torch if it is imported (a state holding tensors has imported it)."""
    return sys.modules.get("torch")


def path_text(path: List[str]) -> str:
    """A value's place in the state, as Python would index it: ``state['model']['w']``."""
    return "state" + "".join(f"[{k!r}]" for k in path)


def contiguous_bytes(torch: Any, t: Any) -> Tuple[Any, Any]:
    """A tensor as it is saved: detached, on the CPU, conjugation and negation resolved,
    contiguous (copied only where it must be), and its flat ``uint8`` view of the same memory."""
    src = t.detach()
    if src.device.type != "cpu":
        src = src.cpu()
    src = src.resolve_conj().resolve_neg()
    if not src.is_contiguous():
        src = src.contiguous()
    return src, src.reshape(-1).view(torch.uint8)


class TreeWalker:
    """The walk of a state's tree both checkpoint formats share: dicts (string keys, order,
    ``OrderedDict`` and its ``_metadata``), lists and tuples, plain values; the leaves (tensors,
    numpy arrays, bytes) go to the format's ``tensor``, ``array`` and ``raw``."""

    def tensor(self, torch: Any, t: Any, path: List[str]) -> Dict[str, Any]:
        raise NotImplementedError

    def array(self, a: Any, path: List[str]) -> Dict[str, Any]:
        raise NotImplementedError

    def raw(self, mv: memoryview, mutable: bool, path: List[str]) -> Dict[str, Any]:
        """Bytes (``mutable``: a bytearray) as a flat byte view."""
        raise NotImplementedError

    def node(self, value: Any, path: List[str]) -> Dict[str, Any]:
        torch = _torch()
        if isinstance(value, Mapping):
            items = []
            for k, v in value.items():
                if not isinstance(k, str):
                    raise TypeError(
                        f"{path_text(path)} has the key {k!r} of type {type(k).__name__}: checkpoint state keys "
                        "must be strings"
                    )
                items.append([k, self.node(v, path + [k])])
            out: Dict[str, Any] = {"d": items}
            if isinstance(value, OrderedDict):
                out["o"] = 1
            meta = getattr(value, "_metadata", None)
            if meta is not None:
                try:
                    out["m"] = json.loads(json.dumps(meta))
                except (TypeError, ValueError):
                    pass
            return out
        if torch is not None and isinstance(value, torch.Tensor):
            return self.tensor(torch, value, path)
        if isinstance(value, (np.ndarray, np.generic)):
            return self.array(value, path)
        if isinstance(value, (bytes, bytearray, memoryview)):
            mv = memoryview(value)
            if not mv.c_contiguous:
                raise ValueError(f"{path_text(path)}: the memoryview is not C-contiguous")
            mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
            return self.raw(mv, isinstance(value, bytearray), path)
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"v": value}
        if isinstance(value, (list, tuple)):
            key = "l" if isinstance(value, list) else "u"
            return {key: [self.node(v, path + [str(i)]) for i, v in enumerate(value)]}
        raise TypeError(
            f"cannot save {path_text(path)}: a {type(value).__module__}.{type(value).__qualname__} is neither a tensor, "
            "a numpy array nor bytes (nor a str, int, float, bool, None, or a list, tuple or dict of them)"
        )



class _Encoder(TreeWalker):
    def __init__(self) -> None:
        self.buffers: List[Any] = []
        self.tensors: List[Dict[str, Any]] = []
        self.offset = 0

    def _add(self, buf: Any, nbytes: int, entry: Dict[str, Any]) -> Dict[str, Any]:
        pad = (-self.offset) % ALIGN
        if pad:
            self.buffers.append(memoryview(_ZEROS)[:pad])
            self.offset += pad
        entry["offset"] = self.offset
        entry["nbytes"] = nbytes
        if nbytes:
            self.buffers.append(buf)
        self.offset += nbytes
        self.tensors.append(entry)
        return {"t": len(self.tensors) - 1}

    def raw(self, mv: memoryview, mutable: bool, path: List[str]) -> Dict[str, Any]:
        return self._add(mv, mv.nbytes, {"kind": "bytearray" if mutable else "bytes"})

    def tensor(self, torch: Any, t: Any, path: List[str]) -> Dict[str, Any]:
        if t.layout != torch.strided:
            raise TypeError(f"cannot save {path_text(path)}: {t.layout} tensors are not supported (only dense ones)")
        if t.is_quantized:
            raise TypeError(f"cannot save {path_text(path)}: quantized tensors are not supported")
        requires_grad = bool(t.requires_grad)
        shape = list(t.shape)
        dtype = str(t.dtype).replace("torch.", "")
        flat = contiguous_bytes(torch, t)[1]
        nbytes = flat.numel()
        entry = {"kind": "torch", "dtype": dtype, "shape": shape}
        if requires_grad:
            entry["requires_grad"] = True
        return self._add(flat.numpy() if nbytes else None, nbytes, entry)

    def array(self, a: Any, path: List[str]) -> Dict[str, Any]:
        scalar = isinstance(a, np.generic)
        arr = np.asarray(a)
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)  # (a 0-d array is contiguous: its shape stays ())
        if arr.dtype.hasobject:
            raise TypeError(f"cannot save {path_text(path)}: numpy arrays of Python objects are not supported")
        descr = np.lib.format.dtype_to_descr(arr.dtype)
        flat = arr.reshape(-1).view(np.uint8)
        entry = {"kind": "numpy", "dtype": descr, "shape": list(arr.shape)}
        if scalar:
            entry["scalar"] = True
        return self._add(flat, flat.nbytes, entry)


def encode(state: Mapping[str, Any]) -> List[Tuple[str, List[Any]]]:
    """The parts of `state`: ``[("state.json", [json]), ("tensors", [buffer, ...])]``."""
    if not isinstance(state, Mapping):
        raise TypeError(f"a checkpoint state must be a dict (a state_dict), not a {type(state).__name__}")
    enc = _Encoder()
    tree = enc.node(state, [])
    meta = {"format": FORMAT, "version": VERSION, "tree": tree, "tensors": enc.tensors, "bytes": enc.offset}
    return [(META_PART, [json.dumps(meta, allow_nan=True).encode()]), (DATA_PART, enc.buffers)]


def _parse(parts: List[Tuple[str, Any]]) -> Tuple[Dict[str, Any], Any]:
    by_name = dict(parts)
    if META_PART not in by_name:
        names = ", ".join(by_name)
        raise ValueError(f"this checkpoint was not saved from Python (parts: {names}); read it with load_parts()")
    meta = json.loads(bytes(memoryview(by_name[META_PART])))
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"unknown checkpoint state format {meta.get('format')!r} version {meta.get('version')!r}")
    return meta, by_name.get(DATA_PART)


class _Decoder:
    def __init__(self, meta: Dict[str, Any], data: Any) -> None:
        self.meta = meta
        self.data = data
        self.size = len(data) if data is not None else 0
        self._np: Optional[np.ndarray] = None
        self._torch_base: Any = None

    def np_base(self) -> np.ndarray:
        if self._np is None:
            self._np = np.frombuffer(self.data, dtype=np.uint8) if self.size else np.empty(0, np.uint8)
        return self._np

    def torch_base(self, torch: Any) -> Any:
        if self._torch_base is None:
            self._torch_base = torch.frombuffer(self.data, dtype=torch.uint8)
        return self._torch_base

    def tensor(self, i: int) -> Any:
        e = self.meta["tensors"][i]
        off, n = e["offset"], e["nbytes"]
        if off + n > self.size:
            raise ValueError(f"tensor {i} lies past the end of the checkpoint's data ({off}+{n} > {self.size})")
        kind = e["kind"]
        if kind == "torch":
            import torch

            dtype = getattr(torch, e["dtype"])
            if n == 0:
                t = torch.empty(e["shape"], dtype=dtype)
            else:
                t = self.torch_base(torch)[off : off + n].view(dtype).reshape(e["shape"])
            if e.get("requires_grad"):
                t.requires_grad_(True)
            return t
        if kind == "numpy":
            dtype = np.lib.format.descr_to_dtype(_descr(e["dtype"]))
            a = self.np_base()[off : off + n].view(dtype).reshape(e["shape"])
            return a[()] if e.get("scalar") else a
        raw = bytes(self.np_base()[off : off + n])
        return bytearray(raw) if kind == "bytearray" else raw

    def node(self, node: Dict[str, Any]) -> Any:
        if "d" in node:
            d: MutableMapping[str, Any] = OrderedDict() if node.get("o") else {}
            for k, v in node["d"]:
                d[k] = self.node(v)
            if "m" in node and isinstance(d, OrderedDict):
                d._metadata = node["m"]  # type: ignore[attr-defined]
            return d
        if "t" in node:
            return self.tensor(node["t"])
        if "l" in node:
            return [self.node(v) for v in node["l"]]
        if "u" in node:
            return tuple(self.node(v) for v in node["u"])
        return node["v"]

    def fill(self, node: Dict[str, Any], target: Any, path: List[str]) -> Any:
        """Copies the saved values into `target` in place where it holds tensors or arrays."""
        if "d" in node:
            check_same_keys(node, target, path)
            for k, v in node["d"]:
                target[k] = self.fill(v, target[k], path + [k])
            return target
        if "t" in node:
            src = self.tensor(node["t"])
            torch = _torch()
            if torch is not None and isinstance(target, torch.Tensor):
                if not isinstance(src, torch.Tensor) or src.dtype != target.dtype or src.shape != target.shape:
                    raise ValueError(
                        f"{path_text(path)}: the checkpoint holds {describe(src)}, the target is {describe(target)}"
                    )
                with torch.no_grad():
                    target.copy_(src)
                return target
            if isinstance(target, np.ndarray):
                if not isinstance(src, np.ndarray) or src.dtype != target.dtype or src.shape != target.shape:
                    raise ValueError(
                        f"{path_text(path)}: the checkpoint holds {describe(src)}, the target is {describe(target)}"
                    )
                np.copyto(target, src)
                return target
            return src
        return self.node(node)


def _descr(d: Any) -> Any:
    """JSON turned the descr's tuples into lists; numpy wants them back."""
    if isinstance(d, list):
        return [tuple(_descr(x) for x in f) if isinstance(f, list) else f for f in d]
    return d


def check_same_keys(node: Dict[str, Any], target: Any, path: List[str]) -> None:
    """A saved dict (``node["d"]``) and the mapping a load fills in place: the same keys, or a
    ``ValueError`` naming what is missing on each side (both formats' in-place loads)."""
    if not isinstance(target, MutableMapping):
        raise ValueError(f"{path_text(path)}: the checkpoint has a dict here, the target a {type(target).__name__}")
    saved = [k for k, _ in node["d"]]
    missing = [k for k in saved if k not in target]
    unexpected = [k for k in target if k not in set(saved)]
    if missing or unexpected:
        raise ValueError(
            f"{path_text(path)}: keys differ from the checkpoint's (missing in the target: {missing}, "
            f"not in the checkpoint: {unexpected})"
        )


def describe(x: Any) -> str:
    shape = tuple(getattr(x, "shape", ()))
    return f"{type(x).__name__} dtype {getattr(x, 'dtype', '?')} shape {shape}"


def decode(parts: List[Tuple[str, Any]], into: Optional[MutableMapping[str, Any]] = None) -> Any:
    """The state of a loaded checkpoint's parts: new tensors, or `into` filled in place."""
    meta, data = _parse(parts)
    dec = _Decoder(meta, data)
    if into is None:
        return dec.node(meta["tree"])
    return dec.fill(meta["tree"], into, [])


def _has_tensor(node: Dict[str, Any]) -> bool:
    if "t" in node:
        return True
    children = node.get("l") or node.get("u") or [v for _, v in node.get("d", [])]
    return any(_has_tensor(c) for c in children)


def load_in_place(meta_part: Any, into: MutableMapping[str, Any], scatter: Any) -> Any:
    """Fills `into` from a checkpoint whose `state.json` is `meta_part`, reading the tensors
    part once through ``scatter([(offset, writable buffer), ...])`` straight into the target
    tensors and arrays where they are contiguous CPU memory of the saved dtype and shape (into
    a temporary, then copied, where not). Everything is checked before anything is read."""
    meta, _ = _parse([(META_PART, meta_part)])
    targets: List[Tuple[int, Any]] = []
    after: List[Any] = []
    torch = _torch()

    def tensor_entry(i: int) -> Dict[str, Any]:
        return meta["tensors"][i]

    def plan(node: Dict[str, Any], target: Any, path: List[str], parent: Any, key: Any) -> None:
        if "d" in node:
            check_same_keys(node, target, path)
            for k, v in node["d"]:
                plan(v, target[k], path + [k], target, k)
            return
        if "t" not in node:
            if _has_tensor(node):
                raise ValueError(f"{path_text(path)}: lists or tuples holding tensors cannot be loaded in place")
            value = _Decoder(meta, None).node(node)
            after.append(lambda: parent.__setitem__(key, value))
            return
        e = tensor_entry(node["t"])
        off, n = e["offset"], e["nbytes"]
        if e["kind"] == "torch":
            dtype = getattr(__import__("torch"), e["dtype"])
            if torch is None or not isinstance(target, torch.Tensor):
                raise ValueError(f"{path_text(path)}: the checkpoint holds a tensor, the target is a {type(target).__name__}")
            if target.dtype != dtype or list(target.shape) != e["shape"]:
                raise ValueError(
                    f"{path_text(path)}: the checkpoint holds dtype {e['dtype']} shape {tuple(e['shape'])}, "
                    f"the target is {describe(target)}"
                )
            if n == 0:
                return
            if target.device.type == "cpu" and target.is_contiguous() and not target.is_conj() and not target.is_neg():
                targets.append((off, target.detach().reshape(-1).view(torch.uint8).numpy()))
            else:
                tmp = np.empty(n, np.uint8)
                targets.append((off, tmp))

                def copy_back(t: Any = target, tmp: np.ndarray = tmp, dtype: Any = dtype, shape: Any = e["shape"]) -> None:
                    with torch.no_grad():
                        t.copy_(torch.from_numpy(tmp).view(dtype).reshape(shape))

                after.append(copy_back)
            return
        if e["kind"] == "numpy" and e.get("scalar"):
            # A numpy scalar is immutable: replaced by the saved one.
            dtype = np.lib.format.descr_to_dtype(_descr(e["dtype"]))
            tmp = np.empty(n, np.uint8)
            targets.append((off, tmp))
            after.append(lambda tmp=tmp, dtype=dtype: parent.__setitem__(key, tmp.view(dtype).reshape(())[()]))
            return
        if e["kind"] == "numpy":
            dtype = np.lib.format.descr_to_dtype(_descr(e["dtype"]))
            if not isinstance(target, np.ndarray) or target.dtype != dtype or list(target.shape) != e["shape"]:
                raise ValueError(
                    f"{path_text(path)}: the checkpoint holds dtype {dtype} shape {tuple(e['shape'])}, "
                    f"the target is {describe(target)}"
                )
            if n == 0:
                return
            if target.flags.c_contiguous and target.flags.writeable:
                targets.append((off, target.reshape(-1).view(np.uint8)))
            else:
                tmp = np.empty(n, np.uint8)
                targets.append((off, tmp))
                after.append(lambda t=target, tmp=tmp, dtype=dtype, shape=e["shape"]: np.copyto(t, tmp.view(dtype).reshape(shape)))
            return
        # bytes / bytearray: replaced by the saved value
        tmp = np.empty(n, np.uint8)
        targets.append((off, tmp))
        kind = e["kind"]
        after.append(lambda tmp=tmp, kind=kind: parent.__setitem__(key, bytearray(tmp.tobytes()) if kind == "bytearray" else tmp.tobytes()))

    plan(meta["tree"], into, [], None, None)
    scatter(targets)
    for f in after:
        f()
    return into
