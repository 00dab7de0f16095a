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
disjoint and together hold every file once. grain is not imported by this module: its source
protocol is structural.
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
        self.path = tier_path(path)
        if not is_s3_url(self.path) and not os.path.exists(self.path):
            raise NotFoundError(f"dataset {self.path} does not exist")
        if (shard_index is None) != (shard_count is None):
            raise ValueError("give both shard_index and shard_count, or neither (then JAX's process index)")
        if shard_index is None or shard_count is None:
            shard_index, shard_count = process_shard()
        if shard_count < 1 or not 0 <= shard_index < shard_count:
            raise ValueError(f"shard {shard_index} of {shard_count}: need 0 <= shard_index < shard_count")
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


__all__ = ["FileSource", "process_shard"]
