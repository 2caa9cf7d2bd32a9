"""Programs for the tests of the shared-memory link's offers (``transports/shm.py``: an
``RTS`` that carries its send buffer's address; the receiver copies as soon as a recv
matches and answers ``DATA_DONE`` alone), importable by each rank's process.

The copies can be held (``_Gate``: ``Channels._read`` does nothing while it is shut), so
that a cancellation or a death lands while the sender's buffer is lent."""

from __future__ import annotations

import asyncio
import os
import select
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import current_process
from typing import Any

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import asynccomm as ac
from asynccomm._comm.process_runner import run_rank
from asynccomm._core.wire import CTS
from asynccomm.transports import shm
from asynccomm.transports.shm import Channels, Node, ShmTransport

from .contract import bounded, check
from .shm_cases import _Refusing, broken_or_not

OPTIONS = {"eager_limit": 65_536, "pool_bytes": 64 << 20, "timeout": None}
#: A message of several ``READ_CHUNK``s, odd-sized.
BIG = 2 * shm.READ_CHUNK + 3
#: Sizes of the property: eager, the eager limit, just above it, one chunk, two and a bit.
SIZES = (8, 65_536, 65_537, (1 << 20) + 3, 2 * shm.READ_CHUNK + 5)
SENTINEL = 0xEE


class _Gate:
    """Holds every single copy of this process while shut (``Channels._read`` returns at
    once); counts what the link sends and takes."""

    shut = False
    holding: asyncio.Event | None = None  # set once a copy is held
    cts = 0  # CTS sent by this rank
    taken = 0  # offers a recv matched
    answered = 0  # this rank's offers answered by the Python steps
    gone_pid = 0  # once this process has ended, open (``sender_dies``)

    @classmethod
    def install(cls) -> None:
        read, send, take = Channels._read, ShmTransport._send, Channels.take
        answered = ShmTransport._answered

        def gated(self: Channels) -> None:
            if cls.gone_pid and cls.shut and _ended(cls.gone_pid):
                cls.shut = False  # the copy meets a process that is gone
            if not cls.shut:
                read(self)
            elif cls.holding is not None:
                cls.holding.set()

        def counted_send(self: ShmTransport, dest: int, raw: Any) -> None:
            cls.cts += raw[0] == CTS
            send(self, dest, raw)

        def counted_take(self: Channels, *args: Any) -> None:
            cls.taken += 1
            take(self, *args)

        def counted_answer(self: ShmTransport, *args: Any) -> None:
            cls.answered += 1
            answered(self, *args)

        Channels._read = gated  # type: ignore[method-assign]
        ShmTransport._send = counted_send  # type: ignore[method-assign]
        Channels.take = counted_take  # type: ignore[method-assign]
        ShmTransport._answered = counted_answer  # type: ignore[method-assign]


def _ended(pid: int) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # reaped already
        return True
    try:
        return bool(select.select([fd], [], [], 0)[0])
    finally:
        os.close(fd)


def _link(comm: ac.Communicator) -> ShmTransport:
    link = comm._engine.link  # type: ignore[attr-defined]
    assert isinstance(link, ShmTransport)
    return link


async def _held() -> None:
    """Shut the gate (if it is not) and wait until it holds a copy (the program's bound
    ends a wait that hangs)."""
    _Gate.shut = True
    _Gate.holding = asyncio.Event()
    await _Gate.holding.wait()


def data(n: int, k: int) -> np.ndarray[Any, Any]:
    return (np.arange(n, dtype=np.int64) * 7 + k).astype(np.uint8)


async def _recv_then(comm: ac.Communicator, buf: Any, tag: int, got: list[Any]) -> None:
    got.append(await comm.recv(buf, 0, tag))
    await asyncio.sleep(0)  # a cancellation deferred by a recv that completed lands here
    got.append("not cancelled")


async def _send_then(comm: ac.Communicator, buf: Any, tag: int, done: list[bool]) -> None:
    await comm.send(buf, 1, tag)
    done.append(True)
    await asyncio.sleep(0)
    done.append(False)


async def lent(comm: ac.Communicator) -> dict[str, Any]:
    """Rank 0 sends ``BIG`` messages to rank 1: a recv posted before the ``RTS``; one
    posted after it; a recv cancelled while it copies; a send cancelled while rank 1
    copies it; a send withdrawn before any recv matched it.  What each rank saw."""
    ready = np.zeros(1)
    out: dict[str, Any] = {}
    if comm.rank == 0:
        await comm.recv(ready, 1, 2)  # 1: rank 1's recv is posted
        await comm.send(data(BIG, 1), 1, 1)
        req = comm.isend(data(BIG, 2), 1, 3)  # 2: announced before rank 1 posts its recv
        await comm.send(ready, 1, 4)
        await req
        await comm.recv(ready, 1, 6)  # 3: rank 1 cancels its recv while it copies
        await comm.send(data(BIG, 3), 1, 5)
        await comm.recv(ready, 1, 8)  # 4: this send is cancelled while rank 1 copies it
        done: list[bool] = []
        task = asyncio.create_task(_send_then(comm, data(BIG, 4), 7, done))
        await comm.recv(ready, 1, 9)
        task.cancel()
        await comm.send(ready, 1, 10)
        try:
            await task
        except asyncio.CancelledError:
            pass
        out["cancelled send"] = done
        task = asyncio.create_task(comm.send(data(BIG, 5), 1, 11))  # 5: withdrawn
        await asyncio.sleep(0)  # the task runs: its RTS goes
        check(_link(comm).wire.announced, "5: not announced")
        task.cancel()
        try:
            await task
            out["withdrawn"] = False
        except asyncio.CancelledError:
            out["withdrawn"] = True
        req = comm.isend(data(BIG, 6), 1, 11)
        await comm.send(ready, 1, 12)
        await req
        link = _link(comm)  # (every offer answered: nothing lent or awaited left)
        out["lent left"] = len(link._sends) + len(link.wire.announced) + len(
            link.channels.copying)
    else:
        channels = _link(comm).channels
        buf = np.zeros(BIG, np.uint8)
        req = comm.irecv(buf, 0, 1)
        await comm.send(ready, 0, 2)
        await req
        check(np.array_equal(buf, data(BIG, 1)), "1: corrupted")
        await comm.recv(ready, 0, 4)
        out["offers waiting"] = len(channels.offers)
        await comm.recv(buf, 0, 3)
        check(np.array_equal(buf, data(BIG, 2)), "2: corrupted")
        _Gate.shut = True
        got: list[Any] = []
        task = asyncio.create_task(_recv_then(comm, buf, 5, got))
        await comm.send(ready, 0, 6)
        await _held()
        task.cancel()
        for _ in range(3):
            await asyncio.sleep(0)
        _Gate.shut = False
        try:
            await task
        except asyncio.CancelledError:
            pass
        out["cancelled recv"] = [type(g).__name__ if g != "not cancelled" else g for g in got]
        check(np.array_equal(buf, data(BIG, 3)), "3: corrupted")
        _Gate.shut = True
        req = comm.irecv(buf, 0, 7)
        await comm.send(ready, 0, 8)
        await _held()
        await comm.send(ready, 0, 9)  # rank 0 cancels its send now
        await comm.recv(ready, 0, 10)  # its WITHDRAW came first
        _Gate.shut = False
        await req
        check(np.array_equal(buf, data(BIG, 4)), "4: corrupted")
        await comm.recv(ready, 0, 12)
        await comm.recv(buf, 0, 11)
        check(np.array_equal(buf, data(BIG, 6)), "5: the withdrawn message arrived")
        out["offers left"] = len(channels.offers)
        out["copies left"] = len(channels._reading) + len(channels._pulls)
    out["cts"] = _Gate.cts
    out["taken"] = _Gate.taken
    out["answered"] = _Gate.answered
    out["answers in C"] = _link(comm).path is not None
    return out


def lent_copies(loop: str) -> object:
    """``lent`` on this rank (a ``launch`` target)."""
    _Gate.install()
    return run_rank(bounded(lent, 60.0), loop, OPTIONS)


async def sender_dies(comm: ac.Communicator) -> str:
    """Rank 0 is killed (SIGKILL) while rank 1 copies its message (held until rank 0's
    process has ended: the copy finds it gone): what rank 1's recv got, and whether rank
    1 still copies once."""
    ready = np.zeros(1)
    if comm.rank == 0:
        await comm.recv(ready, 1, 2)
        comm.isend(data(BIG, 1), 1, 1)
        await comm.recv(ready, 1, 3)  # rank 1 copies
        os.kill(os.getpid(), signal.SIGKILL)
    node = Node.current()
    assert node is not None
    _Gate.shut = True
    _Gate.gone_pid = node.pids[0]
    buf = np.zeros(BIG, np.uint8)
    req = comm.irecv(buf, 0, 1)
    await comm.send(ready, 0, 2)
    await _held()
    await comm.send(ready, 0, 3)
    said = await broken_or_not(req)
    return f"{said}; copies once: {node.single_copy}"  # (a gone process is no refusal)


def a_sender_that_dies(loop: str) -> object:
    """``sender_dies`` on this rank (a ``launch`` target)."""
    _Gate.install()
    return run_rank(bounded(sender_dies, 30.0), loop, OPTIONS)


@dataclass(frozen=True)
class Plan:
    """Rank 0's messages (size index, whether rank 1's recv is posted before the send),
    and the order of rank 1's other recvs (a permutation, by key)."""

    msgs: tuple[tuple[int, bool], ...]
    order: tuple[int, ...]


def plans() -> st.SearchStrategy[Plan]:
    msgs = st.lists(st.tuples(st.integers(0, len(SIZES) - 1), st.booleans()), min_size=1,
                    max_size=6).map(tuple)
    return msgs.flatmap(lambda m: st.permutations(range(len(m))).map(
        lambda order: Plan(m, tuple(order))))


def exchange(plan: Plan) -> Callable[[ac.Communicator], Any]:
    """Rank 0 sends the plan's messages (on tags 0, 1, ...) once rank 1 has posted the
    recvs that go first; rank 1 posts the others in the plan's order and checks them."""

    async def main(comm: ac.Communicator) -> None:
        ready = np.zeros(1)
        if comm.rank == 0:
            await comm.recv(ready, 1, 100)
            await ac.wait_all([comm.isend(data(SIZES[s], i), 1, i)
                               for i, (s, _) in enumerate(plan.msgs)])
            return
        bufs = [np.full(SIZES[s] + 64, SENTINEL, np.uint8) for s, _ in plan.msgs]
        reqs = [comm.irecv(bufs[i][:SIZES[s]], 0, i)
                for i, (s, first) in enumerate(plan.msgs) if first]
        await comm.send(ready, 0, 100)
        reqs += [comm.irecv(bufs[i][:SIZES[plan.msgs[i][0]]], 0, i)
                 for i in plan.order if not plan.msgs[i][1]]
        await ac.wait_all(reqs)
        for i, (s, _) in enumerate(plan.msgs):
            n = SIZES[s]
            check(np.array_equal(bufs[i][:n], data(n, i)), f"message {i} corrupted")
            check(not (bufs[i][n:] != SENTINEL).any(), f"message {i}: written past it")

    return main


def sizes_and_orders(loop: str, examples: int, refuse: bool) -> object:
    """The property over ``examples`` plans (the ranks draw the same ones), each in a world
    with the C lane's steps or the Python ones, rank 1's single copy refused if
    ``refuse``: this rank's first failure, and whether it copies once."""
    if refuse and current_process().name == "asynccomm-rank-1":
        shm.single_copy = _Refusing(shm.single_copy)  # type: ignore[assignment]
    errors = _holds(loop, examples, exchange,
                    Plan(((3, False), (4, True)), (0, 1)))  # (rendezvous twice)
    node = Node.current()
    assert node is not None
    return errors, node.single_copy


def both_ways(plan: Plan) -> Callable[[ac.Communicator], Any]:
    """Both ranks send the plan's messages to each other at once (on the rings: each
    rank's fragments going on its ring while it takes its peer's), and post their recvs
    in the plan's order, each before or after its peer's send as it happens; both check
    theirs."""

    async def main(comm: ac.Communicator) -> None:
        peer = 1 - comm.rank
        bufs = [np.full(SIZES[s] + 64, SENTINEL, np.uint8) for s, _ in plan.msgs]
        sends = [comm.isend(data(SIZES[s], i + 10 * comm.rank), peer, i)
                 for i, (s, first) in enumerate(plan.msgs) if first]
        recvs = [comm.irecv(bufs[i][:SIZES[plan.msgs[i][0]]], peer, i) for i in plan.order]
        sends += [comm.isend(data(SIZES[s], i + 10 * comm.rank), peer, i)
                  for i, (s, first) in enumerate(plan.msgs) if not first]
        await ac.wait_all(sends + recvs)
        for i, (s, _) in enumerate(plan.msgs):
            n = SIZES[s]
            check(np.array_equal(bufs[i][:n], data(n, i + 10 * peer)),
                  f"message {i} corrupted")
            check(not (bufs[i][n:] != SENTINEL).any(), f"message {i}: written past it")

    return main


def sizes_both_ways(loop: str, examples: int, refuse: bool) -> object:
    """``both_ways`` over ``examples`` plans (the ranks draw the same ones), each in a world
    with the C lane's steps or the Python ones, every single copy refused if ``refuse``
    (all rendezvous data on the rings): this rank's first failure."""
    if refuse:
        shm.single_copy = _Refusing(shm.single_copy)  # type: ignore[assignment]
    return _holds(loop, examples, both_ways, Plan(((3, True), (3, False), (2, True)),
                                                  (2, 0, 1)))


def _holds(loop: str, examples: int, program: Callable[[Plan], Callable[[ac.Communicator], Any]],
           first: Plan) -> list[str]:
    """``program(plan)`` runs over ``examples`` plans (``first`` among them; the ranks draw
    the same ones), each in a world with the C lane's steps or the Python ones: this
    rank's first failure, if any."""
    errors: list[str] = []

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(plan=plans(), native=st.sampled_from([None, False]))
    @example(plan=first, native=None)
    def holds(plan: Plan, native: bool | None) -> None:
        if errors:
            return
        try:
            run_rank(bounded(program(plan), 20.0), loop, {**OPTIONS, "native": native})
        except Exception as exc:
            errors.append(f"{plan} (native={native}): {type(exc).__name__}: {exc}")

    holds()
    return errors


async def empty_rendezvous(comm: ac.Communicator) -> int:
    """Rank 0 sends empty messages faster than its credit allows (a pool of 1 KiB: one
    eager message at a time), so that some go rendezvous (an ``RTS`` with nothing to
    offer); rank 1 receives them all.  How many it received."""
    n = 8
    if comm.rank == 0:
        reqs = [comm.isend(np.zeros(0, np.uint8), 1, i) for i in range(n)]
        await comm.send(np.zeros(1), 1, 100)
        await ac.wait_all(reqs)
        return n
    await comm.recv(np.zeros(1), 0, 100)  # every message is announced or here by now
    got = 0
    for i in range(n):
        status = await comm.recv(np.zeros(0, np.uint8), 0, i)
        got += status.nbytes == 0
    return got


def empty_messages_over_rendezvous(loop: str) -> object:
    """``empty_rendezvous`` on this rank (a ``launch`` target)."""
    return run_rank(bounded(empty_rendezvous, 30.0), loop, {**OPTIONS, "pool_bytes": 1024})
