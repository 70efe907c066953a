"""Build the policy engine's inputs from a request: the edge between HTTP and the pure engine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from policies.classify import signals_from_body
from policies.engine import canary_bucket
from policies.types import (
    BackendState,
    ContentSignals,
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
    return RequestView(
        endpoint=endpoint, model=model, client=client, stream=body.get("stream") is True,
        fields_set=frozenset(body),
        temperature=float(temperature) if _is_number(temperature) else None,
        min_p=float(min_p) if _is_number(min_p) else None,
        has_logit_bias=bool(body.get("logit_bias")),
        n=n if type(n) is int else 1,
        signals=signals_from_body(body) if endpoint != "embeddings" else _NO_SIGNALS,
        pinned_variant=pinned.decode("latin-1") if pinned else None,
        canary_bucket=canary_bucket(_sticky_key(client, body, headers)), now=now,
        numeric_fields={k: v for k, v in body.items() if _is_number(v)})


def _is_number(value: Any) -> TypeGuard[float]:
    # JSON numbers only: `true` is an int to Python, and a string is never read as a number
    # (proxy/relay/fields.py refuses both before a decision).
    return type(value) in (int, float)


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
