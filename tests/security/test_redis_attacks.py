"""Redis failures (docs/security-isolation.md), against a real redis-server on loopback.

- A burst of new sessions flushed after an outage: every member of the flush once had one
  score, and a pull whose page ended inside that run read the same 5,000 members forever.
  Now each member has its own score, a flush is bounded, and a pull pages by offset: each
  replica takes every row once and its next pull is short.
- Redis hung (SIGSTOP) or away (shut down) under `--redis-url`: a client with limits once got
  a plain-text 500. Now the real gateway counts the limits itself (fail-over), within a bound
  of time, and refuses over-limit requests with the API's own 429.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis
import yaml

from loadtests.harness.gateway import CLIENT_KEY, OTHER_KEY, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from policies.compiled import compile_policy
from policies.schema import load_policy
from proxy.backends.session_share import FLUSH_BATCH, PULL_BATCH, SessionShare
from proxy.backends.session_table import SharedRow
from proxy.gateway import Gateway
from proxy.settings import Settings

SESSIONS = 6_000  # the finding's burst: more than one pull page (PULL_BATCH)
PREFIX = "sec"


def _replica(tmp_path: Path, name: str, redis_url: str) -> Gateway:
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump(coder_policy({"a": "http://127.0.0.1:9"})))
    fields: dict[str, Any] = {
        "config": config,
        "state_dir": tmp_path / name,
        "redis_url": redis_url,
        "redis_prefix": PREFIX,
    }
    settings = Settings(**fields)
    return Gateway(settings, compile_policy(load_policy(config)))


def _share(gw: Gateway) -> SessionShare:
    assert isinstance(gw.share, SessionShare)
    return gw.share


async def _pull_all(share: SessionShare) -> tuple[int, float]:
    """One pull, bounded: a pull that reads the same page again and again never returns."""
    started = time.perf_counter()
    async with asyncio.timeout(10):
        taken = await share.pull()
    return taken, time.perf_counter() - started


async def test_a_burst_flushed_after_an_outage_is_pulled_once(
    tmp_path: Path, redis_url: str
) -> None:
    assert SESSIONS > PULL_BATCH and SESSIONS > FLUSH_BATCH
    a, b = _replica(tmp_path, "a", redis_url), _replica(tmp_path, "b", redis_url)
    try:
        now = time.perf_counter()
        for n in range(SESSIONS):  # placed while Redis was away: all queued at once
            a.sessions.merge(f"s-{n:032x}", SharedRow("a", now, 100, 1, 10))
            _share(a).changed(f"s-{n:032x}")
        assert _share(a).queued() == SESSIONS
        first = await _share(a).flush()
        assert first == FLUSH_BATCH and _share(a).queued() == SESSIONS - FLUSH_BATCH  # bounded
        assert await _share(a).flush() == SESSIONS - FLUSH_BATCH
        client = aioredis.Redis.from_url(redis_url)
        try:
            scores: list[Any] = await client.zrange(
                f"{PREFIX}:sess-changed", 0, -1, withscores=True
            )
        finally:
            await client.aclose()
        assert len(scores) == SESSIONS and len({s for _, s in scores}) == SESSIONS
        taken, _ = await _pull_all(_share(b))
        assert taken == SESSIONS and len(b.sessions) == SESSIONS
        # The next pull reads the last CLOCK_SKEW_S of the index again, by design, and ends.
        again, _ = await _pull_all(_share(b))
        assert again <= SESSIONS
    finally:
        await a.aclose()
        await b.aclose()


async def test_members_of_one_score_are_read_once_each(tmp_path: Path, redis_url: str) -> None:
    """The index an older replica left: 6,000 members with one score (the finding's state)."""
    client = aioredis.Redis.from_url(redis_url)
    wall = time.time()
    row = b'["old-replica","a",%f,100,1,10]' % wall
    try:
        pipe = client.pipeline(transaction=False)
        for n in range(SESSIONS):
            pipe.set(f"{PREFIX}:sess:s-{n:032x}", row, ex=600)
        pipe.zadd(f"{PREFIX}:sess-changed", {f"s-{n:032x}": wall for n in range(SESSIONS)})
        await pipe.execute()
    finally:
        await client.aclose()
    c = _replica(tmp_path, "c", redis_url)
    try:
        taken, _ = await _pull_all(_share(c))
        assert taken == SESSIONS and len(c.sessions) == SESSIONS
        again, _ = await _pull_all(_share(c))
        assert again <= SESSIONS
    finally:
        await c.aclose()


# -- limits with Redis hung or away, through the real gateway ---------------------------------------


@pytest.fixture
def limited(certs: Any, redis_url: str) -> Iterator[tuple[GatewayServer, int]]:
    """The gateway with `--redis-url`, both clients limited to 2 requests a minute; the Redis
    server's pid, to hang it."""
    pid = int(redis.Redis.from_url(redis_url).info("server")["process_id"])
    with SimServer("mtp3", served_model_name="qwen3.8-27b", time_scale=0.02) as sim:
        policy = coder_policy({"a": sim.url})
        for client in policy["clients"]:
            client["requests_per_minute"] = 2
            client["max_concurrent"] = 4
        with GatewayServer(policy, certs=certs, args=("--redis-url", redis_url)) as gw:
            try:
                yield gw, pid
            finally:
                os.kill(pid, signal.SIGCONT)  # the fixture's redis-server must be able to stop


def _ask(gw: GatewayServer, key: str) -> tuple[httpx.Response, float]:
    body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    started = time.monotonic()
    with gw.client(key) as c:
        r = c.post("/v1/chat/completions", json=body)
    return r, time.monotonic() - started


def _served_then_limited(gw: GatewayServer, key: str) -> None:
    """Two requests served, the third refused by the limit, each in the API's shape, each in
    bounded time (one Redis call waits at most 2 x 0.5 s; then Redis is left alone 5 s)."""
    for expected in (200, 200, 429):
        r, took = _ask(gw, key)
        assert r.status_code == expected, r.text[:300]
        assert r.headers["content-type"].startswith("application/json")
        assert took < 3, took
        if expected == 429:
            assert r.json()["error"]["type"] == "RateLimitError" and "retry-after" in r.headers


@pytest.mark.timeout(90)
def test_limited_clients_are_served_when_redis_hangs_or_goes_away(
    limited: tuple[GatewayServer, int],
) -> None:
    gw, pid = limited
    assert _ask(gw, CLIENT_KEY)[0].status_code == 200  # Redis up: counted there
    os.kill(pid, signal.SIGSTOP)  # hung: connections accepted, never answered
    try:
        time.sleep(0.2)
        _served_then_limited(gw, OTHER_KEY)
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        redis.Redis.from_url(f"redis://127.0.0.1:{_port(gw)}/0").shutdown(nosave=True)
    except redis.ConnectionError:
        pass  # the server closes the connection as it goes
    time.sleep(5.5)  # past the fail-over's pause: the gateway asks the dead Redis again
    _served_then_limited(gw, CLIENT_KEY)  # counted afresh by the replica
    errors = [line for line in gw.metrics().splitlines() if "limits_redis_errors_total{" in line]
    assert errors and sum(float(line.rsplit(" ", 1)[1]) for line in errors) >= 2, errors
    assert not any("Internal Server Error" in line for line in gw.output)


def _port(gw: GatewayServer) -> int:
    for i, arg in enumerate(gw.args):
        if arg == "--redis-url":
            return int(gw.args[i + 1].rsplit(":", 1)[1].split("/")[0])
    raise AssertionError("no --redis-url")
