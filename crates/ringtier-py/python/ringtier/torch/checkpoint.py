"""Checkpoints of one process's torch state: :class:`ringtier.CheckpointStore` saves a
``state_dict`` (tensors written from their own memory; dtype, bfloat16 included, shape and key
order kept) durably to a fast tier and drains it to slower ones; ``async_save`` returns a
:class:`ringtier.SaveFuture` once the state is copied. ``ringtier.torch.distributed`` builds
the ``torchrun`` store on it, one such store per rank."""

from __future__ import annotations

from .._ringtier import SaveFuture
from ..checkpoint import CheckpointStore

__all__ = ["CheckpointStore", "SaveFuture"]
