"""The fault-tolerance contract on ``backend="processes"`` (``_comm/agreement.py``): revoke,
failed/ack_failed, agree and shrink across processes, ranks killed (``SIGKILL``) at random
moments, and the coordinator of an agreement dying during it.  ``ASYNCCOMM_STRESS_EXAMPLES``
runs many more killings (``make test-stress``)."""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asynccomm as ac
from asynccomm.transports import shm

from . import process_programs as pp
from .common import Died
from .test_programs import AFTER, STEPS

pytestmark = pytest.mark.skipif(shm.missing() is not None, reason=str(shm.missing()))

EXAMPLES = int(os.environ.get("ASYNCCOMM_STRESS_EXAMPLES", "2"))
#: Seconds each rank's program may take (a hang fails the rank instead of the test run).
LIMIT = 20.0


def run(main: Any, size: int, loop: str = "uvloop") -> list[Any]:
    return ac.run(functools.partial(pp.bounded, main=main, limit=LIMIT), size,
                  backend="processes", faults="tolerate", loop=loop, timeout=LIMIT)


def test_a_failure_alone_reads_as_before() -> None:
    (err, failed, acked), died = run(pp.failure_alone, 2)
    assert isinstance(died, Died) and "(raised on rank 1)" in died.__notes__
    assert type(err) is ac.CommBrokenError and err.peer == 1 and err.rank == 0
    assert failed == (1,) and acked == ()


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def shared(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """What each rank of one world of 4 processes got from the programs that leave their
    communicator usable (``pp.SHARED``), on each loop."""
    return run(pp.several, 4, request.param)


def test_revoke_fails_pending_and_later_ops_on_every_rank(
        shared: list[dict[str, Any]]) -> None:
    for rank in range(3):
        *errors, ok, size, total = shared[rank]["revoke_everywhere"]
        assert len(errors) == (7 if rank == 0 else 10)
        assert all(e == ("CommRevokedError", 0, rank) for e in errors), (rank, errors)
        assert (ok, size, total) == (1 & 2 & 3, 3, 3.0)


def test_agree_is_the_and_of_the_flags_on_worlds_and_their_sub_communicators(
        shared: list[dict[str, Any]]) -> None:
    got = [shared[rank]["agree_and"] for rank in range(4)]
    both = 0b1110 & 0b0111 & 0b1111 & 0b0110
    assert got == [[both, both, 0b1110 & 0b1111], [both, both, 0b0111 & 0b0110],
                   [both, both, 0b1110 & 0b1111], [both, both, 0b0111 & 0b0110]]


def test_shrink_gives_one_membership_in_the_old_order_and_wildcards_follow_acks() -> None:
    results = run(pp.shrink_in_order, 4)
    assert isinstance(results[1], Died)
    for rank in (0, 2, 3):
        parents, sub_parents, acked, total, failed = results[rank]
        assert parents == [0, 2, 3] and sub_parents == [0, 1, 3]  # sub: world 3, 1, 0
        assert acked == (1,) and failed == (1,) and total == 5.0


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_member_that_never_joins_a_split_is_named_not_waited_for(loop: str) -> None:
    """(``forming``, Rule 2b; ``shm.Node.forfeit``.)  Rank 2 forfeits, raises, dies: its
    split gives that; ranks 0 and 1 get ``CommBrokenError`` naming it, from the split if
    rank 2 was to make the new world, else from their ops with it, and the two go on."""
    results = run(pp.never_joins, 3, loop)
    assert isinstance(results[2], RuntimeError) and "signal 9" in str(results[2])
    for rank in (0, 1):
        forfeits, forfeits_first, raises, raises_first, dies = results[rank]
        for got in (forfeits, raises):  # the split made, without rank 2
            assert got[:3] == ("use", "CommBrokenError", 2) and got[4] == 0.0, got
            assert "never joined" in got[3], got
        for got in (forfeits_first, raises_first):  # rank 2 was to make its world
            assert got[:2] == ("split", 2) and "left before it made" in got[2], got
        assert dies[0] in ("split", "use") and 2 in dies and "died" in str(dies), dies


def test_bad_flags_are_refused_before_anything_is_taken(
        shared: list[dict[str, Any]]) -> None:
    for errors, value in (shared[rank]["bad_flags"] for rank in range(2)):
        assert errors == ["TypeError", "TypeError", "TypeError", "ValueError", "ValueError"]
        assert value == 2 & 3


def test_collectives_that_lose_a_member_do_not_hang() -> None:
    results = run(pp.collective_loses_member, 3)
    assert isinstance(results[2], RuntimeError) and "signal 9" in str(results[2])
    for got in results[:2]:
        assert all(g in ("ok", ("CommBrokenError", 2)) for g in got), got
        assert got[1:] == [("CommBrokenError", 2)] * 4, got  # the allreduce needs rank 2


@pytest.mark.parametrize("how", ["collecting", "told-one", "told-none"])
def test_the_coordinator_dying_during_agree_leaves_one_answer(how: str) -> None:
    results = run(functools.partial(pp.coordinator_dies, how=how), 4)
    assert isinstance(results[0], RuntimeError) and "signal 9" in str(results[0])
    # told one: the decision rank 0 made (its flag 1 in, nobody failed) reached rank 1,
    # which passed it on; otherwise the survivors decide anew, without rank 0.
    want = (1, ()) if how == "told-one" else (3, (0,))
    assert [r[:2] for r in results[1:]] == [want] * 3
    assert all(r[2:] == ([1, 2, 3], 3.0) for r in results[1:]), results


@st.composite
def kills(draw: st.DrawFn) -> pp.Kill:
    size = draw(st.integers(2, 4))
    steps = tuple(draw(st.lists(st.sampled_from((*STEPS, "big")), min_size=1, max_size=4)))
    return pp.Kill(size, steps, draw(st.integers(0, size - 1)),
                   draw(st.integers(0, len(steps))), draw(st.booleans()))


@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(plan=kills())
def test_survivors_of_a_killed_rank_revoke_agree_shrink_and_go_on(plan: pp.Kill) -> None:
    results = run(functools.partial(pp.killed, plan=plan), plan.size)
    victim = results[plan.victim]
    assert isinstance(victim, RuntimeError) and "signal 9" in str(victim), victim
    survivors = [r for r in range(plan.size) if r != plan.victim]
    outcomes = [results[r] for r in survivors]
    assert all(isinstance(o, tuple) for o in outcomes), outcomes
    errored = any(errors for errors, *_ in outcomes)
    for rank, (errors, flag, acked, parents, total, got) in zip(survivors, outcomes,
                                                               strict=True):
        for name, peer in errors:  # every failure typed, and naming the failed rank
            assert name == "CommRevokedError" or (name == "CommBrokenError"
                                                  and peer == plan.victim), errors
        assert flag == (0 if errored else 1)  # one answer on every survivor
        assert acked == (plan.victim,)
        assert parents == survivors  # one membership, in the old order
        assert total == sum(r + 1.0 for r in survivors)
        left = survivors[(survivors.index(rank) - 1) % len(survivors)]
        assert got == [(left, k) for k in range(AFTER)]  # nothing lost or duplicated
