"""Build the policy engine's inputs from a request: the edge between HTTP and the pure engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from policies.classify import signals_from_body
from policies.engine import canary_bucket
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
)

_NO_SIGNALS = ContentSignals()


def request_view(body: Mapping[str, Any], endpoint: Endpoint, model: str, client: str,
                 headers: Mapping[bytes, bytes], now: float) -> RequestView:
    temperature = body.get("temperature")
    min_p = body.get("min_p")
    n = body.get("n")
    pinned = headers.get(b"x-specrouter-variant")
    numeric = {k: v for k, v in body.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    fields_set = set(body)
    for name, spellings in FIELD_NAMES.get(endpoint, {}).items():
        numeric.pop(name, None)
        fields_set.discard(name)
        present = _first_present(body, spellings)
        if present is not None:
            fields_set.add(name)
            value = body[present]
            if isinstance(value, int | float) and not isinstance(value, bool):
                numeric[name] = value
    return RequestView(
        endpoint=endpoint, model=model, client=client, stream=body.get("stream") is True,
        fields_set=frozenset(fields_set),
        temperature=float(temperature) if isinstance(temperature, int | float) else None,
        min_p=float(min_p) if isinstance(min_p, int | float) else None,
        has_logit_bias=bool(body.get("logit_bias")),
        n=n if isinstance(n, int) else 1,
        signals=signals_from_body(body) if endpoint != "embeddings" else _NO_SIGNALS,
        pinned_variant=pinned.decode("latin-1") if pinned else None,
        canary_bucket=canary_bucket(_sticky_key(client, body, headers)), now=now,
        numeric_fields=numeric)


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
    return replace(decision, inject=inject,
                   defaults_applied=tuple(spelled[k] for k in decision.defaults_applied),
                   clamped=tuple(spelled.get(k, k) for k in decision.clamped))


def _sticky_key(client: str, body: Mapping[str, Any], headers: Mapping[bytes, bytes]) -> str:
    """Canary stickiness: per client, and per end user or session when the client says which
    (OpenAI's `user` field, vLLM's `X-Session-ID` header), so one agent serving many users
    spreads them over both arms while each user keeps the same one."""
    user = body.get("user")
    session = headers.get(b"x-session-id")
    if isinstance(user, str) and user:
        return f"{client}/{user}"
    if session:
        return f"{client}/{session.decode('latin-1')}"
    return client


def live_state_from_json(data: Mapping[str, Any]) -> LiveState:
    """A LiveState from its JSON form (admin explain, `specrouter policy explain --state`)."""
    backends = {name: BackendState(**dict(fields))
                for name, fields in (data.get("backends") or {}).items()}
    guards = {name: GuardState(**dict(fields))
              for name, fields in (data.get("guards") or {}).items()}
    return LiveState(backends=backends, guards=guards)
