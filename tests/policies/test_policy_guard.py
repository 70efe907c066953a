"""The acceptance guard as scripted sequences: (acceptance reading, time) -> expected state.

Rule: trip below 2.8 held 30 s; recover at >= 3.3 held 20 s; traffic back on trial after 60 s.
Each step is (acceptance or None, now, expected) with expected "ok", "low" (below, not yet
tripped), "tripped", "trial" or "trial-high" (on trial, recovery clock running).
"""

from __future__ import annotations

from typing import Any

import pytest

from policies.guard import OK, advance
from policies.schema import GuardRule
from policies.types import GuardState

RULE: dict[str, Any] = {
    "name": "g",
    "kind": "acceptance_guard",
    "variant": "a",
    "below": 2.8,
    "for_s": 30,
    "recover_above": 3.3,
    "recover_for_s": 20,
    "probe_after_s": 60,
}

Step = tuple[float | None, float, str]

TRIP: list[Step] = [(2.0, 0, "low"), (2.0, 30, "tripped")]  # tripped_at = 30

SEQUENCES: dict[str, tuple[dict[str, Any], list[Step]]] = {
    "steady-ok": ({}, [(4.0, 0, "ok"), (3.0, 10, "ok"), (2.8, 20, "ok")]),
    "trips-exactly-at-for-s": ({}, [(2.0, 0, "low"), (2.0, 29.9, "low"), (2.0, 30, "tripped")]),
    "threshold-itself-is-not-low": ({}, [(2.8, 0, "ok"), (2.8, 100, "ok")]),
    "a-dip-restarts-the-clock": (
        {},
        [
            (2.0, 0, "low"),
            (3.0, 10, "ok"),
            (2.0, 20, "low"),
            (2.0, 49.9, "low"),
            (2.0, 50, "tripped"),
        ],
    ),
    "no-reading-holds": ({}, [(2.0, 0, "low"), (None, 15, "low"), (2.0, 30, "tripped")]),
    "no-reading-when-ok": ({}, [(None, 0, "ok"), (None, 1000, "ok")]),
    "zero-for-s-trips-at-once": ({"for_s": 0}, [(2.7, 5, "tripped")]),
    "recovers-with-hysteresis": (
        {},
        [
            *TRIP,
            (3.0, 35, "tripped"),
            (3.3, 40, "tripped"),
            (3.3, 59.9, "tripped"),
            (3.3, 60, "ok"),
        ],
    ),
    "band-restarts-recovery": (
        {},
        [
            *TRIP,
            (3.5, 35, "tripped"),
            (3.0, 45, "tripped"),
            (3.5, 50, "tripped"),
            (3.5, 69.9, "tripped"),
            (3.5, 70, "ok"),
        ],
    ),
    "no-reading-keeps-recovery-clock": (
        {},
        [*TRIP, (3.5, 35, "tripped"), (None, 45, "tripped"), (3.5, 55, "ok")],
    ),
    "trial-after-probe-delay": (
        {},
        [*TRIP, (None, 89.9, "tripped"), (None, 90, "trial"), (None, 200, "trial")],
    ),
    "failed-trial-trips-at-once": (
        {},
        [
            *TRIP,
            (None, 90, "trial"),
            (2.0, 91, "tripped"),
            (None, 150.9, "tripped"),
            (None, 151, "trial"),
        ],
    ),
    "successful-trial": (
        {},
        [
            *TRIP,
            (None, 90, "trial"),
            (3.4, 95, "trial-high"),
            (3.4, 114.9, "trial-high"),
            (3.4, 115, "ok"),
            (2.0, 116, "low"),
        ],
    ),
    "trial-in-band-stays-on-trial": (
        {},
        [
            *TRIP,
            (None, 90, "trial"),
            (3.4, 95, "trial-high"),
            (3.0, 100, "trial"),
            (3.0, 500, "trial"),
            (2.79, 501, "tripped"),
        ],
    ),
    "trial-keeps-recovery-clock-from-tripped": (
        {},
        [*TRIP, (3.5, 85, "tripped"), (None, 90, "trial-high"), (3.5, 105, "ok")],
    ),
    "probe-disabled-waits-for-evidence": (
        {"probe_after_s": None},
        [*TRIP, (None, 10_000, "tripped"), (3.3, 10_001, "tripped"), (3.3, 10_021, "ok")],
    ),
    "recover-defaults-to-trip-band": (
        {"recover_above": None, "recover_for_s": None},
        [*TRIP, (2.8, 40, "tripped"), (2.8, 69.9, "tripped"), (2.8, 70, "ok")],
    ),
}


def _label(state: GuardState) -> str:
    if state.tripped:
        return "tripped"
    if state.probing:
        return "trial" if state.high_since is None else "trial-high"
    return "ok" if state.low_since is None else "low"


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_guard_sequence(name: str) -> None:
    overrides, steps = SEQUENCES[name]
    rule = GuardRule.model_validate({**RULE, **overrides})
    state = OK
    for i, (acceptance, now, expected) in enumerate(steps):
        state = advance(state, acceptance, float(now), rule)
        assert _label(state) == expected, f"step {i}: ({acceptance}, {now})"


def test_tripped_state_records_when() -> None:
    rule = GuardRule.model_validate(RULE)
    state = advance(advance(OK, 1.0, 5.0, rule), 1.0, 40.0, rule)
    assert state == GuardState(tripped=True, low_since=5.0, tripped_at=40.0)


def test_tripped_without_timestamp_starts_probe_clock() -> None:
    # A state built by hand (or by an older gateway) with no tripped_at: the clock starts now.
    rule = GuardRule.model_validate(RULE)
    state = advance(GuardState(tripped=True), None, 100.0, rule)
    assert state.tripped and state.tripped_at == 100.0
