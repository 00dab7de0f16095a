"""``ringtier.grain``: a grain data source over ringtier, for JAX input pipelines.

:class:`FileSource` is a grain ``RandomAccessDataSource`` (``__len__``, ``__getitem__``) and a
``SupportsBatchedReadRandomAccessDataSource`` (``_getitems``: many indices in one call) over
the files of a directory or an S3 prefix::

    import grain
    import ringtier.grain

    source = ringtier.grain.FileSource("/data/imagenet/train")
    ds = grain.MapDataset.source(source).shuffle(seed=0).map(decode).batch(64)

grain asks a source for one index at a time from many threads (``ReadOptions.num_threads``,
16 by default) in each worker process. The source gathers the requests that arrive while
reads are in flight into the next read (a group commit: no timer, no added wait for a lone
request; up to ``reads_in_flight`` batched reads at once), so concurrent ``__getitem__`` calls
become batched reads of many files through the engine (io_uring, O_DIRECT where the file
system allows it). ``_getitems`` reads its indices as one batch directly. Every read of a
process goes through one :class:`ringtier.FileReader`, made on first use in that process (a
forked worker makes its own): one engine, one ring, one pool of read buffers for all of them.

An element is the file's bytes as a ``uint8`` numpy array over the reader's read buffer (no
copy; the buffer goes back to the pool when the array is dropped), or ``(key, array)`` with
``with_keys``. The source is plain data (path, keys, shard, buffer size) and pickles into
grain's worker processes, where each opens its own reader.

Sharding: ``shard_index`` of ``shard_count`` keeps every ``shard_count``-th file of the sorted
key list; by default, where JAX is imported, ``jax.process_index()`` of
``jax.process_count()``, else the whole dataset. (Or leave the source whole and let grain's
sampler shard it, ``grain.sharding.ShardByJaxProcess()``.) The shards of one dataset are
disjoint and together hold every file once. grain is not imported for :class:`FileSource`: its
source protocol is structural.

``FileDataset`` is the faster form where the pipeline can start from an ``IterDataset``: a
grain ``IterDataset`` over ringtier's loader, read ahead by the engine in the epoch's order, with
no per-index protocol, sharded, sliced by ``mp_prefetch`` and checkpointed by grain. grain is
imported when it is first used::

    ds = ringtier.grain.FileDataset("/data/imagenet/train", seed=0).map(decode).batch(64)
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._ringtier import FileReader, Loader
from ._types import PathLike, is_s3_url, tier_path
from .errors import NotFoundError


def process_shard() -> Tuple[int, int]:
    """``(jax.process_index(), jax.process_count())`` where JAX is imported, else ``(0, 1)``."""
    jax = sys.modules.get("jax")
    if jax is None:
        return 0, 1
    return int(jax.process_index()), int(jax.process_count())


#: Bytes of one read buffer where the source does not list the files (``keys`` given).
DEFAULT_BUFFER_SIZE = 1 << 20


class _Slot:
    """One request waiting in the group commit."""

    __slots__ = ("key", "event", "value", "error", "done", "lead")

    def __init__(self, key: str) -> None:
        self.key = key
        self.event = threading.Event()
        self.value: Any = None
        self.error: Optional[BaseException] = None
        self.done = False  # value or error is set
        self.lead = False  # handed the lead: read the next batch


def _dataset_shard(path: PathLike, shard_index: Optional[int], shard_count: Optional[int]) -> Tuple[str, int, int]:
    """The dataset's path (it must exist, or be an S3 URL) and this process's shard: both of
    ``shard_index``/``shard_count`` given, or neither (JAX's process index and count)."""
    where = tier_path(path)
    if not is_s3_url(where) and not os.path.exists(where):
        raise NotFoundError(f"dataset {where} does not exist")
    if (shard_index is None) != (shard_count is None):
        raise ValueError("give both shard_index and shard_count, or neither (then JAX's process index)")
    if shard_index is None or shard_count is None:
        shard_index, shard_count = process_shard()
    for name, v in (("shard_index", shard_index), ("shard_count", shard_count)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        raise ValueError(f"shard {shard_index} of {shard_count}: need 0 <= shard_index < shard_count")
    return where, shard_index, shard_count


class FileSource:
    """The files of ``path`` (a directory, its ``.ringtier-manifest.tsv`` when it has one, or
    ``s3://bucket/prefix?endpoint=...``), or only ``keys``, as a grain data source: index ``i``
    is the ``i``-th key of this shard (keys sorted).

    ``max_batch``: the most files one batched read takes; ``reads_in_flight``: the most
    batched reads at once (2: measured best; more made smaller batches, and each read has a
    fixed cost); ``engine``: ``"auto"``, ``"uring"`` or ``"posix"`` (:class:`ringtier.Loader`);
    ``buffers``: read buffers in each process's pool (:class:`ringtier.FileReader`; a buffer is
    the largest file the listing found, or 1 MiB where ``keys`` are given; mapped, not touched,
    until reads fill them). A missing or unreadable file raises :class:`ringtier.RingtierError`
    from ``__getitem__``."""

    def __init__(
        self,
        path: PathLike,
        *,
        keys: Optional[Sequence[str]] = None,
        shard_index: Optional[int] = None,
        shard_count: Optional[int] = None,
        with_keys: bool = False,
        max_batch: int = 256,
        reads_in_flight: int = 2,
        engine: str = "auto",
        buffers: int = 1024,
    ) -> None:
        self.path, shard_index, shard_count = _dataset_shard(path, shard_index, shard_count)
        for name, v in (("max_batch", max_batch), ("reads_in_flight", reads_in_flight), ("buffers", buffers)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int of at least 1, not {v!r}")
        #: Bytes of one read buffer: the largest file the listing knows of (a larger one is read
        #: in pieces all the same).
        self.buffer_size = DEFAULT_BUFFER_SIZE
        if keys is None:
            lister = Loader(self.path, batch_size=1, shuffle=False, prefetch=0, lazy_pool=True, engine=engine)
            keys = lister.keys()
            self.buffer_size = max(1, int(lister.listing["max_size"]))
            del lister
        self.keys: List[str] = sorted(keys)[shard_index::shard_count]
        self.shard_index, self.shard_count = shard_index, shard_count
        self.with_keys, self.max_batch, self.engine = with_keys, max_batch, engine
        self.reads_in_flight, self.buffers = reads_in_flight, buffers
        self._init_state()

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._pending: List[_Slot] = []
        self._leaders = 0  # threads reading a batch, or handed the lead and about to
        self._reader: Optional[Tuple[int, Any]] = None  # (pid, FileReader) of the process using it

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        for k in ("_lock", "_pending", "_leaders", "_reader"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_state()

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        # grain's checkpointing of a DataLoader takes the source's repr as its identity.
        return (
            f"ringtier.grain.FileSource(path={self.path!r}, files={len(self.keys)}, "
            f"shard={self.shard_index}/{self.shard_count})"
        )

    def _key(self, index: Any) -> str:
        i = int(index)
        n = len(self.keys)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for a source of {n} files")
        return self.keys[i]

    def _element(self, key: str, sample: Any) -> Any:
        data = np.frombuffer(sample, np.uint8) if len(sample) else np.zeros(0, np.uint8)
        return (key, data) if self.with_keys else data

    def file_reader(self) -> Any:
        """This process's :class:`ringtier.FileReader`, made on first use in it (a reader made
        before a ``fork()`` has no I/O threads in the child: a forked worker makes its own).
        Two threads making the first one at once make two; one is kept."""
        pid = os.getpid()
        got = self._reader
        if got is not None and got[0] == pid:
            return got[1]
        reader = FileReader(self.path, buffer_size=self.buffer_size, buffers=self.buffers, engine=self.engine)
        self._reader = (pid, reader)
        return reader

    def _read_each(self, keys: Sequence[str]) -> List[Any]:
        """The files ``keys`` read as one batch (``max_batch`` files per batched read): per key,
        in the order given, its element or the error that reading it raised (an exception
        object, not raised: one bad file is that file's error alone)."""
        unique = list(dict.fromkeys(keys))
        reader = self.file_reader()
        got: Dict[str, Any] = {}
        for at in range(0, len(unique), self.max_batch):
            part = unique[at : at + self.max_batch]
            got.update(zip(part, reader.read(part)))
        return [got[k] if isinstance(got[k], BaseException) else self._element(k, got[k]) for k in keys]

    def read(self, keys: Sequence[str]) -> List[Any]:
        """The files ``keys`` read as one batch (``max_batch`` files per batched read): the
        elements, in the order given; the first file that could not be read raises."""
        out = self._read_each(keys)
        for v in out:
            if isinstance(v, BaseException):
                raise v
        return out

    def _getitems(self, indices: Sequence[int]) -> List[Any]:
        """The elements of ``indices``, read as one batch (grain's batched read protocol)."""
        return self.read([self._key(i) for i in indices])

    def __getitem__(self, index: int) -> Any:
        """The element of ``index``: read together with the other threads' requests that
        arrive while reads are in flight."""
        slot = _Slot(self._key(index))
        with self._lock:
            self._pending.append(slot)
            lead = self._leaders < self.reads_in_flight
            if lead:
                self._leaders += 1
        while True:
            if lead:
                self._lead()
            with self._lock:
                lead = slot.lead
                slot.lead = False
                if not lead:
                    if slot.done:
                        break
                    slot.event.clear()
            if not lead:
                slot.event.wait()
        if slot.error is not None:
            raise slot.error
        return slot.value

    def _lead(self) -> None:
        """Reads the oldest pending requests (up to ``max_batch``) as one batch, then hands the
        lead to the oldest request still pending and not led, if any (else gives it up)."""
        with self._lock:
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
        if batch:
            try:
                values = self._read_each([s.key for s in batch])
                for s, v in zip(batch, values):
                    if isinstance(v, BaseException):
                        s.error = v  # this file's error: the batch's other requests have their files
                    else:
                        s.value = v
            except BaseException as e:  # the read itself failed: every waiter of the batch gets it
                for s in batch:
                    s.error = e
        with self._lock:
            for s in batch:
                s.done = True
                s.event.set()
            nxt = next((s for s in self._pending if not s.lead), None)
            if nxt is not None:
                nxt.lead = True
                nxt.event.set()
            else:
                self._leaders -= 1


class _FileDatasetBase:
    """What :class:`FileDataset` is, without grain: its settings, sharding and slicing. The
    class grain sees (``ringtier.grain.FileDataset``) is this one with ``grain.IterDataset``
    as a base, made on first use (this module never imports grain itself)."""

    def __init__(
        self,
        path: PathLike,
        *,
        seed: int = 0,
        shuffle: bool = True,
        num_epochs: Optional[int] = 1,
        shard_index: Optional[int] = None,
        shard_count: Optional[int] = None,
        with_keys: bool = False,
        read_batch: int = 256,
        prefetch: int = 2,
        hold: int = 1024,
        on_bad: str = "skip",
        engine: str = "auto",
    ) -> None:
        super().__init__()
        self.path, shard_index, shard_count = _dataset_shard(path, shard_index, shard_count)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, not {type(seed).__name__}")
        for name, v in (("read_batch", read_batch), ("hold", hold)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int of at least 1, not {v!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be an int of at least 0, not {prefetch!r}")
        if num_epochs is not None and (isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1):
            raise ValueError(f"num_epochs must be None (forever) or an int of at least 1, not {num_epochs!r}")
        if on_bad not in ("skip", "fail"):
            raise ValueError(f'on_bad must be "skip" or "fail", not {on_bad!r}')
        self.seed, self.shuffle, self.num_epochs = seed, bool(shuffle), num_epochs
        self.shard_index, self.shard_count = shard_index, shard_count
        self.with_keys, self.read_batch, self.prefetch, self.hold = bool(with_keys), read_batch, prefetch, hold
        self.on_bad, self.engine = on_bad, engine

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Keeps the elements ``sl`` of this dataset's shard (grain's in-place slicing: each of
        ``mp_prefetch``'s workers keeps ``slice(i, None, n)``). The shard's order is dealt out
        element by element, so ``sequential_slice`` gives the same disjoint, complete split;
        only ``stop=None`` and a ``start`` below ``step`` are meaningful here."""
        start, stop, step = sl.start or 0, sl.stop, sl.step or 1
        if stop is not None or step < 1 or not 0 <= start < step:
            raise ValueError(f"FileDataset slices as slice(i, None, n) with 0 <= i < n, not {sl!r}")
        self.shard_index += self.shard_count * start
        self.shard_count *= step

    def __repr__(self) -> str:
        return (
            f"ringtier.grain.FileDataset(path={self.path!r}, shard={self.shard_index}/{self.shard_count}, "
            f"seed={self.seed}, shuffle={self.shuffle}, num_epochs={self.num_epochs})"
        )

    def _make_loader(self) -> Any:
        return Loader(
            self.path,
            batch_size=self.read_batch,
            prefetch=self.prefetch,
            shuffle=self.shuffle,
            seed=self.seed,
            rank=self.shard_index,
            world_size=self.shard_count,
            hold=self.hold,
            lazy_pool=True,
            on_bad=self.on_bad,
            engine=self.engine,
        )


class _FileIteratorBase:
    """What :class:`FileDataset`'s iterator is, without grain (its grain class is made with
    the dataset's). State: the epoch, where the current read batch starts in this shard's
    order, and how many of its elements were handed out; restoring reads that batch again and
    skips those."""

    def __init__(self, ds: Any) -> None:
        super().__init__()
        self._ds = ds
        self._loader: Optional[Any] = None
        self._epoch, self._start, self._given = 0, 0, 0
        self._skip = 0  # elements of the next batch already handed out before a restore
        self._batches: Optional[Any] = None
        self._samples: List[Any] = []
        self._have = False  # a batch is being handed out; it spans `_span` places of the order
        self._span = 0

    def _reset(self) -> None:
        self._batches, self._samples, self._have = None, [], False

    def __next__(self) -> Any:
        ds = self._ds
        while self._given >= len(self._samples):
            if self._have:  # the batch is handed out: the next starts after it
                self._start += self._span
                self._samples, self._have = [], False
            if ds.num_epochs is not None and self._epoch >= ds.num_epochs:
                raise StopIteration
            if self._loader is None:
                self._loader = ds._make_loader()
            if self._batches is None:
                self._batches = iter(self._loader.epoch(self._epoch, self._start))
            try:
                batch = next(self._batches)
            except StopIteration:
                self._epoch, self._start, self._given, self._skip = self._epoch + 1, 0, 0, 0
                self._reset()
                continue
            self._span = len(batch.indices) + len(batch.skipped)
            self._samples, self._have = list(batch), True
            self._given, self._skip = min(self._skip, len(self._samples)), 0
        s = self._samples[self._given]
        self._samples[self._given] = None  # the buffer goes back once the caller drops it
        self._given += 1
        data = np.frombuffer(s, np.uint8) if len(s) else np.zeros(0, np.uint8)
        return (s.key, data) if ds.with_keys else data

    def get_state(self) -> Dict[str, Any]:
        """``{"epoch", "position", "given"}``: the epoch, where the current read batch starts
        in this shard's order, and the elements of it already handed out."""
        return {"epoch": self._epoch, "position": self._start, "given": self._given if self._have else self._skip}

    def set_state(self, state: Dict[str, Any]) -> None:
        """Goes back (or forward) to a state :meth:`get_state` returned."""
        try:
            epoch, position, given = int(state["epoch"]), int(state["position"]), int(state["given"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a FileDataset iterator state: {state!r} ({e})") from None
        if epoch < 0 or position < 0 or given < 0:
            raise ValueError(f"not a FileDataset iterator state: {state!r} (negative)")
        self._reset()
        self._epoch, self._start, self._skip, self._given = epoch, position, given, 0


_GRAIN_CLASSES: Dict[str, Any] = {}


def _grain_classes() -> Tuple[Any, Any]:
    """``(FileDataset, its iterator class)``, made with grain's bases on first use."""
    if not _GRAIN_CLASSES:
        try:
            import grain
        except ImportError as e:
            raise ImportError("ringtier.grain.FileDataset needs grain: pip install 'ringtier[grain]'") from e

        class _FileIterator(_FileIteratorBase, grain.DatasetIterator):
            pass

        class FileDataset(_FileDatasetBase, grain.IterDataset):
            def __iter__(self) -> Any:
                return _FileIterator(self)

        FileDataset.__module__ = _FileIterator.__module__ = __name__
        FileDataset.__qualname__ = FileDataset.__name__ = "FileDataset"
        _FileIterator.__qualname__ = _FileIterator.__name__ = "_FileIterator"
        FileDataset.__doc__ = _FILE_DATASET_DOC
        _GRAIN_CLASSES.update(FileDataset=FileDataset, _FileIterator=_FileIterator)
    return _GRAIN_CLASSES["FileDataset"], _GRAIN_CLASSES["_FileIterator"]


_FILE_DATASET_DOC = """The files of ``path`` (a directory, its manifest, or an S3 prefix) as a grain
``IterDataset``: this shard's files in the epoch's shuffled order (``seed``, the same order on
every process), read ahead by the engine ``read_batch`` files at a time, ``prefetch`` reads
ahead, with no Python thread per element and no per-index protocol::

    ds = ringtier.grain.FileDataset("/data/train", seed=0).map(decode).batch(64)

An element is the file's bytes as a ``uint8`` numpy array over the engine's read buffer (no
copy; the buffer goes back when the array is dropped; ``hold`` is how many Python may keep at
once before :class:`ringtier.PoolExhaustedError`), or ``(key, array)`` with ``with_keys``.
``num_epochs`` epochs (``None``: forever), each reshuffled. Shard: ``shard_index`` of
``shard_count``, by default ``jax.process_index()`` of ``jax.process_count()`` where JAX is
imported; grain's ``mp_prefetch`` workers each take a slice of it (``set_slice``). The iterator
checkpoints with grain (``get_state``/``set_state``: epoch, position, elements handed out) and
resumes exactly. A file the listing or the read cannot use is skipped and named once
(``on_bad="skip"``) or raises (``"fail"``)."""


def __getattr__(name: str) -> Any:
    if name in ("FileDataset", "_FileIterator"):
        cls = _grain_classes()[0 if name == "FileDataset" else 1]
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FileSource", "FileDataset", "process_shard"]
