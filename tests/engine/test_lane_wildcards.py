"""Recvs that name ``ANY_SOURCE`` or ``ANY_TAG`` on the C lane.

A wildcard recv takes the earliest waiting message it names (``Matcher``'s wildcard
indexes) or is posted, and a message that lands meets the earliest posted of the recvs
that name it (its exact (source, tag) bucket and the three wildcard ones), as
``Matcher.deliver`` says, in C.  Before, any wildcard recv
posted sent every message of its rank through the Python steps: a message and its answer
took 2.5 times as long at 8 B in-process and 2.7 times on processes and MPI.  Programs of
exact and wildcard recvs, cancellations and sends give what the Python steps give, and
every message is received once, intact, in order."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asynccomm as ac

BUILT = importlib.util.find_spec("asynccomm._native._lane") is not None
PURE = os.environ.get("ASYNCCOMM_PURE_PYTHON", "") not in ("", "0")
needs_lane = pytest.mark.skipif(not BUILT or PURE, reason="the C lane is not in use here")
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}
ANY_S, ANY_T = ac.ANY_SOURCE, ac.ANY_TAG


def _run(loop: str, main: Callable[[ac.World], Any], native: bool | None = None,
         size: int = 3) -> Any:
    async def run() -> Any:
        async with ac.open_world(size, native=native) as world:
            return await asyncio.wait_for(main(world), 20)

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(run())


@pytest.mark.native
@needs_lane
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_wildcard_recvs_and_their_messages_never_reach_the_python_steps(
        loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recv naming ``ANY_SOURCE``, ``ANY_TAG`` or both, posted before its message (no
    message waiting), and the send that fills it, run in C; a message meets the earliest
    posted recv that names it, exact or wildcard."""
    def refuse(*args: Any) -> Any:
        raise AssertionError("the Python steps ran")

    async def main(world: ac.World) -> list[Any]:
        c0, c1, c2 = world.comms
        await c0.send(np.ones(2), 2, 6)  # a dtype's name is learnt the first time it is sent
        await c2.recv(np.empty(2), 0, 6)
        monkeypatch.setattr(ac.Communicator, "_send_op", refuse)
        monkeypatch.setattr(ac.Communicator, "_recv_op", refuse)
        got: list[Any] = []
        for i, (src, tag) in enumerate([(ANY_S, 7), (0, ANY_T), (ANY_S, ANY_T)]):
            out = np.empty(2)
            task = asyncio.ensure_future(c2.recv(out, src, tag))
            await asyncio.sleep(0)
            await c1.send(np.full(2, float(i)), 2, 7) if src == ANY_S else \
                await c0.send(np.full(2, float(i)), 2, 7)
            got.append((tuple(await task), out[0]))
        # posted order decides between an exact and a wildcard recv that both name it
        a, b = np.empty(2), np.empty(2)
        exact, wild = c2.irecv(a, 0, 7), c2.irecv(b, ANY_S, ANY_T)
        await c0.send(np.full(2, 10.0), 2, 7)
        await c0.send(np.full(2, 11.0), 2, 7)
        got.append((exact.status.source, a[0], wild.status.tag, b[0]))
        wild, exact = c2.irecv(b, ANY_S, 7), c2.irecv(a, 1, 7)
        await c1.send(np.full(2, 12.0), 2, 7)
        await c1.send(np.full(2, 13.0), 2, 7)
        got.append((wild.status.source, b[0], exact.status.source, a[0]))
        # a wildcard recv for another tag lets an exact one take its message
        other, exact = c2.irecv(b, ANY_S, 8), c2.irecv(a, 0, 7)
        await c0.send(np.full(2, 14.0), 2, 7)
        done = (exact.done(), other.done(), a[0])
        await c1.send(np.full(2, 15.0), 2, 8)
        got.append((*done, other.status.source, b[0]))
        return got

    assert _run(loop, main) == [
        ((1, 7, 16, 2, (2,)), 0.0), ((0, 7, 16, 2, (2,)), 1.0), ((1, 7, 16, 2, (2,)), 2.0),
        (0, 10.0, 7, 11.0), (1, 12.0, 1, 13.0), (True, False, 14.0, 1, 15.0)]


@pytest.mark.native
@needs_lane
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_wildcard_recv_takes_the_earliest_waiting_message_it_names_in_c(
        loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages that arrived before their recvs: a wildcard recv takes the earliest of
    those it names, in C (once its rank's wildcard indexes are built: the first wildcard
    recv that finds messages waiting builds them, in the Python steps)."""
    def refuse(*args: Any) -> Any:
        raise AssertionError("the Python steps ran")

    async def main(world: ac.World) -> list[Any]:
        c0, c1, c2 = world.comms
        await c0.send(np.ones(2), 2, 6)  # (the indexes built, a dtype's name learnt)
        await c2.recv(np.empty(2))
        monkeypatch.setattr(ac.Communicator, "_recv_op", refuse)
        for comm, tag, value in [(c0, 1, 1.0), (c1, 0, 2.0), (c0, 0, 3.0), (c1, 1, 4.0)]:
            await comm.send(np.full(2, value), 2, tag)
        got = []
        for src, tag in [(ANY_S, ANY_T), (ANY_S, 0), (0, ANY_T), (1, 1)]:
            out = np.empty(2)
            status = await c2.recv(out, src, tag)
            got.append((status.source, status.tag, out[0]))
        return got

    assert _run(loop, main) == [(0, 1, 1.0), (1, 0, 2.0), (0, 0, 3.0), (1, 1, 4.0)]


# -- programs: the lane and the Python steps agree, and nothing is lost --------------------

SOURCES, TAGS = (0, 1, ANY_S), (0, 1, ANY_T)


@st.composite
def programs(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """Rank 2's recvs (exact or wildcard, some cancelled later) and ranks 0 and 1's sends,
    shuffled; then enough recvs of any message for every send."""
    recv = st.tuples(st.just("recv"), st.sampled_from(SOURCES), st.sampled_from(TAGS))
    send = st.tuples(st.just("send"), st.sampled_from((0, 1)), st.sampled_from((0, 1)))
    cancel = st.tuples(st.just("cancel"), st.integers(0, 11), st.just(0))
    ops = (draw(st.lists(recv, min_size=1, max_size=12))
           + draw(st.lists(send, min_size=1, max_size=12))
           + draw(st.lists(cancel, max_size=3)))
    return draw(st.permutations(ops))


async def _program(world: ac.World, program: list[tuple[Any, ...]]) -> list[Any]:
    """Each recv's outcome (the message's source, tag and contents, or cancelled), in
    posting order, then what the catch-all recvs took, then the matcher's counts of recvs
    posted and of wildcard ones, once every recv is done or cancelled."""
    comms = world.comms
    recvs: list[tuple[ac.Request, np.ndarray[Any, Any]]] = []
    sent = 0
    for op, a, b in program:
        if op == "recv":
            out = np.full(3, -1, np.int64)
            recvs.append((comms[2].irecv(out, a, b), out))
        elif op == "send":  # (source, tag, its number among the sends)
            await comms[a].send(np.array([a, b, sent], np.int64), 2, b)
            sent += 1
        elif recvs:
            recvs[a % len(recvs)][0].cancel()
        await asyncio.sleep(0)
    for _ in range(4):
        await asyncio.sleep(0)
    waiting = comms[2]._engine.matcher.statistics().unexpected_messages
    extra = []
    for _ in range(waiting):  # every message is taken by someone
        out = np.full(3, -1, np.int64)
        extra.append((comms[2].irecv(out, ANY_S, ANY_T), out))
    for _ in range(4):
        await asyncio.sleep(0)
    outcomes: list[Any] = []
    for req, out in recvs + extra:
        if not req.done():  # (every send is in: it waits for nothing that will come)
            req.cancel()
            outcomes.append("pending")
        elif req.cancelled():
            outcomes.append("cancelled")
        else:
            status = req.status
            outcomes.append((status.source, status.tag, out.tolist()))
    matcher = comms[2]._engine.matcher  # (its counts of recvs posted, wildcard ones: none)
    outcomes.append(("counts", matcher._n_posted, matcher._n_wild_posted))
    return outcomes


@pytest.mark.native
@needs_lane
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@settings(max_examples=60, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(program=programs())
def test_wildcard_programs_give_on_the_lane_what_the_python_steps_give(
        loop: str, program: list[tuple[Any, ...]]) -> None:
    def main(world: ac.World) -> Any:
        return _program(world, program)

    lane, python = (_run(loop, main, native) for native in (True, False))
    assert lane == python
    assert lane.pop() == ("counts", 0, 0)
    # every message once, intact, and those of one (source, tag) in the order sent
    took = [o for o in lane if isinstance(o, tuple)]
    numbers = [o[2][2] for o in took if o[2][0] >= 0]
    n_sent = sum(op == "send" for op, _, _ in program)
    assert sorted(numbers) == list(range(n_sent))
    for source, tag, (s, t, _) in took:
        assert (source, tag) == (s, t)
    for key in {(o[0], o[1]) for o in took}:
        sequence = [o[2][2] for o in took if (o[0], o[1]) == key]
        assert sequence == sorted(sequence)
