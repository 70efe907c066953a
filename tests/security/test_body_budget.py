"""Request bodies' memory, bounded across the process and per client (proxy/body_budget.py).

The finding (M1): memory was bounded per request only, so one client's 24 concurrent 8 MiB
requests to a slow engine took the gateway's RSS from 130 to 673 MB, over its 512 MiB
Kubernetes limit. Replayed here through the real gateway over TLS, scaled down: an engine that
holds every request until the test lets it answer, budgets of 3 MiB in all and 2 MiB per
client, requests of ~1 MB. Also: the budget's arithmetic, and that the budget, the Kubernetes
limit and the deploy plan's reservation come from one place.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import yaml

from loadtests.harness.gateway import CLIENT_KEY, OTHER_KEY, GatewayServer, coder_policy
from proxy.body_budget import (
    BODY_BUDGET_BYTES,
    BODY_BUDGET_PER_CLIENT_BYTES,
    GATEWAY_MEMORY_MIB,
    BodyBudget,
)
from proxy.certs import CertFiles
from proxy.ops.deploy.memory import MemoryParams
from proxy.settings import Settings
from tests.security.loopback_engine import LoopbackEngine

MIB = 1 << 20
ANSWER = b'{"id":"cmpl-1","object":"chat.completion","model":"qwen3.8-27b","choices":[]}'
ENV = {
    "SPECROUTER_BODY_BUDGET_BYTES": str(3 * MIB),
    "SPECROUTER_BODY_BUDGET_PER_CLIENT_BYTES": str(2 * MIB),
    "SPECROUTER_BODY_BUDGET_WAIT_S": "0.3",
}
DEPLOYMENT = Path(__file__).parents[2] / "deploy" / "k8s" / "deployment.yaml"


# -- the arithmetic ------------------------------------------------------------------------------


def test_the_budget_counts_in_all_and_per_client() -> None:
    b = BodyBudget(total=10, per_client=6)
    assert b.try_take("a", 4) and b.try_take("a", 2) and not b.try_take("a", 1)  # a's 6
    assert b.try_take("b", 4) and not b.try_take("c", 1)  # all 10
    b.give("a", 6)
    assert b.by_client == {"b": 4} and b.try_take("c", 5)
    assert BodyBudget(10, 6).try_take("a", 50)  # alone: never refused forever
    b2 = BodyBudget(10, 6)
    assert b2.try_take("a", 3) and b2.try_take("b", 50) is False and b2.try_take("c", 7)


async def test_a_request_over_the_budget_waits_for_one_to_end_or_gives_up() -> None:
    b = BodyBudget(total=10, per_client=10)
    first = await b.take("a", 8, 0.0)
    assert first is not None
    assert await b.take("b", 4, 0.0) is None  # no wait: refused at once
    waiting = asyncio.ensure_future(b.take("b", 4, 30.0))
    await asyncio.sleep(0)
    assert not waiting.done()
    first.fit(7)  # its body was smaller than declared: 1 comes back, not enough
    await asyncio.sleep(0)
    assert not waiting.done()
    first.release()
    second = await waiting
    assert second is not None and b.used == 4
    second.release()
    assert b.used == 0 and b.by_client == {}


def test_the_budget_the_kubernetes_limit_and_the_deploy_plan_agree() -> None:
    limits = yaml.safe_load(DEPLOYMENT.read_text())["spec"]["template"]["spec"]["containers"][0]
    assert limits["resources"]["limits"]["memory"] == f"{GATEWAY_MEMORY_MIB}Mi"
    assert MemoryParams().gateway_gib * 1024 == GATEWAY_MEMORY_MIB
    settings = Settings()
    assert settings.body_budget_bytes == BODY_BUDGET_BYTES
    assert settings.body_budget_per_client_bytes == BODY_BUDGET_PER_CLIENT_BYTES
    assert BODY_BUDGET_PER_CLIENT_BYTES >= settings.max_body_bytes  # a client's largest fits


# -- replayed through the gateway ---------------------------------------------------------------


class GateEngine(LoopbackEngine):
    """Holds every POST until `open` is called; `held` counts those it got."""

    def __init__(self) -> None:
        super().__init__()
        self.held = 0
        self.arrived = threading.Condition()
        self._gate = asyncio.Event()

    def open(self) -> None:
        self.loop.call_soon_threadsafe(self._gate.set)

    def wait_held(self, n: int) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: self.held >= n, 10), self.held

    async def answer(
        self, w: asyncio.StreamWriter, line: str, headers: dict[str, str], body: bytes
    ) -> bool:
        if line.startswith("POST "):
            with self.arrived:
                self.held += 1
                self.arrived.notify_all()
            await self._gate.wait()
        post = line.startswith("POST ")
        out, ctype = (ANSWER, b"application/json") if post else (b"", b"text/plain")
        w.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: %b\r\ncontent-length: %d\r\n\r\n%b"
            % (ctype, len(out), out)
        )
        return True


@pytest.fixture(scope="module")
def stack(certs: CertFiles) -> Iterator[tuple[GatewayServer, GateEngine]]:
    with pytest.MonkeyPatch.context() as env, GateEngine() as engine:
        for name, value in ENV.items():
            env.setenv(name, value)  # inherited by the gateway
        with GatewayServer(coder_policy({"gate": engine.url}, defaults={}), certs=certs) as gw:
            yield gw, engine


def _body(tag: str) -> bytes:
    content = f"[{tag}] " + "x" * 1_000_000  # ~1 MB: two fit a client's 2 MiB, three do not
    return orjson.dumps({"model": "coder", "messages": [{"role": "user", "content": content}]})


class _Post(threading.Thread):
    def __init__(self, gw: GatewayServer, key: str, tag: str, path: str) -> None:
        super().__init__(daemon=True)
        self.gw, self.key, self.tag, self.path = gw, key, tag, path
        self.response: httpx.Response | None = None
        self.start()

    def run(self) -> None:
        with self.gw.client(self.key) as c:
            self.response = c.post(self.path, content=_body(self.tag), timeout=30)

    def done(self) -> httpx.Response:
        self.join(30)
        assert self.response is not None
        return self.response


def _refused(gw: GatewayServer, key: str, path: str = "/v1/chat/completions") -> httpx.Response:
    """A request that must be refused within the budget's wait (0.3 s): on the base it would
    reach the held engine and time out here."""
    with gw.client(key) as c:
        r = c.post(path, content=_body("refused"), timeout=5)
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1" and r.headers["x-should-retry"] == "true"
    assert "memory budget" in r.text
    return r


def test_one_client_cannot_take_the_processes_memory_for_bodies(
    stack: tuple[GatewayServer, GateEngine],
) -> None:
    gw, engine = stack
    mine = [_Post(gw, CLIENT_KEY, f"a{i}", "/v1/chat/completions") for i in range(2)]
    engine.wait_held(2)  # the client's 2 MiB are taken, held at the engine
    try:
        r = _refused(gw, CLIENT_KEY)  # a third body of the same client: 503, OpenAI's shape
        assert r.json()["error"]["code"] == 503
        r = _refused(gw, CLIENT_KEY, "/v1/messages")  # ... Anthropic's on Messages
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "overloaded_error"
        other = _Post(gw, OTHER_KEY, "b0", "/v1/chat/completions")  # another client: served
        engine.wait_held(3)
        _refused(gw, OTHER_KEY)  # the process's 3 MiB are taken
    finally:
        engine.open()
    assert [p.done().status_code for p in [*mine, other]] == [200] * 3
    # The bodies' bytes came back with their requests' ends.
    with gw.client(CLIENT_KEY) as c:
        r = c.post("/v1/chat/completions", content=_body("again"), timeout=10)
        assert r.status_code == 200
