#!/usr/bin/env bash
# Finishes a Linux wheel built by maturin (scripts/build_wheels.sh here, the release
# workflow on GitHub) and checks it (SPEC 1 and 26):
#   * drops the extension's DT_NEEDED on libsqlite3 (patchelf) and checks that its
#     sqlite3_* symbols are undefined, not a bundled copy: at import,
#     quotaengine/_sqlite.py points them at the SQLite that Python's sqlite3 loaded;
#   * rewrites the wheel's RECORD (wheel pack);
#   * fails unless `auditwheel show` finds it consistent with the tag in its name.
# Usage: scripts/finish_linux_wheel.sh WHEEL   (needs patchelf, auditwheel, wheel, nm)
set -euo pipefail
WHEEL=$1
OUT=$(dirname "$WHEEL")
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

"$PY" -m wheel unpack -d "$WORK" "$WHEEL" >/dev/null
SO=$(ls "$WORK"/quotaengine-*/quotaengine/_quotaengine*.so)
for lib in $(patchelf --print-needed "$SO" | grep '^libsqlite3' || true); do
    echo "removing DT_NEEDED $lib"
    patchelf --remove-needed "$lib" "$SO"
done
if patchelf --print-needed "$SO" | grep -q sqlite; then
    echo "error: the extension still names a SQLite library" >&2; exit 1
fi
if ! nm -D --undefined-only "$SO" | grep -q ' sqlite3_open_v2$'; then
    echo "error: sqlite3_open_v2 is not an undefined symbol of the extension (a bundled SQLite?)" >&2; exit 1
fi
if nm -D --defined-only "$SO" | grep -q ' sqlite3_'; then
    echo "error: the extension defines sqlite3_* symbols (a bundled SQLite?)" >&2; exit 1
fi
echo "needed: $(patchelf --print-needed "$SO" | tr '\n' ' ')"
rm "$WHEEL"
"$PY" -m wheel pack -d "$OUT" "$WORK"/quotaengine-*/ >/dev/null
[ -f "$WHEEL" ] || { echo "error: wheel pack did not write $WHEEL" >&2; exit 1; }

# The platform tag in the file name, e.g. manylinux_2_28_x86_64.
TAG=$(basename "$WHEEL" .whl | awk -F- '{print $NF}')
SHOW=$(auditwheel show "$WHEEL")
echo "$SHOW"
if ! tr '\n' ' ' <<<"$SHOW" | tr -s ' ' | grep -q "consistent with the following platform tag: \"$TAG\""; then
    echo "error: auditwheel does not find $WHEEL consistent with $TAG" >&2; exit 1
fi
