"""Failure cases under MPI, one per command: ``mpiexec -n 2 python -m
tests.transports.mpi_cases CASE``.  ``test_mpi.py`` runs them and checks how the job ends.
Cases that end normally can share a job, one after another, as sections of
``tests.mpi_sections``: ``mpiexec -n 2 python -m tests.mpi_sections
"tests.transports.mpi_cases CASE" ...``.

- ``raise``: rank 1 raises while rank 0 waits for it; rank 0 must get ``CommBrokenError``
  naming the failure, and the job must exit non-zero.
- ``sigint``: rank 1 gets Ctrl-C (SIGINT) while rank 0 waits for it; rank 0 must hear
  that rank 1 was interrupted, and the job must exit non-zero.
- ``raise-stuck``: rank 1 raises while rank 0 never talks to it again; rank 1 must abort
  the job after its grace period instead of hanging.
- ``kill``: rank 1 is killed (SIGKILL) while rank 0 waits for it; the launcher ends the job.
- ``size-mismatch``: ``run(main, world_size=wrong)`` raises ValueError on every rank.
- ``run-rules``: under mpiexec ``run(main)`` and ``run(main, world_size=<MPI size>)`` run
  this process's rank on MPI; another size names both numbers; ``backend="local"`` runs an
  in-process world in each process.
- ``two-worlds``: two worlds open at once in each process never see each other's messages.
- ``send-error``: an MPI error in a send fails that send with ``TransportError`` (the
  communicator stays usable, and an eager send's credit is not lost).
- ``progress-error``: an MPI error in the progress task fails what was pending with
  ``TransportError`` and, since the world cannot close cleanly, aborts the job.
- ``after-failure``: once rank 0's link broke, a message that landed before is still
  received, and new recvs, probes, sends and ``iprobe`` raise ``TransportError`` at once.
- ``answer-landed``: a ``sendrecv`` whose incoming message has already landed (its rank's
  loop was blocked meanwhile, so no progress task saw it), or was taken as it came by the
  progress of the exchange before, completes without suspending.
- ``doorbell``: rank 1 waits until idle rank 0 dozes on its doorbell, then sends; rank 0
  is woken by the ring.
- ``unmatched-at-close``: rank 1 closes with rank 0's rendezvous message announced and
  never matched: rank 0's send fails with ``CommBrokenError``, and the job ends.
- ``links``: each rank prints the link of its world, of a ``split`` into halves and of a
  ``dup`` (after a ring exchange on each), and of its private context; and the link of a
  traced world with ``ASYNCCOMM_TRANSPORT=shm`` (the same: a trace keeps it).
- ``lane``: with the C lane built, small sends (awaited and ``isend``) and recvs (posted
  before their message lands, awaited and ``irecv``, or taking one that landed first, whose
  credit is then owed back) never reach the Python steps on MPI.
- ``direct``: where MPI's handles are C ints (MPICH), the C lane calls ``MPI_Test``,
  ``MPI_Start`` and ``MPI_Isend`` of the control messages itself: rank 0 bursts small
  sends while rank 1's loop is blocked outside MPI (on a FIFO), so that MPI cannot take
  them all at once; those not complete at once are kept, their buffers with them, and
  every message arrives intact once rank 1 runs again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

import asynccomm as ac
from asynccomm import open_mpi_world
from asynccomm.testing import fail_next_mpi_call, posted
from asynccomm.transports._mpi_transport import EARLY_MAX


async def raise_on_rank_1(comm: ac.Communicator) -> str:
    box = np.zeros(1)
    if comm.rank == 1:
        await comm.send(box, 0, 1)
        raise ValueError("boom on purpose")
    pending = comm.irecv(box, 1, 2)  # posted before rank 1's news can arrive
    await comm.recv(np.zeros(1), 1, 1)
    try:
        await pending
    except ac.CommBrokenError as exc:
        sys.stdout.write(f"rank {comm.rank} got CommBrokenError: {exc}\n")
        return "broken"
    return "not broken"


async def interrupted_rank(comm: ac.Communicator) -> str:
    box = np.zeros(1)
    if comm.rank == 1:
        await comm.send(box, 0, 1)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C on this rank only
        await asyncio.sleep(3600)
    pending = comm.irecv(box, 1, 2)
    await comm.recv(np.zeros(1), 1, 1)
    try:
        await pending
    except ac.CommBrokenError as exc:
        sys.stdout.write(f"rank {comm.rank} got CommBrokenError: {exc}\n")
        return "broken"
    return "not broken"


async def raise_while_peer_is_busy(comm: ac.Communicator) -> None:
    if comm.rank == 1:
        raise ValueError("boom while rank 0 is busy")
    await asyncio.sleep(3600)  # busy elsewhere: never closes on its own


async def killed_rank(comm: ac.Communicator) -> None:
    box = np.zeros(1)
    if comm.rank == 1:
        await comm.send(box, 0, 1)
        os.kill(os.getpid(), signal.SIGKILL)
    await comm.recv(box, 1, 1)
    await comm.recv(box, 1, 2)  # never sent


async def unmatched_at_close(comm: ac.Communicator) -> str:
    if comm.rank == 1:
        await comm.recv(np.zeros(1), 0, 1)  # behind the announcement: it is here, unmatched
        return "rank 1 closed"
    req = comm.isend(np.ones(1 << 20, np.uint8), 1, 9)  # never received
    await comm.send(np.zeros(1), 1, 1)
    try:
        await req
    except ac.CommBrokenError as exc:
        return f"unmatched send: CommBrokenError: {exc}"
    return "unmatched send: completed"


async def early_withdrawn(comm: ac.Communicator) -> str:
    """Rendezvous sends whose data send went out with the announcement, withdrawn before
    any recv matched them (timed out): one to the peer, one to this rank.  Each receiver
    drains the data (else the sender's data send never completes, and the world never
    closes); the next message on the same tag arrives whole."""
    n = 1 << 20
    if comm.rank == 0:
        outcome = []
        for dest, tag, timeout in ((1, 5, 0.2), (0, 6, 0.1)):
            try:
                await comm.send(np.ones(n, np.uint8), dest, tag, timeout=timeout)
                outcome.append("sent")
            except ac.CommTimeoutError:
                outcome.append("timed out")
        await comm.send(np.zeros(1), 1, 1)
        await comm.send(np.full(n, 2, np.uint8), 1, 5)
        return f"to the peer: {outcome[0]}, to itself: {outcome[1]}"
    await comm.recv(np.zeros(1), 0, 1)  # behind the withdrawal: it was dropped here
    buf = np.zeros(n, np.uint8)
    status = await comm.recv(buf, 0, 5)
    return f"got {status.nbytes} B of {sorted(set(buf.tolist()))}"


async def early_peer_fails(comm: ac.Communicator) -> str:
    """A rank fails while the other's rendezvous send to it (its data send posted) waits
    unmatched there: the send fails, naming the failure, and the job ends."""
    if comm.rank == 1:
        await comm.recv(np.zeros(1), 0, 1)  # behind the announcement: it is here, unmatched
        raise ValueError("boom with an early send waiting")
    req = comm.isend(np.ones(1 << 20, np.uint8), 1, 9)
    await comm.send(np.zeros(1), 1, 1)
    try:
        await req
    except ac.CommBrokenError as exc:
        sys.stdout.write(f"rank 0: early send: CommBrokenError: {exc}\n")
        sys.stdout.flush()
        return "broken"
    return "completed"


async def nothing(comm: ac.Communicator) -> int:
    return comm.rank


async def two_worlds() -> str:
    async with open_mpi_world() as a, open_mpi_world() as b:
        peer = (a.rank + 1) % a.size
        src = (a.rank - 1) % a.size
        x, y = np.zeros(1), np.zeros(1)
        ra, rb = a.irecv(x, src, 1), b.irecv(y, src, 1)  # same source and tag on both
        await b.send(np.array([2.0]), peer, 1)
        await a.send(np.array([1.0]), peer, 1)
        await ac.wait_all([ra, rb])
        return f"rank {a.rank}: world a got {x[0]:g}, world b got {y[0]:g}"


async def send_error(comm: ac.Communicator) -> str:
    if comm.rank == 0:
        fail_next_mpi_call(comm, "Isend")
        try:
            await comm.send(np.zeros(1 << 20, np.uint8), 1, 5)
        except ac.TransportError as exc:
            outcome = f"TransportError: {exc}"
        else:
            outcome = "no error"
        # An eager send that fails the usual way (a timeout keeps it off the fast lane).
        wire = comm._engine.link.wire  # type: ignore[attr-defined]
        credit = wire.credit[1]
        fail_next_mpi_call(comm, "Isend")
        try:
            await comm.send(np.zeros(1), 1, 6, timeout=60.0)
        except ac.TransportError:
            outcome += "\nsmall send: TransportError"
        else:
            outcome += "\nsmall send: no error"
        outcome += ", credit kept" if wire.credit[1] == credit else ", credit lost"
        await comm.send(np.ones(1 << 20, np.uint8), 1, 5)
        return outcome
    out = np.zeros(1 << 20, np.uint8)
    await comm.recv(out, 0, 5)
    return f"received {int(out.sum())}"


#: A message above the early sizes: its data send is posted after the ``CTS`` and tracked
#: until a poll sees it complete (an early one's may have completed as its ``CTS`` lands,
#: and no poll of pending requests is needed).
TRACKED = EARLY_MAX + (1 << 20)


async def progress_error(comm: ac.Communicator) -> None:
    if comm.rank == 0:
        fail_next_mpi_call(comm, "Testsome")
        await comm.send(np.zeros(TRACKED, np.uint8), 1, 5)  # TransportError: raised
    else:
        await comm.recv(np.zeros(TRACKED, np.uint8), 0, 5)
        await asyncio.sleep(3600)  # never finishes on its own: the abort ends it


async def after_failure(comm: ac.Communicator) -> str:
    """Rank 0's link breaks (an MPI error in its progress task): a message that landed
    before is still received, and every op posted after fails at once with
    ``TransportError`` (none waits for what cannot come)."""
    if comm.rank == 1:
        await comm.send(np.full(1, 3.0), 0, 3)
        await comm.recv(np.zeros(TRACKED, np.uint8), 0, 5)
        await asyncio.sleep(3600)  # never finishes on its own: the abort ends it
        return "rank 1 woke"
    await comm.probe(1, 3)  # landed
    fail_next_mpi_call(comm, "Testsome")
    outcomes = []
    try:
        await comm.send(np.zeros(TRACKED, np.uint8), 1, 5)
    except ac.TransportError:
        outcomes.append("send TransportError")
    out = np.zeros(1)
    await comm.recv(out, 1, 3)
    outcomes.append(f"landed {out[0]:g}")
    ops = {"recv": lambda: comm.recv(np.zeros(1), 1, 9),
           "recv-any": lambda: comm.recv(np.zeros(1), ac.ANY_SOURCE, ac.ANY_TAG),
           "probe": lambda: comm.probe(1, 9),
           "send": lambda: comm.send(np.zeros(1), 1, 9),
           "irecv": lambda: comm.irecv(np.zeros(1), 1, 9)}
    for name, op in ops.items():
        try:
            await asyncio.wait_for(op(), 5)
        except ac.TransportError:
            outcomes.append(f"{name} TransportError")
        except TimeoutError:
            outcomes.append(f"{name} hung")
    try:
        comm.iprobe(1, 9)
    except ac.TransportError:
        outcomes.append("iprobe TransportError")
    return "rank 0: " + ", ".join(outcomes)


class _Resume:
    """Awaits the rest of a coroutine that suspended once, on ``first``."""

    def __init__(self, steps: Generator[Any, None, Any], first: Any) -> None:
        self.steps, self.first = steps, first

    def __await__(self) -> Generator[Any, None, Any]:
        value = self.first
        while True:
            try:
                sent = yield value
            except BaseException as exc:  # forwarded, as await would
                value = self.steps.throw(exc)
                continue
            try:
                value = self.steps.send(sent)
            except StopIteration as stop:
                return stop.value


async def answer_landed(comm: ac.Communicator) -> str:
    from mpi4py import MPI

    peer = 1 - comm.rank  # an exchange first: the fast lane knows a dtype once it was used
    await comm.sendrecv(np.zeros(4), peer, np.zeros(4), peer, sendtag=2, recvtag=2)
    if comm.rank == 1:
        await comm.send(np.full(4, 7.0), 0, 3)
        MPI.COMM_WORLD.Barrier()  # after the send: it lands at rank 0 before this returns
        back = np.zeros(4)
        await comm.recv(back, 0, 4)
        return f"rank 1 got {back[0]:g}"
    MPI.COMM_WORLD.Barrier()  # blocks the loop: the message lands, no task sees it
    head = comm._engine.link.progress._slots[0].req  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    matcher = comm._engine.matcher
    while not head.Test() and time.monotonic() < deadline:  # landed (it stays so until
        # the slot is restarted), still without a turn of the loop; or handed over already
        # (the first exchange's progress may have taken it as it came)
        if matcher.waiting(1, 3) is not None:
            break
    got = np.zeros(4)
    steps = comm.sendrecv(np.ones(4), 1, got, 1, sendtag=4, recvtag=3).__await__()
    try:
        first = steps.send(None)
    except StopIteration:
        how = "at once"
    else:
        await _Resume(steps, first)
        how = "after suspending"
    return f"rank 0 got {got[0]:g} {how}"


async def doorbell(comm: ac.Communicator) -> str:
    from asynccomm.transports._doorbell import Doorbell

    bell = Doorbell.current()
    if bell is None:
        return f"rank {comm.rank} has no doorbell"
    if comm.rank == 1:
        peer = comm._engine.link.progress.bells[0]  # type: ignore[attr-defined]
        deadline = time.monotonic() + 20
        while not peer.flag[0]:  # until rank 0 sleeps and asks to be rung
            if time.monotonic() > deadline:
                return "rank 0 never dozed"
            await asyncio.sleep(0.002)
        await comm.send(np.full(1, 5.0), 0, 1)
        return "rank 1 sent"
    heard = bell.rings_heard
    got = np.zeros(1)
    await comm.recv(got, 1, 1)
    await asyncio.sleep(0)  # the ring is read by the loop's next callback, after the recv
    return f"rank 0 got {got[0]:g} after {bell.rings_heard - heard} ring(s)"


async def lane(comm: ac.Communicator) -> str:
    from mpi4py import MPI

    from asynccomm._comm import communicator as _communicator
    from asynccomm._core.wire import charge

    if _communicator._lane_send is None:
        return "no C lane"
    peer = 1 - comm.rank
    await comm.sendrecv(np.zeros(2), peer, np.zeros(2), peer, sendtag=1, recvtag=1)

    def refuse(*args: Any) -> Any:
        raise AssertionError("the Python steps ran")

    link = comm._engine.link
    saved = ac.Communicator._send_op, ac.Communicator._recv_op, link.offer_bytes  # type: ignore[attr-defined]
    ac.Communicator._send_op = ac.Communicator._recv_op = refuse  # type: ignore[method-assign]
    link.offer_bytes = refuse  # type: ignore[attr-defined]
    got = []
    try:
        for i in range(4):  # each message lands on a recv posted before it
            receiver = i % 2
            out = np.zeros(2)
            if comm.rank == receiver:
                if i < 2:
                    task = await posted(comm.recv(out, peer, 10 + i))
                    MPI.COMM_WORLD.Barrier()
                    status = await task
                else:
                    req = comm.irecv(out, peer, 10 + i)
                    MPI.COMM_WORLD.Barrier()
                    status = await req
                got.append(f"{out[0]:g}/{status.source}/{status.tag}")
            else:
                MPI.COMM_WORLD.Barrier()
                if i < 2:
                    await comm.send(np.full(2, 10.0 + i), receiver, 10 + i)
                else:
                    await comm.isend(np.full(2, 10.0 + i), receiver, 10 + i)
        # A message that landed before its recv (the lane finds no recv posted for it, and
        # it is staged): taken from staging, its credit owed back.
        MPI.COMM_WORLD.Barrier()
        if comm.rank == 0:
            await comm.send(np.full(2, 7.0), 1, 20)
            MPI.COMM_WORLD.Barrier()
        else:
            MPI.COMM_WORLD.Barrier()
            await comm.probe(0, 20)  # landed, and waiting
            wire = comm._engine.link.wire  # type: ignore[attr-defined]
            owed = wire._owed[0]
            out = np.zeros(2)
            await comm.recv(out, 0, 20)
            back = wire._owed[0] - owed
            got.append(f"landed {out[0]:g} owed {'+charge' if back == charge(16) else back}")
    finally:
        ac.Communicator._send_op, ac.Communicator._recv_op, link.offer_bytes = saved  # type: ignore[attr-defined]
    stats = comm._engine.flight.sends  # type: ignore[attr-defined]
    return f"rank {comm.rank}: {' '.join(got)}; sent {stats[peer].n}"


async def hybrid_lane(comm: ac.Communicator) -> str:
    """On two fake hosts (ranks 0 and 2 on one, 1 and 3 on the other): messages to and
    from a peer on the other host, eager and rendezvous, take the C lane's MPI steps, and
    small ones to and from a peer on this host the rings' (the Python steps of either
    side refuse to run); a large one to a peer of this host goes as an offer, as on
    shared memory alone."""
    from mpi4py import MPI

    from asynccomm._comm import communicator as _communicator
    from asynccomm.transports.shm import Channels

    if _communicator._lane_send is None:
        return "no C lane"
    remote, local = comm.rank ^ 1, comm.rank ^ 2
    await comm.sendrecv(np.zeros(2), remote, np.zeros(2), remote, sendtag=1, recvtag=1)
    await comm.sendrecv(np.zeros(2), local, np.zeros(2), local, sendtag=1, recvtag=1)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the Python steps ran")

    link = comm._engine.link
    mpi, route = link.mpi, link.progress  # type: ignore[attr-defined]
    saved = (ac.Communicator._send_op, ac.Communicator._recv_op, link.offer_bytes,  # type: ignore[attr-defined]
             mpi.send, mpi.push, mpi.pull, mpi._dispatch, route.send, Channels._handle)
    ac.Communicator._send_op = ac.Communicator._recv_op = refuse  # type: ignore[method-assign]
    link.offer_bytes = refuse  # type: ignore[attr-defined]
    mpi.send = mpi.push = mpi.pull = mpi._dispatch = route.send = refuse
    Channels._handle = refuse  # type: ignore[method-assign]
    got = []
    try:
        # 16 B (eager) and 1 MiB (rendezvous) to the other host, 16 B on this one
        for peer, n in ((remote, 2), (remote, 1 << 17), (local, 2)):
            out = np.zeros(n)
            if comm.rank < peer:
                await comm.send(np.arange(n, dtype=float) + comm.rank, peer, 30)
                await comm.recv(out, peer, 31)
            else:
                await comm.recv(out, peer, 30)
                await comm.send(np.arange(n, dtype=float) + comm.rank, peer, 31)
            got.append(("ring " if peer == local else "")
                       + ("intact" if (out == np.arange(n) + peer).all() else "wrong"))
        MPI.COMM_WORLD.Barrier()  # (before a peer sends what takes the Python steps)
    finally:
        (ac.Communicator._send_op, ac.Communicator._recv_op, link.offer_bytes,  # type: ignore[attr-defined]
         mpi.send, mpi.push, mpi.pull, mpi._dispatch, route.send, Channels._handle) = saved
    # 1 MiB on this host: an offer, copied by its receiver (no data sent on the route)
    saved_route = route.push, route.pull
    route.push = route.pull = refuse
    try:
        out = np.zeros(1 << 17)
        await comm.sendrecv(np.arange(1 << 17, dtype=float) + comm.rank, local, out, local,
                            sendtag=32, recvtag=32)
        got.append("ring " + ("intact" if (out == np.arange(1 << 17) + local).all()
                              else "wrong"))
    finally:
        route.push, route.pull = saved_route
    return f"rank {comm.rank}: {' '.join(got)}"


async def crowding(comm: ac.Communicator) -> str:
    """Whether this rank's node and MPI side take the cores for crowded: as this machine's
    processes (all of the job's here) outnumber its cores, whatever the fake hosts say."""
    from asynccomm.transports.shm import Node

    node = Node.current()
    assert node is not None
    crowded = comm.size > len(os.sched_getaffinity(0))
    link = comm._engine.link  # type: ignore[attr-defined]
    as_machine = node.crowded == crowded and link.mpi.crowded == crowded
    return f"rank {comm.rank}: crowded as the machine {as_machine}"


#: ``direct``'s burst: more small messages than MPI takes while their receiver is away.
BURST = 400


async def direct(comm: ac.Communicator) -> str:
    from mpi4py import MPI

    from asynccomm._comm import communicator as _communicator
    from asynccomm.transports import _mpi_lib

    if _communicator._lane_send is None:
        return "no C lane"
    link = comm._engine.link  # type: ignore[attr-defined]
    where = f"direct {link.direct} (int handles: {_mpi_lib.direct_calls() is not None})"
    peer = 1 - comm.rank
    await comm.sendrecv(np.zeros(128), peer, np.zeros(128), peer, sendtag=1, recvtag=1)
    path = MPI.COMM_WORLD.bcast(
        os.path.join(tempfile.mkdtemp(), "fifo") if comm.rank == 0 else None, root=0)
    if comm.rank == 0:
        os.mkfifo(path)
    MPI.COMM_WORLD.Barrier()
    if comm.rank == 1:
        # the loop blocked on purpose, and no MPI call made
        with open(path, "rb") as fifo:  # noqa: ASYNC230
            fifo.read(1)
        got = np.zeros(128)
        bad = 0
        for i in range(BURST):
            await comm.recv(got, 0, 2)
            bad += int(not (got == i).all())
        return f"rank 1: {where}; {BURST - bad} of {BURST} intact"
    progress = link.progress
    reqs = [comm.isend(np.full(128, float(i)), 1, 2) for i in range(BURST)]
    kept = len(progress._held)
    with open(path, "wb") as fifo:  # noqa: ASYNC230  (rank 1's loop waits for this)
        fifo.write(b"x")
    await ac.wait_all(reqs)
    os.unlink(path)
    os.rmdir(os.path.dirname(path))
    return f"rank 0: {where}; kept {'some' if kept else 'none'}"


async def who(comm: ac.Communicator) -> str:
    return f"{comm.device.name.split(':')[0]} {comm.rank}/{comm.size}"


async def links(comm: ac.Communicator) -> str:
    """The links of this rank's communicators (each after a ring exchange on it)."""
    half = await comm.split(comm.rank * 2 // comm.size)
    dup = await comm.dup()
    names = []
    for c in (comm, half, dup):
        got = np.zeros(1)
        await c.sendrecv(np.array([float(c.rank)]), (c.rank + 1) % c.size, got,
                         (c.rank - 1) % c.size, sendtag=5, recvtag=5)
        assert got[0] == (c.rank - 1) % c.size
        names.append(type(c._engine.link).__name__)
    names.append(type(comm._private()._engine.link).__name__)
    await half.aclose()
    await dup.aclose()
    return f"rank {comm.rank}: {' '.join(names)}"


async def link_name(comm: ac.Communicator) -> str:
    return type(comm._engine.link).__name__


def traced_shm() -> str:
    was = os.environ.get("ASYNCCOMM_TRANSPORT")
    os.environ["ASYNCCOMM_TRANSPORT"] = "shm"
    try:
        with tempfile.TemporaryDirectory() as where:  # (this rank's file, in a place of its own)
            return f"traced: {ac.run(link_name, trace=os.path.join(where, 'run.json'))}"
    finally:  # as it was, for the cases after this one in the same process
        if was is None:
            del os.environ["ASYNCCOMM_TRANSPORT"]
        else:
            os.environ["ASYNCCOMM_TRANSPORT"] = was


def run_rules() -> str:
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    plain = ac.run(who)
    sized = ac.run(who, world_size=size)
    try:
        ac.run(who, world_size=size + 1)
        wrong = "no error"
    except ValueError as exc:
        wrong = f"ValueError: {exc}"
    local = ac.run(who, world_size=3, backend="local")
    return f"plain={plain!r} sized={sized!r} wrong={wrong!r} local={local!r}"


def main(argv: Sequence[str]) -> int:
    (case,) = argv
    if case == "raise":
        sys.stdout.write(f"{ac.run(raise_on_rank_1)}\n")
    elif case == "sigint":
        sys.stdout.write(f"{ac.run(interrupted_rank)}\n")
    elif case == "raise-stuck":
        ac.run(raise_while_peer_is_busy, abort_grace=1.0)
    elif case == "kill":
        ac.run(killed_rank)
    elif case == "send-error":
        sys.stdout.write(f"{ac.run(send_error)}\n")
    elif case == "progress-error":
        ac.run(progress_error, abort_grace=1.0)  # the abort, without the default wait
    elif case == "after-failure":
        async def report(comm: ac.Communicator) -> str:
            line = await after_failure(comm)
            sys.stdout.write(line + "\n")  # before the abort that follows
            sys.stdout.flush()
            return line

        ac.run(report, abort_grace=1.0)
    elif case == "answer-landed":
        sys.stdout.write(f"{ac.run(answer_landed)}\n")
    elif case == "links":
        sys.stdout.write(f"{ac.run(links)}\n")
        if os.environ.get("ASYNCCOMM_TRANSPORT") != "mpi":
            sys.stdout.write(f"{traced_shm()}\n")
    elif case == "lane":
        sys.stdout.write(f"{ac.run(lane)}\n")
    elif case == "hybrid-lane":
        sys.stdout.write(f"{ac.run(hybrid_lane)}\n")
    elif case == "crowding":
        sys.stdout.write(f"{ac.run(crowding)}\n")
    elif case == "direct":
        sys.stdout.write(f"{ac.run(direct)}\n")
    elif case == "unmatched-at-close":
        sys.stdout.write(f"{ac.run(unmatched_at_close)}\n")
    elif case == "early-withdrawn":
        sys.stdout.write(f"{ac.run(early_withdrawn)}\n")
    elif case == "early-peer-fails":
        sys.stdout.write(f"{ac.run(early_peer_fails)}\n")
    elif case == "doorbell":
        sys.stdout.write(f"{ac.run(doorbell)}\n")
    elif case == "two-worlds":
        sys.stdout.write(asyncio.run(two_worlds()) + "\n")
    elif case == "run-rules":
        sys.stdout.write(run_rules() + "\n")
    elif case == "size-mismatch":
        try:
            ac.run(nothing, world_size=99, backend="mpi")
        except ValueError as exc:
            sys.stdout.write(f"ValueError: {exc}\n")
            return 0
        return 1
    else:
        sys.stderr.write(f"unknown case {case!r}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
