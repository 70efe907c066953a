"""The public API's OpenAPI description, served at /openapi.json on the public listener.

Generated, not written: one operation per path of the public app's route table
(`proxy.relay.forward.ENDPOINTS`), its request body from the endpoint's fields
(proxy/relay/fields.py, which the gateway's own input checks read too). It describes the API as the gateway accepts it: every generation endpoint takes a JSON object
with a string `model`; the gateway itself reads only a few fields (`model`, `stream`,
`stream_options`, `n`, the sampling parameters its policy looks at) and passes every other field
through to the backend untouched, so request schemas allow additional properties. The fields
listed per endpoint are those the backend (vLLM) validates; a body that breaks them gets the
backend's 400, relayed. Errors have OpenAI's shape, `{"error": {"message", "type", "param",
"code"}}`, whether the gateway or the backend answers.

`tests/relay/test_hostile_openapi.py` fuzzes the running gateway from the description it serves.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from policies.types import Endpoint
from proxy.relay.fields import Schema, ref, request_schema
from proxy.relay.openapi_schemas import (
    ANTHROPIC_ERROR,
    CHAT_COMPLETION,
    COMPLETION,
    EMBEDDING_LIST,
    ERROR,
    GENERATION_ERRORS,
    JSON,
    MESSAGE,
    MODEL_LIST,
    OBJECT,
    READY,
    RESPONSE,
    ROUTED_HEADERS,
    UNAUTHORIZED,
    with_anthropic_errors,
)

_SSE = "text/event-stream"


_REQUEST_HEADERS: list[Schema] = [
    {
        "name": "X-Request-Id",
        "in": "header",
        "required": False,
        "description": "Correlates the request in the gateway's log and the backend's.",
        "schema": {"type": "string"},
    },
    {
        "name": "X-Specrouter-Variant",
        "in": "header",
        "required": False,
        "description": "Pin a variant of the route (only for clients with `may_pin`).",
        "schema": {"type": "string"},
    },
    {
        "name": "X-Session-ID",
        "in": "header",
        "required": False,
        "description": "Keeps canary assignment (and engine affinity) sticky per session.",
        "schema": {"type": "string"},
    },
]


# A text/event-stream body is described event by event (as OpenAPI 3.2's `itemSchema` does).
_SSE_EVENT: Schema = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "event": {"type": "string"},
        "data": {"type": "string", "description": "A JSON object, or `[DONE]`."},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
}


def _generation(
    operation_id: str,
    summary: str,
    request: str,
    response: str,
    *,
    streams: bool,
    stream_note: str = "",
) -> Schema:
    ok_content: dict[str, Schema] = {JSON: {"schema": ref(response)}}
    if streams:
        ok_content[_SSE] = {
            "schema": {
                **_SSE_EVENT,
                "description": "One server-sent event, as the backend wrote it. A stream that fails "
                "after it started ends with an error event" + stream_note + ", never silently.",
            }
        }
    return {
        "post": {
            "summary": summary,
            "operationId": operation_id,
            "parameters": _REQUEST_HEADERS,
            "requestBody": {"required": True, "content": {JSON: {"schema": ref(request)}}},
            "responses": {
                "200": {
                    "description": "The backend's answer, relayed byte for byte (the model "
                    "renamed to the one requested).",
                    "headers": ROUTED_HEADERS,
                    "content": ok_content,
                },
                **GENERATION_ERRORS,
            },
        }
    }


_CHAT_SSE = ' (`data: {"error": {...}}` then `data: [DONE]`)'
_RESPONSES_SSE = " (`event: error`)"
_MESSAGES_SSE = " (`event: error`, Anthropic's error object)"


@dataclass(frozen=True, slots=True)
class _Operation:
    operation_id: str
    summary: str
    request: str  # component names
    response: str
    example: Schema
    stream_note: str | None  # None: the endpoint does not stream


_OPERATIONS: dict[Endpoint, _Operation] = {
    "chat": _Operation(
        "createChatCompletion",
        "Chat completion",
        "ChatCompletionRequest",
        "ChatCompletion",
        {"model": "coder", "max_tokens": 16, "messages": [{"role": "user", "content": "Hello"}]},
        _CHAT_SSE,
    ),
    "completions": _Operation(
        "createCompletion",
        "Text completion",
        "CompletionRequest",
        "Completion",
        {"model": "coder", "prompt": "def parse(", "max_tokens": 16},
        _CHAT_SSE,
    ),
    "embeddings": _Operation(
        "createEmbedding",
        "Embeddings",
        "EmbeddingRequest",
        "EmbeddingList",
        {"model": "embedding-small", "input": ["a", "b"]},
        None,
    ),
    "responses": _Operation(
        "createResponse",
        "Responses API",
        "ResponsesRequest",
        "Response",
        {"model": "coder", "input": "Hello", "max_output_tokens": 16},
        _RESPONSES_SSE,
    ),
    "messages": _Operation(
        "createMessage",
        "Anthropic Messages API (the gateway's own errors "
        "in Anthropic's shape; `x-api-key` or bearer auth)",
        "MessagesRequest",
        "Message",
        {"model": "coder", "max_tokens": 16, "messages": [{"role": "user", "content": "Hello"}]},
        _MESSAGES_SSE,
    ),
}
# A path whose operation differs from its API kind's (same request fields).
_PATH_OPERATIONS: dict[str, _Operation] = {
    "/v1/messages/count_tokens": _Operation(
        "countMessageTokens",
        "Anthropic Messages: count the prompt's tokens",
        "MessagesRequest",
        "MessageTokenCount",
        _OPERATIONS["messages"].example,
        None,
    )
}

_OTHER_PATHS: dict[str, Schema] = {
    "/v1/models": {
        "get": {
            "summary": "The model names the policy serves",
            "operationId": "listModels",
            "responses": {
                "200": {
                    "description": "Every name a route accepts in `model`.",
                    "content": {JSON: {"schema": ref("ModelList")}},
                },
                "401": UNAUTHORIZED,
            },
        }
    },
    "/healthz": {
        "get": {
            "summary": "Liveness: the gateway process answers",
            "operationId": "healthz",
            "security": [],
            "responses": {
                "200": {
                    "description": "Alive.",
                    "content": {
                        JSON: {
                            "schema": {
                                "type": "object",
                                "required": ["status"],
                                "properties": {"status": {"type": "string", "enum": ["ok"]}},
                            }
                        }
                    },
                }
            },
        }
    },
    "/readyz": {
        "get": {
            "summary": "Readiness: every route has a variant that is up",
            "operationId": "readyz",
            "security": [],
            "responses": {
                "200": {"description": "Ready.", "content": {JSON: {"schema": ref("Ready")}}},
                "503": {
                    "description": "A route has no variant up, or the gateway is draining.",
                    "content": {JSON: {"schema": ref("Ready")}},
                },
            },
        }
    },
    "/openapi.json": {
        "get": {
            "summary": "This description",
            "operationId": "openapi",
            "security": [],
            "responses": {
                "200": {
                    "description": "OpenAPI 3 document.",
                    "content": {JSON: {"schema": OBJECT}},
                }
            },
        }
    },
}


def build_spec(routes: Mapping[str, Endpoint]) -> dict[str, Any]:
    """The document for a route table (path -> endpoint, as the public app routes them)."""
    paths: dict[str, Schema] = {}
    requests: dict[str, Schema] = {}
    for path, endpoint in routes.items():
        op = _PATH_OPERATIONS.get(path) or _OPERATIONS[endpoint]
        paths[path] = _generation(
            op.operation_id,
            op.summary,
            op.request,
            op.response,
            streams=op.stream_note is not None,
            stream_note=op.stream_note or "",
        )
        if endpoint == "messages":
            paths[path] = with_anthropic_errors(paths[path])
        requests[op.request] = {**request_schema(endpoint), "example": op.example}
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "specrouter public API",
            "version": "1",
            "description": "OpenAI-compatible API of the specrouter gateway in front of vLLM. "
            "Every request body field the gateway does not act on is passed to "
            "the backend unchanged. Before any route is read, a request whose "
            "head is too slow or too large is answered 408 or 431 with an empty "
            "body and the connection closed; a request that is not HTTP gets 400.",
        },
        "security": [{"bearerAuth": []}],
        "paths": {**paths, **_OTHER_PATHS},
        "components": {
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A client key of the policy (stored there as its SHA-256).",
                }
            },
            "schemas": {
                "Error": ERROR,
                "AnthropicError": ANTHROPIC_ERROR,
                "ChatMessage": MESSAGE,
                **requests,
                "ChatCompletion": CHAT_COMPLETION,
                "Completion": COMPLETION,
                "EmbeddingList": EMBEDDING_LIST,
                "Response": RESPONSE,
                "Message": OBJECT,
                "MessageTokenCount": OBJECT,
                "ModelList": MODEL_LIST,
                "Ready": READY,
            },
        },
    }


@functools.cache
def spec() -> dict[str, Any]:
    """The public app's document, built once."""
    # Read late: proxy/relay/app.py imports this module, and owns the route table.
    from proxy.relay.forward import ENDPOINTS

    return build_spec(ENDPOINTS)


@functools.cache
def spec_bytes() -> bytes:
    return orjson.dumps(spec())
