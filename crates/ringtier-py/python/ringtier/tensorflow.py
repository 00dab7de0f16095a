"""``ringtier.tensorflow``: ringtier under ``tf.data`` and TensorFlow's checkpoints.

* :func:`dataset` (or :class:`Source` for ``set_epoch``): a ``tf.data.Dataset`` over ringtier's
  loaders: the files of a directory or S3 prefix (:class:`ringtier.Loader`), TFRecord and
  WebDataset shards (:class:`ringtier.RecordLoader`), or decoded, transformed image batches
  (:mod:`ringtier.transforms`, JPEG decode to crop, flip, dtype and normalization in Rust
  threads). Sharded by a ``tf.distribute.InputContext`` or an explicit ``(index, count)``;
  seeded, a new shuffle each epoch.
* :class:`CheckpointManager`: a ``tf.train.Checkpoint`` saved through ringtier's burst buffer:
  TensorFlow writes its files to a staging directory, the files are committed as one step of a
  :class:`ringtier.CheckpointStore` (checksummed manifest, fsync, atomic rename) on the fast
  tier and drained to the slow tiers (or S3) in the background; ``restore_or_initialize``
  restores the newest intact step.

TensorFlow is imported when first needed (``pip install ringtier[tensorflow]``): importing this
module does not import it. docs/TENSORFLOW.md has the guarantees and the measurements.

How a batch crosses into TensorFlow (``tf.data.Dataset.from_generator``, which hands the
generator's numpy arrays to TensorFlow without a copy when they are 64-byte aligned, as
ringtier's buffers are, page-aligned):

* decoded image batches, ``layout="NCHW"``: **no copy** after the decode; the pipeline decodes
  into one page-aligned buffer per batch and the tensor TensorFlow gets is that buffer;
  ``layout="NHWC"`` (TensorFlow's and Keras' default): **one copy**, a ``tf.transpose`` run by
  ``tf.data``'s own threads;
* raw files or records as ``tf.string`` (what ``tf.io.decode_jpeg`` and
  ``tf.io.parse_example`` take): **two copies**, into a Python ``bytes`` and from it into
  TensorFlow's string tensor (TensorFlow has no way to wrap foreign memory as a string);
* raw files as ``tf.uint8`` vectors (``output="uint8"``): **no copy**; each tensor is the
  loader's pooled read buffer, given back to the pool when TensorFlow drops the tensor.
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import numpy as np

from ._ringtier import Loader, RecordLoader
from ._types import PathLike, is_s3_url, tier_path
from .checkpoint import CheckpointStore
from .errors import BusyError, CorruptError, InvalidInputError, NotFoundError


def _tf() -> Any:
    """TensorFlow, imported on first use."""
    try:
        import tensorflow as tf
    except ImportError as e:  # pragma: no cover - exercised where TensorFlow is missing
        raise ImportError(
            "ringtier.tensorflow needs TensorFlow: pip install 'ringtier[tensorflow]' (tensorflow-cpu>=2.21)"
        ) from e
    return tf


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


#: The WebDataset fields taken as the image when ``image_field`` is not given, in order.
IMAGE_FIELDS = ("jpg", "jpeg", "png", "webp")


def image_of(record: Any, field: Optional[str]) -> Any:
    """The image field of a WebDataset sample (``field``, or the first of :data:`IMAGE_FIELDS`)."""
    names = [field] if field is not None else list(IMAGE_FIELDS)
    for name in names:
        if name in record:
            return record[name]
    raise InvalidInputError(
        f"record {record.key!r} of shard {record.shard_key} has none of the image fields {tuple(names)} "
        f"(it has: {', '.join(record.names())}); give image_field="
    )


def label_of_record(record: Any, field: str) -> int:
    """The integer label in a WebDataset sample's ``field`` (``cls``)."""
    if field not in record:
        raise InvalidInputError(
            f"record {record.key!r} of shard {record.shard_key} has no label field {field!r} "
            f"(it has: {', '.join(record.names())}); give label_field=None for images only"
        )
    text = record[field].to_bytes().strip()
    try:
        return int(text)
    except ValueError:
        raise CorruptError(
            f"record {record.key!r} of shard {record.shard_key}: label field {field!r} is not an integer: {text[:32]!r}"
        ) from None


FORMATS = ("files", "tfrecord", "wds")
LAYOUTS = ("NHWC", "NCHW")
OUTPUTS = ("bytes", "uint8")


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

    ``options`` go to the loader (:class:`ringtier.Loader`: ``prefetch``, ``engine``,
    ``verify``, ``cache``, ``hold`` ...; :class:`ringtier.RecordLoader`: ``depth``,
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
        if labels not in (None, "inferred"):
            raise InvalidInputError(f"labels must be None or 'inferred', not {labels!r}")
        self.path = tier_path(path)
        if not is_s3_url(self.path) and not os.path.exists(self.path):
            raise NotFoundError(f"dataset {self.path} does not exist")
        self.format, self.order = format, order
        self.batch_size, self.drop_last = batch_size, drop_last
        self.read_batch = batch_size or read_batch
        self.shuffle, self.seed = shuffle, seed
        self.shard_index, self.shard_count = _shard_of(input_context, shard)
        self.with_keys, self.output = with_keys, output
        self.transform, self.layout, self.depth = transform, layout, depth
        self.decode_threads = decode_threads
        self.image_field, self.label_field = image_field, label_field
        self.fields = list(fields) if fields is not None else None
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
        keys, label_of = self._keys, self._label_of
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
            data = np.array([s.to_bytes() for s in samples], dtype=object)
            del samples
            out: List[Any] = [data]
            if keys is not None:
                out.insert(0, np.array([keys[i] for i in indices], dtype=object))
            if label_of is not None:
                out.append(label_of[list(indices)])
            yield tuple(out) if len(out) > 1 else data

    def _records(self, epoch: int, position: int) -> Iterator[Any]:
        loader = self._loader()
        wds = self.format == "wds"
        fields = self.fields or []
        pending: List[Any] = []

        def pack(records: List[Any]) -> Any:
            if not wds:
                return np.array([r.to_bytes() for r in records], dtype=object)
            out = {f: np.array([r[f].to_bytes() if f in r else b"" for r in records], dtype=object) for f in fields}
            out["__key__"] = np.array([r.key for r in records], dtype=object)
            return out

        for record in loader.epoch(epoch, position):
            pending.append(record)
            if len(pending) == self.read_batch:
                yield pack(pending)
                pending = []
        if pending and not (self.drop_last and self.batch_size is not None):
            yield pack(pending)

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
            return self._images(epoch, position)
        if self.format == "files":
            return self._files(epoch, position)
        return self._records(epoch, position)

    def dataset(self) -> Any:
        """The ``tf.data.Dataset`` (each iteration reads the next epoch)."""
        tf = _tf()
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
        return ds.unbatch() if self.batch_size is None else ds

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


class SaveFuture:
    """A :meth:`CheckpointManager.save` with ``wait=False``: TensorFlow's files are written,
    their commit into the store runs in the background. :meth:`result` waits until the step is
    durable on the fast tier and returns the report."""

    def __init__(self, step: int, future: Any) -> None:
        self.step = step
        self._future = future

    def done(self) -> bool:
        return bool(self._future.done())

    def result(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        return self._future.result(timeout)  # type: ignore[no-any-return]


class CheckpointManager:
    """Saves a ``tf.train.Checkpoint`` through ringtier's burst buffer (the paper's third
    experiment, around TensorFlow's own saver).

    ``save(step)``: TensorFlow writes the checkpoint's files (``checkpoint.write``) into a
    staging directory, then the files are committed as step ``step`` of a
    :class:`ringtier.CheckpointStore` over ``tiers`` (fastest first): written to the fast tier,
    checksummed in a manifest, fsynced and renamed into place, so a crash leaves the previous
    step or the new one, never a torn one. The store drains each step to the next tiers (a
    slower disk, NFS, ``s3://...``) in the background and keeps ``keep_last`` steps on each
    faster tier once drained; ``max_to_keep`` (None: all) deletes older steps everywhere.

    ``restore_or_initialize()``: restores the newest intact step (a step whose every copy is
    bad is passed over, with a ``RuntimeWarning``) and returns its number, or runs
    ``init_fn`` and returns None when there is none.

    ``staging_dir``: where TensorFlow writes before the commit (default: a directory beside the
    fast tier's, ``<fast>/.tf-staging-<prefix>``; for an S3 fast tier, the system's temp
    directory); emptied when the manager opens (one writer per prefix: the store's lock) and
    after each save. Restored files are kept in it until the next restore or :meth:`close`
    (TensorFlow may read them late, for variables created after the restore).

    A save of a step that is being saved (``wait=False``, another thread) raises
    :class:`ringtier.BusyError`; a step already committed, :class:`ringtier.AlreadyExistsError`.
    ``store_options`` go to :class:`ringtier.CheckpointStore` (``chunk_bytes``,
    ``drain_bytes_per_sec``, ``engine``, ``fast_capacity_bytes`` ...).
    """

    def __init__(
        self,
        checkpoint: Any,
        tiers: Sequence[PathLike],
        *,
        keep_last: int = 2,
        max_to_keep: Optional[int] = None,
        prefix: str = "tf-ckpt",
        staging_dir: Optional[PathLike] = None,
        init_fn: Optional[Callable[[], Any]] = None,
        create: bool = True,
        **store_options: Any,
    ) -> None:
        if isinstance(tiers, (str, bytes, os.PathLike)):
            raise TypeError("tiers must be a list of directories, fastest first (e.g. [fast, slow])")
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be at least 1 (or None), not {max_to_keep}")
        self.checkpoint = checkpoint
        self.max_to_keep = max_to_keep
        self.init_fn = init_fn
        self.store = CheckpointStore(tiers, prefix=prefix, keep_last=keep_last, create=create, **store_options)
        fast = self.store.tiers[0]
        if staging_dir is None:
            base = tempfile.gettempdir() if is_s3_url(fast) else fast
            staging_dir = os.path.join(base, f".tf-staging-{prefix}")
        self.staging_dir = os.fspath(staging_dir)
        # The store's lock is held: what a killed writer of this prefix left here is garbage.
        shutil.rmtree(self.staging_dir, ignore_errors=True)
        os.makedirs(self.staging_dir, exist_ok=True)
        self._lock = threading.Lock()
        self._saving: Set[int] = set()
        self._executor: Any = None
        self._restore_dir: Optional[str] = None
        self.last_status: Any = None

    # -- saving ---------------------------------------------------------------------------

    def _claim(self, step: Optional[int]) -> int:
        with self._lock:
            if step is None:
                latest = self.store.latest()
                step = max([(latest if latest is not None else -1), *self._saving]) + 1
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise ValueError(f"step must be a non-negative int, not {step!r}")
            if step in self._saving:
                raise BusyError(f"checkpoint step {step} is being saved")
            self._saving.add(step)
            return step

    def _write(self, step: int) -> Tuple[str, float]:
        """TensorFlow's files of the checkpoint, in a fresh staging directory."""
        where = tempfile.mkdtemp(prefix=f"step-{step}-", dir=self.staging_dir)
        t0 = time.perf_counter()
        self.checkpoint.write(os.path.join(where, "ckpt"))
        return where, time.perf_counter() - t0

    def _commit(self, step: int, where: str, tf_write_seconds: float, t0: float) -> Dict[str, Any]:
        import mmap

        try:
            parts: List[Tuple[str, List[Any]]] = []
            maps: List[Any] = []
            for name in sorted(os.listdir(where)):
                with open(os.path.join(where, name), "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    if size == 0:
                        parts.append((name, [b""]))
                        continue
                    m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
                    maps.append(m)
                    parts.append((name, [m]))
            if not parts:
                raise InvalidInputError(f"checkpoint.write wrote no files for step {step}")
            t1 = time.perf_counter()
            report = dict(self.store._store.save(step, parts))
            report["commit_seconds"] = time.perf_counter() - t1
            report["files"] = [name for name, _ in parts]
            del parts
            for m in maps:
                m.close()
        finally:
            shutil.rmtree(where, ignore_errors=True)
            with self._lock:
                self._saving.discard(step)
        report["tf_write_seconds"] = tf_write_seconds
        report["blocking_seconds"] = time.perf_counter() - t0
        self._prune()
        return report

    def save(self, step: Optional[int] = None, *, wait: bool = True) -> Any:
        """Saves the checkpoint as ``step`` (None: the step after the newest). With ``wait``
        (the default) returns once the step is durable on the fast tier: ``{"step", "bytes",
        "tier", "blocking_seconds", "tf_write_seconds", "commit_seconds", ...}``. With
        ``wait=False`` returns a :class:`SaveFuture` once TensorFlow has written its files
        (the variables may change from then on); the commit runs in the background."""
        t0 = time.perf_counter()
        step = self._claim(step)
        try:
            where, tf_seconds = self._write(step)
        except BaseException:
            with self._lock:
                self._saving.discard(step)
            raise
        if wait:
            return self._commit(step, where, tf_seconds, t0)
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ringtier-tf-commit")
        return SaveFuture(step, self._executor.submit(self._commit, step, where, tf_seconds, t0))

    def _prune(self) -> None:
        if self.max_to_keep is None:
            return
        steps = [c["step"] for c in self.store.list()]
        for old in steps[: max(0, len(steps) - self.max_to_keep)]:
            try:
                self.store.delete(old)
            except (BusyError, NotFoundError):
                pass

    # -- restoring ------------------------------------------------------------------------

    def restore(self, step: Optional[int] = None) -> Optional[int]:
        """Restores ``step`` (None: the newest intact one) into the checkpoint and returns the
        step restored, or None when the store has none. The ``tf.train.Checkpoint.read``
        status is :attr:`last_status` (``.assert_consumed()``, ``.expect_partial()``)."""
        loaded = self.store.load_parts(step)
        if loaded is None:
            return None
        at, _tier, parts, _fallbacks = loaded
        if self._restore_dir is not None:
            shutil.rmtree(self._restore_dir, ignore_errors=True)
        self._restore_dir = tempfile.mkdtemp(prefix=f"restore-{at}-", dir=self.staging_dir)
        for name, buf in parts:
            with open(os.path.join(self._restore_dir, name), "wb") as f:
                f.write(memoryview(buf))
        del parts
        self.last_status = self.checkpoint.read(os.path.join(self._restore_dir, "ckpt"))
        return int(at)

    def restore_or_initialize(self) -> Optional[int]:
        """Restores the newest intact step and returns it; without one, calls ``init_fn``
        (when given) and returns None."""
        at = self.restore()
        if at is None and self.init_fn is not None:
            self.init_fn()
        return at

    # -- the store ------------------------------------------------------------------------

    @property
    def latest_step(self) -> Optional[int]:
        """The newest committed step, or None."""
        return self.store.latest()

    @property
    def steps(self) -> List[int]:
        """Every committed step, oldest first."""
        return [c["step"] for c in self.store.list()]

    def drain(self) -> None:
        """Waits for pending commits (``wait=False``) and for every committed step to reach
        the slowest tier."""
        self.wait()
        self.store.drain()

    def wait(self) -> None:
        """Waits for the pending ``wait=False`` commits."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def close(self, drain: bool = False) -> None:
        """Waits for pending commits, closes the store (``drain=True``: after the drain) and
        removes the staging directory."""
        self.wait()
        self.store.close(drain)
        shutil.rmtree(self.staging_dir, ignore_errors=True)
        self._restore_dir = None

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ringtier.tensorflow.CheckpointManager(tiers={self.store.tiers}, staging={self.staging_dir!r})"


__all__ = ["CheckpointManager", "SaveFuture", "Source", "dataset"]
