"""Session-aware admission's rule (policies/admission.py), one row per case: (turn, the engine's
residents and waiters, its KV) -> admit or wait, and why.

The engine: 100,000 KV tokens, fit_fraction 0.9 (90,000), max_num_seqs 4 x turn_tokens 1,000
kept free: resident prefixes may hold 86,000 tokens. Time is 1,000 s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from policies.admission import (
    ADMIT_REASONS,
    WAIT_REASONS,
    Capacity,
    EngineResidency,
    Resident,
    Turn,
    Waiter,
    admission,
    expected_wait_s,
    held_tokens,
    move_instead,
)
from policies.spec.admission import SessionAdmissionSpec
from policies.spec.backends import BackendSpec
from policies.types import SessionView

NOW = 1000.0
KV = Capacity(100_000, 4)


def spec(**kw: Any) -> SessionAdmissionSpec:
    base: dict[str, Any] = {"enabled": True, "turn_tokens": 1000, "shared_prefix_tokens": 0}
    return SessionAdmissionSpec.model_validate({**base, **kw})


def r(key: str, tokens: int, idle_for: float | None = 5.0) -> Resident:
    return Resident(key, tokens, None if idle_for is None else NOW - idle_for)


def w(key: str, waited: float, client: str = "", present_for: float | None = None) -> Waiter:
    return Waiter(key, NOW - waited, True, client, present_for)


# One client's six sessions waiting, the oldest 100 s: another client's turn (AD3).
SIX = tuple(w(f"x{i}", 100 - i, "x") for i in range(6))


@dataclass
class Row:
    name: str
    turn: Turn
    engine: EngineResidency
    admit: bool
    reason: str
    spec: SessionAdmissionSpec = spec()
    capacity: Capacity = KV
    ends: tuple[str, ...] = ()
    ahead: int = 0


ROWS = [
    Row("off", Turn("s", 10**6), EngineResidency((r("a", 90_000),)), True, "off", spec(enabled=False)),
    Row("compaction of a resident session goes", Turn("a", 50_000, keeps_place=True),
        EngineResidency((r("a", 80_000),), (w("b", 900),)), True, "class"),
    Row("compaction of another session: a turn like any", Turn("s", 50_000, keeps_place=True),
        EngineResidency((r("a", 80_000),)), False, "full"),
    Row("a declared class waits in turn", Turn("s", 1_000, keeps_place=True),
        EngineResidency((r("a", 46_000),), (w("b", 10),)), False, "queue", ahead=1),
    Row("KV unknown", Turn("s", 50_000), EngineResidency((r("a", 80_000),)), True, "kv-unknown",
        capacity=Capacity(None, 4)),
    Row("empty engine", Turn("s", 50_000), EngineResidency(), True, "fits"),
    Row("too big alone: goes anyway", Turn("s", 200_000), EngineResidency(), True, "alone"),
    Row("fits beside one", Turn("s", 40_000), EngineResidency((r("a", 46_000),)), True, "fits"),
    Row("one token over", Turn("s", 40_001), EngineResidency((r("a", 46_000),)), False, "full"),
    Row("shared prefix counted once", Turn("s", 50_000),
        EngineResidency((r("a", 50_000),)), True, "fits", spec(shared_prefix_tokens=20_000)),
    Row("shared prefix learned", Turn("s", 50_000),
        EngineResidency((r("a", 50_000),), shared_prefix_tokens=20_000), True, "fits",
        spec(shared_prefix_tokens=None)),
    Row("policy's shared prefix wins", Turn("s", 50_000),
        EngineResidency((r("a", 50_000),), shared_prefix_tokens=20_000), False, "full"),
    Row("fits but others wait first", Turn("s", 1_000),
        EngineResidency((r("a", 46_000),), (w("b", 10), w("c", 5))), False, "queue", ahead=2),
    Row("its place: second", Turn("c", 1_000),
        EngineResidency((r("a", 46_000),), (w("b", 10), w("c", 5))), False, "queue", ahead=1),
    Row("its place: first, fits", Turn("b", 1_000),
        EngineResidency((r("a", 46_000),), (w("b", 10), w("c", 5))), True, "fits"),
    Row("its place: first, full", Turn("b", 60_000),
        EngineResidency((r("a", 46_000),), (w("b", 10), w("c", 5))), False, "full"),
    Row("resident goes though full", Turn("a", 200_000),
        EngineResidency((r("a", 80_000), r("b", 80_000)), (w("c", 100),)), True, "resident"),
    Row("resident yields at max_wait_s", Turn("a", 80_000),
        EngineResidency((r("a", 80_000),), (w("c", 600),)), False, "yield", ends=("a",), ahead=1),
    Row("a kept place banks no wait while absent", Turn("a", 80_000),
        EngineResidency((r("a", 80_000),), (w("c", 700, present_for=10),)), True, "resident"),
    Row("... its wait while present counts", Turn("a", 80_000),
        EngineResidency((r("a", 80_000),), (w("c", 700, present_for=600),)), False, "yield",
        ends=("a",), ahead=1),
    Row("a client's six sessions: another client's turn is second", Turn("y", 1_000, client="y"),
        EngineResidency((r("a", 46_000),), SIX), False, "queue", ahead=1),
    Row("... its place too", Turn("y", 1_000, client="y"),
        EngineResidency((r("a", 46_000),), (*SIX, w("y", 1, "y"))), False, "queue", ahead=1),
    Row("... and that client's own next session waits for the round", Turn("x9", 1_000, client="x"),
        EngineResidency((r("a", 46_000),), (*SIX, w("y", 1, "y"))), False, "queue", ahead=7),
    Row("... once its first went, the client served least recently goes first",
        Turn("y", 1_000, client="y"),
        EngineResidency((r("a", 46_000),), (*SIX[1:], w("y", 1, "y")), served=(("x", 7),)),
        True, "fits"),
    Row("... and the one served last waits for it", Turn("x1", 1_000, client="x"),
        EngineResidency((r("a", 46_000),), (*SIX[1:], w("y", 1, "y")),
                        served=(("x", 7), ("y", 2))), False, "queue", ahead=1),
    Row("resident stays before max_wait_s", Turn("a", 80_000),
        EngineResidency((r("a", 80_000),), (w("c", 599),)), True, "resident"),
    Row("unlimited max_wait_s: never yields", Turn("a", 80_000),
        EngineResidency((r("a", 80_000),), (w("c", 10**6),)), True, "resident",
        spec(max_wait_s=None)),
    Row("idle residency ends", Turn("s", 40_000),
        EngineResidency((r("a", 80_000, idle_for=60),)), True, "fits", ends=("a",)),
    Row("not idle while in flight", Turn("s", 40_000),
        EngineResidency((r("a", 80_000, idle_for=None),)), False, "full"),
    Row("idle after its own idle_s", Turn("s", 40_000),
        EngineResidency((r("a", 80_000, idle_for=20),)), True, "fits", spec(idle_s=10),
        ends=("a",)),
    Row("an idle one's residency ends as the resident goes", Turn("a", 1),
        EngineResidency((r("a", 1), r("b", 1, idle_for=61))), True, "resident", ends=("b",)),
    Row("lower fit_fraction", Turn("s", 30_000), EngineResidency((r("a", 40_000),)), False,
        "full", spec(fit_fraction=0.5)),
    Row("max_num_seqs x turn_tokens kept free", Turn("s", 40_000),
        EngineResidency((r("a", 40_000),)), False, "full", capacity=Capacity(100_000, 20)),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_admission(row: Row) -> None:
    v = admission(row.turn, row.engine, row.capacity, row.spec, NOW)
    assert (v.admit, v.reason) == (row.admit, row.reason), v.detail
    assert v.reason in (ADMIT_REASONS if v.admit else WAIT_REASONS)
    assert v.ends == row.ends
    assert v.ahead == row.ahead
    assert v.detail


def test_arithmetic_in_the_detail() -> None:
    v = admission(Turn("s", 40_001), EngineResidency((r("a", 46_000),)), KV, spec(), NOW)
    assert "86,001 + 4 x 1,000 = 90,001 > 0.9 x 100,000 KV tokens = 90,000" in v.detail


@pytest.mark.parametrize(
    ("prefixes", "shared", "held"),
    [([], 5, 0), ([10], 20, 10), ([10, 30], 20, 30), ([50, 50, 50], 20, 20 + 3 * 30)],
)
def test_held_tokens(prefixes: list[int], shared: int, held: int) -> None:
    assert held_tokens(prefixes, shared) == held


@pytest.mark.parametrize(
    ("kw", "ahead", "wait"),
    [({}, 0, 60.0), ({}, 3, 240.0), ({}, 20, 600.0), ({"max_wait_s": 30}, 5, 30.0),
     ({"max_wait_s": None}, 4, 300.0)],
)  # fmt: skip
def test_expected_wait(kw: dict[str, Any], ahead: int, wait: float) -> None:
    v = admission(Turn("s", 1), EngineResidency(), KV, spec(), NOW)
    assert expected_wait_s(v, spec(**kw)) == 0.0
    waiting = tuple(w(f"q{i}", 1) for i in range(ahead))
    v = admission(Turn("s", 90_000), EngineResidency((r("a", 1),), waiting), KV, spec(**kw), NOW)
    assert not v.admit and v.ahead == ahead
    assert expected_wait_s(v, spec(**kw)) == wait


def _backend(decode: float | None = None) -> BackendSpec:
    return BackendSpec.model_validate(
        {"url": "http://127.0.0.1:1", "served_model_name": "m", "decode_tokens_per_s": decode}
    )


def test_move_pays_only_with_the_wait() -> None:
    session = SessionView("s", engine="a", prefix_tokens=80_000, turns=3, out_tokens_per_turn=500)
    a, b = _backend(), _backend()
    admits = admission(Turn("s", 80_000), EngineResidency(), KV, spec(), NOW)
    waits = admission(Turn("s", 90_000), EngineResidency((r("x", 1),)), KV, spec(), NOW)
    # Re-prefilling 80,000 tokens at 2,000 tokens/s costs 40 s.
    assert move_instead(session, "a", a, 30.0, [("b", b, admits)], 10) is None
    move = move_instead(session, "a", a, 60.0, [("b", b, admits)], 10)
    assert move is not None and move.to == "b" and move.pays
    assert "60 s of wait on a" in move.explain()
    # An engine where it would wait too is no way out; nor is the held one.
    assert move_instead(session, "a", a, 600.0, [("b", b, waits), ("a", a, admits)], 10) is None


def test_a_place_kept_for_a_retry_blocks_nobody() -> None:
    ghost = Waiter("c", NOW - 900, present=False)
    engine = EngineResidency((r("a", 80_000),), (ghost, w("d", 5)))
    # d goes first while c is away; a does not yield to a session that is not there
    v = admission(Turn("d", 1_000), EngineResidency((), (ghost,)), KV, spec(), NOW)
    assert (v.admit, v.reason) == (True, "fits")
    assert admission(Turn("a", 80_000), engine, KV, spec(), NOW).reason == "resident"
    # back: its place is before d's
    back = EngineResidency((r("a", 80_000),), (Waiter("c", NOW - 900), w("d", 5)))
    assert admission(Turn("d", 1_000), back, KV, spec(), NOW).ahead == 1
    assert admission(Turn("a", 80_000), back, KV, spec(), NOW).reason == "yield"
