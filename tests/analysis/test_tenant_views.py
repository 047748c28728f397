"""SPEC 23.4: tenants in the snapshot (``.tenants``, ``tenants_to_pandas()``, a second HTML
table, the text table) and in ``quotaengine status``: used / limit per limit in force, in
dollars for a ``cost`` window."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any

import pandas as pd
import quotaengine as q
from moments import HOUR, TEN_AM
from quotaengine._snapshot import TENANT_COLUMNS, QuotaSnapshot, fmt_dollars

ROUTE = {
    "platform": "groq", "model_id": "llama", "key_id": 1,
    "rpm_used": 1, "rpm_limit": 10, "rpd_used": 3, "rpd_limit": 100,
    "tpm_used": 0, "tpm_limit": None, "tpd_used": 0, "tpd_limit": None,
    "used_fraction": 0.1, "in_flight": 0, "cooldown_source": None, "cooldown_expires_at_ms": None,
    "exhausts_at_ms": None,
}  # fmt: skip
TENANT_ROWS = [
    {
        "tenant": "team:search", "window": "cost/day", "used": 420_000, "limit": 5_000_000,
        "in_flight": 1_500, "used_fraction": 421_500 / 5_000_000, "exhausts_at_ms": TEN_AM + 3 * HOUR,
    },
    {
        "tenant": "user:<script>", "window": "requests/minute", "used": 3, "limit": 5, "in_flight": 1,
        "used_fraction": 0.8, "exhausts_at_ms": None,
    },
]  # fmt: skip


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quotaengine", *args], capture_output=True, text=True, timeout=120)


def snapshot(tenants: list[dict[str, Any]] | None) -> QuotaSnapshot:
    return QuotaSnapshot([dict(ROUTE)], TEN_AM, "quota.db", tenants)


class Tables(HTMLParser):
    """Each <table>'s header cells and body rows (cell texts), and the <p> texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict[str, list[Any]]] = []
        self.paragraphs: list[str] = []
        self.titles: list[str] = []
        self._where: str | None = None
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "table":
            self.tables.append({"head": [], "rows": []})
        elif tag == "p":
            self.paragraphs.append("")
            self._where = "p"
        elif tag == "th":
            self.tables[-1]["head"].append("")
            self._where = "th"
        elif tag == "tr" and self._where != "th" and self.tables[-1]["head"]:
            self.tables[-1]["rows"].append([])
        elif tag == "td":
            self.tables[-1]["rows"][-1].append("")
            self._where = "td"
            title = dict(attrs).get("title")
            if title:
                self.titles.append(title)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("p", "th", "td"):
            self._where = None

    def handle_data(self, data: str) -> None:
        if self._where == "p":
            self.paragraphs[-1] += data
        elif self._where == "th":
            self.tables[-1]["head"][-1] += data
        elif self._where == "td":
            self.tables[-1]["rows"][-1][-1] += data


def tables(page: str) -> Tables:
    parser = Tables()
    parser.feed(page)
    parser.close()
    return parser


def test_dollars_are_shown_exactly_and_to_the_cent_at_least() -> None:
    assert fmt_dollars(5_000_000) == "$5.00"
    assert fmt_dollars(420_000) == "$0.42"
    assert fmt_dollars(675) == "$0.000675"
    assert fmt_dollars(1_234_567) == "$1.234567"
    assert fmt_dollars(0) == "$0.00"
    assert fmt_dollars(1_234_500_000) == "$1,234.50"


def test_without_tenants_the_snapshot_is_as_before() -> None:
    plain = QuotaSnapshot([dict(ROUTE)], TEN_AM, "quota.db")
    for empty in (None, []):
        snap = snapshot(empty)
        assert snap.tenants == []
        assert snap._repr_html_() == plain._repr_html_()
        assert str(snap) == str(plain)
        assert len(tables(snap._repr_html_()).tables) == 1
        assert "tenant" not in str(snap)
    df = snapshot(None).tenants_to_pandas()
    assert list(df.columns) == TENANT_COLUMNS and len(df) == 0


def test_tenants_to_pandas_has_the_spec_columns() -> None:
    snap = snapshot(TENANT_ROWS)
    assert snap.tenants == TENANT_ROWS
    df = snap.tenants_to_pandas()
    assert (
        list(df.columns)
        == TENANT_COLUMNS
        == [
            "tenant",
            "window",
            "used",
            "limit",
            "in_flight",
            "used_fraction",
            "exhausts_at_ms",
        ]
    )
    assert list(df.tenant) == ["team:search", "user:<script>"]
    assert list(df.window) == ["cost/day", "requests/minute"]
    for name in ("used", "limit", "in_flight"):
        assert df[name].dtype == "int64", name
    assert list(df.used) == [420_000, 3] and list(df.limit) == [5_000_000, 5] and list(df.in_flight) == [1_500, 1]
    assert df.used_fraction.dtype == "float64" and list(df.used_fraction) == [0.0843, 0.8]
    assert df.exhausts_at_ms.dtype == "Int64"
    assert df.exhausts_at_ms[0] == TEN_AM + 3 * HOUR and pd.isna(df.exhausts_at_ms[1])


def test_html_has_a_second_table_of_tenants_in_dollars(local_zone: Callable[[str], None]) -> None:
    local_zone("UTC")
    page = tables(snapshot(TENANT_ROWS)._repr_html_())
    assert len(page.tables) == 2
    routes, tenants = page.tables
    assert routes["rows"][0][:4] == ["groq", "llama", "1", "1/10"]
    assert "2 tenants with limits in force" in page.paragraphs[1]
    assert tenants["head"] == ["tenant", "window", "used / limit", "used", "in flight", "runs out"]
    assert tenants["rows"] == [
        ["team:search", "cost/day", "$0.42 / $5.00", "8%", "$0.0015", "13:00"],
        ["user:<script>", "requests/minute", "3 / 5", "80%", "1", "-"],
    ]
    assert "script" not in page.tags  # names are escaped
    assert any("$0.42 used and $0.0015 in flight of $5.00" in t for t in page.titles)


def test_str_has_the_tenant_table_after_the_routes(local_zone: Callable[[str], None]) -> None:
    local_zone("UTC")
    lines = str(snapshot(TENANT_ROWS)).splitlines()
    assert lines[0].endswith(": 1 routes") and lines[2].split()[:4] == ["groq", "llama", "1", "1/10"]
    assert lines[3] == ""
    assert lines[4] == "2 tenants with limits in force (cost in dollars):"
    assert lines[5].split() == ["tenant", "window", "used", "/", "limit", "used", "in", "flight", "runs", "out"]
    assert lines[6].split() == ["team:search", "cost/day", "$0.42", "/", "$5.00", "8%", "$0.0015", "13:00"]
    assert lines[7].split() == ["user:<script>", "requests/minute", "3", "/", "5", "80%", "1", "-"]


def test_two_limits_of_one_tenant_count_it_once() -> None:
    rows = [dict(TENANT_ROWS[0]), dict(TENANT_ROWS[0], window="requests/day", used=7, limit=100, in_flight=0)]
    rows[1]["used_fraction"] = 0.07
    assert "1 tenant with limits in force" in str(snapshot(rows))
    assert q.QuotaSnapshot is QuotaSnapshot


# ============================================================================ from an engine

# 2 $/M input, 10 $/M output: 1,000 input and 100 output tokens cost 2,000 + 1,000 µ$.
PRICES = q.Prices(2, 10)


def build_tenants(e: q.QuotaEngine) -> q.Lease:
    """At 10:00: ``team:*`` $0.10 a day; ann 10 requests a minute and 5,500 tokens in 1h.

    * ann and team:a: 1,000 + 100 tokens of openai/gpt-4o (3,000 µ$);
    * ann: 2 requests; bob (no limits): 1 request;
    * team:a: a live lease of 500 estimated tokens (1,000 µ$ reserved), returned.
    """
    e.set_model_prices("openai", "gpt-4o", PRICES)
    e.set_tenant_limits("team:*", [q.Limit.dollars(0.1, "day")])
    e.set_tenant_limits("user:ann", [q.Limit("requests", 10, "minute"), q.Limit("tokens", 5_500, "1h")])
    e.record_tokens("openai", "gpt-4o", 1, input_tokens=1_000, output_tokens=100, tenant=["user:ann", "team:a"])
    e.record_request("openai", "gpt-4o", 1, tenant="user:ann")
    e.record_request("openai", "gpt-4o", 1, tenant="user:ann")
    e.record_request("openai", "gpt-4o", 1, tenant="user:bob")
    return e.lease("openai", "gpt-4o", 2, 500, tenant="team:a")


# SPEC 22.2's arithmetic: now + (limit - used - in_flight) / (usage of the last 10 minutes / 10 minutes)
ENGINE_ROWS = [
    {
        "tenant": "team:a", "window": "cost/day", "used": 3_000, "limit": 100_000, "in_flight": 1_000,
        "used_fraction": 0.04, "exhausts_at_ms": TEN_AM + 96_000 * 600_000 // 3_000,
    },
    {
        "tenant": "user:ann", "window": "requests/minute", "used": 2, "limit": 10, "in_flight": 0,
        "used_fraction": 0.2, "exhausts_at_ms": None,  # a window under an hour has no forecast
    },
    {
        "tenant": "user:ann", "window": "tokens/1h", "used": 1_100, "limit": 5_500, "in_flight": 0,
        "used_fraction": 0.2, "exhausts_at_ms": TEN_AM + 4_400 * 600_000 // 1_100,
    },
]  # fmt: skip


def test_snapshot_tenants_from_an_engine(engine: q.QuotaEngine, store: str, clock: q.ManualClock) -> None:
    lease = build_tenants(engine)
    snap = engine.snapshot()
    assert snap.tenants == ENGINE_ROWS
    # bob has usage today but no limit in force: a tenant, without rows
    assert engine.tenants() == ["team:a", "user:ann", "user:bob"]
    df = snap.tenants_to_pandas()
    assert list(df.tenant) == ["team:a", "user:ann", "user:ann"]
    assert list(df["limit"]) == [100_000, 10, 5_500]
    # a read-only engine on the same store sees the same, the lease of the writer in flight
    with q.QuotaEngine(store, clock=clock, readonly=True) as reader:
        assert reader.snapshot().tenants == ENGINE_ROWS
    lease.success(input_tokens=500, output_tokens=0)  # 1,000 µ$, as reserved
    row = engine.snapshot().tenants[0]
    assert (row["used"], row["in_flight"], row["used_fraction"]) == (4_000, 0, 0.04)


def test_snapshot_tenants_in_html_and_text(engine: q.QuotaEngine, local_zone: Callable[[str], None]) -> None:
    local_zone("UTC")
    build_tenants(engine)
    snap = engine.snapshot()
    page = tables(snap._repr_html_())
    assert len(page.tables) == 2
    assert page.tables[1]["rows"] == [
        ["team:a", "cost/day", "$0.003 / $0.10", "4%", "$0.001", "15:20"],
        ["user:ann", "requests/minute", "2 / 10", "20%", "0", "-"],
        ["user:ann", "tokens/1h", "1,100 / 5,500", "20%", "0", "10:40"],
    ]
    lines = str(snap).splitlines()
    start = lines.index("2 tenants with limits in force (cost in dollars):")
    assert [line.split()[:5] for line in lines[start + 2 :]] == [
        ["team:a", "cost/day", "$0.003", "/", "$0.10"],
        ["user:ann", "requests/minute", "2", "/", "10"],
        ["user:ann", "tokens/1h", "1100", "/", "5500"],
    ]


def test_status_prints_each_tenants_limits_in_dollars(store: str) -> None:
    with q.QuotaEngine(store, env={}) as e:
        e.set_model_prices("openai", "gpt-4o", PRICES)
        e.set_tenant_limits("team:*", [q.Limit.dollars(5, "day")])
        e.set_tenant_limits("user:ann", [q.Limit("requests", 100, "minute")])
        # 210,000 input tokens at 2 $/M: $0.42
        e.record_tokens("openai", "gpt-4o", 1, input_tokens=210_000, output_tokens=0, tenant=["user:ann", "team:a"])
        e.record_request("openai", "gpt-4o", 1, tenant="user:ann")
    r = cli("status", "--db", store)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    routes = next(i for i, line in enumerate(lines) if line.startswith("platform"))
    tenants = lines.index("2 tenants with limits in force (cost in dollars):")
    assert routes < tenants  # after the routes
    rows = {
        tuple(line.split()[:2]): line for line in lines[tenants + 2 :] if line.split()[:1] in (["team:a"], ["user:ann"])
    }
    assert "$0.42 / $5.00" in rows[("team:a", "cost/day")]
    assert "1 / 100" in rows[("user:ann", "requests/minute")]
