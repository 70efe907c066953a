"""The policy on loopback: two simulated coding variants behind the real gateway."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
import yaml

from loadtests.harness.gateway import ADMIN_TOKEN, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from policies.engine import canary_bucket
from policies.sessions import session_of

SERVED = "qwen3.8-27b"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def _msg(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Fix the bug in `src/mod{i}.py`."}]


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[SimServer, SimServer]]:
    with (
        SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.05) as deep,
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.05) as shallow,
    ):
        yield deep, shallow


@pytest.fixture
def pair(engines: tuple[SimServer, SimServer]) -> tuple[SimServer, SimServer]:
    """The module's two engines, alive, without faults, idle (each test its own gateway)."""
    for sim in engines:
        if sim.proc is None or sim.proc.poll() is not None:
            sim.restart()  # a test killed it
        sim.clear_faults()
    _wait(lambda: all(s.stats()["running"] == 0 and s.stats()["waiting"] == 0 for s in engines))
    return engines


def _variant(c: httpx.Client, i: int = 0, **extra) -> httpx.Response:
    r = c.post(
        "/v1/chat/completions",
        json={"model": "coder", "messages": _msg(i), "max_tokens": 4, **extra},
    )
    assert r.status_code == 200, r.text
    return r


def _hold_streams(gw: GatewayServer, n: int, stop: threading.Event) -> list[threading.Thread]:
    """n long streams, open until `stop` (bounded by max_tokens anyway)."""

    def run(i: int) -> None:
        with (
            gw.client() as c,
            c.stream(
                "POST",
                "/v1/chat/completions",
                json={"model": "coder", "messages": _msg(i), "stream": True, "max_tokens": 3000},
            ) as r,
        ):
            for _ in r.iter_raw():
                if stop.is_set():
                    break

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
        time.sleep(0.05)  # staggered, as agents arrive
    return threads


def _wait(predicate, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_load_rule_moves_traffic_when_concurrency_crosses_n(certs, pair) -> None:
    deep, shallow = pair
    rules = [
        {
            "name": "deep-when-quiet",
            "kind": "load",
            "use": "deep",
            "max_in_flight": 2,
            "scope": "route",
            "otherwise": "shallow",
        }
    ]
    with (
        GatewayServer(
            coder_policy({"deep": deep.url, "shallow": shallow.url}, rules=rules), certs=certs
        ) as gw,
        gw.client() as c,
    ):
        r = _variant(c)
        assert (r.headers["x-specrouter-variant"], r.headers["x-specrouter-reason"]) == (
            "deep",
            "deep-when-quiet",
        )
        stop = threading.Event()
        threads = _hold_streams(gw, 3, stop)
        try:
            _wait(lambda: gw.admin_get("/admin/status").json()["in_flight"] >= 3)
            r = _variant(c, 1)
            assert r.headers["x-specrouter-variant"] == "shallow"
            assert r.headers["x-specrouter-reason"] == "deep-when-quiet"
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        _wait(lambda: gw.admin_get("/admin/status").json()["in_flight"] == 0)
        assert _variant(c, 2).headers["x-specrouter-variant"] == "deep"
        assert (
            'specrouter_decisions_total{reason="deep-when-quiet",route="coder",'
            'variant="shallow"}' in gw.metrics()
        )


def test_acceptance_collapse_diverts_then_recovers(certs, pair) -> None:
    deep, shallow = pair
    rules = [
        {
            "name": "deep-acceptance",
            "kind": "acceptance_guard",
            "variant": "deep",
            "below": 2.5,
            "for_s": 0.5,
            "recover_above": 3.0,
            "recover_for_s": 0.5,
            "probe_after_s": 1.5,
            "window_s": 1.5,
            "fallback": "shallow",
        }
    ]
    with (
        GatewayServer(
            coder_policy({"deep": deep.url, "shallow": shallow.url}, rules=rules), certs=certs
        ) as gw,
        gw.client() as c,
    ):
        assert _variant(c).headers["x-specrouter-variant"] == "deep"
        deep.fault("acceptance_collapse", factor=0.05)
        seen: list[str] = []

        def diverted() -> bool:
            r = c.post(
                "/v1/chat/completions",
                json={"model": "coder", "messages": _msg(0), "max_tokens": 60},
            )
            seen.append(r.headers["x-specrouter-variant"])
            return r.headers["x-specrouter-variant"] == "shallow"

        _wait(diverted, timeout=20)
        r = _variant(c)
        assert r.headers["x-specrouter-reason"] == "deep-acceptance"
        assert "deep" in seen  # it served until the guard saw the collapse
        deep.clear_faults()

        def back() -> bool:
            r = c.post(
                "/v1/chat/completions",
                json={"model": "coder", "messages": _msg(0), "max_tokens": 60},
            )
            return (
                r.headers["x-specrouter-variant"] == "deep"
                and r.headers["x-specrouter-reason"] != "deep-acceptance"
            )

        _wait(back, timeout=30)


def test_killed_backend_fails_over_without_client_errors(certs, pair) -> None:
    deep, shallow = pair
    with GatewayServer(coder_policy({"deep": deep.url, "shallow": shallow.url}), certs=certs) as gw:
        statuses: Counter[int] = Counter()
        served: Counter[str] = Counter()
        stop = threading.Event()

        def client_loop(i: int) -> None:
            with gw.client() as c:
                while not stop.is_set():
                    r = c.post(
                        "/v1/chat/completions",
                        json={"model": "coder", "messages": _msg(i), "max_tokens": 8},
                    )
                    statuses[r.status_code] += 1
                    served[r.headers.get("x-specrouter-variant", "?")] += 1

        threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        deep.kill()
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert set(statuses) == {200}, statuses
        assert served["deep"] > 0 and served["shallow"] > 0


def _canary_arm(user: str, percent: float) -> str:
    """The arm the decision engine gives `user` of the harness's client (`agent`)."""
    session = session_of("agent", {"user": user}, {})
    assert session is not None
    return "shallow" if canary_bucket(session.key) * 100.0 < percent else "deep"


def test_canary_share_and_stickiness(certs, pair) -> None:
    deep, shallow = pair
    rules = [{"name": "mtp-canary", "kind": "canary", "use": "shallow", "percent": 10}]
    # The share over 1,000 users, from the engine's own bucketing (no requests needed) ...
    expected = {f"user-{i}": _canary_arm(f"user-{i}", 10) for i in range(1000)}
    share = sum(v == "shallow" for v in expected.values()) / len(expected)
    assert 0.07 <= share <= 0.13, share
    # ... and the gateway puts every user where that bucketing says, twice (sticky).
    asked = [f"user-{i}" for i in range(0, 1000, 10)]
    assert {expected[u] for u in asked} == {"deep", "shallow"}
    with (
        GatewayServer(
            coder_policy({"deep": deep.url, "shallow": shallow.url}, rules=rules), certs=certs
        ) as gw,
        gw.client() as c,
    ):
        for _ in range(2):
            for n, user in enumerate(asked):
                r = _variant(c, n, max_tokens=1, user=user)
                assert r.headers["x-specrouter-variant"] == expected[user], user
        canary = next(u for u in asked if expected[u] == "shallow")
        assert (
            _variant(c, 0, max_tokens=1, user=canary).headers["x-specrouter-reason"] == "mtp-canary"
        )


def test_policy_changes_under_load_lose_nothing(certs, pair) -> None:
    deep, shallow = pair
    policy = coder_policy({"deep": deep.url, "shallow": shallow.url})
    with GatewayServer(policy, certs=certs) as gw:
        failures: list[str] = []
        done = Counter[str]()
        stop = threading.Event()

        def stream_loop(i: int) -> None:
            with gw.client() as c:
                while not stop.is_set():
                    with c.stream(
                        "POST",
                        "/v1/chat/completions",
                        json={
                            "model": "coder",
                            "messages": _msg(i),
                            "stream": True,
                            "max_tokens": 40,
                        },
                    ) as r:
                        body = r.read()
                    if (
                        r.status_code != 200
                        or not body.endswith(b"data: [DONE]\n\n")
                        or b'"error"' in body
                    ):
                        failures.append(f"{r.status_code} {body[-200:]!r}")
                    done["ok"] += 1

        threads = [threading.Thread(target=stream_loop, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        versions = set()
        with httpx.Client(base_url=gw.admin, headers=ADMIN, timeout=10) as admin:
            for n in range(50):
                current = admin.get("/admin/policy")
                doc = current.json()["document"]
                doc["routes"]["coder"]["defaults"] = {"temperature": 0.6 + (n % 2) / 10}
                doc["routes"]["coder"]["variants"] = (
                    ["deep", "shallow"] if n % 3 else ["shallow", "deep"]
                )
                r = admin.put(
                    "/admin/policy",
                    content=yaml.safe_dump(doc),
                    headers={"if-match": current.headers["etag"]},
                )
                assert r.status_code == 200, r.text
                versions.add(r.json()["version"])
                time.sleep(0.02)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert failures == []
        assert done["ok"] >= 16
        history = gw.admin_get("/admin/policy/history").json()["history"]
        assert len(history) == 51


def test_concurrent_puts_and_invalid_put_on_loopback(certs, pair) -> None:
    deep, shallow = pair
    with GatewayServer(coder_policy({"deep": deep.url, "shallow": shallow.url}), certs=certs) as gw:
        with httpx.Client(base_url=gw.admin, headers=ADMIN, timeout=10) as admin:
            current = admin.get("/admin/policy")
            etag, doc = current.headers["etag"], current.json()["document"]
            results: list[int] = []

            def put(t: float) -> None:
                d = {
                    **doc,
                    "routes": {"coder": {**doc["routes"]["coder"], "defaults": {"temperature": t}}},
                }
                with httpx.Client(base_url=gw.admin, headers=ADMIN, timeout=10) as own:
                    results.append(
                        own.put(
                            "/admin/policy", content=yaml.safe_dump(d), headers={"if-match": etag}
                        ).status_code
                    )

            threads = [threading.Thread(target=put, args=(t,)) for t in (0.5, 0.6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(results) == [200, 412]
            before = admin.get("/admin/policy")
            file_before = gw.policy_path.read_bytes()
            bad = {**doc, "routes": {"coder": {**doc["routes"]["coder"], "variants": ["gone"]}}}
            r = admin.put(
                "/admin/policy",
                content=yaml.safe_dump(bad),
                headers={"if-match": before.headers["etag"]},
            )
            assert r.status_code == 422 and "gone" in r.json()["error"]["message"]
            after = admin.get("/admin/policy")
            assert after.headers["etag"] == before.headers["etag"]
            assert gw.policy_path.read_bytes() == file_before
