"""Resilience against real vLLM engines: a client that hangs up frees vLLM's slot; a stopped
engine is marked down and its route fails over; restarted, it is marked up and serves again;
the client's `priority` reaches vLLM's scheduler.

Runs last among the real-vLLM tests (it restarts the ngram engine with --max-num-seqs 1 for the
priority test, on the same port, and leaves it so).
"""

from __future__ import annotations

import threading
import time

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
    clients whose policy priorities are 9, 1 and 5: vLLM starts the lowest value first."""
    assert vllm.ngram.max_num_seqs == 1

    def send(key: str, prio: int | None, tokens: int, hang_up: threading.Event | None) -> None:
        rid = f"prio-{prio}"
        body = {
            "model": f"{SERVED}-ngram",
            "messages": CHAT,
            "max_tokens": tokens,
            "stream": True,
            "ignore_eos": True,  # the blocker holds the slot until it hangs up, EOS or not
            **GREEDY,
        }
        with (
            vgw.client(key=key) as c,
            c.stream("POST", "/v1/chat/completions", json=body, headers={"x-request-id": rid}) as r,
        ):
            assert r.status_code == 200
            for _ in r.iter_lines():
                if hang_up is not None and hang_up.is_set():
                    return  # the client hangs up: vLLM frees the slot

    release = threading.Event()
    blocker = threading.Thread(target=send, args=(PRIORITY_KEYS[0], None, 30000, release))
    blocker.start()
    assert wait_for(lambda: samples(vllm.ngram.metrics_text())[RUNNING] == 1, 30)
    queued = []
    for prio in (9, 1, 5):
        t = threading.Thread(target=send, args=(PRIORITY_KEYS[prio], prio, 48, None))
        t.start()
        queued.append(t)
        time.sleep(0.3)
    waiting = "vllm:num_requests_waiting"

    def counts() -> dict[str, float]:  # what the failure shows: one run failed here, unexplained
        page = samples(vllm.ngram.metrics_text())
        return {"running": page[RUNNING], "waiting": page[waiting]}

    assert wait_for(lambda: counts()["waiting"] == 3, 30), (
        counts(),
        vgw.admin_get("/admin/status").json()["backends"]["v-ngram"],
        vgw.output[-20:],
    )
    release.set()  # the slot frees; the scheduler picks among the three by priority
    for t in [blocker, *queued]:
        t.join(60)
    # The order of their first tokens, on the gateway's clock (threads in this process may
    # read their answers in any order on a loaded machine).
    first = {prio: logged(vgw, f"prio-{prio}") for prio in (9, 1, 5)}
    order = sorted(first, key=lambda p: first[p]["time"] + first[p]["ttft_s"])
    assert order == [1, 5, 9], {p: (r["time"], r["ttft_s"]) for p, r in first.items()}
