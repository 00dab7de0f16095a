#!/usr/bin/env bash
# The Python checkpoint benchmark with a slow tier the kernel enforces: ext4 in a file on a
# loop device (direct I/O), throttled with cgroup v1 blkio to the fast directory's raw
# O_DIRECT write bandwidth / SLOWDOWN (default 4). Runs bench/python/ckpt_bench.py --slow
# inside the cgroup: ringtier's burst buffer (save to the fast tier, drain to the slow one)
# against torch.save straight to the slow tier.
#
#   sudo PYTHON=.venv-py/bin/python bench/python/ckpt_slow_tier.sh [SLOWDOWN]
#
# Needs root, losetup, mkfs.ext4, /sys/fs/cgroup/blkio; everything is undone on exit.
# Results: bench/results/$NAME.{md,json} (NAME defaults to python-ckpt-slow-Rx).
set -euo pipefail
cd "$(dirname "$0")/../.."
R=${1:-4}
PYTHON=${PYTHON:-python3}
WORK=${WORK:-bench/work/py-ckpt-slow}
GIB=${GIB:-1}
REPEATS=${REPEATS:-5}
NAME=${NAME:-python-ckpt-slow-${R}x}
CG=/sys/fs/cgroup/blkio/ringtier-pybench-$$
[ "$(id -u)" = 0 ] || { echo "needs root (loop device, mount, cgroup)" >&2; exit 1; }
mkdir -p "$WORK/mnt" "$WORK/fast"
LOOP=""
cleanup() {
  set +e
  [ -d "$CG" ] && { echo $$ > /sys/fs/cgroup/blkio/cgroup.procs; rmdir "$CG"; }
  mountpoint -q "$WORK/mnt" && umount "$WORK/mnt"
  [ -n "$LOOP" ] && losetup -d "$LOOP"
  rm -rf "$WORK"
}
trap cleanup EXIT
truncate -s 8G "$WORK/slow.img"
mkfs.ext4 -q -F "$WORK/slow.img"
LOOP=$(losetup --direct-io=on --find --show "$WORK/slow.img")
mount "$LOOP" "$WORK/mnt"
DEV=$(lsblk -dno MAJ:MIN "$LOOP" | tr -d ' ')
runs=()
for _ in 1 2 3; do
  s=$(dd if=/dev/zero of="$WORK/fast/dd-probe" bs=8M count=32 oflag=direct conv=fsync 2>&1 |
    awk '/copied/ { for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) print $(i - 1) }')
  rm -f "$WORK/fast/dd-probe"
  runs+=("$(awk -v s="$s" 'BEGIN { printf "%d", 268435456 / s }')")
done
FAST=$(printf '%s\n' "${runs[@]}" | sort -n | sed -n 2p)
BPS=$((FAST / R))
mkdir "$CG"
echo "$DEV $BPS" > "$CG/blkio.throttle.write_bps_device"
echo "$DEV $BPS" > "$CG/blkio.throttle.read_bps_device"
echo $$ > "$CG/cgroup.procs"
echo "fast raw O_DIRECT write $((FAST / 1000000)) MB/s (dd, median of 3); slow tier $LOOP ($DEV) throttled to $((BPS / 1000000)) MB/s"
dd if=/dev/zero of="$WORK/mnt/dd-check" bs=8M count=16 oflag=direct conv=fsync 2>&1 | tail -1
rm -f "$WORK/mnt/dd-check"
SLOW_TIER_DESC="ext4 on loop device $LOOP, cgroup v1 blkio read/write $((BPS / 1000000)) MB/s = fast raw write $((FAST / 1000000)) MB/s / $R" \
  "$PYTHON" bench/python/ckpt_bench.py --dir "$WORK/fast" --slow "$WORK/mnt" --only-slow --gib "$GIB" \
  --repeats "$REPEATS" --json "bench/results/$NAME.json" --md "bench/results/$NAME.md"
