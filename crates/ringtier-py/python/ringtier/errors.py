"""Exceptions raised by ringtier.

Every ringtier error is a :class:`RingtierError` with

* ``kind``: a short stable name, the engine's error kind (``ringtier_core::ErrorKind``:
  ``"not_found"``, ``"permission_denied"``, ``"corrupt"``, ...) or one of Python's own
  (``"closed"``, ``"fork"``);
* ``temporary``: whether retrying the same call may succeed;
* ``errno``: the OS error code it came from, or None.

Each engine kind is raised as exactly one class (:data:`CLASS_BY_KIND`), and that class is also
the builtin exception Python raises for the same failure: a missing file is a
:class:`FileNotFoundError`, a refused path a :class:`PermissionError`, a checkpoint step saved
twice a :class:`FileExistsError`, bad input a :class:`ValueError`, a full disk an
:class:`OSError` with ``errno`` ``ENOSPC``. The classes that are :class:`OSError` s carry the OS
code as ``errno`` (and then print as ``[Errno N] message``); the others have ``errno`` as an
attribute too.
"""

from __future__ import annotations

import io
import types
from typing import Mapping, Optional, Type


class RingtierError(Exception):
    """An error from ringtier's engine."""

    kind: str = "io"
    temporary: bool = False
    # `errno` is not a class attribute here: it would hide OSError's own `errno` on the
    # subclasses that are OSErrors. The others declare `errno = None` themselves.
    errno: Optional[int]


class NotFoundError(RingtierError, FileNotFoundError, ValueError):
    """A file, directory, checkpoint or key that does not exist."""

    kind = "not_found"


class AlreadyExistsError(RingtierError, FileExistsError):
    """Something already exists where a new one was to be created: a checkpoint step saved
    again (or one with a quarantined copy), a directory where an object is to be written."""

    kind = "already_exists"


class InvalidInputError(RingtierError, ValueError):
    """An argument ringtier cannot use (bad size, setting, buffer)."""

    kind = "invalid_input"
    errno: Optional[int] = None


class InvalidKeyError(InvalidInputError):
    """A key that is not a valid object key: absolute, with a ``..`` or empty component, a
    NUL byte, or too long."""

    kind = "invalid_key"


class MisalignedError(InvalidInputError):
    """A buffer, offset or length that breaks the alignment Direct I/O needs."""

    kind = "misaligned"


class OutOfRangeError(InvalidInputError):
    """A position past the end: a read past the end of an object, a resume position past the
    end of an epoch."""

    kind = "out_of_range"


class NoSpaceError(RingtierError, OSError):
    """A tier is full (``ENOSPC``, ``EDQUOT``, or a capacity bound such as
    ``fast_capacity_bytes``)."""

    kind = "no_space"


class PermissionDeniedError(RingtierError, PermissionError):
    """Refused: by the operating system (``EACCES``, ``EPERM``, a read-only file system), by a
    tier that does not follow links (a symbolic link inside a store's tier), or by S3
    (credentials)."""

    kind = "permission_denied"


class UnsupportedError(RingtierError, io.UnsupportedOperation):
    """Not supported here: saving through a read-only store, a mode the file system or kernel
    lacks (``EOPNOTSUPP``, ``ENOSYS``). Like :class:`io.UnsupportedOperation` (writing to a
    file opened for reading) it is both an :class:`OSError` and a :class:`ValueError`."""

    kind = "unsupported"


class CorruptError(RingtierError, OSError):
    """Data failed a check: checksum mismatch, truncated part, bad manifest or record. An
    :class:`OSError`, as Python's own readers report bad files (``gzip.BadGzipFile``)."""

    kind = "corrupt"


class ResourceExhaustedError(RingtierError, OSError):
    """A resource limit was hit: memory that cannot be allocated or mapped (``ENOMEM``, the
    memlock limit), open files (``EMFILE``, ``ENFILE``), a buffer pool."""

    kind = "resource_exhausted"


class PoolExhaustedError(ResourceExhaustedError, BufferError):
    """Python holds so many samples that the loader has no buffer left to read into (the
    ``resource_exhausted`` kind, raised by the loader; also a :class:`BufferError`)."""

    kind = "resource_exhausted"


class ShutdownError(RingtierError, RuntimeError):
    """The engine (a thread pool, an io_uring driver, a background task) stopped while the
    operation was pending."""

    kind = "shutdown"
    errno: Optional[int] = None


class BusyError(RingtierError, BlockingIOError):
    """Held elsewhere: a checkpoint store another process (or another open) holds, a step
    being saved, an S3 prefix whose lease another writer holds. A :class:`BlockingIOError`,
    as ``fcntl.flock`` raises for a lock held elsewhere."""

    kind = "busy"


class IoError(RingtierError, OSError):
    """Any other I/O error (``EIO``, ``EISDIR``, an S3 endpoint that does not answer, ...);
    ``errno`` names the OS error where there is one."""

    kind = "io"


class ClosedError(RingtierError, ValueError):
    """An operation on a closed checkpoint store or a released sample."""

    kind = "closed"
    errno: Optional[int] = None


class ForkError(RingtierError, RuntimeError):
    """An engine object used in a process it was not created in (inherited through fork())."""

    kind = "fork"
    errno: Optional[int] = None


CLASS_BY_KIND: Mapping[str, Type[RingtierError]] = types.MappingProxyType(
    {
        "not_found": NotFoundError,
        "already_exists": AlreadyExistsError,
        "invalid_key": InvalidKeyError,
        "invalid_input": InvalidInputError,
        "misaligned": MisalignedError,
        "out_of_range": OutOfRangeError,
        "no_space": NoSpaceError,
        "permission_denied": PermissionDeniedError,
        "unsupported": UnsupportedError,
        "corrupt": CorruptError,
        "resource_exhausted": ResourceExhaustedError,
        "shutdown": ShutdownError,
        "busy": BusyError,
        "io": IoError,
    }
)
"""The class each engine error kind (``ringtier_core::ErrorKind::as_str``) is raised as.
``src/errors.rs`` raises through it, and its tests check that every kind is here."""


def _new(
    cls: Type[RingtierError],
    message: str,
    kind: Optional[str] = None,
    temporary: bool = False,
    errno: Optional[int] = None,
) -> RingtierError:
    """An exception of ``cls``: an :class:`OSError` with an OS code is made as
    ``cls(errno, message)`` (so it keeps ``errno`` through pickling), others as
    ``cls(message)``."""
    if errno is not None and issubclass(cls, OSError):
        exc = cls(errno, message)
    else:
        exc = cls(message)
        if errno is not None:
            exc.errno = errno
    exc.kind = kind if kind is not None else cls.kind
    exc.temporary = temporary
    return exc


def _from_kind(kind: str, message: str, temporary: bool = False, errno: Optional[int] = None) -> RingtierError:
    """The exception for an engine error of ``kind`` (:data:`CLASS_BY_KIND`; a kind this
    version does not know is a plain :class:`RingtierError` keeping ``kind``). How
    ``src/errors.rs`` raises every engine error."""
    return _new(CLASS_BY_KIND.get(kind, RingtierError), message, kind, temporary, errno)


__all__ = [
    "CLASS_BY_KIND",
    "RingtierError",
    "NotFoundError",
    "AlreadyExistsError",
    "InvalidInputError",
    "InvalidKeyError",
    "MisalignedError",
    "OutOfRangeError",
    "NoSpaceError",
    "PermissionDeniedError",
    "UnsupportedError",
    "CorruptError",
    "ResourceExhaustedError",
    "PoolExhaustedError",
    "ShutdownError",
    "BusyError",
    "IoError",
    "ClosedError",
    "ForkError",
]
