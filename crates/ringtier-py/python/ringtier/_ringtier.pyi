"""Type stubs of the extension module ``ringtier._ringtier``."""

import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

__version__: str
# The JPEG decoder this build uses: "libjpeg-turbo" (the wheels; feature turbojpeg) or
# "zune-jpeg" (a source build's default). Re-exported as ringtier.JPEG_DECODER.
JPEG_DECODER: str
# Whether tiers may be ``s3://bucket/prefix?endpoint=...`` URLs (feature s3, on by default).
HAS_S3: bool

_Buffer = Any  # an object exporting the buffer protocol (bytes, numpy array, memoryview)

class Sample:
    """One sample: the pooled buffer its file was read into (raw), or decoded RGB pixels.

    Exports its bytes through the buffer protocol (one dimension, ``B``, writable):
    ``numpy.frombuffer(sample, numpy.uint8)`` and ``torch.frombuffer(sample, dtype=torch.uint8)``
    share its memory. The buffer goes back to the loader's pool when the sample and every view
    of it are gone (or at :meth:`release`)."""

    index: int
    """Index of the sample in the dataset (see :meth:`Loader.keys`)."""
    shape: Optional[Tuple[int, int, int]]
    """(height, width, 3) of a decoded image; None for raw bytes."""
    @property
    def key(self) -> str:
        """The sample's key (path relative to the dataset directory)."""
    @property
    def released(self) -> bool:
        """True once :meth:`release` gave the buffer back."""
    def to_bytes(self) -> bytes:
        """A copy of the bytes."""
    def release(self) -> None:
        """Gives the buffer back to the pool now; a ``BufferError`` while views exist."""
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class Batch:
    """A batch of samples, in the epoch's order."""

    epoch: int
    index: int
    """Index of the batch in this rank's epoch."""
    indices: List[int]
    """Dataset indices of the samples."""
    skipped: List[str]
    """Samples left out (unreadable, wrong size, bad checksum), with the reason."""
    bytes: int
    read_seconds: float
    decode_seconds: float
    @property
    def samples(self) -> List[Sample]: ...
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> Sample: ...
    def __iter__(self) -> Iterator[Sample]: ...

class Epoch:
    """One epoch's batches; the GIL is released while waiting for one."""

    def __iter__(self) -> "Epoch": ...
    def __next__(self) -> Batch: ...
    @property
    def position(self) -> int:
        """Samples of this rank consumed so far: ``Loader.epoch(epoch, position)`` resumes here."""
    @property
    def epoch(self) -> int: ...
    def stats(self) -> Dict[str, float]:
        """batches, samples, skipped, bytes, stall_seconds, first_stall_seconds, read_seconds,
        decode_seconds."""

class FileBuffer:
    """One file read by :meth:`FileReader.read`: its read buffer (pooled, or its own where the
    pool was all in use), exported through the buffer protocol (one dimension, ``B``,
    writable): ``numpy.frombuffer(buf, numpy.uint8)`` shares its memory. A pooled buffer goes
    back to the pool when the object and every view of it are gone."""

    def to_bytes(self) -> bytes:
        """A copy of the bytes."""
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class FileReader:
    """Reads any files of a dataset directory (or ``s3://bucket/prefix?endpoint=...``), whole,
    by key, into one pool of read buffers: a random-access source's reader
    (``ringtier.grain.FileSource`` keeps one per process). One engine, one tier and one pool
    for every :meth:`read`; no listing, epoch or statistics.

    ``buffer_size``: bytes of the largest file expected (each pooled buffer holds one such
    file; a larger one is read in pieces and assembled, one copy); ``buffers``: buffers in the
    pool, a private mapping faulted in as reads fill it (not registered); where Python holds
    them all, a read takes buffers of its own instead of waiting. ``engine``: ``"auto"``,
    ``"uring"`` or ``"posix"``. Like every object holding the engine's threads it works only
    in the process that made it (``ringtier.ForkError`` in a forked child: make one there)."""

    def __init__(
        self, path: Union[str, os.PathLike], *, buffer_size: int = 1048576, buffers: int = 1024, engine: str = "auto"
    ) -> None: ...
    def read(self, keys: List[str], sizes: Optional[List[int]] = None) -> List[Union[FileBuffer, Exception]]:
        """The files ``keys`` (paths under the dataset; any order, repeats allowed) read whole
        in one batched read, the GIL released: per key a :class:`FileBuffer` or, where that
        file could not be read, the exception (a ``ringtier.RingtierError`` of its kind, e.g.
        ``NotFoundError``), returned, not raised. ``sizes``: per key, the size to expect, as
        a hint (the file's own size wins)."""
    @property
    def buffers(self) -> int:
        """Buffers in the pool."""
    @property
    def buffer_size(self) -> int:
        """Bytes of one pooled buffer."""
    @property
    def in_use(self) -> int:
        """Pooled buffers in use now (held by Python or by a read)."""
    @property
    def engine(self) -> str:
        """``"uring"`` or ``"posix"``."""

class Loader:
    """Reads a dataset directory (its manifest, or every file under it) in batches; or every
    object under an S3 prefix, ``s3://bucket/prefix?endpoint=URL``, read with range GETs, up to
    64 in flight (URL setting ``read_concurrency``).

    Arguments: ``batch_size`` samples per batch; ``prefetch`` batches read ahead (0: read when
    asked); ``shuffle`` with ``seed`` (the same order on every rank); ``rank`` of
    ``world_size`` (each rank reads every world_size-th sample of the epoch's order);
    ``drop_last``; ``decode`` (an int: decode JPEGs to RGB of that size, on ``decode_threads``
    threads); ``verify`` CRC-32C against the manifest; ``on_bad`` ``"skip"`` or ``"fail"``;
    ``engine`` ``"auto"`` (io_uring where the kernel allows it, the thread pool where it is
    refused, with one ``RuntimeWarning``), ``"uring"`` (an error where refused) or ``"posix"``; ``hold`` samples Python may keep beyond the
    loader's pipeline (default ``batch_size``); ``keys`` to read only those files.

    ``on_bad`` also decides an entry the listing cannot use (a dangling symbolic link, a link
    loop, a directory that cannot be read): ``"skip"`` leaves it out, names it in one
    ``RuntimeWarning`` (``warn_skipped=False``: only in :attr:`skipped_summary`) and counts it
    in ``ringtier_loader_samples_skipped_total``; ``"fail"`` raises an error naming it.

    Listing (docs/SCALE.md): directories are read with their entries' types, without a stat per
    file; sizes are learned from the reads (the buffers are sized from 256 stats spread over the
    dataset; a larger file takes more than one read), so a file truncated after the listing is
    read as it is now. ``stat_files=True`` stats every file and holds each to its listed size (a
    file that changed is skipped and named); ``cache=`` and ``materialize=`` imply it.
    ``listing_cache`` (default True): the listing is kept in ``DIR/.ringtier-listing`` (where the
    directory is writable) and used while every directory it was made from is unchanged
    (entries, inode, modification and change times); its sizes are hints, never trusted over
    the files.

    ``cache``: a :class:`Cache` (or a dict of its arguments) in front of the dataset's tier.
    ``materialize``: a directory (created when missing) where the first epoch stores each
    decoded, resized image (``materialize_size`` pixels square; default the decoded size, or at
    least 256 when the chain has a random step; never below it) and later epochs read it back,
    running only the random steps (needs ``decode``). ``materialize_for``: a
    :class:`TransformPipeline` whose split point is stored instead (``decode`` None): a chain
    with a random crop stores the whole image resized to ``materialize_size`` (default the
    larger of 256 and the output size), a deterministic crop stores the crop itself; the loader
    yields those ``uint8`` pixels, for ``TransformPipeline.submit(..., pixels=side)``.

    ``lazy_pool``: map the read buffers without touching them and do not register them with
    io_uring, so construction costs next to nothing and reads fault in only the pages they fill
    (``ringtier.torch`` datasets set it in DataLoader workers, each of which has a pool of its
    own); the default faults the whole pool in now and registers it.

    Raises :class:`ringtier.PoolExhaustedError` (not a hang) when Python holds so many samples
    that no buffer is left for the next batch."""

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        *,
        batch_size: int = 64,
        prefetch: int = 2,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        decode: Optional[int] = None,
        decode_threads: int = 2,
        verify: bool = False,
        on_bad: str = "skip",
        engine: str = "auto",
        hold: Optional[int] = None,
        keys: Optional[Sequence[str]] = None,
        cache: Optional[Union["Cache", Dict[str, Any]]] = None,
        materialize: Optional[Union[str, "os.PathLike[str]"]] = None,
        materialize_size: Optional[int] = None,
        materialize_for: Optional["TransformPipeline"] = None,
        lazy_pool: bool = False,
        warn_skipped: bool = True,
        stat_files: bool = False,
        listing_cache: bool = True,
    ) -> None: ...
    def cache_stats(self) -> Optional[Dict[str, Any]]:
        """The cache's totals (``cache=`` only, else None): policy, hits, reuse_hits, misses,
        late_prefetches, hit_bytes, miss_bytes, prefetched, prefetched_bytes, unused_evicted,
        evictions, hit_ratio, and per level (fastest first) name, capacity_bytes, used_bytes
        (held or reserved), ready_bytes (written, served at once), reuse_hits, prefetch_hits."""
    def epoch(self, epoch: int = 0, position: int = 0) -> Epoch:
        """The batches of ``epoch``, from ``position`` (samples already consumed) on."""
    def _tf_epoch(self, epoch: int = 0, position: int = 0) -> int:
        """The raw samples of ``epoch`` from ``position`` on for TensorFlow's batch op
        (``ringtier._tf_op``): a token naming the epoch in this process."""
    def keys(self) -> List[str]:
        """Every sample's key, by dataset index."""
    @property
    def skipped(self) -> List[Tuple[str, str]]:
        """The entries the listing left out under ``on_bad="skip"`` (a dangling link, a link
        loop, a directory that cannot be read, a file whose stat fails with ``keys=``), as
        ``(key, reason)``."""
    @property
    def skipped_summary(self) -> Optional[str]:
        """The warning naming the entries the listing left out, or None."""
    @property
    def listing(self) -> Dict[str, Any]:
        """How the dataset was listed: ``samples``, ``bytes`` its keys and sizes hold (the
        keys' bytes plus 16 per sample), ``from_cache`` (the ``.ringtier-listing`` beside it
        was current), ``sizes`` (``"exact"``: stat'd; ``"hints"``: from the cache;
        ``"learned"``: from the reads) and ``max_size`` (the largest size known or estimated,
        which the read buffers are sized by)."""
    @property
    def pool_buffers(self) -> int: ...
    @property
    def pool_bytes(self) -> int: ...
    @property
    def held(self) -> int:
        """Raw samples Python holds now."""
    def __len__(self) -> int:
        """Samples this rank reads per epoch."""

class Cache:
    """The settings of a loader's read-through cache (docs/CACHE.md), checked when made.

    ``capacity`` bytes in ``medium`` (``"memory"``, or a directory, created when missing and
    written by this cache only), or ``levels``, fastest first (``[("memory", BYTES), (DIR,
    BYTES)]``). ``policy``: ``"static"`` (the default: filled once, never evicted), ``"lru"``,
    ``"clairvoyant"`` (Belady's placement on the future reads, over the next
    ``lookahead_epochs`` epochs computed from the seed, plus a prefetcher that fills only free
    room with the reads left after demand, at most ``prefetch_depth`` in flight, into
    ``prefetch_bytes`` of the first level; it beats static only where the readers of a cache do
    not read the whole dataset each epoch, e.g. one node of a larger job: docs/CACHE.md), or
    ``"none"``. Objects larger
    than the read that missed are fetched in ranges of ``range_bytes``. ``node_dir`` with
    ``local_ranks``: one cache for the node's ranks, which are separate processes (torchrun's
    ``--nproc-per-node``): the directory (the same path on every rank; on tmpfs such as
    ``/dev/shm`` it is memory) holds one copy of a sample per node, placed by a plan every rank
    computes from the seed; ``capacity`` is the node's; ``total_epochs`` (the job's number of
    epochs, the same on every rank) lets that plan look over the whole job instead of
    ``lookahead_epochs``. Bad settings raise
    :class:`ringtier.InvalidInputError`."""

    def __init__(
        self,
        capacity: Optional[int] = None,
        *,
        policy: Optional[str] = None,
        medium: Union[str, "os.PathLike[str]"] = "memory",
        levels: Optional[Sequence[Tuple[Union[str, "os.PathLike[str]"], int]]] = None,
        lookahead_epochs: int = 3,
        prefetch_bytes: Optional[int] = None,
        prefetch_depth: int = 128,
        range_bytes: int = 8 << 20,
        node_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
        local_ranks: Optional[int] = None,
        total_epochs: Optional[int] = None,
    ) -> None: ...
    @property
    def policy(self) -> str: ...
    @property
    def local_ranks(self) -> Optional[int]:
        """Ranks per node sharing ``node_dir`` across processes, or None."""
    @property
    def levels(self) -> List[Tuple[str, int]]:
        """``("memory", bytes)`` or ``(directory, bytes)``, fastest first."""
    @property
    def capacity_bytes(self) -> int: ...
    @property
    def lookahead_epochs(self) -> int: ...
    @property
    def total_epochs(self) -> Optional[int]:
        """The job's number of epochs, if given."""
    @property
    def prefetch_bytes(self) -> int:
        """The clairvoyant prefetcher's budget in bytes."""
    @property
    def prefetch_depth(self) -> int: ...

class RecordField:
    """One field of a record: a WebDataset member's data (``name`` its extension, ``jpg``,
    ``cls``) or a TFRecord's data (``name`` empty). Exports its bytes through the buffer
    protocol (one dimension, ``B``, writable): ``numpy.frombuffer(field, numpy.uint8)`` and
    ``torch.frombuffer(field, dtype=torch.uint8)`` share its memory."""

    name: str
    def to_bytes(self) -> bytes:
        """A copy of the bytes."""
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class Record:
    """One record of a shard: a TFRecord (one field, whose bytes the record exports directly
    through the buffer protocol) or a WebDataset sample (one field per member sharing the key:
    ``record["jpg"]``; the record itself then exports nothing)."""

    shard: int
    """Index of its shard in :meth:`RecordLoader.shards`."""
    shard_key: str
    """Its shard's file name (relative to the directory)."""
    offset: int
    """Byte offset of the record (TFRecord) or of its first tar header (WebDataset)."""
    size: int
    """Bytes it takes in the shard, framing included."""
    key: str
    """The WebDataset sample key (member path without its extension); empty for TFRecord."""
    @property
    def fields(self) -> Dict[str, RecordField]:
        """The fields by name."""
    def names(self) -> List[str]:
        """Field names, in shard order."""
    def to_bytes(self) -> bytes:
        """A copy of a one-field record's bytes (a TFRecord)."""
    def __getitem__(self, name: str) -> RecordField: ...
    def __contains__(self, name: str) -> bool: ...
    def __len__(self) -> int:
        """Bytes of all fields."""
    def __buffer__(self, flags: int) -> memoryview: ...

class RecordBatch:
    """Records of one epoch taken together (:meth:`RecordEpoch.next_batch`), held by the
    loader: no Python object per record. :meth:`pack_into` copies them end to end into a
    buffer the caller gives (a ``DataLoader`` worker's shared-memory slot)."""

    def __len__(self) -> int:
        """Records in the batch."""
    def names(self) -> List[str]:
        """Field names, each once, in the order they first appear (``[""]`` for TFRecord)."""
    def nbytes(self, field: Optional[str] = None) -> int:
        """Bytes :meth:`pack_into` writes for ``field``."""
    def keys(self) -> List[str]:
        """Each record's key: the WebDataset sample key, or ``SHARD:OFFSET`` (a TFRecord)."""
    def field_bytes(self, field: Optional[str] = None) -> List[bytes]:
        """Each record's ``field`` (``None``: all of its fields, end to end) as a ``bytes``, in
        batch order; ``b""`` for a record without it: a ``tf.string`` batch in one call. One
        copy per record, from the record's memory into its ``bytes``, made with the GIL
        released."""
    def pack_into(self, out: Any, field: Optional[str] = None) -> List[int]:
        """Copies ``field`` of every record (``None``: all of each record's fields; a record
        without the field takes no bytes) end to end into the front of ``out`` (writable,
        contiguous, at least :meth:`nbytes` bytes; else ``ringtier.InvalidInputError`` and
        nothing written) and returns the ``len + 1`` offsets: record ``i`` is
        ``out[offsets[i]:offsets[i + 1]]``."""

class RecordEpoch:
    """One epoch's records, in this reader's order; the GIL is released while waiting."""

    def __iter__(self) -> "RecordEpoch": ...
    def __next__(self) -> Record: ...
    def next_batch(self, max_records: int, max_bytes: int = 0) -> Optional[RecordBatch]:
        """Up to ``max_records`` next records as one :class:`RecordBatch` (and, where
        ``max_bytes`` is not 0, no more once their bytes reach it: the record that reaches it
        ends the batch, whole); ``None`` at the end of the epoch. They count as delivered
        (:attr:`position`, :meth:`stats`) as records from ``__next__`` do. An error after some
        records of the batch ends the batch there and is raised by the next call."""
    @property
    def position(self) -> int:
        """Records of this reader delivered so far: ``RecordLoader.epoch(epoch, position)``
        resumes here."""
    @property
    def epoch(self) -> int: ...
    def stats(self) -> Dict[str, int]:
        """records, bytes (of the fields delivered), skipped (bad records with
        ``on_bad="skip"``); ``held_bytes``: record bytes the loader holds that Python has not
        been handed yet (parsed, shuffle buffer, prefetch queue, the last wait's records), and
        ``held_peak``, the most it held at once this epoch (at most
        ``RecordLoader.memory_bound(largest record) - pool_bytes``)."""

class RecordLoader:
    """Reads the records of a directory of TFRecord (``*.tfrecord``, ``*.tfrecords``) or
    WebDataset (``*.tar``) shards, links followed; or of the shards under an S3 prefix,
    ``s3://bucket/prefix?endpoint=URL`` (range GETs of ``read_size``, ``depth`` in flight).

    ``order="stream"``: each epoch the shards are shuffled (``shuffle_shards``, seeded by
    ``seed`` and the epoch, the same on every rank) and split over readers, ``(rank, worker)``
    taking every ``world_size x workers``-th shard, so every record is read exactly once per
    epoch; the shards are read front to back as one sliding window of ``2 x depth - 1``
    requests of ``read_size`` bytes in flight (O_DIRECT on the io_uring engine), and their
    records go through a seeded shuffle buffer of ``shuffle_buffer`` records or
    ``shuffle_bytes`` bytes, whichever is reached first, spanning shard boundaries (0 or 1
    records: shard order).

    ``order="global"``: one seeded random permutation of every record of every shard, read
    through per-shard indexes (``SHARD.idx`` from ``ringtier index``, DALI's ``tfrecord2idx``
    and ``wds2idx`` formats, in ``index_dir`` or the shard directory, named ``SHARD.idx`` or
    ``STEM.idx``; a shard without one is indexed by streaming it once, in memory) with
    ``depth`` records per batched read; ``(rank, worker)`` takes every ``world_size x
    workers``-th record; ``read_size`` is raised to fit the largest record.

    Memory is bounded by configuration, whatever the shard sizes: a pool of ``2 x depth x
    read_size`` bytes (64 MiB by default), the shuffle buffer (``shuffle_bytes``, 64 MiB), the
    prefetch queue (``prefetch`` records and ``prefetch_bytes``, 16 MiB), the records of one
    read buffer being parsed (``read_size``) and those taken into Python per wait (1 MiB):
    :meth:`memory_bound` (about 151 MiB at the defaults), plus what the caller keeps. The
    loader counts the record bytes it holds (:meth:`RecordEpoch.stats`). Each record is copied
    once, out of the pooled read buffers; the queues move it, Python shares that memory.

    ``on_bad``: ``"fail"`` (a truncated record, a CRC mismatch, a corrupt tar header, an index
    that does not match its shard raise :class:`ringtier.CorruptError` naming the shard and
    byte offset) or ``"skip"`` (counted in :meth:`RecordEpoch.stats`, logged). A directory
    entry that cannot be listed (a dangling symbolic link, a link loop, an unreadable
    directory) fails the listing with an error naming it under ``"fail"``; under ``"skip"`` it
    is left out and named in one ``RuntimeWarning``.

    ``cache``: a :class:`Cache` (or a dict of its arguments) in front of the shards, one
    object per shard: a shard read for the first time is fetched whole in the background
    (``range_bytes`` pieces) and admitted by the policy; later reads of a held shard come from
    the cache's levels. ``clairvoyant`` plans on this reader's shard order of the coming epochs
    (streaming only: in a global order every reader reads every shard each epoch, where it
    keeps what ``static`` keeps, and is refused)."""

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        *,
        format: str = "tfrecord",
        order: str = "stream",
        read_size: int = 4 << 20,
        depth: int = 8,
        shuffle_buffer: int = 1024,
        shuffle_bytes: int = 64 << 20,
        shuffle_shards: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        workers: int = 1,
        prefetch: int = 256,
        prefetch_bytes: int = 16 << 20,
        on_bad: str = "fail",
        engine: str = "auto",
        index_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
        cache: Optional[Union["Cache", Dict[str, Any]]] = None,
    ) -> None: ...
    def epoch(self, epoch: int = 0, position: int = 0) -> RecordEpoch:
        """The records of ``epoch``, from ``position`` (records this reader already got) on.
        Streaming, the skipped records are read and parsed again (not delivered); in a global
        order they are not read."""
    def cache_stats(self) -> Optional[Dict[str, Any]]:
        """The cache's totals (``cache=`` only, else None), as :meth:`Loader.cache_stats`."""
    def shards(self) -> List[str]:
        """Shard file names, in the order :attr:`Record.shard` numbers them."""
    def _tf_epoch(self, epoch: int = 0, position: int = 0) -> int:
        """The records of ``epoch`` from ``position`` on for TensorFlow's batch op
        (``ringtier._tf_op``): a token naming the epoch in this process (TFRecord only)."""
    def epoch_shards(self, epoch: int = 0) -> List[str]:
        """Shards this reader streams in ``epoch``, in order."""
    @property
    def format(self) -> str:
        """``"tfrecord"`` or ``"wds"``."""
    @property
    def order(self) -> str:
        """``"stream"`` or ``"global"``."""
    @property
    def read_size(self) -> int: ...
    @property
    def pool_bytes(self) -> int: ...
    @property
    def shuffle_bytes(self) -> int:
        """Byte bound of the shuffle buffer (0: none)."""
    @property
    def prefetch_bytes(self) -> int:
        """Byte bound of the prefetch queue (0: none)."""
    def memory_bound(self, max_record: int) -> Optional[int]:
        """The most bytes the loader holds at once for records of at most ``max_record``
        bytes (read pool, shuffle buffer, prefetch queue, one read buffer's records, one
        wait's records); not what the caller keeps. ``None`` where a byte bound is 0."""
    def __len__(self) -> int:
        """Records this reader gets per epoch (global order only: a ``TypeError`` streaming)."""

class SaveFuture:
    """An ``async_save`` in progress."""

    step: int
    def done(self) -> bool: ...
    def result(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Waits until the checkpoint is durable (``TimeoutError`` after ``timeout`` seconds)."""

class PartBuffer:
    """A loaded part's bytes, exported through the buffer protocol (writable)."""

    @property
    def views(self) -> int: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class CheckpointStore:
    """The Rust store; use :class:`ringtier.CheckpointStore`."""

    def __init__(
        self,
        tiers: List[str],
        *,
        prefix: str = "ckpt",
        chunk_bytes: int = ...,
        keep_last: int = 2,
        drain_concurrency: int = 1,
        save_parallelism: int = 1,
        drain_bytes_per_sec: Optional[int] = None,
        fast_capacity_bytes: Optional[int] = None,
        on_full: str = "wait",
        engine: str = "auto",
        read_only: bool = False,
        create: bool = False,
    ) -> None: ...
    def save(self, step: int, parts: List[Tuple[str, List[_Buffer]]]) -> Dict[str, Any]: ...
    def async_save(self, step: int, parts: List[Tuple[str, List[_Buffer]]]) -> SaveFuture: ...
    def commit_files(self, step: int, dir: str, names: List[str]) -> Dict[str, Any]: ...
    def load(
        self, step: Optional[int] = None
    ) -> Optional[Tuple[int, str, List[Tuple[str, PartBuffer]], List[str], List[Tuple[int, str]]]]: ...
    def delete(self, step: int) -> None: ...
    def quarantined(self) -> List[Dict[str, Any]]: ...
    def read_part(self, step: int, name: str) -> PartBuffer: ...
    def load_scatter(self, step: int, name: str, targets: List[Tuple[int, _Buffer]]) -> int: ...
    def list(self) -> List[Dict[str, Any]]: ...
    def latest(self) -> Optional[int]: ...
    def verify(self, step: int) -> List[Tuple[str, Optional[str]]]: ...
    def drain(self) -> None: ...
    def drain_stats(self) -> Dict[str, Any]: ...
    @property
    def tiers(self) -> List[str]: ...
    @property
    def closed(self) -> bool: ...
    def close(self, drain: bool = False) -> None: ...

def _engine_pid() -> int: ...
def _is_s3_url(path: str) -> bool: ...
def _tf_release(token: int) -> bool:
    """Ends the batch op's epoch ``token`` (whether it was still open)."""
def _tf_open_epochs() -> int:
    """Batch-op epochs open in this process."""
def doctor(paths: Sequence[Union[str, "os.PathLike[str]"]] = ..., json: bool = False) -> str:
    """What this machine gives the engine and what it falls back to (io_uring or the thread
    pool and why, memlock, each path's file system, O_DIRECT, durability and free space, THP,
    CUDA, the JPEG decoder): one line per finding and a verdict, or JSON with ``json=True``.
    ``python -m ringtier doctor`` prints it."""
    ...
def serve_metrics(addr: str = "127.0.0.1:9464", allow_remote: bool = False) -> str:
    """Serves ringtier's Prometheus metrics on ``addr`` (port 0: a free one); returns the address.
    Call before creating loaders and stores."""

def metrics_text() -> str:
    """The exposition text a scrape of ``/metrics`` returns (after :func:`serve_metrics`)."""

class TransformPipeline:
    """A compiled transform chain (:mod:`ringtier.transforms`; build one with
    ``Compose.compile()``): JPEG decode, crop, resize, flip, CHW layout, dtype and normalization
    in one pass per image on ``threads`` Rust threads, one buffer per batch. Sample ``i``'s
    random crop and flip come from (``seed``, epoch, ``indices[i]``)."""

    def __init__(
        self,
        size: int,
        *,
        crop: str = "resize",
        resize: Optional[int] = None,
        scale: Tuple[float, float] = (0.08, 1.0),
        ratio: Tuple[float, float] = ...,
        flip: Optional[float] = None,
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        dtype: str = "float32",
        seed: int = 0,
        threads: Optional[int] = None,
        dct_scaling: bool = True,
    ) -> None: ...
    def submit(
        self,
        items: List[_Buffer],
        indices: List[int],
        epoch: int = 0,
        out: Optional[_Buffer] = None,
        pixels: Optional[int] = None,
    ) -> PendingBatch:
        """Starts decoding ``items`` (encoded images) into one batch; ``out``: a writable buffer
        of ``len(items) * sample_bytes`` bytes to fill instead of the pipeline's own.
        ``pixels=SIDE``: the items are the stored split point (``SIDE x SIDE x 3`` uint8 from a
        :class:`Loader` with ``materialize_for=`` this pipeline); only the steps after it run."""
    def apply_rgb(self, rgb: _Buffer, height: int, width: int, index: int = 0, epoch: int = 0) -> TransformedBatch:
        """Transforms one decoded ``height x width x 3`` uint8 image."""
    @property
    def sample_bytes(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def threads(self) -> int: ...
    @property
    def seed(self) -> int: ...

class PendingBatch:
    """A batch being decoded by a :class:`TransformPipeline`."""

    def wait(self) -> TransformedBatch:
        """Waits for every image; failed ones are left out (``TransformedBatch.failed``)."""
    @property
    def done(self) -> bool: ...

class TransformedBatch:
    """``(n, 3, S, S)`` CHW images, uint8 or float32, exported through the buffer protocol
    without a copy (empty when they went to ``out=``)."""

    @property
    def shape(self) -> Tuple[int, int, int, int]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def indices(self) -> List[int]: ...
    @property
    def failed(self) -> List[Tuple[int, str]]: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class SafetensorsBuffer:
    """Bytes read from a safetensors file (a file's data span, or one tensor), exported through
    the buffer protocol (one dimension, ``B``, writable) without a copy: the tensors
    :mod:`ringtier.safetensors` returns are views of it and keep it alive."""

    def __len__(self) -> int: ...
    @property
    def views(self) -> int:
        """Buffer views alive now."""
    def __buffer__(self, flags: int) -> memoryview: ...

class SafetensorsModel:
    """A safetensors model opened by the engine: ``key`` (a ``.safetensors`` file, or a
    ``.json`` shard index whose shards are opened with it) on the tier at ``root`` (a
    directory, or an ``s3://bucket/prefix?endpoint=...`` URL). The headers are read and
    checked as hostile input when it opens (a :class:`~ringtier.CorruptError` for a bad one).
    :mod:`ringtier.safetensors` is the API to use; this is what it runs on."""

    def __init__(self, root: str, key: str, engine: str = "auto") -> None: ...
    @property
    def files(self) -> List[str]:
        """The files' keys, in order."""
    @property
    def sharded(self) -> bool:
        """Whether it was opened through a shard index."""
    def metadata(self, file: int) -> Optional[Dict[str, str]]:
        """The ``__metadata__`` of file ``file`` (None where it has none)."""
    def tensors(self) -> List[Tuple[str, int, str, List[int], int, int]]:
        """Every tensor as ``(name, file, dtype, shape, begin, end)``, file by file in data
        order; ``begin``/``end`` count from the file's data region."""
    def read_all(
        self, depth: Optional[int] = None, chunk_bytes: Optional[int] = None
    ) -> List[Tuple[SafetensorsBuffer, int]]:
        """Every file's data read at ``depth`` (default 16) reads of ``chunk_bytes`` (default
        8 MiB) in flight into one page-aligned buffer per file, without a copy:
        ``[(buffer, data_offset)]``, a tensor's bytes at ``data_offset + begin``."""
    def map_all(
        self, threads: Optional[int] = None, chunk_bytes: Optional[int] = None
    ) -> List[Tuple[SafetensorsBuffer, int]]:
        """Every file's data mapped private from the page cache, read ahead by ``threads``
        (default 8) threads taking ``chunk_bytes`` (default 8 MiB) at a time:
        ``[(buffer, 0)]``, a tensor's bytes at ``begin``. Files only (not S3)."""
    def read_tensor(self, name: str) -> SafetensorsBuffer:
        """Tensor ``name`` read alone: a buffer of exactly its bytes."""
    def read_into(
        self, targets: Sequence[Tuple[str, _Buffer]], depth: Optional[int] = None, chunk_bytes: Optional[int] = None
    ) -> None:
        """Reads the tensors named in ``targets`` into the writable C-contiguous buffers given
        (each of the tensor's byte count), through ``depth`` buffers of one chunk."""

def safetensors_save(
    root: str,
    key: str,
    tensors: Sequence[Tuple[str, str, Sequence[int], _Buffer]],
    metadata: Optional[Dict[str, str]] = None,
    engine: str = "auto",
    max_shard_bytes: Optional[int] = None,
    prefix: str = "model",
    chunk_bytes: Optional[int] = None,
) -> List[str]:
    """Saves ``[(name, dtype, shape, bytes buffer)]`` as ``key`` on the tier at ``root``
    (created if missing), durable when it returns; with ``max_shard_bytes``, as a sharded model
    under ``root/key`` with its ``model.safetensors.index.json`` written last. Returns the keys
    written, the index last. :func:`ringtier.safetensors.save_file` is the API to use."""

def safetensors_layout(
    tensors: Sequence[Tuple[str, str, Sequence[int], int]], metadata: Optional[Dict[str, str]] = None
) -> Tuple[bytes, List[int]]:
    """Lays out a safetensors file for ``[(name, dtype, shape, byte count)]`` and ``metadata``
    as :func:`safetensors_save` does: ``(the file's first bytes, order)``, ``order[i]`` the
    index of the ``i``-th tensor whose bytes follow. A duplicate or reserved name, or a byte
    count that dtype and shape do not make, is an :class:`InvalidInputError`. The checkpoint
    store's ``format="safetensors"`` writes its files with it."""

def safetensors_parse(data: _Buffer) -> Tuple[int, Optional[Dict[str, str]], List[Tuple[str, str, List[int], int, int]]]:
    """Parses the header of the safetensors file ``data`` holds (all of it) as hostile input:
    ``(data_start, metadata or None, [(name, dtype, shape, begin, end)])`` in data order,
    offsets counted from ``data_start``. Anything inconsistent is a :class:`CorruptError`."""

class GroupManifest:
    """A committed step's group manifest (``ringtier_migrate::group``): the world size and
    every rank's bytes and shard digest, written by the coordinator after every rank's shard
    was committed in its own store."""

    @staticmethod
    def from_bytes(step: int, data: bytes) -> "GroupManifest":
        """Parses a manifest's bytes for ``step`` (bounded; ``CorruptError`` when bad)."""
    def to_bytes(self) -> bytes:
        """The manifest's bytes (what the coordinator sends the other ranks)."""
    @property
    def step(self) -> int:
        """The step."""
    @property
    def world_size(self) -> int:
        """The number of ranks that saved the step."""
    @property
    def ranks(self) -> List[Dict[str, Any]]:
        """``[{"rank", "bytes", "items", "digest"}]``, by rank."""
    def verify_shard(self, rank: int, store: CheckpointStore) -> None:
        """``rank``'s shard is committed in ``store`` and is the one named here
        (``FileNotFoundError`` when not committed, ``CorruptError`` when it differs)."""
    def missing(self, stores: Sequence[Optional[CheckpointStore]]) -> List[int]:
        """The ranks whose shard is not committed in ``stores[rank]`` (None: no store opens);
        ``CorruptError`` for a shard that differs from the manifest."""

def group_shard(store: CheckpointStore, rank: int, step: int, bytes: int, items: Optional[int] = None) -> bytes:
    """This rank's report for the group commit: proves its shard of ``step`` committed in
    ``store`` (``FileNotFoundError`` when not)."""

def group_commit(
    coordinator: CheckpointStore,
    step: int,
    reports: Sequence[Union[bytes, str]],
    extra: Sequence[Tuple[str, bytes]] = ...,
) -> GroupManifest:
    """On the coordinator: commits ``step`` from every rank's report (``group_shard``'s bytes,
    or the rank's error as a str), the group manifest (and ``extra`` parts) written last as
    ``step`` of ``coordinator``. ``ValueError`` (nothing written) when a rank failed."""

def group_check(coordinator: CheckpointStore, step: int, world_size: Optional[int] = None) -> GroupManifest:
    """The group manifest of committed ``step``: ``FileNotFoundError`` when not committed,
    ``CorruptError`` when bad, ``ValueError`` when ``world_size`` differs."""
