"""Pure request-side edits: what the gateway sends upstream for a client's body.

The body is parsed once with orjson into a dict; only top-level keys the decision names are
set, so every field the gateway does not know passes through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from policies.capabilities import EngineKind, capabilities
from policies.types import Endpoint
from proxy.relay.body_shape import Encoded

# Endpoints whose streams carry vLLM's `stream_options` usage frames.
USAGE_ENDPOINTS: frozenset[Endpoint] = frozenset({"chat", "completions"})


@dataclass(frozen=True, slots=True)
class UsagePlan:
    """How the relay treats usage frames for one stream (see measure.StreamFilter)."""

    injected: bool = False
    strip_usage: bool = False
    drop_usage_chunk: bool = False


def plan_usage(body: dict[str, Any], endpoint: Endpoint, backend_kind: EngineKind) -> UsagePlan:
    """Ask vLLM for per-chunk usage when the client did not, so tokens per step are measured.

    Only for n == 1: with several choices vLLM moves `system_fingerprint` per choice and the
    per-request spec metrics are not reported anyway.
    """
    if endpoint not in USAGE_ENDPOINTS or body.get("stream") is not True:
        return UsagePlan()
    # Only an engine that honours continuous usage is asked for it (policies/capabilities.py);
    # llama.cpp sends its `timings` unasked, so its request goes as the client sent it.
    if not capabilities(backend_kind).continuous_usage or body.get("n", 1) not in (1, None):
        return UsagePlan()
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        return UsagePlan()  # malformed: let the backend answer its own 400
    opts = opts or {}
    include = opts.get("include_usage") is True
    continuous = include and opts.get("continuous_usage_stats") is True
    if continuous:
        return UsagePlan()
    return UsagePlan(injected=True, strip_usage=True, drop_usage_chunk=not include)


def upstream_body(
    body: dict[str, Any],
    inject: dict[str, Any],
    served_model: str,
    usage: UsagePlan,
    encoded: Encoded | None = None,
) -> bytes:
    """The body for the engine, as one bytes object (`upstream_pieces` joined)."""
    return b"".join(upstream_pieces(body, inject, served_model, usage, encoded))


def upstream_pieces(
    body: dict[str, Any],
    inject: dict[str, Any],
    served_model: str,
    usage: UsagePlan,
    encoded: Encoded | None = None,
) -> list[bytes | memoryview]:
    """The body for the engine, as the pieces to write one after the other: exactly the bytes
    `orjson.dumps` writes for the edited body, but a container already serialised (a
    `memoryview` in `body`, put there by `Exchange.release_tree`, or one of `encoded`, the
    containers `check_fields` serialised, wherever the body still holds the very value
    checked) goes out as that view, not copied into a new body."""
    out = dict(body)
    out.update(inject)
    out["model"] = served_model
    if usage.injected:
        opts = dict(out.get("stream_options") or {})
        opts["include_usage"] = True
        opts["continuous_usage_stats"] = True
        out["stream_options"] = opts
    for name, (value, json) in (encoded or {}).items():
        if out.get(name) is value:
            out[name] = json
    pieces: list[bytes | memoryview] = []
    small = bytearray(b"{")
    for i, (key, value) in enumerate(out.items()):
        if i:
            small += b","
        small += orjson.dumps(key)
        small += b":"
        if type(value) is memoryview:
            pieces += (bytes(small), value)
            small = bytearray()
        else:
            small += orjson.dumps(value)
    small += b"}"
    pieces.append(bytes(small))
    return pieces
