#!/usr/bin/env python3
"""The thread-pool engine (what ``engine="auto"`` falls back to where io_uring is refused)
against io_uring, on the same files, cold, interleaved pair by pair (shared/MEASURING.md):

1. the paper's read sweep: ``ringtier bench read`` (posix-threads against uring-direct,
   concurrency swept, cold passes, repeats interleaved inside one run);
2. a 1 GiB checkpoint: ``ringtier ckpt --engine uring|posix save`` (one part, fsynced) and
   ``restore`` (fsynced), caches dropped before every pass, uring and posix alternating.

Usage (root, for drop_caches; a release build):
  cargo build --release -p ringtier-cli
  python3 bench/engine_fallback.py --bin target/release/ringtier --work /tmp/ef \\
      --out bench/results/engine-fallback
The work directory must be on the file system to measure (ext4 here); it is removed after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def run(cmd) -> tuple[str, float, float]:
    """stdout, wall seconds, CPU seconds of the child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"{cmd}: {p.stdout}{p.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p.stdout, wall, cpu


def summary(xs):
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ringtier")
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", default="bench/results/engine-fallback")
    ap.add_argument("--files", type=int, default=4096)
    ap.add_argument("--ckpt-mib", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    work, out = Path(a.work), Path(a.out)
    if work.exists():
        sys.exit(f"{work} exists; give a new directory")
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True)
    try:
        ds = work / "ds"
        run([a.bin, "gen", "--preset", "imagenet", "--files", a.files, "--dir", ds])
        read_json = out / "read.json"
        read_cmd = [a.bin, "bench", "read", "--dir", ds, "--repeats", a.repeats, "--concurrency", "1,4,16,64",
                    "--engines", "posix-threads,uring-direct", "--json", read_json]
        table, _, _ = run(read_cmd)
        read = json.loads(read_json.read_text())

        part = work / "weights.bin"
        with open(part, "wb") as f:
            for _ in range(a.ckpt_mib):
                f.write(os.urandom(1 << 20))
        size = part.stat().st_size
        pairs = {"save": [], "restore": []}
        sides = {e: {"save_s": [], "save_cpu_s": [], "restore_s": [], "restore_cpu_s": []} for e in ("uring", "posix")}
        for r in range(a.repeats):
            got = {}
            for engine in ("uring", "posix") if r % 2 == 0 else ("posix", "uring"):
                tier = work / f"ckpt-{engine}"
                shutil.rmtree(tier, ignore_errors=True)
                shutil.rmtree(work / "out", ignore_errors=True)
                drop_caches()
                so, wall, cpu = run([a.bin, "ckpt", "--engine", engine, "--tiers", tier, "save", "--step", "1",
                                     "--part", f"w={part}", "--no-drain"])
                m = re.search(r"in ([0-9.]+) s", so)
                save_s = float(m.group(1)) if m else wall
                drop_caches()
                so, wall, rcpu = run([a.bin, "ckpt", "--engine", engine, "--tiers", tier, "restore",
                                      "--out", work / "out"])
                m = re.search(r"in ([0-9.]+) s \(", so)
                restore_s = float(m.group(1)) if m else wall
                if (work / "out" / "w").stat().st_size != size:
                    sys.exit("restored size differs")
                s = sides[engine]
                s["save_s"].append(save_s)
                s["save_cpu_s"].append(cpu)
                s["restore_s"].append(restore_s)
                s["restore_cpu_s"].append(rcpu)
                got[engine] = (save_s, restore_s)
                shutil.rmtree(tier, ignore_errors=True)
            pairs["save"].append(got["posix"][0] / got["uring"][0])
            pairs["restore"].append(got["posix"][1] / got["uring"][1])

        def mbps(secs):
            return summary([size / s / 1e6 for s in secs])

        ckpt = {
            e: {
                "save_mb_per_s": mbps(v["save_s"]),
                "restore_mb_per_s": mbps(v["restore_s"]),
                "save_cpu_s_per_gib": summary([c / (size / (1 << 30)) for c in v["save_cpu_s"]]),
                "restore_cpu_s_per_gib": summary([c / (size / (1 << 30)) for c in v["restore_cpu_s"]]),
                "raw": v,
            }
            for e, v in sides.items()
        }
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        fs = subprocess.run(["findmnt", "-no", "FSTYPE", "-T", str(work)], capture_output=True, text=True).stdout.strip()
        result = {
            "schema": "ringtier.bench.engine-fallback/1",
            "command": " ".join(sys.argv),
            "commit": commit,
            "machine": {"nproc": os.cpu_count(), "kernel": platform.release(), "filesystem": fs},
            "read": {"command": " ".join(str(c) for c in read_cmd), "report": str(read_json.name),
                     "headline": read.get("headline")},
            "ckpt": {"bytes": size, "repeats": a.repeats, "posix_over_uring_time": {k: summary(v) for k, v in pairs.items()},
                     "engines": ckpt},
        }
        (out / "result.json").write_text(json.dumps(result, indent=1))
        lines = [table, "", f"checkpoint of {size / (1 << 30):.2f} GiB on {fs}, {a.repeats} pairs, cold, fsynced:"]
        for e, v in ckpt.items():
            sv, rv = v["save_mb_per_s"], v["restore_mb_per_s"]
            lines.append(f"  {e:6} save {sv['min']:.0f}/{sv['median']:.0f}/{sv['max']:.0f} MB/s "
                         f"({v['save_cpu_s_per_gib']['median']:.2f} CPU s/GiB), restore {rv['min']:.0f}/{rv['median']:.0f}/{rv['max']:.0f} MB/s "
                         f"({v['restore_cpu_s_per_gib']['median']:.2f} CPU s/GiB)")
        for k, v in pairs.items():
            s = summary(v)
            lines.append(f"  posix/uring {k} time: {s['min']:.2f}/{s['median']:.2f}/{s['max']:.2f} (min/median/max of pairs)")
        text = "\n".join(lines)
        print(text)
        (out / "result.txt").write_text(text + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
