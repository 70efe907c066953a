"""Build the policy engine's inputs from a request: the edge between HTTP and the pure engine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.classify import signals_from_body
from policies.engine import canary_bucket
from policies.sessions import session_of
from policies.types import (
    BackendState,
    ContentSignals,
    Endpoint,
    GuardState,
    LiveState,
    RequestView,
    SessionView,
)

_NO_SIGNALS = ContentSignals()


def request_view(body: Mapping[str, Any], endpoint: Endpoint, model: str, client: str,
                 headers: Mapping[bytes, bytes], now: float,
                 session: SessionView | None = None) -> RequestView:
    """`session`: the session table's view of the request's session (policies/sessions.py);
    without one the session is identified here, as new."""
    temperature = body.get("temperature")
    min_p = body.get("min_p")
    n = body.get("n")
    pinned = headers.get(b"x-specrouter-variant")
    if session is None and endpoint != "embeddings":
        sid = session_of(client, body, headers)
        session = None if sid is None else SessionView(sid.key, sid.subagent)
    return RequestView(
        endpoint=endpoint, model=model, client=client, stream=body.get("stream") is True,
        fields_set=frozenset(body),
        temperature=float(temperature) if isinstance(temperature, int | float) else None,
        min_p=float(min_p) if isinstance(min_p, int | float) else None,
        has_logit_bias=bool(body.get("logit_bias")),
        n=n if isinstance(n, int) else 1,
        signals=signals_from_body(body) if endpoint != "embeddings" else _NO_SIGNALS,
        pinned_variant=pinned.decode("latin-1") if pinned else None,
        # Canary stickiness per session (a client serving many users or running many agents
        # spreads them over both arms, each keeps its arm), per client without one.
        canary_bucket=canary_bucket(client if session is None else session.key), now=now,
        numeric_fields={k: v for k, v in body.items()
                        if isinstance(v, int | float) and not isinstance(v, bool)},
        session=session)


def live_state_from_json(data: Mapping[str, Any]) -> LiveState:
    """A LiveState from its JSON form (admin explain, `specrouter policy explain --state`)."""
    backends = {name: BackendState(**dict(fields))
                for name, fields in (data.get("backends") or {}).items()}
    guards = {name: GuardState(**dict(fields))
              for name, fields in (data.get("guards") or {}).items()}
    return LiveState(backends=backends, guards=guards)
