"""Resilience against real vLLM engines: a client that hangs up frees vLLM's slot; a stopped
engine is marked down and its route fails over; restarted, it is marked up and serves again;
the client's `priority` reaches vLLM's scheduler.

Runs last among the real-vLLM tests (it restarts the ngram engine with --max-num-seqs 1 for the
priority test, on the same port, and leaves it so).
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from typing import Any

import httpx

from loadtests.harness.gateway import GatewayServer
from loadtests.harness.vllm import SERVED
from tests.engines.vllm import replay
from tests.engines.vllm.common import (
    CHAT,
    GREEDY,
    PROMPT,
    kv_events,
    logged,
    samples,
    wait_for,
)
from tests.engines.vllm.conftest import PRIORITY_KEYS, Engines

RUNNING = "vllm:num_requests_running"


def test_a_client_that_hangs_up_frees_the_slot(vgw: GatewayServer, vllm: Engines) -> None:
    body = {"model": SERVED, "messages": CHAT, "max_tokens": 20000, "stream": True, **GREEDY}
    seen: list[str] = []
    with vgw.client() as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        lines = r.iter_lines()  # held: a dropped iterator is closed, and closes the response
        for line in lines:
            seen.append(line)
            if len(seen) > 8:
                break
        assert any('"delta":' in line for line in seen), seen
        assert wait_for(lambda: samples(vllm.draft.metrics_text())[RUNNING] == 1, 5)
    assert wait_for(lambda: samples(vllm.draft.metrics_text())[RUNNING] == 0, 5)


def variant(gw: GatewayServer) -> str:
    with gw.client() as c:
        r = c.post(
            "/v1/chat/completions",
            json={"model": f"{SERVED}-fo", "messages": CHAT, "max_tokens": 4, **GREEDY},
        )
    assert r.status_code == 200, r.text
    return r.headers["x-specrouter-variant"]


def health(gw: GatewayServer, backend: str) -> str:
    status = gw.admin_get("/admin/status").json()
    return str(status["backends"][backend]["health"])


def test_stop_failover_restart_recover(vgw: GatewayServer, vllm: Engines) -> None:
    """... and the restart is the lost prefix's cause for a session's next turn: the recorded
    OpenAI SDK session's first request before the restart, its second after it."""
    assert variant(vgw) == "v-ngram"
    first, second = replay.load("openai-sdk")
    with vgw.client() as c:
        before, _ = replay.send(c, vllm.ngram, vgw, first, None)
    assert before.status == 200, before.text[:300]
    restarts = kv_events(vgw, "v-ngram", "restart")
    vllm.ngram.stop()
    assert wait_for(lambda: health(vgw, "v-ngram") == "down", 15), health(vgw, "v-ngram")
    assert variant(vgw) == "v-draft"  # the route fails over to the other engine
    vllm.ngram.max_num_seqs = 1  # for the priority test below
    vllm.ngram.start(keep_port=True)
    assert wait_for(lambda: health(vgw, "v-ngram") == "up", 15), health(vgw, "v-ngram")
    assert variant(vgw) == "v-ngram"
    # The gateway knows of the restart once the new process publishes its first batch (its
    # sequence starts at 0 again): a request that stores a block.
    long = [{"role": "user", "content": PROMPT * 20}]
    with vgw.client() as c:
        body = {"model": f"{SERVED}-ngram", "messages": long, "max_tokens": 2, **GREEDY}
        assert c.post("/v1/chat/completions", json=body).status_code == 200
        assert wait_for(lambda: kv_events(vgw, "v-ngram", "restart") > restarts, 15)
        after, _ = replay.send(c, vllm.ngram, vgw, second, None)
    assert after.status == 200, after.text[:300]
    row, block = after.row, int(vllm.ngram.cache_config()["block_size"])
    held = before.row["prompt_tokens"] // block * block
    assert row["session"] == before.row["session"], (row, before.row)
    assert (row["cached_tokens"], row["expected_tokens"]) == (0, held), row
    assert (row["lost_tokens"], row["loss_cause"]) == (held, "engine-reset"), row


def test_priority_reaches_vllms_scheduler(vgw: GatewayServer, vllm: Engines) -> None:
    """One slot (--max-num-seqs 1), a long request holding it, three queued behind it from
    clients whose policy priorities are 9, then 5 and 1: vLLM starts the lowest value first.

    While the blocker decodes, the engine, its API server and the gateway take the two cores.
    The blocker is a completion (a chat stream's per-step rendering and parsing kept vLLM's API
    server so busy that a queued request took 7-20 s to reach the scheduler) read in paced
    chunks (a thread reading 300 lines a second starved this process's other threads for
    seconds); each queued client connects before it starts (no TLS handshake under that load)
    and waits as long as the test does."""
    assert vllm.ngram.max_num_seqs == 1
    waiting = "vllm:num_requests_waiting"

    def counts() -> dict[str, float]:
        page = samples(vllm.ngram.metrics_text())
        return {"running": page[RUNNING], "waiting": page[waiting]}

    def body(tokens: int) -> dict[str, Any]:
        return {
            "model": f"{SERVED}-ngram",
            "messages": CHAT,
            "max_tokens": tokens,
            "stream": True,
            "ignore_eos": True,  # every answer runs to its max_tokens
            **GREEDY,
        }

    def queued(c: httpx.Client, prio: int, go: threading.Event) -> None:
        go.wait()
        rid = f"prio-{prio}"
        with c.stream(
            "POST", "/v1/chat/completions", json=body(48), headers={"x-request-id": rid}
        ) as r:
            assert r.status_code == 200
            r.read()

    release = threading.Event()

    def blocker(c: httpx.Client) -> None:
        # A completion: vLLM's API server renders no chat and runs no parser per step.
        blocking = {"model": f"{SERVED}-ngram", "prompt": PROMPT, "max_tokens": 30000}
        blocking |= {"stream": True, "ignore_eos": True, **GREEDY}
        with c.stream("POST", "/v1/completions", json=blocking) as r:
            assert r.status_code == 200
            for _ in r.iter_raw():
                if release.wait(0.05):  # the client hangs up: vLLM frees the slot
                    return

    prios = (9, 1, 5)
    with ExitStack() as stack:

        def client(prio: int) -> httpx.Client:
            c = stack.enter_context(vgw.client(key=PRIORITY_KEYS[prio]))
            c.timeout = httpx.Timeout(120)  # a queued request's first byte: the test's waits
            return c

        clients = {p: client(p) for p in prios}
        for c in clients.values():  # connected now, while the machine is quiet
            assert c.get("/v1/models").status_code == 200
        gos = {p: threading.Event() for p in prios}
        threads = [threading.Thread(target=queued, args=(clients[p], p, gos[p])) for p in prios]
        threads.append(threading.Thread(target=blocker, args=(client(0),)))
        for t in threads:
            t.start()
        phases = Phases()  # printed: where a slow run's time went (pytest shows it on failure)
        try:
            assert wait_for(lambda: counts()["running"] == 1, 60), counts()
            phases("blocker running")
            # 9 first (FIFO would start it first), then 5 and 1 together (5 sent first).
            gos[9].set()
            assert wait_for(lambda: counts()["waiting"] == 1, 60), counts()
            phases("9 waiting")
            gos[5].set()
            gos[1].set()
            assert wait_for(lambda: counts()["waiting"] == 3, 60), counts()
            phases("all 3 waiting")
        finally:
            for go in gos.values():
                go.set()
            release.set()  # the slot frees; the scheduler picks among the three by priority
            for t in threads:
                t.join(120)
            phases("all answered")
    # The order of their first tokens, on the gateway's clock (threads in this process may
    # read their answers in any order on a loaded machine).
    first = {prio: logged(vgw, f"prio-{prio}") for prio in prios}
    order = sorted(first, key=lambda p: first[p]["time"] + first[p]["ttft_s"])
    assert order == [1, 5, 9], {p: (r["time"], r["ttft_s"]) for p, r in first.items()}


class Phases:
    """Seconds from the start to each named phase, printed as they pass."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, name: str) -> None:
        print(f"{time.monotonic() - self.start:6.2f} s {name}", flush=True)
