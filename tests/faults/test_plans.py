"""Fault plans as data (``asynccomm.sim.FaultPlan``): each kind of fault does what
``docs/faults.md`` says, on the cluster model's virtual clock, and a plan replays."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm.sim import FaultPlan, LinkFault, PlannedCrash, RankFault

CLUSTER = ac.Cluster.preset("roce100g")
MS = 1e-3


def run(main: Any, size: int, plan: FaultPlan | None, **options: Any) -> list[Any]:
    options = {"timeout": 30, **options}
    if plan is None:
        return ac.run(main, size, cluster=CLUSTER, **options)
    return ac.run(main, size, cluster=CLUSTER, fault_plan=plan, **options)


async def pings(comm: ac.Communicator, n: int = 4, nbytes: int = 8) -> list[float]:
    """Rank 0 sends rank 1 ``n`` messages; rank 1 returns when each arrived."""
    buf = np.zeros(nbytes, np.uint8)
    if comm.rank == 0:
        for k in range(n):
            await comm.send(buf, 1, tag=k)
        return []
    times = []
    for k in range(n):
        await comm.recv(buf, 0, tag=k)
        times.append(comm.model_time())
    return times


def test_a_plan_round_trips_through_json() -> None:
    plan = FaultPlan(links=(LinkFault(src=0, dst=1, delay=MS, jitter=MS, both_ways=False),
                            LinkFault(link="roce100g", start=1.0, end=2.0, partition=True,
                                      bandwidth=0.5)),
                     ranks=(RankFault(2, crash_at_event=3), RankFault(1, slowdown=2.0,
                                                                      hang_at=0.5)),
                     seed=7, detection_timeout=0.1)
    again = FaultPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    assert FaultPlan.from_dict(FaultPlan().to_dict()) == FaultPlan()


@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda: LinkFault(delay=-1.0), ValueError, "delay"),
    (lambda: LinkFault(start=2.0, end=1.0, delay=1.0), ValueError, "after start"),
    (lambda: LinkFault(bandwidth=0.0), ValueError, "bandwidth"),
    (lambda: LinkFault(partition=True), ValueError, "heal"),
    (lambda: LinkFault(), ValueError, "must delay"),
    (lambda: LinkFault(src="0", delay=1.0), TypeError, "src"),
    (lambda: RankFault(0), ValueError, "crash, hang or slow"),
    (lambda: RankFault(0, crash_at_event=0), ValueError, "from 1"),
    (lambda: RankFault(0, slowdown=0.5), ValueError, "slowdown"),
    (lambda: RankFault(-1, crash_at=1.0), ValueError, "rank"),
    (lambda: FaultPlan(links=[LinkFault(delay=1.0)]), TypeError, "tuple"),  # type: ignore[arg-type]
    (lambda: FaultPlan(detection_timeout=0.0), ValueError, "detection_timeout"),
    (lambda: FaultPlan.from_dict({"links": [{"delay": 1.0, "late": 2}]}), ValueError, "late"),
])
def test_a_bad_plan_is_refused_when_made(make: Any, error: type[Exception],
                                         match: str) -> None:
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize(("plan", "options", "error", "match"), [
    (FaultPlan(ranks=(RankFault(4, crash_at=0.1),)), {}, ValueError, "out of range"),
    (FaultPlan(links=(LinkFault(link="nvlink", delay=1.0),)), {}, ValueError, "roce100g"),
    (FaultPlan(ranks=(RankFault(0, crash_at=0.1), RankFault(0, slowdown=2.0))), {},
     ValueError, "two RankFaults"),
    (FaultPlan(), {"faults": "abort"}, ValueError, "tolerate"),
    ("crash rank 1", {}, TypeError, "FaultPlan"),
])
def test_a_plan_that_does_not_fit_the_world_is_refused_before_any_rank_runs(
        plan: Any, options: dict[str, Any], error: type[Exception], match: str) -> None:
    ran = []

    async def main(comm: ac.Communicator) -> None:
        ran.append(comm.rank)

    with pytest.raises(error, match=match):
        run(main, 4, plan, **options)
    with pytest.raises(ValueError, match="cluster model"):
        ac.run(main, 2, fault_plan=FaultPlan(), clock="virtual")
    assert ran == []


def test_an_empty_plan_changes_nothing() -> None:
    assert run(pings, 2, FaultPlan()) == run(pings, 2, None)


def test_a_delay_adds_to_every_message_sent_while_it_lasts() -> None:
    base = run(pings, 2, None)[1]
    delayed = run(pings, 2, FaultPlan(links=(LinkFault(src=0, dst=1, delay=MS),)))[1]
    assert delayed[0] == pytest.approx(base[0] + MS, abs=1e-9)
    assert all(d >= b + MS - 1e-9 for d, b in zip(delayed, base, strict=True))
    later = run(pings, 2, FaultPlan(links=(LinkFault(delay=MS, start=1.0),)))[1]
    assert later == base  # every message left before the fault began
    by_name = run(pings, 2, FaultPlan(links=(LinkFault(link="roce100g", delay=MS),)))[1]
    assert by_name == delayed


def test_jitter_is_seeded_bounded_and_replays() -> None:
    def plan(seed: int) -> FaultPlan:
        return FaultPlan(links=(LinkFault(delay=MS, jitter=MS),), seed=seed)

    base = run(pings, 2, None)[1]
    first, again, other = (run(pings, 2, plan(s))[1] for s in (1, 1, 2))
    assert first == again and first != other
    assert first == sorted(first)  # still in order
    assert base[0] + MS - 1e-9 <= first[0] <= base[0] + 2 * MS + 1e-9


def test_a_degraded_link_is_slower_by_its_factor() -> None:
    async def big(comm: ac.Communicator) -> float:
        return (await pings(comm, 1, 16 << 20) or [0.0])[0]

    base = run(big, 2, None)[1]
    slow = run(big, 2, FaultPlan(links=(LinkFault(bandwidth=0.25),)))[1]
    assert 3.5 < slow / base < 4.1


@pytest.mark.parametrize("both_ways", [False, True])
def test_a_partition_holds_messages_until_it_heals(both_ways: bool) -> None:
    async def both(comm: ac.Communicator) -> float:
        send = comm.isend(np.zeros(1), 1 - comm.rank)
        await comm.recv(np.zeros(1), 1 - comm.rank)
        got = comm.model_time()
        await send
        return got

    heal = 5 * MS
    plan = FaultPlan(links=(LinkFault(src=0, dst=1, partition=True, end=heal,
                                      both_ways=both_ways),))
    t0, t1 = run(both, 2, plan)
    assert t1 > heal  # 0 -> 1 was held
    assert (t0 > heal) == both_ways  # 1 -> 0 too, two-sided


def test_a_slow_rank_computes_and_copies_slower() -> None:
    async def work(comm: ac.Communicator) -> float:
        await comm.compute(seconds=MS)
        return comm.model_time()

    assert run(work, 2, FaultPlan(ranks=(RankFault(1, slowdown=3.0),))) == pytest.approx(
        [MS, 3 * MS])


async def survive(comm: ac.Communicator) -> Any:
    """Receive from every other rank, then recover as a ULFM program does."""
    errors: list[type] = []
    try:
        buf = np.zeros(1)
        if comm.rank == 0:
            for src in range(1, comm.size):
                await comm.recv(buf, src)
        else:
            await comm.send(np.ones(1), 0)
        await comm.allreduce(np.ones(1))
    except (ac.CommBrokenError, ac.CommRevokedError) as exc:
        errors.append(type(exc))
        comm.revoke()
    when = comm.model_time()
    new = await comm.shrink()
    total = np.array([comm.rank + 1.0])
    await new.allreduce(total)
    return when, comm.acked_failed(), float(total[0])


def test_a_crash_at_a_time_fails_the_rank_and_its_peers_go_on() -> None:
    plan = FaultPlan(links=(LinkFault(src=2, dst=0, delay=2 * MS, both_ways=False),),
                     ranks=(RankFault(2, crash_at=MS),))
    results = run(survive, 3, plan)
    assert isinstance(results[2], ac.CommClosedError)
    for _, acked, total in (results[0], results[1]):
        assert acked == (2,) and total == 1.0 + 2.0
    # Rank 0 took rank 2's message (sent before the crash, delayed) before hearing of it.
    assert results[0][0] >= 2 * MS


def test_a_crash_at_an_engine_event_is_counted_on_every_communicator() -> None:
    results = run(survive, 4, FaultPlan(ranks=(RankFault(3, crash_at_event=1),)))
    assert isinstance(results[3], ac.CommClosedError)
    assert [r[1:] for r in results[:3]] == [((3,), 6.0)] * 3


def test_a_hang_is_declared_failed_after_the_detection_timeout() -> None:
    plan = FaultPlan(ranks=(RankFault(1, hang_at=0.0),), detection_timeout=10 * MS)
    results = run(survive, 3, plan)
    assert results[0][0] == pytest.approx(10 * MS, abs=1e-5)  # heard at once then
    assert [r[1:] for r in (results[0], results[2])] == [((1,), 4.0)] * 2


def test_a_hang_without_detection_waits_until_the_op_timeout() -> None:
    async def main(comm: ac.Communicator) -> Any:
        buf = np.zeros(1)
        if comm.rank == 0:
            try:
                await comm.recv(buf, 1, timeout=0.5)
            except ac.CommTimeoutError:
                return "timed out", comm.model_time()
        else:
            await comm.send(buf, 0)
        return "done", comm.model_time()

    results = run(main, 2, FaultPlan(ranks=(RankFault(1, hang_at=0.0),)), timeout=1.0)
    assert results[0] == ("timed out", pytest.approx(0.5))
    assert results[1][1] >= 1e6  # its own (eager) send left only at the end of time


@pytest.mark.parametrize(("length", "declared"), [(5 * MS, False), (50 * MS, True)])
def test_a_partition_declares_an_isolated_rank_failed_only_past_the_timeout(
        length: float, declared: bool) -> None:
    plan = FaultPlan(links=(LinkFault(src=2, partition=True, end=length, both_ways=False),),
                     detection_timeout=20 * MS)
    results = run(survive, 3, plan)
    if declared:
        assert isinstance(results[2], ac.CommClosedError)
        assert results[0][1:] == ((2,), 3.0)
    else:
        assert [r[1:] for r in results] == [((), 6.0)] * 3
        assert results[0][0] > length  # delayed, not dropped


def test_the_trace_shows_the_faults(tmp_path: Path) -> None:
    plan = FaultPlan(links=(LinkFault(src=1, dst=0, partition=True, end=MS),),
                     ranks=(RankFault(2, crash_at=1e-6), RankFault(1, slowdown=2.0)))
    run(survive, 3, plan, trace=tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    faults = {(e["pid"], e["name"]): e["ts"] for e in events if e.get("cat") == "fault"}
    assert faults[(2, "fault: crash")] == pytest.approx(1.0)  # microseconds
    assert (1, "fault: held to 0") in faults and (1, "fault: slow") in faults


def test_the_trace_shows_a_declared_failure(tmp_path: Path) -> None:
    plan = FaultPlan(ranks=(RankFault(1, hang_at=1e-6),), detection_timeout=2 * MS)
    results = run(survive, 3, plan, trace=tmp_path / "t.json")
    assert results[0][1:] == ((1,), 4.0)
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    faults = {(e["pid"], e["name"]): e["ts"] for e in events if e.get("cat") == "fault"}
    assert faults[(1, "fault: hang")] == pytest.approx(1.0)  # microseconds
    assert faults[(1, "fault: declared failed")] == pytest.approx(2001.0)


def test_the_crashed_ranks_peers_are_told_why() -> None:
    async def main(comm: ac.Communicator) -> Any:
        if comm.rank == 0:
            try:
                await comm.recv(np.zeros(1), 1)
            except ac.CommBrokenError as exc:
                return exc
        else:
            await comm.recv(np.zeros(1), 0)

    err = run(main, 2, FaultPlan(ranks=(RankFault(1, crash_at=MS),)))[0]
    assert err.peer == 1 and "fault plan" in str(err) + str(err.__cause__)
    assert isinstance(err.__cause__, PlannedCrash)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_plan_runs_on_the_wall_clock_too(loop: str) -> None:
    """Model time on a real loop: a 5 ms partition holds the message 5 (real) ms."""
    plan = FaultPlan(links=(LinkFault(link="roce100g", partition=True, end=5 * MS),))
    _, (t,) = ac.run(functools.partial(pings, n=1), 2, cluster=CLUSTER, clock="wall",
                     loop=loop, fault_plan=plan, timeout=30)
    assert 5 * MS <= t < 1.0
