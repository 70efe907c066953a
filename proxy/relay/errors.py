"""OpenAI/vLLM-shaped error bodies and SSE error events."""

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


def error_type(status: int) -> str:
    return _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "")


def error_body(
    status: int,
    message: str,
    *,
    type_: str | None = None,
    param: str | None = None,
    code: int | str | None = None,
) -> bytes:
    """vLLM's `ErrorResponse` shape: OpenAI's, with an integer `code` by default."""
    return orjson.dumps(vllm_wire.error_body(
        message, type_ or error_type(status), status if code is None else code, param))


def sse_error_event(status: int, message: str, *, type_: str | None = None,
                    responses: bool = False) -> bytes:
    """vLLM's mid-stream error form: an error event then `[DONE]` (json.dumps spacing).

    On /v1/responses the stream has typed events and no `[DONE]`: an `error` event ends it.
    """
    if responses:
        event = {"type": "error", "code": str(status), "message": message, "param": None}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    return vllm_wire.error_event(message, type_ or error_type(status), status) + vllm_wire.DONE
