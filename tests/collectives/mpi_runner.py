"""Every collective with every algorithm on MPI, checked exactly against numpy.

Run: ``mpiexec -n N python -m tests.collectives.mpi_runner``.  Each rank runs the table
(small, past the eager limit, and roots other than 0) through ``ac.run``, which picks the
MPI transport under a launcher; rank 0 prints a summary and every rank exits non-zero if
any rank failed.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import asynccomm as ac

from .cases import Case, all_cases, bounded, call, check


def table(size: int) -> list[Case]:
    out = []
    for i, case in enumerate(all_cases()):
        for j, shape in enumerate([(3, 2), (20000,)]):  # small; past the eager limit
            out.append(Case(case.collective, case.algorithm, shape, "float64",
                            root=(i + j) % size, tag=(2 * i + j) * 4096,
                            in_place=bool(j) and case.collective == "allreduce"))
    return out


def main() -> int:
    if not ac.launched_by_mpi():
        sys.stderr.write("run under mpiexec: mpiexec -n N python -m tests.collectives."
                         "mpi_runner\n")
        return 2
    size = ac.mpi_world_size()
    assert size is not None
    cases = table(size)

    async def program(comm: ac.Communicator) -> list[str]:
        failures = []
        for case in cases:
            try:
                check(case, comm.rank, comm.size, await call(comm, case))
            except Exception as exc:
                failures.append(f"{case} on rank {comm.rank}: {exc!r}")
                traceback.print_exc()
        return failures

    failures: Any = ac.run(bounded(program, 60.0))
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    failed = world.allreduce(len(failures))
    if world.Get_rank() == 0:
        sys.stdout.write(f"collectives on MPI, {size} ranks: {len(cases) - len(failures)} "
                         f"passed, {failed} failed\n")
    for line in failures:
        sys.stdout.write(line + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
