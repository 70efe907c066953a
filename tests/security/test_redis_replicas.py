"""What replicas sharing one Redis survive: a row or index member from the future (a bad row, or
a replica whose clock is an hour ahead), Redis losing the turn-state secret (restarted without
persistence: FLUSHALL leaves it in the same state), and another replica's flood of sessions.
In-process replicas on a real redis-server; each flush and pull is called when the test says,
so no test waits on the loops' clocks unless it says why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from loadtests.harness.gateway import coder_policy
from policies.sessions import SessionId, session_of
from proxy.gateway import Gateway
from tests.backends.replicas import replica

ROWS, INDEX, SECRET = "specrouter:sess:", "specrouter:sess-changed", "specrouter:turn-state-secret"
URLS = {"a": "http://127.0.0.1:9", "b": "http://127.0.0.1:10"}
BODY: dict[str, Any] = {"model": "coder", "messages": [{"role": "user", "content": "hi"}]}


def _replica(tmp_path: Path, name: str, redis_url: str, table_size: int = 10_000) -> Gateway:
    doc = coder_policy(URLS)
    doc["sessions"] = {"table_size": table_size}
    return replica(tmp_path, name, doc, redis_url)


def _sid(client: str, session: str) -> SessionId:
    sid = session_of(client, BODY, {b"x-session-id": session.encode()})
    assert sid is not None
    return sid


def _count(gw: Gateway, result: str) -> float:
    value: float = gw.metrics.session_share.labels(result)._value.get()
    return value


async def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, what
        await asyncio.sleep(0.02)


async def test_a_row_from_the_future_moves_no_cursor_and_is_trimmed(
    tmp_path: Path, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """RD3 (a bad row's far-future score) and RD3b (a replica an hour ahead writes its score
    and its time an hour on): neither is merged, the cursor stays at now, so a row another
    replica writes next is still pulled; a flush trims the future members."""
    a = _replica(tmp_path, "a", redis_url)
    r = aioredis.Redis.from_url(redis_url)
    try:
        now = time.time()
        future = {  # session: (index score, the row's last seen)
            "bad-score": (now + 3600, now),
            "clock-ahead": (now + 3600, now + 3600),
            "bad-seen": (now, now + 3600),
        }
        for session, (score, seen) in future.items():
            key = _sid("agent", session).key
            await r.set(ROWS + key, orjson.dumps(["ahead", "b", seen, 10, 1, 5]), ex=600)
            await r.zadd(INDEX, {key: score})
        with caplog.at_level(logging.WARNING, "specrouter.sessions"):
            await a.share.pull()  # type: ignore[union-attr]
        good = _sid("agent", "good").key
        await r.set(ROWS + good, orjson.dumps(["other", "b", time.time(), 10, 3, 5]), ex=600)
        await r.zadd(INDEX, {good: time.time()})
        await a.share.pull()  # type: ignore[union-attr]
        row = a.sessions.get(good)
        assert row is not None and row.turns == 3, "the cursor went past the next row"
        for session in future:
            assert a.sessions.get(_sid("agent", session).key) is None, session
        # bad-seen: read (its score is now, and within the skew again by the second pull)
        assert _count(a, "refused") >= 1
        # a local change, flushed: the members an hour on are trimmed (by Redis's clock)
        a.sessions.placed(_sid("agent", "mine"), "agent", "a", time.perf_counter())
        assert await a.share.flush() == 1  # type: ignore[union-attr]
        left = {m.decode() for m in await r.zrange(INDEX, 0, -1)}
        assert _sid("agent", "bad-score").key not in left
        assert _sid("agent", "clock-ahead").key not in left
        assert good in left and _count(a, "future") == 2
        said = [m for m in caplog.messages if "clock is ahead" in m]
        assert len(said) == 1, caplog.messages  # logged once
    finally:
        await r.aclose()
        await a.aclose()


async def test_a_lost_turn_state_secret_is_put_back_or_taken_by_every_replica(
    tmp_path: Path, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """BR2: Redis loses the secret. With no replica starting meanwhile, the first to look puts
    the replicas' one back; when a starting replica set another first, every replica takes
    it, logged and counted, and a token one issues holds on the other again."""
    a = _replica(tmp_path, "a", redis_url)
    b = _replica(tmp_path, "b", redis_url)
    r = aioredis.Redis.from_url(redis_url)
    a.start()
    b.start()
    try:
        await _until(lambda: a.turn_state.secret is not None, 5.0, "a: no secret")
        await _until(lambda: b.turn_state.secret == a.turn_state.secret, 5.0, "b: another")
        held = a.turn_state.secret
        await r.flushall()  # Redis restarted without persistence
        with caplog.at_level(logging.WARNING, "specrouter.sessions"):
            await _until_value(r, held, "the replicas' secret was never put back")

        def lost() -> list[float]:
            errors = (gw.metrics.session_share_errors.labels("secret-lost") for gw in (a, b))
            return sorted(e._value.get() for e in errors)

        # the replica counts once its SET has answered: Redis may show the value a moment before
        await _until(lambda: sum(lost()) > 0, 5.0, "the put-back was not counted")
        assert a.turn_state.secret == b.turn_state.secret == held
        assert lost() == [0, 1]  # the first to look put it back, the other found it
        assert sum("had lost the turn-state secret" in m for m in caplog.messages) == 1
        await r.flushall()
        await r.set(SECRET, "a-replica-started-after-the-restart-set-this")  # before a, b look
        new = b"a-replica-started-after-the-restart-set-this"
        with caplog.at_level(logging.WARNING, "specrouter.sessions"):
            await _until(
                lambda: a.turn_state.secret == b.turn_state.secret == new,
                5.0,
                "the replicas kept the secret Redis lost",
            )
        for gw in (a, b):
            assert gw.metrics.session_share_errors.labels("secret-changed")._value.get() == 1
        assert sum("is not this replica's" in m for m in caplog.messages) == 2
        token = a.turn_state.issue("agent", "s-1", "a", time.time())
        assert b.turn_state.verify(token, "agent", "s-1", time.time()) == "a"
    finally:
        await r.aclose()
        await a.aclose()
        await b.aclose()


async def _until_value(r: aioredis.Redis, value: bytes | None, what: str) -> None:
    end = time.monotonic() + 5.0
    while await r.get(SECRET) != value:
        assert time.monotonic() < end, what
        await asyncio.sleep(0.02)


async def test_a_merged_row_keeps_its_client_so_another_s_flood_evicts_its_own(
    tmp_path: Path, redis_url: str
) -> None:
    """BR3: on replica a, client agent's session and then client other's 40 sessions; replica
    b (a 20-row table) merges them all. Merged as one client, the flood evicted agent's row on
    b; with their clients, the flood evicts its own."""
    a = _replica(tmp_path, "a", redis_url)
    b = _replica(tmp_path, "b", redis_url, table_size=20)
    try:
        victim = _sid("agent", "victim")
        a.sessions.placed(victim, "agent", "a", time.perf_counter())
        for i in range(40):
            a.sessions.placed(_sid("other", f"flood-{i}"), "other", "a", time.perf_counter())
        assert await a.share.flush() == 41  # type: ignore[union-attr]
        assert await b.share.pull() == 41  # type: ignore[union-attr]
        row = b.sessions.get(victim.key)
        assert row is not None, "another client's flood evicted the victim's merged row"
        assert row.client == "agent" and len(b.sessions) == 20
    finally:
        await a.aclose()
        await b.aclose()
