#!/usr/bin/env bash
# Installs the wheel in dist/ from the file alone (pip --no-index) into a fresh venv of
# each Python below, with no cargo or rustc on PATH, and checks it (SPEC 26): import,
# sqlite_version() == sqlite3.sqlite_version, a plain sqlite3 connection beside a live
# engine leaves its WAL alone, the README's quickstart, `quotaengine demo --seconds 5`
# (scripts/check_wheel.py does the in-process part and measures import time), and times
# the install (`pip install --no-index` of the wheel file into the fresh venv, wall time).
# Ends with a table: per Python, install time, import time (fresh process minus a bare
# start) and `python -X importtime`'s cumulative time for quotaengine (medians of 7).
# Usage: scripts/check_wheel.sh [python ...]   (default: pyenv 3.10, 3.12, 3.13, Debian's 3.11)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIST=${DIST:-dist}
WORK=${WORK:-target/wheel-check}
if [ $# -gt 0 ]; then
    PYTHONS=("$@")
else
    PYTHONS=(/root/.pyenv/versions/3.10.13/bin/python3 /root/.pyenv/versions/3.12.1/bin/python3
        /root/.pyenv/versions/3.13.0/bin/python3 /usr/bin/python3)
fi
WHEEL=$(ls "$DIST"/quotaengine-*-cp310-abi3-*_"$(uname -m)".whl)
echo "wheel: $WHEEL ($(du -k "$WHEEL" | cut -f1) KiB)"
# No Rust toolchain: the venv's bin and the system's directories only.
CLEAN_PATH=/usr/local/bin:/usr/bin:/bin
if PATH=$CLEAN_PATH command -v cargo >/dev/null || PATH=$CLEAN_PATH command -v rustc >/dev/null; then
    echo "error: cargo or rustc is on $CLEAN_PATH" >&2; exit 1
fi
rm -rf "$WORK"; mkdir -p "$WORK"
FAILED=0
SUMMARY=()
for py in "${PYTHONS[@]}"; do
    name=$("$py" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')
    venv="$ROOT/$WORK/$name"
    printf '\n== %s (%s)\n' "$name" "$py"
    if ! "$py" -m venv "$venv"; then echo "FAIL $name: no venv" >&2; FAILED=1; continue; fi
    run() { (cd "$ROOT/$WORK" && env -i HOME="$HOME" PATH="$venv/bin:$CLEAN_PATH" LANG=C.UTF-8 "$@"); }
    start=$(date +%s%N)
    if run python -m pip install -q --no-index --find-links "$ROOT/$DIST" quotaengine \
        && install_s=$(( ($(date +%s%N) - start) / 1000000 )) \
        && run python "$ROOT/scripts/check_wheel.py" "$ROOT/README.md" | tee "$ROOT/$WORK/$name.json" \
        && run quotaengine demo --seconds 5 --db "$ROOT/$WORK/$name-demo.db" >"$ROOT/$WORK/$name-demo.log" 2>&1; then
        echo "demo: $(tail -1 "$ROOT/$WORK/$name-demo.log")"
        echo "PASS $name"
        SUMMARY+=("$("$venv/bin/python" -c 'import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print("| {} ({}) | {:.2f} s | {} ms | {} ms |".format(
    r["python"], sys.argv[3], int(sys.argv[2]) / 1000, r["import_ms"], r["importtime_ms"]))
' "$ROOT/$WORK/$name.json" "$install_s" "$py")")
    else
        echo "FAIL $name" >&2; tail -20 "$ROOT/$WORK/$name-demo.log" 2>/dev/null >&2 || true; FAILED=1
    fi
done
printf '\nwheel %s: %s bytes\n' "$(basename "$WHEEL")" "$(stat -c %s "$WHEEL")"
echo "| Python | install from the wheel | import quotaengine | -X importtime (quotaengine, cumulative) |"
echo "|---|---|---|---|"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
