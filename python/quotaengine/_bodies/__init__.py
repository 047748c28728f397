"""The corpus of real provider error bodies: ``<provider>/<name>.json`` (or ``.txt`` when
the body is no JSON), one file per body as the provider sent it. The demo reads it here,
in the installed package; the tests read it through ``tests/provider_bodies.py``, and the
Rust core's provider tests (``src/core/providers/tests.rs``) at compile time."""

from __future__ import annotations

from importlib.resources import files


def read(provider: str, name: str) -> str:
    """One body of the corpus, e.g. ``read("groq", "tpm_429.json")``."""
    return files(__name__).joinpath(provider).joinpath(name).read_text(encoding="utf-8")
