"""Session-aware admission's residency shared by replicas through a real redis-server (two
in-process gateways): one replica's resident sessions count against the engine on the other,
its waiting sessions keep their place in the other's first come first served order, and
malformed published state is skipped."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson

from loadtests.harness.gateway import coder_policy
from policies.admission import Capacity, Turn, admission
from proxy.backends.residency import Remote
from proxy.backends.residency_share import _merge
from proxy.gateway import Gateway
from tests.backends.replicas import replica

S1, S2, S3, S4 = (f"s-{i:032x}" for i in range(1, 5))


def _gateway(tmp_path: Path, name: str, redis_url: str) -> Gateway:
    doc = coder_policy({"a": "http://127.0.0.1:9"})
    doc["admission"] = {"sessions": {"enabled": True, "turn_tokens": 0}}
    return replica(tmp_path, name, doc, redis_url)


async def _until(check: Any, timeout: float = 5.0) -> None:
    start = time.perf_counter()
    while not check():
        assert time.perf_counter() - start < timeout, "not within the staleness bound"
        await asyncio.sleep(0.02)


async def test_one_replicas_residency_counts_on_the_other(tmp_path: Path, redis_url: str) -> None:
    a, b = _gateway(tmp_path, "a", redis_url), _gateway(tmp_path, "b", redis_url)
    a.start()
    b.start()
    try:
        spec = b.policy.current.document.admission.sessions
        a.residency.admitted("a", S1, 80_000)
        await _until(lambda: b.residency.snapshot("a", time.perf_counter(), 60).residents)
        snap = b.residency.snapshot("a", time.perf_counter(), 60)
        assert [(r.key, r.prefix_tokens, r.idle_since) for r in snap.residents] == [
            (S1, 80_000, None)
        ]
        kv = Capacity(100_000, 16)
        # On b, a second session does not fit beside a's; a's turn of S1 on b is resident.
        now = time.perf_counter()
        assert admission(Turn(S2, 30_000), snap, kv, spec, now).reason == "full"
        assert admission(Turn(S1, 80_000), snap, kv, spec, now).reason == "resident"
        # a's waiting session is before b's own, later one.
        a.residency.join("a", S3, time.perf_counter())
        await _until(lambda: b.residency.snapshot("a", time.perf_counter(), 60).waiting)
        b.residency.join("a", S4, time.perf_counter())
        snap = b.residency.snapshot("a", time.perf_counter(), 60)
        assert [w.key for w in snap.waiting] == [S3, S4]
        verdict = admission(Turn(S4, 1_000), snap, kv, spec, time.perf_counter())
        assert (verdict.reason, verdict.ahead) == ("queue", 1)
        # a's turn ends: idle there, idle on b too
        a.residency.turn_done(
            "a", S1, time.perf_counter(), prompt_tokens=1000, completion_tokens=0, cached_tokens=0
        )
        await _until(
            lambda: all(
                r.idle_since is not None
                for r in b.residency.snapshot("a", time.perf_counter(), 60).residents
            )
        )
    finally:
        await a.aclose()
        await b.aclose()


def test_malformed_state_is_skipped() -> None:
    remote: dict[str, Remote] = {}
    good = [S1, 10, None]
    state = {
        "a": {
            "residents": [good, ["x", 1, None], [S2, -1, None], [S3, 5, "now"], [S4, 1e30, 1.0]],
            "waiting": [[S2, 5.0, True], [S3, "nan", True], [S4, 6.0, "yes"], "junk"],
            "shared": 7,
        },
        "": {"residents": [good]},
        "b": "junk",
    }
    _merge(remote, orjson.dumps(state), 0.0)
    _merge(remote, b"not json", 0.0)
    _merge(remote, b"[1, 2]", 0.0)
    assert list(remote) == ["a"]
    residents, waiting, shared = remote["a"]
    assert [r.key for r in residents] == [S1] and [w.key for w in waiting] == [S2]
    assert shared == 7
