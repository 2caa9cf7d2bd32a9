"""Randomized collectives on MPI, through the communicator's methods: the property test's
cases (every collective, algorithm, dtype, op, root, in-place form and shape, from empty to
pipelined) at the launcher's world size, checked exactly against numpy.

Run: ``mpiexec -n N python -m tests.collectives.mpi_property_runner [--examples K]``.  Each
rank draws the same derandomized examples (no shrinking, so the ranks stay in lockstep) and
runs each one in a world of its own; rank 0 prints a summary and every rank exits non-zero
if any rank saw a failure.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import asynccomm as ac

from .cases import Case, bounded, call_method, check, report_on_mpi
from .test_properties import cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.collectives.mpi_property_runner")
    parser.add_argument("--examples", type=int, default=30)
    args = parser.parse_args(argv)
    size = ac.mpi_world_size()
    if size is None:
        sys.stderr.write("run under mpiexec: mpiexec -n N python -m "
                         "tests.collectives.mpi_property_runner\n")
        return 2
    failures: list[str] = []
    ran = 0

    @settings(max_examples=args.examples, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(drawn=cases(sizes=st.just(size), envs=st.just("mpi")))
    def one(drawn: tuple[Case, int, str]) -> None:
        nonlocal ran
        case = drawn[0]
        ran += 1

        async def program(comm: ac.Communicator) -> Any:
            return await call_method(comm, case)

        try:
            got = ac.run(bounded(program, 60.0))
            check(case, _rank(), size, got)
        except Exception as exc:
            failures.append(f"{case} on rank {_rank()}: {exc!r}")
            traceback.print_exc()

    one()
    return report_on_mpi(failures, lambda failed: f"random collectives on MPI, {size} ranks: "
                                                  f"{ran} examples, {failed} failures")


def _rank() -> int:
    from mpi4py import MPI

    return int(MPI.COMM_WORLD.Get_rank())


if __name__ == "__main__":
    sys.exit(main())
