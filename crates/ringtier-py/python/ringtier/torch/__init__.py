"""PyTorch integration: ``IterableDataset`` s for ``DataLoader`` workers and ``torchrun``
ranks, and a checkpoint store whose steps commit only once every rank's shard is durable.

The modules, one concept each (every name is also importable from ``ringtier.torch``):

* :mod:`ringtier.torch.data`: :class:`IterableDataset`, the samples of a dataset directory
  (``ringtier.Loader``), each epoch's seeded order split over ``world_size x num_workers``
  shards, so every sample is read exactly once per epoch across ranks and workers;
* :mod:`ringtier.torch.records`: :class:`RecordDataset`, the same for TFRecord and WebDataset
  shards (``ringtier.RecordLoader``), streamed or in a global order through per-shard indexes;
* :mod:`ringtier.torch.images`: :class:`ImageFolder` (torchvision's class-directory layout)
  and the decoded, transformed batches behind every dataset's ``transform=``
  (:mod:`ringtier.transforms`);
* :mod:`ringtier.torch.checkpoint`: the one-process store of torch state dicts
  (:class:`ringtier.CheckpointStore`, :class:`ringtier.SaveFuture`);
* :mod:`ringtier.torch.distributed`: :class:`DistributedCheckpointStore` and its
  :class:`DistributedSaveFuture`: each rank its own store (prefix ``PREFIX/rankNNNNN``) on the
  same tiers; a step commits when rank 0 writes the global manifest (``PREFIX/global``) after
  every rank reported its shard durable, the "metadata last" rule of
  ``torch.distributed.checkpoint``;
* :mod:`ringtier.torch.dcp`: ``StorageWriter`` and ``StorageReader`` for
  ``torch.distributed.checkpoint`` itself (``dcp.save``, ``dcp.async_save``, ``dcp.load``,
  resharding) over the same stores (import it as a module: it is not re-exported here);
* :mod:`ringtier.torch.lightning`: ``RingtierCheckpointIO``, Lightning's ``CheckpointIO`` over
  the store (needs ``lightning``; import it as a module).

The datasets create their loaders inside ``__iter__``, in the process that iterates (a
DataLoader worker after ``fork()``), never inherited. No module of the package imports
``ringtier.torch`` itself: each imports the ones it builds on, so they load in any order.
"""

from __future__ import annotations

# `Loader`, `PathLike`, `CheckpointStore`, `SaveFuture` and the private helpers are imported
# as names of `ringtier.torch` since it was one module: kept importable from here.
from .._ringtier import Loader
from .._types import PathLike
from ..checkpoint import _step
from ._world import rank_world as _rank_world
from .checkpoint import CheckpointStore, SaveFuture
from ._packed import PackedBatch
from .data import IterableDataset, _to_tensor
from .distributed import DistributedCheckpointStore, DistributedSaveFuture
from .images import ImageFolder
from .records import RecordDataset

__all__ = ["ImageFolder", "IterableDataset", "PackedBatch", "DistributedCheckpointStore", "DistributedSaveFuture", "RecordDataset"]
