"""Conservation under cancellation: randomized programs that cancel and time out sends and
recvs at random points, and the invariant every transport must keep.

The invariant: every message whose send succeeded is received exactly once, intact and in
order; no message whose send was withdrawn (cancelled, timed out) is ever received; and a
recv that raised leaves its buffer untouched.

A ``Plan`` is drawn by hypothesis (``plans()``).  Rank 0 sends the plan's messages to rank
1 on one tag, each with its way of being cancelled or timed out, on the default stream or
awaited on a stream of the rank's own (arrays, or in half the plans Python
objects holding them: ``send_obj``, whose buffers travel as messages of their own); rank 1
receives with its own cycle of cancellations until rank 0's manifest (the list of sends
that succeeded) arrives, then drains what is left and checks the invariant.  One of its
ways is a ``sendrecv`` (a message to itself, and the recv) whose task is cancelled: what
it sent to itself must arrive exactly when the send went.  Programs
synchronise with messages only, so the same plan runs in-process
(``test_conservation.py``), on the virtual clock, on the cluster model and under
``mpiexec`` (``mpi_conservation_runner.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

import asynccomm as ac

#: Sizes in bytes: empty, one element, the eager limit, just above it, a rendezvous copied
#: inline, and two copied on a worker thread (odd-sized).
SIZES = (0, 8, ac.EAGER_LIMIT, ac.EAGER_LIMIT + 1, 1 << 20, (4 << 20) + 8, (8 << 20) + 24)
LARGEST = max(SIZES)
SEND_MODES = ("send", "isend", "req_cancel", "task_cancel", "timeout0", "timeout_tiny",
              "asyncio_timeout", "stream", "stream_timeout")
RECV_MODES = ("recv", "any_source", "req_cancel", "task_cancel", "timeout0", "timeout_tiny",
              "asyncio_timeout", "sendrecv_cancel", "stream_timeout")
#: Seconds: short enough to expire while a peer is busy, long enough to sometimes not.
TINY = 1e-4
#: The timeout of the awaited modes that have one ("stream": an awaited send on a stream
#: of the rank's own, idle when posted; objects have no streams, and go the default one).
TIMEOUTS = {"timeout0": 0.0, "timeout_tiny": TINY, "stream": None, "stream_timeout": TINY}
DATA, MANIFEST, DONE, ECHO = 1, 2, 3, 4
SENTINEL = 0xEE


@dataclass(frozen=True)
class Plan:
    """Rank 0's sends (size index, mode, loop turns before cancelling) and rank 1's recv
    attempts (mode, loop turns), used in a cycle."""

    sends: tuple[tuple[int, str, int], ...]
    recvs: tuple[tuple[str, int], ...]
    objects: bool = False


def plans(max_sends: int = 10) -> st.SearchStrategy[Plan]:
    send = st.tuples(st.integers(0, len(SIZES) - 1), st.sampled_from(SEND_MODES),
                     st.integers(0, 3))
    recv = st.tuples(st.sampled_from(RECV_MODES), st.integers(0, 3))
    return st.builds(
        Plan,
        sends=st.lists(send, min_size=1, max_size=max_sends).map(tuple),
        # A plain recv ends every cycle, so rendezvous sends always find a taker.
        recvs=st.lists(recv, min_size=0, max_size=6).map(lambda r: (*r, ("recv", 0))),
        objects=st.booleans(),
    )


def payload(nbytes: int, ident: int) -> np.ndarray[Any, Any]:
    """Message ``ident``: its id in the first 8 bytes, then bytes that differ per id."""
    period = ((np.arange(251) * 7 + ident) % 251).astype(np.uint8)
    out = np.resize(period, nbytes)
    if nbytes >= 8:
        out[:8].view(np.int64)[0] = ident
    return out


def identify(buf: np.ndarray[Any, Any], nbytes: int) -> tuple[int, int]:
    """(size, id) of a received message (id -1 for messages too short to carry one)."""
    return nbytes, int(buf[:8].view(np.int64)[0]) if nbytes >= 8 else -1


class Broken(AssertionError):
    """The invariant does not hold."""


def check(cond: object, what: str) -> None:
    if not cond:
        raise Broken(what)


async def turns(k: int) -> None:
    for _ in range(k):
        await asyncio.sleep(0)


# -- rank 0 ------------------------------------------------------------------------------------


async def _send_one(comm: ac.Communicator, msg: np.ndarray[Any, Any], ident: int,
                    objects: bool, mode: str, k: int) -> bool | ac.Request | ac.TaskRequest:
    """Send one message (or an object holding it); True (sent), False (withdrawn), or a
    request to settle later."""
    obj = {"id": ident, "data": msg}

    def start() -> ac.Request | ac.TaskRequest:
        return comm.isend_obj(obj, 1, DATA) if objects else comm.isend(msg, 1, DATA)

    async def send(timeout: float | None = None, on_stream: bool = False) -> None:
        await (comm.send_obj(obj, 1, DATA, timeout=timeout) if objects
               else comm.send(msg, 1, DATA, timeout=timeout,
                              stream=comm.stream() if on_stream else None))

    if mode == "send":
        await send()
        return True
    if mode == "isend":
        return start()
    if mode == "req_cancel":
        req = start()
        await turns(k)
        req.cancel()  # withdrawn, or it completes: settled later
        return req
    if mode == "task_cancel":
        task = asyncio.ensure_future(send())
        await turns(k)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return False
        return True
    try:
        if mode == "asyncio_timeout":
            async with asyncio.timeout(TINY):
                await send()
        else:
            await send(timeout=TIMEOUTS[mode], on_stream=mode.startswith("stream"))
    except TimeoutError:  # CommTimeoutError is one too
        return False
    return True


async def sender(comm: ac.Communicator, plan: Plan) -> list[tuple[int, int]]:
    outcomes: list[bool | ac.Request | ac.TaskRequest] = []
    msgs = []
    for ident, (size, mode, k) in enumerate(plan.sends):
        msg = payload(SIZES[size], ident)
        msgs.append(msg)
        outcomes.append(await _send_one(comm, msg, ident, plan.objects, mode, k))
    sent = []
    for ident, outcome in enumerate(outcomes):
        if not isinstance(outcome, bool):
            try:
                await outcome
                outcome = True
            except asyncio.CancelledError:
                outcome = False
        if outcome:
            sent.append((msgs[ident].size, ident) if plan.objects
                        else identify(msgs[ident], msgs[ident].size))
    manifest = np.array([len(sent), *(x for pair in sent for x in pair)], np.int64)
    await comm.send(manifest, 1, MANIFEST)
    await comm.recv(np.zeros(1, np.int64), 1, DONE)  # the receiver has checked
    return sent


# -- rank 1 ------------------------------------------------------------------------------------


class _Received:
    """What rank 1 got, checked as it arrives, and how many of its ``sendrecv``s' own
    messages (to itself, on ``ECHO``) went."""

    def __init__(self) -> None:
        self.got: list[tuple[int, int]] = []
        self.echoes = 0

    def took(self, buf: np.ndarray[Any, Any], status: ac.Status) -> None:
        nbytes = status.nbytes
        check(status.source == 0 and status.tag == DATA, f"status {status}")
        size, ident = identify(buf, nbytes)
        if ident >= 0:
            check(np.array_equal(buf[:nbytes], payload(nbytes, ident)),
                  f"message {ident} ({nbytes} B) arrived corrupted")
        check(not (buf[nbytes:nbytes + 64] != SENTINEL).any(), "written past the message")
        self.got.append((size, ident))

    def took_object(self, obj: Any, status: ac.Status) -> None:
        check(status.source == 0 and status.tag == DATA, f"status {status}")
        data = obj["data"]
        check(np.array_equal(data, payload(data.size, obj["id"])),
              f"object {obj['id']} ({data.size} B) arrived corrupted")
        self.got.append((data.size, obj["id"]))

    def untouched(self, buf: np.ndarray[Any, Any], how: str) -> None:
        check(bool((buf[:4096] == SENTINEL).all()) and bool((buf[-4096:] == SENTINEL).all()),
              f"a recv that {how} wrote its buffer")


class _Arrays:
    """Rank 1's recvs of arrays, into a fresh buffer each."""

    def __init__(self, comm: ac.Communicator, seen: _Received) -> None:
        self.comm, self.seen = comm, seen
        self.buf = np.full(LARGEST, SENTINEL, np.uint8)

    def start(self, src: int) -> ac.Request:
        return self.comm.irecv(self.buf, src, DATA)

    async def recv(self, timeout: float | None = None, on_stream: bool = False) -> ac.Status:
        return await self.comm.recv(self.buf, 0, DATA, timeout=timeout,
                                    stream=self.comm.stream() if on_stream else None)

    def took(self, result: ac.Status) -> None:
        self.seen.took(self.buf, result)

    def untouched(self, how: str) -> None:
        self.seen.untouched(self.buf, how)


class _Objects:
    """Rank 1's recvs of objects (nothing to leave untouched: ``recv_obj`` makes them)."""

    def __init__(self, comm: ac.Communicator, seen: _Received) -> None:
        self.comm, self.seen = comm, seen

    def start(self, src: int) -> ac.TaskRequest:
        return self.comm.irecv_obj(src, DATA)

    async def recv(self, timeout: float | None = None,
                   on_stream: bool = False) -> tuple[Any, ac.Status]:
        return await self.comm.recv_obj(0, DATA, timeout=timeout)

    def took(self, result: tuple[Any, ac.Status]) -> None:
        self.seen.took_object(*result)

    def untouched(self, how: str) -> None:
        pass


async def _cancelled_or_took(way: Any, op: Any) -> None:
    """The outcome of a recv whose request or task was cancelled: withdrawn, or (it had
    matched) its message."""
    try:
        result = await op
    except asyncio.CancelledError:
        way.untouched("was cancelled")
    except ac.CommTimeoutError:
        if not isinstance(way, _Objects):
            raise
        # its sender's send_obj timed out after the header went: the object was abandoned
    else:
        way.took(result)


async def _sendrecv_cancelled(comm: ac.Communicator, way: _Arrays, k: int, plan: Plan,
                              seen: _Received) -> None:
    """A ``sendrecv`` (a message to itself on ``ECHO``, a recv from rank 0) whose task is
    cancelled after ``k`` turns: each op is withdrawn, or went all the same (the
    cancellation's note names those), and what went is accounted for."""
    task = asyncio.ensure_future(comm.sendrecv(np.full(1, seen.echoes, np.int64), comm.rank,
                                               way.buf, 0, sendtag=ECHO, recvtag=DATA))
    await turns(k)
    task.cancel()
    try:
        status = await task
    except asyncio.CancelledError as exc:
        notes = "".join(getattr(exc, "__notes__", []))
        if "1 (recv, done)" in notes:  # its message arrived all the same: its size by id
            ident = -1 if bool((way.buf[:8] == SENTINEL).all()) else identify(way.buf, 8)[1]
            nbytes = 0 if ident < 0 else SIZES[plan.sends[ident][0]]
            way.took(ac.Status(0, DATA, nbytes, nbytes))
        else:
            way.untouched("was cancelled")
        seen.echoes += "0 (send, done)" in notes
    else:
        way.took(status)
        seen.echoes += 1


async def _recv_one(comm: ac.Communicator, objects: bool, mode: str, k: int,
                    manifest: ac.Request, seen: _Received, plan: Plan) -> None:
    way: Any = _Objects(comm, seen) if objects else _Arrays(comm, seen)
    if mode == "sendrecv_cancel":
        if not objects:
            await _sendrecv_cancelled(comm, way, k, plan, seen)
            return
        mode = "task_cancel"  # (a sendrecv of objects is not a thing)
    if mode in ("recv", "any_source", "req_cancel"):
        req = way.start(ac.ANY_SOURCE if mode == "any_source" else 0)
        if mode == "req_cancel":
            await turns(k)
        else:
            try:
                await ac.wait_any([req, manifest])
            except ac.CommTimeoutError:  # an abandoned object: told below
                pass
        if not req.done():
            req.cancel()  # withdrawn, or it completes: its message is ours
        await _cancelled_or_took(way, req)
        return
    if mode == "task_cancel":
        task = asyncio.ensure_future(way.recv())
        await turns(k)
        task.cancel()
        await _cancelled_or_took(way, task)
        return
    try:
        if mode == "asyncio_timeout":
            async with asyncio.timeout(TINY):
                result = await way.recv()
        else:
            result = await way.recv(timeout=TIMEOUTS[mode], on_stream=mode.startswith("stream"))
    except TimeoutError:  # (an object abandoned by its sender's timeout too)
        way.untouched("timed out")
    else:
        way.took(result)


async def receiver(comm: ac.Communicator, plan: Plan) -> list[tuple[int, int]]:
    seen = _Received()
    box = np.zeros(2 * len(plan.sends) + 1, np.int64)
    manifest = comm.irecv(box, 0, MANIFEST)
    i = 0
    while not manifest.done():
        mode, k = plan.recvs[i % len(plan.recvs)]
        i += 1
        await _recv_one(comm, plan.objects, mode, k, manifest, seen, plan)
    count = int(box[0])
    sent = [(int(box[1 + 2 * j]), int(box[2 + 2 * j])) for j in range(count)]
    while len(seen.got) < len(sent) or plan.objects and comm.iprobe(0, DATA) is not None:
        # Every send that succeeded was announced before the manifest (one sender's
        # messages arrive in order): what is not here now was lost.  Objects abandoned by
        # their sender's timeout after their header went are drained too: each fails.
        check(comm.iprobe(0, DATA) is not None,
              f"lost: received {seen.got}, but the sends that succeeded were {sent}")
        way = _Objects(comm, seen) if plan.objects else _Arrays(comm, seen)
        try:
            way.took(await way.recv())
        except ac.CommTimeoutError:
            if not plan.objects:
                raise
    check(seen.got == sent, f"received {seen.got}, but the sends that succeeded were {sent}")
    check(comm.iprobe(0, DATA) is None, "a withdrawn message arrived")
    echo = np.zeros(1, np.int64)
    for n in range(seen.echoes):  # each sendrecv's own message that went, once, in order
        await comm.recv(echo, comm.rank, ECHO)
        check(int(echo[0]) == n, f"echo {n} arrived as {int(echo[0])}")
    check(comm.iprobe(comm.rank, ECHO) is None, "a withdrawn sendrecv's message arrived")
    check(comm.statistics().pending_ops == 0, "ops left pending")
    await comm.send(np.zeros(1, np.int64), 0, DONE)
    return seen.got


def program(plan: Plan) -> Callable[[ac.Communicator], Awaitable[Any]]:
    """The SPMD program of ``plan`` (ranks above 1 take no part)."""
    async def conservation(comm: ac.Communicator) -> Any:
        if comm.size < 2 or comm.rank > 1:
            return None
        return await (sender if comm.rank == 0 else receiver)(comm, plan)

    return conservation
