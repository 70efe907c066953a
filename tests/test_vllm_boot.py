"""loadtests/harness/vllm_boot.py's order: one boot at a time, in the order given, at most
`at_once` not yet done, a taken server first, a failure raised where the server is taken.
Stand-in servers (no process): a real vLLM boot costs a minute, and tests/engines/vllm* boot
the real ones through the same Boot."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from loadtests.harness.vllm import VllmServer
from loadtests.harness.vllm_boot import Boot


class FakeServer(VllmServer):
    """Spawned and stopped in memory; healthy when the test says so."""

    def __init__(self, key: str, log: list[str], gate: threading.Event) -> None:
        super().__init__(home=None, kind=key)  # type: ignore[arg-type]
        self.key, self.log, self.gate = key, log, gate
        self.up = False

    def spawn(self, *, keep_port: bool = False) -> None:
        self.log.append(f"spawn {self.key}")
        self.up = True

    def wait_healthy(self) -> None:
        self.gate.wait(10)
        if self.key == "bad":
            raise RuntimeError("vLLM (bad) exited while starting")

    def stop(self) -> None:
        if self.up:
            self.log.append(f"stop {self.key}")
        self.up = False

    def alive(self) -> bool:
        return self.up


def boot(keys: str, at_once: int) -> tuple[Boot, list[str], dict[str, threading.Event]]:
    log: list[str] = []
    gates = {key: threading.Event() for key in keys}

    def maker(key: str) -> Any:
        return lambda: FakeServer(key, log, gates[key])

    makers = {key: maker(key) for key in keys}
    if "x" in keys:  # a failure
        makers["x"] = lambda: FakeServer("bad", log, gates["x"])
    return Boot(makers, at_once=at_once), log, gates


def test_one_at_a_time_in_order_and_at_most_at_once() -> None:
    b, log, gates = boot("abc", at_once=2)
    b.start("abc")
    gates["a"].set()
    assert b.take("a").alive()
    gates["b"].set()
    assert b.take("b").alive()
    assert log == ["spawn a", "spawn b"]  # c waits: two not done
    b.done("a")
    gates["c"].set()
    assert b.take("c").alive()
    assert log == ["spawn a", "spawn b", "stop a", "spawn c"]
    b.close()
    assert sorted(log[4:]) == ["stop b", "stop c"]


def test_a_server_taken_before_its_turn_boots_next() -> None:
    b, log, gates = boot("abc", at_once=1)
    b.start("abc")
    gates["a"].set()
    b.take("a")  # a not done: the cap holds b and c back, but c is asked for
    gates["c"].set()
    assert b.take("c").alive()
    assert log == ["spawn a", "spawn c"]
    b.close()


def test_a_failed_boot_is_raised_where_it_is_taken_and_the_next_boots() -> None:
    b, log, gates = boot("xa", at_once=3)
    b.start("xa")
    gates["x"].set()
    gates["a"].set()
    with pytest.raises(RuntimeError, match=r"vLLM \(x\) did not start"):
        b.take("x")
    assert b.take("a").alive()
    b.close()


def test_after_close_nothing_boots() -> None:
    b, log, gates = boot("ab", at_once=1)
    b.start("ab")
    gates["a"].set()
    b.take("a")
    b.close()
    with pytest.raises(RuntimeError, match=r"vLLM \(b\) did not start"):
        b.take("b")
    assert log == ["spawn a", "stop a"]


def test_servers_waited_for_together_boot_side_by_side() -> None:
    b, log, gates = boot("abc", at_once=3)
    b.want("a", "b")
    deadline = time.monotonic() + 10
    while log != ["spawn a", "spawn b"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log == ["spawn a", "spawn b"]  # b spawned before a is healthy; c not yet
    gates["a"].set()
    gates["b"].set()
    assert b.take("a").alive() and b.take("b").alive()
    b.close()
