"""A blocking probe that finds its message here as it is made returns its Status with no
request (``steps.probe_found``), recorded as a probe posted and finished at once is: the
async parameter server probes ``ANY_SOURCE``, ``ANY_TAG`` once a gradient, and making,
posting, finishing and awaiting a request cost it about twice what ``iprobe`` does."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import uvloop

import asynccomm as ac
from asynccomm._engine.engine import DeviceEngine

from ..calls import counted

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}
PROBES = [(ac.ANY_SOURCE, ac.ANY_TAG), (0, 4), (ac.ANY_SOURCE, 3), (0, ac.ANY_TAG)]


async def _probes(world: ac.World, found_path: bool) -> list[Any]:
    """Two messages from rank 0 to rank 1, probed as ``PROBES`` say (with the found path
    or, ``found_path`` False, with every probe made a request and posted), then taken;
    a probe that waits for its message; and probes refused for their arguments.  What
    each gave, rank 1's probe entries in its flight record (their times as equal or not),
    its count of other ops, and its statistics."""
    c0, c1 = world.comms
    ticks = itertools.count(1)
    for comm in world.comms:  # (one clock that steps at each reading)
        comm._engine.now = lambda: float(next(ticks))  # type: ignore[method-assign]
    engine = c1._engine
    for tag in (3, 4):
        await c0.send(np.full(2, float(tag)), 1, tag)
    got: list[Any] = []
    for src, tag in PROBES:
        engine.fast = found_path
        try:
            got.append(tuple(await c1.probe(src, tag)))
        finally:
            engine.fast = True
    for tag in (3, 4):
        out = np.empty(2)
        await c1.recv(out, 0, tag)
        got.append(out[0])
    waiting = asyncio.ensure_future(c1.probe(0, 5))  # none here: it waits, posted
    await asyncio.sleep(0)
    await c0.send(np.ones(1), 1, 5)
    got.append(tuple(await asyncio.wait_for(waiting, 10)))
    await c1.recv(np.empty(1), 0, 5)
    for bad in ({"src": 7}, {"tag": -5}, {"src": 0, "tag": 4, "timeout": -1.0},
                {"src": 0, "tag": 4, "timeout": "soon"}):
        try:
            await c1.probe(**bad)
        except (ValueError, TypeError) as exc:
            got.append(type(exc).__name__)
    entries = [(e["op"], e["peer"], e["tag"], e["nbytes"], e["state"],
                e["post"] == e["finish"], e["match"] == e["finish"])
               for e in c1.flight_record() if e["op"] == "probe"]
    return [got, entries, engine.flight.others, c1.statistics()]


def _run(loop: str, found_path: bool) -> list[Any]:
    async def run() -> list[Any]:
        async with ac.open_world(2) as world:
            return await asyncio.wait_for(_probes(world, found_path), 20)

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(run())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_probe_that_finds_its_message_makes_no_request_and_is_recorded_alike(
        loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    full = _run(loop, False)
    posted = counted(monkeypatch, DeviceEngine, "post_probe", lambda req: req.tag)
    found = _run(loop, True)
    assert posted == [5]  # only the probe that had to wait was posted
    assert found == full
    got, entries, others, _ = found
    assert got[:4] == [(0, 3, 16, 2, (2,)), (0, 4, 16, 2, (2,)), (0, 3, 16, 2, (2,)),
                       (0, 3, 16, 2, (2,))]
    assert got[4:7] == [3.0, 4.0, (0, 5, 8, 1, (1,))]
    assert got[7:] == ["ValueError", "ValueError", "ValueError", "TypeError"]
    assert entries[:4] == [("probe", p, t, -1, "done", False, False) for p, t in PROBES]
    assert others == 5
