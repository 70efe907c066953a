"""Schemas of the public API description (openapi.py): bodies, headers, error responses."""

from __future__ import annotations

from proxy.relay.fields import Schema, ref

JSON = "application/json"


def _nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


# -- request bodies: their fields are in proxy/relay/fields.py -------------------------------------

MESSAGE: Schema = {
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

ERROR: Schema = {
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

OBJECT: Schema = {"type": "object", "additionalProperties": True}


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
            "choices": {"type": "array", "items": OBJECT},
            "usage": _nullable(OBJECT),
        },
        "additionalProperties": True,
    }


CHAT_COMPLETION = _completion_object("chat.completion")
COMPLETION = _completion_object("text_completion")

EMBEDDING_LIST: Schema = {
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
        "usage": _nullable(OBJECT),
    },
    "additionalProperties": True,
}

RESPONSE: Schema = {
    "type": "object",
    "required": ["id", "object", "status"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["response"]},
        "status": {"type": "string"},
        "output": {"type": "array", "items": OBJECT},
    },
    "additionalProperties": True,
}

MODEL_LIST: Schema = {
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
                    "max_model_len": _nullable(
                        {
                            "type": "integer",
                            "description": "The context window in tokens (null: not known yet).",
                        }
                    ),
                },
                "additionalProperties": True,
            },
        },
        "first_token_limit_s": {
            "type": "number",
            "description": "The longest a stream waits for its first output before the "
            "gateway answers with an error: admission, then the first-byte timeout.",
        },
    },
}

READY: Schema = {
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
ROUTED_HEADERS: dict[str, Schema] = {
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
        "content": {JSON: {"schema": ref("Error")}},
    }


UNAUTHORIZED = {
    "description": "No key, or a key no client of the policy has. `code` is `invalid_api_key`.",
    "headers": {"WWW-Authenticate": {"schema": {"type": "string"}, "required": True}},
    "content": {JSON: {"schema": ref("Error")}},
}

ANTHROPIC_ERROR: Schema = {
    "type": "object",
    "description": "Anthropic's error shape, the gateway's own errors on /v1/messages: `type` is "
    "`authentication_error`, `invalid_request_error`, `not_found_error`, "
    "`rate_limit_error`, `overloaded_error`, `timeout_error`, `api_error`, ...",
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


def with_anthropic_errors(path_item: Schema) -> Schema:
    """On the Messages route the gateway answers in Anthropic's shape, while the engine's own
    validation errors (relayed) keep vLLM's OpenAI shape: either may come."""
    responses = path_item["post"]["responses"]
    for status, answer in list(responses.items()):
        if status.startswith(("4", "5")):
            either = {"anyOf": [ref("AnthropicError"), ref("Error")]}
            responses[status] = {**answer, "content": {JSON: {"schema": either}}}
    return path_item


GENERATION_ERRORS: dict[str, Schema] = {
    "400": _error(
        "The body is not JSON, not an object, has no string `model`, the model does "
        "not serve this endpoint, a pinned variant does not exist, or the backend "
        "rejected a field (its 400, relayed)."
    ),
    "401": UNAUTHORIZED,
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
