#!/usr/bin/env python3
"""boto3 baselines for `ringtier bench s3` (run by it; prints one JSON line).

upload: s3.upload_file(FILE) with a TransferConfig (multipart, max_concurrency threads).
read:   a ThreadPoolExecutor of THREADS doing get_object(...)["Body"].read() over KEYS.

Wall time and this process's CPU time (all threads, getrusage) cover the transfer only, not
the interpreter's start or imports.
"""
import argparse
import json
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def client(args, pool):
    return boto3.client(
        "s3",
        endpoint_url=args.endpoint,
        region_name="us-east-1",
        aws_access_key_id=args.access_key,
        aws_secret_access_key=args.secret_key,
        config=Config(max_pool_connections=max(pool, 10), retries={"max_attempts": 3}),
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["upload", "read"])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--access-key", required=True)
    p.add_argument("--secret-key", required=True)
    p.add_argument("--file")
    p.add_argument("--key")
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--chunk", type=int, default=8 << 20)
    p.add_argument("--keys-file")
    p.add_argument("--threads", type=int, default=8)
    args = p.parse_args()
    if args.mode == "upload":
        s3 = client(args, args.concurrency)
        cfg = TransferConfig(
            multipart_threshold=args.chunk,
            multipart_chunksize=args.chunk,
            max_concurrency=args.concurrency,
            use_threads=True,
        )
        t0, c0 = time.perf_counter(), cpu()
        s3.upload_file(args.file, args.bucket, args.key, Config=cfg)
        t1, c1 = time.perf_counter(), cpu()
        size = s3.head_object(Bucket=args.bucket, Key=args.key)["ContentLength"]
        print(json.dumps({"seconds": t1 - t0, "cpu_seconds": c1 - c0, "bytes": size}))
    else:
        with open(args.keys_file) as f:
            keys = [k for k in f.read().split("\n") if k]
        s3 = client(args, args.threads)

        def get(k):
            return len(s3.get_object(Bucket=args.bucket, Key=k)["Body"].read())

        with ThreadPoolExecutor(max_workers=args.threads) as pool:
            list(pool.map(get, keys[: min(len(keys), args.threads)]))  # warm the connection pool
            t0, c0 = time.perf_counter(), cpu()
            total = sum(pool.map(get, keys))
            t1, c1 = time.perf_counter(), cpu()
        print(json.dumps({"seconds": t1 - t0, "cpu_seconds": c1 - c0, "bytes": total}))


if __name__ == "__main__":
    sys.exit(main())
