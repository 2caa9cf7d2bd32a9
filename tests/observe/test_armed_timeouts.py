"""The wall-clock deadlock proof sees every timeout the library arms (a collective's, a
``split``'s, an object recv's), on asyncio and uvloop: a wait that such a timeout will end
is not a deadlock; a true deadlock still is."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

import asynccomm as ac

LOOPS = ["asyncio", "uvloop"]


async def _gives_up_then_sends(comm: ac.Communicator, call: str) -> str:
    """Rank 1 waits in ``call`` (with a timeout) for rank 0, which waits for rank 1's
    message: only the timeout can end it, and then rank 1 sends."""
    buf = np.zeros(2)
    if comm.rank == 0:
        await comm.recv(buf, 1, tag=1)
        return "got it"
    try:
        if call == "allreduce":
            await comm.allreduce(np.ones(4), timeout=0.5)
        elif call == "barrier":
            await comm.barrier(timeout=0.5)
        elif call == "split":
            await comm.split(0, timeout=0.5)
        else:
            await comm.recv_obj(0, tag=5, timeout=0.5)
    except ac.CommTimeoutError:
        pass
    await comm.send(buf, 0, tag=1)
    return "gave up"


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("call", ["allreduce", "barrier", "split", "recv_obj"])
def test_a_wait_a_library_timeout_will_end_is_not_a_deadlock(loop: str, call: str) -> None:
    async def main(comm: ac.Communicator) -> str:
        return await _gives_up_then_sends(comm, call)

    assert ac.run(main, 2, loop=loop) == ["got it", "gave up"]


@pytest.mark.parametrize("loop", LOOPS)
def test_a_deadlock_after_timed_collectives_is_still_proven(loop: str) -> None:
    async def main(comm: ac.Communicator) -> None:
        x = np.ones(4)
        await comm.allreduce(x, timeout=5.0)  # finished: its timeout is no longer armed
        await comm.split(0, timeout=5.0)
        await comm.recv(x, 1 - comm.rank, tag=2)  # both receive first: a deadlock

    with pytest.raises(ac.DeadlockError, match="wait-for cycle: rank 0 waits for 1"):
        ac.run(main, 2, loop=loop)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_deadlock_inside_a_collective_without_timeout_is_proven(loop: str) -> None:
    async def main(comm: ac.Communicator) -> None:
        if comm.rank == 0:
            await comm.recv(np.zeros(2), 1, tag=1)
        else:
            await comm.allreduce(np.ones(4))

    with pytest.raises(ac.DeadlockError):
        ac.run(main, 2, loop=loop)


async def _own_timeout_then_sends(comm: ac.Communicator) -> str:
    buf = np.zeros(2)
    if comm.rank == 0:
        await comm.recv(buf, 1, tag=1)
        return "got it"
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0.5):  # the program's own, around an op
            await comm.recv(buf, 0, tag=2)
    await comm.send(buf, 0, tag=1)
    return "gave up"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_wait_the_programs_own_timeout_will_end_is_not_a_deadlock(loop: str) -> None:
    assert ac.run(_own_timeout_then_sends, 2, loop=loop) == ["got it", "gave up"]


@pytest.mark.parametrize("loop", LOOPS)
def test_a_deadlock_after_the_programs_own_timeout_is_still_proven(loop: str) -> None:
    async def main(comm: ac.Communicator) -> None:
        x = np.ones(2)
        async with asyncio.timeout(5.0) as cm:  # left: no longer armed (still referenced)
            await comm.sendrecv(x, 1 - comm.rank, np.zeros(2), 1 - comm.rank)
        assert cm.when() is not None
        await comm.recv(x, 1 - comm.rank, tag=2)  # both receive first: a deadlock

    with pytest.raises(ac.DeadlockError):
        ac.run(main, 2, loop=loop)
