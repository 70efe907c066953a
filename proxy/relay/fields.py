"""The public endpoints' request fields: one description read by the OpenAPI document
(proxy/relay/openapi.py) and by the gateway's own input checks (`check_fields`).

Every described field is typed as the OpenAI API types it and the gateway refuses a wrong type
itself (400 naming the field, no coercion: a string `max_tokens` would slip past the route's
clamps, a string `stream` would be read as not streaming while the engine streams). Counts that
multiply the work asked for (`n`, `best_of`, logprobs, messages) have limits (`Limits`, from the
settings), and the whole body a depth and integer range that survive re-serialisation. Value
ranges other than those (and the Messages temperature's 0-1, which vLLM does not enforce
there) stay the backend's (vLLM's) to judge; they are described so clients and
fuzzers see them. Fields not listed pass through untouched.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

from policies.types import Endpoint
from proxy.relay.body_shape import Encoded, Problem, shape

Schema = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: str | None  # the JSON type; None when `extra` says it (a oneOf)
    required: bool = False
    nullable: bool = False
    checked: bool = False  # an empty or out-of-range value is refused (400) by the gateway
    minimum: float | None = None
    exclusive_minimum: bool = False
    maximum: float | None = None
    min_length: int | None = None
    enum: tuple[str, ...] | None = None
    default: Any = None
    description: str | None = None
    extra: Schema = field(default_factory=dict)  # items, properties, oneOf, ...
    # The `Limits` attribute bounding it: an integer's maximum, an array's number of items.
    limit: str | None = None

    def schema(self) -> Schema:
        """The field as an OpenAPI 3.0 schema (limits at their defaults)."""
        out: Schema = {} if self.type is None else {"type": self.type}
        most = None if self.limit is None else getattr(DEFAULT_LIMITS, self.limit)
        for key, value in (
            ("minLength", self.min_length),
            ("minimum", self.minimum),
            ("exclusiveMinimum", self.exclusive_minimum or None),
            ("maximum", most if self.type == "integer" else self.maximum),
            ("maxItems", most if self.type != "integer" else None),
            ("enum", None if self.enum is None else list(self.enum)),
            ("default", self.default),
            ("description", self.description),
        ):
            if value is not None:
                out[key] = value
        out.update(self.extra)
        if self.nullable:
            out["nullable"] = True
        return out


@dataclass(frozen=True, slots=True)
class Limits:
    """The gateway's own bounds on client input; each a setting of the same name."""

    max_n: int = 8  # n, best_of: each choice is a whole generation
    max_top_logprobs: int = 20  # chat, responses (OpenAI's own maximum)
    max_logprobs: int = 5  # completions (OpenAI's own maximum)
    max_messages: int = 4096  # chat messages, responses input items
    max_json_depth: int = 128  # orjson cannot re-serialise beyond 254
    max_json_containers: int = 262_144  # objects and arrays: the parsed body's memory

    @classmethod
    def of(cls, settings: Any) -> Limits:
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


DEFAULT_LIMITS = Limits()


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


_TOKEN_IDS: Schema = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_OPEN_OBJECTS: Schema = {"type": "array", "items": {"type": "object", "additionalProperties": True}}

MODEL = Field(
    "model",
    "string",
    required=True,
    checked=True,
    min_length=1,
    description="A model name the policy serves (`GET /v1/models`). The client sees "
    "this name in the response, whatever the backend's served name is.",
)
STREAM = Field(
    "stream",
    "boolean",
    nullable=True,
    default=False,
    description="Answer with server-sent events (`text/event-stream`).",
)
STREAM_OPTIONS = Field(
    "stream_options",
    "object",
    nullable=True,
    description="Only with `stream: true`. The gateway asks the backend for per-chunk usage to "
    "measure each request and removes it again, so the client receives exactly the "
    "usage it asked for here.",
    extra={
        "properties": {
            "include_usage": {"type": "boolean", "nullable": True},
            "continuous_usage_stats": {"type": "boolean", "nullable": True},
        },
        "additionalProperties": True,
    },
)
TEMPERATURE = Field(
    "temperature",
    "number",
    nullable=True,
    minimum=0,
    description="When absent, the route's policy may set a default (reported in "
    "the `X-Specrouter-Defaults` response header).",
)
TOP_P = Field("top_p", "number", nullable=True, minimum=0, exclusive_minimum=True, maximum=1)
SEED = Field("seed", "integer", nullable=True)

TOP_LOGPROBS = Field("top_logprobs", "integer", nullable=True, minimum=0, limit="max_top_logprobs")

SAMPLING: tuple[Field, ...] = (
    Field("max_tokens", "integer", nullable=True, minimum=1),
    Field("n", "integer", nullable=True, minimum=1, default=1, limit="max_n"),
    Field("best_of", "integer", nullable=True, minimum=1, limit="max_n"),
    TEMPERATURE,
    TOP_P,
    Field("top_k", "integer", nullable=True),
    Field("min_p", "number", nullable=True, minimum=0, maximum=1),
    SEED,
    Field(
        "stop",
        None,
        nullable=True,
        extra={"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    ),
    Field(
        "logit_bias", "object", nullable=True, extra={"additionalProperties": {"type": "number"}}
    ),
    Field("user", "string", description="The end user: keeps canary assignment sticky."),
)

FIELDS: dict[Endpoint, tuple[Field, ...]] = {
    "chat": (
        MODEL,
        Field(
            "messages",
            "array",
            required=True,
            extra={"items": ref("ChatMessage")},
            limit="max_messages",
        ),
        STREAM,
        STREAM_OPTIONS,
        Field("max_completion_tokens", "integer", nullable=True, minimum=1),
        Field("logprobs", "boolean", nullable=True),
        TOP_LOGPROBS,
        Field("tools", "array", nullable=True, extra={"items": _OPEN_OBJECTS["items"]}),
        *SAMPLING,
    ),
    "completions": (
        MODEL,
        Field(
            "prompt",
            None,
            required=True,
            extra={
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    {**_TOKEN_IDS, "minItems": 1},
                    {"type": "array", "items": _TOKEN_IDS, "minItems": 1},
                ]
            },
        ),
        STREAM,
        STREAM_OPTIONS,
        Field("echo", "boolean"),
        Field("logprobs", "integer", nullable=True, minimum=0, limit="max_logprobs"),
        *SAMPLING,
    ),
    "embeddings": (
        MODEL,
        Field(
            "input",
            None,
            required=True,
            extra={
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}},
                    _TOKEN_IDS,
                    {"type": "array", "items": _TOKEN_IDS},
                ]
            },
        ),
        Field("encoding_format", "string", enum=("float", "base64"), default="float"),
        Field("dimensions", "integer", nullable=True, minimum=1),
        Field("user", "string"),
    ),
    "responses": (
        MODEL,
        Field(
            "input",
            None,
            required=True,
            extra={"oneOf": [{"type": "string"}, _OPEN_OBJECTS]},
            limit="max_messages",
        ),
        Field("instructions", "string", nullable=True),
        Field("max_output_tokens", "integer", nullable=True, minimum=1),
        STREAM,
        TEMPERATURE,
        TOP_P,
        SEED,
        TOP_LOGPROBS,
    ),
    "messages": (
        MODEL,
        Field(
            "messages",
            "array",
            required=True,
            extra={"items": _OPEN_OBJECTS["items"]},
            limit="max_messages",
        ),
        # Required by /v1/messages, not by /v1/messages/count_tokens (one field list serves both):
        # vLLM answers a missing one itself, with its own bytes (the golden anth_err_400 files).
        Field("max_tokens", "integer", nullable=True, minimum=1),
        Field("system", None, nullable=True, extra={"oneOf": [{"type": "string"}, _OPEN_OBJECTS]}),
        Field(
            "stream",
            "boolean",
            nullable=True,
            default=False,
            description="Answer with Anthropic's server-sent events (`event:` lines).",
        ),
        Field("stop_sequences", "array", nullable=True, extra={"items": {"type": "string"}}),
        # Anthropic's range, which vLLM does not enforce on this route: the gateway does.
        Field(
            "temperature",
            "number",
            nullable=True,
            checked=True,
            minimum=0,
            maximum=1,
            description=TEMPERATURE.description,
        ),
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
    return {
        "type": "object",
        "required": [f.name for f in fields if f.required],
        "properties": {f.name: f.schema() for f in fields},
        "additionalProperties": True,
    }


# -- the gateway's own checks ----------------------------------------------------------------------

# JSON types as orjson returns them: exact types, so `true` is no integer and `1.0` no integer.
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "integer": (int,),
    "number": (int, float),
}
_ARTICLE = {"integer": "an integer", "array": "an array", "object": "an object"}
_NOT_AN_OBJECT = ("request body must be a JSON object", None)


@dataclass(frozen=True, slots=True)
class _Check:
    kinds: tuple[type, ...]
    message: str  # a wrong type's
    non_empty: bool
    most: int | None  # an integer's maximum, an array's items
    too_many: str
    # A `checked` field's value range, which the gateway enforces itself (Messages temperature).
    bounds: tuple[float, float] | None = None

    def problem(self, value: Any) -> str | None:
        kind = type(value)
        if kind not in self.kinds or (self.non_empty and not value):
            return self.message
        if self.most is not None:
            size = len(value) if kind is list else value if kind is int else 0
            if size > self.most:
                return self.too_many
        if self.bounds is not None and not self.bounds[0] <= value <= self.bounds[1]:
            return f"{self.message} from {self.bounds[0]:g} to {self.bounds[1]:g}"
        return None


def _check(f: Field, limits: Limits) -> _Check:
    names = (
        [f.type]
        if f.type is not None
        else list(dict.fromkeys(o["type"] for o in f.extra.get("oneOf", ())))
    )
    assert names, f"field {f.name} needs a JSON type"
    kinds = tuple(k for n in names for k in _PY_TYPES[n])
    said = " or ".join(_ARTICLE.get(n, f"a {n}") for n in names)
    message = f"`{f.name}` {'is required and ' if f.required else ''}must be {said}"
    most = None if f.limit is None else int(getattr(limits, f.limit))
    unit = "" if f.type == "integer" else " items"
    bounds = None
    if f.checked and (f.minimum is not None or f.maximum is not None):
        bounds = (
            -math.inf if f.minimum is None else f.minimum,
            math.inf if f.maximum is None else f.maximum,
        )
    return _Check(
        kinds,
        message,
        bool(f.min_length),
        most,
        f"`{f.name}` must be at most {most}{unit} (`{f.limit}`)",
        bounds,
    )


@functools.lru_cache(maxsize=8)
def _compiled(limits: Limits) -> dict[Endpoint, tuple[dict[str, _Check], tuple[str, ...]]]:
    return {
        endpoint: ({f.name: _check(f, limits) for f in fs}, tuple(f.name for f in fs if f.required))
        for endpoint, fs in FIELDS.items()
    }


def check_fields(
    endpoint: Endpoint,
    body: Any,
    limits: Limits = DEFAULT_LIMITS,
    encoded: Encoded | None = None,
    size: int | None = None,
) -> Problem | None:
    """None when the body passes the gateway's own checks, else (message, param) for its 400.
    A dict lookup per top-level key, and one serialisation of each container, which `encoded`
    (when given) keeps for the body the gateway sends upstream (proxy/relay/rewrite.py).
    `size`: the body's JSON length when known (a short body's depth needs no check)."""
    if not isinstance(body, dict):
        return _NOT_AN_OBJECT
    checks, required = _compiled(limits)[endpoint]
    for name in required:  # in the order described: `model` first
        value = body.get(name)
        problem = checks[name].message if value is None else checks[name].problem(value)
        if problem is not None:
            return problem, name
    for name, value in body.items():
        check = checks.get(name)
        if check is not None and value is not None:  # null is absent, the backend's to judge
            problem = check.problem(value)
            if problem is not None:
                return problem, name
    return shape(body, limits.max_json_depth, {} if encoded is None else encoded, size)


def too_many_containers(raw: bytes, limits: Limits = DEFAULT_LIMITS) -> str | None:
    """Before the parse: the 413's message when the body may hold more than
    `max_json_containers` objects and arrays, each 60-200 bytes once parsed (orjson's dicts and
    lists; a body of empty objects is ~21 times its JSON). Brackets are counted, those inside
    strings too (an upper bound), and only in a body long enough to hold that many (two bytes
    each): an agent's 400 KiB body is never scanned."""
    most = limits.max_json_containers
    if len(raw) <= 2 * most or raw.count(b"{") + raw.count(b"[") <= most:
        return None
    return f"request body holds more than {most} JSON objects and arrays (`max_json_containers`)"


# -- request headers --------------------------------------------------------------------------------

_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


def client_request_id(value: bytes | None) -> str | None:
    """The client's `X-Request-Id` when it is one the engines and the request log may carry
    (at most 128 characters of [A-Za-z0-9._:-]); None: the gateway makes its own."""
    if value is None or _REQUEST_ID.fullmatch(value) is None:
        return None
    return value.decode("ascii")
