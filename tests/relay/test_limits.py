"""Per-client limits, in process and in a real Redis shared by gateway replicas."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import pytest
import yaml

from loadtests.harness.gateway import ADMIN_TOKEN, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from proxy.relay.limits import MemoryLimits, RedisLimits


@pytest.fixture(params=["memory", "redis"])
async def limits(request, redis_url):
    lim = MemoryLimits() if request.param == "memory" else RedisLimits(redis_url)
    yield lim
    await lim.aclose()


async def test_concurrent_limit(limits) -> None:
    assert await limits.enter("a", 2, None) is None
    assert await limits.enter("a", 2, None) is None
    assert await limits.enter("a", 2, None) is not None
    assert await limits.enter("b", 2, None) is None  # per client
    await limits.leave("a")
    assert await limits.enter("a", 2, None) is None


async def test_requests_per_minute_allows_the_burst_then_paces(limits) -> None:
    results = [await limits.enter("c", None, 30) for _ in range(31)]
    for _ in range(30):
        await limits.leave("c")
    assert all(r is None for r in results[:30])
    wait = results[30]
    assert wait is not None and 0 < wait <= 2.0  # one request per 2 s after the burst


def test_two_replicas_share_limits_and_policy(certs, redis_url, tmp_path) -> None:
    sims = [
        SimServer(p, served_model_name="qwen3.8-27b", time_scale=0.02)
        for p in ("dflash7-prob-block", "dflash7-prob-block", "mtp3", "mtp3")
    ]
    for s in sims:
        s.__enter__()
    try:
        policy = coder_policy({"deep": sims[0].url, "shallow": sims[2].url})
        policy["backends"]["deep"] = {
            "urls": [sims[0].url, sims[1].url],
            "served_model_name": "qwen3.8-27b",
        }
        policy["backends"]["shallow"] = {
            "urls": [sims[2].url, sims[3].url],
            "served_model_name": "qwen3.8-27b",
        }
        policy["clients"][0]["requests_per_minute"] = 20
        shared = tmp_path / "policy.yaml"
        shared.write_text(yaml.safe_dump(policy, sort_keys=False))
        args = ("--redis-url", redis_url)
        with (
            GatewayServer(policy_path=shared, certs=certs, args=args) as g1,
            GatewayServer(policy_path=shared, certs=certs, args=args) as g2,
        ):
            # The limit holds across both: 20 per minute in all, not 20 each.
            codes: Counter[int] = Counter()
            for i in range(30):
                gw = (g1, g2)[i % 2]
                with gw.client() as c:
                    r = c.post(
                        "/v1/chat/completions",
                        json={
                            "model": "coder",
                            "max_tokens": 1,
                            "messages": [{"role": "user", "content": f"q{i}"}],
                        },
                    )
                codes[r.status_code] += 1
                if r.status_code == 429:
                    assert int(r.headers["retry-after"]) >= 1
                    assert r.headers["x-should-retry"] == "true"
            assert codes == {200: 20, 429: 10}

            # A policy change through one replica reaches the other (the shared file).
            with httpx.Client(
                base_url=g1.admin, timeout=10, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}
            ) as admin:
                current = admin.get("/admin/policy")
                doc = current.json()["document"]
                doc["clients"][0]["requests_per_minute"] = None
                doc["routes"]["coder"]["defaults"] = {"temperature": 0.55}
                r = admin.put(
                    "/admin/policy",
                    content=yaml.safe_dump(doc),
                    headers={"if-match": current.headers["etag"]},
                )
                assert r.status_code == 200
                version = r.json()["version"]
            deadline = time.monotonic() + 10
            while g2.admin_get("/admin/status").json()["policy_version"] != version:
                assert time.monotonic() < deadline, "the change did not reach replica 2"
                time.sleep(0.1)
            with g2.client() as c:
                r = c.post(
                    "/v1/chat/completions",
                    json={
                        "model": "coder",
                        "max_tokens": 1,
                        "messages": [{"role": "user", "content": "after"}],
                    },
                )
            assert r.status_code == 200
            assert r.headers["x-specrouter-defaults"] == "temperature=0.55"

            # Killing one replica loses only its own in-flight requests.
            outcomes: dict[str, list[bool]] = {"g1": [], "g2": []}

            def stream(name: str, gw: GatewayServer, i: int) -> None:
                try:
                    with (
                        gw.client() as c,
                        c.stream(
                            "POST",
                            "/v1/chat/completions",
                            json={
                                "model": "coder",
                                "stream": True,
                                "max_tokens": 4000,
                                "messages": [{"role": "user", "content": f"s{i}"}],
                            },
                        ) as r,
                    ):
                        body = r.read()
                    outcomes[name].append(body.endswith(b"data: [DONE]\n\n"))
                except httpx.HTTPError:
                    outcomes[name].append(False)

            threads = [
                threading.Thread(target=stream, args=(n, g, i))
                for i in range(4)
                for n, g in (("g1", g1), ("g2", g2))
            ]
            for t in threads:
                t.start()
            time.sleep(0.3)
            g1.kill()
            for t in threads:
                t.join(timeout=60)
            assert outcomes["g2"] == [True] * 4
            assert len(outcomes["g1"]) == 4 and not all(outcomes["g1"])
    finally:
        for s in sims:
            s.__exit__(None, None, None)
