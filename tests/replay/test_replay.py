"""`specrouter replay`: the session workload, its statistics, and a short run through the gateway
over TLS against a one-device simulated GB10."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.replay import report
from loadtests.replay.driver import TurnResult
from loadtests.replay.workload import Session, WorkloadParams, request_body


def test_turns_extend_the_previous_prompt() -> None:
    params = WorkloadParams(turns=3, initial_context=300, new_tokens=100)
    s = Session(params, agent=0, number=0)
    first = s.next_turn()
    s.record("def f():\n    return 1\n", 12)
    second = s.next_turn()
    assert second.messages[: len(first.messages)] == first.messages  # the prefix is shared
    assert second.messages[-2] == {"role": "assistant", "content": "def f():\n    return 1\n"}
    assert second.context_tokens == first.context_tokens + 12 + 100 + 10
    s.record("x", 5)
    s.record("y", 5)
    assert s.done


def test_sessions_compact_at_the_context_limit() -> None:
    s = Session(
        WorkloadParams(
            turns=50,
            shared_prefix=500,
            initial_context=1000,
            new_tokens=400,
            gen_tokens=100,
            max_context=2500,
        ),
        0,
        0,
    )
    turns = 0
    while not s.done:
        s.next_turn()
        s.record("a", 100)
        turns += 1
    assert turns < 50 and s.context_tokens <= 2500


def test_sessions_of_one_kind_share_their_system_prefix() -> None:
    params = WorkloadParams(shared_prefix=2000, initial_context=500)
    a, b = Session(params, 0, 0), Session(params, 1, 3)
    sub = Session(params, 0, 1001, subagent=True)
    sa, sb, ss = (s.next_turn().messages[0]["content"] for s in (a, b, sub))
    shared = sa[: len(sa) - len(sa.partition("# Repository context")[2])]
    assert len(shared) > 4000 and sb.startswith(shared)  # the agent kind's prompt and tools
    assert sa != sb  # each session's own repository context follows
    assert not ss.startswith(shared[:200])  # subagents are a kind of their own
    assert a.context_tokens == 2000 + 500 + 40


def test_generated_tokens_average_the_mean() -> None:
    s = Session(WorkloadParams(gen_tokens=460), 0, 0)
    drawn = [s.next_turn().max_tokens for _ in range(2000)]
    assert sum(drawn) / len(drawn) == pytest.approx(460, rel=0.06)


@pytest.mark.parametrize(
    "api,path,key",
    [
        ("chat", "/v1/chat/completions", "messages"),
        ("responses", "/v1/responses", "input"),
        ("messages", "/v1/messages", "messages"),
    ],
)
def test_request_bodies(api: str, path: str, key: str) -> None:
    params = WorkloadParams(api_mix={api: 1.0}, temperatures=(None,), tools=2)
    turn = Session(params, 0, 0).next_turn()
    got_path, body = request_body(turn, params)
    assert got_path == path and body[key] and body["stream"] is True
    assert "temperature" not in body  # unset stays unset
    assert len(body["tools"]) == 2


def test_temperatures_per_agent_round_robin() -> None:
    params = WorkloadParams(agents=3, temperatures=(0.7, None))
    assert [Session(params, a, 0).temperature for a in range(3)] == [0.7, None, 0.7]


def _turn(
    agent: int, turn_s: float, cached: int | None = None, error: str | None = None
) -> TurnResult:
    return TurnResult(
        agent, 0, False, "responses", 0.7, 1000, 0.0, turn_s, 1.0, 30.0, 1000, cached, 400, error
    )


def test_summary_figures() -> None:
    turns = [_turn(0, 10.0, 900), _turn(0, 20.0, 800), _turn(1, 30.0), _turn(1, 5.0, error="x")]
    built = report.build(
        turns,
        params={},
        time_scale=0.1,
        wall_s=10.0,
        engines={"prefix_queries": 100.0, "prefix_hits": 96.0, "preemptions": 2.0},
        cpu={"client": 0.9, "simulator": 0.1},
    )
    o = built["overall"]
    assert o["turns"] == 3 and o["errors"] == 1
    assert o["turn_s"]["p50"] == 20.0 and o["turn_s"]["n"] == 3
    assert o["prefix_hit_rate"] == 0.96 and o["preemptions"] == 2.0
    assert built["per_agent"]["0"]["usage_hit_rate"] == pytest.approx(1700 / 2000)
    assert len(built["warnings"]) == 1 and "client" in built["warnings"][0]


def test_turns_in_the_warm_up_are_not_measured() -> None:
    early, late = _turn(0, 10.0), _turn(0, 30.0)
    late.start_s = 100.0
    built = report.build(
        [early, late],
        params={},
        time_scale=0.1,
        wall_s=20.0,
        engines={"prefix_queries": 1000.0, "prefix_hits": 960.0, "preemptions": 0.0},
        cpu={},
        warmup_s=50.0,
    )
    o = built["overall"]
    assert o["turns"] == 1 and o["turn_s"]["p50"] == 30.0 and len(built["turns"]) == 2
    assert o["prefilled_per_turn"] == 40.0 and "50 s warm-up" in built["window"]


def test_engine_counters() -> None:
    text = (
        '# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{engine="0"} 5\n'
        '# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total{engine="0"} 2\n'
    )
    assert report.engine_counters(text) == {
        "prefix_queries": 0.0,
        "prefix_hits": 5.0,
        "preemptions": 2.0,
    }


def test_replay_smoke_through_the_gateway(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "proxy.cli",
        "replay",
        "--sim",
        "--agents",
        "2",
        "--duration",
        "5",
        "--turns",
        "3",
        "--time-scale",
        "0.02",
        "--shared-prefix",
        "800",
        "--initial-context",
        "600",
        "--warmup",
        "1",
        "--new-tokens",
        "300",
        "--gen-tokens",
        "60",
        "--think-s",
        "0.5",
        "--temperature",
        "0.7,unset",
        "--api-mix",
        "chat=1,responses=1",
        "--progress-s",
        "2",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "time scale 0.02" in done.stdout
    data = json.loads((tmp_path / "replay.json").read_text())
    o = data["overall"]
    assert o["turns"] >= 4 and o["errors"] == 0, data["error_samples"]
    assert set(data["per_agent"]) == {"0", "1"}
    assert o["prefix_hit_rate"] > 0.3  # turns extend each other's prompts
    assert o["preemptions"] == 0
    assert data["warmup_s"] == 50.0 and "warm-up" in data["window"]  # 1 s wall at 0.02
    assert o["turns"] == sum(1 for t in data["turns"] if t["start_s"] >= 50.0)
    assert (tmp_path / "replay.png").stat().st_size > 1000
    assert {t["temperature"] for t in data["turns"]} == {0.7, None}


def test_each_session_names_itself_as_agents_do() -> None:
    """Every request carries its session's id (a subagent's its parent's too): a gateway cannot
    tell the replay's sessions apart otherwise (they share one system prompt)."""
    import asyncio

    from aiohttp import web

    from loadtests.replay.driver import Driver

    seen: list[tuple[str | None, str | None]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        seen.append(
            (request.headers.get("x-session-id"), request.headers.get("x-parent-session-id"))
        )
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        delta = {"choices": [{"index": 0, "delta": {"content": "ok"}}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1}}
        for event in (delta, usage):
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        params = WorkloadParams(
            agents=2, turns=3, think_s=0.0, api_mix={"chat": 1.0}, subagent_rate=1.0
        )
        try:
            await Driver(params, f"http://127.0.0.1:{port}", time_scale=1.0, duration_s=3.0).run()
        finally:
            await runner.cleanup()

    asyncio.run(main())
    ids = {s for s, _ in seen}
    assert None not in ids and len(ids) >= 4  # two agents' sessions and their subagents
    parents = {p for _, p in seen if p is not None}
    assert parents and parents <= ids  # a subagent names a session that sent requests itself
