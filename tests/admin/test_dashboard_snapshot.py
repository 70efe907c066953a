"""The dashboard snapshot's per-agent rows and charts, and its size bound, without a browser."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from loadtests.harness.gateway import coder_policy
from policies.compiled import compile_policy
from policies.schema import load_policy
from policies.sessions import SessionId
from proxy.admin.dashboard import encoded, snapshot
from proxy.gateway import Gateway
from proxy.observe.timeline import Timeline
from proxy.record.measure import Measurement
from proxy.record.request import RequestRecord
from proxy.settings import Settings
from tests.observe.test_timeline import Clock


@pytest.fixture
def gw(tmp_path: Path) -> Gateway:
    config = tmp_path / "policy.yaml"
    backends = {"coder-dflash7": "http://127.0.0.1:9", "coder-mtp3": "http://127.0.0.1:10"}
    config.write_text(yaml.safe_dump(coder_policy(backends)))
    settings = Settings(config=config, state_dir=tmp_path / "state", admin_token="t")
    return Gateway(settings, compile_policy(load_policy(config)))


def virtual_timeline(gw: Gateway) -> Clock:
    """The gateway's ring swapped for one on a virtual clock (the sink too)."""
    clock = Clock()
    timeline = Timeline(clock=clock)
    gw.sinks[gw.sinks.index(gw.timeline.add)] = timeline.add
    gw.timeline = timeline
    return clock


def turn(gw: Gateway, n: int, engine: str, *, cached: int | None, agent: str = "codex") -> None:
    """Turn `n` of session s-<n % 50>: placed, then finished through the gateway's sinks."""
    key = f"s-{n % 50:032x}"
    sid = SessionId(key, "header", "", agent.endswith("/subagent"), kind=agent)
    gw.sessions.placed(sid, "agent", engine, 0.0)
    m = Measurement(0.0, stream=True, prompt_tokens=40_000 + n, cached_tokens=cached)
    m.completion_tokens, m.t_first_token, m.t_last_token = 1234, 12.345, 25.678
    m.spec = {"num_accepted_draft_tokens": 1233 - 392, "num_spec_steps": 392}  # 3.1454 a step
    gw.finished(
        RequestRecord(
            f"req-{n}",
            "agent",
            "chat",
            route="coder",
            backend=engine,
            session=key,
            agent=agent,
            m=m,
        )
    )


def test_agent_rows_show_the_session_table_and_the_window(gw: Gateway) -> None:
    clock = virtual_timeline(gw)
    for n in (0, 50, 1):  # s-0 twice, s-1 once; only s-0's engine reports cached tokens
        turn(gw, n, "coder-dflash7", cached=30_000 if n != 1 else None)
    clock.now += 10
    turn(gw, 2, "coder-mtp3", cached=0, agent="claude-code/subagent")
    rows = snapshot(gw, None, None)["agents"]
    by = {r["session"][-2:]: r for r in rows}
    assert [r["session"][-2:] for r in rows] == ["02", "01", "00"]  # most recent first
    s0, s1, s2 = by["00"], by["01"], by["02"]
    assert (s0["requests"], s0["tokens_in"], s0["tokens_out"]) == (2, 80_050, 2468)
    assert s0["cached_tokens"] == 60_000 and s1["cached_tokens"] is None  # not reported
    assert s2["cached_tokens"] == 0 and s2["agent"] == "claude-code/subagent"
    assert s0["engine"] == "coder-dflash7" and s0["decode_s"] == pytest.approx(26.67)
    assert s0["engine_share"] == pytest.approx(2 / 3, abs=1e-3) and s2["engine_share"] == 1.0
    assert s0["series"]["tok_s"][-2:] == [92.5, None]  # 1233 tokens in 13.333 s, a bucket ago
    assert s2["series"]["ttft_p50_ms"][-1] == pytest.approx(12345, rel=0.05)
    timeline = snapshot(gw, None, None)["timeline"]
    assert sorted(timeline["variants"]) == ["coder-dflash7", "coder-mtp3"]
    assert timeline["variants"]["coder-mtp3"]["tps"][-1] == 3.15


def test_fifty_agents_over_ninety_buckets_stay_under_the_bound(gw: Gateway) -> None:
    clock = virtual_timeline(gw)
    for bucket in range(90):
        for n in range(bucket * 50, bucket * 50 + 50):
            turn(gw, n, ("coder-dflash7", "coder-mtp3")[n % 2], cached=n)
        clock.now += 10
    clock.now -= 10  # the last bucket still open
    snap = snapshot(gw, None, None)
    assert len(snap["agents"]) == 50
    assert all(None not in r["series"]["tok_s"] for r in snap["agents"])  # every bucket drawn
    limit = gw.settings.max_dashboard_bytes
    data = orjson.dumps(snap)
    assert len(data) <= limit, len(data)  # whole: no row and no series cut
    assert encoded(snap, limit) == data
    small = orjson.loads(encoded(snap, 64 * 1024))  # a smaller bound: agents halved, whole
    assert small["truncated"] and 0 < len(small["agents"]) < 50
    assert small["agents"][0] == snap["agents"][0] and small["timeline"] == snap["timeline"]
