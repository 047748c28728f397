"""``QuotaSnapshot``: the state of every active route, for notebooks and the CLI."""

from __future__ import annotations

import datetime as _dt
import html
from collections.abc import Iterator
from typing import Any

COLUMNS = [
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

#: The columns of ``QuotaSnapshot.tenants`` rows and ``tenants_to_pandas()`` (SPEC 23.4).
TENANT_COLUMNS = ["tenant", "window", "used", "limit", "in_flight", "used_fraction", "exhausts_at_ms"]


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def _datetime(ms: int, local: bool) -> _dt.datetime | None:
    """An epoch-ms time as an aware datetime (UTC, or the local zone), or ``None`` when
    it lies outside the years 1 to 9999 a datetime holds (a forecast at a slow pace
    can be millions of years away)."""
    try:
        at = _EPOCH + _dt.timedelta(milliseconds=ms)
        return at.astimezone() if local else at
    except (OverflowError, ValueError, OSError):
        return None


def _out_of_range(ms: int) -> str:
    return "after year 9999" if ms > 0 else "before year 1"


def _fmt_time(ms: int) -> str:
    """An epoch-ms time in UTC (``after year 9999`` when beyond what a datetime holds)."""
    at = _datetime(ms, local=False)
    return _out_of_range(ms) if at is None else at.strftime("%Y-%m-%d %H:%M:%S UTC")


def _fmt_at(ms: int) -> str:
    """``at <UTC time>``, or ``after year 9999`` (``before year 1``) beyond a datetime."""
    at = _fmt_time(ms)
    return at if _datetime(ms, local=False) is None else f"at {at}"


def fmt_local(ms: int, now_ms: int) -> str:
    """An epoch-ms time as a local time: ``HH:MM``, with the date when not today's (SPEC 22.2);
    ``after year 9999`` (or ``before year 1``) when beyond what a datetime holds."""
    at, now = _datetime(ms, local=True), _datetime(now_ms, local=True)
    if at is None:
        return _out_of_range(ms)
    return at.strftime("%H:%M") if now is not None and at.date() == now.date() else at.strftime("%Y-%m-%d %H:%M")


def fmt_dollars(micro: int) -> str:
    """Micro-dollars as dollars, exactly and at least to the cent: ``$5.00``, ``$0.42``,
    ``$0.000675``, ``$1,234.5``."""
    whole, frac = divmod(int(micro), 1_000_000)
    cents = f"{frac:06d}".rstrip("0").ljust(2, "0")
    return f"${whole:,}.{cents}"


def fmt_amount(window: str, value: int, sep: str = ",") -> str:
    """A tenant window's amount: dollars for a ``cost`` window (held in micro-dollars),
    else the count (with ``sep`` between thousands)."""
    if window.startswith("cost/"):
        return fmt_dollars(value)
    return f"{value:,}".replace(",", sep)


def _fmt_left(ms: int) -> str:
    s = max(0, ms) // 1000
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class QuotaSnapshot:
    """One row per (platform, model_id, key_id) with usage today, a live lease or an
    active cooldown, sorted by platform, model_id, key_id.

    ``tenants`` (SPEC 23.4) holds one dict per tenant with limits in force or usage
    today and per limit in force for it, sorted by tenant, then in gate order, with the
    keys of :data:`TENANT_COLUMNS`: ``tenant`` (its own name, also when a pattern
    declared the limit), ``window`` (``"<metric>/<per>"``, e.g. ``"cost/day"``),
    ``used``, ``limit`` and ``in_flight`` (requests, tokens, or micro-dollars for a
    ``cost`` window; ``in_flight`` is what live leases hold), ``used_fraction`` (``(used
    + in_flight) / limit``) and ``exhausts_at_ms`` (SPEC 22.2's forecast of that window,
    ``None`` when none)."""

    def __init__(
        self,
        rows: list[dict[str, Any]],
        taken_at_ms: int,
        path: str,
        tenants: list[dict[str, Any]] | None = None,
    ) -> None:
        # Every declared limit beyond the classic four (SPEC §14.1), named by its reason, in
        # the order routes declare them: a column each, only for those some route declares.
        self.declared: list[str] = []
        for r in rows:
            for reason, used, limit in r.pop("declared", ()):
                if reason not in self.declared:
                    self.declared.append(reason)
                r[f"{reason}_used"], r[f"{reason}_limit"] = used, limit
        for r in rows:
            for reason in self.declared:
                r.setdefault(f"{reason}_used", None)
                r.setdefault(f"{reason}_limit", None)
        self.rows = rows
        self.taken_at_ms = taken_at_ms
        self.path = path
        self.tenants: list[dict[str, Any]] = [dict(t) for t in tenants or ()]

    @property
    def columns(self) -> list[str]:
        """SPEC §12's columns, with ``<reason>_used`` and ``<reason>_limit`` after the classic
        four for each other limit some route declares (e.g. ``requests/1s_used``)."""
        at = COLUMNS.index("tpd_limit") + 1
        extra = [f"{reason}_{part}" for reason in self.declared for part in ("used", "limit")]
        return COLUMNS[:at] + extra + COLUMNS[at:]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]

    def to_pandas(self) -> Any:
        """The rows as a pandas DataFrame with exactly the SPEC §12 columns (needs pandas).

        ``platform``/``model_id``/``cooldown_source`` are strings; ``key_id``, the
        ``*_used`` counts (requests for rpm/rpd, tokens for tpm/tpd) and ``in_flight``
        are int64; the ``*_limit`` columns, ``cooldown_expires_at_ms`` and
        ``exhausts_at_ms`` (epoch ms, SPEC 22.2: the earliest of the route's forecasts)
        are nullable ``Int64`` (``<NA>``: no limit / no cooldown / no forecast); ``used_fraction`` is
        float64 (NaN without limits). Each other declared limit adds ``<reason>_used`` and
        ``<reason>_limit`` (nullable ``Int64``: ``<NA>`` on routes that do not declare it).
        """
        import pandas as pd

        def col(name: str) -> list[Any]:
            return [r[name] for r in self.rows]

        data: dict[str, Any] = {}
        declared = {f"{reason}_used" for reason in self.declared}
        for name in self.columns:
            if name in ("platform", "model_id"):
                data[name] = pd.Series(col(name), dtype=str)
            elif name == "cooldown_source":
                data[name] = pd.Series(col(name), dtype=object)
            elif name == "used_fraction":
                data[name] = pd.Series([None if v is None else float(v) for v in col(name)], dtype="float64")
            elif name.endswith("_limit") or name in ("cooldown_expires_at_ms", "exhausts_at_ms") or name in declared:
                data[name] = pd.Series(col(name), dtype="Int64")
            else:
                data[name] = pd.Series(col(name), dtype="int64")
        return pd.DataFrame(data, columns=self.columns)

    def tenants_to_pandas(self) -> Any:
        """The tenant rows (SPEC 23.4) as a pandas DataFrame with exactly the columns
        :data:`TENANT_COLUMNS` (needs pandas): ``tenant`` and ``window`` are strings;
        ``used``, ``limit`` and ``in_flight`` int64 (micro-dollars for a ``cost``
        window); ``used_fraction`` float64; ``exhausts_at_ms`` nullable ``Int64``
        (``<NA>``: no forecast)."""
        import pandas as pd

        def col(name: str) -> list[Any]:
            return [r[name] for r in self.tenants]

        data = {
            "tenant": pd.Series(col("tenant"), dtype=str),
            "window": pd.Series(col("window"), dtype=str),
            **{name: pd.Series(col(name), dtype="int64") for name in ("used", "limit", "in_flight")},
            "used_fraction": pd.Series([float(v) for v in col("used_fraction")], dtype="float64"),
            "exhausts_at_ms": pd.Series(col("exhausts_at_ms"), dtype="Int64"),
        }
        return pd.DataFrame(data, columns=TENANT_COLUMNS)

    _TENANT_HEAD = ["tenant", "window", "used / limit", "used", "in flight", "runs out"]

    def _tenant_cells(self, row: dict[str, Any]) -> list[str]:
        window = row["window"]
        return [
            row["tenant"],
            window,
            f"{fmt_amount(window, row['used'], '')} / {fmt_amount(window, row['limit'], '')}",
            f"{row['used_fraction']:.0%}",
            fmt_amount(window, row["in_flight"], ""),
            self._runs_out(row),
        ]

    def _tenant_count(self) -> str:
        n = len({t["tenant"] for t in self.tenants})
        return f"{n} tenant{'' if n == 1 else 's'} with limits in force"

    def _cells(self, row: dict[str, Any]) -> list[str]:
        def win(name: str) -> str:
            used, limit = row[f"{name}_used"], row[f"{name}_limit"]
            if used is None:
                return "-"
            return f"{used}/{'∞' if limit is None else limit}"

        cd = "-"
        if row["cooldown_source"] is not None:
            cd = f"{row['cooldown_source']} {_fmt_left(row['cooldown_expires_at_ms'] - self.taken_at_ms)}"
        frac = row["used_fraction"]
        return [
            row["platform"],
            row["model_id"],
            str(row["key_id"]),
            win("rpm"),
            win("rpd"),
            win("tpm"),
            win("tpd"),
            *[win(reason) for reason in self.declared],
            "-" if frac is None else f"{frac:.0%}",
            str(row["in_flight"]),
            cd,
            self._runs_out(row),
        ]

    def _runs_out(self, row: dict[str, Any]) -> str:
        at = row.get("exhausts_at_ms")
        return "-" if at is None else fmt_local(at, self.taken_at_ms)

    _HEAD = ["platform", "model", "key", "RPM", "RPD", "TPM", "TPD", "used", "in flight", "cooldown", "runs out"]

    @property
    def _head(self) -> list[str]:
        return self._HEAD[:7] + self.declared + self._HEAD[7:]

    def __str__(self) -> str:
        head = f"quota snapshot of {self.path} at {_fmt_time(self.taken_at_ms)}: {len(self.rows)} routes"
        table = [self._head] + [self._cells(r) for r in self.rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(self._head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
        if self.tenants:
            table = [self._TENANT_HEAD] + [self._tenant_cells(t) for t in self.tenants]
            widths = [max(len(r[i]) for r in table) for i in range(len(self._TENANT_HEAD))]
            lines.append(f"\n{self._tenant_count()} (cost in dollars):")
            lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table)
        return "\n".join([head, *lines])

    def __repr__(self) -> str:
        return f"<QuotaSnapshot of {self.path!r}: {len(self.rows)} routes at {self.taken_at_ms}>"

    _WINDOW_HELP = {
        "rpm": "requests in the last 60 s",
        "rpd": "requests since the start of the platform's day (00:00 UTC unless its calendar says otherwise)",
        "tpm": "tokens in the last 60 s",
        "tpd": "tokens since the start of the platform's day",
    }

    def _repr_html_(self) -> str:
        """An HTML table for Jupyter: a header line (which file, when), then per route
        the four windows as used/limit with a small utilisation bar, the worst
        fraction, the leases in flight, the cooldown (source and time left) and when a
        window runs out at the recent pace (a local time, SPEC 22.2). When there are
        tenant rows, a second table of them follows (SPEC 23.4, cost in dollars)."""
        esc = html.escape

        def bar(frac: float | None) -> str:
            if frac is None:
                return ""
            pct = max(0.0, min(1.0, frac)) * 100
            color = "#2e7d32" if pct < 70 else "#f9a825" if pct < 90 else "#c62828"
            return (
                '<div class="qe-bar" style="width:64px;height:5px;background:rgba(127,127,127,.25);'
                f'margin-top:2px"><div style="width:{pct:.0f}%;height:5px;background:{color}"></div></div>'
            )

        def window(row: dict[str, Any], name: str) -> str:
            used, limit = row[f"{name}_used"], row[f"{name}_limit"]
            help_text = self._WINDOW_HELP.get(name, f"{name} (a declared limit)")
            css = name if name in self._WINDOW_HELP else "declared"
            if used is None:
                return f'<td class="qe-{css}" title="{esc(help_text)}: not declared here">-</td>'
            if limit is None:
                frac, shown, tip = None, f"{used:,}/∞", f"{help_text}: {used:,}, no limit"
            else:
                frac = 1.0 if limit <= 0 else used / limit
                shown = f"{used:,}/{limit:,}"
                tip = f"{help_text}: {used:,} of {limit:,} ({frac:.0%})"
            return f'<td class="qe-{css}" title="{esc(tip)}" style="text-align:right">{esc(shown)}{bar(frac)}</td>'

        rows = sorted(self.rows, key=lambda r: (r["platform"], r["model_id"], r["key_id"]))
        benched = sum(1 for r in rows if r["cooldown_source"] is not None)
        in_flight = sum(r["in_flight"] for r in rows)
        out = [
            '<div class="quotaengine-snapshot">',
            f'<p class="qe-header"><b>quotaengine</b> snapshot of <code>{esc(self.path)}</code> '
            f"at {esc(_fmt_time(self.taken_at_ms))}: {len(rows)} route{'' if len(rows) == 1 else 's'}, "
            f"{benched} on cooldown, {in_flight} lease{'' if in_flight == 1 else 's'} in flight</p>",
            "<table><thead><tr>",
            *[f"<th>{esc(h)}</th>" for h in self._head],
            "</tr></thead><tbody>",
        ]
        if not rows:
            out.append(
                f'<tr><td colspan="{len(self._head)}"><i>no route has usage today, '
                "a live lease or an active cooldown</i></td></tr>"
            )
        for r in rows:
            frac = r["used_fraction"]
            cooldown = r["cooldown_source"] is not None
            out.append('<tr style="background:rgba(198,40,40,.08)">' if cooldown else "<tr>")
            out.append(f'<td class="qe-platform">{esc(r["platform"])}</td>')
            out.append(f'<td class="qe-model">{esc(r["model_id"])}</td>')
            out.append(f'<td class="qe-key">{esc(str(r["key_id"]))}</td>')
            out.extend(window(r, w) for w in ("rpm", "rpd", "tpm", "tpd", *self.declared))
            out.append(
                '<td class="qe-used" style="text-align:right">'
                + ("-" if frac is None else f"{frac:.0%}{bar(frac)}")
                + "</td>"
            )
            out.append(f'<td class="qe-in-flight" style="text-align:right">{r["in_flight"]}</td>')
            if cooldown:
                expires = r["cooldown_expires_at_ms"]
                left = _fmt_left(expires - self.taken_at_ms)
                out.append(
                    f'<td class="qe-cooldown" title="until {esc(_fmt_time(expires))}">'
                    f"<b>{esc(r['cooldown_source'])}</b>, {esc(left)} left</td>"
                )
            else:
                out.append('<td class="qe-cooldown">-</td>')
            at = r.get("exhausts_at_ms")
            if at is None:
                out.append('<td class="qe-runs-out">-</td>')
            else:
                out.append(
                    f'<td class="qe-runs-out" title="a window runs out at this pace {esc(_fmt_at(at))}">'
                    f"{esc(fmt_local(at, self.taken_at_ms))}</td>"
                )
            out.append("</tr>")
        out.append("</tbody></table>")
        if self.tenants:
            out.extend(self._tenants_html(bar))
        out.append("</div>")
        return "".join(out)

    def _tenants_html(self, bar: Any) -> list[str]:
        """The second table (SPEC 23.4): per tenant and limit in force, used / limit (in
        dollars for a ``cost`` window) with a bar of (used + in flight) / limit, that
        fraction, what live leases hold and when the window runs out at the recent pace."""
        esc = html.escape
        out = [
            f'<p class="qe-header qe-tenants-header">{esc(self._tenant_count())} (cost in dollars)</p>',
            '<table class="qe-tenants"><thead><tr>',
            *[f"<th>{esc(h)}</th>" for h in self._TENANT_HEAD],
            "</tr></thead><tbody>",
        ]
        for t in self.tenants:
            window, frac = t["window"], t["used_fraction"]
            used, limit = fmt_amount(window, t["used"]), fmt_amount(window, t["limit"])
            in_flight = fmt_amount(window, t["in_flight"])
            tip = f"{t['tenant']}, {window}: {used} used and {in_flight} in flight of {limit} ({frac:.0%})"
            out.append("<tr>")
            out.append(f'<td class="qe-tenant">{esc(t["tenant"])}</td>')
            out.append(f'<td class="qe-window">{esc(window)}</td>')
            out.append(
                f'<td class="qe-usage" title="{esc(tip)}" style="text-align:right">'
                f"{esc(f'{used} / {limit}')}{bar(frac)}</td>"
            )
            out.append(f'<td class="qe-used" style="text-align:right">{frac:.0%}</td>')
            out.append(f'<td class="qe-in-flight" style="text-align:right">{esc(in_flight)}</td>')
            at = t.get("exhausts_at_ms")
            if at is None:
                out.append('<td class="qe-runs-out">-</td>')
            else:
                out.append(
                    f'<td class="qe-runs-out" title="this window runs out at this pace {esc(_fmt_at(at))}">'
                    f"{esc(fmt_local(at, self.taken_at_ms))}</td>"
                )
            out.append("</tr>")
        out.append("</tbody></table>")
        return out
