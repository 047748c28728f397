"""SPEC §12, analysis half: the snapshot (rows, columns, HTML), read-only engines next to a
live writer, the ``quotaengine.analysis`` DataFrames and plots (Agg backend)."""

from __future__ import annotations

import hashlib
import math
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import quotaengine as q  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from moments import MINUTE, TEN_AM  # noqa: E402
from quotaengine import analysis  # noqa: E402

SPEC_COLUMNS = [
    "platform",
    "model_id",
    "key_id",
    "rpm_used",
    "rpm_limit",
    "rpd_used",
    "rpd_limit",
    "tpm_used",
    "tpm_limit",
    "tpd_used",
    "tpd_limit",
    "used_fraction",
    "in_flight",
    "cooldown_source",
    "cooldown_expires_at_ms",
    "exhausts_at_ms",
]

# The known setup: the clock starts at 10:00 UTC; the snapshot is taken at 10:05:01.
T_FIRST = TEN_AM
T_SECOND = TEN_AM + 5 * MINUTE
T_NOW = T_SECOND + 1_000
COOLDOWN_MS = 600_000


def build_known(e: q.QuotaEngine, clock: q.ManualClock) -> None:
    """groq/llama (rpm 10, rpd 100, tpm 1000, no tpd) on keys 1..3 and unlimited cerebras/qwen:

    * key 1: 2 requests + 300 tokens at 10:00, 1 request + 200 tokens at 10:05;
    * key 2: one lease in flight (estimated 100 tokens), no usage;
    * key 3: a 10-minute "tier" cooldown set at 10:05;
    * cerebras/qwen key 4: 1 request at 10:05, no limits.
    """
    e.set_model_limits("groq", "llama", rpm=10, rpd=100, tpm=1000)
    e.record_request("groq", "llama", 1)
    e.record_request("groq", "llama", 1)
    e.record_tokens("groq", "llama", 1, 300)
    clock.advance(5 * MINUTE)
    e.record_request("groq", "llama", 1)
    e.record_tokens("groq", "llama", 1, 200)
    e.acquire_lease("groq", "llama", 2, 100)
    e.set_cooldown("groq", "llama", 3, COOLDOWN_MS, "tier")
    e.record_request("cerebras", "qwen", 4)
    clock.advance(1_000)


EXPECTED_ROWS = [
    {
        "platform": "cerebras", "model_id": "qwen", "key_id": 4,
        "rpm_used": 1, "rpm_limit": None, "rpd_used": 1, "rpd_limit": None,
        "tpm_used": 0, "tpm_limit": None, "tpd_used": 0, "tpd_limit": None,
        "used_fraction": None, "in_flight": 0, "cooldown_source": None, "cooldown_expires_at_ms": None,
        "exhausts_at_ms": None,
    },
    {
        "platform": "groq", "model_id": "llama", "key_id": 1,
        "rpm_used": 1, "rpm_limit": 10, "rpd_used": 3, "rpd_limit": 100,
        "tpm_used": 200, "tpm_limit": 1000, "tpd_used": 500, "tpd_limit": None,
        "used_fraction": 0.2, "in_flight": 0, "cooldown_source": None, "cooldown_expires_at_ms": None,
        # SPEC 22.2: 97 requests of the day left at 3 per 10 minutes
        "exhausts_at_ms": T_NOW + 97 * 600_000 // 3,
    },
    {
        "platform": "groq", "model_id": "llama", "key_id": 2,
        "rpm_used": 0, "rpm_limit": 10, "rpd_used": 0, "rpd_limit": 100,
        "tpm_used": 0, "tpm_limit": 1000, "tpd_used": 0, "tpd_limit": None,
        "used_fraction": 0.0, "in_flight": 1, "cooldown_source": None, "cooldown_expires_at_ms": None,
        "exhausts_at_ms": None,
    },
    {
        "platform": "groq", "model_id": "llama", "key_id": 3,
        "rpm_used": 0, "rpm_limit": 10, "rpd_used": 0, "rpd_limit": 100,
        "tpm_used": 0, "tpm_limit": 1000, "tpd_used": 0, "tpd_limit": None,
        "used_fraction": 0.0, "in_flight": 0, "cooldown_source": "tier",
        "cooldown_expires_at_ms": T_SECOND + COOLDOWN_MS, "exhausts_at_ms": None,
    },
]  # fmt: skip


@pytest.fixture
def known(engine: q.QuotaEngine, clock: q.ManualClock) -> q.QuotaEngine:
    build_known(engine, clock)
    return engine


@pytest.fixture
def reader(known: q.QuotaEngine, store: str, clock: q.ManualClock) -> Iterator[q.QuotaEngine]:
    """A read-only engine on the known database, next to the (still open) writer."""
    r = q.QuotaEngine(store, clock=clock, readonly=True)
    yield r
    r.close()


@pytest.fixture
def empty_db(tmp_path: Path) -> Path:
    """A quotaengine database with its schema and nothing else."""
    path = tmp_path / "empty.db"
    q.QuotaEngine(path, env={}).close()
    return path


# ============================================================================ snapshot rows


def test_snapshot_rows_are_the_known_state(known: q.QuotaEngine) -> None:
    snap = known.snapshot()
    assert snap.taken_at_ms == T_NOW
    assert len(snap) == 4
    assert [dict(r) for r in snap] == EXPECTED_ROWS
    assert [list(r) for r in snap] == [SPEC_COLUMNS] * 4  # every key, in SPEC order


def test_snapshot_to_pandas_has_exactly_the_spec_columns(known: q.QuotaEngine) -> None:
    df = known.snapshot().to_pandas()
    assert list(df.columns) == SPEC_COLUMNS
    assert len(df) == 4
    assert list(df.platform) == ["cerebras", "groq", "groq", "groq"]
    assert list(df.key_id) == [4, 1, 2, 3]
    key1 = df[df.key_id == 1].iloc[0]
    assert (key1.rpm_used, key1.rpm_limit, key1.rpd_used, key1.rpd_limit) == (1, 10, 3, 100)
    assert (key1.tpm_used, key1.tpm_limit, key1.tpd_used) == (200, 1000, 500)
    assert pd.isna(key1.tpd_limit)
    assert key1.used_fraction == pytest.approx(0.2)
    assert df.set_index("key_id").in_flight.to_dict() == {4: 0, 1: 0, 2: 1, 3: 0}
    key3 = df[df.key_id == 3].iloc[0]
    assert key3.cooldown_source == "tier" and key3.cooldown_expires_at_ms == T_SECOND + COOLDOWN_MS
    cerebras = df[df.platform == "cerebras"].iloc[0]
    assert math.isnan(cerebras.used_fraction) and pd.isna(cerebras.rpm_limit)
    assert pd.isna(cerebras.cooldown_source) and pd.isna(cerebras.cooldown_expires_at_ms)
    # Integers stay integers (nullable where a limit may be missing).
    for name in ("key_id", "rpm_used", "rpd_used", "tpm_used", "tpd_used", "in_flight"):
        assert df[name].dtype == "int64", name
    for name in ("rpm_limit", "rpd_limit", "tpm_limit", "tpd_limit", "cooldown_expires_at_ms", "exhausts_at_ms"):
        assert df[name].dtype == "Int64", name
    assert df.set_index("key_id").exhausts_at_ms.to_dict()[1] == T_NOW + 97 * 600_000 // 3
    assert df.used_fraction.dtype == "float64"


def test_empty_snapshot(empty_db: Path) -> None:
    with q.QuotaEngine(empty_db, readonly=True) as r:
        snap = r.snapshot()
    assert len(snap) == 0
    df = snap.to_pandas()
    assert list(df.columns) == SPEC_COLUMNS and len(df) == 0
    assert "0 routes" in str(snap)
    page = parse_html(snap._repr_html_())
    assert all(row == [] for row in page.rows) and "no route has usage today" in page.text


def test_snapshot_str_is_the_cli_table(known: q.QuotaEngine, local_zone: Callable[[str], None]) -> None:
    local_zone("UTC")
    text = str(known.snapshot())
    lines = text.splitlines()
    assert lines[0].endswith("at 2026-01-01 10:05:01 UTC: 4 routes")
    head = ["platform", "model", "key", "RPM", "RPD", "TPM", "TPD", "used", "in", "flight", "cooldown", "runs", "out"]
    assert lines[1].split() == head
    # SPEC 22.2: the day's requests run out at 15:28:21 UTC at this pace (the test runs in UTC)
    row = ["groq", "llama", "1", "1/10", "3/100", "200/1000", "500/∞", "20%", "0", "-", "15:28"]
    assert lines[3].split() == row
    assert lines[5].split()[-4:] == ["0", "tier", "9m59s", "-"]


# ============================================================================ snapshot HTML


class _Table(HTMLParser):
    """Collects the header paragraph, the table's header cells and, per body row, each
    cell's text, class and the widths (%) of the utilisation bars inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.header = ""
        self.text = ""
        self.head: list[str] = []
        self.rows: list[list[dict[str, Any]]] = []
        self._in_p = False
        self._cell: dict[str, Any] | None = None
        self._in_th = False
        self._bar_depth = 0
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "p":
            self._in_p = True
        elif tag == "th":
            self._in_th = True
            self.head.append("")
        elif tag == "tr" and self.head and not self._in_th:
            self.rows.append([])
        elif tag == "td":
            self._cell = {"text": "", "class": a.get("class"), "bars": [], "title": a.get("title")}
        elif tag == "div" and self._cell is not None:
            if a.get("class") == "qe-bar":
                self._bar_depth = 1
            elif self._bar_depth:
                style = a.get("style") or ""
                width = style.split("width:")[1].split("%")[0]
                self._cell["bars"].append(float(width))

    def handle_endtag(self, tag: str) -> None:
        if tag == "p":
            self._in_p = False
        elif tag == "th":
            self._in_th = False
        elif tag == "td" and self._cell is not None:
            if self._cell["class"] is not None and self.rows:
                self._cell["text"] = self._cell["text"].strip()
                self.rows[-1].append(self._cell)
            self._cell = None
        elif tag == "div":
            self._bar_depth = 0

    def handle_data(self, data: str) -> None:
        self.text += data
        if self._in_p:
            self.header += data
        if self._in_th:
            self.head[-1] += data
        if self._cell is not None:
            self._cell["text"] += data

    def by_route(self) -> dict[tuple[str, str, int], dict[str, dict[str, Any]]]:
        out = {}
        for row in self.rows:
            cells = {c["class"].removeprefix("qe-"): c for c in row}
            out[(cells["platform"]["text"], cells["model"]["text"], int(cells["key"]["text"]))] = cells
        return out


def parse_html(page: str) -> _Table:
    parser = _Table()
    parser.feed(page)
    parser.close()
    return parser


def test_html_header_says_when_and_which_file(known: q.QuotaEngine, store: str) -> None:
    page = parse_html(known.snapshot()._repr_html_())
    assert store in page.header
    assert "2026-01-01 10:05:01 UTC" in page.header
    assert "4 routes" in page.header and "1 on cooldown" in page.header and "1 lease in flight" in page.header
    head = ["platform", "model", "key", "RPM", "RPD", "TPM", "TPD", "used", "in flight", "cooldown", "runs out"]
    assert page.head == head


def test_html_shows_the_numbers_per_route(known: q.QuotaEngine) -> None:
    page = parse_html(known.snapshot()._repr_html_())
    routes = page.by_route()
    # Sorted by platform, model, key.
    assert list(routes) == [
        ("cerebras", "qwen", 4),
        ("groq", "llama", 1),
        ("groq", "llama", 2),
        ("groq", "llama", 3),
    ]

    k1 = routes[("groq", "llama", 1)]
    assert [k1[w]["text"] for w in ("rpm", "rpd", "tpm", "tpd")] == ["1/10", "3/100", "200/1,000", "500/∞"]
    # A utilisation bar per window with a limit, as wide as used/limit.
    assert [k1[w]["bars"] for w in ("rpm", "rpd", "tpm", "tpd")] == [[10.0], [3.0], [20.0], []]
    assert k1["used"]["text"] == "20%" and k1["used"]["bars"] == [20.0]
    assert k1["in-flight"]["text"] == "0" and k1["cooldown"]["text"] == "-"
    assert "200 of 1,000" in k1["tpm"]["title"]

    k2 = routes[("groq", "llama", 2)]
    assert k2["in-flight"]["text"] == "1"
    assert k2["rpm"]["text"] == "0/10" and k2["used"]["text"] == "0%"

    k3 = routes[("groq", "llama", 3)]
    assert k3["cooldown"]["text"] == "tier, 9m59s left"
    assert "until 2026-01-01 10:15:00 UTC" in k3["cooldown"]["title"]

    cerebras = routes[("cerebras", "qwen", 4)]
    assert [cerebras[w]["text"] for w in ("rpm", "rpd", "tpm", "tpd")] == ["1/∞", "1/∞", "0/∞", "0/∞"]
    assert cerebras["used"]["text"] == "-" and all(cerebras[w]["bars"] == [] for w in ("rpm", "tpd"))


def test_html_bars_clamp_and_a_zero_limit_is_full(engine: q.QuotaEngine) -> None:
    engine.set_model_limits("p", "m", rpm=2, rpd=0)
    for _ in range(3):
        engine.record_request("p", "m", 1)  # over the limit: recorded usage, not admission
    page = parse_html(engine.snapshot()._repr_html_())
    cells = page.by_route()[("p", "m", 1)]
    assert cells["rpm"]["text"] == "3/2" and cells["rpm"]["bars"] == [100.0]
    assert cells["rpd"]["text"] == "3/0" and cells["rpd"]["bars"] == [100.0]


def test_html_escapes_names(engine: q.QuotaEngine) -> None:
    engine.record_request("<script>alert(1)</script>", "a&b", 1)
    page = parse_html(engine.snapshot()._repr_html_())
    assert "script" not in page.tags
    assert ("<script>alert(1)</script>", "a&b", 1) in page.by_route()


# ============================================================================ read-only engines


def file_state(path: Path) -> tuple[str, int, int]:
    data = path.read_bytes()
    st = path.stat()
    return hashlib.sha256(data).hexdigest(), st.st_size, st.st_mtime_ns


def read_everything(r: q.QuotaEngine) -> None:
    r.snapshot()
    r.usage_events()
    r.active_cooldowns()
    r.model_limits("groq", "llama")
    r.provider_caps("groq")
    r.server_logs(10)
    r.quota_state()
    analysis.events_frame(r)
    analysis.state_frame(r)
    analysis.cooldowns_frame(r)
    analysis.plot_usage(r)
    analysis.plot_utilisation(r)
    analysis.plot_cooldowns(r)


@pytest.mark.sqlite_only
def test_readonly_engine_never_writes(known: q.QuotaEngine, reader: q.QuotaEngine, db_path: Path) -> None:
    wal = Path(str(db_path) + "-wal")
    monitor = sqlite3.connect(db_path)
    try:
        version = monitor.execute("PRAGMA data_version").fetchone()[0]
        rows = monitor.execute("SELECT count(*) FROM rate_limit_usage").fetchone()[0]
        before = file_state(db_path), (wal.stat().st_size if wal.exists() else 0)
        for _ in range(3):
            read_everything(reader)
        analysis.plot_cooldowns(db_path)  # also through a path (its own read-only engine)
        analysis.state_frame(str(db_path))
        # No other connection committed anything, the main file and the WAL are as they were.
        assert monitor.execute("PRAGMA data_version").fetchone()[0] == version
        assert monitor.execute("SELECT count(*) FROM rate_limit_usage").fetchone()[0] == rows
        assert (file_state(db_path), (wal.stat().st_size if wal.exists() else 0)) == before
        # Positive control: a write by the writer does show up in data_version.
        known.record_request("groq", "llama", 1)
        assert monitor.execute("PRAGMA data_version").fetchone()[0] != version
    finally:
        monitor.close()
    with pytest.raises(q.DatabaseError):
        reader.record_request("groq", "llama", 1)


def test_readonly_engine_sees_the_writers_new_rows(
    known: q.QuotaEngine, reader: q.QuotaEngine, clock: q.ManualClock
) -> None:
    assert len(reader.usage_events()) == 6
    assert reader.snapshot().rows == known.snapshot().rows
    known.record_request("groq", "llama", 1)
    known.record_tokens("groq", "llama", 1, 50)
    known.set_cooldown("cerebras", "qwen", 4, 30_000, "authoritative")
    assert len(reader.usage_events()) == 8
    assert len(analysis.events_frame(reader)) == 8
    row = {(r["platform"], r["key_id"]): r for r in reader.snapshot()}
    assert row[("groq", 1)]["rpm_used"] == 2 and row[("groq", 1)]["tpd_used"] == 550
    assert row[("cerebras", 4)]["cooldown_source"] == "authoritative"
    assert len(analysis.cooldowns_frame(reader)) == 2


@pytest.mark.sqlite_only
def test_readonly_engine_is_not_blocked_by_a_writer_holding_the_lock(
    known: q.QuotaEngine, db_path: Path, clock: q.ManualClock
) -> None:
    blocker = sqlite3.connect(db_path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")  # holds the write lock
        blocker.execute("DELETE FROM rate_limit_cooldowns")  # uncommitted
        with q.QuotaEngine(db_path, clock=clock, readonly=True, busy_timeout_ms=5_000) as r:
            start = time.monotonic()
            assert len(r.snapshot()) == 4
            assert len(r.active_cooldowns()) == 1  # the uncommitted delete is invisible
            assert time.monotonic() - start < 2.0
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


# ============================================================================ analysis frames


def test_importing_quotaengine_does_not_import_pandas_or_matplotlib() -> None:
    code = (
        "import sys, quotaengine, quotaengine.analysis;"
        "bad = [m for m in ('pandas', 'matplotlib', 'numpy') if m in sys.modules];"
        "assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_events_frame(reader: q.QuotaEngine) -> None:
    df = analysis.events_frame(reader)
    assert list(df.columns) == [
        "time",
        "platform",
        "model_id",
        "key_id",
        "kind",
        "tokens",
        "input_tokens",
        "output_tokens",
        "cached_tokens",
        "cost",
        "tenants",
        "created_at_ms",
    ]
    assert len(df) == 6
    assert str(df.time.dtype) == "datetime64[ns, UTC]"
    for name in ("key_id", "tokens", "cost", "created_at_ms"):
        assert df[name].dtype == "int64", name
    assert (df.cost == 0).all()  # no prices: every event costs 0 (SPEC 23.1)
    assert df.tenants.tolist() == [[]] * 6  # no tenants named
    for name in ("platform", "model_id", "kind"):
        assert pd.api.types.is_string_dtype(df[name]), name
    assert df.time.iloc[0] == pd.Timestamp("2026-01-01 10:00:00", tz="UTC")
    assert (df.time.astype("int64") // 1_000_000 == df.created_at_ms).all()
    assert df.created_at_ms.is_monotonic_increasing
    assert df[df.kind == "request"].groupby("platform").size().to_dict() == {"cerebras": 1, "groq": 3}
    assert df[df.kind == "tokens"].tokens.sum() == 500
    # Filters: [since, until) in epoch ms, and one platform.
    assert len(analysis.events_frame(reader, since_ms=T_SECOND)) == 3
    assert len(analysis.events_frame(reader, until_ms=T_SECOND)) == 3
    assert len(analysis.events_frame(reader, since_ms=T_FIRST, until_ms=T_FIRST + 1)) == 3
    assert set(analysis.events_frame(reader, platform="cerebras").platform) == {"cerebras"}
    assert len(analysis.events_frame(reader, platform="groq", key_id=1)) == 5


@pytest.mark.sqlite_only
def test_events_frame_from_a_path_and_empty(reader: q.QuotaEngine, db_path: Path, empty_db: Path) -> None:
    assert len(analysis.events_frame(db_path)) == 6
    assert len(analysis.events_frame(str(db_path))) == 6
    empty = analysis.events_frame(empty_db)
    assert len(empty) == 0 and list(empty.columns) == list(analysis.EVENT_COLUMNS)
    assert str(empty.time.dtype) == "datetime64[ns, UTC]" and empty.key_id.dtype == "int64"
    with pytest.raises(TypeError):
        analysis.events_frame(42)  # type: ignore[arg-type]
    with pytest.raises(q.DatabaseError):
        analysis.events_frame(db_path.parent / "missing.db")


def test_state_frame(reader: q.QuotaEngine, empty_db: Path) -> None:
    df = analysis.state_frame(reader)
    assert list(df.columns) == SPEC_COLUMNS and len(df) == 4
    pd.testing.assert_frame_equal(df, reader.snapshot().to_pandas())
    assert list(zip(df.platform, df.key_id, strict=True)) == [("cerebras", 4), ("groq", 1), ("groq", 2), ("groq", 3)]
    empty = analysis.state_frame(empty_db)
    assert list(empty.columns) == SPEC_COLUMNS and len(empty) == 0


def test_cooldowns_frame(reader: q.QuotaEngine, empty_db: Path) -> None:
    df = analysis.cooldowns_frame(reader)
    assert list(df.columns) == ["platform", "model_id", "key_id", "source", "set_at", "expires_at", "remaining_s"]
    assert len(df) == 1
    row = df.iloc[0]
    assert (row.platform, row.model_id, row.key_id, row.source) == ("groq", "llama", 3, "tier")
    assert row.set_at == pd.Timestamp("2026-01-01 10:05:00", tz="UTC")
    assert row.expires_at == pd.Timestamp("2026-01-01 10:15:00", tz="UTC")
    assert row.remaining_s == pytest.approx(599.0)
    assert str(df.set_at.dtype) == str(df.expires_at.dtype) == "datetime64[ns, UTC]"
    assert df.remaining_s.dtype == "float64" and df.key_id.dtype == "Int64"  # <NA>: every key (SPEC 21.1)
    empty = analysis.cooldowns_frame(empty_db)
    assert len(empty) == 0 and list(empty.columns) == list(analysis.COOLDOWN_COLUMNS)
    assert str(empty.expires_at.dtype) == "datetime64[ns, UTC]"


# ============================================================================ plots


def lines_by_label(ax: Any) -> dict[str, Any]:
    return {line.get_label(): line for line in ax.get_lines()}


def assert_no_data(fig: Any) -> None:
    if isinstance(fig, matplotlib.axes.Axes):  # plot_usage and plot_spend return their Axes (SPEC 27.4)
        fig = fig.figure
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 1
    ax = fig.axes[0]
    assert not ax.axison and not ax.get_lines() and not ax.images and not ax.patches
    assert any("no data" in t.get_text() for t in ax.texts)
    fig.canvas.draw()  # renders under Agg


def test_plot_usage(reader: q.QuotaEngine) -> None:
    fig = analysis.plot_usage(reader, kind="rate").figure
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 2
    requests, tokens = fig.axes
    assert "requests" in requests.get_ylabel() and "tokens" in tokens.get_ylabel()
    req = lines_by_label(requests)
    # SPEC 22.2: each declared limit its own line at its value
    assert set(req) == {"cerebras", "groq", "groq/llama rpm 10", "groq/llama rpd 100"}
    # Per-minute bins from 10:00 to 10:05, plus the end of the last bin.
    assert list(req["groq"].get_ydata()) == [2, 0, 0, 0, 0, 1, 1]
    assert list(req["cerebras"].get_ydata()) == [0, 0, 0, 0, 0, 1, 1]
    assert list(req["groq/llama rpm 10"].get_ydata()) == [10, 10]
    assert list(req["groq/llama rpd 100"].get_ydata()) == [100, 100]
    tok = lines_by_label(tokens)
    assert set(tok) == {"cerebras", "groq", "groq/llama tpm 1k"}
    assert list(tok["groq"].get_ydata()) == [300, 0, 0, 0, 0, 200, 200]
    assert list(tok["groq/llama tpm 1k"].get_ydata()) == [1000, 1000]
    fig.canvas.draw()


def test_plot_usage_resamples_and_filters(reader: q.QuotaEngine) -> None:
    fig = analysis.plot_usage(reader, freq="5min", platform="groq", kind="rate").figure
    requests, tokens = fig.axes
    req = lines_by_label(requests)
    assert set(req) == {"groq", "groq/llama rpm 10", "groq/llama rpd 100"}
    assert list(req["groq"].get_ydata()) == [2, 1, 1]
    assert list(lines_by_label(tokens)["groq"].get_ydata()) == [300, 200, 200]
    since = analysis.plot_usage(reader, since_ms=T_SECOND, kind="rate")
    assert list(lines_by_label(since)["groq"].get_ydata()) == [1, 1]


@pytest.mark.parametrize("freq", ["10s", "1min", "5min", "1h"])
def test_a_sliding_limit_is_not_divided_into_the_bins(engine: q.QuotaEngine, freq: str) -> None:
    """SPEC 22.2: an rpm=30 window allows a burst of 30 in any bin, 10 s ones included."""
    engine.set_model_limits("groq", "burst", rpm=30)
    for _ in range(30):
        engine.record_request("groq", "burst", 1)
    (line,) = [v for k, v in lines_by_label(analysis.plot_usage(engine, freq=freq, kind="rate")).items() if "rpm" in k]
    assert list(line.get_ydata()) == [30, 30]
    assert line.get_label() == "groq/burst rpm 30"


def test_plot_usage_draws_every_declared_limit_and_cap(known: q.QuotaEngine, reader: q.QuotaEngine) -> None:
    known.record_request("groq", "llama", 2)
    known.set_model_limits(
        "groq",
        "mixtral",
        rpm=5,
        limits=[
            q.Limit("requests", 3, "10s"),
            q.Limit("tokens", 50_000, "week"),
            q.Limit("requests", 2, "10s", scope="key"),
            q.Limit("input_tokens", 4_000, "minute"),
        ],
    )
    known.record_request("groq", "mixtral", 1)
    known.set_provider_caps("groq", minute_requests=12, daily_tokens=150_000)
    req, tok = (lines_by_label(ax) for ax in analysis.plot_usage(reader, kind="rate").figure.axes)
    limits = {k: v.get_ydata()[0] for k, v in req.items() if " " in k}
    assert limits == {
        "groq/llama rpm 10": 10,
        "groq/llama rpd 100": 100,
        "groq/mixtral rpm 5": 5,
        "groq/mixtral requests/10s 3": 3,
        "groq/mixtral requests/10s:key 2": 2,
        "groq provider_minute_requests 12": 12,
    }
    limits = {k: v.get_ydata()[0] for k, v in tok.items() if " " in k}
    assert limits == {
        "groq/llama tpm 1k": 1000,
        "groq/mixtral input_tokens/minute 4k": 4000,
        "groq/mixtral tokens/week 50k": 50_000,
        "groq provider_daily_tokens 150k": 150_000,
    }


def test_plot_utilisation(reader: q.QuotaEngine) -> None:
    fig = analysis.plot_utilisation(reader)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 2  # the heat map and its colorbar
    ax = fig.axes[0]
    assert len(ax.images) == 1
    data = np.ma.getdata(ax.images[0].get_array()).astype(float)
    assert data.shape == (4, 4)  # routes x (rpm, rpd, tpm, tpd)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["RPM", "RPD", "TPM", "TPD"]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "cerebras / qwen / key 4",
        "groq / llama / key 1",
        "groq / llama / key 2",
        "groq / llama / key 3",
    ]
    assert np.isnan(data[0]).all()  # cerebras: no limits
    np.testing.assert_allclose(data[1, :3], [0.1, 0.03, 0.2])
    assert np.isnan(data[1, 3])  # no tpd limit
    np.testing.assert_allclose(data[2, :3], [0, 0, 0])
    assert "200/1k" in [t.get_text() for t in ax.texts]
    assert fig.axes[1].get_ylabel() == "used / limit"
    fig.canvas.draw()


def test_plot_cooldowns(reader: q.QuotaEngine, known: q.QuotaEngine, clock: q.ManualClock) -> None:
    fig = analysis.plot_cooldowns(reader)
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    ax = fig.axes[0]
    assert len(ax.patches) == 1
    assert [t.get_text() for t in ax.get_yticklabels()] == ["groq / llama / key 3"]
    assert matplotlib.colors.to_hex(ax.patches[0].get_facecolor()) == analysis.SOURCE_COLORS["tier"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["tier", "now"]
    fig.canvas.draw()

    # A short heuristic cooldown that has expired is still drawn (paler) while stored.
    known.set_cooldown("cerebras", "qwen", 4, 2_000, "heuristic")
    clock.advance(5_000)
    fig = analysis.plot_cooldowns(reader)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["cerebras / qwen / key 4", "groq / llama / key 3"]
    assert len(ax.patches) == 2
    assert ax.patches[0].get_alpha() < ax.patches[1].get_alpha()
    # since_ms drops what ended before it.
    fig = analysis.plot_cooldowns(reader, since_ms=T_NOW + 10_000)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["groq / llama / key 3"]
    assert_no_data(analysis.plot_cooldowns(reader, since_ms=T_SECOND + COOLDOWN_MS + 1))


def test_stored_cooldowns_keep_expired_ones_until_cleaned_up(
    engine: q.QuotaEngine, store: str, clock: q.ManualClock
) -> None:
    engine.set_cooldown("groq", "llama", 3, COOLDOWN_MS, "tier")
    engine.set_cooldown("cerebras", "qwen", 4, 2_000, "heuristic")
    clock.advance(5_000)
    assert [(c.platform, c.key_id) for c in engine.active_cooldowns()] == [("groq", 3)]
    with q.QuotaEngine(store, clock=clock, readonly=True) as reader:
        for e in (engine, reader):
            stored = e.stored_cooldowns()
            assert [(c.platform, c.model_id, c.key_id, c.source) for c in stored] == [
                ("cerebras", "qwen", 4, "heuristic"),
                ("groq", "llama", 3, "tier"),
            ]
            assert (stored[0].set_at_ms, stored[0].expires_at_ms, stored[0].remaining_ms) == (TEN_AM, TEN_AM + 2_000, 0)
            assert stored[1].remaining_ms == COOLDOWN_MS - 5_000
        assert engine.cleanup_expired_cooldowns() == 1
        assert [c.key_id for c in reader.stored_cooldowns()] == [3]


def test_plots_on_an_empty_database(empty_db: Path) -> None:
    assert_no_data(analysis.plot_usage(empty_db))
    assert_no_data(analysis.plot_utilisation(empty_db))
    assert_no_data(analysis.plot_cooldowns(empty_db))
    with q.QuotaEngine(empty_db, readonly=True) as r:
        assert_no_data(analysis.plot_usage(r, platform="groq"))


def test_plots_on_an_in_memory_engine(clock: q.ManualClock) -> None:
    with q.QuotaEngine(":memory:", clock=clock, env={}) as e:
        build_known(e, clock)
        assert len(analysis.plot_usage(e, kind="rate").figure.axes) == 2
        assert analysis.plot_utilisation(e).axes[0].images[0].get_array().shape == (4, 4)
        assert len(analysis.plot_cooldowns(e).axes[0].patches) == 1


def test_plot_functions_leave_no_pyplot_figures(reader: q.QuotaEngine) -> None:
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    analysis.plot_usage(reader)
    analysis.plot_utilisation(reader)
    analysis.plot_cooldowns(reader)
    assert plt.get_fignums() == before


# ============================================================================ CLI additions


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quotaengine", *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, "QUOTAENGINE_DB": ""},
    )  # fmt: skip


def test_cli_status_tables(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    with q.QuotaEngine(db, env={}) as e:
        e.set_model_limits("groq", "llama", rpm=10)
        e.record_request("groq", "llama", 7)
        e.set_provider_caps("groq", daily_requests=500)
        e.set_cooldown("groq", "llama", 7, 600_000, "authoritative")
    r = cli("status", "--db", str(db))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    caps = lines.index("provider caps (per key; - = none) and calendars (where each day starts):")
    head = ["platform", "requests/day", "requests/min", "tokens/day", "calendar", "day", "started"]
    assert lines[caps + 1].split() == head
    assert lines[caps + 2].split()[:5] == ["groq", "500", "-", "-", "UTC"]
    assert lines[caps + 2].endswith("00:00:00 UTC")  # a UTC day starts at midnight UTC
    cds = lines.index("active cooldowns: 1")
    assert lines[cds + 2].split()[:2] == ["groq/llama/7", "authoritative"]
    assert "degraded: False" in lines


def test_cli_status_shows_each_platforms_calendar(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    with q.QuotaEngine(db, env={}) as e:
        e.record_request("google", "gemini-2.5-flash", 1)
        e.record_request("groq", "llama", 1)
        e.set_platform_calendar("groq", "Asia/Tokyo")
    r = cli("status", "--db", str(db))
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("  g")}
    assert "America/Los_Angeles" in rows["google"]
    assert rows["google"].split()[-2] in ("07:00:00", "08:00:00")  # midnight Pacific, in UTC
    assert "Asia/Tokyo" in rows["groq"] and rows["groq"].split()[-2] == "15:00:00"


def test_cli_clear_cooldowns_refuses_an_empty_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    r = cli("clear-cooldowns", "3", "--db", str(empty))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert empty.read_bytes() == b""  # not turned into a database


def test_cli_reads_and_clears_either_backend(store: str) -> None:
    with q.QuotaEngine(store, env={}) as e:
        e.record_request("groq", "llama", 7)
        e.set_cooldown("groq", "llama", 7, 600_000, "tier")
    r = cli("status", "--db", store)
    assert r.returncode == 0, r.stderr
    assert "groq" in r.stdout and "active cooldowns: 1" in r.stdout
    r = cli("clear-cooldowns", "7", "--db", store)
    assert r.returncode == 0 and "cleared 1 cooldown(s) of key 7" in r.stdout, r.stderr
    assert "no active cooldowns" in cli("cooldowns", "--db", store).stdout


def test_events_frame_names_each_events_tenants(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    """SPEC 23.1's ``tenants`` of a usage event, as a column of lists: one tenant, two, none."""
    engine.record_request("groq", "m", 1, tenant="alice")
    clock.advance(1)
    engine.record_tokens("groq", "m", 1, 40, tenant=["alice", "team:a"])
    clock.advance(1)
    engine.record_request("groq", "m", 1)
    df = analysis.events_frame(engine)
    assert df.tenants.tolist() == [["alice"], ["alice", "team:a"], []]
    per_tenant = df.explode("tenants").dropna(subset=["tenants"]).groupby("tenants").size().to_dict()
    assert per_tenant == {"alice": 2, "team:a": 1}
