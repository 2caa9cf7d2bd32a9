"""Failures during a collective: the point-to-point op's own typed error, noted with the
collective, its algorithm, tags and rank; every op of the call withdrawn before it leaves."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm._collectives import functions as coll
from asynccomm.testing import posted

from .cases import SLOW, virtual


def ring(names: Any, nbytes: int, size: int) -> str:
    return "ring"


def notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


async def idle(world: ac.World, *ranks: int) -> None:
    for r in ranks:
        stats = world.comms[r].statistics()
        assert stats.pending_ops == 0 and stats.matcher.posted_recvs == 0, (r, stats)


async def works(world: ac.World, ranks: list[int] | None = None) -> None:
    """A good collective on every rank still runs (on tags the failed call did not use)."""
    comms = world.comms

    async def one(comm: ac.Communicator) -> None:
        x = np.ones(3, np.int64)
        await coll.allreduce(comm, x, tag=3 * coll.TAG_SPAN)
        assert (x == len(comms)).all()

    await asyncio.gather(*(one(c) for c in comms))


async def test_a_peer_that_closed_breaks_the_call() -> None:
    async with asyncio.timeout(10), ac.open_world(3) as world:
        await world.comms[2].aclose()
        got = await asyncio.gather(
            *(coll.allreduce(c, np.ones(8), tag=100, choose=ring) for c in world.comms[:2]),
            return_exceptions=True)
        for rank, exc in enumerate(got):
            assert isinstance(exc, ac.CommBrokenError), exc
            assert f"during allreduce (ring, tags 100..4195) on rank {rank} of 3" in notes(exc)
        await idle(world, 0, 1)


def test_timeout_bounds_the_whole_call_not_each_op() -> None:
    async def body(world: ac.World) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        got = await asyncio.gather(
            *(coll.allreduce(c, np.ones(16), tag=0, timeout=1.0, choose=ring)
              for c in world.comms), return_exceptions=True)
        assert loop.time() - start == pytest.approx(1.0, abs=0.05)  # each op takes ~0.3 s
        for rank, exc in enumerate(got):
            assert isinstance(exc, ac.CommTimeoutError), exc
            assert exc.op == "allreduce" and exc.timeout == 1.0 and exc.rank == rank
            assert "did not finish within 1.0 s" in str(exc)
            assert f"during allreduce (ring, tags 0..4095) on rank {rank} of 4" in notes(exc)
        await asyncio.sleep(1.0)  # messages in flight land as unexpected, nothing waits
        await idle(world, 0, 1, 2, 3)
        await works(world)

    virtual(4, body, SLOW)


def test_a_call_within_its_timeout_succeeds() -> None:
    async def body(world: ac.World) -> None:
        xs = [np.full(16, c.rank, np.int64) for c in world.comms]
        await asyncio.gather(*(coll.allreduce(c, x, tag=0, timeout=5.0, choose=ring)
                               for c, x in zip(world.comms, xs, strict=True)))
        assert all((x == 6).all() for x in xs)

    virtual(4, body, SLOW)


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "bcast", "alltoall"])
def test_cancellation_mid_collective_leaves_nothing_pending(collective: str) -> None:
    async def body(world: ac.World) -> None:
        p = world.size
        calls = {
            "allreduce": lambda c: coll.allreduce(c, np.ones(1 << 16), tag=0, choose=ring),
            "allgather": lambda c: coll.allgather(c, np.ones(1 << 16),
                                                  np.empty((p, 1 << 16)), tag=0),
            "bcast": lambda c: coll.bcast(c, np.ones(1 << 16), tag=0),
            "alltoall": lambda c: coll.alltoall(c, np.ones((p, 1 << 14)),
                                                np.empty((p, 1 << 14)), tag=0),
        }
        tasks = [asyncio.create_task(calls[collective](c)) for c in world.comms]
        await asyncio.sleep(0.5)  # mid-call: each step takes 0.3 s or more
        assert not any(t.done() for t in tasks)
        for t in tasks:
            t.cancel()
        got = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(g, asyncio.CancelledError) for g in got), got
        await asyncio.sleep(2.0)
        await idle(world, *range(p))
        await works(world)

    virtual(4, body, SLOW)


async def test_cancellation_on_a_real_loop_leaves_nothing_pending() -> None:
    async with asyncio.timeout(10), ac.open_world(3) as world:
        # rank 2 never joins: ranks 0 and 1 wait mid-call until cancelled
        tasks = [await posted(coll.allreduce(c, np.ones(1 << 15), tag=0, choose=ring))
                 for c in world.comms[:2]]  # each waits on its first step's ops
        for t in tasks:
            t.cancel()
        got = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(g, asyncio.CancelledError) for g in got), got
        await idle(world, 0, 1)


@pytest.mark.timeout(30)
def test_deadlock_is_reported_with_the_note() -> None:
    async def body(world: ac.World) -> list[BaseException | None]:
        async def stuck(comm: ac.Communicator) -> None:
            await comm.recv(np.empty(1), 0, tag=99)  # never joins the allreduce

        return await asyncio.gather(  # type: ignore[no-any-return]
            *(coll.allreduce(c, np.ones(4), tag=0, choose=ring) for c in world.comms[:2]),
            stuck(world.comms[2]), return_exceptions=True)

    got = virtual(3, body, limit=None)
    assert all(isinstance(g, ac.DeadlockError) for g in got), got
    for rank in (0, 1):
        assert f"during allreduce (ring, tags 0..4095) on rank {rank} of 3" in notes(got[rank])
    assert notes(got[2]) == ""  # the one error object of the world was not written on


@pytest.mark.parametrize("size", [2, 3])
async def test_dtype_mismatch_between_ranks_is_a_match_error_with_a_hint(size: int) -> None:
    async with asyncio.timeout(10), ac.open_world(size) as world:
        def buf(rank: int) -> np.ndarray[Any, Any]:
            return np.ones(4, np.float32 if rank == 0 else np.int32)

        got = await asyncio.gather(
            *(coll.allreduce(c, buf(c.rank), tag=0, choose=ring, timeout=1.0)
              for c in world.comms), return_exceptions=True)
        mismatched = [g for g in got if isinstance(g, ac.MatchError)]
        assert mismatched, got
        for exc in mismatched:
            assert isinstance(exc, ac.DTypeMismatchError)
            assert "hint: every rank must pass allreduce buffers of the same shape and dtype" \
                in notes(exc)
        for exc in got:
            assert isinstance(exc, ac.MatchError | ac.CommTimeoutError), exc
