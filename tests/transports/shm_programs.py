"""What each rank's process runs for the shared-memory tests: the transport contract and
the conservation programs, every program in a world of its own on both loops, all within
one launch of the processes (``process_runner.launch``), as the MPI runners do under one
``mpiexec``.  Each rank returns its failures as text."""

from __future__ import annotations

import time
import traceback
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asynccomm._comm.process_runner import run_rank

from .conservation import plans, program
from .contract import OPTIONS, PROGRAMS, bounded

#: Seconds one conservation example may take before it fails as hung.
LIMIT = 10.0
LOOPS = ("uvloop", "asyncio")


def contract(names: list[str], loops: tuple[str, ...] = LOOPS
             ) -> tuple[list[str], int, float]:
    """Run the contract programs ``names`` on this rank, on each of ``loops``: (failures,
    passed, seconds)."""
    failures: list[str] = []
    passed = 0
    started = time.perf_counter()
    for name in names:
        for loop in loops:
            options = {"eager_limit": 65_536, "pool_bytes": 64 << 20, "timeout": None,
                       **OPTIONS.get(name, {})}
            try:
                run_rank(bounded(PROGRAMS[name]), loop, options)
            except Exception as exc:  # reported, and the next one runs
                failures.append(f"{name}[{loop}]: {type(exc).__name__}: {exc}\n"
                                + "".join(traceback.format_exception(exc)))
            else:
                passed += 1
    return failures, passed, time.perf_counter() - started


def conservation(examples: int) -> list[str]:
    """The conservation search on every rank at once: the ranks draw the same
    derandomized examples, so they run the same worlds in the same order.  The first
    failing example of each loop is reported, and ends that loop's search (a failure
    breaks both ranks' worlds, so they stop together)."""
    failures: list[str] = []
    for loop in LOOPS:
        failures.extend(_search(loop, examples))
    return failures


def _search(loop: str, examples: int) -> list[str]:
    options = {"eager_limit": 65_536, "pool_bytes": 64 << 20, "timeout": None}
    errors: list[str] = []

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(plan=plans(), loop=st.just(loop))
    def holds(plan: Any, loop: str) -> None:
        if errors:
            return
        try:
            run_rank(bounded(program(plan), LIMIT), loop, options)
        except Exception as exc:
            errors.append(f"[{loop}] {plan}: {type(exc).__name__}: {exc}")

    holds()
    return errors


def suite(names: list[str], examples: int, loops: tuple[str, ...] = LOOPS) -> list[str]:
    """The contract programs ``names`` on each of ``loops``, then ``examples``
    conservation examples per loop (none: 0), in this launch; this rank's failures."""
    failures = contract(names, loops)[0] if names else []
    return failures + (conservation(examples) if examples else [])
