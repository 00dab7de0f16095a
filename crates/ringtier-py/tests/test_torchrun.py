"""Two ranks under torchrun (gloo, CPU): every sample once per epoch across ranks and
DataLoader workers; a checkpoint step commits only when every rank's shard is durable; a rank
killed mid-save leaves the previous step loadable; async_save commits once every rank's
result() has its shard; another world size is refused."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_dataset

JOB = Path(__file__).parent / "torchrun_job.py"


def torchrun(nproc: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(JOB), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def results(out: Path, mode: str, n: int) -> list:
    return [json.loads((out / f"{mode}-{r}.json").read_text()) for r in range(n)]


def committed(tier: Path, prefix: str, step: int) -> bool:
    return (tier / "ckpt" / prefix / f"{step:020d}" / "MANIFEST.json").exists()


def test_two_ranks(tmp_path):
    data = tmp_path / "data"
    files = write_dataset(data, 203)
    fast, slow, out = tmp_path / "fast", tmp_path / "slow", tmp_path / "out"
    for d in (fast, slow, out):
        d.mkdir()
    tiers = f"{fast},{slow}"

    run = torchrun(2, "train", str(data), tiers, str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    r0, r1 = results(out, "train", 2)
    for epoch in range(2):
        per_rank = r0["epochs"][epoch]
        assert per_rank == r1["epochs"][epoch]
        seen = collections.Counter(k for keys in per_rank for k in keys)
        assert seen == collections.Counter(list(files)), f"epoch {epoch}: every sample exactly once"
        assert abs(len(per_rank[0]) - len(per_rank[1])) <= 2
    assert r0["epochs"][0] != r0["epochs"][1], "epochs are shuffled differently"
    assert r0["latest"] == r1["latest"] == 2 and r0["loaded_ok"] and r1["loaded_ok"]

    run = torchrun(2, "kill", str(data), tiers, str(out))
    assert run.returncode != 0, "rank 1 was killed"
    assert (out / "kill-1.json").exists(), run.stdout + run.stderr
    assert not (out / "kill-0.json").exists(), "rank 0 must not see step 3 committed"
    assert not committed(fast, "rank00001", 3), "rank 1 died mid-save (its shard is not committed)"
    assert not committed(fast, "global", 3), "no global manifest: step 3 is not committed"

    run = torchrun(2, "restore", str(data), tiers, str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    for r in results(out, "restore", 2):
        assert r["latest"] == 2 and 3 not in r["steps"], r
        assert r["loaded_ok"], "each rank loads its own shard of step 2"
        assert r["after_save"] == 4
        assert r["async_report"]["ok"] and r["async_report"]["step"] == 5 and r["async_report"]["bytes"] > 0, r
        assert r["async_done"] and r["async_latest"] == 5 and r["async_loaded_ok"], r
        assert r["again_error"] and "5" in r["again_error"] and r["again_latest"] == 5, r
    assert committed(fast, "global", 4) and committed(fast, "global", 5)

    run = torchrun(1, "reshard", str(data), tiers, str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    (r,) = results(out, "reshard", 1)
    assert r["error"] and "saved by 2 ranks; this job has 1" in r["error"]
