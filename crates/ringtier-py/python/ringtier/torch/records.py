"""``ringtier.torch.RecordDataset``: TFRecord and WebDataset shards for ``DataLoader`` workers
and ``torchrun`` ranks (see :class:`ringtier.RecordLoader`)."""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import IterableDataset as _TorchIterable
from torch.utils.data import get_worker_info

from .._ringtier import RecordBatch, RecordLoader
from .._types import PathLike, is_s3_url, tier_path
from ..errors import NotFoundError
from ..errors import InvalidInputError
from ._packed import (
    PackedBatch,
    SlotRing,
    WarnOnce,
    dataloader_batches,
    fit_engine_to_worker,
    picklable_state,
)
from ._world import rank_world


def _field_tensor(field: Any) -> torch.Tensor:
    """A uint8 tensor over the field's memory (no copy)."""
    if len(field) == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(field, dtype=torch.uint8)


class RecordDataset(_TorchIterable):  # type: ignore[type-arg]
    """The records of a directory of TFRecord or WebDataset shards for
    ``torch.utils.data.DataLoader``.

    Yields a TFRecord as a uint8 tensor over its bytes, a WebDataset sample as a dict of
    field name to uint8 tensor (only ``fields`` when given), each sharing the record's memory;
    ``with_keys=True`` yields ``(key, item)`` (the sample key, or ``shard:offset`` for a
    TFRecord). Records have different lengths: use ``DataLoader(ds, batch_size=None)`` or a
    ``collate_fn`` that decodes them.

    The readers are ``world_size x num_workers``: rank r's worker w is reader ``r *
    num_workers + w``, streaming every such shard of the epoch's shuffled shard order
    (``order="stream"``) or taking every such record of one global permutation
    (``order="global"``, through the shards' indexes). ``rank``/``world_size`` default to
    torch.distributed's (or ``RANK``/``WORLD_SIZE``). Call :meth:`set_epoch` before each epoch;
    ``position`` resumes a reader after that many of its records. The loader is created inside
    ``__iter__``, in the process that iterates (a worker after ``fork()``). ``options`` are
    :class:`ringtier.RecordLoader`'s (``read_size``, ``depth``, ``shuffle_buffer``, ``seed``,
    ``on_bad``, ``index_dir``, ...).

    ``cache``: a :class:`ringtier.Cache` (or a dict of its arguments) in front of the shards,
    one object per shard (policy ``lru``, ``static``, ``clairvoyant`` on this reader's shard
    order, or ``none``; capacity in memory or a directory; docs/CACHE.md); its totals:
    :meth:`cache_stats`. ``materialize=`` is for the file datasets.

    ``transform``: a :class:`ringtier.transforms.Compose` (or torchvision transforms it
    compiles): the dataset yields batches of ``batch_size`` decoded, transformed images, a
    ``(n, 3, S, S)`` tensor (Rust threads, pinned memory when CUDA is available). A WebDataset
    sample's image is its ``image_field`` (default: the first of ``jpg``, ``jpeg``, ``png``,
    ``webp``) and its label the integer in ``label_field`` (``cls``): batches are ``(images,
    labels)``, labels int64 (``label_field=None``: images only). A TFRecord's bytes are the
    image (images only). ``with_keys=True`` puts the keys first: ``(keys, images[, labels])``.
    A record's random crop and flip depend on (seed, epoch, ``shard << 40 | offset``).
    Under DataLoader workers one worker per 64 cores of the rank decodes (the shards are split
    over the decoding workers), on the threads of the cores it is given, and the others stay
    idle (one ``RuntimeWarning``; ``active_workers=N`` sets the number), as
    :class:`ringtier.torch.ImageFolder` does.

    ``batched=True`` (without ``transform``): batches of ``batch_size`` records, for
    ``DataLoader(ds, batch_size=None, num_workers=N)``. In a worker a batch crosses to the main
    process packed: a TFRecord batch is one :class:`PackedBatch` (``batch[i]`` a record's
    tensor), a WebDataset batch a dict of field name to :class:`PackedBatch` (a record without
    that field gives an empty tensor) plus ``"__key__"``, the sample keys; the record loader
    takes the batch whole (:meth:`ringtier.RecordEpoch.next_batch`) and copies its bytes
    straight into one of the worker's shared-memory slots, with no Python object per record.
    Without workers the same shapes hold lists of tensors sharing the records' memory. Records
    one at a time (the default) are refused under ``DataLoader(num_workers=N,
    batch_size=None)`` (each would cross the worker boundary as a shared-memory tensor of its
    own), with a message that says what to write instead; ``num_workers=0`` is the fast
    setting (the loader has its own threads).
    """

    def __init__(
        self,
        path: PathLike,
        *,
        format: str = "tfrecord",
        order: str = "stream",
        fields: Optional[Sequence[str]] = None,
        with_keys: bool = False,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        transform: Any = None,
        batch_size: int = 64,
        image_field: Optional[str] = None,
        label_field: Optional[str] = "cls",
        pin_memory: Optional[bool] = None,
        batched: bool = False,
        active_workers: Optional[int] = None,
        **options: Any,
    ) -> None:
        super().__init__()
        from .images import check_active_workers

        self.active_workers = check_active_workers(active_workers)
        if batched and transform is not None:
            raise ValueError("batched=True is for raw records: transform= already yields batches")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
        # transform=: decoded and transformed batches (ringtier.torch.images); checked here.
        self.transform, self.batch_size, self.pin_memory = transform, batch_size, pin_memory
        self.image_field, self.label_field = image_field, label_field
        compiled = None
        if transform is not None:
            from .images import check_record_transform

            compiled = check_record_transform(transform, batch_size, int(options.get("seed", 0)))
        self.path = tier_path(path)
        if not is_s3_url(self.path) and not os.path.isdir(self.path):
            raise NotFoundError(f"shard directory {self.path} does not exist")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither (then torch.distributed's are used)")
        self.format, self.order = format, order
        self.fields = list(fields) if fields is not None else None
        self.with_keys = with_keys
        self.rank, self.world_size = rank, world_size
        self.options: Dict[str, Any] = dict(options)
        if options.get("cache") is not None:
            from .data import _checked_cache

            self.options["cache"] = _checked_cache(options["cache"])
        if "materialize" in options or "materialize_size" in options:
            raise ValueError(
                "materialize= is for file datasets (ringtier.torch.IterableDataset, ImageFolder): a record "
                "dataset's samples are records inside shards; give the shards a cache= instead"
            )
        self.epoch = 0
        self.position = 0
        self._loader: Optional[Tuple[int, Tuple[int, int, int, int], RecordLoader]] = None
        self.batched = batched
        self._workers_warning = WarnOnce()
        self._idle_warning = WarnOnce("idle workers")
        self._ring = SlotRing()
        if compiled is not None:
            from .images import premake_slots

            # The decoding workers' slots, made before a DataLoader forks (SlotRing.premake).
            premake_slots(self._ring, compiled, batch_size, self.active_workers)

    def __getstate__(self) -> Dict[str, Any]:
        """Pickled (a worker a ``spawn`` or ``forkserver`` DataLoader starts, a copy): without
        this process's loader and pipeline (:func:`picklable_state`)."""
        return picklable_state(self, "_loader")

    def set_epoch(self, epoch: int, position: int = 0) -> None:
        """The epoch the next iteration reads, from ``position`` of this reader on."""
        self.epoch, self.position = epoch, position

    def reader(self) -> Tuple[int, int, int, int]:
        """(rank, world_size, worker, workers) of this process; with ``transform``, workers are
        the decoding workers (``ringtier.torch.images.decoding_workers_of``: the others stay
        idle)."""
        rank, world = rank_world(self.rank, self.world_size)
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        if self.transform is not None and info is not None:
            from .images import decoding_workers_of

            workers = decoding_workers_of(workers, self.active_workers)
        return rank, world, worker, workers

    def loader(self) -> RecordLoader:
        """This process's record loader (created here, on first use in this process)."""
        reader = self.reader()
        pid = os.getpid()
        if self._loader is None or self._loader[0] != pid or self._loader[1] != reader:
            rank, world, worker, workers = reader
            fit_engine_to_worker(workers if get_worker_info() is not None else None)
            loader = RecordLoader(
                self.path,
                format=self.format,
                order=self.order,
                rank=rank,
                world_size=world,
                worker=worker,
                workers=workers,
                **self.options,
            )
            self._loader = (pid, reader, loader)
        return self._loader[2]

    def __len__(self) -> int:
        """Records of this rank per epoch, all its workers together (global order only)."""
        rank, world = rank_world(self.rank, self.world_size)
        # Counting needs no cache (nor its directory).
        options = {k: v for k, v in self.options.items() if k != "cache"}
        return len(RecordLoader(self.path, format=self.format, order=self.order, rank=rank, world_size=world, **options))

    def cache_stats(self) -> Optional[Dict[str, Any]]:
        """This process's cache totals (hits, misses, prefetches, per level; one object per
        shard); None without ``cache=`` or before the first iteration in this process."""
        if self._loader is None or self._loader[0] != os.getpid():
            return None
        return self._loader[2].cache_stats()

    def _item(self, record: Any) -> Any:
        if self.format == "tfrecord":
            return _field_tensor(record)
        names = self.fields if self.fields is not None else record.names()
        return {n: _field_tensor(record[n]) for n in names}

    def _batch(self, records: List[Any]) -> Any:
        """``records`` as one batch without workers: lists of tensors sharing the records'
        memory."""
        wds = self.format != "tfrecord"
        keys = [r.key or f"{r.shard_key}:{r.offset}" for r in records] if self.with_keys or wds else None

        def column(items: List[Any], with_keys: bool) -> Any:
            tensors = [_field_tensor(x) if len(x) else torch.empty(0, dtype=torch.uint8) for x in items]
            return list(zip(keys or [], tensors)) if with_keys else tensors

        if not wds:
            return column(records, self.with_keys)
        names: List[str] = list(self.fields) if self.fields is not None else []
        if self.fields is None:
            for r in records:
                names += [n for n in r.names() if n not in names]
        out: Dict[str, Any] = {n: column([r[n] if n in r else b"" for r in records], False) for n in names}
        out["__key__"] = keys
        return out

    def _packed(self, batch: RecordBatch, worker: int) -> Any:
        """A :class:`RecordBatch` packed in a worker: the loader copies each column's bytes
        straight into one of the worker's shared-memory slots (no Python object per record)."""
        wds = self.format != "tfrecord"
        keys = batch.keys() if self.with_keys or wds else None

        def column(field: Optional[str], with_keys: bool) -> PackedBatch:
            return PackedBatch.filled(
                batch.nbytes(field),
                lambda out: batch.pack_into(out, field),
                keys if with_keys else None,
                ring=self._ring,
                worker=worker,
            )

        if not wds:
            return column(None, self.with_keys)
        names = list(self.fields) if self.fields is not None else batch.names()
        out: Dict[str, Any] = {n: column(n, False) for n in names}
        out["__key__"] = keys
        return out

    def _batches(self) -> Iterator[Any]:
        info = get_worker_info()
        epoch = self.loader().epoch(self.epoch, self.position)
        if info is not None:
            # In a worker: whole batches from the loader, packed by it into shared memory.
            while True:
                batch = epoch.next_batch(self.batch_size)
                if batch is None:
                    return
                yield self._packed(batch, info.id)
        pending: List[Any] = []
        for record in epoch:
            pending.append(record)
            if len(pending) == self.batch_size:
                yield self._batch(pending)
                pending = []
        if pending:
            yield self._batch(pending)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is not None:
            if not self.batched and self.transform is None and dataloader_batches() is False:
                from .data import per_sample_refused

                raise InvalidInputError(
                    per_sample_refused("ringtier.torch.RecordDataset(path)", info.num_workers, "batched=True")
                )
            self._workers_warning.warn()
        if self.batched:
            yield from self._batches()
            return
        if self.transform is not None:
            from .images import iterate_records

            yield from iterate_records(self)
            return
        for record in self.loader().epoch(self.epoch, self.position):
            item = self._item(record)
            if self.with_keys:
                key = record.key or f"{record.shard_key}:{record.offset}"
                yield key, item
            else:
                yield item


__all__ = ["RecordDataset"]
