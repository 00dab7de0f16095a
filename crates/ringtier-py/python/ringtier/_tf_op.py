"""ringtier's TensorFlow batch op (``_tf_op.cc``): built on first use against the installed
TensorFlow and this package's extension module, cached, and loaded with
``tf.load_op_library``. With it, TFRecord and raw-file batches become ``tf.string`` tensors in
C++ on tf.data's thread (one copy per sample, no Python, no GIL); without it (no C++ compiler,
TensorFlow's headers missing, ``RINGTIER_TF_OP=off``) ``ringtier.tensorflow`` hands them over
through a Python generator, as before, after one warning.

Settings (environment):

* ``RINGTIER_TF_OP``: ``auto`` (default: build or load the op, fall back with a warning),
  ``on`` (the op or an error that says why), ``off`` (never: the generator).
* ``RINGTIER_TF_CXX`` (else ``CXX``, else ``c++`` or ``g++`` on ``PATH``): the compiler.
* ``RINGTIER_CACHE_DIR`` (else ``$XDG_CACHE_HOME/ringtier``, else ``~/.cache/ringtier``): the
  op is kept under ``tf-op/`` there, one file per (op source, TensorFlow, extension module,
  compiler), so a new TensorFlow or ringtier builds a new one. The directory must be this
  user's and not writable by others (a shared library is loaded from it); otherwise the op is
  built in a private temporary directory for the process.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import warnings
from typing import Any, List, Optional

from .errors import UnsupportedError

MODES = ("auto", "on", "off")
#: Seconds the compiler may take.
BUILD_TIMEOUT = 300
#: The prefix of the temporary directory an op is built in where no private cache exists.
PRIVATE_PREFIX = "ringtier-tf-op-"

_lock = threading.Lock()
_loaded: Optional[Any] = None
_refusal: Optional[str] = None
_pid = 0
_warned = False


class OpUnavailableError(UnsupportedError):
    """The op could not be built or loaded (the message says why): raised where
    ``RINGTIER_TF_OP=on``; an :class:`ringtier.errors.UnsupportedError`."""


def mode() -> str:
    """``RINGTIER_TF_OP`` (``auto`` when unset); an error for anything else."""
    m = os.environ.get("RINGTIER_TF_OP", "auto").strip().lower() or "auto"
    if m not in MODES:
        raise ValueError(f"RINGTIER_TF_OP must be one of {MODES}, not {m!r}")
    return m


def _compiler() -> Optional[str]:
    for name in (os.environ.get("RINGTIER_TF_CXX"), os.environ.get("CXX"), "c++", "g++"):
        if name:
            found = shutil.which(name)
            if found:
                return found
            if os.environ.get("RINGTIER_TF_CXX") == name:
                return name  # named explicitly: its failure says what is wrong
    return None


def _private_dir(path: str) -> bool:
    """Whether ``path`` is a real directory (not a link) of this user, writable by no one else."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def cache_dir() -> Optional[str]:
    """Where built ops are kept, created (mode 0700) if missing; None when that place is not
    private to this user (then each process builds its own)."""
    base = os.environ.get("RINGTIER_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = os.path.join(xdg, "ringtier") if xdg else os.path.join(os.path.expanduser("~"), ".cache", "ringtier")
    path = os.path.join(base, "tf-op")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return path if _private_dir(path) and _private_dir(base) else None


def _build_command(cxx: str, src: str, out: str, tf: Any, ext: str) -> List[str]:
    ext_dir, ext_name = os.path.split(ext)
    return [
        cxx,
        "-std=c++17",
        "-O2",
        "-w",
        "-shared",
        "-fPIC",
        src,
        "-o",
        out,
        *tf.sysconfig.get_compile_flags(),
        *tf.sysconfig.get_link_flags(),
        f"-L{ext_dir}",
        f"-l:{ext_name}",
        f"-Wl,-rpath,{ext_dir}",
        "-Wl,--no-undefined",
    ]


def _key(cxx: str, src_bytes: bytes, tf: Any, ext: str) -> str:
    st = os.stat(ext)
    h = hashlib.sha256()
    for part in (
        src_bytes,
        tf.__version__.encode(),
        " ".join(tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags()).encode(),
        f"{os.path.realpath(ext)}:{st.st_size}:{st.st_mtime_ns}".encode(),
        os.path.realpath(cxx).encode(),
    ):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()[:24]


def _build(tf: Any) -> str:
    """The op's shared library: from the cache, or built now; raises OpUnavailableError."""
    from . import _ringtier

    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(here, "_tf_op.cc")
    ext = getattr(_ringtier, "__file__", None)
    if not ext or not os.path.isfile(ext):
        raise OpUnavailableError("ringtier's extension module is not a file on disk; the op links against it")
    try:
        with open(src, "rb") as f:
            src_bytes = f.read()
    except OSError as e:
        raise OpUnavailableError(f"the op's source {src} is missing ({e}): reinstall ringtier") from e
    cxx = _compiler()
    if cxx is None:
        raise OpUnavailableError(
            "no C++ compiler found (install g++, or name one in RINGTIER_TF_CXX or CXX) to build the op"
        )
    name = f"ringtier_tf_op-{_key(cxx, src_bytes, tf, ext)}.so"
    where = cache_dir()
    if where is not None:
        lib = os.path.join(where, name)
        try:
            st = os.lstat(lib)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                return lib
        except FileNotFoundError:
            pass
    else:
        where = tempfile.mkdtemp(prefix=PRIVATE_PREFIX)
        lib = os.path.join(where, name)
    tmp = os.path.join(where, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
    cmd = _build_command(cxx, src, tmp, tf, ext)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OpUnavailableError(f"building the op with {cxx} failed: {e}") from e
    if done.returncode != 0:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-12:])
        raise OpUnavailableError(f"building the op with {cxx} failed (exit {done.returncode}):\n{tail}")
    os.replace(tmp, lib)
    return lib


def load() -> Optional[Any]:
    """The loaded op module (``.ringtier_next_records``), or None where ``RINGTIER_TF_OP`` is
    ``off`` or (``auto``) it cannot be built, with one warning per process saying why;
    ``on`` raises :class:`OpUnavailableError` instead."""
    global _loaded, _refusal, _pid, _warned
    m = mode()
    if m == "off":
        return None
    with _lock:
        if _pid != os.getpid():
            _loaded, _refusal, _pid = None, None, os.getpid()
        if _loaded is None and _refusal is None:
            try:
                import tensorflow as tf

                lib = _build(tf)
                try:
                    _loaded = tf.load_op_library(lib)
                finally:
                    if os.path.basename(os.path.dirname(lib)).startswith(PRIVATE_PREFIX):
                        # Built for this process alone (no private cache): loaded (or not), the
                        # file is not needed any more.
                        shutil.rmtree(os.path.dirname(lib), ignore_errors=True)
            except OpUnavailableError as e:
                _refusal = str(e)
            except Exception as e:  # tf.errors.NotFoundError and the like from the loader
                _refusal = f"loading the op failed: {type(e).__name__}: {e}"
        if _loaded is not None:
            return _loaded
        if m == "on":
            raise OpUnavailableError(f"RINGTIER_TF_OP=on: {_refusal}")
        if not _warned:
            _warned = True
            warnings.warn(
                f"ringtier.tensorflow: tf.string batches cross through Python (slower): {_refusal}. "
                "Set RINGTIER_TF_OP=off to choose that path without this warning.",
                RuntimeWarning,
                stacklevel=3,
            )
        return None


def refusal() -> Optional[str]:
    """Why the op is not loaded in this process (None: loaded, or not tried)."""
    return _refusal


__all__ = ["BUILD_TIMEOUT", "MODES", "OpUnavailableError", "cache_dir", "load", "mode", "refusal"]

if sys.platform != "linux":  # pragma: no cover - ringtier is Linux-only
    raise ImportError("ringtier's TensorFlow op is built for Linux")
