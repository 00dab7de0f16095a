#!/usr/bin/env bash
# Staging checks and benchmark on a machine with an NVIDIA GPU (a few minutes).
#
#   bench/gpu_stage.sh                # writes results to $OUT (or bench/results/)
#
# 1. builds ringtier with the `cuda` feature (cudarc, dynamic loading: no toolkit needed,
#    only the driver's libcuda at run time);
# 2. runs the staging tests with the feature (a driver present: the CUDA path is exercised);
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
RT=./target/release/ringtier
[ -f "$DIR/.ringtier-manifest.tsv" ] || $RT gen --preset imagenet --files 8192 --dir "$DIR"
$RT bench stage --dir "$DIR" --target cuda:0 --repeats 5 --json "$OUT/stage-cuda.json" | tee "$OUT/stage-cuda.txt"
$RT bench stage --dir "$DIR" --target host --repeats 5 --json "$OUT/stage-host-on-gpu-machine.json" | tee "$OUT/stage-host-on-gpu-machine.txt"
