"""``ringtier.torch.DistributedCheckpointStore``: a checkpoint store for ``torchrun`` jobs
whose steps commit only once every rank's shard is durable.

Each rank gets its own store (prefix ``PREFIX/rankNNNNN``) on the same tiers; a step commits
when rank 0 writes the global manifest (``PREFIX/global``, ``world.json``) after every rank
reported its shard durable: the "metadata last" rule of ``torch.distributed.checkpoint``.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Sequence, Tuple, Union

import torch.distributed as dist

from .._ringtier import GroupManifest, SaveFuture, group_check, group_commit, group_shard
from .._types import PathLike, tier_path
from ..checkpoint import _step
from ._world import rank_world
from .checkpoint import CheckpointStore


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
        self.rank, self.world_size = rank_world(rank, world_size)
        self.group = group
        self.prefix = prefix
        self.tiers = [tier_path(t) for t in tiers]
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
            report["shard"] = group_shard(self.shards._store, self.rank, step, report["bytes"])
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
        """The collective end of a save: gathers every rank's outcome (its shard proven
        committed in its own store, or its error); rank 0 runs the group commit
        (``ringtier._ringtier.group_commit``: refused unless every rank's shard is committed,
        the group manifest written last) and tells every rank how it went; raises this rank's
        error or the commit's."""
        if report is None:
            report = {"ok": False, "error": f"{type(failure).__name__}: {failure}", "step": step, "bytes": 0}
        shard = report.pop("shard", None)
        reports = self._gather(shard if report["ok"] else report["error"])
        refused: Optional[str] = None
        if self.global_store is not None:
            try:
                group_commit(self.global_store._store, step, reports)
            except Exception as e:  # reported to every rank
                refused = str(e)
        refused = self._broadcast(refused)
        if failure is not None:
            raise failure
        if refused is not None:
            raise RuntimeError(refused)
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
        # Rank 0 checks the group manifest (committed, this world size) and sends it to every
        # rank (the others may not see rank 0's fast tier); each rank checks its own shard
        # against it (committed where it looks, the one the manifest names).
        sent: Union[bytes, str, int, None] = None
        if self.rank == 0:
            try:
                sent = group_check(self._global()._store, step, self.world_size).to_bytes()
            except Exception as e:  # reported to every rank
                sent = _legacy_world_size(self._global(), step)
                if sent is None:
                    sent = str(e)
        sent = self._broadcast(sent)
        if isinstance(sent, str):
            raise ValueError(sent)
        if isinstance(sent, int):
            # A step committed before the group manifest (a `{"world": ...}` state in the
            # global store): its world size is checked, and each rank loads its shard as then.
            if sent != self.world_size:
                raise ValueError(
                    f"checkpoint {step} was saved by {sent} ranks; this job has {self.world_size}: "
                    "loading it needs the same world size (resharding is not supported)"
                )
            return self.shards.load(step, into=into)
        assert isinstance(sent, bytes)
        GroupManifest.from_bytes(step, sent).verify_shard(self.rank, self.shards._store)
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
                    shards = self._store.shards
                    report["shard"] = group_shard(shards._store, self._store.rank, self.step, report["bytes"])
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


__all__ = ["DistributedCheckpointStore", "DistributedSaveFuture"]


def _legacy_world_size(global_store: CheckpointStore, step: int) -> Optional[int]:
    """The world size of ``step`` where its global manifest is the format before the group
    commit (the state ``{"world": {"world_size": N, ...}}``), else None."""
    try:
        old = global_store.load(step)
        return int(old["world"]["world_size"])
    except Exception:
        return None
