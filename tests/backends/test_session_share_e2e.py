"""Two gateway processes sharing one redis-server: a session placed by one is sticky on the
other; with Redis killed mid-run both keep serving."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import redis

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from proxy.certs import CertFiles

SERVED = "qwen3.8-27b"
SHARE = ("--session-flush-interval", "0.1", "--session-pull-interval", "0.1")


def _ask(c: httpx.Client, session: str) -> tuple[str, str]:
    r = c.post(
        "/v1/chat/completions",
        headers={"x-session-id": session},
        json={"model": "coder", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    assert r.status_code == 200, r.text
    return r.headers["x-specrouter-variant"], r.headers["x-specrouter-reason"]


def test_two_replicas_share_sessions_and_survive_redis(certs: CertFiles, redis_url: str) -> None:
    args = ("--redis-url", redis_url, *SHARE)
    with (
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.02) as a,
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.02) as b,
        # the same engines, each replica's rules preferring another one
        GatewayServer(coder_policy({"a": a.url, "b": b.url}), certs=certs, args=args) as one,
        GatewayServer(coder_policy({"b": b.url, "a": a.url}), certs=certs, args=args) as two,
        one.client() as c1,
        two.client() as c2,
    ):
        assert _ask(c1, "conv-1")[0] == "a"
        assert _ask(c2, "conv-2")[0] == "b"  # a session the first replica never saw
        # Asking before the row arrived would place it anew (and that placement would win):
        # wait for each replica to have merged the other's (0.2 s on a quiet machine; the bound
        # is for a starved one).
        _until(lambda: all(_merged(gw) for gw in (one, two)), "not shared")
        assert _ask(c2, "conv-1") == ("a", "session")
        assert _ask(c1, "conv-2") == ("b", "session")
        try:
            redis.Redis.from_url(redis_url).shutdown(nosave=True)
        except redis.RedisError:
            pass  # the server closes the connection as it goes
        for i in range(10):  # each replica serves from its local table, sessions still sticky
            assert _ask(c1, "conv-2") == ("b", "session")
            assert _ask(c2, "conv-1") == ("a", "session")
            assert _ask(c1, f"new-{i}")[0] == "a"
        _until(
            lambda: 'specrouter_session_share_errors_total{op="pull"}' in one.metrics(),
            "no pull error",
        )
        assert sum("Redis unreachable" in line for line in one.output) == 1


def _merged(gw: GatewayServer) -> bool:
    return 'specrouter_session_share_rows_total{result="merged"}' in gw.metrics()


def _until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout:g} s"
        time.sleep(0.05)
