#!/usr/bin/env bash
# The burst-buffer experiment against a slow tier the kernel enforces: an ext4 file system in
# a file on a loop device (direct I/O, so the backing file's page cache does not absorb the
# writes), throttled with cgroup v1 blkio (read and write bytes per second on that device
# only). The fast tier is a directory on the root file system (or FAST_DIR). cgroup v2 io.max
# would do the same where the io controller is enabled; on these machines it is not.
#
#   sudo bench/ckpt_blkio.sh              # slowdowns 4 and 16, 5 repeats each
#   REPEATS=3 sudo bench/ckpt_blkio.sh 2 8
#
# For each slowdown R it measures the fast directory's raw O_DIRECT write bandwidth with dd
# (median of 3), throttles the loop device to that / R and runs
#   ringtier bench ckpt --slow-dir MOUNT/slow --slow-kernel-bw BPS --repeats N
# inside the cgroup, so `direct` saves, the drain's writes and restores from the slow tier all
# go through the kernel's throttle. Results: bench/results/ckpt-blkio-Rx.{json,txt}.
# Needs root, losetup, mkfs.ext4 and /sys/fs/cgroup/blkio; everything is undone on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

REPEATS=${REPEATS:-5}
WORK=${WORK:-bench/work/ckpt-blkio}
FAST_DIR=${FAST_DIR:-$WORK/fast}
OUT=${OUT:-bench/results}
IMG_SIZE=${IMG_SIZE:-6G}
RATIOS=("$@")
[ ${#RATIOS[@]} -gt 0 ] || RATIOS=(4 16)
CG=/sys/fs/cgroup/blkio/ringtier-bench-$$

[ "$(id -u)" = 0 ] || { echo "needs root (loop device, mount, cgroup)" >&2; exit 1; }
[ -f /sys/fs/cgroup/blkio/cgroup.procs ] || { echo "no cgroup v1 blkio hierarchy at /sys/fs/cgroup/blkio" >&2; exit 1; }
cargo build --release -q -p ringtier-cli
RT=$PWD/target/release/ringtier

mkdir -p "$WORK/mnt" "$FAST_DIR" "$OUT"
LOOP=""
cleanup() {
  set +e
  [ -d "$CG" ] && { echo $$ > /sys/fs/cgroup/blkio/cgroup.procs; rmdir "$CG"; }
  mountpoint -q "$WORK/mnt" && umount "$WORK/mnt"
  [ -n "$LOOP" ] && losetup -d "$LOOP"
  rm -f "$WORK/slow.img" "$FAST_DIR/dd-probe"
}
trap cleanup EXIT

truncate -s "$IMG_SIZE" "$WORK/slow.img"
mkfs.ext4 -q -F "$WORK/slow.img"
LOOP=$(losetup --direct-io=on --find --show "$WORK/slow.img")
mount "$LOOP" "$WORK/mnt"
DEV=$(lsblk -dno MAJ:MIN "$LOOP" | tr -d ' ')
echo "slow tier: $LOOP ($DEV) mounted at $WORK/mnt, ext4 in $WORK/slow.img, direct-io on"

# Raw O_DIRECT write + fsync of 256 MiB on the fast directory, in bytes per second.
fast_bps() {
  local runs=()
  for _ in 1 2 3; do
    local s
    s=$(dd if=/dev/zero of="$FAST_DIR/dd-probe" bs=8M count=32 oflag=direct conv=fsync 2>&1 |
      awk '/copied/ { for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) print $(i - 1) }')
    rm -f "$FAST_DIR/dd-probe"
    runs+=("$(awk -v s="$s" 'BEGIN { printf "%.0f", 268435456 / s }')")
  done
  printf '%s\n' "${runs[@]}" | sort -n | sed -n 2p
}

mkdir "$CG"
echo $$ > "$CG/cgroup.procs"
for R in "${RATIOS[@]}"; do
  FAST=$(fast_bps)
  BPS=$(awk -v f="$FAST" -v r="$R" 'BEGIN { printf "%.0f", f / r }')
  echo "== slowdown ${R}x: fast raw write $((FAST / 1000000)) MB/s, blkio $DEV read/write $((BPS / 1000000)) MB/s"
  echo "$DEV $BPS" > "$CG/blkio.throttle.write_bps_device"
  echo "$DEV $BPS" > "$CG/blkio.throttle.read_bps_device"
  # A check that the throttle holds: 128 MiB O_DIRECT to the slow mount.
  dd if=/dev/zero of="$WORK/mnt/dd-check" bs=8M count=16 oflag=direct conv=fsync 2>&1 | tail -1
  rm -f "$WORK/mnt/dd-check"
  RINGTIER_LOG=${RINGTIER_LOG:-warn} "$RT" bench ckpt --dir "$WORK/base" --fast-dir "$FAST_DIR" --slow-dir "$WORK/mnt/slow" \
    --slow-kernel-bw "$BPS" --repeats "$REPEATS" --json "$OUT/ckpt-blkio-${R}x.json" |
    tee "$OUT/ckpt-blkio-${R}x.txt"
  echo "$DEV 0" > "$CG/blkio.throttle.write_bps_device"
  echo "$DEV 0" > "$CG/blkio.throttle.read_bps_device"
done
