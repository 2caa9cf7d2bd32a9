"""The shared idle tick of the MPI progress tasks: who wakes, who stays parked, and that the
timer is shared, disarmed when nobody is idle, and closed by its last user."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from asynccomm.transports._ticker import Ticker

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
