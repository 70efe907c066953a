"""Anthropic Messages through the real gateway over TLS, with the Anthropic SDK: auth by
`x-api-key` or bearer, the gateway's own errors in Anthropic's shape, count_tokens, and what
reaches the engine (no client key; clamps and defaults under the Messages field names)."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import httpx
import pytest

from loadtests.harness.gateway import CLIENT_KEY, OTHER_KEY, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from proxy import auth

SERVED = "qwen3.8-27b"
SLOW_KEY = "sk-test-slow"
ASK = [{"role": "user", "content": "Write a python function that adds two numbers."}]


class _Echo(BaseHTTPRequestHandler):
    """An engine that records what it was sent and answers `{}`."""

    seen: list[tuple[str, dict[str, str], dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_GET(self) -> None:
        # The gateway's health checks and scrapes: healthy, no metrics. Without this the checks
        # get 501 and, on a slow machine, mark the backend down before the test sends (a 503).
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def stack(certs) -> Iterator[tuple[GatewayServer, str]]:
    echo = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    echo_url = f"http://127.0.0.1:{echo.server_address[1]}"
    with SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.02) as sim:
        policy = coder_policy(
            {"sim": sim.url},
            defaults={"temperature": 1.3},
            extra_clients=[
                {"name": "slow", "key_sha256": auth.hash_key(SLOW_KEY), "requests_per_minute": 1}
            ],
        )
        policy["routes"]["coder"]["clamps"] = {"max_tokens": {"max": 6}}
        policy["backends"]["echo"] = {
            "url": echo_url,
            "kind": "vllm",
            "task": "generate",
            "served_model_name": "echo",
            "max_concurrency": 4,
        }
        policy["routes"]["echo"] = {
            "models": ["echo"],
            "variants": ["echo"],
            "defaults": {"temperature": 1.3, "max_tokens": 9},
            "clamps": {"max_tokens": {"max": 5}},
        }
        with GatewayServer(policy, certs=certs) as gw:
            yield gw, echo_url
    echo.shutdown()
    echo.server_close()


def _sdk(gw: GatewayServer, **kw: Any) -> anthropic.Anthropic:
    ctx = ssl.create_default_context(cafile=str(gw.certs.ca_cert))
    return anthropic.Anthropic(
        base_url=gw.base, http_client=anthropic.DefaultHttpxClient(verify=ctx), max_retries=0, **kw
    )


def _raw(
    gw: GatewayServer, headers: dict[str, str], body: Any, path: str = "/v1/messages"
) -> httpx.Response:
    ctx = ssl.create_default_context(cafile=str(gw.certs.ca_cert))
    with httpx.Client(base_url=gw.base, verify=ctx, timeout=30) as c:
        if isinstance(body, bytes):
            return c.post(path, content=body, headers=headers)
        return c.post(path, json=body, headers=headers)


def _anthropic_error(r: httpx.Response, status: int, err_type: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert list(body) == ["type", "error"] and body["type"] == "error"
    assert list(body["error"]) == ["type", "message"] and body["error"]["type"] == err_type
    return str(body["error"]["message"])


def test_sdk_with_x_api_key_streaming_and_not(stack) -> None:
    gw, _ = stack
    with _sdk(gw, api_key=CLIENT_KEY) as client:  # the SDK sends `x-api-key`
        _sdk_calls(client)


def _sdk_calls(client: anthropic.Anthropic) -> None:
    resp = client.messages.with_raw_response.create(model="coder", max_tokens=50, messages=ASK)
    msg = resp.parse()
    assert msg.type == "message" and msg.model == "coder" and msg.content[0].type == "text"
    assert msg.usage.input_tokens > 0 and 1 <= msg.usage.output_tokens <= 6  # clamped to 6
    assert resp.headers["x-specrouter-variant"] == "sim"
    # The route's default temperature (1.3) held within Anthropic's range.
    assert resp.headers["x-specrouter-defaults"] == "temperature=1.0"
    with client.messages.stream(model="coder", max_tokens=4, messages=ASK) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and "content_block_delta" in events
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens <= 4
    assert final.content and final.content[0].type == "text" and final.content[0].text
    # count_tokens, the same prompt
    count = client.messages.count_tokens(model="coder", messages=ASK)
    assert count.input_tokens == msg.usage.input_tokens


def test_bearer_auth_and_two_different_keys(stack) -> None:
    gw, _ = stack
    with _sdk(gw, auth_token=CLIENT_KEY) as client:
        msg = client.messages.create(model="coder", max_tokens=2, messages=ASK)
    assert msg.usage.output_tokens >= 1
    same = {"x-api-key": CLIENT_KEY, "authorization": f"Bearer {CLIENT_KEY}"}
    assert _raw(gw, same, {"model": "coder", "max_tokens": 2, "messages": ASK}).status_code == 200
    both = {"x-api-key": CLIENT_KEY, "authorization": f"Bearer {OTHER_KEY}"}
    _anthropic_error(
        _raw(gw, both, {"model": "coder", "max_tokens": 2, "messages": ASK}),
        401,
        "authentication_error",
    )
    with _sdk(gw, api_key="sk-wrong") as client, pytest.raises(anthropic.AuthenticationError):
        client.messages.create(model="coder", max_tokens=2, messages=ASK)
    # The OpenAI routes take `x-api-key` too, and keep their own error shape.
    ctx = ssl.create_default_context(cafile=str(gw.certs.ca_cert))
    with httpx.Client(base_url=gw.base, verify=ctx, timeout=30) as c:
        assert c.get("/v1/models", headers={"x-api-key": CLIENT_KEY}).status_code == 200
        r = c.get("/v1/models", headers=both)
    assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"


def test_gateway_errors_are_anthropic_shaped(stack) -> None:
    gw, _ = stack
    key = {"x-api-key": CLIENT_KEY}
    with _sdk(gw, api_key=CLIENT_KEY) as client, pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=2, messages=ASK)
    _anthropic_error(
        _raw(gw, key, {"model": "nope", "max_tokens": 2, "messages": ASK}), 404, "not_found_error"
    )
    _anthropic_error(_raw(gw, key, b"{not json"), 400, "invalid_request_error")
    _anthropic_error(
        _raw(gw, key, {"max_tokens": 2, "messages": ASK}), 400, "invalid_request_error"
    )
    message = _anthropic_error(
        _raw(gw, key, {"model": "coder", "max_tokens": 2, "temperature": 1.5, "messages": ASK}),
        400,
        "invalid_request_error",
    )
    assert "temperature" in message
    _anthropic_error(
        _raw(gw, {}, {"model": "coder", "max_tokens": 2, "messages": ASK}),
        401,
        "authentication_error",
    )
    slow = {"x-api-key": SLOW_KEY}
    _raw(gw, slow, {"model": "coder", "max_tokens": 1, "messages": ASK})
    r = _raw(gw, slow, {"model": "coder", "max_tokens": 1, "messages": ASK})
    _anthropic_error(r, 429, "rate_limit_error")
    assert r.headers["retry-after"]
    # A missing `max_tokens` is the gateway's to refuse, in Anthropic's shape (count_tokens
    # takes none); the engine's own validation errors are relayed as vLLM wrote them.
    message = _anthropic_error(
        _raw(gw, key, {"model": "coder", "messages": ASK}), 400, "invalid_request_error"
    )
    assert "`max_tokens` is required" in message
    counted = _raw(gw, key, {"model": "coder", "messages": ASK}, "/v1/messages/count_tokens")
    assert counted.status_code == 200, counted.text
    r = _raw(gw, key, {"model": "coder", "max_tokens": 0, "messages": ASK})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body.max_tokens"


def test_what_reaches_the_engine(stack) -> None:
    gw, _ = stack
    _Echo.seen.clear()
    headers = {"x-api-key": CLIENT_KEY, "authorization": f"Bearer {CLIENT_KEY}"}
    assert (
        _raw(gw, headers, {"model": "echo", "max_tokens": 50, "messages": ASK}).status_code == 200
    )
    assert (
        _raw(
            gw, headers, {"model": "echo", "messages": ASK}, "/v1/messages/count_tokens"
        ).status_code
        == 200
    )
    ctx = ssl.create_default_context(cafile=str(gw.certs.ca_cert))
    with httpx.Client(base_url=gw.base, verify=ctx, timeout=30, headers=headers) as c:
        c.post(
            "/v1/chat/completions",
            json={"model": "echo", "messages": ASK, "max_completion_tokens": 50},
        )
        c.post("/v1/responses", json={"model": "echo", "input": "hi", "max_output_tokens": 50})
        c.post("/v1/responses", json={"model": "echo", "input": "hi", "temperature": 1.5})
    (p1, h1, m1), (p2, h2, m2), (p3, _, chat), (p4, _, resp), (_, _, resp2) = _Echo.seen
    assert (p1, p2, p3, p4) == (
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/chat/completions",
        "/v1/responses",
    )
    for h in (h1, h2):
        assert "x-api-key" not in h and "authorization" not in h  # the echo engine has no key
        assert CLIENT_KEY not in json.dumps(h)
    assert m1["max_tokens"] == 5 and m1["temperature"] == 1.0 and m1["model"] == "echo"
    assert chat["max_completion_tokens"] == 5 and "max_tokens" not in chat
    assert chat["temperature"] == 1.3  # OpenAI's range is not Anthropic's
    assert resp["max_output_tokens"] == 5 and "max_tokens" not in resp
    assert resp2["max_output_tokens"] == 9  # the default, under the Responses name
