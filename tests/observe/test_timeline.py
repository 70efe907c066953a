"""The dashboard's 15-minute ring (proxy/observe/timeline.py), on a virtual clock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from proxy.observe.timeline import Timeline
from proxy.record.measure import Measurement
from proxy.record.request import RequestRecord


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def record(
    backend: str = "v",
    *,
    session: str = "",
    agent: str = "codex",
    ttft: float | None = 0.1,
    tokens: int = 11,
    decode_s: float = 1.0,
    steps: int | None = 4,  # decode steps: 10 tokens after the first in 4 = 2.5 per step
    outcome: str = "ok",
    cached: int | None = None,
) -> RequestRecord:
    m = Measurement(0.0, stream=ttft is not None, completion_tokens=tokens, cached_tokens=cached)
    first = ttft if ttft is not None else 0.05
    m.t_first_token, m.t_last_token = first, first + decode_s
    if steps is not None:
        m.spec = {"num_accepted_draft_tokens": tokens - 1 - steps, "num_spec_steps": steps}
    return RequestRecord(
        "r", "agent", "chat", backend=backend, session=session, agent=agent, outcome=outcome, m=m
    )


def _last(tl: Timeline, kind: str, key: str) -> dict[str, object]:
    series = tl.series(kind, [key])[key]
    return {name: values[-1] for name, values in series.items()}


# Each case: the records that finish in one bucket, and the bucket's point for variant "v".
CASES = [
    pytest.param(
        [record(ttft=t / 1000) for t in (100,) * 19 + (1000,)],
        {"ttft_p50_ms": 100, "ttft_p95_ms": 100, "tok_s": 10.0, "tps": 2.5},
        id="p95-of-20-is-the-19th",
    ),
    pytest.param(
        [record(ttft=t / 1000) for t in (100,) * 9 + (1000,) * 11],
        {"ttft_p50_ms": 1000, "ttft_p95_ms": 1000},
        id="p50-is-the-middle-sample",
    ),
    pytest.param(
        [record(tokens=101, decode_s=1.0), record(tokens=11, decode_s=9.0)],
        {"tok_s": 11.0},  # token-weighted: 110 tokens in 10 s, not the mean of 100 and 1.1
        id="decode-rate-token-weighted",
    ),
    pytest.param(
        [record(ttft=t / 1000) for t in (10, 11, 35)],
        {"ttft_p50_ms": 11, "ttft_p95_ms": 35},
        id="p95-of-three-is-the-largest",
    ),
    pytest.param(
        [record(steps=5), record(tokens=31, steps=10), record(steps=None)],
        {"tps": 2.67},  # (10 + 30) / (5 + 10): pooled, not the mean of 2.0 and 3.0
        id="tokens-per-step-pooled-over-reporting",
    ),
    pytest.param(
        [record(ttft=None)],
        {"ttft_p50_ms": None, "ttft_p95_ms": None, "tok_s": 10.0},
        id="non-stream-has-no-ttft",
    ),
    pytest.param(
        [record(outcome="client_gone"), record(backend="")],
        {"ttft_p50_ms": None, "ttft_p95_ms": None, "tok_s": None, "tps": None},
        id="failed-and-unserved-not-charted",
    ),
    pytest.param(
        [record(tokens=1)],
        {"tok_s": None},
        id="one-token-has-no-decode-rate",
    ),
]


@pytest.mark.parametrize(("records", "expected"), CASES)
def test_bucket_point(records: list[RequestRecord], expected: dict[str, object]) -> None:
    tl = Timeline(clock=Clock())
    for r in records:
        tl.add(r)
    point = _last(tl, "variants", "v")
    for name, value in expected.items():
        if isinstance(value, int) and value > 0 and name.startswith("ttft"):
            assert point[name] == pytest.approx(value, rel=0.05), name  # a ~9 % histogram bin
        else:
            assert point[name] == value, name


def test_buckets_move_with_the_clock_and_expire_after_the_window() -> None:
    clock = Clock()
    tl = Timeline(bucket_s=10, buckets=90, clock=clock)
    tl.add(record(tokens=11))
    clock.now += 10
    tl.add(record(tokens=21))
    toks = tl.series("variants", ["v"])["v"]["tok_s"]
    assert len(toks) == 90 and toks[-2:] == [10.0, 20.0] and set(toks[:-2]) == {None}
    assert tl.tokens("variants", "v") == 32
    clock.now += 880  # the first bucket is 89 back: still in the window
    assert tl.series("variants", ["v"])["v"]["tok_s"][0] == 10.0
    clock.now += 10
    assert tl.series("variants", ["v"])["v"]["tok_s"][0] == 20.0
    assert tl.tokens("variants", "v") == 21
    clock.now += 1000  # wrapped: a reused slot must not show its old bucket
    tl.add(record(tokens=6, decode_s=1.0))
    toks = tl.series("variants", ["v"])["v"]["tok_s"]
    assert toks[-1] == 5.0 and set(toks[:-1]) == {None}
    assert tl.variant_names() == ["v"]


def test_a_closed_bucket_is_computed_once() -> None:
    clock = Clock()
    tl = Timeline(clock=clock)
    tl.add(record(tokens=11))
    assert _last(tl, "variants", "v")["tok_s"] == 10.0  # open: recomputed each time
    tl.add(record(tokens=31))
    assert _last(tl, "variants", "v")["tok_s"] == 20.0
    clock.now += 10
    first = tl.series("variants", ["v"])["v"]["tok_s"][-2]
    slot = next(s for s in tl._ring if s is not None)
    assert first == 20.0 and slot.variants["v"].final is not None


def test_agents_are_bounded_per_bucket_and_labelled() -> None:
    tl = Timeline(max_agents=2, clock=Clock())
    for i in range(3):
        tl.add(record(session=f"s-{i}", agent="claude-code/subagent", cached=None if i else 5))
    assert [tl.tokens("agents", f"s-{i}") for i in range(3)] == [11, 11, 0]
    assert tl.tokens("variants", "v") == 33  # the third session still counts for its variant
    assert tl.labels["s-0"].agent == "claude-code/subagent"
    assert tl.labels["s-0"].cache_reported and not tl.labels["s-1"].cache_reported
    assert _last(tl, "agents", "s-2")["tok_s"] is None
    assert _last(tl, "agents", "s-0")["tok_s"] == 10.0
    tl.add(record(session="s-1", cached=0))  # a zero reported is a report
    assert tl.labels["s-1"].cache_reported
    assert list(tl.labels) == ["s-0", "s-2", "s-1"]  # most recently seen last
