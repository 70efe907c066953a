"""The gateway's per-request figures against vLLM's own counters and the client's clock.

Each request runs alone, so the engine's counter deltas are its own. vLLM's ITL histogram is per
engine step, not per token: it is never compared with here.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from loadtests.harness.gateway import GatewayServer
from loadtests.harness.vllm import SERVED, VllmServer
from proxy.observe.metrics import BACKEND_COUNTERS
from proxy.vllm_wire import Family
from tests.engines.vllm.common import (
    CHAT,
    GREEDY,
    logged,
    per_token_itl_p50,
    samples,
    timed_stream,
)
from tests.engines.vllm.conftest import Engines

ITERATIONS = "vllm:iteration_tokens_total_count"  # one per engine step
MERGE_RETRIES = 3  # sends again of a stream whose outputs vLLM merged (a loaded machine)


def alone(
    gw: GatewayServer, engine: VllmServer, model: str, rid: str, body: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, float], Any]:
    """(the answer, the engine's counter deltas, the gateway's log row) of one request; a
    stream's answer is its last usage and `outputs`, the engine outputs it carried (its events
    with a choice, less the first, which only names the role)."""
    before = samples(engine.metrics_text())
    with gw.client() as c:
        r = c.post(
            "/v1/chat/completions",
            json={"model": model, **body},
            headers={"x-request-id": rid, "x-session-id": f"session-{rid}"},
        )
    assert r.status_code == 200, r.text
    after = samples(engine.metrics_text())
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    if not body.get("stream"):
        return r.json(), delta, logged(gw, rid)
    usage, events = None, 0
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            events += bool(event.get("choices"))
    return {"usage": usage, "outputs": events - 1}, delta, logged(gw, rid)


@pytest.mark.parametrize(
    ("kind", "stream"), [("draft", False), ("draft", True), ("ngram", False), ("ngram", True)]
)
def test_token_counts_and_tokens_per_step(
    vgw: GatewayServer, vllm: Engines, kind: str, stream: bool
) -> None:
    """Token counts equal vLLM's; tokens per target step is (completion tokens - 1) / decode
    steps, the decode steps being the change in vllm:iteration_tokens_total's count less the
    prefill's step. The gateway's logged value must be within 1 % of that, request by request,
    or withheld where nothing it has can be right: an ngram answer without a stream (vLLM's
    summary counts neither its undrafted steps nor exactly its accepted drafts)."""
    engine = vllm.draft if kind == "draft" else vllm.ngram
    model = SERVED if kind == "draft" else f"{SERVED}-ngram"
    seen, merged = [], []
    for i, max_tokens in enumerate((96, 160)):
        body: dict[str, Any] = {"messages": CHAT, "max_tokens": max_tokens, **GREEDY}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        for attempt in range(MERGE_RETRIES + 1):
            rid = f"tps-{kind}-{'s' if stream else 'n'}-{i}-{attempt}"
            answer, delta, row = alone(vgw, engine, model, rid, body)
            usage = answer["usage"]
            assert usage["completion_tokens"] == max_tokens
            assert row["completion_tokens"] == delta["vllm:generation_tokens_total"] == max_tokens
            assert (
                row["prompt_tokens"] == delta["vllm:prompt_tokens_total"] == usage["prompt_tokens"]
            )
            steps = delta[ITERATIONS] - 1
            truth = (max_tokens - 1) / steps
            assert truth > 1.5  # drafts are accepted on the tiny models
            # One output per step (the prefill's and each decode step's) unless vLLM's output
            # handler merged some, which it does when its consumer falls behind (a loaded
            # machine: CI logged 2.5 for 2.436, 38 outputs for 39 steps). The stream then shows
            # fewer steps than were made and nothing the gateway sees can tell: sent again.
            if not stream or answer["outputs"] >= steps + 1:
                break
            merged.append((rid, answer["outputs"], steps + 1))
        seen.append((row["tokens_per_step"], round(truth, 3), row["tps_source"]))
    if kind == "ngram" and not stream:
        assert all(logged is None for logged, _, _ in seen), seen
        return
    # vLLM's per-request summary averages over drafted steps only (ngram: 5.0 against 2.4-3.1
    # before proxy/record/steps.py) and counts drafts accepted past max_tokens: neither may show.
    wrong = [e for e in seen if e[0] is None or e[0] != pytest.approx(e[1], rel=0.01)]
    assert not wrong, f"(logged, engine, source) {wrong}; merged (request, outputs, steps) {merged}"


def test_ttft_and_per_token_itl_against_the_clients_clock(
    vgw: GatewayServer, vllm: Engines
) -> None:
    """The gateway's TTFT is before the client's by the last hop (at most 1.5 ms on loopback
    TLS), its per-token ITL median within 0.05 ms of the client's (a step is milliseconds here: a
    per-step figure taken for per-token would be off by far more). Best of five requests: on a
    shared 2-core machine one request can lose milliseconds to a neighbour's burst."""
    ttft_gaps, itl_gaps = [], []
    for i in range(5):
        body = {
            "model": SERVED,
            "messages": CHAT,
            "max_tokens": 64,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            **GREEDY,
        }
        client_ttft, frames = timed_stream(vgw, body, f"clock-{i}")
        row = logged(vgw, f"clock-{i}")
        assert sum(n for _, n in frames) == row["completion_tokens"] == 64
        assert row["ttft_s"] < client_ttft
        ttft_gaps.append(client_ttft - row["ttft_s"])
        itl_gaps.append(abs(per_token_itl_p50(frames) - row["itl_p50_s"]))
    # Always before the client's; the last hop (gateway -> TLS -> client) measured 0.3-0.8 ms
    # on a quiet machine, 1.0-3.7 ms under load average 7.
    assert min(ttft_gaps) <= 0.0015, ttft_gaps
    # A run beside an install saw 12-740 us over the five (best 12 us): the old 10 us bound failed.
    assert min(itl_gaps) < 0.00005, itl_gaps


def test_cached_tokens_reach_the_log_and_the_session_table(
    vgw: GatewayServer, vllm: Engines
) -> None:
    body = {"messages": CHAT * 8, "max_tokens": 8, **GREEDY}
    first, _, row1 = alone(vgw, vllm.draft, SERVED, "cache-1", body)
    vgw_rid = "cache-2"
    before = samples(vllm.draft.metrics_text())
    with vgw.client() as c:
        r = c.post(
            "/v1/chat/completions",
            json={"model": SERVED, **body},
            headers={"x-request-id": vgw_rid, "x-session-id": "session-cache-1"},
        )
    after = samples(vllm.draft.metrics_text())
    cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    assert cached == after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    row2 = logged(vgw, vgw_rid)
    assert row2["cached_tokens"] == cached
    assert row2["session"] == row1["session"]  # the key the gateway made of x-session-id
    session = next(
        s
        for s in vgw.admin_get("/dashboard/snapshot").json()["agents"]
        if s["session"] == row1["session"]
    )
    assert session["cached_tokens"] == (row1["cached_tokens"] or 0) + cached
    assert session["requests"] == 2


def test_scraped_families_are_vllms_own(vgw: GatewayServer, vllm: Engines) -> None:
    """Every family the gateway reads is on the real engine's page (those proxy/vllm_wire.py
    calls "0.33 only" too: 0.32.0 has them already), and the counters it re-exports equal the
    engine's."""
    page = vllm.draft.metrics_text()
    names = {m.group(1) for m in re.finditer(r"^# TYPE (\S+) ", page, re.M)}
    names |= {n.removesuffix("_total") for n in names}
    wanted = {
        v
        for k, v in vars(Family).items()
        if k.isupper() and isinstance(v, str) and v.startswith("vllm:")
    }
    missing = sorted(f for f in wanted if f not in names)
    assert missing == [], missing
    engine = samples(page)
    deadline = time.monotonic() + 10
    mismatched: list[str] = []
    while time.monotonic() < deadline:
        ours = samples(vgw.metrics())
        engine = samples(vllm.draft.metrics_text())
        mismatched = []
        for name, help_text in BACKEND_COUNTERS.values():
            source = help_text.split()[0].rstrip(".")
            got = _labelled(vgw.metrics(), f"{name}_total", "v-draft")
            if got != engine.get(source):
                mismatched.append(f"{name}: {got} vs {source} {engine.get(source)}")
        if not mismatched:
            break
        time.sleep(0.3)
    assert mismatched == [], mismatched
    assert ours


def _labelled(page: str, sample: str, backend: str) -> float | None:
    found = re.search(rf'^{re.escape(sample)}\{{backend="{backend}"\}} (\S+)', page, re.M)
    return float(found.group(1)) if found else None
