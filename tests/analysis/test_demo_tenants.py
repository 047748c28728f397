"""The demo's tenants (SPEC 23.2, 23.4): every call made for a user and its team, prices on
its paid models, and a summary of what each tenant spent and who was refused for what."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import quotaengine as qe
from quotaengine import _demo


def test_demo_serves_tenants_and_says_who_was_refused_for_what(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "quotaengine", "demo", "--seconds", "2", "--threads", "4", "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    # the zero-overshoot proof now covers alice's requests a minute too
    assert "overshoot: 0 requests over a published limit" in r.stdout
    head = out.index(
        "  tenants (each call for a user and its team; team:* gives each team its own $0.005 a day, "
        "user:alice 5 requests a minute):"
    )
    names = ["team:search", "team:support", "user:alice", "user:bob", "user:carol", "user:dave"]
    assert [line.split()[0] for line in out[head + 1 : head + 7]] == names
    rows = {line.split()[0]: line for line in out[head + 1 : head + 7]}
    assert "cost/day $" in rows["team:search"] and " / $0.005" in rows["team:search"]
    assert "requests/minute" in rows["user:alice"] and "no limits" in rows["user:bob"]
    refused = out.index("  refused for a tenant's own limit (tenant, reason, refusals):")
    by_tenant = {}
    for line in out[refused + 1 :]:
        if not line.startswith("    "):
            break
        tenant, reason, n = line.split()
        by_tenant[(tenant, reason)] = int(n)
    # alice asks about 17 times in 2 s with 5 requests a minute: refused for her own limit
    assert by_tenant.get(("user:alice", "tenant:requests/minute"), 0) > 0
    assert all(t in names and reason.startswith("tenant:") for t, reason in by_tenant)
    with qe.QuotaEngine(tmp_path / "quota.db", env={}) as e:
        # the declarations and prices stay in the file for `status` to show
        assert e.tenant_limits("team:ads") == [qe.Limit.dollars(_demo.TEAM_BUDGET, "day")]
        assert e.tenant_limits("user:alice") == [qe.Limit("requests", _demo.ALICE_RPM, "minute")]
        assert e.model_prices("demo-groq", "llama-3.3-70b-versatile") == qe.Prices(0.59, 0.79)
        assert e.model_prices("demo-ollama", "llama3.2:3b") is None
        assert set(names) <= set(e.tenants())
        # every event was made for a user and its team
        events = e.usage_events()
        assert events and all(len(ev["tenants"]) == 2 and ev["tenants"][1].startswith("team:") for ev in events)
        assert sum(ev["cost"] for ev in events) > 0
        # alice never had more than 5 requests in any minute (the admission is exact)
        alice = sorted(
            ev["created_at_ms"] for ev in events if ev["kind"] == "request" and "user:alice" in ev["tenants"]
        )
        assert all(b - a >= 60_000 for a, b in zip(alice, alice[5:], strict=False))
    status = subprocess.run(
        [sys.executable, "-m", "quotaengine", "status", "--db", str(tmp_path / "quota.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
    assert "tenants with limits in force (cost in dollars):" in status.stdout
    assert " / $0.005" in status.stdout
