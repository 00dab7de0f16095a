"""``ringtier.tensorflow``: ringtier under ``tf.data`` and TensorFlow's checkpoints.

* :func:`dataset` (or :class:`Source` for ``set_epoch``): a ``tf.data.Dataset`` over ringtier's
  loaders: the files of a directory or S3 prefix (:class:`ringtier.Loader`), TFRecord and
  WebDataset shards (:class:`ringtier.RecordLoader`), or decoded, transformed image batches
  (:mod:`ringtier.transforms`, JPEG decode to crop, flip, dtype and normalization in Rust
  threads). Sharded by a ``tf.distribute.InputContext`` or an explicit ``(index, count)``;
  seeded, a new shuffle each epoch.
* :class:`CheckpointManager`: a ``tf.train.Checkpoint`` saved through ringtier's burst buffer:
  TensorFlow writes its files into a staging directory on the fast tier, the files are
  committed in place as one step of a :class:`ringtier.CheckpointStore` (checksummed manifest,
  fsync, atomic rename; not written a second time) and drained to the slow tiers (or S3) in
  the background; ``restore_or_initialize`` restores the newest intact step.

TensorFlow is imported when first needed (``pip install ringtier[tensorflow]``): importing this
module does not import it. docs/TENSORFLOW.md has the guarantees and the measurements.

How a batch crosses into TensorFlow (``tf.data.Dataset.from_generator``, which hands the
generator's numpy arrays to TensorFlow without a copy when they are 64-byte aligned, as
ringtier's buffers are, page-aligned):

* decoded image batches, ``layout="NCHW"``: **no copy** after the decode; the pipeline decodes
  into one page-aligned buffer per batch and the tensor TensorFlow gets is that buffer;
  ``layout="NHWC"`` (TensorFlow's and Keras' default): **one copy**, a ``tf.transpose`` run by
  ``tf.data``'s own threads;
* raw files as ``tf.string`` (what ``tf.io.decode_jpeg`` takes): **two copies**, into a
  Python ``bytes`` and from it into TensorFlow's string tensor (TensorFlow has no way to wrap
  foreign memory as a string);
* TFRecord records and WebDataset fields as ``tf.string`` (what ``tf.io.parse_example``
  takes): **three copies**: the record loader's, out of its read buffers into the record (Rust,
  on the engine's threads), then the same two: into a ``bytes``, made in Rust for a whole chunk
  of records in one call with the GIL released (``RecordBatch.field_bytes``), and into
  TensorFlow's string tensor;
* raw files as ``tf.uint8`` vectors (``output="uint8"``): **no copy**; each tensor is the
  loader's pooled read buffer, given back to the pool when TensorFlow drops the tensor.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple


from ._types import PathLike, is_s3_url
from .checkpoint import CheckpointStore
from .errors import BusyError, InvalidInputError, NotFoundError
from ._tf_data import Source, dataset, image_of, label_of_record  # noqa: F401 (the public API)

# What makes a trackable hold state in a checkpoint, as TensorFlow's async checkpointing
# decides it (async_checkpoint_helper._get_all_trackables).
_STATE_METHODS = ("_serialize_to_tensors", "_gather_saveables_for_checkpoint", "_copy_trackable_to_cpu")


def _defines(obj: Any, names: Sequence[str], base: type) -> bool:
    own = getattr(obj, "__dict__", None)
    if isinstance(own, dict) and any(n in own for n in names):
        return True
    return any(any(n in t.__dict__ for n in names) for t in type(obj).__mro__ if t is not base)


def _async_refusal(checkpoint: Any, objects: Sequence[Any]) -> Optional[str]:
    """Why TensorFlow's async checkpointing cannot save what ``checkpoint.write`` would (its
    trackables ``objects``), or None. TensorFlow's helper saves a new ``tf.train.Checkpoint``
    made of the checkpoint's constructor arguments, so an attribute set on the checkpoint
    later is left out; and it copies each object that holds state with the object's
    ``_copy_trackable_to_cpu``, leaving out (with a log line) an object without one."""
    import tensorflow as tf

    made_with = getattr(checkpoint, "_kwargs", None)
    if not isinstance(made_with, dict):
        return "this TensorFlow's tf.train.Checkpoint does not say what its async checkpointing saves"
    children = {k: o for k, o in tf.train.TrackableView.children(checkpoint).items() if k != "save_counter"}
    later = sorted(k for k, o in children.items() if made_with.get(k) is not o)
    if later:
        return (
            f"TensorFlow's async checkpointing saves only what the tf.train.Checkpoint was made with, "
            f"not {', '.join(later)} (set on it after)"
        )
    base = tf.__internal__.tracking.Trackable
    for obj in objects:
        if _defines(obj, _STATE_METHODS, base) and not _defines(obj, ("_copy_trackable_to_cpu",), base):
            return f"TensorFlow's async checkpointing cannot copy a {type(obj).__name__} (it would leave it out)"
    return None


def _drop_async_helper(checkpoint: Any) -> bool:
    """Ends the checkpoint's TensorFlow async-checkpoint helper (after its pending write; its
    error is raised) so that the next async write makes a new one. False where this
    TensorFlow keeps the helper elsewhere."""
    if not hasattr(checkpoint, "_async_checkpointer_impl"):
        return False
    helper = checkpoint._async_checkpointer_impl
    if helper is None:
        return True
    join = getattr(helper, "_join_async_save_thread", None)
    if join is None:
        return False
    join()
    checkpoint._async_checkpointer_impl = None
    return True


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
    staging directory on the fast tier, then the files are committed in place as step ``step``
    of a :class:`ringtier.CheckpointStore` over ``tiers`` (fastest first,
    :meth:`ringtier.CheckpointStore.commit_files`): each checksummed from the page cache,
    fsynced and renamed into the step (TensorFlow's write is the only one), the manifest written
    last, so a crash leaves the previous step or the new one, never a torn one. The store drains
    each step to the next tiers (a slower disk, NFS, ``s3://...``) in the background and keeps
    ``keep_last`` steps on each faster tier once drained; ``max_to_keep`` (None: all) deletes
    older steps everywhere (in the background once a save is durable; :meth:`wait` waits for
    it).

    ``restore_or_initialize()``: restores the newest intact step (a step whose every copy is
    bad is passed over, with a ``RuntimeWarning``) and returns its number, or runs
    ``init_fn`` and returns None when there is none.

    ``staging_dir``: where TensorFlow writes before the commit (default: a directory in the fast
    tier's, ``<fast>/.tf-staging-<prefix>``; for an S3 fast tier, the system's temp directory);
    emptied when the manager opens (one writer per prefix: the store's lock) and after each
    save. Files under the fast tier's directory are adopted; a ``staging_dir`` elsewhere (or an
    S3 fast tier) makes the commit copy them, as a second write. Restored files are kept in it
    until the next restore or :meth:`close` (TensorFlow may read them late, for variables
    created after the restore).

    ``save(step, wait=False)`` returns a :class:`SaveFuture` once the state is taken: with
    ``async_write`` (the default) by TensorFlow's own async checkpointing (the variables copied,
    copy-on-write on the CPU; TensorFlow's thread writes the files, then the commit runs),
    except where that would leave an object out (a trackable without ``_copy_trackable_to_cpu``:
    written synchronously, one ``RuntimeWarning``); objects added to the checkpoint after a save
    get a new TensorFlow helper (TensorFlow's lists the objects once).

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
        async_write: bool = True,
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
        self.async_write = bool(async_write)
        self._async_objects: Optional[List[Any]] = None
        self._async_warned = False

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

    def _write(self, step: int, options: Any = None) -> Tuple[str, float]:
        """TensorFlow's files of the checkpoint (``checkpoint.write`` with ``options``), in a
        fresh staging directory; the directory is removed where the write fails."""
        where = tempfile.mkdtemp(prefix=f"step-{step}-", dir=self.staging_dir)
        t0 = time.perf_counter()
        try:
            self.checkpoint.write(os.path.join(where, "ckpt"), options=options)
        except BaseException:
            shutil.rmtree(where, ignore_errors=True)
            raise
        return where, time.perf_counter() - t0

    def _write_async(self, step: int) -> Optional[Tuple[str, float]]:
        """A snapshot of the checkpoint's state handed to TensorFlow's own async checkpointing
        (``CheckpointOptions(enable_async=True)``): ``checkpoint.write`` returns once the
        variables are copied (copy-on-write on the CPU: the copy is paid by the next update of
        each variable) and TensorFlow's thread writes the files. None where that cannot save
        everything (see :func:`_async_refusal`): the caller writes synchronously."""
        import tensorflow as tf

        objects = tf.train.TrackableView(self.checkpoint).descendants()
        refusal = _async_refusal(self.checkpoint, objects)
        if refusal is not None:
            if not self._async_warned:
                self._async_warned = True
                warnings.warn(
                    f"ringtier: {refusal}; save(wait=False) writes the checkpoint before it returns",
                    RuntimeWarning,
                )
            return None
        previous = self._async_objects
        if previous is not None and (len(previous) != len(objects) or any(a is not b for a, b in zip(previous, objects))):
            # TensorFlow's helper copies the objects it found at its first write and silently
            # leaves later ones (an optimizer's slots, a new attribute) out of every later
            # checkpoint: a new helper for the new set, once the old one has written.
            if not _drop_async_helper(self.checkpoint):
                self.async_write = False
                warnings.warn(
                    "ringtier: the checkpoint gained objects and TensorFlow's async checkpointing "
                    "cannot be reset on this TensorFlow version; save(wait=False) writes the "
                    "checkpoint before it returns from now on",
                    RuntimeWarning,
                )
                return None
        self._async_objects = objects
        return self._write(step, tf.train.CheckpointOptions(enable_async=True))

    def _await_tensorflow(self, step: int, where: str) -> float:
        """Waits for TensorFlow's thread to finish an async write; raises its error, or when
        the write left no complete checkpoint (TensorFlow writes ``ckpt.index`` last, out of
        ``ckpt_temp/``). Returns the seconds waited."""
        t0 = time.perf_counter()
        self.checkpoint.sync()
        helper = getattr(self.checkpoint, "_async_checkpointer_impl", None)
        error = getattr(helper, "_async_error", None)
        if error is not None:
            # Taken here, so that the next write does not raise it as its own.
            helper._async_error = None
            raise RuntimeError(f"TensorFlow's async write of checkpoint step {step} failed: {error}") from error
        names = os.listdir(where)
        if "ckpt.index" not in names or any(n.endswith("_temp") for n in names):
            # The next write raises TensorFlow's error where another thread took it first.
            raise RuntimeError(f"TensorFlow's async write of checkpoint step {step} did not finish: {sorted(names)}")
        return time.perf_counter() - t0

    def _staged(self, step: int, where: str) -> List[str]:
        """The names of TensorFlow's files of ``step``, complete, in ``where``."""
        names = sorted(os.listdir(where))
        if not names:
            raise InvalidInputError(f"checkpoint.write wrote no files for step {step}")
        return names

    def _commit(
        self, step: int, where: str, tf_write_seconds: float, t0: float, background: bool, tf_async: bool = False
    ) -> Dict[str, Any]:
        tf_wait = 0.0
        try:
            if tf_async:
                tf_wait = self._await_tensorflow(step, where)
            names = self._staged(step, where)
            t1 = time.perf_counter()
            # TensorFlow's files become the step's parts where they are (adopted), or are
            # copied where the staging directory is not on the fast tier.
            report = dict(self.store.commit_files(step, where, names))
            report["commit_seconds"] = time.perf_counter() - t1
            report["files"] = names
        finally:
            shutil.rmtree(where, ignore_errors=True)
            with self._lock:
                self._saving.discard(step)
        report["tf_write_seconds"] = tf_write_seconds
        report["tf_async"] = tf_async
        report["tf_background_write_seconds"] = tf_wait
        report["blocking_seconds"] = time.perf_counter() - t0
        if background:
            self._prune()
        else:
            # Old steps are deleted off the training loop's thread (wait() waits for it).
            self._background().submit(self._prune)
        return report

    def _background(self) -> Any:
        """The one thread that commits ``wait=False`` saves and prunes old steps, in order."""
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ringtier-tf-commit")
        return self._executor

    def save(self, step: Optional[int] = None, *, wait: bool = True) -> Any:
        """Saves the checkpoint as ``step`` (None: the step after the newest). With ``wait``
        (the default) returns once the step is durable on the fast tier: ``{"step", "bytes",
        "tier", "blocking_seconds", "tf_write_seconds", "commit_seconds", "adopted_bytes",
        ...}``. With ``wait=False`` returns a :class:`SaveFuture` once the step's state is
        taken (the variables may change from then on): with ``async_write`` (the default), as
        soon as TensorFlow's async checkpointing has snapshotted the variables, its thread
        writing the files; without, once TensorFlow has written them. The commit runs in the
        background; ``result()`` says which (``tf_async``)."""
        t0 = time.perf_counter()
        step = self._claim(step)
        tf_async = False
        try:
            written = self._write_async(step) if (not wait and self.async_write) else None
            tf_async = written is not None
            where, tf_seconds = written if written is not None else self._write(step)
        except BaseException:
            with self._lock:
                self._saving.discard(step)
            raise
        if wait:
            return self._commit(step, where, tf_seconds, t0, False)
        return SaveFuture(step, self._background().submit(self._commit, step, where, tf_seconds, t0, True, tf_async))

    def _prune(self) -> None:
        """Deletes the steps beyond the newest ``max_to_keep`` everywhere (in the background
        thread); a failure is a ``RuntimeWarning``, the next save prunes again."""
        if self.max_to_keep is None:
            return
        try:
            steps = [c["step"] for c in self.store.list()]
            for old in steps[: max(0, len(steps) - self.max_to_keep)]:
                try:
                    self.store.delete(old)
                except (BusyError, NotFoundError):
                    pass
        except Exception as e:  # noqa: BLE001 (reported, not lost in a future nobody reads)
            warnings.warn(f"ringtier: deleting checkpoints beyond max_to_keep failed: {e}", RuntimeWarning)

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
        prefix = os.path.join(self._restore_dir, "ckpt")
        self._meet_save_counter(prefix)
        self.last_status = self.checkpoint.read(prefix)
        return int(at)

    def _meet_save_counter(self, prefix: str) -> None:
        """TensorFlow's async checkpointing writes a ``save_counter`` variable that
        ``checkpoint.write`` does not; where the step has one, the checkpoint's own is made
        (``tf.train.Checkpoint.save_counter`` makes it on first use) so that it is restored
        and ``last_status.assert_consumed()`` holds as for a step written synchronously."""
        if getattr(self.checkpoint, "_save_counter", None) is not None or not hasattr(type(self.checkpoint), "save_counter"):
            return
        import tensorflow as tf

        if any(name == "save_counter/.ATTRIBUTES/VARIABLE_VALUE" for name, _ in tf.train.list_variables(prefix)):
            self.checkpoint.save_counter  # noqa: B018 (made on first use)

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
        """Waits for the pending ``wait=False`` commits and ``max_to_keep`` deletions."""
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
