"""Running hypothesis-drawn programs on every MPI rank at once: each rank draws the same
derandomized examples, runs each in a world of its own on both loops, and all ranks
raise together when one failed, so the search stays in step.  The runners of the
randomized suites (``mpi_conservation_runner``, ``tests.engine.mpi_objects_runner``)
are this with their own programs."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asynccomm as ac

from .contract import bounded

#: Seconds one example may take before it fails as hung.
LIMIT = 10.0


def run_plans(what: str, module: str, plans: st.SearchStrategy[Any],
              program: Callable[[Any], Any], examples: int) -> int:
    """Run ``program(plan)`` for ``examples`` plans per loop on every rank; rank 0 prints
    ``{what} on MPI, N ranks: K examples per loop, F failed in S s``.  The exit status."""
    if not ac.launched_by_mpi():
        sys.stderr.write(f"run under an MPI launcher: mpiexec -n N python -m {module}\n")
        return 2
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    failures: list[str] = []
    started = time.perf_counter()
    for loop in ("uvloop", "asyncio"):

        @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck), print_blob=False)
        @given(plan=plans, loop=st.just(loop))
        def holds(plan: Any, loop: str) -> None:
            error = ""
            try:
                ac.run(bounded(program(plan), LIMIT), loop=loop)
            except Exception as exc:
                error = f"rank {rank}: {type(exc).__name__}: {exc}"
            errors = [e for e in world.allgather(error) if e]
            if errors:  # every rank raises, so the search stays in step
                raise AssertionError("; ".join(errors))

        try:
            holds()
        except Exception as exc:
            failures.append(f"[{loop}] {exc}")
            if rank == 0:
                traceback.print_exception(exc, file=sys.stderr)
    if rank == 0:
        for line in failures:
            sys.stdout.write(f"FAILED {line}\n")
        sys.stdout.write(f"{what} on MPI, {size} ranks: {examples} examples per loop, "
                         f"{len(failures)} failed in {time.perf_counter() - started:.1f} s\n")
    return 1 if failures else 0
