"""GET /v1/models: each served name with its context window, and the gateway's first-token limit.

A name's window (`max_model_len`, vLLM's field) is the policy's `engine.max_model_len` of each
backend that may answer it (its route's variants, fallbacks among them), else what that
backend's engines report on their own /v1/models (read by the health checker,
proxy/backends/health.py); the smallest, since any of them may serve a turn. None while unknown.

`first_token_limit_s` (beside `data`) is the longest the gateway lets a stream go without output
before it answers with an error: the admission waits its policy allows, then the first-byte
timeout (proxy/relay/keepalive.py). `specrouter connect` sets the agents' own timeouts above it
(docs/connect.md).
"""

from __future__ import annotations

from typing import Any

from policies.compiled import CompiledPolicy
from proxy.backends.engines import EngineTable
from proxy.settings import Settings


def model_list(
    policy: CompiledPolicy, engines: EngineTable, settings: Settings, created: int
) -> dict[str, Any]:
    data: list[dict[str, Any]] = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "specrouter",
            "root": name,
            "parent": None,
            "max_model_len": _window(policy, engines, name),
            "permission": [],
        }
        for name in policy.model_names()
    ]
    return {
        "object": "list",
        "data": data,
        "first_token_limit_s": first_token_limit(policy, settings),
    }


def first_token_limit(policy: CompiledPolicy, settings: Settings) -> float:
    """Admission (the concurrency queue, and a session's hold when on), then the first byte."""
    admission = policy.document.admission
    held = admission.sessions.stream_wait_s if admission.sessions.enabled else 0.0
    return admission.queue_timeout_s + held + settings.first_byte_timeout_s


def _window(policy: CompiledPolicy, engines: EngineTable, name: str) -> int | None:
    route = policy.route_for_model(name)
    if route is None:
        return None
    known = [w for b in route.variants if (w := _backend_window(policy, engines, b))]
    return min(known, default=None)


def _backend_window(policy: CompiledPolicy, engines: EngineTable, name: str) -> int | None:
    backend = policy.backend(name)
    if backend.engine.max_model_len is not None:
        return backend.engine.max_model_len
    reported = [engines.states[u].max_model_len for u in backend.engine_urls if u in engines.states]
    return min((w for w in reported if w is not None), default=None)
