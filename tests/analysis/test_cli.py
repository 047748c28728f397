"""The command line, run as a user would: through a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import quotaengine as qe


def run(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quotaengine", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def test_demo_runs_and_proves_zero_overshoot(tmp_path: Path) -> None:
    r = run("demo", "--seconds", "2", "--threads", "4", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "overshoot: 0 requests over a published limit" in r.stdout
    assert "admitted" in r.stdout and "refused" in r.stdout
    # the closing summary: refused answers per provider, what was learned
    assert "refused answers (429/503) per provider" in r.stdout
    assert "demo-gemini" in r.stdout and "demo-ollama" in r.stdout
    assert "limits learned:" in r.stdout and "concurrency caps:" in r.stdout
    # what the engine learned from the OpenRouter-like aggregator (SPEC 21)
    assert "provider caps learned from pool 429s:" in r.stdout
    assert "upstream congestion:" in r.stdout
    # SPEC 22.1: interactive and batch callers on the same keys, batch leaving a reserve
    assert "batch at priority 1 leaves 30% of every limit to interactive at priority 0" in r.stdout
    lines = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.startswith("    ")}
    assert lines["interactive"][1:3] == ["1", "thread(s)"] and lines["batch"][1:3] == ["3", "thread(s)"]
    assert (tmp_path / "quota.db").exists()  # the default database is ./quota.db
    status = run("status", "--db", str(tmp_path / "quota.db"))
    assert status.returncode == 0, status.stderr
    assert "demo-groq" in status.stdout
    assert "degraded: False" in status.stdout
    with qe.QuotaEngine(tmp_path / "quota.db", env={}) as e:
        assert e.priority_reserve(1) == 0.0  # the demo gave the file its reserve back


def test_status_cooldowns_events_and_clear(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    with qe.QuotaEngine(db, env={}) as e:
        e.set_model_limits("groq", "llama", rpm=10)
        e.record_request("groq", "llama", 7)
        e.set_cooldown("groq", "llama", 7, 600_000, "tier")
    r = run("status", "--db", str(db))
    assert r.returncode == 0 and "groq" in r.stdout and "1/10" in r.stdout, r.stdout
    r = run("cooldowns", "--db", str(db))
    assert r.returncode == 0 and "groq/llama/7" in r.stdout and "tier" in r.stdout
    r = run("events", "--db", str(db), "--since", "1h")
    assert r.returncode == 0 and "1 event(s)" in r.stdout
    r = run("clear-cooldowns", "7", "--db", str(db))
    assert r.returncode == 0 and "cleared 1" in r.stdout
    assert "no active cooldowns" in run("cooldowns", "--db", str(db)).stdout


def test_help_for_every_subcommand() -> None:
    for sub in ("status", "cooldowns", "clear-cooldowns", "events", "demo"):
        r = run(sub, "--help")
        assert r.returncode == 0 and "--db" in r.stdout


def test_bad_databases_are_one_line_errors(tmp_path: Path) -> None:
    missing = run("status", "--db", str(tmp_path / "nope.db"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    text = tmp_path / "notes.txt"
    text.write_text("not a database at all, just some text to fill a header " * 10)
    r = run("status", "--db", str(text))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_status_adds_a_column_per_declared_limit(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    with qe.QuotaEngine(db, env={}) as e:
        e.set_model_limits("mistral", "small", rpm=10, limits=[qe.Limit("tokens", 1_000_000, "month")])
        e.record_tokens("mistral", "small", 1, 2_500)
        e.record_request("groq", "llama", 7)
    r = run("status", "--db", str(db))
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if line.startswith("platform"))
    assert header.split()[3:8] == ["RPM", "RPD", "TPM", "TPD", "tokens/month"]
    assert "2500/1000000" in r.stdout


def test_events_show_the_token_split(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    with qe.QuotaEngine(db, env={}) as e:
        e.record_tokens("anthropic", "claude", 1, input_tokens=10, output_tokens=5, cached_tokens=2)
        e.record_tokens("groq", "llama", 1, 7)
    r = run("events", "--db", str(db), "--since", "1h")
    assert r.returncode == 0, r.stderr
    assert "anthropic/claude/1  tokens  15  (input 10, output 5, cached 2)" in r.stdout
    assert "groq/llama/1  tokens  7\n" in r.stdout


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    with qe.QuotaEngine(db, env={}) as e:
        for i in range(3000):
            e.record_tokens("groq", "llama", i % 50, 7)
    p = subprocess.Popen(
        [sys.executable, "-m", "quotaengine", "events", "--db", str(db), "--since", "1h", "--limit", "3000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()  # like `| head -1`
    p.stdout.close()
    err = p.stderr.read().decode()
    p.stderr.close()
    assert p.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err
