"""What a rank waits for, beyond its ops: the timeouts the library arms, and the collective
calls it is inside.  The hang watchdog, the deadlock proof and the dumps read these.

How it works
------------
Rule 1 (armed timeouts).  Every timeout the library arms around an await (a collective's
``timeout=``, and with it ``split``'s) goes through ``armed_timeout``, which counts it on
its loop while it is armed.  The wall-clock deadlock proof never proves a world stuck while
one is armed on its loop: the timeout will wake a task.  (An op's own timeout is its
request's timer, which the proof reads from the request; uvloop shows neither to Python.)
Rule 2 (collective scopes).  A collective call registers its ``Exchange`` with the engine
of the communicator it runs on (``inside``): the call's name, algorithm, tags, and (from the
exchange) its step and the ops it waits on.  Nothing unregisters it: a scope whose exchange
is gone, or has nothing pending, is not shown.  ``during`` names the operation a collective
runs for (``split``), for the same reports.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from .._core.states import Kind
from .flight import format_entry

if TYPE_CHECKING:
    from .._core.matching import Matcher
    from ..transports.base import Link
    from .flight import FlightRecorder
    from .request import Request

__all__ = ["Scope", "armed", "armed_timeout", "collective_lines", "communicator_label",
           "describe_scopes", "dump", "during", "inside", "scope_of", "scopes"]

class EngineView(Protocol):
    """What the reports read of a rank's engine (``engine.EngineView``, which imports
    this module: named by what it has, so neither module imports the other)."""

    scopes: list[Scope]

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def world_rank(self) -> int: ...

    @property
    def world_ranks(self) -> list[int] | None: ...

    @property
    def context(self) -> str: ...

    @property
    def private(self) -> bool: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def link(self) -> Link: ...

    @property
    def matcher(self) -> Matcher: ...

    @property
    def log(self) -> Any: ...

    @property
    def trace(self) -> bool: ...

    @property
    def flight(self) -> FlightRecorder: ...

    @property
    def recent(self) -> Any: ...

    def live_requests(self) -> list[Request]: ...


class Exchange(Protocol):
    """What a scope reads of a collective call's ops (``_collectives.algorithms.Exchange``,
    a layer above)."""

    comm: Any
    tag: int
    _live: list[Request]


_ARMED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = (
    weakref.WeakKeyDictionary())
_DURING: contextvars.ContextVar[str] = contextvars.ContextVar("asynccomm_during", default="")


class armed_timeout:
    """``asyncio.timeout(delay)``, counted on its loop while armed (Rule 1); ``None``
    arms nothing."""

    __slots__ = ("_cm", "_loop")

    def __init__(self, delay: float | None) -> None:
        self._cm = asyncio.timeout(delay)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> asyncio.Timeout:
        cm = await self._cm.__aenter__()
        if cm.when() is not None:
            self._loop = loop = asyncio.get_running_loop()
            _ARMED[loop] = _ARMED.get(loop, 0) + 1
        return cm

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            _ARMED[loop] -= 1
        await self._cm.__aexit__(exc_type, exc, tb)  # (it never swallows: it converts)


def armed(loop: asyncio.AbstractEventLoop) -> int:
    """How many library timeouts are armed on ``loop`` now."""
    return _ARMED.get(loop, 0)


# -- collective scopes --------------------------------------------------------------------

class Scope:
    """One collective call on one rank (Rule 2)."""

    __slots__ = ("__weakref__", "algo", "during", "exchange", "span", "where", "world_ranks")

    def __init__(self, exchange: Exchange, where: str, algo: str, span: int,
                 world_ranks: list[int] | None = None) -> None:
        self.exchange: weakref.ref[Exchange] = weakref.ref(exchange)
        self.world_ranks = world_ranks  # of the communicator's ranks (None: the same)
        self.where = where
        self.algo = algo
        self.span = span
        self.during = _DURING.get()

    def waiting(self) -> list[Request]:
        """The call's ops that have not finished (none once it is over)."""
        ex = self.exchange()
        return [] if ex is None else [r for r in ex._live if not r.done()]

    def describe(self) -> str:
        """``inside allreduce (ring), tags 0..4095, step 3, waiting on rank 1 (recv tag 1),
        rank 1 (send tag 1)``."""
        ex = self.exchange()
        if ex is None:
            return f"inside {self.where} ({self.algo}), finished"
        tag = ex.tag - ex.tag % self.span  # (the call's block: Exchange adds an offset)
        for_ = f" for {self.during}" if self.during else ""
        waits = ", ".join(f"rank {self._peer(r.peer)} ({r.kind.value} tag {r.tag})"
                          for r in self.waiting() if r.kind is not Kind.COMPUTE)
        return (f"inside {self.where}{for_} ({self.algo}), tags {tag}..{tag + self.span - 1}, "
                f"step {getattr(ex, 'step', 0)}, waiting on {waits or 'nothing'}")


    def _peer(self, peer: int) -> str:
        world = self.world_ranks
        if world is None or not 0 <= peer < len(world) or world[peer] == peer:
            return "ANY_SOURCE" if peer < 0 else str(peer)
        return f"{peer} (world rank {world[peer]})"


def inside(exchange: Exchange, where: str, algo: str, span: int) -> None:
    """Register ``exchange`` as collective ``where`` run with ``algo`` (Rule 2), on the
    engine of the communicator it runs on (nothing for other communicator-likes)."""
    engine = getattr(exchange.comm, "_engine", None)
    if engine is None:
        return
    engine.scopes = [s for s in engine.scopes if s.waiting()]  # forget the finished
    engine.scopes.append(Scope(exchange, where, algo, span, engine.world_ranks))


@contextmanager
def during(operation: str) -> Iterator[None]:
    """The collectives run inside this block do it for ``operation`` (``split``)."""
    token = _DURING.set(operation)
    try:
        yield
    finally:
        _DURING.reset(token)


def scopes(engine: EngineView) -> list[Scope]:
    """The collective calls of ``engine`` with ops pending."""
    return [s for s in engine.scopes if s.waiting()]


def scope_of(engine: EngineView, req: Request) -> Scope | None:
    """The collective call ``req`` belongs to, if any."""
    for s in engine.scopes:
        ex = s.exchange()
        if ex is not None and any(r is req for r in ex._live):
            return s
    return None


def describe_scopes(engine: EngineView) -> list[str]:
    """One line per collective call of ``engine`` with ops pending."""
    return [s.describe() for s in scopes(engine)]


# -- dumps: every rank's ops, under their communicator ------------------------------------

def communicator_label(engine: EngineView) -> str:
    """Where ``engine``'s ops are, for dumps: ``""`` (the world's communicator), ``the
    private context``, ``on a sub-communicator, as its rank 0 of 2``, or both."""
    context = engine.context
    at = context.find("(on a sub-communicator")
    sub = context[at + 1:context.index(")", at)] if at >= 0 else ""
    if engine.private or context.startswith("(inside a collective)"):
        return "the private context (collectives, objects)" + (f", {sub}" if sub else "")
    return sub


def dump(engines: Sequence[EngineView], *, last: int | None) -> str:
    """Every rank's pending ops and last ``last`` finished ops, human-readable: the world's
    communicator's pending ops first, then each other communicator's under its label with
    the collective calls waiting there (every count is the rank's, all communicators)."""
    ranks: dict[int, list[EngineView]] = {}
    for e in engines:
        ranks.setdefault(e.world_rank, []).append(e)
    lines = []
    for rank in sorted(ranks):
        finished: list[dict[str, Any]] = []
        sections: list[str] = []
        n_pending = 0
        for e in sorted(ranks[rank], key=lambda e: communicator_label(e) != ""):
            live = e.live_requests()
            finished += e.flight.dicts(e.rank)
            n_pending += len(live)
            label = communicator_label(e)
            if label and (live or scopes(e)):
                sections.append(f"  {label}: {len(live)} pending op(s)")
            sections += [f"  {s}" for s in describe_scopes(e)]
            sections += [f"  pending  {format_entry(d)}" for d in e.flight.dicts(e.rank, live)
                         if d["finish"] is None]
        shown = finished if last is None else finished[-last:] if last else []
        lines.append(f"rank {rank}: {n_pending} pending op(s), last {len(shown)} of "
                     f"{len(finished)} finished op(s) recorded")
        lines += sections
        lines += [f"  finished {format_entry(d)}" for d in shown]
    return "\n".join(lines)


def collective_lines(engines: Sequence[EngineView]) -> list[str]:
    """``rank 1: inside allreduce (ring), ..., waiting on rank 0 (recv tag 1)``, for every
    collective call of ``engines`` with ops pending."""
    return [f"rank {e.world_rank}: {s}" for e in engines for s in describe_scopes(e)]

