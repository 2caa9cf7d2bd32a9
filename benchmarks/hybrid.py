"""asynccomm's link of a world on several hosts beside raw mpi4py, 4 processes as 2 hosts.

``mpiexec -n 4 python -m benchmarks.hybrid`` runs the world as if ranks 0 and 1 were on one
host and 2 and 3 on another (``ASYNCCOMM_TEST_HOSTS=a,a,b,b``, set here): each rank's link
is the hybrid one, the rings of shared memory to the peer of its host and MPI to the
others.  Two pairs ping-pong at once, either within each host (0-1 and 2-3) or across
(0-2 and 1-3), and the one-way time (half a round trip, the median over repeats) is set
beside raw mpi4py ``Send``/``Recv`` between the same pairs, alternating repeat by repeat
in the same processes.  On one machine the MPI messages "between hosts" travel through
MPICH's shared memory too: what this shows is the cost of the link's own steps on each
way, not a network's.  No target.

Rank 0 prints the table and writes ``hybrid.json``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import asynccomm as ac

from ._common import (
    KiB,
    MiB,
    launched_args,
    load_average,
    median,
    mpi_environment,
    print_table,
    printed,
    size_label,
    write_json,
)

__all__ = ["main"]

#: Ranks 0 and 1 on one host, 2 and 3 on the other.
HOSTS = "a,a,b,b"
TAG = 5


@dataclass
class Row:
    way: str  # "same host" or "across hosts"
    nbytes: int
    iters: int
    raw: list[float] = field(default_factory=list)
    asynccomm: list[float] = field(default_factory=list)

    def ratio(self) -> float:
        return median(self.asynccomm) / median(self.raw)


def peer_of(rank: int, way: str) -> int:
    return rank ^ 1 if way == "same host" else rank ^ 2


def raw_pingpong(comm: Any, buf: np.ndarray[Any, Any], peer: int, iters: int) -> float:
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        if comm.Get_rank() < peer:
            comm.Send(buf, peer, TAG)
            comm.Recv(buf, peer, TAG)
        else:
            comm.Recv(buf, peer, TAG)
            comm.Send(buf, peer, TAG)
    return (time.perf_counter() - start) / (2 * iters)


async def ac_pingpong(comm: ac.Communicator, raw: Any, buf: np.ndarray[Any, Any], peer: int,
                      iters: int) -> float:
    raw.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        if comm.rank < peer:
            await comm.send(buf, peer, TAG)
            await comm.recv(buf, peer, TAG)
        else:
            await comm.recv(buf, peer, TAG)
            await comm.send(buf, peer, TAG)
    return (time.perf_counter() - start) / (2 * iters)


async def measure(comm: ac.Communicator, sizes: Sequence[int], repeats: int,
                  most: int) -> list[Row]:
    from mpi4py import MPI

    raw = MPI.COMM_WORLD.Dup()
    rows = []
    try:
        for way in ("same host", "across hosts"):
            peer = peer_of(comm.rank, way)
            for nbytes in sizes:
                buf = np.ones(nbytes, np.uint8)
                iters = max(min(20, most), min(most, (64 * MiB) // nbytes))
                row = Row(way, nbytes, iters)
                raw_pingpong(raw, buf, peer, max(5, iters // 10))  # warm up both
                await ac_pingpong(comm, raw, buf, peer, max(5, iters // 10))
                for _ in range(repeats):
                    row.raw.append(raw_pingpong(raw, buf, peer, iters))
                    row.asynccomm.append(await ac_pingpong(comm, raw, buf, peer, iters))
                rows.append(row)
    finally:
        raw.Free()
    return rows


def print_report(rows: list[Row], env: dict[str, Any], loop: str, quick: bool,
                 link: str) -> None:
    print(f"asynccomm {env['asynccomm']}, link {link} ({env['mpi']}), 4 processes as 2 "
          f"hosts ({HOSTS}) on {env['cpus_usable']} cores, loop {loop}"
          f"{' (--quick)' if quick else ''}; load average {env['loadavg_1min']:.2f} at start, "
          f"{env['loadavg_1min_at_end']:.2f} at end")
    print_table("One-way time, two pairs ping-ponging at once (median, us; raw mpi4py "
                "between the same ranks, alternating repeat by repeat)",
                ["way", "size", "iters", "raw mpi4py", "asynccomm", "asynccomm/raw"],
                [[r.way, size_label(r.nbytes), r.iters, f"{median(r.raw) * 1e6:.2f}",
                  f"{median(r.asynccomm) * 1e6:.2f}", f"{r.ratio():.2f}x"] for r in rows])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return launched_args("hybrid", __doc__, "two sizes, few iterations and repeats",
                         "hybrid.json", argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    if size != 4:
        print("run with 4 processes: mpiexec -n 4 python -m benchmarks.hybrid",
              file=sys.stderr)
        return 2
    stamp = datetime.datetime.now(datetime.UTC)
    env = mpi_environment()
    started = time.perf_counter()
    os.environ["ASYNCCOMM_TEST_HOSTS"] = HOSTS  # this measures the hybrid link
    os.environ.pop("ASYNCCOMM_TRANSPORT", None)
    sizes = (8, 1 * MiB) if args.quick else (8, 64 * KiB, 1 * MiB)
    repeats, most = (2, 50) if args.quick else (7, 2000)

    async def bench(comm: ac.Communicator) -> tuple[list[Row], str]:
        return await measure(comm, sizes, repeats, most), type(comm._engine.link).__name__

    rows, link = ac.run(bench, loop=args.loop, backend="mpi")
    if MPI.COMM_WORLD.Get_rank() != 0:
        return 0
    elapsed = time.perf_counter() - started
    env["loadavg_1min_at_end"] = load_average()
    with printed() as report:
        print_report(rows, env, args.loop, args.quick, link)
    doc = {"suite": "hybrid", "schema": 1, "timestamp": stamp.isoformat(timespec="seconds"),
           "quick": args.quick, "loop": args.loop, "processes": size, "hosts": HOSTS,
           "link": link, "elapsed_seconds": elapsed, "environment": env,
           "rows": [asdict(r) for r in rows], "checks": [],
           "report": report.getvalue()}
    write_json(args.out, "hybrid.json", doc, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
