"""Why a session's turn goes or waits (session-aware admission, policies/admission.py), for
`specrouter policy explain --residency` and the admin API's explain alike. Pure.

An engine's residency given by hand (JSON), as the gateway would hold it:

    {"kv_tokens": 813427,                          # else the backend's `kv_tokens`
     "shared_prefix_tokens": 18000,                # else 0 (the policy's value wins when set)
     "residents": [{"key": "s-a", "prefix_tokens": 90000, "idle_s": 12}, ...],  # idle_s null:
                                                                               # a turn in flight
     "waiting": [{"key": "s-b", "waited_s": 140}, ...]}                        # first come first
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from policies.admission import (
    BYTES_PER_TOKEN,
    Capacity,
    EngineResidency,
    Resident,
    Turn,
    Verdict,
    Waiter,
    admission,
    expected_wait_s,
)
from policies.compiled import CompiledPolicy
from policies.types import RequestView, RuleVerdict

RESIDENCY_FIELDS: Final = ("kv_tokens", "shared_prefix_tokens", "residents", "waiting")


def residency_from_json(data: Mapping[str, Any], now: float) -> tuple[EngineResidency, int | None]:
    """(the engine's residency, its KV tokens if given); TypeError names what is wrong."""
    unknown = sorted(set(data) - set(RESIDENCY_FIELDS))
    if unknown:
        raise TypeError(
            f"unknown field(s) {', '.join(unknown)}; known: {', '.join(RESIDENCY_FIELDS)}"
        )
    kv = data.get("kv_tokens")
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1):
        raise TypeError("kv_tokens must be a positive integer")
    residents = []
    for row in _list(data, "residents"):
        idle = row.get("idle_s")
        residents.append(
            Resident(
                _key(row),
                _count(row.get("prefix_tokens", 0), "prefix_tokens"),
                None if idle is None else now - _number(idle, "idle_s"),
            )
        )
    waiting = [
        Waiter(_key(row), now - _number(row.get("waited_s", 0), "waited_s"))
        for row in _list(data, "waiting")
    ]
    shared = _count(data.get("shared_prefix_tokens", 0), "shared_prefix_tokens")
    return EngineResidency(tuple(residents), tuple(waiting), shared), kv


def turn_verdict(
    view: RequestView,
    backend: str,
    policy: CompiledPolicy,
    engine: EngineResidency,
    kv_tokens: int | None,
    prefix_tokens: int,
) -> tuple[Verdict, RuleVerdict]:
    """The turn's admission on `backend` and its explain line (rule `admission`)."""
    spec = policy.document.admission.sessions
    session = view.session
    key = session.key if session is not None else "s-explain"
    if session is not None:
        held = session.prefix_tokens if session.engine in (backend, None) else 0
        prefix_tokens = max(prefix_tokens, held)
    b = policy.backend(backend)
    kv = kv_tokens if kv_tokens is not None else b.kv_tokens
    turn = Turn(key, prefix_tokens, view.keeps_place)
    verdict = admission(turn, engine, Capacity(kv, b.max_concurrency), spec, view.now)
    if session is None and verdict.reason not in ("off", "class"):
        return verdict, RuleVerdict("admission", "admit", "no session: never held")
    word = "admit" if verdict.admit else "wait"
    detail = f"{verdict.reason}: {verdict.detail}"
    if not verdict.admit:
        detail += f"; expected wait {expected_wait_s(verdict, spec):.0f} s"
    return verdict, RuleVerdict("admission", word, detail)


def body_tokens(raw_size: int) -> int:
    """A prompt's tokens estimated from its body's bytes, as the gateway estimates them."""
    return raw_size // BYTES_PER_TOKEN


def _list(data: Mapping[str, Any], name: str) -> list[Mapping[str, Any]]:
    rows = data.get(name, [])
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise TypeError(f"{name} must be a list of objects")
    return rows


def _key(row: Mapping[str, Any]) -> str:
    key = row.get("key")
    if not isinstance(key, str) or not key:
        raise TypeError("each resident and waiting session needs a `key`")
    return key


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"{name} must be a count (an integer >= 0)")
    return value


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise TypeError(f"{name} must be a number >= 0")
    return float(value)
