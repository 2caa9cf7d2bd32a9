"""Run under ``mpiexec -n 2``: what a rank hears of a peer that failed or returned, and
what a close drops (``tests/transports/test_close_reports.py``).  ``argv[1]`` picks the case;
each rank prints one line ``rank R: ...`` with what it saw."""

from __future__ import annotations

import sys

import numpy as np

import asynccomm as ac

LIMIT = 20.0  # bounds every wait: a case that goes wrong ends, it does not hang


async def failed(comm: ac.Communicator) -> str:
    """Rank 1 fails; rank 0 waits on it: for a message, and inside an allreduce."""
    if comm.rank == 1:
        raise ValueError("boom")
    try:
        await comm.recv(np.zeros(2), 1, timeout=LIMIT)
    except ac.CommBrokenError as exc:
        return f"recv: {exc}"
    return "recv: no error"


async def failed_in_collective(comm: ac.Communicator) -> str:
    if comm.rank == 1:
        raise ValueError("boom in a collective")
    try:
        await comm.allreduce(np.ones(4), timeout=LIMIT)
    except ac.CommBrokenError as exc:
        return f"allreduce: {str(exc).splitlines()[0]}"
    return "allreduce: no error"


async def returned(comm: ac.Communicator) -> str:
    if comm.rank == 1:
        return "returned"
    try:
        await comm.recv(np.zeros(2), 1, timeout=LIMIT)
    except ac.CommBrokenError as exc:
        return f"recv: {exc}"
    return "recv: no error"


async def dropped(comm: ac.Communicator) -> str:
    """Rank 0 sends two small messages and one large one that rank 1 never receives."""
    if comm.rank == 1:
        await comm.recv(np.zeros(1), 0, tag=9, timeout=LIMIT)  # after the small ones
        return "closing"
    await comm.send(np.zeros(2), 1, tag=3)
    await comm.send(np.zeros(2), 1, tag=3)
    big = comm.isend(np.zeros(ac.EAGER_LIMIT + 1, np.uint8), 1, tag=4)
    await comm.send(np.zeros(1), 1, tag=9)
    try:
        await big
    except ac.CommBrokenError as exc:
        return f"large send: {exc}"
    return "large send: completed"


CASES = {f.__name__: f for f in (failed, failed_in_collective, returned, dropped)}


def main() -> None:
    case = CASES[sys.argv[1]]
    if sys.argv[1] == "dropped":
        import logging

        import structlog

        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
        structlog.configure(logger_factory=structlog.stdlib.LoggerFactory(),
                            processors=[structlog.processors.KeyValueRenderer(
                                sort_keys=True)])

    async def run(comm: ac.Communicator) -> str:
        said = await case(comm)
        sys.stdout.write(f"rank {comm.rank}: {said}\n")
        sys.stdout.flush()
        return said

    ac.run(run)


if __name__ == "__main__":
    main()
