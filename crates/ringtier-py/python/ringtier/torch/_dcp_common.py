"""What the DCP writer and reader share: the on-disk names, the step and prefix parsing, the
metadata's allow-listed unpickler and the JSON parts' bounded parsing."""

from __future__ import annotations

import json
import os
import pickle
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.distributed.checkpoint import metadata as _md
from torch.serialization import _get_layout

from .._types import PathLike
from ..errors import CorruptError

FORMAT = "ringtier-dcp"
VERSION = 1
#: The coordinator's part holding DCP's pickled ``Metadata``.
METADATA_PART = "metadata"
#: The coordinator's part naming the saving ranks (JSON).
WORLD_PART = "world.json"
#: Each rank's part describing its items (JSON).
RANK_PART = "rank.json"
#: The most bytes of ``metadata`` or a JSON part read (1 GiB); larger is refused unread.
MAX_METADATA_BYTES = 1 << 30
_ALIGN = 64
_ZEROS = bytes(_ALIGN)
_PART_NAME = re.compile(r"data-[0-9]{5}\Z")
#: The fqn of the write result that carries a rank's shard report (``group_shard``) to the
#: coordinator's ``finish`` beside its items' results; never in the metadata.
_SHARD_REPORT = "__ringtier_shard_report__"


def _parse_step(checkpoint_id: Any) -> Optional[int]:
    """The step a ``checkpoint_id`` names (an int, or a str of decimal digits), else None."""
    if checkpoint_id is None or isinstance(checkpoint_id, bool):
        return None
    if isinstance(checkpoint_id, int):
        return checkpoint_id if checkpoint_id >= 0 else None
    if isinstance(checkpoint_id, str) and checkpoint_id.strip().isdigit():
        return int(checkpoint_id.strip())
    return None


def _step_of(checkpoint_id: Any) -> Optional[int]:
    if checkpoint_id is None:
        return None
    step = _parse_step(checkpoint_id)
    if step is None:
        raise ValueError(
            f"checkpoint_id {checkpoint_id!r} does not name a ringtier step: give an int >= 0 or a string of "
            "one (the tiers are given to the StorageWriter/StorageReader, not as checkpoint_id)"
        )
    return step


def _rank_prefix(prefix: str, rank: int) -> str:
    return f"{prefix}/rank{rank:05d}"


def _tiers_list(tiers: Sequence[PathLike]) -> List[str]:
    if isinstance(tiers, (str, bytes, os.PathLike)):
        raise TypeError("tiers must be a list, fastest first (e.g. [fast, slow])")
    out = [os.fspath(t) for t in tiers]
    if not out:
        raise ValueError("tiers must name at least one tier")
    if any(not isinstance(t, str) for t in out):
        raise TypeError("tiers must be str or os.PathLike (not bytes)")
    return out


def _check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not prefix or prefix.startswith("/") or ".." in prefix.split("/"):
        raise ValueError(f"prefix must be a relative key without '..', got {prefix!r}")
    return prefix


# ---- the metadata: pickled by DCP's classes, unpickled with an allow-list ----------------------

_DCP_CLASSES = {
    "Metadata",
    "MetadataIndex",
    "ChunkStorageMetadata",
    "TensorStorageMetadata",
    "BytesStorageMetadata",
    "TensorProperties",
    "StorageMeta",
    "_MEM_FORMAT_ENCODING",
}
_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "int", "float", "str", "bytes", "bool", "complex"}


class _MetadataUnpickler(pickle.Unpickler):
    """Loads DCP metadata and refuses any other class (a tampered file cannot run code)."""

    def __init__(self, f: Any, allowed: Dict[Tuple[str, str], Any]) -> None:
        super().__init__(f)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if module == _md.__name__ and name in _DCP_CLASSES:
            return getattr(_md, name)
        if module == "builtins" and name in _BUILTINS:
            return super().find_class(module, name)
        if module == "collections" and name in ("OrderedDict", "defaultdict"):
            return super().find_class(module, name)
        if module == "torch" and name == "Size":
            return torch.Size
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
            return getattr(torch, name)
        if module == "torch.serialization" and name == "_get_layout":
            # Looks a layout up by its name in torch's own table (how torch pickles layouts).
            return _get_layout
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            raise pickle.UnpicklingError("DCP metadata holding tensors is not supported")
        hit = self._allowed.get((module, name))
        if hit is not None:
            return hit
        raise pickle.UnpicklingError(
            f"DCP metadata refers to {module}.{name}, which is not allowed (pass it to "
            "StorageReader(safe_globals=[...]) if you trust this checkpoint)"
        )


def _json_part(buf: Any, what: str) -> Dict[str, Any]:
    try:
        doc = json.loads(bytes(memoryview(buf)))
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptError(f"{what} is not JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CorruptError(f"{what} is not a {FORMAT} document")
    if doc.get("version") != VERSION:
        raise CorruptError(f"{what} has version {doc.get('version')!r}; this build reads {VERSION}")
    return doc


# ---- the writer ----------------------------------------------------------------------------
