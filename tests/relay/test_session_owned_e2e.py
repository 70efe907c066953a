"""The session vLLM tags a request's KV blocks with is the gateway's own key, through the real
gateway over a simulated vLLM 0.32.0 (which reads it as that release does: the body's
`session_id`, then `X-Session-ID`, then `vllm_xargs`); a client's engine-steering `vllm_xargs`
is refused in the API's own error shape and reaches no engine."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.requestlog import logged_rows
from loadtests.harness.sim import SimServer
from proxy.certs import CertFiles
from tests.stacks import SimGateway, Stacks

VERSION = "0.32.0"
_ids = itertools.count()


@contextmanager
def _stack(certs: CertFiles) -> Iterator[SimGateway]:
    with SimServer(vllm_version=VERSION, time_scale=0.02) as sim:
        doc = coder_policy({"a": sim.url}, defaults={})
        doc["backends"]["a"]["engine"] = {"vllm_version": VERSION}
        with GatewayServer(doc, certs=certs) as gw:
            yield SimGateway(sim, gw)


@pytest.fixture
def stack(stacks: Stacks, certs: CertFiles) -> SimGateway:
    return stacks.get(("session-owned", VERSION), lambda: _stack(certs))


def _send(
    stack: SimGateway, path: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[httpx.Response, str]:
    rid = f"owned-{next(_ids)}"
    with stack.gw.client() as c:
        r = c.post(path, json=body, headers={"x-request-id": rid, **headers})
    return r, rid


def _tagged(stack: SimGateway, rid: str) -> list[str | None]:
    """The session ids the engine tagged request `rid` with (one per request it got)."""
    seen = httpx.get(f"{stack.sim.url}/_sim/sessions", timeout=5).json()
    return [v for k, v in seen.items() if k.endswith(rid)]


CHAT = {"model": "coder", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "coder", "max_output_tokens": 4, "input": "hi"}
MESSAGES = {"model": "coder", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/responses", RESPONSES),
        ("/v1/messages", MESSAGES),
    ],
)
def test_the_engine_tags_the_gateways_session(
    stack: SimGateway, path: str, body: dict[str, Any]
) -> None:
    # a client's body `session_id` naming another conversation does not reach the engine
    headers = {"x-claude-code-session-id": f"conv-{path}"}
    first, rid1 = _send(stack, path, {**body, "session_id": "someone-else"}, headers)
    second, rid2 = _send(stack, path, body, headers)
    assert first.status_code == second.status_code == 200, first.text
    rows = logged_rows(stack.gw.dir / "state", {rid1, rid2}, "request_id, session")
    key = rows[rid1]["session"]
    assert key and key.startswith("s-") and rows[rid2]["session"] == key
    assert _tagged(stack, rid1) == _tagged(stack, rid2) == [key]


def test_a_request_without_a_session_is_untagged(stack: SimGateway) -> None:
    body = {"model": "coder", "max_tokens": 4, "prompt": "hi", "session_id": "someone-else"}
    r, rid = _send(stack, "/v1/completions", body, {})
    assert r.status_code == 200, r.text
    assert _tagged(stack, rid) == [None]


@pytest.mark.parametrize(
    ("path", "body", "key"),
    [
        ("/v1/chat/completions", CHAT, "session_id"),
        ("/v1/responses", RESPONSES, "kv_cache_report_mode"),
        ("/v1/messages", MESSAGES, "session_id"),
    ],
)
def test_engine_steering_xargs_are_refused(
    stack: SimGateway, path: str, body: dict[str, Any], key: str
) -> None:
    r, rid = _send(stack, path, {**body, "vllm_xargs": {key: "full"}}, {})
    assert r.status_code == 400, r.text
    err = r.json()
    if path == "/v1/messages":
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    else:
        assert err["error"]["param"] == "vllm_xargs"
    assert f"vllm_xargs.{key}" in (err["error"]["message"])
    assert _tagged(stack, rid) == []  # no engine saw it
