"""Hostile or broken input on the relay's side: hypothesis against the SSE framing, the stream
filter and the request rewriting, then a raw backend that misbehaves behind the real gateway.

The pure properties: FrameSplitter gives back exactly the bytes it was fed, however they were cut;
StreamFilter never raises, and on a well-formed vLLM stream gives the client vLLM's bytes for the
client's own request (the gateway's added usage removed, nothing else touched); `upstream_body`
keeps every client field it does not set; `request_view` (and the policy after it) takes any JSON
object. End to end: whatever the backend sends, the client gets the bytes, or a clear error event,
or an OpenAI-style error, within a hard timeout; never a hang, never a bare 500.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import hypothesis.strategies as st
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer, coder_policy
from policies.engine import decide
from policies.inputs import request_view
from policies.schema import compile_policy, load_policy
from policies.types import LiveState
from proxy.certs import CertFiles
from proxy.record.measure import Measurement
from proxy.relay import sse
from proxy.relay.measure import StreamFilter, read_body
from proxy.relay.rewrite import plan_usage, upstream_body

PURE = settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- strategies ------------------------------------------------------------------------------------

# Bytes that look like SSE more often than uniform noise would: the framing's own pieces.
_PIECES = st.sampled_from(
    [
        b"\n",
        b"\n\n",
        b"\r\n",
        b"data: ",
        b"data: {",
        b"}",
        b"[DONE]",
        b"event: ",
        b": ping",
        b'"usage":{',
        b",",
        b"\xff",
        b"\xc3",
    ]
)
SSE_BYTES = st.lists(st.one_of(_PIECES, st.binary(max_size=12)), max_size=40).map(b"".join)
JSON_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)  # orjson's strings
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | JSON_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(JSON_TEXT, inner, max_size=4),
    max_leaves=12,
)
# Keys the gateway reads are drawn often, so their odd values are tried, not just their absence.
_KEYS = (
    st.sampled_from(
        [
            "model",
            "messages",
            "prompt",
            "input",
            "stream",
            "stream_options",
            "n",
            "temperature",
            "min_p",
            "top_p",
            "logit_bias",
            "max_tokens",
            "user",
            "tools",
            "instructions",
            "priority",
            "seed",
        ]
    )
    | JSON_TEXT
)
_STREAM_OPTIONS = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {},
        optional={
            "include_usage": st.booleans() | JSON,
            "continuous_usage_stats": st.booleans() | JSON,
            "extra": JSON,
        },
    ),
)
BODY = st.dictionaries(_KEYS, JSON, max_size=8).flatmap(
    lambda d: st.fixed_dictionaries(
        {},
        optional={
            "stream": st.just(True) | JSON,
            "stream_options": _STREAM_OPTIONS,
            "n": st.sampled_from([1, None, 2]) | JSON,
        },
    ).map(lambda extra: {**d, **extra})
)


def cuts(data: bytes) -> st.SearchStrategy[list[bytes]]:
    """`data` cut into consecutive pieces at random points (empty pieces included)."""
    return st.lists(st.integers(0, len(data)), max_size=12).map(
        lambda points: [
            data[a:b]
            for a, b in zip([0, *sorted(points)], [*sorted(points), len(data)], strict=True)
        ]
    )


def split_all(pieces: list[bytes]) -> tuple[list[bytes], bytes]:
    splitter = sse.FrameSplitter()
    frames: list[bytes] = []
    for piece in pieces:
        frames += splitter.feed(piece)
    return frames, splitter.flush()


# -- FrameSplitter ---------------------------------------------------------------------------------


@PURE
@given(st.data())
def test_splitter_gives_back_exactly_its_input(data: st.DataObject) -> None:
    stream = data.draw(SSE_BYTES)
    frames, rest = split_all(data.draw(cuts(stream)))
    assert b"".join(frames) + rest == stream
    assert all(f.endswith(_BLANK_ENDS) for f in frames)  # each ends a blank line


# Two line ends in a row, each LF, CRLF or a lone CR (the SSE grammar).
_BLANK_ENDS = (b"\n\n", b"\r\r", b"\n\r", b"\r\n\r\n", b"\n\r\n", b"\r\r\n")


# A well-formed vLLM frame: one `data:` (or `event:` + `data:`) block, one blank line after it.
_FRAME = st.one_of(
    st.builds(lambda obj: b"data: " + orjson.dumps(obj) + b"\n\n", JSON),
    st.builds(
        lambda t, obj: b"event: " + t.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n",
        st.text("abcdefghijklmnopqrstuvwxyz._", min_size=1, max_size=20),
        JSON,
    ),
    st.just(sse.DONE),
)


@PURE
@given(st.data())
def test_splitter_frames_of_a_well_formed_stream_do_not_depend_on_the_cuts(
    data: st.DataObject,
) -> None:
    frames = data.draw(st.lists(_FRAME, max_size=8))
    stream = b"".join(frames)
    got, rest = split_all(data.draw(cuts(stream)))
    assert got == frames
    assert rest == b""


@PURE
@example(pieces=[b"data: a\n\n\n", b"\ndata: b\n\n"])
@given(pieces=st.lists(SSE_BYTES, max_size=6))
def test_splitter_frames_never_depend_on_the_cuts(pieces: list[bytes]) -> None:
    whole, whole_rest = split_all([b"".join(pieces)])
    got, rest = split_all(pieces)
    assert (got, rest) == (whole, whole_rest)


def test_splitter_keeps_invalid_utf8_and_a_missing_end() -> None:
    stream = b'data: {"x":"\xff\xfe\xc3"}\n\ndata: {"y":"\xed\xa0\x80"}\n\ndata: {"trunc'
    frames, rest = split_all([stream[:7], stream[7:30], stream[30:]])
    assert frames == [b'data: {"x":"\xff\xfe\xc3"}\n\n', b'data: {"y":"\xed\xa0\x80"}\n\n']
    assert rest == b'data: {"trunc'


def test_splitter_cuts_crlf_framed_events() -> None:
    frames, rest = split_all([b"data: a\r\n\r\ndata: b\r", b"\n\r\n: c\r\n\r\n"])
    assert (frames, rest) == ([b"data: a\r\n\r\n", b"data: b\r\n\r\n", b": c\r\n\r\n"], b"")


def test_splitter_passes_a_huge_line_whole() -> None:
    line = b"data: " + b"x" * (4 << 20) + b"\n\n"
    frames, rest = split_all([line[i : i + 65536] for i in range(0, len(line), 65536)])
    assert frames == [line] and rest == b""


def test_splitter_is_linear_in_a_huge_line() -> None:
    line = b"data: " + b"x" * (64 << 20) + b"\n\n"
    splitter = sse.FrameSplitter()
    frames: list[bytes] = []
    # The thread's CPU time, not the wall clock: a loaded machine (the suite's other workers)
    # stretches the wall time of the linear splitter past any bound (3 s for 62 MiB, once).
    started = time.thread_time()
    for i in range(0, len(line), 65536):
        frames += splitter.feed(line[i : i + 65536])
        # A linear splitter takes ~0.1 s; stop early instead of waiting out the quadratic one.
        assert time.thread_time() - started < 3.0, f"only {i >> 20} MiB split in 3 s of CPU"
    assert frames == [line]


# -- StreamFilter ----------------------------------------------------------------------------------


def _filter(frames: list[bytes], **kw: Any) -> tuple[bytes, Measurement]:
    m = Measurement(0.0)
    filt = StreamFilter(m, **kw)
    out = b"".join(filt.frame(f, float(i)) for i, f in enumerate(frames)) + filt.release()
    return out, m


_FILTER_OPTS = st.fixed_dictionaries(
    {
        "strip_usage": st.booleans(),
        "drop_usage_chunk": st.booleans(),
        "rename": st.none() | st.just((b'"model":"m"', b'"model":"coder"')),
    }
)


def _usage_parses(frame: bytes) -> bool:
    """Whether the frame's usage object (if any) and, on a usage chunk, the frame are JSON."""
    span = sse.usage_span(frame)
    if span is None:
        return True
    try:
        orjson.loads(frame[span[0] + len(sse.USAGE_KEY) - 1 : span[1]])
        if b'"choices":[]' in frame and b'"metrics":' in frame:
            orjson.loads(frame[6:])
    except orjson.JSONDecodeError:
        return False
    return True


_GARBAGE_FRAME = st.one_of(
    SSE_BYTES.map(lambda b: b + sse.FRAME_END),
    SSE_BYTES.map(lambda b: b"data: {" + b + b"}\n\n"),
    st.builds(
        lambda a, u, b: b"data: {" + a + b',"usage":{' + u + b"}" + b + b"}\n\n",
        SSE_BYTES,
        SSE_BYTES,
        SSE_BYTES,
    ),
    st.builds(
        lambda obj: b'data: {"choices":[],"usage":' + orjson.dumps(obj) + b"}\n\n",
        st.dictionaries(JSON_TEXT, JSON, max_size=4),
    ),
    st.builds(lambda t: b'data: {"choices":[{"finish_reason":"' + t + b"\n\n", SSE_BYTES),
    st.just(b'data: {"error": {"message": 5}}\n\n'),
    st.just(b'data: {"error": [}\n\n'),
    st.just(sse.DONE),
)


@PURE
@given(frames=st.lists(_GARBAGE_FRAME, max_size=10), opts=_FILTER_OPTS)
def test_filter_never_raises_on_garbage(frames: list[bytes], opts: dict[str, Any]) -> None:
    out, m = _filter(frames, **opts)
    if not opts["strip_usage"] and not opts["drop_usage_chunk"] and opts["rename"] is None:
        assert out == b"".join(frames)  # nothing to edit: every byte through, in order
    # Every choice frame is counted once, whatever its content: JSON objects that are neither
    # an error event nor a usage-only chunk (`"choices":[]`).
    assert m.chunks == sum(
        1
        for f in frames
        if f.startswith(b"data: {")
        and not f.startswith(b'data: {"error"')
        and b'"choices":[]' not in f
    )
    assert m.completion_tokens >= 0 and len(m.step_gaps) == len(m.step_tokens)


@pytest.mark.parametrize(
    "frame",
    [
        b'data: {"choices":[{"delta":{}}],"usage":{"completion_tokens":oops}}\n\n',
        b'data: {"choices":[{"delta":{}}],"usage":{"completion_tokens":1e999}}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":1},"metrics":{broken}\n\n',
    ],
)
@pytest.mark.parametrize("strip", [False, True])
def test_filter_survives_a_malformed_usage_object(frame: bytes, strip: bool) -> None:
    out, m = _filter([frame, sse.DONE], strip_usage=strip, drop_usage_chunk=strip)
    assert out.endswith(sse.DONE)


# A well-formed vLLM chat stream, as it comes with the gateway's injected continuous usage.
def _head(model: bytes) -> bytes:
    return (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"'
        + model
        + b'",'
    )


def _choice(delta: bytes, finish: bytes = b"null") -> bytes:
    return (
        b'"choices":[{"index":0,"delta":'
        + delta
        + b',"logprobs":null,"finish_reason":'
        + finish
        + b"}]"
    )


def _usage(prompt: int, completion: int) -> bytes:
    return b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}' % (
        prompt,
        prompt + completion,
        completion,
    )


FP = b',"system_fingerprint":"vllm-0.28.0-abcd1234"'
SPEC = (
    b',"metrics":{"speculative_decoding":{"mean_acceptance_length":2.5,'
    b'"num_spec_steps":2,"num_accepted_draft_tokens":3,"num_draft_tokens":14}}'
)


def vllm_stream(
    texts: list[str],
    *,
    include: bool,
    continuous: bool,
    prompt: int = 7,
    spec: bool = False,
    model: bytes = b"m",
) -> list[bytes]:
    """The frames vLLM sends for these stream_options (n == 1), content JSON-escaped."""

    def u(c: int) -> bytes:
        return _usage(prompt, c) if continuous else b""

    head = _head(model)
    frames = [head + _choice(b'{"role":"assistant","content":""}') + u(0) + b"}\n\n"]
    total = 0
    for text in texts:
        total += 1 + len(text) // 4
        frames.append(
            head + _choice(b'{"content":' + orjson.dumps(text) + b"}") + u(total) + b"}\n\n"
        )
    if include:
        frames.append(head + _choice(b"{}", b'"stop"') + u(total) + b"}\n\n")
        frames.append(
            head + b'"choices":[]' + _usage(prompt, total) + FP + (SPEC if spec else b"") + b"}\n\n"
        )
    else:
        frames.append(head + _choice(b"{}", b'"stop"') + FP + b"}\n\n")
    frames.append(sse.DONE)
    return frames


# Text a model may produce, including the bytes the filter searches for, JSON-escaped or not.
_TEXT = st.one_of(
    JSON_TEXT,
    st.sampled_from(
        [
            ',"usage":{',
            '"finish_reason":"',
            '"choices":[]',
            "\n\ndata: [DONE]\n\n",
            '"model":"m"',
            "}",
            "{",
            "\\",
            '"',
            "data: {",
        ]
    ),
)


@PURE
@given(
    texts=st.lists(_TEXT, max_size=8),
    include=st.booleans(),
    continuous=st.booleans(),
    spec=st.booleans(),
    rename=st.booleans(),
    data=st.data(),
)
def test_filter_gives_the_client_vllms_own_bytes(
    texts: list[str], include: bool, continuous: bool, spec: bool, rename: bool, data: st.DataObject
) -> None:
    body: dict[str, Any] = {
        "model": "coder",
        "stream": True,
        "stream_options": {"include_usage": include, "continuous_usage_stats": continuous},
    }
    plan = plan_usage(body, "chat", "vllm")
    upstream = vllm_stream(
        texts, include=plan.injected or include, continuous=plan.injected or continuous, spec=spec
    )
    # What vLLM would have sent the client for its own request, under the client's model name.
    want = b"".join(
        vllm_stream(
            texts,
            include=include,
            continuous=include and continuous,
            spec=spec and include,
            model=b"coder" if rename else b"m",
        )
    )
    # Through the relay's pipeline: arbitrary reads, the splitter, the filter per frame.
    frames, rest = split_all(data.draw(cuts(b"".join(upstream))))
    m = Measurement(0.0)
    filt = StreamFilter(
        m,
        strip_usage=plan.strip_usage,
        drop_usage_chunk=plan.drop_usage_chunk,
        rename=(b'"model":"m"', b'"model":"coder"') if rename else None,
    )
    got = b"".join(filt.frame(f, float(i)) for i, f in enumerate(frames)) + filt.release() + rest
    assert got == want
    assert m.prompt_tokens == 7
    assert m.completion_tokens == sum(1 + len(t) // 4 for t in texts)
    assert m.finish_reason == "stop"
    assert m.chunks == len(texts) + 2


# -- request side: plan_usage, upstream_body, request_view -------------------------------------------

_INJECT = st.dictionaries(
    st.sampled_from(["temperature", "top_p", "priority", "max_tokens", "min_p", "spec_decode"]),
    JSON,
    max_size=3,
)


@PURE
@given(
    body=BODY,
    inject=_INJECT,
    served=JSON_TEXT,
    endpoint=st.sampled_from(["chat", "completions", "embeddings", "responses"]),
    kind=st.sampled_from(["vllm", "openai"]),
)
def test_upstream_body_keeps_every_client_field_it_does_not_set(
    body: dict[str, Any], inject: dict[str, Any], served: str, endpoint: Any, kind: str
) -> None:
    body = orjson.loads(orjson.dumps(body))  # as the gateway has it: parsed from the wire
    before = orjson.dumps(body)
    plan = plan_usage(body, endpoint, kind)
    out = orjson.loads(upstream_body(body, inject, served, plan))
    assert orjson.dumps(body) == before  # the client's body itself is not modified
    assert out["model"] == served
    for key, value in inject.items():
        if key != "model":
            assert out[key] == value
    for key, value in body.items():
        if key in inject or key == "model":
            continue
        if key == "stream_options" and plan.injected:
            assert out[key] == {
                **(value or {}),
                "include_usage": True,
                "continuous_usage_stats": True,
            }
        else:
            assert out[key] == value, key
    assert set(out) == set(body) | set(inject) | {"model"} | (
        {"stream_options"} if plan.injected else set()
    )
    if plan.injected:
        assert endpoint in ("chat", "completions") and body.get("stream") is True


@PURE
@given(
    body=BODY,
    endpoint=st.sampled_from(["chat", "completions", "embeddings", "responses"]),
    headers=st.dictionaries(
        st.sampled_from(
            [b"x-specrouter-variant", b"x-session-id", b"x-request-id", b"authorization"]
        ),
        st.binary(max_size=16),
        max_size=3,
    ),
)
def test_request_view_and_the_policy_take_any_json_object(
    body: dict[str, Any], endpoint: Any, headers: dict[bytes, bytes]
) -> None:
    body = orjson.loads(orjson.dumps(body))
    model = body.get("model")
    model = model if isinstance(model, str) and model else "coder"
    view = request_view(body, endpoint, model, "agent", headers, 1.0)
    assert view.model == model
    decision = decide(view, LiveState(), DEMO_POLICY)
    assert decision.rejection is not None or decision.backend is not None
    if decision.rejection is not None:
        assert 400 <= decision.rejection.status < 600


DEMO_POLICY = compile_policy(
    load_policy(Path(__file__).resolve().parents[2] / "policies" / "demo.yaml")
)


@PURE
@given(
    st.one_of(
        SSE_BYTES,
        JSON.map(orjson.dumps),
        st.dictionaries(st.sampled_from(["usage", "choices", "metrics", "error"]), JSON).map(
            orjson.dumps
        ),
    )
)
def test_measurement_reads_any_non_streaming_body(body: bytes) -> None:
    read_body(Measurement(0.0), body)


# -- a raw backend that misbehaves, behind the real gateway ---------------------------------------

Script = Callable[[asyncio.StreamWriter, dict[str, Any]], Awaitable[None]]
HEAD_OK = b"HTTP/1.1 200 OK\r\nconnection: close\r\n"


def _sse_head(chunked: bool = True) -> bytes:
    return (
        HEAD_OK
        + b"content-type: text/event-stream; charset=utf-8\r\n"
        + (b"transfer-encoding: chunked\r\n\r\n" if chunked else b"\r\n")
    )


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


async def _send_chunks(w: asyncio.StreamWriter, frames: list[bytes], *, end: bool = True) -> None:
    w.write(_sse_head())
    for frame in frames:
        w.write(_chunk(frame))
        await w.drain()
    if end:
        w.write(b"0\r\n\r\n")
    await w.drain()


def _upstream(req: dict[str, Any], texts: list[str]) -> list[bytes]:
    """What vLLM would stream for the (gateway-rewritten) request it got."""
    opts = req.get("stream_options") or {}
    return vllm_stream(
        texts,
        include=opts.get("include_usage") is True,
        continuous=opts.get("continuous_usage_stats") is True,
        model=req["model"].encode(),
    )


TEXTS = ["def ", "parse", "(x):\n", "    return x"]
HUGE = "y" * (8 << 20)


async def s_vllm(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    await _send_chunks(w, _upstream(req, TEXTS))


async def s_garbage(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    await _send_chunks(w, GARBAGE)


GARBAGE = [
    b"data: {not json at all\n\n",
    b"\x00\xff\xfe\x80 binary\n\n",
    b": keep-alive\n\n",
    b"event: weird\ndata: [1,2\n\n",
    b'data: {"choices":[{"finish_reason":"\xff\n\n',
    b"data: [DONE]\n\n",
]


async def s_no_done(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    await _send_chunks(w, _upstream(req, TEXTS)[:-1])


async def s_truncated_chunked(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    frames = _upstream(req, TEXTS)
    w.write(_sse_head() + _chunk(frames[0]) + _chunk(frames[1]) + b"1000\r\n" + frames[2][:20])
    await w.drain()


async def s_invalid_utf8(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    frames = _upstream(req, ["ok"])
    bad = frames[1].replace(b'"ok"', b'"\xff\xfe\xc3(\xed\xa0\x80"')
    await _send_chunks(w, [frames[0], bad, *frames[2:]])


async def s_huge_line(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    await _send_chunks(w, _upstream(req, [HUGE]))


async def s_bad_usage(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    frames = _upstream(req, TEXTS)
    frames[2] = frames[2].replace(b'"completion_tokens":', b'"completion_tokens":oops', 1)
    await _send_chunks(w, frames)


async def s_hang_mid_stream(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    await _send_chunks(w, _upstream(req, TEXTS)[:2], end=False)
    await asyncio.sleep(30)


async def s_crlf(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    frames = [f.replace(b"\n\n", b"\r\n\r\n") for f in _upstream(req, TEXTS)]
    await _send_chunks(w, frames)


async def s_non_json_200(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    body = b"<html><body>upstream proxy says hi</body></html>\xff"
    w.write(
        HEAD_OK + b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    )


async def s_broken_json_200(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    body = b'{"id": "x", "choices": [ {{{'
    w.write(
        HEAD_OK + b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    )


async def s_gzip_stream(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    body = gzip.compress(b"".join(_upstream(req, TEXTS)))
    w.write(
        HEAD_OK + b"content-type: text/event-stream\r\ncontent-encoding: gzip\r\n"
        b"content-length: %d\r\n\r\n" % len(body) + body
    )


async def s_truncated_body(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    w.write(
        HEAD_OK
        + b"content-type: application/json\r\ncontent-length: 5000\r\n\r\n"
        + b'{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":'
    )


async def s_gzip_body(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    body = gzip.compress(b'{"id":"cmpl-1","object":"chat.completion","choices":[]}')
    w.write(
        HEAD_OK + b"content-type: application/json\r\ncontent-encoding: gzip\r\n"
        b"content-length: %d\r\n\r\n" % len(body) + body
    )


async def s_html_500(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    body = b"<h1>500 Internal Server Error</h1>"
    w.write(
        b"HTTP/1.1 500 Internal Server Error\r\nconnection: close\r\ncontent-type: text/html"
        b"\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    )


async def s_utf8_header(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    body = b'{"id":"cmpl-1","object":"chat.completion","choices":[]}'
    w.write(
        HEAD_OK + b"content-type: application/json\r\nx-upstream-note: 5 \xe2\x82\xac\r\n"
        b"content-length: %d\r\n\r\n" % len(body) + body
    )


async def s_garbage_status(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    w.write(b"HTTP/1.1 twohundred OK\r\n\r\nwhatever")


async def s_close_at_once(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    pass


async def s_empty_stream(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    await _send_chunks(w, [])


async def s_responses_no_end(w: asyncio.StreamWriter, req: dict[str, Any]) -> None:
    await _send_chunks(
        w,
        [
            b'event: response.created\ndata: {"type":"response.created"}\n\n',
            b'event: response.output_text.delta\ndata: {"delta":"hi"}\n\n',
        ],
    )


SCRIPTS: dict[str, Script] = {
    name.removeprefix("s_"): fn for name, fn in globals().items() if name.startswith("s_")
}


class RawBackend:
    """An asyncio HTTP/1.1 server on loopback, in its own thread, that answers /health and
    /metrics like vLLM and every POST with the script named by the body's `hostile` field."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: asyncio.Server | None = None
        self.url = ""
        self.requests: list[dict[str, Any]] = []

    def __enter__(self) -> RawBackend:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop
        ).result(5)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self.server is not None
            self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head = await r.readuntil(b"\r\n\r\n")
            line, *fields = head.decode("latin-1").split("\r\n")
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)
            }
            body = await r.readexactly(int(headers.get("content-length", "0")))
            if line.startswith("GET "):
                w.write(HEAD_OK + b"content-type: text/plain\r\ncontent-length: 0\r\n\r\n")
            else:
                req = orjson.loads(body)
                self.requests.append(req)
                await SCRIPTS[req["hostile"]](w, req)
            await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a client gone, or the server stopping (a hanging script is cancelled)
        finally:
            w.close()


@pytest.fixture(scope="module")
def raw_gateway(certs: CertFiles) -> Iterator[tuple[GatewayServer, RawBackend]]:
    with RawBackend() as backend:
        # One variant and no fallback: what the backend did reaches the client, not a retry.
        policy = coder_policy({"raw": backend.url}, defaults={})
        with GatewayServer(
            policy, certs=certs, args=("--first-byte-timeout", "3", "--idle-timeout", "2")
        ) as gw:
            yield gw, backend


@pytest.fixture
def client(raw_gateway: tuple[GatewayServer, RawBackend]) -> Iterator[httpx.Client]:
    gw, _ = raw_gateway
    ctx = ssl.create_default_context(cafile=str(gw.certs.ca_cert))
    with httpx.Client(
        base_url=gw.base,
        verify=ctx,
        timeout=httpx.Timeout(10.0, connect=5.0),
        headers={"authorization": f"Bearer {CLIENT_KEY}"},
    ) as c:
        _wait_ready(c)
        yield c


def _wait_ready(c: httpx.Client) -> None:
    """A failed request may mark the backend down; health checks bring it back in ~0.5 s."""
    deadline = time.monotonic() + 10
    while c.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, "backend never came back up"
        time.sleep(0.1)


def _post(
    c: httpx.Client,
    script: str,
    *,
    stream: bool = True,
    path: str = "/v1/chat/completions",
    **extra: Any,
) -> tuple[int, dict[str, str], bytes, str | None]:
    """POST and read to the end under a hard wall-clock limit: status, headers, body, and the
    transport error the client saw, if any."""
    body = {
        "model": "coder",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        "hostile": script,
        **extra,
    }
    started = time.monotonic()
    chunks: list[bytes] = []
    error = None
    with c.stream("POST", path, json=body) as r:
        try:
            for chunk in r.iter_raw():
                chunks.append(chunk)
                assert time.monotonic() - started < 20, "the response never ended"
        except httpx.TransportError as exc:
            error = f"{type(exc).__name__}: {exc}"
        status, headers = r.status_code, dict(r.headers)
    return status, headers, b"".join(chunks), error


def _client_view(texts: list[str]) -> bytes:
    """What the client should get for a stream without stream_options, model renamed."""
    return b"".join(vllm_stream(texts, include=False, continuous=False, model=b"coder"))


def _error_event(body: bytes) -> dict[str, Any]:
    """The stream ends with vLLM's error event and `[DONE]`; its error object."""
    assert body.endswith(sse.DONE), body[-300:]
    last = body[: -len(sse.DONE)].rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"data: "), last
    err: dict[str, Any] = json.loads(last[6:])["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["code"], int)
    return err


def _openai_error(status: int, body: bytes) -> dict[str, Any]:
    err: dict[str, Any] = orjson.loads(body)["error"]
    assert err["code"] in (status, str(status)) and err["message"], err
    return err


E2E = pytest.mark.timeout(60)


@E2E
def test_raw_backend_baseline_is_byte_identical(client: httpx.Client) -> None:
    status, _, body, error = _post(client, "vllm")
    assert (status, error) == (200, None)
    assert body == _client_view(TEXTS)


@E2E
def test_garbage_frames_reach_the_client_as_they_came(client: httpx.Client) -> None:
    status, _, body, error = _post(client, "garbage")
    assert (status, error) == (200, None)
    assert body == b"".join(GARBAGE)


@E2E
def test_a_stream_without_done_ends_with_an_error_event(client: httpx.Client) -> None:
    status, _, body, error = _post(client, "no_done")
    assert (status, error) == (200, None)
    assert body.startswith(_client_view(TEXTS)[: -len(sse.DONE)])
    assert _error_event(body)["code"] == 502


@E2E
def test_truncated_chunked_encoding_ends_with_an_error_event(client: httpx.Client) -> None:
    status, _, body, error = _post(client, "truncated_chunked")
    assert (status, error) == (200, None)
    assert body.startswith(_client_view(TEXTS)[:100])
    assert _error_event(body)["code"] == 502


@E2E
def test_invalid_utf8_is_relayed_byte_for_byte(client: httpx.Client) -> None:
    status, _, body, error = _post(client, "invalid_utf8")
    assert (status, error) == (200, None)
    assert body == _client_view(["ok"]).replace(b'"ok"', b'"\xff\xfe\xc3(\xed\xa0\x80"')


@E2E
def test_an_enormous_single_line_is_relayed_whole(client: httpx.Client) -> None:
    status, _, body, error = _post(client, "huge_line")
    assert (status, error) == (200, None)
    assert body == _client_view([HUGE])


@E2E
def test_a_silent_backend_mid_stream_ends_with_an_error_event(client: httpx.Client) -> None:
    started = time.monotonic()
    status, _, body, error = _post(client, "hang_mid_stream")
    assert (status, error) == (200, None)
    assert _error_event(body)["code"] == 504
    assert time.monotonic() - started < 8  # the gateway's --idle-timeout is 2 s


@E2E
def test_a_responses_stream_without_its_terminal_event_ends_with_an_error_event(
    client: httpx.Client,
) -> None:
    status, _, body, error = _post(client, "responses_no_end", path="/v1/responses", input="hi")
    assert (status, error) == (200, None)
    assert body.endswith(b"\n\n")
    last = body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"event: error\ndata: "), last
    assert json.loads(last.split(b"data: ", 1)[1])["code"] == "502"


@E2E
@pytest.mark.parametrize("script", ["non_json_200", "broken_json_200"])
def test_a_200_that_says_json_but_is_not_is_a_bad_gateway(
    client: httpx.Client, script: str
) -> None:
    """Relayed as it came once, a 200 the client's SDK could not parse: a non-streaming answer
    is read whole (bounded) and parsed before its status goes out."""
    status, headers, body, error = _post(client, script, stream=False)
    assert (status, error) == (502, None)
    assert "not JSON" in _openai_error(502, body)["message"]
    assert b"upstream proxy says hi" not in body and b"{{{" not in body


@E2E
@pytest.mark.parametrize(
    ("script", "status"), [("garbage_status", 502), ("close_at_once", 502), ("empty_stream", 502)]
)
def test_a_backend_that_fails_before_its_first_byte_gives_an_openai_error(
    client: httpx.Client, script: str, status: int
) -> None:
    got, headers, body, error = _post(client, script)
    assert (got, error) == (status, None), body
    assert headers["content-type"] == "application/json"
    _openai_error(status, body)


@E2E
def test_a_backend_500_with_an_html_body_is_relayed_with_its_body(client: httpx.Client) -> None:
    status, _, body, error = _post(client, "html_500", stream=False)
    assert (status, error) == (500, None)
    assert body == b"<h1>500 Internal Server Error</h1>"


@E2E
def test_a_malformed_usage_object_does_not_cut_the_stream(client: httpx.Client) -> None:
    status, _, body, error = _post(client, "bad_usage")
    assert (status, error) == (200, None)
    assert body.endswith(sse.DONE)


@E2E
def test_a_truncated_non_streaming_body_is_not_passed_off_as_complete(client: httpx.Client) -> None:
    status, _, body, error = _post(client, "truncated_body", stream=False)
    assert (status, error) == (502, None)  # read whole before the status: refused
    assert "cut short" in _openai_error(502, body)["message"]


@E2E
def test_a_body_cut_short_after_its_status_ends_the_response_broken_and_quietly(
    raw_gateway: tuple[GatewayServer, RawBackend], client: httpx.Client
) -> None:
    """A streaming request answered with a JSON body (relayed as it comes) that breaks: the
    client sees a broken body, and the gateway ends the response itself (not uvicorn's
    "returned without completing response" error)."""
    status, _, body, error = _post(client, "truncated_body")
    assert status == 200
    assert error is not None, f"a complete-looking 200 with a truncated body: {body!r}"
    _, _, body, error = _post(client, "vllm")  # a request after it: its log lines came first
    assert error is None
    assert not [line for line in raw_gateway[0].output if "without completing" in line]


@E2E
def test_a_backend_header_outside_latin1_does_not_break_the_response(client: httpx.Client) -> None:
    status, headers, body, error = _post(client, "utf8_header", stream=False)
    assert (status, error) == (200, None), body
    assert body.startswith(b'{"id":"cmpl-1"')


@E2E
@pytest.mark.parametrize(("script", "stream"), [("gzip_body", False), ("gzip_stream", True)])
def test_a_compressed_backend_answer_is_refused(
    client: httpx.Client, script: str, stream: bool
) -> None:
    """Asked for `identity`, an engine that encodes its answer anyway could be neither checked
    nor measured, and its stream would carry the usage the gateway asked for: refused."""
    status, headers, body, error = _post(client, script, stream=stream)
    assert (status, error) == (502, None)
    assert "content-encoding 'gzip'" in _openai_error(502, body)["message"]


@E2E
def test_a_crlf_framed_stream_is_relayed_without_a_spurious_error(client: httpx.Client) -> None:
    status, _, body, error = _post(client, "crlf")
    assert (status, error) == (200, None)
    assert body.endswith(b"data: [DONE]\r\n\r\n"), body[-200:]


@E2E
def test_the_gateway_survived_all_of_it(
    raw_gateway: tuple[GatewayServer, RawBackend], client: httpx.Client
) -> None:
    gw, backend = raw_gateway
    status, _, body, error = _post(client, "vllm")
    assert (status, error, body) == (200, None, _client_view(TEXTS))
    assert backend.requests[-1]["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }
    assert gw.proc is not None and gw.proc.poll() is None
