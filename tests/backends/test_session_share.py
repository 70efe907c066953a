"""The session table shared by replicas through a real redis-server (two in-process gateways)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from loadtests.harness.gateway import coder_policy
from loadtests.harness.ports import free_port
from policies.engine import decide
from policies.inputs import request_view
from policies.sessions import session_of
from policies.types import LiveState
from proxy.backends.session_share import SessionShare
from proxy.backends.session_table import SharedRow
from proxy.gateway import Gateway
from tests.backends.replicas import FLUSH_S, PULL_S, replica
from tests.redis_server import redis_server

BOUND_S = FLUSH_S + PULL_S
HEADERS = {b"x-session-id": b"conv-1"}
BODY: dict[str, Any] = {"model": "coder", "messages": [{"role": "user", "content": "hi"}]}
KEY = session_of("agent", BODY, HEADERS).key  # type: ignore[union-attr]


def _gateway(tmp_path: Path, name: str, variants: list[str], redis_url: str, **kw: Any) -> Gateway:
    """A replica whose rules place a new session on `variants[0]`."""
    urls = {"a": "http://127.0.0.1:9", "b": "http://127.0.0.1:10"}
    return replica(tmp_path, name, coder_policy({v: urls[v] for v in variants}), redis_url, **kw)


def _request(gw: Gateway) -> tuple[str | None, str]:
    """What the relay does for a request (proxy/relay/app.py `_decide`): the table's view of
    the session, the decision, the placement."""
    sid = session_of("agent", BODY, HEADERS)
    assert sid is not None
    now = time.perf_counter()
    view = request_view(BODY, "chat", "coder", "agent", HEADERS, now, gw.sessions.view(sid, now))
    decision = decide(view, LiveState(), gw.policy.current)
    assert decision.backend is not None
    gw.sessions.placed(sid, "agent", decision.backend, now)
    return decision.backend, decision.reason


async def _until(check: Any, timeout: float) -> float:
    start = time.perf_counter()
    while not check():
        assert time.perf_counter() - start < timeout, "not within the staleness bound"
        await asyncio.sleep(0.01)
    return time.perf_counter() - start


async def test_a_session_placed_by_one_replica_sticks_on_the_other(
    tmp_path: Path, redis_url: str
) -> None:
    a = _gateway(tmp_path, "a", ["a", "b"], redis_url)
    b = _gateway(tmp_path, "b", ["b", "a"], redis_url)
    a.start()
    b.start()
    try:
        assert _request(a)[0] == "a"
        key = KEY
        a.sessions.served(key, 4500, time.perf_counter())  # its attained service travels too
        a.sessions.finished(
            key,
            "a",
            time.perf_counter(),
            prompt_tokens=4000,
            completion_tokens=500,
            cached_tokens=0,
            decode_s=1.0,
        )
        # a flush and a pull, each possibly just missed, and scheduling on a loaded machine
        waited = await _until(lambda: b.sessions.get(key) is not None, 4 * BOUND_S + 1.0)
        row = b.sessions.get(key)
        assert row is not None and (row.engine, row.prefix_tokens, row.turns) == ("a", 4500, 1)
        assert row.attained.total(time.perf_counter(), 600.0) == 4500
        assert waited < 4 * BOUND_S + 1.0
        # b's rules say b; the session stays where its prefix is
        assert _request(b) == ("a", "session")
        # b's turn goes back to a (last seen wins), with the turn count b knows
        b.sessions.finished(
            key,
            "a",
            time.perf_counter(),
            prompt_tokens=5000,
            completion_tokens=100,
            cached_tokens=4500,
            decode_s=0.5,
        )
        await _until(lambda: (a.sessions.get(key) or row).turns == 2, 4 * BOUND_S + 1.0)
        again = a.sessions.get(key)
        assert again is not None and again.prefix_tokens == 5100
        sent = a.metrics.session_share.labels("sent")._value.get()
        merged = b.metrics.session_share.labels("merged")._value.get()
        assert sent >= 1 and merged >= 1
    finally:
        await a.aclose()
        await b.aclose()


async def test_redis_killed_mid_run_the_local_table_serves(
    tmp_path: Path, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    a = _gateway(tmp_path, "a", ["a", "b"], redis_url)
    a.start()
    try:
        assert _request(a)[0] == "a"
        await _until(lambda: a.metrics.session_share.labels("sent")._value.get() >= 1, 5.0)
        killer = aioredis.Redis.from_url(redis_url)
        try:
            await killer.shutdown(nosave=True)
        except Exception:  # noqa: BLE001 - the server closes the connection as it goes
            pass
        errors = a.metrics.session_share_errors
        for _ in range(20):  # requests keep being decided from the local table, sticky
            assert _request(a) == ("a", "default")
            await asyncio.sleep(0.05)
        await _until(lambda: errors.labels("pull")._value.get() >= 2, 10.0)
        assert a.share is not None and a.share.queued() == 1  # kept for when Redis is back
        unreachable = [r for r in caplog.records if "Redis unreachable" in r.getMessage()]
        assert len(unreachable) == 1  # logged once, however many retries
    finally:
        await a.aclose()


async def test_one_outage_is_logged_once_and_never_reached_by_an_empty_flush(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing queued: the flush makes no round trip, which is no sign that Redis is back (it
    once logged "reachable again", then the next failed pull "unreachable" again)."""
    gw = _gateway(tmp_path, "a", ["a"], _dead_url())
    gw.start()
    try:
        errors = gw.metrics.session_share_errors
        await _until(lambda: errors.labels("pull")._value.get() >= 3, 10.0)
        assert gw.share is not None and gw.share.queued() == 0
        said = [r.getMessage() for r in caplog.records if "Redis" in r.getMessage()]
        assert len(said) == 1 and said[0].startswith("Redis unreachable"), said
    finally:
        await gw.aclose()


async def test_redis_back_on_its_port_is_logged_once_and_gets_the_kept_row(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    with redis_server(port, tmp_path):
        gw = _gateway(tmp_path, "a", ["a"], f"redis://127.0.0.1:{port}/0")
        gw.start()
    try:  # Redis is gone: the row placed now is kept for when it is back
        assert _request(gw)[0] == "a"
        errors = gw.metrics.session_share_errors
        await _until(lambda: errors.labels("flush")._value.get() >= 2, 10.0)
        assert gw.share is not None and gw.share.queued() == 1
        sent = gw.metrics.session_share.labels("sent")

        def said() -> list[str]:
            return [r.getMessage() for r in caplog.records if "Redis" in r.getMessage()]

        with redis_server(port, tmp_path):
            # The backoff is at most 10 s. "Reachable again" may come from a later round trip
            # than the flush: one that began before a failure does not count.
            await _until(lambda: sent._value.get() >= 1 and "again" in " ".join(said()), 15.0)
            assert gw.share.queued() == 0
        assert [m.split(" (")[0] for m in said()] == [
            "Redis unreachable",
            "Redis reachable again: sessions shared",
        ], said()
    finally:
        await gw.aclose()


def _dead_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there once closed


async def test_the_queue_is_bounded_while_redis_is_away(tmp_path: Path) -> None:
    gw = _gateway(tmp_path, "a", ["a"], _dead_url(), session_queue_max=100)
    share = gw.share
    assert isinstance(share, SessionShare)
    try:
        for n in range(1000):
            share.changed(f"s-{n:032x}")
        assert share.queued() == 100
        assert gw.metrics.session_share.labels("dropped")._value.get() == 900
        for n in range(900, 1000):  # the newest are kept; a row must exist to be sent
            gw.sessions.merge(f"s-{n:032x}", SharedRow("a", time.perf_counter(), 0, 0, 0))
        with pytest.raises(Exception):  # noqa: B017 - whatever the client raises
            await share.flush()
        assert share.queued() == 100  # queued again, not lost, not grown
        share.changed("s-new")
        assert share.queued() == 100
    finally:
        await gw.aclose()
