"""Command line: ``python -m quotaengine {status,cooldowns,clear-cooldowns,events,demo,serve}``.

Every subcommand takes ``--db PATH`` (default: ``$QUOTAENGINE_DB``, else ``./quota.db``).
A missing or foreign database is a one-line error and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import DatabaseError, QuotaEngine
from ._snapshot import _fmt_left, _fmt_time


def _open_existing(path: str | None, readonly: bool = True) -> QuotaEngine:
    """An engine on an existing database (``None``: the engine's default). A read-only
    engine refuses a missing, empty or foreign file; a write command opens it read-only
    first, so that it never turns such a file into a quotaengine database."""
    if not readonly:
        QuotaEngine(path, readonly=True).close()
    return QuotaEngine(path, readonly=readonly)


def _table(head: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows]]


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)


def _key(key_id: int | None) -> str:
    """A cooldown's key: "*" for a model benched on every key (SPEC 21.1)."""
    return "*" if key_id is None else str(key_id)


def cmd_status(args: argparse.Namespace) -> int:
    with _open_existing(args.db) as e:
        snap = e.snapshot()
        print(snap)
        platforms = sorted({r["platform"] for r in snap.rows})
        if platforms:
            print("\nprovider caps (per key; - = none) and calendars (where each day starts):")
            caps = [(p, e.provider_caps(p)) for p in platforms]
            rows = [
                [
                    p,
                    _opt(c.daily_requests),
                    _opt(c.minute_requests),
                    _opt(c.daily_tokens),
                    e.platform_calendar(p),
                    _fmt_time(e.day_start_ms(p)),
                ]
                for p, c in caps
            ]
            head = ["platform", "requests/day", "requests/min", "tokens/day", "calendar", "day started"]
            print("\n".join(_table(head, rows)))
        cds = e.active_cooldowns()
        print(f"\nactive cooldowns: {len(cds)}")
        if cds:
            rows = [
                [
                    f"{c.platform}/{c.model_id}/{_key(c.key_id)}",
                    c.source,
                    _fmt_left(c.remaining_ms),
                    f"until {_fmt_time(c.expires_at_ms)}",
                ]
                for c in cds
            ]
            print("\n".join(_table(["route", "source", "time left", "expires"], rows)))
        print(f"\ndegraded: {e.degraded}")
        outages = [r for r in e.server_logs(1000) if r.get("event") == "degraded"]
        if outages:
            last = outages[0]
            when = _fmt_time(last["created_at_ms"])
            print(f"  last database outage logged by a writer: {when}: {last['message']}")
    return 0


def cmd_cooldowns(args: argparse.Namespace) -> int:
    with _open_existing(args.db) as e:
        cds = e.active_cooldowns()
        if not cds:
            print("no active cooldowns")
        for c in cds:
            print(
                f"{c.platform}/{c.model_id}/{_key(c.key_id)}  {c.source:<13}  {_fmt_left(c.remaining_ms):>8} left"
                f"  (until {_fmt_time(c.expires_at_ms)})"
            )
    return 0


def cmd_clear_cooldowns(args: argparse.Namespace) -> int:
    with _open_existing(args.db, readonly=False) as e:
        n = e.clear_cooldowns_for_key(args.key_id)
    print(f"cleared {n} cooldown(s) of key {args.key_id}")
    return 0


def _parse_since(text: str) -> int:
    units = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    text = text.strip().lower()
    if not text or text[-1] not in units or not text[:-1].isdigit():
        raise argparse.ArgumentTypeError(f"expected a duration such as 30m, 1h or 2d, got {text!r}")
    return int(text[:-1]) * units[text[-1]]


def cmd_events(args: argparse.Namespace) -> int:
    with _open_existing(args.db) as e:
        now = e.now_ms()
        rows = e.usage_events(since_ms=now - args.since, platform=args.platform)
        for r in rows[-args.limit :]:
            # SPEC 14.4: the split the call reported, when it did.
            split = ", ".join(
                f"{k.removesuffix('_tokens')} {r[k]}"
                for k in ("input_tokens", "output_tokens", "cached_tokens")
                if r[k] is not None
            )
            print(
                f"{_fmt_time(r['created_at_ms'])}  {r['platform']}/{r['model_id']}/{r['key_id']}  "
                f"{r['kind']:<7} {r['tokens']}" + (f"  ({split})" if split else "")
            )
        print(f"{len(rows)} event(s)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    return run_demo(args.db, seconds=args.seconds, threads=args.threads, quiet=args.quiet)


def cmd_serve(args: argparse.Namespace) -> int:
    from ._serve import serve

    return serve(args.db, args.host, args.port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quotaengine", description="Inspect and exercise a quotaengine database.")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--db", default=None, help="database file (default: $QUOTAENGINE_DB or ./quota.db)")
        return p

    add("status", "windows, tenants' limits, caps and cooldowns of a database").set_defaults(func=cmd_status)
    add("cooldowns", "active cooldowns with source and time left").set_defaults(func=cmd_cooldowns)
    p = add("clear-cooldowns", "operator reset of a key: clear its cooldowns and ladder history")
    p.add_argument("key_id", type=int)
    p.set_defaults(func=cmd_clear_cooldowns)
    p = add("events", "recent usage events")
    p.add_argument("--since", type=_parse_since, default=_parse_since("1h"), help="e.g. 30m, 1h, 2d (default 1h)")
    p.add_argument("--platform", default=None)
    p.add_argument("--limit", type=int, default=50, help="show at most this many (newest)")
    p.set_defaults(func=cmd_events)
    p = add("demo", "run a simulated router against simulated providers")
    p.add_argument("--seconds", type=float, default=8.0, help="how long to run (default 8)")
    p.add_argument("--threads", type=int, default=8, help="router threads (default 8)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_demo)
    p = add("serve", "a live page, /api/snapshot and /metrics for the database, opened read-only")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this host only)")
    p.add_argument("--port", type=int, default=9464, help="port (default 9464; 0 picks a free one)")
    p.set_defaults(func=cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except DatabaseError as exc:
        print(f"quotaengine: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`quotaengine events | head`): stop quietly, as Unix tools
        # do; what is still buffered for stdout goes nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
