"""Type aliases the package's signatures share (defined here once, imported elsewhere)."""

from __future__ import annotations

import os
from typing import Union

PathLike = Union[str, "os.PathLike[str]"]
"""A filesystem path: a ``str`` or an ``os.PathLike`` (``pathlib.Path``)."""

__all__ = ["PathLike"]
