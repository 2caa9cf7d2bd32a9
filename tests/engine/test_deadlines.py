"""Op timeouts behind one shared loop timer (``asynccomm._deadlines``): each op times out at
its deadline and in deadline order, an op that finished first never does, and a timer left
armed with no live deadline neither moves virtual time nor hides a deadlock."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm._deadlines import SLACK, Deadlines, deadlines_of, end, owner_of

LOOPS = ["asyncio", "uvloop"]


# -- on the virtual clock --------------------------------------------------------------------

def test_ops_time_out_in_deadline_order_each_at_its_deadline() -> None:
    timeouts = [7.0, 2.0, 9.0, 1.0, 5.0, 3.0, 8.0, 4.0, 6.0, 2.5]

    async def main(comm: ac.Communicator) -> list[tuple[float, float]]:
        if comm.rank == 1:
            await comm.recv(np.zeros(1), 0, tag=99)  # stays open until rank 0 is done
            return []
        loop = asyncio.get_running_loop()
        seen: list[tuple[float, float]] = []

        async def one(tag: int, timeout: float) -> None:
            with pytest.raises(ac.CommTimeoutError):
                await comm.recv(np.zeros(1), 1, tag=tag, timeout=timeout)
            seen.append((timeout, loop.time()))

        await asyncio.gather(*(one(tag, t) for tag, t in enumerate(timeouts)))
        await comm.send(np.zeros(1), 1, tag=99)
        return seen

    seen = ac.run(main, 2, clock="virtual")[0]
    assert seen == [(t, t) for t in sorted(timeouts)]


def test_ops_that_finish_before_their_deadline_never_time_out() -> None:
    # Rank 0 posts 12 recvs with a 1 s timeout at t=0; rank 1 sends one every 0.1 s (the
    # first at 0.05 s): the 10 sent before 1 s complete, the other 2 time out at 1 s.
    async def main(comm: ac.Communicator) -> Any:
        loop = asyncio.get_running_loop()
        if comm.rank == 1:
            await comm.compute(seconds=0.05)
            for tag in range(12):
                await comm.send(np.full(1, tag, float), 0, tag=tag)
                await comm.compute(seconds=0.1)
            await comm.send(np.zeros(1), 0, tag=99)
            return None
        bufs = [np.zeros(1) for _ in range(12)]
        reqs = [comm.irecv(bufs[tag], 1, tag=tag, timeout=1.0) for tag in range(12)]
        got: list[tuple[str, float]] = []
        for tag, req in enumerate(reqs):
            try:
                await req
                got.append(("ok", float(bufs[tag][0])))
            except ac.CommTimeoutError:
                got.append(("timed out", loop.time()))
        await comm.recv(np.zeros(1), 1, tag=99)
        return got

    got = ac.run(main, 2, clock="virtual")[0]
    assert got == [("ok", float(tag)) for tag in range(10)] + [("timed out", 1.0)] * 2


def test_a_stale_shared_timer_does_not_move_virtual_time_or_delay_a_deadlock() -> None:
    # A recv with a 100 s timeout completes at once: the shared timer stays armed at 100 s
    # with no live deadline.  The deadlock that follows is found at 0 s, not at 100 s.
    async def main(comm: ac.Communicator) -> float:
        loop = asyncio.get_running_loop()
        peer = 1 - comm.rank
        if comm.rank == 0:
            await comm.recv(np.zeros(1), peer, tag=1, timeout=100.0)
        else:
            await comm.send(np.zeros(1), peer, tag=1)
        await comm.compute(seconds=0.5)
        try:
            await comm.recv(np.zeros(1), peer, tag=2)  # both: nobody sends
        except ac.DeadlockError:
            return loop.time()
        return -1.0

    assert ac.run(main, 2, clock="virtual") == [0.5, 0.5]


def test_a_live_deadline_behind_a_dead_one_times_out_at_its_own() -> None:
    # The shared timer is armed at 1 s for a recv that completes at 0.1 s; the recv with a
    # 5 s timeout behind it times out at 5 s.
    async def main(comm: ac.Communicator) -> tuple[float | None, float]:
        loop = asyncio.get_running_loop()
        if comm.rank == 1:
            await comm.compute(seconds=0.1)  # after rank 0 posted its recvs
            await comm.send(np.zeros(1), 0, tag=1)
            await comm.recv(np.zeros(1), 0, tag=99)  # stays open until rank 0 is done
            return None, 0.0
        first = comm.irecv(np.zeros(1), 1, tag=1, timeout=1.0)
        second = comm.irecv(np.zeros(1), 1, tag=2, timeout=5.0)
        await first
        stale = deadlines_of(loop).armed
        with pytest.raises(ac.CommTimeoutError):
            await second
        at = loop.time()
        await comm.send(np.zeros(1), 1, tag=99)
        return stale, at

    assert ac.run(main, 2, clock="virtual")[0] == (1.0, 5.0)


# -- on the wall clock ------------------------------------------------------------------------

@pytest.mark.parametrize("loop", LOOPS)
def test_a_stale_shared_timer_does_not_delay_a_deadlock_report(loop: str) -> None:
    async def main(comm: ac.Communicator) -> None:
        peer = 1 - comm.rank
        if comm.rank == 0:
            await comm.recv(np.zeros(1), peer, tag=1, timeout=60.0)
        else:
            await comm.send(np.zeros(1), peer, tag=1)
        await comm.recv(np.zeros(1), peer, tag=2)  # both: a deadlock

    t0 = time.perf_counter()
    with pytest.raises(ac.DeadlockError):
        ac.run(main, 2, loop=loop)
    assert time.perf_counter() - t0 < 10.0  # the proof's two checks, not the 60 s timer


@pytest.mark.parametrize("loop", LOOPS)
def test_a_live_shared_timer_is_not_a_deadlock(loop: str) -> None:
    # Rank 0's first recv ends; its second waits with a timeout behind the same (re-armed)
    # timer: it times out, never a DeadlockError.
    async def main(comm: ac.Communicator) -> str:
        peer = 1 - comm.rank
        if comm.rank == 1:
            await comm.send(np.zeros(1), peer, tag=1)
            await comm.recv(np.zeros(1), peer, tag=3)
            return "done"
        await comm.recv(np.zeros(1), peer, tag=1, timeout=0.2)
        try:
            await comm.recv(np.zeros(1), peer, tag=2, timeout=0.4)
        except ac.CommTimeoutError:
            await comm.send(np.zeros(1), peer, tag=3)
            return "timed out"
        return "received"

    assert ac.run(main, 2, loop=loop) == ["timed out", "done"]


async def test_ping_pong_with_timeouts_never_times_out_and_keeps_few_entries() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        buf0, buf1 = np.zeros(1), np.zeros(1)

        async def pong() -> None:
            for _ in range(500):
                await c1.recv(buf1, 0, timeout=30.0)
                await c1.send(buf1, 0, timeout=30.0)

        task = asyncio.create_task(pong())
        for i in range(500):
            buf0[0] = i
            await c0.send(buf0, 1, timeout=30.0)
            await c0.recv(buf0, 1, timeout=30.0)
        await task
        deadlines = c0._engine.deadlines
        assert deadlines is c1._engine.deadlines  # one per loop
        assert deadlines.live() == 0
        assert len(deadlines._heap) <= 2 * SLACK + 2  # dead entries are compacted away


# -- the heap itself -------------------------------------------------------------------------

class _Owner:
    def __init__(self) -> None:
        self.due: list[Any] = []

    def _on_timeout(self, req: Any) -> None:
        req._timer = None
        self.due.append(req)


class _Req:
    def __init__(self, owner: _Owner) -> None:
        self._owner = owner
        self._timer: Any = None


async def test_the_heap_keeps_at_most_twice_its_live_entries() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    owner = _Owner()
    keep = []
    for i in range(5000):
        req = _Req(owner)
        deadlines.arm(req, 3600.0)
        if i % 100 == 0:
            keep.append(req)  # live
        else:
            end(req)
        assert len(deadlines._heap) <= 2 * (len(keep) + 1) + SLACK + 1
    assert deadlines.live() == len(keep) == 50
    handle = deadlines._handle
    assert handle is not None
    if hasattr(loop, "_scheduled"):  # (uvloop's handles show no callback)
        assert owner_of(handle) is deadlines
    for req in keep:
        end(req)
    assert not deadlines.settle() and deadlines.armed is None and handle.cancelled()
    assert owner.due == []


async def test_an_entry_ended_drops_its_request() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    req = _Req(_Owner())
    deadlines.arm(req, 3600.0)
    entry = req._timer
    assert entry[2] is req
    end(req)
    assert req._timer is None and entry[2] is None  # the heap keeps no request alive
    deadlines.settle()


async def test_due_entries_are_handed_over_in_deadline_then_arming_order() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    owner = _Owner()
    reqs = [_Req(owner) for _ in range(6)]
    for req, delay in zip(reqs, [0.03, 0.01, 0.02, 0.01, 0.0, 0.02], strict=True):
        deadlines.arm(req, delay)
    end(reqs[2])
    done = loop.create_future()
    loop.call_later(0.1, done.set_result, None)
    await done
    assert owner.due == [reqs[4], reqs[1], reqs[3], reqs[5], reqs[0]]
    assert deadlines.armed is None and deadlines._heap == []


def test_a_deadline_fires_among_the_loops_timers_where_the_ops_own_timer_would() -> None:
    # Deadlines at 0.5 s (A) and 1 s (B), then a timer of the program's at 1 s (X), all
    # armed at t=0; A's op completes at 0.1 s, so the shared timer moves from A to B: B
    # still expires before X, in the order they were armed.
    async def main(comm: ac.Communicator) -> list[bool]:
        loop = asyncio.get_running_loop()
        if comm.rank == 1:
            await comm.compute(seconds=0.1)
            await comm.send(np.zeros(1), 0, tag=1)
            await comm.recv(np.zeros(1), 0, tag=99)  # stays open until rank 0 is done
            return []
        a = comm.irecv(np.zeros(1), 1, tag=1, timeout=0.5)
        b = comm.irecv(np.zeros(1), 1, tag=2, timeout=1.0)
        seen: list[bool] = []
        loop.call_later(1.0, lambda: seen.append(b.done()))
        await a
        with pytest.raises(ac.CommTimeoutError):
            await b
        await comm.send(np.zeros(1), 1, tag=99)
        return seen

    assert ac.run(main, 2, clock="virtual")[0] == [True]


async def test_ops_armed_in_any_order_keep_the_shared_heap_a_heap() -> None:
    # Recvs posted on the fast lane with timeouts in no order, some equal (the lane pushes
    # an entry itself where it is no less than its parent, else hands it to heappush): the
    # heap stays a heap of every op's entry, the timer is armed at the earliest deadline,
    # and withdrawing the ops ends every entry.
    timeouts = [700.0, 200.0, 900.0, 100.0, 500.0, 300.0, 800.0, 400.0, 600.0, 250.0,
                300.0, 300.0, 100.0, 1000.0, 50.0, 50.0]
    async with ac.open_world(2) as world:
        c0, _ = world.comms
        reqs = [c0.irecv(np.zeros(1), 1, tag=tag, timeout=t) for tag, t in enumerate(timeouts)]
        deadlines = deadlines_of(asyncio.get_running_loop())
        heap = deadlines._heap
        assert all(heap[i] <= heap[c] for i in range(len(heap))
                   for c in (2 * i + 1, 2 * i + 2) if c < len(heap))
        entries = [req._timer for req in reqs]
        assert all(any(e is entry for e in heap) for entry in entries)
        assert [entry[2] for entry in entries] == reqs
        assert deadlines.armed == min(entry[0] for entry in entries)
        for req in reqs:
            req.cancel()
        assert all(req._timer is None and entry[2] is None
                   for req, entry in zip(reqs, entries, strict=True))
        assert not deadlines.settle() and deadlines.armed is None
