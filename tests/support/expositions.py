"""Prometheus text read back through ``prometheus_client``'s own parser, to compare two
expositions of one engine sample for sample whatever their line and label order."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def families(text: bytes) -> dict[str, Any]:
    """Prometheus text as the client's parser reads it: family name -> family."""
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def parsed(text: bytes) -> dict[str, tuple[str, str, list[tuple[str, tuple[tuple[str, Any], ...], float]]]]:
    """``{family: (type, help, sorted samples)}``, each sample ``(name, sorted labels,
    value)``; a histogram's ``le`` as a number (Python's client writes ``1.0`` where the
    Go-style text writes ``1``: the same bound)."""
    out = {}
    for f in text_string_to_metric_families(text.decode()):
        rows = sorted(
            (s.name, tuple(sorted((k, float(v) if k == "le" else v) for k, v in s.labels.items())), s.value)
            for s in f.samples
        )
        out[f.name] = (f.type, f.documentation, rows)
    return out
