"""One client against another's sessions and conversations (docs/security-hardening.md), replayed
against the real gateway with a recording engine on loopback: what a client may claim about
itself (a subagent's priority), how much of the shared session table it may hold, what of its
session and trace headers goes upstream, and whose stored response it may continue.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from loadtests.harness.gateway import (
    ADMIN_TOKEN,
    CLIENT_KEY,
    OTHER_KEY,
    GatewayServer,
    coder_policy,
)
from proxy.certs import CertFiles
from tests.security.loopback_engine import LoopbackEngine

CHAT = b'{"id":"cmpl-1","object":"chat.completion","model":"qwen3.8-27b","choices":[]}'
EMBED = b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}]}'
TABLE_SIZE = 20


class Engine(LoopbackEngine):
    """Records each POST (path, headers, body); answers chat, embeddings and Responses (a new
    `resp_N` id each time, as vLLM's store would)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self._ids = itertools.count(1)

    async def answer(
        self, w: asyncio.StreamWriter, line: str, headers: dict[str, str], raw: bytes
    ) -> bool:
        path = line.split(" ")[1]
        if line.startswith("GET "):
            body, ctype = b"", b"text/plain"
        else:
            self.seen.append((path, headers, orjson.loads(raw)))
            ctype = b"application/json"
            body = {
                "/v1/embeddings": EMBED,
                "/v1/responses": b'{"id":"resp_%d","object":"response",'
                b'"status":"completed","output":[]}' % next(self._ids),
            }.get(path, CHAT)
        rid = headers.get("x-request-id", "").encode()
        w.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: %b\r\ncontent-length: %d\r\n"
            b"x-request-id: %b\r\n\r\n%b" % (ctype, len(body), rid, body)
        )
        return True


class Stack:
    def __init__(self, gw: GatewayServer, engine: Engine) -> None:
        self.gw, self.engine = gw, engine


@pytest.fixture(scope="module")
def stack(certs: CertFiles) -> Iterator[Stack]:
    with Engine() as engine:
        policy = coder_policy({"rec": engine.url}, defaults={}, embed={"embed": engine.url})
        policy["backends"]["rec"]["priority_scheduling"] = True
        policy["sessions"] = {"subagent_priority": -10, "table_size": TABLE_SIZE}
        with GatewayServer(policy, certs=certs) as gw:
            yield Stack(gw, engine)


def _post(
    s: Stack, path: str, body: dict[str, Any], key: str, headers: dict[str, str] | None = None
) -> tuple[httpx.Response, dict[str, str], dict[str, Any]]:
    before = len(s.engine.seen)
    with s.gw.client(key) as c:
        r = c.post(path, json=body, headers=headers or {})
    got = s.engine.seen[before:]
    return r, *(got[-1][1:] if got else ({}, {}))


def _chat(s: Stack, key: str, headers: dict[str, str]) -> dict[str, Any]:
    body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}]}
    r, _, sent = _post(s, "/v1/chat/completions", body, key, headers)
    assert r.status_code == 200, r.text
    return sent


def test_a_self_declared_subagent_gets_no_better_priority_than_its_client(stack: Stack) -> None:
    s = stack
    plain = _chat(s, OTHER_KEY, {"x-session-id": "mine"})
    marked = _chat(s, OTHER_KEY, {"x-session-id": "mine", "x-openai-subagent": "1"})
    # The policy gives subagents -10 (ahead of everyone); the client's own priority is 0.
    assert plain["priority"] == 0 and marked["priority"] == 0, (plain, marked)


def test_one_client_s_many_sessions_do_not_evict_another_s(stack: Stack) -> None:
    s = stack
    for i in range(3):
        _chat(s, CLIENT_KEY, {"x-session-id": f"victim-{i}"})
    for i in range(TABLE_SIZE * 2):  # the finding: 12,000 ids against a 10,000-row table
        _chat(s, OTHER_KEY, {"x-session-id": f"flood-{i}"})
    for i in range(3):
        r = httpx.post(
            s.gw.admin + "/admin/policy/explain",
            headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
            json={
                "request": {"model": "coder", "messages": [{"role": "user", "content": "hi"}]},
                "client": "agent",
                "headers": {"x-session-id": f"victim-{i}"},
            },
            timeout=10,
        )
        assert r.status_code == 200, r.text
        assert r.json()["session"]["source"] == "table", f"victim-{i} was evicted: {r.text}"


def test_embeddings_send_no_raw_session_header_upstream(stack: Stack) -> None:
    s = stack
    r, headers, _ = _post(
        s,
        "/v1/embeddings",
        {"model": "embed", "input": "x"},
        OTHER_KEY,
        {"x-session-id": "raw-secret-session"},
    )
    assert r.status_code == 200, r.text
    assert "raw-secret-session" not in orjson.dumps(headers).decode(), headers


def test_previous_response_id_continues_only_the_creator_s_conversation(stack: Stack) -> None:
    s = stack
    body = {"model": "coder", "input": "hi"}
    r, _, _ = _post(s, "/v1/responses", body, CLIENT_KEY)
    assert r.status_code == 200, r.text
    created = r.json()["id"]
    before = len(s.engine.seen)
    stolen, _, _ = _post(s, "/v1/responses", {**body, "previous_response_id": created}, OTHER_KEY)
    assert stolen.status_code == 404, stolen.text
    assert stolen.json()["error"]["param"] == "previous_response_id"
    assert len(s.engine.seen) == before  # never reached the engine
    own, _, sent = _post(s, "/v1/responses", {**body, "previous_response_id": created}, CLIENT_KEY)
    assert own.status_code == 200 and sent["previous_response_id"] == created


PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# (case, the client's trace headers, what the engine gets of them)
TRACE = [
    ("valid", {"traceparent": PARENT, "tracestate": "a=1,b=2"}, ("a=1,b=2", PARENT)),
    ("tracestate-60k", {"traceparent": PARENT, "tracestate": "a=" + "x" * 60_000}, (None, PARENT)),
    (
        "tracestate-33-members",
        {"traceparent": PARENT, "tracestate": "a=1," * 32 + "b=2"},
        (None, PARENT),
    ),
    ("traceparent-junk", {"traceparent": "x" * 8_000, "tracestate": "a=1"}, (None, None)),
    (
        "traceparent-zero-trace",
        {"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"},
        (None, None),
    ),
]


@pytest.mark.parametrize(("case", "sent", "forwarded"), TRACE, ids=[c[0] for c in TRACE])
def test_trace_headers_reach_the_engine_only_within_the_standard_s_bounds(
    stack: Stack, case: str, sent: dict[str, str], forwarded: tuple[str | None, str | None]
) -> None:
    body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}]}
    r, headers, _ = _post(stack, "/v1/chat/completions", body, OTHER_KEY, sent)
    assert r.status_code == 200, r.text
    assert (headers.get("tracestate"), headers.get("traceparent")) == forwarded, case
