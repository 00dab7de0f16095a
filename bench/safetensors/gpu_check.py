"""ringtier.safetensors to a GPU: correctness and time against safetensors, on a machine with
CUDA (torch with CUDA, the ringtier wheel and safetensors installed).

    sudo python bench/safetensors/gpu_check.py --dir /var/tmp/st-gpu --gib 2 --repeats 3 \
        [--out bench/results/safetensors/gpu-2g.json]

1. Checks: ``ringtier.safetensors.load_file(index, device="cuda")`` returns, for every tensor of
   a sharded model, the bytes ``safetensors.torch.load_file(shard, device="cuda")`` returns
   (compared on the GPU), and ``load_model`` into a model on the GPU fills it the same way.
2. Times, cold (page cache dropped before every pass, as root; else posix_fadvise per file),
   interleaved, each pass in this process after a ``torch.cuda.synchronize()``:
   ``ringtier-cuda`` (streamed through two page-locked staging buffers),
   ``ringtier-cpu-then-to`` (``load_file`` on the CPU, then ``.to("cuda")`` per tensor), and
   ``safetensors-cuda`` (``safetensors.torch.load_file(shard, device="cuda")`` per shard);
   wall seconds and user+sys CPU seconds per GiB, min/median/max, ratios pair by pair.

Exits 2 without CUDA. The model is made by bench/safetensors/bench.py's generator.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (the model generator and the cold helper)


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device here (torch.cuda.is_available() is False): nothing to check", file=sys.stderr)
        sys.exit(2)
    import safetensors.torch as st

    from ringtier import safetensors as rs

    if not bench.shard_files(args.dir):
        bench.gen(args.dir, args.gib, args.shards, torch_save=False)
    files = bench.shard_files(args.dir)
    index = args.dir / rs.INDEX_FILE
    total = sum(os.path.getsize(f) for f in files)

    ours = rs.load_file(index, device="cuda")
    for f in files:
        for k, v in st.load_file(f, device="cuda").items():
            assert ours[k].device.type == "cuda" and ours[k].dtype == v.dtype and ours[k].shape == v.shape, k
            assert torch.equal(ours[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)), k
    module = bench.model_in_memory(files).to("cuda")
    assert rs.load_model(module, index) == ([], [])
    for k, v in module.state_dict().items():
        assert v.device.type == "cuda" and torch.equal(v.reshape(-1).view(torch.uint8), ours[k].reshape(-1).view(torch.uint8)), k
    n = len(ours)
    del ours, module
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    print(f"checked: {n} tensors equal to safetensors' on cuda, by load_file and load_model", flush=True)

    def ringtier_cuda():
        return rs.load_file(index, device="cuda")

    def ringtier_cpu_then_to():
        return {k: v.to("cuda") for k, v in rs.load_file(index).items()}

    def safetensors_cuda():
        out = {}
        for f in files:
            out.update(st.load_file(f, device="cuda"))
        return out

    sides = {"ringtier-cuda": ringtier_cuda, "ringtier-cpu-then-to": ringtier_cpu_then_to,
             "safetensors-cuda": safetensors_cuda}
    runs = {s: [] for s in sides}
    for r in range(args.repeats):
        for s, fn in sides.items():
            bench.drop_caches(files)
            torch.cuda.synchronize()
            c0, t0 = cpu_s(), time.perf_counter()
            out = fn()
            torch.cuda.synchronize()
            wall, cpu = time.perf_counter() - t0, cpu_s() - c0
            runs[s].append({"wall_s": wall, "cpu_s_per_gib": cpu / (total / (1 << 30))})
            del out
            torch.cuda.empty_cache()
            print(f"round {r} {s}: {runs[s][-1]}", flush=True)

    def summ(v):
        return {"min": min(v), "median": statistics.median(v), "max": max(v)}

    report = {
        "schema": "ringtier.bench.safetensors.gpu/1",
        "command": " ".join([sys.executable] + sys.argv),
        "device": torch.cuda.get_device_name(0),
        "bytes": total,
        "sides": {s: {"wall_s": summ([x["wall_s"] for x in v]), "cpu_s_per_gib": summ([x["cpu_s_per_gib"] for x in v])}
                  for s, v in runs.items()},
        "ringtier_cuda_time_over": {s: summ([a["wall_s"] / b["wall_s"] for a, b in zip(runs["ringtier-cuda"], v)])
                                    for s, v in runs.items() if s != "ringtier-cuda"},
        "raw": runs,
    }
    print(json.dumps({k: report[k] for k in ("device", "sides", "ringtier_cuda_time_over")}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
