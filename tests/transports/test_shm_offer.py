"""The shared-memory link's offers: a large message's ``RTS`` carries its sender's buffer
address where the single copy is on, and its receiver copies as soon as a recv matches,
answering ``DATA_DONE`` alone (no ``CTS``).  Each test launches processes of its own
(``shm_offer_cases``)."""

from __future__ import annotations

import os

import pytest

from asynccomm._comm.process_runner import launch
from asynccomm.transports.shm import missing, single_copy

from .shm_offer_cases import (
    a_sender_that_dies,
    empty_messages_over_rendezvous,
    lent_copies,
    sizes_and_orders,
    sizes_both_ways,
)

pytestmark = [pytest.mark.skipif(missing() is not None, reason=str(missing())),
              pytest.mark.skipif(single_copy is None,
                                 reason="the single copy needs the C extension")]

STRESS = os.environ.get("ASYNCCOMM_STRESS_EXAMPLES")
#: ``make test-stress`` adds the asyncio loop and many more examples.
LOOPS = ["uvloop", "asyncio"] if STRESS else ["uvloop"]
EXAMPLES = int(STRESS) // 10 if STRESS else 5  # (each example opens worlds of its own)
#: (Refused single copies on the offer path: ``test_shm.py``'s refusal test; ``make
#: test-stress`` adds the property with rank 1 refused.)


@pytest.mark.parametrize("loop", LOOPS)
def test_recvs_before_and_after_the_offer_and_cancellations_while_lent(loop: str) -> None:
    """Posted before or after the ``RTS``, the recv copies without a ``CTS``; a recv
    cancelled while it copies completes (its cancellation deferred); a send cancelled
    while its receiver copies completes (the receiver decided); a send withdrawn before any
    recv matched is never received, and its offer is forgotten."""
    (k0, sender), (k1, receiver) = launch(lent_copies, 2, (loop,))
    assert (k0, k1) == ("ok", "ok"), (sender, receiver)
    # (Where the C lane lands the answers, only the one to a send being withdrawn takes
    # the Python steps: none, where that copy was answered before the send's cancellation
    # ran, as a copy its sender shares sometimes is.)
    c = sender["answers in C"]
    assert sender.pop("answered") in ((0, 1) if c else (5,))
    assert sender == {"cancelled send": [True], "withdrawn": True, "lent left": 0, "cts": 0,
                      "taken": 0, "answers in C": c}
    assert receiver == {"offers waiting": 1, "cancelled recv": ["Status"], "offers left": 0,
                        "copies left": 0, "cts": 0, "taken": 5, "answered": 0,
                        "answers in C": c}


def test_a_sender_killed_while_its_receiver_copies_breaks_that_recv() -> None:
    outcomes = launch(a_sender_that_dies, 2, ("uvloop",))
    kind, error = outcomes[0]
    assert kind == "err" and "killed by signal 9" in str(error), outcomes
    kind, said = outcomes[1]
    assert kind == "ok" and said.startswith("CommBrokenError: rank 0 died"), outcomes
    assert said.endswith("copies once: True"), outcomes


@pytest.mark.parametrize("refuse", [False, True] if STRESS else [False])
def test_any_sizes_in_any_order_arrive_intact(refuse: bool) -> None:
    """A hypothesis property (the ranks draw the same plans): messages of eager and
    rendezvous sizes, recvs posted before the sends or after in any order, on the C lane's
    steps or the Python ones; with rank 1's single copy refused, the same over the ring
    (and rank 1 copies once no more)."""
    outcomes = launch(sizes_and_orders, 2, ("uvloop", EXAMPLES, refuse))
    assert outcomes == [("ok", ([], True)), ("ok", ([], not refuse))]


@pytest.mark.parametrize("refuse", [True, False] if STRESS else [True])
def test_messages_both_ways_at_once_arrive_intact(refuse: bool) -> None:
    """A hypothesis property (the ranks draw the same plans): both ranks send to each other
    at once, messages of eager and rendezvous sizes, the recvs posted in any order, on the
    C lane's steps or the Python ones; the single copies refused, every rendezvous payload
    comes on the rings (both processes putting fragments on theirs while they take their
    peer's)."""
    assert launch(sizes_both_ways, 2, ("uvloop", EXAMPLES, refuse)) == [("ok", []),
                                                                         ("ok", [])]


def test_empty_messages_that_go_rendezvous_arrive() -> None:
    """An empty message sent without credit is announced with nothing to offer; its
    receiver's recv completes at once and the sender's send too (no copy to wait for)."""
    assert launch(empty_messages_over_rendezvous, 2, ("uvloop",)) == [("ok", 8), ("ok", 8)]
