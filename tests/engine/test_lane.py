"""The C lane (``asynccomm/_lane.c``) does exactly what the Python steps do.

Random programs of sends and recvs (awaited and not, exact and wildcard, some that misfit,
some on another stream, some left pending, some cancelled; sendrecv and batch exchanges;
small messages and timed copies of 64 KiB and more) run twice on the same loop: in a world
on the C lane (``open_world(native=True)``) and in one on the Python steps
(``native=False``).  Everything a program can observe must be the same: each op's outcome,
the bytes received, each rank's flight record (its times by how they were read, on a clock
that steps at each reading; the C lane's ``Ring`` against a deque), summary tallies (its
``Tally`` against the Python one), staging-pool and matcher statistics, and in a traced
world each traced op with its message's flow id.  These tests are marked ``native``: where
the lane is not built (or ``ASYNCCOMM_PURE_PYTHON=1``, whose pass of ``make test``
deselects them) there is nothing to compare them with.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asynccomm as ac
from asynccomm._buffers import PendingBuffers, dtype_name
from asynccomm._comm import communicator as _communicator
from asynccomm._comm import native as _native
from asynccomm._engine import lane as _fastlane
from asynccomm._engine.engine import DeviceEngine
from asynccomm._engine.fast import THREAD_COPY_MIN, TIMED_COPY_MIN
from asynccomm._engine.flight import Tally
from asynccomm._engine.stream import StreamStatistics
from asynccomm.transports.local import LocalLink

BUILT = importlib.util.find_spec("asynccomm._native._lane") is not None
PURE = os.environ.get("ASYNCCOMM_PURE_PYTHON", "") not in ("", "0")
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}
#: Where each loop runs the programs: on its own, and (uvloop) tracing every op.
ENVS = [("uvloop", False), ("asyncio", False), ("uvloop", True)]
SIZE = 3
DTYPES = (np.float64, np.int32)


#: A test of the C lane, or one that compares it with the Python steps, is also marked
#: ``native``: ``make test``'s pure-Python pass deselects them (``-m "not native"``).
needs_lane = pytest.mark.skipif(not BUILT or PURE, reason="the C lane is not in use here")


@pytest.fixture(params=[pytest.param(True, marks=pytest.mark.native), False],
                ids=["native", "python"])
def native(request: pytest.FixtureRequest) -> bool:
    """Each world of a test: on the C lane (marked ``native``), and on the Python steps."""
    if request.param and (not BUILT or PURE):
        pytest.skip("the C lane is not in use here")
    return bool(request.param)


def test_the_lane_is_used_where_it_was_built() -> None:
    assert (_communicator._lane_send is not None) is (BUILT and not PURE)
    assert (_communicator._lane_recv is not None) is (BUILT and not PURE)


def test_a_world_carries_the_lane_it_chose(native: bool) -> None:
    """Its communicators (sub-communicators and private contexts too) hold the C lane's
    entries or None, its engines the lane's primitives, flight ring and tallies."""
    async def lanes(world: ac.World) -> list[tuple[Any, ...]]:
        c0, c1 = world.comms
        await asyncio.gather(c0.barrier(), c1.barrier())  # (opens the private contexts)
        subs = await asyncio.gather(c0.dup(), c1.dup())
        out = []
        for comm in (c0, c1, c0._private(), subs[1]):
            engine = comm._engine
            out.append((comm._lane_send, comm._lane_recv, engine.lane.name, engine.copy,
                         type(engine.flight.ring), type(engine.flight.sends[0]),
                         engine.lane.pending))
        return out

    async def run() -> list[tuple[Any, ...]]:
        async with ac.open_world(2, native=native) as world:
            return await asyncio.wait_for(lanes(world), 10)

    got = set(asyncio.run(run()))
    if native:
        assert got == {(_communicator._lane_send, _communicator._lane_recv, "C",
                        _fastlane.copy, _fastlane.LANE.Ring, _fastlane.LANE.Tally,
                        _fastlane.LANE.PendingBuffers)}
    else:
        assert got == {(None, None, "python", None, deque, Tally, PendingBuffers)}


@pytest.mark.parametrize("loop", list(LOOPS))
def test_recvs_pending_in_rows_of_one_array_use_the_lanes_index(native: bool,
                                                                loop: str) -> None:
    """Recvs pre-posted into the rows of one array: the lane's index of pending buffers
    refuses a recv into a pending row, and the burst lands row by row."""
    async def main(world: ac.World) -> type:
        c0, c1 = world.comms
        block = np.zeros((64, 4))
        reqs = [c1.irecv(block[i], 0, 6) for i in range(64)]
        with pytest.raises(ValueError, match=r"^rank 1: the recv buffer overlaps the "
                           r"buffer of recv\(src=0, tag=6\), which is still pending"):
            c1.irecv(block[10:12].reshape(-1), 0, 7)
        kind = type(c1._engine._recv_buffers)
        for i in range(64):
            await c0.send(np.full(4, float(i)), 1, 6)
        await ac.wait_all(reqs)
        assert block[:, 0].tolist() == [float(i) for i in range(64)]
        assert c1._engine._recv_buffers is None  # none pending: the index is let go
        assert c1.irecv(block[10:12].reshape(-1), 0, 7).cancel()
        return kind

    async def run() -> type:
        async with ac.open_world(2, native=native) as world:
            return await asyncio.wait_for(main(world), 10)

    runner = asyncio.Runner(loop_factory=LOOPS[loop])
    with runner:
        kind = runner.run(run())
    assert kind is (_fastlane.LANE.PendingBuffers if native else PendingBuffers)


@pytest.mark.parametrize("loop", list(LOOPS))
def test_rows_that_landed_leave_the_index_and_the_others_stay(native: bool,
                                                              loop: str) -> None:
    """Half a burst into pre-posted rows landed: the index holds the pending rows only (a
    recv into a row that landed is taken; one into a pending row refused, naming it), and
    those that land later leave it too."""
    async def main(world: ac.World) -> None:
        c0, c1 = world.comms
        engine = c1._engine
        block = np.zeros((16, 4))
        reqs = [c1.irecv(block[i], 0, 6) for i in range(16)]
        await ac.wait_all([c0.isend(np.full(4, float(i)), 1, 6) for i in range(8)])
        assert [r.done() for r in reqs] == [True] * 8 + [False] * 8
        assert len(engine._recv_buffers) == engine._pending_recvs == 8
        again = c1.irecv(block[3], 0, 7)  # landed: its row is free
        assert len(engine._recv_buffers) == 9
        with pytest.raises(ValueError, match=r"^rank 1: the recv buffer overlaps the "
                           r"buffer of recv\(src=0, tag=6\), which is still pending"):
            c1.irecv(block[7:9].reshape(-1), 0, 8)
        assert again.cancel()
        assert len(engine._recv_buffers) == engine._pending_recvs == 8
        await ac.wait_all([c0.isend(np.full(4, float(i)), 1, 6) for i in range(8, 16)])
        assert [await r for r in reqs] == [ac.Status(0, 6, 32, 4)] * 16
        assert block[:, 0].tolist() == [float(i) for i in range(16)]
        assert engine._recv_buffers is None and engine._pending_recvs == 0

    async def run() -> None:
        async with ac.open_world(2, native=native) as world:
            await asyncio.wait_for(main(world), 10)

    runner = asyncio.Runner(loop_factory=LOOPS[loop])
    with runner:
        runner.run(run())


def test_a_world_asks_for_the_lane_where_it_is_not_built(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``native=True`` without the C lane is refused before the world opens; the others
    open on the Python steps."""
    monkeypatch.setattr(_communicator, "_lane_send", None)
    monkeypatch.setattr(_communicator, "_lane_recv", None)

    async def main(comm: ac.Communicator) -> str | None:
        return comm._engine.lane.name if comm._lane_send is None else "C"

    async def one(native: object) -> str | None:
        async with ac.open_world(2, native=native) as world:  # type: ignore[arg-type]
            return await main(world.comms[0])

    with pytest.raises(ValueError, match="native=True asks for asynccomm's C lane"):
        asyncio.run(one(True))
    with pytest.raises(ValueError, match="native=True"):
        ac.run(main, 2, native=True)  # said before any rank runs
    with pytest.raises(TypeError, match="native must be True, False or None"):
        asyncio.run(one(1))
    assert asyncio.run(one(None)) == asyncio.run(one(False)) == "python"
    assert ac.run(main, 2, native=None) == ["python", "python"]


@pytest.mark.native
@needs_lane
def test_small_awaited_messages_never_reach_the_python_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> Any:
        raise AssertionError("the Python steps ran")

    async def main(world: ac.World) -> list[float]:
        c0, c1 = world.comms
        await c0.send(np.ones(2), 1, 6)  # a dtype's name is learnt the first time it is sent
        await c1.recv(np.empty(2), 0, 6)
        monkeypatch.setattr(ac.Communicator, "_send_op", refuse)
        monkeypatch.setattr(ac.Communicator, "_recv_op", refuse)
        got = []
        for i in range(3):  # staged, then taken; posted, then filled
            await c0.send(np.full(2, float(i)), 1, 7)
            out = np.empty(2)
            await c1.recv(out, 0, 7)
            got.append(out[0])
        task = asyncio.ensure_future(c1.recv(out, 0, 8))
        await asyncio.sleep(0)
        await c0.send(np.full(2, 9.0), 1, 8)
        await task
        got.append(out[0])
        req = c1.irecv(out, 0, 9)
        await c0.isend(np.full(2, 5.0), 1, 9)
        await req
        got.append(out[0])
        return got

    async def run() -> list[float]:
        async with ac.open_world(2) as world:
            return await asyncio.wait_for(main(world), 10)

    assert asyncio.run(run()) == [0.0, 1.0, 2.0, 9.0, 5.0]


@pytest.mark.native
@needs_lane
def test_ops_on_an_idle_stream_or_with_a_timeout_never_reach_the_python_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane takes an op on an idle stream of the user's and one with a timeout: done
    as posted, or posted and tracked on its stream, its timer armed (a recv that times
    out is withdrawn by it)."""
    def refuse(*args: Any) -> Any:
        raise AssertionError("the Python steps ran")

    async def main(world: ac.World) -> list[Any]:
        c0, c1 = world.comms
        s0, s1 = c0.stream(), c1.stream()
        await c0.send(np.ones(2), 1, 6)  # a dtype's name is learnt the first time it is sent
        await c1.recv(np.empty(2), 0, 6)
        monkeypatch.setattr(ac.Communicator, "_send_op", refuse)
        monkeypatch.setattr(ac.Communicator, "_recv_op", refuse)
        got: list[Any] = []
        out = np.empty(2)
        for stream, timeout in ((s0, None), (None, 5.0), (s0, 5), (s0, 0.0)):
            sent = c0.isend(np.full(2, 3.0), 1, 7, stream=stream, timeout=timeout)
            assert sent.done() and sent.stream is (stream or c0._engine.default_stream)
            assert sent.timeout == (None if timeout is None else float(timeout))
            await c0.send(np.full(2, 4.0), 1, 7, stream=stream, timeout=timeout)
            recv_stream = None if stream is None else s1
            got.append((await c1.recv(out, 0, 7, stream=recv_stream, timeout=timeout),
                        out[0]))
            req = c1.irecv(out, 0, 7, stream=recv_stream, timeout=timeout)
            assert req.done()
            got.append((await req, out[0]))
            req = c1.irecv(out, 0, 8, stream=recv_stream, timeout=timeout)  # posted
            assert not req.done() and req._tracked and (req._timer is None) is (
                timeout is None)
            stats = (recv_stream or c1._engine.default_stream).statistics()
            got.append((stats.active, c1._engine._n_pending, c1._engine._pending_recvs))
            if timeout == 0:
                with pytest.raises(ac.CommTimeoutError):
                    await req
            else:
                await c0.send(np.full(2, 5.0), 1, 8, stream=stream, timeout=timeout)
                got.append((await req, out[0]))
            assert not req._tracked and req._timer is None
        return got

    async def run() -> list[Any]:
        async with ac.open_world(2) as world:
            return await asyncio.wait_for(main(world), 10)

    status = ac.Status(0, 7, 16, 2)
    filled = ac.Status(0, 8, 16, 2)
    assert asyncio.run(run()) == [(status, 3.0), (status, 4.0), (1, 1, 1), (filled, 5.0)] * 3 + [
        (status, 3.0), (status, 4.0), (1, 1, 1)]


@pytest.mark.native
@needs_lane
def test_a_stream_or_timeout_the_lane_does_not_take_leaves_it_to_the_python_steps() -> None:
    """A busy or held stream, another communicator's stream, a traced world's stream and
    a timeout ``check_timeout`` refuses (or one of a subclass) are not handled, having
    changed nothing: the lane answers False or None."""
    from asynccomm._engine.lane import LANE

    async def main(world: ac.World, other: ac.World) -> None:
        c0, c1 = world.comms
        await c0.send(np.ones(2), 1, 6)
        await c1.recv(np.empty(2), 0, 6)
        busy = c1.stream()
        pending = c1.irecv(np.empty(2), 0, 1, stream=busy)
        held = c1.stream()
        held.wait(busy.record())
        foreign = other.comms[1].stream()
        for stream in (busy, held, foreign, "stream"):
            assert LANE.send(c1, np.ones(2), 0, 2, True, stream, None) is False
            assert LANE.recv(c1, np.empty(2), 0, 2, True, stream, None) is None
        for timeout in (-1, -0.5, float("nan"), float("inf"), True, "1", 10 ** 400,
                        np.float64(1.0)):
            assert LANE.send(c1, np.ones(2), 0, 2, True, None, timeout) is False
            assert LANE.recv(c1, np.empty(2), 0, 2, True, None, timeout) is None
        assert c1.statistics().pending_ops == 1 and c0.iprobe(1, 2) is None
        assert busy.statistics().submitted == 1 and held.statistics().submitted == 0
        with pytest.raises(TypeError, match="timeout must be a number"):
            c1.irecv(np.empty(2), 0, 2, timeout=True)
        with pytest.raises(ValueError, match="timeout must be a finite number"):
            c1.isend(np.ones(2), 0, 2, stream=c1.stream(), timeout=float("nan"))
        with pytest.raises(TypeError, match=r"send\(comm, buf, dst, tag, handle, stream, "
                           r"timeout\)"):
            LANE.send(c1, np.ones(2), 0, 2, True)
        assert pending.cancel()

    async def traced(world: ac.World) -> None:
        c0, c1 = world.comms
        assert LANE.send(c0, np.ones(2), 1, 2, True, c0.stream(), None) is False
        assert LANE.recv(c1, np.empty(2), 0, 2, True, c1.stream(), None) is None

    async def run() -> None:
        async with ac.open_world(2) as world, ac.open_world(2) as other:
            await asyncio.wait_for(main(world, other), 10)
        with tempfile.TemporaryDirectory() as tmp:
            async with ac.open_world(2, trace=str(Path(tmp) / "t.json")) as world:
                await asyncio.wait_for(traced(world), 10)

    asyncio.run(run())


@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_recv_on_a_stream_from_a_gone_peer_fails_untracked(native: bool, loop: str) -> None:
    """A recv on an idle stream from a rank that closed fails as it is posted: its stream
    never counts it (the engine's ``start`` fails it before ``Stream._submit`` tracks
    it), and no timer is left; a recv from a live rank is counted after it."""
    async def main(world: ac.World) -> list[Any]:
        c0, _, c2 = world.comms
        await c2.aclose()
        s = c0.stream()
        req = c0.irecv(np.empty(2), 2, 1, stream=s, timeout=1000.0)
        got: list[Any] = [req.done(), req._timer, s.statistics(), c0.statistics().pending_ops]
        with pytest.raises(ac.CommBrokenError):
            await req
        live = c0.irecv(np.empty(2), 1, 1, stream=s, timeout=1000.0)
        got += [s.statistics(), live.sseq, c0.statistics().pending_ops]
        assert live.cancel()
        return got

    async def run() -> list[Any]:
        async with ac.open_world(3, native=native) as world:
            return await asyncio.wait_for(main(world), 10)

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        got = runner.run(run())
    assert got == [True, None, StreamStatistics(0, 0, 0), 0, StreamStatistics(0, 1, 1), 1, 1]


@pytest.mark.native
@needs_lane
def test_a_message_the_lane_stages_is_left_to_reference_counting() -> None:
    """A staged message can be part of no cycle; the collector does not walk it."""
    import gc

    async def stage(world: ac.World) -> tuple[bool, int, float]:
        c0, c1 = world.comms
        await c0.send(np.ones(1), 1, 2)  # a dtype's name is learnt the first time
        await c1.recv(np.empty(1), 0, 2)
        await c0.send(np.full(1, 3.0), 1, 2)
        (msg,) = c1._engine.matcher.unexpected()
        tracked = gc.is_tracked(msg)
        out = np.empty(1)
        await c1.recv(out, 0, 2)
        return tracked, sys.getrefcount(msg), float(out[0])

    async def run() -> tuple[bool, int, float]:
        async with ac.open_world(2) as world:
            return await asyncio.wait_for(stage(world), 10)

    tracked, refs, value = asyncio.run(run())
    assert not tracked and value == 3.0
    assert refs == 2  # the test's own name and getrefcount's argument: nothing else


@pytest.mark.native
@needs_lane
def test_staging_beside_a_recv_posted_for_another_tag_holds_no_reference() -> None:
    """A message the lane stages while a recv is posted for another (source, tag) leaves
    the matcher's index of posted recvs as it found it: no reference is kept to it."""
    async def stage(world: ac.World) -> tuple[int, int]:
        c0, c1 = world.comms
        await c0.send(np.ones(1), 1, 2)  # a dtype's name is learnt the first time
        await c1.recv(np.empty(1), 0, 2)
        req = c1.irecv(np.empty(1), 0, 5)
        posted = c1._engine.matcher._posted
        before = sys.getrefcount(posted)
        for _ in range(3):
            await c0.send(np.full(1, 3.0), 1, 6)  # staged: no recv for tag 6
        after = sys.getrefcount(posted)
        for _ in range(3):
            await c1.recv(np.empty(1), 0, 6)
        req.cancel()
        return before, after

    async def run() -> tuple[int, int]:
        async with ac.open_world(2) as world:
            return await asyncio.wait_for(stage(world), 10)

    before, after = asyncio.run(run())
    assert after == before


#: Timed copies (``_engine.fast``): at the eager limit (staged when no recv waits), past
#: it (waits at its sender), and the largest inline one (under ``THREAD_COPY_MIN``).
TIMED = [TIMED_COPY_MIN, TIMED_COPY_MIN + 8, 1 << 20, THREAD_COPY_MIN - 8]


@pytest.mark.native
@needs_lane
@pytest.mark.parametrize("nbytes", TIMED, ids=["64K", "64K+8", "1M", "4M-8"])
def test_timed_copies_never_reach_the_python_steps(monkeypatch: pytest.MonkeyPatch,
                                                   nbytes: int) -> None:
    """A message of 64 KiB or more copied inline goes the C lane whole: into a recv
    posted for it (awaited, or ``irecv``/``isend``), and at the eager limit staged and
    then taken; past it, its recv takes it from the send waiting at its sender.  One of
    ``THREAD_COPY_MIN`` is left to the Python steps."""
    def refuse(*args: Any) -> Any:
        raise AssertionError("the Python steps ran")

    async def main(world: ac.World) -> list[float]:
        c0, c1 = world.comms
        n = nbytes // 8
        await c0.send(np.ones(2), 1, 6)  # a dtype's name is learnt the first time it is sent
        await c1.recv(np.empty(2), 0, 6)
        monkeypatch.setattr(ac.Communicator, "_send_op", refuse)
        monkeypatch.setattr(ac.Communicator, "_recv_op", refuse)
        got = []
        out = np.empty(n)
        task = asyncio.ensure_future(c1.recv(out, 0, 8))
        await asyncio.sleep(0)
        await c0.send(np.full(n, 9.0), 1, 8)
        assert (await task).nbytes == nbytes
        got.append(out[-1])
        req = c1.irecv(out, 0, 9)
        await c0.isend(np.full(n, 5.0), 1, 9)
        await req
        got.append(out[-1])
        if nbytes <= ac.EAGER_LIMIT:  # staged, then taken (awaited, and irecv)
            for i in range(2):
                await c0.send(np.full(n, float(i)), 1, 7)
                await (c1.recv(out, 0, 7) if i == 0 else c1.irecv(out, 0, 7))
                got.append(out[-1])
        else:  # the send waits at its sender (posted here), the recv takes it here
            monkeypatch.setattr(LocalLink, "received", refuse)
            monkeypatch.setattr(DeviceEngine, "start", refuse)
            for i in range(2):
                send = c0.isend(np.full(n, float(i)), 1, 7)
                assert not send.done()
                await (c1.recv(out, 0, 7) if i == 0 else c1.irecv(out, 0, 7))
                assert send.done()
                got.append(out[-1])
        monkeypatch.undo()
        big, into = np.ones(THREAD_COPY_MIN // 8), np.empty(THREAD_COPY_MIN // 8)
        req = c1.irecv(into, 0, 3)  # a recv posted for it: copied on the worker thread
        assert _fastlane.LANE.send(c0, big, 1, 3, False, None, None) is False
        await c0.send(big, 1, 3)
        await req
        # none posted: the send is posted here (it waits at its sender), the recv copies it
        # on the worker thread
        send = _fastlane.LANE.send(c0, big, 1, 3, False, None, None)
        assert type(send) is ac.Request and not send.done()
        assert (await c1.recv(into, 0, 3)).nbytes == THREAD_COPY_MIN
        await send
        return got

    async def run() -> list[float]:
        async with ac.open_world(2) as world:
            return await asyncio.wait_for(main(world), 10)

    assert asyncio.run(run()) == [9.0, 5.0, 0.0, 1.0]


async def _timed_pair(world: ac.World, nbytes: int, posted: bool, handle: bool) -> Any:
    """One message of ``nbytes`` from rank 0 to rank 1, its recv ``posted`` first or its
    send, awaited or (``handle``) as requests; on a clock that steps at each reading (a
    record's times equal where one reading made them): the records' times by how they
    were read, the tallies' waits and copies by whether they took time, the requests'."""
    c0, c1 = world.comms
    _count_clock(world)
    n = nbytes // 8
    src, out = np.arange(float(n)), np.zeros(n)
    if posted:
        recv = c1.irecv(out, 0, 1) if handle else asyncio.ensure_future(c1.recv(out, 0, 1))
        await asyncio.sleep(0)
        send = c0.isend(src, 1, 1) if handle else c0.send(src, 1, 1)
        await send
        status = await recv
    else:
        send = c0.isend(src, 1, 1) if handle else asyncio.ensure_future(c0.send(src, 1, 1))
        await asyncio.sleep(0)
        recv = c1.irecv(out, 0, 1) if handle else c1.recv(out, 0, 1)
        status = await recv
        await send
    assert np.array_equal(out, src)
    seen: list[Any] = [tuple(status)]
    for comm in world.comms:
        flight = comm._engine.flight
        seen.append([({k: v for k, v in e.items() if k not in ("post", "match", "finish")},
                      _times(e)) for e in comm.flight_record()])
        seen.append([{peer: (t.n, t.nbytes, t.w == 0, t.c == 0) for peer, t in tally.items()}
                     for tally in (flight.sends, flight.recvs)])
    if handle:
        seen.append([(r.t_post == r.t_match, r.t_match == r.t_fin, r.t_post <= r.t_fin)
                     for r in (send, recv)])
    return seen


@pytest.mark.parametrize("nbytes", [8, *TIMED], ids=["8", "64K", "64K+8", "1M", "4M-8"])
@pytest.mark.parametrize("posted", [True, False], ids=["recv-first", "send-first"])
@pytest.mark.parametrize("handle", [False, True], ids=["awaited", "requests"])
@pytest.mark.parametrize("traced", [False, True], ids=["plain", "traced"])
def test_timed_copies_are_recorded_as_the_python_steps_record_them(
        nbytes: int, posted: bool, handle: bool, traced: bool, tmp_path: Path) -> None:
    """Each lane's flight record, tallies and requests for one message: a timed copy's
    recv matched before its copy and finished after it, a small one's in one reading;
    on the C lane exactly as on the Python steps (and the same on both where the lane is
    not built)."""
    async def run(native: bool) -> Any:
        trace = str(tmp_path / f"{native}.json") if traced else None
        async with ac.open_world(2, native=native, trace=trace) as world:
            return await asyncio.wait_for(_timed_pair(world, nbytes, posted, handle), 10)

    python = asyncio.run(run(False))
    if nbytes >= TIMED_COPY_MIN:  # the recv's record: matched before its copy, finished after
        assert python[3][0][1][1] is False
    if BUILT and not PURE:
        assert asyncio.run(run(True)) == python


@pytest.mark.parametrize("nbytes", TIMED, ids=["64K", "64K+8", "1M", "4M-8"])
@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_recv_cancelled_before_a_timed_copy_leaves_it_to_the_next(native: bool, loop: str,
                                                                    nbytes: int) -> None:
    """A recv cancelled before its message came is not filled, nor recorded done; the
    message (64 KiB or more) goes to the next recv that names it."""
    async def main(world: ac.World) -> None:
        c0, c1 = world.comms
        n = nbytes // 8
        first, second = np.zeros(n), np.zeros(n)
        task = asyncio.ensure_future(c1.recv(first, 0, 4))
        req = c1.irecv(np.zeros(n), 0, 5)
        await asyncio.sleep(0)
        task.cancel()
        assert req.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        send = asyncio.ensure_future(c0.send(np.full(n, 2.0), 1, 4))
        await asyncio.sleep(0)
        status = await c1.recv(second, 0, 4)
        await send
        assert status.nbytes == nbytes and second[0] == second[-1] == 2.0
        assert not first.any()
        states = sorted((e["op"], e["state"]) for e in c1.flight_record())
        assert states == [("recv", "cancelled"), ("recv", "cancelled"), ("recv", "done")]
        assert c1.iprobe(0, 4) is None and c1.statistics().pending_ops == 0

    async def run() -> None:
        async with ac.open_world(2, native=native) as world:
            await asyncio.wait_for(main(world), 10)

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(run())


@pytest.mark.native
@needs_lane
@pytest.mark.parametrize(("on_stream", "timeout"),
                         [(False, None), (True, None), (False, 5), (True, 2.5)])
def test_a_recv_posted_by_the_lane_is_the_request_python_makes(on_stream: bool,
                                                               timeout: Any) -> None:
    """Every field of a recv the lane posted equals the Python steps' own, on the default
    stream or an idle one of the user's, with a timeout or none; and so does what tracks
    it (its stream's and its engine's counts)."""
    fields = [n for cls in ac.Request.__mro__ for n in getattr(cls, "__slots__", ())]

    async def post(world: ac.World) -> tuple[dict[str, Any], Any]:
        c1 = world.comms[1]
        stream = c1.stream() if on_stream else None
        req = c1.irecv(np.empty(4), 0, 3, stream=stream, timeout=timeout)
        out = {n: getattr(req, n, "<unset>") for n in fields}
        engine = c1._engine
        held = req.stream
        counts = (held.statistics(), list(held._pending), held._seq, engine._n_pending,
                  engine._pending_recvs, held is (stream or engine.default_stream))
        req.cancel()
        return out, counts

    async def run(native: bool) -> tuple[dict[str, Any], Any]:
        async with ac.open_world(2, native=native) as world:
            return await asyncio.wait_for(post(world), 10)

    lane, lane_counts = asyncio.run(run(True))
    python, python_counts = asyncio.run(run(False))
    for name in ("t_post", "array", "_owner", "stream", "_timer"):  # times, objects
        assert type(lane.pop(name)) is type(python.pop(name))
    assert lane == python
    assert lane_counts == python_counts


@pytest.mark.native
@needs_lane
def test_a_recv_the_lane_completed_is_the_request_python_completes() -> None:
    """Every field of a posted recv that a message then filled, lane against Python steps:
    its status, its state, that nothing tracks it any more."""
    fields = [n for cls in ac.Request.__mro__ for n in getattr(cls, "__slots__", ())]

    async def fill(world: ac.World) -> tuple[dict[str, Any], int]:
        c0, c1 = world.comms
        await c0.send(np.ones(4), 1, 2)  # a dtype's name is learnt the first time it is sent
        await c1.recv(np.empty(4), 0, 2)
        req = c1.irecv(np.empty(4), 0, 3)
        assert req.view is None  # (the lane's: it makes no byte view)
        await c0.send(np.arange(4.0), 1, 3)
        await req
        return {n: getattr(req, n, "<unset>") for n in fields}, c1.statistics().pending_ops

    async def run(native: bool) -> tuple[dict[str, Any], int]:
        async with ac.open_world(2, native=native) as world:
            return await asyncio.wait_for(fill(world), 10)

    lane, lane_pending = asyncio.run(run(True))
    python, python_pending = asyncio.run(run(False))
    for name in ("t_post", "t_match", "t_fin", "array", "_owner", "stream"):  # times, objects
        assert type(lane.pop(name)) is type(python.pop(name))
    assert lane == python
    assert lane["_tracked"] is False and lane_pending == python_pending == 0


@pytest.mark.native
@needs_lane
def test_a_lane_that_does_not_fit_the_classes_leaves_the_python_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from asynccomm._engine.lane import LANE

    class Stale:  # a Request whose fields are not slots
        array = None

    async def one_message() -> float:
        async with ac.open_world(2) as world:
            c0, c1 = world.comms
            out = np.empty(1)
            await c0.send(np.full(1, 7.0), 1, 1)
            await c1.recv(out, 0, 1)
            return float(out[0])

    try:
        with pytest.raises(TypeError, match="classes"):
            LANE.configure({})
        spec = _native.spec({**_native._classes(ac.Communicator), "Request": Stale})
        with pytest.raises(TypeError, match="is not a slot"):
            LANE.configure(spec)
        # The lane is off now, and says so: every op takes the Python steps.
        assert LANE.send(None, None, 0, 0, False, None, None) is False
        assert LANE.recv(None, None, 0, 0, False, None, None) is None
        assert asyncio.run(one_message()) == 7.0

        def stale(lane: object, communicator: type) -> None:
            raise TypeError("<class 'Request'>.array is not a slot")

        monkeypatch.setattr(_native, "configure", stale)
        monkeypatch.delenv("ASYNCCOMM_REQUIRE_NATIVE", raising=False)
        with pytest.warns(RuntimeWarning, match="rebuild it"):
            assert _native.configure_lane(ac.Communicator) == (None, None)
        assert _native.CONFIGURED is None  # (an MPI world's link is not accelerated)
        monkeypatch.setenv("ASYNCCOMM_REQUIRE_NATIVE", "1")  # CI: refused, not a warning
        with pytest.raises(ImportError, match="rebuild it"):
            _native.configure_lane(ac.Communicator)
    finally:
        monkeypatch.undo()
        _native.configure_lane(ac.Communicator)
    assert asyncio.run(one_message()) == 7.0


# -- random programs ------------------------------------------------------------------

_rank = st.integers(0, SIZE - 1)
_tag = st.integers(0, 2)
#: Elements per message: small ones, and (float64) a timed copy at the eager limit, one
#: past it, and one of 320 KiB (int32: half those bytes); all inline (THREAD_COPY_MIN).
_n = st.sampled_from([0, 1, 3, 8, 100, 0, 1, 3, 8, 100, 8192, 8193, 40_000])
_dt = st.sampled_from(range(len(DTYPES)))
_send = st.sampled_from(["send", "send", "isend", "send_stream", "send_timeout",
                         "isend_timeout", "send_stream_timeout"])
_recv = st.sampled_from(["recv", "recv", "irecv", "recv_stream", "recv_timeout",
                         "irecv_timeout", "recv_stream_timeout", "hold"])
#: The timeouts of the ops that take one (``*_timeout``), in turn: none that fires before
#: the program ends but 0 (at the loop's next turn), int and float, and ones
#: ``check_timeout`` refuses (the op is then an error, nothing posted).
TIMEOUTS = (0, 1000.0, 0.0, 1000, None, -1, float("nan"), True)
_exchange = st.sampled_from(["sendrecv", "sendrecv", "batch"])


@st.composite
def programs(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """Messages (a send and a recv that names it, mostly with room and the same dtype,
    sometimes a wildcard, a smaller buffer or another dtype), exchanges (sendrecv or batch
    on both sides), stray sends, recvs and exchanges, and cancellations, shuffled.  Ops
    go on the default stream or on the rank's stream, with a timeout or none; a "hold"
    posts a recv on the rank's other stream and holds its stream until that one is done
    (so later ops on the stream queue)."""
    out: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 10))):
        src, dst, tag, n, dt = draw(_rank), draw(_rank), draw(_tag), draw(_n), draw(_dt)
        cap = draw(st.sampled_from([n, n, n, n + 5, max(0, n - 1)]))
        rdt = draw(st.sampled_from([dt, dt, dt, 1 - dt]))
        rsrc = draw(st.sampled_from([src, src, src, ac.ANY_SOURCE]))
        rtag = draw(st.sampled_from([tag, tag, tag, ac.ANY_TAG]))
        out.append((draw(_send), src, dst, tag, n, dt))
        out.append((draw(_recv), dst, rsrc, rtag, cap, rdt))
    for _ in range(draw(st.integers(0, 2))):
        a, b, tag, n, dt = draw(_rank), draw(_rank), draw(_tag), draw(_n), draw(_dt)
        out.append((draw(_exchange), a, b, tag, n, dt))
        out.append((draw(_exchange), b, a, tag, n, dt))
    strays = st.one_of(
        st.tuples(_exchange, _rank, _rank, _tag, _n, _dt),
        st.tuples(_send, _rank, _rank, _tag, _n, _dt),
        st.tuples(_recv, _rank, _rank, _tag, _n, _dt),
        st.tuples(st.just("cancel"), _rank, _rank, _tag, _n, _dt))
    out += draw(st.lists(strays, max_size=4))
    return draw(st.permutations(out))


def _outcome(value: Any) -> Any:
    if isinstance(value, BaseException):
        return type(value).__name__
    return tuple(value) if isinstance(value, tuple) else value


def _post(pending: list[Any], seen: list[Any], i: int, out: Any,
          op: Callable[[], ac.Request]) -> None:
    """Post op ``i`` (its recv buffer ``out``); one refused is seen as its error's name."""
    try:
        pending.append((i, op(), out))
    except (ValueError, TypeError) as exc:
        seen.append((i, _outcome(exc)))


def _times(entry: dict[str, Any]) -> tuple[bool, bool]:
    """How a flight record's times are made, on a clock that never reads the same twice:
    whether it was matched as it was posted, and finished as it was matched (a timed copy
    is matched before it and finished after it)."""
    return entry["post"] == entry["match"], entry["match"] == entry["finish"]


def _count_clock(world: ac.World) -> None:
    """Every engine of ``world`` on one clock that steps at each reading: records made
    from one reading have equal times, from two readings different ones."""
    ticks = itertools.count(1)

    def now() -> float:
        return float(next(ticks))

    for comm in world.comms:
        comm._engine.now = now


async def _program(world: ac.World, program: list[tuple[Any, ...]]) -> list[Any]:
    comms = world.comms
    _count_clock(world)
    streams = [c.stream() for c in comms]
    others = [c.stream() for c in comms]
    pending: list[tuple[int, Any, np.ndarray[Any, Any] | None]] = []
    seen: list[Any] = []
    for i, (op, rank, peer, tag, n, dt) in enumerate(program):
        comm = comms[rank]
        dtype = DTYPES[dt]
        timeout = TIMEOUTS[(i + tag) % len(TIMEOUTS)] if op.endswith("_timeout") else None
        on_stream = "_stream" in op
        op = op.removesuffix("_timeout").removesuffix("_stream")
        if op in ("sendrecv", "batch"):  # with ``peer`` both ways, on one tag
            buf = np.arange(i * 100, i * 100 + n).astype(dtype)
            out = np.full(n, -1).astype(dtype)
            exchange = (comm.sendrecv(buf, peer, out, peer, sendtag=tag, recvtag=tag)
                        if op == "sendrecv" else
                        comm.batch([ac.SendOp(buf, peer, tag), ac.RecvOp(out, peer, tag)]))
            pending.append((i, asyncio.ensure_future(exchange), out))
        elif op in ("send", "isend"):  # "send_stream": an isend on a stream
            buf = np.arange(i * 100, i * 100 + n).astype(dtype)
            if op == "send" and not on_stream:
                try:
                    await asyncio.wait_for(comm.send(buf, peer, tag, timeout=timeout), 0.05)
                    seen.append((i, "sent"))
                except (ac.AsyncCommError, TimeoutError, ValueError, TypeError) as exc:
                    seen.append((i, _outcome(exc)))
            else:
                stream = streams[rank] if on_stream else None
                _post(pending, seen, i, None, partial(comm.isend, buf, peer, tag,
                                                      stream=stream, timeout=timeout))
        elif op == "cancel":
            for _, what, _ in pending:
                if isinstance(what, asyncio.Future | asyncio.Task) and not what.done():
                    what.cancel()
                    break
                if isinstance(what, ac.Request) and not what.done():
                    what.cancel()
                    break
        elif op == "hold":  # a recv on the other stream, which holds this one
            out = np.full(n, -1).astype(dtype)
            pending.append((i, comm.irecv(out, peer, tag, stream=others[rank]), out))
            streams[rank].wait(others[rank].record())
        else:
            out = np.full(n, -1).astype(dtype)
            if op == "recv" and not on_stream:
                task = asyncio.ensure_future(comm.recv(out, peer, tag, timeout=timeout))
                pending.append((i, task, out))
            else:
                stream = streams[rank] if on_stream else None
                _post(pending, seen, i, out, partial(comm.irecv, out, peer, tag,
                                                     stream=stream, timeout=timeout))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    for _ in range(4):
        await asyncio.sleep(0)
    # (pending ops are listed stream by stream, and streams in no fixed order)
    seen.append([(c.statistics(), c._engine._pending_recvs,
                  sorted((e["op"], e["state"]) for e in c.flight_record())) for c in comms])
    seen.append([(s.statistics(), list(s._pending), [r.sseq for r in s._pending.values()])
                 for s in streams + others])
    for i, what, out in pending:
        if not what.done():
            what.cancel()
        try:
            result = await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(
                _await(what))), 0.05) if not what.done() else _result(what)
        except BaseException as exc:  # the outcome is what is compared
            result = exc
        seen.append((i, _outcome(result), None if out is None else out.tolist()))
    for comm in comms:
        flight = [({k: v for k, v in e.items() if k not in ("post", "match", "finish")},
                   _times(e)) for e in comm.flight_record()]
        engine = comm._engine
        tallies = [{peer: (t.n, t.nbytes) for peer, t in tally.items()}
                   for tally in (engine.flight.sends, engine.flight.recvs)]
        seen.append((comm.rank, flight, tallies, engine.flight.others, comm.statistics()))
        if engine.tracer is not None:
            seen.append([(entry[:6], flow) for entry, flow, _ in engine.tracer.ops])
    return seen


async def _await(what: Any) -> Any:
    return await what


def _result(what: Any) -> Any:
    if what.cancelled():
        return asyncio.CancelledError()
    if isinstance(what, ac.Request):
        return what.exception() or what.status
    return what.exception() or what.result()


def _run(loop: str, traced: bool, program: list[tuple[Any, ...]], native: bool) -> list[Any]:
    for dtype in DTYPES:  # names known from the start (each first message goes the full way)
        dtype_name(np.dtype(dtype), "a")
    async def main(trace: str | None) -> list[Any]:
        async with ac.open_world(SIZE, trace=trace, native=native) as world:
            return await asyncio.wait_for(_program(world, program), 20)

    with tempfile.TemporaryDirectory() as tmp, asyncio.Runner(
            loop_factory=LOOPS[loop]) as runner:
        return runner.run(main(str(Path(tmp) / "trace.json") if traced else None))


@pytest.mark.native
@needs_lane
@pytest.mark.parametrize(("loop", "traced"), ENVS, ids=["uvloop", "asyncio", "traced"])
@settings(max_examples=40, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(program=programs())
def test_the_lane_and_the_python_steps_agree(loop: str, traced: bool,
                                             program: list[tuple[Any, ...]]) -> None:
    lane = _run(loop, traced, program, True)
    python = _run(loop, traced, program, False)
    assert lane == python
