"""Deadlines: asyncio.timeout's semantics on one timer for many waits."""

from __future__ import annotations

import asyncio

import pytest

from backends.fleet.deadlines import Deadlines


async def test_a_wait_past_its_time_raises_timeout_error_and_one_in_time_does_not() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    started_s = loop.time()
    with pytest.raises(TimeoutError), deadlines.limit(0.05):
        await asyncio.sleep(5)
    assert 0.04 <= loop.time() - started_s < 1.0
    with deadlines.limit(5.0):
        await asyncio.sleep(0.01)  # in time: nothing raised, nothing left behind
    assert len(deadlines) == 0


async def test_many_waits_of_different_lengths_each_end_at_their_own_time() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    started_s = loop.time()
    ended: dict[str, float] = {}

    async def wait(name: str, timeout_s: float, sleep_s: float) -> None:
        try:
            with deadlines.limit(timeout_s):
                await asyncio.sleep(sleep_s)
            ended[name] = -1.0  # finished in time
        except TimeoutError:
            ended[name] = loop.time() - started_s

    # The long group's first wait is armed first; the short group joins later and must not
    # wait for the long one's deadline.
    await asyncio.gather(wait("long", 0.6, 5), wait("quick", 0.3, 0.01),
                         wait("short", 0.1, 5), wait("short2", 0.1, 5))
    assert ended["quick"] == -1.0
    assert 0.09 <= ended["short"] < 0.45 and 0.09 <= ended["short2"] < 0.45
    assert 0.55 <= ended["long"] < 1.5
    assert len(deadlines) == 0


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    deadlines = Deadlines()

    async def wait() -> None:
        with deadlines.limit(5.0):
            await asyncio.sleep(5)

    task = asyncio.create_task(wait())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(deadlines) == 0


async def test_a_timeout_while_the_task_is_also_cancelled_stays_a_cancellation() -> None:
    deadlines = Deadlines()

    async def wait() -> None:
        with deadlines.limit(0.05):
            try:
                await asyncio.sleep(5)
            finally:
                await asyncio.sleep(0.1)  # cleanup outlasting the deadline

    task = asyncio.create_task(wait())
    await asyncio.sleep(0.01)
    task.cancel()  # the client left first; the deadline passes during the cleanup
    with pytest.raises(asyncio.CancelledError):
        await task
