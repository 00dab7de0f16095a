"""The job tests/test_torchrun.py runs under `torchrun --nproc-per-node N` (gloo, CPU).

    python -m torch.distributed.run --standalone --nproc-per-node 2 torchrun_job.py MODE DATA TIERS OUT

MODE: `train` (read two epochs through the IterableDataset with 2 DataLoader workers per rank,
then save steps 1 and 2 through the DistributedCheckpointStore), `kill` (save step 3; rank 1
SIGKILLs itself mid-save), `restore` (load the latest step, check it, save step 4, async_save
step 5 changing the tensors at once, then async_save step 5 again). Each rank
writes OUT/MODE-RANK.json.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import ringtier.torch as rt


def shard_state(rank: int, step: int) -> dict:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return {
        "model": {"w": torch.randn(64, 32, generator=g).to(torch.bfloat16), "b": torch.randn(32, generator=g)},
        "rank": rank,
        "step": step,
    }


def same(a: dict, b: dict) -> bool:
    return (
        torch.equal(a["model"]["w"], b["model"]["w"])
        and torch.equal(a["model"]["b"], b["model"]["b"])
        and a["rank"] == b["rank"]
        and a["step"] == b["step"]
    )


def main() -> None:
    mode, data, tiers, out = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict = {"rank": rank, "world": world}
    if mode == "train":
        ds = rt.IterableDataset(data, batch_size=16, seed=11, with_keys=True)
        dl = DataLoader(ds, batch_size=None, num_workers=2)
        epochs = []
        for epoch in range(2):
            ds.set_epoch(epoch)
            keys = [k for batch in dl for k, _ in batch]
            gathered: list = [None] * world
            dist.all_gather_object(gathered, keys)
            epochs.append(gathered)
        result["epochs"] = epochs
        store = rt.DistributedCheckpointStore(tiers)
        for step in (1, 2):
            store.save(step, shard_state(rank, step))
        result["latest"] = store.latest()
        result["loaded_ok"] = same(store.load(2), shard_state(rank, 2))
        store.close()
    elif mode == "kill":
        store = rt.DistributedCheckpointStore(tiers)
        state = shard_state(rank, 3)
        if rank == 1:
            state["big"] = torch.ones(768 << 20, dtype=torch.uint8)  # a save long enough to die in

            def die() -> None:
                time.sleep(0.1)
                with open(os.path.join(out, "kill-1.json"), "w") as f:
                    json.dump({"rank": 1, "killed_at": time.time()}, f)
                os.kill(os.getpid(), signal.SIGKILL)

            threading.Thread(target=die, daemon=True).start()
        result["saved"] = store.save(3, state)  # rank 1 never returns; rank 0 waits in the gather
    elif mode == "restore":
        store = rt.DistributedCheckpointStore(tiers)
        result["latest"] = store.latest()
        result["steps"] = [c["step"] for c in store.list()]
        result["loaded_ok"] = same(store.load(), shard_state(rank, 2))
        store.save(4, shard_state(rank, 4))
        result["after_save"] = store.latest()
        # async_save: the tensors may change once it returns; result() commits the step.
        state = shard_state(rank, 5)
        fut = store.async_save(5, state)
        state["model"]["w"].fill_(7)
        state["model"]["b"].zero_()
        report = fut.result(timeout=120)
        result["async_report"] = {k: report[k] for k in ("ok", "step", "bytes")}
        result["async_done"] = fut.done()
        result["async_latest"] = store.latest()
        result["async_loaded_ok"] = same(store.load(5), shard_state(rank, 5))
        # A step saved again fails on every rank and commits nothing new.
        again = store.async_save(5, shard_state(rank, 5))
        try:
            again.result(timeout=120)
            result["again_error"] = None
        except Exception as e:
            result["again_error"] = f"{type(e).__name__}: {e}"
        result["again_latest"] = store.latest()
        store.close()
    elif mode == "reshard":
        store = rt.DistributedCheckpointStore(tiers)
        try:
            store.load(2)
            result["error"] = None
        except ValueError as e:
            result["error"] = str(e)
        store.close()
    with open(os.path.join(out, f"{mode}-{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
