"""WebDataset shards read from S3 into a PyTorch loop: ringtier's RecordDataset (``s3://`` URL,
``format="wds"``) against s3torchconnector's S3IterableDataset with webdataset's tar parsing (as
s3torchconnector's docs show it) and mosaicml-streaming's StreamingDataset (the same samples
written as MDS shards, its own format), on one loopback S3 server.

    flock /tmp/ringtier-bench.lock python bench/python/wds_s3_bench.py --dir /dev/shm/rt-wds-s3 \\
        [--files 2048] [--median 100k] [--shards 16] [--latency-ms 4] [--workers 0,2] [--repeats 3] \\
        [--server target/release/ringtier-s3-server] [--cli target/release/ringtier] [--json o.json] [--md o.md]

Data: ``ringtier gen --format wds`` (per sample a ``.bin`` of random bytes, log-normal sizes, and
a ``.cls``), uploaded once to the test kit's s3s-fs server (``ringtier-s3-server``, objects under
--dir; on /dev/shm the server's disk is memory), which answers every request ``--latency-ms``
late (a remote endpoint's round trip). For streaming the same samples are written as MDS shards
(``MDSWriter``, columns ``bin: bytes, cls: int``) and uploaded beside them.

Each pass is a fresh Python process (so no client keeps a cache between passes) that makes the
dataset and a ``DataLoader(batch_size=None, num_workers=N)``, iterates one epoch and counts
samples and payload bytes (checked: every sample, every ``.bin`` byte; MB/s are of the ``.bin``
bytes): wall time from before the dataset is made, CPU
of the pass's process and its DataLoader workers (user+sys; the server is another process). Each
peer is swept over the same worker counts; streaming's local cache directory is emptied before
each of its passes (cold). Passes are interleaved (order rotated per repeat); ratios are ringtier
against each peer at its best worker count, repeat by repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

from _report import write_report  # bench/python/_report.py (the script's own folder is on sys.path)

ACCESS_KEY, SECRET_KEY = "ringtier-test", "ringtier-test-secret"  # the test kit's server
BUCKET = "bench"


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _sample_bytes(sample: Dict[str, Any]) -> int:
    n = 0
    for k, v in sample.items():
        if k.startswith("__"):
            continue
        if hasattr(v, "numel"):
            n += v.numel() * v.element_size()
        elif isinstance(v, (bytes, bytearray, memoryview)):
            n += len(v)
        elif isinstance(v, (int, str)):
            n += len(str(v))
    return n


def one_pass(peer: str, endpoint: str, workers: int, cache: str) -> Dict[str, Any]:
    """One epoch of `peer` in this process; returns samples, bytes, seconds, cpu."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    t0, c0 = time.perf_counter(), _cpu()
    if peer == "ringtier":
        from ringtier.torch import RecordDataset

        ds: Any = RecordDataset(f"s3://{BUCKET}/wds?endpoint={endpoint}&region=us-east-1", format="wds")
    elif peer == "s3torchconnector":
        from s3torchconnector import S3ClientConfig, S3IterableDataset
        from webdataset.tariterators import group_by_keys, tar_file_expander

        class S3Wds(IterableDataset):
            """s3torchconnector's shards (sharded over workers) through webdataset's tar reader."""

            def __iter__(self):
                shards = S3IterableDataset.from_prefix(
                    f"s3://{BUCKET}/wds/", region="us-east-1", endpoint=endpoint,
                    s3client_config=S3ClientConfig(force_path_style=True), enable_sharding=True)
                return group_by_keys(tar_file_expander({"url": o.key, "stream": o} for o in shards))

        ds = S3Wds()
    elif peer == "streaming":
        from streaming import StreamingDataset

        os.environ["S3_ENDPOINT_URL"] = endpoint
        # batch_size sets its read-ahead (predownload: 8 batches of samples); 64 as the others'.
        ds = StreamingDataset(remote=f"s3://{BUCKET}/mds", local=cache, shuffle=False, batch_size=64)
    else:
        raise SystemExit(f"unknown peer {peer}")
    dl = DataLoader(ds, batch_size=None, num_workers=workers)
    samples = nbytes = 0
    for s in dl:
        samples += 1
        nbytes += _sample_bytes(s)
    del dl
    return {"samples": samples, "bytes": nbytes, "seconds": time.perf_counter() - t0, "cpu_seconds": _cpu() - c0,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def prepare(args: argparse.Namespace, endpoint: str) -> Dict[str, Any]:
    """Generates the shards, writes their MDS twin, uploads both; returns counts."""
    import boto3
    from botocore.config import Config

    src = os.path.join(args.dir, "gen")
    subprocess.run([args.cli, "gen", "--format", "wds", "--files", str(args.files), "--median", args.median,
                    "--shards", str(args.shards), "--dir", src], check=True, stdout=subprocess.DEVNULL)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                      config=Config(s3={"addressing_style": "path"}))
    shards = sorted(f for f in os.listdir(src) if f.endswith(".tar"))
    for f in shards:
        s3.upload_file(os.path.join(src, f), BUCKET, f"wds/{f}")
    # The same samples as MDS (streaming's format), shard size about the tar shards'.
    import tarfile

    from streaming import MDSWriter

    mds = os.path.join(args.dir, "mds")
    size = max(os.path.getsize(os.path.join(src, f)) for f in shards)
    samples = nbytes = 0
    with MDSWriter(out=mds, columns={"bin": "bytes", "cls": "int"}, size_limit=size) as w:
        for f in shards:
            with tarfile.open(os.path.join(src, f)) as t:
                cur: Dict[str, Any] = {}
                for m in t:
                    stem, ext = m.name.rsplit(".", 1)
                    data = t.extractfile(m).read()  # type: ignore[union-attr]
                    cur[ext] = data
                    if "bin" in cur and "cls" in cur:
                        w.write({"bin": cur["bin"], "cls": int(cur["cls"])})
                        samples += 1
                        nbytes += len(cur["bin"])
                        cur = {}
    for f in sorted(os.listdir(mds)):
        s3.upload_file(os.path.join(mds, f), BUCKET, f"mds/{f}")
    shutil.rmtree(src)
    shutil.rmtree(mds)
    return {"samples": samples, "bin_bytes": nbytes, "tar_shards": len(shards)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--files", type=int, default=2048)
    ap.add_argument("--median", default="100k")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--latency-ms", type=float, default=4.0)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peers", default="ringtier,s3torchconnector,streaming")
    ap.add_argument("--server", default="target/release/ringtier-s3-server")
    ap.add_argument("--cli", default="target/release/ringtier")
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--nw", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION="us-east-1")
    if args.one:
        print(json.dumps(one_pass(args.one, args.endpoint, args.nw, os.path.join(args.dir, "cache"))))
        return
    if os.path.exists(args.dir):
        sys.exit(f"{args.dir} exists: give a new directory (it is removed at the end)")
    os.makedirs(os.path.join(args.dir, "s3", BUCKET))
    server = subprocess.Popen([args.server, "--root", os.path.join(args.dir, "s3"), "--latency-ms", str(args.latency_ms)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    results: List[Dict[str, Any]] = []
    peers = args.peers.split(",")
    workers = [int(w) for w in args.workers.split(",")]
    try:
        assert server.stdout is not None
        endpoint = server.stdout.readline().strip()
        if not endpoint.startswith("http://"):
            sys.exit(f"the S3 server did not start: {endpoint!r}")
        data = prepare(args, endpoint)
        configs = [(p, w) for p in peers for w in workers]
        for rep in range(args.repeats):
            k = rep % len(configs)
            for peer, nw in configs[k:] + configs[:k]:
                shutil.rmtree(os.path.join(args.dir, "cache"), ignore_errors=True)
                la = os.getloadavg()[0]
                out = subprocess.run([sys.executable, __file__, "--dir", args.dir, "--one", peer, "--endpoint", endpoint,
                                      "--nw", str(nw)], check=True, capture_output=True, text=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                if r["samples"] != data["samples"] or r["bytes"] < data["bin_bytes"]:
                    raise SystemExit(f"{peer} with {nw} workers read {r['samples']} samples ({r['bytes']} bytes) of "
                                     f"{data['samples']} ({data['bin_bytes']} bytes of .bin)")
                r.update(peer=peer, workers=nw, repeat=rep, loadavg_before=la)
                results.append(r)
                print(f"{peer:18s} w{nw} rep {rep}: {r['samples'] / r['seconds']:8.1f} samples/s "
                      f"{data['bin_bytes'] / r['seconds'] / 1e6:7.1f} MB/s cpu {r['cpu_seconds']:.2f}s", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(args.dir, ignore_errors=True)
    gib = data["bin_bytes"] / 2**30
    rows: Dict[str, Any] = {}
    for peer in peers:
        for nw in workers:
            ps = [r for r in results if r["peer"] == peer and r["workers"] == nw]
            s = sorted(p["seconds"] for p in ps)
            rows[f"{peer} w{nw}"] = {
                "peer": peer, "workers": nw, "seconds": {"min": s[0], "median": statistics.median(s), "max": s[-1]},
                "samples_per_s_median": data["samples"] / statistics.median(s),
                "mb_per_s_median": data["bin_bytes"] / statistics.median(s) / 1e6,
                "cpu_s_per_gib_median": statistics.median(p["cpu_seconds"] / gib for p in ps),
                "peak_rss_mib_max": max(p["peak_rss_mib"] for p in ps)}

    def best(peer: str) -> int:
        return min(workers, key=lambda w: rows[f"{peer} w{w}"]["seconds"]["median"])

    ratios: Dict[str, Any] = {}
    rt_best = best("ringtier") if "ringtier" in peers else None
    for peer in peers:
        if peer == "ringtier" or rt_best is None:
            continue
        pb = best(peer)
        ra = {r["repeat"]: r for r in results if r["peer"] == "ringtier" and r["workers"] == rt_best}
        rb = {r["repeat"]: r for r in results if r["peer"] == peer and r["workers"] == pb}
        sp = sorted(rb[k]["seconds"] / ra[k]["seconds"] for k in ra if k in rb)
        cp = sorted(ra[k]["cpu_seconds"] / rb[k]["cpu_seconds"] for k in ra if k in rb)
        ratios[f"ringtier w{rt_best} vs {peer} w{pb}"] = {
            "speed": {"min": sp[0], "median": statistics.median(sp), "max": sp[-1]},
            "cpu": {"min": cp[0], "median": statistics.median(cp), "max": cp[-1]}}
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "machine": f"{socket.gethostname()}, {os.cpu_count()} cores, kernel {platform.release()}",
            "command": "python " + " ".join(sys.argv), "data": data, "latency_ms": args.latency_ms,
            "repeats": args.repeats, "storage": f"s3s-fs on loopback, objects under {args.dir}"}
    lines = ["# WebDataset shards from S3: ringtier vs s3torchconnector (+ webdataset) vs mosaicml-streaming", "",
             f"{meta['date']}; {meta['machine']}; {meta['storage']}, {args.latency_ms:g} ms per request; "
             f"{data['samples']} samples in {data['tar_shards']} tar shards, {gib:.2f} GiB of `.bin`; "
             f"{args.repeats} interleaved repeats, each pass a fresh process.", "",
             f"Command: `{meta['command']}`", "",
             "| peer, DataLoader workers | seconds min / median / max | samples/s (median) | MB/s (median) "
             "| CPU s per GiB (median) | peak RSS MiB |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        s = r["seconds"]
        lines.append(f"| {name} | {s['min']:.2f} / {s['median']:.2f} / {s['max']:.2f} | {r['samples_per_s_median']:.0f} "
                     f"| {r['mb_per_s_median']:.0f} | {r['cpu_s_per_gib_median']:.2f} | {r['peak_rss_mib_max']:.0f} |")
    lines += ["", "| ratio, pair by pair (speed: peer seconds / ringtier seconds; CPU: ringtier / peer) "
              "| speed min / median / max | CPU min / median / max |", "|---|---|---|"]
    for k, v in ratios.items():
        a, b = v["speed"], v["cpu"]
        lines.append(f"| {k} | {a['min']:.2f} / {a['median']:.2f} / {a['max']:.2f} "
                     f"| {b['min']:.2f} / {b['median']:.2f} / {b['max']:.2f} |")
    text = "\n".join(lines) + "\n"
    write_report(text, {"meta": meta, "rows": rows, "ratios": ratios, "passes": results}, args.json, args.md)


if __name__ == "__main__":
    main()
