"""Engine data that must not reach another client, the load state or the dashboard
(docs/security-hardening.md), replayed against the real gateway with two raw engines on loopback.

Each POST is answered by the script its body names; /health and /metrics answer what the test
sets. After each attack another client is served its own answer, and the gateway is alive.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator

import httpx
import orjson
import pytest

from loadtests.harness.gateway import OTHER_KEY, GatewayServer, coder_policy
from loadtests.harness.ports import free_port
from loadtests.harness.requestlog import logged_rows
from proxy.certs import CertFiles
from tests.security.loopback_engine import LoopbackEngine

ANSWER = b'{"id":"cmpl-1","object":"chat.completion","model":"qwen3.8-27b","choices":[]}'
SEEN = ANSWER.replace(b'"qwen3.8-27b"', b'"coder"')
EVIL = b'{"id":"cmpl-evil","object":"chat.completion","choices":[]}'
Script = Callable[[asyncio.StreamWriter, str], Awaitable[bool]]  # True: keep the connection


def _json(body: bytes, extra: bytes = b"", ctype: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: %b\r\ncontent-length: %d\r\n%b\r\n%b" % (
        ctype,
        len(body),
        extra,
        body,
    )


def _echo(rid: str) -> bytes:
    return b"x-request-id: %b\r\n" % rid.encode()


async def s_ok(w: asyncio.StreamWriter, rid: str) -> bool:
    w.write(_json(ANSWER, _echo(rid)))
    return True


async def s_second_no_echo(w: asyncio.StreamWriter, rid: str) -> bool:
    w.write(_json(ANSWER) + _json(EVIL))
    return True


async def s_late_no_echo(w: asyncio.StreamWriter, rid: str) -> bool:
    """No echo, then a second answer a moment later, on a connection kept open."""
    w.write(_json(ANSWER))
    await w.drain()
    await asyncio.sleep(0.05)
    w.write(_json(EVIL))
    return True


async def s_head_in_one_read(w: asyncio.StreamWriter, rid: str) -> bool:
    pad = b"".join(b"x-pad-%d: %b\r\n" % (i, b"p" * 4000) for i in range(25))  # 100 KB
    w.write(_json(ANSWER, _echo(rid) + pad))
    return True


async def s_not_json(w: asyncio.StreamWriter, rid: str) -> bool:
    w.write(_json(b"<html>sign in</html>", _echo(rid)))
    return True


async def s_negative_tokens(w: asyncio.StreamWriter, rid: str) -> bool:
    usage = {"prompt_tokens": -5, "completion_tokens": -3, "total_tokens": 1 << 63}
    w.write(_json(orjson.dumps({**orjson.loads(ANSWER), "usage": usage}), _echo(rid)))
    return True


async def s_slow_head(w: asyncio.StreamWriter, rid: str) -> bool:
    await asyncio.sleep(2.0)  # past the first-byte timeout (1 s): the engine has the request
    w.write(_json(ANSWER, _echo(rid)))
    return False


SCRIPTS: dict[str, Script] = {
    name.removeprefix("s_"): fn for name, fn in globals().items() if name.startswith("s_")
}


class Engine(LoopbackEngine):
    """HTTP/1.1 on loopback in its own thread; `health` and `metrics` are what GETs answer."""

    def __init__(self) -> None:
        super().__init__()
        self.posts = 0
        self.health = 200
        self.metrics = b""

    async def answer(
        self, w: asyncio.StreamWriter, line: str, headers: dict[str, str], body: bytes
    ) -> bool:
        if line.startswith("GET /metrics"):
            w.write(_json(self.metrics, ctype=b"text/plain"))
            return True
        if line.startswith("GET "):
            w.write(b"HTTP/1.1 %d X\r\ncontent-length: 0\r\n\r\n" % self.health)
            return True
        self.posts += 1
        script = SCRIPTS[orjson.loads(body).get("hostile", "ok")]
        return await script(w, headers.get("x-request-id", ""))


class Stack:
    def __init__(self, gw: GatewayServer, a: Engine, b: Engine) -> None:
        self.gw, self.a, self.b = gw, a, b


@pytest.fixture(scope="module")
def stack(certs: CertFiles) -> Iterator[Stack]:
    with Engine() as a, Engine() as b:
        policy = coder_policy({"a": a.url, "b": b.url}, defaults={})
        with GatewayServer(
            policy, certs=certs, args=("--first-byte-timeout", "1", "--idle-timeout", "5")
        ) as gw:
            yield Stack(gw, a, b)


def _post(
    gw: GatewayServer, script: str, key: str = OTHER_KEY, stream: bool = False
) -> httpx.Response:
    body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}], "hostile": script}
    if stream:
        body["stream"] = True
    with gw.client(key) as c:
        return c.post("/v1/chat/completions", json=body)


def _ready(s: Stack) -> None:
    s.a.health, s.a.metrics = 200, b""
    deadline = time.monotonic() + 10
    while _status(s.gw)["a"]["health"] != "up":
        assert time.monotonic() < deadline, "backend a never came back up"
        time.sleep(0.1)


def _status(gw: GatewayServer) -> dict[str, dict[str, object]]:
    r = gw.admin_get("/admin/status")
    assert r.status_code == 200, r.text
    backends: dict[str, dict[str, object]] = r.json()["backends"]
    return backends


def _bad_gateway(needle: str) -> Callable[[httpx.Response], None]:
    def check(r: httpx.Response) -> None:
        assert r.status_code == 502 and needle in r.text, r.text[:300]

    return check


def _served(r: httpx.Response) -> None:
    assert (r.status_code, r.content) == (200, SEEN), r.text[:300]


# (script, what its own client gets)
ATTACKS: list[tuple[str, Callable[[httpx.Response], None]]] = [
    ("second_no_echo", _served),
    ("late_no_echo", _served),
    ("head_in_one_read", _bad_gateway("head larger than")),
    ("not_json", _bad_gateway("not JSON")),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("script", "expect"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_an_engine_answer_reaches_no_other_client(
    stack: Stack, script: str, expect: Callable[[httpx.Response], None]
) -> None:
    _ready(stack)
    for _ in range(6):  # the finding: 6 of 6 next requests got the stale answer
        expect(_post(stack.gw, script, key="sk-test-client"))
        # At once, on whatever connection the gateway reuses: this client's own answer.
        _served(_post(stack.gw, "ok"))
        streamed = _post(stack.gw, "ok", stream=True)  # the push relay's kept connections
        assert streamed.status_code == 200 and b"cmpl-1" in streamed.content, streamed.text
    assert stack.gw.proc is not None and stack.gw.proc.poll() is None


@pytest.mark.timeout(30)
def test_negative_token_counts_keep_the_log_row(stack: Stack) -> None:
    _ready(stack)
    r = _post(stack.gw, "negative_tokens")
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]
    rows = logged_rows(stack.gw.dir / "state", {rid}, "outcome, prompt_tokens, completion_tokens")
    assert rid in rows, "the request's log row was lost"
    row = rows[rid]
    assert row["outcome"] == "ok" and row["prompt_tokens"] is None
    assert row["completion_tokens"] in (0, None)


@pytest.mark.timeout(30)
def test_a_request_timed_out_before_the_head_is_not_sent_to_another_variant(
    stack: Stack,
) -> None:
    _ready(stack)
    a, b = stack.a.posts, stack.b.posts
    r = _post(stack.gw, "slow_head")
    assert r.status_code == 504, r.text
    assert r.json()["error"]["message"].startswith("no backend could serve")
    assert (stack.a.posts - a, stack.b.posts - b) == (1, 0)


METRICS = {
    "nan": b"vllm:num_requests_running NaN\nvllm:num_requests_waiting +Inf\n",
    "huge": b"vllm:num_requests_running 1e300\nvllm:num_requests_waiting 1e300\n",
    "negative": b"vllm:num_requests_running -7\nvllm:num_requests_waiting -1e300\n",
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", list(METRICS))
def test_metrics_values_that_are_not_counts_are_not_read(stack: Stack, kind: str) -> None:
    _ready(stack)
    gw, a = stack.gw, stack.a
    a.health = 503  # down first: the health that a bad scrape once froze at its last value
    deadline = time.monotonic() + 10
    while _status(gw)["a"]["health"] == "up":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    a.health, a.metrics = 200, METRICS[kind]
    deadline = time.monotonic() + 10
    while (state := _status(gw)["a"])["health"] != "up":
        assert time.monotonic() < deadline, f"health frozen: {state}"
        time.sleep(0.1)
    time.sleep(0.6)  # two more scrapes of the bad page
    state = _status(gw)["a"]
    assert state["running"] in (None, 0) and state["waiting"] in (None, 0), state
    assert gw.admin_get("/dashboard/snapshot").status_code == 200
    _served(_post(gw, "ok"))


@pytest.mark.parametrize("client", ["push", "pull"])
async def test_a_connect_failure_names_no_engine_address(client: str) -> None:
    """What a client reads of a refused engine connection (both relays' engine clients)."""
    from proxy.relay.engine_conn import EnginePool, open_engine_stream
    from proxy.relay.upstream import Upstream, UpstreamError

    port = free_port()  # nothing listens there
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with pytest.raises(UpstreamError) as caught:
        if client == "push":
            await open_engine_stream(EnginePool(), url, b"{}", {}, 2.0)
        else:
            upstream = Upstream(connect_timeout=2.0, first_byte_timeout=2.0)
            try:
                await upstream.post(url, b"{}", {})
            finally:
                await upstream.aclose()
    message = str(caught.value)
    assert "refused" in message.lower(), message
    assert str(port) not in message and "127.0.0.1" not in message, message
