"""The measures through a real gateway in front of the simulator: TTFT at the client's first
token frame (chat, completions, Responses) within 5 ms of the request log's, non-streaming
requests out of TTFT, `tps_source`, Server-Timing on every response."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.requestlog import logged_rows
from loadtests.harness.sim import SimServer
from loadtests.probe.frames import _frame_kind

SERVED = "qwen3.8-27b"
MESSAGES = [{"role": "user", "content": "Write a function that parses `src/app/main.py`."}]
_TIMING = re.compile(r"(\w+);dur=([\d.]+)")
TRIES = 5


@pytest.fixture(scope="module")
def stack(certs: Any) -> Iterator[GatewayServer]:
    with SimServer("mtp3", served_model_name=SERVED, time_scale=0.05, faults=False) as sim:
        with GatewayServer(coder_policy({"coder-a": sim.url}, served=SERVED), certs=certs) as gw:
            yield gw


def _is_token(frame: bytes) -> bool:
    if frame.startswith(b"event: "):
        return frame.startswith(
            (b"event: response.output_text.delta", b"event: response.reasoning_text.delta")
        )
    return _frame_kind(frame) == "token"


def _timed(c: httpx.Client, path: str, body: dict[str, Any], rid: str) -> tuple[float, str]:
    """The client's TTFT (request sent to the first token frame read) and Server-Timing."""
    t0 = time.perf_counter()
    with c.stream("POST", path, json=body, headers={"x-request-id": rid}) as r:
        assert r.status_code == 200
        buf, ttft = b"", None
        for raw in r.iter_raw():
            now = time.perf_counter()
            buf += raw
            *frames, buf = buf.split(b"\n\n")
            if ttft is None and any(_is_token(f) for f in frames):
                ttft = now - t0
        assert ttft is not None
        return ttft, r.headers["server-timing"]


def _rows(gw: GatewayServer, ids: set[str]) -> dict[str, dict[str, Any]]:
    return logged_rows(gw.dir / "state", ids)


def test_ttft_tps_source_and_server_timing_through_the_gateway(stack: GatewayServer) -> None:
    gw = stack
    streams = {
        "chat": (
            "/v1/chat/completions",
            {"model": "coder", "messages": MESSAGES, "stream": True, "max_tokens": 24},
        ),
        "cmpl": (
            "/v1/completions",
            {"model": "coder", "prompt": "def parse(", "stream": True, "max_tokens": 24},
        ),
        "resp": (
            "/v1/responses",
            {
                "model": "coder",
                "input": "Write hello world in C.",
                "stream": True,
                "max_output_tokens": 24,
            },
        ),
    }
    client_ttft: dict[str, float] = {}
    with gw.client() as c:
        c.post(
            "/v1/chat/completions", json={"model": "coder", "messages": MESSAGES, "max_tokens": 2}
        )  # the connection, kept alive
        for api, (path, body) in streams.items():
            for i in range(TRIES):
                client_ttft[f"{api}{i}"], timing = _timed(c, path, body, f"{api}{i}")
                parts = dict(_TIMING.findall(timing))
                assert set(parts) == {"gw", "engine"} and float(parts["gw"]) < 50
        plain = c.post(
            "/v1/chat/completions",
            headers={"x-request-id": "plain"},
            json={"model": "coder", "messages": MESSAGES, "max_tokens": 24},
        )
        assert plain.status_code == 200 and "engine;dur=" in plain.headers["server-timing"]
        denied = c.post(
            "/v1/chat/completions",
            headers={"authorization": "Bearer nope"},
            json={"model": "coder", "messages": MESSAGES},
        )
        assert denied.status_code == 401 and set(
            dict(_TIMING.findall(denied.headers["server-timing"]))
        ) == {"gw"}
    rows = _rows(gw, {*client_ttft, "plain"})
    for api in streams:
        diffs = []
        for rid in (f"{api}{i}" for i in range(TRIES)):
            row = rows[rid]
            assert row["completion_tokens"] > 0 and row["prompt_tokens"], row
            assert row["gateway_s"] is not None and row["engine_headers_s"] is not None
            diffs.append(abs(client_ttft[rid] - row["ttft_s"]))
        # The client reads the same first token frame a TLS hop later (best of TRIES: the
        # shared box's scheduling adds milliseconds to single requests, up to ~9 ms in the full
        # suite beside a booting vLLM; `response.created`, a wrong frame, comes a whole prefill
        # earlier).
        assert min(diffs) < 0.012, (api, diffs)
    assert rows["chat0"]["tps_source"] == rows["cmpl0"]["tps_source"] == "chunks"
    assert rows["resp0"]["tps_source"] == "average" and rows["resp0"]["tokens_per_step"] > 1
    assert rows["resp0"]["itl_p50_s"] is not None
    assert rows["plain"]["ttft_s"] is None and rows["plain"]["e2e_s"] > 0
    assert rows["plain"]["tps_source"] is None
    # the non-streaming requests are in e2e, not in TTFT
    metrics = gw.metrics()
    ttft = _count(metrics, "specrouter_ttft_seconds_count")
    e2e = _count(metrics, "specrouter_e2e_seconds_count")
    assert ttft == 3 * TRIES and e2e == 3 * TRIES + 2


def _count(metrics: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(name + "{") and 'backend="coder-a"' in line
    )
