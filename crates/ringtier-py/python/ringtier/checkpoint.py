"""The checkpoint store from Python: ``save`` a state dict, ``load`` it back."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import warnings
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Sequence, Tuple, Union

from . import _safetensors_state as st_codec
from . import _state_dict_codec as codec
from ._ringtier import CheckpointStore as _Store
from ._ringtier import SaveFuture
from ._types import PathLike, is_s3_url, tier_path
from .errors import CorruptError, NotFoundError
from .safetensors import _parse_size


FORMATS = ("ringtier", "safetensors")
"""The values of :class:`CheckpointStore`'s ``format``."""


class CheckpointStore:
    """A crash-consistent checkpoint store over directories ordered fastest first: ``save``
    returns once the checkpoint is durable on the first (fast) tier, and a background drain
    copies it to the next ones, evicting old fast copies (``keep_last`` are kept).

    ``state`` is a dict (nested dicts allowed) of torch tensors, numpy arrays, bytes and plain
    values (str, int, float, bool, None, lists and tuples of them): a model's or optimizer's
    ``state_dict`` with string keys. Tensors are written from their own memory where they are
    contiguous CPU tensors; dtype (bfloat16 included), shape and key order come back exactly.

    Arguments:
        tiers: directories, fastest first (e.g. ``["/nvme/ckpt", "/nfs/ckpt"]``); a tier may be
            an S3 URL, ``"s3://bucket/prefix?endpoint=URL&region=R"``, credentials from the
            ``AWS_*`` environment variables (docs/PYTHON.md, "S3 tiers").
        prefix: the store's key prefix on every tier (several stores can share tiers).
        chunk_bytes: bytes per write and per drain copy.
        keep_last: committed checkpoints kept on each faster tier once drained.
        drain_concurrency: checkpoints drained at once.
        save_parallelism: parts (tensors) a save writes at once, each with one write in flight
            while its next chunk is copied (memory: two ``chunk_bytes`` buffers per part).
        drain_bytes_per_sec: cap on the drain's bandwidth (None: no cap).
        fast_capacity_bytes: bytes of checkpoints the fast tier may hold (None: its free space).
        on_full: ``"wait"`` for the drain to make room, or ``"write_through"`` to the next tier.
        engine: ``"auto"`` (O_DIRECT io_uring where the kernel allows it, else the thread pool
            with one ``RuntimeWarning``), ``"uring"`` (an error where io_uring is refused) or
            ``"posix"`` (a thread pool). The files are the same whichever engine wrote them.
        read_only: open to list, load and verify only (next to a process that saves).
        create: create missing tier directories (otherwise they are an error).
        format: how :meth:`save` lays a state out. ``"ringtier"`` (the default): parts
            ``state.json`` and ``tensors``. ``"safetensors"``: one part ``model.safetensors``, a
            safetensors file that ``safetensors.torch.load_file`` reads on every tier (S3
            included) once drained, so a step is also a Hub-ready model: tensors named by their
            path in the state joined with ``"."`` (``{"model": {"w": t}}`` gives ``model.w``),
            the rest of the state (structure, plain values, which values were numpy arrays or
            bytes) as JSON in the file's ``__metadata__``; every dtype must be one the format
            has. :meth:`load` reads steps of either format, whichever the store was opened with.
        max_shard_size: with ``format="safetensors"``, the most tensor bytes per file (an int,
            or ``"5GB"``/``"500MiB"``): a state with more is saved as Hugging Face's sharded
            layout, ``model-0000i-of-0000N.safetensors`` and ``model.safetensors.index.json``.
            None (the default): one file, whatever its size.

    One process at a time opens a store for writing (a second gets :class:`ringtier.BusyError`).
    Use it as a context manager, or call :meth:`close`.

    Files another library writes (TensorFlow's saver, a safetensors writer) become a step
    without being written a second time: write them into :meth:`staging_dir` (or any directory
    under the fast tier) and :meth:`commit_files`, or ``with store.staging(step) as s:`` write
    into ``s.path``.
    """

    def __init__(
        self,
        tiers: Sequence[PathLike],
        *,
        prefix: str = "ckpt",
        chunk_bytes: int = 32 << 20,
        keep_last: int = 2,
        drain_concurrency: int = 1,
        save_parallelism: int = 1,
        drain_bytes_per_sec: Optional[int] = None,
        fast_capacity_bytes: Optional[int] = None,
        on_full: str = "wait",
        engine: str = "auto",
        read_only: bool = False,
        create: bool = False,
        format: str = "ringtier",
        max_shard_size: Optional[Union[int, str]] = None,
    ) -> None:
        if isinstance(tiers, (str, bytes, os.PathLike)):
            raise TypeError("tiers must be a list of directories, fastest first (e.g. [fast, slow])")
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(map(repr, FORMATS))}, not {format!r}")
        self._shard_bytes: Optional[int] = None
        if max_shard_size is not None:
            if format != "safetensors":
                raise ValueError("max_shard_size applies to format='safetensors' only")
            self._shard_bytes = _parse_size(max_shard_size)
            if self._shard_bytes <= 0:
                raise ValueError(f"max_shard_size must be positive, not {max_shard_size!r}")
        self._format = format
        self._store = _Store(
            [tier_path(t) for t in tiers],
            prefix=prefix,
            chunk_bytes=chunk_bytes,
            keep_last=keep_last,
            drain_concurrency=drain_concurrency,
            save_parallelism=save_parallelism,
            drain_bytes_per_sec=drain_bytes_per_sec,
            fast_capacity_bytes=fast_capacity_bytes,
            on_full=on_full,
            engine=engine,
            read_only=read_only,
            create=create,
        )
        fast = self._store.tiers[0]
        # Where `staging_dir` makes directories: on the fast tier's file system, so that their
        # files are adopted, not copied (for an S3 fast tier: the system's temp directory).
        self._staging_root: Optional[str] = None
        if not is_s3_url(fast):
            self._staging_root = os.path.join(fast, f".staging-{prefix.replace('/', '_')}")
            if not read_only:
                # The store's lock is held: what a killed writer of this prefix staged is garbage.
                shutil.rmtree(self._staging_root, ignore_errors=True)

    def save(self, step: int, state: Mapping[str, Any]) -> Dict[str, Any]:
        """Saves ``state`` as checkpoint ``step`` and returns once it is durable on the fast
        tier: ``{"step", "bytes", "tier", "blocking_seconds", "wrote_through",
        "adopted_bytes"}`` (``adopted_bytes`` is 0 here; see :meth:`commit_files`). Do not
        change the tensors while it runs (from other threads). The state is checked whole before
        anything is written: a bad value (``TypeError``/``ValueError``) leaves no step."""
        return self._store.save(_step(step), self._encode(state))

    def async_save(self, step: int, state: Mapping[str, Any]) -> SaveFuture:
        """Copies ``state`` into a staging buffer and returns a :class:`ringtier.SaveFuture`
        at once (the shape of ``torch.distributed.checkpoint.async_save``): the caller may
        change its tensors as soon as this returns; ``future.result()`` waits until the
        checkpoint is durable on the fast tier and returns the report."""
        return self._store.async_save(_step(step), self._encode(state))

    def staging_dir(self) -> str:
        """A new, empty directory to write one checkpoint's files into before
        :meth:`commit_files`: under the fast tier's directory (``<fast>/.staging-<prefix>/``),
        so that the files are adopted rather than copied (the system's temp directory for an
        S3 fast tier). What is left there is removed when a store opens for writing."""
        if self._staging_root is None:
            return tempfile.mkdtemp(prefix="ringtier-staging-")
        os.makedirs(self._staging_root, exist_ok=True)
        return tempfile.mkdtemp(prefix="step-", dir=self._staging_root)

    def staging(self, step: int) -> "FileStaging":
        """``with store.staging(step) as s:`` write files into ``s.path``; when the block ends
        without an exception they are committed as ``step`` (:meth:`commit_files`; the report
        in ``s.report``); the directory is removed either way."""
        return FileStaging(self, _step(step))

    def commit_files(self, step: int, directory: PathLike, names: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """Commits the files ``names`` (default: every entry of ``directory``, sorted) that a
        program wrote into ``directory`` as the parts of checkpoint ``step``, and returns once
        the step is durable on the fast tier, with the report of :meth:`save` (its
        ``adopted_bytes``: the bytes not written again).

        Where ``directory`` lies under the fast tier's directory (:meth:`staging_dir` does),
        each file is *adopted*: checked to be a regular file reached without a symbolic link,
        checksummed (CRC-32C) from the page cache, fsynced and renamed into the step, so its
        bytes are not written a second time and it is gone from ``directory`` afterwards. A file
        the tier cannot adopt (a second hard link, another file system below the fast
        directory) is copied and left. Where ``directory`` is elsewhere (outside the fast
        tier, or an S3 fast tier) every file is copied, as :meth:`save` copies. Either way the
        step is committed as :meth:`save` commits (manifest last: a crash leaves the previous
        step or this one) and restores, drains and verifies like any other.

        A symbolic link among the files (or on the way to them under the fast tier) is a
        ``PermissionError``; a name that is not a regular file (a FIFO, a directory) a
        ``FileNotFoundError``; nothing is committed then. Do not change the files while this
        runs."""
        at = _step(step)
        where = os.fspath(directory)
        if isinstance(where, bytes):
            where = os.fsdecode(where)
        chosen = sorted(os.listdir(where)) if names is None else [str(n) for n in names]
        rel = self._under_fast(where)
        if rel is not None:
            return self._store.commit_files(at, rel, chosen)
        parts, maps = _mapped_files(where, chosen)
        try:
            return self._store.save(at, parts)
        finally:
            del parts
            for m in maps:
                m.close()

    def _under_fast(self, directory: str) -> Optional[str]:
        """``directory`` relative to the fast tier's directory, ``/``-separated, when it lies
        under it (by name: links are not resolved here, the engine refuses them); else None."""
        fast = self._store.tiers[0]
        if is_s3_url(fast):
            return None
        rel = os.path.relpath(os.path.abspath(directory), os.path.abspath(fast))
        if rel == os.curdir or rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
            return None
        return rel.replace(os.sep, "/")

    def _encode(self, state: Mapping[str, Any]) -> List[Tuple[str, List[Any]]]:
        if self._format == "safetensors":
            return st_codec.encode(state, self._shard_bytes)
        return codec.encode(state)

    def load(self, step: Optional[int] = None, into: Optional[MutableMapping[str, Any]] = None) -> Any:
        """Loads checkpoint ``step`` (the newest intact one when None; None when the store is
        empty).

        Without ``into``: a new state, its tensors sharing one buffer holding the checkpoint's
        bytes (writable; no copy per tensor). With ``into`` (a state dict of the same keys,
        shapes and dtypes): streams the checkpoint straight into its tensors and arrays (CPU,
        contiguous; others through a temporary) and returns it; keys, dtypes and shapes are
        checked before anything is read.

        A step saved with ``format="safetensors"`` loads the same way (detected from its part
        names); with ``into`` it is loaded whole, then copied into the given tensors.

        With ``step`` None, newer steps whose every copy is bad (a torn manifest, a part
        failing its checksum) are passed over: each is named in a ``RuntimeWarning`` and in
        :attr:`skipped` (``[(step, reason)]``, newest first). With ``into``, a bad step may
        have written some tensors before it failed; the older step loaded after it writes
        them all again."""
        self.skipped: List[Tuple[int, str]] = []
        if into is not None:
            # Streamed into the given tensors: the tensors part is read once, each chunk copied
            # where it belongs, without a buffer of the whole checkpoint.
            steps = [_step(step)] if step is not None else [c["step"] for c in reversed(self.list())]
            for at in steps:
                try:
                    try:
                        meta = self._store.read_part(at, codec.META_PART)
                    except NotFoundError:
                        # No state.json: a safetensors step (or no such step: the load says which).
                        loaded = self._store.load(at)
                        if loaded is None or not st_codec.is_safetensors_step([n for n, _ in loaded[2]]):
                            raise
                        return st_codec.fill(loaded[2], into)
                    return codec.load_in_place(
                        meta, into, lambda targets: self._store.load_scatter(at, codec.DATA_PART, targets)
                    )
                except (CorruptError, NotFoundError) as e:
                    if step is not None:
                        raise
                    self._skip(at, str(e))
            return None
        loaded = self.load_parts(step)
        if loaded is None:
            return None
        _step_loaded, _tier, parts, _fallbacks = loaded
        if st_codec.is_safetensors_step([name for name, _ in parts]):
            return st_codec.decode(parts)
        return codec.decode(parts)

    def _skip(self, step: int, why: str) -> None:
        self.skipped.append((step, why))
        warnings.warn(f"ringtier: checkpoint {step} skipped, no intact copy: {why}", RuntimeWarning, stacklevel=3)

    def load_parts(self, step: Optional[int] = None) -> Optional[Tuple[int, str, List[Tuple[str, Any]], List[str]]]:
        """The raw parts of checkpoint ``step`` (the newest intact one when None): ``(step,
        tier, [(name, PartBuffer)], fallbacks)``; a ``PartBuffer`` exports its bytes through
        the buffer protocol. Steps passed over are in :attr:`skipped`, as for :meth:`load`."""
        self.skipped = []
        loaded = self._store.load(None if step is None else _step(step))
        if loaded is None:
            return None
        at, tier, parts, fallbacks, skipped = loaded
        for s, why in skipped:
            self._skip(s, why)
        return at, tier, parts, fallbacks

    def delete(self, step: int) -> None:
        """Deletes checkpoint ``step`` from every tier (a quarantined copy included), each copy
        manifest first, as eviction does. Raises :class:`ringtier.BusyError` while a save of
        that step runs, :class:`ringtier.NotFoundError` when it is nowhere."""
        self._store.delete(_step(step))

    def quarantined(self) -> List[Dict[str, Any]]:
        """Copies set aside because no intact copy of their step exists (bit rot, a torn
        manifest): ``[{"step", "tier", "reason", "unix_ms"}]``. They are never listed, loaded
        or drained; :meth:`delete` removes them."""
        return self._store.quarantined()

    def list(self) -> List[Dict[str, Any]]:
        """Every committed checkpoint: ``[{"step", "bytes", "tiers"}]``, oldest first."""
        return self._store.list()

    def latest(self) -> Optional[int]:
        """The newest committed step, or None."""
        return self._store.latest()

    def verify(self, step: int) -> List[Tuple[str, Optional[str]]]:
        """Reads every committed copy of ``step`` and checks it: ``[(tier, None or the reason)]``."""
        return self._store.verify(_step(step))

    def drain(self) -> None:
        """Waits until every committed checkpoint has reached the slowest tier."""
        self._store.drain()

    def drain_stats(self) -> Dict[str, Any]:
        """Drain totals: ``checkpoints``, ``bytes``, ``busy_seconds``, ``paused_seconds``,
        ``backlog_bytes``."""
        return self._store.drain_stats()

    @property
    def format(self) -> str:
        """How :meth:`save` lays a state out: ``"ringtier"`` or ``"safetensors"``."""
        return self._format

    @property
    def tiers(self) -> List[str]:
        """The tier directories, fastest first."""
        return self._store.tiers

    @property
    def closed(self) -> bool:
        """True once closed."""
        return self._store.closed

    def close(self, drain: bool = False) -> None:
        """Closes the store; ``drain=True`` first waits for the drain to finish."""
        self._store.close(drain)

    def __enter__(self) -> "CheckpointStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._store)


class FileStaging:
    """A directory for one checkpoint's files (:meth:`CheckpointStore.staging`): ``path``,
    committed as ``step`` when the ``with`` block ends without an exception (``report``)."""

    def __init__(self, store: CheckpointStore, step: int) -> None:
        self.store = store
        self.step = step
        self.path = ""
        self.report: Optional[Dict[str, Any]] = None

    def __enter__(self) -> "FileStaging":
        self.path = self.store.staging_dir()
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        try:
            if exc_type is None:
                self.report = self.store.commit_files(self.step, self.path)
        finally:
            shutil.rmtree(self.path, ignore_errors=True)


def _mapped_files(directory: str, names: Sequence[str]) -> Tuple[List[Tuple[str, List[Any]]], List[Any]]:
    """The files as parts for a copying save: each mapped (no copy into Python), opened without
    following a link (a link is a ``PermissionError``, anything but a regular file a
    ``NotFoundError``, as the engine says for files under the fast tier). Returns the parts and
    the mappings to close after the save."""
    import mmap

    parts: List[Tuple[str, List[Any]]] = []
    maps: List[Any] = []
    try:
        for name in names:
            path = os.path.join(directory, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as e:
                if os.path.islink(path):
                    why = f"{path} is a symbolic link: checkpoint files are never read through links"
                    raise PermissionError(why) from e
                raise
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise NotFoundError(f"{path} is not a regular file")
                if st.st_size == 0:
                    parts.append((name, [b""]))
                    continue
                m = mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ)
                maps.append(m)
                parts.append((name, [m]))
            finally:
                os.close(fd)
    except BaseException:
        for m in maps:
            m.close()
        raise
    return parts, maps


def _step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"step must be an int, not {type(step).__name__}")
    if step < 0:
        raise ValueError(f"step must not be negative, got {step}")
    return step
