"""Helpers shared by the record-format comparison scripts (tfdata_vs_ringtier.py,
wds_tarfile_vs_ringtier.py): cold files, CPU contention, the file system's name, summaries."""

import os
import statistics
import subprocess
import sys


def evict(files):
    """Drops every file of `files` from the page cache (works without root)."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cold(files, drop):
    """Evicts `files` from the page cache: `drop` (root): sync, then drop_caches (everything);
    else `evict` (per file, works without root)."""
    if drop:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    else:
        evict(files)


def hogs(n):
    """n busy-looping processes (CPU contention for both sides alike)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def fs_type(path):
    """The file system type of `path`, as `stat -f` names it."""
    out = subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True)
    return out.stdout.strip()


def summary(v):
    """min / median / max of a list of numbers."""
    return {"min": min(v), "median": statistics.median(v), "max": max(v)}


def git_commit():
    """The commit of the checkout this script runs from, or "" where there is none (a script
    written out by `ringtier paper`, a machine without git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
    except OSError:
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""
