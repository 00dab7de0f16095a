"""What the scale benchmarks share: a cold page cache, min/median/max, and the JSON and
Markdown outputs. Imported by the scripts beside it (run as `python bench/scale/NAME.py`)."""

from __future__ import annotations

import json
import os
import statistics
from typing import Any, Dict, List, Optional


def drop_caches() -> None:
    """Writes back and drops the page cache (root): every pass starts cold."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def summary(v: List[float]) -> Dict[str, float]:
    return {"min": min(v), "median": statistics.median(v), "max": max(v)}


def write_outputs(payload: Any, text: str, json_path: Optional[str], md_path: Optional[str]) -> None:
    """The report as JSON and its table as Markdown, where asked for."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(payload, f, indent=1)
    if md_path:
        with open(md_path, "w") as f:
            f.write(text)
