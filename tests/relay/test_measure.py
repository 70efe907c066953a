"""The measures' one meaning (proxy/record/measure.py; the filter, relay/measure.py, events.py),
sans-io: TTFT at the first token frame, per-token ITL, where tokens per step comes from, Server-Timing, and the Messages
and Responses readers on vLLM's golden bytes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.record.measure import TPS_SOURCES, Measurement
from proxy.relay.events import MessagesReader, ResponsesReader, reader_for
from proxy.relay.measure import StreamFilter, read_body
from tests.golden import GOLDEN


def _frames(path: Path) -> list[bytes]:
    return [f + b"\n\n" for f in path.read_bytes().split(b"\n\n") if f.strip()]


def _relay(path: Path, endpoint: str) -> tuple[Measurement, bytes, list[bytes]]:
    """Every frame through the filter at t = 1, 2, 3, ... s: the measurement, the bytes out."""
    m = Measurement(0.0, stream=True)
    filt = StreamFilter(m, events=reader_for(endpoint, m))
    frames = _frames(path)
    out = b"".join(filt.frame(f, float(i + 1)) for i, f in enumerate(frames)) + filt.release()
    return m, out, frames


def _first(frames: list[bytes], marker: bytes) -> float:
    return float(next(i for i, f in enumerate(frames) if marker in f) + 1)


@pytest.mark.parametrize("version", ["0.28.0", "0.33.0"])
@pytest.mark.parametrize(
    "name, marker, output, finish",
    [
        ("anth_stream_plain", b'"text_delta"', 14, "end_turn"),
        ("anth_stream_reasoning", b'"thinking_delta"', None, None),
        ("anth_stream_tools_qwen3_coder", b'"thinking_delta"', None, "tool_use"),
        ("anth_stream_tools_qwen3_coder_noreasoning", b'"input_json_delta"', None, "tool_use"),
        ("anth_stream_max_tokens", b'"text_delta"', None, "max_tokens"),
    ],
)
def test_messages_reader_on_the_golden_streams(
    version: str, name: str, marker: bytes, output: int | None, finish: str | None
) -> None:
    m, out, frames = _relay(GOLDEN / version / f"{name}.sse", "messages")
    assert out == b"".join(frames)  # read only
    assert any(marker in f for f in frames)
    # not message_start, content_block_start or a thinking block's signature
    assert m.ttft == _first(frames, b"event: content_block_delta")
    deltas = sum(
        1
        for f in frames
        if f.startswith(b"event: content_block_delta") and b"signature_delta" not in f
    )
    assert m.delta_events == deltas
    assert m.prompt_tokens in (17, 19) and m.completion_tokens > 0
    if output is not None:
        assert m.completion_tokens == output
    if finish is not None:
        assert m.finish_reason == finish
    if b'"input_json_delta"' in out:  # a tool-call parser buffers tokens: events are not steps
        assert (m.tps_source, m.acceptance, m.estimate_void) == (None, None, "tool_calls")
    else:
        assert m.tps_source == "average"
        assert m.acceptance == pytest.approx((m.completion_tokens - 1) / (deltas - 1))
    last_delta = (
        max(
            i
            for i, f in enumerate(frames)
            if b'_delta"' in f
            and f.startswith(b"event: content_block_delta")
            and b"signature_delta" not in f
        )
        + 1
    )
    itl = m.itl_per_token()
    assert len(itl) == m.completion_tokens - 1
    assert itl[0] == pytest.approx((last_delta - m.ttft) / (m.completion_tokens - 1))


def test_messages_reader_cached_tokens_and_error() -> None:
    m, _, _ = _relay(GOLDEN / "0.28.0" / "anth_stream_prompt_tokens_details.sse", "messages")
    assert (m.prompt_tokens, m.cached_tokens, m.completion_tokens) == (17, 16, 14)
    m, _, _ = _relay(GOLDEN / "0.28.0" / "anth_stream_error_midstream.sse", "messages")
    assert m.error is not None and "validation errors" in m.error


@pytest.mark.parametrize(
    "version, name, final, output",
    [
        ("0.28.0", "responses_stream", "completed", 14),
        ("0.33.0", "responses_stream", "completed", 14),
        ("0.33.0", "responses_stream_truncated", "max_output_tokens", 11),
    ],
)
def test_responses_measured_like_chat(version: str, name: str, final: str, output: int) -> None:
    path = GOLDEN / version / f"{name}.sse"
    m, out, frames = _relay(path, "responses")
    assert out == b"".join(frames)
    assert m.ttft == _first(frames, b"event: response.output_text.delta")  # not .created
    assert m.ttft is not None and m.ttft > 1.0
    assert (m.prompt_tokens, m.cached_tokens, m.completion_tokens) == (17, 0, output)
    assert m.finish_reason == final
    assert m.tps_source == "average" and m.acceptance is not None and m.acceptance > 1


def test_chat_ttft_is_the_first_token_frame_not_the_role_chunk() -> None:
    role = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    tok = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"def"}}]}\n\n'
    tool = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
        b'"function":{"arguments":"{"}}]}}]}\n\n'
    )
    for first_token in (tok, tool):
        m = Measurement(0.0, stream=True)
        filt = StreamFilter(m)
        filt.frame(b": keep-alive\n\n", 0.5)
        filt.frame(role, 1.0)
        filt.frame(first_token, 2.0)
        assert m.ttft == 2.0
    usage_role = role.replace(
        b"}]}", b'}],"usage":{"prompt_tokens":5,"total_tokens":5,"completion_tokens":0}}'
    )
    usage_tok = tok.replace(
        b"}]}", b'}],"usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1}}'
    )
    m = Measurement(0.0, stream=True)
    filt = StreamFilter(m)
    filt.frame(usage_role, 1.0)
    filt.frame(usage_tok, 3.0)
    assert m.ttft == 3.0


def test_a_non_streaming_request_has_no_ttft() -> None:
    m = Measurement(0.0)
    m.t_first_byte, m.t_end = 0.4, 0.5
    read_body(
        m,
        b'{"choices":[{"finish_reason":"stop"}],"usage":{"prompt_tokens":3,'
        b'"total_tokens":5,"completion_tokens":2}}',
    )
    assert m.ttft is None and m.e2e == 0.5 and m.completion_tokens == 2
    assert m.tps_source is None and m.acceptance is None


def test_tps_source_values() -> None:
    assert TPS_SOURCES == ("engine", "chunks", "average")
    m = Measurement(0.0, stream=True)
    for total, t in ((1, 1.0), (4, 1.1), (6, 1.2)):
        m.record_tokens(total, t)
    assert m.tps_source == "chunks" and m.acceptance == pytest.approx(2.5)
    assert m.itl_per_token() == pytest.approx([0.1 / 3] * 3 + [0.05] * 2)
    # The engine's summary: 3 drafted steps (one output held back: 2 chunks); its mean
    # (1 + 2 / 3) is not the figure, (6 - 1) / 3 is.
    m.spec = {"num_accepted_draft_tokens": 2, "num_spec_steps": 3, "mean_acceptance_length": 1.67}
    assert m.tps_source == "engine" and m.acceptance == pytest.approx(5 / 3)
    assert m.accepted_and_steps == (2, 3)
    avg = Measurement(0.0, stream=True)
    for t in (1.0, 2.0, 3.0):
        avg.record_delta(t)
    avg.record_usage({"input_tokens": 3, "output_tokens": 7})
    assert avg.tps_source == "average" and avg.acceptance == pytest.approx(3.0)
    assert avg.accepted_and_steps == (4, 2)
    assert avg.itl_per_token() == pytest.approx([2.0 / 6] * 6)


_TIMING = re.compile(r"(\w+);dur=([\d.]+)")


def parse_server_timing(value: str) -> dict[str, float]:
    return {k: float(v) for k, v in _TIMING.findall(value)}


def test_server_timing_and_phases() -> None:
    m = Measurement(10.0, stream=True)
    assert parse_server_timing(m.server_timing(10.002).decode()) == {"gw": 2.0}
    m.t_engine, m.t_headers = 10.0004, 10.8127
    assert parse_server_timing(m.server_timing(10.9).decode()) == {"gw": 0.4, "engine": 812.3}
    m.t_first_token, m.t_end = 11.0, 12.0
    assert m.phases() == pytest.approx(
        {"gateway": 0.0004, "engine_headers": 0.8123, "first_token": 0.1873, "end": 1.0}
    )
    assert sum(m.phases().values()) == pytest.approx(m.e2e)


def test_readers_by_api_name() -> None:
    m = Measurement(0.0)
    assert isinstance(reader_for("messages", m), MessagesReader)
    assert isinstance(reader_for("responses", m), ResponsesReader)
    assert reader_for("chat", m) is None
