"""The first-byte deadlines on one timer (proxy/relay/deadlines.py): which waits they end,
told apart from other cancellations, and what the queue keeps."""

from __future__ import annotations

import asyncio

import pytest

from proxy.relay.deadlines import Deadline, Deadlines


class TimedOut(Exception):
    pass


async def _wait(deadlines: Deadlines, done: asyncio.Future[None]) -> str:
    """The way the push relay waits: its deadline started, ended in `finally`."""
    deadline = deadlines.start()
    try:
        await done
        return "answered"
    except asyncio.CancelledError:
        if not deadlines.expired(deadline):
            raise
        raise TimedOut from None
    finally:
        deadlines.end(deadline)


@pytest.mark.parametrize(
    ("answered", "outcome"),
    [
        (0.0, "answered"),  # in time
        (None, "timed out"),  # never: the deadline ends the wait
    ],
)
async def test_a_wait_ends_by_its_answer_or_its_deadline(
    answered: float | None, outcome: str
) -> None:
    deadlines = Deadlines(0.05)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    if answered is not None:
        loop.call_later(answered, done.set_result, None)
    task = asyncio.create_task(_wait(deadlines, done))
    try:
        got = await task
    except TimedOut:
        got = "timed out"
    assert got == outcome
    assert not task.cancelling()  # the deadline's cancel taken back: the task is clean
    assert len(deadlines) == 0
    deadlines.close()


async def test_waits_started_one_after_the_other_end_each_at_its_own_deadline() -> None:
    deadlines = Deadlines(0.08)
    loop = asyncio.get_running_loop()
    ended: list[tuple[int, float]] = []

    async def one(i: int) -> None:
        t0 = loop.time()
        with pytest.raises(TimedOut):  # a future each: a task's cancel cancels what it awaits
            await _wait(deadlines, loop.create_future())
        ended.append((i, loop.time() - t0))

    tasks = []
    for i in range(3):
        tasks.append(asyncio.create_task(one(i)))
        await asyncio.sleep(0.03)
    await asyncio.gather(*tasks)
    assert [i for i, _ in ended] == [0, 1, 2]
    assert all(waited >= 0.08 - 0.002 for _, waited in ended)  # none ended before its time
    assert len(deadlines) == 0
    deadlines.close()


async def test_an_answered_wait_in_front_does_not_hold_back_the_next_deadline() -> None:
    deadlines = Deadlines(0.05)
    loop = asyncio.get_running_loop()
    first: asyncio.Future[None] = loop.create_future()
    never: asyncio.Future[None] = loop.create_future()
    a = asyncio.create_task(_wait(deadlines, first))
    await asyncio.sleep(0.01)
    b = asyncio.create_task(_wait(deadlines, never))
    await asyncio.sleep(0)
    first.set_result(None)
    assert await a == "answered"
    with pytest.raises(TimedOut):
        await b
    deadlines.close()


async def test_another_cancellation_goes_on_even_when_the_deadline_fired_too() -> None:
    """The client left (the disconnect watch cancels the task) in the loop turn the deadline
    fired: the task sees a cancellation, not a timeout, and ends cancelled."""
    deadlines = Deadlines(0.02)
    loop = asyncio.get_running_loop()
    never: asyncio.Future[None] = loop.create_future()
    started: list[Deadline] = []

    async def waiter() -> str:
        deadline = deadlines.start()
        started.append(deadline)
        try:
            await never
            return "answered"
        except asyncio.CancelledError:
            if not deadlines.expired(deadline):
                raise
            return "timed out"
        finally:
            deadlines.end(deadline)

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    # due with the deadline's timer: both cancel before the task runs again, in either order
    loop.call_at(started[0].at, task.cancel)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert started[0].fired and task.cancelled()
    deadlines.close()


async def test_a_plain_cancellation_is_not_a_timeout() -> None:
    deadlines = Deadlines(10.0)
    loop = asyncio.get_running_loop()
    never: asyncio.Future[None] = loop.create_future()
    task = asyncio.create_task(_wait(deadlines, never))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(deadlines) == 0  # ended in `finally`
    deadlines.close()


async def test_the_queue_keeps_no_task_and_empties_once_the_oldest_ends() -> None:
    deadlines = Deadlines(10.0)
    loop = asyncio.get_running_loop()
    gates = [loop.create_future() for _ in range(4)]
    tasks = [asyncio.create_task(_wait(deadlines, g)) for g in gates]
    await asyncio.sleep(0)
    assert len(deadlines) == 4
    for g in gates[1:]:  # the newer ones end first: kept behind the oldest, without a task
        g.set_result(None)
    await asyncio.gather(*tasks[1:])
    assert len(deadlines) == 4
    gates[0].set_result(None)
    await tasks[0]
    assert len(deadlines) == 0
    deadlines.close()


def test_one_set_of_deadlines_serves_one_event_loop_after_another() -> None:
    """A timer armed on a loop that ended never fires: the next loop arms its own."""
    deadlines = Deadlines(0.02)

    async def never_answered() -> str:
        loop = asyncio.get_running_loop()
        try:
            return await _wait(deadlines, loop.create_future())
        except TimedOut:
            return "timed out"

    async def armed_then_left() -> None:
        deadline = deadlines.start()  # arms the timer on this loop, which then ends
        deadlines.end(deadline)

    asyncio.run(armed_then_left())
    assert asyncio.run(never_answered()) == "timed out"
    deadlines.close()
