"""The shared idle tick of the MPI progress tasks: who wakes, who stays parked, and that the
timer is shared, disarmed when nobody is idle, and closed by its last user."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from asynccomm.transports._ticker import BUSY_PERIOD, BUSY_SAFETY, Ticker

#: No test here needs more than a few ticks; this bounds each wait.
LIMIT = 5.0


class Idler:
    """Says it has work from its ``busy_after``-th poll on."""

    def __init__(self, busy_after: int) -> None:
        self.busy_after = busy_after
        self.polls = 0
        self.fut: asyncio.Future[None] | None = None
        self.wake_itself = False

    def poll_idle(self) -> bool:
        self.polls += 1
        if self.wake_itself and self.fut is not None:  # as a send from inside a poll does
            self.fut.set_result(None)
        return self.polls >= self.busy_after


@pytest.fixture
async def ticker() -> AsyncIterator[Ticker]:
    ticker = Ticker.for_loop(asyncio.get_running_loop())
    yield ticker
    ticker.release()


async def test_wakes_when_its_poll_says_so(ticker: Ticker) -> None:
    idler = Idler(busy_after=3)
    async with asyncio.timeout(LIMIT):
        await ticker.park(idler)
    assert idler.polls == 3 or ticker._fd < 0  # no timerfd: woken by the fallback sleep


async def test_one_idler_waking_leaves_the_other_parked(ticker: Ticker) -> None:
    if ticker._fd < 0:
        pytest.skip("no timerfd here")
    quick, slow = Idler(busy_after=1), Idler(busy_after=10**9)
    slow_fut = ticker.park(slow)
    async with asyncio.timeout(LIMIT):
        await ticker.park(quick)
    assert not slow_fut.done()
    assert slow.polls >= 1
    slow_fut.cancel()  # cancelling unparks: the ticker drops it at its next tick


async def test_a_poll_that_wakes_its_own_future_is_fine(ticker: Ticker) -> None:
    idler = Idler(busy_after=10**9)
    idler.wake_itself = True
    idler.fut = ticker.park(idler)
    async with asyncio.timeout(LIMIT):
        await idler.fut
    assert ticker._waiters == [] or ticker._fd < 0


async def test_disarmed_when_nobody_is_idle(ticker: Ticker,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    if ticker._fd < 0:
        pytest.skip("no timerfd here")
    disarmed = asyncio.get_running_loop().create_future()
    real = ticker._set

    def spy(spec: object) -> None:
        real(spec)  # type: ignore[arg-type]
        if spec is ticker._stop and not disarmed.done():
            disarmed.set_result(None)

    monkeypatch.setattr(ticker, "_set", spy)
    async with asyncio.timeout(LIMIT):
        await ticker.park(Idler(busy_after=1))
        await disarmed  # the next tick found nobody parked
    assert not ticker._armed


async def test_shared_per_loop_and_closed_by_the_last_user() -> None:
    loop = asyncio.get_running_loop()
    first = Ticker.for_loop(loop)
    second = Ticker.for_loop(loop)
    assert first is second
    fd = first._fd
    first.release()
    assert first._fd == fd
    second.release()
    assert first._fd == -1
    third = Ticker.for_loop(loop)
    try:
        assert third is not first
    finally:
        third.release()


async def test_a_tick_that_fell_due_during_a_long_poll_waits_for_the_tasks_it_woke(
        ticker: Ticker) -> None:
    """A progress task at work holds the loop for a long MPI call (a large message's copy),
    then wakes the task waiting for that message and yields.  The tick that fell due
    meanwhile (no task at work polled the parked ones) polls them only after the woken
    task has run: under uvloop a reader's callback runs before the callbacks already
    ready, and the polls (several microseconds after a long copy) used to come between
    the wake-up and the task."""
    if ticker._fd < 0:
        pytest.skip("no timerfd here")
    loop = asyncio.get_running_loop()
    order: list[str] = []
    polled = asyncio.Event()

    class Recording(Idler):
        def poll_idle(self) -> bool:
            order.append("poll")
            polled.set()
            return super().poll_idle()

    worker = Ticker.for_loop(loop)  # a second user, at work: the tick is the busy one
    try:
        parked = ticker.park(Recording(busy_after=10**9))
        assert ticker._spec is ticker._busy
        woken = loop.create_future()

        async def waiter() -> None:
            await woken
            order.append("woken")

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)  # it waits
        order.clear()
        polled.clear()
        end = time.perf_counter() + 1.5 * BUSY_SAFETY  # the long call: a tick falls due
        while time.perf_counter() < end:
            pass
        woken.set_result(None)
        async with asyncio.timeout(LIMIT):
            await task
            await polled.wait()  # the tick still polls, a turn later
        assert order[0] == "woken"
        parked.cancel()
    finally:
        worker.release()


async def test_a_task_at_work_polls_the_parked_ones_and_the_tick_leaves_them_to_it(
        ticker: Ticker) -> None:
    """While a task is at work it polls the parked ones when ``due`` has passed (each
    ``BUSY_PERIOD``); the tick, slowed to ``BUSY_SAFETY``, then polls nothing itself."""
    if ticker._fd < 0:
        pytest.skip("no timerfd here")
    loop = asyncio.get_running_loop()
    worker = Ticker.for_loop(loop)
    try:
        idler = Idler(busy_after=10**9)
        parked = ticker.park(idler)
        assert ticker._spec is ticker._busy
        polled = 0
        end = time.perf_counter() + 1.5 * BUSY_SAFETY  # past the tick, polling when due
        while (now := time.perf_counter()) < end:
            if now >= ticker.due:
                ticker.poll_parked(now)
                polled += 1
                assert ticker.due == now + BUSY_PERIOD
        assert polled >= 1 and idler.polls == polled  # (a loaded machine: fewer polls)
        ticker.poll_parked(last := time.perf_counter())  # (just polled: the tick finds it so)
        for _ in range(5):  # the tick that fell due runs in one of these turns
            await asyncio.sleep(0)
        # (unless the machine held this process up for a whole period meanwhile)
        assert idler.polls == polled + 1 or time.perf_counter() - last >= BUSY_PERIOD
        assert not parked.done()
        parked.cancel()
    finally:
        worker.release()
