"""A virtual-time event loop: time jumps to the next timer whenever every task waits.

How it works
------------
``VirtualTimeLoop`` is a selector event loop whose clock is an integer count of
nanoseconds that only moves when the loop would otherwise sleep (simpy's heap of timers,
trio's ``MockClock`` with ``autojump_threshold=0``):

Rule 1: while callbacks are ready, time stands still; programs see every step they take
as instantaneous.
Rule 2: when nothing is ready and a timer is scheduled, the clock jumps to that timer's
deadline at once (after a non-blocking poll of real I/O).
Rule 3: while work is outstanding on threads (``run_in_executor``/``to_thread``) or real
file descriptors are registered, the loop waits for them in real time without moving the
clock, so thread work takes no virtual time and runs stay deterministic.
Rule 4: timers due at the same time fire in the order they were scheduled: each timer
carries a sequence number that breaks ties in the heap, so a program's model time never
depends on the heap's treatment of equal keys, hash order or other accidents
(``call_at_seq`` gives a timer that stands for one scheduled earlier that one's number).
Rule 5: when nothing is ready, no timer is scheduled and nothing real is outstanding,
nothing can ever wake the program: the loop calls its idle handler (the world fails every
pending operation with ``DeadlockError``); if there is none, or the handler finds nothing
to wake, it raises ``DeadlockError`` itself.
Rule 6: a shared deadline timer (``asynccomm._deadlines``) with no live deadline left is
stale: it would wake nothing, so it is settled (disarmed, or moved to the earliest live
deadline) before the clock would jump to it, and never moves the clock nor keeps Rule 5
from applying.

uvloop cannot fake time, which is why virtual time needs this selector loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import selectors
from collections.abc import Callable, Iterator
from concurrent.futures import Future as ConcurrentFuture
from typing import Any

from .._deadlines import owner_of
from .._exceptions import DeadlockError

__all__ = ["VirtualTimeLoop", "new_virtual_loop"]


class _VirtualSelector(selectors.BaseSelector):
    """Delegates to a real selector but turns sleeps into clock jumps."""

    def __init__(self, loop: VirtualTimeLoop, real: selectors.BaseSelector) -> None:
        self._loop = loop
        self._real = real

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = self._real.select(0)
        if events or timeout == 0:
            return events
        loop = self._loop
        if loop._outstanding_real_work():
            return self._real.select(timeout)  # Rule 3: real waiting, clock still
        if timeout is None or not loop._jump_to_next_timer():  # Rule 2
            loop._idle()  # Rule 5
        return []


class _Timer(asyncio.TimerHandle):
    """A timer ordered by (deadline, sequence number): equal deadlines fire first in,
    first out (Rule 4)."""

    __slots__ = ("_seq",)

    def __init__(self, when: float, seq: int, callback: Callable[..., Any], args: tuple[Any, ...],
                 loop: asyncio.AbstractEventLoop, context: Any) -> None:
        super().__init__(when, callback, args, loop, context)
        self._seq = seq

    def __lt__(self, other: object) -> bool:
        if isinstance(other, _Timer):
            return (self.when(), self._seq) < (other.when(), other._seq)
        return super().__lt__(other)  # type: ignore[operator]

    def __gt__(self, other: object) -> bool:
        if isinstance(other, _Timer):
            return (self.when(), self._seq) > (other.when(), other._seq)
        return super().__gt__(other)  # type: ignore[operator]


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop on a virtual clock (see module docs).

    Attributes:
        on_idle: called when nothing can ever wake the program; returns True if it woke
            something (for example by failing pending operations), False otherwise.
    """

    def __init__(self) -> None:
        super().__init__()
        self._now_ns = 0
        self._executor_jobs = 0
        self._base_fds = 0
        self.on_idle: Callable[[], bool] | None = None
        self._selector = _VirtualSelector(self, self._selector)  # type: ignore[has-type]
        self._base_fds = len(self._selector.get_map())  # the loop's own self-pipe
        self._timer_seq = itertools.count()

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any,  # type: ignore[override]
                context: Any = None) -> asyncio.TimerHandle:
        """As ``asyncio``'s, with ties between equal deadlines broken by scheduling order."""
        if when is None:
            raise TypeError("when cannot be None")
        self._check_closed()  # type: ignore[attr-defined]
        if self.get_debug():
            self._check_thread()  # type: ignore[attr-defined]
        return self.call_at_seq(when, next(self._timer_seq), callback, *args, context=context)

    @property
    def timer_seq(self) -> Iterator[int]:
        """The sequence numbers that order timers due at the same time (Rule 4)."""
        return self._timer_seq

    def call_at_seq(self, when: float, seq: int, callback: Callable[..., Any], *args: Any,
                    context: Any = None) -> asyncio.TimerHandle:
        """``call_at``, ordered among timers due at the same time as if scheduled when
        ``seq`` was drawn from ``timer_seq`` (a timer that stands for one scheduled
        earlier: ``asynccomm._deadlines``)."""
        if when is None:
            raise TypeError("when cannot be None")
        self._check_closed()  # type: ignore[attr-defined]
        timer = _Timer(when, seq, callback, args, self, context)
        heapq.heappush(self._scheduled, timer)  # type: ignore[attr-defined]
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    def time(self) -> float:
        return self._now_ns / 1e9  # division rounds correctly: 30 s is exactly 30.0

    def time_ns(self) -> int:
        """The virtual time in integer nanoseconds."""
        return self._now_ns

    def run_in_executor(self, executor: Any, func: Callable[..., Any],  # type: ignore[override]
                        *args: Any) -> asyncio.Future[Any]:
        fut = super().run_in_executor(executor, func, *args)
        self._executor_jobs += 1
        fut.add_done_callback(self._executor_job_done)
        return fut

    async def shutdown_default_executor(self, *args: Any) -> None:
        # It waits for the executor on a thread of its own, outside run_in_executor.
        self._executor_jobs += 1
        try:
            await super().shutdown_default_executor(*args)
        finally:
            self._executor_jobs -= 1

    def _executor_job_done(self, _fut: asyncio.Future[Any] | ConcurrentFuture[Any]) -> None:
        self._executor_jobs -= 1

    def _outstanding_real_work(self) -> bool:
        return self._executor_jobs > 0 or len(self._selector.get_map()) > self._base_fds

    def _jump_to_next_timer(self) -> bool:
        """Move the clock to the earliest timer that will wake something; False if none
        will (Rule 6: a stale shared deadline timer is settled, never jumped to)."""
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        while scheduled:
            first = scheduled[0]
            if first.cancelled():
                heapq.heappop(scheduled)  # what the loop does with one on top
                first._scheduled = False  # type: ignore[attr-defined]
                self._timer_cancelled_count -= 1  # type: ignore[attr-defined]
                continue
            owner = owner_of(first)
            if owner is not None:
                owner.settle()  # disarms a stale one, or moves it to its live deadline
                if first.cancelled():
                    continue
            when_ns = math.ceil(first.when() * 1e9)
            # Float rounding must never leave the timer a hair in the future.
            while when_ns / 1e9 < first.when():
                when_ns += 1
            if when_ns > self._now_ns:
                self._now_ns = when_ns
            return True
        return False

    def _idle(self) -> None:
        handler = self.on_idle
        if handler is not None and handler():
            return
        raise DeadlockError("every task is waiting and nothing can wake them "
                            "(no timers, no I/O, no thread work)", pending={})


def new_virtual_loop() -> VirtualTimeLoop:
    """A loop factory for ``asyncio.Runner(loop_factory=...)``."""
    return VirtualTimeLoop()
