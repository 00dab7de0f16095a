"""PyTorch integration: an ``IterableDataset`` for ``DataLoader`` workers and ``torchrun``
ranks, and a checkpoint store whose steps commit only once every rank's shard is durable.

``IterableDataset`` splits each epoch's seeded shuffled order over ``world_size x num_workers``
shards (rank r's worker w reads shard ``r * num_workers + w``), so every sample is read exactly
once per epoch across ranks and workers. Its loader is created inside ``__iter__``, in the
process that iterates (a DataLoader worker after ``fork()``), never inherited.

``RecordDataset`` does the same for TFRecord and WebDataset shards (``ringtier.RecordLoader``),
streamed or in a global order through per-shard indexes.

``DistributedCheckpointStore`` gives each rank its own store (prefix ``PREFIX/rankNNNNN``) on
the same tiers; a step commits when rank 0 writes the global manifest (``PREFIX/global``,
``world.json``) after every rank reported its shard durable: the "metadata last" rule of
``torch.distributed.checkpoint``.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Iterator, List, Mapping, MutableMapping, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset as _TorchIterable
from torch.utils.data import get_worker_info

from ._ringtier import Loader, SaveFuture
from .checkpoint import CheckpointStore, PathLike, _step


def _rank_world(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither (then torch.distributed's are used)")
    if rank is not None and world_size is not None:
        return rank, world_size
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


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
        engine: str = "uring",
        with_keys: bool = False,
        hold: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.path = os.fspath(path)
        if not os.path.isdir(self.path) and not os.path.isfile(self.path):
            from .errors import NotFoundError

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
        )
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither (then torch.distributed's are used)")
        self.rank, self.world_size = rank, world_size
        self.with_keys = with_keys
        self.epoch = 0
        self.position = 0
        self._loader: Optional[Tuple[int, Tuple[int, int], Loader]] = None

    def set_epoch(self, epoch: int, position: int = 0) -> None:
        """The epoch the next iteration reads, from ``position`` of this shard on."""
        self.epoch, self.position = epoch, position

    def shard(self) -> Tuple[int, int]:
        """(this process's shard, number of shards): rank x workers."""
        rank, world = _rank_world(self.rank, self.world_size)
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        return rank * workers + worker, world * workers

    def loader(self) -> Loader:
        """This process's loader for its shard (created here, on first use in this process)."""
        shard = self.shard()
        pid = os.getpid()
        if self._loader is None or self._loader[0] != pid or self._loader[1] != shard:
            loader = Loader(self.path, batch_size=self.read_batch, rank=shard[0], world_size=shard[1], **self.options)
            self._loader = (pid, shard, loader)
        return self._loader[2]

    def __len__(self) -> int:
        """Samples of this rank per epoch (all its workers together)."""
        rank, world = _rank_world(self.rank, self.world_size)
        return len(Loader(self.path, batch_size=self.read_batch, rank=rank, world_size=world, **self.options))

    def __iter__(self) -> Iterator[Any]:
        loader = self.loader()
        keys = loader.keys() if self.with_keys else None
        decoded = self.options.get("decode") is not None
        frombuffer, uint8 = torch.frombuffer, torch.uint8
        for batch in loader.epoch(self.epoch, self.position):
            samples = list(batch)
            if decoded:
                tensors = [_to_tensor(s) for s in samples]
            else:
                # Raw bytes: one tensor per sample without a length or shape call each (the
                # per-sample Python work is most of this layer's cost).
                try:
                    tensors = [frombuffer(s, dtype=uint8) for s in samples]
                except ValueError:  # an empty sample (torch.frombuffer refuses zero bytes)
                    tensors = [_to_tensor(s) for s in samples]
            items: List[Any] = (
                [(keys[s.index], t) for s, t in zip(samples, tensors)] if keys is not None else tensors
            )
            if self.batch_size is None:
                yield from items
            else:
                yield items


class DistributedCheckpointStore:
    """A checkpoint store for ``torchrun`` jobs: each rank saves its own shard (its
    ``state_dict``) to its own store on the same tiers; a step is committed, listed and
    loadable only once every rank's shard is durable and rank 0 has written the step's global
    manifest (world size, every rank's bytes) after them.

    A rank that dies mid-save leaves the step uncommitted (its partial shard is removed when its
    store is next opened) and the previous step loadable. Loading with another world size is an
    error (no resharding). Every rank must call :meth:`save`, :meth:`load`, :meth:`latest`,
    :meth:`close` and an :meth:`async_save`'s ``result()`` together (they use collectives of
    ``group``).

    Multi-node: the global manifest and every rank's shard must be visible to the rank that
    loads it, so keep the tiers on shared storage (one fast tier per node works for saving:
    ranks of a node share it; restore then needs the shards drained to the shared slow tier).
    """

    def __init__(
        self,
        tiers: Sequence[PathLike],
        *,
        prefix: str = "ckpt",
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        group: Any = None,
        **options: Any,
    ) -> None:
        self.rank, self.world_size = _rank_world(rank, world_size)
        self.group = group
        self.prefix = prefix
        self.tiers = [os.fspath(t) for t in tiers]
        self.shards = CheckpointStore(self.tiers, prefix=f"{prefix}/rank{self.rank:05d}", **options)
        self.global_store: Optional[CheckpointStore] = None
        if self.rank == 0:
            self.global_store = CheckpointStore(self.tiers, prefix=f"{prefix}/global", **options)
        self._barrier()

    def _collective(self) -> bool:
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    def _barrier(self) -> None:
        if self._collective():
            dist.barrier(group=self.group)

    def _gather(self, obj: Any) -> List[Any]:
        if not self._collective():
            return [obj]
        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def _broadcast(self, obj: Any) -> Any:
        if not self._collective():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def _global(self) -> CheckpointStore:
        if self.global_store is not None:
            return self.global_store
        return CheckpointStore(self.tiers, prefix=f"{self.prefix}/global", read_only=True)

    def save(self, step: int, state: Mapping[str, Any]) -> Dict[str, Any]:
        """Saves this rank's ``state`` as its shard of ``step``; returns once every rank's
        shard is durable and the step is committed (the global manifest written)."""
        step = _step(step)
        t0 = time.perf_counter()
        try:
            report: Dict[str, Any] = {"ok": True, **self.shards.save(step, state)}
        except Exception as e:  # reported to every rank, then raised here
            return self._commit(step, t0, None, e)
        return self._commit(step, t0, report, None)

    def async_save(self, step: int, state: Mapping[str, Any]) -> "DistributedSaveFuture":
        """Copies this rank's ``state`` into a staging buffer and returns at once (the caller
        may change its tensors then), saving the shard in the background: the shape of
        ``torch.distributed.checkpoint.async_save``. ``future.result()`` is collective: every
        rank calls it; it waits for this rank's shard, then commits the step as :meth:`save`
        does (every rank's report gathered, rank 0 writes the global manifest, a barrier)."""
        step = _step(step)
        t0 = time.perf_counter()
        try:
            local: Optional[SaveFuture] = self.shards.async_save(step, state)
        except Exception as e:  # the staging copy failed: reported at result(), on every rank
            return DistributedSaveFuture(self, step, t0, None, e)
        return DistributedSaveFuture(self, step, t0, local, None)

    def _commit(
        self, step: int, t0: float, report: Optional[Dict[str, Any]], failure: Optional[BaseException]
    ) -> Dict[str, Any]:
        """The collective end of a save: gathers every rank's outcome; rank 0 writes the global
        manifest when every shard is durable; a barrier; raises this rank's error or names the
        ranks that failed."""
        if report is None:
            report = {"ok": False, "error": f"{type(failure).__name__}: {failure}", "step": step, "bytes": 0}
        reports = self._gather(report)
        bad = [(r, rep["error"]) for r, rep in enumerate(reports) if not rep["ok"]]
        if not bad and self.global_store is not None:
            world = {
                "step": step,
                "world_size": self.world_size,
                "ranks": [{"rank": r, "bytes": rep["bytes"]} for r, rep in enumerate(reports)],
            }
            self.global_store.save(step, {"world": world})
        self._barrier()
        if failure is not None:
            raise failure
        if bad:
            raise RuntimeError(f"checkpoint {step} not committed: rank(s) failed: {bad}")
        report["commit_seconds"] = time.perf_counter() - t0
        return report

    def list(self) -> List[Dict[str, Any]]:
        """Committed steps (global manifest written), from rank 0's view."""
        steps = self._global().list() if self.rank == 0 else None
        return self._broadcast(steps)

    def latest(self) -> Optional[int]:
        """The newest committed step (every rank gets rank 0's answer)."""
        latest = self._global().latest() if self.rank == 0 else None
        return self._broadcast(latest)

    def load(self, step: Optional[int] = None, into: Optional[MutableMapping[str, Any]] = None) -> Any:
        """This rank's shard of committed ``step`` (the newest when None; None when there is
        none). Raises ``ValueError`` when the step was saved by another number of ranks."""
        if step is None:
            step = self.latest()
            if step is None:
                return None
        step = _step(step)
        # Rank 0 reads the global manifest and tells every rank (the others may not see rank
        # 0's fast tier).
        saved: Union[int, str, None] = None
        if self.rank == 0:
            try:
                world = self._global().load(step)
                saved = int(world["world"]["world_size"]) if world is not None else None
            except FileNotFoundError:
                saved = None
            if saved is None:
                saved = f"checkpoint {step} is not committed (no global manifest: not every rank's shard was durable)"
        saved = self._broadcast(saved)
        if isinstance(saved, str):
            raise ValueError(saved)
        if saved != self.world_size:
            raise ValueError(
                f"checkpoint {step} was saved by {saved} ranks; this job has {self.world_size}: "
                "loading it needs the same world size (resharding is not supported)"
            )
        return self.shards.load(step, into=into)

    def delete(self, step: int) -> None:
        """Deletes committed ``step`` (collective: every rank calls it): rank 0 removes the
        global manifest first, so the step stops being committed before any shard goes; then
        every rank removes its shard. A rank whose shard is already gone is not an error."""
        step = _step(step)
        failure: Optional[str] = None
        if self.global_store is not None:
            try:
                self.global_store.delete(step)
            except FileNotFoundError:
                pass
            except Exception as e:  # reported to every rank
                failure = f"{type(e).__name__}: {e}"
        failure = self._broadcast(failure)
        if failure is not None:
            raise RuntimeError(f"checkpoint {step} not deleted: rank 0: {failure}")
        try:
            self.shards.delete(step)
        except FileNotFoundError:
            pass
        self._barrier()

    def drain(self) -> None:
        """Waits for this rank's (and on rank 0 the global) drain."""
        self.shards.drain()
        if self.global_store is not None:
            self.global_store.drain()

    def close(self, drain: bool = False) -> None:
        """Closes this rank's stores."""
        self.shards.close(drain)
        if self.global_store is not None:
            self.global_store.close(drain)

    def __enter__(self) -> "DistributedCheckpointStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DistributedSaveFuture:
    """A :meth:`DistributedCheckpointStore.async_save` in progress. :meth:`done` says whether
    this rank's shard is durable; the step is committed only by :meth:`result`, which every
    rank must call (it is collective)."""

    def __init__(
        self,
        store: DistributedCheckpointStore,
        step: int,
        t0: float,
        local: Optional[SaveFuture],
        failure: Optional[BaseException],
    ) -> None:
        self.step = step
        self._store = store
        self._t0 = t0
        self._local = local
        self._failure = failure
        self._outcome: Optional[Tuple[Optional[Dict[str, Any]], Optional[BaseException]]] = None

    def done(self) -> bool:
        """True once this rank's shard is durable (or its save failed)."""
        return self._outcome is not None or self._local is None or self._local.done()

    def result(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Waits for this rank's shard (``TimeoutError`` after ``timeout`` seconds, before any
        collective: call it again), then commits the step on every rank: returns this rank's
        report, or raises its error, or ``RuntimeError`` naming the ranks that failed."""
        if self._outcome is None:
            report: Optional[Dict[str, Any]] = None
            failure = self._failure
            if self._local is not None and failure is None:
                try:
                    report = {"ok": True, **self._local.result(timeout)}
                except TimeoutError:
                    raise
                except Exception as e:  # reported to every rank, then raised here
                    failure = e
            try:
                self._outcome = (self._store._commit(self.step, self._t0, report, failure), None)
            except Exception as e:
                self._outcome = (None, e)
        done, err = self._outcome
        if err is not None:
            raise err
        assert done is not None
        return done


from ._torch_records import RecordDataset  # noqa: E402  (TFRecord / WebDataset shards)

__all__ = ["IterableDataset", "DistributedCheckpointStore", "DistributedSaveFuture", "RecordDataset"]
