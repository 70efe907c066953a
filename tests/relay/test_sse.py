"""The relay's pure parts: SSE framing and the byte edits of usage frames."""

from __future__ import annotations

import pytest

from proxy.record.measure import Measurement
from proxy.relay import sse
from proxy.relay.measure import StreamFilter

HEAD = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
ROLE = (
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
    b'"finish_reason":null}]'
)
TAIL_ROLE = b',"prompt_token_ids":null,"prompt_text":null}\n\n'


def content(text: str) -> bytes:
    return (
        b'"choices":[{"index":0,"delta":{"content":"'
        + text.encode()
        + b'"},"logprobs":null,"finish_reason":null,"token_ids":null}]'
    )


FINISH = (
    b'"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop",'
    b'"stop_reason":null,"token_ids":null}]'
)
FP = b',"system_fingerprint":"vllm-0.28.0-abcd1234"'


def usage(p: int, c: int) -> bytes:
    return b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}' % (p, p + c, c)


def upstream_stream(tokens: list[int], spec: bytes = b"") -> list[bytes]:
    """What vLLM sends with include_usage + continuous_usage_stats (injected by the gateway)."""
    frames = [HEAD + ROLE + usage(5, 0) + TAIL_ROLE]
    total = 0
    for i, t in enumerate(tokens):
        total += t
        frames.append(HEAD + content("x" * t + str(i)) + usage(5, total) + b"}\n\n")
    frames.append(HEAD + FINISH + usage(5, total) + b"}\n\n")
    frames.append(HEAD + b'"choices":[]' + usage(5, total) + FP + spec + b"}\n\n")
    frames.append(sse.DONE)
    return frames


def client_expected(tokens: list[int], *, include: bool, continuous: bool) -> bytes:
    """What vLLM would have sent for the client's own stream_options."""

    def u(c: int) -> bytes:
        return usage(5, c) if continuous else b""

    out = [HEAD + ROLE + u(0) + TAIL_ROLE]
    total = 0
    for i, t in enumerate(tokens):
        total += t
        out.append(HEAD + content("x" * t + str(i)) + u(total) + b"}\n\n")
    if include:
        out.append(HEAD + FINISH + u(total) + b"}\n\n")
        out.append(HEAD + b'"choices":[]' + usage(5, total) + FP + b"}\n\n")
    else:
        out.append(HEAD + FINISH + FP + b"}\n\n")
    out.append(sse.DONE)
    return b"".join(out)


@pytest.mark.parametrize("split", [1, 3, 7, 64, 10_000])
def test_splitter_reassembles_frames_at_any_split(split: int) -> None:
    stream = b"".join(upstream_stream([1, 3, 4, 2]))
    splitter = sse.FrameSplitter()
    frames: list[bytes] = []
    for i in range(0, len(stream), split):
        frames += splitter.feed(stream[i : i + split])
    assert b"".join(frames) == stream
    assert all(f.endswith(b"\n\n") and f.count(b"\n\n") == 1 for f in frames)
    assert splitter.flush() == b""


def test_splitter_keeps_a_truncated_tail() -> None:
    splitter = sse.FrameSplitter()
    assert splitter.feed(b"data: {}\n\ndata: {") == [b"data: {}\n\n"]
    assert splitter.flush() == b"data: {"


@pytest.mark.parametrize(
    ("include", "continuous", "strip", "drop"),
    [
        (False, False, True, True),  # the client asked for nothing: usage frames all removed
        (True, False, True, False),  # include_usage only: per-chunk usage removed
    ],
)
def test_filter_gives_the_client_vllms_bytes_for_its_own_request(
    include, continuous, strip, drop
) -> None:
    tokens = [1, 4, 3, 5, 2]
    m = Measurement(0.0)
    filt = StreamFilter(m, strip_usage=strip, drop_usage_chunk=drop)
    out = b"".join(filt.frame(f, float(i)) for i, f in enumerate(upstream_stream(tokens)))
    out += filt.release()
    assert out == client_expected(tokens, include=include, continuous=continuous)
    assert m.completion_tokens == sum(tokens)
    assert m.prompt_tokens == 5
    # The first content chunk is the prefill step; decode steps follow.
    assert list(m.step_tokens) == tokens[1:]
    assert m.acceptance == pytest.approx(sum(tokens[1:]) / len(tokens[1:]))
    assert m.finish_reason == "stop"


def test_filter_prefers_the_engines_exact_acceptance() -> None:
    spec = (
        b',"metrics":{"speculative_decoding":{"mean_acceptance_length":3.5,'
        b'"draft_acceptance_rate":0.4,"acceptance_histogram":[0,1,1,0],"num_spec_steps":2,'
        b'"num_accepted_draft_tokens":5,"num_draft_tokens":14,"num_spec_tokens":7}}'
    )
    m = Measurement(0.0)
    filt = StreamFilter(m, strip_usage=True, drop_usage_chunk=True)
    out = b"".join(filt.frame(f, 0.0) for f in upstream_stream([1, 3, 4], spec))
    assert b"metrics" not in out and b"usage" not in out
    assert m.acceptance == 3.5
    assert m.accepted_and_steps == (5, 2)


def test_filter_renames_the_served_model() -> None:
    m = Measurement(0.0)
    filt = StreamFilter(m, rename=(b'"model":"m"', b'"model":"coder"'))
    out = filt.frame(HEAD + content("a") + b"}\n\n", 0.0)
    assert b'"model":"coder"' in out and b'"model":"m"' not in out


def test_filter_records_an_error_event() -> None:
    m = Measurement(0.0)
    filt = StreamFilter(m)
    frame = b'data: {"error": {"message": "boom", "type": "InternalServerError"}}\n\n'
    assert filt.frame(frame, 0.0) == frame
    assert m.error == "boom"


@pytest.mark.parametrize(
    ("data", "start", "end"),
    [
        (b'{"a":1}', 0, 7),
        (b'x{"a":{"b":2},"c":3}y', 1, 20),
        (b'{"s":"}{"}', 0, 10),
        (b'{"a":1', 0, -1),
    ],
)
def test_object_end(data: bytes, start: int, end: int) -> None:
    assert sse.object_end(data, start) == end
