"""The gateway's own error bodies and SSE error events: OpenAI/vLLM-shaped, and on the
Anthropic Messages route Anthropic-shaped (`{"type":"error","error":{"type","message"}}`)."""

from __future__ import annotations

import json
from http import HTTPStatus

import orjson

from proxy import vllm_wire

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    413: "RequestEntityTooLarge",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGateway",
    503: "ServiceUnavailable",
    504: "GatewayTimeout",
}


# Anthropic's error type names, by HTTP status (what its SDKs map to exception classes): vLLM's,
# a 503 (the gateway's own "no variant can take it") named as Anthropic names overload, and a
# 504 (the engine's first byte or silence timed out) as Anthropic names its own timeouts.
_ANTHROPIC_TYPES = {
    **vllm_wire.ANTHROPIC_ERROR_TYPES,
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_type(status: int) -> str:
    return _ANTHROPIC_TYPES.get(status) or (
        "invalid_request_error" if status < 500 else "api_error"
    )


def anthropic_error(status: int, message: str) -> dict[str, object]:
    return {"type": "error", "error": {"type": anthropic_type(status), "message": message}}


def error_type(status: int) -> str:
    return _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "")


def error_body(
    status: int,
    message: str,
    *,
    type_: str | None = None,
    param: str | None = None,
    code: int | str | None = None,
    anthropic: bool = False,
) -> bytes:
    """vLLM's `ErrorResponse` shape: OpenAI's, with an integer `code` by default; Anthropic's
    when `anthropic` (its type names come from the status; `type_`, `param`, `code` go)."""
    if anthropic:
        return orjson.dumps(anthropic_error(status, message))
    return orjson.dumps(
        vllm_wire.error_body(
            message, type_ or error_type(status), status if code is None else code, param
        )
    )


def sse_error_event(
    status: int,
    message: str,
    *,
    type_: str | None = None,
    responses: bool = False,
    messages: bool = False,
) -> bytes:
    """vLLM's mid-stream error form: an error event then `[DONE]` (json.dumps spacing).

    On /v1/responses the stream has typed events and no `[DONE]`: an `error` event ends it.
    On /v1/messages too, with Anthropic's error object (as vLLM's own converter writes it).
    """
    if messages:
        return b"event: error\ndata: " + orjson.dumps(anthropic_error(status, message)) + b"\n\n"
    if responses:
        event = {"type": "error", "code": str(status), "message": message, "param": None}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    return vllm_wire.error_event(message, type_ or error_type(status), status) + vllm_wire.DONE
