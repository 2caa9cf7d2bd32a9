"""Crash points, enumerated on the modelled cluster: a rank crashes right after its k-th
engine event (a send posted, a recv matched to a message at its sender, a payload copied
into a recv buffer), on any communicator, for every k and every rank of small programs.
The survivors recover (revoke, agree, shrink, retry) and agree on one result.

``make test`` runs every rank at a stride of k (``STRIDE``); ``make test-crash-points``
(``ASYNCCOMM_CRASH_POINTS=all``) runs every k.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

import asynccomm as ac
from asynccomm.sim.loop import new_virtual_loop
from asynccomm.transports.local import LocalLink

from .test_programs import AFTER, final, leaves, step

#: Every k with ``ASYNCCOMM_CRASH_POINTS=all``; else every STRIDE-th (and the first).
ALL = os.environ.get("ASYNCCOMM_CRASH_POINTS", "") == "all"
STRIDE = 7
PROGRAMS = {"ring+allreduce": ("ring", "allreduce"), "server+objects": ("server", "objects"),
            "all four": ("objects", "server", "allreduce", "ring")}
SIZE = 3
ERRORS = (ac.CommBrokenError, ac.CommRevokedError, ExceptionGroup)


class Events:
    """Counts each world rank's engine events; crashes the victim at the k-th."""

    def __init__(self, victim: int | None = None, at: int = 0) -> None:
        self.counts = [0] * SIZE
        self.victim, self.at = victim, at
        self.tasks: list[asyncio.Task[Any]] = []
        self.crashed = False

    def event(self, link: LocalLink, rank: int) -> None:
        world = link.endpoints[rank].world_rank  # type: ignore[attr-defined]
        self.counts[world] += 1
        if world == self.victim and self.counts[world] == self.at and not self.crashed:
            self.crashed = True
            self.tasks[world].cancel()  # it dies at its next await


def counting(monkeypatch: pytest.MonkeyPatch, events: Events) -> None:
    send, fetch, received = LocalLink.send, LocalLink.fetch, LocalLink.received

    def on_send(self: LocalLink, msg: Any, dest: int) -> None:
        send(self, msg, dest)
        events.event(self, msg.source)

    def on_fetch(self: LocalLink, msg: Any, rank: int, into: Any, ready: Any) -> None:
        fetch(self, msg, rank, into, ready)
        events.event(self, rank)

    def on_received(self: LocalLink, msg: Any, rank: int) -> object:
        record = received(self, msg, rank)
        events.event(self, rank)
        return record

    monkeypatch.setattr(LocalLink, "send", on_send)
    monkeypatch.setattr(LocalLink, "fetch", on_fetch)
    monkeypatch.setattr(LocalLink, "received", on_received)


def program(steps: tuple[str, ...]) -> Any:
    async def main(comm: ac.Communicator) -> Any:
        if comm.rank == 0:
            comm.ack_failed()
        errors: list[BaseException] = []
        try:
            for i, what in enumerate(steps):
                await step(comm, what, i)
        except ERRORS as exc:
            errors.extend(leaves(exc))
            comm.revoke()
        world = list(range(SIZE))
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
            if await new.agree(ok) == 1:
                return errors, world, result
            comm = new

    return main


def run(steps: tuple[str, ...], events: Events) -> list[Any]:
    async def world_main() -> list[Any]:
        async with ac.open_world(SIZE, ac.Cluster.preset("roce100g")) as world:

            async def one(comm: ac.Communicator) -> Any:
                try:
                    async with comm:
                        return await program(steps)(comm)
                except asyncio.CancelledError:
                    if comm.rank != events.victim:
                        raise
                    return "crashed"

            events.tasks = [asyncio.ensure_future(one(c)) for c in world.comms]
            async with asyncio.timeout(10.0):  # model seconds: a hang jumps to it
                out = await asyncio.gather(*events.tasks, return_exceptions=True)
            # A victim whose k-th event was its last, with no await after it, finishes its
            # coroutine with the cancellation pending: asyncio reports its task cancelled
            # without raising inside it.  It crashed as it finished; a survivor cancelled
            # is a failure.
            for rank, result in enumerate(out):
                if isinstance(result, asyncio.CancelledError) and rank == events.victim:
                    out[rank] = "crashed"
                elif isinstance(result, BaseException):
                    raise result
            return list(out)

    with asyncio.Runner(loop_factory=new_virtual_loop) as runner:
        return runner.run(world_main())


def points() -> list[tuple[str, int, int]]:
    """(program, victim, k) for every k of the victim's fault-free run (or a stride)."""
    out = []
    for name, steps in PROGRAMS.items():
        with pytest.MonkeyPatch.context() as mp:
            events = Events()
            counting(mp, events)
            run(steps, events)
        for victim in range(SIZE):
            ks = range(1, events.counts[victim] + 1)
            out += [(name, victim, k) for k in (ks if ALL else [*ks[:1], *ks[1::STRIDE]])]
    return out


@pytest.mark.parametrize(("name", "victim", "k"), points())
def test_a_crash_at_any_engine_event_is_survived(monkeypatch: pytest.MonkeyPatch, name: str,
                                                 victim: int, k: int) -> None:
    events = Events(victim, k)
    counting(monkeypatch, events)
    results = run(PROGRAMS[name], events)
    assert events.crashed
    # A crash after the rank's last wait never lands (an op that completed is never
    # reported cancelled, and the rank had nothing left to wait for): it finished.
    alive = [r for r in range(SIZE) if results[r] != "crashed"]
    assert len(alive) >= SIZE - 1
    survivors = [results[r] for r in alive]
    members = {tuple(world) for _, world, _ in survivors}
    assert len(members) == 1  # one membership, in one order
    (world,) = members  # (the crashed rank is in it if it crashed after its last part)
    for rank, (errors, _, (total, got)) in zip(alive, survivors, strict=True):
        for exc in errors:  # typed; a broken op names the rank it lost
            assert type(exc) in (ac.CommRevokedError, ac.CommBrokenError), exc
            assert type(exc) is ac.CommRevokedError or exc.peer is not None
        assert total == sum(r + 1.0 for r in world)  # the fault-free result on that group
        left = world[(world.index(rank) - 1) % len(world)]
        assert got == [(left, k) for k in range(AFTER)]  # nothing lost or duplicated
