"""Crash points, enumerated on the modelled cluster with fault plans: a rank crashes right
after its k-th engine event (a send posted, a recv matched to a message at its sender, a
payload copied into a recv buffer; ``RankFault(rank, crash_at_event=k)``), on any
communicator, in small programs of 2 to 8 ranks.  The survivors recover (revoke, agree,
shrink, retry) and:

- every survivor's awaits finish, with a result or a typed error, in bounded model time;
- nothing is lost or duplicated between survivors (a numbered ring after recovery);
- every agree gives every survivor one answer, and shrink one membership, in one order;
- the survivors' result is the fault-free result on the shrunk group.

``make test`` runs a sample of the points (the first, middle and last event of a few
ranks of each program); ``make test-crash-points`` (``ASYNCCOMM_CRASH_POINTS=all``) runs
every k of every rank, and prints the counts.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm.sim import FaultPlan, RankFault
from asynccomm.sim.loop import new_virtual_loop

from .test_programs import AFTER, final, leaves, step

ALL = os.environ.get("ASYNCCOMM_CRASH_POINTS", "") == "all"
CLUSTER = ac.Cluster.preset("roce100g")
ERRORS = (ac.CommBrokenError, ac.CommRevokedError, ExceptionGroup)
LIMIT = 10.0  # model seconds: a hang jumps to it

#: name: (ranks, steps); steps of ``step`` (ring, allreduce, server, objects) or ``more``.
PROGRAMS: dict[str, tuple[int, tuple[str, ...]]] = {
    "ring": (2, ("ring", "ring")),
    "ring@5": (5, ("ring", "ring", "ring")),
    "pipeline": (4, ("pipeline", "pipeline")),
    "pipeline@8": (8, ("pipeline",)),
    "allreduce": (3, ("allreduce", "allreduce")),
    "allreduce@8": (8, ("allreduce",)),
    "server": (3, ("server", "server")),
    "server@6": (6, ("server",)),
    "parameter server": (4, ("ps", "ps")),
    "parameter server@7": (7, ("ps",)),
    "objects": (3, ("objects", "objects")),
    "split+allreduce": (4, ("split",)),
    "split+allreduce@6": (6, ("split", "ring")),
    "bcast+reduce": (5, ("bcast", "reduce")),
    "gather+scatter": (4, ("gather", "scatter")),
    "alltoall": (4, ("alltoall",)),
    "allgather+barrier": (3, ("allgather", "barrier")),
    "ring+allreduce": (3, ("ring", "allreduce")),
    "server+objects": (3, ("server", "objects")),
    "all four": (3, ("objects", "server", "allreduce", "ring")),
    "ps+split": (5, ("ps", "split")),
    "pipeline+bcast": (6, ("pipeline", "bcast")),
    "mixed@8": (8, ("ring", "ps", "allreduce")),
    "two ranks, everything": (2, ("server", "split", "objects", "alltoall")),
}


async def more(comm: ac.Communicator, what: str, i: int) -> None:
    """The steps beyond ``test_programs.step``, fault-free results asserted."""
    n, me = comm.size, comm.rank
    expect = n * (n + 1) / 2  # the sum of every rank's rank + 1
    if what == "pipeline":  # rank 0 starts, each adds its rank + 1 and passes it on
        buf = np.zeros(1)
        if me > 0:
            await comm.recv(buf, me - 1, tag=300 + i)
        buf += me + 1
        if me < n - 1:
            await comm.send(buf, me + 1, tag=300 + i)
        assert buf[0] == (me + 1) * (me + 2) / 2
    elif what == "ps":  # workers push gradients to rank 0 in any order, get the sum back
        if me == 0:
            total, buf = np.zeros(2), np.zeros(2)
            for _ in range(n - 1):
                await comm.recv(buf, ac.ANY_SOURCE, tag=400 + i)
                total += buf
            await ac.wait_all([comm.isend(total, w, tag=500 + i) for w in range(1, n)])
        else:
            await comm.send(np.array([me + 1.0, i]), 0, tag=400 + i)
            total = np.zeros(2)
            await comm.recv(total, 0, tag=500 + i)
        assert total[0] == expect - 1 and total[1] == i * (n - 1)
    elif what == "split":
        sub = await comm.split(me % 2)
        assert sub is not None
        buf = np.array([me + 1.0])
        await sub.allreduce(buf)
        assert buf[0] == sum(r + 1.0 for r in range(me % 2, n, 2))
    elif what == "bcast":
        buf = np.full(3, float(i) if me == i % n else -1.0)
        await comm.bcast(buf, root=i % n)
        assert buf[0] == i
    elif what == "reduce":
        out = np.zeros(1)
        await comm.reduce(np.array([me + 1.0]), out, root=0)
        assert me != 0 or out[0] == expect
    elif what == "gather":
        out = np.zeros((n, 1)) if me == 0 else None
        await comm.gather(np.array([me + 1.0]), out, root=0)
        assert out is None or list(out[:, 0]) == [r + 1.0 for r in range(n)]
    elif what == "scatter":
        out = np.zeros(1)
        await comm.scatter(np.arange(n, dtype=float).reshape(n, 1) if me == 0 else None,
                           out, root=0)
        assert out[0] == me
    elif what == "alltoall":
        out = np.zeros((n, 1))
        await comm.alltoall(np.full((n, 1), me + 1.0), out)
        assert list(out[:, 0]) == [r + 1.0 for r in range(n)]
    elif what == "allgather":
        out = np.zeros((n, 1))
        await comm.allgather(np.array([me + 1.0]), out)
        assert list(out[:, 0]) == [r + 1.0 for r in range(n)]
    elif what == "barrier":
        await comm.barrier()
    else:
        await step(comm, what, i)


def program(size: int, steps: tuple[str, ...]) -> Any:
    async def main(comm: ac.Communicator) -> Any:
        if comm.rank == 0:
            comm.ack_failed()  # a server hears of a client's failure on ANY_SOURCE
        errors: list[BaseException] = []
        try:
            for i, what in enumerate(steps):
                await more(comm, what, i)
        except ERRORS as exc:
            errors.extend(leaves(exc))
            comm.revoke()
        world = list(range(size))
        answers = []
        while True:  # until one round finishes on every member it has
            new = await comm.shrink()
            world = [world[new.parent_rank(r)] for r in range(new.size)]
            try:
                result: Any = await final(new, world)
                ok = 1
            except ERRORS as exc:
                errors.extend(leaves(exc))
                new.revoke()
                ok = 0
            answers.append((await new.agree(ok), tuple(world)))
            if answers[-1][0] == 1:
                return errors, world, result, answers
            comm = new

    return main


def run(name: str, plan: FaultPlan) -> tuple[list[Any], list[int]]:
    """``run_program`` of the program called ``name``."""
    return run_program(*PROGRAMS[name], plan)


def run_program(size: int, steps: tuple[str, ...],
                plan: FaultPlan) -> tuple[list[Any], list[int]]:
    """Each rank's result ("crashed" for a rank that raised) and engine event counts."""

    async def world_main() -> tuple[list[Any], list[int]]:
        async with ac.open_world(size, CLUSTER, fault_plan=plan) as world:

            async def one(comm: ac.Communicator) -> Any:
                try:
                    async with comm:
                        return await program(size, steps)(comm)
                except ac.AsyncCommError:
                    return "crashed"  # (only the victim may: checked below)

            async with asyncio.timeout(LIMIT):
                out = await asyncio.gather(*(one(c) for c in world.comms))
            return list(out), list(world.comms[0]._family.faults.counts)

    with asyncio.Runner(loop_factory=new_virtual_loop) as runner:
        return runner.run(world_main())


@functools.cache
def counts(name: str) -> list[int]:
    """Each rank's engine events in the program's fault-free run."""
    results, events = run(name, FaultPlan())
    assert "crashed" not in results
    return events


def points() -> list[tuple[str, int, int]]:
    """(program, victim, k): every k of every rank (ALL), or the first, middle and last of
    rank 0, rank 1 and the last rank."""
    out = []
    for name, (size, _) in PROGRAMS.items():
        events = counts(name)
        for victim in range(size) if ALL else sorted({0, 1, size - 1}):
            n = events[victim]
            ks = range(1, n + 1) if ALL else sorted({1, (n + 1) // 2, n})
            out += [(name, victim, k) for k in ks]
    return out


POINTS = points()


def summary() -> str:
    """The counts: programs, their sizes, the points run and every point there is."""
    every = sum(sum(counts(name)) for name in PROGRAMS)
    sizes = sorted({size for size, _ in PROGRAMS.values()})
    return (f"crash points: {len(PROGRAMS)} programs on {sizes[0]}-{sizes[-1]} ranks, "
            f"{len(POINTS)} points run of {every} (every rank x every engine event)")


def test_the_counts(record_property: Any) -> None:
    """Enough programs and points, and their numbers on record (``make
    test-crash-points`` prints them)."""
    sizes = {size for size, _ in PROGRAMS.values()}
    assert len(PROGRAMS) >= 20 and min(sizes) == 2 and max(sizes) == 8
    every = sum(sum(counts(name)) for name in PROGRAMS)
    assert len(POINTS) == every if ALL else len(POINTS) >= 3 * len(PROGRAMS)
    record_property("crash_points", summary())


@pytest.mark.parametrize(("name", "victim", "k"), POINTS)
def test_a_crash_at_any_engine_event_is_survived(name: str, victim: int, k: int) -> None:
    size = PROGRAMS[name][0]
    results, events = run(name, FaultPlan(ranks=(RankFault(victim, crash_at_event=k),)))
    assert events[victim] >= k  # it reached its k-th event (and crashed after it)
    # A crash after the rank's last wait never lands: it had finished.
    alive = [r for r in range(size) if results[r] != "crashed"]
    assert set(range(size)) - set(alive) <= {victim}
    survivors = [results[r] for r in alive]
    assert len({tuple(answers) for *_, answers in survivors}) == 1  # every agree: one answer
    members = {tuple(world) for _, world, _, _ in survivors}
    assert len(members) == 1  # one membership, in one order
    (world,) = members
    assert set(alive) <= set(world)
    for rank, (errors, _, (total, got), _) in zip(alive, survivors, strict=True):
        for exc in errors:  # typed; a broken op names the rank it lost
            assert type(exc) in (ac.CommRevokedError, ac.CommBrokenError), exc
            assert type(exc) is ac.CommRevokedError or exc.peer is not None
        assert total == sum(r + 1.0 for r in world)  # the fault-free result on that group
        left = world[(world.index(rank) - 1) % len(world)]
        assert got == [(left, j) for j in range(AFTER)]  # nothing lost or duplicated


if __name__ == "__main__":
    sys.stdout.write(summary() + "\n")
