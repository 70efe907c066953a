"""The x-codex-turn-state secret across replicas: without one configured, replicas agree on one
through a real redis-server (the first sets it), so a token one issues holds the turn on the
other; a configured secret needs no Redis."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from policies.engine import decide
from policies.inputs import request_view
from policies.types import LiveState
from proxy.gateway import Gateway
from tests.backends.test_session_share import BODY, HEADERS, KEY, _gateway


async def _secret(gw: Gateway, timeout: float = 5.0) -> bytes:
    end = time.monotonic() + timeout
    while gw.turn_state.secret is None:
        assert time.monotonic() < end, "no shared secret in time"
        await asyncio.sleep(0.02)
    return gw.turn_state.secret


async def test_replicas_share_one_secret_and_honour_each_others_tokens(
    tmp_path: Path, redis_url: str
) -> None:
    a = _gateway(tmp_path, "a", ["a", "b"], redis_url)
    b = _gateway(tmp_path, "b", ["b", "a"], redis_url)
    assert a.turn_state.secret is None  # nothing issued until the replicas agree
    a.start()
    b.start()
    try:
        assert await _secret(a) == await _secret(b)
        token = a.turn_state.issue("agent", KEY, "a", time.time())
        engine = b.turn_state.verify(token, "agent", KEY, time.time())
        assert engine == "a"
        # b's rules (and its empty table) say b: the turn stays on the engine a's token names
        now = time.perf_counter()
        view = request_view(BODY, "chat", "coder", "agent", HEADERS, now, turn_engine=engine)
        d = decide(view, LiveState(), b.policy.current)
        assert (d.backend, d.reason) == ("a", "turn-state")
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_configured_secret_is_used_as_is(tmp_path: Path, redis_url: str) -> None:
    a = _gateway(tmp_path, "a", ["a", "b"], redis_url, turn_state_secret="k" * 32)
    assert a.turn_state.secret == b"k" * 32 and a.share is not None
    assert a.share.turn_state is None  # nothing to agree on
    await a.aclose()
