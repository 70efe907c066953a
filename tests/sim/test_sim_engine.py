"""The engine model without a server: scheduling, acceptance, stop conditions, profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests.sim.engine import Delta, EngineCore, EngineRequest, SamplingSpec
from loadtests.sim.metrics import SimMetrics
from loadtests.sim.prefix_cache import chain
from loadtests.sim.profiles import BUILTIN_PROFILES, Profile, ProfileError, load_profiles
from loadtests.sim.textgen import split_pieces, token_ids


def make_core(profile: str | Profile = "dflash7-prob-block", **kw: int) -> EngineCore:
    prof = BUILTIN_PROFILES[profile] if isinstance(profile, str) else profile
    metrics = SimMetrics("m", prof.max_model_len, prof.num_spec_tokens)
    return EngineCore(prof, metrics, **kw)


def make_req(
    key: int,
    *,
    max_tokens: int = 200,
    prompt_len: int = 64,
    hashes: list[int] | None = None,
    n: int = 1,
    **sampling: object,
) -> EngineRequest:
    spec = SamplingSpec(max_tokens=max_tokens, **sampling)  # type: ignore[arg-type]
    return EngineRequest(
        f"r{key}",
        prompt_len=prompt_len,
        block_hashes=hashes or [],
        sampling=spec,
        n=n,
        key=key,
        arrival=0.0,
    )


def drain(req: EngineRequest) -> list[Delta]:
    out = list(req._pending.values())
    req._pending.clear()
    return out


def run(
    core: EngineCore, reqs: list[EngineRequest], max_steps: int = 100_000
) -> dict[str, list[list[Delta]]]:
    """Step until every request is done; returns each request's deltas step by step."""
    seen: dict[str, list[list[Delta]]] = {r.request_id: [] for r in reqs}
    now = 0.0
    for _ in range(max_steps):
        if not core.has_work():
            break
        plan = core.plan_step(now)
        now += plan.duration
        core.complete_step(plan, now)
        for r in reqs:
            d = drain(r)
            if d:
                seen[r.request_id].append(d)
    return seen


def test_builtin_tables_reproduce_the_facts_at_one_stream() -> None:
    # The tables are derived from the facts; this guards against an edit that breaks them.
    expected = {
        "mtp3": 2.55,
        "dflash7-greedy": 3.16,
        "dflash5-greedy": 3.45,
        "dflash4-greedy": 2.77,
    }
    for name, t in expected.items():
        prof = BUILTIN_PROFILES[name]
        assert prof.tokens_per_step(1) == pytest.approx(t, abs=0.01)
        assert t / prof.step_seconds(1) == pytest.approx(
            {"mtp3": 20.8, "dflash7-greedy": 26.0, "dflash5-greedy": 28.5, "dflash4-greedy": 23.0}[
                name
            ],
            rel=0.01,
        )
    prob = BUILTIN_PROFILES["dflash5-prob"]
    assert prob.tokens_per_step(1) < prob.tokens_per_step(4) < prob.tokens_per_step(16)


def test_step_time_interpolates_and_extrapolates() -> None:
    prof = BUILTIN_PROFILES["mtp3"]
    s8, s16 = prof.step_seconds(8), prof.step_seconds(16)
    assert s8 < prof.step_seconds(12) < s16
    assert prof.step_seconds(32) > s16
    assert prof.step_seconds(0) == prof.step_seconds(1)


def test_mean_tokens_per_step_matches_the_profile() -> None:
    core = make_core("dflash7-prob-block")
    reqs = [make_req(k, max_tokens=4000, ignore_eos=True, temperature=0.7) for k in range(8)]
    for r in reqs:
        core.add(r)
    # Eight streams: compare with the profile's expectation at batch 8.
    seen = run(core, reqs)
    steps = sum(s.spec.steps for r in reqs for s in r.sequences)
    accepted = sum(s.spec.accepted for r in reqs for s in r.sequences)
    assert 1 + accepted / steps == pytest.approx(
        BUILTIN_PROFILES["dflash7-prob-block"].tokens_per_step(8), rel=0.03
    )
    # Every decode delta but the (possibly truncated) last carries 1 + accepted tokens.
    for r in reqs:
        (seq,) = r.sequences
        chunks = [d[0] for d in seen[r.request_id]]
        assert len(chunks) == seq.spec.steps + 1  # + the prefill step's token
        assert sum(len(c.token_ids) for c in chunks) == 4000
        hist = [0] * (core.k + 1)
        for c in chunks[1:-1]:
            hist[len(c.token_ids) - 1] += 1
        diff = [a - b for a, b in zip(seq.spec.histogram, hist, strict=True)]
        assert sum(diff) == 1 and min(diff) == 0  # only the last step differs


def test_temperature_lowers_acceptance() -> None:
    def mean_tps(temperature: float) -> float:
        core = make_core("mtp3")
        reqs = [
            make_req(k, max_tokens=3000, ignore_eos=True, temperature=temperature) for k in range(6)
        ]
        for r in reqs:
            core.add(r)
        run(core, reqs)
        seqs = [s for r in reqs for s in r.sequences]
        return 1 + sum(s.spec.accepted for s in seqs) / sum(s.spec.steps for s in seqs)

    assert mean_tps(1.0) < mean_tps(0.7) - 0.15


def test_text_is_deterministic_whatever_the_batch() -> None:
    alone = make_core()
    r1 = make_req(42, max_tokens=300, ignore_eos=True)
    alone.add(r1)
    text1 = "".join(d[0].text for d in run(alone, [r1])["r42"])

    busy = make_core("dflash5-prob")  # another profile, other neighbours: same text
    others = [make_req(k, max_tokens=150) for k in range(5)]
    r2 = make_req(42, max_tokens=300, ignore_eos=True)
    for r in [*others, r2]:
        busy.add(r)
    text2 = "".join(d[0].text for d in run(busy, [*others, r2])["r42"])
    assert text1 == text2 and len(text1) > 300


def test_max_num_seqs_caps_the_batch_and_abort_frees_a_slot() -> None:
    core = make_core(max_num_seqs=4)
    reqs = [make_req(k, max_tokens=1000, ignore_eos=True) for k in range(6)]
    for r in reqs:
        core.add(r)
    core.plan_step(0.0)
    assert len(core.running) == 4 and len(core.waiting) == 2
    core.abort(reqs[0])
    assert reqs[0].aborted and reqs[0].done
    core.plan_step(0.1)
    assert len(core.running) == 4 and len(core.waiting) == 1


def test_natural_end_and_length() -> None:
    core = make_core()
    natural = make_req(1, max_tokens=100_000)
    short = make_req(2, max_tokens=7)
    core.add(natural)
    core.add(short)
    seen = run(core, [natural, short])
    last = seen["r1"][-1][-1]
    assert last.finish_reason == "stop" and last.stop_reason is None
    assert last.token_ids[-1] == 151_645  # EOS counted as a token, no text for it
    assert natural.sequences[0].num_generated >= 8
    assert seen["r2"][-1][-1].finish_reason == "length"
    assert sum(len(d[0].token_ids) for d in seen["r2"]) == 7


def test_stop_string_truncates_and_reports() -> None:
    core = make_core()
    req = make_req(3, max_tokens=2000, ignore_eos=True, stop=("return",))
    core.add(req)
    deltas = [d[0] for d in run(core, [req])["r3"]]
    text = "".join(d.text for d in deltas)
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_reason == "return"
    assert "return" not in text
    # With include_stop_str the stop string ends the text.
    core2 = make_core()
    req2 = make_req(3, max_tokens=2000, ignore_eos=True, stop=("return",), include_stop_str=True)
    core2.add(req2)
    text2 = "".join(d[0].text for d in run(core2, [req2])["r3"])
    assert text2.endswith("return") and text2[: -len("return")] == text


def test_prefix_cache_hits_for_a_repeated_prompt() -> None:
    core = make_core()
    hashes = list(range(250))  # 250 blocks of 16 tokens = 4,000 tokens
    first = make_req(1, prompt_len=4000, hashes=hashes, max_tokens=5)
    core.add(first)
    plan = core.plan_step(0.0)
    assert first.cached_tokens == 0
    cold = plan.duration
    run(core, [first])
    again = make_req(2, prompt_len=4000, hashes=hashes, max_tokens=5)
    core.add(again)
    warm = core.plan_step(10.0).duration
    assert again.cached_tokens == 3999  # the last token is always recomputed
    assert cold > 1.9 and warm < 0.2  # ~2 s of prefill at 2,000 tokens/s, then almost none


def _chat_prompt(turns: list[tuple[str, str]]) -> tuple[list[int], list[int], list[int]]:
    """A rendered conversation's ids, block hashes and tail (what Sim.new_request passes)."""
    text = "".join(f"<|im_start|>{role}\n{body}<|im_end|>\n" for role, body in turns)
    ids = token_ids(split_pieces(text + "<|im_start|>assistant\n"))
    hashes = chain(ids, 16)
    return ids, hashes, ids[len(hashes) * 16 :]


def test_generated_blocks_serve_the_next_turn() -> None:
    # vLLM hashes every full block, those decoding filled too: the next turn, whose prompt holds
    # this turn's answer, finds them cached and prefills only what the tools added.
    core = make_core()
    history = [("system", "You write code.\n" * 40), ("user", "Implement it.")]
    ids, hashes, tail = _chat_prompt(history)
    first = EngineRequest(
        "t1",
        prompt_len=len(ids),
        block_hashes=hashes,
        sampling=SamplingSpec(max_tokens=300, min_tokens=300),
        n=1,
        key=1,
        arrival=0.0,
        tail_ids=tail,
    )
    core.add(first)
    deltas = run(core, [first])["t1"]
    answer = "".join(d.text for step in deltas for d in step)
    assert sum(len(d.token_ids) for step in deltas for d in step) == 300
    ids2, hashes2, tail2 = _chat_prompt([*history, ("assistant", answer), ("user", "x = 1\n" * 50)])
    second = EngineRequest(
        "t2",
        prompt_len=len(ids2),
        block_hashes=hashes2,
        sampling=SamplingSpec(max_tokens=5),
        n=1,
        key=2,
        arrival=0.0,
        tail_ids=tail2,
    )
    core.add(second)
    core.plan_step(100.0)  # admission, on the core's virtual clock
    # All of the first prompt and of the answer, but the block the end-of-turn marker completes.
    assert second.cached_tokens >= (len(ids) + 300) // 16 * 16 - 16
    assert second.cached_tokens > len(ids) + 250
    added = len(ids2) - len(ids) - 300  # the tools' output and the template's markers
    assert len(ids2) - second.cached_tokens <= added + 32


def test_acceptance_collapse_factor() -> None:
    core = make_core()
    core.accept_factor = 0.0
    req = make_req(5, max_tokens=50, ignore_eos=True)
    core.add(req)
    chunks = [d[0] for d in run(core, [req])["r5"]]
    assert all(len(c.token_ids) == 1 for c in chunks)
    assert req.sequences[0].spec.accepted == 0


def test_n_sequences_share_the_request() -> None:
    core = make_core()
    req = make_req(9, n=3, max_tokens=40, ignore_eos=True)
    core.add(req)
    seen = run(core, [req])["r9"]
    indices = {d.index for step in seen for d in step}
    assert indices == {0, 1, 2} and req.done
    texts = ["".join(d.text for step in seen for d in step if d.index == i) for i in range(3)]
    assert len(set(texts)) == 3  # each choice is its own sample


def test_yaml_profiles(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "profiles:\n"
        "  fast-mtp:\n"
        "    base: mtp3\n"
        "    step_ms: {1: 50, 16: 100}\n"
        "  tiny:\n"
        "    num_spec_tokens: 2\n"
        "    acceptance: {1: [0.5, 0.25]}\n"
        "    step_ms: {1: 10}\n"
    )
    profiles = load_profiles(path)
    assert profiles["fast-mtp"].step_seconds(1) == 0.05
    assert profiles["fast-mtp"].num_spec_tokens == 3
    assert profiles["tiny"].tokens_per_step(1) == pytest.approx(1.75)
    bad = tmp_path / "bad.yaml"
    bad.write_text("x:\n  num_spec_tokens: 2\n  acceptance: {1: [0.5]}\n")
    with pytest.raises(ProfileError):
        load_profiles(bad)


def test_an_aborted_prefill_leaves_its_computed_blocks_for_a_resend() -> None:
    # As vLLM's block pool: the full blocks of every chunk prefilled stay hashed after the abort
    # (tail first to go), so the resend of the same prompt prefills only the rest.
    core = make_core()
    hashes = list(range(2500))  # 40,000 tokens: several chunks of max_num_batched_tokens
    first = make_req(1, prompt_len=40_000, hashes=hashes, max_tokens=5)
    core.add(first)
    now = 0.0
    for _ in range(2):
        plan = core.plan_step(now)
        now += plan.duration
        core.complete_step(plan, now)
    seq = first.sequences[0]
    done = 40_000 - seq.prefill_left
    assert 0 < done < 40_000 and done % 16 == 0
    core.abort(first)
    resend = make_req(2, prompt_len=40_000, hashes=hashes, max_tokens=5)
    core.add(resend)
    core.plan_step(now)
    assert resend.cached_tokens == done
    # One that never left the queue computed nothing and leaves nothing.
    queued = make_req(3, prompt_len=4000, hashes=list(range(10_000, 10_250)), max_tokens=5)
    core.add(queued)  # waiting: no step has run since
    core.abort(queued)
    again = make_req(4, prompt_len=4000, hashes=list(range(10_000, 10_250)), max_tokens=5)
    core.add(again)
    core.plan_step(now)
    assert again.cached_tokens == 0
