"""SPEC 27.3 in a real browser: Debian's chromium, headless, loads ``quotaengine serve``'s
page for a database with usage, cooldowns, forecasts and tenants; the rendered DOM is
checked at 1280×800 and at a phone's 390×844, and a cooldown set by another engine shows
up without a reload. ``QE_SCREENSHOT=path.png`` saves the 1280×800 view (docs/img/live-page.png)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import quotaengine as q
import test_serve
from chromium import Chromium
from test_serve import Running, populate

location = test_serve.location  # a SQLite file or a Redis prefix (a fixture)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    b = Chromium(tmp_path_factory.mktemp("chromium"))
    yield b
    b.close()


def routes_shown(b: Chromium) -> list[str]:
    return list(b.eval("[...document.querySelectorAll('[data-route]')].map(e => e.dataset.route)"))


def test_the_live_page_in_chromium(browser: Chromium, location: str) -> None:
    populate(location)
    with q.QuotaEngine(location) as e:
        e.set_model_limits("mistral", "mistral-small", rpm=60, rpd=2_000)
        e.register_key(3, "mistral")
        for _ in range(40):
            e.record_request("mistral", "mistral-small", 3)
    holder = q.QuotaEngine(location)  # a router with a call in flight
    lease = holder.lease("mistral", "mistral-small", 3, 800)
    running = Running(location)
    b = browser
    try:
        b.viewport(1280, 800)
        b.goto(running.url + "/")
        b.wait_for("document.querySelectorAll('[data-route]').length === 4")
        assert sorted(routes_shown(b)) == [
            "google/gemini-2.5-flash/7",
            "groq/llama-3.3-70b/1",
            "groq/llama-3.3-70b/2",
            "mistral/mistral-small/3",
        ]
        # per platform, in sections of their own
        assert b.eval("[...document.querySelectorAll('section[data-platform]')].map(e => e.dataset.platform)") == [
            "google",
            "groq",
            "mistral",
        ]
        # windows as bars: used against the limit
        bars = b.eval(
            "[...document.querySelectorAll('[data-route=\"groq/llama-3.3-70b/1\"] .win')].map(w => "
            "[w.dataset.window, w.querySelector('.label .v').textContent, w.querySelector('.bar')?.dataset.used,"
            " w.querySelector('.bar')?.dataset.limit, w.querySelector('.bar .used')?.style.width])"
        )
        assert ["rpd", "100 / 1,000", "100", "1000", "10%"] in bars
        assert ["tpm", "4,000 / 12,000", "4000", "12000", "33.33%"] in bars
        tokens_day = b.eval(
            'document.querySelector(\'[data-route="google/gemini-2.5-flash/7"] [data-window="input_tokens/day"] .v\')'
            ".textContent"
        )
        assert tokens_day == "52,000 / 1,000,000"
        # a call in flight: its share of the request windows' bars
        flight = b.eval(
            "(() => { const r = document.querySelector('[data-route=\"mistral/mistral-small/3\"]');"
            " return [r.querySelector('.badge.flight').textContent,"
            " r.querySelector('[data-window=\"rpm\"] .bar').dataset.inFlight,"
            " r.querySelector('[data-window=\"rpm\"] .v').textContent]; })()"
        )
        assert flight == ["1 in flight", "1", "40 / 60 +1"]
        # its cooldown with the time left
        cd = b.eval(
            "(() => { const c = document.querySelector('[data-route=\"groq/llama-3.3-70b/2\"] [data-cooldown]');"
            " return [c.dataset.cooldown, c.textContent, +c.dataset.leftMs]; })()"
        )
        assert cd[0] == "authoritative" and cd[1].startswith("cooling down 9m") and 9 * 60_000 < cd[2] <= 10 * 60_000
        assert "(authoritative)" in cd[1]
        # its exhaustion forecast (100 of 1,000 requests a day, in the last minute)
        fc = b.eval("document.querySelector('[data-route=\"groq/llama-3.3-70b/1\"] [data-forecast]')?.textContent")
        to_midnight = 86_400_000 - int(time.time() * 1000) % 86_400_000  # groq's day is UTC's
        if to_midnight > 92 * 60_000:  # it runs out in about 90 minutes, before the day ends
            assert fc is not None and fc.startswith("rpd runs out at "), fc
        elif to_midnight < 79 * 60_000:  # the day ends first: no forecast to show
            assert fc is None, fc
        # the tenants with their limits
        tenants = b.eval(
            "[...document.querySelectorAll('#tenants tr[data-tenant]')].map(r => "
            "[r.dataset.tenant, r.dataset.window, r.cells[2].textContent])"
        )
        assert ["acme", "tokens/day", "53,000 / 200,000"] in tenants
        assert ["acme", "requests/day", "3 / 1,000"] in tenants
        assert ["acme", "cost/day", "$0.00 / $5.00"] in tenants  # µ$ shown as dollars
        assert ["team:search", "requests/day", "100 / 500"] in tenants
        # the last warnings of server_logs
        warnings = b.eval("[...document.querySelectorAll('#warnings li[data-level]')].map(e => e.textContent)")
        assert len(warnings) == 1 and "PROVIDER_DAILY_REQUEST_CAP_OPENROUTER" in warnings[0]
        # readable at 1280×800: cards side by side, nothing wider than the window
        assert b.eval("document.documentElement.scrollWidth <= window.innerWidth")
        assert b.eval("new Set([...document.querySelectorAll('.route')].map(e => e.offsetTop)).size") < 4
        if os.environ.get("QE_SCREENSHOT") and "://" not in location:
            b.screenshot(Path(os.environ["QE_SCREENSHOT"]))

        # a change made by another engine shows up within a few seconds, without a reload
        b.eval("window.__same_document = true")
        with q.QuotaEngine(location) as other:
            other.set_cooldown("google", "gemini-2.5-flash", 7, 30 * 60_000, "heuristic")
        started = time.monotonic()
        b.wait_for(
            'document.querySelector(\'[data-route="google/gemini-2.5-flash/7"] [data-cooldown="heuristic"]\')',
            timeout_s=6,
        )
        assert time.monotonic() - started < 6
        assert b.eval("window.__same_document === true")  # refreshed in place
        left = b.eval(
            "document.querySelector('[data-route=\"google/gemini-2.5-flash/7\"] [data-cooldown]').textContent"
        )
        assert left.startswith("cooling down 29m") or left.startswith("cooling down 30m")

        # on a phone: one column, no horizontal overflow
        b.viewport(390, 844, mobile=True)
        b.goto(running.url + "/")
        b.wait_for("document.querySelectorAll('[data-route]').length === 4")
        # (a phone widens its layout viewport to what overflows: innerWidth would grow too)
        assert b.eval("[window.innerWidth, document.documentElement.clientWidth]") == [390, 390]
        assert b.eval("document.documentElement.scrollWidth") <= 390
        lefts = b.eval("[...document.querySelectorAll('.route')].map(e => e.getBoundingClientRect().left)")
        assert len(set(lefts)) == 1
        assert b.eval("[...document.querySelectorAll('.route')].every(e => e.getBoundingClientRect().right <= 390)")
        if os.environ.get("QE_SCREENSHOT") and "://" not in location:
            b.screenshot(Path(os.environ["QE_SCREENSHOT"]).with_name("live-page-phone.png"))
    finally:
        running.close()
        lease.success(800)
        holder.close()
