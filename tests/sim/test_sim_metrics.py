"""/metrics: vLLM's names, types and labels, and counters that agree with what was streamed."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loadtests.harness.sim import SimServer, sse_data

MODEL = "coder"


def series(name: str, **extra: str) -> str:
    """A sample's name as exposed: prometheus_client sorts the labels."""
    labels = {"engine": "0", "model_name": MODEL, **extra}
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer("dflash5-prob", served_model_name=MODEL, spec_metrics="summary") as s:
        yield s


def scrape(sim: SimServer) -> dict[str, float]:
    text = httpx.get(sim.url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_names_types_and_labels(sim: SimServer) -> None:
    resp = httpx.get(sim.url + "/metrics", timeout=10)
    assert resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    expected = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:spec_decode_num_drafts": "counter",
        "vllm:spec_decode_num_draft_tokens": "counter",
        "vllm:spec_decode_num_accepted_tokens": "counter",
        "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
    }
    for name, kind in expected.items():
        # prometheus_client names a counter's TYPE line with or without _total, by version.
        assert types.get(name, types.get(name + "_total")) == kind, name
    m = scrape(sim)
    for reason in ("stop", "length", "abort", "error", "repetition"):
        assert series("vllm:request_success_total", finished_reason=reason) in m
    for pos in range(5):
        assert series("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)) in m
    assert series("vllm:num_requests_running") in m
    assert series("vllm:inter_token_latency_seconds_bucket", le="0.01") in m
    assert series("vllm:time_to_first_token_seconds_bucket", le="2560.0") in m
    assert series("vllm:e2e_request_latency_seconds_bucket", le="7680.0") in m


def _stream(sim: SimServer, seed: int, results: list[dict[str, Any]]) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"task {seed}"}],
        "max_tokens": 150,
        "ignore_eos": True,
        "seed": seed,
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    resp = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30)
    chunks = [json.loads(f) for f in sse_data(resp.content)[:-1]]
    results.append(
        {
            "decode": [len(c["choices"][0]["token_ids"]) for c in chunks[2:-1]],
            "spec": chunks[-1]["metrics"]["speculative_decoding"],
            "completion": chunks[-1]["usage"]["completion_tokens"],
        }
    )


def test_counters_agree_with_the_streams(sim: SimServer) -> None:
    before = scrape(sim)
    results: list[dict[str, Any]] = []
    threads = [threading.Thread(target=_stream, args=(sim, s, results)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = scrape(sim)

    def delta(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    decode_chunks = sum(len(r["decode"]) for r in results)
    decode_tokens = sum(sum(r["decode"]) for r in results)
    drafts = delta(series("vllm:spec_decode_num_drafts_total"))
    accepted = delta(series("vllm:spec_decode_num_accepted_tokens_total"))
    # One draft per decode step per sequence, one SSE chunk per step.
    assert drafts == decode_chunks
    assert delta(series("vllm:spec_decode_num_draft_tokens_total")) == 5 * drafts
    per_pos = [
        delta(series("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p)))
        for p in range(5)
    ]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)
    # Per-request summaries sum to the counters exactly.
    assert sum(r["spec"]["num_spec_steps"] for r in results) == drafts
    assert sum(r["spec"]["num_accepted_draft_tokens"] for r in results) == accepted
    # 1 + accepted/drafts is the mean tokens per decode chunk; only each request's last step
    # can differ (truncated at max_tokens), by at most k tokens.
    assert 0 <= (drafts + accepted) - decode_tokens <= 5 * len(results)
    assert abs((1 + accepted / drafts) - decode_tokens / decode_chunks) <= 5 * len(results) / drafts
    assert delta(series("vllm:generation_tokens_total")) == 4 * 150
    assert delta(series("vllm:request_success_total", finished_reason="length")) == 4
    assert delta(series("vllm:time_to_first_token_seconds_count")) == 4
    # ITL: one sample per engine step per request (not per token).
    assert delta(series("vllm:inter_token_latency_seconds_count")) == drafts
    assert after[series("vllm:num_requests_running")] == 0


def test_prefix_cache_counters(sim: SimServer) -> None:
    before = scrape(sim)
    long_prompt = "def f(x):\n    return x * 2\n" * 300
    body = {"model": MODEL, "messages": [{"role": "user", "content": long_prompt}], "max_tokens": 3}
    first = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30).json()
    httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30)
    after = scrape(sim)
    prompt = first["usage"]["prompt_tokens"]
    assert (
        after[series("vllm:prefix_cache_queries_total")]
        - before[series("vllm:prefix_cache_queries_total")]
        == 2 * prompt
    )
    hits = (
        after[series("vllm:prefix_cache_hits_total")]
        - before[series("vllm:prefix_cache_hits_total")]
    )
    assert prompt - 16 <= hits < prompt  # the repeat hits every full block
    assert (
        after[series("vllm:prompt_tokens_total")] - before[series("vllm:prompt_tokens_total")]
        == 2 * prompt
    )


def _samples(m: Any) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = m.exposition("text/plain")[0].decode()
    return {
        s.name + str(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


@pytest.mark.parametrize("version", ["0.28.0", "0.33.0"])
def test_derived_families_follow_the_recorded_ones(version: str) -> None:
    """Cached prompt tokens are the prefix-cache hits, by source local; the waiting requests
    are all waiting for capacity; 0.33's own families exist in 0.33 mode only."""
    from loadtests.sim.metrics import SimMetrics

    m = SimMetrics(MODEL, 4096, 0, vllm_version=version)
    m.prompt_tokens.inc(100)
    m.prefix_hits.inc(64)
    m.waiting.set(3)
    lv = [("engine", "0"), ("model_name", MODEL)]
    for _ in range(2):  # a second scrape adds nothing
        got = _samples(m)
        assert got["vllm:prompt_tokens_cached_total" + str(lv)] == 64
        by_source = "vllm:prompt_tokens_by_source_total"
        assert got[by_source + str(sorted([*lv, ("source", "local_cache_hit")]))] == 64
        assert got[by_source + str(sorted([*lv, ("source", "local_compute")]))] == 36
        waiting = "vllm:num_requests_waiting_by_reason"
        assert got[waiting + str(sorted([*lv, ("reason", "capacity")]))] == 3
    cached_by_source = "vllm:prompt_tokens_cached_by_source_total"
    device = str(sorted([*lv, ("source", "device")]))
    assert (cached_by_source + device in got) == (version == "0.33.0")
    if version == "0.33.0":
        assert got[cached_by_source + device] == 64
