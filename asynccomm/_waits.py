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
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING

from ._core.states import Kind

if TYPE_CHECKING:
    from ._collective_algorithms import Exchange
    from ._engine import DeviceEngine
    from ._request import Request

__all__ = ["Scope", "armed", "armed_timeout", "describe_scopes", "during", "inside", "scope_of",
           "scopes"]

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
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        loop, self._loop = self._loop, None
        if loop is not None:
            _ARMED[loop] -= 1
        return await self._cm.__aexit__(exc_type, exc, tb)


def armed(loop: asyncio.AbstractEventLoop) -> int:
    """How many library timeouts are armed on ``loop`` now."""
    return _ARMED.get(loop, 0)


# -- collective scopes --------------------------------------------------------------------

class Scope:
    """One collective call on one rank (Rule 2)."""

    __slots__ = ("__weakref__", "algo", "during", "exchange", "span", "where")

    def __init__(self, exchange: Exchange, where: str, algo: str, span: int) -> None:
        self.exchange = weakref.ref(exchange)
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
        tag = ex.tag
        for_ = f" for {self.during}" if self.during else ""
        waits = ", ".join(f"rank {r.peer} ({r.kind.value} tag {r.tag})"
                          for r in self.waiting() if r.kind is not Kind.COMPUTE)
        return (f"inside {self.where}{for_} ({self.algo}), tags {tag}..{tag + self.span - 1}, "
                f"step {getattr(ex, 'step', 0)}, waiting on {waits or 'nothing'}")


def inside(exchange: Exchange, where: str, algo: str, span: int) -> None:
    """Register ``exchange`` as collective ``where`` run with ``algo`` (Rule 2), on the
    engine of the communicator it runs on (nothing for other communicator-likes)."""
    engine = getattr(exchange.comm, "_engine", None)
    if engine is None:
        return
    engine.scopes = [s for s in engine.scopes if s.waiting()]  # forget the finished
    engine.scopes.append(Scope(exchange, where, algo, span))


@contextmanager
def during(operation: str) -> Iterator[None]:
    """The collectives run inside this block do it for ``operation`` (``split``)."""
    token = _DURING.set(operation)
    try:
        yield
    finally:
        _DURING.reset(token)


def scopes(engine: DeviceEngine) -> list[Scope]:
    """The collective calls of ``engine`` with ops pending."""
    return [s for s in engine.scopes if s.waiting()]


def scope_of(engine: DeviceEngine, req: Request) -> Scope | None:
    """The collective call ``req`` belongs to, if any."""
    for s in engine.scopes:
        ex = s.exchange()
        if ex is not None and any(r is req for r in ex._live):
            return s
    return None


def describe_scopes(engine: DeviceEngine) -> list[str]:
    """One line per collective call of ``engine`` with ops pending."""
    return [s.describe() for s in scopes(engine)]
