"""The device model (loadtests/sim/device.py) on the engine core's virtual clock: co-located
engines slow each other, the context term, capacity from the memory share, preemption and
prefix-cache eviction under pressure."""

from __future__ import annotations

import pytest

from loadtests.sim.device import (
    BANDWIDTH_BYTES_PER_S,
    CALIBRATED_CONTEXT_TOKENS,
    KV_BYTES_PER_TOKEN,
    Device,
    DeviceParams,
    demand,
    kv_tokens_from_share,
    kv_tokens_split,
)
from loadtests.sim.engine import EngineCore, EngineRequest, State
from loadtests.sim.metrics import SimMetrics
from loadtests.sim.profiles import BUILTIN_PROFILES
from proxy.ops.deploy.memory import engine_from_share
from tests.sim.test_sim_engine import make_req, run

PROFILE = BUILTIN_PROFILES["dflash7-prob-block"]


def core_on(device: Device | None = None, kv: int | None = None) -> EngineCore:
    metrics = SimMetrics("m", PROFILE.max_model_len, PROFILE.num_spec_tokens)
    return EngineCore(PROFILE, metrics, device=device, kv_cache_tokens=kv)


def decode_step(core: EngineCore) -> float:
    """Duration of the first step in which every running sequence decodes."""
    now = 0.0
    for _ in range(1000):
        plan = core.plan_step(now)
        if plan.decode and not plan.prefill:
            return plan.duration
        now += plan.duration
        core.complete_step(plan, now)
    raise AssertionError("never decoded")


def test_kv_per_token_is_the_mtp_figure() -> None:
    assert KV_BYTES_PER_TOKEN == pytest.approx(38_087, rel=0.001)
    # ~14 ms per step for one 100K-token context, as the issue works out.
    ctx = Device().context_seconds([100_000 + CALIBRATED_CONTEXT_TOKENS])
    assert ctx == pytest.approx(100_000 * KV_BYTES_PER_TOKEN / BANDWIDTH_BYTES_PER_S)
    assert 0.013 < ctx < 0.015


@pytest.mark.parametrize("overlap,factor", [(0.0, 2.0), (0.5, 1.5), (1.0, 1.0)])
def test_co_located_engines_slow_each_other(overlap: float, factor: float) -> None:
    alone = core_on()
    alone.add(make_req(1, max_tokens=50))
    t_alone = decode_step(alone)

    device = Device("gb10", DeviceParams(overlap=overlap))
    a, b = core_on(device), core_on(device)
    a.add(make_req(1, max_tokens=50))
    assert decode_step(a) == pytest.approx(t_alone)  # the other engine is idle
    b.add(make_req(2, max_tokens=50))
    assert a.plan_step(1.0).duration == pytest.approx(t_alone * factor)


def test_three_busy_engines_serialise() -> None:
    device = Device()
    cores = [core_on(device) for _ in range(3)]
    for i, c in enumerate(cores):
        c.add(make_req(i, max_tokens=50))
    alone = core_on()
    alone.add(make_req(0, max_tokens=50))
    assert decode_step(cores[0]) == pytest.approx(3 * decode_step(alone))


def test_step_time_grows_with_the_context() -> None:
    short, long_ = core_on(), core_on()
    short.add(make_req(1, prompt_len=64, max_tokens=50))
    long_.add(make_req(2, prompt_len=100_000, max_tokens=50))
    t_short, t_long = decode_step(short), decode_step(long_)
    seq = long_.running[0]
    expected = (seq.kv_tokens - CALIBRATED_CONTEXT_TOKENS) * KV_BYTES_PER_TOKEN / 273e9
    assert t_long - t_short == pytest.approx(expected, rel=1e-6)
    # A short context is within the calibration: the facts' step time, untouched.
    assert t_short == pytest.approx(PROFILE.step_seconds(1))


def test_capacity_follows_the_memory_share() -> None:
    small, large = kv_tokens_from_share(PROFILE, 0.26), kv_tokens_from_share(PROFILE, 0.5)
    assert small == engine_from_share(demand(PROFILE), 0.26).kv_tokens
    assert 0 < small < large
    core = core_on(kv=small)
    assert core.kv_capacity == small
    assert core.cache.total == small // PROFILE.block_size
    one, two = kv_tokens_split([PROFILE]), kv_tokens_split([PROFILE] * 2)
    assert one[0] > two[0] == two[1] > 0
    # EngineCore alone (no kv_cache_tokens): the profile's, the documents' 36 GiB.
    assert core_on().kv_capacity == 813_427


def test_preemption_when_running_sequences_outgrow_the_cache() -> None:
    core = core_on(kv=3000)
    reqs = [make_req(i, prompt_len=1200, max_tokens=600, ignore_eos=True) for i in range(2)]
    for r in reqs:
        core.add(r)
    seen = run(core, reqs)
    assert core.metrics.preemptions._value.get() >= 1
    for r in reqs:
        assert r.finished == 1
        tokens = sum(len(d.token_ids) for step in seen[r.request_id] for d in step)
        assert tokens == 600  # recompute loses nothing the client was sent
    assert core.kv_used == 0


def test_preempted_sequence_recomputes_its_generated_tokens() -> None:
    core = core_on(kv=3000)
    a = make_req(1, prompt_len=1200, max_tokens=900, ignore_eos=True)
    b = make_req(2, prompt_len=1200, max_tokens=900, ignore_eos=True)
    core.add(a)
    core.add(b)
    now = 0.0
    while core.metrics.preemptions._value.get() == 0:
        plan = core.plan_step(now)
        now += plan.duration
        core.complete_step(plan, now)
    core.plan_step(now)  # the victim waits at the front of the queue
    victim = b.sequences[0]
    assert victim.state is State.WAITING and victim.preempted
    generated = victim.num_generated
    assert generated > 0
    while True:
        plan = core.plan_step(now)
        work = [n for s, n in plan.prefill if s is victim]
        if work:
            break
        now += plan.duration
        core.complete_step(plan, now)
    # Its prompt (less what the prefix cache kept) and everything it had generated.
    assert work[0] == 1200 + generated - victim.in_cache
    assert victim.in_cache <= 1200 - 16
    assert core.metrics.prefix_queries._value.get() == 3 * 1200


def test_prefix_cache_evicts_lru_blocks_under_pressure() -> None:
    core = core_on(kv=3200)  # 200 blocks
    first = make_req(1, prompt_len=800, hashes=list(range(1, 51)), max_tokens=20)
    core.add(first)
    run(core, [first])
    assert len(core.cache) == 50
    big = make_req(
        2, prompt_len=3000, hashes=list(range(1000, 1187)), max_tokens=20, ignore_eos=True
    )
    core.add(big)
    now = 0.0
    core.complete_step(core.plan_step(now), now)
    # The running prompt's 187 blocks leave room for 13 of the first request's 50 (12 once
    # the first generated token takes a block): the oldest go first.
    assert len(core.cache) <= 200
    assert core.cache.evictions >= 37
    run(core, [big])
    assert big.finished == 1
    again = make_req(3, prompt_len=800, hashes=list(range(1, 51)), max_tokens=5)
    core.add(again)
    core.plan_step(1.0)
    assert again.cached_tokens == 0  # its first blocks were the least recently used


def _prio_core(kv: int, policy: str) -> EngineCore:
    metrics = SimMetrics("m", PROFILE.max_model_len, PROFILE.num_spec_tokens)
    return EngineCore(
        PROFILE, metrics, kv_cache_tokens=kv, max_num_seqs=1, scheduling_policy=policy
    )


def _prio_req(key: int, priority: int, arrival: float, **kw: int) -> EngineRequest:
    req = make_req(key, ignore_eos=True, **kw)
    req.priority, req.arrival = priority, arrival
    return req


@pytest.mark.parametrize(("policy", "first"), [("fcfs", "r1"), ("priority", "r2")])
def test_priority_scheduling_serves_the_waiting_queue_by_priority(policy, first) -> None:
    """vLLM's waiting queue: arrival order under fcfs, (priority, arrival) under priority."""
    core = _prio_core(100_000, policy)
    late_but_urgent = _prio_req(2, 0, arrival=1.0, max_tokens=5)
    early = _prio_req(1, 5, arrival=0.0, max_tokens=5)
    core.add(early)
    core.add(late_but_urgent)
    core.plan_step(0.0)  # one slot: admits one
    assert [s.request.request_id for s in core.running] == [first]


@pytest.mark.parametrize(("policy", "victim"), [("fcfs", "r2"), ("priority", "r1")])
def test_priority_scheduling_preempts_the_lowest_priority(policy, victim) -> None:
    """Under pressure vLLM preempts the last admitted (fcfs) or the running request with the
    largest (priority, arrival) (priority): here the one admitted first."""
    core = EngineCore(
        PROFILE,
        SimMetrics("m", PROFILE.max_model_len, PROFILE.num_spec_tokens),
        kv_cache_tokens=3000,
        scheduling_policy=policy,
    )
    low = _prio_req(1, 9, arrival=0.0, prompt_len=1200, max_tokens=900)
    high = _prio_req(2, 0, arrival=1.0, prompt_len=1200, max_tokens=900)
    core.add(low)
    core.add(high)
    now = 0.0
    while core.metrics.preemptions._value.get() == 0:
        plan = core.plan_step(now)
        now += plan.duration
        core.complete_step(plan, now)
    preempted = [r.request_id for r in (low, high) if r.sequences[0].preempted]
    assert preempted == [victim]
