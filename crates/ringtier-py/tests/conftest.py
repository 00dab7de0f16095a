"""Shared fixtures: small datasets of real files in a temporary directory."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import struct
from pathlib import Path
from typing import Dict

import pytest


def write_dataset(root: Path, n: int, seed: int = 7, subdirs: int = 3) -> Dict[str, bytes]:
    """`n` files of random sizes (1 byte to 20 KB) under `subdirs` directories."""
    rng = random.Random(seed)
    files: Dict[str, bytes] = {}
    for i in range(n):
        key = f"d{i % subdirs}/f{i:05d}.bin"
        data = rng.randbytes(rng.randint(1, 20_000))
        p = root / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        files[key] = data
    return files


@pytest.fixture
def dataset(tmp_path: Path):
    root = tmp_path / "ds"
    files = write_dataset(root, 300)
    return root, files


@pytest.fixture
def tiers(tmp_path: Path):
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    fast.mkdir()
    slow.mkdir()
    return [str(fast), str(slow)]


def digest(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


DATA = Path(__file__).parent / "data"
os.environ.setdefault("RINGTIER_TEST", "1")


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as the manifest holds it."""
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data: bytes) -> int:
    """TFRecord's masked CRC-32C."""
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """One TFRecord: length, masked CRC of the length, data, masked CRC of the data."""
    n = struct.pack("<Q", len(data))
    return n + struct.pack("<I", masked(n)) + data + struct.pack("<I", masked(data))


def write_manifest(root: Path, files: Dict[str, bytes]) -> Path:
    lines = ["# ringtier-manifest v1", "# key\tsize\tcrc32c"]
    lines += [f"{k}\t{len(v)}\t{crc32c(v):08x}" for k, v in sorted(files.items())]
    p = root / ".ringtier-manifest.tsv"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt for the test, whatever the process inherited: a shell
    starts a background job with SIGINT ignored, and Python then leaves it ignored."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)
