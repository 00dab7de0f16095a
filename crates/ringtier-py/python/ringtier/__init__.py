"""ringtier: an io_uring storage engine for deep-learning I/O, from Python.

* :class:`Loader` reads a dataset directory (or its manifest) in seeded, shuffled, sharded
  batches with a bounded prefetch; each :class:`Sample` is the pooled buffer the file was read
  into, shared with numpy and torch without a copy (``numpy.frombuffer(sample, numpy.uint8)``,
  ``torch.frombuffer(sample, dtype=torch.uint8)``).
* :class:`RecordLoader` reads TFRecord and WebDataset (tar) shards: streamed (shards split
  over ranks and workers, a seeded shuffle buffer) or in one global random order through
  per-shard indexes; each :class:`Record` (its :class:`RecordField` s) is shared with numpy and
  torch without a copy, or a :class:`RecordBatch` of them is packed into one buffer.
* :class:`FileReader` reads any files of a dataset by key into one pool of buffers (a
  random-access source's reader: ``ringtier.grain.FileSource``).
* :class:`CheckpointStore` saves dicts of tensors, arrays and bytes (a ``state_dict``) to a
  fast tier, durable when :meth:`~CheckpointStore.save` returns, and drains them to slower
  tiers in the background.
* :mod:`ringtier.torch`: an ``IterableDataset`` for ``DataLoader`` workers and ``torchrun``
  ranks, and a checkpoint store whose steps commit only once every rank's shard is durable.

The engine (a runtime and io_uring driver threads) is created lazily in the process that
uses it. Objects created before a ``fork()`` raise :class:`ForkError` in the child: create
loaders in the process that iterates them (``ringtier.torch.IterableDataset`` does).

:data:`JPEG_DECODER` names the JPEG decoder this build decodes with: ``"libjpeg-turbo"`` in the
published wheels, ``"zune-jpeg"`` in a source build without feature ``turbojpeg``.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional, Sequence

from . import errors
from ._ringtier import (
    JPEG_DECODER,
    Batch,
    Cache,
    Epoch,
    FileBuffer,
    FileReader,
    Loader,
    PartBuffer,
    Record,
    RecordBatch,
    RecordEpoch,
    RecordField,
    RecordLoader,
    Sample,
    SaveFuture,
    __version__,
    doctor,
    metrics_text,
    serve_metrics,
)
from ._types import PathLike, is_s3_url, tier_path
from .checkpoint import CheckpointStore
from .errors import (
    AlreadyExistsError,
    BusyError,
    ClosedError,
    CorruptError,
    ForkError,
    InvalidInputError,
    InvalidKeyError,
    IoError,
    MisalignedError,
    NoSpaceError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    PoolExhaustedError,
    ResourceExhaustedError,
    RingtierError,
    ShutdownError,
    UnsupportedError,
)


class Dataset:
    """The samples of a directory: its ``.ringtier-manifest.tsv`` (written by ``ringtier gen``)
    when it has one, else every file under it; or only ``keys`` when given.

    A dataset is plain data (a path and keys) and can cross ``fork()`` and pickling; the
    :class:`Loader` it makes holds the engine.
    """

    def __init__(self, path: PathLike, keys: Optional[Iterable[str]] = None) -> None:
        self.path = tier_path(path)
        if not is_s3_url(self.path) and not os.path.exists(self.path):
            raise NotFoundError(f"dataset directory {self.path} does not exist")
        self.keys: Optional[Sequence[str]] = list(keys) if keys is not None else None

    def loader(self, **options: object) -> Loader:
        """A :class:`Loader` over this dataset; ``options`` are :class:`Loader`'s."""
        return Loader(self.path, keys=self.keys, **options)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        n = "all" if self.keys is None else len(self.keys)
        return f"ringtier.Dataset({self.path!r}, keys={n})"


__all__ = [
    "AlreadyExistsError",
    "Batch",
    "BusyError",
    "Cache",
    "CheckpointStore",
    "ClosedError",
    "CorruptError",
    "Dataset",
    "Epoch",
    "FileBuffer",
    "FileReader",
    "ForkError",
    "InvalidInputError",
    "InvalidKeyError",
    "IoError",
    "JPEG_DECODER",
    "Loader",
    "MisalignedError",
    "NoSpaceError",
    "NotFoundError",
    "OutOfRangeError",
    "PartBuffer",
    "PermissionDeniedError",
    "PoolExhaustedError",
    "Record",
    "RecordBatch",
    "RecordEpoch",
    "RecordField",
    "RecordLoader",
    "ResourceExhaustedError",
    "RingtierError",
    "Sample",
    "SaveFuture",
    "ShutdownError",
    "UnsupportedError",
    "doctor",
    "errors",
    "metrics_text",
    "serve_metrics",
    "__version__",
]
