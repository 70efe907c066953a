"""The replay's impatient agents: what each clock counts (a table), and the driver's resends
against a loopback engine whose first answer stays silent (with or without comment pings)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from loadtests.replay.driver import Driver, TurnResult
from loadtests.replay.watchdogs import AGENTS, Clock, retries_status, retry_delay
from loadtests.replay.workload import WorkloadParams

# (api, what arrives at t (agent seconds): head / bytes / event / ping event), due after the last
CLOCKS = [
    ("responses", [], None),  # Codex keeps no clock before the head
    ("responses", [("head", 0)], 300),
    ("responses", [("head", 0), ("bytes", 200)], 300),  # comments do not count
    ("responses", [("head", 0), ("event", 200)], 500),
    ("chat", [], 600),  # aider: httpx's read timeout before the head too
    ("chat", [("head", 10), ("bytes", 500)], 1100),
    ("messages", [], 300),  # Claude Code's event watchdog runs from the request
    ("messages", [("head", 0), ("ping", 200)], 300),  # the byte one re-arms; the event one not
    ("messages", [("head", 0), ("event", 100), ("bytes", 350)], 400),  # bytes do not hold it
]


@pytest.mark.parametrize(("api", "arrivals", "due"), CLOCKS)
def test_what_each_clock_counts(api: str, arrivals: list[tuple[str, float]], due: float) -> None:
    clock = Clock(AGENTS[api], 0.0)
    for what, t in arrivals:
        if what == "head":
            clock.head(t)
        else:
            clock.byte(t)
            if what != "bytes":
                clock.event(t, ping=what == "ping")
    assert clock.due() == due


# (api, one SSE line read at 200 s after the head at 0, due after it): what the driver tells
# the clock of the lines the gateway's pings are made of.
LINES = [
    ("responses", ": ping", 300),  # Codex's parser drops comments
    ("responses", "event: keepalive", 300),  # not an event until its data line
    ("responses", 'data: {"type":"keepalive"}', 500),  # the gateway's Responses ping event
    ("responses", 'data: {"type":"ping"}', 500),
    ("chat", ": ping", 800),  # aider: httpx's read timeout counts any bytes
    ("messages", 'data: {"type":"ping"}', 300),  # Claude Code's event clock skips `ping`
    ("messages", 'data: {"type":"keepalive"}', 500),  # any other event re-arms both
]


@pytest.mark.parametrize(("api", "line", "due"), LINES)
def test_what_each_clock_counts_of_the_pings(api: str, line: str, due: float) -> None:
    clock = Clock(AGENTS[api], 0.0)
    clock.head(0.0)
    data = json.loads(line[6:]) if line.startswith("data: ") else None
    clock.line(200.0, line, data)
    assert clock.due() == due


def test_retry_rules() -> None:
    codex, aider = AGENTS["responses"], AGENTS["chat"]
    assert not retries_status(codex, 429) and retries_status(aider, 429)
    assert retries_status(codex, 503) and not retries_status(codex, 400)
    assert retry_delay(codex, 0, 5.0) == 5.0  # it waits the retry-after
    assert retry_delay(aider, 2, 5.0) == 1.0  # aider does not: 0.25 s doubling
    assert retry_delay(aider, 9, None) == 32.0


SCALE = 0.001  # Codex's 300 s: 0.3 s here; aider's 600 s: 0.6 s
SILENCE = 1.0  # wall seconds the first answer keeps the client waiting


def _events(api: str) -> list[bytes]:
    if api == "chat":
        delta = {"choices": [{"index": 0, "delta": {"content": "ok"}}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1}}
        return [f"data: {json.dumps(e)}\n\n".encode() for e in (delta, usage)] + [
            b"data: [DONE]\n\n"
        ]
    done = {"response": {"usage": {"input_tokens": 10, "output_tokens": 1}}}
    return [
        b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta", '
        b'"delta": "ok"}\n\n',
        b"event: response.completed\ndata: "
        + json.dumps({"type": "response.completed", **done}).encode()
        + b"\n\n",
    ]


async def _replay(api: str, pings: bool, watchdogs: bool) -> tuple[TurnResult, list[str]]:
    log: list[str] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        first = not log
        log.append("sent")
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        if api == "responses":
            await resp.write(b'event: response.created\ndata: {"type": "response.created"}\n\n')
        if first:
            try:
                for _ in range(int(SILENCE / 0.05)):
                    await asyncio.sleep(0.05)
                    if pings:
                        await resp.write(b": ping\n\n")
            except (ConnectionResetError, ConnectionError):
                log.append("aborted")  # the agent hung up on the silent answer
                return resp
        for event in _events(api):
            await resp.write(event)
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_post("/v1/responses", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    params = WorkloadParams(
        agents=1, turns=1, think_s=10_000.0, api_mix={api: 1.0}, subagent_rate=0.0
    )
    driver = Driver(
        params,
        f"http://127.0.0.1:{port}",
        time_scale=SCALE,
        duration_s=SILENCE + 0.3,
        watchdogs=watchdogs,
    )
    try:
        results = await driver.run()
    finally:
        await runner.cleanup()
    return results[0], log


@pytest.mark.parametrize(
    ("api", "pings", "watchdogs", "resends"),
    [
        ("responses", True, True, 1),  # Codex: the comments do not hold it; it resends
        ("chat", True, True, 0),  # aider: any bytes hold httpx's read timeout
        ("chat", False, True, 1),
        ("responses", True, False, 0),  # patient agents wait
    ],
)
def test_a_silent_answer_is_resent_as_the_agent_does(
    api: str, pings: bool, watchdogs: bool, resends: int
) -> None:
    turn, log = asyncio.run(_replay(api, pings, watchdogs))
    assert turn.error is None and turn.completion_tokens == 1
    assert turn.resends == resends and turn.watchdog_fires == resends
    if resends and pings:
        # The abandoned answer's connection was closed before the resend was answered.
        assert log[:3] == ["sent", "sent", "aborted"] or log[:3] == ["sent", "aborted", "sent"]
