"""``ringtier.doctor`` and ``python -m ringtier doctor``: the engine's view of this machine, one
line per finding and a verdict, JSON with ``--json``; under a seccomp filter it says io_uring
is refused and that ``auto`` uses the thread pool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ringtier

JOB = Path(__file__).parent / "no_uring_job.py"


def test_report_lines_and_verdict(tmp_path):
    text = ringtier.doctor([tmp_path, "/dev/shm"])
    lines = text.splitlines()
    topics = {line.split()[1] for line in lines[:-1]}
    assert {"kernel", "io_uring", "memlock", "path", "thp", "cuda", "decoder"} <= topics, text
    assert lines[-1].startswith("verdict: "), text
    shm = [line for line in lines if "/dev/shm" in line]
    assert shm and "tmpfs" in shm[0] and "not durable" in shm[0], text
    assert ringtier.JPEG_DECODER in text


def test_json_and_module_entry_point(tmp_path):
    report = json.loads(ringtier.doctor([str(tmp_path)], json=True))
    assert report["verdict"]["auto_engine"] in ("io_uring", "thread pool")
    assert any(f["topic"] == "path" for f in report["findings"])
    p = subprocess.run([sys.executable, "-m", "ringtier", "doctor", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1].startswith("verdict: ")


def test_says_io_uring_is_refused_under_a_seccomp_filter(tmp_path):
    code = (
        "import sys; sys.path.insert(0, %r); import no_uring_job, errno; "
        "no_uring_job.deny_io_uring_setup(errno.EPERM); import ringtier, json; "
        "print(ringtier.doctor([%r], json=True))" % (str(JOB.parent), str(tmp_path))
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["verdict"]["auto_engine"] == "thread pool", report["verdict"]
    uring = next(f for f in report["findings"] if f["topic"] == "io_uring")
    assert uring["status"] == "warn" and "EPERM" in uring["text"], uring
