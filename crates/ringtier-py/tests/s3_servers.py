"""Real S3 servers on loopback for the Python tests: the test kit's s3s-fs server
(``ringtier-s3-server``, built by ``cargo build -p ringtier-testkit --bin ringtier-s3-server``)
and ``moto_server``. Each runs as a child process on a free port; buckets are created per test.

A missing server skips its tests, unless ``RINGTIER_REQUIRE_S3_SERVER=1`` (the s3s-fs binary)
or ``RINGTIER_REQUIRE_MOTO=1`` (moto) is set, as CI does: then it fails them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Dict, Iterator, Optional

import pytest



def _source_tree() -> Optional[Path]:
    """The repository these tests sit in (crates/ringtier-py/tests), or None where they run from
    a copy outside it, against an installed wheel (as CI does)."""
    here = Path(__file__).resolve()
    if len(here.parents) > 3 and (here.parents[3] / "crates" / "ringtier-testkit").is_dir():
        return here.parents[3]
    return None


REPO = _source_tree()

# The test kit's credentials (ringtier_testkit::s3::{ACCESS_KEY, SECRET_KEY}); moto takes any.
ACCESS_KEY = "ringtier-test"
SECRET_KEY = "ringtier-test-secret"


def server_binary() -> Optional[Path]:
    """The test kit's ``ringtier-s3-server``: ``$RINGTIER_S3_SERVER``, else target/{debug,release}
    of the source tree (none from a copy of the tests: set the variable)."""
    env = os.environ.get("RINGTIER_S3_SERVER")
    if env:
        return Path(env)
    if REPO is None:
        return None
    for profile in ("debug", "release"):
        p = REPO / "target" / profile / "ringtier-s3-server"
        if p.is_file():
            return p
    return None


def _missing(what: str, env: str) -> None:
    if os.environ.get(env) == "1":
        pytest.fail(f"{what} is required here ({env}=1)")
    pytest.skip(f"{what} is not available")


class S3Server:
    """One server: ``endpoint``, ``kind`` (``"s3s-fs"`` or ``"moto"``), ``root`` (s3s-fs: the
    directory whose subdirectories are the buckets)."""

    def __init__(self, kind: str, endpoint: str, proc: subprocess.Popen, root: Optional[Path]) -> None:
        self.kind, self.endpoint, self.proc, self.root = kind, endpoint, proc, root

    def create_bucket(self, name: Optional[str] = None) -> str:
        name = name or f"b{uuid.uuid4().hex[:12]}"
        if self.root is not None:
            (self.root / name).mkdir()
        else:
            # moto checks no signature: an unsigned CreateBucket.
            req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT", data=b"")
            urllib.request.urlopen(req, timeout=10).read()
        return name

    def put(self, bucket: str, key: str, data: bytes) -> None:
        """Stores an object (s3s-fs: as the file its directory maps it to)."""
        if self.root is not None:
            p = self.root / bucket / key
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        else:
            req = urllib.request.Request(
                f"{self.endpoint}/{bucket}/{key}",
                method="PUT",
                data=data,
                headers={"Content-Type": "application/octet-stream"},
            )
            urllib.request.urlopen(req, timeout=10).read()

    def url(self, bucket: str, prefix: str, **settings: object) -> str:
        q = "&".join([f"endpoint={self.endpoint}", "region=us-east-1"] + [f"{k}={v}" for k, v in settings.items()])
        return f"s3://{bucket}/{prefix}?{q}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_s3s_fs(root: Path, latency_ms: float = 0.0) -> S3Server:
    binary = server_binary()
    if binary is None:
        _missing(
            "the test kit's ringtier-s3-server (cargo build -p ringtier-testkit --bin ringtier-s3-server)",
            "RINGTIER_REQUIRE_S3_SERVER",
        )
    assert binary is not None
    root.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [str(binary), "--root", str(root), "--latency-ms", str(latency_ms)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    endpoint = proc.stdout.readline().strip()
    if not endpoint.startswith("http://"):
        proc.kill()
        raise RuntimeError(f"ringtier-s3-server did not start (said {endpoint!r})")
    return S3Server("s3s-fs", endpoint, proc, root)


def start_moto() -> S3Server:
    exe = shutil.which("moto_server")
    if exe is None:
        _missing("moto_server (pip install 'moto[server]')", "RINGTIER_REQUIRE_MOTO")
    assert exe is not None
    port = free_port()
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited at start: {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return S3Server("moto", endpoint, proc, None)
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto_server did not listen within 30 s")


def aws_env() -> Dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": "us-east-1",
    }


def servers(kinds: str, tmp_root: Path) -> Iterator[S3Server]:
    srv = start_s3s_fs(tmp_root / "s3s-fs") if kinds == "s3s-fs" else start_moto()
    try:
        yield srv
    finally:
        srv.stop()
