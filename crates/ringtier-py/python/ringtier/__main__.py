"""``python -m ringtier doctor [PATH ...] [--json]``: what this machine gives the engine (io_uring
or the thread pool and why, the locked-memory limit, each path's file system, O_DIRECT,
durability and free space, transparent huge pages, the CUDA driver, the JPEG decoder), one
line per finding and a verdict; exit 0. The same report as the ``ringtier doctor`` command."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ringtier")
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="what this machine gives the engine, and what it falls back to")
    doc.add_argument("paths", nargs="*", help="directories to examine (default: . and the temp dir)")
    doc.add_argument("--json", action="store_true", help="the report as JSON")
    args = parser.parse_args(argv)
    from . import doctor

    print(doctor(args.paths, json=args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
