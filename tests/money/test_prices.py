"""SPEC 23.1: prices. ``Prices(input, output, *, cached_input=None, per_request=0.0)`` in dollars
per million tokens (per request for ``per_request``), held exactly as integer pico-dollars
(``round(x * 10**6)`` per token, ``round(per_request * 10**12)`` per request) and read back as
held; ``set_model_prices`` / ``model_prices`` persisted and shared like model limits: every
process and host on the store sees them at its next call, ``None`` forgets them."""

from __future__ import annotations

import math
import sqlite3
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import quotaengine as q
from old_schemas import downgrade_schema
from subprocesses import finish, spawn

P, M = "openai", "gpt-4o-mini"
MINI = q.Prices(0.15, 0.6, cached_input=0.075)

# ================================================================== the value


def test_the_repr_is_the_spec_s() -> None:
    assert repr(MINI) == "Prices(input=0.15, output=0.6, cached_input=0.075, per_request=0.0)"
    assert repr(q.Prices(3, 15, per_request=0.002)) == (
        "Prices(input=3.0, output=15.0, cached_input=3.0, per_request=0.002)"
    )
    assert str(q.Prices(0, 0)) == "Prices(input=0.0, output=0.0, cached_input=0.0, per_request=0.0)"
    # A value too small or too large for a plain decimal prints as Python prints a float.
    assert repr(q.Prices(1e-6, 2e9)) == "Prices(input=1e-06, output=2000000000.0, cached_input=1e-06, per_request=0.0)"
    assert eval(repr(MINI), {"Prices": q.Prices}) == MINI


def test_the_fields_and_their_defaults() -> None:
    p = q.Prices(2.5, 10)
    assert (p.input, p.output, p.cached_input, p.per_request) == (2.5, 10.0, 2.5, 0.0)
    assert all(type(v) is float for v in (p.input, p.output, p.cached_input, p.per_request))
    # cached_input=None is the default: the input price.
    assert q.Prices(2.5, 10, cached_input=None) == p
    # Zero is a price (free), not "unset".
    assert q.Prices(2.5, 10, cached_input=0).cached_input == 0.0
    assert q.Prices(input=1, output=2, cached_input=0.5, per_request=0.01).per_request == 0.01
    with pytest.raises(TypeError):
        q.Prices(1, 2, 0.5)  # type: ignore[misc]  # cached_input and per_request are keyword-only
    with pytest.raises(TypeError):
        q.Prices(1)  # type: ignore[call-arg]


def test_equal_prices_are_equal_and_hash_alike_and_the_value_is_frozen() -> None:
    assert q.Prices(0.15, 0.6) == q.Prices(0.15, 0.6, cached_input=0.15, per_request=0.0)
    assert hash(q.Prices(0.15, 0.6)) == hash(q.Prices(0.15, 0.6, cached_input=0.15, per_request=0.0))
    assert q.Prices(1, 2) == q.Prices(1.0, 2.0) and hash(q.Prices(1, 2)) == hash(q.Prices(1.0, 2.0))
    assert len({MINI, q.Prices(0.15, 0.6, cached_input=0.075), q.Prices(0.15, 0.6)}) == 2
    for different in (
        q.Prices(0.16, 0.6, cached_input=0.075),
        q.Prices(0.15, 0.61, cached_input=0.075),
        q.Prices(0.15, 0.6, cached_input=0.076),
        q.Prices(0.15, 0.6, cached_input=0.075, per_request=1e-12),
    ):
        assert different != MINI
    assert MINI != (0.15, 0.6, 0.075, 0.0)
    assert MINI != "Prices(input=0.15, output=0.6, cached_input=0.075, per_request=0.0)"
    with pytest.raises(AttributeError):
        MINI.input = 1.0  # type: ignore[misc]


def test_prices_are_held_exactly_in_pico_dollars_and_read_back_as_held() -> None:
    # Decimal prices read back as written: 0.15 $/M is 150_000 p$ per token, 150_000 / 10**6.
    for x in (0.15, 0.6, 0.075, 0.1, 1.25, 3.0, 15.0, 0.0375, 75.0, 0.000001, 1234.567891):
        assert q.Prices(x, x).input == x
    # No float drift: 0.1 + 0.2 is 300_000.00000000006 p$ per token, held as 300_000: 0.3.
    assert q.Prices(0.1 + 0.2, 0).input == 0.3
    # A price finer than a p$ per token rounds to the nearest p$ and reads back as held.
    p = q.Prices(0.0000004, 1.0000006, cached_input=0.0000006)
    assert (p.input, p.output, p.cached_input) == (0.0, 1.000001, 0.000001)
    # Half a p$ rounds as Python's round() does: to even.
    assert q.Prices(0.0000005, 0.0000015).input == 0.0
    assert q.Prices(0.0000005, 0.0000015).output == round(0.0000015 * 10**6) / 10**6 == 0.000002
    # A price per request is held in p$ too (10**12 per dollar).
    assert q.Prices(0, 0, per_request=0.002).per_request == 0.002
    assert q.Prices(0, 0, per_request=1.4e-12).per_request == 1e-12
    assert q.Prices(0, 0, per_request=0.4e-12).per_request == 0.0
    # What reads back is what is held: building it again holds the same prices.
    assert q.Prices(p.input, p.output, cached_input=p.cached_input) == p
    # Prices that hold the same p$ are the same prices.
    assert q.Prices(0.15, 0.6) == q.Prices(0.1500000001, 0.6000000004)
    # The widest price is just below 2**63 p$ per token.
    assert q.Prices(9.2e12, 0).input == 9.2e12
    assert q.Prices(0, 0, per_request=9.2e6).per_request == 9.2e6


FIELDS = ["input", "output", "cached_input", "per_request"]


def build(field: str, value: Any) -> q.Prices:
    """Prices with ``value`` for ``field`` (and 1 $/M for the others)."""
    args: dict[str, Any] = {"input": 1.0, "output": 1.0}
    args[field] = value
    return q.Prices(**args)


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", [-0.01, -1, -1e-300, math.nan, math.inf, -math.inf], ids=repr)
def test_a_negative_nan_or_infinite_price_is_a_value_error(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        build(field, value)


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", [True, False, "0.15", b"1", 1j, [1.0], object()], ids=repr)
def test_a_bool_or_a_non_number_is_a_type_error(field: str, value: Any) -> None:
    with pytest.raises(TypeError, match=field):
        build(field, value)


@pytest.mark.parametrize("field", ["input", "output"])
def test_input_and_output_are_required_numbers(field: str) -> None:
    with pytest.raises(TypeError, match=field):
        build(field, None)


def test_any_number_is_a_price() -> None:
    """ints, floats, and numbers Python turns into a float (Decimal, Fraction, numpy's)."""
    np = pytest.importorskip("numpy")
    assert q.Prices(Decimal("0.15"), Fraction(3, 5), cached_input=np.float64(0.075), per_request=np.int64(0)) == MINI
    assert q.Prices(np.float32(0.5), 1).input == 0.5


@pytest.mark.parametrize("field", FIELDS)
def test_a_price_beyond_int64_pico_dollars_is_an_overflow_error(field: str) -> None:
    huge = 1e7 if field == "per_request" else 1e13  # 2**63 p$ is 9.22e6 $ or 9.22e12 $/M
    for value in (huge, 1e300, 10**400):
        with pytest.raises(OverflowError, match=field):
            build(field, value)
    assert not issubclass(OverflowError, ValueError)  # the two stay apart


# ================================================================== persisted, shared


def test_set_read_replace_and_forget(engine: q.QuotaEngine) -> None:
    assert engine.model_prices(P, M) is None
    assert engine.set_model_prices(P, M, MINI) is None
    got = engine.model_prices(P, M)
    assert got == MINI and repr(got) == repr(MINI)
    # Another model, and the same model on another platform, have none.
    assert engine.model_prices(P, "gpt-4o") is None
    assert engine.model_prices("azure", M) is None
    dearer = q.Prices(2.5, 10, cached_input=1.25, per_request=0.001)
    engine.set_model_prices(P, M, dearer)
    assert engine.model_prices(P, M) == dearer
    engine.set_model_prices(P, M, None)
    assert engine.model_prices(P, M) is None
    # Forgetting what is not set is not an error.
    engine.set_model_prices(P, M, None)
    assert engine.model_prices(P, M) is None


def test_prices_are_a_models_own_and_limits_are_left_alone(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=5)
    engine.set_model_prices(P, M, MINI)
    engine.set_model_prices(P, "o3", q.Prices(2, 8, cached_input=0.5))
    limits = engine.model_limits(P, M)
    assert limits is not None and limits.rpm == 5
    engine.set_model_limits(P, M, rpm=6)
    assert engine.model_prices(P, M) == MINI
    # Prices need no declared limits, and declaring limits sets no prices.
    assert engine.model_limits(P, "o3") is None
    engine.set_model_limits(P, "o1", rpm=1)
    assert engine.model_prices(P, "o1") is None
    assert engine.model_prices(P, "o3") == q.Prices(2, 8, cached_input=0.5)


def test_names_are_kept_as_given(engine: q.QuotaEngine) -> None:
    names = [("a\x1fb", "m\\"), ("Groq", "llama"), ("groq", "Llama"), ("p", "x" * 300), ("é", "模型")]
    for i, (p, m) in enumerate(names):
        engine.set_model_prices(p, m, q.Prices(i, i))
    for i, (p, m) in enumerate(names):
        assert engine.model_prices(p, m) == q.Prices(i, i)


def test_another_engine_sees_prices_at_its_next_call(engine: q.QuotaEngine, other: q.QuotaEngine) -> None:
    assert other.model_prices(P, M) is None
    engine.set_model_prices(P, M, MINI)
    assert other.model_prices(P, M) == MINI
    other.set_model_prices(P, M, q.Prices(0.3, 1.2))
    assert engine.model_prices(P, M) == q.Prices(0.3, 1.2)
    engine.set_model_prices(P, M, None)
    assert other.model_prices(P, M) is None
    # The exact value travels: a price held below a decimal's precision too.
    fine = q.Prices(0.0000004, 1.0000006, cached_input=1e-6, per_request=1.4e-12)
    engine.set_model_prices(P, M, fine)
    got = other.model_prices(P, M)
    assert got == fine and (got.input, got.output, got.cached_input, got.per_request) == (0.0, 1.000001, 1e-6, 1e-12)


def test_prices_outlive_the_engine(store: str, clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        e.set_model_prices(P, M, MINI)
        e.set_model_prices(P, "gone", MINI)
        e.set_model_prices(P, "gone", None)
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        assert e.model_prices(P, M) == MINI
        assert e.model_prices(P, "gone") is None
    with q.QuotaEngine(store, clock=clock, env={}, readonly=True) as ro:
        assert ro.model_prices(P, M) == MINI
        with pytest.raises(q.DatabaseError):
            ro.set_model_prices(P, M, None)
        assert ro.model_prices(P, M) == MINI


SET_AND_READ = """
    import sys
    import quotaengine as q
    e = q.QuotaEngine(sys.argv[1], env={})
    print(repr(e.model_prices(sys.argv[2], sys.argv[3])))
    e.set_model_prices(sys.argv[2], sys.argv[3], q.Prices(1.1, 4.4, cached_input=0.275, per_request=0.0001))
    e.set_model_prices(sys.argv[2], "forgotten", None)
    e.close()
"""


def test_another_process_sees_prices_and_its_own_are_seen(store: str, clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        e.set_model_prices(P, M, MINI)
        e.set_model_prices(P, "forgotten", q.Prices(1, 1))
        with spawn(SET_AND_READ, store, P, M) as proc:
            out = finish(proc, timeout=60)
        assert out.splitlines() == ["Prices(input=0.15, output=0.6, cached_input=0.075, per_request=0.0)"]
        # What the other process set and forgot holds here at the next call.
        assert e.model_prices(P, M) == q.Prices(1.1, 4.4, cached_input=0.275, per_request=0.0001)
        assert e.model_prices(P, "forgotten") is None


# ================================================================== bad calls write nothing


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("", M, MINI), ValueError),
        ((P, "", MINI), ValueError),
        ((P, "", None), ValueError),
        ((None, M, MINI), TypeError),
        ((P, 7, MINI), TypeError),
        ((P, M, "Prices(0.15, 0.6)"), TypeError),
        ((P, M, (0.15, 0.6)), TypeError),
        ((P, M, {"input": 0.15, "output": 0.6}), TypeError),
        ((P, M, q.Limits(rpm=1)), TypeError),
        ((P, M, 0.15), TypeError),
    ],
    ids=repr,
)
def test_a_bad_call_raises_and_writes_nothing(
    engine: q.QuotaEngine, other: q.QuotaEngine, args: tuple[Any, ...], error: type[Exception]
) -> None:
    engine.set_model_prices(P, M, MINI)
    with pytest.raises(error):
        engine.set_model_prices(*args)
    assert engine.model_prices(P, M) == MINI
    assert other.model_prices(P, M) == MINI
    assert other.model_prices("", M) is None and other.model_prices(P, "") is None


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, True, "1", 1e13, 10**400], ids=repr)
def test_bad_prices_never_reach_the_store(engine: q.QuotaEngine, other: q.QuotaEngine, bad: Any) -> None:
    engine.set_model_prices(P, M, MINI)
    with pytest.raises((ValueError, TypeError, OverflowError)):
        engine.set_model_prices(P, M, q.Prices(bad, 1))
    assert engine.model_prices(P, M) == MINI
    assert other.model_prices(P, M) == MINI


# ================================================================== the SQLite file


@pytest.mark.sqlite_only
def test_the_file_holds_integer_pico_dollars(store: str, clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        e.set_model_prices(P, M, q.Prices(0.15, 0.6, cached_input=0.075, per_request=0.002))
        e.set_model_prices(P, "tiny", q.Prices(0.0000004, 1.0000006))
        e.set_model_prices(P, "widest", q.Prices(9.2e12, 0, per_request=9.2e6))
    con = sqlite3.connect(store)
    rows = con.execute(
        "SELECT platform, model_id, input_pps, output_pps, cached_input_pps, per_request_pps, "
        "typeof(input_pps) FROM model_prices ORDER BY model_id"
    ).fetchall()
    con.close()
    assert rows == [
        (P, M, 150_000, 600_000, 75_000, 2_000_000_000, "integer"),
        (P, "tiny", 0, 1_000_001, 0, 0, "integer"),
        (P, "widest", 9_200_000_000_000_000_000, 0, 9_200_000_000_000_000_000, 9_200_000_000_000_000_000, "integer"),
    ]


@pytest.mark.sqlite_only
def test_a_plain_sqlite_writer_is_seen_and_a_row_it_spoiled_prices_nothing(store: str, clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        e.set_model_prices(P, M, MINI)
        con = sqlite3.connect(store)
        with con:
            con.execute("UPDATE model_prices SET output_pps = 700000 WHERE model_id = ?", (M,))
            con.execute(
                "INSERT INTO model_prices VALUES (?, 'spoiled', -1, 0, 0, 0), (?, 'text', 'x', 0, 0, 0)", (P, P)
            )
        con.close()
        assert e.model_prices(P, M) == q.Prices(0.15, 0.7, cached_input=0.075)
        assert e.model_prices(P, "spoiled") is None
        assert e.model_prices(P, "text") is None


@pytest.mark.sqlite_only
def test_a_version_11_file_gains_the_prices_table(db_path: Path, clock: q.ManualClock) -> None:
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        e.set_model_limits(P, M, rpm=5)
    con = sqlite3.connect(db_path)
    with con:
        downgrade_schema(con, 11)
    assert con.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'model_prices'").fetchone() == (0,)
    con.close()
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        assert e.model_prices(P, M) is None
        limits = e.model_limits(P, M)
        assert limits is not None and limits.rpm == 5
        e.set_model_prices(P, M, MINI)
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        assert e.model_prices(P, M) == MINI
    con = sqlite3.connect(db_path)
    assert con.execute("PRAGMA user_version").fetchone() == (13,)
    con.close()


def test_prices_are_exported() -> None:
    assert "Prices" in q.__all__
    assert q.Prices is q._quotaengine.Prices  # type: ignore[attr-defined]
    assert q.Prices.__module__ == "quotaengine"
