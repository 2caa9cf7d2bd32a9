"""The transport contract and conservation under cancellation on the shared-memory link,
in ``n`` processes (``backend="processes"``), each running every program in a world of its
own: one launch per size (starting processes is slow).  ``make test`` runs 2 and 4
processes; ``make test-stress`` (``ASYNCCOMM_STRESS_EXAMPLES``) adds 3, and conservation
at 3 and 4 with many more examples."""

from __future__ import annotations

import os

import pytest

from asynccomm._comm.process_runner import launch
from asynccomm.transports.shm import missing

from .contract import PROGRAMS
from .shm_programs import suite

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

STRESS = os.environ.get("ASYNCCOMM_STRESS_EXAMPLES")
EXAMPLES = int(STRESS or "10")
#: (processes, contract programs, conservation examples per loop) of each launch.
LAUNCHES = [(2, True, EXAMPLES), (4, True, 0)]
if STRESS:
    LAUNCHES += [(3, True, EXAMPLES), (4, False, EXAMPLES)]


@pytest.mark.parametrize(("n", "with_contract", "examples"), LAUNCHES)
def test_contract_and_conservation_on_processes(n: int, with_contract: bool,
                                                examples: int) -> None:
    names = list(PROGRAMS) if with_contract else []
    outcomes = launch(suite, n, (names, examples))
    failures = [f"rank {r}: {v!r}" if kind == "err" else f"rank {r}: {line}"
                for r, (kind, v) in enumerate(outcomes)
                for line in ([v] if kind == "err" else v)]  # type: ignore[union-attr]
    assert not failures, "\n".join(failures)
