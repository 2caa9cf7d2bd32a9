"""Run the transport contract on MPI, one world per program and loop.

Run: ``mpiexec -n N python -m tests.transports.mpi_contract_runner [--only NAME,...]
[--loops uvloop,asyncio]`` (``make test-mpi N=4``).  Every rank runs every program through
``ac.run(program)``, which picks the MPI transport under an MPI launcher; each program is
bounded by a timeout.  Rank 0 prints one line per failure and a summary; every rank exits
non-zero if any rank saw a failure.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Sequence

import asynccomm as ac

from .contract import OPTIONS, PROGRAMS, bounded


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.transports.mpi_contract_runner")
    parser.add_argument("--only", default=",".join(PROGRAMS),
                        help="comma-separated program names (default: all)")
    parser.add_argument("--loops", default="uvloop,asyncio")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        sys.stderr.write(f"unknown programs: {unknown}\n")
        return 2
    if not ac.launched_by_mpi():
        sys.stderr.write("run under an MPI launcher: mpiexec -n N python -m "
                         "tests.transports.mpi_contract_runner\n")
        return 2
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    failures: list[str] = []
    passed = 0
    started = time.perf_counter()
    for name in names:
        for loop in args.loops.split(","):
            try:
                ac.run(bounded(PROGRAMS[name]), loop=loop, **OPTIONS.get(name, {}))
            except Exception as exc:
                failures.append(f"{name}[{loop}] on rank {rank}: {type(exc).__name__}: {exc}")
                traceback.print_exception(exc, file=sys.stderr)
            else:
                passed += 1
    every = world.gather(failures, root=0)
    failed = world.allreduce(len(failures))
    total = world.allreduce(passed + len(failures))
    if rank == 0:
        assert every is not None
        for lines in every:
            for line in lines:
                sys.stdout.write(f"FAILED {line}\n")
        sys.stdout.write(f"contract on MPI, {size} ranks: {total - failed} passed, {failed} "
                         f"failed (rank-runs) in {time.perf_counter() - started:.1f} s\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
