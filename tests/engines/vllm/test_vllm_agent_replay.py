"""The real agents' recorded sessions (tests/fixtures/agent-recordings: Codex, Claude Code,
aider, the Anthropic and OpenAI SDKs, and a Codex thread begun on a provider that encrypts its
reasoning) replayed through the gateway to real vLLM, one request at a time, so that the
engine's counter deltas are that request's own.

Every request is served (200 and a whole answer), or adapted by a named rule of
proxy/relay/adapt.py (counted), and the gateway's request log says what vLLM's own /metrics
counters say of the same request: prompt, cached and generated tokens exactly, TTFT and the
decode time within the stated tolerances (test_figures_equal_vllms_counters)."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer
from loadtests.harness.vllm import SERVED
from proxy import vllm_wire
from tests.engines.vllm import replay
from tests.engines.vllm.conftest import Engines
from tests.engines.vllm.replay import Replayed, replay_all

TTFT = "vllm:time_to_first_token_seconds_sum"
DECODE = "vllm:request_decode_time_seconds_sum"


@pytest.fixture(scope="module")
def replayed(vgw: GatewayServer, vllm: Engines) -> dict[str, list[Replayed]]:
    """Every recorded session, through the gateway to the ngram engine (no draft model to
    prefill beside the target: the agents' prompts are up to 28K tokens), one at a time."""
    return replay_all(vgw, vllm.ngram)


def _answer_complete(one: Replayed) -> bool:
    """A whole answer in the API's own shape: the stream's end event, or a body with usage."""
    endpoint = one.rec.endpoint
    if one.rec.stream:
        ends = {
            "responses": "event: response.completed",
            "messages": "event: message_stop",
            "chat/completions": "data: [DONE]",
        }
        return ends[endpoint] in one.text and '"error"' not in one.text
    doc = json.loads(one.text)
    return "usage" in doc and "error" not in doc


def test_every_recorded_request_is_served(replayed: dict[str, list[Replayed]]) -> None:
    expected = set(replay.manifest()["sessions"])
    assert set(replayed) == expected
    failed = []
    for session in replayed.values():
        for one in session:
            if one.rec.method == "HEAD":  # Claude Code's reachability probe: any answer will do
                assert one.status in (200, 404), one.rec.name
                continue
            if one.status != 200 or not _answer_complete(one):
                failed.append(f"{one.rec.name} {one.status} {one.text[:300]}")
    assert failed == [], "\n".join(failed)


def test_codex_turn_state_is_honoured(replayed: dict[str, list[Replayed]]) -> None:
    """The gateway issues Codex its turn-state token and accepts it back within the turn."""
    states = [one.row["turn_state"] for one in replayed["codex"] if one.row is not None]
    assert states.count("refused") == 0, states
    assert "valid" in states and "issued" in states


def test_encrypted_reasoning_is_adapted_and_counted(
    replayed: dict[str, list[Replayed]], vgw: GatewayServer, vllm: Engines
) -> None:
    """vLLM refuses the Codex turn that carries encrypted reasoning (sent to it directly); the
    gateway leaves the blob out (rule `responses-encrypted-reasoning`), counts it, and serves."""
    (one,) = replayed["codex-encrypted"]
    assert one.status == 200
    headers, body = replay.request_of(one.rec, CLIENT_KEY, None)
    doc = json.loads(body) | {"model": SERVED, "stream": False}
    direct = httpx.post(f"{vllm.ngram.url}/v1/responses", json=doc, timeout=60)
    assert direct.status_code == 400
    assert vllm_wire.ENCRYPTED_REASONING_ERROR in direct.json()["error"]["message"]
    page = vgw.metrics()
    found = re.search(
        r'^specrouter_adaptations_total\{backend="v-ngram",rule="responses-encrypted-reasoning"\} (\S+)',
        page,
        re.M,
    )
    assert found and float(found.group(1)) == 1.0, page
    others = [o for s, ones in replayed.items() if s != "codex-encrypted" for o in ones]
    assert not any('encrypted_content":"gAAAA' in o.rec.body.decode() for o in others)


def test_figures_equal_vllms_counters(replayed: dict[str, list[Replayed]]) -> None:
    """Per request (alone on the engine): the log's prompt, cached and generated tokens equal
    the deltas of vllm:prompt_tokens, vllm:prefix_cache_hits and vllm:generation_tokens; its
    prompt tokens are the manifest's (the recordings' lengths in the tiny model's tokens). TTFT:
    vLLM's clock starts after its API server rendered and tokenised the prompt and stops when
    the engine core made the token; the gateway's starts at the request's arrival and stops
    when it relays that token, so it is later by the gateway's hop and vLLM's preprocessing:
    0 <= gateway - vLLM <= 0.25 s + 5 % (a 28K-token prompt is rendered and tokenised in
    ~0.1-0.2 s on this machine). Decode time (first token to last, streams): within 0.1 s +
    10 % of vLLM's vllm:request_decode_time_seconds (the same span, the last hop aside)."""
    lengths = replay.manifest()["prompt_tokens"]
    wrong: list[str] = []
    for session in replayed.values():
        for one in session:
            row, d = one.row, one.delta
            if row is None:
                continue
            name = one.rec.name
            counted = {
                "prompt": (row["prompt_tokens"], d["vllm:prompt_tokens_total"], lengths[name]),
                "cached": (row["cached_tokens"] or 0, d["vllm:prefix_cache_hits_total"]),
                "completion": (row["completion_tokens"], d["vllm:generation_tokens_total"]),
            }
            wrong += [f"{name} {k} {v}" for k, v in counted.items() if len(set(v)) != 1]
            if row["completion_tokens"] != replay.CAP:
                wrong.append(f"{name} completion {row['completion_tokens']} != {replay.CAP}")
            if not one.rec.stream:
                continue
            ttft = row["ttft_s"] - d[TTFT]
            if not 0 <= ttft <= 0.25 + 0.05 * d[TTFT]:
                wrong.append(f"{name} ttft gateway {row['ttft_s']:.4f} vllm {d[TTFT]:.4f}")
            decode = row["e2e_s"] - row["ttft_s"]
            if abs(decode - d[DECODE]) > 0.1 + 0.1 * d[DECODE]:
                wrong.append(f"{name} decode gateway {decode:.4f} vllm {d[DECODE]:.4f}")
    assert wrong == [], "\n".join(wrong)
