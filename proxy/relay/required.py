"""Anthropic's required Messages field the shared field list cannot require: `max_tokens`.

`model` and `messages` are required on both Messages paths (fields.py); `max_tokens` only on
/v1/messages (count_tokens takes none), so it is checked here, by path. Without this check
vLLM answers a missing one itself, in OpenAI's shape with a Python dict in its message, which
Anthropic's SDKs do not read: the gateway refuses it in Anthropic's shape instead, a deliberate
deviation from relaying vLLM's bytes (docs/byte-exactness.md). Its value's type is fields.py's
check; its range, like every other engine-made 400, stays vLLM's to answer.
"""

from __future__ import annotations

from typing import Any

from proxy.relay.body_shape import Problem

MESSAGES_PATH = "/v1/messages"


def missing(path: str, body: dict[str, Any]) -> Problem | None:
    """(message, param) for the 400 when `path` requires a field the body lacks, else None."""
    if path == MESSAGES_PATH and body.get("max_tokens") is None:
        return "`max_tokens` is required and must be an integer", "max_tokens"
    return None
