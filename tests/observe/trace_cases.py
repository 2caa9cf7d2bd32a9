"""Traced programs run in other processes (``backend="processes"``, mpiexec): importable,
so that each rank's process finds them by name."""

from __future__ import annotations

import os
import signal

import numpy as np

import asynccomm as ac


async def groups(comm: ac.Communicator) -> str:
    """Point-to-point round the ring (an eager message and a large one), a collective and
    a split with its own point-to-point and collective; the link's kind."""
    assert comm._engine.traced and comm._engine.tracer is not None  # the traced lane
    nxt, prev = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    await comm.sendrecv(np.full(10, float(comm.rank)), nxt, got := np.zeros(10), prev)
    assert got[0] == prev
    await comm.sendrecv(np.ones(100_000), nxt, np.zeros(100_000), prev)
    await comm.allreduce(total := np.ones(1000))  # (in place)
    assert total[0] == comm.size
    sub = await comm.split(comm.rank // 2)
    assert sub is not None
    if sub.size > 1:
        await sub.sendrecv(np.ones(4), (sub.rank + 1) % sub.size, np.zeros(4),
                           (sub.rank - 1) % sub.size)
    await sub.allreduce(np.ones(10))
    return type(comm._engine.link).__name__


async def one_raises(comm: ac.Communicator) -> None:
    """Rank 1 sends one message, then raises; rank 0's next recv fails."""
    if comm.rank == 1:
        await comm.send(np.ones(8), 0, tag=1)
        raise ValueError("boom on purpose")
    await comm.recv(np.zeros(8), 1, tag=1)
    await comm.recv(np.zeros(8), 1, tag=2)  # never sent: broken when rank 1 fails


async def groups_on_shm(comm: ac.Communicator) -> None:
    """``groups`` under mpiexec, on the shared-memory link."""
    assert await groups(comm) == "ShmTransport"


async def one_killed(comm: ac.Communicator) -> None:
    """Rank 1 sends one message, then its process is killed (it writes no trace); rank 0's
    next recv fails."""
    if comm.rank == 1:
        await comm.send(np.ones(8), 0, tag=1)
        os.kill(os.getpid(), signal.SIGKILL)
    await comm.recv(np.zeros(8), 1, tag=1)
    await comm.recv(np.zeros(8), 1, tag=2)  # never sent: broken when rank 1 dies


async def groups_on_hybrid(comm: ac.Communicator) -> None:
    """``groups`` under mpiexec on two fake hosts: shared memory within each, MPI across."""
    assert await groups(comm) == "HybridTransport"
