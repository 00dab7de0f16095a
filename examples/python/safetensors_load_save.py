"""Save a model as sharded safetensors with ringtier, load it back in one call, and check it
against the ``safetensors`` package both ways.

    python examples/python/safetensors_load_save.py [--dir DIR] [--mib 64] [--shard-mib 16]

Makes a transformer-shaped state dict (bf16 weights, fp32 norms), saves it sharded
(``model-0000i-of-0000N.safetensors`` and ``model.safetensors.index.json``, durable), loads the
whole model with one ``ringtier.safetensors.load_file`` (every shard read at depth, tensors
are views of one page-aligned buffer per file), reloads it into a ``torch.nn.Module`` already
in memory with ``load_model`` (the chunks copied into the model's own parameters), reads one
tensor lazily with ``safe_open``, and checks that ``safetensors.torch`` reads ringtier's shards and that ringtier's save of one
file is byte-identical to ``safetensors.torch.save_file``'s. The last line printed is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from ringtier import safetensors as rs


def make_model(mib: int) -> dict:
    g = torch.Generator().manual_seed(0)
    width = 512
    layers = max(1, mib * (1 << 20) // (2 * 4 * width * width * 2))
    sd = {"embed.weight": torch.randn(8192, width, generator=g).to(torch.bfloat16)}
    for i in range(layers):
        sd[f"layers.{i}.attn.qkv.weight"] = torch.randn(3 * width, width, generator=g).to(torch.bfloat16)
        sd[f"layers.{i}.mlp.up.weight"] = torch.randn(4 * width, width, generator=g).to(torch.bfloat16)
        sd[f"layers.{i}.norm.weight"] = torch.ones(width)
    return sd


class Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.attn = torch.nn.Module()
        self.attn.qkv = torch.nn.Linear(width, 3 * width, bias=False, dtype=torch.bfloat16)
        self.mlp = torch.nn.Module()
        self.mlp.up = torch.nn.Linear(width, 4 * width, bias=False, dtype=torch.bfloat16)
        self.norm = torch.nn.RMSNorm(width)


class Model(torch.nn.Module):
    """The module whose state dict ``make_model`` makes."""

    def __init__(self, layers: int, width: int = 512):
        super().__init__()
        self.embed = torch.nn.Embedding(8192, width, dtype=torch.bfloat16)
        self.layers = torch.nn.ModuleList(Block(width) for _ in range(layers))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--mib", type=int, default=64, help="model size, MiB")
    ap.add_argument("--shard-mib", type=int, default=16, help="largest shard, MiB")
    args = ap.parse_args()
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory()
        args.dir = Path(tmp.name)
    sd = make_model(args.mib)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())

    t0 = time.perf_counter()
    files = rs.save_sharded(sd, args.dir / "model", max_shard_size=args.shard_mib << 20, metadata={"format": "pt"})
    save_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    loaded = rs.load_file(args.dir / "model")  # the directory: its model.safetensors.index.json
    load_s = time.perf_counter() - t0
    assert set(loaded) == set(sd)
    for k, v in sd.items():
        assert torch.equal(loaded[k], v), k

    model = Model(layers=(len(sd) - 1) // 3)
    t0 = time.perf_counter()
    missing, unexpected = rs.load_model(model, args.dir / "model")  # strict: every name matches
    reload_s = time.perf_counter() - t0
    assert (missing, unexpected) == ([], [])
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd[k]), k

    with rs.safe_open(args.dir / "model" / files[0], framework="pt") as f:
        name = f.keys()[0]
        assert torch.equal(f.get_tensor(name), sd[name])

    checked_with_safetensors = False
    try:
        import safetensors.torch as st
    except ImportError:
        st = None
    if st is not None:
        for shard in files[:-1]:
            for k, v in st.load_file(str(args.dir / "model" / shard)).items():
                assert torch.equal(v, sd[k]), k
        small = {k: sd[k] for k in list(sd)[:4]}
        rs.save_file(small, args.dir / "ours.safetensors")
        st.save_file(small, str(args.dir / "theirs.safetensors"))
        assert (args.dir / "ours.safetensors").read_bytes() == (args.dir / "theirs.safetensors").read_bytes()
        checked_with_safetensors = True

    print(
        json.dumps(
            {
                "tensors": len(sd),
                "bytes": nbytes,
                "files": files,
                "save_s": round(save_s, 4),
                "load_s": round(load_s, 4),
                "load_model_s": round(reload_s, 4),
                "checked_with_safetensors": checked_with_safetensors,
            }
        )
    )
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
