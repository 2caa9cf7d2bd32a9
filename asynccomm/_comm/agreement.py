"""Revoke, agree and shrink when the members are in other processes (the shared-memory
link): the same calls and rules as ``_comm.faults`` (docs/faults.md), as a protocol.

The protocol's messages are control messages of the communicator's own link (the wire's
``FT`` kind, beside the point-to-point protocol's; the link hands them to ``Remote``, its
``ft`` hook, and tells it when a peer closed or died).  Each link delivers in order, per
pair of ranks, and a peer's death is known at once and exactly (its ``pidfd``), after what
it published before it died: that is all the protocol relies on.  A member has *failed*
once its end closed (a ``CLOSE``, said by it or for it when its process died).

Rule P1 (revoke).  ``revoke()`` revokes the communicator here (this rank's ops, and its
private context's, fail with ``CommRevokedError``) and sends ``REVOKE`` to every member;
a member that receives its first ``REVOKE`` does the same, forwarding it to every member
(so a revoke reaches every live member even if the revoker dies while sending).  A later
``REVOKE`` changes nothing.  ``revoked_by`` is the rank whose revoke arrived first.
Rule P2 (a lost member).  A collective that fails here because member f failed (Rule 2 of
``faults``) fails this rank's collectives from now on, and sends ``LOST(f)`` to every
member; its first ``LOST`` does the same on each member, forwarded the same way.
Rule P3 (contributions).  The k-th ``agree``/``shrink`` of a rank sends ``CONTRIB(k,
flag, failures it knows)`` to its coordinator: the lowest-ranked member it does not know
to have failed (itself, perhaps).  When it learns that its coordinator failed before it
holds the decision, it sends the same to the next one.
Rule P4 (deciding).  A member that is the coordinator (by its own knowledge) decides call
k once it has called k itself and every member has contributed to it or is known failed
(its own knowledge, and the failures the contributions name): the value is the AND of the
flags of the contributors not failed, the failed set the failed members.  It sends
``DECIDE`` to every member it does not know failed.
Rule P5 (one decision).  A member that receives its first ``DECIDE(k)`` keeps it, forwards
it to every member it does not know failed, and only then returns it (a later ``DECIDE(k)``
changes nothing; a coordinator that holds one answers a ``CONTRIB(k)`` with it).  So once
any rank holds a decision, every live member receives it before it can learn that that
rank failed (in-order delivery; a death is seen after what was published), so before a
new coordinator could count every live member's contribution: no coordinator decides
anew, and no two ranks return different decisions.  A coordinator that dies before any
live member holds its decision decided for nobody; the next one collects the
contributions again (Rule P3).  A decision may reach a member before its link sees the
death of a member the decision names (no order between pairs of ranks): ``failed()``
names the acknowledged members too.
Rule P6 (shrink).  A shrink's decision names the survivors (the members not failed); each
survivor opens a new world of them, in their old order (``Node.open_world``, through the
family's ``child``), even if its call was cancelled meanwhile (then it closes its end at
once, as in-process).  A survivor whose process dies while the new world opens makes the
others' shrink fail with ``CommBrokenError`` naming it: they shrink again.
"""

from __future__ import annotations

import asyncio
import copy
import struct
from array import array
from typing import Any

from .._core.states import POSTED
from .._core.wire import FT, HEADER
from .._engine.engine import SEND, DeviceEngine
from .._exceptions import CommBrokenError, CommRevokedError
from .view import CommView

__all__ = ["ALL", "Remote", "attach", "check_what", "remote"]

ALL = -1  # the AND of no flags: every bit set

#: The protocol's messages (the first byte of an ``FT`` message's payload).
REVOKE = 1
LOST = 2
CONTRIB = 3
DECIDE = 4
#: type, what (0 agree, 1 shrink), call number, flag or value, rank (who revoked, who was
#: lost); then the failed ranks (int32 each).
_BODY = struct.Struct("<BBxxxxxxqqq")
_WHAT = ("agree", "shrink")

Decision = tuple[str, int, frozenset[int]]


class Remote:
    """One rank's side of the protocol for one communicator (see module docs); its link's
    ``ft`` hook."""

    def __init__(self, comm: CommView, link: Any) -> None:
        self.comm = comm
        self.link = link
        self.rank = comm.rank
        self.size = comm.size
        self.revoked_by: int | None = None
        self.lost: int | None = None
        self.acked: frozenset[int] = frozenset()
        self.calls = 0  # this rank's agree and shrink calls
        self.mine: dict[int, tuple[str, int]] = {}  # its contributions, by call number
        self.sent_to: dict[int, int] = {}  # where each went
        self.decided: dict[int, Decision] = {}
        self.waiting: dict[int, asyncio.Future[Decision]] = {}
        self.made: dict[int, asyncio.Future[Any]] = {}  # shrinks: this rank's new comm
        #: As coordinator: the contributions, by call number, by rank (flag, failures).
        self.contribs: dict[int, dict[int, tuple[str, int, frozenset[int]]]] = {}

    # -- what this rank knows --------------------------------------------------------------

    def gone(self) -> frozenset[int]:
        """The members known failed here (their end closed)."""
        return frozenset(r for r in self.link.wire.closed_by if r != self.rank)

    def coordinator(self) -> int:
        gone = self.gone()
        return min(r for r in range(self.size) if r not in gone)

    # -- sending ------------------------------------------------------------------------

    def _send(self, dest: int, kind: int, what: str, k: int, value: int, rank: int,
              ranks: frozenset[int] = frozenset()) -> None:
        link = self.link
        if link.wire.close_sent or link._broken is not None or dest in link.wire.closed_by:
            return  # closed here (failed: nobody waits for it) or there
        body = (_BODY.pack(kind, _WHAT.index(what), k, value, rank)
                + array("i", sorted(ranks)).tobytes())
        link._send(dest, HEADER.pack(FT, 0, self.rank, 0, len(body), 0, 0, b"") + body)

    def _flood(self, kind: int, what: str, k: int, value: int, rank: int,
               ranks: frozenset[int] = frozenset()) -> None:
        """Send to every member not known failed here."""
        gone = self.gone()
        for dest in range(self.size):
            if dest != self.rank and dest not in gone:
                self._send(dest, kind, what, k, value, rank, ranks)

    # -- the link's hook ----------------------------------------------------------------

    def message(self, source: int, payload: bytes) -> None:
        kind, what_i, k, value, rank = _BODY.unpack_from(payload)
        ranks = frozenset(array("i", payload[_BODY.size:]))
        what = _WHAT[what_i]
        if kind == REVOKE:
            self._revoked(rank)
        elif kind == LOST:
            self._lost(rank)
        elif kind == CONTRIB:
            self._contributed(k, source, what, value, ranks)
        elif kind == DECIDE:
            self._decided(k, (what, value, ranks))

    def closed(self, source: int) -> None:
        """A member closed or died: contributions go to the next coordinator, and open
        calls may now be decided here."""
        coordinator = self.coordinator()
        for k, (what, flag) in self.mine.items():
            if k not in self.decided and self.sent_to.get(k) != coordinator:
                self._contribute(k, what, flag)
        for k in list(self.contribs):
            self._try(k)

    # -- revoke (P1), a lost member (P2) ---------------------------------------------------

    def revoke(self) -> None:
        self._revoked(self.rank)

    def _revoked(self, by: int) -> None:
        if self.revoked_by is not None:
            return
        self.revoked_by = by
        comm = self.comm
        for c in (comm, _private_of(comm)):
            if c is not None and not c.closed:
                _revoke(c._engine, CommRevokedError(
                    f"rank {c.rank}'s communicator was revoked by rank {by}", rank=c.rank,
                    revoked_by=by))
        self._flood(REVOKE, "agree", 0, 0, by)

    def lose(self, peer: int) -> None:
        private = _private_of(self.comm)
        if peer in self.gone() or (private is not None and peer in private._engine.gone):
            self._lost(peer)

    def _lost(self, peer: int) -> None:
        if self.lost is not None:
            return
        self.lost = peer
        private = _private_of(self.comm)
        if private is not None and not private.closed and private._engine.revoked is None:
            _revoke(private._engine, CommBrokenError(
                f"rank {peer} failed during a collective call of this communicator: its "
                "collectives fail from now on; shrink it to go on without that rank",
                rank=self.rank, peer=peer))
        self._flood(LOST, "agree", 0, 0, peer)

    # -- agree and shrink (P3 to P6) -------------------------------------------------------

    def join(self, what: str, flag: int) -> tuple[int, asyncio.Future[Decision]]:
        """This rank's next fault-tolerant call: its number, and the decision to come."""
        k = self.calls
        self.calls = k + 1
        fut: asyncio.Future[Decision] = self.comm._loop.create_future()
        self.mine[k] = (what, flag)
        self.waiting[k] = fut
        if k in self.decided:
            self._resolve(k)
        else:
            self._contribute(k, what, flag)
        return k, fut

    def _contribute(self, k: int, what: str, flag: int) -> None:
        coordinator = self.sent_to[k] = self.coordinator()
        if coordinator == self.rank:
            self._contributed(k, self.rank, what, flag, self.gone())
        else:
            self._send(coordinator, CONTRIB, what, k, flag, 0, self.gone())

    def _contributed(self, k: int, source: int, what: str, flag: int,
                     failures: frozenset[int]) -> None:
        decided = self.decided.get(k)
        if decided is not None:  # decided already: that is the answer
            if source != self.rank:
                self._send(source, DECIDE, decided[0], k, decided[1], 0, decided[2])
            return
        self.contribs.setdefault(k, {})[source] = (what, flag, failures)
        self._try(k)

    def _try(self, k: int) -> None:
        """Decide call k if this rank coordinates it and may (Rule P4)."""
        contribs = self.contribs.get(k)
        if (contribs is None or self.rank not in contribs or k in self.decided
                or self.coordinator() != self.rank):
            return
        failed = set(self.gone())
        for _, _, failures in contribs.values():
            failed |= failures
        failed.discard(self.rank)
        if any(r not in contribs and r not in failed for r in range(self.size)):
            return
        value = ALL
        for r, (_, flag, _) in contribs.items():
            if r not in failed:
                value &= flag
        self._decided(k, (contribs[self.rank][0], value, frozenset(failed)))

    def _decided(self, k: int, decision: Decision) -> None:
        if k in self.decided:
            return
        self.decided[k] = decision
        self.contribs.pop(k, None)
        what, value, failed = decision
        self._flood(DECIDE, what, k, value, 0, failed)  # before anything else (Rule P5)
        if k in self.mine:
            self._resolve(k)

    def _resolve(self, k: int) -> None:
        what, value, failed = decision = self.decided[k]
        if what == "shrink" and self.mine[k][0] == "shrink" and k not in self.made:
            self.made[k] = asyncio.ensure_future(self._make(k, failed))
        fut = self.waiting.pop(k, None)
        if fut is not None and not fut.done():
            fut.set_result(decision)
        elif k in self.made:  # its call was cancelled before the decision
            self.close_when_made(k)

    def close_when_made(self, k: int) -> None:
        """Close this rank's end of shrink k's new communicator once it is made (its call
        left after the decision: Rule 5)."""
        comm = self.comm

        def close(done: asyncio.Future[Any]) -> None:
            if not done.cancelled() and done.exception() is None:
                comm._linger(asyncio.ensure_future(done.result().aclose()))

        self.made[k].add_done_callback(close)

    async def _make(self, k: int, failed: frozenset[int]) -> Any:
        comm = self.comm
        survivors = [r for r in range(self.size) if r not in failed]
        return await comm._family.child(comm, survivors, 0, ("shrink", k))


def _private_of(comm: CommView) -> Any:
    """``comm``'s private context, if it has one."""
    return getattr(comm, "_private_comm", None)


def _revoke(engine: DeviceEngine, exc: BaseException) -> None:
    """``engine.revoke(exc)``, and its announced sends withdrawn too: their receivers are
    in other processes, which decide (a send they matched already completes)."""
    engine.revoke(exc)
    for req in engine.live_requests():
        if req.kind is SEND and req._state is POSTED:
            engine.withdraw(req, copy.copy(exc), ask=True)


def attach(comm: CommView, link: Any) -> None:
    """Give ``comm`` (a communicator of processes, not a private context) its side of the
    protocol, before any message of it can arrive."""
    link.ft = Remote(comm, link)
    # Poll now: the link joined a poll that may be asleep with no doorbell armed on it, and
    # a peer's first message (a contribution, perhaps) may be on its rings already.
    link.node.kick()


def remote(comm: CommView) -> Remote | None:
    """``comm``'s side of the protocol, if its members are in other processes."""
    ft = getattr(comm._engine.link, "ft", None)
    return ft if isinstance(ft, Remote) and not comm._engine.private else None


def check_what(mine: str, decided: str, rank: int) -> None:
    """Raise ``ValueError`` if this rank's call is not the one decided."""
    if mine != decided:
        raise ValueError(f"rank {rank} called {mine} where another rank called {decided}: "
                         "every rank makes its agree and shrink calls in the same order")
