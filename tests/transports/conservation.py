"""Conservation under cancellation: randomized programs that cancel and time out sends and
recvs at random points, and the invariant every transport must keep.

The invariant: every message whose send succeeded is received exactly once, intact and in
order; no message whose send was withdrawn (cancelled, timed out) is ever received; and a
recv that raised leaves its buffer untouched.

A ``Plan`` is drawn by hypothesis (``plans()``).  Rank 0 sends the plan's messages to rank
1 on one tag, each with its way of being cancelled; rank 1 receives with its own cycle of
cancellations until rank 0's manifest (the list of sends that succeeded) arrives, then
drains what is left and checks the invariant.  Programs synchronise with messages only, so
the same plan runs in-process (``test_conservation.py``), on the virtual clock, on the
cluster model and under ``mpiexec`` (``mpi_conservation_runner.py``).
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
#: inline, and one copied on a worker thread (odd-sized).
SIZES = (0, 8, ac.EAGER_LIMIT, ac.EAGER_LIMIT + 1, 1 << 20, (4 << 20) + 8)
LARGEST = max(SIZES)
SEND_MODES = ("send", "isend", "req_cancel", "task_cancel", "timeout0", "timeout_tiny",
              "asyncio_timeout")
RECV_MODES = ("recv", "any_source", "req_cancel", "task_cancel", "timeout0", "timeout_tiny",
              "asyncio_timeout")
#: Seconds: short enough to expire while a peer is busy, long enough to sometimes not.
TINY = 1e-4
DATA, MANIFEST, DONE = 1, 2, 3
SENTINEL = 0xEE


@dataclass(frozen=True)
class Plan:
    """Rank 0's sends (size index, mode, loop turns before cancelling) and rank 1's recv
    attempts (mode, loop turns), used in a cycle."""

    sends: tuple[tuple[int, str, int], ...]
    recvs: tuple[tuple[str, int], ...]


def plans(max_sends: int = 10) -> st.SearchStrategy[Plan]:
    send = st.tuples(st.integers(0, len(SIZES) - 1), st.sampled_from(SEND_MODES),
                     st.integers(0, 3))
    recv = st.tuples(st.sampled_from(RECV_MODES), st.integers(0, 3))
    return st.builds(
        Plan,
        sends=st.lists(send, min_size=1, max_size=max_sends).map(tuple),
        # A plain recv ends every cycle, so rendezvous sends always find a taker.
        recvs=st.lists(recv, min_size=0, max_size=6).map(lambda r: (*r, ("recv", 0))),
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


async def _send_one(comm: ac.Communicator, msg: np.ndarray[Any, Any], mode: str,
                    k: int) -> bool | ac.Request:
    """Send one message; True (sent), False (withdrawn), or a request to settle later."""
    if mode == "send":
        await comm.send(msg, 1, DATA)
        return True
    if mode == "isend":
        return comm.isend(msg, 1, DATA)
    if mode == "req_cancel":
        req = comm.isend(msg, 1, DATA)
        await turns(k)
        return False if req.cancel() else req
    if mode == "task_cancel":
        task = asyncio.ensure_future(comm.send(msg, 1, DATA))
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
                await comm.send(msg, 1, DATA)
        else:
            await comm.send(msg, 1, DATA, timeout=0 if mode == "timeout0" else TINY)
    except TimeoutError:  # CommTimeoutError is one too
        return False
    return True


async def sender(comm: ac.Communicator, plan: Plan) -> list[tuple[int, int]]:
    outcomes: list[bool | ac.Request] = []
    msgs = []
    for ident, (size, mode, k) in enumerate(plan.sends):
        msg = payload(SIZES[size], ident)
        msgs.append(msg)
        outcomes.append(await _send_one(comm, msg, mode, k))
    sent = []
    for ident, outcome in enumerate(outcomes):
        if isinstance(outcome, ac.Request):
            try:
                await outcome
                outcome = True
            except asyncio.CancelledError:
                outcome = False
        if outcome:
            sent.append(identify(msgs[ident], msgs[ident].size))
    manifest = np.array([len(sent), *(x for pair in sent for x in pair)], np.int64)
    await comm.send(manifest, 1, MANIFEST)
    await comm.recv(np.zeros(1, np.int64), 1, DONE)  # the receiver has checked
    return sent


# -- rank 1 ------------------------------------------------------------------------------------


class _Received:
    """What rank 1 got, checked as it arrives."""

    def __init__(self) -> None:
        self.got: list[tuple[int, int]] = []

    def took(self, buf: np.ndarray[Any, Any], status: ac.Status) -> None:
        nbytes = status.nbytes
        check(status.source == 0 and status.tag == DATA, f"status {status}")
        size, ident = identify(buf, nbytes)
        if ident >= 0:
            check(np.array_equal(buf[:nbytes], payload(nbytes, ident)),
                  f"message {ident} ({nbytes} B) arrived corrupted")
        check(not (buf[nbytes:nbytes + 64] != SENTINEL).any(), "written past the message")
        self.got.append((size, ident))

    def untouched(self, buf: np.ndarray[Any, Any], how: str) -> None:
        check(bool((buf[:4096] == SENTINEL).all()) and bool((buf[-4096:] == SENTINEL).all()),
              f"a recv that {how} wrote its buffer")


async def _settle_recv(req: ac.Request, buf: np.ndarray[Any, Any], seen: _Received) -> None:
    if not req.cancel():  # matched: its message is ours
        seen.took(buf, await req)
    else:
        seen.untouched(buf, "was cancelled")


async def _recv_one(comm: ac.Communicator, mode: str, k: int, manifest: ac.Request,
                    seen: _Received) -> None:
    buf = np.full(LARGEST, SENTINEL, np.uint8)
    if mode in ("recv", "any_source"):
        req = comm.irecv(buf, 0 if mode == "recv" else ac.ANY_SOURCE, DATA)
        await ac.wait_any([req, manifest])
        if req.done():
            seen.took(buf, await req)
        else:
            await _settle_recv(req, buf, seen)
        return
    if mode == "req_cancel":
        req = comm.irecv(buf, 0, DATA)
        await turns(k)
        await _settle_recv(req, buf, seen)
        return
    if mode == "task_cancel":
        task = asyncio.ensure_future(comm.recv(buf, 0, DATA))
        await turns(k)
        task.cancel()
        try:
            status = await task
        except asyncio.CancelledError:
            seen.untouched(buf, "was cancelled")
        else:
            seen.took(buf, status)
        return
    try:
        if mode == "asyncio_timeout":
            async with asyncio.timeout(TINY):
                status = await comm.recv(buf, 0, DATA)
        else:
            status = await comm.recv(buf, 0, DATA, timeout=0 if mode == "timeout0" else TINY)
    except TimeoutError:
        seen.untouched(buf, "timed out")
    else:
        seen.took(buf, status)


async def receiver(comm: ac.Communicator, plan: Plan) -> list[tuple[int, int]]:
    seen = _Received()
    box = np.zeros(2 * len(plan.sends) + 1, np.int64)
    manifest = comm.irecv(box, 0, MANIFEST)
    i = 0
    while not manifest.done():
        mode, k = plan.recvs[i % len(plan.recvs)]
        i += 1
        await _recv_one(comm, mode, k, manifest, seen)
    count = int(box[0])
    sent = [(int(box[1 + 2 * j]), int(box[2 + 2 * j])) for j in range(count)]
    while len(seen.got) < len(sent):
        # Every send that succeeded was announced before the manifest (one sender's
        # messages arrive in order): what is not here now was lost.
        check(comm.iprobe(0, DATA) is not None,
              f"lost: received {seen.got}, but the sends that succeeded were {sent}")
        buf = np.full(LARGEST, SENTINEL, np.uint8)
        seen.took(buf, await comm.recv(buf, 0, DATA))
    check(seen.got == sent, f"received {seen.got}, but the sends that succeeded were {sent}")
    check(comm.iprobe(0, DATA) is None, "a withdrawn message arrived")
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
