#!/usr/bin/env bash
# The read micro-benchmark's file set, ringtier (uring-direct, one ring) against fio
# (io_uring, O_DIRECT) over the same files, in the same order, at the same depth and block
# size, interleaved.
#
#   bench/read_vs_fio.sh                      # ImageNet-like 16,384 files, bs 128k, depths 1 8 32 64, 5 pairs
#   PAIRS=3 DEPTHS="16 32" bench/read_vs_fio.sh
#
# fio reads only whole blocks of each file (a file of 200 KB read with --bs=128k yields one
# 128 KiB read; files under 128 KiB are skipped), so the dataset for this comparison has every
# size rounded up to a multiple of the block size (`ringtier gen --size-multiple`): both sides
# then read every byte, in reads of the block size, one file after another per slot.
#
# The fio command for a file set (printed and kept in the report):
#   fio --name=files --opendir=DIR --ioengine=io_uring --direct=1 --rw=read --bs=BS \
#       --iodepth=D --openfiles=D --numjobs=1 --iomem_align=4096 --invalidate=0 --fadvise_hint=0 \
#       --file_service_type=sequential --output-format=json
# --file_service_type=sequential makes fio finish a file before moving on, as a loader does
# (fio's default, roundrobin, switches file after every I/O); --invalidate=0 --fadvise_hint=0:
# with O_DIRECT fio needs neither, and both cost it time per file. Each makes fio faster here:
# the baseline is fio at its best. ringtier reads the files in the same order as fio
# (--order readdir: a recursive walk in readdir order).
# fio also reads the dataset's manifest file (about 0.7 MB next to 2.6 GB).
# Metadata is warm on both sides: fio stats every file in its set-up, before its timed phase,
# so its opens find the inodes cached. ringtier's passes are made cold with RINGTIER_COLD=fadvise
# (each file's pages dropped with posix_fadvise DONTNEED; O_DIRECT reads none anyway), not
# drop_caches, which would also evict every inode and dentry and make its timed opens read
# them from the disk (0.6x fio at depth 1 that way, against about 0.9x with equal metadata).
# Results: bench/results/read-vs-fio.{json,md} (override with OUT=path-prefix).
set -euo pipefail
cd "$(dirname "$0")/.."

PAIRS=${PAIRS:-5}
DEPTHS=${DEPTHS:-"1 8 32 64"}
BS=${BS:-128k}
DIR=${DIR:-bench/work/imagenet-bs$BS}
OUT=${OUT:-bench/results/read-vs-fio}

command -v fio >/dev/null || { echo "fio is not installed: apt-get install -y fio" >&2; exit 1; }
cargo build --release -q -p ringtier-cli
RT=./target/release/ringtier
if [ ! -f "$DIR/.ringtier-manifest.tsv" ]; then
  $RT gen --preset imagenet --size-multiple "$BS" --dir "$DIR"
fi

tmp=$(mktemp -d)
# shellcheck source=bench/fio_memory.sh
. bench/fio_memory.sh
trap 'rm -rf "$tmp"; fio_memory_restore' EXIT
for d in $DEPTHS; do
  FIO=(fio --name=files --opendir="$DIR" --ioengine=io_uring --direct=1 --rw=read --bs="$BS"
       --iodepth="$d" --openfiles="$d" --numjobs=1 --iomem_align=4096 --invalidate=0 --fadvise_hint=0
       --file_service_type=sequential --output-format=json)
  RING=(env RINGTIER_COLD=fadvise "$RT" bench read --dir "$DIR" --engines uring-direct --depths "$d" --rings 1
        --read-size "$BS" --order readdir --repeats 1)
  echo "fio:      ${FIO[*]}"
  echo "ringtier: ${RING[*]}"
  for i in $(seq 1 "$PAIRS"); do
    if (( i % 2 )); then
      "${FIO[@]}" --output="$tmp/fio-$d-$i.json" >/dev/null 2>&1
      "${RING[@]}" --seed "$i" --json "$tmp/ring-$d-$i.json" >/dev/null 2>&1
    else
      "${RING[@]}" --seed "$i" --json "$tmp/ring-$d-$i.json" >/dev/null 2>&1
      "${FIO[@]}" --output="$tmp/fio-$d-$i.json" >/dev/null 2>&1
    fi
    echo "depth $d: pair $i/$PAIRS done"
  done
  echo "${FIO[*]}" > "$tmp/fio-cmd-$d"
  echo "${RING[*]}" > "$tmp/ring-cmd-$d"
done

FS=$(findmnt -n -o FSTYPE --target "$DIR" 2>/dev/null || stat -f -c %T "$DIR")
python3 - "$tmp" "$PAIRS" "$OUT" "$FS" "$DEPTHS" "$DIR" <<'PY'
import json, os, platform, statistics, sys, datetime
tmp, pairs, out, fs, depths, ds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5].split(), sys.argv[6]
def mmm(v):
    return {"min": min(v), "median": statistics.median(v), "max": max(v)}
points = []
for d in depths:
    rows = []
    for i in range(1, pairs + 1):
        f = json.load(open(f"{tmp}/fio-{d}-{i}.json"))["jobs"][0]
        r = json.load(open(f"{tmp}/ring-{d}-{i}.json"))
        run = r["points"][0]["runs"][0]
        fio_secs = f["job_runtime"] / 1000.0
        fio_bw = f["read"]["io_bytes"] / fio_secs / 1e6
        ring_bw = run["bytes"] / run["wall_seconds"] / 1e6
        rows.append({
            "pair": i,
            "fio_bytes": f["read"]["io_bytes"],
            "ringtier_bytes": run["bytes"],
            "fio_mb_per_sec": fio_bw,
            "ringtier_mb_per_sec": ring_bw,
            "ratio": ring_bw / fio_bw,
            "fio_cpu_seconds_per_gib": (f["usr_cpu"] + f["sys_cpu"]) / 100.0 * fio_secs / (f["read"]["io_bytes"] / 2**30),
            "ringtier_cpu_seconds_per_gib": run["cpu_seconds"] / (run["bytes"] / 2**30),
        })
    points.append({
        "depth": int(d),
        "fio_command": open(f"{tmp}/fio-cmd-{d}").read().strip(),
        "ringtier_command": open(f"{tmp}/ring-cmd-{d}").read().strip(),
        "pairs": rows,
        "summary": {k: mmm([r[k] for r in rows]) for k in ["fio_mb_per_sec", "ringtier_mb_per_sec", "ratio", "fio_cpu_seconds_per_gib", "ringtier_cpu_seconds_per_gib"]},
    })
best = max(points, key=lambda p: p["summary"]["ringtier_mb_per_sec"]["median"])
mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
report = {
    "schema": "ringtier.bench.read-vs-fio/1",
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "machine": {"cpus": os.cpu_count(), "memory_bytes": mem, "kernel": platform.release()},
    "storage": {"filesystem": fs, "dataset": ds, "note": "virtual disk; compare within one run"},
    "fio_memory": os.environ.get("FIO_MEMORY", ""),
    "points": points,
    "best_ringtier_depth": best["depth"],
    "ratio_at_best_depth": best["summary"]["ratio"],
}
os.makedirs(os.path.dirname(out), exist_ok=True)
json.dump(report, open(out + ".json", "w"), indent=2)
md = [f"# File-set reads: ringtier uring-direct vs fio ({report['date']})", "",
      f"Machine: {os.cpu_count()} CPUs, {mem/2**30:.0f} GiB, kernel {platform.release()}; storage: {fs} on the virtual disk; dataset `{ds}`.", "",
      f"- fio: `{points[0]['fio_command']}` (depth varies)",
      f"- ringtier: `{points[0]['ringtier_command']}` (depth varies)",
      f"- memory: {report['fio_memory']}",
      "- metadata: warm on both sides (fio stats every file before its timed phase; ringtier's passes drop only the files' pages, `RINGTIER_COLD=fadvise`)", "",
      "| depth | fio MB/s min/med/max | ringtier MB/s min/med/max | ratio min/med/max | fio CPU s/GiB | ringtier CPU s/GiB |",
      "|---|---|---|---|---|---|"]
for p in points:
    s = p["summary"]
    f = lambda k: f"{s[k]['min']:.1f} / {s[k]['median']:.1f} / {s[k]['max']:.1f}"
    md.append(f"| {p['depth']} | {f('fio_mb_per_sec')} | {f('ringtier_mb_per_sec')} | {s['ratio']['min']:.3f} / {s['ratio']['median']:.3f} / {s['ratio']['max']:.3f} | {s['fio_cpu_seconds_per_gib']['median']:.3f} | {s['ringtier_cpu_seconds_per_gib']['median']:.3f} |")
md += ["", f"ringtier's best depth: {best['depth']}; ratio to fio there (per pair): min {best['summary']['ratio']['min']:.3f}, median {best['summary']['ratio']['median']:.3f}, max {best['summary']['ratio']['max']:.3f}."]
open(out + ".md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
