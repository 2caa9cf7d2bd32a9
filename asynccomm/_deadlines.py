"""Op deadlines behind one loop timer: arming a timeout costs a heap push, ending it a store.

The engines of one loop share one ``Deadlines`` (``deadlines_of``).

How it works
------------
Rule 1 (entries).  ``Deadlines.arm(req, delay)`` pushes the entry ``[when, seq, req]`` on
a heap (``when`` is ``loop.time() + delay``, exactly what ``call_later`` would compute;
``seq`` breaks ties between equal deadlines in arming order) and stores it as the
request's ``_timer``.  Whoever ends the op first ends the entry: ``entry[2] = None`` and
``req._timer = None`` (``end``); the entry stays on the heap, dead, until it surfaces.
The C lane arms and ends entries the same way (``arm_timer`` and ``settle``, in C).
Rule 2 (the timer).  One loop timer, armed at ``at``, no later than the earliest live
deadline: ``arm`` arms it when none is armed, and re-arms it when the new deadline is
earlier; otherwise arming costs the push and a comparison.  When it fires, every entry
due (deadline at most ``at`` or now, armed before it fired) leaves the heap and each live
one is handed to its engine's ``_on_timeout`` in (deadline, seq) order; dead entries on
top are dropped, and the timer is armed again at the earliest deadline left, or stays
unarmed when the heap is empty.  A live entry is never handed over before the loop would
have fired a timer of its own at its deadline.
Rule 3 (dead entries).  While a timer is armed the heap may hold entries of ops that
ended; when it holds more than twice those it held live at its last compaction (plus
``SLACK``), it keeps only the live ones, so memory stays within twice the peak of live
entries and the cost per arm stays constant.
Rule 4 (soft timers).  A timer armed here may be stale: no live entry left, it would wake
the loop to do nothing.  It must not count as something that will wake the program:
``owner_of`` tells such a handle from other timers, and ``settle`` drops the dead entries
on top, disarms the timer when no live entry is left (or moves it to the earliest live
deadline) and says whether one is.  The virtual-time loop settles one before jumping to
it (a stale one never moves virtual time); the deadlock proof settles one before
counting it (``_comm.hang``).  A live op's entry is its request's ``_timer``, which the
proof reads from the request.
Rule 5 (order among the loop's timers).  On the virtual-time loop (``timer_seq``,
``call_at_seq``) an entry's ``seq`` is drawn from the loop's own timer sequence, and the
timer is armed with its first entry's: it fires among the loop's other timers due at the
same time exactly where that op's own timer would have.  What differs: ops' deadlines due
at the same instant expire together, at the place of the first, before a timer of another
kind due then too that was scheduled between them.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from heapq import heapify, heappop, heappush
from typing import Any

__all__ = ["Deadlines", "deadlines_of", "end", "owner_of"]

#: Dead entries allowed beyond twice the live ones before the heap is compacted.
SLACK = 64


class Deadlines:
    """The deadlines of the timed ops on one loop, behind one loop timer (module docs)."""

    __slots__ = ("_at", "_call_at", "_first", "_handle", "_heap", "_limit", "_loop", "_seq",
                 "_time")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._time = loop.time
        self._heap: list[list[Any]] = []
        # On the virtual-time loop entries draw the loop's own timer sequence numbers, and
        # the timer takes its first entry's: it sits among the loop's timers where that
        # op's own timer would have (Rule 5).
        self._seq: Iterator[int] = getattr(loop, "timer_seq", None) or itertools.count()
        self._call_at: Callable[..., asyncio.TimerHandle] | None = getattr(
            loop, "call_at_seq", None)
        self._handle: asyncio.TimerHandle | None = None
        self._first: list[Any] | None = None  # the entry the timer is armed for
        self._at = 0.0
        self._limit = SLACK

    def arm(self, req: Any, delay: float) -> None:
        """Call ``req._owner._on_timeout(req)`` ``delay`` seconds from now unless ``req``
        ends first (``end``); stores its entry as ``req._timer`` (Rule 1)."""
        when = self._time() + delay
        entry = [when, next(self._seq), req]
        heap = self._heap
        heappush(heap, entry)
        req._timer = entry
        if self._handle is None or when < self._at:
            self._arm_at()
        elif len(heap) > self._limit:
            self._compact()

    def live(self) -> int:
        """How many entries are live (O(n): for reports and tests)."""
        return sum(1 for e in self._heap if e[2] is not None)

    @property
    def armed(self) -> float | None:
        """The loop time the timer is armed at; None when unarmed."""
        return None if self._handle is None else self._at

    def settle(self) -> bool:
        """Drop the dead entries on top; disarm the timer if none is live, else keep it at
        the earliest live deadline.  True if a live entry is left (Rule 4)."""
        heap = self._heap
        while heap and heap[0][2] is None:
            heappop(heap)
        if not heap:
            self._disarm()
            return False
        if self._handle is None or heap[0] is not self._first:
            self._arm_at()
        return True

    def close(self) -> None:
        """Disarm the timer if no live entry is left (an engine that has closed)."""
        self.settle()

    def _arm_at(self) -> None:
        """Arm the timer at the first entry's deadline."""
        if self._handle is not None:
            self._handle.cancel()
        first = self._heap[0]
        when = first[0]
        if self._call_at is None:
            self._handle = self._loop.call_at(when, self._fire)
        else:
            self._handle = self._call_at(when, first[1], self._fire)
        self._at = when
        self._first = first

    def _disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._first = None

    def _compact(self) -> None:
        heap = self._heap
        heap[:] = [e for e in heap if e[2] is not None]
        heapify(heap)
        self._limit = 2 * len(heap) + SLACK

    def _fire(self) -> None:
        self._handle = self._first = None
        heap = self._heap
        limit = max(self._at, self._time())
        bound = next(self._seq)  # entries armed meanwhile wait for the next round
        try:
            while heap and heap[0][0] <= limit and heap[0][1] < bound:
                entry = heappop(heap)
                req = entry[2]
                if req is not None:
                    entry[2] = None
                    req._owner._on_timeout(req)
        finally:
            self.settle()


def deadlines_of(loop: asyncio.AbstractEventLoop) -> Deadlines:
    """The ``Deadlines`` of ``loop``: one per loop, shared by its engines, so that equal
    deadlines fire in arming order whichever rank armed them (kept on the loop; a loop
    that takes no attribute gets one of its own per call)."""
    deadlines: Deadlines | None = getattr(loop, "_asynccomm_deadlines", None)
    if deadlines is None:
        deadlines = Deadlines(loop)
        try:
            loop._asynccomm_deadlines = deadlines  # type: ignore[attr-defined]
        except AttributeError:
            pass
    return deadlines


def end(req: Any) -> None:
    """End ``req``'s entry, if it has one: its op finished or was withdrawn (Rule 1)."""
    entry = req._timer
    if entry is not None:
        entry[2] = None
        req._timer = None


def owner_of(handle: asyncio.TimerHandle) -> Deadlines | None:
    """The ``Deadlines`` whose timer ``handle`` is, else None (Rule 4; asyncio's handles:
    uvloop's show no callback, nor does uvloop show its timers)."""
    callback = getattr(handle, "_callback", None)
    if getattr(callback, "__func__", None) is Deadlines._fire:
        owner: Deadlines = callback.__self__  # type: ignore[union-attr]
        return owner
    return None
