#!/usr/bin/env bash
# Builds the Python package `ringtier` as the files a user installs without a Rust toolchain:
#
#   crates/ringtier-py/build-wheels.sh [OUT_DIR]        (default: target/wheels)
#
#   ringtier-<v>-cp311-abi3-manylinux_2_28_x86_64.whl   every CPython >= 3.11 (the stable ABI
#                                                       has the buffer protocol from 3.11)
#   ringtier-<v>-cp310-cp310-manylinux_2_28_x86_64.whl  CPython 3.10 only
#   ringtier-<v>-cp39-cp39-manylinux_2_28_x86_64.whl    CPython 3.9 only
#   ringtier-<v>.tar.gz                                 the sdist (`pip install` builds it: cargo)
#
# RINGTIER_WHEELS picks what to build, a comma-separated subset of `abi3,cp39,cp310,sdist`
# (default: all; CI builds `abi3` only). A version-specific wheel whose interpreter is not on
# this machine (python3.9, python3.10; pyenv's versions are looked up too) is skipped, and said.
#
# Every wheel is built from crates/ringtier-py with
# - cargo profile `wheel` (the root Cargo.toml: release with fat LTO, one codegen unit,
#   stripped, unwinding panics so that a Rust panic stays a Python exception);
# - feature `turbojpeg`: JPEG decode with libjpeg-turbo, built by the turbojpeg crate from its
#   bundled source (cmake, and nasm for the SIMD code) and linked statically into the
#   extension; `ringtier.JPEG_DECODER` says "libjpeg-turbo";
# - feature `abi3` for the abi3 wheel only (pyo3's abi3-py311; `cargo test` never sets it);
# - `maturin build --zig --compatibility manylinux_2_28`.
#
# Why zig: a wheel may only use the glibc symbol versions of its manylinux tag. This machine
# has glibc 2.36, so a native build links against 2.36 and the honest tag is manylinux_2_36,
# which pip refuses on RHEL 8 / Rocky 8 (2.28), Ubuntu 20.04 (2.31) or Debian 11 (2.31), all
# common on training clusters. The alternative, a manylinux_2_28 container, needs Docker and a
# toolchain image. `zig cc` (ziglang from PyPI, driven by maturin through cargo-zigbuild) links
# against glibc 2.28's symbol versions instead, with no container. It compiles the C as well:
# maturin hands cmake a toolchain file naming zig, so libjpeg-turbo (cmake) and aws-lc (cc, the
# S3 tier's TLS) are built for glibc 2.28 too; no environment variable is needed for either.
#
# Every wheel is then checked, and the script fails otherwise: `auditwheel show` (auditwheel
# from PyPI) must find the wheel consistent with manylinux_2_28 or an older tag and list no
# external shared library beyond the manylinux whitelist (libc, libm, libpthread, libdl, ...);
# the file name must carry the expected tags (cp311-abi3, cp39-cp39, cp310-cp310); and the
# extension, loaded by an interpreter it is for, must say JPEG_DECODER == "libjpeg-turbo".
#
# Needs: cargo, python3 (>= 3.9, for the tool venv), cmake and nasm (apt-get install -y cmake
# nasm), PyPI (maturin 1.16, ziglang and auditwheel 6.8 go into the tool venv
# target/wheel-tools; pip's cache keeps them between runs). The build directory is
# $CARGO_TARGET_DIR, else target/wheel (apart from the test builds in target/debug).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
CRATE=crates/ringtier-py
OUT=${1:-target/wheels}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WHAT=${RINGTIER_WHEELS:-abi3,cp39,cp310,sdist}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/wheel}
# The newest glibc whose symbols a wheel may use: manylinux_2_28 or older.
MAX_GLIBC_MINOR=28
COMPAT=manylinux_2_$MAX_GLIBC_MINOR

wants() { [[ ",$WHAT," == *",$1,"* ]]; }
for w in ${WHAT//,/ }; do
  case "$w" in abi3 | cp39 | cp310 | sdist) ;; *)
    echo "build-wheels: unknown RINGTIER_WHEELS entry '$w' (abi3, cp39, cp310, sdist)" >&2
    exit 2
    ;;
  esac
done

for tool in cargo cmake nasm; do
  if ! command -v "$tool" >/dev/null; then
    echo "build-wheels: $tool is needed (cmake and nasm: apt-get install -y cmake nasm)" >&2
    exit 1
  fi
done

# The build tools, pinned, in a venv of their own.
TOOLS=$ROOT/target/wheel-tools
[ -x "$TOOLS/bin/python" ] || python3 -m venv "$TOOLS"
if ! "$TOOLS/bin/python" - <<'EOF' 2>/dev/null; then
from importlib.metadata import version
assert version("maturin").startswith("1.16."), version("maturin")
assert version("auditwheel").startswith("6.8."), version("auditwheel")
version("ziglang")
EOF
  "$TOOLS/bin/python" -m pip install -q --disable-pip-version-check 'maturin==1.16.*' ziglang 'auditwheel==6.8.*'
fi
MATURIN=$TOOLS/bin/maturin
AUDITWHEEL=$TOOLS/bin/auditwheel
# maturin finds zig as `python -m ziglang` of the python on PATH: the tool venv's.
export PATH="$TOOLS/bin:$PATH"

# An interpreter of version $1 (3.9, 3.10): python3.X on PATH if it runs (pyenv's shim may not),
# else pyenv's newest 3.X.
find_python() {
  local v=$1 c
  for c in "$(command -v "python$v" || true)" $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$v".*/bin/"python$v" 2>/dev/null | sort -V -r); do
    if [ -n "$c" ] && "$c" -c "import sys; assert sys.version_info[:2] == tuple(map(int, '$v'.split('.')))" 2>/dev/null; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

# The wheel `$1` is a manylinux_2_28-or-older wheel with tags `$2` (cp311-abi3) that needs no
# external library, and its extension, loaded by python `$3`, decodes with libjpeg-turbo.
check_wheel() {
  local whl=$1 tags=$2 py=$3 name report tmp
  name=$(basename "$whl")
  if ! [[ "$name" =~ ^ringtier-[^-]+-${tags}-manylinux_2_([0-9]+)_x86_64\.whl$ ]] || ((BASH_REMATCH[1] > MAX_GLIBC_MINOR)); then
    echo "build-wheels: $name is not tagged $tags, manylinux_2_$MAX_GLIBC_MINOR or older, x86_64" >&2
    return 1
  fi
  report=$("$AUDITWHEEL" show "$whl" 2>&1) || {
    echo "$report" >&2
    echo "build-wheels: auditwheel show failed on $name" >&2
    return 1
  }
  # auditwheel names any library outside the whitelist ("The following external shared
  # libraries are required by the wheel: ..."); the whitelisted ones it lists as
  # "system-provided", which is fine.
  if grep -qi "external shared libraries are required" <<<"$report"; then
    echo "$report" >&2
    echo "build-wheels: $name needs an external shared library" >&2
    return 1
  fi
  local platform
  platform=$(tr '\n' ' ' <<<"$report" | grep -oE 'consistent with the following platform tag: *"[a-z0-9_]+"' | grep -oE '"[a-z0-9_]+"' | tr -d '"')
  if ! [[ "$platform" =~ ^manylinux_2_([0-9]+)_x86_64$ ]] || ((BASH_REMATCH[1] > MAX_GLIBC_MINOR)); then
    echo "$report" >&2
    echo "build-wheels: auditwheel finds $name consistent with '$platform', not manylinux_2_$MAX_GLIBC_MINOR or older" >&2
    return 1
  fi
  tmp=$(mktemp -d)
  "$TOOLS/bin/python" -m zipfile -e "$whl" "$tmp"
  # The extension alone (the package's __init__ would import numpy): one .so, no vendored
  # libraries (a `ringtier.libs` folder would mean a repaired wheel).
  local so
  so=$(find "$tmp" -name '_ringtier*.so')
  if [ "$(wc -l <<<"$so")" != 1 ] || [ -n "$(find "$tmp" -maxdepth 1 -name '*.libs')" ]; then
    echo "build-wheels: $name holds $(find "$tmp" -name '*.so' | wc -l) shared objects" >&2
    rm -rf "$tmp"
    return 1
  fi
  local decoder
  decoder=$("$py" -c '
import importlib.machinery, importlib.util, sys
loader = importlib.machinery.ExtensionFileLoader("_ringtier", sys.argv[1])
spec = importlib.util.spec_from_file_location("_ringtier", sys.argv[1], loader=loader)
m = importlib.util.module_from_spec(spec)
loader.exec_module(m)
print(m.JPEG_DECODER)' "$so")
  rm -rf "$tmp"
  if [ "$decoder" != libjpeg-turbo ]; then
    echo "build-wheels: $name decodes JPEG with '$decoder', not libjpeg-turbo" >&2
    return 1
  fi
  echo "build-wheels: $name: $platform, no external library, JPEG_DECODER=$decoder, $(stat -c %s "$whl") bytes"
}

# One maturin build into a fresh folder (so that the wheel it made is the one checked);
# `$1`: a label, the rest: maturin's arguments.
build() {
  local label=$1 start
  shift
  rm -rf "$OUT/.build-$label"
  start=$(date +%s)
  "$MATURIN" build -m "$CRATE/Cargo.toml" --profile wheel --zig --compatibility "$COMPAT" \
    --out "$OUT/.build-$label" "$@"
  echo "build-wheels: $label built in $(($(date +%s) - start)) s"
}

# Moves the one wheel of build `$1` into OUT (replacing an older one of the same name); prints
# its path.
take() {
  local label=$1 whl
  whl=$(ls "$OUT/.build-$label"/*.whl)
  mv -f "$whl" "$OUT/"
  rm -rf "$OUT/.build-$label"
  echo "$OUT/$(basename "$whl")"
}

built=()
if wants abi3; then
  PY311=$(command -v python3)
  if ! "$PY311" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    PY311=$(find_python 3.11 || find_python 3.12 || find_python 3.13 || true)
  fi
  if [ -z "$PY311" ]; then
    echo "build-wheels: the abi3 wheel needs a python >= 3.11 to check it with" >&2
    exit 1
  fi
  build abi3 --features abi3,turbojpeg
  whl=$(take abi3)
  check_wheel "$whl" cp311-abi3 "$PY311"
  built+=("$whl")
fi
for v in 3.9 3.10; do
  tag=cp${v/./}
  wants "$tag" || continue
  if ! py=$(find_python "$v"); then
    echo "build-wheels: no python$v on this machine: the $tag wheel is skipped"
    continue
  fi
  build "$tag" --features turbojpeg --interpreter "$py"
  whl=$(take "$tag")
  check_wheel "$whl" "$tag-$tag" "$py"
  built+=("$whl")
done
if wants sdist; then
  rm -rf "$OUT/.build-sdist"
  "$MATURIN" sdist -m "$CRATE/Cargo.toml" --out "$OUT/.build-sdist"
  sdist=$(ls "$OUT/.build-sdist"/*.tar.gz)
  mv -f "$sdist" "$OUT/"
  rm -rf "$OUT/.build-sdist"
  built+=("$OUT/$(basename "$sdist")")
fi
echo "build-wheels: in $OUT:"
for f in "${built[@]}"; do
  echo "  $(basename "$f") ($(stat -c %s "$f") bytes)"
done
