#!/usr/bin/env bash
# Installing ringtier: the prebuilt wheel against the source build, same machine (issue 35).
#
#   bench/wheel_install.sh [RESULT_JSON]    (default: bench/results/wheel-install/result.json)
#
# From a clean export of HEAD (git archive: the working tree's uncommitted edits are not in
# it) under target/, with cold build directories, it measures
#   1. wheel_build_seconds: `RINGTIER_WHEELS=abi3 crates/ringtier-py/build-wheels.sh`, once,
#      from an empty CARGO_TARGET_DIR (profile wheel, zig, libjpeg-turbo, the script's checks);
#   2. install_wheel_seconds: `pip install --no-index <the abi3 wheel>` into a fresh venv with
#      numpy already installed (no torch), REPEATS times (min/median/max; the median is the
#      figure);
#   3. install_source_seconds: `pip install ./crates/ringtier-py` into a fresh venv with numpy
#      already installed, from an empty CARGO_TARGET_DIR: what a user without a wheel runs
#      (release profile, default features, maturin fetched into pip's isolated build
#      environment), once (about 4 minutes on 2 cores).
# Venv creation and numpy are outside every timing; pip's cache holds numpy and maturin.
# Needs what build-wheels.sh needs (cargo, cmake, nasm, PyPI or pip's cache) and python3 >= 3.11.
# The export and its build directories are deleted at the end.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
RESULT=${1:-bench/results/wheel-install/result.json}
REPEATS=${REPEATS:-5}
COMMIT=$(git rev-parse HEAD)
PY=$(command -v python3)
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "python3 >= 3.11 is needed (the abi3 wheel)"'

WORK=$ROOT/target/bench-wheel-install
rm -rf "$WORK"
mkdir -p "$WORK/src/target"
trap 'rm -rf "$WORK"' EXIT
git archive HEAD | tar -x -C "$WORK/src"
# build-wheels.sh's tool venv (maturin, ziglang, auditwheel), made once outside the timing.
TOOLS=$ROOT/target/wheel-tools
if [ ! -x "$TOOLS/bin/maturin" ]; then
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q 'maturin==1.16.*' ziglang 'auditwheel==6.8.*'
fi
ln -s "$TOOLS" "$WORK/src/target/wheel-tools"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

echo "wheel-install: commit $COMMIT, $(nproc) cores, kernel $(uname -r), $("$PY" -V)"
echo "wheel-install: 1/3 the abi3 wheel, cold"
t=$(now)
CARGO_TARGET_DIR=$WORK/src/target/wheel RINGTIER_WHEELS=abi3 \
  "$WORK/src/crates/ringtier-py/build-wheels.sh" "$WORK/wheels"
BUILD_S=$(since "$t")
WHEEL=$(ls "$WORK"/wheels/ringtier-*-cp311-abi3-manylinux_2_*_x86_64.whl)
WHEEL_BYTES=$(stat -c %s "$WHEEL")
echo "wheel-install: $(basename "$WHEEL"), $WHEEL_BYTES bytes, built in $BUILD_S s"
# KEEP_WHEEL=DIR keeps a copy of the wheel (the export is deleted at the end).
if [ -n "${KEEP_WHEEL:-}" ]; then
  mkdir -p "$KEEP_WHEEL"
  cp "$WHEEL" "$KEEP_WHEEL/"
fi

fresh_venv() {
  rm -rf "$1"
  "$PY" -m venv "$1"
  "$1/bin/python" -m pip install -q --disable-pip-version-check numpy
}

echo "wheel-install: 2/3 pip install the wheel, $REPEATS times"
INSTALL_RUNS=()
for i in $(seq "$REPEATS"); do
  fresh_venv "$WORK/venv-wheel"
  t=$(now)
  "$WORK/venv-wheel/bin/python" -m pip install -q --disable-pip-version-check --no-index "$WHEEL"
  INSTALL_RUNS+=("$(since "$t")")
  (cd "$WORK" && "$WORK/venv-wheel/bin/python" -c 'import ringtier; assert ringtier.JPEG_DECODER == "libjpeg-turbo"')
  echo "wheel-install:   run $i: ${INSTALL_RUNS[-1]} s"
done

echo "wheel-install: 3/3 pip install ./crates/ringtier-py from source, cold"
fresh_venv "$WORK/venv-source"
t=$(now)
(cd "$WORK/src" && CARGO_TARGET_DIR=$WORK/src/target/source-cold \
  "$WORK/venv-source/bin/python" -m pip install -q --disable-pip-version-check ./crates/ringtier-py)
SOURCE_S=$(since "$t")
(cd "$WORK" && "$WORK/venv-source/bin/python" -c 'import ringtier; print("source build decodes with", ringtier.JPEG_DECODER)')
echo "wheel-install: source install $SOURCE_S s"

mkdir -p "$(dirname "$RESULT")"
"$PY" - "$RESULT" "$COMMIT" "$(basename "$WHEEL")" "$WHEEL_BYTES" "$BUILD_S" "$SOURCE_S" "${INSTALL_RUNS[@]}" <<'EOF'
import json, os, platform, statistics, sys
out, commit, wheel, wheel_bytes, build_s, source_s, *runs = sys.argv[1:]
runs = [float(r) for r in runs]
median = statistics.median(runs)
result = {
    "schema": "ringtier.bench.wheel-install/1",
    "command": "bench/wheel_install.sh",
    "commit": commit,
    "machine": {"nproc": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
    "wheel": wheel,
    "wheel_bytes": int(wheel_bytes),
    "wheel_build_seconds": float(build_s),
    "install_wheel_seconds": median,
    "install_wheel_seconds_runs": {"min": min(runs), "median": median, "max": max(runs), "runs": runs},
    "install_source_seconds": float(source_s),
    "install_source_runs": 1,
    "source_over_wheel": round(float(source_s) / median, 1),
    "notes": "wheel: pip install --no-index of the abi3 wheel into a fresh venv with numpy installed; "
    "source: pip install ./crates/ringtier-py (release profile, default features: zune-jpeg) into a fresh venv "
    "with numpy installed, empty CARGO_TARGET_DIR, maturin from pip's cache; wheel build: "
    "build-wheels.sh abi3 (profile wheel: fat LTO, 1 codegen unit; zig; libjpeg-turbo), empty CARGO_TARGET_DIR. "
    "Venv creation and numpy are outside the timings.",
}
with open(out, "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")
print(json.dumps(result, indent=2))
EOF
