"""Train a small FSDP2 model and checkpoint it through ``torch.distributed.checkpoint`` with
ringtier's storage: a file to copy and adapt.

    torchrun --standalone --nproc-per-node 2 examples/python/dcp_fsdp.py --ckpt DIR [--steps 6]
        [--ckpt-every 2] [--slow DIR]

What it shows:

* the model is sharded with ``fully_shard`` (FSDP2) on CPU and gloo; its and the optimizer's
  state come from ``get_state_dict`` as DTensors, one shard per rank;
* ``dcp.async_save(..., storage_writer=StorageWriter(tiers))`` every ``--ckpt-every`` steps:
  staging copies the state and training goes on; the step is committed (DCP's metadata
  written) once every rank's shard is durable on the fast tier, ``--ckpt``; with ``--slow``
  each checkpoint then drains there in the background (a tier may be an ``s3://`` URL);
* on start, ``dcp.load(..., storage_reader=StorageReader(tiers))`` resumes from the newest
  committed checkpoint, with any number of ranks: DCP reshards, so a job saved by 2 ranks
  resumes on 1 or 4.

The last line printed (by rank 0) is one JSON object: the steps run, the step resumed from,
the last loss and the last checkpoint's step.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from ringtier.torch.dcp import StorageReader, StorageWriter


class TrainState(Stateful):
    """What a checkpoint holds: the model, the optimizer and the step, through DCP's
    ``get_state_dict`` / ``set_state_dict`` (sharded, resharded on load)."""

    def __init__(self, model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
        self.model, self.optim, self.step = model, optim, 0

    def state_dict(self) -> dict:
        msd, osd = get_state_dict(self.model, self.optim)
        return {"model": msd, "optim": osd, "step": self.step}

    def load_state_dict(self, sd: dict) -> None:
        set_state_dict(self.model, self.optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        self.step = sd["step"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True, help="the fast tier (a directory)")
    ap.add_argument("--slow", help="a slower tier the checkpoints drain to (a directory or an s3:// URL)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--ckpt-every", type=int, default=2)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train = TrainState(model, optim)

    # async_save runs DCP's collectives on a thread while training runs FSDP's: on its own group.
    ckpt_group = dist.new_group(backend="gloo")
    tiers = [args.ckpt] + ([args.slow] if args.slow else [])
    writer = StorageWriter(tiers)
    reader = StorageReader(tiers)
    resumed = None
    if reader.latest() is not None:  # None on a first run
        dcp.load({"train": train}, storage_reader=reader)
        resumed = train.step
    reader.close()

    g = torch.Generator().manual_seed(1000 + rank)
    pending = None
    loss = torch.tensor(0.0)
    last_ckpt = None
    start = train.step
    for _ in range(args.steps):
        x = torch.randn(32, 64, generator=g)
        y = torch.randint(0, 10, (32,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optim.step()
        optim.zero_grad()
        train.step += 1
        if train.step % args.ckpt_every == 0:
            if pending is not None:
                pending.result()  # one checkpoint in flight at a time
            # Staged now (copied); written, committed and drained while training goes on.
            pending = dcp.async_save({"train": train}, storage_writer=writer, checkpoint_id=train.step,
                                     process_group=ckpt_group)
            last_ckpt = train.step
    if pending is not None:
        pending.result()
    writer.close(drain=True)  # every checkpoint on the slowest tier before the job ends
    if rank == 0:
        print(json.dumps({
            "ranks": world, "steps": train.step - start, "resumed_from": resumed, "loss": round(loss.item(), 4),
            "last_checkpoint": last_ckpt,
        }))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
