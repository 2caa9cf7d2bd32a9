"""The shared-memory link's per-message steps in C (``_lane.ShmPath``) do what the Python
steps do.

Two ranks' links share one segment in this process, with a stand-in for the node (its
``kick``s and ``wake``s recorded).  Random states are set up twice, alike: where each ring
starts (near its end: records wrap; or nearly full: no room), the eager credit, a closed,
broken or dead peer, control messages queued, an armed doorbell.  The same sends run on one
through the Python steps and on the other through the C lane's, then the receiver polls
(Python, or C), and everything the steps touch is compared: the whole segment (records,
``tail``, ``head``, ``want``, doorbells), each ring's ``_pos`` and ``_seen``, the credit,
the queues, what the node was asked, and what was handed to the receiving endpoint.  A
world of two links on real engines then runs ping-pongs both ways (``native=``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asynccomm as ac
from asynccomm._comm import communicator as _communicator
from asynccomm._comm import native as _native
from asynccomm._comm.process_runner import _ProcessFamily
from asynccomm._core import wire as w
from asynccomm._core.descriptors import STAGED
from asynccomm._engine.engine import DeviceEngine
from asynccomm._engine.lane import LANE
from asynccomm._exceptions import TransportError
from asynccomm.sim.device import Device
from asynccomm.transports import _shm_ring
from asynccomm.transports._shm_ring import ARMED, RING_BYTES, Segment, segment_bytes
from asynccomm.transports.shm import (
    DATA_COPYING,
    DATA_DONE,
    FRAGMENT,
    READ_CHUNK,
    Channels,
    Node,
    ShmTransport,
    missing,
)

from ..calls import counted

pytestmark = [pytest.mark.native,
              pytest.mark.skipif(LANE is None or _native.CONFIGURED is None
                                 or not _shm_ring.NATIVE or missing() is not None,
                                 reason="the C lane is not built here (or switched off)")]

T = TypeVar("T")
POOL = 1 << 16  # each rank's staging cap: a window of 32 KiB per rank at size 2


class FakeNode:
    """What a link asks of its node, recorded."""

    single_copy = False
    share_copies = False
    crowded = False

    def __init__(self) -> None:
        self.kicks = 0
        self.woken: list[int] = []

    def kick(self) -> None:
        self.kicks += 1

    def wake(self, peer: int) -> None:
        self.woken.append(peer)

    def accelerate(self, lane: Any) -> None:
        """(The node's own turn in C is ``test_shm_node_native``'s.)"""


class Endpoint:
    """A receiving engine as the link's Python steps see it (the C steps hand anything
    but the engine's own class to them)."""

    closed = False

    def __init__(self) -> None:
        self.arrived_: list[tuple[Any, ...]] = []
        self.other: list[str] = []

    def arrived(self, msg: Any) -> None:
        self.arrived_.append((msg.source, msg.tag, msg.nbytes, msg.count, msg.dtype,
                              msg.shape, msg.where, bytes(msg.view[:msg.nbytes])
                              if msg.view is not None else msg.ident))

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.other.append(name)


def offer_bytes(endpoint: Any, source: int, tag: int, view: memoryview, nbytes: int,
                count: int, dtype: str) -> bool:
    endpoint.arrived_.append(("offered", source, tag, bytes(view[:nbytes]), count, dtype))
    return True


def new_segment(size: int) -> Segment:
    """A new segment of the rings of ``size`` ranks."""
    fd = os.memfd_create("asynccomm-test", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, segment_bytes(size))
        return Segment(fd, size)
    finally:
        os.close(fd)


def pair(state: dict[str, Any], native: bool) -> tuple[Segment, list[ShmTransport], FakeNode]:
    """Two links (ranks 0 and 1) on one new segment, set up as ``state`` says."""
    segment = new_segment(2)
    node = FakeNode()
    links = [ShmTransport(node, segment, r, [0, 1], eager_limit=4096,  # type: ignore[arg-type]
                          pools=[POOL, POOL]) for r in range(2)]
    start, used = state["start"], state["used"]
    for link in links:  # each ring starts where ``state`` says: ``used`` bytes not freed
        link.endpoint = Endpoint()  # type: ignore[assignment]
        link.offer_bytes = offer_bytes
        out = link.channels.out[1 - link.rank]
        assert out is not None
        out._pos, out._seen = start, start - used
        segment.words.store(out._tail, start)
        segment.words.store(out._head, start - used)
        for _, ring in link.channels.incoming:
            ring._pos = start
        if state["armed"]:
            segment.words.store(segment.bell(link.rank), ARMED)
    if native:
        for link in links:
            link.accelerate(LANE)
    sender = links[0]
    sender.wire.credit[1] = state["credit"]
    if state["closed"]:
        sender.wire.closed_by[1] = "has closed its communicator"
    if state["broken"]:
        sender._broken = TransportError("broken", rank=0)
    if state["dead"]:
        sender.channels.dead.add(1)
    for _ in range(state["queued"]):
        sender.channels._ctrl[1].append(w.HEADER.pack(w.CREDIT, 0, 0, 0, 640, 0, 0, b""))
    return segment, links, node


def observe(segment: Segment, links: list[ShmTransport], node: FakeNode,
            results: list[object]) -> tuple[Any, ...]:
    return (results, bytes(segment.mm), node.kicks, node.woken,
            [(r._pos, r._seen) for link in links for r in link.channels.out if r is not None],
            [r._pos for link in links for _, r in link.channels.incoming],
            [list(link.wire.credit) for link in links],
            [list(link.wire._owed) for link in links],
            [list(map(list, link.channels._ctrl)) for link in links],
            [link.endpoint.arrived_ for link in links],  # type: ignore[attr-defined]
            [link.endpoint.other for link in links])  # type: ignore[attr-defined]


SENDS = st.lists(st.tuples(st.sampled_from([0, 8, 24, 1000, 4096, 4097]),
                           st.sampled_from(["<f8", "<f8", "<u1", "<c16"]),
                           st.integers(-3, 1 << 20)), min_size=1, max_size=4)
STATES = st.fixed_dictionaries({
    "start": st.sampled_from([RING_BYTES, 2 * RING_BYTES - 64, 2 * RING_BYTES - 4200,
                              3 * RING_BYTES - 8]),
    "used": st.sampled_from([0, 0, RING_BYTES - 5000, RING_BYTES - 100]),
    "credit": st.sampled_from([0, 600, 1 << 15]),
    "closed": st.booleans(),
    "broken": st.sampled_from([False, False, False, True]),
    "dead": st.sampled_from([False, False, False, True]),
    "queued": st.sampled_from([0, 0, 1]),
    "armed": st.booleans(),
    "want": st.booleans(),
    "sends": SENDS,
})


def run_steps(state: dict[str, Any], native: bool) -> tuple[Any, ...]:
    for _, dtype, _ in state["sends"]:
        if dtype == "<c16":  # one dtype the wire has not met: the Python steps
            w.DTYPE_FIELDS.pop(dtype, None)
        else:
            w.encode_dtype(dtype)
    segment, links, node = pair(state, native)
    results: list[object] = []
    try:
        for nbytes, dtype, tag in state["sends"]:
            dt = np.dtype(dtype)
            array = np.arange(nbytes // dt.itemsize, dtype=dt)
            try:
                results.append(links[0].send_now(1, tag, array, array.nbytes, array.size,
                                                 dtype))
            except Exception as exc:
                results.append(repr(exc))
        if state["want"]:  # the sender waits for room: the receiver wakes it once done
            out = links[0].channels.out[1]
            assert out is not None
            segment.words.store(out._want, 1)
        results.append(links[1].channels.poll())
        results.append(links[1].channels.poll())  # nothing more
        return observe(segment, links, node, results)
    finally:
        for link in links:
            link.channels.close()


@settings(max_examples=150, derandomize=True, database=None, deadline=None)
@given(state=STATES)
def test_send_now_and_poll_do_what_the_python_steps_do(state: dict[str, Any]) -> None:
    assert run_steps(state, True) == run_steps(state, False)


#: Control records (``Channels._put``): a header alone, with a payload, odd lengths, one
#: of half a ring, one that never fits.
RECORDS = st.lists(st.sampled_from([w.HEADER.size, w.HEADER.size + 8, 61, 1000,
                                    RING_BYTES // 2 - 8, RING_BYTES]), min_size=1, max_size=6)


def run_puts(state: dict[str, Any], sizes: list[int], native: bool) -> tuple[Any, ...]:
    segment, links, node = pair(state, native)
    results: list[object] = []
    try:
        for i, n in enumerate(sizes):
            raw = (bytes(range(i, 251)) * (n // 200 + 1))[:n]
            results.append(links[0].channels._put(1, raw if i % 2 else bytearray(raw)))
        return observe(segment, links, node, results)
    finally:
        for link in links:
            link.channels.close()


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(state=STATES, sizes=RECORDS)
def test_put_does_what_the_python_steps_do(state: dict[str, Any], sizes: list[int]) -> None:
    """A control record put on a ring in C (``ShmPath.put``: the offers' ``RTS`` and their
    answers) leaves the segment, the ring's positions and the doorbell as ``Ring.put`` and
    ``Channels.ring`` do."""
    assert run_puts(state, sizes, True) == run_puts(state, sizes, False)


#: Rendezvous payloads on the ring (``Channels._fragments``): less than a fragment, one,
#: a bit more, several, more than a ring holds.
FRAGMENTED = st.sampled_from([1, 4095, FRAGMENT, FRAGMENT + 1, 3 * FRAGMENT + 5,
                              RING_BYTES + 3 * FRAGMENT // 2])


def run_fragments(state: dict[str, Any], nbytes: int, start: int, turns: int,
                  native: bool) -> tuple[Any, ...]:
    """``nbytes`` from rank 0 to rank 1's recv on a data tag, from offset ``start``: the
    sender's fragments put on the ring and the receiver's polls taking them, ``turns``
    times (or until all is in)."""
    segment, links, node = pair(state, native)
    payload = memoryview((bytes(range(251)) * (nbytes // 251 + 1))[:nbytes])
    into = bytearray(nbytes)
    done: list[int] = []
    results: list[object] = []
    try:
        links[1].channels.pull(memoryview(into), 0, 77, lambda: done.append(len(done)))
        links[1].channels._pulls[(0, 77)].off = start
        off = start
        for _ in range(turns):
            off = links[0].channels._fragments(1, payload, off, 77)
            results.append(off)
            results.append(links[1].channels.poll())
            if off == nbytes:
                break
        results.append(links[1].channels.poll())  # nothing more
        pulls = {k: p.off for k, p in links[1].channels._pulls.items()}
        return (observe(segment, links, node, results), bytes(into), done, pulls)
    finally:
        for link in links:
            link.channels.close()


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(state=STATES, nbytes=FRAGMENTED, start=st.sampled_from([0, 0, 1, FRAGMENT]),
       turns=st.sampled_from([1, 6]))
def test_fragments_go_and_land_as_the_python_steps_do(state: dict[str, Any], nbytes: int,
                                                      start: int, turns: int) -> None:
    """A rendezvous payload that comes on the ring (its single copy refused), its
    fragments put in C (``ShmPath.fragments``) and landed in the recv
    in C (``ShmPath.poll``), leaves the segment, the rings' positions, the doorbells, the
    recv's bytes and its completion as the Python steps do."""
    start = min(start, nbytes - 1)
    assert (run_fragments(state, nbytes, start, turns, True)
            == run_fragments(state, nbytes, start, turns, False))


@pytest.mark.parametrize("native", [True, False])
def test_a_sender_stays_awake_while_its_offer_is_copied(native: bool) -> None:
    """Told that its offer is being copied (``DATA_COPYING``), a sender's poll says there
    is activity (its loop spins, and does not sleep until a doorbell wakes it for the
    answer) until the answer comes, its receiver dies, or the bound passes; on either
    lane."""
    state = {"start": RING_BYTES, "used": 0, "credit": 1 << 15, "closed": False, "broken": False,
             "dead": False, "queued": 0, "armed": False, "want": False, "sends": []}
    segment, links, _ = pair(state, native)
    sender, receiver = links[0].channels, links[1].channels
    try:
        def copying(ident: int, nbytes: int) -> None:
            receiver._answer(0, w.HEADER.pack(DATA_COPYING, 0, 1, 0, nbytes, 0, ident, b""))

        assert sender.poll() is False
        copying(42, 64 << 20)
        assert sender.poll() is True  # the record
        assert sender.poll() is True  # (nothing came: awake all the same)
        assert list(sender.copying) == [(1, 42)]
        receiver._answer(0, w.HEADER.pack(DATA_DONE, 0, 1, 0, 0, 0, 42, b""))
        assert sender.poll() is True
        assert sender.copying == {}
        assert sender.poll() is False
        copying(43, 0)  # an answer that never comes: awake until the bound
        assert sender.poll() is True
        sender.copying[(1, 43)] = time.perf_counter() - 1e-6
        assert sender.poll() is False
        assert sender.copying == {}
        copying(44, 64 << 20)
        assert sender.poll() is True
        sender.peer_died(1)
        assert sender.copying == {}
    finally:
        for link in links:
            link.channels.close()


def test_the_c_steps_run_where_the_lane_is_built() -> None:
    state = {"start": RING_BYTES, "used": 0, "credit": 1 << 15, "closed": False, "broken": False,
             "dead": False, "queued": 0, "armed": False, "want": False, "sends": []}
    segment, links, _ = pair(state, True)
    try:
        assert links[0].send_now.__qualname__ == "ShmPath.send_now"
        assert links[1].channels.poll.__qualname__ == "ShmPath.poll"
        assert links[0].channels._put.__qualname__ == "ShmPath.put"
        assert links[0].channels._fragments.__qualname__ == "ShmPath.fragments"
    finally:
        for link in links:
            link.channels.close()


def test_a_rank_on_no_ring_here_is_left_to_the_python_steps() -> None:
    """A world of 3 ranks whose rank 2 has no ring on this segment (the hybrid link's
    peer on another host: ``Channels(places=)``): the C steps put a message to rank 1 on
    its ring, where it lands in C, hand one to rank 2 to the link's Python ``send_now``,
    and refuse to put a record or fragments on rank 2's ring."""
    w.encode_dtype("<f8")
    segment = new_segment(2)
    node = FakeNode()
    python: list[int] = []
    links = []
    for r in range(2):
        link = ShmTransport(node, segment, r, [0, 1, -1], eager_limit=4096,  # type: ignore[arg-type]
                            pools=[POOL] * 3)
        link.progress = Channels(node, segment, r, [0, 1, -1],  # type: ignore[arg-type]
                                 link._on_control, link._answered, places=[0, 1, -1])
        link.endpoint = Endpoint()  # type: ignore[assignment]
        link.offer_bytes = offer_bytes
        link.send_now = lambda dest, *args: python.append(dest) or True  # type: ignore[method-assign]
        link.accelerate(LANE)
        links.append(link)
    try:
        sender, receiver = links
        assert sender.channels.out[2] is None and [s for s, _ in sender.channels.incoming] == [1]
        assert sender.send_now(1, 5, np.ones(2), 16, 2, "<f8") is True
        assert sender.send_now(2, 5, np.ones(2), 16, 2, "<f8") is True
        assert python == [2]  # the message to rank 2 only
        assert receiver.channels.poll() is True
        assert [a[:3] for a in receiver.endpoint.arrived_] == [("offered", 0, 5)]  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="rings"):
            sender.channels._put(2, w.HEADER.pack(w.CREDIT, 0, 0, 0, 640, 0, 0, b""))
        with pytest.raises(ValueError, match="rings"):
            sender.channels._fragments(2, memoryview(bytes(64)), 0, 9)
    finally:
        for link in links:
            link.channels.close()


@pytest.mark.parametrize("armed", [False, True])
def test_an_armed_doorbell_is_cleared_and_rung_once_after_the_record_is_published(
        armed: bool) -> None:
    """The sender's half of the armed-doorbell protocol (``test_shm_protocol``'s model):
    publish (``tail``), then load the bell, and only if it is armed, clear it and wake the
    receiver; a second send finds it clear and wakes no one."""
    state = {"start": RING_BYTES, "used": 0, "credit": 1 << 15, "closed": False, "broken": False,
             "dead": False, "queued": 0, "armed": armed, "want": False, "sends": []}
    segment, links, node = pair(state, True)
    ring = links[0].channels.out[1]
    assert ring is not None
    woken_at: list[int] = []
    node.wake = lambda peer: woken_at.append(segment.words.load(ring._tail))  # type: ignore[method-assign]
    try:
        assert links[0].send_now(1, 5, np.ones(1), 8, 1, "<f8") is True
        published = segment.words.load(ring._tail)
        assert published > RING_BYTES
        assert links[0].send_now(1, 5, np.ones(1), 8, 1, "<f8") is True
        assert segment.words.load(ring._tail) > published
        assert segment.words.load(segment.bell(1)) == 0
        assert woken_at == ([published] if armed else [])  # the first, once published
        assert node.kicks == 2
    finally:
        for link in links:
            link.channels.close()


def test_a_closed_segment_is_left_to_the_python_steps() -> None:
    """Once the link's segment is released the C steps touch no mapping."""
    state = {"start": RING_BYTES, "used": 0, "credit": 1 << 15, "closed": False, "broken": False,
             "dead": False, "queued": 0, "armed": False, "want": False, "sends": []}
    segment, links, _ = pair(state, True)
    links[1].channels.close()
    assert links[1].channels.poll() is False
    links[0].channels.close()


# -- a world of two links on real engines ---------------------------------------------------


def _nodes() -> list[Node]:
    group = secrets.token_hex(6)
    nodes = [Node(group, r, 2) for r in range(2)]
    for node in nodes:
        node.watch([os.getpid()] * 2)  # (the single copy reads this process)
    return nodes


async def _open(nodes: list[Node], native: bool, eager_limit: int = 4096, pool: int = POOL
                ) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """The links and communicators of ranks 0 and 1 of a world on ``nodes``, opened with
    ``native=``, ``eager_limit`` and each rank's staging cap ``pool``."""
    lane = _communicator.world_lane(native)
    fams = [_ProcessFamily(node, "w1", [0, 1], [pool, pool], eager_limit=eager_limit,
                           pool_bytes=pool, timeout=None, registry=[], lane=lane)
            for node in nodes]
    return await asyncio.wait_for(asyncio.gather(  # type: ignore[return-value]
        fams[0].open(Device(0, "shm:0")), fams[1].open(Device(1, "shm:1"))), 30)


def _run(loop: str, main: Coroutine[Any, Any, T]) -> T:
    """``main`` run to its end on a new loop of kind ``loop``."""
    factory = None
    if loop == "uvloop":
        import uvloop
        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def _flights(*comms: Any) -> list[Any]:
    """The flight records of ``comms`` (times aside), then their matchers' statistics."""
    flight: list[Any] = [[{k: v for k, v in d.items() if k not in ("post", "match", "finish")}
                          for d in c.flight_record()] for c in comms]
    flight.append([c.statistics().matcher for c in comms])
    return flight


@contextlib.asynccontextmanager
async def _opened(native: bool) -> AsyncIterator[tuple[tuple[Any, Any], tuple[Any, Any]]]:
    """``_open`` on two nodes of their own, closed after."""
    nodes = _nodes()
    try:
        yield await _open(nodes, native)
    finally:
        for node in nodes:
            node._detach()
            node.sock.close()


async def _world(native: bool) -> tuple[Any, ...]:
    """Ranks 0 and 1 of a world of two links in this process (two nodes), opened with
    ``native=``: ping-pongs of small messages both ways, a recv posted before its message
    lands and one after, a dtype of its own shape, and a large one."""
    nodes = _nodes()
    try:
        (l0, c0), (l1, c1) = await _open(nodes, native)
        kinds = (l0.send_now.__qualname__, l1.channels.poll.__qualname__)

        async def ping(comm: Any, peer: int, first: bool) -> list[float]:
            got = []
            buf = np.zeros(1)
            for i in range(50):
                if first:
                    await comm.send(np.array([float(i)]), peer, 3)
                    await comm.recv(buf, peer, 4)
                else:
                    await comm.recv(buf, peer, 3)
                    await comm.send(buf + 0.5, peer, 4)
                got.append(float(buf[0]))
            return got

        pings = await asyncio.wait_for(asyncio.gather(ping(c0, 1, True), ping(c1, 0, False)),
                                       30)
        late = np.zeros(3, dtype=np.int32)
        await c0.send(np.arange(3, dtype=np.int32), 1, 8)
        grid = np.zeros((2, 3))
        await c0.send(np.ones((2, 3)), 1, 9)
        big = np.zeros(100_000, dtype=np.uint8)
        sent_big = c0.isend(np.full(100_000, 7, dtype=np.uint8), 1, 10)
        statuses = await asyncio.wait_for(asyncio.gather(
            c1.recv(late, 0, 8), c1.recv(grid, 0, 9), c1.recv(big, 0, 10), sent_big), 30)
        # (what was staged depends on when each poll ran: not compared)
        pending = [c.statistics().pending_ops for c in (c0, c1)]
        await asyncio.wait_for(asyncio.gather(c0.aclose(), c1.aclose()), 30)
        return (kinds, pings, late.tolist(), grid.tolist(), int(big.sum()),
                [tuple(s) if s is not None else None for s in statuses[:3]], pending)
    finally:
        for node in nodes:
            node._detach()
            node.sock.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_world_on_either_lane_does_the_same(loop: str) -> None:
    """A world opened with ``native=True`` runs the links' per-message steps in C (their
    ``ShmPath``), one with ``native=False`` the Python steps: the same ops give the same."""
    c, python = (_run(loop, _world(native)) for native in (True, False))
    assert c[0] == ("ShmPath.send_now", "ShmPath.poll")
    assert python[0] == ("ShmTransport.send_now", "Channels.poll")
    assert c[1:] == python[1:]
    assert c[1] == [[float(i) + 0.5 for i in range(50)], [float(i) for i in range(50)]]
    assert c[2:5] == ([0, 1, 2], [[1.0] * 3] * 2, 700_000)
    assert c[6] == [0, 0]


async def _early(native: bool, handed: list[int], count: int = 300,
                 posted: bool = False, names: tuple[int, int] = (0, 8)) -> tuple[Any, ...]:
    """An eager message of ``count`` int32s that lands before its recv is posted (or, with
    ``posted``, after: a recv that ``names`` (source, tag), wildcards allowed, posted
    first), on a world opened with ``native=`` whose eager limit is 64 KiB
    (and each rank's staging cap 1 MiB: credit for it):
    what the receiving engine was handed (``arrived``: the tags in ``handed``), the
    message as it waits (None: none waited), the charge owed back to its sender then and
    once a recv took it, and what the recv got."""
    nodes = _nodes()
    try:
        (_, c0), (l1, c1) = await _open(nodes, native, eager_limit=65536, pool=1 << 20)
        engine = l1.endpoint
        first = np.zeros(3, dtype=np.int32)  # (a dtype's first message takes the Python steps)
        await asyncio.wait_for(asyncio.gather(c1.recv(first, 0, 7),
                                              c0.send(np.arange(3, dtype=np.int32), 1, 7)), 30)
        handed.clear()
        got = np.zeros(count, dtype=np.int32)
        recv = c1.irecv(got, *names) if posted else None
        await c0.send(np.arange(count, dtype=np.int32), 1, 8)
        waiting = owed_before = None
        if not posted:
            for _ in range(1000):  # the receiver's poll task takes it
                if engine.matcher.statistics().unexpected_messages:
                    break
                await asyncio.sleep(0)
            [msg] = engine.matcher.unexpected()
            waiting = (msg.where, type(msg.view).__name__, bytes(msg.view[:16]))
            owed_before = l1.wire._owed[0]
        status = await asyncio.wait_for(recv if recv is not None else c1.recv(got, 0, 8), 30)
        result = (list(handed), waiting, owed_before, l1.wire._owed[0], got.tolist(),
                  tuple(status), engine.pool.statistics().in_use_bytes)
        await asyncio.wait_for(asyncio.gather(c0.aclose(), c1.aclose()), 30)
        return result
    finally:
        for node in nodes:
            node._detach()
            node.sock.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("count", [300, 16384])  # 1200 B, and the eager limit's 64 KiB
def test_an_eager_message_that_lands_before_its_recv_is_staged_in_c(
        count: int, loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C lane stages an eager message for which no recv is posted itself (no Python
    frame: the engine's ``arrived`` is not called), as the engine would: in the staging
    pool, its charge owed back to its sender only once a recv takes it.  Up to the eager
    limit: a message of 64 KiB took the Python steps, 10-25% of a collective call whose
    messages are that size."""
    handed = counted(monkeypatch, DeviceEngine, "arrived", lambda msg: msg.tag)
    seen = {native: _run(loop, _early(native, handed, count)) for native in (True, False)}
    c, python = seen[True], seen[False]
    assert c[0] == [] and python[0] == [8]
    assert c[1:] == python[1:]
    assert c[1] == (STAGED, "bytearray", np.arange(4, dtype=np.int32).tobytes())
    assert c[3] - c[2] == w.charge(4 * count)  # owed back once a recv took it, not before
    assert c[4] == list(range(count)) and c[6] == 0


def _posted_landings(loop: str, monkeypatch: pytest.MonkeyPatch, count: int,
                     names: tuple[int, int] = (0, 8)) -> dict[bool, tuple[Any, list[int]]]:
    """``_early`` with its recv posted first (naming ``names``), on each lane: what it
    gave, and the sizes of the eager messages of tag 8 that the link's Python landing
    (``_on_control``) saw."""
    landed: list[int] = []
    on_control = ShmTransport._on_control

    def counted(link: ShmTransport, slot: Any) -> Any:
        kind, _, _, tag, nbytes = w.HEADER.unpack_from(slot.buf)[:5]
        if kind == w.EAGER and tag == 8:
            landed.append(nbytes)
        return on_control(link, slot)

    monkeypatch.setattr(ShmTransport, "_on_control", counted)
    seen = {}
    for native in (True, False):
        landed.clear()
        seen[native] = (_run(loop, _early(native, [], count, posted=True, names=names)),
                        list(landed))
    return seen


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_eager_message_of_the_eager_limit_lands_in_its_posted_recv_in_c(
        loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64 KiB eager message whose recv is posted goes into it in C (the link's Python
    landing, ``_on_control``, never runs for it), as the Python steps put it there."""
    seen = _posted_landings(loop, monkeypatch, 16384)
    (c, c_landed), (python, python_landed) = seen[True], seen[False]
    assert python_landed == [65536]  # (the Python steps' world)
    assert c == python and c[4] == list(range(16384))
    assert c_landed == []


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("count", [300, 16384])
@pytest.mark.parametrize("names", [(ac.ANY_SOURCE, 8), (0, ac.ANY_TAG),
                                   (ac.ANY_SOURCE, ac.ANY_TAG)])
def test_an_eager_message_lands_in_a_wildcard_recv_in_c(
        names: tuple[int, int], count: int, loop: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An eager message whose recv posted first names ``ANY_SOURCE`` or ``ANY_TAG`` goes
    into it in C (``_on_control`` never runs for it), as the Python steps put it there,
    the status the message's own source and tag.  (It took the Python steps, a message
    and its answer 2.7 times as long at 8 B on two processes.)"""
    seen = _posted_landings(loop, monkeypatch, count, names)
    (c, c_landed), (python, python_landed) = seen[True], seen[False]
    assert c == python and c[4] == list(range(count))
    assert c[5][:2] == (0, 8)  # (the message's source and tag)
    assert c_landed == [] and python_landed == [4 * count]


# -- a large message's offer: its answer lands in C -------------------------------------------

OFFERED = [5000, 100_000, 1 << 20]  # (over the eager limit: each an offer)


async def _offers(native: bool, answered: list[int]) -> tuple[Any, ...]:
    """Rank 0 sends ``OFFERED`` (rendezvous with an offer: the receiver copies, and answers
    ``DATA_DONE``) to rank 1, its recvs posted before the offers land and after, on a world
    opened with ``native=``: the messages, the statuses, the sends' ends, what the sender
    keeps of its offers after them, the flight records (times aside) and the matchers'
    statistics, the sender's tallies, and its offers answered by the Python steps
    (``answered``)."""
    nodes = _nodes()
    for node in nodes:  # (a shared copy is ``Channels.take``'s: test_shm_share's)
        node.share_copies = False
    try:
        (l0, c0), (l1, c1) = await _open(nodes, native)
        assert l0.channels.node.single_copy and l1.channels.node.single_copy
        warm = np.zeros(5000, np.uint8)  # (a dtype's first message takes the Python steps)
        await asyncio.wait_for(asyncio.gather(c1.recv(warm, 0, 19), c0.send(warm + 1, 1, 19)),
                               30)
        answered.clear()
        out: list[Any] = []
        for before in (True, False):
            bufs = [np.zeros(n, np.uint8) for n in OFFERED]
            recvs = [c1.irecv(b, 0, 20 + i) for i, b in enumerate(bufs)] if before else []
            sends = [c0.isend(np.full(n, i + 1, np.uint8), 1, 20 + i)
                     for i, n in enumerate(OFFERED)]
            if not before:
                for _ in range(1000):  # every offer landed at rank 1 first
                    if len(l1.channels.offers) == len(OFFERED):
                        break
                    await asyncio.sleep(0)
                assert len(l1.channels.offers) == len(OFFERED)
                recvs = [c1.irecv(b, 0, 20 + i) for i, b in enumerate(bufs)]
            statuses = await asyncio.wait_for(asyncio.gather(*recvs, *sends), 30)
            out.append(([tuple(s) for s in statuses[:len(OFFERED)]],
                        [int(b.sum()) for b in bufs],
                        [(s.done(), s.cancelled(), s.t_post <= s.t_match <= s.t_fin)
                         for s in sends]))
        # A recv too small (truncation: the message waits for one that fits): the Python
        # steps, alike; and a wildcard one, posted first: matched in C.
        small, fits, wild = (np.zeros(n, np.uint8) for n in (100, 5000, 5000))
        sent = c0.isend(np.ones(5000, np.uint8), 1, 30)
        odd = await asyncio.wait_for(asyncio.gather(c1.recv(small, 0, 30),
                                                    return_exceptions=True), 30)
        odd += await asyncio.wait_for(asyncio.gather(
            c1.recv(fits, 0, 30), sent, c1.recv(wild, ac.ANY_SOURCE, 31),
            c0.send(np.ones(5000, np.uint8), 1, 31)), 30)
        out.append([type(o).__name__ if isinstance(o, BaseException) else o for o in odd]
                   + [int(fits.sum()), int(wild.sum())])
        l1.channels.node.single_copy = False  # (refused: the bytes come on the ring)
        refused = np.zeros(5000, np.uint8)
        out.append(await asyncio.wait_for(asyncio.gather(
            c1.recv(refused, 0, 32), c0.send(np.full(5000, 3, np.uint8), 1, 32)), 30)
            + [int(refused.sum())])
        kept = (dict(l0._sends), dict(l0.wire.announced), dict(l0.channels.copying),
                dict(l1.channels.offers), c0.statistics().pending_ops)
        flight = _flights(c0, c1)
        tally = (c0._engine.flight.sends[1].n, c0._engine.flight.sends[1].nbytes)
        await asyncio.wait_for(asyncio.gather(c0.aclose(), c1.aclose()), 30)
        return out, kept, flight, tally, list(answered)
    finally:
        for node in nodes:
            node._detach()
            node.sock.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_offers_answer_lands_in_c_as_the_python_steps_land_it(
        loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiver's C poll lands an offer whose recv is posted (matched, copied, answered
    ``DATA_DONE``, the recv complete: ``Channels.take`` is not called), and the sender's
    lands the answer (the send activated and complete, its flight record and tally, the
    wire and the link forget the offer: ``ShmTransport._answered`` is not called), with no
    Python frame; everything the sender and the receiver see is what the Python steps
    give."""
    answered: list[int] = []  # (the offers answered, then those taken, by the Python steps)
    original, take = ShmTransport._answered, Channels.take

    def counted(link: ShmTransport, dest: int, ident: int, tag: int) -> None:
        answered.append(ident)
        original(link, dest, ident, tag)

    def counted_take(channels: Channels, *args: Any) -> None:
        answered.append(-1)
        take(channels, *args)

    monkeypatch.setattr(ShmTransport, "_answered", counted)
    monkeypatch.setattr(Channels, "take", counted_take)
    c, python = (_run(loop, _offers(native, answered)) for native in (True, False))
    assert c[:4] == python[:4]
    # (C: only the offers that landed before their recvs were posted, and the truncated
    # and the refused recvs', take ``fetch``; the wildcard recv's offer lands in C)
    assert c[4][:len(OFFERED) + 2] == [-1] * (len(OFFERED) + 2)  # (then the refusal's
    assert len(c[4]) == len(OFFERED) + 3  # answer: on the ring, the Python steps)
    assert python[4].count(-1) == 2 * len(OFFERED) + 3
    assert c[0][3][2] == 15000
    assert c[0][2][0] == "TruncationError" and c[0][2][2] is None
    assert c[0][2][5:] == [5000, 5000]
    statuses, sums, ends = c[0][0]
    assert sums == [n * (i + 1) for i, n in enumerate(OFFERED)]
    assert statuses == [(0, 20 + i, n, n, (n,)) for i, n in enumerate(OFFERED)]
    assert ends == [(True, False, True)] * len(OFFERED)
    assert c[1] == ({}, {}, {}, {}, 0)
    assert c[3] == (2 * len(OFFERED) + 4, 2 * sum(OFFERED) + 4 * 5000)  # (and the others)


# -- an offer of more than one read: matched in C, copied a read per turn -------------------

BIG = 2 * READ_CHUNK + 3


async def _big_offers(native: bool, fetched: list[int]) -> tuple[Any, ...]:
    """Rank 0 sends messages of several reads (``BIG``) to rank 1 on a world opened with
    ``native=``: one whose recv is posted first; two at once, their recvs posted first (the
    second lands while the first is being copied); one whose recv is posted after its offer
    landed.  The statuses, the payloads, the sends' ends, what either rank keeps of the
    offers and copies after them, the flight records (times aside) and the matchers'
    statistics; and the recvs the Python steps matched (``fetched``: ``fetch`` calls)."""
    async with _opened(native) as ((l0, c0), (l1, c1)):
        warm = np.zeros(5000, np.uint8)  # (a dtype's first message takes the Python steps)
        await asyncio.wait_for(asyncio.gather(c1.recv(warm, 0, 19), c0.send(warm + 1, 1, 19)),
                               30)
        fetched.clear()
        bufs = [np.zeros(BIG, np.uint8) for _ in range(4)]

        def payload(i: int) -> np.ndarray[Any, Any]:
            return (np.arange(BIG) * 3 + i).astype(np.uint8)

        ops = await asyncio.wait_for(asyncio.gather(c1.recv(bufs[0], 0, 20),
                                                    c0.send(payload(0), 1, 20)), 30)
        recvs = [c1.irecv(bufs[i], 0, 20 + i) for i in (1, 2)]
        ops += await asyncio.wait_for(asyncio.gather(
            *recvs, *(c0.isend(payload(i), 1, 20 + i) for i in (1, 2))), 30)
        sent = c0.isend(payload(3), 1, 23)
        for _ in range(1000):  # its offer landed at rank 1 first
            if l1.channels.offers:
                break
            await asyncio.sleep(0)
        ops += await asyncio.wait_for(asyncio.gather(c1.recv(bufs[3], 0, 23), sent), 30)
        statuses = [tuple(s) for s in ops if s is not None]
        intact = [bool(np.array_equal(b, payload(i))) for i, b in enumerate(bufs)]
        kept = (dict(l0._sends), dict(l0.wire.announced), dict(l0.channels.copying),
                dict(l1.channels.offers), len(l1.channels._reading), dict(l1.channels._pulls),
                c0.statistics().pending_ops, c1.statistics().pending_ops)
        flight = _flights(c0, c1)
        await asyncio.wait_for(asyncio.gather(c0.aclose(), c1.aclose()), 30)
        return statuses, intact, kept, flight, list(fetched)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_offer_of_several_reads_is_matched_in_c_as_the_python_steps_match_it(
        loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiver's C poll matches an offer of more than one ``READ_CHUNK`` whose recv is
    posted (no ``fetch``), hands its copy to ``Channels.take`` (a read per turn of the
    loop) and completes the recv in C once it is in; an offer landing while a copy is
    under way, or before its recv, takes the Python steps; everything either rank sees
    is what the Python steps give."""
    fetched: list[int] = []
    original = ShmTransport.fetch

    def counted(link: ShmTransport, msg: Any, *args: Any) -> None:
        fetched.append(msg.tag)
        original(link, msg, *args)

    monkeypatch.setattr(ShmTransport, "fetch", counted)
    c, python = (_run(loop, _big_offers(native, fetched)) for native in (True, False))
    assert c[:4] == python[:4]
    assert c[1] == [True] * 4
    assert c[0] == [(0, 20 + i, BIG, BIG, (BIG,)) for i in (0, 1, 2, 3)]
    assert c[2] == ({}, {}, {}, {}, 0, {}, 0, 0)
    assert sorted(python[4]) == [20, 21, 22, 23]
    assert sorted(c[4]) == [22, 23]  # (the second of two at once, and the one posted after)
