"""Batches that cross the ``DataLoader`` worker boundary as one tensor.

A ``DataLoader`` worker hands each item it yields to the main process by pickling it; every
tensor inside goes through its own shared-memory segment (created, its descriptor sent over a
socket, mapped on the other side). One segment per sample cost most of the loader's speed with
``num_workers > 0`` (0.22x the 0-worker speed on 16,384 small files). A :class:`PackedBatch`
holds a batch's samples end to end in one tensor, allocated in shared memory in the worker so
that pickling it copies nothing more, plus their offsets (a plain list) and, for samples of one
shape (decoded images), that shape: one segment per batch.

Also: the warning, once per process, that the engine has its own I/O threads and that
``num_workers=0`` is the fast setting.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import torch

_warned = False

WORKERS_WARNING = (
    "ringtier: this dataset runs in a DataLoader worker (num_workers > 0). ringtier's engine has "
    "its own I/O and decode threads in every process: num_workers=0 is the fast setting (the "
    "workers add a copy of every batch into shared memory and compete for the same cores). "
    "Batches cross the worker boundary packed (one tensor per batch); give the dataset "
    "batch_size=N and the DataLoader batch_size=None, or samples cross one by one."
)


class WarnOnce:
    """A flag shared with the ``DataLoader`` workers a dataset forks (one byte of shared memory
    made with the dataset), so that the warning comes once per dataset, not once per worker
    and epoch. Pickled outside process start-up (a copy of the dataset), it starts unset."""

    def __init__(self) -> None:
        import multiprocessing

        self._flag: Any = multiprocessing.Value("b", 0)

    def __getstate__(self) -> dict:
        from multiprocessing import context

        # Inherited by a spawned worker: keep the shared byte; any other pickle: a fresh flag.
        return {"_flag": self._flag if context.get_spawning_popen() is not None else None}

    def __setstate__(self, state: dict) -> None:
        self._flag = state["_flag"]

    def warn(self, message: str = WORKERS_WARNING) -> bool:
        """Warns (a ``RuntimeWarning``) unless this flag already did; True when it warned."""
        global _warned
        if self._flag is not None:
            with self._flag.get_lock():  # two workers starting together warn once
                if self._flag.value:
                    return False
                self._flag.value = 1
        elif _warned:
            return False
        _warned = True
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        return True


def _shared_bytes(n: int) -> torch.Tensor:
    """A uint8 tensor of ``n`` bytes in shared memory (pickled without another copy)."""
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # an older torch: share after the fact (one more copy)
        return torch.empty(n, dtype=torch.uint8).share_memory_()
    return torch.empty(0, dtype=torch.uint8).set_(new_shared(n))


class PackedBatch:
    """A batch of uint8 samples in one tensor: ``data`` holds them end to end, sample ``i`` is
    ``data[offsets[i]:offsets[i + 1]]``; with ``shape`` every sample has that shape (decoded
    images, ``(H, W, 3)``) and :meth:`tensor` is the ``(N, *shape)`` batch without a copy.

    Behaves as the list of samples it replaces: ``len(batch)``, ``batch[i]`` and iteration
    give each sample as a tensor viewing ``data`` (``(key, tensor)`` when made with keys).
    ``pin_memory()`` (what ``DataLoader(pin_memory=True)`` calls) pins ``data`` once for the
    whole batch. Deliberately not a ``collections.abc.Sequence``: the ``DataLoader`` would
    unpack one into a list of tensors, one shared-memory segment each."""

    __slots__ = ("data", "offsets", "shape", "keys")

    def __init__(
        self,
        data: torch.Tensor,
        offsets: Sequence[int],
        shape: Optional[Tuple[int, ...]] = None,
        keys: Optional[List[str]] = None,
    ) -> None:
        if data.dtype != torch.uint8 or data.dim() != 1:
            raise TypeError(f"PackedBatch data must be a 1-D uint8 tensor, not {data.dtype} of {data.dim()} dims")
        offsets = list(offsets)
        if not offsets or offsets[0] != 0 or offsets[-1] != data.numel():
            raise ValueError(f"offsets must start at 0 and end at the data's {data.numel()} bytes")
        if any(b < a for a, b in zip(offsets, offsets[1:])):
            raise ValueError("offsets must not decrease")
        if keys is not None and len(keys) != len(offsets) - 1:
            raise ValueError(f"{len(keys)} keys for {len(offsets) - 1} samples")
        self.data = data
        self.offsets = offsets
        self.shape = tuple(shape) if shape is not None else None
        self.keys = keys

    @classmethod
    def pack(cls, tensors: Sequence[torch.Tensor], keys: Optional[List[str]] = None, shared: bool = True) -> "PackedBatch":
        """Copies ``tensors`` (uint8) end to end into one tensor (in shared memory when
        ``shared``). They keep a common ``shape`` when they all have one."""
        offsets = [0]
        for t in tensors:
            offsets.append(offsets[-1] + t.numel())
        total = offsets[-1]
        data = _shared_bytes(total) if shared and total > 0 else torch.empty(total, dtype=torch.uint8)
        if tensors and total > 0:
            torch.cat([t.reshape(-1) for t in tensors], out=data)
        shape: Optional[Tuple[int, ...]] = None
        if tensors:
            first = tuple(tensors[0].shape)
            if len(first) > 1 and all(tuple(t.shape) == first for t in tensors):
                shape = first
        return cls(data, offsets, shape, keys)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def sample(self, i: int) -> torch.Tensor:
        """Sample ``i`` as a tensor viewing ``data`` (its ``shape`` when the batch has one)."""
        n = len(self)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"batch index {i} out of range ({n} samples)")
        t = self.data[self.offsets[j] : self.offsets[j + 1]]
        return t.view(self.shape) if self.shape is not None else t

    def __getitem__(self, i: int) -> Any:
        t = self.sample(i)
        return (self.keys[i], t) if self.keys is not None else t

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def tensors(self) -> List[torch.Tensor]:
        """Every sample, as views."""
        return [self.sample(i) for i in range(len(self))]

    def tensor(self) -> torch.Tensor:
        """The batch as one ``(N, *shape)`` tensor viewing ``data`` (samples of one shape only)."""
        if self.shape is None:
            raise ValueError("the samples of this batch have different lengths: use batch[i] or offsets")
        return self.data.view((len(self),) + self.shape)

    def pin_memory(self, device: Any = None) -> "PackedBatch":
        """The batch with ``data`` in pinned (page-locked) host memory."""
        data = self.data.pin_memory(device) if device is not None else self.data.pin_memory()
        return PackedBatch(data, self.offsets, self.shape, self.keys)

    def __repr__(self) -> str:
        shape = f", shape={self.shape}" if self.shape is not None else ""
        return f"ringtier.torch.PackedBatch(samples={len(self)}, bytes={self.data.numel()}{shape})"


__all__ = ["PackedBatch", "WORKERS_WARNING", "WarnOnce"]
