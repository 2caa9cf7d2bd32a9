"""Conservation under cancellation on MPI: the randomized programs of ``conservation.py``,
drawn by hypothesis, on every rank at once.

Run: ``mpiexec -n N python -m tests.transports.mpi_conservation_runner`` (``test_mpi.py``
runs it at 2 ranks; ``make test-stress`` with many more examples).  Every rank runs the
same derandomized hypothesis search; after each example the ranks agree on its outcome
(an allreduce), so they pass, fail and shrink in lockstep, and rank 0 prints the smallest
failing plan.  Exits non-zero if any example failed.
"""

from __future__ import annotations

import os
import sys

from .conservation import plans, program
from .mpi_programs import run_plans

EXAMPLES = int(os.environ.get("ASYNCCOMM_STRESS_EXAMPLES", "25"))


def main() -> int:
    return run_plans("conservation", "tests.transports.mpi_conservation_runner", plans(),
                     program, EXAMPLES)


if __name__ == "__main__":
    sys.exit(main())
