"""Collective calls keep their place whatever happens to them, leave buffers as they were
when they raise, and drop what the others sent a call this rank left; ``split`` and ``dup``
make a communicator on every rank or on none."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import asynccomm as ac

from .cases import SLOW, virtual


async def sums_are_right(world: ac.World, rounds: int = 3) -> None:
    """Every rank's next collectives pair with every other rank's: right sums."""
    async def one(comm: ac.Communicator) -> None:
        for i in range(rounds):
            x = np.full(5, comm.rank + 10 * i, np.int64)
            await comm.allreduce(x, timeout=5)
            assert (x == sum(range(comm.size)) + 10 * i * comm.size).all(), (comm.rank, x)

    await asyncio.gather(*(one(c) for c in world.comms))


# -- a call takes its place when called ----------------------------------------------------

@pytest.mark.parametrize("how", ["task.cancel", "wait_for 0"])
async def test_a_collective_cancelled_before_it_ran_keeps_its_place(how: str) -> None:
    async with asyncio.timeout(10), ac.open_world(3) as world:
        c0 = world.comms[0]
        x = np.ones(4)
        if how == "task.cancel":
            task = asyncio.get_running_loop().create_task(c0.allreduce(x))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(c0.allreduce(x), 0)
        assert (x == 1).all()
        # The others' first allreduce (the one rank 0 left) cannot complete: withdrawn by
        # its timeout.  Then every rank's next calls pair again.
        got = await asyncio.gather(*(c.allreduce(np.ones(4), timeout=0.5)
                                     for c in world.comms[1:]), return_exceptions=True)
        assert all(isinstance(g, ac.CommTimeoutError) for g in got), got
        await sums_are_right(world)


async def test_an_argument_error_on_one_rank_keeps_every_rank_in_step() -> None:
    async with asyncio.timeout(10), ac.open_world(2) as world:
        c0, c1 = world.comms
        with pytest.raises(ValueError, match="recvbuf"):  # rank-dependent: only the root
            await c0.reduce(np.ones(3), np.ones(4), root=0)
        await c1.reduce(np.ones(3), None, root=0)  # a leaf only sends: done as staged
        await sums_are_right(world)
        assert c0._private()._engine.statistics().pool.in_use_bytes == 0  # dropped there


def test_a_call_cancelled_before_it_ran_on_the_virtual_clock() -> None:
    async def body(world: ac.World) -> None:
        c0 = world.comms[0]
        task = asyncio.get_running_loop().create_task(c0.barrier())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        got = await asyncio.gather(*(c.barrier(timeout=1) for c in world.comms[1:]),
                                   return_exceptions=True)
        assert all(isinstance(g, ac.CommTimeoutError) for g in got), got
        await sums_are_right(world)

    virtual(4, body)


# -- buffers after an error ----------------------------------------------------------------

@pytest.mark.parametrize("in_place", [True, False])
def test_an_allreduce_that_fails_half_way_leaves_its_buffers_as_they_were(
        in_place: bool) -> None:
    """Rank 1 leaves the ring (its timeout) after the first step; rank 0 has reduced part
    of its array by then, and times out in the second step."""
    n = 1 << 16

    async def body(world: ac.World) -> None:
        c0, c1 = world.comms
        x = np.arange(n, dtype=np.float64)
        out = x if in_place else np.full(n, -1.0)
        got = await asyncio.gather(
            c0.allreduce(x, None if in_place else out, timeout=3, algorithm="ring"),
            c1.allreduce(np.ones(n), timeout=0.5, algorithm="ring"), return_exceptions=True)
        assert all(isinstance(g, ac.CommTimeoutError) for g in got), got
        assert (x == np.arange(n)).all()
        if not in_place:
            assert (out == -1.0).all()

    virtual(2, body, cluster=SLOW)


def test_a_failed_alltoall_writes_no_row() -> None:
    async def body(world: ac.World) -> None:
        recv = [np.full((3, 2), -7, np.int64) for _ in range(3)]

        async def one(comm: ac.Communicator) -> None:
            send = np.full((3, 2), comm.rank, np.int64)
            if comm.rank == 2:
                await asyncio.sleep(2)  # late: the others time out
            await comm.alltoall(send, recv[comm.rank], timeout=0.5)

        got = await asyncio.gather(*(one(c) for c in world.comms), return_exceptions=True)
        assert all(isinstance(g, ac.CommTimeoutError) for g in got), got
        for r in range(3):
            assert (recv[r] == -7).all(), (r, recv[r])
        await sums_are_right(world)

    virtual(3, body)


# -- what the others sent a call this rank left ---------------------------------------------

def test_the_messages_of_calls_one_rank_left_do_not_pile_up() -> None:
    """Rank 1 is always late; rank 0 times out every round.  Rank 0's staging pool (on the
    private context) holds at most the current round's messages, not every round's."""
    nbytes = 32 << 10

    async def body(world: ac.World) -> None:
        c0, c1 = world.comms
        peaks = []
        for _ in range(30):
            async def late() -> None:
                await asyncio.sleep(0.2)
                with pytest.raises(ac.CommTimeoutError):
                    await c1.allreduce(np.ones(nbytes // 8), timeout=0.1,
                                       algorithm="recursive_doubling")

            got = await asyncio.gather(
                c0.allreduce(np.ones(nbytes // 8), timeout=0.1, algorithm="recursive_doubling"),
                late(), return_exceptions=True)
            assert isinstance(got[0], ac.CommTimeoutError), got
            peaks.append(c0._private()._engine.statistics().pool.in_use_bytes)
        assert max(peaks) <= 2 * nbytes, peaks
        await sums_are_right(world)

    virtual(2, body)


# -- split and dup: on every rank or none ---------------------------------------------------

async def test_a_bad_color_on_one_rank_fails_the_split_on_every_rank() -> None:
    async with asyncio.timeout(10), ac.open_world(3) as world:
        async def one(comm: ac.Communicator) -> Any:
            return await comm.split(-1 if comm.rank == 1 else 0)

        got = await asyncio.gather(*(one(c) for c in world.comms), return_exceptions=True)
        assert isinstance(got[1], ValueError), got
        for r in (0, 2):
            assert isinstance(got[r], ac.CommBrokenError), got
            assert "rank 1 passed a bad argument" in str(got[r])
        await sums_are_right(world)
        subs = await asyncio.gather(*(c.split(c.rank % 2) for c in world.comms))
        assert [s.size for s in subs] == [2, 1, 2]


@pytest.mark.parametrize("culprit", [0, 2])
async def test_a_split_cancelled_on_one_rank_fails_everywhere_and_the_next_works(
        culprit: int) -> None:
    async with asyncio.timeout(10), ac.open_world(3) as world:
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(c.split(0)) for c in world.comms]
        tasks[culprit].cancel()
        got = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(got[culprit], asyncio.CancelledError), got
        for r in range(3):
            if r != culprit:
                assert isinstance(got[r], ac.CommBrokenError), got
                assert f"rank {culprit} was cancelled" in str(got[r])
        await sums_are_right(world)
        subs = await asyncio.gather(*(c.split(0) for c in world.comms))
        assert [s.size for s in subs] == [3, 3, 3]
        x = [np.full(2, c.rank, np.int64) for c in subs]
        await asyncio.gather(*(c.allreduce(v) for c, v in zip(subs, x, strict=True)))
        assert all((v == 3).all() for v in x)


def test_a_split_one_rank_is_late_for_times_out_on_every_rank_within_its_timeout() -> None:
    async def body(world: ac.World) -> None:
        loop = asyncio.get_running_loop()

        async def one(comm: ac.Communicator) -> tuple[Any, float]:
            if comm.rank == 2:
                await asyncio.sleep(3)
            start = loop.time()
            try:
                return await comm.split(0, timeout=1), loop.time() - start
            except ac.AsyncCommError as exc:
                return exc, loop.time() - start

        got = await asyncio.gather(*(one(c) for c in world.comms))
        for r, (res, took) in enumerate(got):
            assert isinstance(res, ac.CommTimeoutError), (r, res)
            assert took <= 1.0 + 1e-6, (r, took)
        await sums_are_right(world)
        subs = await asyncio.gather(*(c.split(c.rank, timeout=1) for c in world.comms))
        assert [s.size for s in subs] == [1, 1, 1]

    virtual(3, body)


def test_a_rank_that_leaves_after_every_rank_was_ready_closes_its_end() -> None:
    """Rank 1 leaves by its timeout while rank 0 is slow to decide: rank 0 hears of it
    first and aborts; nobody hangs, and the parent works after."""
    async def body(world: ac.World) -> None:
        async def one(comm: ac.Communicator) -> Any:
            if comm.rank == 0:
                await asyncio.sleep(2)
            try:
                return await comm.split(0, timeout=1 if comm.rank == 1 else None)
            except ac.AsyncCommError as exc:
                return exc

        got = await asyncio.gather(*(one(c) for c in world.comms))
        assert isinstance(got[1], ac.CommTimeoutError), got
        assert all(isinstance(g, ac.CommBrokenError | ac.CommTimeoutError) for g in got), got
        await sums_are_right(world)

    virtual(3, body)


async def test_dup_cancelled_before_it_ran_fails_everywhere_and_the_next_works() -> None:
    async with asyncio.timeout(10), ac.open_world(2) as world:
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(c.dup()) for c in world.comms]
        tasks[1].cancel()
        got = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(got[1], asyncio.CancelledError)
        assert isinstance(got[0], ac.CommBrokenError), got
        subs = await asyncio.gather(*(c.dup() for c in world.comms))
        x = [np.full(2, c.rank, np.int64) for c in subs]
        await asyncio.gather(*(c.allreduce(v) for c, v in zip(subs, x, strict=True)))
        assert all((v == 1).all() for v in x)


# -- arguments that differ between ranks ---------------------------------------------------

@pytest.mark.parametrize("algorithm", ["recursive_doubling", "ring"])
def test_blocks_of_another_size_fail_the_call_on_every_rank(algorithm: str) -> None:
    async def body(world: ac.World) -> None:
        xs = [np.ones(6 + c.rank, np.int64) for c in world.comms]
        got = await asyncio.gather(*(c.allreduce(x, timeout=1, algorithm=algorithm)
                                     for c, x in zip(world.comms, xs, strict=True)),
                                   return_exceptions=True)
        assert all(isinstance(g, ac.MatchError | ac.CommTimeoutError) for g in got), got
        assert any(isinstance(g, ac.MatchError) for g in got), got
        assert all((x == 1).all() for x in xs)
        await sums_are_right(world)

    virtual(2, body)


@pytest.mark.parametrize("what", ["op", "root"])
def test_ranks_that_pass_another_op_or_root_never_compute_with_each_other(what: str) -> None:
    """Rank 1 passes another op (or root): the root's messages and rank 1's never pair, so
    no rank computes with data meant for another call; those that wait time out."""
    async def body(world: ac.World) -> None:
        async def one(comm: ac.Communicator) -> Any:
            x = np.full(4, comm.rank + 2, np.int64)
            out = np.full(4, -1, np.int64)
            op = "max" if what == "op" and comm.rank == 1 else "sum"
            root = 1 if what == "root" and comm.rank == 1 else 0
            try:
                await comm.reduce(x, out if comm.rank == root else None, op, root=root,
                                  timeout=1)
            except ac.CommTimeoutError as exc:
                assert (out == -1).all()
                return exc
            return out

        got = await asyncio.gather(*(one(c) for c in world.comms))
        assert isinstance(got[0], ac.CommTimeoutError), got  # rank 0 waits for its children
        if what == "root":  # so does rank 1, a root of its own: no message pairs with it
            assert isinstance(got[1], ac.CommTimeoutError), got
        for g in got:  # no rank reports a reduced result
            assert isinstance(g, ac.CommTimeoutError) or (g == -1).all(), got

    virtual(3, body)
