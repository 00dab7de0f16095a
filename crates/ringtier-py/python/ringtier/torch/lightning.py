"""A Lightning ``CheckpointIO`` over the ringtier checkpoint store (needs ``lightning``).

    from lightning.pytorch import Trainer
    from ringtier.torch.lightning import RingtierCheckpointIO

    trainer = Trainer(plugins=[RingtierCheckpointIO(["/nvme/ckpt", "/nfs/ckpt"])])

Each checkpoint path Lightning names (``DIR/epoch=0-step=100.ckpt``, ``DIR/last.ckpt``) is a
store of its own on the tiers (prefix ``PREFIX/<name>-<hash of the full path>``); each save of
that path is its next step, so saving ``last.ckpt`` again replaces it and loading a path reads
its newest step. ``save_checkpoint`` returns once the checkpoint is durable on the fast tier
and it drains to the slower tiers in the background; ``remove_checkpoint`` (Lightning's top-k
pruning) deletes every step of the path from every tier; ``teardown`` (the end of ``fit``)
waits for the drains and closes the stores. Nothing is written under ``DIR`` itself.

A Lightning checkpoint holds tensors (model and optimizer state) and other values (loops,
callbacks, hyper-parameters, optimizer states keyed by int). The tensors are saved by the
store from their own memory; the rest, with a placeholder per tensor, as one ``torch.save``
blob, read back with ``torch.load(weights_only=...)`` as Lightning asks (``True`` unless it
passes ``False``).

This plugin is for strategies whose rank 0 saves the whole checkpoint (single device, DDP).
Sharded strategies (FSDP) save through ``torch.distributed.checkpoint``: give them
:class:`ringtier.torch.dcp.StorageWriter` and :class:`~ringtier.torch.dcp.StorageReader`.
"""

from __future__ import annotations

import copy
import hashlib
import io
import os
import re
from typing import Any, Dict, List, Optional

import torch
from lightning.fabric.plugins import CheckpointIO

from .._types import PathLike
from ..checkpoint import CheckpointStore

_MARK = "__ringtier_tensor__"


def _split(obj: Any, tensors: Dict[str, torch.Tensor]) -> Any:
    """``obj`` with each tensor replaced by ``(_MARK, key)`` and put in ``tensors``."""
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors):06d}"
        tensors[key] = obj
        return (_MARK, key)
    if isinstance(obj, dict):
        out = copy.copy(obj)  # the same mapping type, its attributes (a state_dict's _metadata) kept
        for k, v in obj.items():
            out[k] = _split(v, tensors)
        return out
    if isinstance(obj, list):
        return [_split(v, tensors) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_split(v, tensors) for v in obj)
    return obj


def _join(obj: Any, tensors: Dict[str, Any], map_location: Any) -> Any:
    if isinstance(obj, tuple) and len(obj) == 2 and obj[0] == _MARK and isinstance(obj[1], str):
        t = tensors[obj[1]]
        if isinstance(map_location, (str, torch.device)):
            t = t.to(map_location)
        return t
    if isinstance(obj, dict):
        for k in list(obj):
            obj[k] = _join(obj[k], tensors, map_location)
        return obj
    if isinstance(obj, list):
        return [_join(v, tensors, map_location) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_join(v, tensors, map_location) for v in obj)
    return obj


class RingtierCheckpointIO(CheckpointIO):
    """Lightning checkpoints in ringtier checkpoint stores on ``tiers`` (fastest first).

    Arguments:
        tiers: directories (or ``s3://`` URLs), fastest first.
        prefix: the key prefix of every store this plugin makes.
        **store_options: passed to each :class:`ringtier.CheckpointStore` (``keep_last``
            defaults to 1 here: a path's older steps are only kept on the slower tiers).
    """

    def __init__(self, tiers: List[PathLike], *, prefix: str = "lightning", **store_options: Any) -> None:
        if isinstance(tiers, (str, bytes, os.PathLike)):
            raise TypeError("tiers must be a list, fastest first (e.g. [fast, slow])")
        self.tiers = [os.fspath(t) for t in tiers]
        self.prefix = prefix
        self.store_options = {"create": True, "keep_last": 1, **store_options}
        self._stores: Dict[str, CheckpointStore] = {}

    def _prefix(self, path: PathLike) -> str:
        full = os.path.abspath(os.fspath(path))
        name = os.path.basename(full)
        if name.endswith(".ckpt"):
            name = name[: -len(".ckpt")]
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80] or "ckpt"
        digest = hashlib.sha256(full.encode()).hexdigest()[:12]
        return f"{self.prefix}/{safe}-{digest}"

    def _store(self, path: PathLike) -> CheckpointStore:
        key = self._prefix(path)
        s = self._stores.get(key)
        if s is None:
            s = CheckpointStore(self.tiers, prefix=key, **self.store_options)
            self._stores[key] = s
        return s

    def save_checkpoint(self, checkpoint: Dict[str, Any], path: PathLike, storage_options: Optional[Any] = None) -> None:
        """Saves ``checkpoint`` as the next step of ``path``'s store; returns once durable on
        the fast tier."""
        if storage_options is not None:
            raise TypeError(f"RingtierCheckpointIO takes no storage_options (got {storage_options!r})")
        tensors: Dict[str, torch.Tensor] = {}
        skeleton = _split(checkpoint, tensors)
        buf = io.BytesIO()
        torch.save(skeleton, buf)
        store = self._store(path)
        latest = store.latest()
        step = 0 if latest is None else latest + 1
        store.save(step, {"skeleton": buf.getvalue(), "tensors": tensors})

    def load_checkpoint(
        self, path: PathLike, map_location: Optional[Any] = None, weights_only: Optional[bool] = None
    ) -> Dict[str, Any]:
        """The newest checkpoint saved as ``path``; ``FileNotFoundError`` when there is none."""
        store = self._store(path)
        state = store.load()
        if state is None:
            raise FileNotFoundError(f"no checkpoint saved as {os.fspath(path)!r} on {self.tiers}")
        skeleton = torch.load(io.BytesIO(state["skeleton"]), weights_only=weights_only is not False)
        return _join(skeleton, state["tensors"], map_location)

    def remove_checkpoint(self, path: PathLike) -> None:
        """Deletes every step of ``path`` from every tier."""
        store = self._store(path)
        for c in store.list():
            store.delete(c["step"])

    def exists(self, path: PathLike) -> bool:
        """True when a checkpoint was saved as ``path``."""
        return self._store(path).latest() is not None

    def teardown(self) -> None:
        """Waits for every store's drain, then closes them."""
        for s in self._stores.values():
            s.close(drain=True)
        self._stores = {}


__all__ = ["RingtierCheckpointIO"]
