#!/usr/bin/env bash
# Checks the Linux aarch64 wheel on this x86_64 machine (SPEC 26), under qemu-user:
# Debian 12's arm64 python3 (3.11) and libsqlite3, unpacked from Debian's packages into
# target/arm64/root (debootstrap --foreign; nothing of it runs on the host), runs
# scripts/check_wheel.py and `quotaengine demo --seconds 5` on the wheel installed from
# its file alone (the host's pip installs it into a directory: `--platform
# manylinux_2_28_aarch64 --no-index`; the arm64 Python has no pip of its own).
# Needs Debian's qemu-user-static and debootstrap. No binfmt_misc: a child process is
# started through qemu too (QE_CHECK_PYTHON). Figures are emulated, not an arm64 CPU's.
# Usage: scripts/check_wheel_qemu.sh   (after ARCH=aarch64 bash scripts/build_wheels.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIST=${DIST:-dist}
WORK=$ROOT/target/wheel-check-aarch64
ROOTFS=${ROOTFS:-$ROOT/target/arm64/root}
QEMU=$(command -v qemu-aarch64-static) || { echo "error: apt-get install qemu-user-static" >&2; exit 1; }
WHEEL=$(ls "$DIST"/quotaengine-*-cp310-abi3-manylinux_2_28_aarch64.whl)

if [ ! -x "$ROOTFS/usr/bin/python3.11" ]; then
    command -v debootstrap >/dev/null || { echo "error: apt-get install debootstrap" >&2; exit 1; }
    debootstrap --foreign --arch=arm64 --variant=minbase --include=python3,libsqlite3-0 \
        bookworm "$ROOTFS" http://deb.debian.org/debian
    for deb in "$ROOTFS"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$ROOTFS"; done
fi
PY=("$QEMU" -L "$ROOTFS" "$ROOTFS/usr/bin/python3.11")

rm -rf "$WORK"; mkdir -p "$WORK"
echo "wheel: $WHEEL ($(stat -c %s "$WHEEL") bytes)"
start=$(date +%s%N)
python3 -m pip install -q --root-user-action=ignore --no-deps --no-index --find-links "$DIST" --target "$WORK/site" \
    --platform manylinux_2_28_aarch64 --implementation cp --python-version 3.11 --only-binary :all: quotaengine
echo "install (host pip, into a directory): $(( ($(date +%s%N) - start) / 1000000 )) ms"
file "$WORK"/site/quotaengine/_quotaengine*.so
run() { (cd "$WORK" && env -i HOME="$HOME" PATH=/usr/bin:/bin LANG=C.UTF-8 PYTHONPATH="$WORK/site" \
    QE_CHECK_PYTHON="${PY[*]}" "${PY[@]}" "$@"); }
run -c 'import platform, sqlite3; print(platform.machine(), "python", platform.python_version(), "sqlite3", sqlite3.sqlite_version)'
run "$ROOT/scripts/check_wheel.py" "$ROOT/README.md"
run -m quotaengine demo --seconds 5 --db "$WORK/demo.db" >"$WORK/demo.log" 2>&1 || { tail -20 "$WORK/demo.log" >&2; exit 1; }
echo "demo: $(tail -1 "$WORK/demo.log")"
echo "PASS aarch64 (qemu)"
