"""The transport contract and conservation under cancellation on the shared-memory link,
in ``n`` processes (``backend="processes"``), each running every program in a world of its
own: one launch per size (starting processes is slow).  ``make test`` runs the contract at 2
and 4 processes and conservation at 2 and 3; ``make test-stress``
(``ASYNCCOMM_STRESS_EXAMPLES``) adds the contract at 3, and conservation at 3 and 4 with
many more examples."""

from __future__ import annotations

import os

import pytest

from asynccomm._comm.process_runner import launch
from asynccomm.transports.shm import missing, single_copy

from .contract import PROGRAMS
from .shm_cases import refused_single_copy
from .shm_programs import suite

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

STRESS = os.environ.get("ASYNCCOMM_STRESS_EXAMPLES")
EXAMPLES = int(STRESS or "6")
BOTH = ("uvloop", "asyncio")
#: (processes, contract programs, conservation examples per loop, the pure-Python path:
#: libatomic's atomics, rendezvous data on the ring, the loops of the contract programs) of
#: each launch.  The contract runs on both loops at 2 processes; at 4, and on the
#: pure-Python path (whose steps are the same on either loop), on one each.  Conservation
#: runs at 2 processes and at 3, more than the cores (a node then waits as a crowded one:
#: its short yielding spin, then its doorbell).
LAUNCHES = [(2, True, EXAMPLES, False, BOTH), (4, True, 0, False, ("asyncio",)),
            (2, True, 0, True, ("uvloop",)), (3, False, EXAMPLES, False, BOTH)]
if STRESS:
    LAUNCHES += [(3, True, EXAMPLES, False, BOTH), (4, False, EXAMPLES, False, BOTH),
                 (3, False, EXAMPLES, True, BOTH), (4, True, 0, False, BOTH),
                 (2, True, 0, True, BOTH)]


@pytest.mark.parametrize(("n", "with_contract", "examples", "pure", "loops"), LAUNCHES)
def test_contract_and_conservation_on_processes(n: int, with_contract: bool, examples: int,
                                                pure: bool, loops: tuple[str, ...],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if pure:  # read by each process as it imports asynccomm
        monkeypatch.setenv("ASYNCCOMM_PURE_PYTHON", "1")
    names = list(PROGRAMS) if with_contract else []
    outcomes = launch(suite, n, (names, examples, loops))
    failures = [f"rank {r}: {v!r}" if kind == "err" else f"rank {r}: {line}"
                for r, (kind, v) in enumerate(outcomes)
                for line in ([v] if kind == "err" else v)]  # type: ignore[union-attr]
    assert not failures, "\n".join(failures)


def test_a_refused_single_copy_sends_the_data_on_the_ring_instead() -> None:
    """Where the kernel does not let a receiver read its sender (``process_vm_readv``),
    the sender is told and sends the bytes on the ring; that receiver copies once no more."""
    if single_copy is None:
        pytest.skip("the single copy needs the C extension")
    outcomes = launch(refused_single_copy, 2, ("uvloop",))
    assert outcomes == [("ok", True), ("ok", False)]
