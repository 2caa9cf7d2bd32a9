"""The transport contract: SPMD programs every transport must run the same way.

Each program is ``async def program(comm) -> result`` and runs on every rank of a world of
any size (at size 1 it passes trivially, like mpi4py's tests).  A program checks what it
sees with ``check`` and raises ``AssertionError`` when the transport broke the contract.
``test_local.py`` runs them in-process (``ac.run(program, world_size=n)``) and
``mpi_contract_runner.py`` under ``mpiexec`` (``ac.run(program)``), so in-process and MPI
are held to exactly the same semantics.

Programs synchronise with messages, never with sleeps: a marker message sent after an
operation arrives after everything that operation sent (one sender's control traffic is
ordered on every transport).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import asynccomm as ac
from asynccomm.testing import posted

Program = Callable[[ac.Communicator], Awaitable[Any]]

EAGER = ac.EAGER_LIMIT
BIG = EAGER + 1
#: Sizes in bytes: empty, tiny, the eager limit (inclusive), just above it, and a
#: multi-chunk rendezvous of an odd size.
SIZES = (0, 1, 8, EAGER, BIG, (4 << 20) + 3)
MARK = 30_000  # marker tags sit above the tags programs use
SHORT = 0.05  # seconds: timeouts that must expire
#: Seconds one program may take on one rank before it fails as hung.
PROGRAM_LIMIT = 30.0


def bounded(program: Program, limit: float = PROGRAM_LIMIT) -> Program:
    """``program`` failing with TimeoutError instead of hanging if it takes more than
    ``limit`` seconds."""
    async def run(comm: ac.Communicator) -> Any:
        async with asyncio.timeout(limit):
            return await program(comm)

    run.__name__ = program.__name__
    return run


def check(cond: object, what: str) -> None:
    if not cond:
        raise AssertionError(what)


@contextmanager
def raises(kind: type[BaseException], what: str) -> Iterator[None]:
    """Check that the block raises ``kind`` (pytest is not needed under mpiexec)."""
    try:
        yield
    except kind:
        return
    raise AssertionError(f"{what}: {kind.__name__} was not raised")


def pattern(nbytes: int, seed: int) -> np.ndarray[Any, Any]:
    """Bytes that differ with ``seed`` and repeat every 251 (prime) bytes, so a shifted or
    misplaced chunk shows."""
    period = ((np.arange(251) * 7 + seed) % 251).astype(np.uint8)
    return np.resize(period, nbytes)


def neighbours(comm: ac.Communicator) -> tuple[int, int]:
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


async def marker(comm: ac.Communicator, dst: int, value: int = 0, tag: int = MARK) -> None:
    await comm.send(np.array([value], np.int64), dst, tag)


async def wait_marker(comm: ac.Communicator, src: int, tag: int = MARK) -> int:
    box = np.zeros(1, np.int64)
    await comm.recv(box, src, tag)
    return int(box[0])


def is_mpi(comm: ac.Communicator) -> bool:
    """The ranks are in other processes (MPI, or processes over shared memory): only a
    receiver can tell whether a send it was announced may still be withdrawn."""
    return comm.device.name.startswith(("mpi:", "proc:"))


# -- data and sizes ----------------------------------------------------------------------------


async def ring_sizes(comm: ac.Communicator) -> int:
    """Every size, eager and rendezvous, around the ring, recv posted before and after."""
    if comm.size < 2:
        return 0
    right, left = neighbours(comm)
    for i, nbytes in enumerate(SIZES):
        out = np.full(nbytes, 0xEE, np.uint8)
        if i % 2:  # recv first
            rreq = comm.irecv(out, left, i)
            await comm.send(pattern(nbytes, comm.rank), right, i)
            status = await rreq
        else:
            sreq = comm.isend(pattern(nbytes, comm.rank), right, i)
            status = await comm.recv(out, left, i)
            await sreq
        check(status == ac.Status(left, i, nbytes, nbytes), f"status {status} for {nbytes} B")
        check(np.array_equal(out, pattern(nbytes, left)), f"{nbytes} B arrived corrupted")
    return len(SIZES)


async def ring_sizes_without_eager(comm: ac.Communicator) -> int:
    """``ring_sizes`` with ``eager_limit=0``: every non-empty message uses rendezvous."""
    return await ring_sizes(comm)


async def ring_sizes_with_a_large_eager_limit(comm: ac.Communicator) -> int:
    """``ring_sizes`` with a 1 MiB eager limit (MPI carries at most 64 KiB inline)."""
    return await ring_sizes(comm)


async def dtypes_and_counts(comm: ac.Communicator) -> None:
    """Typed buffers keep their dtype; ``count=`` sends a prefix; a shorter message fits."""
    if comm.size < 2 or comm.rank > 1:
        return
    if comm.rank == 0:
        await comm.send(np.arange(10, dtype=np.float32), 1, 1)
        await comm.send(np.arange(100_000, dtype=np.int64), 1, 2, count=50_000)
        await comm.send(b"bytes travel as uint8", 1, 3)
        return
    out = np.zeros(16, np.float32)
    st = await comm.recv(out, 0, 1)
    check(st.count == 10 and st.nbytes == 40 and out[9] == 9 and out[10] == 0, f"{st}")
    big = np.zeros(60_000, np.int64)
    st = await comm.recv(big, 0, 2)
    check(st.count == 50_000 and big[49_999] == 49_999 and big[50_000] == 0, f"{st}")
    raw = bytearray(64)
    st = await comm.recv(raw, 0, 3)
    check(bytes(raw[:st.nbytes]) == b"bytes travel as uint8", "bytes payload")


async def ring_exchange(comm: ac.Communicator) -> int:
    """A token once around the ring, then 4 MiB blocks to the right (examples/ring.py)."""
    if comm.size < 2:
        return 0
    right, left = neighbours(comm)
    token = np.zeros(1, np.int64)
    if comm.rank == 0:
        await comm.send(token, right, 1)
        await comm.recv(token, left, 1)
        check(token[0] == sum(range(comm.size)), f"token {token[0]}")
    else:
        await comm.recv(token, left, 1)
        token += comm.rank
        await comm.send(token, right, 1)
    block = np.full(1 << 20, comm.rank, np.float32)
    incoming = np.empty_like(block)
    st = await comm.sendrecv(block, right, incoming, left, sendtag=2, recvtag=2)
    check(st.source == left and st.nbytes == 4 << 20, f"{st}")
    check(bool((incoming == left).all()), "block corrupted")
    return int(token[0])


async def self_messages(comm: ac.Communicator) -> None:
    """A rank may send to itself, eager and rendezvous."""
    for nbytes in (8, (1 << 20) + 5):
        sreq = comm.isend(pattern(nbytes, 3), comm.rank, 4)
        out = np.zeros(nbytes, np.uint8)
        st = await comm.recv(out, comm.rank, 4)
        await sreq
        check(st.source == comm.rank and np.array_equal(out, pattern(nbytes, 3)), "self")


# -- matching --------------------------------------------------------------------------------


async def tags_select_messages(comm: ac.Communicator) -> None:
    """A recv takes the message with its tag, whatever arrived before."""
    if comm.size < 2 or comm.rank > 1:
        return
    if comm.rank == 0:
        for tag in (5, 6, 7):
            await comm.send(np.full(4, tag, np.int32), 1, tag)
        await comm.send(np.full(BIG // 4 + 1, 8, np.int32), 1, 8)  # rendezvous
        return
    for tag in (8, 7, 5, 6):
        out = np.zeros(BIG // 4 + 1, np.int32)
        st = await comm.recv(out, 0, tag)
        check(st.tag == tag and out[0] == tag, f"tag {tag} got {st}")


async def wildcards(comm: ac.Communicator) -> None:
    """ANY_SOURCE and ANY_TAG take every rank's message, each exactly once."""
    if comm.size < 2:
        return
    if comm.rank != 0:
        nbytes = 16 if comm.rank % 2 else BIG  # eager and rendezvous senders
        await comm.send(np.full(nbytes, comm.rank, np.uint8), 0, 100 + comm.rank)
        return
    seen = set()
    for _ in range(comm.size - 1):
        out = np.zeros(BIG, np.uint8)
        st = await comm.recv(out, ac.ANY_SOURCE, ac.ANY_TAG)
        check(st.tag == 100 + st.source and out[0] == st.source, f"{st}")
        seen.add(st.source)
    check(seen == set(range(1, comm.size)), f"sources {seen}")


async def non_overtaking(comm: ac.Communicator) -> None:
    """One sender's messages with one tag arrive in posting order, eager and rendezvous
    mixed, whether the recvs name the source or not."""
    if comm.size < 2:
        return
    n = 12
    if comm.rank != 0:
        reqs = [comm.isend(np.full(BIG if i % 3 == 0 else 8, i, np.uint8), 0, 9)
                for i in range(n)]
        await ac.wait_all(reqs)
        return
    nexts = dict.fromkeys(range(1, comm.size), 0)
    for k in range(n * (comm.size - 1)):
        out = np.zeros(BIG, np.uint8)
        src = ac.ANY_SOURCE if k % 2 else 1 + (k // 2) % (comm.size - 1)
        if src != ac.ANY_SOURCE and nexts[src] == n:
            src = ac.ANY_SOURCE
        st = await comm.recv(out, src, 9)
        check(out[0] == nexts[st.source], f"from {st.source}: got {out[0]}, "
              f"expected {nexts[st.source]}")
        nexts[st.source] += 1


async def unexpected_burst(comm: ac.Communicator) -> None:
    """Many eager messages arrive before any recv; all are staged and kept in order."""
    if comm.size < 2:
        return
    n = 200
    if comm.rank != 0:
        for i in range(n):
            await comm.send(np.array([comm.rank, i], np.int64), 0, 3)
        await marker(comm, 0)
        return
    for src in range(1, comm.size):
        await wait_marker(comm, src)
    check(comm.statistics().matcher.unexpected_messages == n * (comm.size - 1), "staged")
    for src in range(1, comm.size):
        for i in range(n):
            out = np.zeros(2, np.int64)
            await comm.recv(out, src, 3)
            check(list(out) == [src, i], f"{list(out)} != {[src, i]}")
    check(comm.statistics().pool.in_use_bytes == 0, "staging buffers released")


async def unexpected_beyond_the_pool(comm: ac.Communicator) -> None:
    """Run with a tiny staging pool: eager messages that find no recv and no pool space
    still arrive intact and in order, staging never passes the cap (across processes, the
    sender runs out of credit and waits for its recv), and the pool's accounting ends at
    zero."""
    if comm.size < 2 or comm.rank > 1:
        return
    if comm.rank == 0:  # in-process, sends that find the pool full wait for their recv
        reqs = [comm.isend(pattern(1000, i), 1, 6) for i in range(20)]
        await marker(comm, 1)
        await ac.wait_all(reqs)
        return
    await wait_marker(comm, 0)
    for i in range(20):
        out = np.zeros(1000, np.uint8)
        await comm.recv(out, 0, 6)
        check(np.array_equal(out, pattern(1000, i)), f"message {i}")
    pool = comm.statistics().pool
    check(pool.in_use_bytes == 0, "pool accounting")
    check(pool.peak_bytes <= pool.capacity_bytes, f"staged past the cap: {pool}")


async def large_transfers(comm: ac.Communicator) -> None:
    """Messages of more rendezvous chunks than a transfer keeps in flight, both ways at
    once, into larger buffers."""
    if comm.size < 2 or comm.rank > 1:
        return
    peer, nbytes = 1 - comm.rank, (40 << 20) + 5
    out = np.zeros(nbytes + 11, np.uint8)
    st = await comm.sendrecv(pattern(nbytes, comm.rank), peer, out, peer, sendtag=1,
                             recvtag=1)
    check(st.nbytes == nbytes and np.array_equal(out[:nbytes], pattern(nbytes, peer)),
          "large transfer corrupted")
    check(not out[nbytes:].any(), "written past the message")


# -- misfits: nothing lost -------------------------------------------------------------------


async def truncation_keeps_the_message(comm: ac.Communicator) -> None:
    """Too small a buffer fails the recv, leaves the buffer untouched, keeps the message."""
    if comm.size < 2 or comm.rank > 1:
        return
    sizes = (100, BIG + 100)
    if comm.rank == 0:
        for tag, nbytes in enumerate(sizes):
            await comm.send(pattern(nbytes, tag), 1, tag)
        return
    for tag, nbytes in enumerate(sizes):
        small = np.full(nbytes - 1, 9, np.uint8)
        with raises(ac.TruncationError, f"{nbytes} B into {nbytes - 1} B"):
            await comm.recv(small, 0, tag)
        check(bool((small == 9).all()), "truncated buffer was written")
        out = np.zeros(nbytes, np.uint8)
        st = await comm.recv(out, 0, tag)
        check(st.nbytes == nbytes and np.array_equal(out, pattern(nbytes, tag)), "kept")


async def dtype_mismatch_keeps_the_message(comm: ac.Communicator) -> None:
    """Another dtype fails the recv untouched; the message waits for recv_new."""
    if comm.size < 2 or comm.rank > 1:
        return
    counts = (10, BIG)
    if comm.rank == 0:
        for tag, n in enumerate(counts):
            await comm.send(np.arange(n, dtype=np.float32), 1, tag)
        return
    for tag, n in enumerate(counts):
        wrong = np.full(n, -1, np.int32)
        with raises(ac.DTypeMismatchError, "float32 into int32"):
            await comm.recv(wrong, 0, tag)
        check(bool((wrong == -1).all()), "mismatched buffer was written")
        arr, st = await comm.recv_new(0, tag)
        check(arr.dtype == np.float32 and st.count == n and arr[-1] == n - 1, f"{st}")


async def probes_and_recv_new(comm: ac.Communicator) -> None:
    """probe waits for a message, iprobe sees it, neither takes it; recv_new sizes it."""
    if comm.size < 2 or comm.rank > 1:
        return
    if comm.rank == 0:
        await wait_marker(comm, 1)  # rank 1 probes before anything is sent
        await comm.send(np.arange(7, dtype=np.int16), 1, 21)
        await comm.send(np.arange(BIG, dtype=np.uint8), 1, 22)
        return
    check(comm.iprobe(0, 21) is None, "iprobe saw a message that was not sent")
    probe = asyncio.ensure_future(comm.probe(0, 21))
    await marker(comm, 0)
    st = await probe
    check(st == ac.Status(0, 21, 14, 7), f"probe {st}")
    check(comm.iprobe(ac.ANY_SOURCE, 21) == st, "iprobe after probe")
    big = await comm.probe(0, 22)
    check(big.nbytes == BIG, f"{big}")
    arr, st2 = await comm.recv_new(0, 21)
    check(arr.dtype == np.int16 and list(arr) == list(range(7)) and st2 == st, "recv_new")
    arr, st3 = await comm.recv_new()
    check(st3 == big and arr.size == BIG and arr[-1] == (BIG - 1) % 256, "recv_new big")


# -- streams, batches, requests --------------------------------------------------------------


async def explicit_streams_in_order(comm: ac.Communicator) -> None:
    """An explicit stream posts its ops strictly in order, on both sides."""
    if comm.size < 2 or comm.rank > 1:
        return
    stream = comm.stream()
    tags = (3, 1, 2)
    if comm.rank == 0:
        reqs = [comm.isend(np.full(BIG, t, np.uint8), 1, t, stream=stream) for t in tags]
        await stream.synchronize()
        check(all(r.done() for r in reqs), "synchronize returned early")
        return
    outs = [np.zeros(BIG, np.uint8) for _ in tags]
    reqs = [comm.irecv(out, 0, t, stream=stream) for out, t in zip(outs, tags, strict=True)]
    event = stream.record()
    await event.synchronize()
    statuses = [r.status for r in reqs]
    check([s.tag for s in statuses if s] == list(tags), f"{statuses}")
    check(all(out[0] == t for out, t in zip(outs, tags, strict=True)), "stream data")


async def batch_and_sendrecv(comm: ac.Communicator) -> None:
    """batch posts everything at once (no deadlock in a ring of rendezvous sends)."""
    if comm.size < 2:
        return
    right, left = neighbours(comm)
    a, b = np.zeros(BIG, np.uint8), np.zeros(8, np.uint8)
    results = await comm.batch([
        ac.SendOp(np.full(BIG, comm.rank, np.uint8), right, 1),
        ac.SendOp(np.full(8, comm.rank, np.uint8), left, 2),
        ac.RecvOp(a, left, 1),
        ac.RecvOp(b, right, 2),
    ])
    check(results[:2] == [None, None], f"{results}")
    check(results[2] == ac.Status(left, 1, BIG, BIG) and a[0] == left, f"{results[2]}")
    check(results[3] == ac.Status(right, 2, 8, 8) and b[0] == right, f"{results[3]}")
    out = np.zeros(3, np.float64)
    st = await comm.sendrecv(np.full(3, comm.rank, np.float64), left, out, right,
                             sendtag=5, recvtag=5)
    check(st.source == right and out[0] == right, f"{st}")


async def wait_all_and_wait_any(comm: ac.Communicator) -> None:
    if comm.size < 2 or comm.rank > 1:
        return
    peer = 1 - comm.rank
    outs = [np.zeros(BIG if i % 2 else 4, np.uint8) for i in range(6)]
    recvs = [comm.irecv(out, peer, 40 + i) for i, out in enumerate(outs)]
    sends = [comm.isend(np.full(len(out), i, np.uint8), peer, 40 + i)
             for i, out in enumerate(outs)]
    results = await ac.wait_all(recvs + sends)
    check([r.tag for r in results[:6]] == list(range(40, 46)), f"{results}")
    check(results[6:] == [None] * 6, "send results")
    check(all(out[0] == i for i, out in enumerate(outs)), "wait_all data")
    reqs = [comm.irecv(np.zeros(1, np.uint8), peer, 50), comm.irecv(np.zeros(1, np.uint8),
                                                                     peer, 51)]
    await comm.send(np.ones(1, np.uint8), peer, 51)
    index, st = await ac.wait_any(reqs)
    check(index == 1 and st.tag == 51, f"{index} {st}")
    check(reqs[0].cancel(), "cancel the other")
    # Neither rank may close while the other still has a recv posted for it.
    await comm.sendrecv(np.zeros(1), peer, np.zeros(1), peer, sendtag=52, recvtag=52)


# -- cancellation and timeouts ---------------------------------------------------------------


async def cancelled_recvs_lose_nothing(comm: ac.Communicator) -> None:
    """req.cancel(), task cancellation and asyncio.timeout withdraw recvs; the messages
    go to the next recvs and the cancelled buffers are never written."""
    if comm.size < 2 or comm.rank > 1:
        return
    if comm.rank == 0:
        await wait_marker(comm, 1)
        for tag in (1, 2, 3):
            await comm.send(np.full(BIG, tag, np.uint8), 1, tag)
        return
    dead = [np.full(BIG, 0xAA, np.uint8) for _ in range(3)]
    req = comm.irecv(dead[0], 0, 1)
    check(req.cancel() and req.cancelled(), "req.cancel")
    with raises(asyncio.CancelledError, "awaiting a cancelled request"):
        await req
    task = await posted(comm.recv(dead[1], 0, 2))
    task.cancel()
    with raises(asyncio.CancelledError, "cancelled task"):
        await task
    with raises(TimeoutError, "asyncio.timeout"):
        async with asyncio.timeout(SHORT):
            await comm.recv(dead[2], 0, 3)
    await marker(comm, 0)
    for tag in (1, 2, 3):
        out = np.zeros(BIG, np.uint8)
        await comm.recv(out, 0, tag)
        check(out[0] == tag, f"tag {tag} lost")
    check(all(bool((d == 0xAA).all()) for d in dead), "a cancelled buffer was written")
    check(comm.statistics().pending_ops == 0, "pending ops left")


async def cancelled_sendrecv_keeps_what_it_sent(comm: ac.Communicator) -> None:
    """A sendrecv cancelled while it waits (its small send done, its recv unmatched): the
    recv is withdrawn with its buffer untouched, the note names the send, the sent message
    arrives, and the one the recv would have taken goes to the next recv."""
    if comm.size < 2 or comm.rank > 1:
        return
    peer = 1 - comm.rank
    if comm.rank == 1:
        first = np.zeros(2)
        await comm.recv(first, peer, 60)
        check(first[0] == 7.0, "the cancelled sendrecv's send did not arrive")
        await wait_marker(comm, peer)
        await comm.send(np.full(4, 5.0), peer, 61)
        return
    dead = np.full(4, -1.0)
    task = await posted(comm.sendrecv(np.full(2, 7.0), peer, dead, peer, sendtag=60,
                                      recvtag=61))
    task.cancel()
    try:
        await task
    except asyncio.CancelledError as exc:
        notes = "".join(getattr(exc, "__notes__", []))
    else:
        raise AssertionError("a cancelled sendrecv: CancelledError was not raised")
    check("ops 0 (send, done) had matched and finished" in notes, f"notes {notes!r}")
    await marker(comm, peer)
    out = np.zeros(4)
    st = await comm.recv(out, peer, 61)
    check(st.count == 4 and out[0] == 5.0, f"{st} {out}")
    check(bool((dead == -1.0).all()), "the cancelled recv's buffer was written")
    check(comm.statistics().pending_ops == 0, "pending ops left")


async def cancelled_sends_lose_nothing(comm: ac.Communicator) -> None:
    """A rendezvous send withdrawn before any recv matched it is gone for good (req.cancel,
    task cancellation, asyncio.timeout), and later sends with the same tag still arrive."""
    if comm.size < 2 or comm.rank > 1:
        return
    if comm.rank == 0:
        req = comm.isend(np.full(BIG, 1, np.uint8), 1, 7)
        if is_mpi(comm):  # only the receiver can tell: cancel() does not wait to ask it
            check(not req.cancel(), "req.cancel of a send announced to another process")
            with raises(TimeoutError, "withdrawing it by cancelling its awaiting task"):
                async with asyncio.timeout(0):
                    await req
        else:
            check(req.cancel(), "req.cancel of an unmatched send")
        check(req.cancelled(), "the first send was withdrawn")
        task = await posted(comm.send(np.full(BIG, 2, np.uint8), 1, 7))
        task.cancel()
        with raises(asyncio.CancelledError, "cancelled send task"):
            await task
        with raises(TimeoutError, "asyncio.timeout on a send"):
            async with asyncio.timeout(SHORT):
                await comm.send(np.full(BIG, 3, np.uint8), 1, 7)
        await marker(comm, 1)  # after every withdrawal
        await wait_marker(comm, 1)
        await comm.send(np.full(BIG, 4, np.uint8), 1, 7)
        return
    await wait_marker(comm, 0)
    check(comm.iprobe(0, 7) is None, "a withdrawn send is still visible")
    await marker(comm, 0)
    out = np.zeros(BIG, np.uint8)
    await comm.recv(out, 0, 7)
    check(out[0] == 4, f"got the withdrawn message {out[0]}")


async def send_withdrawn_after_match(comm: ac.Communicator) -> None:
    """A send cancelled right after posting while its recv is already waiting: either it
    had matched (cancel False, data arrives) or it was withdrawn and the recv takes the
    next message.  Nothing is lost or written twice.  (On MPI only the receiver can tell,
    so cancel() refuses and the send completes.)"""
    if comm.size < 2 or comm.rank > 1:
        return
    if comm.rank == 1:
        out = np.zeros(BIG, np.uint8)
        rreq = comm.irecv(out, 0, 13)
        await marker(comm, 0)
        cancelled = await wait_marker(comm, 0, MARK + 1)
        st = await rreq
        check(st.nbytes == BIG and out[0] == (2 if cancelled else 1), f"{cancelled} {out[0]}")
        check(comm.iprobe(0, 13) is None, "a second message is left")
        return
    await wait_marker(comm, 1)
    sreq = comm.isend(np.full(BIG, 1, np.uint8), 1, 13)
    cancelled = sreq.cancel()
    await marker(comm, 1, int(cancelled), MARK + 1)
    if cancelled:
        await comm.send(np.full(BIG, 2, np.uint8), 1, 13)
    else:
        await sreq


async def cancellation_storm(comm: ac.Communicator) -> None:
    """Sends and recvs cancelled at random moments, eager and rendezvous mixed: exactly the
    messages whose sends were not withdrawn arrive, once each and in order, and no
    cancelled recv buffer is written."""
    if comm.size < 2 or comm.rank > 1:
        return
    rng = random.Random(7 + comm.rank)
    n = 60
    if comm.rank == 0:
        kept, reqs = [], []
        for i in range(n):
            msg = np.zeros(BIG if rng.random() < 0.6 else 16, np.uint8)
            msg[:8].view(np.int64)[0] = i
            req = comm.isend(msg, 1, 5)
            if rng.random() < 0.5:
                if rng.random() < 0.5:
                    await asyncio.sleep(0)  # a random interleaving: let progress run
                if req.cancel():
                    continue
            kept.append(i)
            reqs.append(req)
        await ac.wait_all(reqs)
        await comm.send(np.array([len(kept), *kept], np.int64), 1, 6)
        await wait_marker(comm, 1)
        await marker(comm, 1, tag=MARK + 1)  # after every answer to rank 1's last recvs
        await wait_marker(comm, 1, MARK + 2)  # closing earlier would fail rank 1's recvs
        return
    listing = np.zeros(n + 1, np.int64)
    list_req = comm.irecv(listing, 0, 6)
    received: list[int] = []
    pending: tuple[ac.Request, np.ndarray[Any, Any]] | None = None
    while not list_req.done():
        buf = np.full(BIG, 0xEE, np.uint8)
        req = comm.irecv(buf, 0, 5)
        if rng.random() < 0.3:
            if rng.random() < 0.5:
                await asyncio.sleep(0)
            if req.cancel():
                check(bool((buf == 0xEE).all()), "a cancelled recv was written")
                continue
        await ac.wait_any([req, list_req])
        if req.done():
            received.append(int(buf[:8].view(np.int64)[0]))
        else:
            pending = (req, buf)
    await marker(comm, 0)
    await wait_marker(comm, 0, MARK + 1)
    if pending is not None:
        req, buf = pending
        if req.done() or not req.cancel():  # matched: its message is one of the kept
            await req
            received.append(int(buf[:8].view(np.int64)[0]))
        else:
            check(bool((buf == 0xEE).all()), "a cancelled recv was written")
    kept = [int(i) for i in listing[1:1 + int(listing[0])]]
    while len(received) < len(kept):
        buf = np.zeros(BIG, np.uint8)
        await comm.recv(buf, 0, 5)
        received.append(int(buf[:8].view(np.int64)[0]))
    check(received == kept, f"received {received}, expected {kept}")
    check(comm.iprobe(0, 5) is None, "a withdrawn message arrived")
    await marker(comm, 0, tag=MARK + 2)


async def a_withdrawn_large_send_keeps_the_order(comm: ac.Communicator) -> None:
    """A large send that times out at once (``timeout=0``) while its recv is already
    waiting, then a small and a large send with the same tag: the withdrawal either lost
    (the recv had matched: M1, M2, M3 in order) or won (M2, M3 in order); a later message
    never overtakes an earlier one, and nothing is lost or received twice."""
    if comm.size < 2 or comm.rank > 1:
        return
    big = 1 << 20
    if comm.rank == 1:
        outs = [np.zeros(big, np.uint8) for _ in range(3)]
        reqs = [comm.irecv(outs[0], 0, 0), comm.irecv(outs[1], 0, 0)]
        await marker(comm, 0)
        kept = await wait_marker(comm, 0, MARK + 1)
        if kept:  # M3 needs a third recv
            reqs.append(comm.irecv(outs[2], 0, 0))
        statuses = await ac.wait_all(reqs)
        values = [int(out[0]) for out in outs[:len(reqs)]]
        check(values == ([1, 2, 3] if kept else [2, 3]), f"kept={kept}: got {values}")
        check([s.nbytes for s in statuses] == [big, 10, big][1 - kept:], f"{statuses}")
        check(comm.iprobe(0, 0) is None, "a message too many")
        await marker(comm, 0, tag=MARK + 2)
        return
    await wait_marker(comm, 1)
    try:
        await comm.send(np.full(big, 1, np.uint8), 1, 0, timeout=0)
        kept = 1
    except ac.CommTimeoutError:
        kept = 0
    await comm.send(np.full(10, 2, np.uint8), 1, 0)
    last = comm.isend(np.full(big, 3, np.uint8), 1, 0)
    await marker(comm, 1, kept, MARK + 1)
    await last
    await wait_marker(comm, 1, MARK + 2)


async def wildcards_fail_once_every_peer_has_closed(comm: ac.Communicator) -> None:
    """A recv or probe from ANY_SOURCE that no live rank can satisfy fails with
    CommBrokenError naming the closed ranks, whether it was posted before they closed or
    after (every rank but 0 leaves at once)."""
    if comm.size < 2 or comm.rank != 0:
        return
    with raises(ac.CommBrokenError, "recv from ANY_SOURCE with every peer gone"):
        try:
            await comm.recv(np.zeros(4, np.uint8), ac.ANY_SOURCE, 3)
        except ac.CommBrokenError as exc:
            ranks = ", ".join(str(r) for r in range(1, comm.size))
            check(f"every other rank has closed its communicator (ranks {ranks})" in str(exc),
                  f"message: {exc}")
            raise
    with raises(ac.CommBrokenError, "probe from ANY_SOURCE with every peer gone"):
        await comm.probe(ac.ANY_SOURCE, ac.ANY_TAG)
    with raises(ac.CommBrokenError, "recv_new from ANY_SOURCE with every peer gone"):
        await comm.recv_new()


async def timeouts(comm: ac.Communicator) -> None:
    """timeout= fails unmatched ops with CommTimeoutError, withdrawn; the comm stays
    usable and the timed-out send is never received."""
    if comm.size < 2 or comm.rank > 1:
        return
    peer = 1 - comm.rank
    if comm.rank == 0:
        with raises(ac.CommTimeoutError, "send timeout"):
            await comm.send(np.ones(BIG, np.uint8), 1, 14, timeout=SHORT)
        await marker(comm, 1)
    else:
        with raises(ac.CommTimeoutError, "recv timeout"):
            await comm.recv(np.zeros(4, np.uint8), 0, 15, timeout=SHORT)
        with raises(ac.CommTimeoutError, "probe timeout"):
            await comm.probe(0, 15, timeout=SHORT)
        await wait_marker(comm, 0)
        check(comm.iprobe(0, 14) is None, "a timed-out send was delivered")
    out = np.zeros(BIG, np.uint8)
    st = await comm.sendrecv(np.full(BIG, comm.rank, np.uint8), peer, out, peer,
                             sendtag=16, recvtag=16, timeout=30)
    check(st.source == peer and out[0] == peer, "exchange after timeouts")
    check(comm.statistics().pending_ops == 0, "pending ops left")


async def bad_input(comm: ac.Communicator) -> None:
    """Bad arguments raise ValueError/TypeError before anything is posted."""
    buf = np.zeros(4, np.float32)
    with raises(ValueError, "dst out of range"):
        await comm.send(buf, comm.size)
    with raises(ValueError, "ANY_SOURCE on a send"):
        await comm.send(buf, ac.ANY_SOURCE)
    with raises(ValueError, "negative tag"):
        await comm.send(buf, 0, -5)
    with raises(TypeError, "not a buffer"):
        await comm.send([1, 2, 3], 0)
    with raises(ValueError, "read-only recv buffer"):
        await comm.recv(b"read-only", 0)
    with raises(TypeError, "count and dtype disagree"):
        await comm.send(buf, 0, dtype=np.int64)
    check(comm.statistics().pending_ops == 0, "something was posted")


async def closed_peer_breaks_pending_ops(comm: ac.Communicator) -> None:
    """A rank that returns closes its communicator: ops that only it could complete fail
    with CommBrokenError instead of hanging."""
    if comm.size < 2 or comm.rank != 0:
        return  # rank 1 leaves at once
    with raises(ac.CommBrokenError, "recv from a closed rank"):
        await comm.recv(np.zeros(4, np.uint8), 1, 99)
    with raises(ac.CommBrokenError, "rendezvous send to a closed rank"):
        await comm.send(np.zeros(BIG, np.uint8), 1, 99)


async def shapes_travel(comm: ac.Communicator) -> None:
    """``recv_new`` gives the sender's shape (0-d, 2-D, 3-D past the eager limit, a batch's
    send), ``Status.shape`` says it, and a recv into a flat buffer of the same byte size
    still works; a send with ``count=`` is flat."""
    right, left = neighbours(comm)
    shapes = [(3, 4), (), (2, 3, BIG // 6 + 1), (0, 5), (7,)]
    sends = [comm.isend((np.arange(int(np.prod(s)), dtype=np.int32) + comm.rank).reshape(s),
                        right, 40 + i) for i, s in enumerate(shapes)]
    for i, shape in enumerate(shapes):
        arr, st = await comm.recv_new(left, 40 + i)
        check(arr.shape == shape and st.shape == shape and arr.dtype == np.int32,
              f"recv_new gave {arr.shape}/{st.shape}, sent {shape}")
        check(np.array_equal(arr.ravel(), np.arange(arr.size, dtype=np.int32) + left),
              "shaped data")
    await ac.wait_all(sends)
    await comm.batch([ac.SendOp(np.ones((2, 5), np.float32), right, 50),
                      ac.SendOp(np.ones((4, 4), np.float32), right, 51, count=6)])
    flat = np.zeros(10, np.float32)
    st = await comm.recv(flat, left, 50)
    check(st.shape == (2, 5) and st.count == 10 and flat.sum() == 10, "recv into flat")
    arr, st = await comm.recv_new(left, 51)
    check(arr.shape == (6,) and st.shape == (6,), "count= sends flat")


# -- objects and non-blocking batches ----------------------------------------------------------


async def objects_round_trip(comm: ac.Communicator) -> None:
    """Objects (nested dicts of arrays, past the eager limit too) arrive intact and in
    order, by exact source and tag or wildcards; an array recv never takes an object nor
    ``recv_obj`` an array (each waits for the right recv); an unpicklable object is a
    TypeError before anything is sent; requests from ``isend_obj``/``irecv_obj`` go to
    ``wait_all``; a ``recv_obj`` cancelled before anything arrived takes nothing."""
    right, left = neighbours(comm)

    def payload(rank: int, i: int) -> dict[str, Any]:
        return {"rank": rank, "i": i, "grads": {"w": pattern(BIG, rank + i).reshape(-1, 1),
                                               "b": np.full((2, 3), i, np.float32)},
                "meta": ["x" * i, (rank, None)]}

    with raises(TypeError, "send_obj of an unpicklable object"):
        await comm.send_obj(lambda: None, right)
    lost = comm.irecv_obj(left, 99)
    lost.cancel()
    with raises(asyncio.CancelledError, "cancelled irecv_obj"):
        await lost
    sends = [comm.isend_obj(payload(comm.rank, i), right, 5) for i in range(3)]
    await comm.send(np.arange(3, dtype=np.int64), right, 6)
    with raises(ac.DTypeMismatchError, "recv of an object into an array"):
        await comm.recv(np.zeros(1 << 20, np.uint8), left, 5)
    with raises(ac.DTypeMismatchError, "recv_obj of an array"):
        await comm.recv_obj(left, 6)
    for i in range(3):
        obj, st = await (comm.recv_obj(left, 5) if i else comm.recv_obj())
        want = payload(left, i)
        check(st.source == left and st.tag == 5 and obj["i"] == i and obj["meta"] ==
              want["meta"], f"object {i}: {obj['i']} from {st.source}")
        check(np.array_equal(obj["grads"]["w"], want["grads"]["w"])
              and obj["grads"]["w"].shape == (BIG, 1)
              and np.array_equal(obj["grads"]["b"], want["grads"]["b"]), "arrays intact")
    await ac.wait_all(sends)
    arr, _ = await comm.recv_new(left, 6)
    check(arr.tolist() == [0, 1, 2], "the array waited for its recv")
    recv = comm.irecv_obj(left, 7)
    await ac.wait_all([comm.isend_obj({"k": comm.rank}, right, 7)])
    (obj, _), = await ac.wait_all([recv])
    check(obj == {"k": left}, "irecv_obj through wait_all")
    with raises(ac.CommTimeoutError, "recv_obj that timed out"):
        await comm.recv_obj(left, 98, timeout=SHORT)
    await marker(comm, left)  # my recv timed out: the left may send to me now
    await wait_marker(comm, right)
    # The cancelled and timed-out recvs took nothing: these find their objects.
    await comm.send_obj({"late": comm.rank}, right, 99)
    await comm.send_obj({"later": comm.rank}, right, 98)
    check((await comm.recv_obj(left, 99))[0] == {"late": left}, "after a cancelled recv_obj")
    check((await comm.recv_obj(left, 98))[0] == {"later": left}, "after a timed-out one")


async def ibatch_returns_requests(comm: ac.Communicator) -> None:
    """``ibatch`` posts like ``batch`` and returns the requests at once; a bad op posts
    nothing."""
    right, left = neighbours(comm)
    out = np.zeros(BIG, np.uint8)
    with raises(TypeError, "ibatch of a non-op"):
        comm.ibatch([ac.RecvOp(out, left, 1), "send"])  # type: ignore[list-item]
    reqs = comm.ibatch([ac.RecvOp(out, left, 1), ac.SendOp(pattern(BIG, comm.rank), right, 1)])
    check(len(reqs) == 2 and all(isinstance(r, ac.Request) for r in reqs), "requests")
    status, sent = await ac.wait_all(reqs)
    check(status.source == left and sent is None, "ibatch results")
    check(np.array_equal(out, pattern(BIG, left)), "ibatch data")
    check(comm.ibatch([]) == [], "an empty ibatch")


# -- collectives -------------------------------------------------------------------------------


async def collectives_keep_to_themselves(comm: ac.Communicator) -> None:
    """Collectives as methods: results equal numpy's, two in flight at once don't mix, a
    pending wildcard recv of the program takes none of their messages, and they work on a
    sub-communicator too."""
    size, rank = comm.size, comm.rank
    pending = comm.irecv(np.zeros(8, np.int64), ac.ANY_SOURCE, ac.ANY_TAG)
    a = np.full(BIG // 8, rank + 1, np.int64)  # past the eager limit
    b = np.arange(5, dtype=np.float64) * (rank + 1)
    await asyncio.gather(comm.allreduce(a), comm.allreduce(b, op=ac.MAX))
    check(np.all(a == size * (size + 1) // 2), "allreduce sum")
    check(np.array_equal(b, np.arange(5) * size), "allreduce max")
    rows = np.zeros((size, 3), np.int32)
    await comm.allgather(np.full(3, rank, np.int32), rows)
    check(np.array_equal(rows[:, 0], np.arange(size)), "allgather")
    root = size - 1
    buf = np.arange(4.0) if rank == root else np.zeros(4)
    await comm.bcast(buf, root=root)
    check(np.array_equal(buf, np.arange(4.0)), "bcast")
    total = np.zeros(2, np.int64) if rank == 0 else None
    await comm.reduce(np.array([rank, 1]), total, op="sum", root=0)
    check(rank != 0 or total is not None and total.tolist() == [size * (size - 1) // 2, size],
          "reduce")
    mine = np.zeros(2, np.int64)
    await comm.reduce_scatter(np.ones((size, 2), np.int64) * rank, mine)
    check(mine.tolist() == [size * (size - 1) // 2] * 2, "reduce_scatter")
    everyone = np.zeros((size, 1), np.int64) if rank == 0 else None
    await comm.gather(np.array([rank * 10]), everyone)
    check(rank != 0 or everyone is not None and everyone[:, 0].tolist() ==
          [10 * r for r in range(size)], "gather")
    part = np.zeros(1, np.int64)
    await comm.scatter(np.arange(size).reshape(size, 1) if rank == 0 else None, part)
    check(int(part[0]) == rank, "scatter")
    swapped = np.zeros((size, 1), np.int64)
    await comm.alltoall(np.array([[rank * 100 + j] for j in range(size)]), swapped)
    check(swapped[:, 0].tolist() == [r * 100 + rank for r in range(size)], "alltoall")
    await comm.barrier()
    sub = await comm.split(rank % 2)
    assert sub is not None
    x = np.array([rank])
    await sub.allreduce(x)
    check(int(x[0]) == sum(r for r in range(size) if r % 2 == rank % 2), "sub allreduce")
    await sub.aclose()
    check(not pending.done(), "a pending wildcard recv took a collective's message")
    await comm.barrier()  # every rank checked before anyone sends it a message
    right, left = neighbours(comm)
    await comm.send(np.full(8, rank, np.int64), right, 3)
    status = await pending
    check(status.source == left and status.tag == 3, "the wildcard recv took its message")


# -- sub-communicators -------------------------------------------------------------------------


async def split_orders_and_isolates(comm: ac.Communicator) -> None:
    """``split`` ranks by (key, rank) per color; a wildcard recv on the sub-communicator
    never takes a message sent on the parent with the same source and tag, nor the reverse;
    ``color=None`` gives None; a nested split and a dup work too."""
    size, rank = comm.size, comm.rank
    color = rank % 2
    sub = await comm.split(color, key=-rank)  # reversed order within each color
    assert sub is not None
    mates = sorted((r for r in range(size) if r % 2 == color), reverse=True)
    check(sub.size == len(mates) and sub.rank == mates.index(rank),
          f"split gave rank {sub.rank} of {sub.size}, expected {mates.index(rank)} of "
          f"{len(mates)}")
    # The same (source, tag) on the parent and on the sub-communicator: each recv takes
    # the message of its own communicator, whatever arrives first.
    right, left = (sub.rank + 1) % sub.size, (sub.rank - 1) % sub.size
    parent_right, parent_left = mates[right], mates[left]
    box = np.zeros(1, np.int64)
    await comm.send(np.array([1000 + rank]), parent_right, 7)
    await sub.send(np.array([2000 + rank]), right, 7)
    st = await sub.recv(box, ac.ANY_SOURCE, ac.ANY_TAG)
    check(int(box[0]) == 2000 + parent_left and st.source == left and st.tag == 7,
          f"sub-communicator recv took {int(box[0])} from {st.source}")
    st = await comm.recv(box, ac.ANY_SOURCE, 7)
    check(int(box[0]) == 1000 + parent_left and st.source == parent_left,
          f"parent recv took {int(box[0])} from {st.source}")
    nothing = await comm.split(None if rank == 0 else 0)
    check((nothing is None) == (rank == 0), "color=None must give None, and only it")
    if nothing is not None:
        check(nothing.size == size - 1 and nothing.rank == rank - 1, "split without rank 0")
        await nothing.aclose()
    twin = await sub.dup()
    check((twin.rank, twin.size) == (sub.rank, sub.size), "dup keeps the ranks")
    await twin.send(np.array([rank]), right, 3)
    await sub.send(np.array([-rank]), right, 3)
    await sub.recv(box, left, ac.ANY_TAG)
    check(int(box[0]) == -parent_left, "dup's message matched on its parent")
    await twin.recv(box, ac.ANY_SOURCE, ac.ANY_TAG)
    check(int(box[0]) == parent_left, "parent's message matched on the dup")
    async with await sub.split(0, key=0) as same:  # nested: one group, same order
        check((same.rank, same.size) == (sub.rank, sub.size), "nested split")
        data = pattern(BIG, rank)
        got = np.empty(BIG, np.uint8)
        await same.sendrecv(data, right, got, left)
        check(np.array_equal(got, pattern(BIG, parent_left)), "nested split data")
    check(same.closed and not sub.closed, "closing a sub-communicator leaves its parent")
    await twin.aclose()
    await sub.aclose()
    check(sub.closed and twin.closed and not comm.closed, "sub-communicators close alone")


async def split_bad_input(comm: ac.Communicator) -> None:
    """A bad color or key is a typed error before anything is sent, on every rank, and
    the communicator keeps working (the next split matches everyone's)."""
    with raises(TypeError, "split(color='a')"):
        await comm.split("a")  # type: ignore[arg-type]
    with raises(ValueError, "split(color=-1)"):
        await comm.split(-1)
    with raises(TypeError, "split(key=1.5)"):
        await comm.split(0, key=1.5)  # type: ignore[arg-type]
    sub = await comm.split(0)
    assert sub is not None
    check(sub.size == comm.size and sub.rank == comm.rank, "split after errors")
    await sub.aclose()
    sub_closed = await comm.dup()
    await sub_closed.aclose()
    with raises(ac.CommClosedError, "split on a closed communicator"):
        await sub_closed.split(0)


async def a_closed_world_closes_its_groups(comm: ac.Communicator) -> None:
    """Sub-communicators left open close with their parent; a rank whose sub-communicator
    peer closed gets CommBrokenError there, as with a world."""
    sub = await comm.split(0)
    assert sub is not None
    await comm.dup()  # left open on purpose: the world closes it
    if comm.size > 1:
        if sub.rank == 1:
            await sub.aclose()
            await marker(comm, 0)
        elif sub.rank == 0:
            await wait_marker(comm, 1)
            with raises(ac.CommBrokenError, "recv from a rank that closed the group"):
                await sub.recv(np.zeros(1), 1, 0)


PROGRAMS: dict[str, Program] = {p.__name__: p for p in (
    ring_sizes, ring_sizes_without_eager, ring_sizes_with_a_large_eager_limit,
    dtypes_and_counts, ring_exchange, self_messages, tags_select_messages,
    wildcards, non_overtaking, unexpected_burst, unexpected_beyond_the_pool,
    large_transfers, truncation_keeps_the_message,
    dtype_mismatch_keeps_the_message, probes_and_recv_new, explicit_streams_in_order,
    batch_and_sendrecv, wait_all_and_wait_any, cancelled_recvs_lose_nothing,
    cancelled_sendrecv_keeps_what_it_sent, cancelled_sends_lose_nothing,
    send_withdrawn_after_match, cancellation_storm,
    a_withdrawn_large_send_keeps_the_order, timeouts, bad_input,
    closed_peer_breaks_pending_ops, wildcards_fail_once_every_peer_has_closed,
    shapes_travel, objects_round_trip, ibatch_returns_requests, split_orders_and_isolates,
    split_bad_input, a_closed_world_closes_its_groups, collectives_keep_to_themselves,
)}

#: World options a program needs (``ac.run(program, **OPTIONS.get(name, {}))``).
OPTIONS: dict[str, dict[str, Any]] = {
    "unexpected_beyond_the_pool": {"pool_bytes": 4096},
    "ring_sizes_without_eager": {"eager_limit": 0},
    "ring_sizes_with_a_large_eager_limit": {"eager_limit": 1 << 20},
}
