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

from ..transports.mpi_programs import run_plans
from .objects_programs import plans, program

EXAMPLES = int(os.environ.get("ASYNCCOMM_STRESS_EXAMPLES", "15"))


def main() -> int:
    return run_plans("object programs", "tests.engine.mpi_objects_runner",
                     plans(failures=False), program, EXAMPLES)


if __name__ == "__main__":
    sys.exit(main())
