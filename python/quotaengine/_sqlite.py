"""One SQLite per process (SPEC 1 and 26): the engine runs on the SQLite that Python's ``sqlite3`` uses.

The Linux wheel's extension leaves its ``sqlite3_*`` symbols undefined and names no
SQLite library (no ``DT_NEEDED``); :func:`share_sqlite` runs before it is imported and
puts the SQLite that ``_sqlite3`` loaded, whatever its path, in the process's global
symbol scope, where the extension's symbols then resolve. ``dlopen`` of a file that is
already loaded returns that same copy, so no second SQLite is loaded.

Where the C module behind ``sqlite3`` has SQLite built in (``_sqlite3`` of
python-build-standalone, as uv installs it; ``pysqlite3._sqlite3`` where ``sqlite3`` was
swapped for pysqlite3) and exports its symbols, that module itself is promoted; if it
does not export them, the system's ``libsqlite3.so.0`` is used with one warning. A
source build links the system SQLite directly (``DT_NEEDED``); promoting it again is
harmless. A build with SQLite compiled in (cargo feature ``bundled-sqlite``, the Windows
wheel) runs on its own copy: :func:`check_runs_on` names it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import types
import warnings

# What to install when no SQLite shared library is found.
_INSTALL_HINT = (
    "quotaengine needs the SQLite 3 shared library (libsqlite3.so.0): install it with your "
    "system's package manager (Debian/Ubuntu: apt-get install libsqlite3-0; Fedora/RHEL: "
    "dnf install sqlite-libs; Alpine: apk add sqlite-libs)"
)

# How the engine found its SQLite (for diagnostics and scripts/check_wheel.py).
source = "not loaded"
_warned = False


def _exports_sqlite(path: str | None) -> bool:
    """Whether the file at ``path`` (None: the program and its global libraries) exports SQLite."""
    try:
        lib = ctypes.CDLL(path)
        return hasattr(lib, "sqlite3_libversion") and hasattr(lib, "sqlite3_open_v2")
    except OSError:
        return False


def _version_of(path: str | None) -> str | None:
    try:
        fn = ctypes.CDLL(path).sqlite3_libversion
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_char_p
    out = fn()
    return out.decode() if isinstance(out, bytes) else None


def _mapped_sqlite_libraries() -> list[str]:
    """The SQLite shared libraries mapped in this process, from /proc/self/maps."""
    found: list[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) < 6:
                    continue
                path = parts[5].strip()
                if os.path.basename(path).startswith("libsqlite3") and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def _sqlite3_extension(sqlite3: types.ModuleType) -> types.ModuleType | None:
    """The C module behind ``sqlite3``: the module its ``connect`` is defined in.

    ``_sqlite3`` on CPython; ``pysqlite3._sqlite3`` where ``sqlite3`` is pysqlite3
    (``sys.modules["sqlite3"] = pysqlite3``). Importing ``_sqlite3`` by name instead would
    load the stdlib's module, and with it a second SQLite, beside the one in use.
    """
    owner = getattr(getattr(sqlite3, "connect", None), "__self__", None)
    if isinstance(owner, types.ModuleType):
        return owner
    return sys.modules.get("_sqlite3")


def _promote(path: str) -> None:
    ctypes.CDLL(path, mode=os.RTLD_GLOBAL | os.RTLD_NOW)


def share_sqlite() -> None:
    """Makes the SQLite that Python's ``sqlite3`` uses resolve the extension's symbols (Linux)."""
    global source
    if not sys.platform.startswith("linux"):
        # macOS wheels link the system's libsqlite3.dylib, Windows wheels compile SQLite in
        # (docs/wheels.md); check_runs_on warns where that is a second copy that matters.
        source = "linked at build time"
        return
    try:
        import sqlite3
    except ImportError:
        _sqlite3 = None
    else:
        _sqlite3 = _sqlite3_extension(sqlite3)
    if _sqlite3 is not None:
        wanted = sqlite3.sqlite_version
        # 1. SQLite as a shared library beside _sqlite3 (Debian, pyenv, conda, python images).
        for path in _mapped_sqlite_libraries():
            if _version_of(path) == wanted:
                _promote(path)
                source = path
                return
        # 2. SQLite built into _sqlite3 (python-build-standalone, pysqlite3), if it exports it.
        module_file = getattr(_sqlite3, "__file__", None)
        if module_file and _exports_sqlite(module_file) and _version_of(module_file) == wanted:
            _promote(module_file)
            source = module_file
            return
        # 3. SQLite built into the interpreter itself and exported by it.
        if module_file is None and _exports_sqlite(None) and _version_of(None) == wanted:
            source = "the Python executable"
            return
    # 4. The system's library: a second copy beside _sqlite3's built-in one (if any).
    for name in ("libsqlite3.so.0", "libsqlite3.so"):
        try:
            _promote(name)
        except OSError:
            continue
        source = name
        if _sqlite3 is not None:
            global _warned
            _warned = True
            warnings.warn(
                f"quotaengine runs on the system SQLite ({name}, "
                f"{_version_of(name)}), not on the copy built into this Python's sqlite3 module "
                f"({sqlite3.sqlite_version}), which does not export it: do not open the engine's "
                "database file with the sqlite3 module (or pandas) in this process; two SQLite "
                "copies in one process do not see each other's locks and can corrupt or lose data",
                RuntimeWarning,
                stacklevel=3,
            )
        return
    raise ImportError(_INSTALL_HINT)


def check_runs_on(version: str, compiled_in: bool = False) -> None:
    """Warns once if the engine's SQLite (``version``) is a second copy beside ``sqlite3``'s.

    Cannot happen on Linux after :func:`share_sqlite` with the wheel; it can with a macOS
    wheel (linked to the system's libsqlite3.dylib) on a Python whose sqlite3 brings its
    own SQLite, and with SQLite compiled into the extension (``compiled_in``: cargo
    feature ``bundled-sqlite``), which is always a copy of its own, whatever its version.
    """
    global source
    if compiled_in:
        # Nothing was loaded for the extension: it runs on its own copy.
        source = "compiled into the extension"
    if _warned or sys.platform == "win32":
        # Windows wheels compile SQLite in: Windows locks are per handle, so two copies
        # coordinate as two processes do (docs/wheels.md).
        return
    try:
        import sqlite3
    except ImportError:
        return
    if sqlite3.sqlite_version != version or compiled_in:
        ours = f"SQLite {version} compiled into its extension" if compiled_in else f"SQLite {version}"
        warnings.warn(
            f"quotaengine runs on {ours}, Python's sqlite3 on {sqlite3.sqlite_version}: two "
            "SQLite copies in this process; do not open the engine's database file with the "
            "sqlite3 module (or pandas) in this process (they do not see each other's locks and "
            "can corrupt or lose data)",
            RuntimeWarning,
            stacklevel=3,
        )
