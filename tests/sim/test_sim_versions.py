"""Version modes' flags (refused as the release's argument parser refuses them) and
stream_interval, server-wide and per request."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from loadtests.sim import cli
from loadtests.sim.profiles import BUILTIN_PROFILES
from loadtests.sim.server import create_app
from loadtests.sim.state import SimConfig


@pytest.mark.parametrize(
    ("version", "flag", "refused"),
    [
        ("0.28.0", ["--per-request-spec-decode-metrics", "summary"], True),
        ("0.28.0", ["--per-request-spec-decode-metrics=none"], True),
        ("0.32.0", ["--per-request-spec-decode-metrics", "summary", "--port", "-1"], False),
        ("0.33.0", ["--per-request-spec-decode-metrics", "summary", "--port", "-1"], False),
    ],
)
def test_a_flag_the_release_lacks_is_refused(
    capsys: pytest.CaptureFixture[str], version: str, flag: list[str], refused: bool
) -> None:
    rc = cli.main(["--vllm-version", version, *flag, "--host", "256.0.0.1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert ("has no --per-request-spec-decode-metrics" in err) is refused
    if not refused:
        assert "cannot bind" in err  # got past the flag check


async def _chunk_tokens(config: SimConfig, body: dict[str, Any]) -> list[int]:
    app, sim = create_app(config)
    sim.engine.start()
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://sim"
        ) as client:
            resp = await client.post("/v1/completions", json=body, timeout=30)
    finally:
        sim.abort_all()
        await sim.engine.stop()
    out = []
    for frame in resp.content.split(b"\n\n"):
        if frame.startswith(b"data: {") and b'"choices":[]' not in frame:
            (choice,) = json.loads(frame[6:])["choices"]
            out.append(len(choice["token_ids"]))
    return out


@pytest.mark.parametrize(("server", "request_field"), [(4, None), (1, 4)])
def test_stream_interval(server: int, request_field: int | None) -> None:
    config = SimConfig(
        profile=BUILTIN_PROFILES["nospec"],
        served_model_name="m",
        time_scale=0.001,
        stream_interval=server,
    )
    body: dict[str, Any] = {
        "model": "m",
        "prompt": "def f(",
        "max_tokens": 30,
        "stream": True,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    if request_field is not None:
        body["stream_interval"] = request_field
    tokens = asyncio.run(_chunk_tokens(config, body))
    assert sum(tokens) == 30
    # the first output at once, then at least 4 new tokens a chunk, the finish with what is left
    assert tokens[0] == 1 and all(t >= 4 for t in tokens[1:-1]) and len(tokens) <= 9
    plain = asyncio.run(
        _chunk_tokens(
            SimConfig(profile=BUILTIN_PROFILES["nospec"], served_model_name="m", time_scale=0.001),
            {**body, "stream_interval": None},
        )
    )
    assert plain == [1] * 30  # one token a step without speculation, one chunk a step


def test_frontend_model_merges_outputs() -> None:
    """The merging model: a lagging API server takes several steps' output in one chunk."""
    config = SimConfig(
        profile=BUILTIN_PROFILES["nospec"],
        served_model_name="m",
        time_scale=0.001,
        frontend_chunk_ms=200.0,
    )
    body = {
        "model": "m",
        "prompt": "def f(",
        "max_tokens": 30,
        "stream": True,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    tokens = asyncio.run(_chunk_tokens(config, body))
    assert sum(tokens) == 30 and max(tokens) > 1 and len(tokens) < 30
