"""The DCP storage reader (``ringtier.torch.dcp.StorageReader``): plans reads of a committed
step's items, checks the group commit, reads the parts at depth and copies into the planner's
tensors."""

from __future__ import annotations

import io
import os
import pickle
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader as _DcpReader
from torch.futures import Future

from .._ringtier import GroupManifest, group_check
from .._types import PathLike
from ..checkpoint import CheckpointStore
from ..errors import CorruptError
from ._dcp_common import MAX_METADATA_BYTES, METADATA_PART
from ._dcp_common import (
    _PART_NAME,
    _check_prefix,
    _MetadataUnpickler,
    _parse_step,
    _rank_prefix,
    _step_of,
    _tiers_list,
)

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

