"""Several engines per variant: load-aware choice with prefix-cache locality."""

from __future__ import annotations

from collections import Counter

import pytest

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from proxy.backends.engines import EngineTable, prefix_affinity

URLS = ("http://a:1", "http://b:1", "http://c:1")


def _conv(system: str, first: str, *later: str) -> dict:
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    msgs += [{"role": "user", "content": t} for t in later]
    return {"messages": msgs}


def test_same_conversation_same_engine_and_different_ones_spread() -> None:
    eps = EngineTable()
    key = prefix_affinity(_conv("You are a coder.", "Fix main.py"))
    later = prefix_affinity(_conv("You are a coder.", "Fix main.py", "and now tests"))
    assert key == later
    assert eps.pick(URLS, key) == eps.pick(URLS, later)
    picks = Counter(eps.pick(URLS, prefix_affinity(_conv("s", f"task {i}"))) for i in range(300))
    assert set(picks) == set(URLS) and min(picks.values()) > 60


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ({"http://a:1": 0, "http://b:1": 0, "http://c:1": 0}, "preferred"),
        ({"http://a:1": 2, "http://b:1": 2, "http://c:1": 2}, "preferred"),
        # The preferred engine is clearly busier than the others: go to the least loaded.
        ({"http://a:1": 9, "http://b:1": 9, "http://c:1": 0}, "least"),
    ],
)
def test_bounded_load(loads, expected) -> None:
    eps = EngineTable()
    key = prefix_affinity({"prompt": "def f():"})
    preferred = eps.pick(URLS, key)
    for url, load in loads.items():
        eps.state(url).in_flight = load
    if expected == "least":
        for url in URLS:
            eps.state(url).in_flight = 0 if url != preferred else 9
        assert eps.pick(URLS, key) != preferred
    else:
        assert eps.pick(URLS, key) == preferred


def test_down_engines_are_skipped_and_no_affinity_means_least_loaded() -> None:
    eps = EngineTable()
    eps.state("http://a:1").up = False
    eps.state("http://b:1").in_flight = 3
    assert eps.pick(URLS, None) == "http://c:1"
    for url in URLS:
        eps.state(url).up = False
    assert eps.pick(URLS, None) in URLS  # all down: try anyway rather than refuse


def test_two_engines_behind_one_variant(certs) -> None:
    with (
        SimServer("mtp3", served_model_name="m", time_scale=0.02) as e1,
        SimServer("mtp3", served_model_name="m", time_scale=0.02) as e2,
    ):
        policy = coder_policy({"coder": e1.url}, served="m")
        policy["backends"]["coder"] = {
            "urls": [e1.url, e2.url],
            "task": "generate",
            "served_model_name": "m",
        }
        with GatewayServer(policy, certs=certs) as gw, gw.client() as c:

            def ask(i: int, turn: int = 0) -> int:
                msgs = [{"role": "user", "content": f"conversation {i}"}]
                msgs += [{"role": "assistant", "content": "ok"}] * turn
                r = c.post(
                    "/v1/chat/completions", json={"model": "m", "messages": msgs, "max_tokens": 2}
                )
                assert r.status_code == 200
                return 0

            before = (e1.stats()["requests"], e2.stats()["requests"])
            for i in range(20):
                ask(i)
            after = (e1.stats()["requests"], e2.stats()["requests"])
            assert after[0] > before[0] and after[1] > before[1]
            e2.kill()
            for i in range(20):
                ask(i, 1)  # every conversation still answered, by the engine left
