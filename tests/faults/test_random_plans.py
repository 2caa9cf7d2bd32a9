"""Random seeded fault plans on random programs of 2 to 6 modelled ranks: link delays,
jitter, degraded bandwidth and partitions, with at most one rank crashing (at a time or
an engine event), hanging (then declared failed by the modelled detector) or slowed down.
The invariants of ``test_crash_points`` hold, and more: link faults alone fail no rank
(a partition delays, it does not drop), and only the ranks the plan fails fail.

``make test`` runs a few dozen plans; ``make test-fault-plans`` (the ``fault_plans``
marker, ``ASYNCCOMM_FAULT_PLANS`` examples: 10,000 by default there) many more.
"""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from asynccomm.sim import FaultPlan, LinkFault, RankFault
from asynccomm.sim.faults import PlannedFaults

from . import test_crash_points as points
from .test_programs import AFTER

#: The long run's examples (``make test-fault-plans``); unset, it is deselected.  Its
#: examples come from seed ``ASYNCCOMM_FAULT_PLANS_SEED`` (the make target runs one process
#: per core, each with its own seed and its share of the examples).
MANY = int(os.environ.get("ASYNCCOMM_FAULT_PLANS") or 0)
SEED = int(os.environ.get("ASYNCCOMM_FAULT_PLANS_SEED") or 0)
STEPS = ("ring", "allreduce", "server", "objects", "pipeline", "ps", "bcast", "alltoall",
         "allgather", "barrier", "split")
MS = 1e-3


@st.composite
def link_faults(draw: st.DrawFn, size: int) -> LinkFault:
    ends = st.one_of(st.none(), st.integers(0, size - 1))
    start = draw(st.sampled_from([0.0, 0.01 * MS, 0.1 * MS, MS]))
    partition = draw(st.booleans())
    length = draw(st.sampled_from([0.01 * MS, MS, 5 * MS, 30 * MS]))
    delay = draw(st.sampled_from([0.0, 1e-6, 0.1 * MS, MS]))
    jitter = draw(st.sampled_from([0.0, 1e-6, 0.1 * MS]))
    bandwidth = draw(st.sampled_from([1.0, 0.5, 0.05]))
    if not (partition or delay or jitter or bandwidth < 1):
        delay = 1e-6  # (a fault that does nothing is refused)
    heals = partition or draw(st.booleans())
    return LinkFault(src=draw(ends), dst=draw(ends), both_ways=draw(st.booleans()),
                     start=start, end=start + length if heals else math.inf, delay=delay,
                     jitter=jitter, bandwidth=bandwidth, partition=partition)


@st.composite
def plans(draw: st.DrawFn) -> tuple[int, tuple[str, ...], FaultPlan]:
    size = draw(st.integers(2, 6))
    steps = tuple(draw(st.lists(st.sampled_from(STEPS), min_size=1, max_size=4)))
    links = draw(st.lists(link_faults(size), max_size=3))
    ranks: tuple[RankFault, ...] = ()
    timeout = draw(st.sampled_from([None, 2 * MS, 20 * MS]))
    kind = draw(st.sampled_from(["none", "none", "time", "event", "hang", "slow"]))
    victim = draw(st.integers(0, size - 1))
    if kind == "time":
        ranks = (RankFault(victim, crash_at=draw(st.sampled_from([0.0, 1e-6, 1e-5, 1e-4]))),)
    elif kind == "event":
        ranks = (RankFault(victim, crash_at_event=draw(st.integers(1, 40))),)
    elif kind == "hang":
        timeout = timeout or 2 * MS  # a hang is survived only when it is detected
        ranks = (RankFault(victim, hang_at=draw(st.sampled_from([0.0, 1e-6, 1e-5]))),)
    elif kind == "slow":
        ranks = (RankFault(victim, slowdown=draw(st.sampled_from([2.0, 10.0]))),)
    return size, steps, FaultPlan(tuple(links), ranks, draw(st.integers(0, 2**31)), timeout)


def check(size: int, steps: tuple[str, ...], plan: FaultPlan) -> None:
    results, _ = points.run_program(size, steps, plan)
    planned = PlannedFaults(plan, points.CLUSTER, size)
    may_fail = set(planned.declared) | {r.rank for r in plan.ranks if r.slowdown == 1}
    alive = [r for r in range(size) if results[r] != "crashed"]
    assert set(range(size)) - set(alive) <= may_fail
    survivors = [results[r] for r in alive]
    if not survivors:
        return
    assert len({tuple(answers) for *_, answers in survivors}) == 1  # every agree: one answer
    members = {tuple(world) for _, world, _, _ in survivors}
    assert len(members) == 1  # one membership, in one order
    (world,) = members
    assert set(alive) <= set(world) and set(range(size)) - set(world) <= may_fail
    for rank, (errors, _, (total, got), _) in zip(alive, survivors, strict=True):
        if not may_fail:
            assert errors == []  # link faults delay, they never fail an op
        assert total == sum(r + 1.0 for r in world)  # the fault-free result on that group
        left = world[(world.index(rank) - 1) % len(world)]
        assert got == [(left, j) for j in range(AFTER)]  # nothing lost or duplicated


@settings(max_examples=40, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans())
def test_random_fault_plans_are_survived(plan: tuple[int, tuple[str, ...], FaultPlan]) -> None:
    check(*plan)


@pytest.mark.fault_plans  # (deselected unless ASYNCCOMM_FAULT_PLANS is set: tests/conftest.py)
@settings(max_examples=max(MANY, 1), database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@seed(SEED)
@given(plan=plans())
def test_many_random_fault_plans_are_survived(
        plan: tuple[int, tuple[str, ...], FaultPlan]) -> None:
    check(*plan)


def test_a_random_plan_replays_from_its_dict() -> None:
    plan = FaultPlan((LinkFault(delay=MS, jitter=MS), LinkFault(src=1, partition=True,
                                                                 end=5 * MS)),
                     (RankFault(2, crash_at_event=7),), seed=11, detection_timeout=20 * MS)
    first = points.run_program(4, ("ps", "ring", "split"), plan)
    again = points.run_program(4, ("ps", "ring", "split"), FaultPlan.from_dict(plan.to_dict()))
    assert repr(first) == repr(again)


def test_a_split_left_after_go_is_not_waited_for() -> None:
    """A rank whose split could not hear rank 0's GO (its private context lost a member)
    forfeits its place: the members that came are told, instead of waiting for it."""
    plan = FaultPlan((LinkFault(both_ways=False, jitter=1e-6),), (RankFault(1, crash_at=0.0),))
    results, _ = points.run_program(4, ("split",), plan)
    assert [r for r in results if r == "crashed"] == ["crashed"]
