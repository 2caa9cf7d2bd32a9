"""Every collective with every algorithm on MPI, checked exactly against numpy.

Run: ``mpiexec -n N python -m tests.collectives.mpi_runner``.  Each rank runs the table
(small, past the eager limit, and roots other than 0) through ``ac.run``, which picks the
MPI transport under a launcher; rank 0 prints a summary and every rank exits non-zero if
any rank failed.
"""

from __future__ import annotations

import asyncio
import sys
import traceback
from typing import Any

import numpy as np

import asynccomm as ac
from asynccomm._collectives import functions as coll

from .cases import Case, all_cases, bounded, call, check, report_on_mpi


def table(size: int) -> list[Case]:
    out = []
    for i, case in enumerate(all_cases()):
        for j, shape in enumerate([(3, 2), (20000,)]):  # small; past the eager limit
            out.append(Case(case.collective, case.algorithm, shape, "float64",
                            root=(i + j) % size, tag=(2 * i + j) * 4096,
                            in_place=bool(j) and case.collective == "allreduce"))
    return out


async def timed_out(comm: ac.Communicator) -> None:
    """The last rank stays out of a ring allreduce past the eager limit: the others time
    out, their ops (a large send announced to the absent rank among them) are withdrawn,
    and a collective on fresh tags then works on every rank."""
    tag = 1000 * 4096
    if comm.rank < comm.size - 1:
        try:
            await coll.allreduce(comm, np.ones(20000), tag=tag, timeout=0.5,
                                 choose=lambda *_: "ring")
        except ac.CommTimeoutError as exc:
            assert "during allreduce (ring" in "\n".join(exc.__notes__)
        else:
            raise AssertionError("the allreduce did not time out")
    else:
        await asyncio.sleep(1.0)
    assert comm.statistics().pending_ops == 0
    x = np.full(20000, comm.rank + 1.0)
    await coll.allreduce(comm, x, tag=tag + 4096, timeout=20.0)
    assert (x == comm.size * (comm.size + 1) / 2).all()


async def complex_order_refused(comm: ac.Communicator) -> None:
    """MAX of complex numbers is refused on every rank before anything is sent; an op named
    in capitals then reduces."""
    tag = 1000 * 4096 + 8192
    try:
        await coll.allreduce(comm, np.ones(4, np.complex128), op="MAX", tag=tag)
    except TypeError as exc:
        assert "complex numbers have no order" in str(exc), exc
    else:
        raise AssertionError("MAX of complex numbers was not refused")
    assert comm.statistics().pending_ops == 0
    x = np.full(4, comm.rank + 1.0)
    await coll.allreduce(comm, x, op="MAX", tag=tag, timeout=20.0)
    assert (x == comm.size).all()


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
        try:
            await timed_out(comm)
        except Exception as exc:
            failures.append(f"timeout case on rank {comm.rank}: {exc!r}")
            traceback.print_exc()
        try:
            await complex_order_refused(comm)
        except Exception as exc:
            failures.append(f"complex order case on rank {comm.rank}: {exc!r}")
            traceback.print_exc()
        return failures

    failures: Any = ac.run(bounded(program, 60.0))
    return report_on_mpi(failures, lambda failed: f"collectives on MPI, {size} ranks: "
                                                  f"{len(cases) - len(failures)} passed, "
                                                  f"{failed} failed")


if __name__ == "__main__":
    sys.exit(main())
