"""A session keeps its engine across ten turns while other traffic moves the load rule's choice:
by the agent's header, and headerless by the prefix fingerprint. Two simulated variants behind
the real gateway."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.sim import SimServer

SERVED = "qwen3.8-27b"
# deep while the route holds at most two sequences, else shallow: the load decides per request
RULES = [
    {
        "name": "deep-when-quiet",
        "kind": "load",
        "use": "deep",
        "max_in_flight": 2,
        "scope": "route",
        "otherwise": "shallow",
    }
]


@pytest.fixture
def gw(certs) -> Iterator[GatewayServer]:
    with (
        SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.05) as deep,
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.05) as shallow,
        GatewayServer(
            coder_policy({"deep": deep.url, "shallow": shallow.url}, rules=RULES), certs=certs
        ) as server,
    ):
        yield server


class Load:
    """Three long streams from other conversations while on: the route is busy."""

    def __init__(self, gw: GatewayServer) -> None:
        self.gw, self.stop, self.threads = gw, threading.Event(), list[threading.Thread]()

    def on(self) -> None:
        self.stop.clear()
        for i in range(3):
            t = threading.Thread(target=self._stream, args=(i,))
            t.start()
            self.threads.append(t)
        _wait(lambda: self.gw.admin_get("/admin/status").json()["in_flight"] >= 3)

    def off(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)
        self.threads.clear()
        _wait(lambda: self.gw.admin_get("/admin/status").json()["in_flight"] == 0)

    def _stream(self, i: int) -> None:
        with (
            self.gw.client() as c,
            c.stream(
                "POST",
                "/v1/chat/completions",
                json={
                    "model": "coder",
                    "stream": True,
                    "max_tokens": 30000,  # in flight until `off` (the test's turns set the pace)
                    "messages": [{"role": "user", "content": f"Other work {i}: refactor mod{i}."}],
                },
                headers={"x-claude-code-session-id": f"other-{i}"},
            ) as r,
        ):
            for _ in r.iter_raw():
                # paced: three threads reading every chunk starved this process's others
                if self.stop.wait(0.05):
                    break


def _wait(predicate, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def _ten_turns(
    gw: GatewayServer, load: Load, headers: dict[str, str], busy_turns: set[int]
) -> list[tuple[str, str]]:
    """(variant, reason) per turn; the load is on during `busy_turns`."""
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in src/app.py."},
    ]
    served = []
    with gw.client() as c:
        for turn in range(10):
            busy = turn in busy_turns
            if busy and not load.threads:
                load.on()
            elif not busy and load.threads:
                load.off()
            r = c.post(
                "/v1/chat/completions",
                headers=headers,
                json={"model": "coder", "messages": messages, "max_tokens": 8},
            )
            assert r.status_code == 200, r.text
            served.append((r.headers["x-specrouter-variant"], r.headers["x-specrouter-reason"]))
            messages += [
                {
                    "role": "assistant",
                    "content": r.json()["choices"][0]["message"]["content"] or "ok",
                },
                {"role": "user", "content": f"Now step {turn + 2}."},
            ]
    load.off()
    return served


def test_header_session_keeps_its_engine_while_load_varies(gw: GatewayServer) -> None:
    load = Load(gw)
    served = _ten_turns(gw, load, {"x-claude-code-session-id": "cc-7f3a"}, {2, 3, 4, 7, 8})
    assert {v for v, _ in served} == {"deep"}, served
    assert served[0][1] == "deep-when-quiet"
    # while busy the rule said shallow: the session stayed, counted as such
    assert ("deep", "session") in served
    assert (
        'specrouter_decisions_total{reason="session",route="coder",variant="deep"}' in gw.metrics()
    )


def test_headerless_session_keeps_its_engine_by_fingerprint(gw: GatewayServer) -> None:
    load = Load(gw)
    served = _ten_turns(gw, load, {}, {0, 1, 5, 6})  # placed under load: on shallow
    assert {v for v, _ in served} == {"shallow"}, served
    assert ("shallow", "session") in served  # quiet turns: the rule said deep
