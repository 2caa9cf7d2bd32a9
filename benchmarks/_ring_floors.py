"""The floors of the ring on one machine with no MPI and no library (``shm_p2p``): each hop
sends ``nbytes`` to rank+1 and waits for rank-1's, the two ways a process can wait for
another's message.

- The kernel-wait floor (``kernel_ring``): each rank's datagram socket waited on by its
  event loop (``add_reader``; the callback reads what came and wakes a future the hop
  awaits), the message a datagram.  A process that sleeps in the kernel until its peer
  writes pays this at least: the peer's ``sendto`` wakes it (on a crowded machine the
  scheduler runs it when a core is free), its loop turns once.
- The yield-spin floor (``spin_ring``): the message copied into a slot of rank+1's
  shared mapping and a counter raised; the receiver looks at its counter, giving its core
  away (``sched_yield``) after each look that found nothing, as MPICH's shared-memory
  channel waits (raw mpi4py's ``Sendrecv``).  Blocking: no event loop.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import secrets
import time
from typing import Any

import numpy as np

from asynccomm.transports._mpi_lib import sched_yield, yield_now
from asynccomm.transports._shm_ring import words

from ._common import bench_address, datagram_socket

#: The yield-spin floor's slots per receiver (a rank is never more hops ahead of rank+1
#: than the ring has ranks; a sender with no free slot waits for one the same way).
SLOTS = 16
_TAKEN = 64  # each rank's two counters (posted, at 0; taken), a cache line apart
_COUNTERS = 2 * _TAKEN


class BareRings:
    """The two floors' sockets and mapping for the processes of ``raw`` (an mpi4py
    communicator; collective), each hop ``nbytes``.  ``close()`` releases them."""

    def __init__(self, raw: Any, nbytes: int) -> None:
        self.raw = raw
        rank, size = raw.Get_rank(), raw.Get_size()
        self.nbytes = nbytes
        self.payload = np.full(nbytes, 1, dtype=np.uint8)
        self.into = np.zeros(nbytes, dtype=np.uint8)
        token = raw.bcast(secrets.token_hex(8) if rank == 0 else None)

        self.sock = datagram_socket()
        self.sock.bind(bench_address(f"ring-{token}-{rank}"))
        self.next = bench_address(f"ring-{token}-{(rank + 1) % size}")
        # One mapping for all: per rank its counters, then its slots.
        self.inbox = _COUNTERS + SLOTS * nbytes
        span = size * self.inbox
        if rank == 0:
            fd = os.memfd_create("asynccomm-bench-ring", os.MFD_CLOEXEC)
            os.ftruncate(fd, span)
            raw.bcast((os.getpid(), fd))
        else:
            pid, theirs = raw.bcast(None)
            fd = os.open(f"/proc/{pid}/fd/{theirs}", os.O_RDWR | os.O_CLOEXEC)
        try:
            self.mm = mmap.mmap(fd, span)
        finally:
            raw.Barrier()  # every rank mapped it (and bound its socket)
            os.close(fd)
        self.words = words(self.mm)
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)
        self.mine = rank * self.inbox
        self.theirs = (rank + 1) % size * self.inbox
        self.sent = self.taken = 0  # hops of the yield-spin floor so far

    def close(self) -> None:
        self.raw.Barrier()  # no datagram is on its way to a socket that closes
        self.sock.close()
        self.words.release()
        del self.bytes
        self.mm.close()

    async def kernel_ring(self, iters: int) -> tuple[float, float]:
        """(Seconds per hop, this rank's CPU seconds per hop) of the kernel-wait floor."""
        loop = asyncio.get_running_loop()
        sock, into, payload, dest = self.sock, self.into.data, self.payload.data, self.next
        came = 0
        waiter: asyncio.Future[None] | None = None

        def readable() -> None:
            nonlocal came
            while True:
                try:
                    sock.recv_into(into)
                except BlockingIOError:
                    break
                came += 1
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

        loop.add_reader(sock.fileno(), readable)
        try:
            self.raw.Barrier()
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(iters):
                while True:
                    try:
                        sock.sendto(payload, dest)
                        break
                    except BlockingIOError:  # rank+1's queue is full: it drains it
                        await yield_now()
                while not came:
                    waiter = loop.create_future()
                    await waiter
                    waiter = None
                came -= 1
            return (time.perf_counter() - start) / iters, (time.process_time() - cpu) / iters
        finally:
            loop.remove_reader(sock.fileno())

    def spin_ring(self, iters: int) -> tuple[float, float]:
        """(Seconds per hop, this rank's CPU seconds per hop) of the yield-spin floor."""
        load, store = self.words.load, self.words.store
        data, payload, into, n = self.bytes, self.payload, self.into, self.nbytes
        mine, theirs = self.mine, self.theirs
        self.raw.Barrier()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(iters):
            sent = self.sent + 1
            while sent - load(theirs + _TAKEN) > SLOTS:  # no free slot at rank+1
                sched_yield()
            at = theirs + _COUNTERS + sent % SLOTS * n
            data[at:at + n] = payload
            store(theirs, sent)  # posted
            self.sent = sent
            taken = self.taken + 1
            while load(mine) < taken:
                sched_yield()
            at = mine + _COUNTERS + taken % SLOTS * n
            into[:] = data[at:at + n]
            store(mine + _TAKEN, taken)
            self.taken = taken
        return (time.perf_counter() - start) / iters, (time.process_time() - cpu) / iters
