"""Error responses in vLLM's shape and status codes, and the API key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loadtests.harness.sim import SimServer, sse_data

MODEL = "coder"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer("mtp3", served_model_name=MODEL) as s:
        yield s


def post(
    sim: SimServer, body: Any, path: str = "/v1/chat/completions", **kw: Any
) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(
            sim.url + path, content=body, headers={"content-type": "application/json"}, timeout=10
        )
    return httpx.post(sim.url + path, json=body, timeout=10, **kw)


MSGS = [{"role": "user", "content": "hi"}]


def test_unknown_model_is_404(sim: SimServer) -> None:
    resp = post(sim, {"model": "nope", "messages": MSGS})
    assert resp.status_code == 404
    assert resp.content == (
        b'{"error":{"message":"The model `nope` does not exist.","type":"NotFoundError","param":"model","code":404}}'
    )


def test_validation_is_400_bad_request(sim: SimServer) -> None:
    resp = post(sim, {"model": MODEL})
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert list(err) == ["message", "type", "param", "code"]
    assert err["type"] == "Bad Request" and err["code"] == 400 and err["param"] == "body.messages"
    assert err["message"].startswith(
        "1 validation error:\n  {'type': 'missing', 'loc': ('body', 'messages')"
    )
    bad_json = post(sim, b'{"model": ')
    assert (
        bad_json.status_code == 400 and "JSON decode error" in bad_json.json()["error"]["message"]
    )
    wrong_type = post(sim, {"model": MODEL, "messages": MSGS, "max_tokens": "many"})
    assert (
        wrong_type.status_code == 400 and wrong_type.json()["error"]["param"] == "body.max_tokens"
    )


def test_stream_options_without_stream(sim: SimServer) -> None:
    resp = post(sim, {"model": MODEL, "messages": MSGS, "stream_options": {"include_usage": True}})
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "stream_options" and err["type"] == "BadRequestError"
    assert "Stream options can only be defined when `stream=True`." in err["message"]


@pytest.mark.parametrize("extra", [{"min_p": 0.1}, {"logit_bias": {"42": 1.0}}])
def test_min_p_and_logit_bias_with_speculation(sim: SimServer, extra: dict[str, Any]) -> None:
    message = "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
    resp = post(sim, {"model": MODEL, "messages": MSGS, **extra})
    assert resp.status_code == 400
    assert resp.json() == {
        "error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    }
    # Streaming: vLLM validates inside the engine client's generator, after the 200 went out, so
    # the error arrives as an event (json.dumps, with spaces) followed by [DONE].
    streamed = post(sim, {"model": MODEL, "messages": MSGS, "stream": True, **extra})
    assert streamed.status_code == 200
    assert sse_data(streamed.content) == [
        b'{"error": {"message": "'
        + message.encode()
        + b'", "type": "BadRequestError", "param": null, "code": 400}}',
        b"[DONE]",
    ]


def test_sampling_and_context_checks(sim: SimServer) -> None:
    resp = post(sim, {"model": MODEL, "messages": MSGS, "max_tokens": 300_000})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith(
        "'max_tokens' or 'max_completion_tokens' is too large: 300000."
    )
    resp = post(sim, {"model": MODEL, "messages": MSGS, "max_tokens": 0})
    assert (
        resp.status_code == 400
        and "max_tokens must be at least 1" in resp.json()["error"]["message"]
    )
    resp = post(sim, {"model": MODEL, "messages": MSGS, "temperature": -1})
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "BadRequestError"


def test_unknown_route_and_method(sim: SimServer) -> None:
    resp = httpx.get(sim.url + "/v1/nothing-here", timeout=10)
    assert resp.status_code == 404
    assert resp.json() == {
        "error": {"message": "Not Found", "type": "Not Found", "param": None, "code": 404}
    }
    resp = httpx.get(sim.url + "/v1/chat/completions", timeout=10)
    assert resp.status_code == 405 and resp.json()["error"]["type"] == "Method Not Allowed"
    # A generation profile has no embeddings route (vLLM registers routes by task).
    assert post(sim, {"input": "x"}, "/v1/embeddings").status_code == 404


def test_api_key() -> None:
    with SimServer("nospec", faults=False, extra_args=("--api-key", "s3cret")) as sim:
        resp = httpx.get(sim.url + "/v1/models", timeout=10)
        assert resp.status_code == 401 and resp.content == b'{"error":"Unauthorized"}'
        ok = httpx.get(
            sim.url + "/v1/models", headers={"Authorization": "Bearer s3cret"}, timeout=10
        )
        assert ok.status_code == 200
        assert httpx.get(sim.url + "/health", timeout=10).status_code == 200
        assert httpx.get(sim.url + "/metrics", timeout=10).status_code == 200
        # No speculation: min_p is fine.
        resp = httpx.post(
            sim.url + "/v1/chat/completions",
            json={"messages": MSGS, "min_p": 0.1, "max_tokens": 5},
            headers={"Authorization": "Bearer s3cret"},
            timeout=10,
        )
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 5
