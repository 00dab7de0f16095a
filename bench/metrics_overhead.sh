#!/usr/bin/env bash
# Throughput of `ringtier bench read` with the Prometheus exporter on versus off, interleaved
# pairs in separate processes (the recorder is process-global), same dataset, engine and depth.
#
#   bench/metrics_overhead.sh            # 7 pairs, uring-direct depth 32, ImageNet-like set
#   PAIRS=5 ENGINE=posix-threads CONC=16 bench/metrics_overhead.sh
#
# Results: bench/results/metrics-overhead.{json,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${PAIRS:-7}
ENGINE=${ENGINE:-uring-direct}
CONC=${CONC:-32}
DIR=${DIR:-bench/work/imagenet}
OUT=${OUT:-bench/results/metrics-overhead}
cargo build --release -q -p ringtier-cli
RT=./target/release/ringtier
[ -f "$DIR/.ringtier-manifest.tsv" ] || $RT gen --preset imagenet --dir "$DIR"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
BASE=("$RT" bench read --dir "$DIR" --engines "$ENGINE" --concurrency "$CONC" --repeats 1)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$PAIRS"); do
  if (( i % 2 )); then
    "${BASE[@]}" --seed "$i" --json "$tmp/off-$i.json" >/dev/null 2>&1
    "${BASE[@]}" --seed "$i" --json "$tmp/on-$i.json" --metrics-addr "127.0.0.1:$port" >/dev/null 2>&1
  else
    "${BASE[@]}" --seed "$i" --json "$tmp/on-$i.json" --metrics-addr "127.0.0.1:$port" >/dev/null 2>&1
    "${BASE[@]}" --seed "$i" --json "$tmp/off-$i.json" >/dev/null 2>&1
  fi
  echo "pair $i/$PAIRS done"
done
FS=$(findmnt -n -o FSTYPE --target "$DIR" 2>/dev/null || echo unknown)
python3 - "$tmp" "$PAIRS" "$OUT" "${BASE[*]}" "$FS" <<'PY'
import json, os, platform, statistics, sys, datetime
tmp, pairs, out, cmd, fs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
rows = []
for i in range(1, pairs + 1):
    on = json.load(open(f"{tmp}/on-{i}.json"))["points"][0]["runs"][0]
    off = json.load(open(f"{tmp}/off-{i}.json"))["points"][0]["runs"][0]
    bw = lambda r: r["bytes"] / r["wall_seconds"] / 1e6
    cpu = lambda r: r["cpu_seconds"] / (r["bytes"] / 2**30)
    rows.append({"pair": i, "off_mb_per_sec": bw(off), "on_mb_per_sec": bw(on), "ratio_on_over_off": bw(on) / bw(off),
                 "off_cpu_seconds_per_gib": cpu(off), "on_cpu_seconds_per_gib": cpu(on)})
mmm = lambda k: {"min": min(r[k] for r in rows), "median": statistics.median(r[k] for r in rows), "max": max(r[k] for r in rows)}
summary = {k: mmm(k) for k in rows[0] if k != "pair"}
rep = {"schema": "ringtier.bench.metrics-overhead/1",
       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
       "command": cmd + "  [--metrics-addr 127.0.0.1:PORT for 'on']", "filesystem": fs, "pairs": rows, "summary": summary}
json.dump(rep, open(out + ".json", "w"), indent=2)
md = [f"# Metrics overhead on `bench read` ({rep['date']})", "", f"Command: `{rep['command']}`; dataset on {fs}, passes cold (evicted) where the filesystem allows, pairs interleaved, separate processes.", "",
      "| | min | median | max |", "|---|---|---|---|"]
for k in summary:
    md.append(f"| {k} | {summary[k]['min']:.3f} | {summary[k]['median']:.3f} | {summary[k]['max']:.3f} |")
open(out + ".md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
