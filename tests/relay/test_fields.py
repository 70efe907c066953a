"""The public request fields: one description for the OpenAPI document and the gateway's checks."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.relay.app import ENDPOINTS
from proxy.relay.body_shape import _ORJSON_DEPTH, Encoded, _wrapper
from proxy.relay.fields import (
    DEFAULT_LIMITS,
    FIELDS,
    Limits,
    check_fields,
    client_request_id,
    too_many_containers,
)
from proxy.relay.openapi import build_spec, spec
from proxy.relay.rewrite import UsagePlan, plan_usage, upstream_body, upstream_pieces
from proxy.settings import Settings


def _nested(levels: int) -> list:
    """A value `levels` arrays deep (the body around it is one more)."""
    out: list = []
    for _ in range(levels - 1):
        out = [out]
    return out


@pytest.mark.parametrize("endpoint", sorted(FIELDS))
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ([], ("request body must be a JSON object", None)),
        (None, ("request body must be a JSON object", None)),
        ({}, ("`model` is required and must be a string", "model")),
        ({"model": ""}, ("`model` is required and must be a string", "model")),
        ({"model": 7}, ("`model` is required and must be a string", "model")),
        ({"model": None}, ("`model` is required and must be a string", "model")),
        ({"model": "coder", "bogus": "two"}, None),  # fields not described pass through
    ],
)
def test_check_fields(endpoint, body, expected) -> None:
    required = {
        "chat": "messages",
        "completions": "prompt",
        "embeddings": "input",
        "responses": "input",
        "messages": "messages",
    }[endpoint]
    if isinstance(body, dict) and (expected is None or expected[1] != "model"):
        body = {**body, required: ["hi"] if endpoint == "completions" else []}
    assert check_fields(endpoint, body) == expected


@pytest.mark.parametrize(
    ("endpoint", "body", "expected"),
    [
        # Wrong types are refused, never coerced (a string slips past a clamp).
        ("chat", {"max_tokens": "600"}, ("`max_tokens` must be an integer", "max_tokens")),
        ("chat", {"max_tokens": 600.0}, ("`max_tokens` must be an integer", "max_tokens")),
        ("chat", {"stream": "true"}, ("`stream` must be a boolean", "stream")),
        ("chat", {"temperature": "0.5"}, ("`temperature` must be a number", "temperature")),
        ("chat", {"n": True}, ("`n` must be an integer", "n")),
        ("chat", {"messages": 5}, ("`messages` is required and must be an array", "messages")),
        (
            "completions",
            {"prompt": 5},
            ("`prompt` is required and must be a string or an array", "prompt"),
        ),
        # Counts that multiply the work are limits, not clamps.
        ("chat", {"n": 9}, ("`n` must be at most 8 (`max_n`)", "n")),
        ("completions", {"best_of": 9}, ("`best_of` must be at most 8 (`max_n`)", "best_of")),
        (
            "chat",
            {"top_logprobs": 21},
            ("`top_logprobs` must be at most 20 (`max_top_logprobs`)", "top_logprobs"),
        ),
        (
            "completions",
            {"logprobs": 6},
            ("`logprobs` must be at most 5 (`max_logprobs`)", "logprobs"),
        ),
        (
            "chat",
            {"messages": [{"role": "user", "content": "x"}] * 4097},
            ("`messages` must be at most 4096 items (`max_messages`)", "messages"),
        ),
        (
            "responses",
            {"input": [{}] * 4097},
            ("`input` must be at most 4096 items (`max_messages`)", "input"),
        ),
        # Anthropic's temperature range, which vLLM does not enforce on /v1/messages.
        (
            "messages",
            {"temperature": 1.5},
            ("`temperature` must be a number from 0 to 1", "temperature"),
        ),
        ("messages", {"temperature": "1"}, ("`temperature` must be a number", "temperature")),
        # The whole body: depth, and integers orjson would not write back as they came.
        ("chat", {"x": _nested(128)}, ("`x` is nested deeper than 128 levels", "x")),
        (
            "chat",
            {"metadata": {"a": [1e20]}},
            ("`metadata` has an integer beyond 64 bits", "metadata"),
        ),
        ("chat", {"seed": -1e19}, ("`seed` must be an integer", "seed")),
        ("chat", {"x": 1e20}, ("`x` has an integer beyond 64 bits", "x")),
        (
            "chat",
            {"tools": [{"code": "size+1; [1e+5,"}], "x": {"y": [3, -2.5e19]}},
            ("`x` has an integer beyond 64 bits", "x"),
        ),
        # `e+` in text, and numbers with an exponent within 64 bits: no problem.
        ("chat", {"x": ["a+b", "2e+30,", {"k": "[1e+20]"}], "y": [1.5e17, 1e-7]}, None),
        # Within bounds: passes.
        (
            "chat",
            {
                "n": 8,
                "top_logprobs": 20,
                "logprobs": True,
                "temperature": 1,
                "x": _nested(127),
                "seed": 2**63,
                "stream": None,
                "messages": [{"content": [{"text": "a"}]}] * 4096,
            },
            None,
        ),
        ("completions", {"logprobs": 5, "prompt": [[1, 2, 3]], "stop": ["\n"]}, None),
    ],
)
def test_types_and_limits(endpoint, body, expected) -> None:
    base = {"model": "coder", "messages": [], "prompt": "hi", "input": "hi"}
    assert check_fields(endpoint, {**base, **body}) == expected


def test_the_checked_containers_are_serialised_once_for_the_upstream_body() -> None:
    body = {
        "model": "coder",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x + 1 é"}]}],
        "stream": True,
        "stream_options": {"include_usage": False},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "stop": ["\n"],
        "temperature": 0.5,
    }
    encoded: Encoded = {}
    assert check_fields("chat", body, Limits(), encoded) is None
    assert set(encoded) == {"messages", "stream_options", "tools", "stop"}
    assert all(bytes(j) == orjson.dumps(body[k]) for k, (_, j) in encoded.items())
    usage = plan_usage(body, "chat", "vllm")
    assert usage.injected  # stream_options is rewritten: its checked bytes are not reused
    # The policy's injected `stop` replaces the client's: the new value is written, not the old.
    inject = {"temperature": 0.7, "stop": ["END"]}
    out = upstream_body(body, inject, "served", usage, encoded)
    assert out == upstream_body(body, inject, "served", usage)
    assert orjson.loads(out)["stop"] == ["END"] and b'"x + 1 \xc3\xa9"' in out
    # The checked `messages` and `tools` go upstream as the very bytes the check wrote (views,
    # no copy), between pieces written for the rest: together, orjson's bytes of the body.
    pieces = upstream_pieces(body, inject, "served", usage, encoded)
    assert b"".join(pieces) == out
    views = [p for p in pieces if type(p) is memoryview]
    assert [v.obj for v in views] == [encoded["messages"][1].obj, encoded["tools"][1].obj]


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"a": [1]}]},
        {"messages": [], "model": "m", "stop": [], "x": {"y": [1.5, None, True, "\u2028"]}},
        {"model": "m", "messages": [{"role": "user", "content": "é"}], "z": 1, "a": {}},
        {"model": "m", "messages": [[]], "stream_options": {"include_usage": True}},
    ],
)
def test_upstream_pieces_are_orjsons_bytes_of_the_edited_body(body: dict[str, Any]) -> None:
    """Whatever holds views (checked containers, released trees), the pieces joined are the
    bytes `orjson.dumps` writes for the body with its edits, key order kept."""
    encoded: Encoded = {}
    assert check_fields("chat", body, Limits(), encoded) is None
    # As `Exchange.release_tree` leaves it: `stream_options` stays parsed (the usage plan edits it)
    released = {
        k: encoded[k][1] if k in encoded and k != "stream_options" else v for k, v in body.items()
    }
    plan = UsagePlan(injected=True, strip_usage=True)
    inject = {"temperature": 0.2}
    edited = {**body, **inject, "model": "served"}
    edited["stream_options"] = {
        **(body.get("stream_options") or {}),
        "include_usage": True,
        "continuous_usage_stats": True,
    }
    want = orjson.dumps(edited)
    for b, enc in ((body, encoded), (released, None), (body, None)):
        assert b"".join(upstream_pieces(b, inject, "served", plan, enc)) == want


def test_limits_are_the_settings() -> None:
    limits = Limits.of(Settings(max_n=2, max_json_depth=4))
    assert check_fields("chat", {"model": "m", "messages": [], "n": 3}, limits) == (
        "`n` must be at most 2 (`max_n`)",
        "n",
    )
    assert check_fields("chat", {"model": "m", "messages": [], "x": _nested(4)}, limits) == (
        "`x` is nested deeper than 4 levels",
        "x",
    )
    assert check_fields("chat", {"model": "m", "messages": [], "x": _nested(3)}, limits) is None
    # the nested lists `shape` keeps per depth hold no request's value once a check returned
    check_fields("chat", {"model": "m", "messages": []})
    for depth in (4, DEFAULT_LIMITS.max_json_depth):
        assert _wrapper(_ORJSON_DEPTH - depth + 1)[1] == [None]


@pytest.mark.parametrize("depth", [1, 3, 4, 5, 40])
@pytest.mark.parametrize("max_depth", [4, 16])
def test_the_body_length_changes_no_answer_nor_the_bytes_kept(depth: int, max_depth: int) -> None:
    """Given the body's length, a body too short to nest beyond the limit is written without
    the depth wrapper: every answer and every container's JSON are those of the full check."""
    limits = Limits.of(Settings(max_json_depth=max_depth))
    for extra in ({}, {"big": float(2**64)}, {"y": [float(2**64)]}):  # 2**64 as orjson reads it
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": _nested(depth)}
        body.update(extra)
        full: Encoded = {}
        sized: Encoded = {}
        size = len(orjson.dumps(body))
        want = check_fields("chat", body, limits, full)
        assert check_fields("chat", body, limits, sized, size) == want
        assert {k: bytes(v[1]) for k, v in sized.items()} == {
            k: bytes(v[1]) for k, v in full.items()
        }
        assert all(bytes(v[1]) == orjson.dumps(v[0]) for v in sized.values())


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (b"", None),
        (b"abc-1.2:3_Z", "abc-1.2:3_Z"),
        (b"a" * 128, "a" * 128),
        (b"a" * 129, None),
        (b"a b", None),
        (b"a/b", None),
        ("é".encode(), None),
        (b"a\n", None),
    ],
)
def test_client_request_id(value, expected) -> None:
    assert client_request_id(value) == expected


def test_the_document_covers_the_route_table_with_the_same_fields() -> None:
    doc = spec()
    assert doc is spec()  # built once
    schemas = doc["components"]["schemas"]
    for path, endpoint in ENDPOINTS.items():
        ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        body = schemas[ref["$ref"].rsplit("/", 1)[1]]
        assert list(body["properties"]) == [f.name for f in FIELDS[endpoint]]
        assert body["required"] == [f.name for f in FIELDS[endpoint] if f.required]
        assert body["properties"]["model"] == {**FIELDS[endpoint][0].schema()}
        assert body["properties"]["model"]["minLength"] == 1
    # A route table without an endpoint describes no such path.
    partial = build_spec({"/v1/embeddings": "embeddings"})
    assert "/v1/chat/completions" not in partial["paths"]
    assert "ChatCompletionRequest" not in partial["components"]["schemas"]


def test_a_body_of_more_containers_than_the_limit_is_refused_before_its_parse() -> None:
    """Each JSON object or array is 60-200 bytes once parsed: `max_json_containers` bounds the
    parsed body's memory; brackets in strings count too (an upper bound), and a
    body too short to hold that many is not scanned."""
    limits = Limits(max_json_containers=1024)

    def body(n: int, item: bytes = b"{}") -> bytes:
        return b'{"model":"m","x":[' + b",".join([item] * n) + b"]}"

    assert too_many_containers(body(1022), limits) is None  # with the body and its list
    problem = too_many_containers(body(1023), limits)
    assert problem is not None and "max_json_containers" in problem
    assert too_many_containers(body(2000, b'"[{"'), limits) is not None
    assert too_many_containers(body(2000, b"1"), limits) is None  # numbers are no containers
    assert too_many_containers(b"[" * 2048, limits) is None  # too short to hold 1,025
