"""Pass a token around a ring of in-process ranks, then exchange arrays with neighbours.

Run: python examples/ring.py [--ranks N] [--loop uvloop|asyncio]
"""

from __future__ import annotations

import argparse

import numpy as np

import asynccomm as ac


async def ring(comm: ac.Communicator) -> dict[str, object]:
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
    return {"token": int(token[0]), "from": status.source, "value": float(incoming[0]),
            "nbytes": status.nbytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args()
    results = ac.run(ring, world_size=args.ranks, loop=args.loop)
    print(f"{'rank':>4}  {'token seen':>10}  {'block from':>10}  {'value':>5}  {'bytes':>9}")
    for rank, r in enumerate(results):
        print(f"{rank:>4}  {r['token']:>10}  {r['from']:>10}  {r['value']:>5.0f}  {r['nbytes']:>9}")
    expected = sum(range(args.ranks))
    print(f"token after one lap: {results[0]['token']} (expected {expected})")


if __name__ == "__main__":
    main()
