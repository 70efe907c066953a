"""The admission queue: limits, round robin between clients, timeouts, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from proxy.backends.admission import Admission, AdmissionTimeout


async def test_fast_path_until_the_limit() -> None:
    adm = Admission()
    for _ in range(3):
        await adm.acquire("b", 3, "x", 1.0)
    assert adm.gate("b").in_use == 3
    assert not adm.try_acquire("b", 3)


async def test_waiters_are_admitted_round_robin_between_clients() -> None:
    adm = Admission()
    await adm.acquire("b", 1, "hog", 1.0)  # the one slot is taken
    order: list[str] = []

    async def wait(client: str, tag: str) -> None:
        await adm.acquire("b", 1, client, 5.0)
        order.append(tag)

    tasks = [asyncio.create_task(wait("hog", f"hog{i}")) for i in range(4)]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(wait("polite", "polite0")))
    await asyncio.sleep(0)
    for _ in range(5):
        adm.release("b", 1)
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    # The latecomer does not wait behind the hog's whole backlog.
    assert order[:2] == ["hog0", "polite0"]
    assert order[2:] == ["hog1", "hog2", "hog3"]


async def test_timeout_leaves_the_queue_clean() -> None:
    adm = Admission()
    await adm.acquire("b", 1, "x", 1.0)
    with pytest.raises(AdmissionTimeout):
        await adm.acquire("b", 1, "y", 0.01)
    assert adm.queued("b") == 0
    adm.release("b", 1)
    assert adm.try_acquire("b", 1)


async def test_cancelled_waiter_is_forgotten_and_its_slot_not_lost() -> None:
    adm = Admission()
    await adm.acquire("b", 1, "x", 1.0)
    waiter = asyncio.create_task(adm.acquire("b", 1, "y", 5.0))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert adm.queued("b") == 0
    adm.release("b", 1)
    assert adm.gate("b").in_use == 0


async def test_cancelled_after_admission_passes_the_slot_on() -> None:
    adm = Admission()
    await adm.acquire("b", 1, "x", 1.0)
    first = asyncio.create_task(adm.acquire("b", 1, "y", 5.0))
    second = asyncio.create_task(adm.acquire("b", 1, "z", 5.0))
    await asyncio.sleep(0)
    adm.release("b", 1)  # admits `first`, whose task has not run yet
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1.0)
    assert adm.gate("b").in_use == 1
