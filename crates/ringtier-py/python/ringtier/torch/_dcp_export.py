"""A DCP step as a Hugging Face model: every saving rank's pieces of a committed step gathered
into full tensors and saved as a ``CheckpointStore(format="safetensors")`` step
(``ringtier.torch.dcp.export_safetensors``, and the writer's ``safetensors=`` option, which
runs it on the coordinator in the background after each commit)."""

from __future__ import annotations

import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from .._types import PathLike
from ..checkpoint import CheckpointStore
from ._dcp_common import _check_prefix, _tiers_list
from ._dcp_read import StorageReader

#: How long an export waits by default for every saving rank's items of its step to be on a
#: tier this process sees (other nodes' ranks drain to the shared tier in their own time).
DEFAULT_WAIT_SECONDS = 600.0


def export_prefix(prefix: str) -> str:
    """The store prefix the exports of DCP prefix ``prefix`` are saved under."""
    return f"{prefix}/safetensors"


def _read_options(store_options: Dict[str, Any]) -> Dict[str, Any]:
    """The store options that concern reading the DCP step (the rest are the export store's)."""
    return {k: v for k, v in store_options.items() if k in ("engine", "chunk_bytes")}


def _select(keys: Union[None, str, Sequence[str]]) -> Optional[List[str]]:
    if keys is None:
        return None
    chosen = [keys] if isinstance(keys, str) else list(keys) if isinstance(keys, (list, tuple)) else []
    if not chosen or not all(isinstance(k, str) and k and "." not in k for k in chosen):
        raise ValueError(
            f"keys={keys!r}: give a top-level key of the saved state (such as 'model'), or a list of them, "
            "or None for every tensor"
        )
    return chosen


def _wait_loadable(tiers: List[str], prefix: str, step: int, wait_seconds: float, options: Dict[str, Any]) -> None:
    """Returns once DCP step ``step`` is loadable here (committed, every saving rank's items on a
    tier this process sees), polling for up to ``wait_seconds``; else the reader's
    ``FileNotFoundError``."""
    deadline = time.monotonic() + max(0.0, wait_seconds)
    delay = 0.05
    while True:
        probe = StorageReader(tiers, prefix=prefix, **options)
        probe.reset(step)
        try:
            probe.read_metadata()
            return
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise
        finally:
            probe.close()
        time.sleep(delay)
        delay = min(1.0, delay * 2)


def _element(tree: Any, path: Sequence[Any]) -> Any:
    """``(True, value)`` at ``path`` (dict keys and list indices) in ``tree``, else
    ``(False, None)``."""
    node = tree
    for key in path:
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, (list, tuple)) and isinstance(key, int) and 0 <= key < len(node):
            node = node[key]
        else:
            return False, None
    return True, node


def gather(
    tiers: Sequence[PathLike],
    step: Optional[int] = None,
    *,
    prefix: str = "dcp",
    keys: Union[None, str, Sequence[str]] = None,
    wait_seconds: float = 0.0,
    safe_globals: Sequence[Any] = (),
    **store_options: Any,
) -> Dict[str, Any]:
    """Loads DCP step ``step`` (None: the newest loadable) of the stores a
    :class:`~ringtier.torch.dcp.StorageWriter` saved to, in this process alone, as full tensors:
    ``{"step", "tensors": {name: tensor}, "skipped": [names of non-tensor items]}``. Names are
    DCP's flattened names (``model.layers.0.weight``); with ``keys`` only the tensors under
    those top-level keys of the saved state, and with one key the names relative to it (what a
    model's ``state_dict`` calls them)."""
    try:  # DCP's own converter (dcp_to_torch_save) uses these two; imported here so that a
        # torch without them fails this call only, naming what is missing.
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    except ImportError as e:  # pragma: no cover - torch before 2.2
        raise ImportError(f"exporting a DCP step needs torch >= 2.2 (DCP's empty-state-dict loader): {e}") from e
    chosen = _select(keys)
    tiers_l = _tiers_list(tiers)
    prefix = _check_prefix(prefix)
    reader = StorageReader(tiers_l, prefix=prefix, safe_globals=safe_globals, **store_options)
    try:
        if step is None:
            found = reader.latest()
            if found is None:
                raise FileNotFoundError(f"no loadable DCP checkpoint under {prefix!r} on {tiers_l}")
            step = found
        else:
            _wait_loadable(tiers_l, prefix, int(step), wait_seconds, {"safe_globals": safe_globals, **store_options})
        reader.reset(step)
        nested: Dict[str, Any] = {}
        # The planner makes every (selected) item of the metadata at its full size, in the
        # saved state's nesting; non-tensor items come back as the objects saved. (Through
        # DCP's own loader underneath ``dcp.load``, as ``dcp_to_torch_save`` does: ``dcp.load``
        # fills a copy of an empty state dict, not the dict given.)
        planner = _EmptyStateDictLoadPlanner(keys=chosen)
        _load_state_dict(nested, storage_reader=reader, planner=planner, no_dist=True)
        metadata = reader._metadata
    finally:
        reader.close()
    flat: Dict[str, Any] = {}
    paths = (metadata.planner_data or {}) if metadata is not None else {}
    for name in (metadata.state_dict_metadata if metadata is not None else {}):
        found, value = _element(nested, paths.get(name, (name,)))
        if found:
            flat[name] = value
    tensors: Dict[str, torch.Tensor] = {}
    skipped: List[str] = []
    strip = f"{chosen[0]}." if chosen is not None and len(chosen) == 1 else ""
    for name, value in flat.items():
        if chosen is not None and not any(name == k or name.startswith(k + ".") for k in chosen):
            continue
        kind = metadata.state_dict_metadata.get(name) if metadata is not None else None
        if not isinstance(value, torch.Tensor) or not isinstance(kind, TensorStorageMetadata):
            skipped.append(name)
            continue
        out = name[len(strip):] if strip and name.startswith(strip) else name
        if not out:
            raise ValueError(f"keys={keys!r}: {name!r} is a tensor at the top level, not a state under it")
        tensors[out] = value
    return {"step": int(step), "tensors": tensors, "skipped": skipped}


def export_safetensors(
    tiers: Sequence[PathLike],
    step: Optional[int] = None,
    *,
    prefix: str = "dcp",
    keys: Union[None, str, Sequence[str]] = None,
    max_shard_size: Union[None, int, str] = None,
    wait_seconds: float = 0.0,
    out_prefix: Optional[str] = None,
    store: Optional[CheckpointStore] = None,
    safe_globals: Sequence[Any] = (),
    **store_options: Any,
) -> Dict[str, Any]:
    """Saves DCP step ``step`` (None: the newest loadable) as a Hugging Face model: the saving
    ranks' pieces (FSDP shards, chunks) gathered into full tensors in this process
    (:func:`gather`), then saved as step ``step`` of a ``CheckpointStore(format="safetensors")``
    under ``PREFIX/safetensors`` on the same tiers: ``<tier>/PREFIX/safetensors/<step, 20
    digits>/parts/`` holds ``model.safetensors`` (or ``max_shard_size`` shards and
    ``model.safetensors.index.json``), durable on the fast tier on return and drained to the
    slower tiers (S3 included) in the background like any step.

    Arguments:
        tiers, prefix, safe_globals: as for the :class:`~ringtier.torch.dcp.StorageReader`.
        keys: None for every tensor of the state under DCP's names (``model.0.weight``,
            ``optim.state.0.exp_avg``); a top-level key such as ``"model"`` for that subtree
            alone, named as the model's ``state_dict`` names it (``0.weight``: what
            ``transformers`` and ``load_state_dict`` take); or a list of top-level keys (names
            kept whole). Items that are not tensors are not exported (named in ``"skipped"``);
            the DCP step keeps everything.
        max_shard_size: as for :class:`ringtier.CheckpointStore` (None: one file).
        wait_seconds: how long to wait for every saving rank's items of ``step`` to be on a
            tier this process sees (ranks of other nodes drain to the shared tier on their own).
        out_prefix: the store prefix to save under (default ``PREFIX/safetensors``, where the
            writer's ``safetensors=`` option saves).
        store: an open safetensors-format store to save into (the writer's); else one is opened
            with ``store_options`` and closed on return (without waiting for its drain).

    Returns ``{"step", "tensors", "bytes", "skipped", "seconds", "report"}`` (``report``: the
    store's save report). Memory: the exported tensors, whole, in this process. A step already
    exported is refused by the store (``ringtier.RingtierError``, kind ``already_exists``)."""
    t0 = time.perf_counter()
    got = gather(tiers, step, prefix=prefix, keys=keys, wait_seconds=wait_seconds, safe_globals=safe_globals,
                 **_read_options(store_options))
    tensors = got["tensors"]
    if not tensors:
        raise ValueError(f"DCP checkpoint {got['step']} under {prefix!r}: no tensor to export (keys={keys!r})")
    own = store is None
    if store is None:
        store = CheckpointStore(
            _tiers_list(tiers), prefix=_check_prefix(out_prefix or export_prefix(prefix)), format="safetensors",
            max_shard_size=max_shard_size, **{"create": True, **store_options},
        )
    try:
        report = store.save(got["step"], tensors)
    finally:
        if own:
            store.close()
    return {
        "step": got["step"], "tensors": len(tensors),
        "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
        "skipped": got["skipped"], "seconds": time.perf_counter() - t0, "report": report,
    }


class Exporter:
    """The writer's background export: one thread, steps exported in commit order into one
    open safetensors store; errors kept for :meth:`wait`."""

    def __init__(self, tiers: List[str], prefix: str, keys: Any, max_shard_size: Any, wait_seconds: float,
                 store_options: Dict[str, Any]) -> None:
        import concurrent.futures

        self.tiers, self.prefix, self.keys = tiers, prefix, _select(keys) if keys is not True else None
        self.max_shard_size, self.wait_seconds = max_shard_size, wait_seconds
        self.store_options = dict(store_options)  # the writer's (never read_only)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ringtier-dcp-export")
        self._pending: List[Any] = []
        self._store: Optional[CheckpointStore] = None
        #: The last finished export's report (see :func:`export_safetensors`), or None.
        self.last: Optional[Dict[str, Any]] = None

    def submit(self, step: int) -> None:
        """Queues the export of committed step ``step``."""
        self._pending.append((step, self._pool.submit(self._run, step)))

    def _run(self, step: int) -> Dict[str, Any]:
        if self._store is None:
            self._store = CheckpointStore(
                self.tiers, prefix=export_prefix(self.prefix), format="safetensors",
                max_shard_size=self.max_shard_size, **self.store_options,
            )
        self.last = export_safetensors(
            self.tiers, step, prefix=self.prefix, keys=self.keys, wait_seconds=self.wait_seconds,
            store=self._store, **_read_options(self.store_options),
        )
        return self.last

    def wait(self) -> List[Dict[str, Any]]:
        """Waits for every queued export; raises the first one's error (all are waited for)."""
        done, first = [], None
        pending, self._pending = self._pending, []
        for step, fut in pending:
            try:
                done.append(fut.result())
            except BaseException as e:  # noqa: BLE001 - re-raised below, after the others
                if first is None:
                    first = (step, e)
                else:
                    warnings.warn(f"ringtier: safetensors export of DCP step {step} failed: {e}", RuntimeWarning)
        if first is not None:
            raise RuntimeError(f"ringtier: safetensors export of DCP checkpoint {first[0]} failed: {first[1]}") from first[1]
        return done

    def drain(self) -> None:
        """Waits for the exports, then for the export store's drain."""
        self.wait()
        if self._store is not None:
            self._store.drain()

    def close(self, drain: bool = False) -> None:
        """Waits for the exports (raising the first error once the store is closed)."""
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
            if self._store is not None:
                self._store.close(drain)
                self._store = None
