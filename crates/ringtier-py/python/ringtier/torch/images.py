"""``ringtier.torch.ImageFolder`` and the transformed batches behind every dataset's
``transform=``: encoded images in, ``(n, 3, S, S)`` tensors out, decoded and transformed in
Rust threads (:mod:`ringtier.transforms`) a few batches ahead of the training loop.

Each batch is one buffer shared with torch without a copy: the pipeline's own memory, or, when
CUDA is available (``pin_memory=None`` asks ``torch.cuda.is_available()``), a pinned tensor from
torch's pinned allocator that the pipeline decodes into, ready for ``.cuda(non_blocking=True)``.
"""

from __future__ import annotations

import collections
import os
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import IterableDataset as _TorchIterable
from torch.utils.data import get_worker_info

from .._ringtier import Loader, TransformPipeline
from .._fields import image_of, label_of_record
from .._types import PathLike
from ..errors import CorruptError, InvalidInputError, NotFoundError
from ..transforms import compile_transform
from ._packed import (
    InlineTensor,
    SlotRing,
    WarnOnce,
    fit_engine_to_worker,
    lease,
    picklable_state,
    rank_cores,
    worker_cores,
)
from ._world import rank_world

#: torchvision's ``IMG_EXTENSIONS``: the files ``ImageFolder`` lists (ringtier decodes JPEG).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

#: Cores of a rank per decoding DataLoader worker of :class:`ImageFolder` (with a transform).
#: One process decodes on as many Rust threads as it has cores; what limits it is the hand-off
#: of its batches to the main process, one per ``batch_size`` images: 365 us a batch from a
#: worker's slot by reference, 813 us the torch way (``bench/scale/handoff.py``, on 2 cores),
#: so 1,200-2,700 batches of 64 (79,000-175,000 images) per second, against about 1,000
#: images/s a core decodes for the ImageNet training chain. Each further decoding process
#: costs its own loader, pool and pipeline start every epoch.
CORES_PER_DECODING_WORKER = 64


def check_active_workers(active_workers: Optional[int]) -> Optional[int]:
    """``active_workers`` (a positive int or None), checked."""
    if active_workers is not None and (
        isinstance(active_workers, bool) or not isinstance(active_workers, int) or active_workers < 1
    ):
        raise InvalidInputError(f"active_workers must be a positive int or None, not {active_workers!r}")
    return active_workers


def decoding_workers_of(num_workers: int, active_workers: Optional[int]) -> int:
    """Of ``num_workers`` DataLoader workers of a dataset with a transform, how many decode (the
    rest stay idle): ``active_workers``, or one per :data:`CORES_PER_DECODING_WORKER` of this
    rank's cores; at most ``num_workers``."""
    if num_workers <= 1:
        return max(1, num_workers)
    return max(1, min(num_workers, wanted_decoding_workers(active_workers)))


def wanted_decoding_workers(active_workers: Optional[int]) -> int:
    """``active_workers``, or one per :data:`CORES_PER_DECODING_WORKER` of this rank's cores."""
    return active_workers if active_workers is not None else -(-rank_cores() // CORES_PER_DECODING_WORKER)


def premake_slots(ring: SlotRing, pipeline: TransformPipeline, batch: int, active_workers: Optional[int]) -> None:
    """The decoding workers' slots for ``batch`` images from ``pipeline``, made now, in the
    main process before a DataLoader forks (see :meth:`SlotRing.premake`)."""
    item = 4 if pipeline.dtype == "float32" else 1
    ring.premake(batch * 3 * pipeline.size * pipeline.size * item, wanted_decoding_workers(active_workers))


def warn_idle(flag: WarnOnce, what: str, num_workers: int, active: int) -> None:
    """The one warning that ``num_workers - active`` of a dataset's workers stay idle."""
    flag.warn(
        f"{what}: {num_workers} DataLoader workers on {rank_cores()} cores: "
        f"{active} decode{'s' if active == 1 else ''} on {worker_cores(active)} threads "
        f"{'each ' if active > 1 else ''}and {num_workers - active} stay idle (one decoding "
        f"process per {CORES_PER_DECODING_WORKER} cores; more only add their start-up); "
        f"num_workers={active} does the same without the idle ones, active_workers= changes it"
    )


def stays_idle(ds: Any, what: str) -> bool:
    """In a DataLoader worker of ``ds`` (a dataset with a transform): whether this worker stays
    idle (its id past the decoding workers); the first idle worker warns, once per dataset."""
    info = get_worker_info()
    if info is None:
        return False
    active = decoding_workers_of(info.num_workers, ds.active_workers)
    if info.id < active:
        return False
    if info.id == active:
        warn_idle(ds._idle_warning, what, info.num_workers, active)
    return True


def default_threads() -> int:
    """Decode threads per process: the cores this process may use, split over DataLoader workers."""
    return worker_cores()


def resolve_pin(pin_memory: Optional[bool]) -> bool:
    """Whether batches go to pinned memory: ``None`` means when CUDA is available."""
    if pin_memory is None:
        return bool(torch.cuda.is_available())
    if pin_memory and not torch.cuda.is_available():
        raise InvalidInputError("pin_memory=True needs CUDA (torch.cuda.is_available() is False)")
    return bool(pin_memory)


def pipeline_for(transform: Any, seed: int, threads: Optional[int]) -> TransformPipeline:
    """This process's pipeline for ``transform`` (threads created here, after any fork)."""
    return compile_transform(transform, seed=seed, threads=threads or default_threads())


def transformed(
    pipeline: TransformPipeline,
    batches: Iterable[Tuple[List[Any], Sequence[int], Any]],
    epoch: int,
    *,
    depth: int = 2,
    pin_memory: bool = False,
    on_bad: str = "skip",
    pixels: bool = False,
    ring: Any = None,
) -> Iterator[Tuple[Any, List[int], Any]]:
    """Decodes and transforms ``batches`` of ``(encoded images, indices, extra)`` with up to
    ``depth`` batches in flight; yields ``(images, kept indices, extra)``, images ``(n, 3, S,
    S)``. A sample that fails to decode is left out (``on_bad="skip"``) or raises
    :class:`ringtier.CorruptError` (``"fail"``). ``pixels=True``: the items are a
    materialized split point's stored pixels (decoded samples, ``(side, side, 3)``), and only
    the steps after it run.

    ``ring`` (a :class:`SlotRing`, in a DataLoader worker): each batch is decoded straight into
    one of the worker's shared-memory slots and yielded as a :class:`LeasedTensor`, which
    reaches the main process as a plain tensor without a copy (a fresh segment, as before, when
    every slot is busy)."""
    if on_bad not in ("skip", "fail"):
        raise InvalidInputError(f'on_bad must be "skip" or "fail", not {on_bad!r}')
    dtype = torch.float32 if pipeline.dtype == "float32" else torch.uint8
    size = pipeline.size
    flight: Deque[Tuple[Any, Optional[torch.Tensor], Any, Any]] = collections.deque()
    info = get_worker_info() if ring is not None else None

    def finish() -> Optional[Tuple[Any, List[int], Any]]:
        pending, out, extra, leased = flight.popleft()
        done = pending.wait()
        if done.failed and on_bad == "fail":
            index, why = done.failed[0]
            raise CorruptError(f"sample {index}: {why}")
        n = done.shape[0]
        if n == 0:
            return None
        images: Any
        if leased is not None:
            images = leased(n)
        elif out is not None:
            images = out[:n]
        else:
            images = torch.frombuffer(done, dtype=dtype).view(done.shape)
        return images, list(done.indices), extra

    for items, indices, extra in batches:
        if not items:
            continue
        out = None
        leased = None
        shape = (len(items), 3, size, size)
        taken = lease(ring, info.id, dtype, shape) if info is not None else None
        if taken is not None:
            out, leased = taken
        elif pin_memory:
            out = torch.empty(shape, dtype=dtype, pin_memory=True)
        side = int(items[0].shape[0]) if pixels else None
        pending = pipeline.submit(
            items, [int(i) for i in indices], epoch, out.numpy() if out is not None else None, pixels=side
        )
        flight.append((pending, out, extra, leased))
        if len(flight) > depth:
            got = finish()
            if got is not None:
                yield got
    while flight:
        got = finish()
        if got is not None:
            yield got


def check_transform(
    transform: Any, decode: Optional[int], batch: int, hold: Optional[int], seed: int
) -> Tuple[int, TransformPipeline]:
    """Checks a file dataset's ``transform=`` (compiles it once) and returns the loader's
    ``hold`` (the raw samples Python keeps while batches decode) and the compiled pipeline."""
    if decode is not None:
        raise InvalidInputError("transform= decodes the images itself: leave decode=None")
    pipeline = compile_transform(transform, seed=seed, threads=1)
    return (hold if hold is not None else batch * 3), pipeline


def process_pipeline(ds: Any) -> TransformPipeline:
    """The dataset ``ds``'s pipeline in this process (made here, after any fork), on this
    process's share of the cores (in a worker: split over the decoding workers)."""
    pid = os.getpid()
    cached = getattr(ds, "_pipeline", None)
    if cached is None or cached[0] != pid:
        info = get_worker_info()
        threads = worker_cores(decoding_workers_of(info.num_workers, ds.active_workers)) if info is not None else None
        cached = (pid, pipeline_for(ds.transform, int(ds.options.get("seed", 0)), threads))
        ds._pipeline = cached
    return cached[1]


def iterate_files(ds: Any) -> Iterator[Any]:
    """``ringtier.torch.IterableDataset.__iter__`` with ``transform=``: image batches (with
    ``with_keys``, ``(keys, images)``). With ``materialize=``, the loader yields the split
    point's pixels (stored, or decoded and stored now) and the pipeline runs the rest."""
    if stays_idle(ds, "ringtier.torch.IterableDataset"):
        return
    pipeline = process_pipeline(ds)
    loader = ds.loader()
    keys = loader.keys() if ds.with_keys else None
    raw = ((list(b), b.indices, None) for b in loader.epoch(ds.epoch, ds.position))
    pin = resolve_pin(ds.pin_memory)
    pixels = "materialize" in ds.options
    ring = ds._ring if get_worker_info() is not None else None
    for images, kept, _ in transformed(pipeline, raw, ds.epoch, pin_memory=pin, pixels=pixels, ring=ring):
        yield ([keys[i] for i in kept], images) if keys is not None else images




def check_record_transform(transform: Any, batch_size: int, seed: int) -> TransformPipeline:
    """Checks a record dataset's ``transform=`` and ``batch_size``; the compiled pipeline."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInputError(f"batch_size must be a positive int, not {batch_size!r}")
    return compile_transform(transform, seed=seed, threads=1)


def iterate_records(ds: Any) -> Iterator[Any]:
    """``ringtier.torch.RecordDataset.__iter__`` with ``transform=``: ``(images, labels)``
    batches of WebDataset samples, image batches of TFRecords (keys first with ``with_keys``)."""
    if stays_idle(ds, "ringtier.torch.RecordDataset"):
        return
    loader = ds.loader()
    pipeline = process_pipeline(ds)
    wds = ds.format != "tfrecord"
    labelled = wds and ds.label_field is not None

    def batches() -> Iterator[Tuple[List[Any], List[int], Dict[int, Tuple[str, int]]]]:
        items: List[Any] = []
        indices: List[int] = []
        extra: Dict[int, Tuple[str, int]] = {}
        for record in loader.epoch(ds.epoch, ds.position):
            index = (record.shard << 40) | record.offset
            items.append(image_of(record, ds.image_field) if wds else record)
            indices.append(index)
            key = record.key or f"{record.shard_key}:{record.offset}"
            extra[index] = (key, label_of_record(record, ds.label_field) if labelled else -1)
            if len(items) == ds.batch_size:
                yield items, indices, extra
                items, indices, extra = [], [], {}
        if items:
            yield items, indices, extra

    pin = resolve_pin(ds.pin_memory)
    ring = ds._ring if get_worker_info() is not None else None
    for images, kept, extra in transformed(pipeline, batches(), ds.epoch, pin_memory=pin, ring=ring):
        out: List[Any] = [images]
        if labelled:
            out.append(torch.tensor([extra[i][1] for i in kept], dtype=torch.int64))
        if ds.with_keys:
            out.insert(0, [extra[i][0] for i in kept])
        yield tuple(out) if len(out) > 1 else images


def find_classes(root: str) -> Tuple[List[str], Dict[str, int]]:
    """torchvision's ``find_classes``: the sorted subdirectories of ``root`` and their indices."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if not classes:
        raise NotFoundError(f"no class directories in {root}")
    return classes, {c: i for i, c in enumerate(classes)}


def make_dataset(
    root: str,
    class_to_idx: Dict[str, int],
    extensions: Optional[Tuple[str, ...]],
    is_valid_file: Optional[Callable[[str], bool]],
) -> List[Tuple[str, int]]:
    """torchvision's ``make_dataset``: (path relative to ``root``, class index), class by class,
    files sorted, links followed."""
    if (extensions is None) == (is_valid_file is None):
        raise ValueError("give exactly one of extensions and is_valid_file")
    exts = tuple(e.lower() for e in extensions) if extensions is not None else None
    out: List[Tuple[str, int]] = []
    for cls in sorted(class_to_idx):
        base = os.path.join(root, cls)
        for dirpath, _, files in sorted(os.walk(base, followlinks=True)):
            for f in sorted(files):
                path = os.path.join(dirpath, f)
                ok = is_valid_file(path) if is_valid_file is not None else f.lower().endswith(exts)  # type: ignore[arg-type]
                if ok:
                    out.append((os.path.relpath(path, root), class_to_idx[cls]))
    if not out:
        raise NotFoundError(f"no image files in the class directories of {root}")
    return out


class ImageFolder(_TorchIterable):  # type: ignore[type-arg]
    """torchvision's ``ImageFolder`` (``root/class_x/xxx.jpg``) read by ringtier: yields
    ``(images, labels)`` batches, ``images`` a ``(n, 3, S, S)`` tensor from ``transform`` (a
    :class:`ringtier.transforms.Compose` or torchvision transforms it can compile), ``labels``
    int64 class indices. Classes are the sorted subdirectories (``classes``,
    ``class_to_idx``, ``samples`` and ``targets`` as torchvision's).

    Use ``DataLoader(ds, batch_size=None)`` (the batches are made here). Each epoch's seeded
    shuffled order is split over ``world_size x num_workers`` shards; call :meth:`set_epoch`
    before each epoch. Decode runs on ``decode_threads`` Rust threads (default: this process's
    cores, split over the DataLoader's workers) ``depth`` batches ahead. Without ``transform``
    it yields ``(list of encoded-bytes uint8 tensors, labels)``. JPEG only: other files fail to
    decode and are skipped (``on_bad="skip"``) or raise (``"fail"``).

    With ``transform`` and several DataLoader workers, one worker per
    :data:`CORES_PER_DECODING_WORKER` cores of this rank decodes (``active_workers`` sets the
    number; on up to 64 cores, one), on the threads of the cores it is given, and the others
    stay idle, yielding nothing: the decode already runs on as many Rust threads as there are
    cores in one process, and each further decoding process only adds its own loader, pool
    and pipeline to fill (on 2 cores, 8 workers of which 2 decoded ran at 0.86x of 0 workers,
    with 1 decoding at 0.93x). The epoch is split over the decoding workers (every sample
    once); one ``RuntimeWarning`` says so. Without ``transform`` (reads only, bound by I/O)
    every worker reads.

    ``materialize=DIR`` stores the transform's split point under ``DIR`` in the first epoch
    and reads it back in later ones, as :class:`ringtier.torch.IterableDataset` does (the whole
    image resized to ``materialize_size`` for a random crop, drawn again each epoch; a
    deterministic crop stored as itself; flip, dtype and normalization each epoch).
    """

    def __init__(
        self,
        root: PathLike,
        transform: Any = None,
        *,
        batch_size: int = 64,
        shuffle: bool = True,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        drop_last: bool = False,
        prefetch: int = 2,
        depth: int = 2,
        decode_threads: Optional[int] = None,
        pin_memory: Optional[bool] = None,
        on_bad: str = "skip",
        engine: str = "auto",
        extensions: Optional[Tuple[str, ...]] = IMG_EXTENSIONS,
        is_valid_file: Optional[Callable[[str], bool]] = None,
        materialize: Optional[PathLike] = None,
        materialize_size: Optional[int] = None,
        active_workers: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.root = os.fspath(root)
        self.active_workers = check_active_workers(active_workers)
        if not os.path.isdir(self.root):
            raise NotFoundError(f"image folder {self.root} does not exist or is not a directory")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInputError(f"batch_size must be a positive int, not {batch_size!r}")
        if on_bad not in ("skip", "fail"):
            raise InvalidInputError(f'on_bad must be "skip" or "fail", not {on_bad!r}')
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither (then torch.distributed's are used)")
        if is_valid_file is not None:
            extensions = None
        self.classes, self.class_to_idx = find_classes(self.root)
        self.samples = make_dataset(self.root, self.class_to_idx, extensions, is_valid_file)
        self.targets = [t for _, t in self.samples]
        self.transform = transform
        compiled = None
        if transform is not None:
            # Fails here, in the constructor, for a chain ringtier cannot run.
            compiled = compile_transform(transform, seed=seed, threads=1)
        self.batch_size, self.seed, self.depth = batch_size, seed, depth
        self.decode_threads, self.pin_memory, self.on_bad = decode_threads, pin_memory, on_bad
        self.rank, self.world_size = rank, world_size
        # on_bad also decides a file the listing cannot use (a dangling link): left out and
        # named once, or an error naming it.
        self.options: Dict[str, Any] = dict(
            prefetch=prefetch, shuffle=shuffle, seed=seed, drop_last=drop_last, engine=engine, on_bad=on_bad
        )
        if materialize is not None and transform is None:
            raise InvalidInputError("materialize= stores the transform's split point: give transform=")
        if materialize_size is not None and materialize is None:
            raise InvalidInputError("materialize_size= without materialize=DIR")
        if materialize is not None:
            self.options["materialize"] = os.fspath(materialize)
            self.options["materialize_size"] = materialize_size
            # The split point's decode runs in the loader: a bad image is its to skip or raise.
            self.options["on_bad"] = on_bad
        self.epoch = 0
        self._state: Optional[Tuple[int, Tuple[int, int], Loader, Optional[TransformPipeline], torch.Tensor]] = None
        self._skipped_warning = WarnOnce("skipped")
        self._idle_warning = WarnOnce("idle workers")
        self._ring = SlotRing()  # the workers' reusable shared memory for batches
        if compiled is not None:
            # The decoding workers' slots, made now (before a DataLoader forks): they outlive
            # the workers, so each epoch's workers find them made (see SlotRing.premake).
            premake_slots(self._ring, compiled, batch_size, self.active_workers)

    def __getstate__(self) -> Dict[str, Any]:
        """Pickled (a worker a ``spawn`` or ``forkserver`` DataLoader starts, a copy): without
        this process's loader and pipeline (:func:`picklable_state`)."""
        return picklable_state(self, "_state")

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads."""
        self.epoch = epoch

    def decoding_workers(self, num_workers: int) -> int:
        """Of ``num_workers`` DataLoader workers, how many read and decode (the rest stay
        idle): all of them without a transform; else ``active_workers``, or one per
        :data:`CORES_PER_DECODING_WORKER` of this rank's cores; at most ``num_workers``."""
        if self.transform is None:
            return max(1, num_workers)
        return decoding_workers_of(num_workers, self.active_workers)

    def shard(self) -> Optional[Tuple[int, int]]:
        """(this process's shard, number of shards): rank x decoding workers; None in a worker
        that stays idle (see :meth:`decoding_workers`)."""
        rank, world = rank_world(self.rank, self.world_size)
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        active = self.decoding_workers(workers)
        if worker >= active:
            return None
        return rank * active + worker, world * active

    def _open(self) -> Optional[Tuple[Loader, Optional[TransformPipeline], torch.Tensor]]:
        shard = self.shard()
        if shard is None:
            return None
        pid = os.getpid()
        if self._state is None or self._state[0] != pid or self._state[1] != shard:
            info = get_worker_info()
            fit_engine_to_worker(self.decoding_workers(info.num_workers) if info is not None else None)
            keys = [k for k, _ in self.samples]
            threads = self.decode_threads
            if threads is None and info is not None:
                threads = worker_cores(self.decoding_workers(info.num_workers))
            pipe = pipeline_for(self.transform, self.seed, threads) if self.transform is not None else None
            split = {"materialize_for": pipe} if "materialize" in self.options else {}
            loader = Loader(
                self.root,
                batch_size=self.batch_size,
                rank=shard[0],
                world_size=shard[1],
                keys=keys,
                hold=self.batch_size * (self.depth + 1),
                lazy_pool=get_worker_info() is not None,  # as ringtier.torch.IterableDataset
                warn_skipped=False,
                **split,
                **self.options,
            )
            if loader.skipped_summary is not None:
                self._skipped_warning.warn(f"ringtier: {loader.skipped_summary}")
            by_key = dict(self.samples)
            labels = torch.tensor([by_key[k] for k in loader.keys()], dtype=torch.int64)
            self._state = (pid, shard, loader, pipe, labels)
        return self._state[2], self._state[3], self._state[4]

    def __len__(self) -> int:
        """Batches of this rank per epoch (all its workers together; the last one may be short)."""
        rank, world = rank_world(self.rank, self.world_size)
        n = len(self.samples) // world + (1 if rank < len(self.samples) % world else 0)
        if self.options["drop_last"]:
            return n // self.batch_size
        return (n + self.batch_size - 1) // self.batch_size

    def _batches(self, loader: Loader, epoch: int) -> Iterator[Tuple[List[Any], Sequence[int], Any]]:
        """The loader's batches; the files that could not be read (a dangling link, a file
        gone) are named once per dataset (``on_bad="skip"``; ``"fail"`` found them when the
        loader was made)."""
        for b in loader.epoch(epoch):
            if b.skipped:
                shown = ", ".join(b.skipped[:8])
                self._skipped_warning.warn(
                    f"ringtier: {len(b.skipped)} files of {self.root} could not be read and are left out "
                    f'(on_bad="skip"), the first: {shown}'
                )
            yield list(b), b.indices, None

    def __iter__(self) -> Iterator[Tuple[Any, torch.Tensor]]:
        opened = self._open()
        if opened is None:  # a worker past the decoding ones (the first of them warns)
            stays_idle(self, "ringtier.torch.ImageFolder")
            return
        loader, pipe, labels = opened
        epoch = self.epoch
        raw = self._batches(loader, epoch)
        if pipe is None:
            for items, indices, _ in raw:
                tensors = [torch.frombuffer(s, dtype=torch.uint8) if len(s) else torch.empty(0, dtype=torch.uint8) for s in items]
                yield tensors, labels[list(indices)]
            return
        pin = resolve_pin(self.pin_memory)
        pixels = "materialize" in self.options
        ring = self._ring if get_worker_info() is not None else None
        for images, kept, _ in transformed(
            pipe, raw, epoch, depth=self.depth, pin_memory=pin, on_bad=self.on_bad, pixels=pixels, ring=ring
        ):
            # From a worker, the labels ride in the message (InlineTensor), the images in a slot.
            yield images, (InlineTensor(labels[kept]) if ring is not None else labels[kept])

    def __repr__(self) -> str:
        return (
            f"ringtier.torch.ImageFolder({self.root!r}, classes={len(self.classes)}, samples={len(self.samples)}, "
            f"batch_size={self.batch_size}, transform={self.transform!r})"
        )


__all__ = ["IMG_EXTENSIONS", "ImageFolder", "find_classes", "make_dataset", "transformed"]
