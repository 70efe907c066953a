"""Build the policy engine's inputs from a request: the edge between HTTP and the pure engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, TypeGuard

from policies.agent_signals import NONE as _NO_AGENT
from policies.agent_signals import signals_of
from policies.classify import signals_from_body
from policies.engine import canary_bucket
from policies.sessions import session_of
from policies.types import (
    FIELD_BOUNDS,
    FIELD_NAMES,
    BackendState,
    ContentSignals,
    Decision,
    Endpoint,
    GuardState,
    LiveState,
    RequestView,
    SessionView,
)

_NO_SIGNALS = ContentSignals()


def request_view(
    body: Mapping[str, Any],
    endpoint: Endpoint,
    model: str,
    client: str,
    headers: Mapping[bytes, bytes],
    now: float,
    session: SessionView | None = None,
    *,
    identified: bool = False,
    keeps_place: bool | None = None,
    turn_engine: str | None = None,
    request_class: str | None = None,
    every_signal: bool = True,
) -> RequestView:
    """`session`: the session table's view of the request's session (policies/sessions.py);
    without one the session is identified here, as new, unless the caller already tried
    (`identified`: the request has no session, and fingerprinting it again would find none).
    `keeps_place`: the agent's class keeps the request in place (policies/agent_signals.py),
    read from the headers when not given, as is `request_class` (its fairness level);
    `turn_engine`: a verified turn-state token's engine; `every_signal=False`: the content
    signals read up to the first that decides the class (the request path's way)."""
    temperature = body.get("temperature")
    min_p = body.get("min_p")
    n = body.get("n")
    pinned = headers.get(b"x-specrouter-variant")
    if session is None and not identified and endpoint != "embeddings":
        sid = session_of(client, body, headers)
        session = None if sid is None else SessionView(sid.key, sid.subagent)
    numeric = {k: v for k, v in body.items() if _is_number(v)}
    signals = (
        _NO_AGENT
        if keeps_place is not None and request_class is not None
        else signals_of(client, headers)
    )
    fields_set = set(body)
    for name, spellings in FIELD_NAMES.get(endpoint, {}).items():
        numeric.pop(name, None)
        fields_set.discard(name)
        present = _first_present(body, spellings)
        if present is not None:
            fields_set.add(name)
            value = body[present]
            if _is_number(value):
                numeric[name] = value
    return RequestView(
        endpoint=endpoint,
        model=model,
        client=client,
        stream=body.get("stream") is True,
        fields_set=frozenset(fields_set),
        temperature=float(temperature) if _is_number(temperature) else None,
        min_p=float(min_p) if _is_number(min_p) else None,
        has_logit_bias=bool(body.get("logit_bias")),
        n=n if type(n) is int else 1,
        signals=(
            signals_from_body(body, every=every_signal) if endpoint != "embeddings" else _NO_SIGNALS
        ),
        pinned_variant=pinned.decode("latin-1") if pinned else None,
        # Canary stickiness per session (a client serving many users or running many agents
        # spreads them over both arms, each keeps its arm), per client without one.
        canary_bucket=canary_bucket(client if session is None else session.key),
        now=now,
        numeric_fields=numeric,
        session=session,
        keeps_place=signals.keeps_place if keeps_place is None else keeps_place,
        turn_engine=turn_engine,
        request_class=signals.request_class if request_class is None else request_class,
    )


def _first_present(body: Mapping[str, Any], spellings: tuple[str, ...]) -> str | None:
    return next((f for f in spellings if body.get(f) is not None), None)


def for_body(decision: Decision, endpoint: Endpoint, body: Mapping[str, Any]) -> Decision:
    """The decision with its injected fields spelled as this API spells them (the field the
    client's value came from, for a clamp) and held within the API's own bounds."""
    names = FIELD_NAMES.get(endpoint, {})
    bounds = FIELD_BOUNDS.get(endpoint, {})
    if not decision.inject or not (names.keys() | bounds.keys()) & decision.inject.keys():
        return decision
    inject: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in decision.inject.items():
        spellings = names.get(key)
        field = key
        if spellings is not None:
            present = _first_present(body, spellings)
            field = present or (key if key in spellings else spellings[0])
        if key in bounds and isinstance(value, int | float) and not isinstance(value, bool):
            low, high = bounds[key]
            value = min(max(value, low), high)
        inject[field], spelled[key] = value, field
    return replace(
        decision,
        inject=inject,
        defaults_applied=tuple(spelled[k] for k in decision.defaults_applied),
        clamped=tuple(spelled.get(k, k) for k in decision.clamped),
    )


def _is_number(value: Any) -> TypeGuard[float]:
    # JSON numbers only: `true` is an int to Python, and a string is never read as a number
    # (proxy/relay/fields.py refuses both before a decision).
    return type(value) in (int, float)


def live_state_from_json(data: Mapping[str, Any]) -> LiveState:
    """A LiveState from its JSON form (admin explain, `specrouter policy explain --state`)."""
    backends = {
        name: BackendState(**dict(fields)) for name, fields in (data.get("backends") or {}).items()
    }
    guards = {
        name: GuardState(**dict(fields)) for name, fields in (data.get("guards") or {}).items()
    }
    return LiveState(backends=backends, guards=guards)
