"""vLLM's batch-size draft schedule in the simulated engine: K from the step's batch size."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadtests.sim.profiles import BUILTIN_PROFILES, Profile
from tests.sim.test_sim_engine import make_core, make_req, run

BASE = BUILTIN_PROFILES["dflash7-prob-block"]


def scheduled(schedule: list[list[int]]) -> Profile:
    config = {**(BASE.speculative_config or {}), "num_speculative_tokens_per_batch_size": schedule}
    return replace(BASE, name="scheduled", speculative_config=config)


@pytest.mark.parametrize(
    ("batch", "k"),
    # a gap (3) and the tail (past 8) keep the previous K; K above num_spec_tokens is capped
    [(1, 7), (2, 4), (3, 4), (4, 2), (8, 2), (64, 2)],
)
def test_k_follows_the_schedule(batch: int, k: int) -> None:
    profile = scheduled([[1, 1, 9], [2, 2, 4], [4, 8, 2]])
    assert profile.draft_tokens(batch) == k
    assert BASE.draft_tokens(batch) == 7  # no schedule: always num_spec_tokens


def test_each_step_drafts_the_k_of_its_batch_on_the_virtual_clock() -> None:
    profile = scheduled([[1, 1, 7], [2, 16, 2]])
    alone = make_core(profile)
    solo = make_req(1, max_tokens=300)
    alone.add(solo)
    run(alone, [solo])
    spec = solo.sequences[0].spec
    assert spec.drafted == 7 * spec.steps

    crowded = make_core(profile)
    reqs = [make_req(i, max_tokens=300) for i in range(4)]
    for req in reqs:
        crowded.add(req)
    seqs = [r.sequences[0] for r in reqs]
    now, ks = 0.0, set()
    while crowded.has_work():
        plan = crowded.plan_step(now)
        before = [s.spec.drafted for s in seqs]
        now += plan.duration
        crowded.complete_step(plan, now)
        scheduled_k = 7 if len(plan.decode) + len(plan.prefill) == 1 else 2
        for seq, drafted in zip(seqs, before, strict=True):
            if seq in plan.decode:
                assert seq.spec.drafted - drafted == scheduled_k
                ks.add(scheduled_k)
    assert 2 in ks  # the four shared steps
    assert all(sum(s.spec.histogram[3:]) < s.spec.steps // 4 for s in seqs)
    # alone it accepts more per step than any of the four, which mostly ran with K=2
    crowded_best = max(s.spec.accepted / s.spec.steps for s in seqs)
    assert spec.accepted / spec.steps > crowded_best
