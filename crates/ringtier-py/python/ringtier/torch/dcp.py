"""``torch.distributed.checkpoint`` (DCP) storage over the ringtier checkpoint store.

:class:`StorageWriter` and :class:`StorageReader` plug into ``dcp.save``, ``dcp.async_save`` and
``dcp.load``, so code that checkpoints through DCP (FSDP2, torchtitan, Lightning's FSDP
strategy) gets the burst buffer, the drain to slower tiers (S3 included) and DCP's resharding
without changing how it saves::

    import torch.distributed.checkpoint as dcp
    from ringtier.torch.dcp import StorageReader, StorageWriter

    writer = StorageWriter(["/nvme/ckpt", "/nfs/ckpt"])
    dcp.save(state_dict, storage_writer=writer, checkpoint_id=step)   # durable on /nvme
    ...
    dcp.load(state_dict, storage_reader=StorageReader(["/nvme/ckpt", "/nfs/ckpt"]))  # newest

Layout on every tier (``PREFIX`` is ``"dcp"`` unless given):

* ``PREFIX/rankNNNNN``: one checkpoint store per saving rank; step ``S`` holds that rank's
  items in parts ``data-00000``, ``data-00001``, ... (each item's bytes at a 64-byte aligned
  offset; a part is at most ``part_bytes`` unless one item is larger) and ``rank.json``;
* ``PREFIX/metadata``: the coordinator's store; step ``S`` holds ``metadata`` (DCP's
  ``Metadata``, pickled, every item's ``(rank, part, offset, nbytes)`` in its
  ``storage_data``) and ``world.json`` (the saving ranks and their bytes).

A step is committed once ``PREFIX/metadata`` holds it, and the coordinator saves it only in
``finish``, after every rank's ``write_data`` returned, that is after every rank's items are
durable (on the fast tier): DCP's metadata goes last. Each store drains to the slower tiers on
its own; a reader uses a step only where its metadata and every saving rank's items are
committed on some tier it sees, so a step whose metadata reached the slow tier before a rank's
items did is passed over (newest) or refused (named), never read half.

Loads read each needed part through the store's streamed restore: checksums are checked as the
bytes pass, and a bad fast copy is read again from the next tier. Items are copied straight
into the destination tensors where those are contiguous CPU tensors of the saved dtype and the
requested region is contiguous in the saved chunk (always so for a load with the saving world
size, and for FSDP2's dim-0 shards at any world size); otherwise through a temporary per item.
A part is read whole (its checksum covers all of it) even where a rank needs some of its items
only, so resharding reads up to ``saving ranks / loading ranks`` times a rank's share.

The metadata is unpickled with an allow-list (DCP's metadata classes, ``torch.Size``, dtypes,
builtins): a tampered file cannot run code. Pass ``safe_globals`` to the reader to allow more
classes (a custom planner's ``planner_data``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import re
import threading
import time
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import metadata as _md
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader as _DcpReader
from torch.distributed.checkpoint.storage import StorageWriter as _DcpWriter
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future
from torch.serialization import _get_layout

from .._ringtier import GroupManifest, group_check, group_commit, group_shard
from .._types import PathLike
from ..checkpoint import CheckpointStore
from ..errors import CorruptError, RingtierError

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


class StorageWriter(_DcpWriter):
    """A ``torch.distributed.checkpoint`` storage writer saving into ringtier checkpoint stores
    on ``tiers`` (fastest first, as for :class:`ringtier.CheckpointStore`).

    ``checkpoint_id`` (given to ``dcp.save``/``dcp.async_save``) names the step: an int, or a
    string holding one; it applies to the next save. Without one a save takes the step after
    the newest committed one. A step already committed is refused; a step whose save failed
    before its metadata was written is saved again (the failed attempt's items are deleted).

    Each rank saves its items to its own store (``PREFIX/rankNNNNN``) and returns from
    ``write_data`` once they are durable on the fast tier; the coordinator then commits the step
    (``PREFIX/metadata``). The stores stay open between saves, draining to the slower tiers in
    the background; :meth:`drain` waits for that, :meth:`close` (or ``with``) closes them.

    Arguments:
        tiers: directories (or other tier URLs the store takes), fastest first.
        prefix: the key prefix of this writer's stores on every tier.
        part_bytes: items are packed into parts of at most this many bytes (an item larger is a
            part of its own), and of at most a ``save_parallelism``-th of the rank's bytes, so
            that ``save_parallelism`` parts are written at once.
        **store_options: passed to each :class:`ringtier.CheckpointStore` (``chunk_bytes``,
            ``keep_last``, ``save_parallelism``, ``engine``, ``drain_bytes_per_sec``, ...);
            defaults here: ``create=True``, ``save_parallelism=2``, ``chunk_bytes=32 MiB``
            (two parts in flight, each with one 32 MiB write while its next chunk is copied:
            128 MiB of buffers: fewer, larger extending O_DIRECT writes; 1 GiB from one rank on
            ext4 here, median of six saves 0.68 s against 0.91 s for four parts of 8 MiB writes).
    """

    def __init__(
        self,
        tiers: Sequence[PathLike],
        *,
        prefix: str = "dcp",
        part_bytes: int = 64 << 20,
        **store_options: Any,
    ) -> None:
        super().__init__()
        if isinstance(part_bytes, bool) or not isinstance(part_bytes, int) or part_bytes <= 0:
            raise ValueError(f"part_bytes must be a positive int, got {part_bytes!r}")
        if "read_only" in store_options or "prefix" in store_options:
            raise TypeError("StorageWriter takes prefix as its own argument and cannot be read_only")
        self.tiers = _tiers_list(tiers)
        self.prefix = _check_prefix(prefix)
        self.part_bytes = part_bytes
        self.store_options = {"create": True, "save_parallelism": 2, "chunk_bytes": 32 << 20, **store_options}
        self._pinned: Optional[int] = None
        self._rank: Optional[int] = None
        self._is_coordinator = False
        self._shards: Optional[CheckpointStore] = None
        self._meta: Optional[CheckpointStore] = None
        #: Steps committed under ``PREFIX/metadata`` (None: not listed since it was opened).
        self._committed: Optional[set] = None
        self._lock = threading.Lock()
        #: The last save's step and this rank's numbers: ``{"step", "bytes", "parts",
        #: "items", "write_seconds"}`` (None before the first save).
        self.last_save: Optional[Dict[str, Any]] = None

    # -- pickling (DCP's process-based async executor sends the writer to another process)
    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_shards"] = state["_meta"] = None
        state["_committed"] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def checkpoint_id(self) -> Optional[int]:
        """The step the next save will use when one was given (None: the next free step)."""
        return self._pinned

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike, None]) -> bool:
        """True for an int >= 0 or a string of one."""
        return _parse_step(checkpoint_id) is not None

    def reset(self, checkpoint_id: Union[str, os.PathLike, int, None] = None) -> None:
        """Sets the step of the next save (``None``: the step after the newest committed)."""
        self._pinned = _step_of(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Opens this rank's store (and on the coordinator the metadata store)."""
        if kwargs.get("use_collectives", True) is False and dist.is_available() and dist.is_initialized():
            if dist.get_world_size() > 1:
                raise ValueError(
                    "ringtier's DCP writer commits a step once for all ranks: save with use_collectives=True"
                )
        rank = kwargs.get("rank")
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        with self._lock:
            if self._shards is not None and self._rank != rank:
                self._shards.close()
                self._shards = None
            self._rank = int(rank)
            self._is_coordinator = bool(is_coordinator)
            if self._shards is None:
                self._shards = CheckpointStore(
                    self.tiers, prefix=_rank_prefix(self.prefix, self._rank), **self.store_options
                )
            if self._is_coordinator and self._meta is None:
                self._meta = CheckpointStore(self.tiers, prefix=f"{self.prefix}/metadata", **self.store_options)
                self._committed = None

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Unchanged: items are placed in parts by :meth:`write_data`."""
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        """On the coordinator: picks the step (the given one, refused if committed; or the
        step after the newest committed) and tells each rank its step and slot."""
        meta = self._require(self._meta, "prepare_global_plan runs on the coordinator after set_up_storage_writer")
        # The committed steps are listed once per opened metadata store, then kept up to date
        # by this writer's own commits (it holds the store's lock: no other process commits
        # under this prefix): a save lists no tier on its blocking path. A step the cache
        # holds is checked again against the tiers before a save is refused for it.
        if self._committed is None:
            self._committed = {c["step"] for c in meta.list()}
        committed = self._committed
        if self._pinned is not None and self._pinned in committed:
            committed = self._committed = {c["step"] for c in meta.list()}
        if self._pinned is not None:
            step = self._pinned
            if step in committed:
                raise ValueError(
                    f"DCP checkpoint {step} is already committed under {self.prefix!r} on {self.tiers}: "
                    "give another checkpoint_id, or delete it first"
                )
        else:
            step = max(committed) + 1 if committed else 0
        world = len(plans)
        return [
            dataclasses.replace(p, storage_data={"ringtier_step": step, "rank": i, "world_size": world})
            for i, p in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        """Writes this rank's items as its store's step and returns (a completed future) once
        they are durable on the fast tier."""
        t0 = time.perf_counter()
        shards = self._require(self._shards, "write_data runs after set_up_storage_writer")
        sd = plan.storage_data
        if not isinstance(sd, dict) or "ringtier_step" not in sd:
            raise ValueError("the save plan was not prepared by ringtier's StorageWriter.prepare_global_plan")
        step, rank = int(sd["ringtier_step"]), int(sd["rank"])
        if rank != self._rank:
            raise ValueError(f"the plan is for rank {rank}, this writer was set up as rank {self._rank}")
        parts, results, nbytes = self._pack(plan.items, planner, rank)
        parts.append((RANK_PART, [json.dumps({
            "format": FORMAT, "version": VERSION, "step": step, "rank": rank, "world_size": sd.get("world_size"),
            "items": len(results), "bytes": nbytes,
        }).encode()]))
        try:
            shards._store.save(step, parts)
        except RingtierError as e:
            if getattr(e, "kind", None) != "already_exists":
                raise
            # A shard of this step is left from a save whose metadata was never written (the
            # coordinator refused committed steps before any rank wrote): replaced. The store
            # refuses a step it holds before writing a byte, so nothing is listed up front.
            shards.delete(step)
            shards._store.save(step, parts)
        # The proof that this rank's items are committed in its store, for the group commit.
        report = group_shard(shards._store, rank, step, nbytes, len(results))
        self.last_save = {
            "step": step, "rank": rank, "bytes": nbytes, "parts": len(parts) - 1, "items": len(results),
            "write_seconds": time.perf_counter() - t0,
        }
        fut: Future = Future()
        fut.set_result(results + [WriteResult(index=MetadataIndex(_SHARD_REPORT), size_in_bytes=0, storage_data=report)])
        return fut

    def _pack(
        self, items: Iterable[WriteItem], planner: SavePlanner, rank: int
    ) -> Tuple[List[Tuple[str, List[Any]]], List[WriteResult], int]:
        parts: List[Tuple[str, List[Any]]] = []
        results: List[WriteResult] = []
        bufs: List[Any] = []
        off = 0
        total = 0
        items = list(items)
        planned = sum(_planned_bytes(i) for i in items)
        parallel = max(1, int(self.store_options.get("save_parallelism", 1)))
        limit = min(self.part_bytes, max(1 << 20, -(-planned // parallel)))

        def close_part() -> None:
            nonlocal bufs, off
            if bufs or not parts:
                parts.append((f"data-{len(parts):05d}", bufs))
            bufs, off = [], 0

        for item in items:
            data, n = _item_bytes(item, planner)
            pad = (-off) % _ALIGN
            if bufs and off + pad + n > limit:
                close_part()
                pad = 0
            if pad:
                bufs.append(memoryview(_ZEROS)[:pad])
                off += pad
            name = f"data-{len(parts):05d}"
            results.append(WriteResult(index=item.index, size_in_bytes=n, storage_data=(rank, name, off, n)))
            if n:
                bufs.append(data)
            off += n
            total += n
        close_part()
        if len(parts) > 99999:
            raise ValueError(f"{len(parts)} parts: raise part_bytes")
        return parts, results, total

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        """On the coordinator, once every rank's ``write_data`` returned: commits the step
        through the group commit (``ringtier._ringtier.group_commit``: refused unless every
        rank's report proves its items committed in its store), which saves DCP's metadata and
        the group manifest (``world.json``) to ``PREFIX/metadata``, last."""
        meta = self._require(self._meta, "finish runs on the coordinator")
        where: Dict[MetadataIndex, Tuple[int, str, int, int]] = {}
        reports: List[Any] = []
        for r, rank_results in enumerate(results):
            report: Any = f"rank {r} returned no shard report (not saved by ringtier's StorageWriter)"
            for wr in rank_results:
                if wr.index.fqn == _SHARD_REPORT:
                    report = wr.storage_data
                    continue
                loc = wr.storage_data
                if not (isinstance(loc, tuple) and len(loc) == 4 and loc[0] == r):
                    raise ValueError(f"rank {r} returned a write result not made by ringtier's StorageWriter: {loc!r}")
                where[wr.index] = loc
            reports.append(report)
        step = self.last_save["step"] if self.last_save is not None else None
        if step is None:
            raise ValueError("finish before write_data on the coordinator")
        metadata.storage_data = where
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.checkpoint_id = str(step)
        blob = pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)
        group_commit(meta._store, step, reports, [(METADATA_PART, blob)])
        if self._committed is not None:
            self._committed.add(step)
        self._pinned = None

    def storage_meta(self) -> Optional[StorageMeta]:
        """None: the step is known only once the coordinator planned the save."""
        return None

    def drain(self) -> None:
        """Waits until this rank's (and on the coordinator the metadata's) checkpoints have
        reached the slowest tier."""
        for s in (self._shards, self._meta):
            if s is not None:
                s.drain()

    def drain_stats(self) -> Dict[str, Any]:
        """This rank's store's drain totals (see :meth:`ringtier.CheckpointStore.drain_stats`)."""
        return self._require(self._shards, "drain_stats after a save").drain_stats()

    def close(self, drain: bool = False) -> None:
        """Closes the stores (``drain=True`` first waits for their drains). Safe to call twice;
        a later save opens them again."""
        with self._lock:
            for s in (self._shards, self._meta):
                if s is not None:
                    s.close(drain)
            self._shards = self._meta = None
            self._committed = None

    def __enter__(self) -> "StorageWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _require(store: Optional[CheckpointStore], why: str) -> CheckpointStore:
        if store is None:
            raise RuntimeError(f"ringtier DCP writer: {why}")
        return store

    def __repr__(self) -> str:
        return f"ringtier.torch.dcp.StorageWriter({self.tiers!r}, prefix={self.prefix!r})"


def _planned_bytes(item: WriteItem) -> int:
    """The bytes the plan says ``item`` holds (0 where it does not say)."""
    if item.type == WriteItemType.BYTE_IO:
        return item.bytes_io_data.nbytes if item.bytes_io_data is not None else 0
    td = item.tensor_data
    if td is None:
        return 0
    n = torch._utils._element_size(td.properties.dtype)
    for d in td.chunk.sizes:  # this rank's chunk, not the whole tensor
        n *= d
    return n


def _item_bytes(item: WriteItem, planner: SavePlanner) -> Tuple[Any, int]:
    """The bytes of one write item (a buffer over the tensor's own memory where it is a
    contiguous CPU tensor) and their count."""
    data = planner.resolve_data(item)
    if item.type == WriteItemType.BYTE_IO:
        if isinstance(data, io.BytesIO):
            raw = data.getvalue()
        elif isinstance(data, (bytes, bytearray, memoryview)):
            raw = bytes(data)
        else:
            raise TypeError(f"{item.index.fqn}: a BYTE_IO item resolved to a {type(data).__name__}")
        return raw, len(raw)
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"{item.index.fqn}: a tensor item resolved to a {type(data).__name__}")
    td = item.tensor_data
    t = data.detach()
    if td is not None:
        if tuple(t.shape) != tuple(td.chunk.sizes):
            raise ValueError(f"{item.index.fqn}: resolved shape {tuple(t.shape)}, the plan says {tuple(td.chunk.sizes)}")
        if t.dtype != td.properties.dtype:
            raise ValueError(f"{item.index.fqn}: resolved dtype {t.dtype}, the plan says {td.properties.dtype}")
    if t.layout != torch.strided or t.is_quantized:
        raise TypeError(f"{item.index.fqn}: only dense tensors can be saved ({t.layout})")
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    n = t.numel() * t.element_size()
    if n == 0:
        return None, 0
    return t.reshape(-1).view(torch.uint8).numpy(), n


# ---- the reader ----------------------------------------------------------------------------


class StorageReader(_DcpReader):
    """A ``torch.distributed.checkpoint`` storage reader over the stores a
    :class:`StorageWriter` saved to on ``tiers`` (fastest first).

    ``checkpoint_id`` (given to ``dcp.load``) names the step (an int or a string of one); it
    stays until the next ``reset``. Without one, the newest step that is committed and whose
    every saving rank's items are committed on some tier is loaded; newer steps that are not
    are named in a ``RuntimeWarning`` and in :attr:`skipped`. DCP reshards: the loading world
    size may differ from the saving one.

    Arguments:
        tiers: as given to the writer (each a tier this process can see: its own fast tier and
            the shared slow one; a step drained to the slow tier loads from there).
        prefix: as given to the writer.
        safe_globals: classes (besides DCP's metadata classes) the metadata may refer to.
        **store_options: passed to each read-only :class:`ringtier.CheckpointStore`
            (``engine``, ``chunk_bytes``, ...).
    """

    def __init__(
        self,
        tiers: Sequence[PathLike],
        *,
        prefix: str = "dcp",
        safe_globals: Sequence[Any] = (),
        **store_options: Any,
    ) -> None:
        super().__init__()
        if "read_only" in store_options or "prefix" in store_options:
            raise TypeError("StorageReader takes prefix as its own argument and is always read-only")
        self.tiers = _tiers_list(tiers)
        self.prefix = _check_prefix(prefix)
        self.store_options = dict(store_options)
        self._allowed = {(g.__module__, g.__qualname__): g for g in safe_globals}
        self._pinned: Optional[int] = None
        self._stores: Dict[str, CheckpointStore] = {}
        self._step: Optional[int] = None
        self._world: Optional[Dict[str, Any]] = None
        self._where: Dict[MetadataIndex, Tuple[int, str, int, int]] = {}
        self._metadata: Optional[Metadata] = None
        #: Newer steps passed over by the last load without a checkpoint_id: ``[(step, reason)]``.
        self.skipped: List[Tuple[int, str]] = []
        #: The last load's numbers: ``{"step", "bytes", "direct_bytes", "parts", "read_seconds"}``.
        self.last_load: Optional[Dict[str, Any]] = None

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_stores"] = {}
        return state

    @property
    def checkpoint_id(self) -> Optional[int]:
        """The step being (or last) loaded, or the given one."""
        return self._step if self._step is not None else self._pinned

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike, None]) -> bool:
        """True for an int >= 0 or a string of one."""
        return _parse_step(checkpoint_id) is not None

    def reset(self, checkpoint_id: Union[str, os.PathLike, int, None] = None) -> None:
        """Sets the step to load (``None``: the newest loadable one)."""
        self._pinned = _step_of(checkpoint_id)
        self._step = None

    def _store(self, prefix: str) -> CheckpointStore:
        s = self._stores.get(prefix)
        if s is None:
            # A tier directory that does not exist holds nothing (a node's fast tier not made
            # yet, a first run): read from the others.
            tiers = [t for t in self.tiers if "://" in t or os.path.isdir(t)]
            if not tiers:
                raise FileNotFoundError(
                    f"no loadable DCP checkpoint under {self.prefix!r} on {self.tiers}: no tier directory exists"
                )
            s = CheckpointStore(tiers, prefix=prefix, read_only=True, **self.store_options)
            self._stores[prefix] = s
        return s

    def _read_small(self, store: CheckpointStore, step: int, part: str, what: str) -> Any:
        sizes = [c["bytes"] for c in store.list() if c["step"] == step]
        if sizes and sizes[0] > 2 * MAX_METADATA_BYTES:
            raise CorruptError(f"{what}: {sizes[0]} bytes, more than DCP metadata can be")
        buf = store._store.read_part(step, part)
        if len(buf) > MAX_METADATA_BYTES:
            raise CorruptError(f"{what}: {len(buf)} bytes, more than DCP metadata can be ({MAX_METADATA_BYTES})")
        return buf

    def _missing_ranks(self, step: int, world: Dict[str, Any]) -> List[int]:
        """The saving ranks whose items are not committed on a tier this process sees (the
        group manifest's check; ``CorruptError`` for items that are not the committed ones)."""
        stores: List[Any] = []
        for r in range(world["world_size"]):
            try:
                stores.append(self._store(_rank_prefix(self.prefix, r))._store)
            except FileNotFoundError:
                stores.append(None)
        return list(world["group"].missing(stores))

    def _world_of(self, step: int) -> Dict[str, Any]:
        """The group manifest of committed ``step`` (``FileNotFoundError`` when it is not
        committed, ``CorruptError`` when its manifest is bad)."""
        m: GroupManifest = group_check(self._store(f"{self.prefix}/metadata")._store, step)
        return {"step": step, "world_size": m.world_size, "ranks": m.ranks, "group": m}

    def latest(self) -> Optional[int]:
        """The newest loadable step (committed, every saving rank's items on a tier this
        process sees), or None: what a load without ``checkpoint_id`` would read. Newer steps
        passed over are in :attr:`skipped`."""
        try:
            return self._newest()[0]
        except FileNotFoundError:
            return None

    def _newest(self) -> Tuple[int, Dict[str, Any]]:
        meta = self._store(f"{self.prefix}/metadata")
        self.skipped = []
        for s in sorted((c["step"] for c in meta.list()), reverse=True):
            try:
                w: Optional[Dict[str, Any]] = self._world_of(s)
                assert w is not None
                missing = self._missing_ranks(s, w)
            except CorruptError as e:
                w, missing, why = None, [], str(e)
            else:
                why = f"the items of rank(s) {missing} are on no tier this process sees"
            if w is not None and not missing:
                return s, w
            self.skipped.append((s, why))
            warnings.warn(f"ringtier: DCP checkpoint {s} passed over: {why}", RuntimeWarning, stacklevel=3)
        raise FileNotFoundError(
            f"no loadable DCP checkpoint under {self.prefix!r} on {self.tiers}"
            + (f" ({len(self.skipped)} passed over: {self.skipped[0][1]})" if self.skipped else "")
        )

    def read_metadata(self) -> Metadata:
        """DCP's metadata of the step to load (see the class docs for which)."""
        meta = self._store(f"{self.prefix}/metadata")
        self.skipped = []
        if self._pinned is not None:
            step = self._pinned
            world = self._world_of(step)
            missing = self._missing_ranks(step, world)
            if missing:
                raise FileNotFoundError(
                    f"DCP checkpoint {step} is committed but the items of rank(s) {missing} are on no tier this "
                    f"process sees ({self.tiers}): their fast tier is elsewhere and not yet drained, or lost"
                )
        else:
            step, world = self._newest()
        blob = self._read_small(meta, step, METADATA_PART, f"DCP checkpoint {step} metadata")
        try:
            metadata = _MetadataUnpickler(io.BytesIO(memoryview(blob)), self._allowed).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
            raise CorruptError(f"DCP checkpoint {step}: its metadata cannot be read: {e}") from e
        if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
            raise CorruptError(f"DCP checkpoint {step}: its metadata is not ringtier DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.checkpoint_id = str(step)
        self._step, self._world = step, world
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Checks where each item lies (bounded, ranks known from ``world.json``)."""
        if self._step is None or self._world is None:
            raise RuntimeError("ringtier DCP reader: set_up_storage_reader before read_metadata")
        ranks = {e["rank"] for e in self._world["ranks"]}
        where = metadata.storage_data
        if not isinstance(where, dict):
            raise CorruptError(f"DCP checkpoint {self._step}: metadata.storage_data is not a dict")
        for idx, loc in where.items():
            ok = (
                isinstance(loc, tuple) and len(loc) == 4
                and isinstance(loc[0], int) and loc[0] in ranks
                and isinstance(loc[1], str) and _PART_NAME.match(loc[1]) is not None
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (loc[2], loc[3]))
            )
            if not ok:
                raise CorruptError(f"DCP checkpoint {self._step}: item {idx} has a bad location {loc!r}")
        self._where = where
        self._metadata = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Unchanged."""
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        """Unchanged."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        """Reads every item of ``plan``, one streamed, checksummed restore per part."""
        if self._metadata is None or self._step is None:
            raise RuntimeError("ringtier DCP reader: read_data before set_up_storage_reader")
        t0 = time.perf_counter()
        step = self._step
        by_part: Dict[Tuple[int, str], List[ReadItem]] = {}
        for req in plan.items:
            loc = self._where.get(req.storage_index)
            if loc is None:
                raise CorruptError(f"DCP checkpoint {step}: no location for {req.storage_index}")
            by_part.setdefault((loc[0], loc[1]), []).append(req)
        nbytes = direct = 0
        for (rank, part), reqs in sorted(by_part.items()):
            store = self._store(_rank_prefix(self.prefix, rank))
            targets, after, n, d = self._plan_part(reqs, planner)
            if targets:
                store._store.load_scatter(step, part, targets)
            for f in after:
                f()
            nbytes += n
            direct += d
        self.last_load = {
            "step": step, "bytes": nbytes, "direct_bytes": direct, "parts": len(by_part),
            "read_seconds": time.perf_counter() - t0,
        }
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _plan_part(
        self, reqs: List[ReadItem], planner: LoadPlanner
    ) -> Tuple[List[Tuple[int, Any]], List[Callable[[], None]], int, int]:
        """The scatter targets of one part's requests and what to do once they are filled."""
        assert self._metadata is not None
        targets: List[Tuple[int, Any]] = []
        after: List[Callable[[], None]] = []
        nbytes = direct = 0
        by_item: Dict[MetadataIndex, List[ReadItem]] = {}
        for req in reqs:
            by_item.setdefault(req.storage_index, []).append(req)
        for index, item_reqs in by_item.items():
            _rank, _part, off, n = self._where[index]
            if item_reqs[0].type == LoadItemType.BYTE_IO:
                tmp = np.empty(n, np.uint8)
                if n:
                    targets.append((off, tmp))
                nbytes += n
                for req in item_reqs:
                    after.append(lambda req=req, tmp=tmp: planner.load_bytes(req, io.BytesIO(tmp.tobytes())))
                continue
            md = self._metadata.state_dict_metadata.get(index.fqn)
            if not isinstance(md, TensorStorageMetadata):
                raise CorruptError(f"{index.fqn}: the metadata has no tensor entry for it")
            sizes = _chunk_sizes(md, index)
            dtype = md.properties.dtype
            elsize = torch.empty((), dtype=dtype).element_size()
            numel = 1
            for s in sizes:
                numel *= s
            if numel * elsize != n:
                raise CorruptError(
                    f"{index.fqn}: stored {n} bytes, its chunk {tuple(sizes)} of {dtype} needs {numel * elsize}"
                )
            # Straight into the destination where every request of this item can be.
            plans = []
            for req in item_reqs:
                span = _contiguous_span(sizes, req.storage_offsets, req.lengths)
                target = planner.resolve_tensor(req).detach()
                if tuple(target.shape) != tuple(req.lengths):
                    raise ValueError(f"{index.fqn}: the load plan's target is {tuple(target.shape)}, "
                                     f"the request {tuple(req.lengths)}")
                ok = (
                    span is not None and target.device.type == "cpu" and target.dtype == dtype
                    and target.is_contiguous() and not target.is_conj() and not target.is_neg()
                )
                plans.append((req, target, span if ok else None))
            spans = sorted((s[0] * elsize, s[1] * elsize) for _, _, s in plans if s is not None)
            disjoint = all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
            if disjoint and all(s is not None for _, _, s in plans):
                for req, target, span in plans:
                    assert span is not None
                    count = (span[1] - span[0]) * elsize
                    if count:
                        targets.append((off + span[0] * elsize, target.reshape(-1).view(torch.uint8).numpy()))
                    nbytes += count
                    direct += count
                    after.append(lambda req=req, target=target: planner.commit_tensor(req, target))
                continue
            tmp = np.empty(n, np.uint8)
            if n:
                targets.append((off, tmp))
            nbytes += n
            for req, target, _ in plans:
                def copy(req: ReadItem = req, target: Any = target, tmp: np.ndarray = tmp, sizes: Any = sizes,
                         dtype: Any = dtype) -> None:
                    src = torch.from_numpy(tmp).view(dtype).reshape(sizes)
                    for d, (o, l) in enumerate(zip(req.storage_offsets, req.lengths)):
                        src = src.narrow(d, o, l)
                    with torch.no_grad():
                        target.copy_(src)
                    planner.commit_tensor(req, target)

                after.append(copy)
        return targets, after, nbytes, direct

    def drain(self) -> None:
        """Nothing to drain (read-only)."""

    def close(self) -> None:
        """Closes the read-only stores this reader opened."""
        for s in self._stores.values():
            s.close()
        self._stores = {}

    def __enter__(self) -> "StorageReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ringtier.torch.dcp.StorageReader({self.tiers!r}, prefix={self.prefix!r})"


def _chunk_sizes(md: TensorStorageMetadata, index: MetadataIndex) -> List[int]:
    """The sizes of the saved chunk ``index`` points at."""
    offsets = tuple(index.offset) if index.offset is not None else (0,) * len(md.size)
    hint = index.index
    chunks = md.chunks
    if hint is not None and 0 <= hint < len(chunks) and tuple(chunks[hint].offsets) == offsets:
        return list(chunks[hint].sizes)
    for c in chunks:
        if tuple(c.offsets) == offsets:
            return list(c.sizes)
    raise CorruptError(f"{index.fqn}: no saved chunk at offset {offsets}")


def _contiguous_span(sizes: Sequence[int], offsets: Sequence[int], lengths: Sequence[int]) -> Optional[Tuple[int, int]]:
    """``(first, end)`` element indexes of the region ``offsets``/``lengths`` of a row-major
    array of ``sizes`` when that region is one contiguous run, else None."""
    nd = len(sizes)
    if len(offsets) != nd or len(lengths) != nd:
        raise CorruptError(f"a read request of rank {len(offsets)} for a chunk of rank {nd}")
    for s, o, l in zip(sizes, offsets, lengths):
        if o < 0 or l < 0 or o + l > s:
            raise CorruptError(f"a read request {tuple(offsets)}+{tuple(lengths)} outside its chunk {tuple(sizes)}")
    count = 1
    for l in lengths:
        count *= l
    strides = [1] * nd
    for d in range(nd - 2, -1, -1):
        strides[d] = strides[d + 1] * sizes[d + 1]
    first = sum(o * st for o, st in zip(offsets, strides))
    if count == 0:
        return (first, first)
    # Contiguous iff, past the first dim that is not length 1, every dim is whole.
    k = 0
    while k < nd and lengths[k] == 1:
        k += 1
    if all(lengths[d] == sizes[d] for d in range(k + 1, nd)):
        return (first, first + count)
    return None


__all__ = ["StorageWriter", "StorageReader", "FORMAT", "VERSION"]
