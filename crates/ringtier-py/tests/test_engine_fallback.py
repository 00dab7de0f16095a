"""Where io_uring is refused (a container's seccomp profile, gVisor, ``kernel.io_uring_disabled``),
``engine="auto"`` (the default) reads and writes with the thread pool: the loader, the torch
dataset, the record loader, the checkpoint store and DCP all work, with one ``RuntimeWarning``
naming why; ``engine="uring"`` fails naming the cause and the way out; what the thread pool
wrote, io_uring reads. The refusal is a seccomp filter in a child process (``no_uring_job.py``);
``.ci/run`` also runs ``-k sysctl`` alone with ``kernel.io_uring_disabled=2``
(``RINGTIER_TEST_SYSCTL=1``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import ringtier  # noqa: E402

JOB = Path(__file__).parent / "no_uring_job.py"


def run_job(mode: str, work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, str(JOB), mode, str(work)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def check(out: dict, why: str) -> None:
    assert out["loader_ok"], out
    assert out["dataset_samples"] == 200, out
    assert out["records_ok"], out
    assert out["store_ok"], out
    assert out["dcp_ok"], out
    assert len(out["warnings"]) == 1, out["warnings"]
    assert why in out["warnings"][0], out["warnings"]
    err = out["uring_error"]
    assert err is not None and 'engine "uring"' in err and why in err and '"auto"' in err, err


@pytest.mark.parametrize("mode,why", [("eperm", "EPERM"), ("enosys", "ENOSYS")])
def test_seccomp_refusal_falls_back_to_the_thread_pool(tmp_path, mode, why):
    check(run_job(mode, tmp_path), why)
    # The same files, read with io_uring (this process has it).
    store = ringtier.CheckpointStore([tmp_path / "fast", tmp_path / "slow"], engine="uring")
    assert store.load(3)["step"] == 3


def test_sysctl_refusal_falls_back_to_the_thread_pool(tmp_path):
    value = Path("/proc/sys/kernel/io_uring_disabled").read_text().strip()
    if value != "2":
        assert not os.environ.get("RINGTIER_TEST_SYSCTL"), f"RINGTIER_TEST_SYSCTL set, io_uring_disabled={value}"
        pytest.skip("kernel.io_uring_disabled is not 2 (.ci/run sets it around this test)")
    check(run_job("none", tmp_path), "kernel.io_uring_disabled=2")


def test_small_memlock_without_cap_ipc_lock(tmp_path):
    """``ulimit -l 64`` (KiB) and no CAP_IPC_LOCK, as in many containers: registered buffers
    fall back, rings are retried smaller, then the thread pool takes over; the defaults work.
    Root gives up CAP_IPC_LOCK through ``setpriv`` to be held to the limit."""
    import shutil

    if os.geteuid() != 0 or not shutil.which("prlimit") or not shutil.which("setpriv"):
        pytest.skip("needs root (to drop CAP_IPC_LOCK) and util-linux's prlimit and setpriv")
    tmp_path.mkdir(parents=True, exist_ok=True)
    cmd = ["prlimit", "--memlock=65536:65536", "setpriv", "--bounding-set=-ipc_lock", "--",
           sys.executable, str(JOB), "none", str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    for k in ("loader_ok", "records_ok", "store_ok", "dcp_ok"):
        assert out[k], out
    assert out["dataset_samples"] == 200, out
