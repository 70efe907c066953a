"""The fault suite: the real gateway (TLS, loopback) in front of two simulated engines that fail
on purpose, under 16 streams from a raw client (loadtests/bench/soak/).

Every scenario checks, from the client's side, that no request was lost (cut without `[DONE]`,
hung past its deadline, malformed) and that the only errors are clear ones (an error event then
`[DONE]`, or an OpenAI error with Retry-After) on the failing backend; and, from the gateway's
side once the load stops, that nothing stays in flight (admin status and the
`specrouter_in_flight` gauge at 0, nothing queued) and no upstream connection leaks (the
gateway's own sockets to the engines' ports, from /proc: none in CLOSE_WAIT, established ones
no more than the streams that were open). Durations here are bounds, not measurements: the
figures are in loadtests/bench/faults_table.md, from `python -m loadtests.bench.soak`.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
import yaml

from loadtests.bench.soak import (
    Address,
    Background,
    Conn,
    HealthWatch,
    Load,
    Outcome,
    Settled,
    burst,
    disconnects,
    metric_sum,
    run_async,
    settle,
)
from loadtests.harness.gateway import (
    ADMIN_TOKEN,
    CLIENT_KEY,
    OTHER_KEY,
    GatewayServer,
    coder_policy,
)
from loadtests.harness.sim import SimServer

SERVED = "qwen3.8-27b"
KEYS = [CLIENT_KEY, OTHER_KEY]  # even workers: client `agent` -> deep; odd: `other` -> shallow
STREAMS = 16
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimServer]]:
    with (
        SimServer(
            "dflash7-prob-block", served_model_name=SERVED, time_scale=0.05, max_num_seqs=64
        ) as deep,
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.05, max_num_seqs=64) as shallow,
    ):
        yield {"deep": deep, "shallow": shallow}


@pytest.fixture
def pair(sims: dict[str, SimServer]) -> tuple[SimServer, SimServer]:
    """The two engines, alive, without faults, idle."""
    for sim in sims.values():
        if sim.proc is None or sim.proc.poll() is not None:
            sim.restart()
        sim.clear_faults()
    _wait(
        lambda: all(s.stats()["running"] == 0 and s.stats()["waiting"] == 0 for s in sims.values()),
        15,
        "engines idle",
    )
    return sims["deep"], sims["shallow"]


def _policy(deep: SimServer, shallow: SimServer, *, continuation: bool = False) -> dict[str, Any]:
    doc = coder_policy(
        {"deep": deep.url, "shallow": shallow.url},
        rules=[{"name": "other-shallow", "kind": "client", "clients": ["other"], "use": "shallow"}],
    )
    for backend in doc["backends"].values():
        backend.update({"startup_s": 0, "max_concurrency": 64})
    doc["routes"]["coder"]["continuation"] = continuation
    doc["health"] = {"fail_after": 2, "recover_after": 2}
    return doc


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"{what}: not reached in {timeout:g}s")


def _more(load: Load, since: float, what: str, n: int = STREAMS) -> None:
    """Until `n` requests sent after `since` have ended: each worker's next one, about."""
    _wait(lambda: sum(o.t0 > since for o in load.outcomes) >= n, 15, what)


def _target(gw: GatewayServer) -> Address:
    return Address.of(gw.base, gw.certs.ca_cert)


def _describe(outs: list[Outcome]) -> str:
    return repr(Counter((o.kind, o.backend) for o in outs))


def _no_loss(outs: list[Outcome]) -> None:
    lost = [o for o in outs if o.lost]
    assert not lost, [(o.kind, o.backend, o.detail) for o in lost[:5]]


def _only_on(outs: list[Outcome], failing: str) -> list[Outcome]:
    """No request lost; errors only on `failing`, each a clear one. Returns the errors."""
    _no_loss(outs)
    errors = [o for o in outs if o.errored]
    stray = [o for o in errors if o.backend != failing]
    assert not stray, [(o.kind, o.backend, o.detail) for o in stray[:5]]
    return errors


def _clean(gw: GatewayServer, sims: tuple[SimServer, ...], *, open_max: int = STREAMS) -> Settled:
    """In flight 0, nothing queued, no CLOSE_WAIT, pooled connections bounded by the streams."""
    state = settle(gw, [s.port for s in sims], timeout=15)
    for sim in sims:
        # Only idle keep-alive connections may stay, in two pools: aiohttp's (plain requests,
        # health checks) and the push relay's (finished streams). Neither holds more than
        # were open at once; an aborted stream's connection is in neither.
        assert state.established(sim.port) <= 2 * open_max + 2, state
    return state


def _served_again(gw: GatewayServer, key: str, backend: str, timeout: float = 10) -> float:
    """Send small requests until one is served by `backend`; when it was."""
    target = _target(gw)
    end = time.monotonic() + timeout
    body = {"model": "coder", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    while time.monotonic() < end:
        out = run_async(burst(target, [(key, body)], deadline_s=10), 15)[0]
        if out.kind == "ok" and out.backend == backend:
            return out.t1
        time.sleep(0.1)
    raise AssertionError(f"{backend} did not serve again in {timeout:g}s")


# -- scenarios ----------------------------------------------------------------------------------


def test_backend_killed_under_16_stream_load(certs, pair) -> None:
    deep, shallow = pair
    with (
        GatewayServer(
            _policy(deep, shallow),
            certs=certs,
            args=("--first-byte-timeout", "5", "--idle-timeout", "5"),
        ) as gw,
        HealthWatch(gw) as watch,
    ):
        load = Load(_target(gw), KEYS, workers=STREAMS, deadline_s=20).start()
        try:
            _wait(lambda: len(load.outcomes) >= STREAMS, 15, "warm-up")
            t_kill = time.monotonic()
            deep.kill()
            t_down = watch.wait("deep", lambda h: h == "down", 5)
            time.sleep(1.5)
            deep.restart()
            t_up = watch.wait("deep", lambda h: h == "up", 10)
            _served_again(gw, CLIENT_KEY, "deep")
            time.sleep(1.0)
        finally:
            outs = load.stop()
        errors = _only_on(outs, "deep")
        # Only the streams open on deep when it died: each ends with an error event + [DONE].
        assert all(o.kind == "error_event" and o.t0 < t_down for o in errors), errors
        assert len(errors) <= STREAMS
        assert any(o.kind == "ok" and o.backend == "shallow" and t_kill < o.t0 < t_up for o in outs)
        after = [o for o in outs if o.t0 > t_up + 0.5]
        assert after and all(o.kind == "ok" for o in after), _describe(after)
        _clean(gw, (deep, shallow))


RELAYS = pytest.mark.parametrize("relay", ["push", "pull"])


@RELAYS
def test_backend_hangs_mid_stream_is_cut_by_the_idle_timeout(certs, pair, relay: str) -> None:
    deep, shallow = pair
    with GatewayServer(
        _policy(deep, shallow),
        certs=certs,
        args=("--idle-timeout", "1", "--first-byte-timeout", "2", "--relay", relay),
    ) as gw:
        aborted0 = deep.stats()["aborted"]
        load = Load(_target(gw), KEYS, workers=STREAMS, deadline_s=20).start()
        try:
            _wait(lambda: len(load.outcomes) >= STREAMS, 15, "warm-up")
            t_hang = time.monotonic()
            deep.fault("hang")
            time.sleep(3.5)
            t_clear = time.monotonic()
            deep.clear_faults()
            _more(load, _served_again(gw, CLIENT_KEY, "deep"), "requests after the hang")
        finally:
            outs = load.stop()
        # A request the hung engine had (sent, with or without its headers back) is not sent
        # again (it would double a slow engine's load): a 504 after the first-byte timeout
        # ("no first byte", or the pull relay's "no response"), never shallow's.
        unsent = [
            o
            for o in outs
            if o.kind == "http_error"
            and o.status == 504
            and ("no first byte" in o.detail or "no response in" in o.detail)
        ]
        errors = _only_on([o for o in outs if o not in unsent], "deep")
        assert errors, "streams open on the hung engine must end"
        for o in errors:
            # The stream's own silence, not a hang: an error event within the idle timeout.
            assert o.kind == "error_event" and "sent nothing" in o.detail, o
            assert t_hang < o.t1 < t_clear + 0.5 and o.t1 - t_hang < 1 + 2.0, o
        # Once deep's timeouts marked it down, new requests went to shallow instead.
        assert any(
            o.kind == "ok"
            and o.backend == "shallow"
            and o.worker % 2 == 0
            and t_hang < o.t0 < t_clear
            for o in outs
        )
        # The gateway closed the hung streams: the engine aborted them, nothing left running.
        _wait(
            lambda: deep.stats()["running"] == 0 and deep.stats()["waiting"] == 0,
            10,
            "hung requests aborted upstream",
        )
        assert deep.stats()["aborted"] - aborted0 >= len(errors)
        _clean(gw, (deep, shallow))


def test_500_and_503_before_the_first_byte(certs, pair) -> None:
    deep, shallow = pair
    with GatewayServer(_policy(deep, shallow), certs=certs) as gw, HealthWatch(gw) as watch:
        load = Load(_target(gw), KEYS, workers=STREAMS, deadline_s=20).start()
        try:
            _wait(lambda: len(load.outcomes) >= STREAMS, 15, "warm-up")
            deep.fault("http_500")  # one failing: retried on the other before the first byte
            t_a = time.monotonic()
            _more(load, t_a, "requests while deep fails")
            shallow.fault("http_503")  # both failing: a clear 5xx with Retry-After
            t_b = time.monotonic()
            _more(load, t_b, "requests while both fail")
            t_c = time.monotonic()
            deep.clear_faults()
            shallow.clear_faults()
            watch.wait("deep", lambda h: h == "up", 10)
            watch.wait("shallow", lambda h: h == "up", 10)
            _served_again(gw, CLIENT_KEY, "deep")
            t_ok = time.monotonic()
            _more(load, t_ok, "requests once both are back")
        finally:
            outs = load.stop()
        _no_loss(outs)
        assert not [o for o in outs if o.kind == "error_event"]  # failures before any byte
        one_failing = [o for o in outs if t_a <= o.t0 and o.t1 < t_b]
        assert one_failing and all(
            o.kind == "ok" and o.backend == "shallow" for o in one_failing
        ), _describe(one_failing)
        both = [o for o in outs if t_b <= o.t0 and o.t1 < t_c]
        assert both, "requests while both engines fail"
        for o in both:
            # The gateway's own 502/503 (no backend left) carries Retry-After; a last attempt's
            # answer is the engine's own OpenAI error (here its 500), relayed as it is.
            assert o.kind == "http_error" and o.status in (500, 502, 503), o
            assert o.status == 500 or (o.retry_after and int(o.retry_after) > 0), o
        after = [o for o in outs if o.t0 > t_ok]
        assert after and all(o.kind == "ok" for o in after), _describe(after)
        assert metric_sum(gw.metrics(), "specrouter_retries_total") > 0
        _clean(gw, (deep, shallow))


@RELAYS
@pytest.mark.parametrize("continuation", [False, True], ids=["error-event", "continued"])
def test_backend_dies_mid_stream(certs, pair, continuation: bool, relay: str) -> None:
    deep, shallow = pair
    with (
        GatewayServer(
            _policy(deep, shallow, continuation=continuation), certs=certs, args=("--relay", relay)
        ) as gw,
        HealthWatch(gw) as watch,
    ):
        load = Load(_target(gw), KEYS, workers=STREAMS, deadline_s=20, keep_bodies=True).start()
        try:
            _wait(lambda: len(load.outcomes) >= STREAMS, 15, "warm-up")
            t_die = time.monotonic()
            deep.fault("die_mid_stream", after_chunks=5)
            watch.wait("deep", lambda h: h != "up", 5)
            time.sleep(1.0)
            t_clear = time.monotonic()
            deep.clear_faults()
            watch.wait("deep", lambda h: h == "up", 10)
            _more(load, _served_again(gw, CLIENT_KEY, "deep"), "requests after the deaths")
        finally:
            outs = load.stop()
        errors = _only_on(outs, "deep")
        continued = metric_sum(gw.metrics(), "specrouter_continuations_total")
        hit = [
            o for o in outs if o.backend == "deep" and o.stream and o.t0 < t_clear and o.t1 > t_die
        ]
        if continuation:
            assert not errors, [(o.kind, o.detail) for o in errors[:5]]
            assert continued >= 1
            for o in hit:  # one complete answer each: one role chunk, one finish reason
                assert o.body is not None
                chunks = [
                    orjson.loads(line[6:])
                    for line in o.body.split(b"\n\n")
                    if line.startswith(b"data: {")
                ]
                finishes = [
                    c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")
                ]
                assert len(finishes) == 1, o.body[-400:]
                assert len({c["id"] for c in chunks}) == 1
        else:
            assert errors and continued == 0
            assert all(o.kind == "error_event" and "connection lost" in o.detail for o in errors), (
                errors
            )
            assert all(t_die < o.t1 for o in errors)
        _clean(gw, (deep, shallow))


def test_health_flapping(certs, pair) -> None:
    deep, shallow = pair
    with GatewayServer(_policy(deep, shallow), certs=certs) as gw, HealthWatch(gw) as watch:
        load = Load(_target(gw), KEYS, workers=STREAMS, deadline_s=20).start()
        try:
            _wait(lambda: len(load.outcomes) >= STREAMS, 15, "warm-up")
            for _ in range(6):
                # /health fails and new requests get 503: active and passive signals agree.
                # (health_fail alone does not flap a backend that serves traffic: each request
                # served resets its failure count.)
                deep.fault("health_fail")
                deep.fault("http_503")
                watch.wait("deep", lambda h: h == "down", 5)
                deep.clear_faults()
                watch.wait("deep", lambda h: h == "up", 5)
            _more(load, _served_again(gw, CLIENT_KEY, "deep"), "requests after the flapping")
        finally:
            outs = load.stop()
        _no_loss(outs)
        assert not [o for o in outs if o.errored], _describe(outs)
        downs = [h for _, h in watch.transitions("deep") if h == "down"]
        assert len(downs) >= 6
        assert {o.backend for o in outs} == {"deep", "shallow"}
        _clean(gw, (deep, shallow))


def test_policy_changes_during_load(certs, pair) -> None:
    deep, shallow = pair
    with GatewayServer(_policy(deep, shallow, continuation=True), certs=certs) as gw:
        load = Load(_target(gw), KEYS, workers=STREAMS, deadline_s=20).start()
        statuses: Counter[int] = Counter()
        try:
            _wait(lambda: len(load.outcomes) >= STREAMS, 15, "warm-up")
            with httpx.Client(base_url=gw.admin, headers=ADMIN, timeout=10) as admin:
                for i in range(20):
                    cur = admin.get("/admin/policy")
                    doc = cur.json()["document"]
                    route = doc["routes"]["coder"]
                    route["defaults"] = {"temperature": round(0.5 + i / 50, 2)}
                    route["variants"] = ["deep", "shallow"] if i % 2 else ["shallow", "deep"]
                    route["rules"][0]["use"] = "deep" if i % 4 == 1 else "shallow"
                    route["continuation"] = i % 3 != 0
                    r = admin.put(
                        "/admin/policy",
                        content=yaml.safe_dump(doc),
                        headers={"if-match": cur.headers["etag"]},
                    )
                    statuses[r.status_code] += 1
                    if i == 7:  # a stale ETag and an invalid document change nothing
                        statuses[
                            admin.put(
                                "/admin/policy",
                                content=yaml.safe_dump(doc),
                                headers={"if-match": cur.headers["etag"]},
                            ).status_code
                        ] += 1
                        now = admin.get("/admin/policy")
                        bad = dict(doc, routes={"coder": dict(route, variants=["gone"])})
                        statuses[
                            admin.put(
                                "/admin/policy",
                                content=yaml.safe_dump(bad),
                                headers={"if-match": now.headers["etag"]},
                            ).status_code
                        ] += 1
                    if i == 10:
                        gw.hup()  # certificate and policy file reloaded meanwhile
                    time.sleep(0.15)
            _more(load, time.monotonic(), "requests under the last policy")
        finally:
            outs = load.stop()
        assert statuses == {200: 20, 412: 1, 422: 1}, statuses
        _no_loss(outs)
        assert not [o for o in outs if o.errored], _describe(outs)
        # The changes took effect under the load: client `other` was sent to deep at times.
        assert any(o.backend == "deep" and o.worker % 2 == 1 for o in outs)
        history = gw.admin_get("/admin/policy/history").json()["history"]
        assert len(history) == 21
        _clean(gw, (deep, shallow))


# RSS growth allowed per request once warm. A request's object graph kept alive is ~12 KB.
# Kept alive until a full collection counts too: reference cycles through a finished request
# (the push channel and its protocol, an error's traceback holding the relay's frame, the engine
# stream and its parser) let hundreds of them, TLS buffers included, pile up (4-8 MB here).
# A fourth, the protocol's bound `authenticated` method in its own scope (proxy/servers.py),
# kept every connection so until it was held weakly too (tests/test_servers_memory.py): now
# 0.6 MB over 1,000 on either relay.
LEAK_KB_PER_REQUEST = 6


@pytest.fixture
def lean_malloc(monkeypatch: pytest.MonkeyPatch) -> None:
    """glibc keeps freed memory: each new TLS connection's buffers (~30 KB) raise the heap's
    high-water mark, less and less as it warms, so RSS climbs for thousands of connections with
    no object alive. For the gateways these tests start, large blocks come from mmap and the
    heap is trimmed, so RSS follows what is live. (Allocator settings only, for measuring.)"""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "16384")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")


def test_1000_client_disconnects_give_1000_upstream_aborts(certs, pair, lean_malloc) -> None:
    deep, shallow = pair
    with GatewayServer(_policy(deep, shallow), certs=certs) as gw:
        target = _target(gw)
        # Warm-up: as many TLS connections as measured below, so the allocator's high-water
        # mark for them is reached first.
        warm = run_async(disconnects(target, CLIENT_KEY, 1000, concurrency=32), 90)
        assert warm == {"dropped": 1000}, warm
        _wait(lambda: deep.stats()["running"] == 0, 10, "warm-up aborts")
        rss0 = settle(gw, [deep.port, shallow.port]).rss_kb
        before = deep.stats()
        gone0 = metric_sum(gw.metrics(), "specrouter_client_disconnects_total")
        seen = run_async(disconnects(target, CLIENT_KEY, 1000, concurrency=32), 90)
        assert seen == {"dropped": 1000}, seen  # each saw its stream begin, then dropped it
        _wait(
            lambda: deep.stats()["aborted"] - before["aborted"] >= 1000, 20, "1,000 upstream aborts"
        )
        after = deep.stats()
        assert after["aborted"] - before["aborted"] == 1000
        assert after["requests"] - before["requests"] == 1000
        assert after["completed"] == before["completed"]  # none ran on to the end
        _wait(
            lambda: deep.stats()["running"] == 0 and deep.stats()["waiting"] == 0, 10, "engine idle"
        )
        state = _clean(gw, (deep, shallow), open_max=0)  # an aborted connection is not pooled
        gone = metric_sum(gw.metrics(), "specrouter_client_disconnects_total") - gone0
        assert gone == 1000
        assert state.rss_kb - rss0 < 1000 * LEAK_KB_PER_REQUEST, (rss0, state.rss_kb)


def test_pull_relay_disconnects_do_not_pin_memory(certs, pair, lean_malloc) -> None:
    """Found by this suite: aiohttp wakes a read interrupted by close() with one module-level
    exception whose traceback grows with every raise, so each request the pull relay was
    reading when its client left stayed alive for good (~12 KB a disconnect)."""
    deep, shallow = pair
    with GatewayServer(_policy(deep, shallow), certs=certs, args=("--relay", "pull")) as gw:
        target = _target(gw)
        run_async(disconnects(target, CLIENT_KEY, 1000, concurrency=32), 90)
        rss0 = settle(gw, [deep.port, shallow.port]).rss_kb
        seen = run_async(disconnects(target, CLIENT_KEY, 1000, concurrency=32), 90)
        assert seen == {"dropped": 1000}, seen
        _wait(
            lambda: deep.stats()["running"] == 0 and deep.stats()["waiting"] == 0, 20, "engine idle"
        )
        state = _clean(gw, (deep, shallow), open_max=0)
        assert state.rss_kb - rss0 < 1000 * LEAK_KB_PER_REQUEST, (rss0, state.rss_kb)


@RELAYS
def test_sigterm_drains_open_streams(certs, pair, relay: str) -> None:
    deep, shallow = pair
    drain = 2.5
    with GatewayServer(
        _policy(deep, shallow), certs=certs, args=("--drain-timeout", str(drain), "--relay", relay)
    ) as gw:
        target = _target(gw)
        msg = [{"role": "user", "content": "Write `drain.py`."}]
        short = {"model": "coder", "stream": True, "max_tokens": 250, "messages": msg}
        long = {
            "model": "coder",
            "stream": True,
            "max_tokens": 4000,
            "ignore_eos": True,
            "messages": msg,
        }
        requests = [(KEYS[i % 2], short if i < 8 else long) for i in range(STREAMS)]
        job = Background(burst(target, requests, deadline_s=30), 40)
        _wait(
            lambda: gw.admin_get("/admin/status").json()["in_flight"] == STREAMS,
            10,
            "16 streams open",
        )
        t_term = time.monotonic()
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        late = run_async(burst(target, [(CLIENT_KEY, short)], deadline_s=10), 15)[0]
        outs: list[Outcome] = job.result()
        rc = gw.proc.wait(timeout=drain + 15)
        t_exit = time.monotonic()
    assert rc == 0, "".join(gw.output[-20:])
    assert t_exit - t_term < drain + 8
    # A new request after SIGTERM is refused (listener closed) or told to retry: never served
    # half-way.
    assert late.kind == "refused" or (late.kind == "http_error" and late.status == 503), late
    _no_loss(outs)  # each stream ends with [DONE]: complete, or an error event before it
    shorts, longs = outs[:8], outs[8:]
    assert all(o.kind == "ok" for o in shorts), [(o.kind, o.detail) for o in shorts]
    for o in longs:
        assert o.kind == "error_event" and "shutting down" in o.detail, o
        assert o.t1 - t_term < drain + 2, o


def test_memory_and_connections_stay_flat_over_repeated_rounds(certs, pair, lean_malloc) -> None:
    """Rounds of 16 streams with a death mid-stream (continued) and 300 client disconnects,
    each followed by a settle. Over plain HTTP on loopback, so that RSS follows live objects
    rather than TLS buffers (see lean_malloc; TLS churn is bounded by the 1,000-disconnect
    test above)."""
    deep, shallow = pair
    with GatewayServer(_policy(deep, shallow, continuation=True), certs=certs, insecure=True) as gw:
        target = _target(gw)
        rounds: list[Settled] = []
        outs: list[Outcome] = []
        for i in range(9):
            load = Load(target, KEYS, workers=STREAMS, deadline_s=20).start()
            try:
                _wait(lambda: deep.stats()["running"] >= STREAMS // 4, 10, "streams on deep")
                died = metric_sum(gw.metrics(), "specrouter_continuations_total")
                deep.fault("die_mid_stream", after_chunks=4 + i)
                t_fault = time.monotonic()
                _wait(
                    lambda d=died: metric_sum(gw.metrics(), "specrouter_continuations_total") > d,
                    10,
                    "a death mid-stream, continued",
                )
                # The deaths of a round are what its 0.3 s of fault kills, as before: no fewer.
                time.sleep(max(0.0, t_fault + 0.3 - time.monotonic()))
                deep.clear_faults()
                seen = run_async(disconnects(target, OTHER_KEY, 300, concurrency=32), 60)
                assert seen == {"dropped": 300}, seen
            finally:
                outs += load.stop()
            rounds.append(_clean(gw, (deep, shallow)))
        _only_on(outs, "deep")
        rss = [r.rss_kb for r in rounds]
        fds = [r.fds for r in rounds]
        conns = [r.established() for r in rounds]
        # After three rounds of warm-up, six rounds (~2,000 requests): what may still grow is
        # bounded (the request log's SQLite page cache, 2 MiB; the health scrape window); a
        # request's objects kept alive (~12 KB) would add 20 MB.
        assert rss[-1] - rss[2] < 6144, rss
        assert max(fds[3:]) <= max(fds[:3]) + 4, fds
        assert max(conns[3:]) <= max(conns[:3]) + 4, conns


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_a_request_on_a_dead_only_backend_gets_a_clear_error(certs, pair, stream: bool) -> None:
    """With no variant left, the client is told so at once: a 502/503 with Retry-After."""
    deep, shallow = pair
    doc = coder_policy({"deep": deep.url})
    doc["backends"]["deep"]["startup_s"] = 0
    with GatewayServer(doc, certs=certs) as gw:
        deep.kill()
        body = {
            "model": "coder",
            "stream": stream,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
        }
        out = run_async(burst(_target(gw), [(CLIENT_KEY, body)], deadline_s=10), 15)[0]
        assert out.kind == "http_error" and out.status in (502, 503), out
        assert out.retry_after, out
        assert re.search(r"specrouter_in_flight\{[^}]*\} 0\.0", gw.metrics())


def test_http_layer_refusals_are_openai_errors(certs, pair) -> None:
    """Found by the soak's bad inputs: the HTTP layer's own refusals (431 here, 408 for slow
    headers) were raw responses with an empty body."""
    deep, shallow = pair
    with GatewayServer(_policy(deep, shallow), certs=certs) as gw:
        target = _target(gw)
        request = target.request(
            "/v1/chat/completions", b"{}", CLIENT_KEY, headers=[("x-pad", "a" * 100_000)]
        )

        async def send() -> tuple[int, str, bytes]:
            conn = await Conn.open(target)
            try:
                reply = await conn.exchange(request)
            finally:
                await conn.close()
            return reply.status, reply.headers.get("content-type", ""), bytes(reply.body)

        status, content_type, body = run_async(send(), 15)
        assert status == 431
        assert content_type.startswith("application/json"), (content_type, body)
        assert orjson.loads(body)["error"]["message"]
