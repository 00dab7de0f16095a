#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets into fuzz/corpus/<target>/ (valid inputs of each
format, from Python's tarfile among others). The committed corpus is these seeds plus what the
fuzzer found, minimised (docs/FUZZING.md); re-running this adds nothing already there."""

import hashlib
import io
import json
import os
import struct
import sys
import tarfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data: bytes) -> int:
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(payloads) -> bytes:
    out = b""
    for p in payloads:
        n = struct.pack("<Q", len(p))
        out += n + struct.pack("<I", masked(n)) + p + struct.pack("<I", masked(p))
    return out


def tar(members, fmt) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, data in members:
            if data is None:
                info = tarfile.TarInfo(name)
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            else:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    # Without tarfile's padding to 10 KiB: the last member, then the two zero blocks.
    b = buf.getvalue().rstrip(b"\0")
    return b + bytes(-len(b) % 512 + 1024)


def put(target: str, data: bytes) -> None:
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def main() -> None:
    # tfrecord / wds: a piece-size byte, then the shard.
    for piece in (0, 1, 13):
        put("tfrecord", bytes([piece]) + tfrecord([b"", b"hello", bytes(range(40))]))
    put("tfrecord", bytes([7]) + tfrecord([b"x" * 300])[:-3])
    samples = [("a/img0.jpg", b"\xff\xd8" + b"j" * 30), ("a/img0.cls", b"1"), ("a/img1.jpg", b"k" * 600),
               ("a/img1.cls", b"2")]
    long = [("d" * 120 + "/x.seg.png", b"png"), ("d" * 120 + "/x.cls", b"3")]
    for fmt, piece in ((tarfile.USTAR_FORMAT, 0), (tarfile.GNU_FORMAT, 100), (tarfile.PAX_FORMAT, 255)):
        put("wds", bytes([piece]) + tar(samples, fmt))
    put("wds", bytes([0]) + tar(long + [("dir" * 40 + "/", None), ("y.txt", b"y")], tarfile.GNU_FORMAT))
    put("wds", bytes([0]) + tar(long + samples[:2], tarfile.PAX_FORMAT))
    # record_index: two bytes of shard size, then the text.
    put("record_index", struct.pack("<H", 200) + b"0 16\n16 21\n37 56\n# comment\n\n")
    v12 = b"v1.2 2\njpg 512 512 a.jpg cls 1536 3 a.cls\njpg 2560 600 b.jpg cls 4096 1 b.cls\n"
    put("record_index", struct.pack("<H", 5120) + v12)
    put("record_index", struct.pack("<H", 5120) + b"v1.1 2\njpg 512 512 cls 1536 3\njpg 2560 600 cls 4096 1\n")
    # dataset_manifest
    put("dataset_manifest", b"# ringtier-manifest v1\n# key\tsize\tcrc32c\na/1.jpg\t10\t1a2b3c4d\nb/2.jpg\t0\t0\n")
    # ckpt_manifest: the step byte, then the manifest (version 1; version 2 with its checksum).
    fields = {"format": "ringtier-checkpoint", "version": 2, "step": 7, "created_unix_ms": 1764600000000,
              "parts": [{"name": "state.json", "size": 120, "crc32c": 305419896},
                        {"name": "tensors", "size": 4096, "crc32c": 2882400001}]}
    crc = crc32c(json.dumps(fields, separators=(",", ":")).encode())
    put("ckpt_manifest", bytes([7]) + json.dumps(dict(fields, crc32c=crc), indent=2).encode())
    v1 = dict(fields, version=1, step=3)
    put("ckpt_manifest", bytes([3]) + json.dumps(v1, indent=2).encode())


if __name__ == "__main__":
    sys.exit(main())
