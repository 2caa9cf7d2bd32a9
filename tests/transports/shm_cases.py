"""Programs for the tests of ``backend="processes"`` (importable: each rank's process
finds them by name), and a script for the tests that stop its parent from outside:
``python -m tests.transports.shm_cases wait|idle N``."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import sys
import time
from multiprocessing import current_process

import numpy as np

import asynccomm as ac
from asynccomm._comm.process_runner import run_rank
from asynccomm._core.wire import HEADER
from asynccomm.transports import shm
from asynccomm.transports.shm import Node


async def who(comm: ac.Communicator) -> tuple[int, int, str]:
    """Each rank's place, and its loop's kind; the ranks pass a token round first."""
    token = np.zeros(1, np.int64)
    if comm.size > 1:
        if comm.rank == 0:
            await comm.send(token + 1, 1, 0)
            await comm.recv(token, comm.size - 1, 0)
        else:
            await comm.recv(token, comm.rank - 1, 0)
            await comm.send(token + 1, (comm.rank + 1) % comm.size, 0)
    return comm.rank, int(token[0]), type(asyncio.get_running_loop()).__module__


def faults_of_fresh_arrays() -> int:
    """Page faults of eight 4 MiB arrays made, filled and freed one after another, after one
    that grew the heap: none where the allocator has settled, about 500 in a new process
    (glibc maps and unmaps each one)."""
    np.empty(4 << 20, np.uint8).fill(1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):
        np.empty(4 << 20, np.uint8).fill(1)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


async def fresh_array_faults(comm: ac.Communicator) -> int:
    return faults_of_fresh_arrays()


async def one_fails(comm: ac.Communicator) -> None:
    """Rank 1 raises; rank 0, waiting for it, fails in turn with what it was told."""
    if comm.rank == 1:
        raise ValueError("boom on purpose")
    try:
        await comm.recv(np.zeros(1), 1, 0)
    except ac.CommBrokenError as exc:
        raise RuntimeError(f"rank 0 got CommBrokenError: {exc}") from None


async def one_dies(comm: ac.Communicator) -> str:
    """Rank 1 is killed (SIGKILL) while rank 0 waits for it: rank 0 says what its recv
    got, and how long after the kill."""
    if comm.rank == 1:
        await comm.send(np.zeros(1), 0, 1)  # rank 0's recv is posted: die
        await comm.recv(np.zeros(1), 0, 2)
        os.kill(os.getpid(), signal.SIGKILL)
    await comm.recv(np.zeros(1), 1, 1)
    req = comm.irecv(np.zeros(1), 1, 3)
    await comm.send(np.zeros(1), 1, 2)
    return await broken_or_not(req)


async def broken_or_not(req: ac.Request) -> str:
    """What awaiting ``req`` gave: its ``CommBrokenError``, as text, or none."""
    try:
        await req
    except ac.CommBrokenError as exc:
        return f"CommBrokenError: {exc}"
    return "no error"


def a_killed_rank(loop: str) -> object:
    """``one_dies`` on this rank (a ``launch`` target)."""
    return run_rank(one_dies, loop, {"eager_limit": 65_536, "pool_bytes": 64 << 20,
                                     "timeout": None})


async def waits(comm: ac.Communicator) -> None:
    """Say this rank is ready (its pid, on stdout), then wait for a message that never
    comes."""
    sys.stdout.write(f"ready {comm.rank} {os.getpid()}\n")
    sys.stdout.flush()
    await comm.recv(np.zeros(1), (comm.rank + 1) % comm.size, 99)


async def idles(comm: ac.Communicator) -> float:
    """Rank 1 waits in a recv for ``IDLE`` seconds while rank 0 sleeps; rank 0 then sends,
    and rank 1 returns its process's CPU seconds while it waited."""
    seconds = float(os.environ.get("IDLE", "10"))
    if comm.rank == 0:
        await comm.barrier()
        await asyncio.sleep(seconds)
        await comm.send(np.zeros(1), 1, 0)
        return 0.0
    await comm.barrier()
    before = time.process_time()
    await comm.recv(np.zeros(1), 0, 0)
    return time.process_time() - before


if __name__ == "__main__":
    mains = {"wait": waits, "idle": idles}
    sys.stdout.write(f"{ac.run(mains[sys.argv[1]], int(sys.argv[2]), backend='processes')}\n")


class _Refusing:
    """The single copy, as where the kernel refuses it (``readv`` fails)."""

    def __init__(self, real: object) -> None:
        self.address = real.address  # type: ignore[attr-defined]

    def readv(self, pid: int, into: object, address: int) -> int:
        raise PermissionError(1, "Operation not permitted")

    def share(self, *args: object) -> bool:
        raise PermissionError(1, "Operation not permitted")


async def large_both_ways(comm: ac.Communicator) -> bool:
    """1 MiB + 5 from rank 0 to 1 and back, checked; whether this rank still copies once."""
    data = np.arange((1 << 20) + 5, dtype=np.uint8)
    out = np.zeros_like(data)
    peer = 1 - comm.rank
    if comm.rank == 0:
        await comm.send(data, peer, 0)
        await comm.recv(out, peer, 1)
    else:
        await comm.recv(out, peer, 0)
        await comm.send(out, peer, 1)
    assert np.array_equal(out, data), "corrupted"
    node = Node.current()
    assert node is not None
    return node.single_copy


def refused_single_copy(loop: str) -> object:
    """``large_both_ways`` where rank 1's kernel refuses to let it read rank 0 (a
    ``launch`` target)."""
    if shm.single_copy is not None and current_process().name == "asynccomm-rank-1":
        shm.single_copy = _Refusing(shm.single_copy)  # type: ignore[assignment]
    return run_rank(large_both_ways, loop, {"eager_limit": 65_536, "pool_bytes": 64 << 20,
                                            "timeout": None})


async def one_breaks(comm: ac.Communicator) -> str:
    """Rank 1's link cannot handle the message on tag 5 (``ShmTransport._on_control`` fails
    there): its pending recv fails with TransportError; rank 0, whose recv waits for rank
    1, hears why."""
    if comm.rank == 0:
        req = comm.irecv(np.zeros(1), 1, 7)
        await comm.send(np.zeros(1), 1, 5)
        try:
            await req
        except ac.CommBrokenError as exc:
            return f"CommBrokenError: {exc}"
        return "no error"
    try:
        await comm.recv(np.zeros(1), 0, 6)
    except ac.TransportError as exc:
        return f"TransportError: {exc}"
    return "no error"


def a_broken_link(loop: str) -> object:
    """``one_breaks`` on this rank (a ``launch`` target)."""
    if current_process().name == "asynccomm-rank-1":
        handle = shm.ShmTransport._on_control

        def failing(self: shm.ShmTransport, slot: object) -> None:
            if HEADER.unpack_from(slot.buf)[3] == 5:  # type: ignore[attr-defined]
                raise RuntimeError("a message it cannot handle")
            handle(self, slot)  # type: ignore[arg-type]

        shm.ShmTransport._on_control = failing  # type: ignore[method-assign]
    return run_rank(one_breaks, loop, {"eager_limit": 65_536, "pool_bytes": 64 << 20,
                                       "timeout": None})
