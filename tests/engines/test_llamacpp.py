"""llama.cpp's real server (xllamacpp) on tiny local models: the API surface the gateway will relay.

One speculative server (target + draft, n_max 8) and one plain server (the same target) for the
module, both with an api key; an embeddings server only for /v1/embeddings, because llama.cpp
serves embeddings only when started with them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtests.harness.llamacpp import LlamaCppServer
from loadtests.harness.sim import sse_data
from loadtests.harness.tinymodels import tiny_pair

API_KEY = "engine-test-key"
PROMPT = "def add(a, b):\n    return a + b\n\nclass Stack:\n    def push(self, value):"
CHAT = [{"role": "user", "content": "Write a function that returns the length of a list."}]
GREEDY = {"temperature": 0, "seed": 1234}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_pair(tmp_path_factory.mktemp("tinymodels"))


@pytest.fixture(scope="module")
def spec(models: tuple[Path, Path]) -> Iterator[LlamaCppServer]:
    target, draft = models
    with LlamaCppServer(target, draft=draft, n_max=8, api_key=API_KEY) as server:
        yield server


@pytest.fixture(scope="module")
def plain(models: tuple[Path, Path]) -> Iterator[LlamaCppServer]:
    with LlamaCppServer(models[0], api_key=API_KEY) as server:
        yield server


def ok(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def complete(server: LlamaCppServer, max_tokens: int = 48, **fields: Any) -> dict[str, Any]:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, **GREEDY, **fields}
    return ok(server.post("/v1/completions", body))


def chat(server: LlamaCppServer, max_tokens: int = 32, **fields: Any) -> dict[str, Any]:
    body = {"messages": CHAT, "max_tokens": max_tokens, **GREEDY, **fields}
    return ok(server.post("/v1/chat/completions", body))


def stream(server: LlamaCppServer, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    resp = server.post(path, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    frames = sse_data(resp.content)
    assert frames[-1] == b"[DONE]"
    return [json.loads(f) for f in frames[:-1]]


def metric_values(text: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text page."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.split()
            out[name] = float(value)
    return out


def tokens_per_step(timings: dict[str, Any]) -> float:
    # Each decode step yields one token of its own plus the draft tokens it accepted; the first
    # token is the prompt's (the metrics test checks this against llamacpp:n_decode_total).
    n = timings["predicted_n"] - 1
    return float(n / (n - timings["draft_n_accepted"]))


# -- the surface -----------------------------------------------------------------------------------


def test_health_is_public_and_the_rest_needs_the_key(spec: LlamaCppServer) -> None:
    assert httpx.get(f"{spec.url}/health", timeout=5).json() == {"status": "ok"}
    assert spec.url.startswith("http://127.0.0.1:")
    for path in ("/v1/models", "/metrics"):
        assert httpx.get(f"{spec.url}{path}", timeout=5).status_code == 401
    models = ok(httpx.get(f"{spec.url}/v1/models", headers=spec.headers, timeout=5))
    assert [m["id"] for m in models["data"]] == [str(spec.model)]


@pytest.mark.parametrize("server_name", ["spec", "plain"])
def test_chat_completion(server_name: str, request: pytest.FixtureRequest) -> None:
    server: LlamaCppServer = request.getfixturevalue(server_name)
    body = chat(server)
    (choice,) = body["choices"]
    assert body["object"] == "chat.completion"
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"]
    # Control tokens are never the greedy pick of the tiny model: it runs to max_tokens.
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 32
    assert body["usage"]["prompt_tokens"] > len(CHAT[0]["content"]) // 8  # template applied


@pytest.mark.parametrize("server_name", ["spec", "plain"])
def test_chat_stream_matches_non_streaming(
    server_name: str, request: pytest.FixtureRequest
) -> None:
    server: LlamaCppServer = request.getfixturevalue(server_name)
    whole = chat(server)["choices"][0]["message"]["content"]
    chunks = stream(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 32, **GREEDY})
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish[-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 32


@pytest.mark.parametrize("server_name", ["spec", "plain"])
def test_completion_and_its_stream(server_name: str, request: pytest.FixtureRequest) -> None:
    server: LlamaCppServer = request.getfixturevalue(server_name)
    body = complete(server)
    (choice,) = body["choices"]
    assert body["object"] == "text_completion"
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 48
    chunks = stream(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 48, **GREEDY})
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == choice["text"]
    assert chunks[-1]["usage"]["completion_tokens"] == 48
    assert chunks[-1]["timings"]["predicted_n"] == 48


def test_embeddings_need_a_server_started_for_them(
    plain: LlamaCppServer, models: tuple[Path, Path]
) -> None:
    resp = plain.post("/v1/embeddings", {"input": "def f"})
    assert resp.status_code == 501
    assert resp.json()["error"]["type"] == "not_supported_error"
    with LlamaCppServer(models[0], embeddings=True, metrics=False) as server:
        body = ok(server.post("/v1/embeddings", {"input": ["def f(x):", "return x"]}))
        vectors = [d["embedding"] for d in body["data"]]
        assert [d["index"] for d in body["data"]] == [0, 1]
        assert [len(v) for v in vectors] == [64, 64]  # the tiny model's n_embd
        assert all(math.isclose(math.hypot(*v), 1.0, rel_tol=1e-4) for v in vectors)
        assert vectors[0] != vectors[1]
        assert body["usage"]["prompt_tokens"] > 0


# -- speculative decoding ------------------------------------------------------------------------


def test_metrics_families_and_draft_counters(spec: LlamaCppServer) -> None:
    before = metric_values(spec.metrics_text())
    body = complete(spec, max_tokens=64)
    page = spec.metrics_text()
    after = metric_values(page)
    families = {line.split()[2] for line in page.splitlines() if line.startswith("# TYPE")}
    assert {
        "llamacpp:prompt_tokens_total",
        "llamacpp:tokens_predicted_total",
        "llamacpp:n_decode_total",
        "llamacpp:requests_processing",
        "llamacpp:spec_decode_num_draft_tokens_total",
        "llamacpp:spec_decode_num_accepted_tokens_total",
        "llamacpp:spec_decode_num_drafts_total",
        "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
    } <= families

    def delta(name: str) -> float:
        return after[f"llamacpp:{name}"] - before.get(f"llamacpp:{name}", 0.0)

    timings = body["timings"]
    assert delta("tokens_predicted_total") == 64
    assert delta("spec_decode_num_draft_tokens_total") == timings["draft_n"]
    assert delta("spec_decode_num_accepted_tokens_total") == timings["draft_n_accepted"]
    # Each target decode yields one token of its own plus the drafts it accepted; not every step
    # after the prompt's has a draft to verify.
    assert delta("n_decode_total") == 64 - timings["draft_n_accepted"]
    assert 0 < delta("spec_decode_num_drafts_total") < delta("n_decode_total")


def test_timings_and_tokens_per_target_step(spec: LlamaCppServer, plain: LlamaCppServer) -> None:
    timings = complete(spec, max_tokens=128)["timings"]
    assert timings["predicted_n"] == 128
    assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert tokens_per_step(timings) > 1.5
    assert tokens_per_step(chat(spec, max_tokens=64)["timings"]) > 1.5
    plain_timings = complete(plain, max_tokens=16)["timings"]
    assert plain_timings["predicted_n"] == 16
    assert "draft_n" not in plain_timings


def test_speculative_output_is_the_targets_own(spec: LlamaCppServer, plain: LlamaCppServer) -> None:
    assert (
        complete(spec, max_tokens=96)["choices"][0]["text"]
        == (complete(plain, max_tokens=96)["choices"][0]["text"])
    )


def test_request_speculative_fields_are_ignored(spec: LlamaCppServer) -> None:
    """Documents llama.cpp today: the draft window is the server's, not the request's."""
    base = complete(spec)["timings"]
    for fields in ({"speculative.n_max": 1}, {"speculative": {"n_max": 1, "n_min": 0}}):
        timings = complete(spec, **fields)["timings"]
        assert (timings["draft_n"], timings["draft_n_accepted"]) == (
            base["draft_n"],
            base["draft_n_accepted"],
        )


# -- sampling ------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0, 0.9])
def test_same_seed_same_text(spec: LlamaCppServer, temperature: float) -> None:
    first = complete(spec, temperature=temperature)["choices"][0]["text"]
    second = complete(spec, temperature=temperature)["choices"][0]["text"]
    assert first == second


def test_sampling_fields_are_honoured(plain: LlamaCppServer) -> None:
    greedy = complete(plain)["choices"][0]["text"]
    assert complete(plain, temperature=1.0, seed=7)["choices"][0]["text"] != greedy
    assert complete(plain, temperature=1.0, seed=7, top_k=1)["choices"][0]["text"] == greedy
    stop = greedy[10:14]
    cut = complete(plain, stop=[stop])["choices"][0]
    assert cut["finish_reason"] == "stop"
    assert cut["text"] == greedy[: greedy.index(stop)]
    resp = plain.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "n": 2})
    assert resp.status_code == 400  # one choice per request only
