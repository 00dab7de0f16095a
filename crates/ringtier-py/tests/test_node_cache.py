"""A node cache shared across processes (issue 30): two local ranks under torchrun, one node of
a two-node job, share one clairvoyant cache as a directory (`ringtier.Cache(node_dir=...,
local_ranks=2)`). The directory never holds two copies of a sample nor more copies than its
capacity, every byte read is right, and the node reads fewer bytes from the slow tier than the
same ranks with a cache each of half the size."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

JOB = Path(__file__).parent / "node_cache_job.py"
SIZE = 4096


def run(mode: str, data: Path, node_dir: Path, cap: int, out: Path) -> list:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(JOB),
           mode, str(data), str(node_dir), str(cap), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "RT_NODES": "2"})
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads((out / f"{mode}-{r}.json").read_text()) for r in range(2)]


def test_two_local_ranks_share_one_node_directory(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(400):
        (data / f"s{i:04d}.bin").write_bytes(bytes((i * 7 + b) % 251 for b in range(SIZE)))
    node_dir, out = tmp_path / "node", tmp_path / "out"
    out.mkdir()
    cap = 200 * SIZE  # half the dataset: the node reads half of it an epoch
    node = run("node", data, node_dir, cap, out)
    rank = run("rank", data, node_dir, cap, out)
    assert all(r["reads"] == 4 * 100 for r in node + rank), "each rank reads its 100 samples an epoch"
    for epoch, found in enumerate(node[0]["copies"]):
        per_sample = collections.Counter(sample for _, sample, _ in found)
        assert all(n == 1 for n in per_sample.values()), f"epoch {epoch}: two copies of one sample: {per_sample}"
        assert sum(size for _, _, size in found) <= cap + 48 * 200, f"epoch {epoch}: over capacity"
    shared = sum(sum(r["slow_bytes"][1:]) for r in node)
    apart = sum(sum(r["slow_bytes"][1:]) for r in rank)
    print(f"slow-tier bytes over the warm epochs: node directory {shared}, a cache per rank {apart}")
    assert shared < apart, f"node directory {shared} bytes vs a cache per rank {apart}"
    assert not any(node_dir.iterdir()), "local rank 0 removed the plan's directory"


def test_node_cache_arguments_are_checked(tmp_path):
    import pytest

    import ringtier

    with pytest.raises(ringtier.InvalidInputError, match="local_ranks"):
        ringtier.Cache(1 << 20, policy="clairvoyant", node_dir=str(tmp_path))
    with pytest.raises(ringtier.InvalidInputError, match="node_dir"):
        ringtier.Cache(1 << 20, policy="clairvoyant", local_ranks=2)
    with pytest.raises(ringtier.InvalidInputError, match="at least 1 local rank"):
        ringtier.Cache(1 << 20, policy="clairvoyant", node_dir=str(tmp_path), local_ranks=0)
    c = ringtier.Cache(1 << 20, policy="lru", node_dir=str(tmp_path), local_ranks=4)
    assert c.local_ranks == 4 and c.levels == [(str(tmp_path), 1 << 20)]
