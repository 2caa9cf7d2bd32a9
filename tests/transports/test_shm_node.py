"""A node's doorbell socket (``transports.shm.Node``): a ring that finds the node asleep
has its records taken in the socket's callback, before the poll task runs again, and the
poll task counts that wake as activity; a ring that finds it awake leaves them to the poll
task; a segment handed over still arrives.  A spinning node takes a record it finds in the
same turn of the loop, and the loop still turns.  A node that rang a sleeping peer sleeps
at once, unless a peer's doorbell woke it."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from array import array

import pytest

from asynccomm.transports import shm
from asynccomm.transports.shm import Node, missing

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))


class Channels:
    """Counts what the node asks of a link's channels."""

    def __init__(self) -> None:
        self.stopped = False
        self.closing = False
        self.polls = 0
        self.disarms = 0
        self.arms = 0
        self.records = 1  # what each poll finds: a record, or (0) nothing
        self._local: list[bytes] = []
        self.incoming: list[object] = []

    def poll(self) -> bool:
        self.polls += 1
        return self.records > 0

    def arm(self) -> bool:
        self.arms += 1
        return False

    def disarm(self) -> None:
        self.disarms += 1


class Link:
    def __init__(self) -> None:
        self.channels = Channels()


def _node() -> tuple[Node, Link, socket.socket]:
    node = Node(f"test-{os.getpid()}-{secrets.token_hex(4)}", 0, 2)
    link = Link()
    node._links.append(link)  # type: ignore[arg-type]
    peer = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    return node, link, peer


async def test_a_ring_that_finds_the_node_asleep_is_taken_in_the_callback() -> None:
    node, link, peer = _node()
    try:
        waiter = node._waiter = asyncio.get_running_loop().create_future()
        peer.sendto(b"\x01", node._addresses[0])
        node._readable()
        assert (link.channels.polls, link.channels.disarms) == (1, 1)
        assert waiter.done()  # and the poll task wakes to look again
        assert node.rings_heard == 1
    finally:
        node._waiter = None
        peer.close()
        node.sock.close()


async def test_a_ring_that_finds_the_node_awake_is_left_to_the_poll_task() -> None:
    node, link, peer = _node()
    try:
        peer.sendto(b"\x01", node._addresses[0])
        node._readable()
        assert (link.channels.polls, link.channels.disarms) == (0, 0)
        assert node._kicked and node.rings_heard == 1
    finally:
        peer.close()
        node.sock.close()


async def test_the_doorbell_callback_takes_one_datagram_and_a_drain_takes_all() -> None:
    """The loop calls the callback again while a datagram waits (its reader is
    level-triggered): one read per call, no read that finds nothing after the ring."""
    node, link, peer = _node()
    try:
        for _ in range(3):
            peer.sendto(b"\x01", node._addresses[0])
        node._readable(False)
        assert node.rings_heard == 1 and node._kicked
        node._readable()
        assert node.rings_heard == 3
        node._readable(False)  # nothing there: nothing taken
        assert node.rings_heard == 3
    finally:
        peer.close()
        node.sock.close()


async def test_a_segment_handed_over_is_not_taken_for_a_ring() -> None:
    node, link, peer = _node()
    fd = os.memfd_create("test-segment", os.MFD_CLOEXEC)
    try:
        node._waiter = asyncio.get_running_loop().create_future()
        peer.sendmsg([b"w1"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", [fd]))], 0,
                     node._addresses[0])
        node._readable()
        got = node._offers.pop("w1")
        assert os.fstat(got).st_ino == os.fstat(fd).st_ino
        os.close(got)
        assert link.channels.polls == 0 and node.rings_heard == 0
    finally:
        node._waiter = None
        os.close(fd)
        peer.close()
        node.sock.close()


async def _stop(task: asyncio.Task[None], node: Node, peer: socket.socket) -> None:
    """End a node's poll task, and the node."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    node._links.clear()
    peer.close()
    node.sock.close()


async def test_a_wake_whose_records_the_callback_took_counts_as_activity(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank with a core of its own spins after activity; the records that woke it were
    taken in the callback, so the poll task finds nothing: it must spin all the same, not
    arm again at once."""
    monkeypatch.setattr(shm, "SPIN", 60.0)  # spins past the end of the test
    node, link, peer = _node()
    node.crowded = False
    channels = link.channels
    channels.records = 0
    task = asyncio.get_running_loop().create_task(node._run())
    try:
        for _ in range(10):  # it finds nothing, arms, and sleeps
            await asyncio.sleep(0)
        assert node._waiter is not None and channels.arms == 1
        channels.records = 1
        peer.sendto(b"\x01", node._addresses[0])
        node._readable()
        channels.records = 0
        for _ in range(10):
            await asyncio.sleep(0)
        assert channels.polls > 2 and channels.arms == 1 and node._waiter is None
    finally:
        await _stop(task, node, peer)


async def _asleep(node: Node, peer: socket.socket) -> asyncio.Task[None]:
    """The node's poll task, once it found nothing, armed and sleeps (``peer`` bound as
    group rank 1, the node's peer)."""
    peer.bind(node._addresses[1])
    node.crowded = False
    node._links[0].channels.records = 0
    task = asyncio.get_running_loop().create_task(node._run())
    for _ in range(10):
        await asyncio.sleep(0)
    assert node._waiter is not None
    return task


async def test_a_node_that_rang_a_sleeping_peer_sleeps_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A send from a sleeping node rings its sleeping peer's doorbell: the node then arms
    and sleeps at once, not spin (its core is the peer's to run on, where the other cores
    are busy), and the peer was rung."""
    monkeypatch.setattr(shm, "SPIN", 60.0)  # a spin would last past the end of the test
    node, link, peer = _node()
    task = await _asleep(node, peer)
    try:
        node.wake(1)  # what a send to the armed peer does: ring it, and kick
        node.kick()
        for _ in range(10):
            await asyncio.sleep(0)
        assert peer.recv(8) == b"\x01"
        assert node._waiter is not None and link.channels.arms == 2
    finally:
        await _stop(task, node, peer)


async def test_a_node_a_doorbell_woke_spins_after_ringing_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node woken by a peer's doorbell that rings a sleeping peer back (an answer) spins
    all the same: the exchange goes on awake, not from doorbell to doorbell."""
    monkeypatch.setattr(shm, "SPIN", 60.0)  # spins past the end of the test
    node, link, peer = _node()
    task = await _asleep(node, peer)
    try:
        peer.sendto(b"\x01", node._addresses[0])
        node._readable()
        await asyncio.sleep(0)
        node.wake(1)
        node.kick()
        for _ in range(10):
            await asyncio.sleep(0)
        assert node._waiter is None and link.channels.arms == 1
        assert link.channels.polls > 3
    finally:
        await _stop(task, node, peer)


async def test_a_node_that_took_a_record_spins_after_ringing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that took a record since it last slept (woken by its own send, not a
    doorbell) spins after ringing a sleeping peer all the same: an exchange under way."""
    monkeypatch.setattr(shm, "SPIN", 60.0)  # spins past the end of the test
    node, link, peer = _node()
    task = await _asleep(node, peer)
    try:
        link.channels.records = 1
        node.kick()
        await asyncio.sleep(0)
        link.channels.records = 0
        node.wake(1)
        node.kick()
        for _ in range(10):
            await asyncio.sleep(0)
        assert node._waiter is None and link.channels.arms == 1
    finally:
        await _stop(task, node, peer)


class _Ring:
    """A ring whose record lands while the node looks at it (``ready``), after its poll
    found nothing; with ``stuck``, a record always there that no poll takes."""

    def __init__(self, events: list[str], channels: Channels, stuck: bool) -> None:
        self.events = events
        self.channels = channels
        self.stuck = stuck
        self.coming = False

    def ready(self) -> bool:
        self.events.append("ready")
        if self.coming:
            self.coming = False
            self.channels.records = 1
        return self.stuck or self.channels.records > 0


async def _spin_with_a_record(monkeypatch: pytest.MonkeyPatch, stuck: bool) -> list[str]:
    """What a spinning node does (the Python steps) while another task runs: a record
    comes each time that task runs (``tick``), or (``stuck``) one is always there that the
    poll never takes (a stopped link's).  The events, in order."""
    monkeypatch.setattr(shm, "SPIN", 60.0)  # spins past the end of the test
    node, link, peer = _node()
    node.crowded = False
    channels = link.channels
    events: list[str] = []
    channels.records = 1  # activity: it spins from then on
    ring = _Ring(events, channels, stuck)
    channels.incoming = [(1, ring)]
    polled = channels.poll

    def poll() -> bool:
        events.append("poll")
        hit = polled()
        channels.records = 0  # taken
        return hit

    channels.poll = poll  # type: ignore[method-assign]
    task = asyncio.get_running_loop().create_task(node._run())
    try:
        for _ in range(3):
            await asyncio.sleep(0)
        events.clear()
        for _ in range(6):
            ring.coming = not stuck
            events.append("tick")
            await asyncio.sleep(0)
        return events
    finally:
        await _stop(task, node, peer)


async def test_a_record_found_while_spinning_is_taken_in_the_same_turn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    events = await _spin_with_a_record(monkeypatch, stuck=False)
    turns = "".join(e[0] for e in events).split("t")[1:]
    # Each turn of the loop: the poll finds nothing, a look finds the record, and the poll
    # takes it at once, before the loop turns (the other task runs again).
    assert len(turns) == 6 and all(t == "prp" for t in turns), events


async def test_a_record_the_poll_never_takes_does_not_keep_the_loop_from_turning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    events = await _spin_with_a_record(monkeypatch, stuck=True)
    turns = "".join(e[0] for e in events).split("t")[1:]
    assert len(turns) == 6 and all(t.count("p") <= 2 for t in turns), events


class _Crowded:
    """A node of a group with more processes than cores, whose poll task's clock the test
    moves (``now``), its ``sched_yield``s counted (``yields``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 0.0
        self.yields = 0
        monkeypatch.setattr(shm, "time", self)
        monkeypatch.setattr(shm, "sched_yield", self.sched_yield)
        self.node, self.link, self.peer = _node()
        self.node.crowded = True

    def perf_counter(self) -> float:
        return self.now

    def sched_yield(self) -> None:
        self.yields += 1

    async def running(self) -> asyncio.Task[None]:
        """The node's poll task, started: its first poll found a record at time 0
        (activity), and there is nothing more to find."""
        task = asyncio.get_running_loop().create_task(self.node._run())
        await asyncio.sleep(0)
        self.link.channels.records = 0
        return task

    async def until_asleep(self) -> int:
        """Turns of the loop (the clock moving ``CROWDED_SPIN / 8`` each) until the node
        sleeps: the ``sched_yield``s it made meanwhile."""
        before = self.yields
        for _ in range(100):
            await asyncio.sleep(0)
            self.now += shm.CROWDED_SPIN / 8
            if self.node._waiter is not None:
                break
        assert self.node._waiter is not None
        return self.yields - before


async def test_a_crowded_node_spins_a_bounded_while_giving_its_core_away(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With more processes than cores, after activity a node looks at its rings for
    ``CROWDED_SPIN``, giving its core away after each look that found nothing, a burst of
    looks per turn of the loop (the loop keeps turning); then it arms and sleeps, and
    gives nothing away any more."""
    clock = _Crowded(monkeypatch)
    node, channels = clock.node, clock.link.channels
    step = shm.CROWDED_SPIN / 8
    task = await clock.running()
    try:
        turns = []
        while node._waiter is None and len(turns) < 100:
            before = clock.yields
            await asyncio.sleep(0)
            turns.append((clock.now, clock.yields - before, channels.arms))
            clock.now += step
        # A burst of looks each turn while the spin lasts, each giving the core away...
        spinning = [t for t in turns if t[0] < shm.CROWDED_SPIN]
        assert len(spinning) >= 7, turns
        assert all(n == shm.BURST and arms == 0 for _, n, arms in spinning[1:]), turns
        # ... then, its bound passed, it arms at once and sleeps.
        assert node._waiter is not None and channels.arms == 1, turns
        assert turns[-1][0] <= shm.CROWDED_SPIN + step, turns
        asleep = clock.yields
        for _ in range(5):
            clock.now += step
            await asyncio.sleep(0)
        assert clock.yields == asleep and channels.arms == 1
    finally:
        await _stop(task, node, clock.peer)


def test_a_crowded_node_keeps_its_core_when_it_rings_peers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A crowded node that rings sleeping peers (a server replying to its workers) gives
    no core away per ring: every peer is rung before any of them runs."""
    clock = _Crowded(monkeypatch)
    node, peer = clock.node, clock.peer
    second = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    node._addresses.append(shm._address(node.group, 2))
    try:
        peer.bind(node._addresses[1])
        second.bind(node._addresses[2])
        node.wake(1)
        node.wake(2)
        assert clock.yields == 0
        assert peer.recv(8) == b"\x01" and second.recv(8) == b"\x01"
    finally:
        for sock in (second, peer, node.sock):
            sock.close()


async def test_a_crowded_node_spins_only_while_its_waits_end_within_a_spin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A wait that outlasted ``CROWDED_SPIN`` (the cores busy with other work, or a slow
    peer) turns the spin off: after the next activity the node arms at once, giving
    nothing away; a wait shorter than it turns it on again."""
    clock = _Crowded(monkeypatch)
    node, channels = clock.node, clock.link.channels
    step = shm.CROWDED_SPIN / 8
    task = await clock.running()
    wait_for_sleep = clock.until_asleep

    try:
        assert await wait_for_sleep() >= 7 * shm.BURST  # a spin
        arms = channels.arms
        clock.now += 10 * shm.CROWDED_SPIN  # a long wait
        node.kick()
        assert await wait_for_sleep() == 0 and channels.arms == arms + 1  # no spin
        clock.now += step  # a short wait
        node.kick()
        assert await wait_for_sleep() >= 7 * shm.BURST  # spinning again
        assert channels.arms == arms + 2
    finally:
        await _stop(task, node, clock.peer)


def _bound_peer(node: Node) -> socket.socket:
    """A socket where rank 1 of ``node``'s group listens: what rings it there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
    sock.bind(node._addresses[1])
    return sock


def _datagrams(sock: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(sock.recv(64))
        except BlockingIOError:
            return out


@pytest.mark.skipif(not hasattr(os, "eventfd"), reason="no eventfd")
def test_a_peer_is_rung_on_its_eventfd_once_it_said_its_number() -> None:
    """Until rank 1 says its eventfd's number, it is rung on its socket; then on its
    eventfd, taken with ``pidfd_getfd`` (here from this very process), and its socket hears
    nothing more."""
    node, _, spare = _node()
    spare.close()
    peer = _bound_peer(node)
    bell = os.eventfd(0, os.EFD_NONBLOCK)
    pidfd = os.pidfd_open(os.getpid())
    try:
        node._pidfds[1] = pidfd
        node.wake(1)
        assert _datagrams(peer) == [b"\x01"]
        node._heard_eventfd(f"1 {bell}".encode())
        node.wake(1)
        node.wake(1)
        assert _datagrams(peer) == [] and os.eventfd_read(bell) == 2
        assert node._peer_eventfds[1] not in (None, bell)  # this process's copy of it
    finally:
        for fd in (bell, pidfd, *filter(None, node._peer_eventfds.values())):
            os.close(fd)
        peer.close()
        node.sock.close()


@pytest.mark.skipif(not hasattr(os, "eventfd"), reason="no eventfd")
def test_a_peer_whose_eventfd_cannot_be_taken_is_rung_on_its_socket(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel refuses ``pidfd_getfd`` (an old kernel, no permission), each ring
    goes to the socket, and the call is not tried again."""
    node, _, spare = _node()
    spare.close()
    peer = _bound_peer(node)
    tried = []

    def refuse(pidfd: int, fd: int) -> int:
        tried.append(fd)
        raise PermissionError(1, "refused")

    monkeypatch.setattr(shm, "pidfd_getfd", refuse)
    try:
        node._pidfds[1] = -1
        node._heard_eventfd(b"1 7")
        node.wake(1)
        node.wake(1)
        assert _datagrams(peer) == [b"\x01", b"\x01"] and tried == [7]
    finally:
        peer.close()
        node.sock.close()


@pytest.mark.skipif(not hasattr(os, "eventfd"), reason="no eventfd")
async def test_a_ring_on_the_eventfd_that_finds_the_node_asleep_is_taken_at_once() -> None:
    """As a ring on the socket: the records are taken in the callback, the poll task wakes;
    a callback that finds nothing (the count read already) does nothing."""
    node, link, peer = _node()
    try:
        assert node.eventfd is not None
        waiter = node._waiter = asyncio.get_running_loop().create_future()
        os.eventfd_write(node.eventfd, 1)
        node._rung()
        assert (link.channels.polls, link.channels.disarms) == (1, 1)
        assert waiter.done() and node.rings_heard == 1
        node._rung()
        assert node.rings_heard == 1 and link.channels.polls == 1
    finally:
        node._waiter = None
        peer.close()
        node.sock.close()


@pytest.mark.skipif(not hasattr(os, "eventfd"), reason="no eventfd")
def test_a_node_tells_its_peers_its_eventfd_as_it_watches_them() -> None:
    node, _, spare = _node()
    spare.close()
    peer = _bound_peer(node)
    try:
        node.watch([os.getpid(), os.getpid()])
        assert _datagrams(peer) == [shm._EVENTFD + f"0 {node.eventfd}".encode()]
    finally:
        for fd in node._pidfds.values():
            os.close(fd)
        peer.close()
        node.sock.close()


class _Turn:
    """The node's turn in C as ``before_wait`` uses it: its looks (``spin``: whether one
    finds a record, ``found``) and its polls counted."""

    def __init__(self, found: bool) -> None:
        self.found = found
        self.spins: list[tuple[int, bool]] = []
        self.polls = 0

    def spin(self, burst: int, share: bool) -> bool:
        self.spins.append((burst, share))
        return self.found

    def poll(self) -> bool:
        self.polls += 1
        return True


@pytest.mark.parametrize("crowded", [True, False])
async def test_a_recv_about_to_wait_looks_once_more_and_takes_what_came(
        crowded: bool) -> None:
    """``before_wait``: a burst of looks, as the poll task's spin (the core given away after
    each empty look where crowded); a record found is taken at once, and the poll task
    hears of it (activity), woken if it slept."""
    node, _, peer = _node()
    node.crowded = crowded
    try:
        turn = node._native = _Turn(found=True)
        waiter = node._waiter = asyncio.get_running_loop().create_future()
        node.before_wait()
        assert turn.spins == [(shm.BURST, True) if crowded else (shm.SPIN_BURST, False)]
        assert turn.polls == 1 and node._took_at > 0.0 and waiter.done()
        node._took_at = 0.0
        turn.found = False  # nothing came: nothing taken
        node.before_wait()
        assert len(turn.spins) == 2 and turn.polls == 1 and node._took_at == 0.0
    finally:
        node._waiter = node._native = None
        peer.close()
        node.sock.close()


def test_a_recv_about_to_wait_does_not_look_after_ringing_a_sleeping_peer() -> None:
    """No looks after ringing a sleeping peer (its core is the woken peer's): the recv
    waits on the loop at once."""
    node, _, peer = _node()
    node.crowded = True
    try:
        turn = node._native = _Turn(found=True)
        node._rang = True
        node.before_wait()
        assert turn.spins == [] and turn.polls == 0 and node._took_at == 0.0
    finally:
        node._native = None
        peer.close()
        node.sock.close()


async def test_a_record_a_recv_took_before_waiting_counts_as_activity(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The records a recv took itself (``before_wait``) keep the poll task spinning as its
    own would: the spin runs ``CROWDED_SPIN`` from then, not from its own last find."""
    clock = _Crowded(monkeypatch)
    node, channels = clock.node, clock.link.channels
    step = shm.CROWDED_SPIN / 8
    task = await clock.running()
    try:
        for _ in range(6):
            clock.now += step
            await asyncio.sleep(0)
        node._took_at = clock.now  # a recv took a record at 6 steps
        for _ in range(6):  # past the spin's end counted from time 0
            clock.now += step
            await asyncio.sleep(0)
        assert node._waiter is None and channels.arms == 0
        for _ in range(10):
            clock.now += step
            await asyncio.sleep(0)
        assert node._waiter is not None and channels.arms == 1
    finally:
        await _stop(task, node, clock.peer)


async def test_a_crowded_node_times_its_waits_from_the_last_record_a_recv_took(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the recvs take the records themselves (``before_wait``), the poll task turns
    seldom: the time since its own last find is no wait, and must not turn its spin off;
    the wait is timed from the last record a recv took."""
    clock = _Crowded(monkeypatch)
    node = clock.node
    step = shm.CROWDED_SPIN / 8
    task = await clock.running()
    try:
        while node._waiter is None:  # its spin, then asleep
            clock.now += step
            await asyncio.sleep(0)
        clock.now += 10 * shm.CROWDED_SPIN  # the poll task saw nothing meanwhile...
        node._took_at = clock.now  # ... but a recv took a record just now
        node.kick()
        assert await clock.until_asleep() >= 7 * shm.BURST  # spinning, not asleep at once
    finally:
        await _stop(task, node, clock.peer)
