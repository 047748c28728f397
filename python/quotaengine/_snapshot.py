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
]


def _fmt_time(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _fmt_left(ms: int) -> str:
    s = max(0, ms) // 1000
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class QuotaSnapshot:
    """One row per (platform, model_id, key_id) with usage today, a live lease or an
    active cooldown, sorted by platform, model_id, key_id."""

    def __init__(self, rows: list[dict[str, Any]], taken_at_ms: int, path: str) -> None:
        self.rows = rows
        self.taken_at_ms = taken_at_ms
        self.path = path

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]

    def to_pandas(self) -> Any:
        """The rows as a pandas DataFrame with the SPEC §12 columns (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=COLUMNS)

    def _cells(self, row: dict[str, Any]) -> list[str]:
        def win(name: str) -> str:
            used, limit = row[f"{name}_used"], row[f"{name}_limit"]
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
            "-" if frac is None else f"{frac:.0%}",
            str(row["in_flight"]),
            cd,
        ]

    _HEAD = ["platform", "model", "key", "RPM", "RPD", "TPM", "TPD", "used", "in flight", "cooldown"]

    def __str__(self) -> str:
        head = f"quota snapshot of {self.path} at {_fmt_time(self.taken_at_ms)}: {len(self.rows)} routes"
        table = [self._HEAD] + [self._cells(r) for r in self.rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(self._HEAD))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
        return "\n".join([head, *lines])

    def __repr__(self) -> str:
        return f"<QuotaSnapshot of {self.path!r}: {len(self.rows)} routes at {self.taken_at_ms}>"

    def _repr_html_(self) -> str:
        def bar(frac: float | None) -> str:
            if frac is None:
                return ""
            pct = max(0.0, min(1.0, frac)) * 100
            color = "#2e7d32" if pct < 70 else "#f9a825" if pct < 90 else "#c62828"
            return (
                f'<div style="width:60px;height:6px;background:#eee;display:inline-block">'
                f'<div style="width:{pct:.0f}%;height:6px;background:{color}"></div></div>'
            )

        out = [
            "<div>",
            f"<p><b>quotaengine</b> snapshot of <code>{html.escape(self.path)}</code> "
            f"at {_fmt_time(self.taken_at_ms)} &middot; {len(self.rows)} routes</p>",
            '<table class="quotaengine-snapshot"><thead><tr>',
            *[f"<th>{html.escape(h)}</th>" for h in self._HEAD],
            "</tr></thead><tbody>",
        ]
        for r in self.rows:
            cells = self._cells(r)
            out.append("<tr>")
            for i, c in enumerate(cells):
                extra = bar(r["used_fraction"]) if i == 7 else ""
                out.append(f"<td>{html.escape(c)} {extra}</td>")
            out.append("</tr>")
        out.append("</tbody></table></div>")
        return "".join(out)
