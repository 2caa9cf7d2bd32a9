"""Pass a token around a ring of ranks, exchange arrays with neighbours, gather a table.

Run: .venv/bin/python examples/ring.py [--ranks N] [--loop uvloop|asyncio]  (in-process)
 or: .venv/bin/mpiexec -n N .venv/bin/python examples/ring.py         (one rank per process)
"""

from __future__ import annotations

import argparse

import numpy as np

import asynccomm as ac


async def ring(comm: ac.Communicator) -> list[list[int]] | None:
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    token = np.zeros(1, dtype=np.int64)
    # A token travels once around the ring; each rank adds its rank to it.
    if comm.rank == 0:
        await comm.send(token, right, tag=1)
        await comm.recv(token, left, tag=1)
    else:
        await comm.recv(token, left, tag=1)
        token += comm.rank
        await comm.send(token, right, tag=1)
    # Every rank sends a 4 MB block to its right neighbour and receives one from its left:
    # a rendezvous exchange that cannot deadlock because both ops are posted at once.
    block = np.full(1 << 20, comm.rank, dtype=np.float32)
    incoming = np.empty_like(block)
    status = await comm.sendrecv(block, right, incoming, left, sendtag=2, recvtag=2)
    # Rank 0 gathers one row per rank: what each saw.
    row = np.array([comm.rank, token[0], status.source, incoming[0], status.nbytes], np.int64)
    if comm.rank != 0:
        await comm.send(row, 0, tag=3)
        return None
    rows = [row.tolist()]
    for src in range(1, comm.size):
        await comm.recv(row, src, tag=3)
        rows.append(row.tolist())
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=None,
                        help="ranks (default 4, or N under mpiexec -n N)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args()
    ranks = args.ranks if args.ranks is not None else ac.mpi_world_size() or 4
    results = ac.run(ring, world_size=ranks, loop=args.loop)
    # In-process run() returns every rank's value; under mpiexec, this process's own.
    table = results if ac.launched_by_mpi() else results[0]
    if table is None:  # not rank 0
        return
    print(f"{'rank':>4}  {'token seen':>10}  {'block from':>10}  {'value':>5}  {'bytes':>9}")
    for rank, token, source, value, nbytes in table:
        print(f"{rank:>4}  {token:>10}  {source:>10}  {value:>5}  {nbytes:>9}")
    print(f"token after one lap: {table[0][1]} (expected {sum(range(len(table)))})")


if __name__ == "__main__":
    main()
