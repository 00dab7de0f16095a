#!/usr/bin/env bash
# Batched O_DIRECT random reads from one file on ext4: ringtier's io_uring tier against fio,
# same file, same block size, same depth, one thread each, interleaved fio/ringtier pairs.
#
#   bench/randread_vs_fio.sh                 # 5 pairs of 10 s, 2 GiB file, bs 128k, depth 32
#   PAIRS=7 RUNTIME=20 BS=64k DEPTH=16 bench/randread_vs_fio.sh
#
# The exact fio command is printed and kept in the report. Results go to
# bench/results/randread-vs-fio.{json,md} (override with OUT=path-prefix).
set -euo pipefail
cd "$(dirname "$0")/.."

PAIRS=${PAIRS:-5}
RUNTIME=${RUNTIME:-10}
FILE=${FILE:-bench/work/randread-2g.bin}
SIZE=${SIZE:-2G}
BS=${BS:-128k}
DEPTH=${DEPTH:-32}
OUT=${OUT:-bench/results/randread-vs-fio}

command -v fio >/dev/null || { echo "fio is not installed: apt-get install -y fio" >&2; exit 1; }
cargo build --release -q -p ringtier-cli
RT=./target/release/ringtier

# Create the file once (random data, O_DIRECT writes, fsynced).
$RT bench randread --file "$FILE" --size "$SIZE" --bs "$BS" --depth "$DEPTH" --runtime 0.5 >/dev/null

FIO=(fio --name=randread --filename="$FILE" --size="$SIZE" --ioengine=io_uring --direct=1
     --rw=randread --bs="$BS" --iodepth="$DEPTH" --numjobs=1 --iomem_align=4096
     --runtime="$RUNTIME" --time_based --randrepeat=0 --output-format=json)
RING=("$RT" bench randread --file "$FILE" --size "$SIZE" --bs "$BS" --depth "$DEPTH"
      --runtime "$RUNTIME" --direct required)
echo "fio:      ${FIO[*]}"
echo "ringtier: ${RING[*]}"

tmp=$(mktemp -d)
# shellcheck source=bench/fio_memory.sh
. bench/fio_memory.sh
trap 'rm -rf "$tmp"; fio_memory_restore' EXIT
for i in $(seq 1 "$PAIRS"); do
  # Alternate which side goes first, so drift does not favour one.
  if (( i % 2 )); then
    "${FIO[@]}" --output="$tmp/fio-$i.json" >/dev/null
    "${RING[@]}" --seed "$i" --json "$tmp/ring-$i.json" >/dev/null
  else
    "${RING[@]}" --seed "$i" --json "$tmp/ring-$i.json" >/dev/null
    "${FIO[@]}" --output="$tmp/fio-$i.json" >/dev/null
  fi
  echo "pair $i/$PAIRS done"
done

FS=$(findmnt -n -o FSTYPE --target "$(dirname "$FILE")" 2>/dev/null || stat -f -c %T "$(dirname "$FILE")")
python3 - "$tmp" "$PAIRS" "$OUT" "$FS" "${FIO[*]}" "${RING[*]}" <<'PY'
import json, os, platform, statistics, sys, datetime
tmp, pairs, out, fs, fio_cmd, ring_cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
rows = []
for i in range(1, pairs + 1):
    f = json.load(open(f"{tmp}/fio-{i}.json"))["jobs"][0]
    r = json.load(open(f"{tmp}/ring-{i}.json"))
    run = r["runs"][0]
    fio_bw = f["read"]["bw_bytes"] / 1e6
    fio_secs = f["job_runtime"] / 1000.0
    fio_cpu = (f["usr_cpu"] + f["sys_cpu"]) / 100.0 * fio_secs
    fio_gib = f["read"]["io_bytes"] / 2**30
    ring_gib = run["bytes"] / 2**30
    rows.append({
        "pair": i,
        "fio_mb_per_sec": fio_bw,
        "ringtier_mb_per_sec": run["mb_per_sec"],
        "ratio": run["mb_per_sec"] / fio_bw,
        "fio_cpu_seconds_per_gib": fio_cpu / fio_gib,
        "ringtier_cpu_seconds_per_gib": run["cpu_seconds"] / ring_gib,
        "fio_clat_p99_us": f["read"]["clat_ns"]["percentile"].get("99.000000", 0) / 1000,
    })
def mmm(key):
    v = [row[key] for row in rows]
    return {"min": min(v), "median": statistics.median(v), "max": max(v)}
summary = {k: mmm(k) for k in ["fio_mb_per_sec", "ringtier_mb_per_sec", "ratio", "fio_cpu_seconds_per_gib", "ringtier_cpu_seconds_per_gib"]}
mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
report = {
    "schema": "ringtier.bench.randread-vs-fio/1",
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "machine": {"cpus": os.cpu_count(), "memory_bytes": mem, "kernel": platform.release()},
    "storage": {"filesystem": fs, "note": "virtual disk; cold reads are noisy, compare within one run"},
    "fio_command": fio_cmd,
    "fio_memory": os.environ.get("FIO_MEMORY", ""),
    "ringtier_command": ring_cmd,
    "pairs": rows,
    "summary": summary,
}
os.makedirs(os.path.dirname(out), exist_ok=True)
json.dump(report, open(out + ".json", "w"), indent=2)
s = summary
md = [
    f"# Random O_DIRECT reads: ringtier vs fio ({report['date']})",
    "",
    f"Machine: {report['machine']['cpus']} CPUs, {mem/2**30:.0f} GiB, kernel {report['machine']['kernel']}; storage: {fs} on the virtual disk.",
    "",
    f"- fio: `{fio_cmd}`",
    f"- ringtier: `{ring_cmd}`",
    f"- memory: {report['fio_memory']}",
    "",
    "| pair | fio MB/s | ringtier MB/s | ratio | fio CPU s/GiB | ringtier CPU s/GiB |",
    "|---|---|---|---|---|---|",
]
for r in rows:
    md.append(f"| {r['pair']} | {r['fio_mb_per_sec']:.1f} | {r['ringtier_mb_per_sec']:.1f} | {r['ratio']:.3f} | {r['fio_cpu_seconds_per_gib']:.3f} | {r['ringtier_cpu_seconds_per_gib']:.3f} |")
md.append("")
md.append("| | min | median | max |")
md.append("|---|---|---|---|")
for k, label in [("fio_mb_per_sec", "fio MB/s"), ("ringtier_mb_per_sec", "ringtier MB/s"), ("ratio", "ringtier / fio (per pair)"),
                 ("fio_cpu_seconds_per_gib", "fio CPU s/GiB"), ("ringtier_cpu_seconds_per_gib", "ringtier CPU s/GiB")]:
    md.append(f"| {label} | {s[k]['min']:.3f} | {s[k]['median']:.3f} | {s[k]['max']:.3f} |")
open(out + ".md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
