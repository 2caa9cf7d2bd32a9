"""In-process, a rendezvous send (over the eager limit) posted before its recv: the C lane
posts it (announced at its receiver, waiting at its sender) and the recv that takes it
completes it, and everything a program can observe is what the Python steps give
(``native=False``): the requests' fields, statuses, flight records, tallies, statistics,
withdrawals and timeouts, probes and wildcard recvs that see the waiting message."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

import numpy as np
import pytest

import asynccomm as ac
from asynccomm._buffers import dtype_name
from asynccomm._comm import communicator as _communicator
from asynccomm._engine.fast import THREAD_COPY_MIN
from asynccomm._engine.stream import Stream
from asynccomm.transports.local import LocalLink

from .test_lane import LOOPS, _count_clock, _times, needs_lane

#: Past the eager limit (a rendezvous), a large inline copy, one the worker thread copies.
SIZES = [ac.EAGER_LIMIT + 8, 1 << 20, THREAD_COPY_MIN]
IDS = ["64K+8", "1M", "4M"]
FIELDS = [n for cls in ac.Request.__mro__ for n in getattr(cls, "__slots__", ())]
#: Times and objects: compared by type only.
LOOSE = ("t_post", "t_match", "t_fin", "array", "_owner", "stream", "_timer", "view")


def _fields(req: ac.Request) -> dict[str, Any]:
    out = {n: getattr(req, n, "<unset>") for n in FIELDS}
    for name in LOOSE:
        out[name] = type(out[name]).__name__
    exc = out.get("_exc")
    out["_exc"] = None if exc is None else (type(exc).__name__, str(exc))
    return out


def _world_state(world: ac.World) -> list[Any]:
    """Each rank's flight record (times by how they were read), tallies, statistics."""
    seen: list[Any] = []
    for comm in world.comms:
        flight = comm._engine.flight
        seen.append([({k: v for k, v in e.items() if k not in ("post", "match", "finish")},
                      _times(e)) for e in comm.flight_record()])
        seen.append([{p: (t.n, t.nbytes, t.w == 0, t.c == 0) for p, t in tally.items()}
                     for tally in (flight.sends, flight.recvs)])
        seen.append((flight.others, comm.statistics(), comm._engine._n_pending,
                     comm._engine._pending_recvs))
    return seen


def _both(program: Callable[[ac.World], Awaitable[Any]], loop: str = "uvloop",
          size: int = 2) -> tuple[Any, Any]:
    """``program`` on the C lane and on the Python steps, each in a world of its own on a
    clock that steps at each reading."""
    async def run(native: bool) -> Any:
        async with ac.open_world(size, native=native) as world:
            _count_clock(world)
            return await asyncio.wait_for(program(world), 10)

    dtype_name(np.dtype(np.float64), "a")  # known from the start (a first message goes
    out = []  # the full way)
    for native in (True, False):
        with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
            out.append(runner.run(run(native)))
    return out[0], out[1]


@pytest.mark.native
@needs_lane
@pytest.mark.parametrize("nbytes", SIZES, ids=IDS)
@pytest.mark.parametrize("on_stream", [False, True], ids=["default", "stream"])
@pytest.mark.parametrize("timeout", [None, 5.0], ids=["no-timeout", "timeout"])
def test_a_send_posted_before_its_recv_is_the_request_python_makes(
        nbytes: int, on_stream: bool, timeout: float | None) -> None:
    """Posted (waiting at its sender), then taken by a recv: every field of the send, its
    stream's and engine's counts, the receiver's matcher, then each rank's flight record,
    tallies and statistics, lane against the Python steps."""
    async def program(world: ac.World) -> Any:
        c0, c1 = world.comms
        n = nbytes // 8
        stream = c0.stream() if on_stream else None
        src, out = np.arange(float(n)), np.zeros(n)
        send = c0.isend(src, 1, 4, stream=stream, timeout=timeout)
        held = cast(Stream, send.stream)
        posted = (_fields(send), held.statistics(), list(held._pending), held._seq,
                  c1.statistics(), c1.iprobe(0, 4), send._timer is not None)
        status = await c1.recv(out, 0, 4)
        await send
        assert np.array_equal(out, src)
        return [posted, tuple(status), _fields(send), held.statistics(), *_world_state(world)]

    lane, python = _both(program)
    assert lane == python


@pytest.mark.native
@needs_lane
@pytest.mark.parametrize("nbytes", SIZES, ids=IDS)
@pytest.mark.parametrize("loop", list(LOOPS))
def test_the_lane_posts_and_completes_a_rendezvous_without_the_python_steps(
        monkeypatch: pytest.MonkeyPatch, nbytes: int, loop: str) -> None:
    """isend then recv (and send then irecv): the send is posted, announced and completed
    by the C lane (under ``THREAD_COPY_MIN``: the recv's copy is the lane's too)."""
    def refuse(*args: Any) -> Any:
        raise AssertionError("the Python steps ran")

    async def main() -> None:
        async with ac.open_world(2) as world:
            c0, c1 = world.comms
            n = nbytes // 8
            await c0.send(np.ones(2), 1, 6)  # a dtype's name is learnt on its first send
            await c1.recv(np.empty(2), 0, 6)
            monkeypatch.setattr(_communicator.Communicator, "_send_op", refuse)
            monkeypatch.setattr(LocalLink, "send", refuse)
            if nbytes < THREAD_COPY_MIN:
                monkeypatch.setattr(_communicator.Communicator, "_recv_op", refuse)
                monkeypatch.setattr(LocalLink, "received", refuse)
            out = np.zeros(n)
            for i in range(3):
                send = (c0.isend(np.full(n, float(i)), 1, 7) if i != 1
                        else asyncio.ensure_future(c0.send(np.full(n, float(i)), 1, 7)))
                await asyncio.sleep(0)
                assert not send.done()
                status = await (c1.recv(out, 0, 7) if i != 2 else c1.irecv(out, 0, 7))
                assert status.nbytes == nbytes and out[0] == out[-1] == float(i)
                await send
            monkeypatch.undo()
            assert c0.statistics().pending_ops == c1.statistics().pending_ops == 0

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(asyncio.wait_for(main(), 10))


async def _withdrawn(world: ac.World, nbytes: int, how: str) -> Any:
    """A send waiting at its sender, withdrawn (``how``: cancelled as a request, its task
    cancelled, timed out), then a recv for it: the next message, never the withdrawn one
    (Rule 4); a send a recv took is never reported cancelled."""
    c0, c1 = world.comms
    n = nbytes // 8
    out = np.zeros(n)
    seen: list[Any] = []
    if how == "request":
        send = c0.isend(np.full(n, 1.0), 1, 3)
        seen.append(send.cancel())
        seen.append(send.cancelled())
    elif how == "task":
        task = asyncio.ensure_future(c0.send(np.full(n, 1.0), 1, 3))
        await asyncio.sleep(0)
        task.cancel()
        seen.append(type((await asyncio.gather(task, return_exceptions=True))[0]).__name__)
    else:  # timed out (the timer fires at the loop's next turn)
        task = asyncio.ensure_future(c0.send(np.full(n, 1.0), 1, 3, timeout=0))
        seen.append(type((await asyncio.gather(task, return_exceptions=True))[0]).__name__)
    seen.append(c1.iprobe(0, 3))
    later = c0.isend(np.full(n, 2.0), 1, 3)
    status = await c1.recv(out, 0, 3)
    seen.append((tuple(status), out[0], out[-1]))
    await later
    seen.append((later.cancel(), later.cancelled(), later.done()))  # taken: not cancelled
    seen.append(_fields(later))
    return seen + _world_state(world)


@pytest.mark.native
@needs_lane
@pytest.mark.parametrize("nbytes", SIZES, ids=IDS)
@pytest.mark.parametrize("how", ["request", "task", "timeout"])
@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_waiting_send_withdrawn_is_never_received(nbytes: int, how: str, loop: str) -> None:
    lane, python = _both(lambda w: _withdrawn(w, nbytes, how), loop)
    assert lane == python


async def _seen_waiting(world: ac.World, nbytes: int) -> Any:
    """What sees a send waiting at its sender: a blocking probe posted before it, a
    wildcard probe (its index built before the send), a wildcard recv that takes it, an
    exact recv on a stream, a recv too small for it (refused, the message kept)."""
    c0, c1, c2 = world.comms
    n = nbytes // 8
    seen: list[Any] = []
    probe = asyncio.ensure_future(c1.probe(0, 5))
    await asyncio.sleep(0)
    seen.append(c1.iprobe(ac.ANY_SOURCE, ac.ANY_TAG))  # builds the wildcard index
    first = c0.isend(np.full(n, 1.0), 1, 5)
    second = c2.isend(np.full(n, 2.0), 1, 5)
    seen.append(tuple(await probe))
    seen.append(c1.iprobe(ac.ANY_SOURCE, 5))
    small = np.zeros(n - 1)
    with pytest.raises(ac.TruncationError):
        await c1.recv(small, 0, 5)
    out = np.zeros(n)
    seen.append(tuple(await c1.recv(out, ac.ANY_SOURCE, 5)))
    seen.append(out[0])
    stream = c1.stream()
    seen.append(tuple(await c1.irecv(out, 2, 5, stream=stream)))
    seen.append(out[0])
    await first
    await second
    seen.append([_fields(first), _fields(second)])
    return seen + _world_state(world)


@pytest.mark.native
@needs_lane
@pytest.mark.parametrize("nbytes", SIZES, ids=IDS)
@pytest.mark.parametrize("loop", list(LOOPS))
def test_probes_and_wildcards_see_a_waiting_send_as_python_does(nbytes: int,
                                                                  loop: str) -> None:
    lane, python = _both(lambda w: _seen_waiting(w, nbytes), loop, size=3)
    assert lane == python


async def _peer_closes(world: ac.World, nbytes: int) -> Any:
    """The receiver closes with a send waiting for it: the send fails, as the Python
    steps fail it."""
    c0, c1 = world.comms
    n = nbytes // 8
    send = c0.isend(np.full(n, 1.0), 1, 8)
    await c1.aclose()
    with pytest.raises(ac.CommBrokenError) as info:
        await send
    late = await asyncio.gather(c0.send(np.full(n, 1.0), 1, 8), return_exceptions=True)
    return [str(info.value), _fields(send), type(late[0]).__name__,
            [({k: v for k, v in e.items() if k not in ("post", "match", "finish")},
              _times(e)) for e in c0.flight_record()]]


@pytest.mark.native
@needs_lane
@pytest.mark.parametrize("nbytes", SIZES, ids=IDS)
@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_send_waiting_for_a_rank_that_closes_fails_as_python_fails_it(nbytes: int,
                                                                        loop: str) -> None:
    lane, python = _both(lambda w: _peer_closes(w, nbytes), loop)
    assert lane == python


@pytest.mark.parametrize("nbytes", SIZES, ids=IDS)
@pytest.mark.parametrize("loop", list(LOOPS))
@pytest.mark.parametrize("native", [pytest.param(True, marks=[pytest.mark.native, needs_lane]),
                                    False], ids=["native", "python"])
def test_many_sends_waiting_are_received_in_order(native: bool, nbytes: int,
                                                  loop: str) -> None:
    """Non-overtaking: sends waiting at their sender, some cancelled, are received in
    the order they were posted, each once."""
    async def main() -> None:
        async with ac.open_world(2, native=native) as world:
            c0, c1 = world.comms
            n = nbytes // 8
            sends = [c0.isend(np.full(n, float(i)), 1, 2) for i in range(6)]
            assert sends[1].cancel() and sends[4].cancel()
            out = np.zeros(n)
            got = []
            for _ in range(4):
                await c1.recv(out, 0, 2)
                got.append(out[-1])
            assert got == [0.0, 2.0, 3.0, 5.0]
            for i, s in enumerate(sends):
                assert s.done() and s.cancelled() == (i in (1, 4))
            assert c1.iprobe(0, 2) is None
            assert c0.statistics().pending_ops == c1.statistics().pending_ops == 0

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(asyncio.wait_for(main(), 10))


async def _taken_then_cancelled(world: ac.World, nbytes: int) -> Any:
    """An awaited send waiting at its sender, taken by a recv, and its task cancelled
    before it resumes: the send is done (received), never reported cancelled; the
    cancellation reaches the task at its next wait."""
    c0, c1 = world.comms
    n = nbytes // 8
    out = np.zeros(n)
    task = asyncio.ensure_future(c0.send(np.full(n, 3.0), 1, 9))
    await asyncio.sleep(0)
    status = await c1.recv(out, 0, 9)
    task.cancel()
    outcome = (await asyncio.gather(task, return_exceptions=True))[0]
    return [tuple(status), out[-1], type(outcome).__name__, *_world_state(world)]


@pytest.mark.native
@needs_lane
@pytest.mark.parametrize("nbytes", SIZES, ids=IDS)
@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_send_taken_then_its_task_cancelled_is_done_as_python_says(nbytes: int,
                                                                     loop: str) -> None:
    lane, python = _both(lambda w: _taken_then_cancelled(w, nbytes), loop)
    assert lane == python
    assert lane[0][1] == 9  # (its tag: the message went)
