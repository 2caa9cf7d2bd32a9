"""Random object programs on MPI: the programs of ``objects_programs.py`` (without a
failing rank, whose error ends the job), drawn by hypothesis, on every rank at once.

Run: ``mpiexec -n N python -m tests.engine.mpi_objects_runner`` (``test_objects_programs.py``
runs it at 2 ranks; ``make test-stress`` with many more examples).  Every rank runs the
same derandomized hypothesis search; after each example the ranks agree on its outcome
(an allreduce), so they pass, fail and shrink in lockstep, and rank 0 prints the smallest
failing plan.  Exits non-zero if any example failed.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asynccomm as ac

from ..transports.contract import bounded
from .objects_programs import Plan, plans, program

EXAMPLES = int(os.environ.get("ASYNCCOMM_STRESS_EXAMPLES", "15"))
#: Seconds one example may take before it fails as hung.
LIMIT = 10.0


def main() -> int:
    if not ac.launched_by_mpi():
        sys.stderr.write("run under an MPI launcher: mpiexec -n N python -m "
                         "tests.engine.mpi_objects_runner\n")
        return 2
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    failures: list[str] = []
    started = time.perf_counter()
    for loop in ("uvloop", "asyncio"):

        @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck), print_blob=False)
        @given(plan=plans(failures=False), loop=st.just(loop))
        def keeps(plan: Plan, loop: str) -> None:
            error = ""
            try:
                ac.run(bounded(program(plan), LIMIT), loop=loop)
            except Exception as exc:
                error = f"rank {rank}: {type(exc).__name__}: {exc}"
            errors = [e for e in world.allgather(error) if e]
            if errors:  # every rank raises, so the search stays in step
                raise AssertionError("; ".join(errors))

        try:
            keeps()
        except Exception as exc:
            failures.append(f"[{loop}] {exc}")
            if rank == 0:
                traceback.print_exception(exc, file=sys.stderr)
    if rank == 0:
        for line in failures:
            sys.stdout.write(f"FAILED {line}\n")
        sys.stdout.write(f"object programs on MPI, {size} ranks: {EXAMPLES} examples per loop, "
                         f"{len(failures)} failed in {time.perf_counter() - started:.1f} s\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
