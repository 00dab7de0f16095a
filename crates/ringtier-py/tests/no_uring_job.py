"""Runs the package's main paths in a process where io_uring is refused, then prints one JSON
line: what ran, what was read back, the warnings. ``test_engine_fallback.py`` runs it.

``python no_uring_job.py MODE WORKDIR`` with MODE ``eperm`` or ``enosys`` (a seccomp filter
installed here, before ringtier is imported: what containers' default profiles and gVisor do)
or ``none`` (the caller set ``kernel.io_uring_disabled=2``; nothing is installed).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import platform
import struct
import sys
import warnings
from pathlib import Path

SYS_IO_URING_SETUP = 425
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def deny_io_uring_setup(err: int) -> None:
    """A seccomp filter on this process: ``io_uring_setup`` fails with ``err``, the rest runs."""
    machine = platform.machine()
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    ld, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
    allow, ret_errno = 0x7FFF0000, 0x00050000
    prog = [
        (ld, 0, 0, 4),  # arch
        (jeq, 1, 0, AUDIT_ARCH[machine]),
        (ret, 0, 0, allow),
        (ld, 0, 0, 0),  # nr
        (jeq, 0, 1, SYS_IO_URING_SETUP),
        (ret, 0, 0, ret_errno | err),
        (ret, 0, 0, allow),
    ]
    raw = b"".join(struct.pack("HBBI", *f) for f in prog)
    buf = ctypes.create_string_buffer(raw)

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Fprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.syscall(SYS_SECCOMP[machine], 1, 0, ctypes.byref(fprog)) != 0:  # SECCOMP_SET_MODE_FILTER
        raise OSError(ctypes.get_errno(), "seccomp")


def main() -> None:
    mode, work = sys.argv[1], Path(sys.argv[2])
    if mode != "none":
        deny_io_uring_setup({"eperm": errno.EPERM, "enosys": errno.ENOSYS}[mode])
    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import write_dataset  # noqa: E402
    from test_records import write_tfrecords  # noqa: E402

    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.utils.data import DataLoader

        import ringtier
        import ringtier.torch
        from ringtier.torch.dcp import StorageReader, StorageWriter

        out: dict = {}
        files = write_dataset(work / "ds", 200)
        # Loader and the torch dataset, 0 and 2 workers.
        seen = {}
        for batch in ringtier.Loader(work / "ds", batch_size=16, seed=1).epoch(0):
            for sample in batch:
                seen[sample.key] = sample.to_bytes()
        out["loader_ok"] = seen == files
        ds = ringtier.torch.IterableDataset(work / "ds", read_batch=32, seed=0)
        n = sum(int(b.shape[0]) if b.dim() > 1 else 1 for b in DataLoader(ds, batch_size=None, num_workers=0))
        out["dataset_samples"] = n
        # Record loader.
        where = write_tfrecords(work / "tf", shards=3, per_shard=40)
        got = set()
        for rec in ringtier.RecordLoader(work / "tf", format="tfrecord").epoch(0):
            got.add(rec.to_bytes())
        out["records_ok"] = got == set(where)
        # Checkpoint store: save, drain, load.
        store = ringtier.CheckpointStore([work / "fast", work / "slow"], create=True)
        state = {"w": torch.arange(100_000, dtype=torch.float32), "step": 3}
        store.save(3, state)
        store.drain()
        back = store.load(3)
        out["store_ok"] = torch.equal(back["w"], state["w"]) and back["step"] == 3
        # DCP through the burst buffer.
        with StorageWriter([work / "dfast", work / "dslow"]) as w:
            dcp.save({"m": torch.ones(64, 64)}, storage_writer=w)
        target = {"m": torch.zeros(64, 64)}
        dcp.load(target, storage_reader=StorageReader([work / "dfast", work / "dslow"]))
        out["dcp_ok"] = bool(torch.equal(target["m"], torch.ones(64, 64)))
        # Asked for io_uring by name: an error naming the cause.
        try:
            ringtier.CheckpointStore([work / "fast", work / "slow"], engine="uring")
            out["uring_error"] = None
        except ringtier.RingtierError as e:
            out["uring_error"] = str(e)
    out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "thread-pool engine" in str(w.message)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
