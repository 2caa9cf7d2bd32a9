"""``ac.run_async`` under ``mpiexec -n 2``: each process runs its own rank on the loop it
awaits from, and a failure is raised on the rank that failed, the others seeing the rank's
close (run by tests/api/test_run_async.py)."""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np

import asynccomm as ac


async def ring(comm: ac.Communicator) -> float:
    out, incoming = np.full(4, float(comm.rank)), np.empty(4)
    await comm.sendrecv(out, 1 - comm.rank, incoming, 1 - comm.rank)
    return float(incoming[0])


async def fail_on_1(comm: ac.Communicator) -> None:
    if comm.rank == 1:
        raise KeyError("boom")
    await comm.recv(np.zeros(1), 1)


async def main() -> dict[str, object]:
    async with asyncio.timeout(30):
        value = await ac.run_async(ring, 2)
        try:
            await ac.run_async(fail_on_1)
        except ac.CommBrokenError as exc:  # rank 0: rank 1 failed
            error, why = "CommBrokenError", "KeyError" in str(exc)
        except KeyError as exc:
            error, why = "KeyError", "(raised on rank 1)" in exc.__notes__
        return {"rank": _rank(), "value": value, "error": error, "why": why}


def _rank() -> int:
    from mpi4py import MPI

    return int(MPI.COMM_WORLD.Get_rank())


if __name__ == "__main__":
    sys.stdout.write(json.dumps(asyncio.run(main())) + "\n")
