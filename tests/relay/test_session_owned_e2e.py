"""The session vLLM tags a request's KV blocks with is the gateway's own key, through the real
gateway over a simulated vLLM 0.32.0 (which reads it as that release does: the body's
`session_id`, then `X-Session-ID`, then `vllm_xargs`); a client's engine-steering `vllm_xargs`
is refused in the API's own error shape and reaches no engine. The same simulator publishes its
KV events to the gateway, which then tells the engine's rendering from other losses."""

from __future__ import annotations

import itertools
import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from loadtests.harness.gateway import ADMIN_TOKEN, GatewayServer, coder_policy
from loadtests.harness.requestlog import logged_rows
from loadtests.harness.sim import SimServer
from proxy.certs import CertFiles
from tests.stacks import SimGateway, Stacks

VERSION = "0.32.0"
_ids = itertools.count()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _stack(certs: CertFiles) -> Iterator[SimGateway]:
    """The simulator publishes its KV events to the gateway (0.32.0's wire and tags)."""
    events = f"tcp://127.0.0.1:{_free_port()}"
    replay = f"tcp://127.0.0.1:{_free_port()}"
    config = {"enable_kv_cache_events": True, "endpoint": events, "replay_endpoint": replay}
    args = ("--kv-events-config", json.dumps(config), "--enable-prompt-tokens-details")
    with SimServer(vllm_version=VERSION, time_scale=0.02, extra_args=args) as sim:
        doc = coder_policy({"a": sim.url}, defaults={})
        doc["backends"]["a"]["engine"] = {"vllm_version": VERSION}
        doc["backends"]["a"]["kv_events"] = {"endpoint": events, "replay": replay}
        with GatewayServer(doc, certs=certs) as gw:
            yield SimGateway(sim, gw)


@pytest.fixture
def stack(stacks: Stacks, certs: CertFiles) -> SimGateway:
    return stacks.get(("session-owned", VERSION), lambda: _stack(certs))


def _send(
    stack: SimGateway,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    rid: str | None = None,
) -> tuple[httpx.Response, str]:
    rid = rid or f"owned-{next(_ids)}"
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


WORDS = " ".join(f"line {i}: def f{i}(x): return x + {i}" for i in range(60))


def test_gateway_names_the_engines_rendering_from_its_events(stack: SimGateway) -> None:
    """A developer message mid-thread (Codex's resumed turn), `developer_in_place` off: the
    engine merges it into the system message at the top (as vLLM does for Qwen's template), so
    the blocks the previous turn left are resident but not reached: logged `engine-rendering`
    (without events: `unknown`)."""
    first = [
        {"role": "system", "content": WORDS},
        {"role": "user", "content": "read the repository"},
    ]
    resumed = [
        *first,
        {"role": "assistant", "content": "done"},
        {"role": "developer", "content": "new permissions: workspace-write"},
        {"role": "user", "content": "go on"},
    ]

    def send(messages: list[dict[str, Any]], rid: str, session: str) -> None:
        body = {"model": "coder", "messages": messages, "max_tokens": 4}
        r, _ = _send(stack, "/v1/chat/completions", body, {"x-session-id": session}, rid)
        assert r.status_code == 200, r.text

    def applied() -> float:
        name = 'specrouter_kv_events_total{backend="a",what="applied"}'
        line = next((x for x in stack.gw.metrics().splitlines() if x.startswith(name)), "0 0")
        return float(line.split()[-1])

    # the engine's publisher connects once the gateway has bound: until then its batches are
    # dropped, so other sessions' turns go first until one is read
    for i in range(50):
        warm = [{"role": "user", "content": f"warm {i}: {WORDS[:400]}"}]  # whole blocks
        send(warm, f"kv-warm-{i}", f"warm-{i}")
        if applied():
            break
    ids = [f"kv-render-{next(_ids)}", f"kv-render-{next(_ids)}"]
    before = applied()
    send(first, ids[0], "conv-dev")
    deadline = time.monotonic() + 10
    while applied() <= before:  # its blocks read before the next turn
        assert time.monotonic() < deadline
        time.sleep(0.01)
    before = applied()
    send(resumed, ids[1], "conv-dev")
    rows = logged_rows(stack.gw.dir / "state", set(ids))
    row = rows[ids[1]]
    assert row["loss_cause"] == "engine-rendering" and row["lost_tokens"] > 0, row
    # The session's prefix for stickiness and admission is what the engine holds, measured:
    # its stored blocks, short of the estimate (the last turn's prompt + output)
    while applied() <= before:
        assert time.monotonic() < deadline + 10
        time.sleep(0.01)
    explained = httpx.post(
        stack.gw.admin + "/admin/policy/explain",
        headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
        json={"request": {"model": "coder", "messages": resumed}, "session": row["session"]},
        timeout=10,
    ).json()["session"]
    estimate = row["prompt_tokens"] + row["completion_tokens"]
    assert 0 < explained["resident_tokens"] == explained["prefix_tokens"] < estimate, explained
