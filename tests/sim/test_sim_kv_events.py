"""The simulator publishes KV events as vLLM does (loadtests/sim/kv_publisher.py, its prefix
cache's stores and evictions): the gateway's subscriber (proxy/backends/kv_subscriber.py)
builds from them the simulator's own cache (the same blocks), and for a session a resident
prefix that covers what that cache then serves the session's next turn (`cached_tokens`); 0.28.0's events name no session."""

from __future__ import annotations

import functools
import json
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from loadtests.harness.sim import SimServer
from loadtests.sim.prefix_cache import PrefixCache
from proxy.backends.kv_subscriber import KvSubscriber


class _Heard:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def stored(self, hashes: list[int], parent: int | None, session: str | None) -> None:
        self.events.append(("stored", list(hashes), parent, session))

    def removed(self, hashes: list[int]) -> None:
        self.events.append(("removed", list(hashes)))


def test_cache_tells_new_runs_and_evictions() -> None:
    cache = PrefixCache(4)
    heard = _Heard()
    cache.listener = heard
    cache.insert([1, 2], session="a")
    cache.insert([1, 2, 3], session="b")  # only the new block, after the one before it
    cache.insert([7], parent=3, session="b")  # an answer's blocks chain on from the prompt
    cache.insert([1, 2, 3, 7, 8], session="a")  # over capacity: the least recent goes
    assert heard.events == [
        ("stored", [1, 2], None, "a"),
        ("stored", [3], 2, "b"),
        ("stored", [7], 3, "b"),
        ("stored", [8], 7, "a"),
        ("removed", [1]),
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.01)


WORDS = " ".join(f"line {i}: def f{i}(x): return x + {i}" for i in range(60))


@pytest.mark.parametrize("version", ["0.32.0", "0.28.0"])
def test_index_from_the_sims_events_is_what_its_cache_serves(version: str) -> None:
    sub = KvSubscriber("tcp://127.0.0.1:*", f"tcp://127.0.0.1:{_free_port()}", name="sim")
    sub.start()
    assert sub.bound.wait(5)
    config = {
        "enable_kv_cache_events": True,
        "endpoint": sub.address,
        "replay_endpoint": sub.replay,
    }
    args = ("--kv-events-config", json.dumps(config), "--enable-prompt-tokens-details")
    try:
        with SimServer(
            vllm_version=version, served_model_name="m", time_scale=0.01, extra_args=args
        ) as sim:
            messages: list[dict[str, Any]] = [{"role": "system", "content": WORDS}]
            cached: list[int] = []
            resident: list[int | None] = []
            for turn in range(3):
                messages.append({"role": "user", "content": f"turn {turn}: {WORDS[: 200 * turn]}"})
                got = sub.residency("sess-A")
                resident.append(None if got is None else got.tokens)
                r = httpx.post(
                    f"{sim.url}/v1/chat/completions",
                    json={"model": "m", "messages": messages, "max_tokens": 16},
                    headers={"x-session-id": "sess-A"},
                    timeout=30,
                )
                assert r.status_code == 200, r.text
                body = r.json()
                cached.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
                messages.append(body["choices"][0]["message"])
                # the index holds the simulator cache's blocks, read from its events alone,
                # before the next turn is sent
                blocks = set(httpx.get(f"{sim.url}/_sim/blocks", timeout=5).json()["blocks"])
                _until(functools.partial(lambda b: set(sub.index.parent) == b, blocks))
            if version == "0.28.0":
                assert resident == [None, None, None]  # untagged: no session's chain
            else:
                assert resident[0] is None and cached[0] == 0
                # what the index says is resident is what the next turn found cached, up to
                # the answer's last blocks: a cut answer is hashed without the end marker the
                # template then writes (as vLLM hashes the generated tokens), so the next
                # prompt may not match them (16 tokens: at most 2 blocks)
                for held, c in zip(resident[1:], cached[1:], strict=True):
                    assert held is not None and c <= held <= c + 32
                assert cached[2] > cached[1] > 0
    finally:
        sub.stop()
