"""When a rank dies, the rest go on: revoke, failure acknowledgement, agree, shrink (ULFM).

The semantics are ULFM's (Open MPI 5, ``MPI_Comm_revoke``/``agree``/``shrink``/
``ack_failed``/``get_failed``): in-process worlds (instant or on the modelled cluster), here;
worlds of processes (``backend="processes"``), by the protocol of ``_comm/agreement.py``
under the same rules; not on MPI (mpi4py 4.1.2 raises ``NotImplementedError`` for
``Comm.Revoke``, ``Agree`` and ``Shrink`` on the MPICH here, and the wire's own protocol
over MPI would need MPI to survive a rank's death, which it does not).

Rule 1 (failure).  A member of a communicator has *failed* once its end of the
communicator closed: its program raised, returned, or closed it.  Its peers' ops that only
it could complete fail with ``CommBrokenError`` naming it, as they always have; a wildcard
recv (``ANY_SOURCE``) waits on while another rank is left.  ``failed()`` is the ranks this
rank knows to have failed, now (it only grows).  ``ack_failed()`` acknowledges them and
returns the acknowledged ranks; from a rank's first ``ack_failed()`` on, its wildcard recvs
and probes on that communicator follow ULFM: one fails with ``CommBrokenError`` naming a
failed rank not acknowledged yet (pending ones at once), so a server that receives from
any rank learns that a client failed; ``ack_failed()`` again, and it receives from the
others.  A program that never calls it sees what it always saw.
Rule 2 (a collective that loses a member).  When a collective call fails on a rank because
a member failed (a ``CommBrokenError`` naming it), every member's collectives (and
objects: both use the private context) fail from then on with ``CommBrokenError`` naming
that member: pending calls at once, later ones as they post.  So no survivor waits in a
collective for a rank that waits for the failed one: each gets a result or that error as
soon as one member detected the failure (in-process: when the failed rank closed).
Point-to-point between survivors goes on working.
Rule 3 (revoke).  ``revoke()`` returns at once, having revoked the communicator on every
member (one process: directly; on the modelled cluster at the same model time): every op
that has not matched, pending or posted later (point-to-point, probes, collectives,
objects, ``split``/``dup``), fails with ``CommRevokedError`` naming the rank that revoked.
A matched transfer finishes (an op that completed is never reported failed, nothing is
lost or duplicated).  Revoking again, from any rank, changes nothing.
Rule 4 (agree).  ``agree(flag)`` is the k-th fault-tolerant call of each rank (``agree``
and ``shrink`` share the count; every rank must make them in the same order).  It decides
once every member has called it or failed: the value is the bitwise AND of the flags of
the members that had not failed then, and the failed set is those that had; every rank
that returns from it gets that same value and leaves it having acknowledged exactly that
failed set (``acked_failed()`` is then the same tuple on every survivor).  A member that
fails during the call is either in the failed set (its flag left out) or took part:
never half.  It works on a revoked communicator.
Rule 5 (shrink).  ``shrink()`` agrees the same way, then makes a new communicator of the
members that had not failed at the decision, ranked in their old order, the same on every
survivor; ``new.parent_rank(r)`` is new rank r's rank in the old communicator.  It works
on a revoked communicator; the new one is not revoked, and is closed with the old one (a
sub-communicator).  A survivor that leaves the call after the decision (cancelled) has
its end of the new communicator closed: the others see it as failed there.

How it decides (in one process): the agreement's state belongs to the group (not to a
coordinating rank, so no coordinator can die mid-call); it decides at the contribution or
the close that completes it, in one step of the event loop, and wakes every waiting
survivor with the one decision.  Across processes (``_comm/agreement.py``) the lowest-ranked
live member coordinates each call and, if it dies, the next one takes over; every call
here goes there when the communicator's members are in other processes.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._exceptions import CommBrokenError, CommClosedError, CommRevokedError
from ..transports.local import LocalLink
from .agreement import ALL, Remote, check_what, remote
from .view import CommView

__all__ = ["ack_failed", "acked_failed", "agree", "failed", "lost_member", "parent_rank",
           "revoke", "shrink"]

_ALL = ALL  # the AND of no flags: every bit set


@dataclass
class _Agreement:
    """One fault-tolerant call (the k-th of every rank) while it decides."""

    what: str
    flags: dict[int, int] = field(default_factory=dict)
    waiting: dict[int, asyncio.Future[tuple[int, frozenset[int]]]] = field(
        default_factory=dict)
    made: asyncio.Future[list[Any]] | None = None  # shrink: the new group's communicators
    survivors: list[int] = field(default_factory=list)  # shrink: their old ranks


class _Group:
    """The fault-tolerance state of one in-process group (a communicator's members)."""

    def __init__(self, link: LocalLink, comms: list[Any]) -> None:
        self.comms = comms  # every member's communicator, by rank
        self.size = len(comms)
        self.gone = link.gone  # the ranks whose end closed (the link's, shared)
        self.revoked_by: int | None = None
        self.acked: list[frozenset[int]] = [frozenset()] * self.size
        self.calls = [0] * self.size  # agree and shrink calls each rank made
        self.open: dict[int, _Agreement] = {}  # undecided, by call number

    def failed(self, rank: int) -> frozenset[int]:
        return frozenset(r for r in self.gone if 0 <= r < self.size and r != rank)

    def join(self, rank: int, what: str, flag: int,
             loop: asyncio.AbstractEventLoop
             ) -> tuple[_Agreement, asyncio.Future[tuple[int, frozenset[int]]]]:
        k = self.calls[rank]
        agreement = self.open.get(k)
        if agreement is not None and agreement.what != what:  # (nothing taken: checked)
            raise ValueError(f"rank {rank} called {what} where another rank called "
                             f"{agreement.what}: every rank makes its agree and shrink "
                             "calls in the same order")
        self.calls[rank] = k + 1
        if agreement is None:
            agreement = self.open[k] = _Agreement(what)
        agreement.flags[rank] = flag
        fut: asyncio.Future[tuple[int, frozenset[int]]] = loop.create_future()
        agreement.waiting[rank] = fut
        self.decide(k)
        return agreement, fut

    def decide(self, k: int) -> None:
        """Decide the k-th call if every member has called it or failed (Rule 4)."""
        agreement = self.open[k]
        gone = self.gone
        if any(r not in agreement.flags and r not in gone for r in range(self.size)):
            return
        del self.open[k]
        failed = frozenset(r for r in range(self.size) if r in gone)
        value = _ALL
        for r, flag in agreement.flags.items():
            if r not in failed:
                value &= flag
        if agreement.what == "shrink":
            agreement.survivors = [r for r in range(self.size) if r not in failed]
            agreement.made = asyncio.ensure_future(self._make(agreement, k))
        for fut in agreement.waiting.values():
            if not fut.done():
                fut.set_result((value, failed))

    def acknowledge(self, rank: int, ranks: frozenset[int]) -> None:
        self.acked[rank] = ranks
        engine = self.comms[rank]._engine
        if engine.acked is not None:
            engine.acked = ranks

    def closed(self, rank: int) -> None:
        """The link's watcher: a member closed.  Its peers that acknowledge failures hear
        of it at once, wildcard recvs included (Rule 1); open calls may be complete."""
        for member in self.comms:
            engine = member._engine
            if (engine.acked is not None and not engine.closed and engine.rank != rank
                    and rank not in engine.unheard):
                engine.peer_closed(rank, None)
        for k in sorted(self.open):
            if k in self.open:
                self.decide(k)

    async def _make(self, agreement: _Agreement, k: int) -> list[Any]:
        """The new communicators of the survivors of a shrink; those of survivors that
        left the call before the decision (cancelled) close at once (Rule 5)."""
        family = self.comms[0]._family
        survivors = agreement.survivors
        made = list(await asyncio.gather(*(
            family.child(self.comms[r], survivors, 0, ("shrink", k)) for r in survivors)))
        for r, sub in zip(survivors, made, strict=True):
            if agreement.waiting[r].cancelled():
                self.comms[r]._linger(asyncio.ensure_future(sub.aclose()))
        return made


_GROUPS: weakref.WeakKeyDictionary[LocalLink, _Group] = weakref.WeakKeyDictionary()


def _group(comm: CommView) -> _Group:
    link = comm._engine.link
    if not isinstance(link, LocalLink) or comm._engine.private:
        raise NotImplementedError("revoke, agree, shrink and failure acknowledgement work on "
                                  "in-process worlds and worlds of processes, not on MPI "
                                  "(mpi4py 4.1.2 has no Comm.Revoke, Agree or Shrink here)")
    group = _GROUPS.get(link)
    if group is None:
        group = _GROUPS[link] = _Group(link, list(getattr(comm._family, "group", ())))
        link.watchers.append(group.closed)
    return group


def _ready(comm: CommView) -> None:
    """``_check_ready``, a revoked communicator allowed."""
    try:
        comm._check_ready()
    except CommRevokedError:
        pass


def _check_flag(flag: object) -> int:
    if type(flag) is bool or not isinstance(flag, int | np.integer):
        raise TypeError(f"flag must be an int, got {type(flag).__name__}")
    value = int(flag)
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"flag={value} does not fit in 64 bits")
    return value


def revoke(comm: CommView) -> None:
    """``Communicator.revoke`` (Rule 3)."""
    _ready(comm)
    ft = remote(comm)
    if ft is not None:
        ft.revoke()
        return
    group = _group(comm)
    if group.revoked_by is not None:
        return
    group.revoked_by = by = comm.rank
    for member in group.comms:
        for c in (member, member._private_comm):
            if c is not None and not c.closed:
                c._engine.revoke(CommRevokedError(
                    f"rank {c.rank}'s communicator was revoked by rank {by}", rank=c.rank,
                    revoked_by=by))


def failed(comm: CommView) -> tuple[int, ...]:
    """``Communicator.failed`` (Rule 1)."""
    _ready(comm)
    ft = remote(comm)
    if ft is not None:
        # An agree or shrink may decide that a member failed before this rank's link hears
        # of it (no order between pairs of ranks): what was acknowledged is known failed.
        return tuple(sorted(ft.gone() | ft.acked))
    return tuple(sorted(_group(comm).failed(comm.rank)))


def ack_failed(comm: CommView) -> tuple[int, ...]:
    """``Communicator.ack_failed`` (Rule 1)."""
    _ready(comm)
    ft = remote(comm)
    if ft is not None:
        acked = ft.acked = ft.acked | ft.gone()
        comm._engine.acked = acked  # from now on, unacknowledged failures fail wildcards
        return tuple(sorted(acked))
    group = _group(comm)
    acked = group.acked[comm.rank] | group.failed(comm.rank)
    comm._engine.acked = acked
    group.acknowledge(comm.rank, acked)
    return tuple(sorted(acked))


def acked_failed(comm: CommView) -> tuple[int, ...]:
    """``Communicator.acked_failed``."""
    _ready(comm)
    ft = remote(comm)
    if ft is not None:
        return tuple(sorted(ft.acked))
    return tuple(sorted(_group(comm).acked[comm.rank]))


async def agree(comm: CommView, flag: object) -> int:
    """``Communicator.agree`` (Rule 4)."""
    _ready(comm)
    value = _check_flag(flag)
    ft = remote(comm)
    if ft is not None:
        _, fut2 = ft.join("agree", value)
        what, decided, failed_set = await fut2
        _acknowledge(ft, comm, failed_set)
        check_what("agree", what, comm.rank)
        return decided
    group = _group(comm)
    _, fut = group.join(comm.rank, "agree", value, comm._loop)
    decided, failed_set = await fut
    group.acknowledge(comm.rank, failed_set)
    return decided


async def shrink(comm: CommView) -> CommView:
    """``Communicator.shrink`` (Rule 5)."""
    _ready(comm)
    ft = remote(comm)
    if ft is not None:
        return await _shrink_remote(ft, comm)
    group = _group(comm)
    agreement, fut = group.join(comm.rank, "shrink", _ALL, comm._loop)
    try:
        _, failed_set = await fut
        group.acknowledge(comm.rank, failed_set)
        assert agreement.made is not None
        comms = await asyncio.shield(agreement.made)
    except asyncio.CancelledError:
        if fut.done() and not fut.cancelled():  # decided: this rank's end closes (Rule 5)
            _close_mine(agreement, comm)
        raise
    if comm.rank not in agreement.survivors:  # it closed during the call: it failed
        raise CommClosedError(f"rank {comm.rank}'s communicator was closed during shrink",
                              rank=comm.rank)
    sub: CommView = comms[agreement.survivors.index(comm.rank)]
    return await _adopt_new(comm, sub)


def _acknowledge(ft: Remote, comm: CommView, ranks: frozenset[int]) -> None:
    ft.acked = ranks
    if comm._engine.acked is not None:
        comm._engine.acked = ranks


async def _shrink_remote(ft: Remote, comm: CommView) -> CommView:
    """``shrink`` of a communicator of processes (``agreement``, Rule P6)."""
    k, fut = ft.join("shrink", _ALL)
    try:
        what, _, failed_set = await fut
        _acknowledge(ft, comm, failed_set)
        check_what("shrink", what, comm.rank)
        sub: CommView = await asyncio.shield(ft.made[k])
    except asyncio.CancelledError:
        if k in ft.made:  # decided: this rank's end closes once made (Rule 5)
            ft.close_when_made(k)
        raise
    return await _adopt_new(comm, sub)


async def _adopt_new(comm: CommView, sub: CommView) -> CommView:
    """``sub``, made by ``comm``'s shrink, becomes its sub-communicator."""
    if comm.closed:  # closed meanwhile: nobody would close the new one
        await sub.aclose()
        raise CommClosedError(f"rank {comm.rank}'s communicator was closed during shrink",
                              rank=comm.rank)
    comm._adopt(sub)
    return sub


def _close_mine(agreement: _Agreement, comm: CommView) -> None:
    """Close this rank's end of the new communicator once it is made."""
    made = agreement.made
    assert made is not None
    mine = agreement.survivors.index(comm.rank)

    def close(done: asyncio.Future[list[Any]]) -> None:
        if not done.cancelled() and done.exception() is None:
            comm._linger(asyncio.ensure_future(done.result()[mine].aclose()))

    made.add_done_callback(close)


def parent_rank(comm: CommView, rank: object) -> int:
    """``Communicator.parent_rank``."""
    r = comm._check_rank(rank, "rank", wildcard=False)
    parent = getattr(comm, "_parent", None)
    if parent is None or parent._engine.private != comm._engine.private:
        raise ValueError(f"rank {comm.rank}'s communicator was not made from another one "
                         "(shrink, split, dup), or that one is closed")
    mine, theirs = comm._engine.world_ranks, parent._engine.world_ranks
    world = r if mine is None else mine[r]
    return world if theirs is None else theirs.index(world)


def lost_member(comm: CommView, exc: BaseException) -> None:
    """A collective call of ``comm`` failed with ``exc``: if a member failed (Rule 2),
    every member's collectives fail from now on with ``CommBrokenError`` naming it."""
    if not isinstance(exc, CommBrokenError) or exc.peer is None:
        return
    ft = remote(comm)
    if ft is not None:
        ft.lose(exc.peer)
        return
    link = comm._engine.link
    private = getattr(comm, "_private_comm", None)
    peer = exc.peer
    if not isinstance(link, LocalLink) or (
            peer not in link.gone and (private is None or peer not in private._engine.gone)):
        return
    for member in getattr(comm._family, "group", ()):
        private = member._private_comm
        if private is not None and not private.closed and private._engine.revoked is None:
            private._engine.revoke(CommBrokenError(
                f"rank {peer} failed during a collective call of this communicator (seen "
                f"by rank {comm.rank}): its collectives fail from now on; shrink it to go "
                "on without that rank", rank=member.rank, peer=peer))
