"""What the gateway owns of a vLLM request: the session its KV blocks are tagged with.

vLLM (0.30.0 on) tags the blocks a request stores with a session id, read from the body's
`session_id` first, then `X-Session-ID`, then `vllm_xargs.session_id` (proxy/vllm_wire.py
`engine_session`). The gateway's prefix accounting reads those tags per session, so the id is
the gateway's scoped key (policies/sessions.py), never a client's: one client could otherwise
name another's session, or split its own across ids the gateway does not know.

- A client's body `session_id` is replaced: it is vLLM's documented field for the identity the
  gateway's key already carries, so an SDK that sets it is served, with the gateway's key where
  the request has a session and the release reads the field, and without it otherwise.
- A client's `vllm_xargs` naming `session_id` or `kv_cache_report_mode` is refused (400, the
  API's own error shape): these steer the engine's cache accounting, not sampling; no agent
  sends them, and `kv_cache_report_mode: "full"` makes the engine publish every reused block
  again, which any client could then make the gateway read.
"""

from __future__ import annotations

from typing import Any

from policies.capabilities import EngineKind
from proxy import vllm_wire

Json = dict[str, Any]


def refused(body: Json) -> tuple[str, str] | None:
    """(message, param) for the 400 when the body sets an engine-steering `vllm_xargs` key."""
    xargs = body.get(vllm_wire.XARGS)
    if type(xargs) is not dict:
        return None  # absent, or malformed: the engine's to refuse
    for key in vllm_wire.ENGINE_XARGS:
        if key in xargs:
            return (
                f"`{vllm_wire.XARGS}.{key}` is set by the gateway, not the client",
                vllm_wire.XARGS,
            )
    return None


def session_fields(
    body: Json, endpoint: str, kind: EngineKind, version: str, session: str
) -> tuple[Json, Json]:
    """(body, inject) for the engine: the client's `session_id` left out, the gateway's
    `session` (empty: none) set where this release reads the field."""
    if kind != "vllm":
        return body, {}
    if vllm_wire.SESSION_FIELD in body:
        body = {k: v for k, v in body.items() if k != vllm_wire.SESSION_FIELD}
    if session and vllm_wire.reads_session_field(version, endpoint):
        return body, {vllm_wire.SESSION_FIELD: session}
    return body, {}
