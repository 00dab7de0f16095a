"""``ringtier.torch.IterableDataset``: the samples of a dataset directory for
``torch.utils.data.DataLoader`` workers and ``torchrun`` ranks (see :class:`ringtier.Loader`).

Each epoch's seeded shuffled order is split over ``world_size x num_workers`` shards (rank r's
worker w reads shard ``r * num_workers + w``), so every sample is read exactly once per epoch
across ranks and workers. The loader is created inside ``__iter__``, in the process that
iterates (a DataLoader worker after ``fork()``), never inherited.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils.data import IterableDataset as _TorchIterable
from torch.utils.data import get_worker_info

from .._ringtier import Loader
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
    worker_cores,
)
from ._world import rank_world


def _to_tensor(sample: Any) -> torch.Tensor:
    """The sample as a uint8 tensor over its pooled buffer (no copy)."""
    if len(sample) == 0:
        return torch.empty(0, dtype=torch.uint8)
    t = torch.frombuffer(sample, dtype=torch.uint8)
    return t.view(sample.shape) if sample.shape is not None else t


class IterableDataset(_TorchIterable):  # type: ignore[type-arg]
    """The samples of a dataset directory for ``torch.utils.data.DataLoader``.

    Yields each sample as a uint8 tensor sharing the loader's pooled buffer (``(H, W, 3)``
    with ``decode=SIZE``), or ``(key, tensor)`` with ``with_keys=True``; with ``batch_size``
    it yields lists of them (``DataLoader(ds, batch_size=None)``), as read together.
    ``rank``/``world_size`` default to torch.distributed's (or ``RANK``/``WORLD_SIZE``).
    Call :meth:`set_epoch` before each epoch, as with ``DistributedSampler``. ``position``
    resumes the first epoch after that many of this shard's samples.

    Pinned memory for ``.cuda(non_blocking=True)``: ``DataLoader(..., pin_memory=True)``.

    ``transform``: a :class:`ringtier.transforms.Compose` (or torchvision transforms it
    compiles): the dataset yields ``(n, 3, S, S)`` image tensors per batch (``(keys, images)``
    with ``with_keys``), JPEGs decoded and transformed in Rust threads (this process's cores),
    in pinned memory when CUDA is available (``pin_memory=None``); ``decode`` must be None.
    Under DataLoader workers one worker per 64 cores of the rank decodes, on the threads of
    the cores it is given, and the others stay idle (one ``RuntimeWarning``;
    ``active_workers=N`` sets the number), as :class:`ringtier.torch.ImageFolder` does.

    ``num_workers=0`` is the fast setting: the engine reads (and decodes) on its own threads.
    In ``DataLoader`` workers (``num_workers > 0``, warned once) each batch of ``batch_size``
    crosses to the main process as one :class:`PackedBatch` (one shared-memory tensor plus
    offsets, used like the list it replaces), and a ``transform`` batch is decoded straight into
    shared memory the worker reuses; each worker's engine and decode threads fit its share of
    the cores. Samples one at a time (no ``batch_size``) under ``DataLoader(num_workers=N,
    batch_size=None)`` are refused with a message that says what to write instead: each would
    cross the worker boundary on its own, at about a tenth of the speed.

    Listing (docs/SCALE.md): without a per-file stat, cached in ``DIR/.ringtier-listing`` and
    used while its directories are unchanged (``stat_files``, ``listing_cache``: see
    :class:`ringtier.Loader`). A dangling link, a link loop or a directory that cannot be read
    is left out and named in one ``RuntimeWarning`` per dataset.

    ``cache``: a :class:`ringtier.Cache` (or a dict of its arguments) in front of the dataset:
    policy ``lru``, ``static``, ``clairvoyant`` or ``none``, a capacity in memory or in a
    directory (docs/CACHE.md). ``materialize=DIR`` (with ``decode``): the first epoch stores
    the decoded, resized pixels under ``DIR`` (``materialize_size`` pixels square; default the
    decoded size, or at least 256 for a random crop), later epochs read them back and run only
    the random steps.

    ``materialize=DIR`` with ``transform``: the store holds the chain's split point, ``uint8``
    RGB. With a ``RandomResizedCrop`` it is the whole decoded image resized to
    ``materialize_size`` square (default the larger of 256 and the output size), and the crop
    is drawn on it each epoch, so augmentations still vary by epoch (its aspect ratio is
    measured on the squashed image, the usual price of the split). With a deterministic crop
    (``Resize`` + ``CenterCrop``, ``CenterCrop``, ``Resize((s, s))``) it is the crop itself at
    the output size. Flip, ``ToDtype`` and ``Normalize`` always run each epoch. Every epoch,
    the first included, transforms the stored pixels: epoch 1 and 2 give the same images
    for the same (seed, epoch, index).
    """

    def __init__(
        self,
        path: PathLike,
        *,
        batch_size: Optional[int] = None,
        read_batch: int = 64,
        prefetch: int = 2,
        shuffle: bool = True,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        drop_last: bool = False,
        decode: Optional[int] = None,
        decode_threads: int = 2,
        verify: bool = False,
        engine: str = "auto",
        with_keys: bool = False,
        hold: Optional[int] = None,
        cache: Optional[Any] = None,
        materialize: Optional[PathLike] = None,
        materialize_size: Optional[int] = None,
        transform: Any = None,
        pin_memory: Optional[bool] = None,
        stat_files: bool = False,
        listing_cache: bool = True,
        active_workers: Optional[int] = None,
    ) -> None:
        super().__init__()
        from .images import check_active_workers

        # transform=: decoded and transformed batches (ringtier.torch.images); checked here.
        self.transform, self.pin_memory = transform, pin_memory
        self.active_workers = check_active_workers(active_workers)
        compiled = None
        if transform is not None:
            from .images import check_transform

            hold, compiled = check_transform(transform, decode, batch_size or read_batch, hold, seed)
        self.path = tier_path(path)
        if not is_s3_url(self.path) and not os.path.isdir(self.path) and not os.path.isfile(self.path):
            raise NotFoundError(f"dataset directory {self.path} does not exist")
        self.batch_size = batch_size
        self.read_batch = batch_size or read_batch
        self.options: Dict[str, Any] = dict(
            prefetch=prefetch,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            decode=decode,
            decode_threads=decode_threads,
            verify=verify,
            engine=engine,
            hold=hold,
            stat_files=stat_files,
            listing_cache=listing_cache,
        )
        if cache is not None:
            self.options["cache"] = _checked_cache(cache)
        if materialize is not None:
            if decode is None and transform is None:
                raise ValueError("materialize= needs decode= or transform=: it stores decoded pixels")
            self.options["materialize"] = os.fspath(materialize)
            self.options["materialize_size"] = materialize_size
        elif materialize_size is not None:
            raise ValueError("materialize_size= without materialize=DIR")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither (then torch.distributed's are used)")
        self.rank, self.world_size = rank, world_size
        self.with_keys = with_keys
        self.epoch = 0
        self.position = 0
        self._loader: Optional[Tuple[int, Tuple[int, int], Loader]] = None
        self._workers_warning = WarnOnce()
        self._skipped_warning = WarnOnce("skipped")  # the listing's left-out entries, once per dataset
        self._ring = SlotRing()  # the workers' reusable shared memory for packed batches
        self._idle_warning = WarnOnce("idle workers")
        if compiled is not None:
            from .images import premake_slots

            # The decoding workers' slots, made before a DataLoader forks (SlotRing.premake).
            premake_slots(self._ring, compiled, self.read_batch, self.active_workers)

    def __getstate__(self) -> Dict[str, Any]:
        """Pickled (a worker a ``spawn`` or ``forkserver`` DataLoader starts, a copy): without
        this process's loader and pipeline (:func:`picklable_state`)."""
        return picklable_state(self, "_loader")

    def set_epoch(self, epoch: int, position: int = 0) -> None:
        """The epoch the next iteration reads, from ``position`` of this shard on."""
        self.epoch, self.position = epoch, position

    def shard(self) -> Tuple[int, int]:
        """(this process's shard, number of shards): rank x workers; with ``transform``, rank x
        decoding workers (``ringtier.torch.images.decoding_workers_of``: the others stay idle)."""
        rank, world = rank_world(self.rank, self.world_size)
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        if self.transform is not None and info is not None:
            from .images import decoding_workers_of

            workers = decoding_workers_of(workers, self.active_workers)
        return rank * workers + worker, world * workers

    def loader(self) -> Loader:
        """This process's loader for its shard (created here, on first use in this process)."""
        shard = self.shard()
        pid = os.getpid()
        if self._loader is None or self._loader[0] != pid or self._loader[1] != shard:
            options = dict(self.options)
            if self.transform is not None and "materialize" in options:
                # The split point of the transform chain (ringtier.torch.images).
                from .images import process_pipeline

                options["materialize_for"] = process_pipeline(self)
            # In a DataLoader worker the read buffers are mapped untouched and unregistered:
            # every worker has a pool of its own, and faulting each one in before the first
            # batch made 4 workers' first epoch 0.36x the speed of 0 workers (src/lazy_pool.rs).
            # Its engine and decode threads fit its share of the cores.
            # In a worker, or one of several ranks on the machine, its engine and decode threads
            # fit its share of the cores.
            info = get_worker_info()
            in_worker = info is not None
            options["lazy_pool"] = in_worker
            if self.transform is not None and info is not None:
                from .images import decoding_workers_of

                fit_engine_to_worker(decoding_workers_of(info.num_workers, self.active_workers))
            else:
                fit_engine_to_worker()
            if in_worker:
                options["decode_threads"] = min(int(options["decode_threads"]), worker_cores())
            loader = Loader(
                self.path, batch_size=self.read_batch, rank=shard[0], world_size=shard[1], warn_skipped=False, **options
            )
            if loader.skipped_summary is not None:
                self._skipped_warning.warn(f"ringtier: {loader.skipped_summary}")
            self._loader = (pid, shard, loader)
        return self._loader[2]

    def __len__(self) -> int:
        """Samples of this rank per epoch (all its workers together)."""
        rank, world = rank_world(self.rank, self.world_size)
        # Counting needs neither the cache nor the materialized copy (nor their directories).
        options = {k: v for k, v in self.options.items() if k not in ("cache", "materialize", "materialize_size")}
        loader = Loader(self.path, batch_size=self.read_batch, rank=rank, world_size=world, warn_skipped=False, **options)
        if loader.skipped_summary is not None:
            self._skipped_warning.warn(f"ringtier: {loader.skipped_summary}")
        return len(loader)

    def cache_stats(self) -> Optional[Dict[str, Any]]:
        """This process's cache totals (hits, misses, prefetches, per level); None without
        ``cache=`` or before the first iteration in this process."""
        if self._loader is None or self._loader[0] != os.getpid():
            return None
        return self._loader[2].cache_stats()

    def __iter__(self) -> Iterator[Any]:
        if self.transform is not None:
            from .images import iterate_files

            yield from iterate_files(self)
            return
        info = get_worker_info()
        if info is not None:
            if self.batch_size is None and dataloader_batches() is False:
                raise InvalidInputError(per_sample_refused("ringtier.torch.IterableDataset(path)", info.num_workers))
            self._workers_warning.warn()
        packed = info is not None and self.batch_size is not None
        loader = self.loader()
        keys = loader.keys() if self.with_keys else None
        decoded = self.options.get("decode") is not None
        frombuffer, uint8 = torch.frombuffer, torch.uint8
        for batch in loader.epoch(self.epoch, self.position):
            samples = list(batch)
            if packed and not decoded:
                # Raw bytes in a worker: each sample copied once into the batch's shared memory.
                batch_keys = [keys[s.index] for s in samples] if keys is not None else None
                yield PackedBatch.pack_buffers(samples, batch_keys, ring=self._ring, worker=info.id if info else 0)
                continue
            if decoded:
                tensors = [_to_tensor(s) for s in samples]
            else:
                # Raw bytes: one tensor per sample without a length or shape call each (the
                # per-sample Python work is most of this layer's cost).
                try:
                    tensors = [frombuffer(s, dtype=uint8) for s in samples]
                except ValueError:  # an empty sample (torch.frombuffer refuses zero bytes)
                    tensors = [_to_tensor(s) for s in samples]
            if packed:
                # One shared-memory tensor per batch across the worker boundary.
                batch_keys = [keys[s.index] for s in samples] if keys is not None else None
                yield PackedBatch.pack(tensors, batch_keys, ring=self._ring, worker=info.id if info else 0)
                continue
            items: List[Any] = (
                [(keys[s.index], t) for s, t in zip(samples, tensors)] if keys is not None else tensors
            )
            if self.batch_size is None:
                yield from items
            else:
                yield items


def per_sample_refused(what: str, workers: int, batched: str = "batch_size=256") -> str:
    """Why a dataset that yields one sample at a time refuses a DataLoader that would send each
    across the worker boundary on its own, and what to write instead."""
    return (
        f"{what} yields one sample at a time, and DataLoader(num_workers={workers}, batch_size=None) would send "
        f"each across the worker boundary on its own (one shared-memory segment per sample: about a tenth of the "
        f"speed of num_workers=0). Give the dataset {batched} and keep DataLoader(ds, batch_size=None, "
        f"num_workers={workers}): each item is then one batch that crosses as one buffer (iterate it for its "
        f"samples). Or batch in the workers, DataLoader(ds, batch_size=N, collate_fn=...), or use num_workers=0 "
        f"(ringtier reads and decodes on its own threads: the fast setting; docs/SCALE.md)."
    )


def _checked_cache(cache: Any) -> Any:
    """A ``ringtier.Cache`` from ``cache=`` (a Cache, or a dict of its arguments), checked now."""
    from .._ringtier import Cache

    if isinstance(cache, Cache):
        return cache
    if isinstance(cache, dict):
        return Cache(**cache)
    raise TypeError(f"cache must be a ringtier.Cache or a dict of its arguments, not {type(cache).__name__}")


__all__ = ["IterableDataset", "PackedBatch"]
