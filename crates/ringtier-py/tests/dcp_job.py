"""The job tests/test_dcp.py runs under torchrun (gloo, CPU) through ringtier's DCP storage.

    python -m torch.distributed.run --standalone --nproc-per-node N dcp_job.py MODE TIERS OUT [STEP]

MODE:
* ``save``: an FSDP2 (``fully_shard``) model and its Adam state (DTensors sharded on dim 0),
  a DTensor sharded on dim 1 and a plain replicated ``state_dict`` saved with ``dcp.save``
  (step STEP, default: the next one), then the same again with ``dcp.async_save`` at STEP+1
  (its tensors changed as soon as staging finished). Rank 0 writes the full tensors of both
  steps to OUT/expected-STEP.pt, and every rank drains before it exits. With
  ``RINGTIER_DCP_SAFETENSORS=KEY`` the writer also exports each step as safetensors
  (``StorageWriter(safetensors=KEY)``), the coordinator's last report in its JSON.
* ``load``: a different model (other seed) of the same shape, at this world size, loaded with
  ``dcp.load`` from step STEP (default: the newest); each rank writes OUT/load-WORLD-RANK.json
  with which tensors match OUT/expected-STEP.pt.

TIERS is comma-separated (fastest first); a tier may be an ``s3://`` URL.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from ringtier.torch.dcp import StorageReader, StorageWriter


def build(seed: int, mesh) -> tuple:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(48, 40), torch.nn.ReLU(), torch.nn.Linear(40, 12))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(seed + 1)
    model(torch.randn(8, 48, generator=g)).square().sum().backward()
    optim.step()
    optim.zero_grad()
    return model, optim


def extra(seed: int, mesh) -> dict:
    """A DTensor sharded on dim 1 (non-contiguous regions when resharded) and plain values."""
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(10, 36, generator=g)
    return {
        "wide": distribute_tensor(wide, mesh, [Shard(1)]),
        "plain": {
            "table": torch.randn(33, 7, generator=g).to(torch.bfloat16),
            "ids": torch.arange(17, dtype=torch.int64) * (seed + 1),
            "meta": {"epoch": seed, "name": f"run-{seed}"},
        },
    }


def state(seed: int, mesh) -> tuple:
    model, optim = build(seed, mesh)
    msd, osd = get_state_dict(model, optim)
    return model, optim, {"model": msd, "optim": osd, "extra": extra(seed, mesh)}


def full(x):
    return x.full_tensor() if isinstance(x, DTensor) else x


def flatten(sd, prefix: str = "") -> dict:
    out = {}
    for k, v in sd.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, torch.Tensor):
            out[key] = full(v).detach().clone()
        else:
            out[key] = v
    return out


def main() -> None:
    mode, tiers, out = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
    step = int(sys.argv[4]) if len(sys.argv) > 4 else None
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    if mode == "save":
        # RINGTIER_DCP_SAFETENSORS=model: each step is also exported as a Hugging Face model.
        export = os.environ.get("RINGTIER_DCP_SAFETENSORS") or False
        writer = StorageWriter(tiers, part_bytes=16 << 10, safetensors=export)  # several parts per rank
        _, _, sd = state(0, mesh)
        t0 = time.perf_counter()
        dcp.save(sd, storage_writer=writer, checkpoint_id=step)
        saved = writer.last_save
        first = saved["step"]
        expected = {first: flatten(sd)}
        # async_save: staged at once; the tensors may change before the upload finishes.
        # (full tensors gathered before: no collective of this thread may overlap the upload's)
        _, _, sd2 = state(5, mesh)
        expected[first + 1] = flatten(sd2)
        fut = dcp.async_save(sd2, storage_writer=writer, checkpoint_id=first + 1)
        with torch.no_grad():
            for v in sd2["model"].values():
                (v.to_local() if isinstance(v, DTensor) else v).fill_(-1.0)
        fut.result()
        writer.close(drain=True)
        if rank == 0:
            for s, e in expected.items():
                torch.save(e, os.path.join(out, f"expected-{s}.pt"))
        result = {"rank": rank, "steps": [first, first + 1], "save": saved, "seconds": time.perf_counter() - t0}
        if export and writer.last_export is not None:
            result["export"] = {k: v for k, v in writer.last_export.items() if k != "report"}
        name = f"save-{world}-{rank}.json"
    elif mode == "load":
        reader = StorageReader(tiers)
        model, optim, sd = state(1, mesh)
        dcp.load(sd, storage_reader=reader, checkpoint_id=step)
        set_state_dict(model, optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        loaded = reader.checkpoint_id
        want = torch.load(os.path.join(out, f"expected-{loaded}.pt"), weights_only=True)
        # Read back through the model and optimizer (set_state_dict took the loaded values).
        msd, osd = get_state_dict(model, optim)
        got = flatten({"model": msd, "optim": osd, "extra": sd["extra"]})
        mismatched = sorted(
            k for k in want
            if k not in got or (
                torch.is_tensor(want[k]) and not (torch.is_tensor(got[k]) and got[k].dtype == want[k].dtype
                                                  and torch.equal(got[k], want[k])))
            or (not torch.is_tensor(want[k]) and got[k] != want[k])
        )
        result = {
            "rank": rank, "world": world, "step": loaded, "checked": len(want), "mismatched": mismatched,
            "load": reader.last_load, "skipped": reader.skipped,
        }
        reader.close()
        name = f"load-{world}-{rank}.json"
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    with open(os.path.join(out, name), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
