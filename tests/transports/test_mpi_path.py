"""The MPI link's per-message steps in C (``_lane.Path``) do what the Python steps do.

The link and its progress run here on a fake communicator (no MPI).  Random states are
set up twice, alike; ``send_now`` runs on one through the Python steps and on the other
through the C lane's, and everything the steps touch is compared: what was handed to MPI,
the eager credit, the control sends kept for reaping, the peer's doorbell (rung only
while it is armed), the progress task's flags and its parked future, and the control
messages that had landed (an eager one is handed on at once, any other is left for the
task).  Where the lane is not built (or ``ASYNCCOMM_PURE_PYTHON=1``) there is nothing to
compare, and the tests say so by skipping.
"""

from __future__ import annotations

import asyncio
import functools
import mmap
import types
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import numpy as np
import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

import asynccomm as ac
from asynccomm._comm import communicator as _communicator
from asynccomm._comm import native as _native
from asynccomm._core import wire as w
from asynccomm._engine.engine import DeviceEngine
from asynccomm._engine.flight import Tally
from asynccomm._engine.lane import LANE
from asynccomm._engine.stream import StreamStatistics
from asynccomm._exceptions import TransportError
from asynccomm.transports import _mpi_lib
from asynccomm.transports._mpi_progress import CTRL_SLOTS, CTRL_TAG, Slot
from asynccomm.transports._mpi_transport import MPITransport

from ..calls import counted

pytestmark = pytest.mark.skipif(LANE is None or _native.CONFIGURED is None,
                                reason="the C lane is not built here (or switched off)")

POOL = 1 << 16  # each rank's staging cap: a window of 32 KiB per rank at size 2


class FakeMPIError(Exception):
    def Get_error_string(self) -> str:
        return str(self)


class Req:
    def __init__(self, done: bool, fail: bool = False) -> None:
        self.done = done
        self.fail = fail

    def Test(self) -> bool:
        if self.fail:
            raise FakeMPIError("Test failed")
        return self.done

    def Start(self) -> None:
        self.done = False


class Comm:
    """What the link and its progress ask of a communicator: MPI's calls, recorded."""

    def __init__(self, *, completes: bool, fails: str) -> None:
        self.completes = completes
        self.fails = fails  # "", "isend" or "test"
        self.sent: list[tuple[bytes, int, int]] = []

    def Get_rank(self) -> int:
        return 1

    def Get_size(self) -> int:
        return 2

    def Get_attr(self, key: object) -> int:
        return 32767

    def Isend(self, buf: Any, dest: int, tag: int) -> Req:
        if self.fails == "isend":
            raise FakeMPIError("Isend failed")
        self.sent.append((bytes(buf), dest, tag))
        return Req(self.completes, fail=self.fails == "test")

    def Recv_init(self, buf: Any, source: int, tag: int) -> Req:
        return Req(False)


class Bell:
    def __init__(self, armed: bool) -> None:
        self.flag = mmap.mmap(-1, 64)
        self.flag[0] = int(armed)
        self.rings = 0

    def ring(self) -> None:
        self.flag[0] = 0
        self.rings += 1


class Endpoint:
    """A receiving engine as the link's Python steps see it (the C steps hand anything
    but the engine's own class to them), with its fast lane's ``offer_bytes``."""

    rank = 1
    closed = False

    def __init__(self) -> None:
        self.offered: list[tuple[Any, ...]] = []
        self.arrived_: list[tuple[Any, ...]] = []

    def offer_bytes(self, source: int, tag: int, view: memoryview, nbytes: int, count: int,
                    dtype: str) -> bool:
        self.offered.append((source, tag, bytes(view[:nbytes]), count, dtype))
        return True

    def arrived(self, msg: Any) -> None:
        self.arrived_.append((msg.source, msg.tag, msg.nbytes, msg.dtype))


@pytest.fixture(autouse=True)
def fake_mpi(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    mpi = types.SimpleNamespace(
        Exception=FakeMPIError, ANY_SOURCE=-1, TAG_UB=0,
        Request=types.SimpleNamespace(Testsome=lambda reqs: [i for i, r in enumerate(reqs)
                                                             if r.done]))
    monkeypatch.setattr(_mpi_lib, "MPI", mpi)
    yield


def land(slot: Slot, header: bytes, payload: bytes = b"") -> None:
    slot.buf[:len(header) + len(payload)] = header + payload
    slot.req.done = True  # type: ignore[attr-defined]


def world(state: dict[str, Any], native: bool, loop: asyncio.AbstractEventLoop) -> MPITransport:
    link = MPITransport(Comm(completes=state["completes"], fails=state["fails"]),  # type: ignore[arg-type]
                        eager_limit=4096, pools=[POOL, POOL])
    progress = link.progress
    progress._slots.extend(Slot(link.comm) for _ in range(CTRL_SLOTS))
    link.endpoint = Endpoint()  # type: ignore[assignment]
    link.offer_bytes = Endpoint.offer_bytes  # (the world gives the fast lane's step)
    link.wire.credit[0] = state["credit"]
    if state["closed"]:
        link.wire.closed_by[0] = "has closed its communicator"
    if state["broken"]:
        link._broken = TransportError("broken", rank=1)
    progress.bells = None if state["bell"] is None else [Bell(state["bell"]), None]
    progress._ctrl = [Req(False) for _ in range(state["ctrl"])]
    if state["parked"] is not None:
        progress._parked = loop.create_future()
        if state["parked"]:
            progress._parked.set_result(None)
    for kind in state["landed"]:
        slot = progress._slots[len([s for s in progress._slots if s.req.done])]
        if kind == w.EAGER:
            land(slot, w.HEADER.pack(w.EAGER, 3, 0, 9, 16, 2, 0, b"<f8"), bytes(range(16)))
        else:
            land(slot, w.HEADER.pack(w.CREDIT, 0, 0, 0, 640, 0, 0, b""))
    if native:
        link.accelerate(LANE)
    return link


def observe(link: MPITransport, result: object) -> tuple[Any, ...]:
    progress = link.progress
    bells = progress.bells
    bell = None if bells is None else (bells[0].rings, bells[0].flag[0])  # type: ignore[union-attr]
    parked = progress._parked
    endpoint: Endpoint = link.endpoint  # type: ignore[assignment]
    return (result, link.comm.sent, list(link.wire.credit), list(link.wire._owed),
            len(progress._ctrl), bell, progress.sent, progress._woke,
            None if parked is None else parked.done(), endpoint.offered, endpoint.arrived_,
            [s.req.done for s in progress._slots])  # type: ignore[attr-defined]


STATES = st.fixed_dictionaries({
    "completes": st.booleans(),
    "fails": st.sampled_from(["", "", "", "isend", "test"]),
    "credit": st.sampled_from([0, 600, 1 << 15]),
    "closed": st.booleans(),
    "broken": st.sampled_from([False, False, False, True]),
    "bell": st.sampled_from([None, False, True]),
    "ctrl": st.integers(0, CTRL_SLOTS),
    "parked": st.sampled_from([None, False, True]),
    "landed": st.lists(st.sampled_from([w.EAGER, w.CREDIT]), max_size=3),
    "nbytes": st.sampled_from([0, 8, 24, 4096, 4097]),
    "dtype": st.sampled_from(["<f8", "<f8", "<u1", "<c16"]),
})


@settings(max_examples=150, derandomize=True, database=None, deadline=None)
@given(state=STATES)
def test_send_now_does_what_the_python_steps_do(state: dict[str, Any]) -> None:
    dtype = np.dtype(state["dtype"])
    count = state["nbytes"] // dtype.itemsize
    array = np.arange(count, dtype=dtype)
    nbytes = array.nbytes
    seen = []
    loop = asyncio.new_event_loop()
    try:
        for native in (False, True):
            if dtype.str == "<c16":  # one dtype the wire has not met: the Python steps
                w.DTYPE_FIELDS.pop(dtype.str, None)
            else:
                w.encode_dtype(dtype.str)
            link = world(state, native, loop)
            result: object
            try:
                result = link.send_now(0, 5, array, nbytes, count, dtype.str)
            except Exception as exc:
                result = repr(exc)
            seen.append(observe(link, result))
    finally:
        loop.close()
    assert seen[1] == seen[0]


def test_an_armed_doorbell_is_rung_once_and_a_clear_one_never() -> None:
    """The case a byte string's truth got wrong: ``flag[0]`` of an mmap is an int."""
    for armed in (False, True):
        state = {"completes": True, "fails": "", "credit": 1 << 15, "closed": False,
                 "broken": False, "bell": armed, "ctrl": 0, "parked": None, "landed": []}
        loop = asyncio.new_event_loop()
        try:
            link = world(state, True, loop)
            assert link.send_now(0, 5, np.ones(1), 8, 1, "<f8") is True
        finally:
            loop.close()
        bell = link.progress.bells[0]  # type: ignore[index]
        assert (bell.rings, bell.flag[0]) == ((1, 0) if armed else (0, 0))  # type: ignore[union-attr]


def test_the_c_steps_send_through_the_communicator_progress_holds_now() -> None:
    """``testing.fail_next_mpi_call`` swaps the progress task's communicator: the C steps
    look it up at each send, as the Python steps do."""
    state = {"completes": True, "fails": "", "credit": 1 << 15, "closed": False,
             "broken": False, "bell": None, "ctrl": 0, "parked": None, "landed": []}
    loop = asyncio.new_event_loop()
    try:
        link = world(state, True, loop)
        failing = Comm(completes=True, fails="isend")
        link.progress.comm = failing  # type: ignore[assignment]
        assert link.send_now(0, 5, np.ones(1), 8, 1, "<f8") is False  # the usual way next
        assert link.wire.credit[0] == 1 << 15  # refunded
        fine = Comm(completes=True, fails="")
        link.progress.comm = fine  # type: ignore[assignment]
        assert link.send_now(0, 5, np.ones(1), 8, 1, "<f8") is True
        assert len(fine.sent) == 1 and link.comm.sent == []  # type: ignore[attr-defined]
    finally:
        loop.close()


@pytest.mark.native
@pytest.mark.parametrize("ring", [False, True], ids=["mpi-peer", "ring-peer"])
def test_a_peer_the_link_reaches_on_rings_keeps_the_python_steps(ring: bool) -> None:
    """The hybrid link's MPI side in C (``ring_peers``): a send to, or a fetch from, a
    peer of this host goes to the link's Python steps (its rings), one to a peer on
    another host is the C lane's."""
    from asynccomm._core.descriptors import Message

    state = {"completes": True, "fails": "", "credit": 1 << 15, "closed": False,
             "broken": False, "bell": None, "ctrl": 0, "parked": None, "landed": []}
    loop = asyncio.new_event_loop()
    try:
        w.encode_dtype("<f8")
        link = world(state, False, loop)
        link.ring_peers = frozenset({0} if ring else ())
        python: list[str] = []
        link.send_now = lambda *args: python.append("send_now") or True  # type: ignore[method-assign]
        link.send = lambda *args: python.append("send")  # type: ignore[method-assign]
        link.fetch = lambda *args: python.append("fetch")  # type: ignore[method-assign]
        link.accelerate(LANE)
        assert link.send_now(0, 5, np.ones(1), 8, 1, "<f8") is True
        big = np.ones(8192)
        link.send(Message(1, 5, big.nbytes, big.size, "<f8", 0, memoryview(big).cast("B")), 0)
        link.fetch(Message(0, 5, big.nbytes, big.size, "<f8", 0, ident=7), 0,
                   memoryview(bytearray(big.nbytes)), lambda *args: None)
        if ring:
            assert python == ["send_now", "send", "fetch"]
            assert link.comm.sent == []  # type: ignore[attr-defined]
        else:  # (the fetch goes the Python way here too: the endpoint is not an engine)
            assert python == ["fetch"]
            assert len(link.comm.sent) == 2  # the eager message and the RTS  # type: ignore[attr-defined]
    finally:
        loop.close()


@pytest.mark.native
def test_ring_peers_other_than_a_set_are_refused() -> None:
    link = MPITransport(Comm(completes=True, fails=""), eager_limit=4096,  # type: ignore[arg-type]
                        pools=[POOL, POOL])
    link.ring_peers = [0]  # type: ignore[assignment]
    with pytest.raises(TypeError, match="ring_peers"):
        link.accelerate(LANE)


def _open_rank(comm_: Comm, native: bool) -> tuple[MPITransport, Any]:
    """Rank 1 of 2 of an MPI world opened on the fake communicator ``comm_`` with
    ``native=``, its control recvs posted (none landed): its link and communicator."""
    from asynccomm._comm import mpi_runner
    from asynccomm.sim.device import Device

    family = mpi_runner._MPIFamily(comm_, [POOL, POOL], crowded=False, eager_limit=4096,
                                   pool_bytes=POOL, timeout=None, registry=[],
                                   bells=[None, None], lane=_communicator.world_lane(native))
    link, comm = family._open(comm_, [POOL, POOL], Device(1, "mpi:1"))
    link.progress._slots.extend(Slot(comm_) for _ in range(CTRL_SLOTS))
    return link, comm


def _unstarted(mp: pytest.MonkeyPatch, chunk: int | None = None) -> None:
    """The MPI link's progress task is not started (a test hands over what lands), and
    its payloads move in chunks of ``chunk`` bytes, if given."""
    mp.setattr(MPITransport, "start", lambda self, endpoint, loop: setattr(
        self, "endpoint", endpoint))
    if chunk is not None:
        mp.setattr("asynccomm.transports._mpi_transport.CHUNK_BYTES", chunk)
        mp.setattr("asynccomm.transports._mpi_chunks.CHUNK_BYTES", chunk)


def _each_lane(run: Callable[[bool], Coroutine[Any, Any, Any]]) -> dict[bool, Any]:
    """What ``run(native)`` gave on the C lane (True) and on the Python steps (False)."""
    seen = {}
    for native in (True, False):
        with asyncio.Runner() as runner:
            seen[native] = runner.run(run(native))
    return seen


async def _mpi_world(native: bool) -> tuple[Any, ...]:
    """This rank (1 of 2) of an MPI world opened on the fake communicator with
    ``native=``: a recv posted before its message lands, one after, and a send.  What
    every op gave, what was handed to MPI, the eager credit, and the flight record."""
    from asynccomm._buffers import dtype_name

    dtype_name(np.dtype("<f8"), "send")  # (names learnt: the fast lanes take these)
    w.encode_dtype("<f8")
    comm_ = Comm(completes=True, fails="")
    link, comm = _open_rank(comm_, native)
    slots = link.progress._slots
    first, second = np.zeros(2), np.zeros(2)
    req = comm.irecv(first, 0, 9)  # posted: the message lands into it
    land(slots[0], w.HEADER.pack(w.EAGER, 3, 0, 9, 16, 2, 0, b"<f8"),
         np.array([1.5, 2.5]).tobytes())
    land(slots[1], w.HEADER.pack(w.EAGER, 3, 0, 4, 16, 2, 0, b"<f8"),
         np.array([3.5, 4.5]).tobytes())  # no recv for it yet: staged
    link.progress._land()
    status = await comm.recv(second, 0, 4)
    await comm.send(np.arange(3.0), 0, 7)
    engine = comm._engine
    return (link.send_now.__qualname__, link.offer_bytes.__name__, engine.lane.name,
            req.done(), req.status, status, first.tolist(), second.tolist(), comm_.sent,
            list(link.wire.credit), list(link.wire._owed), comm.statistics(),
            [{k: v for k, v in e.items() if k not in ("post", "match", "finish")}
             for e in comm.flight_record()],
            [{peer: (t.n, t.nbytes) for peer, t in tally.items()}
             for tally in (engine.flight.sends, engine.flight.recvs)],
            type(engine.flight.ring), type(engine.flight.recvs[0]))


@pytest.mark.native
def test_an_mpi_world_on_either_lane_does_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """A world opened with ``native=True`` runs the link's per-message steps in C (its
    ``Path``), one with ``native=False`` the Python steps: the same ops give the same."""
    _unstarted(monkeypatch)
    handed: dict[bool, list[int]] = {True: [], False: []}
    arrived = DeviceEngine.arrived
    seen = {}
    for native in (True, False):
        def counted(engine: DeviceEngine, msg: Any, native: bool = native) -> None:
            handed[native].append(msg.tag)
            arrived(engine, msg)

        monkeypatch.setattr(DeviceEngine, "arrived", counted)
        with asyncio.Runner() as runner:
            seen[native] = runner.run(_mpi_world(native))
    c, python = seen[True], seen[False]
    # The message that lands before its recv is posted: staged by the C lane itself (no
    # Python frame), by the engine's ``arrived`` on the Python steps; alike after that.
    assert handed == {True: [], False: [4]}
    assert c[:3] == ("Path.send_now", "offer_bytes", "C")
    assert python[:3] == ("MPITransport.send_now", "offer_bytes", "python")
    assert c[-2:] == (LANE.Ring, LANE.Tally)
    assert python[-2:] == (deque, Tally)
    assert c[3:-2] == python[3:-2]
    assert c[3:8] == (True, (0, 9, 16, 2, (2,)), (0, 4, 16, 2, (2,)), [1.5, 2.5], [3.5, 4.5])


async def _await(req: Any) -> None:
    await req


async def _landings(native: bool, rounds: tuple[int, ...]) -> list[list[int]]:
    """This rank (1 of 2) on the fake communicator: for each of ``rounds``, that many
    eager messages land, each into a recv a task waits for, then the progress task's
    ``_land`` runs until every recv is done: how many each ``_land`` completed, by round.
    Every slot is posted again by the next ``_land``."""
    from asynccomm._buffers import dtype_name

    dtype_name(np.dtype("<f8"), "send")
    w.encode_dtype("<f8")
    link, comm = _open_rank(Comm(completes=True, fails=""), native)
    progress = link.progress
    seen = []
    tag = 0
    for n in rounds:
        progress._land()  # none: a slot handed on at the end of a turn is posted again
        bufs = [np.zeros(2) for _ in range(n)]
        reqs = [comm.irecv(b, 0, tag + i) for i, b in enumerate(bufs)]
        waiting = [asyncio.ensure_future(_await(r)) for r in reqs]
        await asyncio.sleep(0)  # each task waits for its recv
        for i in range(n):
            land(progress._slots[len([s for s in progress._slots if s.req.done])],
                 w.HEADER.pack(w.EAGER, 3, 0, tag + i, 16, 2, 0, b"<f8"),
                 np.array([tag + i, 0.5]).tobytes())
        seen.append([])
        for _ in range(n + 1):  # (bounded: a land that hands on nothing fails the test)
            if all(r.done() for r in reqs):
                break
            before = sum(r.done() for r in reqs)
            progress._land()
            seen[-1].append(sum(r.done() for r in reqs) - before)
        assert all(r.done() for r in reqs), seen
        await asyncio.gather(*waiting)
        assert [b[0] for b in bufs] == [tag + i for i in range(n)]
        tag += n
    progress._land()  # (none left: a slot handed on at the end of a turn is posted again)
    assert not any(s.req.done for s in progress._slots)
    return seen


@pytest.mark.native
def test_a_landing_that_woke_a_task_ends_the_turn_unless_in_a_burst(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The C lane's ``land`` ends its turn at the first message that woke a task, its slot
    posted again at the next poll, so the task runs two MPI calls sooner; the next
    ``land``, if more landed meanwhile (a burst), hands on every one.  The Python steps
    hand on every message at once; each message reaches its recv on both lanes."""
    _unstarted(monkeypatch)
    seen = _each_lane(functools.partial(_landings, rounds=(1, 3, 2, 1)))
    assert seen[False] == [[1], [3], [2], [1]]
    # the first of a burst alone, then the rest
    assert seen[True] == [[1], [1, 2], [1, 1], [1]]


# -- the rendezvous steps ---------------------------------------------------------------------


class DataComm(Comm):
    """``Comm`` with data recvs: each is recorded, and its request completes (its buffer
    filled) when the test says so; ``fails`` may also be ``"irecv"``."""

    def __init__(self, *, fails: str = "", at_once: bool = False) -> None:
        super().__init__(completes=True, fails="")
        self.data_fails = fails
        self.at_once = at_once  # data requests complete at their first Test (MPICH's copy)
        self.recvs: list[tuple[memoryview, Req]] = []

    def Irecv(self, buf: Any, source: int, tag: int) -> Req:
        if self.data_fails == "irecv":
            raise FakeMPIError("Irecv failed")
        self.sent.append((b"irecv %d" % len(buf), source, tag))
        req = Req(self.at_once)
        if self.at_once:
            buf[:] = np.arange(len(buf) // 8, dtype="<f8").tobytes()
        self.recvs.append((buf, req))
        return req

    def Isend(self, buf: Any, dest: int, tag: int) -> Req:
        if self.data_fails == "cts" and tag == 0 and bytes(buf)[0] == w.CTS:
            raise FakeMPIError("Isend failed")
        self.sent.append((bytes(buf), dest, tag))
        return Req(tag == 0 or self.at_once)  # a data send: when the test says so


BIG = 8192  # above the eager limit of 4096: a rendezvous message


EARLY_TAG = 20000  # the data tag the peer's early RTS names (its half of the tag space)


async def _rendezvous(native: bool, order: str, fails: str,
                      early: bool = False, at_once: bool = False) -> tuple[Any, ...]:
    """This rank (1 of 2) of an MPI world on the fake communicator: a rendezvous recv (its
    ``RTS`` landing before or after the recv is posted, as ``order`` says) and a
    rendezvous send (answered by a ``CTS``, or first cancelled: ``order`` ``"withdrawn"``
    has its receiver answer ``WITHDRAWN``, ``"lost"`` answer ``CTS`` all the same).  What
    every op gave, what was handed to MPI, the wire's and the link's state, and the flight
    record.  ``early``: both messages' data sends go with their ``RTS`` (the link's
    ``early_min`` lowered by the caller); ``at_once``: MPI finishes each data request
    at its first ``Test`` (the state as the ``RTS`` has landed is kept too)."""
    w.encode_dtype("<f8")
    comm_ = DataComm(fails=fails, at_once=at_once)
    link, comm = _open_rank(comm_, native)
    progress = link.progress
    slots = progress._slots
    got = np.zeros(BIG // 8)
    rts = w.HEADER.pack(w.RTS, 3, 0, 9, BIG, BIG // 8, 5, b"<f8")
    if early:
        rts = rts[:w.DATA_TAG_AT] + EARLY_TAG.to_bytes(4, "little")
    if order == "rts first":  # unexpected: it waits as an announcement
        land(slots[0], rts)
        progress._land()
        req = comm.irecv(got, 0, 9)
    else:  # a recv posted for it: taken as it lands (a wildcard's too)
        req = comm.irecv(got, ac.ANY_SOURCE if order == "wildcard" else 0, 9)
        land(slots[0], rts)
        progress._land()
    if fails:  # the link broke: the recv failed, nothing more moves
        await asyncio.sleep(0)
        return (link.fetch.__qualname__, progress._test_requests.__qualname__,
                req.done() and repr(req.exception()), comm_.sent, progress._data,
                len(progress._reqs), set(link.wire.unmatched), sorted(link._announced),
                repr(link.broken))
    landed = (req.done(), progress._data, len(progress._reqs))
    for buf, data in comm_.recvs:
        buf[:] = np.arange(BIG // 8, dtype="<f8").tobytes()
        data.done = True
    progress._test_requests()
    send = comm.isend(np.arange(BIG // 8, dtype="<f8"), 0, 7)
    ident = link.wire._next_ident
    if order in ("withdrawn", "lost"):
        assert comm._engine.withdraw(send, None)  # asked of the receiver
        answer = w.WITHDRAWN if order == "withdrawn" else w.CTS
        land(slots[0], w.HEADER.pack(answer, 0, 0, 3, 0, 0, ident, b""))
    else:  # (the head slot: the one that landed first went to the back)
        land(slots[0], w.HEADER.pack(w.CTS, 0, 0, 3, 0, 0, ident, b""))
    progress._land()
    state = (progress._data, len(progress._reqs), dict(link.wire.announced),
             dict(link.wire.withdrawing), set(link.wire.unmatched), sorted(link._sends),
             sorted(link._announced), dict(link.wire.early), set(link.wire.early_tags),
             dict(link.wire.early_in), sorted(link._early), send.done(), landed)
    for r in list(progress._reqs):
        r.done = True
    progress._test_requests()
    await asyncio.sleep(0)
    outcome = [(r.done(), r.cancelled(),
                None if not r.done() or r.cancelled() else repr(r.exception()))
               for r in (req, send)]
    return (link.fetch.__qualname__, progress._test_requests.__qualname__, outcome,
            req.status if req.done() and req.exception() is None else None, got.sum(),
            comm_.sent, state, progress._data, len(progress._reqs), repr(link.broken),
            comm.statistics(),
            [{k: v for k, v in e.items() if k not in ("post", "match", "finish")}
             for e in comm.flight_record()])


@pytest.mark.native
@pytest.mark.parametrize("early", [False, True], ids=["cts-first", "early"])
@pytest.mark.parametrize(("order", "fails"), [
    *((order, "") for order in ("rts first", "recv first", "wildcard", "withdrawn", "lost")),
    *((order, fails) for order in ("rts first", "recv first") for fails in ("irecv", "cts"))])
def test_the_rendezvous_steps_in_c_do_what_the_python_steps_do(
        monkeypatch: pytest.MonkeyPatch, order: str, fails: str, early: bool) -> None:
    """An ``RTS`` landing, its match and ``fetch`` (the data recv and the ``CTS``), a
    ``CTS`` landing and the data send, and each transfer's completion, run by ``Path``
    and by the Python steps from the same start, give the same; so do a send withdrawn
    before its ``CTS`` (the C steps hand the answer to the Python steps), and an MPI
    error while fetching (the link breaks, the recv fails).  Alike where the data sends
    go with their ``RTS`` (``early``)."""
    _unstarted(monkeypatch)
    if early:
        monkeypatch.setattr(MPITransport, "early_min", 4096)  # (the eager limit here)
    seen = _each_lane(lambda native: _rendezvous(native, order, fails, early))
    c, python = seen[True], seen[False]
    assert c[:2] == ("Path.fetch", "Path.test")
    assert python[:2] == ("MPITransport.fetch", "Progress._test_requests")
    assert c[2:] == python[2:]
    if not fails:
        assert c[2][0] == (True, False, "None") and c[4] == np.arange(BIG // 8).sum()
        assert c[2][1] == ((True, True, None) if order == "withdrawn"
                           else (True, False, "None"))
        assert c[7:9] == (0, 0)  # nothing left in flight
        data = [(len(raw), tag) for raw, _, tag in c[5]
                if tag and not raw.startswith(b"irecv")]
        recvs = [(raw, tag) for raw, _, tag in c[5] if raw.startswith(b"irecv")]
        state = c[6]
        if early:  # the data send went with the RTS, on a tag of this rank's half
            assert len(data) == 1 and data[0][0] == BIG and data[0][1] > 32767 // 2
            assert recvs == [(b"irecv %d" % BIG, EARLY_TAG)]  # on the tag the RTS named
            # answered: its tag is free again, and its data send is tracked, not kept
            assert state[7:11] == ({}, set(), {}, [])
        else:
            assert len(data) == (0 if order == "withdrawn" else 1)
            assert recvs[0][1] <= 32767 // 2  # the receiver's half
        # (an early send waits for its data send to finish, or for the receiver's drain)
        assert state[11] == (order == "withdrawn" and not early)
    else:
        assert "TransportError" in c[-1]
        assert "TransportError" in c[2]  # the recv failed (``rts first``: in ``fetch``)


@pytest.mark.native
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("early", [False, True], ids=["cts-first", "early"])
@pytest.mark.parametrize("order", ["recv first", "wildcard"])
def test_an_announcement_meets_its_posted_recv_in_c_wildcard_or_exact(
        monkeypatch: pytest.MonkeyPatch, order: str, early: bool, loop: str) -> None:
    """An ``RTS`` whose recv is posted, exact or naming ``ANY_SOURCE``, is matched by the C
    steps as it lands (the engine's ``arrived`` never sees it) and fetched into the recv,
    as the Python steps do it.  (A wildcard recv's took the Python steps, which cost a
    message and its answer 2.7 times as long at 8 B on MPI.)"""
    _unstarted(monkeypatch)
    if early:
        monkeypatch.setattr(MPITransport, "early_min", 4096)
    handed = counted(monkeypatch, DeviceEngine, "arrived", lambda msg: msg.tag)
    seen = {}
    for native in (True, True, False):  # (once first: a dtype's first message takes the
        handed.clear()                  # Python steps)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop"
                            else asyncio.new_event_loop) as runner:
            seen[native] = (runner.run(_rendezvous(native, order, "", early)), list(handed))
    (c, c_handed), (python, python_handed) = seen[True], seen[False]
    assert c[2:] == python[2:] and c[2][0] == (True, False, "None")
    assert c[3][:2] == (0, 9)  # (the message's own source and tag)
    assert 9 not in c_handed and 9 in python_handed


@pytest.mark.native
@pytest.mark.parametrize("early", [False, True], ids=["cts-first", "early"])
@pytest.mark.parametrize("order", ["rts first", "recv first", "withdrawn", "lost"])
def test_data_requests_that_complete_at_once_are_acted_on_where_they_are_posted(
        monkeypatch: pytest.MonkeyPatch, order: str, early: bool) -> None:
    """A data recv that MPI finishes at its first ``Test`` (MPICH copies a transfer it has
    seen announced in the first poll) completes its recv in the call that posted it, and
    a send whose early data send finished before its ``CTS`` landed completes as the
    ``CTS`` lands: neither is tracked for the task's next poll.  Alike on both lanes."""
    _unstarted(monkeypatch)
    if early:
        monkeypatch.setattr(MPITransport, "early_min", 4096)
    seen = _each_lane(lambda native: _rendezvous(native, order, "", early, at_once=True))
    c, python = seen[True], seen[False]
    assert c[:2] == ("Path.fetch", "Path.test")
    assert c[2:] == python[2:]
    assert c[2][0] == (True, False, "None") and c[4] == np.arange(BIG // 8).sum()
    state = c[6]
    if order in ("rts first", "recv first"):
        assert state[12] == (True, 0, 0)  # the recv completed as its RTS landed
    if early and order != "withdrawn":  # its data send had finished: done as answered
        assert state[0:2] == (0, 0) and state[11]
    assert c[7:9] == (0, 0)


@pytest.mark.native
@pytest.mark.parametrize("early", [False, True], ids=["cts-first", "early"])
@pytest.mark.parametrize("order", ["rts first", "recv first"])
@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_a_matched_announcement_sends_its_cts_before_posting_the_data_recv(
        monkeypatch: pytest.MonkeyPatch, native: bool, order: str, early: bool) -> None:
    """The ``CTS`` leaves first and the data recv is posted while it travels (the sender's
    data comes only once the ``CTS`` has landed there): the sender starts its data one
    MPI call sooner.  Alike on both lanes, and however the match came about, and for an
    early announcement too (MPICH copies a payload whose transfer it has seen already
    inside the ``Irecv`` call: the ``CTS`` would wait for the copy); this rank's own early
    send posts its data right behind its ``RTS``."""
    _unstarted(monkeypatch)
    if early:
        monkeypatch.setattr(MPITransport, "early_min", 4096)
    with asyncio.Runner() as runner:
        sent = runner.run(_rendezvous(native, order, "", early))[5]
    steps = [("cts" if raw[0] == w.CTS else "rts" if raw[0] == w.RTS else "control")
             if tag == CTRL_TAG else "irecv" if raw.startswith(b"irecv") else "data"
             for raw, _, tag in sent]
    assert steps == ["cts", "irecv", "rts", "data"]


async def _posted_send(native: bool, timeout: float | None, own: float | None = None,
                       on_stream: bool = False) -> tuple[Any, ...]:
    """This rank (1 of 2) on the fake communicator awaits a rendezvous ``send`` (its
    communicator's default timeout ``timeout``; its own ``own``; on a stream of its own
    with ``on_stream``): the request as posted, before its ``CTS``; then, once answered
    and its data sent, what the send gave and what remains."""
    from asynccomm._buffers import dtype_name

    dtype_name(np.dtype("<f8"), "send")
    w.encode_dtype("<f8")
    comm_ = DataComm()
    link, comm = _open_rank(comm_, native)
    comm._default_timeout = timeout
    engine, progress = comm._engine, link.progress
    data = np.arange(BIG // 8, dtype="<f8")
    stream = comm.stream() if on_stream else None
    task = asyncio.ensure_future(comm.send(data, 0, 7, stream=stream, timeout=own))
    await asyncio.sleep(0)
    held = stream or engine.default_stream
    (req,) = held._pending.values()
    posted = (task.done(), req._state.name, req.t_post >= 0, req._tracked, req.sseq,
              req.source, req.peer, req.tag, req.nbytes, req.count, req.dtype,
              req.view.format, bytes(req.view) == data.tobytes(), req.array is data,
              engine._n_pending, req._timer is not None, req.stream is held, req.timeout,
              held.statistics(), list(comm_.sent))
    land(progress._slots[0], w.HEADER.pack(w.CTS, 0, 0, 3, 0, 0, link.wire._next_ident, b""))
    progress._land()
    for r in list(progress._reqs):
        r.done = True
    progress._test_requests()
    outcome = await asyncio.wait_for(task, 5)
    return posted, (outcome, req._state.name, req._exc, req._tracked, engine._n_pending,
                    dict(held._pending), held.statistics(), comm_.sent[len(posted[-1]):],
                    comm.statistics(),
                    [{k: v for k, v in e.items() if k not in ("post", "match", "finish")}
                     for e in comm.flight_record()])


def _on_both_lanes(monkeypatch: pytest.MonkeyPatch, run: Callable[[bool], Any]
                   ) -> tuple[dict[bool, Any], dict[bool, int]]:
    """``run(native)`` (a coroutine function) on the C lane and on the Python steps, the
    link not started: what each gave, and how many sends of ``BIG`` bytes the Python
    ``_send_op`` posted on each."""
    _unstarted(monkeypatch)
    python_steps = []
    send_op = ac.Communicator._send_op
    monkeypatch.setattr(ac.Communicator, "_send_op", lambda self, *args: (
        python_steps.append(args[0].nbytes), send_op(self, *args))[1])
    seen, took = {}, {}
    for native in (True, False):
        with asyncio.Runner() as runner:
            seen[native] = runner.run(run(native))
        took[native] = python_steps.count(BIG)
        python_steps.clear()
    return seen, took


@pytest.mark.native
@pytest.mark.parametrize(("timeout", "own", "on_stream"),
                         [(None, None, False), (60.0, None, False), (None, 30.0, False),
                          (None, None, True), (60.0, 30, True)])
def test_a_send_the_link_announces_is_posted_by_the_c_lane_as_by_the_python_steps(
        monkeypatch: pytest.MonkeyPatch, timeout: float | None, own: float | None,
        on_stream: bool) -> None:
    """A ``send`` too large to go eagerly to another process is posted by the C lane
    (the request POSTED with its bytes' view, handed to the link, tracked on its stream:
    the default one, or an idle one of the user's; its timer armed where it has a
    timeout, its own or the communicator's default) as the Python steps post it;
    ``send`` waits for it to finish, and it finishes alike."""
    seen, took = _on_both_lanes(monkeypatch, functools.partial(
        _posted_send, timeout=timeout, own=own, on_stream=on_stream))
    assert took == {True: 0, False: 1}
    assert seen[True] == seen[False]
    posted, done = seen[True]
    timed = own if own is not None else timeout
    assert posted[:5] == (False, "POSTED", True, True, 1)
    assert posted[11:18] == ("B", True, True, 1, timed is not None, True, timed)
    assert posted[18] == StreamStatistics(queued=0, active=1, submitted=1)
    assert [raw[0] for raw, _, tag in posted[-1]] == [w.RTS]
    assert done[:7] == (None, "DONE", None, False, 0, {}, StreamStatistics(0, 0, 1))


async def _refused_send(native: bool) -> tuple[Any, ...]:
    """This rank (1 of 2) on the fake communicator awaits a rendezvous ``send`` to rank
    0, whose communicator has closed: what the send raised, the request's end, what is
    tracked and what was handed to MPI."""
    from asynccomm._buffers import dtype_name

    dtype_name(np.dtype("<f8"), "send")
    w.encode_dtype("<f8")
    comm_ = DataComm()
    link, comm = _open_rank(comm_, native)
    link.wire.closed_by[0] = "has closed its communicator"
    engine = comm._engine
    posted = []
    link_send = link.send  # (the C lane's, where it is on)
    link.send = lambda msg, dest: (posted.append(msg), link_send(msg, dest))[1]
    with pytest.raises(ac.AsyncCommError) as info:
        await asyncio.wait_for(comm.send(np.arange(BIG // 8, dtype="<f8"), 0, 7), 5)
    (req,) = posted
    return (type(info.value), str(info.value), req._state.name, req.t_post >= 0,
            req._tracked, hasattr(req, "sseq"), engine._n_pending,
            dict(engine.default_stream._pending),
            engine.default_stream._seq, list(comm_.sent), comm.statistics())


@pytest.mark.native
def test_a_send_the_link_fails_as_it_is_posted_is_never_tracked_on_either_lane(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rendezvous send to a rank whose communicator has closed is posted (by the C lane
    where it takes it), and the link's ``send`` fails it at once: ``send`` raises, and
    the request, DONE as it was posted, never joins its stream's pending ops, alike on
    both lanes."""
    seen, took = _on_both_lanes(monkeypatch, _refused_send)
    assert took == {True: 0, False: 1}  # (the C lane posted it)
    assert seen[True] == seen[False]
    assert seen[True][2:9] == ("DONE", True, False, False, 0, {}, 0)
    assert seen[True][9] == []


async def _announce_one(native: bool, held: bool) -> list[tuple[int, int, int]]:
    """This rank (1 of 2) on the fake communicator posts one rendezvous send of ``BIG``
    bytes (``held``: while every early data tag is held by an unanswered message): what it
    handed to MPI, as (kind or data, data tag named, MPI tag)."""
    w.encode_dtype("<f8")
    comm_ = DataComm()
    link, comm = _open_rank(comm_, native)
    if held:
        ub = link.wire.data_tag_ub
        link.wire.early_tags.update(range(ub // 2 + 1, ub + 1))
    comm.isend(np.arange(BIG // 8, dtype="<f8"), 0, 7)
    await asyncio.sleep(0)
    return [(raw[0] if tag == CTRL_TAG else -1, w.data_tag_of(raw) if tag == CTRL_TAG else 0,
             tag) for raw, _, tag in comm_.sent]


@pytest.mark.native
@pytest.mark.parametrize(("early_max", "chunk", "held", "early"), [
    (BIG, BIG, False, True), (BIG - 1, BIG, False, False), (BIG, BIG - 8, False, False),
    (BIG, BIG, True, False)],
    ids=["within", "above-the-limit", "chunked", "every-tag-held"])
def test_only_a_payload_within_the_early_limit_and_one_chunk_is_sent_early(
        monkeypatch: pytest.MonkeyPatch, early_max: int, chunk: int, held: bool,
        early: bool) -> None:
    """A rendezvous send posts its data right behind its ``RTS`` (which names the data
    tag, one of the sender's half) only when it is within ``early_max``, moves in one
    data send and a data tag is free (else it is announced as any other: never refused);
    alike on both lanes."""
    _unstarted(monkeypatch, chunk)
    monkeypatch.setattr(MPITransport, "early_min", 4096)
    monkeypatch.setattr(MPITransport, "early_max", early_max)
    seen = _each_lane(lambda native: _announce_one(native, held))
    assert seen[True] == seen[False]
    sent = seen[True]
    if early:
        ((kind, named, _), (data, _, tag)) = sent
        assert (kind, data) == (w.RTS, -1) and named == tag > 32767 // 2
    else:
        assert sent == [(w.RTS, 0, CTRL_TAG)]


class AnnouncingComm(DataComm):
    """``DataComm`` that notes, as each ``Isend`` is called, the messages the wire of
    ``link`` (set once the world is open) has recorded as announced; ``fails``: ``"rts"``
    an ``RTS``'s, ``"data"`` a data send's raises MPI's error."""

    def __init__(self, fails: str) -> None:
        super().__init__()
        self.send_fails = fails
        self.link: MPITransport | None = None
        self.announced_then: list[dict[int, int] | None] = []

    def Isend(self, buf: Any, dest: int, tag: int) -> Req:
        link = self.link
        self.announced_then.append(None if link is None else dict(link.wire.announced))
        if (self.send_fails == "rts" and tag == CTRL_TAG and bytes(buf)[0] == w.RTS) or (
                self.send_fails == "data" and tag != CTRL_TAG):
            raise FakeMPIError("Isend failed")
        return super().Isend(buf, dest, tag)


async def _announced_send(native: bool, fails: str) -> tuple[Any, ...]:
    """This rank (1 of 2) on the fake communicator posts one rendezvous send (its data
    sent behind its ``RTS`` if the link's limits say so), MPI failing as ``fails`` says:
    the send's end, the wire's and the link's records, whether the link broke, what was
    handed to MPI; and the announcements recorded as each ``Isend`` was called."""
    w.encode_dtype("<f8")
    comm_ = AnnouncingComm(fails)
    link, comm = _open_rank(comm_, native)
    comm_.link = link
    req = comm.isend(np.arange(BIG // 8, dtype="<f8"), 0, 7)
    await asyncio.sleep(0)
    return ((req.done(), req.done() and repr(req.exception())), dict(link.wire.announced),
            dict(link.wire.early), set(link.wire.early_tags), sorted(link._sends),
            sorted(link._early), repr(link.broken),
            [(raw[0] if tag == CTRL_TAG else -1, tag) for raw, _, tag in comm_.sent]
            ), comm_.announced_then


@pytest.mark.native
@pytest.mark.parametrize(("fails", "early"), [
    ("", False), ("", True), ("rts", False), ("rts", True), ("data", True)],
    ids=["cts-first", "early", "rts-fails", "early-rts-fails", "data-fails"])
def test_a_send_is_recorded_as_announced_once_its_rts_and_early_data_are_with_mpi(
        monkeypatch: pytest.MonkeyPatch, fails: str, early: bool) -> None:
    """The C lane hands a rendezvous send's ``RTS`` to MPI, and an early one's data send
    right behind it, before it records the message as announced (nothing can answer it
    meanwhile: fewer steps before the receiver hears of it); the Python steps record it
    first.  Either way the end is the same: recorded once both are with MPI; never, if
    MPI fails to send the ``RTS`` (the send fails); and if the data send fails, recorded,
    then the link breaks (the send fails)."""
    _unstarted(monkeypatch)
    monkeypatch.setattr(MPITransport, "early_min", 4096)
    if not early:
        monkeypatch.setattr(MPITransport, "early_max", 4096)  # (none is early)
    seen = _each_lane(lambda native: _announced_send(native, fails))
    (c, c_then), (python, python_then) = seen[True], seen[False]
    assert c == python
    ident = 1
    sends = [(w.RTS, CTRL_TAG), (-1, c[2].get(ident, -2))] if early else [(w.RTS, CTRL_TAG)]
    if fails == "rts":
        assert c[0][0] and "TransportError" in c[0][1]
        assert c[1:6] == ({}, {}, set(), [], []) and c[6] == "None" and c[7] == []
    elif fails == "data":
        assert c[0][0] and "TransportError" in c[0][1] and "TransportError" in c[6]
        assert c[4:6] == ([], [])  # (the link let go of it)
        assert c[7] == [(w.RTS, CTRL_TAG)]
    else:
        assert c[0] == (False, False) and c[1] == {ident: 0} and c[4] == [ident]
        assert c[5] == ([ident] if early else []) and c[7] == sends
    calls = len(sends) if fails != "rts" else 1
    assert c_then == [{}] * calls  # handed to MPI before it was recorded
    assert python_then == [{ident: 0}] * calls


async def _early_data_refused(native: bool) -> tuple[str, str, int, list[Any]]:
    """This rank (1 of 2) on the fake communicator posts a rendezvous send sent early,
    whose data send MPI fails to post: how the send ended after a few turns of the loop,
    the link's failure, the ops left pending, and what was handed to MPI."""
    w.encode_dtype("<f8")
    comm_ = AnnouncingComm("data")
    link, comm = _open_rank(comm_, native)
    req = comm.isend(np.arange(BIG // 8, dtype="<f8"), 0, 7)
    for _ in range(3):
        await asyncio.sleep(0)
    ended = "pending" if not req.done() else repr(req.exception())
    return ended, repr(link.broken), comm._engine.pending_ops, comm_.sent


@pytest.mark.native
@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
async def test_a_send_whose_early_data_send_mpi_refuses_fails_with_the_link(
        monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """MPI fails to post an early message's data send (its ``RTS`` has gone: the
    receiver would wait for the data): the link breaks, and the send fails with its
    ``TransportError``, not left pending forever."""
    _unstarted(monkeypatch)
    monkeypatch.setattr(MPITransport, "early_min", 4096)
    ended, broken, pending, sent = await _early_data_refused(native)
    assert ended.startswith("TransportError") and "Isend failed" in ended
    assert "TransportError" in broken and pending == 0
    assert [raw[0] for raw, _, tag in sent] == [w.RTS]


async def _broken_while_moving(native: bool, how: str) -> str:
    """This rank (1 of 2) on the fake communicator receives a rendezvous message whose
    ``RTS`` landed first, by ``recv`` (posted at once, on the fast lane) or ``irecv`` (on
    its stream); the link breaks while its data moves.  What the recv gave."""
    w.encode_dtype("<f8")
    comm_ = DataComm()
    link, comm = _open_rank(comm_, native)
    progress = link.progress
    land(progress._slots[0], w.HEADER.pack(w.RTS, 3, 0, 9, BIG, BIG // 8, 5, b"<f8"))
    progress._land()
    got = np.zeros(BIG // 8)
    if how == "recv":
        waiting: asyncio.Future[Any] = asyncio.ensure_future(comm.recv(got, 0, 9))
    else:
        req = comm.irecv(got, 0, 9)

        async def wait() -> Any:
            return await req

        waiting = asyncio.ensure_future(wait())
    for _ in range(3):
        await asyncio.sleep(0)  # one turn each: the recv is posted, its data recv too
    assert len(comm_.recvs) == 1  # the data is moving
    link._break(TransportError("the network went away"))
    # (Not cancelled on time out: a matched recv waits for its data, which never comes.)
    await asyncio.wait([waiting], timeout=5)
    if not waiting.done():
        return "hung"
    exc = waiting.exception()
    return f"failed: {exc}" if isinstance(exc, TransportError) else f"gave {exc!r}"


@pytest.mark.native
@pytest.mark.parametrize("how", ["recv", "irecv"])
@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_a_recv_whose_data_is_moving_fails_when_the_link_breaks(
        monkeypatch: pytest.MonkeyPatch, native: bool, how: str) -> None:
    """A rendezvous recv that matched a message already announced is pending until its
    data lands: when the link breaks meanwhile it fails (it used to wait for ever when it
    was taken as it was posted)."""
    _unstarted(monkeypatch)
    loop = asyncio.new_event_loop()  # (not a Runner: it would wait for a hung recv)
    try:
        got = loop.run_until_complete(_broken_while_moving(native, how))
    finally:
        loop.close()
    assert got.startswith("failed: ") and "the network went away" in got, got


# -- the send's completion and payloads of several chunks --------------------------------------


CHUNK = 4800  # the chunk size these tests move payloads in (over the eager limit of 4096)


class ChunkComm(DataComm):
    """``DataComm`` whose ``fail_at``-th data request (a data recv or a data send, counted
    from 1) fails instead of being posted, and whose ``RTS`` sends fail as ``rts`` says:
    ``"isend"`` (not posted) or ``"test"`` (posted, then its ``Test`` fails)."""

    def __init__(self, fail_at: int, rts: str) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.rts = rts
        self.posted = 0

    def _next(self) -> None:
        self.posted += 1
        if self.posted == self.fail_at:
            raise FakeMPIError(f"data request {self.posted} failed")

    def Irecv(self, buf: Any, source: int, tag: int) -> Req:
        self._next()
        return super().Irecv(buf, source, tag)

    def Isend(self, buf: Any, dest: int, tag: int) -> Req:
        if tag:
            self._next()
        elif self.rts and bytes(buf)[0] == w.RTS:
            if self.rts == "isend":
                raise FakeMPIError("Isend failed")
            super().Isend(buf, dest, tag)
            return Req(True, fail=True)
        return super().Isend(buf, dest, tag)


def _as_the_task(progress: Any, step: str) -> None:
    """Run one of the progress task's steps as the task does: an error fails the link."""
    try:
        getattr(progress, step)()
    except Exception as exc:
        progress._failed(exc)


def _complete(progress: Any, comm_: ChunkComm, expected: np.ndarray, picks: list[int],
              until: Any) -> list[int]:
    """Complete the data requests in flight one at a time, the ``picks`` choosing which
    (then the oldest), filling each data recv with its chunk of ``expected``, until
    ``until()``; what was in flight before each completion."""
    seen = []
    recvs = {id(req): (buf, i) for i, (buf, req) in enumerate(comm_.recvs)}
    for step in range(64):
        if until():
            break
        reqs = [r for r in progress._reqs if not r.done]
        seen.append(len(reqs))
        if not reqs:
            break
        req = reqs[picks[step] % len(reqs) if step < len(picks) else 0]
        recvs.update({id(r): (b, i) for i, (b, r) in enumerate(comm_.recvs)})
        if id(req) in recvs:
            buf, i = recvs[id(req)]
            raw = expected.tobytes()[i * CHUNK:i * CHUNK + len(buf)]
            buf[:len(raw)] = raw
        req.done = True
        _as_the_task(progress, "_test_requests")
    return seen


async def _chunked(native: bool, plan: dict[str, Any]) -> tuple[Any, ...]:
    """This rank (1 of 2) on the fake communicator, payloads moving in chunks of ``CHUNK``:
    a rendezvous recv (its ``RTS`` before or after the recv is posted) and a rendezvous
    send answered by a ``CTS`` (a withdrawal tried while its data moves, if the plan says
    so), a task waiting for it, their data requests completing in the order the plan
    picks, one of them failing if it says so.  Everything observable: what was handed to
    MPI, the requests in flight at each step, the ops' outcomes and statuses, the wire's
    and the link's state, the flight record."""
    w.encode_dtype("<f8")
    comm_ = ChunkComm(plan["fail_at"], plan["rts"])
    link, comm = _open_rank(comm_, native)
    progress = link.progress
    slots = progress._slots
    n = plan["count"]
    expected = np.arange(n, dtype="<f8") + 0.5
    got = np.zeros(n + 3)  # a larger buffer: nothing written past the message
    rts = w.HEADER.pack(w.RTS, 3, 0, 9, n * 8, n, 5, b"<f8")
    if plan["rts_first"]:
        land(slots[0], rts)
        _as_the_task(progress, "_land")
        req = comm.irecv(got, 0, 9)
    else:
        req = comm.irecv(got, 0, 9)
        land(slots[0], rts)
        _as_the_task(progress, "_land")
    await asyncio.sleep(0)
    recv_steps = _complete(progress, comm_, expected, plan["picks"],
                           lambda: req.done() or link.broken is not None)
    send = comm.isend(expected, 0, 7, timeout=plan["timeout"])

    async def wait() -> Any:
        return await send

    waiting = asyncio.ensure_future(wait())  # a task waits for the send to complete
    await asyncio.sleep(0)
    ident = link.wire._next_ident
    if link.broken is None and not send.done():  # (its RTS sent: the receiver answers)
        land(slots[0], w.HEADER.pack(w.CTS, 0, 0, 3, 0, 0, ident, b""))
        _as_the_task(progress, "_land")
    withdrew = (comm._engine.withdraw(send, None) if plan["withdraw"] and not send.done()
                else None)
    send_steps = _complete(progress, comm_, expected, plan["picks"][::-1],
                           lambda: send.done() or link.broken is not None)
    await asyncio.wait([waiting], timeout=5)
    outcome = [(r.done(), r.cancelled(),
                None if not r.done() or r.cancelled() else repr(r.exception()))
               for r in (req, send, waiting)]
    return ((link.fetch.__qualname__, link.send.__qualname__),
            progress._test_requests.__qualname__, outcome,
            req.status if req.done() and not req.cancelled() and req.exception() is None
            else None, got.tolist(), comm_.sent, recv_steps, send_steps,
            (withdrew, send._timer, send._tracked, comm._engine.pending_ops),
            progress._data, len(progress._reqs), dict(link.wire.announced),
            set(link.wire.unmatched), sorted(link._sends), sorted(link._announced),
            repr(link.broken), comm.statistics(),
            [{k: v for k, v in e.items() if k not in ("post", "match", "finish")}
             for e in comm.flight_record()])


CHUNK_PLANS = st.fixed_dictionaries({
    # one chunk; two exactly; three, the last short; five, more than the window
    "count": st.sampled_from([550, 2 * CHUNK // 8, 2 * CHUNK // 8 + 1, 5 * CHUNK // 8 - 3]),
    "rts_first": st.booleans(),
    "picks": st.lists(st.integers(0, 3), max_size=8),
    "fail_at": st.sampled_from([0, 0, 0, 1, 2, 3, 4, 6]),
    "withdraw": st.booleans(),
    "timeout": st.sampled_from([None, 60.0]),
    "rts": st.sampled_from(["", "", "", "isend", "test"]),
})


@pytest.mark.native
@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(plan=CHUNK_PLANS)
def test_chunked_transfers_and_the_send_completion_in_c_do_what_the_python_steps_do(
        plan: dict[str, Any]) -> None:
    """A payload of one or several chunks, received and sent, its data requests
    completing in any order, run by ``Path`` and by the Python steps from the same start,
    gives the same: the same requests handed to MPI in the same order (at most two chunks
    of a transfer in flight), the same outcomes and statuses, the same flight record and
    tallies; a data request that MPI refuses breaks the link the same way (the op fails,
    nothing is reported cancelled); a withdrawal tried while the data moves loses (the
    send completes, and is not cancelled); the task waiting for the send wakes, and the
    send's timer stops."""
    with pytest.MonkeyPatch.context() as mp:
        _unstarted(mp, CHUNK)
        seen = _each_lane(lambda native: _chunked(native, plan))
    c, python = seen[True], seen[False]
    assert c[:2] == (("Path.fetch", "Path.send"), "Path.test")
    assert python[:2] == (("MPITransport.fetch", "MPITransport.send"),
                          "Progress._test_requests")
    assert c[2:] == python[2:]
    outcome, status, got, sent, recv_steps, send_steps, withdrew = c[2:9]
    assert all(k <= 2 for k in recv_steps + send_steps)  # the window
    assert not any(cancelled for _, cancelled, _ in outcome)  # matched: never cancelled
    n = plan["count"]
    chunks = -(-n * 8 // CHUNK)
    if 0 < plan["fail_at"] <= (chunks if plan["rts"] else 2 * chunks):  # one failed
        assert "TransportError" in c[15]
        assert any(r is not None and "TransportError" in r for _, _, r in outcome)
    elif plan["rts"]:  # the send failed as it was posted (the link stands)
        assert "TransportError" in outcome[1][2] and "TransportError" in outcome[2][2]
        assert c[15] == "None" and c[13:15] == ([], [])  # nothing kept of it
    else:
        assert outcome == [(True, False, "None")] * 3
        assert status == (0, 9, n * 8, n, (n,))
        assert got == [*(np.arange(n) + 0.5), 0.0, 0.0, 0.0]
        data = b"".join(raw for raw, _, tag in sent  # the chunks sent, in order
                        if tag and not raw.startswith(b"irecv"))
        assert data == (np.arange(n, dtype="<f8") + 0.5).tobytes()
        assert withdrew[0] in (None, False)  # a withdrawal while the data moves loses
        assert withdrew[1:] == (None, False, 0)  # its timer stopped, nothing pending
        assert c[9:11] == (0, 0)  # nothing left in flight


SPIN_STATES = st.fixed_dictionaries({
    "landed": st.lists(st.sampled_from([w.EAGER, w.CREDIT]), max_size=3),
    "data": st.lists(st.booleans(), max_size=3),  # data requests in flight: done or not
    "share": st.booleans(),
    "fails": st.booleans(),  # the head control recv's Test raises
})


def _spin_once(state: dict[str, Any], native: bool,
               loop: asyncio.AbstractEventLoop) -> tuple[Any, ...]:
    """One ``Progress._spin`` with its deadline passed, on a link set up from ``state``: what
    the steps touched, the data callbacks fired, the calls to ``share``, the requests left."""
    link = world({"completes": True, "fails": "", "credit": 1 << 15, "closed": False,
                  "broken": False, "bell": None, "ctrl": 0, "parked": None,
                  "landed": state["landed"]}, native, loop)
    progress = link.progress
    fired: list[int] = []
    for i, done in enumerate(state["data"]):
        progress._track(Req(done), functools.partial(fired.append, i))  # type: ignore[arg-type]
    progress._slots[0].req.fail = state["fails"]  # type: ignore[attr-defined]
    shared: list[int] = []
    result: object
    try:
        result = progress._spin(0.0, functools.partial(shared.append, 1) if state["share"]
                                else None)
    except Exception as exc:
        result = repr(exc)
    return observe(link, result), fired, len(shared), len(progress._reqs)


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(state=SPIN_STATES)
def test_the_poll_burst_in_c_does_what_the_python_steps_do(state: dict[str, Any]) -> None:
    """``Progress._spin`` with its deadline passed (one poll, then False unless something
    completed): the head control message handed on if it landed (its slot posted again at
    the next poll, any behind it left for the next turn), the data requests that completed
    acted on, the rest left, ``share`` called between polls, an MPI error raised; alike on
    both lanes."""
    loop = asyncio.new_event_loop()
    try:
        seen = [_spin_once(state, native, loop) for native in (False, True)]
    finally:
        loop.close()
    assert seen[1] == seen[0]
    result, fired, shared = seen[0][0][0], seen[0][1], seen[0][2]
    if state["fails"]:
        assert result == repr(FakeMPIError("Test failed"))
    else:
        assert result is bool(state["landed"] or any(state["data"]))
        assert fired == [i for i, done in enumerate(state["data"]) if done]
        assert shared == (0 if result else int(state["share"]))
        # the head handed on waits at the back to be posted again at the next poll (its
        # recv still complete); any that landed behind it are left for the next turn
        assert sum(seen[0][0][-1]) == len(state["landed"])
        if state["landed"]:
            assert seen[0][0][-1][-1]


def _spin_then(state: dict[str, Any], native: bool,
               loop: asyncio.AbstractEventLoop) -> tuple[Any, ...]:
    """Two ``Progress._spin``s that hand a control message on (the second one after
    ``state["landed_after"]`` more landed), then ``state["next"]``: the slots in their order
    (by where each began) and which are complete, after each step, and what the steps did."""
    link = world({"completes": True, "fails": "", "credit": 1 << 15, "closed": False,
                  "broken": False, "bell": None, "ctrl": 0, "parked": None,
                  "landed": state["landed"]}, native, loop)
    progress = link.progress
    slots = progress._slots
    where = {id(s): i for i, s in enumerate(slots)}
    seen = []
    for step in ("spin", "spin", state["next"]):
        if step == "spin" and seen:  # more land behind those already in
            for kind in state["landed_after"]:
                slot = next(s for s in slots if not s.req.done)  # type: ignore[attr-defined]
                if kind == w.EAGER:
                    land(slot, w.HEADER.pack(w.EAGER, 3, 0, 9, 16, 2, 0, b"<f8"),
                         bytes(range(16)))
                else:
                    land(slot, w.HEADER.pack(w.CREDIT, 0, 0, 0, 640, 0, 0, b""))
        call = {"spin": lambda: progress._spin(0.0, None), "land": progress._land,
                "repost": progress._repost}[step]
        result = call()
        seen.append((step, result, [where[id(s)] for s in slots],
                     [s.req.done for s in slots]))  # type: ignore[attr-defined]
    return (*seen, observe(link, None))


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(state=st.fixed_dictionaries({
    "landed": st.lists(st.sampled_from([w.EAGER, w.CREDIT]), min_size=1, max_size=3),
    "landed_after": st.lists(st.sampled_from([w.EAGER, w.CREDIT]), max_size=2),
    "next": st.sampled_from(["land", "spin", "repost"]),
}))
def test_the_slot_a_poll_burst_hands_on_is_posted_again_at_the_next_poll(
        state: dict[str, Any]) -> None:
    """A poll burst leaves the slot of the message it handed on unposted at the back; the
    next poll (``_land``, ``_spin``, or ``_repost`` at the teardown) posts the
    waiting ones again first, in their order, before it tests the head; alike on both
    lanes."""
    loop = asyncio.new_event_loop()
    try:
        seen = [_spin_then(state, native, loop) for native in (False, True)]
    finally:
        loop.close()
    assert seen[1] == seen[0]
    first, second, after = seen[0][:3]
    n = CTRL_SLOTS
    assert first[1] is True and first[2] == [*range(1, n), 0]
    assert first[3][-1] is True  # handed on, still complete: not posted again yet
    if second[1]:  # the next one handed on the same way; the first posted again before
        assert second[3][-2:] == [False, True]
    else:
        assert second[3][-1] is False
    # after the third step nothing handed on waits at the back (bar a spin's own)
    waiting = 1 if after[0] == "spin" and after[1] else 0
    assert after[3][n - 1 - waiting] is False
    if after[0] == "repost":
        assert after[2] == second[2] and after[3][-1] is False
