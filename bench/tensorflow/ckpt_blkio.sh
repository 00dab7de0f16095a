#!/usr/bin/env bash
# bench/tensorflow/ckpt.py against a slow tier the kernel enforces (as bench/ckpt_blkio.sh):
# ext4 in a file on a loop device (direct I/O), throttled by cgroup v1 blkio to 1/R of the fast
# directory's O_DIRECT write bandwidth (dd, 256 MiB, median of 3); the benchmark runs inside
# the cgroup. Needs root. Results: bench/results/tensorflow/ckpt-blkio-Rx.json.
#
#   sudo bench/tensorflow/ckpt_blkio.sh            # R = 4, 256 MiB checkpoints, 5 repeats
#   MIB=128 REPEATS=3 sudo bench/tensorflow/ckpt_blkio.sh 4 16
#
# PY (default target/tf-venv/bin/python) with PYTHONPATH holding the ringtier package.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPEATS=${REPEATS:-5}
MIB=${MIB:-256}
PY=${PY:-target/tf-venv/bin/python}
WORK=${WORK:-bench/work/tf-ckpt-blkio}
OUT=${OUT:-bench/results/tensorflow}
RATIOS=("$@")
[ ${#RATIOS[@]} -gt 0 ] || RATIOS=(4)
CG=/sys/fs/cgroup/blkio/ringtier-tf-bench-$$
[ "$(id -u)" = 0 ] || { echo "needs root (loop device, mount, cgroup)" >&2; exit 1; }
mkdir -p "$WORK/mnt" "$WORK/fast" "$OUT"
LOOP=""
cleanup() {
  set +e
  [ -d "$CG" ] && { echo $$ > /sys/fs/cgroup/blkio/cgroup.procs; rmdir "$CG"; }
  mountpoint -q "$WORK/mnt" && umount "$WORK/mnt"
  [ -n "$LOOP" ] && losetup -d "$LOOP"
  rm -rf "$WORK"
}
trap cleanup EXIT
truncate -s 4G "$WORK/slow.img"
mkfs.ext4 -q -F "$WORK/slow.img"
LOOP=$(losetup --direct-io=on --find --show "$WORK/slow.img")
mount "$LOOP" "$WORK/mnt"
DEV=$(lsblk -dno MAJ:MIN "$LOOP" | tr -d ' ')
runs=()
for _ in 1 2 3; do
  s=$(dd if=/dev/zero of="$WORK/fast/dd-probe" bs=8M count=32 oflag=direct conv=fsync 2>&1 |
    awk '/copied/ { for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) print $(i - 1) }')
  rm -f "$WORK/fast/dd-probe"
  runs+=("$(awk -v s="$s" 'BEGIN { printf "%.0f", 268435456 / s }')")
done
FAST_BPS=$(printf '%s\n' "${runs[@]}" | sort -n | sed -n 2p)
echo "fast tier O_DIRECT write: $FAST_BPS B/s (median of ${runs[*]})"
mkdir "$CG"
echo $$ > "$CG/cgroup.procs"
for R in "${RATIOS[@]}"; do
  BPS=$((FAST_BPS / R))
  echo "$DEV $BPS" > "$CG/blkio.throttle.write_bps_device"
  echo "$DEV $BPS" > "$CG/blkio.throttle.read_bps_device"
  echo "slow tier: $LOOP ($DEV) throttled to $BPS B/s (1/$R of the fast tier)"
  "$PY" bench/tensorflow/ckpt.py --fast "$WORK/fast" --slow "$WORK/mnt" --mib "$MIB" --repeats "$REPEATS" \
    --slowdown "$R" --slow-kind "ext4 on loop (direct-io) throttled by cgroup v1 blkio to $BPS B/s; fast: $FAST_BPS B/s" \
    --json "$OUT/ckpt-blkio-${R}x.json"
done
