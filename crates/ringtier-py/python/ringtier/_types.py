"""Type aliases the package's signatures share (defined here once, imported elsewhere)."""

from __future__ import annotations

import os
from typing import Union

PathLike = Union[str, "os.PathLike[str]"]
"""A filesystem path: a ``str`` or an ``os.PathLike`` (``pathlib.Path``)."""



def tier_path(path: PathLike) -> str:
    """``path`` as the string the engine takes: a directory, or an ``s3://bucket/prefix?...``
    URL kept as it is. A URL whose ``//`` was collapsed (``pathlib.Path("s3://b/p")`` is
    ``s3:/b/p``) is refused with a ``ValueError`` saying so, instead of being taken for a
    missing directory."""
    s = os.fspath(path)
    if isinstance(s, bytes):
        s = os.fsdecode(s)
    if s.startswith("s3:/") and not s.startswith("s3://"):
        raise ValueError(
            f"{s!r} looks like an S3 URL whose '//' was collapsed (pathlib.Path does that): "
            "pass S3 tiers as str, 's3://bucket/prefix?endpoint=...'"
        )
    return s


def is_s3_url(path: str) -> bool:
    """True when ``path`` names an S3 tier (``s3://...``) rather than a directory, as the engine's
    one parser (``ringtier::open``) decides."""
    from ._ringtier import _is_s3_url

    return _is_s3_url(path)


__all__ = ["PathLike", "is_s3_url", "tier_path"]
