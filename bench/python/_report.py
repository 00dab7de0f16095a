"""The results writer the Python benchmarks share: the readable report printed and written as
Markdown, the raw figures as JSON next to it (shared/MEASURING.md, "Keep the results")."""

from __future__ import annotations

import json
from typing import Any, Optional


def write_report(text: str, payload: Any, json_path: Optional[str], md_path: Optional[str]) -> None:
    """Prints `text`; writes `payload` as JSON to `json_path` and `text` to `md_path` (each when given)."""
    print(text)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(payload, f, indent=1)
    if md_path:
        with open(md_path, "w") as f:
            f.write(text)
