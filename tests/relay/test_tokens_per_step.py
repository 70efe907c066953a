"""Tokens per target step, one definition (proxy/record/steps.py): (completion tokens - 1) /
decode steps, for every engine kind, API and source. Each case is one request's bytes as the
engine sends them, through the relay's own readers; the truth is what the engine did (its
decode steps), never the engine's own mean."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import pytest

from proxy.record.measure import Measurement
from proxy.record.steps import (
    StepCount,
    decode_steps,
    estimate_steps,
    pooled,
    steps_of,
)
from proxy.relay.events import reader_for
from proxy.relay.measure import StreamFilter, read_body, withhold_estimate


def _data(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _event(kind: str, obj: dict[str, object]) -> bytes:
    return b"event: " + kind.encode() + b"\n" + _data(obj)


def _summary(accepted: int, drafted_steps: int, k: int) -> dict[str, object]:
    """vLLM 0.32+'s `metrics.speculative_decoding` (RequestSpecDecodeMetrics.to_dict)."""
    return {
        "mean_acceptance_length": 1 + accepted / drafted_steps if drafted_steps else 1.0,
        "num_spec_steps": drafted_steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted_steps * k,
        "num_spec_tokens": k,
    }


def chat(
    chunks: list[int],
    *,
    summary: dict[str, object] | None = None,
    tool_from: int | None = None,
    completions: bool = False,
) -> list[bytes]:
    """A chat (or completions) stream with continuous usage: one chunk per engine output of
    `chunks[i]` tokens (the first is the prefill's), then the usage chunk."""
    out, total = [], 0
    for i, n in enumerate(chunks):
        total += n
        if completions:
            choice: dict[str, object] = {"index": 0, "text": "x" * n, "finish_reason": None}
        elif tool_from is not None and i >= tool_from:
            call = {"index": 0, "function": {"arguments": "{" * n}}
            choice = {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}
        else:
            choice = {"index": 0, "delta": {"content": "x" * n}, "finish_reason": None}
        usage = {"prompt_tokens": 5, "total_tokens": 5 + total, "completion_tokens": total}
        out.append(_data({"id": "c", "choices": [choice], "usage": usage}))
    last: dict[str, object] = {
        "id": "c",
        "choices": [],
        "usage": {"prompt_tokens": 5, "total_tokens": 5 + total, "completion_tokens": total},
    }
    if summary is not None:
        last["metrics"] = {"speculative_decoding": summary}
    return [*out, _data(last), b"data: [DONE]\n\n"]


def responses(events: int, tokens: int, *, tool: bool = False) -> list[bytes]:
    kind = "response.function_call_arguments.delta" if tool else "response.output_text.delta"
    out = [_event("response.created", {"type": "response.created"})]
    out += [_event(kind, {"type": kind, "delta": "x"}) for _ in range(events)]
    usage = {"input_tokens": 5, "output_tokens": tokens, "input_tokens_details": {}}
    final = {"type": "response.completed", "response": {"status": "completed", "usage": usage}}
    return [*out, _event("response.completed", final)]


def messages(events: int, tokens: int, *, tool: bool = False) -> list[bytes]:
    delta = {"type": "input_json_delta", "partial_json": "{"} if tool else {"type": "text_delta"}
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 5}}}
    out = [_event("message_start", start)]
    out += [
        _event("content_block_delta", {"type": "content_block_delta", "delta": delta})
        for _ in range(events)
    ]
    end = {"type": "message_delta", "usage": {"output_tokens": tokens}}
    return [*out, _event("message_delta", end)]


def llamacpp(tokens: int, accepted: int, *, timings: bool = True) -> list[bytes]:
    """llama.cpp: one frame per token, its own `timings` on the finish chunk."""
    out = [
        _data({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]})
        for _ in range(tokens)
    ]
    last: dict[str, object] = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    if timings:
        last["timings"] = {
            "prompt_n": 5,
            "cache_n": 0,
            "predicted_n": tokens,
            "draft_n": 3 * accepted,
            "draft_n_accepted": accepted,
        }
    return [*out, _data(last), b"data: [DONE]\n\n"]


@dataclass(frozen=True)
class Case:
    frames: list[bytes]
    endpoint: str = "chat"
    k: int | None = None  # the policy's num_speculative_tokens
    llama: bool = False
    interval: int | None = None


def measure(case: Case) -> Measurement:
    m = Measurement(0.0, stream=True)
    body: dict[str, object] = {"stream": True}
    if case.interval is not None:
        body["stream_interval"] = case.interval
    withhold_estimate(m, body, case.k)
    filt = StreamFilter(m, engine_timings=case.llama, events=reader_for(case.endpoint, m))
    for i, frame in enumerate(case.frames):
        filt.frame(frame, 1.0 + i)
    return m


# (case, source, tokens per step): the decode steps are the engine's, by construction.
CASES = {
    # vLLM (and the simulator), chat: one chunk per decode step of 1 + accepted tokens.
    "vllm-chat-chunks": (Case(chat([1, 3, 2, 4])), "chunks", 9 / 3),
    "vllm-completions-chunks": (Case(chat([1, 3, 2, 4], completions=True)), "chunks", 9 / 3),
    # Draft model / MTP / EAGLE / DFlash: a draft at every step, so the summary's steps are the
    # decode steps. Its 2 accepted drafts of the last step fell past max_tokens: 1 + 7 / 3 (its
    # mean) counts them, (10 - 1) / 3 does not.
    "vllm-draft-every-step-summary": (
        Case(chat([1, 3, 2, 4], summary=_summary(7, 3, 3))),
        "engine",
        9 / 3,
    ),
    # One output held back by the detokenizer (two steps in one chunk): the summary's steps win
    # over the chunk count.
    "vllm-held-back-output-summary": (
        Case(chat([1, 3, 4], summary=_summary(4, 3, 3))),
        "engine",
        7 / 3,
    ),
    # ngram: 5 decode steps, 2 of them with a draft (3 accepted). The summary's mean says
    # 1 + 3 / 2 = 2.5; the engine made 8 tokens in 5 steps.
    "vllm-ngram-summary": (
        Case(chat([1, 1, 1, 4, 1, 1], summary=_summary(3, 2, 3))),
        "engine",
        8 / 5,
    ),
    # ngram, its last drafted step cut by max_tokens (2 of its 3 accepted drafts counted past
    # the end): the chunk count (5 steps) is the floor.
    "vllm-ngram-cut-summary": (
        Case(chat([1, 1, 1, 3, 1, 2], summary=_summary(5, 2, 3))),
        "engine",
        8 / 5,
    ),
    # A non-streaming response: the summary alone.
    "vllm-full-body-summary": (None, "engine", 9 / 3),
    # Responses and Messages: no per-event usage; one step per token event after the first.
    "vllm-responses-average": (Case(responses(4, 10), "responses"), "average", 9 / 3),
    "vllm-messages-average": (Case(messages(4, 10), "messages"), "average", 9 / 3),
    # llama.cpp: its timings; (predicted - 1) / (predicted - 1 - accepted), not
    # predicted / (predicted - accepted) (64 tokens, 49 accepted: 4.50, not 4.27).
    "llamacpp-chat-engine": (Case(llamacpp(64, 49), llama=True), "engine", 63 / 14),
    "llamacpp-full-body-engine": (None, "engine", 63 / 14),
}

WITHHELD = {
    # A tool-call parser buffers the call's tokens (a real vLLM sent 21 and 14 in one chunk).
    "chat-tool-call": Case(chat([1, 2, 21, 14], tool_from=2)),
    "responses-tool-call": Case(responses(3, 40, tool=True), "responses"),
    "messages-tool-call": Case(messages(3, 40, tool=True), "messages"),
    # More tokens per chunk than a step gives (k = 3): outputs were merged.
    "chat-merged": Case(chat([1, 3, 9]), k=3),
    # A request average above draft length + 1 (block 7: 8 at most) cannot be steps.
    "responses-above-k+1": Case(responses(3, 30), "responses", k=7),
    # A client's stream_interval: chunks are not steps.
    "chat-stream-interval": Case(chat([1, 8, 8]), interval=8),
    # llama.cpp's frames are tokens, not steps: without its timings there is nothing.
    "llamacpp-no-timings": Case(llamacpp(20, 0, timings=False), llama=True),
}


@pytest.mark.parametrize("name", CASES)
def test_tokens_per_step(name: str) -> None:
    case, source, expected = CASES[name]
    if case is None:  # a whole JSON body
        m = Measurement(0.0)
        if name.startswith("llamacpp"):
            body = {"usage": {"completion_tokens": 64}, "timings": {"predicted_n": 64}}
            body["timings"] |= {"draft_n_accepted": 49, "draft_n": 60}
        else:
            body = {"usage": {"completion_tokens": 10}, "metrics": {}}
            body["metrics"] = {"speculative_decoding": _summary(7, 3, 3)}
        read_body(m, orjson.dumps(body))
    else:
        m = measure(case)
    assert (m.tps_source, m.acceptance) == (source, pytest.approx(expected))
    count = m.step_count
    assert count is not None and count.tokens == m.completion_tokens - 1
    assert m.accepted_and_steps == (count.tokens - count.steps, count.steps)


@pytest.mark.parametrize("name", WITHHELD)
def test_withheld_where_nothing_can_be_right(name: str) -> None:
    m = measure(WITHHELD[name])
    assert m.completion_tokens > 1
    assert (m.tps_source, m.acceptance, m.step_count) == (None, None, None)


def test_ngram_without_a_stream_is_withheld() -> None:
    """ngram, a whole JSON body: 2 drafted steps, 5 accepted drafts of which vLLM counted some
    past max_tokens (a real vLLM 0.32 logged 60 accepted where 56 reached a 96-token answer).
    No chunk count floors the steps, so `tokens - accepted` could be steps short: withheld. A
    summary whose drafted steps account for every step (a draft model's) is still read."""
    for summary, expected in ((_summary(5, 2, 3), None), (_summary(6, 3, 3), 9 / 3)):
        m = Measurement(0.0)
        body = {"usage": {"completion_tokens": 10}, "metrics": {"speculative_decoding": summary}}
        read_body(m, orjson.dumps(body))
        assert m.acceptance == (None if expected is None else pytest.approx(expected))


def test_tool_call_stream_keeps_the_engines_summary() -> None:
    m = measure(Case(chat([1, 2, 21, 14], tool_from=2, summary=_summary(25, 12, 3))))
    # 37 tokens after the first; 12 drafted steps, 37 - 25 = 12: both say 12 steps
    assert (m.tps_source, m.acceptance) == ("engine", pytest.approx(37 / 12))


def test_never_above_draft_length_plus_one() -> None:
    """An engine figure beyond what a step can give is clamped to the physical maximum (the
    policy's draft length, else the summary's own `num_spec_tokens`)."""
    for k in (3, None):
        m = measure(Case(chat([1, 4, 4]), k=k))
        m.spec = {"num_accepted_draft_tokens": 7, "num_spec_steps": 1, "num_spec_tokens": 3}
        assert m.tps_source == "engine" and m.acceptance == pytest.approx(8 / 2)


@pytest.mark.parametrize(
    ("bounds", "steps"),
    [
        ({"accepted": 6}, 4),  # no draft counted: tokens less accepted
        ({"accepted": 6, "drafted_steps": 5}, 5),  # drafts past the end counted
        ({"accepted": 2, "drafted_steps": 3}, 8),  # ngram: undrafted steps
        ({"chunks": 7, "accepted": 6, "drafted_steps": 3}, 7),  # held-back floor
        ({"chunks": 2, "max_step_tokens": 2}, 5),  # the physical floor
        ({}, None),  # nothing to count by
    ],
)
def test_decode_steps_is_the_largest_lower_bound(bounds: dict[str, int], steps: int | None) -> None:
    got = decode_steps(11, **bounds)
    assert (got.steps if got else None) == steps


def test_arithmetic() -> None:
    assert decode_steps(1, accepted=0) is None  # no decode step
    assert estimate_steps(11, 2, 4) is None  # 5 a step with 4 at most: withheld
    assert estimate_steps(11, 5, 4) == StepCount(10, 5)
    assert pooled([StepCount(10, 5), StepCount(30, 10)]) == pytest.approx(40 / 15)
    assert pooled([]) is None
    assert steps_of(100.5, accepted=50.5, drafted_steps=40.0) == 50.0  # windows of floats


def _scrape(t: float, gen: float, first: float, drafts: float, accepted: float) -> str:
    return (
        "# TYPE vllm:generation_tokens_total counter\n"
        f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}\n'
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}\n'
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}\n'
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {first}\n'
        f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {first}\n'
        f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {first / 10}\n'
    )


@pytest.mark.parametrize(
    ("gen", "first", "drafts", "accepted", "expected"),
    [
        (104, 4, 40, 62, 100 / 40),  # every step drafts; 2 accepted past answers' ends
        (104, 4, 10, 30, 100 / 70),  # ngram: 10 of 70 steps drafted (1 + 30 / 10 = 4.0)
        (104, 4, 0, 0, None),  # no speculative decoding
    ],
)
def test_backend_window_by_the_same_definition(
    gen: float, first: float, drafts: float, accepted: float, expected: float | None
) -> None:
    """The guards' and the dashboard's per-backend figure, from the engine's counters."""
    from proxy.backends.health import EngineWindow, parse_vllm_metrics

    window = EngineWindow()
    window.add(parse_vllm_metrics(_scrape(0.0, 1000, 10, 100, 150), 0.0))
    after = _scrape(5.0, 1000 + gen, 10 + first, 100 + drafts, 150 + accepted)
    window.add(parse_vllm_metrics(after, 5.0))
    got = window.acceptance(60.0)
    assert got == (None if expected is None else pytest.approx(expected))
