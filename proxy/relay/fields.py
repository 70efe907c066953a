"""The public endpoints' request fields: one description read by the OpenAPI document
(proxy/relay/openapi.py) and by the gateway's own input checks (`check_fields`).

The gateway itself checks only the fields marked `checked` (`model`, and on Messages the
temperature's 0-1 range, which vLLM does not enforce there); every other field
is the backend's (vLLM's) to validate, and is described here with the bounds the backend
enforces, so clients and fuzzers see them. Fields not listed pass through untouched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from policies.types import Endpoint

Schema = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: str | None  # the JSON type; None when `extra` says it (a oneOf)
    required: bool = False
    nullable: bool = False
    checked: bool = False  # the gateway refuses a bad value itself (400), before any backend
    minimum: float | None = None
    exclusive_minimum: bool = False
    maximum: float | None = None
    min_length: int | None = None
    enum: tuple[str, ...] | None = None
    default: Any = None
    description: str | None = None
    extra: Schema = field(default_factory=dict)  # items, properties, oneOf, ...

    def schema(self) -> Schema:
        """The field as an OpenAPI 3.0 schema."""
        out: Schema = {} if self.type is None else {"type": self.type}
        for key, value in (("minLength", self.min_length), ("minimum", self.minimum),
                           ("exclusiveMinimum", self.exclusive_minimum or None),
                           ("maximum", self.maximum),
                           ("enum", None if self.enum is None else list(self.enum)),
                           ("default", self.default), ("description", self.description)):
            if value is not None:
                out[key] = value
        out.update(self.extra)
        if self.nullable:
            out["nullable"] = True
        return out


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


_TOKEN_IDS: Schema = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_OPEN_OBJECTS: Schema = {"type": "array", "items": {"type": "object", "additionalProperties": True}}

MODEL = Field("model", "string", required=True, checked=True, min_length=1,
              description="A model name the policy serves (`GET /v1/models`). The client sees "
                          "this name in the response, whatever the backend's served name is.")
STREAM = Field("stream", "boolean", nullable=True, default=False,
               description="Answer with server-sent events (`text/event-stream`).")
STREAM_OPTIONS = Field(
    "stream_options", "object", nullable=True,
    description="Only with `stream: true`. The gateway asks the backend for per-chunk usage to "
                "measure each request and removes it again, so the client receives exactly the "
                "usage it asked for here.",
    extra={"properties": {"include_usage": {"type": "boolean", "nullable": True},
                          "continuous_usage_stats": {"type": "boolean", "nullable": True}},
           "additionalProperties": True})
TEMPERATURE = Field("temperature", "number", nullable=True, minimum=0,
                    description="When absent, the route's policy may set a default (reported in "
                                "the `X-Specrouter-Defaults` response header).")
TOP_P = Field("top_p", "number", nullable=True, minimum=0, exclusive_minimum=True, maximum=1)
SEED = Field("seed", "integer", nullable=True)

SAMPLING: tuple[Field, ...] = (
    Field("max_tokens", "integer", nullable=True, minimum=1),
    Field("n", "integer", nullable=True, minimum=1, default=1),
    TEMPERATURE,
    TOP_P,
    Field("top_k", "integer", nullable=True),
    Field("min_p", "number", nullable=True, minimum=0, maximum=1),
    SEED,
    Field("stop", None, nullable=True, extra={"oneOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
    Field("logit_bias", "object", nullable=True, extra={"additionalProperties": {"type": "number"}}),
    Field("user", "string", description="The end user: keeps canary assignment sticky."),
)

FIELDS: dict[Endpoint, tuple[Field, ...]] = {
    "chat": (
        MODEL,
        Field("messages", "array", required=True, extra={"items": ref("ChatMessage")}),
        STREAM, STREAM_OPTIONS,
        Field("max_completion_tokens", "integer", nullable=True, minimum=1),
        Field("tools", "array", nullable=True, extra={"items": _OPEN_OBJECTS["items"]}),
        *SAMPLING,
    ),
    "completions": (
        MODEL,
        Field("prompt", None, required=True, extra={"oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string"}, "minItems": 1},
            {**_TOKEN_IDS, "minItems": 1},
            {"type": "array", "items": _TOKEN_IDS, "minItems": 1}]}),
        STREAM, STREAM_OPTIONS,
        Field("echo", "boolean"),
        *SAMPLING,
    ),
    "embeddings": (
        MODEL,
        Field("input", None, required=True, extra={"oneOf": [
            {"type": "string"}, {"type": "array", "items": {"type": "string"}},
            _TOKEN_IDS, {"type": "array", "items": _TOKEN_IDS}]}),
        Field("encoding_format", "string", enum=("float", "base64"), default="float"),
        Field("dimensions", "integer", nullable=True, minimum=1),
        Field("user", "string"),
    ),
    "responses": (
        MODEL,
        Field("input", None, required=True, extra={"oneOf": [{"type": "string"}, _OPEN_OBJECTS]}),
        Field("instructions", "string", nullable=True),
        Field("max_output_tokens", "integer", nullable=True, minimum=1),
        STREAM, TEMPERATURE, TOP_P, SEED,
    ),
    "messages": (
        MODEL,
        Field("messages", "array", required=True, extra={"items": _OPEN_OBJECTS["items"]}),
        Field("max_tokens", "integer", required=True, minimum=1),
        Field("system", None, nullable=True, extra={"oneOf": [{"type": "string"}, _OPEN_OBJECTS]}),
        Field("stream", "boolean", nullable=True, default=False,
              description="Answer with Anthropic's server-sent events (`event:` lines)."),
        Field("stop_sequences", "array", nullable=True, extra={"items": {"type": "string"}}),
        Field("temperature", "number", nullable=True, checked=True, minimum=0, maximum=1,
              description=TEMPERATURE.description),
        TOP_P,
        Field("top_k", "integer", nullable=True),
        Field("tools", "array", nullable=True, extra={"items": _OPEN_OBJECTS["items"]}),
        Field("tool_choice", "object", nullable=True),
        Field("metadata", "object", nullable=True),
    ),
}


def request_schema(endpoint: Endpoint) -> Schema:
    """The endpoint's request body: its fields, every other field allowed (passed through)."""
    fields = FIELDS[endpoint]
    return {"type": "object", "required": [f.name for f in fields if f.required],
            "properties": {f.name: f.schema() for f in fields}, "additionalProperties": True}


# -- the gateway's own checks ----------------------------------------------------------------------

_PY_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str, "boolean": bool, "object": dict, "array": list, "number": (int, float)}
_NOT_AN_OBJECT = ("request body must be a JSON object", None)
# name, Python type, required, non-empty, (minimum, maximum), message
Check = tuple[str, type | tuple[type, ...], bool, bool, tuple[float, float] | None, str]


def _check(f: Field) -> Check:
    assert f.type is not None, f"checked field {f.name} needs a JSON type"
    message = f"`{f.name}` {'is required and ' if f.required else ''}must be a {f.type}"
    bounds = None
    if f.minimum is not None or f.maximum is not None:
        bounds = (-math.inf if f.minimum is None else f.minimum,
                  math.inf if f.maximum is None else f.maximum)
        message += f" from {f.minimum:g} to {f.maximum:g}" if bounds[1] < math.inf else ""
    return f.name, _PY_TYPES[f.type], f.required, bool(f.min_length), bounds, message


_CHECKS: dict[Endpoint, tuple[Check, ...]] = {
    endpoint: tuple(_check(f) for f in fields if f.checked) for endpoint, fields in FIELDS.items()}


def check_fields(endpoint: Endpoint, body: Any) -> tuple[str, str | None] | None:
    """None when the body passes the gateway's own checks, else (message, param) for its 400.
    A handful of dict lookups: the fields are compiled to `_CHECKS` at import."""
    if not isinstance(body, dict):
        return _NOT_AN_OBJECT
    for name, kind, required, non_empty, bounds, message in _CHECKS[endpoint]:
        value = body.get(name)
        if value is None and not required:
            continue
        if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool) or \
                (non_empty and not value):
            return message, name
        if bounds is not None and isinstance(value, int | float) and \
                not bounds[0] <= value <= bounds[1]:
            return message, name
    return None
