"""Programs of the fault tests on ``backend="processes"`` (importable: each rank's process
finds them by name).  A rank that dies here is killed (``SIGKILL``), as a crashed process."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass
from typing import Any

import numpy as np

import asynccomm as ac
from asynccomm._comm import agreement
from asynccomm.testing import posted
from asynccomm.transports import shm

from .common import Died, outcome
from .test_programs import leaves, recover, step

#: Bytes of a rendezvous step's message (above the eager limit).
BIG = 1 << 18


async def bounded(comm: ac.Communicator, main: Any, limit: float) -> Any:
    """``main(comm)`` within ``limit`` seconds (a hang fails the rank, not the test run)."""
    async with asyncio.timeout(limit):
        return await main(comm)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def failure_alone(comm: ac.Communicator) -> Any:
    """Rank 1 raises; rank 0's recv from it fails as it always did."""
    if comm.rank == 1:
        raise Died
    err = await outcome(comm.recv(np.zeros(1), 1))
    return err, comm.failed(), comm.acked_failed()


async def revoke_everywhere(comm: ac.Communicator) -> list[Any]:
    """Ranks 1 and 2 post ops, tell rank 0, which revokes: every pending and later op of
    every rank fails with ``CommRevokedError`` naming rank 0."""
    if comm.rank == 2:
        await comm.send(np.ones(1), 1, tag=5)  # here before the revoke, never taken
    pending: list[Any] = []
    if comm.rank == 0:
        for _ in range(2):
            await comm.recv(np.zeros(1), ac.ANY_SOURCE, tag=1)
        comm.revoke()
        comm.revoke()
    else:
        if comm.rank == 1:
            pending = [await posted(comm.recv(np.zeros(1), 0)),
                       await posted(comm.probe(ac.ANY_SOURCE, 9)),
                       await posted(comm.barrier())]
        else:
            pending = [await posted(comm.barrier()), await posted(comm.recv_obj(0)),
                       comm.isend(np.ones(BIG // 8), 0, tag=8)]  # announced, unmatched
        await comm.send(np.ones(1), 0, tag=1)
    errors = [await outcome(t) for t in pending]
    later = [await outcome(comm.send(np.ones(1), (comm.rank + 1) % 3)),
             await outcome(comm.recv(np.zeros(1), 2, tag=5)),
             await outcome(comm.isend(np.ones(BIG // 8), (comm.rank + 1) % 3)),
             await outcome(comm.allreduce(np.ones(3))),
             await outcome(comm.send_obj({"a": 1}, (comm.rank + 1) % 3)),
             await outcome(comm.dup()),
             await outcome(comm.split(0))]
    comm.revoke()
    ok = await comm.agree(comm.rank + 1)  # works on a revoked communicator: 1 & 2 & 3
    new = await comm.shrink()
    buf = np.array([1.0])
    await new.allreduce(buf)
    return [(type(e).__name__, getattr(e, "revoked_by", None), e.rank)
            for e in errors + later] + [ok, new.size, float(buf[0])]


#: The programs that share one world of 4 processes (``several``), and the ranks each
#: runs on.
SHARED = {"revoke_everywhere": 3, "agree_and": 4, "bad_flags": 2}


async def several(comm: ac.Communicator) -> dict[str, Any]:
    """Each program of ``SHARED`` in turn, on the world or on a communicator of its own
    (a split of the first ranks, closed after it): what each returned on this rank."""
    got = {}
    for name, size in SHARED.items():
        if size == comm.size:
            got[name] = await globals()[name](comm)
            continue
        sub = await comm.split(0 if comm.rank < size else None)
        if sub is not None:
            async with sub:
                got[name] = await globals()[name](sub)
    return got


async def agree_and(comm: ac.Communicator) -> Any:
    """The AND of the flags; on a ``dup`` and a ``split`` of the world too."""
    flags = [0b1110, 0b0111, 0b1111, 0b0110]
    got = [await comm.agree(flags[comm.rank])]
    dup = await comm.dup()
    got.append(await dup.agree(flags[comm.rank]))
    half = await comm.split(comm.rank % 2)
    got.append(await half.agree(flags[comm.rank]))
    return got


async def shrink_in_order(comm: ac.Communicator) -> Any:
    """Rank 1 fails; the others shrink a ``split`` of the world (its ranks reversed) and
    the world itself; wildcard recvs follow ``ack_failed``."""
    sub = await comm.split(0, key=-comm.rank)  # rank r here is world rank 3 - r
    if comm.rank == 1:
        await comm.recv(np.zeros(1), 0, tag=4)
        raise Died
    if comm.rank == 0:  # a wildcard recv fails once the failure is not acknowledged
        assert comm.ack_failed() == ()
        await comm.send(np.zeros(1), 1, tag=4)  # rank 1 fails now
        buf = np.zeros(1)
        err = await outcome(comm.recv(buf, 1, tag=4))  # now rank 0 knows: 1 failed
        assert type(err) is ac.CommBrokenError and err.peer == 1, err
        assert comm.acked_failed() == () and comm.failed() == (1,)
        err = await outcome(comm.recv(buf, ac.ANY_SOURCE, tag=3))
        assert type(err) is ac.CommBrokenError and err.peer == 1, err
        assert comm.ack_failed() == (1,)
        await comm.send(np.zeros(1), 2, tag=6)
        await comm.recv(buf, ac.ANY_SOURCE, tag=3)  # from another rank now
        assert buf[0] in (2.0, 3.0)
    elif comm.rank == 2:
        await comm.recv(np.zeros(1), 0, tag=6)
        await comm.send(np.array([2.0]), 0, tag=3)
    sub_new = await sub.shrink()
    new = await comm.shrink()
    failed = comm.failed()  # (before any survivor can have closed: they all wait below)
    buf = np.array([float(comm.rank)])
    await new.allreduce(buf)
    return ([new.parent_rank(r) for r in range(new.size)],
            [sub_new.parent_rank(r) for r in range(sub_new.size)], comm.acked_failed(),
            float(buf[0]), failed)


async def bad_flags(comm: ac.Communicator) -> Any:
    errors = []
    for flag in (1.5, True, "1", 2**63, -(2**63) - 1):
        try:
            await comm.agree(flag)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            errors.append(type(exc).__name__)
    return errors, await comm.agree(comm.rank + 2)


async def collective_loses_member(comm: ac.Communicator) -> Any:
    """Rank 2 dies; every survivor's collectives get a result or ``CommBrokenError``
    naming it, and once one failed for it, the next ones too (Rule 2): never a hang."""
    if comm.rank == 2:
        die()
    buf = np.full(4, float(comm.rank))
    got = []
    for call in (lambda: comm.bcast(buf, 0), lambda: comm.allreduce(buf), comm.barrier,
                 lambda: comm.reduce(buf, np.zeros(4), root=0), lambda: comm.allreduce(buf)):
        e = await outcome(call())
        got.append((type(e).__name__, getattr(e, "peer", None))
                   if isinstance(e, ac.AsyncCommError) else "ok")
    return got


async def coordinator_dies(comm: ac.Communicator, how: str) -> Any:
    """Rank 0 coordinates an agreement of 4 ranks and dies: ``"collecting"`` (it holds
    rank 1's contribution, not rank 2's), ``"told-one"`` (it decided and told rank 1 only),
    ``"told-none"`` (it decided and told nobody)."""
    flag = 1 if comm.rank == 0 else 3
    if comm.rank == 0:
        if how != "collecting":
            flood = agreement.Remote._flood

            def dying(self: agreement.Remote, kind: int, *args: Any, **kw: Any) -> None:
                if kind == agreement.DECIDE:
                    if how == "told-one":
                        self._send(1, kind, *args)
                    die()
                flood(self, kind, *args, **kw)

            agreement.Remote._flood = dying  # type: ignore[method-assign]
        task = await posted(comm.agree(flag))
        for r in ((1,) if how == "collecting" else (1, 2, 3)):
            await comm.recv(np.zeros(1), r, tag=1)  # after r's contribution
        if how == "collecting":
            die()
        await task
        raise AssertionError("rank 0 decided and lived")
    if comm.rank == 2 and how == "collecting":  # contributes once rank 0 is gone
        err = await outcome(comm.recv(np.zeros(1), 0, tag=2))
        assert type(err) is ac.CommBrokenError
    task = await posted(comm.agree(flag))
    await outcome(comm.send(np.ones(1), 0, tag=1))  # (rank 0 may be gone)
    value = await task
    acked = comm.acked_failed()
    new = await comm.shrink()
    buf = np.ones(1)
    await new.allreduce(buf)
    return value, acked, [new.parent_rank(r) for r in range(new.size)], buf[0]


@dataclass(frozen=True)
class Kill:
    size: int
    steps: tuple[str, ...]  # test_programs.STEPS, and "big" (rendezvous)
    victim: int
    at: int  # the step at which the victim is killed (len(steps): after the last)
    during: bool  # after posting the step's ops (they may be moving), or before


async def big(comm: ac.Communicator, i: int) -> None:
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    out = np.full(BIG // 8, comm.rank * 1000 + i, np.int64)
    got = np.zeros_like(out)
    await comm.sendrecv(out, right, got, left, sendtag=50 + i, recvtag=50 + i)
    assert (got == left * 1000 + i).all()


async def killed(comm: ac.Communicator, plan: Kill) -> Any:
    """The victim is killed at a step; the survivors catch the error, revoke, agree,
    shrink and finish on the shrunk communicator (``test_programs.final``)."""
    if comm.rank == 0:
        comm.ack_failed()
    errors: list[BaseException] = []
    try:
        for i, what in enumerate((*plan.steps, None)):
            one = (None if what is None else big(comm, i) if what == "big"
                   else step(comm, what, i))
            if comm.rank == plan.victim and i == plan.at:
                if plan.during and one is not None:
                    await posted(one)  # its ops posted: part may be moving
                elif one is not None:
                    one.close()
                die()
            if one is not None:
                await one
    except (ac.CommBrokenError, ac.CommRevokedError, ExceptionGroup) as exc:
        errors.extend(leaves(exc))
        comm.revoke()
    return ([(type(e).__name__, getattr(e, "peer", None)) for e in errors],
            *await recover(comm, errors))


async def never_joins(comm: ac.Communicator) -> list[Any]:
    """Rank 2 takes part in splits of 3 ranks (rank 0 says GO) but never joins the new
    communicator, as its last rank or as its first (which makes its world): it could not
    hear the GO (``forfeits``: its private context failed, as when a member is lost), its
    open fails by an error of its own (``raises``), its process dies as it opens
    (``dies``).  Ranks 0 and 1 are told, naming it, instead of waiting for it: their split
    fails, or their ops with it fail and they go on without it."""
    got = []
    for first in (False, True):
        dup = await comm.dup()  # (rank 2 breaks the private context of this one)
        got.append(await _split_without_2(dup, "forfeits", first))
        await dup.aclose()
    got.append(await _split_without_2(comm, "raises", False))
    got.append(await _split_without_2(comm, "raises", True))
    got.append(await _split_without_2(comm, "dies", False))
    return got


async def _split_without_2(comm: ac.Communicator, how: str, first: bool) -> Any:
    key = -comm.rank if first else comm.rank  # first: new rank 0 is rank 2, the maker
    if comm.rank == 2:
        return await _not_joining(comm, how, key)
    if comm.rank == 0 and how == "forfeits":
        await comm.recv(np.zeros(1), 2)  # rank 2 has stopped listening for the GO
    try:
        sub = await comm.split(0, key)
    except ac.CommBrokenError as exc:
        return "split", exc.peer, str(exc)
    async with sub:
        lost = await outcome(sub.recv(np.zeros(1), 0 if first else 2))
        buf = np.array([float(comm.rank)])
        if comm.rank == 0:
            await sub.send(buf, 1)
        else:
            await sub.recv(buf, 0)
    return "use", type(lost).__name__, lost.peer, str(lost), float(buf[0])


async def _not_joining(comm: ac.Communicator, how: str, key: int) -> Any:
    if how == "forfeits":
        call = await posted(comm.split(0, key))  # its READY sent
        private = comm._private()
        agreement._revoke(private._engine, ac.CommBrokenError(
            "rank 1 failed during a collective call", rank=private.rank, peer=1))
        err = await outcome(call)
        await comm.send(np.ones(1), 0)
        return type(err).__name__
    node = shm.Node.current()
    assert node is not None

    async def failing(name: str, members: list[int]) -> Any:
        if how == "dies":
            die()
        raise OSError("no room for the segment")

    node.open_segment = failing  # type: ignore[method-assign]
    try:
        await comm.split(0, key)
    except OSError as exc:
        return type(exc).__name__
    finally:
        del node.open_segment
    raise AssertionError("rank 2 joined")
