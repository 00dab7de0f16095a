"""The job tests/test_node_cache.py runs under `torchrun --nproc-per-node 2` (gloo, CPU).

    python -m torch.distributed.run --standalone --nproc-per-node 2 node_cache_job.py MODE DATA NODE_DIR CAP OUT

MODE `node`: the two local ranks (of a world of NODES x 2 ranks, NODES from $RT_NODES, this
node's ranks only) read 3 epochs through one clairvoyant cache of CAP bytes shared as the
directory NODE_DIR (`ringtier.Cache(node_dir=..., local_ranks=2)`); MODE `rank`: each rank has
its own cache of CAP / 2 bytes in memory. Every sample's bytes are checked against the file;
every batch ends with a barrier (a training step's all-reduce keeps DDP ranks in step).
After each epoch (all ranks done) local rank 0 lists the node directory's copies. Each rank
writes OUT/MODE-RANK.json: its slow-tier bytes per epoch and, on rank 0, the copies found.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

import ringtier

EPOCHS = 4


def copies(node_dir: Path) -> list:
    """(slot file, sample id) of every copy in the node directory (not the ends of runs)."""
    out = []
    for sub in node_dir.iterdir():
        for f in sub.iterdir():
            if f.name.startswith("slot-") and not f.name.endswith(".lock"):
                b = f.read_bytes()
                if b[:8] == b"RTNODE01":
                    out.append((f.name, int.from_bytes(b[16:20], "little"), len(b)))
    return out


def main() -> None:
    mode, data, node_dir, cap, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
    dist.init_process_group("gloo")
    local, nproc = dist.get_rank(), dist.get_world_size()
    nodes = int(os.environ.get("RT_NODES", "2"))
    world = nodes * nproc
    if mode == "node":
        cache = ringtier.Cache(cap, policy="clairvoyant", node_dir=str(node_dir), local_ranks=nproc, prefetch_depth=32)
    else:
        cache = ringtier.Cache(cap // nproc, policy="clairvoyant", prefetch_depth=32)
    loader = ringtier.Loader(str(data), batch_size=8, seed=5, rank=local, world_size=world, cache=cache)
    keys = loader.keys()
    result = {"rank": local, "slow_bytes": [], "copies": [], "reads": 0}
    before = 0
    for epoch in range(EPOCHS):
        for batch in loader.epoch(epoch):
            for s in batch:
                assert s.to_bytes() == (data / keys[s.index]).read_bytes(), keys[s.index]
                result["reads"] += 1
            dist.barrier()  # the step's gradient all-reduce keeps the ranks in step, as in DDP
        st = loader.cache_stats()
        slow = st["miss_bytes"] + st["prefetched_bytes"]
        result["slow_bytes"].append(slow - before)
        before = slow
        dist.barrier()
        if mode == "node" and local == 0:
            result["copies"].append(copies(node_dir))
        dist.barrier()
    (out / f"{mode}-{local}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
