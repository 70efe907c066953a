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
import threading
from dataclasses import dataclass, field, fields
from typing import Any

import orjson

from policies.types import Endpoint

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
_CONTAINERS = (dict, list)
_NEEDS_A_LOOK = frozenset({dict, list, float})
# orjson reads an integer beyond 64 bits as a float, which it then writes back as another
# number (1e+20): such a number without a fraction is refused, whatever its spelling.
_INT64 = float(2**63)
_ORJSON_DEPTH = 254  # the deepest value orjson writes (its recursion limit is 255)
_WRAPPERS = threading.local()  # `_wrapper`'s, per thread: a slot filled during a check
_EXPONENT = re.compile(rb"e\+")  # a literal: `re` finds it at C speed (bytes.find is slower)
_DIGITS = frozenset(b"0123456789")
_MANTISSA = frozenset(b"0123456789.-")
_VALUE_START = frozenset(b"[,:")  # orjson writes no whitespace
# Each top-level container the check serialised: the value (by identity: the upstream body
# reuses the bytes only for the very object checked, the body is never edited in place) and
# its JSON, a view into the bytes orjson wrote (no copy), sent upstream as it is.
Encoded = dict[str, tuple[Any, memoryview]]
Problem = tuple[str, str | None]  # message, param: the 400's


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
    endpoint: Endpoint, body: Any, limits: Limits = DEFAULT_LIMITS, encoded: Encoded | None = None
) -> Problem | None:
    """None when the body passes the gateway's own checks, else (message, param) for its 400.
    A dict lookup per top-level key, and one serialisation of each container, which `encoded`
    (when given) keeps for the body the gateway sends upstream (proxy/relay/rewrite.py)."""
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
    return _shape(body, limits.max_json_depth, {} if encoded is None else encoded)


def _shape(body: dict[str, Any], max_depth: int, encoded: Encoded) -> Problem | None:
    """The body's nesting within `max_depth` and its integers within 64 bits.

    orjson does the walk, in C, one top-level container at a time: it refuses to write a value
    nested beyond `_ORJSON_DEPTH`, so a container (depth 2) wrapped in `wrap` lists fails
    exactly when the body is too deep; and it writes every float of 2**63 or more with an
    exponent (`e+`). Only a container that fails or has such a number is walked in Python, to
    name the field. The bytes written go into `encoded` (a view, not a copy): the upstream body
    reuses them instead of serialising the same containers again."""
    wrap = _ORJSON_DEPTH - max_depth + 1
    outer, inner = _wrapper(wrap)
    try:
        return _shape_in(body, max_depth, encoded, wrap, outer, inner)
    finally:
        inner[0] = None  # the body is not held by the wrapper past its check


def _wrapper(wrap: int) -> tuple[list[Any], list[Any]]:
    """`wrap` nested lists and the innermost, whose one slot `_shape` fills: made once per
    depth and thread, not per request (~130 lists, 4 us)."""
    made: dict[int, tuple[list[Any], list[Any]]] = _WRAPPERS.__dict__.setdefault("made", {})
    found = made.get(wrap)
    if found is None:
        inner: list[Any] = [None]
        outer: list[Any] = inner
        for _ in range(wrap - 1):
            outer = [outer]
        found = made[wrap] = (outer, inner)
    return found


def _shape_in(
    body: dict[str, Any],
    max_depth: int,
    encoded: Encoded,
    wrap: int,
    outer: list[Any],
    inner: list[Any],
) -> Problem | None:
    for name, value in body.items():
        kind = type(value)
        if kind is float and abs(value) >= _INT64 and value.is_integer():
            return f"`{name}` has an integer beyond 64 bits", name
        if kind not in _CONTAINERS:
            continue
        inner[0] = value
        try:
            out: bytes | None = orjson.dumps(outer)
        except orjson.JSONEncodeError:
            out = None
        if out is None or _has_exponent(out):
            problem = _walk({name: value}, max_depth)
            if problem is not None:
                return problem
        if out is not None:  # the container's own JSON, inside the `wrap` brackets
            encoded[name] = (value, memoryview(out)[wrap:-wrap])
    return None


def _has_exponent(out: bytes) -> bool:
    """Whether orjson wrote a number with an exponent (`1e+20`, so 1e16 or more): `e+` found in
    C, then the bytes before it read as a mantissa that starts a value: text such as `size+1`
    in a string costs no walk (looking at each `+` in Python took 250 us on an agent's body)."""
    if b"+" not in out:  # memchr: most bodies without code have none
        return False
    for found in _EXPONENT.finditer(out):
        i = found.start() - 1
        if i < 0 or out[i] not in _DIGITS:
            continue
        while i >= 0 and out[i] in _MANTISSA:
            i -= 1
        if i < 0 or out[i] in _VALUE_START:
            return True
    return False


def _walk(body: dict[str, Any], max_depth: int) -> Problem | None:
    """`_shape`'s walk in Python: the problem names the top-level field it is in. Containers
    of plain scalars are skipped in C."""
    for name, top in body.items():
        stack: list[tuple[Any, int]] = [([top], 1)]  # the body is depth 1
        while stack:
            node, depth = stack.pop()
            items = node.values() if type(node) is dict else node
            if _NEEDS_A_LOOK.isdisjoint(map(type, items)):
                continue
            for value in items:
                kind = type(value)
                if kind in _CONTAINERS:
                    if depth >= max_depth:
                        return f"`{name}` is nested deeper than {max_depth} levels", name
                    stack.append((value, depth + 1))
                elif kind is float and abs(value) >= _INT64 and value.is_integer():
                    return f"`{name}` has an integer beyond 64 bits", name
    return None


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
