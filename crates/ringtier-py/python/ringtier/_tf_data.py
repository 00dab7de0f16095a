"""``ringtier.tensorflow.Source`` and its helpers: ringtier's loaders as a ``tf.data`` source
(imported by ``ringtier.tensorflow``; TensorFlow is imported on first use)."""

from __future__ import annotations

import atexit
import collections
import ctypes
import os
import threading
import time
import weakref
from typing import Any, Deque, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from . import _ringtier, _tf_op
from ._fields import image_of, label_of_record
from ._ringtier import Loader, RecordLoader
from ._types import PathLike, is_s3_url, tier_path
from .errors import InvalidInputError, NotFoundError

def _tf() -> Any:
    """TensorFlow, imported on first use."""
    try:
        import tensorflow as tf
    except ImportError as e:  # pragma: no cover - exercised where TensorFlow is missing
        raise ImportError(
            "ringtier.tensorflow needs TensorFlow: pip install 'ringtier[tensorflow]' (tensorflow-cpu>=2.21)"
        ) from e
    return tf


# -- interpreter exit with an iterator alive ---------------------------------------------------

# A tf.data iterator still alive when Python exits is destroyed while the interpreter finalizes,
# and its destructor waits for the generator call in flight on a tf.data thread. That call, in
# the engine with the GIL released, cannot take the GIL back once finalization has begun (the
# thread is parked for good): the process would hang at exit. So at exit (atexit runs before
# finalization) every generator is told to end and the calls in flight are waited for.
_exit_lock = threading.Condition()
_in_flight = 0
_closing = False
_last_step = 0.0
_used = False
#: How long exit waits for the generator calls in flight to return.
EXIT_WAIT_SECONDS = 30.0
#: Exit also waits until no generator step has begun for this long (at most
#: :data:`EXIT_QUIET_MAX_SECONDS`): the step tf.data asks for after the one in flight returns
#: (it then ends the generator at once) comes before the interpreter finalizes, not after.
EXIT_QUIET_SECONDS = 0.15
EXIT_QUIET_MAX_SECONDS = 2.0


def _guarded(gen: Iterator[Any]) -> Iterator[Any]:
    """``gen``, ending early once the interpreter is exiting, each step counted in flight."""
    global _in_flight, _last_step, _used
    while True:
        with _exit_lock:
            _used = True
            _last_step = time.monotonic()
            if _closing:
                _exit_lock.notify_all()
                return
            _in_flight += 1
        try:
            item = next(gen)
        except StopIteration:
            return
        finally:
            with _exit_lock:
                _in_flight -= 1
                _exit_lock.notify_all()
        yield item


def _end_generators_at_exit() -> None:
    global _closing
    with _exit_lock:
        _closing = True
        if not _used:
            return
        start = time.monotonic()
        deadline = start + EXIT_WAIT_SECONDS
        while _in_flight and time.monotonic() < deadline:
            _exit_lock.wait(max(0.0, deadline - time.monotonic()))
        quiet_until = min(time.monotonic() + EXIT_QUIET_MAX_SECONDS, deadline)
        while time.monotonic() < quiet_until:
            idle = time.monotonic() - _last_step
            if not _in_flight and idle >= EXIT_QUIET_SECONDS:
                break
            _exit_lock.wait(max(0.01, EXIT_QUIET_SECONDS - idle))


atexit.register(_end_generators_at_exit)


# -- the heap under tf.string batches ----------------------------------------------------------

# mallopt(3) parameters of glibc's malloc.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Allocations above this come from mmap (glibc's own ceiling for its dynamic threshold).
MMAP_THRESHOLD_BYTES = 32 << 20
#: The smallest and the largest trim threshold :func:`keep_heap_for` sets.
TRIM_THRESHOLD_BYTES = (64 << 20, 1 << 30)
#: Environment variables by which a user has chosen glibc's malloc parameters; where one is
#: set (``GLIBC_TUNABLES``: with a ``glibc.malloc.`` tunable), :func:`keep_heap_for` leaves
#: them alone.
MALLOC_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


def _user_chose_malloc() -> bool:
    env = os.environ
    return any(v in env for v in MALLOC_ENV[:-1]) or "glibc.malloc." in env.get("GLIBC_TUNABLES", "")

_heap_lock = threading.Lock()
_heap_trim = 0  # the trim threshold this module set; 0: none yet
_heap_refused = False


def _mallopt() -> Any:
    """glibc's ``mallopt``, or None (another C library, or a preloaded allocator that is not
    glibc's: then its own policy applies)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
        fn = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def keep_heap_for(batch_bytes: int) -> bool:
    """Keeps glibc's malloc from giving the memory of freed batches back to the kernel
    between batches; True where the parameters are set (now or before).

    Why: a ``tf.string`` batch is copied twice into fresh heap memory (a Python ``bytes`` per
    sample, then TensorFlow's strings), on threads whose malloc arenas glibc trims as soon as
    the freed top exceeds twice its (dynamic, often 1 MiB) mmap threshold. Every batch then
    faulted its pages in again: on the ImageNet-like files the faults and unmaps were most of
    the pipeline's CPU, which fell from about 2.0 to 0.6 s per GiB with this (perf;
    docs/TENSORFLOW.md). This sets ``M_MMAP_THRESHOLD`` to 32 MiB (the ceiling of
    glibc's own dynamic threshold) and ``M_TRIM_THRESHOLD`` to four batches, at least 64 MiB
    and at most 1 GiB, raised when a larger batch comes. The process keeps up to that much
    freed memory per arena for reuse instead of unmapping it (never more than its peak use).
    Nothing is changed where the user chose malloc's parameters (:data:`MALLOC_ENV`) or the
    C library is not glibc."""
    global _heap_trim, _heap_refused
    want = min(max(TRIM_THRESHOLD_BYTES[0], 4 * int(batch_bytes)), TRIM_THRESHOLD_BYTES[1])
    want = 1 << (want - 1).bit_length()
    if want <= _heap_trim:
        return True
    if _heap_refused:
        return False
    with _heap_lock:
        if want <= _heap_trim:
            return True
        mallopt = None if _user_chose_malloc() else _mallopt()
        if mallopt is None:
            _heap_refused = True
            return False
        if _heap_trim == 0 and not mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
            _heap_refused = True
            return False
        if not mallopt(_M_TRIM_THRESHOLD, want):
            _heap_refused = True
            return False
        _heap_trim = want
    return True


def _shard_of(input_context: Any, shard: Optional[Tuple[int, int]]) -> Tuple[int, int]:
    """``(index, count)`` of this input pipeline: from ``shard``, or a
    ``tf.distribute.InputContext`` (``input_pipeline_id`` of ``num_input_pipelines``)."""
    if input_context is not None and shard is not None:
        raise ValueError("give input_context or shard, not both")
    if input_context is not None:
        index, count = int(input_context.input_pipeline_id), int(input_context.num_input_pipelines)
    elif shard is not None:
        index, count = (int(v) for v in shard)
    else:
        return 0, 1
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard index {index} of {count}: need 0 <= index < count")
    return index, count


def _class_of(key: str) -> str:
    """The class of a file: its first directory (``class0001/img.jpg``), as Keras'
    ``image_dataset_from_directory`` infers labels."""
    head, sep, _ = key.partition("/")
    if not sep:
        raise InvalidInputError(f"labels='inferred' needs class directories: {key!r} is not in one")
    return head


FORMATS = ("files", "tfrecord", "wds")
#: Chunks of records (``read_batch`` each) that cross into TensorFlow ahead of the unbatch
#: that splits them (at most this many plus the one being split are held as tf.string).
CHUNKS_AHEAD = 4
LAYOUTS = ("NHWC", "NCHW")
OUTPUTS = ("bytes", "uint8")


#: Batch-op epochs one source keeps open at once: a new iteration of the dataset releases the
#: epochs before it. An iterator dropped before its epoch's end (a first batch looked at, a
#: ``take``) leaves the epoch open, its reads done and its queue full, holding read buffers of
#: the loader that the next epoch shares; released, they come back. An older iterator still
#: reading then fails with ``InvalidArgumentError`` (iterate a second dataset made from the
#: same path for two iterations at once).
MAX_OPEN_EPOCHS = 1


def _release_token(token: int) -> None:
    _ringtier._tf_release(token)


def _release_tokens(tokens: Deque[int]) -> None:
    while tokens:
        _release_token(tokens.popleft())


def _rebatch(ds: Any, n: int, drop: bool) -> Any:
    """Batches of ``n`` from the chunks of ``ds`` (rank-1 tensors): ``Dataset.rebatch``
    (TensorFlow 2.13 on), which slices and joins the chunks in C++; ``unbatch().batch(n)``
    before it (one element at a time). Measured on the op's 64-record chunks of the
    ImageNet-like shards: 0.85x the CPU of the unbatch and no slow passes (docs/TENSORFLOW.md)."""
    if hasattr(ds, "rebatch"):
        return ds.rebatch(n, drop_remainder=drop)
    return ds.unbatch().batch(n, drop_remainder=drop)  # pragma: no cover - TensorFlow < 2.13


class Source:
    """The samples of ``path`` (a directory or ``s3://bucket/prefix?endpoint=...``) for
    ``tf.data``; :meth:`dataset` makes the ``tf.data.Dataset``. Keep the source to call
    :meth:`set_epoch` (the ``tf.data.Dataset`` itself is immutable).

    ``format``: ``"files"`` (every file, or the ``.ringtier-manifest.tsv`` of ``ringtier
    gen``), ``"tfrecord"`` or ``"wds"`` (shards; ``order`` ``"stream"`` or ``"global"``, as
    :class:`ringtier.RecordLoader`).

    Elements, without ``transform``:

    * files: the file's bytes (``tf.string``; ``output="uint8"``: a ``tf.uint8`` vector over
      the read buffer, no copy), ``(key, bytes)`` with ``with_keys``, ``(bytes, label)`` with
      ``labels="inferred"`` (the index of the file's class directory in :attr:`class_names`);
    * tfrecord: the record's bytes (``tf.string``, e.g. a serialized ``tf.train.Example``);
    * wds: a dict of ``fields`` (``tf.string`` each; ``b""`` where a sample lacks one) with
      ``"__key__"``.

    With ``batch_size`` the elements are batched (the last batch may be short unless
    ``drop_last``); without it they come one at a time (read in batches of ``read_batch``).
    Records and WebDataset samples cross into TensorFlow ``read_batch`` at a time and are
    batched in TensorFlow's C++ when ``batch_size`` is larger.

    With ``transform`` (a :class:`ringtier.transforms.Compose`; its ``ToDtype`` gives uint8 or
    float32): batches of ``batch_size`` decoded, transformed images, ``(n, S, S, 3)``
    (``layout="NHWC"``) or ``(n, 3, S, S)`` (``"NCHW"``), with ``labels`` (files:
    ``"inferred"``; wds: the integer in ``label_field``) as ``(images, labels)``; a sample
    whose JPEG does not decode is left out. A sample's random crop and flip depend only on
    (seed, epoch, its index).

    Sharding: ``input_context`` (a ``tf.distribute.InputContext``, as
    ``strategy.distribute_datasets_from_function`` passes) or ``shard=(index, count)``;
    every sample is read by exactly one shard per epoch.

    Epochs: each new iteration of the dataset (``for x in ds``, one ``ds.repeat()`` round,
    one Keras epoch) reads the next epoch, starting at ``epoch``; :meth:`set_epoch` chooses the
    epoch (and ``position``, samples of this shard to skip: resuming) of the next iteration.
    The order of an epoch depends only on (seed, epoch). ``shuffle=False`` reads in key order.

    ``tune_malloc`` (default True): where batches cross as ``tf.string`` (raw files, records,
    WebDataset fields), keep glibc's malloc from unmapping freed batch memory between batches
    (:func:`keep_heap_for`; without it most of the pipeline's CPU went to page faults).

    ``options`` go to the loader (:class:`ringtier.Loader`: ``prefetch``, ``engine``,
    ``verify``, ``cache``, ``hold``, ``lazy_pool`` (default True here: the read buffers are
    faulted in as reads fill them, not all before the first batch) ...; :class:`ringtier.RecordLoader`: ``depth``,
    ``read_size``, ``shuffle_buffer``, ``index_dir`` ...).
    """

    def __init__(
        self,
        path: PathLike,
        *,
        format: str = "files",
        order: str = "stream",
        batch_size: Optional[int] = None,
        read_batch: int = 64,
        drop_last: bool = False,
        shuffle: bool = True,
        seed: int = 0,
        epoch: int = 0,
        input_context: Any = None,
        shard: Optional[Tuple[int, int]] = None,
        with_keys: bool = False,
        labels: Optional[str] = None,
        output: str = "bytes",
        fields: Optional[Sequence[str]] = None,
        transform: Any = None,
        layout: str = "NHWC",
        decode_threads: Optional[int] = None,
        depth: int = 2,
        image_field: Optional[str] = None,
        label_field: Optional[str] = "cls",
        tune_malloc: bool = True,
        **options: Any,
    ) -> None:
        if format not in FORMATS:
            raise InvalidInputError(f"format must be one of {FORMATS}, not {format!r}")
        if layout not in LAYOUTS:
            raise InvalidInputError(f"layout must be one of {LAYOUTS}, not {layout!r}")
        if output not in OUTPUTS:
            raise InvalidInputError(f"output must be one of {OUTPUTS}, not {output!r}")
        for name, v in (("batch_size", batch_size), ("read_batch", read_batch)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InvalidInputError(f"{name} must be a positive int, not {v!r}")
        if not isinstance(tune_malloc, bool):
            raise InvalidInputError(f"tune_malloc must be True or False, not {tune_malloc!r}")
        if labels not in (None, "inferred"):
            raise InvalidInputError(f"labels must be None or 'inferred', not {labels!r}")
        self.path = tier_path(path)
        if not is_s3_url(self.path) and not os.path.exists(self.path):
            raise NotFoundError(f"dataset {self.path} does not exist")
        self.format, self.order = format, order
        self.batch_size, self.drop_last = batch_size, drop_last
        self.read_batch = batch_size or read_batch
        # Records cross in chunks of at most read_batch and are batched in TensorFlow's C++: a
        # large batch (1024 records, 136 MB of ImageNet-like samples) no longer waits whole
        # in Python before its first record crosses.
        self.record_chunk = min(read_batch, batch_size or read_batch)
        self.shuffle, self.seed = shuffle, seed
        self.shard_index, self.shard_count = _shard_of(input_context, shard)
        self.with_keys, self.output = with_keys, output
        self.transform, self.layout, self.depth = transform, layout, depth
        self.decode_threads = decode_threads
        self.image_field, self.label_field = image_field, label_field
        self.fields = list(fields) if fields is not None else None
        self.tune_malloc = tune_malloc
        self.options = dict(options)
        if format == "wds" and transform is None and not self.fields:
            raise InvalidInputError("a WebDataset source without transform= needs fields= (e.g. ['jpg', 'cls'])")
        if format == "files" and transform is None and output == "uint8" and batch_size is not None:
            raise InvalidInputError("output='uint8' yields one vector per file: leave batch_size=None")
        if labels is not None and format != "files":
            raise InvalidInputError("labels='inferred' is for files in class directories; wds batches use label_field")
        if transform is not None:
            if batch_size is None:
                raise InvalidInputError("transform= yields image batches: give batch_size")
            if output != "bytes" or with_keys:
                raise InvalidInputError("transform= yields (images[, labels]): output= and with_keys= do not apply")
            from .transforms import compile_transform

            self._probe = compile_transform(transform, seed=seed, threads=1)  # fails here for a bad chain
        self.labels = labels
        self._state: Optional[Tuple[int, Any]] = None
        self._pipeline: Optional[Tuple[int, Any]] = None
        self.class_names: List[str] = []
        self._keys: Optional[List[str]] = None
        self._label_of: Optional[np.ndarray] = None
        if format == "files" and (labels is not None or with_keys):
            self._keys = self._loader().keys()
            if labels is not None:
                self.class_names = sorted({_class_of(k) for k in self._keys})
                index = {c: i for i, c in enumerate(self.class_names)}
                self._label_of = np.array([index[_class_of(k)] for k in self._keys], dtype=np.int64)
        self._epoch, self._position = epoch, 0
        self._lock = threading.Lock()
        # Batch-op epochs this source opened (tokens); those still open are released by
        # close() or when the source goes.
        self._tokens: Deque[int] = collections.deque()
        weakref.finalize(self, _release_tokens, self._tokens)

    # -- epochs ---------------------------------------------------------------------------

    def set_epoch(self, epoch: int, position: int = 0) -> None:
        """The epoch the next iteration of the dataset reads, from ``position`` (samples of
        this shard already consumed) on; later iterations read the epochs after it."""
        with self._lock:
            self._epoch, self._position = int(epoch), int(position)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self._epoch

    def _next_epoch(self) -> Tuple[int, int]:
        with self._lock:
            e, p = self._epoch, self._position
            self._epoch, self._position = e + 1, 0
            return e, p

    # -- loaders --------------------------------------------------------------------------

    def _loader(self) -> Any:
        """This process's loader (made on first use in the process that iterates)."""
        pid = os.getpid()
        if self._state is not None and self._state[0] == pid:
            return self._state[1]
        options = dict(self.options)
        if self.format == "files":
            # The pool's buffers are each the largest file (about 1 MiB for the ImageNet-like
            # set, 10x the median): faulting them all in and registering them cost 0.4 to 1 s
            # before the first batch; a lazy pool faults in only what the reads fill, once.
            options.setdefault("lazy_pool", True)
            if self.transform is not None:
                options.setdefault("hold", self.read_batch * (self.depth + 2))
            elif self.output == "uint8":
                # TensorFlow holds the read buffers it was handed until it drops the tensors.
                options.setdefault("hold", self.read_batch * 16)
            loader = Loader(
                self.path,
                batch_size=self.read_batch,
                shuffle=self.shuffle,
                seed=self.seed,
                rank=self.shard_index,
                world_size=self.shard_count,
                drop_last=self.drop_last and self.batch_size is not None,
                **options,
            )
        else:
            if not self.shuffle:
                options.setdefault("shuffle_buffer", 0)
                options.setdefault("shuffle_shards", False)
            loader = RecordLoader(
                self.path,
                format="tfrecord" if self.format == "tfrecord" else "wds",
                order=self.order,
                seed=self.seed,
                rank=self.shard_index,
                world_size=self.shard_count,
                **options,
            )
        self._state = (pid, loader)
        return loader

    def __len__(self) -> int:
        """Samples of this shard per epoch (files, or records in a global order)."""
        return len(self._loader())

    def _transform_pipeline(self) -> Any:
        pid = os.getpid()
        if self._pipeline is None or self._pipeline[0] != pid:
            from .transforms import compile_transform

            threads = self.decode_threads or max(1, len(os.sched_getaffinity(0)))
            self._pipeline = (pid, compile_transform(self.transform, seed=self.seed, threads=threads))
        return self._pipeline[1]

    # -- what the generator yields ----------------------------------------------------------

    def element_spec(self) -> Any:
        """The ``output_signature`` of the generator (before the dataset's unbatch or
        transpose)."""
        tf = _tf()
        n = None
        if self.transform is not None:
            pipe = self._probe
            dtype = tf.float32 if pipe.dtype == "float32" else tf.uint8
            images = tf.TensorSpec((n, 3, pipe.size, pipe.size), dtype)
            labelled = self.labels is not None or (self.format == "wds" and self.label_field is not None)
            return (images, tf.TensorSpec((n,), tf.int64)) if labelled else images
        if self.format == "wds":
            spec = {f: tf.TensorSpec((n,), tf.string) for f in self.fields or ()}
            spec["__key__"] = tf.TensorSpec((n,), tf.string)
            return spec
        if self.format == "files" and self.output == "uint8":
            data = tf.TensorSpec((None,), tf.uint8)  # one file per element
            parts: List[Any] = [data]
            if self.with_keys:
                parts.insert(0, tf.TensorSpec((), tf.string))
            if self.labels is not None:
                parts.append(tf.TensorSpec((), tf.int64))
            return tuple(parts) if len(parts) > 1 else data
        data = tf.TensorSpec((n,), tf.string)
        parts = [data]
        if self.with_keys:
            parts.insert(0, tf.TensorSpec((n,), tf.string))
        if self.labels is not None:
            parts.append(tf.TensorSpec((n,), tf.int64))
        return tuple(parts) if len(parts) > 1 else data

    def _files(self, epoch: int, position: int) -> Iterator[Any]:
        loader = self._loader()
        # The keys are listed for labels too; they are part of the element only with with_keys.
        keys, label_of = (self._keys if self.with_keys else None), self._label_of
        uint8 = self.output == "uint8"
        for batch in loader.epoch(epoch, position):
            samples = list(batch)
            indices = batch.indices
            if uint8:
                for s, i in zip(samples, indices):
                    data = np.frombuffer(s, np.uint8) if len(s) else np.zeros(0, np.uint8)
                    parts: List[Any] = [data]
                    if keys is not None:
                        parts.insert(0, keys[i])
                    if label_of is not None:
                        parts.append(label_of[i])
                    yield tuple(parts) if len(parts) > 1 else data
                continue
            if self.tune_malloc:
                keep_heap_for(batch.bytes)
            data = np.array([s.to_bytes() for s in samples], dtype=object)
            del samples
            out: List[Any] = [data]
            if keys is not None:
                out.insert(0, np.array([keys[i] for i in indices], dtype=object))
            if label_of is not None:
                out.append(label_of[list(indices)])
            yield tuple(out) if len(out) > 1 else data

    def _records(self, epoch: int, position: int) -> Iterator[Any]:
        """Records ``record_chunk`` at a time: one ``next_batch`` and one ``field_bytes`` per
        chunk (per field for WebDataset), the ``bytes`` made in Rust with the GIL released; no
        Python object per record but its ``bytes``."""
        loader = self._loader()
        wds = self.format == "wds"
        fields = self.fields or []
        chunk = self.record_chunk
        drop_short = self.drop_last and self.batch_size == chunk
        records = loader.epoch(epoch, position)
        while True:
            batch = records.next_batch(chunk)
            if batch is None:
                return
            if len(batch) < chunk and drop_short:
                # The epoch's short last chunk (or the records before an error, which the next
                # call raises).
                records.next_batch(chunk)
                return
            if self.tune_malloc:
                keep_heap_for(batch.nbytes())
            if not wds:
                yield np.array(batch.field_bytes(), dtype=object)
            else:
                out = {f: np.array(batch.field_bytes(f), dtype=object) for f in fields}
                out["__key__"] = np.array(batch.keys(), dtype=object)
                yield out
            del batch

    def _encoded_batches(self, epoch: int, position: int) -> Iterator[Tuple[List[Any], List[int], Any]]:
        """``(encoded images, indices, labels or None)`` per batch of ``batch_size``."""
        loader = self._loader()
        if self.format == "files":
            label_of = self._label_of
            for batch in loader.epoch(epoch, position):
                indices = list(batch.indices)
                yield list(batch), indices, (label_of[indices] if label_of is not None else None)
            return
        wds = self.format == "wds"
        items: List[Any] = []
        indices: List[int] = []
        labels: List[int] = []
        labelled = wds and self.label_field is not None
        for record in loader.epoch(epoch, position):
            items.append(image_of(record, self.image_field) if wds else record)
            indices.append((record.shard << 40) | record.offset)
            if labelled:
                labels.append(label_of_record(record, self.label_field))
            if len(items) == self.batch_size:
                yield items, indices, (np.array(labels, np.int64) if labelled else None)
                items, indices, labels = [], [], []
        if items and not self.drop_last:
            yield items, indices, (np.array(labels, np.int64) if labelled else None)

    def _images(self, epoch: int, position: int) -> Iterator[Any]:
        """Decoded, transformed batches, ``depth`` in flight on the pipeline's threads."""
        pipe = self._transform_pipeline()
        dtype = np.float32 if pipe.dtype == "float32" else np.uint8
        flight: Deque[Tuple[Any, List[int], Any]] = collections.deque()

        def finish() -> Optional[Any]:
            pending, indices, labels = flight.popleft()
            done = pending.wait()
            n = done.shape[0]
            if n == 0:
                return None
            images = np.frombuffer(done, dtype=dtype).reshape(done.shape)
            if labels is None:
                return images
            if done.failed:
                where = {idx: k for k, idx in enumerate(indices)}
                labels = labels[[where[i] for i in done.indices]]
            return images, labels

        for items, indices, labels in self._encoded_batches(epoch, position):
            if not items:
                continue
            flight.append((pipe.submit(items, indices, epoch), indices, labels))
            del items
            if len(flight) > self.depth:
                got = finish()
                if got is not None:
                    yield got
        while flight:
            got = finish()
            if got is not None:
                yield got

    def generator(self) -> Iterator[Any]:
        """One epoch (the next one) as the generator ``from_generator`` runs."""
        epoch, position = self._next_epoch()
        if self.transform is not None:
            return _guarded(self._images(epoch, position))
        if self.format == "files":
            return _guarded(self._files(epoch, position))
        return _guarded(self._records(epoch, position))

    # -- TFRecord and raw files through the batch op ------------------------------------------

    def _open_epoch_token(self) -> Any:
        """The next epoch as a token of the batch op (one per iteration of the dataset)."""
        epoch, position = self._next_epoch()
        token = self._loader()._tf_epoch(epoch, position)
        with self._lock:
            self._tokens.append(token)
            while len(self._tokens) > MAX_OPEN_EPOCHS:
                # An iterator dropped before the end of its epoch leaves its epoch open (the op
                # releases an epoch at its end or first error): the older go here.
                _release_token(self._tokens.popleft())
        return np.int64(token)

    def _op_chunk(self) -> int:
        """Samples per op call: the file loader's batch, or ``read_batch`` records."""
        return self.read_batch if self.format == "files" else self.record_chunk

    def _op_batch_bytes(self) -> int:
        """The bytes of one batch the op path holds, estimated: files, the batch times the
        largest file; records, the batch (``batch_size``, else a chunk) times the median length
        field of the first record of up to 8 shards (each bounded at 64 MiB); 0 where that cannot
        be read (S3, an unreadable shard)."""
        n = self.batch_size or self._op_chunk()
        if self.format == "files":
            return n * int(self._loader().listing["max_size"])
        if is_s3_url(self.path):
            return 0
        lens = []
        for key in self._loader().shards()[:8]:
            try:
                with open(os.path.join(self.path, key), "rb") as f:
                    head = f.read(8)
            except OSError:
                continue
            if len(head) == 8:
                lens.append(min(int.from_bytes(head, "little"), 64 << 20))
        if not lens:
            return 0
        return sorted(lens)[len(lens) // 2] * n

    def _op_dataset(self, op: Any) -> Any:
        """Samples read by the op: each iteration opens the next epoch (a token, made in
        Python once per epoch); the op then makes each chunk's ``tf.string`` tensor in C++, one
        copy per sample, with the samples' indices (keys and labels are gathered by them), and an
        empty tensor ends the epoch."""
        tf = _tf()
        self._loader()  # listed now: a missing or bad dataset fails here, with its kind
        chunk = self._op_chunk()
        files = self.format == "files"
        if self.tune_malloc:
            # The op's strings and the rebatched batches are fresh heap memory on tf.data's
            # threads, which glibc gives back between batches unless told not to (see
            # keep_heap_for): set once here, for the batch this pipeline holds.
            keep_heap_for(self._op_batch_bytes())
        keys = tf.constant(self._keys) if files and self.with_keys else None
        labels = tf.constant(self._label_of) if files and self._label_of is not None else None

        # Plain graph code: autograph's conversion (about 60 ms per dataset) is not needed.
        plain = tf.autograph.experimental.do_not_convert

        @plain
        def open_epoch(_: Any) -> Any:
            token = tf.numpy_function(self._open_epoch_token, [], tf.int64, stateful=True, name="ringtier_open_epoch")
            return tf.ensure_shape(token, ())

        # One token per iteration of the dataset: a Python call in a map over one element (a
        # third of from_generator's cost to build and to start each epoch).
        tokens = tf.data.Dataset.from_tensors(np.int64(0)).map(open_epoch)

        @plain
        def next_chunk(token: Any) -> Any:
            got = op.ringtier_next_records(token, max_records=chunk)
            return got.records, got.indices

        @plain
        def not_empty(data: Any, indices: Any) -> Any:
            return tf.size(indices) > 0

        @plain
        def elements(data: Any, indices: Any) -> Any:
            parts = [data]
            if keys is not None:
                parts.insert(0, tf.gather(keys, indices))
            if labels is not None:
                parts.append(tf.gather(labels, indices))
            return tuple(parts) if len(parts) > 1 else data

        @plain
        def full(data: Any) -> Any:
            return tf.size(data) == chunk

        @plain
        def epoch_chunks(token: Any) -> Any:
            return tf.data.Dataset.from_tensors(token).repeat().map(next_chunk).take_while(not_empty)

        ds = tokens.flat_map(epoch_chunks).map(elements)
        if files or chunk == self.batch_size:
            if self.drop_last and not files:
                ds = ds.filter(full)  # the loader of files leaves the short batch out itself
            # The op (its wait for samples, their copy into the strings) runs CHUNKS_AHEAD
            # chunks ahead of what takes the batches, on a tf.data thread of its own.
            ds = ds.prefetch(CHUNKS_AHEAD)
            return ds.unbatch() if self.batch_size is None else ds
        ds = ds.prefetch(CHUNKS_AHEAD)
        if self.batch_size is None:
            return ds.unbatch()
        return _rebatch(ds, self.batch_size, self.drop_last)

    def close(self) -> None:
        """Ends the batch-op epochs this source still has open (iterators dropped before the
        end of their epoch; an epoch read to its end is closed already). An iterator still
        reading one then fails. Also done when the source is garbage-collected, which
        ``tf.data`` may put off for as long as it keeps the dataset's functions."""
        with self._lock:
            _release_tokens(self._tokens)

    def uses_op(self) -> bool:
        """Whether :meth:`dataset` makes its ``tf.string`` batches in ringtier's C++ op
        (``ringtier._tf_op``: built on first use; ``RINGTIER_TF_OP``) rather than a Python
        generator: TFRecord shards and raw files as ``tf.string`` (``output="bytes"``), without
        ``transform``."""
        if self.transform is not None or self.format == "wds":
            return False
        if self.format == "files" and self.output != "bytes":
            return False
        return _tf_op.load() is not None

    def dataset(self) -> Any:
        """The ``tf.data.Dataset`` (each iteration reads the next epoch)."""
        tf = _tf()
        if self.uses_op():
            return self._op_dataset(_tf_op.load())
        ds = tf.data.Dataset.from_generator(self.generator, output_signature=self.element_spec())
        if self.transform is not None:
            if self.layout == "NHWC":
                # One copy, on tf.data's threads: NCHW from the pipeline to NHWC.
                def nhwc(images: Any, *rest: Any) -> Any:
                    images = tf.transpose(images, (0, 2, 3, 1))
                    return (images, *rest) if rest else images

                ds = ds.map(nhwc, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            return ds
        if self.format == "files" and self.output == "uint8":
            return ds if self.batch_size is None else ds.batch(self.batch_size, drop_remainder=self.drop_last)
        # Read batches cross as one string tensor each; unbatched (and rebatched) in C++.
        rebatched = self.format != "files" and self.record_chunk != self.batch_size
        if self.format != "files" and (self.batch_size is None or rebatched):
            # The generator (the wait for records, their bytes, the copy into tf.string) runs
            # on a thread of its own, CHUNKS_AHEAD chunks ahead of the unbatch, which copies
            # every string once more: two threads instead of one doing both in turn.
            ds = ds.prefetch(CHUNKS_AHEAD)
        if self.batch_size is None:
            return ds.unbatch()
        if rebatched:
            return _rebatch(ds, self.batch_size, self.drop_last)
        return ds

    def __repr__(self) -> str:
        return (
            f"ringtier.tensorflow.Source({self.path!r}, format={self.format!r}, shard={self.shard_index}/"
            f"{self.shard_count}, epoch={self._epoch}, transform={self.transform!r})"
        )


def dataset(path_or_url: PathLike, **options: Any) -> Any:
    """A ``tf.data.Dataset`` over ringtier: ``Source(path_or_url, **options).dataset()``
    (see :class:`Source`). The dataset keeps its :class:`Source` as ``ds.ringtier_source``
    (for ``set_epoch``) until a transformation (``.map``, ``.prefetch``) makes a new one."""
    source = Source(path_or_url, **options)
    ds = source.dataset()
    try:
        ds.ringtier_source = source
    except AttributeError:  # pragma: no cover - a tf.data version with slots
        pass
    return ds
