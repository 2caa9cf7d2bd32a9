"""Hangs: deadlock proofs on the wall clock, the hang watchdog, and the dumps that say
which ops every rank is stuck on.

How it works
------------
Rule 1 (the proof).  An in-process world on the wall clock is deadlocked when, at two
checks in a row (every ``PERIOD`` seconds) with no op finishing in between, every task of
the program but ``run``'s own is blocked on a future that only asynccomm resolves: a
pending op's, a stream event's, another such task, or a ``gather`` of such tasks; no op
has a timeout armed, no timeout the library armed around an await is pending (a
collective's, ``split``'s: ``_engine.waits``), none has matched (its copy is moving), no copy runs
on a worker thread, and (on asyncio) the loop has no ready callback and no timer but the
check's own (the timer ops' timeouts share, ``asynccomm._deadlines``, counts only while it
has a live deadline: one left armed after its ops finished is settled, not counted).
Anything else a task awaits (a sleep, ``asyncio.to_thread``, a user's future, a
``TaskGroup`` or ``asyncio.wait``) means the case is not proven and nothing is raised.
On uvloop, which does not show its timers, a task's own ``asyncio.timeout`` is looked for
among its referrers before anything is raised.  What the proof cannot see is an op posted
from outside any task: by a thread through ``call_soon_threadsafe``, or on uvloop by a bare
``call_later`` callback.
Rule 2 (the verdict).  A proven deadlock fails every unmatched op with one
``DeadlockError`` naming each rank's ops, the wait-for cycle, and each rank's flight
record, exactly as the virtual clock does.
Rule 3 (the watchdog).  ``ASYNCCOMM_HANG_WARN`` seconds (default 10, 0: off) with ops
pending and none finishing: one line per rank says what it waits for (``comm.hang.first``;
on stderr when no logger is on), once per stall.  ``ASYNCCOMM_HANG_TIMEOUT`` seconds
(default 300, 0: off): every rank's pending ops and recent ops are logged (``comm.hang``,
a warning) and the program keeps waiting.
On MPI each process watches its own rank, and at either point asks the ranks it waits for
what they wait for (``DUMP_ASK``; best effort: each answers from its progress task, and
its answer is reported as ``comm.hang.peer`` when it comes).
"""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from .._core.states import ACTIVE, Kind
from .._deadlines import owner_of
from .._engine import waits as _waits
from .._engine.diagnostics import describe
from .._engine.log import NullLogger
from .._engine.options import seconds_from_env
from .._engine.request import _Countdown, awaiting
from .._exceptions import DeadlockError
from .._types import ANY_SOURCE
from .groups import OBJECT_TAGS

if TYPE_CHECKING:
    from .._engine.engine import DeviceEngine

__all__ = ["PERIOD", "Watch", "deadlock_error", "dump", "fail_deadlocked", "hang_timeout",
           "install_dump_signal", "wait_for_cycle"]

#: Seconds between two checks of the wall-clock deadlock proof.
PERIOD: Final = 0.2
#: Finished ops of each rank shown in a deadlock message or a hang report.
SHOWN: Final = 8
DEFAULT_HANG_TIMEOUT: Final = 300.0
DEFAULT_HANG_WARN: Final = 10.0


def hang_timeout() -> float:
    """``ASYNCCOMM_HANG_TIMEOUT`` in seconds (default 300; 0 turns the watchdog off).

    Raises:
        ValueError: the variable is set to something that is not a number >= 0.
    """
    value = seconds_from_env("ASYNCCOMM_HANG_TIMEOUT")
    return DEFAULT_HANG_TIMEOUT if value is None else value


def hang_warning() -> float:
    """``ASYNCCOMM_HANG_WARN`` in seconds (default 10; 0 turns the first warning off).

    Raises:
        ValueError: the variable is set to something that is not a number >= 0.
    """
    value = seconds_from_env("ASYNCCOMM_HANG_WARN")
    return DEFAULT_HANG_WARN if value is None else value


# -- what every rank waits for ------------------------------------------------------------

def _world(e: DeviceEngine, rank: int) -> int:
    """The world rank of ``e``'s communicator's rank ``rank``."""
    return rank if e.world_ranks is None else e.world_ranks[rank]


def _edges(engines: Sequence[DeviceEngine]) -> dict[int, list[tuple[int, int, str]]]:
    """world rank -> [(world rank it waits for, tag, op)] over its unfinished ops, on
    every communicator of the world (a sub-communicator's ranks mapped to the world's)."""
    out: dict[int, list[tuple[int, int, str]]] = {}
    for e in engines:
        for r in e.live_requests():
            if r.kind is Kind.COMPUTE:
                continue
            peers = ([p for p in range(e.size) if p != e.rank] if r.peer == ANY_SOURCE
                     else [r.peer])
            out.setdefault(e.world_rank, []).extend((_world(e, p), r.tag, r.kind.value)
                                                     for p in peers)
    return out


def wait_for_cycle(engines: Sequence[DeviceEngine]) -> str:
    """``rank 0 waits for 1 on tag 0 (recv), rank 1 waits for 0 on tag 0 (recv)``: a
    cycle of the wait-for graph, or what the ranks wait for when there is none."""
    edges = _edges(engines)
    for start in sorted(edges):
        path: list[tuple[int, int, int, str]] = []
        seen = {start}
        rank = start
        while True:
            nxt = next(((p, t, op) for p, t, op in edges.get(rank, ()) if p in edges), None)
            if nxt is None:
                break
            path.append((rank, *nxt))
            if nxt[0] == start:
                return ", ".join(_waits_for(r, p, t, op) for r, p, t, op in path)
            if nxt[0] in seen:
                break
            seen.add(nxt[0])
            rank = nxt[0]
    return "; ".join(_waits_for(r, p, t, op) for r in sorted(edges) for p, t, op in edges[r])


def _waits_for(rank: int, peer: int, tag: int, op: str) -> str:
    tag_s = "any tag" if tag < 0 else f"tag {tag}"
    return f"rank {rank} waits for {peer} on {tag_s} ({op})"


def _summary(engines: Sequence[DeviceEngine]) -> dict[int, str]:
    """world rank -> what it waits for, on one line: its collective calls (``allreduce
    (ring) step 2 waiting on rank 1 (recv tag 0)``) and its other pending ops, each with
    its communicator where that is not the world's; only ranks with ops pending."""
    out: dict[int, list[str]] = {}
    for e in engines:
        live = e.live_requests()
        if not live:
            continue
        label = _waits.communicator_label(e)
        where = f" [{label}]" if label else ""
        calls = _waits.scopes(e)
        parts = out.setdefault(e.world_rank, [])
        parts += [s.describe().removeprefix("inside ") + where for s in calls]
        in_calls = {id(r) for s in calls for r in s.waiting()}
        parts += [describe(r) + where for r in live if id(r) not in in_calls]
    return {rank: "; ".join(parts) for rank, parts in sorted(out.items())}


def peer_report(engines: Sequence[DeviceEngine], world_rank: int, peer: int,
                text: str) -> None:
    """Report what ``peer`` (a world rank) said it waits for, when this rank's watchdog
    asked it."""
    log = engines[0].log if engines else NullLogger()
    if isinstance(log, NullLogger):
        sys.stderr.write(f"asynccomm: rank {world_rank} asked rank {peer}, which it waits "
                         f"for; rank {peer} says:\n{text}\n")
        sys.stderr.flush()
    else:
        log.warning("comm.hang.peer", peer=peer, pending=text)


def dump(engines: Sequence[DeviceEngine], *, last: int | None = SHOWN) -> str:
    """Every rank's pending ops and last ``last`` finished ops, human-readable: a rank's
    communicators together, each with its collective calls (``_engine.waits.dump``)."""
    return _waits.dump(engines, last=last)


def _where(e: DeviceEngine, req: Any) -> str:
    """Where an op is, for people: its communicator, or an object's buffers."""
    if e.private and req.tag >= OBJECT_TAGS:
        return "(a buffer of an object, send_obj/recv_obj)"
    return e.context


def deadlock_error(engines: Sequence[DeviceEngine]) -> DeadlockError | None:
    """The error for a world whose ranks can never be woken; None if nothing is pending."""
    pending: dict[int, list[str]] = {}
    for e in engines:
        if e.pending_ops:
            pending.setdefault(e.world_rank, []).extend(
                f"{op} {where}" if (where := _where(e, r)) else op
                for r, op in zip(e.live_requests(), e.describe_all(), strict=True))
    if not pending:
        return None
    lines = "; ".join(f"rank {rank}: {', '.join(ops)}" for rank, ops in pending.items())
    inside = "".join(f"\n{line}" for line in _waits.collective_lines(engines))
    return DeadlockError(f"deadlock: every rank is blocked and nothing can wake them; "
                         f"unmatched operations: {lines}{inside}\nwait-for cycle: "
                         f"{wait_for_cycle(engines)}\nflight record:\n{dump(engines)}",
                         pending=pending)


def fail_deadlocked(engines: Sequence[DeviceEngine]) -> bool:
    """Fail every unmatched op of a deadlocked world with one ``DeadlockError`` that lists
    them all, per rank.  Returns True if that woke something."""
    exc = deadlock_error(engines)
    if exc is None:
        return False
    woke = False
    for engine in engines:
        for req in engine.live_requests():
            woke = engine.withdraw(req, exc) or woke
    return woke


# -- the periodic check -------------------------------------------------------------------

def _progress(engines: Sequence[DeviceEngine]) -> int:
    """Ops finished so far, over every rank (changes whenever one finishes)."""
    return sum(e.flight.finished() for e in engines)


class Watch:
    """The periodic check of a world (see module docs): the deadlock proof when
    ``tasks_of`` is given (in-process, instant, wall clock), the watchdog when
    ``timeout`` > 0."""

    def __init__(self, engines: Sequence[DeviceEngine], loop: asyncio.AbstractEventLoop, *,
                 timeout: float, driver: asyncio.Task[Any] | None,
                 warn: float | None = None) -> None:
        self.engines = engines
        self.loop = loop
        self.timeout = timeout
        self.warn = hang_warning() if warn is None else warn
        self.driver = driver
        limit = min((t for t in (timeout, self.warn) if t > 0), default=0.0)
        self.period = PERIOD if driver is not None else max(min(limit / 4, 5.0), 0.05)
        self._warned = False
        self._excused: tuple[int, frozenset[tuple[int, int]]] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._last: tuple[int, frozenset[tuple[int, int]]] | None = None
        self._progress = -1
        self._since = loop.time()
        self._reported = 0.0

    def start(self) -> None:
        if self.driver is None and self.timeout <= 0 and self.warn <= 0:
            return
        self._handle = self.loop.call_later(self.period, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        self._handle = self.loop.call_later(self.period, self._tick)
        progress = _progress(self.engines)
        now = self.loop.time()
        if progress != self._progress:
            self._progress, self._since, self._warned = progress, now, False
        if self.driver is not None:
            proof = self._proof()
            if (proof is not None and proof == self._last and not self._timed(proof)
                    and fail_deadlocked(self.engines)):
                self.stop()
                return
            self._last = proof
        if (self.warn > 0 and not self._warned and now - self._since >= self.warn
                and (self.timeout <= 0 or self.warn < self.timeout)
                and any(e.pending_ops for e in self.engines)):
            self._warned = True
            self._first_warning(now - self._since)
        if (self.timeout > 0 and now - self._since >= self.timeout
                and now - self._reported >= self.timeout
                and any(e.pending_ops for e in self.engines)):
            self._reported = now
            self._report(now - self._since)

    def _first_warning(self, idle: float) -> None:
        """One line per rank: what it waits for, after ``warn`` seconds with no op
        finishing; across processes the ranks it waits for are asked too."""
        log = self.engines[0].log
        for rank, waits in _summary(self.engines).items():
            if isinstance(log, NullLogger):
                sys.stderr.write(f"asynccomm: rank {rank}: no op finished for {idle:.1f} s "
                                 f"(ASYNCCOMM_HANG_WARN); waiting on: {waits}\n")
                sys.stderr.flush()
            else:
                log.warning("comm.hang.first", idle_s=round(idle, 3), waiting=waits)
        self._ask_peers()

    def _report(self, idle: float) -> None:
        text = dump(self.engines)
        log = self.engines[0].log
        if isinstance(log, NullLogger):
            sys.stderr.write(f"asynccomm: no op finished for {idle:.1f} s with ops pending "
                             f"(ASYNCCOMM_HANG_TIMEOUT); still waiting:\n{text}\n")
            sys.stderr.flush()
        else:
            log.warning("comm.hang", idle_s=round(idle, 3), pending=text)
        self._ask_peers()

    def _ask_peers(self) -> None:
        """Across processes: ask the ranks this one waits for what they wait for (their
        answers are reported as they come, by ``peer_report``)."""
        asked: set[tuple[int, int]] = set()
        for e in self.engines:
            ask = getattr(e.link, "ask_dump", None)
            if ask is None:
                continue
            for r in e.live_requests():
                if r.kind is Kind.COMPUTE:
                    continue
                peers = range(e.size) if r.peer == ANY_SOURCE else (r.peer,)
                for p in peers:
                    if (id(e), p) not in asked and p != e.rank:
                        asked.add((id(e), p))
                        ask(p)

    def _timed(self, proof: tuple[int, frozenset[tuple[int, int]]]) -> bool:
        """On a loop that hides its timers (uvloop): True if a task of the program has an
        ``asyncio.timeout`` of its own armed, which will wake it.  Looked for once per
        stuck state (it reads the task's referrers: not for every check)."""
        if hasattr(self.loop, "_scheduled"):
            return False  # asyncio: ``_loop_quiet`` saw every timer
        if proof == self._excused:
            return True
        for task in asyncio.all_tasks(self.loop):
            if task is not self.driver and any(_armed(r) for r in gc.get_referrers(task)):
                self._excused = proof
                return True
        return False

    def _proof(self) -> tuple[int, frozenset[tuple[int, int]]] | None:
        """What every task waits for, if the world is provably stuck now, else None."""
        library = _library_futures(self.engines)
        if (library is None or _waits.armed(self.loop)
                or not _loop_quiet(self.loop, self._handle)):
            return None
        tasks = {t for t in asyncio.all_tasks(self.loop) if t is not self.driver}
        waits = []
        for task in tasks:
            waiter = getattr(task, "_fut_waiter", None)
            if waiter is None or waiter.done():
                return None
            if waiter in library or (isinstance(waiter, asyncio.Task) and waiter in tasks):
                waits.append((id(task), id(waiter)))
                continue
            children = getattr(waiter, "_children", None)
            if children is None or not all(c in tasks or c.done() for c in children):
                return None
            waits.append((id(task), id(waiter)))
        if not waits:
            return None
        return _progress(self.engines), frozenset(waits)


def _armed(obj: object) -> bool:
    """True if ``obj`` is an ``asyncio.timeout`` that is armed: entered, with a deadline
    (its timer handle, which asyncio drops on leaving the block)."""
    return (isinstance(obj, asyncio.Timeout)
            and getattr(obj, "_timeout_handler", None) is not None)


def _library_futures(engines: Sequence[DeviceEngine]) -> set[Any] | None:
    """The futures asynccomm will resolve, if nothing is moving; None otherwise."""
    out: set[Any] = set()
    for e in engines:
        if e.closed and not e._copies and e._idle is None:
            continue  # a rank that has finished: nothing of it can wake another
        if e._copies or e._idle is not None:
            return None
        for r in e.live_requests():
            if r._timer is not None or r._state is ACTIVE:  # a timeout or a copy will wake
                return None
            for w in r._waiters or ():
                out.add(w.fut if isinstance(w, _Countdown) else w)
        for stream in e.streams():
            for event in stream._events:
                out.update(event._waiters)
    out.update(awaiting())  # resolved by an object's task, which is checked in turn
    return out


def _loop_quiet(loop: asyncio.AbstractEventLoop, own: asyncio.TimerHandle | None) -> bool:
    """No ready callback and no timer but ``own`` (asyncio's loop shows them; uvloop not),
    nor a shared deadline timer with a live deadline (a stale one wakes nothing)."""
    ready = getattr(loop, "_ready", None)
    if ready:
        return False
    scheduled = getattr(loop, "_scheduled", None)
    if scheduled is None:
        return True
    for h in list(scheduled):  # (settling one may arm another: it is asked, not listed)
        if h is own or h.cancelled():
            continue
        owner = owner_of(h)
        if owner is None or owner.settle():  # a shared deadline timer counts if live
            return False
    return True


# -- dumps on a signal --------------------------------------------------------------------

def install_dump_signal(loop: asyncio.AbstractEventLoop,
                        engines: Callable[[], Sequence[DeviceEngine]]) -> Callable[[], None]:
    """Write every rank's flight record to stderr on SIGUSR1; returns the uninstaller (a
    no-op where signals cannot be handled, on another thread or platform, or when the
    program handles SIGUSR1 itself)."""
    sig = getattr(signal, "SIGUSR1", None)
    if (sig is None or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(sig) is not signal.SIG_DFL):  # the program's own: leave it
        return lambda: None

    def on_signal() -> None:
        sys.stderr.write(f"asynccomm: flight record (SIGUSR1):\n{dump(engines(), last=None)}\n")
        sys.stderr.flush()

    try:
        loop.add_signal_handler(sig, on_signal)
    except (NotImplementedError, RuntimeError, ValueError):
        return lambda: None

    def uninstall() -> None:
        try:
            loop.remove_signal_handler(sig)
        except (RuntimeError, ValueError):  # the loop is closing
            pass

    return uninstall
