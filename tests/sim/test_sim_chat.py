"""Wire format of /v1/chat/completions and /v1/completions against a real sim (byte level)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from loadtests.harness.sim import SimServer, sse_data

MODEL = "coder"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    """0.28 mode, the deployment's: no per-request summary (a 0.29+ flag)."""
    with SimServer("dflash7-prob-block", served_model_name=MODEL) as s:
        yield s


@pytest.fixture(scope="module")
def summary_sim() -> Iterator[SimServer]:
    """0.33 mode with --per-request-spec-decode-metrics summary."""
    with SimServer("dflash7-prob-block", served_model_name=MODEL, spec_metrics="summary") as s:
        yield s


def chat_body(**kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a function that merges two dicts."}],
        "max_tokens": 40,
    }
    body.update(kw)
    return body


def stream(
    sim: SimServer, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> list[bytes]:
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", sim.url + path, json=body, headers=headers) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"] == "text/event-stream; charset=utf-8"
            raw = resp.read()
    return sse_data(raw)


def keys(obj: dict[str, Any]) -> list[str]:
    return list(obj)


def test_stream_chunk_order_and_fields(sim: SimServer) -> None:
    frames = stream(sim, "/v1/chat/completions", chat_body(stream=True), {"X-Request-Id": "abc123"})
    assert frames[-1] == b"[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    role, first, *rest = chunks
    # The role chunk, byte for byte (id from X-Request-Id, created once per stream).
    created = role["created"]
    assert frames[0] == (
        b'{"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":%d,"model":"coder",'
        b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
        b'"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}' % created
    )
    assert all(c["id"] == "chatcmpl-abc123" and c["created"] == created for c in chunks)
    # Content chunks: choice keys in vLLM's order, no usage, no fingerprint until the end.
    for c in [first, *rest[:-1]]:
        assert keys(c) == ["id", "object", "created", "model", "choices"]
        assert keys(c["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
        assert keys(c["choices"][0]["delta"]) == ["content"]
        assert c["choices"][0]["finish_reason"] is None and c["choices"][0]["token_ids"] is None
    final = rest[-1]
    assert keys(final) == ["id", "object", "created", "model", "choices", "system_fingerprint"]
    assert keys(final["choices"][0]) == [
        "index",
        "delta",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
    ]
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["system_fingerprint"].startswith("vllm-0.28.0-")
    # Compact JSON, as pydantic dumps it.
    assert all(b", " not in f.split(b'"content":')[0] for f in frames[:-1])


def test_first_content_chunk_is_the_prefill_token(sim: SimServer) -> None:
    frames = stream(sim, "/v1/chat/completions", chat_body(stream=True, return_token_ids=True))
    chunks = [json.loads(f) for f in frames[:-1]]
    assert chunks[0]["prompt_token_ids"] and len(chunks[0]["prompt_token_ids"]) > 5
    assert len(chunks[1]["choices"][0]["token_ids"]) == 1
    tokens = [len(c["choices"][0]["token_ids"]) for c in chunks[1:]]
    assert sum(tokens) == 40
    assert max(tokens) > 1  # speculative steps carry several tokens


def test_include_usage_and_spec_metrics(summary_sim: SimServer) -> None:
    body = chat_body(
        stream=True, max_tokens=120, return_token_ids=True, stream_options={"include_usage": True}
    )
    frames = stream(summary_sim, "/v1/chat/completions", body)
    chunks = [json.loads(f) for f in frames[:-1]]
    final, usage_chunk = chunks[-2], chunks[-1]
    assert "system_fingerprint" not in final  # it moves to the usage chunk
    assert keys(usage_chunk) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "system_fingerprint",
        "metrics",
    ]
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert keys(usage) == ["prompt_tokens", "total_tokens", "completion_tokens"]
    assert (
        usage["completion_tokens"] == 120 and usage["total_tokens"] == usage["prompt_tokens"] + 120
    )
    spec = usage_chunk["metrics"]["speculative_decoding"]
    assert keys(spec) == [
        "mean_acceptance_length",
        "draft_acceptance_rate",
        "acceptance_histogram",
        "num_spec_steps",
        "num_accepted_draft_tokens",
        "num_draft_tokens",
        "num_spec_tokens",
    ]
    decode = [len(c["choices"][0]["token_ids"]) for c in chunks[2:-1]]  # after the prefill token
    assert spec["num_spec_tokens"] == 7
    assert spec["num_spec_steps"] == len(decode)
    assert spec["num_draft_tokens"] == 7 * len(decode)
    assert sum(spec["acceptance_histogram"]) == len(decode)
    assert (
        sum(j * n for j, n in enumerate(spec["acceptance_histogram"]))
        == spec["num_accepted_draft_tokens"]
    )
    assert spec["mean_acceptance_length"] == 1 + spec["num_accepted_draft_tokens"] / len(decode)
    assert (
        spec["draft_acceptance_rate"]
        == spec["num_accepted_draft_tokens"] / spec["num_draft_tokens"]
    )
    # Every decode chunk but the last (possibly truncated at max_tokens) is 1 + accepted.
    streamed = [0] * 8
    for n in decode[:-1]:
        streamed[n - 1] += 1
    diff = [a - b for a, b in zip(spec["acceptance_histogram"], streamed, strict=True)]
    assert sum(diff) == 1 and min(diff) == 0 and diff.index(1) >= decode[-1] - 1


def test_continuous_usage_on_every_chunk(sim: SimServer) -> None:
    body = chat_body(
        stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}
    )
    chunks = [json.loads(f) for f in stream(sim, "/v1/chat/completions", body)[:-1]]
    role = chunks[0]
    assert keys(role) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "prompt_token_ids",
        "prompt_text",
    ]
    assert role["usage"]["completion_tokens"] == 0
    running = [c["usage"]["completion_tokens"] for c in chunks[1:-1]]
    assert running == sorted(running) and running[-1] == 40
    for c in chunks[1:-1]:
        assert keys(c)[:6] == ["id", "object", "created", "model", "choices", "usage"]
        assert keys(c["usage"]) == [
            "prompt_tokens",
            "total_tokens",
            "completion_tokens",
            "completion_tokens_details",
        ]  # null, as vLLM writes it
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 40


def test_non_streaming_body_has_every_field(summary_sim: SimServer) -> None:
    resp = httpx.post(summary_sim.url + "/v1/chat/completions", json=chat_body(), timeout=30)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert keys(body) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "prompt_logprobs",
        "prompt_token_ids",
        "prompt_text",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert keys(choice) == [
        "index",
        "message",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "routed_experts",
        "weight_versions",  # 0.33
    ]
    assert keys(choice["message"]) == [
        "role",
        "content",
        "refusal",
        "annotations",
        "audio",
        "function_call",
        "reasoning",
    ]
    assert choice["finish_reason"] == "length" and choice["message"]["content"]
    assert keys(body["usage"]) == [
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    ]
    spec = body["metrics"]["speculative_decoding"]
    assert spec["per_step_accepted"] is None and spec["num_spec_tokens"] == 7
    assert body["metrics"]["time_to_first_token_ms"] is None


def test_n_choices_stream_one_choice_per_chunk(sim: SimServer) -> None:
    chunks = [
        json.loads(f) for f in stream(sim, "/v1/chat/completions", chat_body(stream=True, n=2))[:-1]
    ]
    assert [c["choices"][0]["delta"].get("role") for c in chunks[:2]] == ["assistant", "assistant"]
    assert [c["choices"][0]["index"] for c in chunks[:2]] == [0, 1]
    assert all(len(c["choices"]) == 1 for c in chunks)
    finishes = {c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]}
    assert finishes == {0, 1}
    texts = [
        "".join(
            c["choices"][0]["delta"].get("content", "")
            for c in chunks
            if c["choices"][0]["index"] == i
        )
        for i in (0, 1)
    ]
    assert texts[0] != texts[1]


def test_seed_makes_output_deterministic(sim: SimServer) -> None:
    def text(**kw: Any) -> str:
        resp = httpx.post(
            sim.url + "/v1/chat/completions", json=chat_body(max_tokens=60, **kw), timeout=30
        )
        return str(resp.json()["choices"][0]["message"]["content"])

    assert text(seed=7) == text(seed=7)
    assert text(seed=7) != text(seed=8)
    # Same request streamed: the same text, whatever the chunking.
    chunks = [
        json.loads(f)
        for f in stream(sim, "/v1/chat/completions", chat_body(max_tokens=60, seed=7, stream=True))[
            :-1
        ]
    ]
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == text(seed=7)


def test_stop_string_and_max_completion_tokens(sim: SimServer) -> None:
    resp = httpx.post(
        sim.url + "/v1/chat/completions",
        json=chat_body(max_tokens=2000, ignore_eos=True, stop=["return"], seed=1),
        timeout=30,
    ).json()
    choice = resp["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == "return"
    assert "return" not in choice["message"]["content"]
    resp = httpx.post(
        sim.url + "/v1/chat/completions",
        json=chat_body(max_tokens=100, max_completion_tokens=9),
        timeout=30,
    ).json()
    assert resp["usage"]["completion_tokens"] == 9


def test_completions_stream(summary_sim: SimServer) -> None:
    body = {
        "model": MODEL,
        "prompt": "def merge(a, b):",
        "max_tokens": 20,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    frames = stream(summary_sim, "/v1/completions", body, {"X-Request-Id": "c1"})
    chunks = [json.loads(f) for f in frames[:-1]]
    assert frames[-1] == b"[DONE]"
    assert chunks[0]["id"] == "cmpl-c1" and chunks[0]["object"] == "text_completion"
    for c in chunks[:-1]:
        assert keys(c["choices"][0]) == [
            "index",
            "text",
            "logprobs",
            "finish_reason",
            "stop_reason",
            "prompt_token_ids",
            "token_ids",
            "weight_versions",  # 0.33: on every completions choice
        ]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert keys(chunks[-1]) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "system_fingerprint",
        "metrics",
    ]
    assert chunks[-1]["usage"]["completion_tokens"] == 20
    # Default max_tokens for completions is 16.
    plain = httpx.post(
        summary_sim.url + "/v1/completions", json={"model": MODEL, "prompt": "x = "}, timeout=30
    ).json()
    assert (
        plain["usage"]["completion_tokens"] == 16
        and plain["choices"][0]["finish_reason"] == "length"
    )
    assert keys(plain["choices"][0]) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "prompt_logprobs",
        "prompt_token_ids",
        "routed_experts",
        "weight_versions",
    ]


def test_openai_sdk_chat(sim: SimServer) -> None:
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="none")
    text = ""
    usage = None
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        usage = chunk.usage or usage
    assert text and usage is not None and usage.completion_tokens == 30
    full = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=30
    )
    assert full.choices[0].message.content == text  # no seed: server seed + request decide
    comp = client.completions.create(model=MODEL, prompt="import os\n", max_tokens=12)
    assert comp.usage is not None and comp.usage.completion_tokens == 12
