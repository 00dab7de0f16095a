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
  ``storage_data``) and ``world.json`` (the saving ranks and their bytes);
* ``PREFIX/safetensors`` (with the writer's ``safetensors=`` option): step ``S`` as a
  safetensors model, the ranks' pieces gathered into full tensors (:func:`export_safetensors`).

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
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter as _DcpWriter
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .._ringtier import group_commit, group_shard
from .._types import PathLike
from ..checkpoint import CheckpointStore
from ..errors import CorruptError, RingtierError  # noqa: F401 (CorruptError: what readers raise)
from ..safetensors import _parse_size
from ._dcp_common import (  # noqa: F401 (the on-disk names, part of this module's API)
    FORMAT,
    MAX_METADATA_BYTES,
    METADATA_PART,
    RANK_PART,
    VERSION,
    WORLD_PART,
)
from ._dcp_common import (
    _ALIGN,
    _SHARD_REPORT,
    _ZEROS,
    _check_prefix,
    _MetadataUnpickler,
    _parse_step,
    _rank_prefix,
    _step_of,
    _tiers_list,
)
from ._dcp_export import DEFAULT_WAIT_SECONDS, Exporter, _select, export_safetensors, gather  # noqa: F401


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
        safetensors: also keep each committed step as a Hugging Face model (a Hub-ready
            checkpoint of a DCP job): ``True`` for every tensor of the
            state under DCP's names, a top-level key such as ``"model"`` for that subtree named
            as the model's ``state_dict`` names it, or a list of top-level keys. After
            ``finish`` commits a step, the coordinator gathers the ranks' pieces into full
            tensors in a background thread and saves them as a safetensors step under
            ``PREFIX/safetensors`` (``<tier>/PREFIX/safetensors/<step>/parts/model.safetensors``),
            drained like the rest (:func:`export_safetensors`; memory: the exported tensors,
            whole, on the coordinator). :meth:`drain` and :meth:`close` wait for the exports and
            raise the first one's error; :attr:`last_export` is the last report.
        safetensors_max_shard_size: the exported model's ``max_shard_size`` (None: one file).
        safetensors_wait_seconds: how long the coordinator's export waits for the items of ranks
            on other nodes to reach a tier it sees (their drain to the shared tier).
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
        safetensors: Union[bool, str, Sequence[str]] = False,
        safetensors_max_shard_size: Union[None, int, str] = None,
        safetensors_wait_seconds: float = DEFAULT_WAIT_SECONDS,
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
        if safetensors is not False and safetensors is not True:
            _select(safetensors)  # a bad value is refused here, not after the first save
        if safetensors_max_shard_size is not None:
            _parse_size(safetensors_max_shard_size)
        self.safetensors = safetensors
        self.safetensors_max_shard_size = safetensors_max_shard_size
        self.safetensors_wait_seconds = float(safetensors_wait_seconds)
        self._exporter: Optional[Exporter] = None
        #: The last finished safetensors export's report (``safetensors=``; see
        #: :func:`export_safetensors`), or None.
        self.last_export: Optional[Dict[str, Any]] = None
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
        state["_exporter"] = None
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
        if self.safetensors is not False:
            with self._lock:
                if self._exporter is None:
                    self._exporter = Exporter(
                        self.tiers, self.prefix, self.safetensors, self.safetensors_max_shard_size,
                        self.safetensors_wait_seconds, self.store_options,
                    )
                self._exporter.submit(step)

    def wait_exports(self) -> List[Dict[str, Any]]:
        """Waits for the safetensors exports queued so far (``safetensors=``) and returns their
        reports; raises the first one's error."""
        if self._exporter is None:
            return []
        done = self._exporter.wait()
        if done:
            self.last_export = done[-1]
        return done

    def storage_meta(self) -> Optional[StorageMeta]:
        """None: the step is known only once the coordinator planned the save."""
        return None

    def drain(self) -> None:
        """Waits until this rank's (and on the coordinator the metadata's) checkpoints have
        reached the slowest tier (with ``safetensors=``, the exports first, then their store's
        drain too)."""
        self.wait_exports()
        for s in (self._shards, self._meta):
            if s is not None:
                s.drain()
        if self._exporter is not None:
            self._exporter.drain()

    def drain_stats(self) -> Dict[str, Any]:
        """This rank's store's drain totals (see :meth:`ringtier.CheckpointStore.drain_stats`)."""
        return self._require(self._shards, "drain_stats after a save").drain_stats()

    def close(self, drain: bool = False) -> None:
        """Closes the stores (``drain=True`` first waits for their drains). Safe to call twice;
        a later save opens them again. With ``safetensors=``, the queued exports are waited
        for first, and the first one's error is raised once everything is closed."""
        with self._lock:
            exporter, self._exporter = self._exporter, None
        try:
            if exporter is not None:
                try:
                    exporter.close(drain)
                finally:
                    self.last_export = exporter.last or self.last_export
        finally:
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


# The reader lives in its own module; this one is where users import both from.
from ._dcp_read import StorageReader, _contiguous_span  # noqa: E402,F401

__all__ = ["StorageWriter", "StorageReader", "export_safetensors", "gather", "FORMAT", "VERSION"]
