"""What a rank's engine knows of its peers closing, and how it describes its unfinished
ops: the ``DeviceEngine`` steps that read the whole rank rather than one op (peers that
closed or failed, diagnostics, statistics).  Like the rest of the engine, only these steps
change request state here, through ``withdraw`` and ``_finish``."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._buffers import PoolStatistics, StagingPool
from .._core.matching import Matcher, MatcherStatistics
from .._core.states import DONE, POSTED, QUEUED, Kind, State
from .._exceptions import CommBrokenError
from .._types import ANY_SOURCE
from . import diagnostics as diag

if TYPE_CHECKING:
    from ..transports.base import Link
    from .request import Request
    from .stream import Stream

__all__ = ["EngineStatistics", "PeersMixin"]

SEND = Kind.SEND
COMPUTE = Kind.COMPUTE


@dataclass(frozen=True, slots=True)
class EngineStatistics:
    """A snapshot of one rank's engine."""

    pending_ops: int
    """Operations submitted and not finished."""
    active_copies: int
    """Payload copies running on worker threads."""
    streams: int
    """Streams of this rank, the default one included."""
    matcher: MatcherStatistics
    pool: PoolStatistics


class PeersMixin:
    """The whole-rank steps of ``DeviceEngine`` (see module docs)."""

    if not TYPE_CHECKING:  # (mypy would refuse the fields the class that mixes it in lists)
        __slots__ = ()  # that class lists the fields

    rank: int
    size: int
    closed: bool
    fast: bool
    traced: bool
    failure: BaseException | None
    gone: set[int]
    unheard: set[int]
    matcher: Matcher
    pool: StagingPool
    link: Link
    _n_pending: int
    _copies: int
    _streams: weakref.WeakSet[Stream]

    if TYPE_CHECKING:
        def _live(self) -> list[Request]: ...
        def withdraw(self, req: Request, exc: BaseException | None, *,
                     ask: bool = True) -> bool: ...
        def _finish(self, req: Request, state: State, exc: BaseException | None) -> None: ...

    def peer_closed(self, rank: int, exc: BaseException | None) -> None:
        """``rank`` closed or failed: fail recvs and probes that only it could have matched,
        and wildcard ones once no other rank is left (with ``exc``, or a
        ``CommBrokenError`` naming it)."""
        self.gone.add(rank)
        if self.closed or not self._n_pending:
            return
        everyone = self._heard() >= self.size - 1
        if not self.matcher.waits_for(rank, wildcards=everyone):
            return  # (a queued recv meets the closed peer when it is posted)
        for req in [r for r in self._live() if r.kind is not SEND and r.kind is not COMPUTE
                    and (r.peer == rank or (everyone and r.peer == ANY_SOURCE))]:
            if req._state is POSTED:
                self.withdraw(req, exc if exc is not None and req.peer == rank
                              else self.broken(req.peer))

    def _unreachable(self, peer: int) -> bool:
        """True if no rank is left that could send what an op from ``peer`` waits for.  A
        wildcard gives up once every other rank has closed (a message to itself is matched
        when it is posted, so a rank waiting on ANY_SOURCE alone would wait forever)."""
        if peer == ANY_SOURCE:
            return self.size > 1 and self._heard() >= self.size - 1
        return peer in self.gone and peer != self.rank and peer not in self.unheard

    def _heard(self) -> int:
        """How many other ranks this rank knows to have closed."""
        gone = self.gone
        return len(gone) - (self.rank in gone) - len(self.unheard)

    def broken(self, peer: int) -> CommBrokenError:
        """The error for an op of this rank that ``peer`` (``ANY_SOURCE``: every other
        rank), now closed, can never complete."""
        if peer != ANY_SOURCE:  # (the closed ranks are named for wildcards only)
            why, cause = self.link.why_gone(peer)
            return diag.broken(self.rank, peer, self.gone, why, cause)
        return diag.broken(self.rank, peer, self.gone - self.unheard - {self.rank})

    def broke(self, exc: BaseException) -> None:
        """The link failed underneath: fail every unfinished op of this rank with ``exc``,
        and every op posted from now on that no message already here completes (the fast
        lanes close: the usual way checks)."""
        self.failure = exc
        self.fast = self.traced = False
        for req in self._live():
            if req._state < DONE:
                self._finish(req, DONE, diag.fresh_copy(exc))

    @property
    def pending_ops(self) -> int:
        """How many ops of this rank are unfinished."""
        return self._n_pending

    def live_requests(self) -> list[Request]:
        """Every unfinished op of this rank (a copy)."""
        return self._live()

    def describe_all(self) -> list[str]:
        """Every unfinished op of this rank, for deadlock reports."""
        return [diag.describe(r) + ("" if r._state is not QUEUED else " queued on its stream")
                for r in self._live()]

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(pending_ops=self.pending_ops, active_copies=self._copies,
                                streams=len(self._streams), matcher=self.matcher.statistics(),
                                pool=self.pool.statistics())
