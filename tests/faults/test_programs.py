"""Random programs where one rank fails at a random point: the survivors catch the error,
revoke, agree, shrink and finish on the shrunk communicator as a fault-free run would."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asynccomm as ac

from .common import Died, run_ranks

STEPS = ("ring", "allreduce", "server", "objects")
EXAMPLES = int(os.environ.get("ASYNCCOMM_STRESS_EXAMPLES", "50"))
#: Messages each survivor sends its right neighbour on the shrunk communicator.
AFTER = 8


@dataclass(frozen=True)
class Plan:
    size: int
    steps: tuple[str, ...]
    victim: int
    fail_at: int  # the step before which the victim fails (len(steps): after the last)
    how: str  # "raise", or "return": its main returns early


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    size = draw(st.integers(2, 6))
    steps = tuple(draw(st.lists(st.sampled_from(STEPS), min_size=1, max_size=5)))
    return Plan(size, steps, draw(st.integers(0, size - 1)),
                draw(st.integers(0, len(steps))), draw(st.sampled_from(["raise", "return"])))


async def step(comm: ac.Communicator, what: str, i: int) -> None:
    """One fault-free step of every rank (rank 0 serves in ``server``)."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    if what == "ring":
        got = np.zeros(2, np.int64)
        await comm.sendrecv(np.array([comm.rank, i]), right, got, left, sendtag=i, recvtag=i)
        assert list(got) == [left, i]
    elif what == "allreduce":
        buf = np.full(3, comm.rank + 1.0)
        await comm.allreduce(buf)
        assert buf[0] == comm.size * (comm.size + 1) / 2
    elif what == "server":
        if comm.rank == 0:
            buf = np.zeros(2, np.int64)
            for _ in range(comm.size - 1):
                status = await comm.recv(buf, ac.ANY_SOURCE, tag=100 + i)
                assert buf[1] == i
                await comm.send(buf * 2, status.source, tag=100 + i)
        else:
            await comm.send(np.array([comm.rank, i]), 0, tag=100 + i)
            reply = np.zeros(2, np.int64)
            await comm.recv(reply, 0, tag=100 + i)
            assert list(reply) == [2 * comm.rank, 2 * i]
    else:
        await comm.send_obj({"from": comm.rank, "step": i, "a": np.arange(3)}, right, tag=i)
        obj, _ = await comm.recv_obj(left, tag=i)
        assert obj["from"] == left and obj["step"] == i


async def final(comm: ac.Communicator, ranks: list[int]) -> tuple[float, list[Any]]:
    """The work after recovery: an allreduce of each rank's ``ranks[rank] + 1``, and a
    ring of ``AFTER`` numbered messages to the right neighbour, each ``(ranks[rank], k)``."""
    total = np.array([ranks[comm.rank] + 1.0])
    await comm.allreduce(total)
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    sends = [comm.isend(np.array([ranks[comm.rank], k]), right, tag=7) for k in range(AFTER)]
    got = []
    for _ in range(AFTER):
        buf = np.zeros(2, np.int64)
        await comm.recv(buf, left, tag=7)
        got.append(tuple(int(v) for v in buf))
    await ac.wait_all(sends)
    return float(total[0]), got


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    return [exc]


def program(plan: Plan) -> Any:
    async def main(comm: ac.Communicator) -> Any:
        if comm.rank == 0:
            comm.ack_failed()  # the server hears of a client's failure on ANY_SOURCE
        errors: list[BaseException] = []
        try:
            for i, what in enumerate((*plan.steps, None)):
                if comm.rank == plan.victim and i == plan.fail_at:
                    if plan.how == "raise":
                        raise Died
                    return "returned early"
                if what is not None:
                    await step(comm, what, i)
        except (ac.CommBrokenError, ac.CommRevokedError, ExceptionGroup) as exc:
            errors.extend(leaves(exc))  # (a batch whose two ops failed: a group)
            comm.revoke()
        return errors, *await recover(comm, errors)

    return main


async def recover(comm: ac.Communicator, errors: list[BaseException]) -> tuple[Any, ...]:
    """After the steps: agree on whether any survivor saw an error, shrink, and ``final``
    on the shrunk communicator: the flag, the acknowledged failures, the new members'
    old ranks, and what ``final`` returned."""
    flag = await comm.agree(0 if errors else 1)
    acked = comm.acked_failed()
    new = await comm.shrink()
    parents = [new.parent_rank(r) for r in range(new.size)]
    total, got = await final(new, parents)
    return flag, acked, parents, total, got


@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.parametrize("env", ["virtual", "asyncio", "uvloop", "roce100g"])
@given(plan=plans())
def test_survivors_revoke_agree_shrink_and_go_on(env: str, plan: Plan) -> None:
    results = run_ranks(env, plan.size, program(plan), limit=20.0)
    victim = results[plan.victim]
    assert isinstance(victim, Died) if plan.how == "raise" else victim == "returned early"
    survivors = [r for r in range(plan.size) if r != plan.victim]
    outcomes = [results[r] for r in survivors]
    errored = any(errors for errors, *_ in outcomes)
    for rank, (errors, flag, acked, parents, total, got) in zip(survivors, outcomes,
                                                               strict=True):
        for exc in errors:  # every failure typed, and naming the failed rank
            assert (type(exc) is ac.CommRevokedError
                    or (type(exc) is ac.CommBrokenError and exc.peer == plan.victim)), exc
        assert flag == (0 if errored else 1)  # one answer: the AND of the survivors'
        assert acked == (plan.victim,)
        assert parents == survivors  # one membership, in the old order
        assert total == sum(r + 1.0 for r in survivors)  # a fault-free run on that group
        left = survivors[(survivors.index(rank) - 1) % len(survivors)]
        assert got == [(left, k) for k in range(AFTER)]  # nothing lost or duplicated
