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

_JSON = "application/json"
_SSE = "text/event-stream"


def _nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


# -- request bodies: their fields are in proxy/relay/fields.py -------------------------------------

_MESSAGE: Schema = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "example": "user"},
        "content": _nullable(
            {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "object", "additionalProperties": True}},
                ]
            }
        ),
    },
    "additionalProperties": True,
}

# -- responses ---------------------------------------------------------------------------------------

_ERROR: Schema = {
    "type": "object",
    "description": "OpenAI's (and vLLM's) error shape. `code` is the HTTP status as an integer, "
    "or a string code such as `invalid_api_key`.",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": _nullable({"type": "string"}),
                "code": _nullable({"anyOf": [{"type": "integer"}, {"type": "string"}]}),
            },
            "additionalProperties": True,
        }
    },
    "additionalProperties": True,
}

_OBJECT: Schema = {"type": "object", "additionalProperties": True}


def _completion_object(kind: str) -> Schema:
    """A chat.completion or text_completion body: the keys clients read, the rest open."""
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "enum": [kind]},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "items": _OBJECT},
            "usage": _nullable(_OBJECT),
        },
        "additionalProperties": True,
    }


_CHAT_COMPLETION = _completion_object("chat.completion")
_COMPLETION = _completion_object("text_completion")

_EMBEDDING_LIST: Schema = {
    "type": "object",
    "required": ["object", "data", "model"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "embedding"],
                "properties": {
                    "index": {"type": "integer"},
                    "embedding": {
                        "oneOf": [
                            {"type": "array", "items": {"type": "number"}},
                            {"type": "string"},
                        ]
                    },
                },
                "additionalProperties": True,
            },
        },
        "model": {"type": "string"},
        "usage": _nullable(_OBJECT),
    },
    "additionalProperties": True,
}

_RESPONSE: Schema = {
    "type": "object",
    "required": ["id", "object", "status"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["response"]},
        "status": {"type": "string"},
        "output": {"type": "array", "items": _OBJECT},
    },
    "additionalProperties": True,
}

_MODEL_LIST: Schema = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "object", "created", "owned_by"],
                "properties": {
                    "id": {"type": "string"},
                    "object": {"type": "string", "enum": ["model"]},
                    "created": {"type": "integer"},
                    "owned_by": {"type": "string"},
                },
                "additionalProperties": True,
            },
        },
    },
}

_READY: Schema = {
    "type": "object",
    "required": ["ready"],
    "properties": {"ready": {"type": "boolean"}},  # per route: the admin's /admin/readyz
}

_HEADERS_OUT: dict[str, Schema] = {
    "X-Request-Id": {
        "description": "The client's `X-Request-Id`, or one the gateway made up; "
        "also sent to the backend.",
        "schema": {"type": "string"},
    }
}
_ROUTED_HEADERS: dict[str, Schema] = {
    **_HEADERS_OUT,
    "X-Specrouter-Backend": {
        "description": "The backend that served the request.",
        "schema": {"type": "string"},
    },
    "X-Specrouter-Variant": {
        "description": "The same, under the name clients pin with.",
        "schema": {"type": "string"},
    },
    "X-Specrouter-Reason": {
        "description": "Why the policy chose it (`+retryN` after retries).",
        "schema": {"type": "string"},
    },
    "X-Specrouter-Defaults": {
        "description": "Parameters the policy set because the request "
        "left them out: `name=value,...`.",
        "schema": {"type": "string"},
    },
}
_RETRY_AFTER: Schema = {
    "description": "Seconds to wait before retrying.",
    "schema": {"type": "integer", "minimum": 0},
}


def _error(description: str, *, retry_after: bool | None = None) -> Schema:
    """An error response. `retry_after`: True when always sent, None when sometimes."""
    headers = dict(_HEADERS_OUT)
    if retry_after is not None:
        headers["Retry-After"] = {**_RETRY_AFTER, "required": retry_after}
    return {
        "description": description,
        "headers": headers,
        "content": {_JSON: {"schema": ref("Error")}},
    }


_UNAUTHORIZED = {
    "description": "No key, or a key no client of the policy has. `code` is `invalid_api_key`.",
    "headers": {"WWW-Authenticate": {"schema": {"type": "string"}, "required": True}},
    "content": {_JSON: {"schema": ref("Error")}},
}

_ANTHROPIC_ERROR: Schema = {
    "type": "object",
    "description": "Anthropic's error shape, the gateway's own errors on /v1/messages: `type` is "
    "`authentication_error`, `invalid_request_error`, `not_found_error`, "
    "`rate_limit_error`, `overloaded_error`, `api_error`, ...",
    "required": ["type", "error"],
    "properties": {
        "type": {"type": "string", "enum": ["error"]},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            "additionalProperties": True,
        },
    },
    "additionalProperties": True,
}


def _with_anthropic_errors(path_item: Schema) -> Schema:
    """On the Messages route the gateway answers in Anthropic's shape, while the engine's own
    validation errors (relayed) keep vLLM's OpenAI shape: either may come."""
    responses = path_item["post"]["responses"]
    for status, answer in list(responses.items()):
        if status.startswith(("4", "5")):
            either = {"anyOf": [ref("AnthropicError"), ref("Error")]}
            responses[status] = {**answer, "content": {_JSON: {"schema": either}}}
    return path_item


_GENERATION_ERRORS: dict[str, Schema] = {
    "400": _error(
        "The body is not JSON, not an object, has no string `model`, the model does "
        "not serve this endpoint, a pinned variant does not exist, or the backend "
        "rejected a field (its 400, relayed)."
    ),
    "401": _UNAUTHORIZED,
    "403": _error("The client may not use this model, or may not pin a variant."),
    "404": _error("No route serves this model."),
    "408": _error("The body did not arrive within the gateway's `--body-timeout`."),
    "413": _error("The body is larger than the gateway's `--max-body-bytes`."),
    "429": _error(
        "The client's concurrency or request-rate limit (or the backend's own 429, relayed).",
        retry_after=True,
    ),
    "500": _error(
        "The backend's own internal error, relayed when no other variant could serve "
        "the request. The gateway itself never answers 500."
    ),
    "502": _error(
        "No backend could serve the request (connection refused or lost before the first byte).",
        retry_after=None,
    ),
    "503": _error(
        "No backend is up, the backend is busy past the admission queue timeout, or "
        "the gateway is shutting down.",
        retry_after=None,
    ),
    "504": _error("The backend sent no first byte in time.", retry_after=None),
}

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
    ok_content: dict[str, Schema] = {_JSON: {"schema": ref(response)}}
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
            "requestBody": {"required": True, "content": {_JSON: {"schema": ref(request)}}},
            "responses": {
                "200": {
                    "description": "The backend's answer, relayed byte for byte (the model "
                    "renamed to the one requested).",
                    "headers": _ROUTED_HEADERS,
                    "content": ok_content,
                },
                **_GENERATION_ERRORS,
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
                    "content": {_JSON: {"schema": ref("ModelList")}},
                },
                "401": _UNAUTHORIZED,
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
                        _JSON: {
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
                "200": {"description": "Ready.", "content": {_JSON: {"schema": ref("Ready")}}},
                "503": {
                    "description": "A route has no variant up, or the gateway is draining.",
                    "content": {_JSON: {"schema": ref("Ready")}},
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
                    "content": {_JSON: {"schema": _OBJECT}},
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
            paths[path] = _with_anthropic_errors(paths[path])
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
                "Error": _ERROR,
                "AnthropicError": _ANTHROPIC_ERROR,
                "ChatMessage": _MESSAGE,
                **requests,
                "ChatCompletion": _CHAT_COMPLETION,
                "Completion": _COMPLETION,
                "EmbeddingList": _EMBEDDING_LIST,
                "Response": _RESPONSE,
                "Message": _OBJECT,
                "MessageTokenCount": _OBJECT,
                "ModelList": _MODEL_LIST,
                "Ready": _READY,
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


def __getattr__(name: str) -> Any:
    if name == "SPEC":  # the document as a module attribute, built on first use
        return spec()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
