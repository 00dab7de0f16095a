"""Where the Python input path's time goes: the same files read cold by `ringtier bench read`
(uring-direct, depth 32), by the Rust loader alone (`ringtier bench train --no-decode
--compute-ms 0`, batch 64, prefetch 2) and by `ringtier.torch.IterableDataset` in a
`DataLoader(batch_size=None)` (0 workers, one tensor per sample), interleaved, ratios to
`bench read` pair by pair.

    python bench/python/loader_layers.py --dir bench/work/inet --cli target/release/ringtier \\
        [--repeats 3] [--json out.json] [--md out.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loader_bench import drop_caches, manifest_keys, run_cli, run_pass  # noqa: E402


def rust_loader(cli: str, root: str, keys: List[str], nbytes: int) -> float:
    """MB/s of one cold epoch of the Rust loader (images/s times the mean sample size)."""
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"rt-bench-train-{os.getpid()}.json")
    drop_caches(root, keys)
    cmd = [cli, "bench", "train", "--dir", root, "--batch", "64", "--epochs", "1", "--prefetch", "2",
           "--compute-ms", "0", "--no-decode", "--repeats", "1", "--json", out]
    subprocess.run(cmd, check=True, capture_output=True)
    with open(out) as f:
        d = json.load(f)
    os.unlink(out)
    ips = d["points"][0]["images_per_sec"]["median"]
    return ips * nbytes / len(keys) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    keys = manifest_keys(a.dir)
    mb_s: Dict[str, List[float]] = {"bench read": [], "Rust loader": [], "IterableDataset": []}
    nbytes = 0
    for rep in range(a.repeats):
        drop_caches(a.dir, keys)
        r = run_cli(a.cli, a.dir, 32)
        nbytes = int(r["bytes"])
        mb_s["bench read"].append(r["mb_s"])
        mb_s["Rust loader"].append(rust_loader(a.cli, a.dir, keys, nbytes))
        drop_caches(a.dir, keys)
        mb_s["IterableDataset"].append(run_pass("ringtier", 0, a.dir, keys, 64, rep, False)["mb_s"])
        print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in mb_s.items()), flush=True)
    ref = mb_s["bench read"]
    lines = [
        "# Python input path by layer against `ringtier bench read` (cold, interleaved)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {os.cpu_count()} cores; {len(keys)} files, "
        f"{nbytes / 1e9:.2f} GB in {os.path.abspath(a.dir)}; drop_caches before every pass; batch 64, prefetch 2; "
        f"{a.repeats} repeats; load average at the end {os.getloadavg()[0]:.1f}.",
        "",
        f"Command: `{' '.join([os.path.basename(sys.executable)] + sys.argv)}`",
        "",
        "| layer | MB/s min / median / max | x bench read, pair by pair (min / median / max) |",
        "|---|---|---|",
    ]
    for name, xs in mb_s.items():
        r = [x / b for x, b in zip(xs, ref)]
        lines.append(f"| {name} | {min(xs):.0f} / {statistics.median(xs):.0f} / {max(xs):.0f} | "
                     f"{min(r):.2f} / {statistics.median(r):.2f} / {max(r):.2f} |")
    text = "\n".join(lines)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"mb_s": mb_s, "files": len(keys), "bytes": nbytes, "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()
