"""Quota analysis for notebooks: DataFrames of a database and matplotlib plots.

Needs the optional extra ``analysis`` (``pip install quotaengine[analysis]``: pandas
and matplotlib). Both are imported inside the functions, so ``import quotaengine``
(and even ``import quotaengine.analysis``) never imports them.

Every function takes ``source``: a :class:`quotaengine.QuotaEngine` (used as is,
left open) or a path (``str`` or ``os.PathLike``), which is opened with
``readonly=True`` and closed before the function returns. A read-only engine never
writes to the file and never blocks a router that is writing to it, and it sees
that router's newest rows.

Units: timestamps in the database and in every ``*_ms`` argument are milliseconds
since the Unix epoch (UTC); the ``time``, ``set_at`` and ``expires_at`` columns are
``datetime64[ns, UTC]``; ``remaining_s`` is in seconds; ``tokens`` are the
provider's tokens (prompt + completion, as recorded by ``record_tokens`` or
``Lease.success``).

The plot functions build a :class:`matplotlib.figure.Figure` without pyplot (no
global figure state, nothing to close, works under the Agg backend and in headless
CI); they never call ``plt.show()``. :func:`plot_usage` and :func:`plot_spend` return
their ``Axes`` (SPEC 27.4; ``ax.figure`` is the Figure), the others the Figure. In
Jupyter a Figure renders as an image when it is the value of a cell (``%matplotlib
inline``, the default): write ``analysis.plot_usage(db).figure``. On a database with
nothing to show they draw a single "no data" text.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Union

from . import QuotaEngine
from ._quotaengine import _QuotaEngine
from ._snapshot import COLUMNS as STATE_COLUMNS

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pandas as pd
    from matplotlib.figure import Figure

Source = Union[_QuotaEngine, str, "os.PathLike[str]"]

__all__ = [
    "COOLDOWN_COLUMNS",
    "EVENT_COLUMNS",
    "STATE_COLUMNS",
    "WINDOWS",
    "cooldowns_frame",
    "events_frame",
    "plot_cooldowns",
    "plot_spend",
    "plot_usage",
    "plot_utilisation",
    "spend",
    "state_frame",
]

#: Columns of :func:`events_frame`, in order.
EVENT_COLUMNS = [
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
#: Columns of :func:`cooldowns_frame`, in order.
COOLDOWN_COLUMNS = ["platform", "model_id", "key_id", "source", "set_at", "expires_at", "remaining_s"]
#: The four windows, in the order of the heat map's columns.
WINDOWS = ["rpm", "rpd", "tpm", "tpd"]
#: One colour per cooldown source (SPEC §6), used by :func:`plot_cooldowns`.
SOURCE_COLORS = {
    "heuristic": "#f9a825",
    "authoritative": "#1565c0",
    "credit": "#6a1b9a",
    "tier": "#c62828",
    "upstream": "#2e7d32",
}

_UTC = "datetime64[ns, UTC]"

#: The groupings of :func:`spend`: ``by`` -> how an event's column is named.
SPEND_BY = ("tenant", "route", "platform", "model")
#: The column of :func:`spend` (``by="tenant"``) for events that name no tenant.
NO_TENANT = "(none)"


# ----------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _engine(source: Source) -> Iterator[QuotaEngine]:
    """The engine itself, or a read-only engine on a path, closed on exit."""
    if isinstance(source, QuotaEngine):
        yield source
        return
    if isinstance(source, (str, os.PathLike)):
        engine = QuotaEngine(os.fspath(source), readonly=True)
        try:
            yield engine
        finally:
            engine.close()
        return
    raise TypeError(f"expected a QuotaEngine or a database path, got {type(source).__name__}")


def _utc(ms: Any) -> Any:
    """Epoch milliseconds (a sequence or Series of ints) as ``datetime64[ns, UTC]``."""
    import pandas as pd

    values = pd.Series(ms, dtype="int64")
    return pd.to_datetime(values, unit="ms", utc=True).astype(_UTC)


def _route_label(platform: str, model_id: str, key_id: int | None) -> str:
    return f"{platform} / {model_id} / " + ("every key" if key_id is None else f"key {key_id}")


def _compact(value: float) -> str:
    """A short number for labels: 950, 14.4k, 1M, 0.333."""
    if value == 0:
        return "0"
    if abs(value) < 10 and value != int(value):
        return f"{value:.3g}"
    for size, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.0f}"


def _new_figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _no_data(title: str, what: str) -> Figure:
    fig = _new_figure(6.4, 2.4)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, f"no data: {what}", ha="center", va="center", transform=ax.transAxes, color="0.4")
    return fig


def _naive_utc(times: Any) -> Any:
    """tz-aware UTC datetimes as naive UTC ``datetime64[ns]`` for matplotlib's axis."""
    return times.dt.tz_convert(None) if hasattr(times, "dt") else times.tz_convert(None)


def _format_time_axis(ax: Any, seconds: bool = False) -> None:
    """Concise UTC dates on the x axis; with ``seconds``, ticks within a minute read HH:MM:SS."""
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    formats = ["%Y", "%b", "%d", "%H:%M", "%H:%M", "%H:%M:%S"]
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, formats=formats if seconds else None))


# ----------------------------------------------------------------------------- frames


def events_frame(
    source: Source,
    since_ms: int | None = None,
    until_ms: int | None = None,
    platform: str | None = None,
    *,
    model_id: str | None = None,
    key_id: int | None = None,
) -> pd.DataFrame:
    """Usage events as a DataFrame, oldest first.

    One row per row of ``rate_limit_usage`` with ``since_ms <= created_at_ms <
    until_ms`` (epoch milliseconds; ``None`` = unbounded), optionally for one
    ``platform`` / ``model_id`` / ``key_id``. Columns (:data:`EVENT_COLUMNS`):

    * ``time`` -- ``created_at_ms`` as ``datetime64[ns, UTC]``;
    * ``platform``, ``model_id`` (strings), ``key_id`` (int64);
    * ``kind`` -- ``"request"`` (one request; ``tokens`` is 0) or ``"tokens"``
      (``tokens`` tokens used by one call);
    * ``tokens`` (int64: the total), then ``input_tokens``, ``output_tokens`` and
      ``cached_tokens`` (nullable ``Int64``: what the call reported of its split, SPEC
      §14.4; ``<NA>`` where it did not, and for requests);
    * ``cost`` (int64: what the event cost in micro-dollars at the prices in force
      when it was recorded, SPEC 23.1; 0 unpriced);
    * ``tenants`` (object: the list of tenant names the event counted for, SPEC 23.1;
      ``[]`` when none): ``df.explode("tenants")`` gives one row per tenant;
    * ``created_at_ms`` (int64, epoch milliseconds).

    Requests per minute: ``df[df.kind == "request"].resample("1min", on="time").size()``;
    tokens per minute: ``df[df.kind == "tokens"].resample("1min", on="time").tokens.sum()``.
    """
    import pandas as pd

    with _engine(source) as e:
        rows = e.usage_events(since_ms=since_ms, until_ms=until_ms, platform=platform, model_id=model_id, key_id=key_id)
    raw = {
        "platform": pd.Series([r["platform"] for r in rows], dtype=str),
        "model_id": pd.Series([r["model_id"] for r in rows], dtype=str),
        "key_id": pd.Series([r["key_id"] for r in rows], dtype="int64"),
        "kind": pd.Series([r["kind"] for r in rows], dtype=str),
        "tokens": pd.Series([r["tokens"] for r in rows], dtype="int64"),
        **{
            k: pd.Series([r[k] for r in rows], dtype="Int64")
            for k in ("input_tokens", "output_tokens", "cached_tokens")
        },
        "cost": pd.Series([r["cost"] for r in rows], dtype="int64"),
        "tenants": pd.Series([list(r["tenants"]) for r in rows], dtype=object),
        "created_at_ms": pd.Series([r["created_at_ms"] for r in rows], dtype="int64"),
    }
    df = pd.DataFrame(raw)
    df.insert(0, "time", _utc(df["created_at_ms"]))
    return df[EVENT_COLUMNS]


def state_frame(source: Source) -> pd.DataFrame:
    """The engine's snapshot (SPEC §12) as a DataFrame.

    One row per (platform, model_id, key_id) with usage today, a live lease or an
    active cooldown, sorted by platform, model_id, key_id; the columns are exactly
    :data:`STATE_COLUMNS` (= ``QuotaSnapshot.to_pandas()``): ``*_used`` are requests
    (rpm: last 60 s, rpd: since the start of the platform's day, see ``platform_calendar``) or tokens (tpm, tpd) and ``*_limit``
    the declared limits (``<NA>`` when unlimited); ``used_fraction`` is the worst
    used/limit over the declared windows (NaN without limits); ``in_flight`` counts
    live leases; ``cooldown_source`` and ``cooldown_expires_at_ms`` (epoch ms)
    describe an active cooldown, else they are missing. Each limit beyond the classic
    four that some route declares (SPEC §14.1) adds ``<reason>_used`` and
    ``<reason>_limit`` after ``tpd_limit`` (e.g. ``requests/1s_used``; ``<NA>`` on routes
    that do not declare it).
    """
    with _engine(source) as e:
        return e.snapshot().to_pandas()


def cooldowns_frame(source: Source) -> pd.DataFrame:
    """Active cooldowns, soonest expiry first.

    Columns (:data:`COOLDOWN_COLUMNS`): ``platform``, ``model_id``, ``key_id``
    (nullable ``Int64``: ``<NA>`` for a model benched on every key, SPEC 21.1),
    ``source`` (``"heuristic"``, ``"authoritative"``, ``"credit"``, ``"tier"`` or
    ``"upstream"``, see SPEC §6 and 21.1), ``set_at`` and ``expires_at`` (``datetime64[ns, UTC]``), and
    ``remaining_s`` (float64, seconds left at the engine's clock).
    """
    import pandas as pd

    with _engine(source) as e:
        cds = e.active_cooldowns()
    df = pd.DataFrame(
        {
            "platform": pd.Series([c.platform for c in cds], dtype=str),
            "model_id": pd.Series([c.model_id for c in cds], dtype=str),
            "key_id": pd.Series([c.key_id for c in cds], dtype="Int64"),
            "source": pd.Series([c.source for c in cds], dtype=str),
            "set_at": _utc([c.set_at_ms for c in cds]),
            "expires_at": _utc([c.expires_at_ms for c in cds]),
            "remaining_s": pd.Series([c.remaining_ms / 1000 for c in cds], dtype="float64"),
        }
    )
    return df[COOLDOWN_COLUMNS]


def spend(source: Source, *, by: str = "tenant", freq: str = "1D", since_ms: int | None = None) -> pd.DataFrame:
    """Dollars spent per period (SPEC 23.4), from ``usage_events()``.

    One row per period of ``freq`` (a pandas offset alias: ``"1D"``, ``"1h"``, ``"W"``,
    ``"MS"``...; UTC), from the period of the first event to the period of the last,
    periods without spending included; the index is the period's start
    (``datetime64[ns, UTC]``, named ``"period"``). One column per (``columns.name`` is
    ``by``):

    * ``"tenant"`` -- each tenant named by an event (an event naming several counts for
      each, so the columns may add up to more than was spent); events naming none go to
      the column ``"(none)"`` (:data:`NO_TENANT`);
    * ``"route"`` -- ``"platform/model/key"``;
    * ``"platform"``;
    * ``"model"`` -- ``"platform/model"``.

    Columns are sorted by name. A value is dollars (float64): the events' ``cost`` (integer
    micro-dollars, SPEC 23.1) summed exactly, then divided by 10^6. Events that cost
    nothing (unpriced models) still name their column, at 0.0. ``since_ms`` (epoch ms)
    leaves out older events; by default every event still in the store (the retention).
    ``by`` outside :data:`SPEND_BY` is a ``ValueError``.
    """
    import pandas as pd

    if by not in SPEND_BY:
        raise ValueError(f"by must be one of {', '.join(repr(b) for b in SPEND_BY)}, got {by!r}")
    with _engine(source) as e:
        rows = e.usage_events(since_ms=since_ms)
    times: list[int] = []
    labels: list[str] = []
    costs: list[int] = []
    for r in rows:
        if by == "tenant":
            names = list(dict.fromkeys(r["tenants"])) or [NO_TENANT]
        elif by == "route":
            names = [f"{r['platform']}/{r['model_id']}/{r['key_id']}"]
        elif by == "platform":
            names = [r["platform"]]
        else:
            names = [f"{r['platform']}/{r['model_id']}"]
        for name in names:
            times.append(r["created_at_ms"])
            labels.append(name)
            costs.append(r["cost"])
    events = pd.DataFrame(
        {
            "time": _utc(times),
            by: pd.Series(labels, dtype=str),
            "cost": pd.Series(costs, dtype="int64"),
        }
    )
    if events.empty:
        empty = pd.DataFrame(index=pd.DatetimeIndex([], dtype=_UTC, name="period"), columns=pd.Index([], dtype=str))
        empty.columns.name = by
        return empty
    micro = events.groupby(["time", by])["cost"].sum().unstack(by, fill_value=0)
    # Integer micro-dollars per period, empty periods 0; each period labelled by its start.
    micro = micro.resample(freq, closed="left", label="left").sum()
    out = micro.reindex(columns=sorted(micro.columns)).astype("int64") / 1_000_000
    out.index.name = "period"
    out.columns.name = by
    return out


# ----------------------------------------------------------------------------- plots


_CLASSIC = {
    ("requests", "minute"): "rpm",
    ("requests", "day"): "rpd",
    ("tokens", "minute"): "tpm",
    ("tokens", "day"): "tpd",
}


def _reason(limit: Any, declared: list[Any]) -> str:
    """A declared limit's name as ``usage()`` and the gates call it (SPEC §14.1)."""
    per = {"60s": "minute", "1m": "minute"}.get(limit.per, limit.per)
    classic = _CLASSIC.get((limit.metric, per))
    if classic is not None and limit.scope == "account":
        return classic
    name = f"{limit.metric}/{limit.per}"
    twin = any(o.metric == limit.metric and o.per == limit.per and o.scope == "account" for o in declared)
    return name + (":key" if limit.scope == "key" and twin else "")


def _limit_lines(e: _QuotaEngine, platform: str, models: list[str]) -> list[tuple[str, bool, int]]:
    """Every limit a provider's plot draws (SPEC 22.2): each declared limit of the
    models it used, and its provider caps, as (label, is a token limit, value)."""
    lines: list[tuple[str, bool, int]] = []
    for model_id in models:
        declared = e.model_limit_list(platform, model_id)
        for limit in declared:
            label = f"{platform}/{model_id} {_reason(limit, declared)} {_compact(limit.limit)}"
            lines.append((label, limit.metric != "requests", limit.limit))
    caps = e.provider_caps(platform)
    for name, value, tokens in (
        ("provider_daily_requests", caps.daily_requests, False),
        ("provider_minute_requests", caps.minute_requests, False),
        ("provider_daily_tokens", caps.daily_tokens, True),
    ):
        if value is not None:
            lines.append((f"{platform} {name} {_compact(value)}", tokens, value))
    return lines


#: The kinds of :func:`plot_usage`.
USAGE_KINDS = ("fill", "rate")
#: Calendar periods of a limit's ``per`` (SPEC 14.1); every other ``per`` is a sliding width.
_CALENDAR = ("day", "week", "month")
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
#: One sequential colour map per platform, in the platforms' sorted order (then again).
_PLATFORM_MAPS = ("Blues", "Greens", "Oranges", "Purples", "Reds", "YlOrBr", "PuRd", "BuGn", "Greys")
#: Line styles of the windows, in the order they are first met.
_WINDOW_STYLES: tuple[Any, ...] = (
    "-",
    (0, (6, 3)),
    (0, (1, 2)),
    (0, (6, 2, 1, 2)),
    (0, (6, 2, 1, 2, 1, 2)),
    (0, (14, 4)),
    (0, (3, 1, 1, 1, 1, 1, 1, 4)),
)


def _window(per: str) -> int | str:
    """A ``per``'s width in ms (sliding) or its calendar period (``"day"``, ``"week"``, ``"month"``)."""
    if per in _CALENDAR:
        return per
    if per == "minute":
        return 60_000
    return int(per[:-1]) * _UNIT_MS[per[-1]]


def _period_start(ms: int, tz: str, per: str) -> int:
    """The start (epoch ms) of the calendar ``per`` holding ``ms`` in zone ``tz`` (SPEC 14.2)."""
    from datetime import datetime, timedelta
    from zoneinfo import ZoneInfo

    local = datetime.fromtimestamp(ms / 1000, ZoneInfo(tz))
    start = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if per == "week":
        start = (start - timedelta(days=start.weekday())).replace(tzinfo=None).replace(tzinfo=ZoneInfo(tz))
    elif per == "month":
        start = start.replace(day=1)
    # Rebuild from the wall clock so that a DST change between the two days is honoured.
    start = datetime(start.year, start.month, start.day, tzinfo=ZoneInfo(tz))
    return int(start.timestamp() * 1000)


def _period_starts(lo: int, hi: int, tz: str, per: str) -> list[int]:
    """Every start of a calendar ``per`` in ``(lo, hi]``."""
    from datetime import datetime, timedelta
    from zoneinfo import ZoneInfo

    out: list[int] = []
    start = _period_start(lo, tz, per)
    while True:
        local = datetime.fromtimestamp(start / 1000, ZoneInfo(tz))
        if per == "month":
            nxt = datetime(local.year + local.month // 12, local.month % 12 + 1, 1, tzinfo=ZoneInfo(tz))
        else:
            day = local.date() + timedelta(days=7 if per == "week" else 1)
            nxt = datetime(day.year, day.month, day.day, tzinfo=ZoneInfo(tz))
        start = int(nxt.timestamp() * 1000)
        if start > hi:
            return out
        out.append(start)


class _Events:
    """One stream of weighted events, sorted by time, with its running sums."""

    def __init__(self, times: list[int], weights: list[int]) -> None:
        import numpy as np

        order = np.argsort(np.asarray(times, dtype=np.int64), kind="stable")
        self.times = np.asarray(times, dtype=np.int64)[order]
        self.cum = np.concatenate([[0.0], np.cumsum(np.asarray(weights, dtype=float)[order])])

    def through(self, x: Any) -> Any:
        """The weight of the events with ``t <= x`` (``x`` an array of ms)."""
        import numpy as np

        return self.cum[np.searchsorted(self.times, x, side="right")]

    def before(self, x: Any) -> Any:
        """The weight of the events with ``t < x``."""
        import numpy as np

        return self.cum[np.searchsorted(self.times, x, side="left")]

    def used(self, x: Any, per: str, tz: str) -> Any:
        """The usage a window ``per`` counted at each moment of ``x`` (SPEC 14.1)."""
        import numpy as np

        window = _window(per)
        if isinstance(window, int):  # sliding: t > x - width
            return self.through(x) - self.through(x - window)
        x = np.asarray(x, dtype=np.int64)
        if len(x) == 0:
            return self.through(x)
        lo, hi = int(x.min()), int(x.max())
        bounds = np.array([_period_start(lo, tz, window), *_period_starts(lo, hi, tz, window)], dtype=np.int64)
        starts = bounds[np.searchsorted(bounds, x, side="right") - 1]  # the period holding each moment
        return self.through(x) - self.before(starts)  # calendar: t >= the period's start

    def breakpoints(self, per: str, tz: str, lo: int, hi: int) -> list[Any]:
        """The moments in ``[lo, hi]`` where the window's usage can change."""
        import numpy as np

        window = _window(per)
        moved = self.times + window if isinstance(window, int) else np.array(_period_starts(lo, hi, tz, window))
        return [self.times, moved.astype(np.int64)]


def _weight(metric: str, row: dict[str, Any]) -> int:
    """What one usage event counts in a window of ``metric`` (SPEC 14.1, 14.4, 23.1)."""
    if metric == "requests":
        return 1 if row["kind"] == "request" else 0
    if row["kind"] != "tokens" and metric != "cost":
        return 0
    if metric == "tokens":
        return int(row["tokens"])
    if metric == "input_tokens":
        return max(0, (row["input_tokens"] or 0) - (row["cached_tokens"] or 0))
    if metric == "output_tokens":
        return int(row["output_tokens"] or 0)
    return int(row["cost"])  # cost, micro-dollars


class _FillLine:
    """One line of the fill plot: who (``group``, ``name``), which window, and its events."""

    def __init__(
        self, group: str, name: str, window: str, per: str, limit: int, tz: str, streams: list[_Events]
    ) -> None:
        self.group, self.name, self.window, self.per = group, name, window, per
        self.limit, self.tz, self.streams = limit, tz, streams


def _matcher(
    platform: str | None,
    *,
    model_id: str | None = None,
    key_id: Any = None,
    account: str | None = None,
    accounts: dict[tuple[str, int], str] | None = None,
    tenant: str | None = None,
) -> Callable[[dict[str, Any]], bool]:
    """Whether a usage event counts for a line: its platform, model, key, the key's account
    (``accounts``: (platform, key) -> account), or a tenant it names."""

    def keep(r: dict[str, Any]) -> bool:
        if tenant is not None:
            return tenant in r["tenants"]
        if r["platform"] != platform or (model_id is not None and r["model_id"] != model_id):
            return False
        if account is not None and accounts is not None:
            return accounts.get((r["platform"], r["key_id"])) == account
        return key_id is None or r["key_id"] == key_id

    return keep


def _fill_lines(e: _QuotaEngine, rows: list[dict[str, Any]], platform: str | None) -> list[_FillLine]:
    """Every declared limit with usage to show: the routes' model limits, the platforms'
    caps and limits (SPEC 8, 23.3) and, without ``platform``, the tenants' (23.2)."""
    lines: list[_FillLine] = []
    mine = [r for r in rows if platform is None or r["platform"] == platform]
    routes = sorted({(r["platform"], r["model_id"], r["key_id"]) for r in mine})
    accounts = {(p, k): e.key_account(p, k) for p, _m, k in routes}
    zones = {p: e.platform_calendar(p) for p, _m, _k in routes}

    def stream(metric: str, keep: Callable[[dict[str, Any]], bool]) -> _Events:
        picked = [r for r in rows if keep(r)]
        return _Events([r["created_at_ms"] for r in picked], [_weight(metric, r) for r in picked])

    declared: dict[tuple[str, str], list[Any]] = {}
    for p, m, k in routes:
        limits = declared.setdefault((p, m), e.model_limit_list(p, m))
        for limit in limits:
            if limit.scope == "key":
                keep = _matcher(p, model_id=m, key_id=k)
            else:
                keep = _matcher(p, model_id=m, account=accounts[(p, k)], accounts=accounts)
            lines.append(
                _FillLine(
                    p,
                    f"{m} / key {k}",
                    _reason(limit, limits),
                    limit.per,
                    limit.limit,
                    zones[p],
                    [stream(limit.metric, keep)],
                )
            )
    for p in sorted({r[0] for r in routes}):
        caps = e.provider_caps(p)
        platform_limits: list[tuple[str, str, str, int, str]] = [
            (name, metric, per, value, "account")
            for name, metric, per, value in (
                ("provider_daily_requests", "requests", "day", caps.daily_requests),
                ("provider_minute_requests", "requests", "minute", caps.minute_requests),
                ("provider_daily_tokens", "tokens", "day", caps.daily_tokens),
            )
            if value is not None
        ]
        for limit in e.platform_limits(p):
            name = f"platform:{limit.metric}/{limit.per}" + (":key" if limit.scope == "key" else "")
            platform_limits.append((name, limit.metric, limit.per, limit.limit, limit.scope))
        for name, metric, per, value, scope in platform_limits:
            # One line per platform and window: the fullest of its accounts (or keys) at each moment.
            units = sorted({k if scope == "key" else accounts[(p, k)] for pp, _m, k in routes if pp == p}, key=str)
            streams = [
                stream(
                    metric,
                    _matcher(p, key_id=u) if scope == "key" else _matcher(p, account=u, accounts=accounts),
                )
                for u in units
            ]
            who = "every key" if len(units) == 1 else "fullest account"
            lines.append(_FillLine(p, who, name, per, value, zones[p], streams))
    if platform is None:
        named = sorted({t for r in rows for t in r["tenants"]})
        for t in named:
            limits = e.tenant_limits(t)
            zone = (e._tenant_zone(t) if limits else None) or "UTC"  # where its days start (SPEC 23.2's tz)
            for limit in limits:
                window = f"{limit.metric}/{limit.per}"
                streams = [stream(limit.metric, _matcher(None, tenant=t))]
                lines.append(_FillLine("tenants", t, window, limit.per, limit.limit, zone, streams))
    return lines


def _shades(n: int, cmap: str) -> list[Any]:
    """``n`` distinct shades of a sequential colour map, darkest first, none too pale."""
    from matplotlib import colormaps

    cm = colormaps[cmap]
    return [cm(0.9 - 0.45 * i / max(1, n - 1)) for i in range(n)]


def _grouped_legend(ax: Any, sections: list[tuple[str, list[tuple[Any, str]]]]) -> None:
    """A legend outside the plot, on the right: a bold title per section, then its entries;
    in as many columns as keep each under ~32 entries (30 routes stay readable)."""
    from matplotlib.lines import Line2D

    handles: list[Any] = []
    labels: list[str] = []
    for title, entries in sections:
        if not entries:
            continue
        handles.append(Line2D([], [], linestyle="none"))
        labels.append(title)
        for handle, label in entries:
            handles.append(handle)
            labels.append(label)
    ncol = max(1, -(-len(handles) // 32))
    legend = ax.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        fontsize="small",
        frameon=False,
        ncol=ncol,
        handlelength=3.5,
    )
    titles = {t for t, entries in sections if entries}
    for text in legend.get_texts():
        if text.get_text() in titles:
            text.set_fontweight("bold")


def plot_usage(
    source: Source,
    freq: str = "1min",
    platform: str | None = None,
    since_ms: int | None = None,
    *,
    kind: str = "fill",
) -> Any:
    """How full each declared limit is over time (SPEC 27.4), or the usage per bin.

    ``kind="fill"`` (the default): for every declared window, the usage it counted at each
    moment -- a sliding window over its own width (``rpm``: the last 60 s), a calendar
    window since its period's start in the platform's zone (SPEC 14.2) -- divided by its
    limit, as a percentage. One line per (route, window) for a model's limits (scope
    ``"account"`` counting every key of the key's account), per (platform, window) for its
    provider caps and platform limits (23.3; the fullest of its accounts at each moment),
    and per (tenant, window) for the tenants' limits (23.2; calendar periods in the zone the
    tenant's declaration gives, ``set_tenant_limits(..., tz=)``, UTC without one; left
    out with ``platform``). Lines are steps that change only where the usage does (an
    event, an event leaving a sliding window, a period starting); they run from the first
    event (or ``since_ms``) to the engine's now. 100% is drawn as the ceiling; each stored
    cooldown of a route is shaded in the route's colour. Colours group the routes by
    platform (one colour family each; platform lines are thicker), line styles tell the
    windows apart, and the legend sits outside the plot, one section per platform.
    ``freq`` is not used: the fill has no bins, so a per-minute limit is never drawn
    against per-second bins. Line labels are ``"<platform>/<model> / key <k> <reason>"``,
    ``"<platform> / <every key|fullest account> <reason>"`` and
    ``"tenant <name> <metric>/<per>"``; ``ydata`` in percent, ``xdata`` naive UTC
    datetimes.

    ``kind="rate"``: requests and tokens per ``freq`` bin (a fixed pandas offset, "30s",
    "1min", "1h"...), one line per platform, each declared limit and provider cap a dashed
    line at its value (SPEC 22.2); two Axes rows, requests then tokens.

    ``since_ms`` (epoch ms) and ``platform`` narrow what is drawn; by default every event
    still in the database (the retention). Returns the matplotlib ``Axes`` (for
    ``kind="rate"``, the requests Axes; ``ax.figure`` is the Figure). With nothing to
    draw, an Axes with a single "no data" text. Any other ``kind`` is a ``ValueError``.
    """
    if kind not in USAGE_KINDS:
        raise ValueError(f"kind must be one of {', '.join(repr(k) for k in USAGE_KINDS)}, got {kind!r}")
    if kind == "rate":
        return _plot_rate(source, freq, platform, since_ms)
    return _plot_fill(source, platform, since_ms)


def _plot_fill(source: Source, platform: str | None, since_ms: int | None) -> Any:
    import matplotlib.dates as mdates
    import numpy as np
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    title = "how full each limit is" + (f": {platform}" if platform else "")
    with _engine(source) as e:
        now = e.now_ms()
        rows = e.usage_events()  # older events too: they count in the windows at since_ms
        lines = _fill_lines(e, rows, platform)
        cooldowns = [c for c in e.stored_cooldowns() if platform is None or c.platform == platform]
    shown = [r["created_at_ms"] for r in rows if platform is None or r["platform"] == platform]
    if since_ms is not None:
        shown = [t for t in shown if t >= since_ms]
    if not shown:
        return _no_data(title, "no usage events" + (f" for {platform}" if platform else "")).axes[0]
    if not lines:
        return _no_data(title, "no declared limit has usage (kind='rate' draws the usage itself)").axes[0]
    lo = min(shown) if since_ms is None else since_ms
    hi = max(now, max(shown))

    fig = _new_figure(12, 6.5)
    ax = fig.add_subplot()
    groups = list(dict.fromkeys(line.group for line in lines))
    platforms = [g for g in groups if g != "tenants"]
    maps = {p: _PLATFORM_MAPS[i % len(_PLATFORM_MAPS)] for i, p in enumerate(platforms)}
    maps["tenants"] = "Greys"
    colours: dict[tuple[str, str], Any] = {}
    for g in groups:
        names = list(dict.fromkeys(line.name for line in lines if line.group == g))
        colours.update({(g, n): c for n, c in zip(names, _shades(len(names), maps[g]), strict=True)})
    styles: dict[str, Any] = {}
    top = 100.0
    for line in lines:
        points = [np.array([lo, hi], dtype=np.int64)]
        points += [b for s in line.streams for b in s.breakpoints(line.per, line.tz, lo, hi)]
        x = np.unique(np.concatenate(points))
        x = x[(x >= lo) & (x <= hi)]
        used = np.max([s.used(x, line.per, line.tz) for s in line.streams], axis=0)
        y = 100.0 * used / line.limit if line.limit > 0 else np.full(len(x), 100.0)
        top = max(top, float(y.max()))
        style = styles.setdefault(line.window, _WINDOW_STYLES[len(styles) % len(_WINDOW_STYLES)])
        label = (
            f"tenant {line.name} {line.window}"
            if line.group == "tenants"
            else f"{line.group}/{line.name} {line.window}"
            if line.name.count("/ key")
            else f"{line.group} / {line.name} {line.window}"
        )
        ax.plot(
            _np_datetimes(x),
            y,
            drawstyle="steps-post",
            color=colours[(line.group, line.name)],
            linestyle=style,
            linewidth=1.4 if line.name.count("/ key") or line.group == "tenants" else 2.4,
            label=label,
        )
    ax.axhline(100, color="black", linewidth=1.2, zorder=1)
    ax.annotate(
        "limit (100%)", (0, 100), xycoords=("axes fraction", "data"), xytext=(3, 2),
        textcoords="offset points", fontsize="x-small", va="bottom",
    )  # fmt: skip

    benched: list[tuple[Any, str]] = []
    for c in cooldowns:
        if c.expires_at_ms <= lo or c.set_at_ms >= hi:
            continue
        names = [n for (g, n) in colours if g == c.platform and n.startswith(f"{c.model_id} / key ")]
        names = [n for n in names if c.key_id is None or n == f"{c.model_id} / key {c.key_id}"]
        colour = colours[(c.platform, names[0])] if names else "0.5"
        ax.axvspan(
            mdates.date2num(_np_datetime(max(c.set_at_ms, lo))),
            mdates.date2num(_np_datetime(min(c.expires_at_ms, hi))),
            color=colour, alpha=0.15, linewidth=0, zorder=0,
            label=f"cooldown {c.platform}/{c.model_id} / " + ("every key" if c.key_id is None else f"key {c.key_id}"),
        )  # fmt: skip
        benched.append((colour, str(c.source)))

    sections: list[tuple[str, list[tuple[Any, str]]]] = []
    for g in groups:
        entries = []
        for (gg, n), colour in colours.items():
            if gg == g:
                thin = n.count("/ key") or g == "tenants"
                entries.append((Line2D([], [], color=colour, linewidth=1.4 if thin else 2.4), n))
        sections.append(("tenants" if g == "tenants" else f"platform {g}", entries))
    sections.append(("windows", [(Line2D([], [], color="0.3", linestyle=s), w) for w, s in styles.items()]))
    if benched:
        sources = sorted({s for _c, s in benched})
        shade = benched[0][0] if len({str(c) for c, _s in benched}) == 1 else "0.5"
        sections.append(("shaded", [(Patch(color=shade, alpha=0.25), "cooldown (" + ", ".join(sources) + ")")]))
    _grouped_legend(ax, sections)

    ax.set_ylim(0, max(105.0, top * 1.05))
    ax.set_xlim(_np_datetime(lo), _np_datetime(hi))
    ax.set_ylabel("used in the window ÷ its limit (%)")
    ax.set_xlabel("time (UTC)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    _format_time_axis(ax, seconds=True)
    return ax


def plot_spend(source: Source, by: str = "tenant", freq: str = "1D", since_ms: int | None = None) -> Any:
    """Dollars spent per period as stacked bars (SPEC 27.4, 23.4).

    One bar per period of ``freq`` (UTC), stacked from :func:`spend` with the same ``by``
    (``"tenant"``, ``"route"``, ``"platform"``, ``"model"``), ``freq`` and ``since_ms``:
    one colour per column (routes and models grouped by platform, one colour family each),
    drawn in the columns' order, bottom first. The bars of a column are one
    ``BarContainer`` of ``ax.containers`` whose heights are that column of ``spend()``.
    The legend sits outside the plot, top of the stack first. Returns the ``Axes``; with
    nothing spent, an Axes with a single "no data" text. A bad ``by`` is a ``ValueError``.
    """
    import matplotlib.dates as mdates
    import numpy as np
    import pandas as pd

    df = spend(source, by=by, freq=freq, since_ms=since_ms)
    title = f"spend per {by} ({freq} periods, UTC)"
    if df.empty:
        return _no_data(title, "no usage events").axes[0]
    starts = df.index
    ends = starts + pd.tseries.frequencies.to_offset(freq)
    left = mdates.date2num(_naive_utc(starts).to_numpy())
    width = (mdates.date2num(_naive_utc(ends).to_numpy()) - left) * 0.85

    columns = list(df.columns)
    if by in ("route", "model"):
        groups: dict[str, list[str]] = {}
        for c in columns:
            groups.setdefault(c.split("/")[0], []).append(c)
        colours = {}
        for i, (_p, cs) in enumerate(groups.items()):
            colours.update(dict(zip(cs, _shades(len(cs), _PLATFORM_MAPS[i % len(_PLATFORM_MAPS)]), strict=True)))
    else:
        from matplotlib import colormaps

        cmap = colormaps["tab20" if len(columns) > 10 else "tab10"]
        colours = {c: cmap(i % cmap.N) for i, c in enumerate(columns)}

    fig = _new_figure(10, 5)
    ax = fig.add_subplot()
    bottom = np.zeros(len(df))
    for c in columns:
        values = df[c].to_numpy(dtype=float)
        ax.bar(left, values, width=width, bottom=bottom, align="edge", color=colours[c], label=c,
               edgecolor="white", linewidth=0.4)  # fmt: skip
        bottom = bottom + values
    ax.xaxis_date()
    _format_time_axis(ax, seconds=True)
    ax.set_xlim(left[0] - 0.1 * width[0], left[-1] + width[-1] / 0.85)
    top = float(bottom.max())
    decimals = 2 if top >= 0.1 or top <= 0 else 1 - int(np.floor(np.log10(top)))
    ax.yaxis.set_major_formatter(f"${{x:,.{decimals}f}}")
    ax.set_ylabel(f"dollars spent per {freq} period (USD)")
    ax.set_xlabel("period start (UTC)")
    ax.set_title(title + (", stacked" if len(columns) > 1 else ""))
    ax.grid(True, axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(
        handles[::-1], labels[::-1], title=by, loc="upper left", bbox_to_anchor=(1.01, 1),
        fontsize="small", frameon=False, ncol=max(1, -(-len(columns) // 24)),
    )  # fmt: skip
    return ax


def _np_datetimes(ms: Any) -> Any:
    import numpy as np

    return np.asarray(ms, dtype=np.int64).astype("datetime64[ms]")


def _plot_rate(source: Source, freq: str, platform: str | None, since_ms: int | None) -> Any:
    """``plot_usage(kind="rate")``: requests and tokens per bin, against their declared limits.

    Two axes rows sharing the time axis (UTC): requests per ``freq`` bin and tokens
    per ``freq`` bin, one solid line per provider (platform), summed over its models
    and keys. ``freq`` is a fixed pandas offset ("30s", "1min", "5min", "1h", ...);
    bins without events count 0. ``since_ms`` (epoch ms) and ``platform`` filter the
    events; by default every event still in the database (the retention, a day by
    default).

    Reference lines (SPEC 22.2; dashed, the provider's colour): each declared limit
    of every model the provider used, and each of its provider caps, as its own line
    at its value, labelled ``"<platform>/<model> <reason> <limit>"`` (``"<platform>
    <cap> <value>"`` for a cap): request limits on the requests axes, token limits
    on the tokens axes. A sliding window's limit is NOT divided into the bins: an
    ``rpm=30`` window allows a burst of 30 inside any 10 s bin. The y axes are linear
    up to 10 and logarithmic above (a day's limit and a bin's usage both show). Returns the
    requests Axes; ``ax.figure.axes`` is ``[requests, tokens]``.
    """
    import numpy as np
    import pandas as pd

    with _engine(source) as e:
        df = events_frame(e, since_ms=since_ms, platform=platform)
        if df.empty:
            return _no_data("usage over time", "no usage events" + (f" for {platform}" if platform else "")).axes[0]
        models: dict[str, list[str]] = {}
        for p, m in (
            df[["platform", "model_id"]].drop_duplicates().sort_values(["platform", "model_id"]).itertuples(index=False)
        ):
            models.setdefault(p, []).append(m)
        limits = {p: _limit_lines(e, p, ms) for p, ms in models.items()}

    df["bin"] = df["time"].dt.floor(freq)
    index = pd.date_range(df["bin"].min(), df["bin"].max(), freq=freq, name="bin")
    platforms = sorted(models)
    requests = (
        df[df["kind"] == "request"]
        .groupby(["bin", "platform"])
        .size()
        .unstack("platform")
        .reindex(index=index, columns=platforms)
        .fillna(0)
    )
    tokens = (
        df[df["kind"] == "tokens"]
        .groupby(["bin", "platform"])["tokens"]
        .sum()
        .unstack("platform")
        .reindex(index=index, columns=platforms)
        .fillna(0)
    )

    from matplotlib import colormaps

    colors = colormaps["tab10"]
    fig = _new_figure(10, 6)
    ax_req, ax_tok = fig.subplots(2, 1, sharex=True)
    # One more point at the end of the last bin, so that every bin is a full step.
    x = _naive_utc(index.append(pd.DatetimeIndex([index[-1] + index.freq])))
    unit = freq if freq[0].isdigit() else f"1{freq}"
    for i, p in enumerate(platforms):
        color = colors(i % 10)
        for ax, data in ((ax_req, requests), (ax_tok, tokens)):
            y = data[p].to_numpy()
            ax.plot(x, np.append(y, y[-1]), color=color, label=p, drawstyle="steps-post")
        styles = ["--", ":", "-.", (0, (5, 1, 1, 1))]
        for j, (label, is_tokens, value) in enumerate(limits[p]):
            ax = ax_tok if is_tokens else ax_req
            ax.axhline(value, color=color, linestyle=styles[j % len(styles)], linewidth=1, label=label)
    ax_req.set_ylabel(f"requests per {unit}")
    ax_tok.set_ylabel(f"tokens per {unit}")
    for ax in (ax_req, ax_tok):
        # Each panel reads alone (SPEC 27.4: the returned Axes labels its axes too): its
        # own time ticks and label, though the two share their x axis.
        ax.set_xlabel("time (UTC)")
        ax.tick_params(axis="x", labelbottom=True)
    title = "usage over time" + (f": {platform}" if platform else " per provider")
    ax_req.set_title(f"{title} (dashed: each declared limit at its value)")
    for ax in (ax_req, ax_tok):
        # Linear up to 10, logarithmic above: a day's limit and a bin's few requests both show.
        ax.set_yscale("symlog", linthresh=10)
        ax.set_ylim(bottom=0)
        ax.set_xlim(x[0], x[-1])
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", frameon=False)
    _format_time_axis(ax_tok)
    return ax_req


def _fraction(used: Any, limit: Any) -> float:
    import math

    if limit is None or (isinstance(limit, float) and math.isnan(limit)):
        return math.nan
    try:
        import pandas as pd

        if pd.isna(limit):
            return math.nan
    except (TypeError, ValueError):
        pass
    limit = int(limit)
    if limit <= 0:
        return 1.0  # a declared limit of 0 counts as fully used (SPEC §9)
    return int(used) / limit


def plot_utilisation(source: Source) -> Figure:
    """Heat map of used/limit: one row per route of the snapshot, one column per window.

    Rows are the snapshot's routes (platform / model / key, sorted); columns are
    ``rpm``, ``rpd``, ``tpm`` and ``tpd`` (:data:`WINDOWS`), then one per other limit some
    route declares (SPEC §14.1, named by its reason, e.g. ``requests/1s``; NaN on
    routes that do not declare it). A cell is the window's
    used/limit (a fraction; 1.0 = the limit is reached; a declared limit of 0 counts
    as 1.0) and NaN, drawn grey, where the window has no limit. Each cell is
    annotated with ``used/limit`` (``used/∞`` without a limit; 14.4k = 14 400,
    1M = 1 000 000). The colour scale runs from 0 to 1 (values
    over 1 show as 1); a colorbar is attached. The image is ``fig.axes[0].images[0]``;
    its data has shape (routes, 4 + declared limits).
    """
    import numpy as np

    with _engine(source) as e:
        snap = e.snapshot()
    rows = sorted(snap.rows, key=lambda r: (r["platform"], r["model_id"], r["key_id"]))
    if not rows:
        return _no_data("window utilisation", "no route has usage today, a lease or a cooldown")
    windows = WINDOWS + snap.declared
    data = np.array([[_fraction(r[f"{w}_used"], r[f"{w}_limit"]) for w in windows] for r in rows], dtype=float)

    from matplotlib import colormaps

    cmap = colormaps["YlOrRd"].with_extremes(bad="#d9d9d9", over=colormaps["YlOrRd"](1.0))
    fig = _new_figure(max(7.5, 1.9 * len(windows)), 1.2 + 0.42 * len(rows))
    ax = fig.add_subplot()
    image = ax.imshow(data, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")  # NaN: the "bad" colour
    ax.set_xticks(range(len(windows)), [w.upper() if w in WINDOWS else w for w in windows])
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(rows)), [_route_label(r["platform"], r["model_id"], r["key_id"]) for r in rows])
    for i, r in enumerate(rows):
        for j, w in enumerate(windows):
            used, limit = r[f"{w}_used"], r[f"{w}_limit"]
            if used is None:  # a limit this route does not declare
                continue
            text = f"{_compact(used)}/" + ("∞" if limit is None else _compact(limit))
            dark = not np.isnan(data[i, j]) and data[i, j] >= 0.6
            ax.text(j, i, text, ha="center", va="center", fontsize="x-small", color="white" if dark else "black")
    ax.set_title(f"window utilisation (used / limit) at {_when(snap.taken_at_ms)}", fontsize="medium")
    fig.colorbar(image, ax=ax, label="used / limit", fraction=0.05, pad=0.02)
    return fig


def _when(ms: int) -> str:
    from ._snapshot import _fmt_time

    return _fmt_time(ms)


def plot_cooldowns(source: Source, since_ms: int | None = None) -> Figure:
    """Cooldown timelines: one row per route, a bar from ``set_at`` to ``expires_at``.

    Shows every cooldown the database still holds -- the active ones and expired
    ones the engine has not cleaned up yet (the table keeps one cooldown per route,
    the latest) -- that ends at or after ``since_ms`` (epoch ms; ``None`` = all).
    Bars are coloured by source (:data:`SOURCE_COLORS`, legend), expired ones are
    paler, and a vertical line marks the engine's now. The time axis is UTC. Returns
    the Figure; the bars are ``fig.axes[0].patches`` (one per cooldown).
    """
    with _engine(source) as e:
        now = e.now_ms()
        rows = [
            (c.platform, c.model_id, c.key_id, str(c.source), c.set_at_ms, c.expires_at_ms)
            for c in e.stored_cooldowns()
        ]
    if since_ms is not None:
        rows = [r for r in rows if r[5] >= since_ms]
    if not rows:
        return _no_data("cooldowns", "no cooldowns" + ("" if since_ms is None else " since then"))
    rows.sort(key=lambda r: (r[0], r[1], -1 if r[2] is None else r[2]))  # None: every key (SPEC 21.1)

    import matplotlib.dates as mdates
    from matplotlib.patches import Patch

    def num(ms: int) -> float:
        return mdates.date2num(_np_datetime(ms))

    fig = _new_figure(10, 1.4 + 0.38 * len(rows))
    ax = fig.add_subplot()
    for i, (_p, _m, _k, src, set_at, expires_at) in enumerate(rows):
        start, end = num(set_at), num(expires_at)
        expired = expires_at <= now
        ax.barh(
            i,
            end - start,
            left=start,
            height=0.6,
            color=SOURCE_COLORS.get(src, "0.5"),
            alpha=0.4 if expired else 0.9,
            edgecolor="black",
            linewidth=0.5,
        )
        left = "expired" if expired else f"{(expires_at - now) / 1000:,.0f} s left"
        ax.annotate(f" {src}, {left}", (end, i), va="center", fontsize="x-small")
    ax.axvline(num(now), color="black", linestyle=":", linewidth=1, label="now", zorder=3)
    lo = min(num(min(r[4] for r in rows)), num(now))
    hi = max(num(max(r[5] for r in rows)), num(now))
    span = max(hi - lo, 1 / 86_400)  # at least a second wide (units: days)
    ax.set_xlim(lo - 0.02 * span, hi + 0.3 * span)  # room on the right for the labels
    ax.set_yticks(range(len(rows)), [_route_label(r[0], r[1], r[2]) for r in rows])
    ax.invert_yaxis()
    ax.xaxis_date()
    _format_time_axis(ax)
    ax.set_xlabel("time (UTC)")
    ax.set_title("cooldowns (bar: set at -> expires at)", fontsize="medium")
    handles: list[Any] = [Patch(color=c, label=s) for s, c in SOURCE_COLORS.items() if any(r[3] == s for r in rows)]
    handles.append(ax.get_lines()[0])
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def _np_datetime(ms: int) -> Any:
    import numpy as np

    return np.datetime64(int(ms), "ms")
