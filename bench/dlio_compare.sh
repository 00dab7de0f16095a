#!/usr/bin/env bash
# DLIO's PyTorch reader and ringtier's MLPerf-Storage-style presets on the same files, side by
# side (docs/TUNE.md, "DLIO side by side"; issue 29).
#
# For each preset (unet3d, resnet50, cosmoflow): DLIO generates the data set (npz, fixed
# sample size: record_length_stdev = 0), then, every run cold (drop_caches):
#   - fio reads every file once (O_DIRECT, 1 MiB, depth 32): the disk's ceiling for this set;
#   - DLIO (dlio_benchmark 2.0.0, framework and data loader pytorch, one epoch, no
#     checkpoint) with N emulated accelerators (mpirun -np N): its read threads swept at one
#     accelerator (equal budgets: its best), then N = 1, 2, 4, ... until AU < 90%, then
#     bisected: DLIO's largest count at AU >= 90%;
#   - ringtier (`ringtier tune --preset P --preset-data <DLIO's files>`, the engine's defaults)
#     the same search on the same files.
# AU is DLIO's: compute / time with the first step left out (ringtier reports it that way too,
# and every step besides).
#
# Needs root (drop_caches), fio, and DLIO in its own venv:
#   python3 -m venv /work/dlio-venv
#   /work/dlio-venv/bin/pip install --no-deps dlio-benchmark==2.0.0 pydftracer==1.0.2
#   /work/dlio-venv/bin/pip install mpi4py mpich hydra-core omegaconf h5py pandas psutil PyYAML
#   /work/dlio-venv/bin/pip install torch tensorflow-cpu      # DALI does not install here
#
# Usage: bench/dlio_compare.sh [WORKDIR]   (default /tmp/dlio-compare; removed at the end)
# Environment (defaults):
#   DLIO_VENV=/work/dlio-venv  RINGTIER=target/release/ringtier  OUT=bench/results/tune-dlio
#   PRESETS="unet3d resnet50 cosmoflow"  FILES_unet3d=56 FILES_resnet50=8 FILES_cosmoflow=512
#   THREADS="1 2 4" (DLIO read threads swept at one accelerator; THREADS_resnet50="1 2")  MAX_ACC=16
#
# resnet50's shards hold 1,251 samples each. DLIO's PyTorch reader opens a file per sample
# (read_type on_demand: a whole 143 MB npz per 115 KB sample, 89 s for the first batch of 400
# here), so its resnet50 runs use read_type memory (each worker keeps the shards it opened)
# and sample_shuffle off (samples in shard order, as a sharded record pipeline streams them);
# each worker then reads a shard whole once. ringtier reads the same shards' records at their
# offsets in a global shuffle (random 115 KB reads: the harder access pattern).
#   LOCK=/tmp/ringtier-bench.lock (each preset's timed runs hold it)
# Writes OUT/dlio-compare.{json,md}, OUT/dlio-config/workload/ringtier_P.yaml (the DLIO
# configuration used), OUT/P/ (DLIO's summary.json per run, ringtier's tune.json, fio's JSON).
set -euo pipefail

W=${1:-/tmp/dlio-compare}
DLIO_VENV=${DLIO_VENV:-/work/dlio-venv}
RINGTIER=${RINGTIER:-target/release/ringtier}
OUT=${OUT:-bench/results/tune-dlio}
PRESETS=${PRESETS:-unet3d resnet50 cosmoflow}
THREADS=${THREADS:-1 2 4}
MAX_ACC=${MAX_ACC:-16}
LOCK=${LOCK:-/tmp/ringtier-bench.lock}

[ "$(id -u)" = 0 ] || { echo "dlio_compare: needs root (drop_caches)" >&2; exit 2; }
command -v fio >/dev/null || { echo "dlio_compare: needs fio" >&2; exit 2; }
[ -x "$DLIO_VENV/bin/dlio_benchmark" ] || { echo "dlio_compare: no $DLIO_VENV/bin/dlio_benchmark (see the header)" >&2; exit 2; }
[ -x "$RINGTIER" ] || { echo "dlio_compare: no $RINGTIER (cargo build --release -p ringtier-cli)" >&2; exit 2; }

mkdir -p "$W" "$OUT/dlio-config/workload"
W=$(cd "$W" && pwd)
OUT=$(cd "$OUT" && pwd)
trap 'rm -rf "$W"' EXIT
cp "$RINGTIER" "$W/ringtier"       # a stable copy: others may rebuild target/ meanwhile
PY="$DLIO_VENV/bin/python"
export PATH="$DLIO_VENV/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=3

cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# The DLIO workload file for preset $1 with $2 files (after DLIO's *_a100.yaml).
dlio_config() {
  local p=$1 n=$2 f="$OUT/dlio-config/workload/ringtier_$1.yaml" extra=""
  case $p in
    unet3d)    spf=1;    rec=146600628; batch=7;   compute=0.636 ;;
    resnet50)  spf=1251; rec=114660;    batch=400; compute=0.435
               extra=$'  read_type: memory\n  sample_shuffle: "off"' ;;
    cosmoflow) spf=1;    rec=2828486;   batch=1;   compute=0.00551 ;;
    *) echo "unknown preset $p" >&2; exit 2 ;;
  esac
  cat > "$f" <<EOF
# DLIO workload for ringtier's $p preset (bench/dlio_compare.sh): ${p}_a100 with the
# PyTorch reader, npz files of a fixed sample size, one epoch, no checkpoint.
model: $p
framework: pytorch
workflow:
  generate_data: False
  train: True
  checkpoint: False
dataset:
  data_folder: $W/$p
  format: npz
  num_files_train: $n
  num_samples_per_file: $spf
  record_length: $rec
  record_length_stdev: 0
reader:
  data_loader: pytorch
  batch_size: $batch
  read_threads: 2
  file_shuffle: seed
${extra:-  sample_shuffle: seed}
train:
  epochs: 1
  computation_time: $compute
metric:
  au: 0.90
EOF
  echo "$spf $batch"
}

# DLIO with $2 accelerators and $3 read threads on preset $1: prints "AU MB/s".
dlio_run() {
  local p=$1 n=$2 t=$3 o="$OUT/$1/dlio-n$2-t$3"
  rm -rf "$o"; mkdir -p "$o"
  cold
  ( cd "$o" && mpirun -np "$n" dlio_benchmark --config-dir "$OUT/dlio-config" "workload=ringtier_$p" \
      "++workload.reader.read_threads=$t" "++workload.output.folder=$o" > "$o/dlio.out" 2>&1 ) \
    || { echo "DLIO failed, see $o/dlio.out" >&2; tail -5 "$o/dlio.out" >&2; echo "nan nan"; return; }
  "$PY" -c 'import json,sys; m=json.load(open(sys.argv[1]))["metric"]; print(m["train_au_mean_percentage"], m["train_io_mean_MB_per_second"])' "$o/summary.json"
  rm -f "$o"/*.pfw "$o"/*.pfw.gz
}

for p in $PRESETS; do
  n=$(eval echo "\${FILES_$p:-}")
  [ -n "$n" ] || case $p in unet3d) n=56 ;; resnet50) n=8 ;; cosmoflow) n=512 ;; esac
  threads=$(eval echo "\${THREADS_$p:-}")
  [ -n "$threads" ] || { [ "$p" = resnet50 ] && threads="1 2" || threads=$THREADS; }
  read -r spf batch < <(dlio_config "$p" "$n")
  most=$(( n * spf / (3 * batch) ))            # at least 3 steps per accelerator
  [ "$most" -ge 1 ] || most=1
  [ "$most" -le "$MAX_ACC" ] || most=$MAX_ACC
  mkdir -p "$OUT/$p"
  df -h / | tail -1
  echo "== $p: generating $n files with DLIO in $W/$p"
  ( cd "$W" && dlio_benchmark --config-dir "$OUT/dlio-config" "workload=ringtier_$p" \
      ++workload.workflow.generate_data=True ++workload.workflow.train=False \
      "++workload.output.folder=$W/gen-out" > "$OUT/$p/generate.out" 2>&1 )
  data="$W/$p/train"
  du -sb "$data" | awk '{printf "   %.2f GB in %s\n", $1/1e9, $2}'
  exec 9>"$LOCK"; flock 9
  echo "   lock held $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)"
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  cold
  fio --name=ceiling --ioengine=io_uring --direct=1 --rw=read --bs=1M --iodepth=32 --iomem_align=4096 \
      --opendir="$data" --output-format=json --output="$OUT/$p/fio-ceiling.json" > /dev/null
  fio_mb=$("$PY" -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]["read"]; print(round(j["bw_bytes"]/1e6,1))' "$OUT/$p/fio-ceiling.json")
  echo "   fio ceiling (O_DIRECT 1 MiB, depth 32, cold): $fio_mb MB/s"
  # DLIO: read threads at one accelerator, then the search.
  best_t=""; best_au=-1
  : > "$OUT/$p/dlio-runs.txt"
  for t in $threads; do
    read -r au mb < <(dlio_run "$p" 1 "$t")
    echo "1 $t $au $mb" >> "$OUT/$p/dlio-runs.txt"
    echo "   DLIO 1 accelerator, $t read threads: AU $au%, $mb MB/s"
    if "$PY" -c "import sys; sys.exit(0 if float('$au') > float('$best_au') else 1)"; then best_t=$t; best_au=$au; fi
  done
  good=0; bad=""; acc=1; au=$best_au
  while :; do
    if [ "$acc" -gt 1 ]; then
      read -r au mb < <(dlio_run "$p" "$acc" "$best_t")
      echo "$acc $best_t $au $mb" >> "$OUT/$p/dlio-runs.txt"
      echo "   DLIO $acc accelerators, $best_t read threads: AU $au%, $mb MB/s"
    fi
    if "$PY" -c "import sys; sys.exit(0 if float('$au') >= 90 else 1)"; then
      good=$acc; acc=$(( acc * 2 )); [ "$acc" -le "$most" ] || break
    else bad=$acc; break; fi
  done
  if [ -n "$bad" ]; then
    while [ $(( bad - good )) -gt 1 ]; do
      mid=$(( (good + bad) / 2 ))
      read -r au mb < <(dlio_run "$p" "$mid" "$best_t")
      echo "$mid $best_t $au $mb" >> "$OUT/$p/dlio-runs.txt"
      echo "   DLIO $mid accelerators, $best_t read threads: AU $au%, $mb MB/s"
      if "$PY" -c "import sys; sys.exit(0 if float('$au') >= 90 else 1)"; then good=$mid; else bad=$mid; fi
    done
  fi
  echo "$good" > "$OUT/$p/dlio-max-au90.txt"
  echo "   DLIO: largest count at AU >= 90%: $good"
  # ringtier on the same files (the sweep itself is one pass of the defaults over 100 small files).
  printf 'sweep = "one-at-a-time"\n' > "$W/one.toml"
  mkdir -p "$W/rt"
  "$W/ringtier" tune --dir "$W/rt" --space "$W/one.toml" --files 100 --repeats 1 --no-fio --no-trace --no-block \
      --preset "$p" --preset-data "$data" --max-accelerators "$most" --out "$OUT/$p/ringtier" \
      > "$OUT/$p/ringtier.out" 2>&1 || { tail -20 "$OUT/$p/ringtier.out" >&2; exit 1; }
  grep -E "accelerator" "$OUT/$p/ringtier.out" | sed 's/^/   ringtier/'
  echo "$load_before $(cut -d' ' -f1-3 /proc/loadavg)" > "$OUT/$p/load.txt"
  flock -u 9
  rm -rf "$W/$p" "$W/rt" "$W/gen-out"
done

# The summary: JSON and a table.
SUMMARY=""
for p in unet3d resnet50 cosmoflow; do [ -f "$OUT/$p/ringtier/tune.json" ] && SUMMARY="$SUMMARY $p"; done
"$PY" - "$OUT" $SUMMARY <<'EOF'
import json, os, sys, platform, datetime
out, presets = sys.argv[1], sys.argv[2:]
res = {"schema": "ringtier.dlio-compare/1", "date": datetime.datetime.utcnow().isoformat(timespec="seconds") + "Z",
       "kernel": platform.release(), "cpus": os.cpu_count(), "presets": []}
md = ["| preset | files | GB | fio ceiling MB/s | accelerators | DLIO AU % (MB/s) | ringtier AU % (MB/s) | ringtier AU every step % |",
      "| --- | --- | --- | --- | --- | --- | --- | --- |"]
summary = ["| preset | DLIO read threads | DLIO largest count at AU >= 90% | ringtier largest count | ratio | load before / after |",
           "| --- | --- | --- | --- | --- | --- |"]
for p in presets:
    d = os.path.join(out, p)
    fio = json.load(open(os.path.join(d, "fio-ceiling.json")))["jobs"][0]["read"]["bw_bytes"] / 1e6
    runs = [l.split() for l in open(os.path.join(d, "dlio-runs.txt")) if l.strip()]
    dlio = {}
    for n, t, au, mb in runs:
        n = int(n)
        if n not in dlio or float(au) > dlio[n]["au"]:
            dlio[n] = {"accelerators": n, "read_threads": int(t), "au": float(au), "mb_per_sec": float(mb)}
    threads_at_1 = [{"read_threads": int(t), "au": float(au), "mb_per_sec": float(mb)} for n, t, au, mb in runs if n == "1"]
    tune = json.load(open(os.path.join(d, "ringtier", "tune.json")))
    pr = tune["presets"][0]
    rt = {r["accelerators"]: r for r in pr["runs"]}
    dmax = int(open(os.path.join(d, "dlio-max-au90.txt")).read())
    rmax = pr["max_accelerators_au90"]
    load = open(os.path.join(d, "load.txt")).read().split()
    res["presets"].append({"preset": p, "files": pr["files"], "bytes": pr["bytes"], "sample_bytes": pr["preset"]["sample_bytes"],
        "fio_ceiling_mb_per_sec": fio, "dlio_threads_at_one": threads_at_1, "dlio": sorted(dlio.values(), key=lambda r: r["accelerators"]),
        "ringtier": pr["runs"], "dlio_max_accelerators_au90": dmax, "ringtier_max_accelerators_au90": rmax,
        "load_average_before_after": load})
    for n in sorted(set(dlio) | set(rt)):
        dl = f'{dlio[n]["au"]:.1f} ({dlio[n]["mb_per_sec"]:.0f})' if n in dlio else "-"
        r = rt.get(n)
        rs = f'{100*r["au_mlperf"]:.1f} ({r["mb_per_sec"]:.0f})' if r else "-"
        ra = f'{100*r["au"]:.1f}' if r else "-"
        md.append(f'| {p} | {pr["files"]} | {pr["bytes"]/1e9:.2f} | {fio:.0f} | {n} | {dl} | {rs} | {ra} |')
    ratio = f"{rmax/dmax:.1f}x" if dmax else ("n/a (DLIO: 0)")
    best_t = max(threads_at_1, key=lambda r: r["au"])["read_threads"] if threads_at_1 else "-"
    summary.append(f'| {p} | {best_t} | {dmax} | {rmax} | {ratio} | {" ".join(load[:3])} / {" ".join(load[3:])} |')
json.dump(res, open(os.path.join(out, "dlio-compare.json"), "w"), indent=2)
text = "\n".join(md) + "\n\n" + "\n".join(summary) + "\n"
open(os.path.join(out, "dlio-compare.md"), "w").write(text)
print(text)
EOF
