"""Batches that cross the ``DataLoader`` worker boundary as one tensor.

A ``DataLoader`` worker hands each item it yields to the main process by pickling it; every
tensor inside goes through its own shared-memory segment (created, its descriptor sent over a
socket, mapped on the other side). One segment per sample cost most of the loader's speed with
``num_workers > 0`` (0.22x the 0-worker speed on 16,384 small files). A :class:`PackedBatch`
holds a batch's samples end to end in one tensor, in shared memory in the worker so that
pickling it copies nothing more, plus their offsets (a plain list) and, for samples of one
shape (decoded images), that shape: one segment per batch.

A fresh segment per batch still costs its page faults (first writes to new shared memory run
at a tenth of a copy's speed here), so each worker packs into a :class:`SlotRing` of segments
it reuses: a slot is marked busy in a byte of shared memory (made by the dataset before the
workers fork) while the main process holds any view of that batch, and cleared by a finalizer
when the last one is gone; a worker that finds no free slot packs into a fresh segment.

Sending a segment costs more than the batch at small records: torch passes its file descriptor
through multiprocessing's resource sharer, a socket connection with an authentication
handshake per tensor (a batch crossed in 813 us against 340 us for an item without a tensor,
medians of ``bench/scale/handoff.py`` here). A :class:`PackedBatch` in a slot therefore crosses by reference once
the main process has shown it can: the worker sends its pid and the segment's descriptor
number, and the main process opens ``/proc/PID/fd/N`` (the slot is busy, so the worker keeps
it open until the main process lets go of the batch). The first batch crosses the torch way
with the reference beside it; the main process checks that the reference reaches the same
segment and only then sets the ring's by-reference flag, so where ``/proc`` cannot be opened
every batch keeps crossing the torch way.

Also: the warning, once per process, that the engine has its own I/O threads and that
``num_workers=0`` is the fast setting.
"""

from __future__ import annotations

import ctypes
import itertools
import multiprocessing
import os
import sys
import weakref
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

# The kinds of warning given in this process by copies of datasets without a shared flag.
_warned: set = set()

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

    def __init__(self, kind: str = "workers") -> None:
        import multiprocessing

        self._flag: Any = multiprocessing.Value("b", 0)
        self._kind = kind

    def __getstate__(self) -> dict:
        from multiprocessing import context

        # Inherited by a spawned worker: keep the shared byte; any other pickle: a fresh flag.
        flag = self._flag if context.get_spawning_popen() is not None else None
        if flag is not None and getattr(flag.get_lock(), "_is_fork_ctx", False):
            # Made in a fork context, for a worker a spawn or forkserver context starts, which
            # cannot share it: that worker warns for itself (once per process).
            flag = None
        return {"_flag": flag, "_kind": self._kind}

    def __setstate__(self, state: dict) -> None:
        self._flag = state["_flag"]
        self._kind = state.get("_kind", "workers")

    def warn(self, message: str = WORKERS_WARNING) -> bool:
        """Warns (a ``RuntimeWarning``) unless this flag already did; True when it warned."""
        if self._flag is not None:
            with self._flag.get_lock():  # two workers starting together warn once
                if self._flag.value:
                    return False
                self._flag.value = 1
        elif self._kind in _warned:
            return False
        _warned.add(self._kind)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        return True


def _shared_bytes(n: int) -> torch.Tensor:
    """A uint8 tensor of ``n`` bytes in shared memory (pickled without another copy)."""
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # an older torch: share after the fact (one more copy)
        return torch.empty(n, dtype=torch.uint8).share_memory_()
    return torch.empty(0, dtype=torch.uint8).set_(new_shared(n))


def _sparse_shared_bytes(n: int) -> Optional[torch.Tensor]:
    """A uint8 tensor of ``n`` bytes of shared memory whose pages are allocated only when first
    written (a ``memfd``, mapped shared: inherited through ``fork()``, outside ``/dev/shm`` and
    its size limit); None where there is no ``memfd_create``. Not :func:`_shared_bytes`: torch
    allocates every page of a new shared segment up front (0.1 s and the memory itself for
    308 MB here), for slots that may never be used."""
    import mmap

    create = getattr(os, "memfd_create", None)
    if create is None:
        return None
    try:
        fd = create("ringtier-slots", getattr(os, "MFD_CLOEXEC", 0))
    except OSError:
        return None
    try:
        os.ftruncate(fd, n)
        mapped = mmap.mmap(fd, n, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError:
        return None
    finally:
        os.close(fd)  # the mapping keeps the memory
    return torch.frombuffer(mapped, dtype=torch.uint8)


#: Slots per worker (a transform batch holds one from its decode (depth + 1 in flight) until the
#: main process drops it, with the DataLoader's prefetch in between: 6 ran out), and workers per
#: dataset with a ring (further workers pack into fresh segments).
SLOTS_PER_WORKER = 8
MAX_RING_WORKERS = 64

# The busy flags of every ring made in this process, by token: what a PackedBatch unpickled
# in the main process finds its flag through (the flags themselves are never pickled).
_RINGS: Dict[str, Any] = {}

# Per ring (by token), a byte of shared memory that says its slots may cross by reference: set
# by the main process once it opened a worker's segment through ``/proc``.
_BY_REFERENCE: Dict[str, Any] = {}
_tokens = itertools.count()

# Per ring (by token) whose slots were made before fork() (SlotRing.premake): (the one segment
# holding them, bytes per slot), in the process that made them and every process forked from it.
_PREMADE: Dict[str, Tuple[torch.Tensor, int]] = {}


def _release(token: str, index: int) -> None:
    flags = _RINGS.get(token)
    if flags is not None:
        flags[index] = 0


class SlotRing:
    """Reusable shared-memory segments for one dataset's workers (see the module doc). Made in
    the main process, before ``fork()``; each worker uses slots ``[id * SLOTS_PER_WORKER, (id + 1)
    * SLOTS_PER_WORKER)``. Pickled (a spawned worker, a copy of the dataset) it keeps only its
    token: the flags (and ``by_reference``, whether its slots cross by reference) are shared by
    inheritance through ``fork()`` alone.

    Slots are made by each worker, or (:meth:`premake`, for batches of a known size) by the
    main process before it forks: those outlive the workers, so a worker of the next epoch
    finds them made and faulted in, its exit frees nothing, and a batch in one crosses as its
    slot's index (the main process views its own mapping of the slot)."""

    def __init__(self) -> None:
        self.token = f"{os.getpid()}-{next(_tokens)}"
        self.flags: Any = multiprocessing.RawArray(ctypes.c_byte, SLOTS_PER_WORKER * MAX_RING_WORKERS)
        _RINGS[self.token] = self.flags
        self.by_reference: Any = multiprocessing.RawValue(ctypes.c_byte, 0)
        _BY_REFERENCE[self.token] = self.by_reference
        self._slots: List[Optional[torch.Tensor]] = []
        self._pid = -1
        self._premade: Optional[torch.Tensor] = None
        self._premade_bytes = 0
        self._premade_workers = 0
        self._lock: Any = None

    def __getstate__(self) -> dict:
        return {"token": self.token}

    def __setstate__(self, state: dict) -> None:
        self.token = state["token"]
        self.flags = None
        self.by_reference = None
        self._slots, self._pid = [], -1
        self._premade, self._premade_bytes, self._premade_workers, self._lock = None, 0, 0, None

    def premake(self, slot_bytes: int, workers: int) -> None:
        """In the main process, before a DataLoader forks: the slots of workers ``[0,
        workers)``, ``slot_bytes`` each, as one shared segment (virtual memory: a page costs
        only once a batch is written to it, and then stays for the next epoch's worker; at most
        ``SLOTS_PER_WORKER x slot_bytes`` per worker, the ring's own bound). Batches larger than
        a slot, and further workers, get slots of their own as before."""
        workers = min(int(workers), MAX_RING_WORKERS)
        if self.flags is None or self._premade is not None or slot_bytes <= 0 or workers <= 0:
            return
        segment = _sparse_shared_bytes(slot_bytes * SLOTS_PER_WORKER * workers)
        if segment is None:
            return
        self._premade = segment
        self._premade_bytes, self._premade_workers = int(slot_bytes), workers
        # Two processes with one worker id (two DataLoaders over one dataset at once) share
        # these slots: a slot is claimed under this lock, never by both.
        self._lock = multiprocessing.Lock()
        _PREMADE[self.token] = (self._premade, self._premade_bytes)
        # Gone with the ring (its dataset); a batch still viewing a slot keeps the mapping.
        weakref.finalize(self, _PREMADE.pop, self.token, None)

    def _take_premade(self, worker: int) -> Optional[Tuple[torch.Tensor, int]]:
        assert self._premade is not None and self._lock is not None
        with self._lock:
            for j in range(SLOTS_PER_WORKER):
                index = worker * SLOTS_PER_WORKER + j
                if not self.flags[index]:
                    self.flags[index] = 1
                    at = index * self._premade_bytes
                    return self._premade[at : at + self._premade_bytes], index
        return None

    def take(self, worker: int, nbytes: int, headroom: bool = True) -> Optional[Tuple[torch.Tensor, int]]:
        """A free slot of ``worker`` holding at least ``nbytes`` (grown when smaller: by a
        quarter more with ``headroom``, for batches whose size varies), marked busy, and its
        index; None when the ring is not shared with this process or every slot is busy.

        The first free slot is taken, not the next in turn: a worker then touches only as many
        slots as it has batches in flight at once (about ``prefetch_factor`` + 1), and every
        slot is a segment whose pages are faulted in once (a batch of 64 float32 224x224 images
        is 38 MB: 9,400 page faults); taken in turn, all of them were, in every worker."""
        if self.flags is None or worker >= MAX_RING_WORKERS:
            return None
        if worker < self._premade_workers and nbytes <= self._premade_bytes:
            return self._take_premade(worker)
        if self._pid != os.getpid():  # a new worker: its own segments
            self._slots, self._pid = [None] * SLOTS_PER_WORKER, os.getpid()
        for j in range(SLOTS_PER_WORKER):
            index = worker * SLOTS_PER_WORKER + j
            if self.flags[index]:
                continue
            slot = self._slots[j]
            if slot is None or slot.numel() < nbytes:
                slot = _shared_bytes(max(nbytes + (nbytes // 4 if headroom else 0), 1))
                self._slots[j] = slot
            self.flags[index] = 1
            return slot, index
        return None


class _Lease:
    """Which ring slot a batch's memory is (worker side, pickled with the batch), and where
    the main process can open the slot's segment: (worker pid, descriptor number, segment
    bytes), set when the batch is pickled."""

    __slots__ = ("token", "index", "ref")

    def __init__(self, token: str, index: int) -> None:
        self.token, self.index = token, index
        self.ref: Optional[Tuple[int, int, int]] = None


class _OpenedFd:
    """A descriptor in the shape torch's ``rebuild_storage_fd`` takes (``detach()``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def detach(self) -> int:
        return self.fd


def _segment_ref(data: torch.Tensor) -> Optional[Tuple[int, int, int]]:
    """(pid, descriptor, bytes) of the shared segment ``data`` starts, in this process; None
    where it is not a descriptor-backed segment viewed from its start."""
    if data.storage_offset() != 0:
        return None
    try:
        fd, size = data.untyped_storage()._share_fd_cpu_()
    except (RuntimeError, AttributeError):  # another sharing strategy, another torch
        return None
    return os.getpid(), int(fd), int(size)


def _open_segment(ref: Tuple[int, int, int]) -> torch.UntypedStorage:
    """The segment a worker's descriptor holds, opened through ``/proc`` and mapped (or the
    mapping of it this process already has)."""
    from torch.multiprocessing.reductions import rebuild_storage_fd

    pid, fd, size = ref
    own = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    return rebuild_storage_fd(torch.UntypedStorage, _OpenedFd(own), size)  # closes `own`


def _prove_reference(lease: _Lease, data: torch.Tensor) -> None:
    """Sets the ring's by-reference flag once the reference of a batch that crossed the torch
    way opens the very segment it came in (main process)."""
    flag = _BY_REFERENCE.get(lease.token)
    if flag is None or flag.value or lease.ref is None or data.numel() == 0:
        return
    from torch.multiprocessing.reductions import fd_id

    try:
        theirs = _open_segment(lease.ref)
        if fd_id(theirs._share_fd_cpu_()[0]) == fd_id(data.untyped_storage()._share_fd_cpu_()[0]):
            flag.value = 1
    except (OSError, RuntimeError, AttributeError, ImportError):
        pass  # no /proc, another sharing strategy: batches keep crossing the torch way


class PackedBatch:
    """A batch of uint8 samples in one tensor: ``data`` holds them end to end, sample ``i`` is
    ``data[offsets[i]:offsets[i + 1]]``; with ``shape`` every sample has that shape (decoded
    images, ``(H, W, 3)``) and :meth:`tensor` is the ``(N, *shape)`` batch without a copy.

    Behaves as the list of samples it replaces: ``len(batch)``, ``batch[i]`` and iteration
    give each sample as a tensor viewing ``data`` (``(key, tensor)`` when made with keys).
    ``pin_memory()`` (what ``DataLoader(pin_memory=True)`` calls) pins ``data`` once for the
    whole batch. Deliberately not a ``collections.abc.Sequence``: the ``DataLoader`` would
    unpack one into a list of tensors, one shared-memory segment each."""

    __slots__ = ("data", "offsets", "shape", "keys", "_lease")

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
        self._lease: Optional[_Lease] = None

    def __getstate__(self) -> dict:
        state = {"data": self.data, "offsets": self.offsets, "shape": self.shape, "keys": self.keys,
                 "lease": self._lease}
        lease = self._lease
        if lease is not None and self.data.numel() > 0:
            lease.ref = _segment_ref(self.data)
            flag = _BY_REFERENCE.get(lease.token)
            if lease.ref is not None and flag is not None and flag.value:
                state["data"], state["nbytes"] = None, self.data.numel()  # the slot by reference
        return state

    def __setstate__(self, state: dict) -> None:
        self.offsets, self.shape, self.keys = state["offsets"], state["shape"], state["keys"]
        self._lease = None
        data, lease = state["data"], state["lease"]
        if data is None:
            # By reference: the worker keeps the slot open while it is busy (see the module doc).
            storage = _open_segment(lease.ref)
            data = torch.empty(0, dtype=torch.uint8).set_(storage)[: state["nbytes"]]
        elif lease is not None:
            _prove_reference(lease, data)
        if lease is not None and lease.token in _RINGS and data.numel() > 0:
            # The slot is free again once no view of this memory is left: every view made
            # from here on holds `arr`, whose finalizer clears the slot's busy flag.
            arr = data.numpy()
            weakref.finalize(arr, _release, lease.token, lease.index)
            data = torch.frombuffer(arr, dtype=torch.uint8)
        elif lease is not None:
            _release(lease.token, lease.index)
        self.data = data

    @classmethod
    def pack(
        cls,
        tensors: Sequence[torch.Tensor],
        keys: Optional[List[str]] = None,
        shared: bool = True,
        ring: Optional[SlotRing] = None,
        worker: int = 0,
    ) -> "PackedBatch":
        """Copies ``tensors`` (uint8) end to end into one tensor: a free slot of ``ring`` for
        ``worker``, else fresh shared memory (``shared``), else process memory. They keep a
        common ``shape`` when they all have one."""
        offsets = [0]
        for t in tensors:
            offsets.append(offsets[-1] + t.numel())
        total = offsets[-1]
        taken = ring.take(worker, total) if ring is not None and shared and total > 0 else None
        if taken is not None:
            data = taken[0][:total]
        else:
            data = _shared_bytes(total) if shared and total > 0 else torch.empty(total, dtype=torch.uint8)
        if tensors and total > 0:
            torch.cat([t.reshape(-1) for t in tensors], out=data)
        shape: Optional[Tuple[int, ...]] = None
        if tensors:
            first = tuple(tensors[0].shape)
            if len(first) > 1 and all(tuple(t.shape) == first for t in tensors):
                shape = first
        batch = cls(data, offsets, shape, keys)
        if taken is not None and ring is not None:
            batch._lease = _Lease(ring.token, taken[1])
        return batch

    @classmethod
    def pack_buffers(
        cls,
        buffers: Sequence[Any],
        keys: Optional[List[str]] = None,
        ring: Optional[SlotRing] = None,
        worker: int = 0,
    ) -> "PackedBatch":
        """Like :meth:`pack`, from objects with the buffer protocol (a loader's samples, records,
        record fields; ``b""`` for none): each one's bytes copied once, straight into the batch's
        shared memory, without a tensor per sample (what costs most in a worker at hundreds of
        thousands of samples a second)."""
        views = []
        offsets = [0]
        for b in buffers:
            v = memoryview(b)
            if v.ndim != 1 or v.format != "B":
                v = v.cast("B")
            views.append(v)
            offsets.append(offsets[-1] + v.nbytes)

        def fill(dst: memoryview) -> List[int]:
            for v, o in zip(views, offsets):
                dst[o : o + v.nbytes] = v
            return offsets

        return cls.filled(offsets[-1], fill, keys, ring=ring, worker=worker)

    @classmethod
    def filled(
        cls,
        nbytes: int,
        fill: Callable[[memoryview], Sequence[int]],
        keys: Optional[List[str]] = None,
        ring: Optional[SlotRing] = None,
        worker: int = 0,
    ) -> "PackedBatch":
        """A batch of ``nbytes`` bytes that ``fill`` writes: it is given the batch's memory (a
        writable ``memoryview`` of exactly ``nbytes``: a free slot of ``ring`` for ``worker``,
        else fresh shared memory) and returns the samples' offsets. What a loader that packs
        its samples itself uses (``RecordBatch.pack_into``): the bytes go straight into the
        memory that crosses to the main process, with no Python object per sample."""
        taken = ring.take(worker, nbytes) if ring is not None and nbytes > 0 else None
        if taken is not None:
            data = taken[0][:nbytes]
        else:
            data = _shared_bytes(nbytes) if nbytes > 0 else torch.empty(0, dtype=torch.uint8)
        try:
            batch = cls(data, fill(memoryview(data.numpy())), None, keys)
        except BaseException:
            if taken is not None and ring is not None and ring.flags is not None:
                ring.flags[taken[1]] = 0  # the slot was never handed out
            raise
        if taken is not None and ring is not None:
            batch._lease = _Lease(ring.token, taken[1])
        return batch

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


def _premade_slot(token: str, index: int, nbytes: int) -> Optional[torch.Tensor]:
    """This process's view of the first ``nbytes`` of slot ``index`` of a ring whose slots were
    made before fork(); None when they were not (or not that slot)."""
    made = _PREMADE.get(token)
    if made is None:
        return None
    segment, slot_bytes = made
    at = index * slot_bytes
    if nbytes > slot_bytes or at + slot_bytes > segment.numel():
        return None
    return segment[at : at + nbytes]


def _rebuild_premade(token: str, index: int, nbytes: int, dtype: str, shape: Tuple[int, ...]) -> torch.Tensor:
    """The main process's side of a :class:`LeasedTensor` in a slot made before fork(): its own
    mapping of the slot, freed for the worker when the last view of it is gone."""
    data = _premade_slot(token, index, nbytes)
    if data is None:
        raise RuntimeError(
            f"ringtier: a worker's batch is in slot {index} of ring {token}, which this process does not share "
            "(the batch was sent to a process not forked from the dataset's)"
        )
    return _rebuild_leased(data, token, index, dtype, shape)


def _rebuild_leased(data: torch.Tensor, token: str, index: int, dtype: str, shape: Tuple[int, ...]) -> torch.Tensor:
    """The main process's side of :class:`LeasedTensor`: a plain tensor over the worker's slot,
    the slot freed for the worker when the last view of it is gone."""
    kind = getattr(torch, dtype)
    if token in _RINGS and data.numel() > 0:
        arr = data.numpy()
        weakref.finalize(arr, _release, token, index)
        return torch.frombuffer(arr, dtype=kind).view(shape)
    _release(token, index)
    return data.view(kind).view(shape)


class LeasedTensor:
    """A batch a DataLoader worker made in one of its :class:`SlotRing` slots (transformed
    images decoded straight into shared memory), on its way to the main process: it unpickles
    there as a plain ``torch.Tensor`` of ``shape`` and ``dtype`` viewing the slot, without a
    copy, and the slot is the worker's again once no view of that tensor is left."""

    __slots__ = ("data", "token", "index", "dtype", "shape")

    def __init__(self, data: torch.Tensor, token: str, index: int, dtype: str, shape: Tuple[int, ...]) -> None:
        self.data, self.token, self.index, self.dtype, self.shape = data, token, index, dtype, tuple(shape)

    def __reduce__(self) -> Any:
        nbytes = self.data.numel()
        made = _premade_slot(self.token, self.index, nbytes)
        if made is not None and nbytes > 0 and made.data_ptr() == self.data.data_ptr():
            # A slot made before fork(): the main process has it mapped already.
            return (_rebuild_premade, (self.token, self.index, nbytes, self.dtype, self.shape))
        return (_rebuild_leased, (self.data, self.token, self.index, self.dtype, self.shape))

    def tensor(self) -> torch.Tensor:
        """The batch as a tensor (in the worker: a view of the slot)."""
        return self.data.view(getattr(torch, self.dtype)).view(self.shape)


def _rebuild_inline(data: bytes, dtype: str, shape: Tuple[int, ...]) -> torch.Tensor:
    kind = getattr(torch, dtype)
    if not data:
        return torch.empty(shape, dtype=kind)
    return torch.frombuffer(bytearray(data), dtype=kind).view(shape)


class InlineTensor:
    """A small tensor (a batch's labels) on its way from a DataLoader worker, carried inside the
    message as its bytes; it unpickles as a plain tensor. torch would instead move it into a
    shared-memory segment of its own and pass the segment's descriptor through
    multiprocessing's resource sharer: a server thread each worker starts for its first batch
    (30-50 ms before the first batch reached the main process on 2 cores) and a connection
    with an authentication handshake for every tensor."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __reduce__(self) -> Any:
        t = self.tensor.detach().contiguous()
        return (_rebuild_inline, (t.numpy().tobytes(), str(t.dtype).replace("torch.", ""), tuple(t.shape)))


def lease(ring: Optional[SlotRing], worker: int, dtype: torch.dtype, shape: Tuple[int, ...]) -> Optional[Tuple[torch.Tensor, Any]]:
    """A free slot of ``ring`` for ``worker`` as a tensor of ``dtype`` and ``shape`` to fill,
    and a function that turns the first ``n`` rows of it into the :class:`LeasedTensor` to yield;
    None when there is no ring or no free slot."""
    if ring is None:
        return None
    item = torch.empty((), dtype=dtype).element_size()
    nbytes = item
    for d in shape:
        nbytes *= d
    taken = ring.take(worker, max(nbytes, 1), headroom=False)  # every full batch is this size
    if taken is None:
        return None
    slot, index = taken
    out = slot[:nbytes].view(dtype).view(shape)
    per_row = nbytes // shape[0] if shape and shape[0] else 0
    name = str(dtype).replace("torch.", "")

    def finish(n: int) -> LeasedTensor:
        return LeasedTensor(slot[: n * per_row], ring.token, index, name, (n,) + tuple(shape[1:]))

    return out, finish


def picklable_state(obj: Any, loader_attr: str) -> Dict[str, Any]:
    """A dataset's ``__getstate__``: its attributes without this process's loader (set to
    None) and transform pipeline, which every process (a spawned worker, a copy) makes for
    itself."""
    state = dict(obj.__dict__)
    state[loader_attr] = None
    state.pop("_pipeline", None)
    return state


def local_ranks() -> int:
    """The ranks of this job on this machine (``LOCAL_WORLD_SIZE``, as torchrun sets it; 1
    without it)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def rank_cores() -> int:
    """The cores this rank's processes (it and its DataLoader workers) may run on: its CPU
    affinity; where that is the whole machine and several ranks share it
    (``LOCAL_WORLD_SIZE``), this rank's share."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 2
    if cores >= (os.cpu_count() or cores):
        # Not pinned by the launcher: the node's ranks share every core.
        cores = max(1, cores // local_ranks())
    return max(1, cores)


def worker_cores(workers: Optional[int] = None) -> int:
    """The cores this process may run on: :func:`rank_cores`, split over the DataLoader's
    workers in a worker (over ``workers`` of them where given: the ones that work)."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if workers is None:
        workers = info.num_workers if info is not None else 1
    return max(1, rank_cores() // max(1, workers))


#: The runtime threads of a process's engine when nothing says otherwise (ringtier-py's
#: engine.rs); a worker or a rank gets fewer when its share of the cores is smaller.
ENGINE_THREADS = 2


def fit_engine_to_worker(workers: Optional[int] = None) -> None:
    """Before a process's engine starts, in a DataLoader worker or in one of several ranks on a
    machine: the engine's runtime threads fit the process's share of the cores
    (``RINGTIER_ENGINE_THREADS``, read once when a process's engine starts; a value the user
    set wins). ``workers``: the workers that share the cores, where not all of them work (see
    :func:`worker_cores`)."""
    from torch.utils.data import get_worker_info

    if "RINGTIER_ENGINE_THREADS" in os.environ or (get_worker_info() is None and local_ranks() == 1):
        return
    os.environ["RINGTIER_ENGINE_THREADS"] = str(min(ENGINE_THREADS, worker_cores(workers)))


def dataloader_batches() -> Optional[bool]:
    """In a DataLoader worker, called from a dataset's ``__iter__`` body: whether the
    DataLoader batches the items itself (``batch_size=N``, one crossing per batch) or sends
    each on its own (``batch_size=None``); None when it cannot be told (then nothing is
    refused)."""
    f = sys._getframe(1)
    for _ in range(8):
        f = f.f_back  # type: ignore[assignment]
        if f is None:
            return None
        fetcher = f.f_locals.get("self")
        if fetcher is not None and hasattr(fetcher, "auto_collation") and hasattr(fetcher, "dataset_iter"):
            return bool(fetcher.auto_collation)
    return None


__all__ = [
    "InlineTensor",
    "LeasedTensor",
    "PackedBatch",
    "SlotRing",
    "WORKERS_WARNING",
    "WarnOnce",
    "dataloader_batches",
    "fit_engine_to_worker",
    "local_ranks",
    "picklable_state",
    "lease",
    "rank_cores",
    "worker_cores",
]
