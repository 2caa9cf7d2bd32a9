"""A precise shared tick for idle progress tasks: one timer per loop polls them all.

MPI offers nothing to wait on, so an idle progress task polls.  To wake within a
millisecond of a message it must poll more often than every millisecond, and neither loop
can sleep that briefly: uvloop's timers count whole milliseconds (shorter sleeps return at
once, so a rank would spin), asyncio's selector rounds its timeout up to the next one.  On
Linux a ``timerfd`` has no such limit: the loop waits on it like on a socket, and the kernel
wakes it on time.

Every idle progress task of the loop (a communicator's own and its private context's, and
those of its children) parks on the same tick; at each tick the ticker calls each one's
``poll_idle()`` and wakes only those that have something to do.  An idle period then costs
one wake-up and a few MPI tests, not a task switch per progress task.  The tick is
``PERIOD`` while all of them are parked, and the timer is disarmed while none is parked.
While one of them is at work, that one polls the parked ones itself every ``BUSY_PERIOD``,
at a moment it has nothing else to do (``poll_parked``: before it spins waiting for
something), and the tick slows to ``BUSY_SAFETY``, for a task at work that stops turning
(tearing down): a tick interrupts whatever the loop runs, and one that fell due inside a
long MPI call (a large message's copy) ran its polls, several microseconds with the caches
cold from the copy, between that call's completion and the task it woke (under uvloop a
reader's callback runs before the callbacks already ready; a tick now waits for them).
Elsewhere (no ``timerfd``) an idle task sleeps ``FALLBACK``.

Where every rank that can send to this process rings its doorbell (``_doorbell``: ranks
that share a host), the tick is not needed while all the tasks are parked: the ticker arms
the doorbell, polls them once more, and dozes, waking when a datagram arrives or at the
``SAFETY_PERIOD`` tick.  An idle process then costs next to nothing, and wakes as soon as
the kernel delivers the datagram.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from typing import ClassVar, Protocol

from ._doorbell import Doorbell

__all__ = ["BUSY_PERIOD", "BUSY_SAFETY", "FALLBACK", "PERIOD", "SAFETY_PERIOD", "Ticker"]

#: The period of the tick while every progress task of the loop is idle: a message finds
#: its receiver within it.
PERIOD = 400e-6
#: While another progress task of the loop is at work, it polls the parked ones this
#: often (``poll_parked``), at moments it has nothing else to do; past twice this, at the
#: next turn it has, whatever it does (a flood of messages leaves it no idle moment).
BUSY_PERIOD = 1e-3
#: The tick meanwhile: it polls the parked tasks only if no task at work did for
#: ``BUSY_PERIOD`` (one that stopped turning: tearing down, or blocked by user code).
BUSY_SAFETY = 4e-3
#: The idle poll where no ``timerfd`` exists (the shortest sleep both loops can do).
FALLBACK = 1e-3
#: The tick while dozing on the doorbell: it only bounds how late a ring that went missing
#: is made up for (none should: see ``_doorbell``).
SAFETY_PERIOD = 10e-3


class Idler(Protocol):
    """What parks on the tick.  ``dozable``: it can sleep until the doorbell rings (every
    rank that can send to it rings, and nothing it sent needs its polls to go out)."""

    @property
    def dozable(self) -> bool: ...

    def poll_idle(self) -> bool:
        """Poll once; True if the task should run (never raises)."""


_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = 0o2000000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create  # noqa: B018  # present?
        libc.timerfd_settime  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def _spec(period: float) -> _Itimerspec:
    spec = _Itimerspec()
    whole, part = divmod(round(period * 1e9), 10**9)
    spec.it_interval.tv_sec = spec.it_value.tv_sec = whole
    spec.it_interval.tv_nsec = spec.it_value.tv_nsec = part
    return spec


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Ticker:
    """The loop's shared idle tick (see module docs).  ``for_loop`` gives the loop's ticker
    and counts a user; each user calls ``release`` once, and the last one closes it."""

    _by_loop: ClassVar[dict[asyncio.AbstractEventLoop, Ticker]] = {}
    _lib: ClassVar[ctypes.CDLL | None] = None
    _looked_up: ClassVar[bool] = False

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._users = 0
        self._waiters: list[tuple[Idler, asyncio.Future[None]]] = []
        self._fd = -1
        self._idle = _spec(PERIOD)
        self._busy = _spec(BUSY_SAFETY)
        self._stop = _spec(0.0)
        self._safety = _spec(SAFETY_PERIOD)
        self._spec = self._stop  # what the timer is set to
        self.bell: Doorbell | None = None  # this process's doorbell, if this loop has it
        self._dozing = False  # the doorbell is armed: the tick is only the safety one
        self._settling = False  # a ring was heard: _settle reads it next
        self._deferred = False  # a busy tick's polls wait for the callbacks ready before it
        #: When a task at work next polls the parked ones (``perf_counter``), at an idle
        #: moment of its own; ``BUSY_PERIOD`` later it must, idle or not.
        self.due = 0.0
        lib = self._libc()
        if lib is not None:
            fd = lib.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                loop.add_reader(fd, self._tick)
                bell = Doorbell.current()
                if bell is not None and bell.owner is None:  # one loop of the process
                    bell.owner = self
                    self.bell = bell
                    loop.add_reader(bell.sock.fileno(), self._rung)

    @classmethod
    def _libc(cls) -> ctypes.CDLL | None:
        if not cls._looked_up:
            cls._lib, cls._looked_up = _libc(), True
        return cls._lib

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop) -> Ticker:
        """The loop's ticker (made on first use), with one more user."""
        ticker = cls._by_loop.get(loop)
        if ticker is None:
            ticker = cls._by_loop[loop] = cls(loop)
        ticker._users += 1
        return ticker

    def release(self) -> None:
        """One user is done; the last closes the timer."""
        self._users -= 1
        if self._users > 0:
            return
        del self._by_loop[self._loop]
        bell = self.bell
        if bell is not None:
            bell.disarm()
            bell.owner = self.bell = None
            self._dozing = False
            if not self._loop.is_closed():
                self._loop.remove_reader(bell.sock.fileno())
        if self._fd >= 0:
            if not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def park(self, idler: Idler) -> asyncio.Future[None]:
        """A future resolved once ``idler.poll_idle()``, called at each tick, says so; or
        after ``FALLBACK`` where no timerfd exists.  Whoever holds it may resolve it sooner
        (a wake-up), and then calls ``unpark``; cancelling it unparks too."""
        fut = self._loop.create_future()
        if self._fd < 0:
            self._loop.call_later(FALLBACK, _resolve, fut)
            return fut
        self._waiters.append((idler, fut))
        self._pace()
        return fut

    def unpark(self, idler: Idler) -> None:
        """``idler`` runs again (woken by the tick or otherwise): stop polling it, and stop
        dozing (a doorbell armed while the process works would be rung for nothing)."""
        waiters = self._waiters
        for i, (who, _) in enumerate(waiters):
            if who is idler:
                del waiters[i]
                break
        if self._fd >= 0:
            self._pace()

    @property
    def _armed(self) -> bool:
        return self._spec is not self._stop

    def _pace(self) -> None:
        """Doze on the doorbell when every user is parked and dozable; else tick fast when
        every user is parked, slower when one is at work, not at all when none is."""
        while True:
            parked = len(self._waiters)
            bell = self.bell
            if (bell is not None and parked and parked >= self._users
                    and all(getattr(who, "dozable", False) for who, _ in self._waiters)):
                bell.arm()
                # A message that landed before the doorbell was armed rang nothing: look.
                if self._poll_all():
                    bell.disarm()
                    self._dozing = False
                    continue
                self._dozing = True
                spec = self._safety
            else:
                if self._dozing:
                    self._dozing = False
                    bell.disarm()  # type: ignore[union-attr]
                spec = (self._stop if not parked else self._idle if parked >= self._users
                        else self._busy)
            if spec is not self._spec:
                self._set(spec)
            return

    def _set(self, spec: _Itimerspec) -> None:
        lib = self._libc()
        assert lib is not None
        lib.timerfd_settime(self._fd, 0, ctypes.byref(spec), None)
        self._spec = spec

    def _poll_all(self) -> bool:
        """Poll every parked idler, and wake those that have work; True if any woke."""
        still = []
        woke = False
        for idler, fut in self._waiters:
            if fut.done():
                continue
            busy = idler.poll_idle()
            if fut.done():  # its poll woke it already (it sent something)
                woke = True
                continue
            if busy:
                fut.set_result(None)
                woke = True
            else:
                still.append((idler, fut))
        self._waiters = still
        return woke

    def poll_parked(self, now: float) -> None:
        """Poll the parked tasks (``now``: ``time.perf_counter()``), for a task at work
        that found ``due`` passed: the next is due ``BUSY_PERIOD`` on."""
        self.due = now + BUSY_PERIOD
        if self._waiters:
            self._poll_all()
            self._pace()

    def _tick(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return
        if self._spec is self._busy:
            # A task of the loop is at work and polls the parked ones itself; if it did
            # not lately, what the turn that held the loop woke runs first (under uvloop
            # a reader's callback runs before the callbacks already ready).
            if not self._deferred and time.perf_counter() >= self.due:
                self._deferred = True
                self._loop.call_soon(self._busy_tick)
            return
        self._poll_all()
        self._pace()

    def _busy_tick(self) -> None:
        self._deferred = False
        if self._fd >= 0:  # (not released meanwhile)
            self.poll_parked(time.perf_counter())

    def _rung(self) -> None:
        """A datagram on the doorbell: a rank sent this process something.  The parked
        tasks are polled first, and reading the datagrams and setting the tick wait for
        the next callback: the loop runs what the polls woke (a recv that completed)
        before it.  (Both take as long as a poll, just after a long doze.)"""
        if self._settling:  # the datagrams are read in a moment
            return
        self._poll_all()
        self._settling = True
        self._loop.call_soon(self._settle)

    def _settle(self) -> None:
        self._settling = False
        bell = self.bell
        if bell is None:  # released meanwhile
            return
        bell.drain()
        self._pace()
