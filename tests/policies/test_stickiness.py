"""Stickiness in decide(): one row per case, (session, rules, live state) -> backend, reason.

Backends: `a` (deep speculative, 100 tokens/s per sequence), `b` (shallow, 60 tokens/s, the
fallback, priority scheduling), `p` (plain, no decode rate stated). The load rule sends a
request to `b` once `a` holds two sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from policies.compiled import CompiledPolicy
from policies.engine import decide
from policies.schema import validate_policy
from policies.stickiness import move_cost
from policies.types import BackendState, GuardState, LiveState, RequestView, SessionView

LOAD = {"name": "quiet", "kind": "load", "use": "a", "max_in_flight": 2, "otherwise": "b"}
GUARD = {"name": "a-acceptance", "kind": "acceptance_guard", "variant": "a", "below": 2.0}
TOWARD_P = {"name": "to-p", "kind": "client", "clients": ["agent"], "use": "p"}


def policy(rules: list[dict[str, Any]], **sessions: Any) -> CompiledPolicy:
    return CompiledPolicy(
        validate_policy(
            {
                "schema": 1,
                "backends": {
                    "a": {
                        "url": "http://127.0.0.1:1",
                        "served_model_name": "m",
                        "decode_tokens_per_s": 100.0,
                        "speculative": {"method": "dflash", "num_speculative_tokens": 7},
                    },
                    "b": {
                        "url": "http://127.0.0.1:2",
                        "served_model_name": "m",
                        "priority_scheduling": True,
                        "decode_tokens_per_s": 60.0,
                        "speculative": {"method": "mtp", "num_speculative_tokens": 3},
                    },
                    "p": {"url": "http://127.0.0.1:3", "served_model_name": "m"},
                },
                "routes": {
                    "coder": {
                        "models": ["coder"],
                        "variants": ["a", "b", "p"],
                        "fallback": "b",
                        "rules": rules,
                    }
                },
                "clients": [{"name": "agent", "key_sha256": "0" * 64, "priority": 3}],
                "sessions": sessions,
            }
        )
    )


def session(engine: str | None, **kw: Any) -> SessionView:
    return SessionView("s-test", engine=engine, **kw)


def state(a_in_flight: int = 0, **health: Any) -> LiveState:
    backends = {n: BackendState(health=health.get(n, "up")) for n in ("a", "b", "p")}
    backends["a"] = BackendState(health=health.get("a", "up"), in_flight=a_in_flight)
    tripped = {"a": GuardState(tripped=True)} if health.get("tripped") else {}
    return LiveState(backends=backends, guards=tripped)


@dataclass
class Row:
    id: str
    rules: list[dict[str, Any]]
    session: SessionView | None
    live: LiveState
    backend: str
    reason: str


BUSY = state(a_in_flight=2)
ROWS = [
    Row("no-session-rules-decide", [LOAD], None, BUSY, "b", "quiet"),
    Row("new-session-rules-decide", [LOAD], session(None), BUSY, "b", "quiet"),
    Row(
        "held-agrees-reason-stands", [LOAD], session("a", prefix_tokens=5000), state(), "a", "quiet"
    ),
    # a is busy, the load rule says b: b decodes slower, no gain, the session stays
    Row(
        "busy-stays",
        [LOAD],
        session("a", prefix_tokens=5000, out_tokens_per_turn=500),
        BUSY,
        "a",
        "session",
    ),
    # held on b, the rules say a (faster): 10 turns x 500 tokens x (1/60 - 1/100) = 33 s gain
    Row(
        "move-pays-short-prefix",
        [LOAD],
        session("b", prefix_tokens=20_000, out_tokens_per_turn=500),
        state(),
        "a",
        "session-move",
    ),
    # ... against 100 K tokens / 2000 tokens/s = 50 s of prefill: stays
    Row(
        "move-does-not-pay-long-prefix",
        [LOAD],
        session("b", prefix_tokens=100_000, out_tokens_per_turn=500),
        state(),
        "b",
        "session",
    ),
    # the same session late in its life: 1 turn left, 3.3 s < 10 s
    Row(
        "late-in-session-stays",
        [LOAD],
        session("b", prefix_tokens=20_000, turns=9, out_tokens_per_turn=500),
        state(),
        "b",
        "session",
    ),
    Row(
        "mean-turns-from-table",
        [LOAD],
        session("b", prefix_tokens=20_000, turns=2, out_tokens_per_turn=500, mean_turns=3.0),
        state(),
        "b",
        "session",
    ),
    Row(
        "no-decode-rate-no-move",
        [TOWARD_P],
        session("a", prefix_tokens=10, out_tokens_per_turn=500),
        state(),
        "a",
        "session",
    ),
    Row(
        "held-down-moves", [LOAD], session("a", prefix_tokens=5000), state(a="down"), "b", "health"
    ),
    Row(
        "held-starting-moves",
        [LOAD],
        session("a", prefix_tokens=5000),
        state(a="starting"),
        "b",
        "health",
    ),
    Row(
        "held-tripped-moves",
        [GUARD, LOAD],
        session("a", prefix_tokens=5000),
        state(tripped=True),
        "b",
        "a-acceptance",
    ),
    Row(
        "held-not-in-route-is-new", [LOAD], session("gone", prefix_tokens=5000), BUSY, "b", "quiet"
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_stickiness(row: Row) -> None:
    view = RequestView(endpoint="chat", model="coder", client="agent", session=row.session)
    d = decide(view, row.live, policy(row.rules))
    assert (d.backend, d.reason) == (row.backend, row.reason)


def test_sticky_off_lets_the_rules_decide() -> None:
    view = RequestView(
        endpoint="chat", model="coder", client="agent", session=session("a", prefix_tokens=5000)
    )
    assert decide(view, BUSY, policy([LOAD], sticky=False)).backend == "b"


def test_pinned_beats_the_session() -> None:
    p = CompiledPolicy(
        validate_policy(
            {
                **policy([LOAD]).document.to_data(),
                "clients": [{"name": "agent", "key_sha256": "0" * 64, "may_pin": True}],
            }
        )
    )
    view = RequestView(
        endpoint="chat", model="coder", client="agent", pinned_variant="p", session=session("a")
    )
    assert (decide(view, state(), p).backend, decide(view, state(), p).reason) == ("p", "pinned")


def test_subagent_priority_on_priority_engines_only() -> None:
    sub = RequestView(
        endpoint="chat",
        model="coder",
        client="agent",
        session=SessionView("s-sub", subagent=True, engine="b"),
    )
    main = RequestView(
        endpoint="chat", model="coder", client="agent", session=SessionView("s-main", engine="b")
    )
    p = policy([], subagent_priority=10)
    assert decide(sub, state(), p).priority == 10
    assert decide(main, state(), p).priority == 3
    assert decide(sub, state(), policy([])).priority == 3  # unset: the client's own
    on_a = RequestView(
        endpoint="chat",
        model="coder",
        client="agent",
        session=SessionView("s-sub", subagent=True, engine="a"),
    )
    assert decide(on_a, state(), p).priority is None  # a runs FCFS


def test_explain_shows_the_arithmetic() -> None:
    view = RequestView(
        endpoint="chat",
        model="coder",
        client="agent",
        session=session("b", prefix_tokens=100_000, out_tokens_per_turn=500),
    )
    d = decide(view, state(), policy([LOAD]), explain=True)
    verdict = next(v for v in d.verdicts if v.rule == "session")
    assert verdict.verdict == "stay"
    assert verdict.detail == (
        "b -> a: gain 10 turns x 500 tokens = 33.33 s <= re-prefill "
        "100000 tokens / 2000 tokens/s = 50.00 s"
    )
    assert d.verdicts[-1].rule == "result"


def test_move_cost_numbers() -> None:
    p = policy([])
    cost = move_cost(
        session("b", prefix_tokens=4000, out_tokens_per_turn=300, turns=4),
        "b",
        p.backend("b"),
        "a",
        p.backend("a"),
        10.0,
    )
    assert cost.remaining_turns == 6
    assert cost.gain_s == pytest.approx(6 * 300 * (1 / 60 - 1 / 100))
    assert cost.cost_s == pytest.approx(2.0) and cost.pays
