"""Exceptions raised by ringtier.

Every ringtier error is a :class:`RingtierError` with a ``kind`` (a short stable name such as
``"not_found"`` or ``"corrupt"``) and ``temporary`` (whether retrying may help). Bad input is
also a :class:`ValueError` (or :class:`TypeError` for a wrong type), a missing file or
directory also a :class:`FileNotFoundError`.
"""

from __future__ import annotations


class RingtierError(Exception):
    """An error from ringtier's engine."""

    kind: str = "io"
    temporary: bool = False


class NotFoundError(RingtierError, FileNotFoundError, ValueError):
    """A file, directory, checkpoint or key that does not exist."""

    kind = "not_found"


class InvalidInputError(RingtierError, ValueError):
    """An argument ringtier cannot use (bad key, size, setting, out-of-range position)."""

    kind = "invalid_input"


class ClosedError(RingtierError, ValueError):
    """An operation on a closed checkpoint store or a released sample."""

    kind = "closed"


class CorruptError(RingtierError):
    """Data failed a check: checksum mismatch, truncated part, bad manifest."""

    kind = "corrupt"


class NoSpaceError(RingtierError, OSError):
    """A tier is full."""

    kind = "no_space"


class BusyError(RingtierError):
    """Held elsewhere: a checkpoint store another process (or another open) holds."""

    kind = "busy"


class UnsupportedError(RingtierError):
    """Not supported here (e.g. saving through a read-only store)."""

    kind = "unsupported"


class ForkError(RingtierError, RuntimeError):
    """An engine object used in a process it was not created in (inherited through fork())."""

    kind = "fork"


class PoolExhaustedError(RingtierError, BufferError):
    """Python holds so many samples that the loader has no buffer left to read into."""

    kind = "resource_exhausted"


__all__ = [
    "RingtierError",
    "NotFoundError",
    "InvalidInputError",
    "ClosedError",
    "CorruptError",
    "NoSpaceError",
    "BusyError",
    "UnsupportedError",
    "ForkError",
    "PoolExhaustedError",
]
