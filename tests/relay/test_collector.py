"""The collector's pause (proxy/relay/collector.py): overlapping pauses resume it once, only if
it was on, and a request's tree is freed, with its pause ended, when the request first waits."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from proxy.relay.collector import Pause


class Node:
    """A container stand-in that a weak reference can watch."""


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


# (collector on at the start, steps, collector on after each step)
CASES = [
    (True, "b e", [False, True]),
    (True, "b b e e", [False, False, False, True]),
    (True, "b e b e", [False, True, False, True]),
    (False, "b e", [False, False]),
    (False, "b b e e", [False, False, False, False]),
]


@pytest.mark.parametrize(("on", "steps", "after"), CASES, ids=[c[1] + f" on={c[0]}" for c in CASES])
def test_pauses_overlap_and_resume_the_collector_once(
    collector_on: None, on: bool, steps: str, after: list[bool]
) -> None:
    if not on:
        gc.disable()
    pause = Pause()
    seen = []
    for step in steps.split():
        pause.begin() if step == "b" else pause.end()
        seen.append(gc.isenabled())
    assert seen == after
    assert pause.open == 0


async def test_the_tree_is_freed_and_the_pause_ended_when_the_request_first_waits(
    collector_on: None,
) -> None:
    pause = Pause()
    node = Node()
    watch = weakref.ref(node)
    pause.begin()
    tree: list[object] = [[node]]
    del node
    pause.end_when_waiting(tree)
    # the rest of the request's synchronous path (the engine write) runs with both
    assert watch() is not None and not gc.isenabled()
    await asyncio.sleep(0)
    assert watch() is None and tree == []
    assert gc.isenabled() and pause.open == 0


async def test_the_collector_resumes_once_the_last_open_pause_ends(collector_on: None) -> None:
    pause = Pause()

    async def request(tree: list[object]) -> None:
        pause.begin()
        pause.end_when_waiting(tree)
        await asyncio.sleep(0)

    a: list[object] = [[1]]
    b: list[object] = [[2]]
    pause.begin()  # a third request, still parsing
    await asyncio.gather(request(a), request(b))
    assert a == [] and b == []
    assert not gc.isenabled()  # the third's pause is still open
    pause.end()
    assert gc.isenabled() and pause.open == 0
