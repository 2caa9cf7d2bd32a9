"""Collective calls keep their place on MPI, and split makes a communicator on every rank or
none, whatever one rank does to its call.

Run: ``mpiexec -n N python -m tests.collectives.mpi_sequencing_runner`` (N >= 2).  Rank 0
prints ``sequencing on MPI, N ranks: P passed, F failed``; every rank exits non-zero if any
rank failed.
"""

from __future__ import annotations

import asyncio
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

import asynccomm as ac

from .cases import bounded, report_on_mpi


async def sums_are_right(comm: ac.Communicator) -> None:
    for i in range(2):
        x = np.full(5, comm.rank + 10 * i, np.int64)
        await comm.allreduce(x, timeout=20)
        assert (x == sum(range(comm.size)) + 10 * i * comm.size).all(), x


async def cancelled_before_it_ran(comm: ac.Communicator) -> None:
    if comm.rank == 0:
        task = asyncio.get_running_loop().create_task(comm.allreduce(np.ones(4)))
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("not cancelled")
        await asyncio.sleep(1.0)  # the others time out in the call rank 0 left
    else:
        try:
            await comm.allreduce(np.ones(4), timeout=0.5)
        except ac.CommTimeoutError:
            pass
        else:
            raise AssertionError("completed without rank 0")
    await sums_are_right(comm)


async def bad_color(comm: ac.Communicator) -> None:
    last = comm.size - 1
    try:
        await comm.split(-1 if comm.rank == last else 0, timeout=20)
    except ValueError:
        assert comm.rank == last
    except ac.CommBrokenError as exc:
        assert comm.rank != last and f"rank {last} passed a bad argument" in str(exc), exc
    else:
        raise AssertionError("the split succeeded")
    await sums_are_right(comm)
    sub = await comm.split(comm.rank % 2, timeout=20)
    assert sub is not None and sub.size == len(range(comm.rank % 2, comm.size, 2))
    await sums_are_right(sub)


async def cancelled_split(comm: ac.Communicator) -> None:
    last = comm.size - 1
    if comm.rank == 0:
        await asyncio.sleep(1.0)  # slow to decide
    task = asyncio.get_running_loop().create_task(comm.split(0, timeout=20))
    if comm.rank == last:
        await asyncio.sleep(0.2)  # said it was ready, then leaves: rank 0 aborts
        task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        assert comm.rank == last
    except ac.CommBrokenError as exc:
        assert comm.rank != last and f"rank {last} was cancelled" in str(exc), exc
    else:
        raise AssertionError("the split succeeded")
    await sums_are_right(comm)
    sub = await comm.split(0, timeout=20)
    assert sub is not None and sub.size == comm.size
    await sums_are_right(sub)


async def late_for_split(comm: ac.Communicator) -> None:
    if comm.rank == comm.size - 1:
        await asyncio.sleep(1.5)
    try:
        await comm.split(0, timeout=0.5)
    except ac.CommTimeoutError:
        pass
    else:
        raise AssertionError("the split did not time out")
    await sums_are_right(comm)


CASES: list[Callable[[ac.Communicator], Awaitable[None]]] = [
    cancelled_before_it_ran, bad_color, cancelled_split, late_for_split]


def main() -> int:
    if not ac.launched_by_mpi():
        sys.stderr.write("run under mpiexec\n")
        return 2

    async def program(comm: ac.Communicator) -> list[str]:
        failures = []
        for case in CASES:
            try:
                await case(comm)
            except Exception as exc:
                failures.append(f"{case.__name__} on rank {comm.rank}: {exc!r}")
                traceback.print_exc()
        return failures

    failures: Any = ac.run(bounded(program, 60.0))
    size = ac.mpi_world_size()
    return report_on_mpi(failures, lambda failed: f"sequencing on MPI, {size} ranks: "
                                                  f"{len(CASES) - failed} passed, "
                                                  f"{failed} failed")


if __name__ == "__main__":
    sys.exit(main())
