"""The random programs of ``adversity`` on MPI, at the launcher's world size: collectives,
splits, dups and objects in which one rank cancels a call, comes late, or none does (a
rank that fails would end the MPI job: that case is the in-process runs' and the fault
tests').

Run: ``mpiexec -n N python -m tests.collectives.mpi_adversity_runner [--examples K]``.
Every rank draws the same derandomized programs (no shrinking: the ranks stay in
lockstep) and runs each in a world of its own; rank 0 checks every rank's record and
prints ``random programs on MPI, N ranks: K examples, F failures``.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings

import asynccomm as ac

from .adversity import MISDEEDS, Program, check, check_objects, programs, run_rank
from .cases import bounded, report_on_mpi


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.collectives.mpi_adversity_runner")
    parser.add_argument("--examples", type=int, default=20)
    args = parser.parse_args(argv)
    size = ac.mpi_world_size()
    if size is None:
        sys.stderr.write("run under mpiexec\n")
        return 2
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    failures: list[str] = []
    ran = 0

    @settings(max_examples=args.examples, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(program=programs(size, tuple(m for m in MISDEEDS if m != "fail")))
    def one(program: Program) -> None:
        nonlocal ran
        ran += 1

        async def body(comm: ac.Communicator) -> Any:
            return await run_rank(comm, program)

        try:
            record: Any = ac.run(bounded(body, 60.0))
        except Exception as exc:
            record = exc
        try:  # (nothing here may raise on one rank only: the ranks stay in lockstep)
            records = world.gather(record)
        except Exception as exc:
            failures.append(f"{program}: the records did not cross: {exc!r}")
            return
        if world.Get_rank() == 0:
            try:
                check(program, records)
                check_objects(program, records)
            except Exception as exc:
                failures.append(f"{program}: {exc!r}")
                traceback.print_exc()

    one()
    return report_on_mpi(failures, lambda failed: f"random programs on MPI, {size} ranks: "
                                                  f"{ran} examples, {failed} failures")


if __name__ == "__main__":
    sys.exit(main())
