#!/usr/bin/env bash
# Staging checks and benchmark on a machine with an NVIDIA GPU (a few minutes).
#
#   bench/gpu_stage.sh                # writes results to $OUT (or bench/results/)
#
# 1. builds ringtier with the `cuda` feature (cudarc, dynamic loading: no toolkit needed,
#    only the driver's libcuda at run time);
# 2. runs the staging tests with the feature (a driver present: the CUDA path is exercised),
#    then the cancellation tests again with more seeds (STAGE_RUNS, default 50): batches and
#    futures dropped at random points while copies run on cuda:0, copies that cannot start
#    part-way through a batch, everything dropped at once; each staged copy is read back from
#    the device and compared with its source as it was when the copy started. Log:
#    $OUT/stage-cancel-cuda.txt. Fails if the CUDA path was not exercised;
# 3. generates an ImageNet-like set and runs `bench stage` to cuda:0 and to host memory:
#    pipelined pinned staging against raw reads, pageable buffers + copy, and pinned without
#    overlap, 5 interleaved repeats each.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
DIR=${DIR:-bench/work/gpu-imagenet}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
cargo build --release -q -p ringtier-cli --features cuda
cargo test -q -p ringtier-stage --features cuda 2>&1 | tail -5
RINGTIER_STAGE_RUNS=${STAGE_RUNS:-50} cargo test -p ringtier-stage --features cuda --lib cancel_tests \
  -- --nocapture --test-threads 1 >"$OUT/stage-cancel-cuda.txt" 2>&1 \
  || { tail -40 "$OUT/stage-cancel-cuda.txt"; exit 1; }
grep -E "^target |test result" "$OUT/stage-cancel-cuda.txt"
grep -q "^target Cuda(0)" "$OUT/stage-cancel-cuda.txt" \
  || { echo "the CUDA path was not exercised (no device seen by the tests)"; exit 1; }
RT=./target/release/ringtier
[ -f "$DIR/.ringtier-manifest.tsv" ] || $RT gen --preset imagenet --files 8192 --dir "$DIR"
$RT bench stage --dir "$DIR" --target cuda:0 --repeats 5 --json "$OUT/stage-cuda.json" | tee "$OUT/stage-cuda.txt"
$RT bench stage --dir "$DIR" --target host --repeats 5 --json "$OUT/stage-host-on-gpu-machine.json" | tee "$OUT/stage-host-on-gpu-machine.txt"
