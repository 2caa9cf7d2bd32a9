"""The collective algorithms, built only on point-to-point ``isend``/``irecv``.

How it works
------------
Every algorithm takes an ``Exchange`` (one collective call's ops on one communicator) and
flat, C-contiguous 1-D views of the caller's buffers, and moves data in *steps*: in a step a
rank posts its recv, then its send, and waits for both.  Within a call a rank uses at most
three tags, ``tag``, ``tag + 1`` and ``tag + 2``; steps between one pair of ranks on one tag
match in posting order (MPI's non-overtaking rule), so no step needs a tag of its own.

Rule 1 (determinism).  Where two partial results meet, the lower rank's comes first
(``op(lower, higher)``), and ring results are reduced once by their owner and copied to the
others, so an allreduce gives the same bits on every rank.
Rule 2 (trees).  A tree parent sends to its children one at a time, largest subtree first,
so the order of a root's sends never depends on how equal-time timers fire.
Rule 3 (withdrawal).  ``Exchange`` remembers every op it posted; ``withdraw`` takes back
every one still pending (atomically: an op that matched finishes, one that did not is
withdrawn) before an error or cancellation leaves the call.
Rule 4 (non-powers of two).  Recursive doubling folds the first ``2 * rem`` ranks in pairs
(each even rank hands its data to the odd one above it and waits), runs on the remaining
power of two, and unfolds the result back to the even ranks.
Rule 5 (whole blocks).  Every recv must receive exactly its block: a shorter message
(the sender's array is smaller) fails the call with a ``MatchError``, as a longer one
(``TruncationError``) or one of another dtype (``DTypeMismatchError``) already does.
Rule 6 (scratch).  Temporaries come from ``Exchange.empty``: the call's own scratch
(``_collectives.scratch``), given back to the rank's pool only if the call succeeds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from .._engine.request import SEND, Request, wait_any
from .._exceptions import MatchError
from .ops import ReduceOp
from .scratch import FRESH, Scratch

__all__ = ["ALGORITHMS", "P2P", "Exchange", "Steps"]

Array = np.ndarray[Any, Any]


class P2P(Protocol):
    """What the algorithms need of a communicator: its public point-to-point API."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def isend(self, buf: Any, dst: int, tag: int = ...) -> Request: ...

    def irecv(self, buf: Any, src: int = ..., tag: int = ...) -> Request: ...


class Steps(Protocol):
    """A cluster model's CPU work of a call's steps (``_collectives.functions`` Rule 5b)."""

    async def step(self, peers: tuple[int, ...] = ()) -> None:
        """Spend a step's work: after each wait (on ops with ``peers``: the ranks it
        received from, else those it sent to)."""


def _peers(reqs: tuple[Request, ...]) -> tuple[int, ...]:
    """The ranks a wait on ``reqs`` received from, else those it sent to."""
    got = tuple(r.peer for r in reqs if r.kind is not SEND)
    return got or tuple(r.peer for r in reqs)


class Exchange:
    """One collective call's point-to-point ops on ``comm``, with tags from ``tag`` on."""

    def __init__(self, comm: P2P, tag: int, scratch: Scratch | None = None) -> None:
        self.comm = comm
        #: The call's scratch (``FRESH``: temporaries allocated afresh).
        self.scratch = FRESH if scratch is None else scratch
        self.rank = comm.rank
        self.size = comm.size
        self.tag = tag
        self._live: list[Request] = []
        self._counts: dict[Request, int] = {}  # what each recv must receive, exactly
        self.pending_at_withdrawal: list[Request] = []
        self.step = 0  # waits begun so far (hang reports name the step)
        self.steps: Steps | None = None  # a model's work of the steps (spent after a wait)

    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> Array:
        """A temporary of this call's own (Rule 6)."""
        return self.scratch.empty(shape, dtype)

    def copy(self, a: Array) -> Array:
        """A flat copy of ``a``, of this call's own (Rule 6)."""
        return self.scratch.copy(a)

    def send(self, buf: Array, dst: int, offset: int = 0) -> Request:
        req = self.comm.isend(buf, dst, self.tag + offset)
        self._live.append(req)
        return req

    def recv(self, buf: Array, src: int, offset: int = 0) -> Request:
        req = self.comm.irecv(buf, src, self.tag + offset)
        self._live.append(req)
        self._counts[req] = buf.size
        return req

    async def wait(self, *reqs: Request) -> None:
        """Wait until every op is done; raise the first failure as soon as it happens.

        Raises:
            Exception: the error of an op that failed.
            asyncio.CancelledError: an op was withdrawn by someone else.
        """
        pending = list(reqs)
        self.step += 1
        while True:
            for r in pending:
                if r.done():
                    exc = r.exception()
                    if exc is not None:
                        raise exc
                    if r.cancelled():
                        raise asyncio.CancelledError(f"{r!r} was cancelled")
                    self._check_count(r)
            pending = [r for r in pending if not r.done()]
            if not pending:
                break
            await wait_any(pending)
        self._live = [r for r in self._live if not r.done()]
        if self.steps is not None:
            await self.steps.step(_peers(reqs))

    def _check_count(self, req: Request) -> None:
        """A recv of a collective takes a whole block: a shorter message means the sender
        passed a smaller array (Rule 5)."""
        want = self._counts.pop(req, None)
        status = req.status
        if want is None or status is None or status.count == want:
            return
        raise MatchError(
            f"rank {self.rank}: rank {status.source} sent {status.count} elements where "
            f"{want} were expected: its buffer is smaller than this rank's", rank=self.rank,
            source=status.source, tag=status.tag, nbytes=status.nbytes,
            capacity=req.nbytes, send_dtype="", recv_dtype="")

    async def exchange(self, sendbuf: Array, dst: int, recvbuf: Array, src: int,
                       offset: int = 0) -> None:
        """One step: post the recv, then the send, and wait for both."""
        recv = self.recv(recvbuf, src, offset)
        await self.wait(recv, self.send(sendbuf, dst, offset))

    async def send_wait(self, buf: Array, dst: int, offset: int = 0) -> None:
        await self.wait(self.send(buf, dst, offset))

    async def recv_wait(self, buf: Array, src: int, offset: int = 0) -> None:
        await self.wait(self.recv(buf, src, offset))

    async def withdraw(self) -> None:
        """Take back every op still pending (Rule 3) and wait until each has settled, even
        through cancellation: one that had matched finishes, the others are withdrawn."""
        pending = [r for r in self._live if not r.done()]
        self._live = []
        self.pending_at_withdrawal = pending
        for r in pending:
            r.cancel()  # at once wherever this side alone can tell
        rest = [r for r in pending if not r.done()]
        if not rest:
            return
        # Only the peer can tell (a large send across processes), or the op has matched:
        # await each in a task and cancel it, which asks the peer and waits for the answer.
        tasks = [asyncio.ensure_future(_await(r)) for r in rest]
        try:
            await asyncio.sleep(0)  # each task now awaits its op
        except asyncio.CancelledError:
            pass
        for t in tasks:
            t.cancel()
        while not all(t.done() for t in tasks):
            try:
                await asyncio.wait(tasks)
            except asyncio.CancelledError:
                pass  # the call is failing already; its error carries on once all settled
        for t in tasks:
            if not t.cancelled():
                t.exception()  # retrieved: the call's own error is the one to report


async def _await(req: Request) -> None:
    await req


def _blocks(flat: Array, parts: int) -> list[Array]:
    """``flat`` cut into ``parts`` contiguous views, the first ``len % parts`` one longer."""
    q, extra = divmod(flat.size, parts)
    bounds = [i * q + min(i, extra) for i in range(parts + 1)]
    return [flat[bounds[i]:bounds[i + 1]] for i in range(parts)]


def _combine(op: ReduceOp, mine: Array, theirs: Array, mine_first: bool) -> None:
    """``mine = op(lower rank's, higher rank's)`` (Rule 1)."""
    if mine_first:
        op.combine(mine, theirs, mine)
    else:
        op.combine(theirs, mine, mine)


# -- rings -------------------------------------------------------------------------------------

async def ring_reduce_scatter_blocks(ex: Exchange, blocks: list[Array], op: ReduceOp,
                                     offset: int = 0) -> None:
    """Reduce ``blocks`` (this rank's contribution, overwritten) so that ``blocks[rank]``
    holds the reduction of every rank's block ``rank``: p - 1 steps around the ring."""
    p, r = ex.size, ex.rank
    if p == 1:
        return
    right, left = (r + 1) % p, (r - 1) % p
    tmp = ex.empty(max(b.size for b in blocks), blocks[0].dtype)
    for s in range(p - 1):
        into = blocks[(r - s - 2) % p]
        got = tmp[:into.size]
        await ex.exchange(blocks[(r - s - 1) % p], right, got, left, offset)
        op.combine(got, into, into)  # the ring's earlier ranks first, the same on every run


async def ring_allgather_blocks(ex: Exchange, blocks: list[Array], offset: int = 0,
                               first: Array | None = None) -> None:
    """Given ``blocks[rank]``, fill every other block: p - 1 steps around the ring.
    ``first``: what the first step sends, if not ``blocks[rank]`` (the same values)."""
    p, r = ex.size, ex.rank
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        send = first if s == 0 and first is not None else blocks[(r - s) % p]
        await ex.exchange(send, right, blocks[(r - s - 1) % p], left, offset)


async def allreduce_ring(ex: Exchange, work: Array, op: ReduceOp) -> None:
    """Ring allreduce in place: reduce-scatter (each rank owns one block), then allgather."""
    blocks = _blocks(work, ex.size)
    await ring_reduce_scatter_blocks(ex, blocks, op, 0)
    await ring_allgather_blocks(ex, blocks, 1)


async def allgather_ring(ex: Exchange, mine: Array, out: Array) -> None:
    """The ring; its first step sends the caller's ``mine``, not the copy of it just
    written into ``out``: a rank in another process reads a buffer its sender has just
    written from that core's caches, slower (2-rank 4 MiB calls on processes took 16-24%
    less so, 3 and 4 ranks about the same; in-process, where one core writes and reads
    both, 2 and 3 ranks 2-5% more, the copy just written being the warmer, 4 ranks 3%
    less).  Sent while the copy is made, it took 9% less on 2 processes: the two copies
    share the cores."""
    blocks = _blocks(out, ex.size)
    blocks[ex.rank][...] = mine
    await ring_allgather_blocks(ex, blocks, first=mine.reshape(blocks[ex.rank].shape))


async def reduce_scatter_ring(ex: Exchange, send: Array, out: Array, op: ReduceOp) -> None:
    work = ex.copy(send)
    blocks = _blocks(work, ex.size)
    await ring_reduce_scatter_blocks(ex, blocks, op)
    out[...] = blocks[ex.rank]


# -- recursive doubling and halving ------------------------------------------------------------

class _Fold:
    """Rule 4's ranks: ``p2`` the power of two that runs, ``rem`` the folded pairs."""

    def __init__(self, size: int, rank: int) -> None:
        self.p2 = 1 << (size.bit_length() - 1)
        self.rem = size - self.p2
        self.folded = rank < 2 * self.rem  # in a pair
        self.idle = self.folded and rank % 2 == 0  # hands its data over and waits
        self.v = rank // 2 if self.folded else rank - self.rem  # rank among the p2

    def real(self, v: int) -> int:
        return 2 * v + 1 if v < self.rem else v + self.rem

    def first_block(self, v: int) -> int:
        """The first real block of virtual block ``v`` (block p for v = p2)."""
        return 2 * v if v < self.rem else v + self.rem


async def allreduce_recursive_doubling(ex: Exchange, work: Array, op: ReduceOp) -> None:
    p, r = ex.size, ex.rank
    f = _Fold(p, r)
    if f.idle:
        await ex.send_wait(work, r + 1, 0)
        await ex.recv_wait(work, r + 1, 1)
        return
    tmp = ex.empty(work.size, work.dtype)
    if f.folded:
        await ex.recv_wait(tmp, r - 1, 0)
        op.combine(tmp, work, work)
    d = 1
    while d < f.p2:
        partner = f.real(f.v ^ d)
        await ex.exchange(work, partner, tmp, partner, 2)
        _combine(op, work, tmp, r < partner)
        d <<= 1
    if f.folded:
        await ex.send_wait(work, r - 1, 1)


async def reduce_scatter_recursive_doubling(ex: Exchange, send: Array, out: Array,
                                            op: ReduceOp) -> None:
    """Recursive halving: each step keeps half of the remaining blocks and sends the other
    half to the partner, which reduces it into its own half."""
    p, r, m = ex.size, ex.rank, out.size
    f = _Fold(p, r)
    work = ex.copy(send)
    if f.idle:
        await ex.send_wait(work, r + 1, 0)
        await ex.recv_wait(out, r + 1, 1)
        return
    tmp = ex.empty(work.size, work.dtype)
    if f.folded:
        await ex.recv_wait(tmp, r - 1, 0)
        op.combine(tmp, work, work)
    lo, d = 0, f.p2 >> 1  # the virtual blocks [lo, lo + 2d) are still this rank's
    while d:
        partner = f.real(f.v ^ d)
        keep, give = (lo, lo + d) if f.v & d == 0 else (lo + d, lo)
        k0, k1 = f.first_block(keep) * m, f.first_block(keep + d) * m
        g0, g1 = f.first_block(give) * m, f.first_block(give + d) * m
        got = tmp[:k1 - k0]
        await ex.exchange(work[g0:g1], partner, got, partner, 2)
        _combine(op, work[k0:k1], got, r < partner)
        lo, d = keep, d >> 1
    if f.folded:
        await ex.send_wait(work[(r - 1) * m:r * m], r - 1, 1)
    out[...] = work[r * m:(r + 1) * m]


# -- Bruck -----------------------------------------------------------------------------------

async def allgather_bruck(ex: Exchange, mine: Array, out: Array) -> None:
    """ceil(log2 p) steps; in step k a rank sends the blocks it has to rank - 2^k."""
    p, r, m = ex.size, ex.rank, mine.size
    tmp = ex.empty(p * m, mine.dtype)  # block i is rank (r + i)'s
    tmp[:m] = mine
    k = 1
    while k < p:
        cnt = min(k, p - k)
        await ex.exchange(tmp[:cnt * m], (r - k) % p, tmp[k * m:(k + cnt) * m], (r + k) % p)
        k <<= 1
    out[r * m:] = tmp[:(p - r) * m]
    out[:r * m] = tmp[(p - r) * m:]


# -- binomial trees ----------------------------------------------------------------------------

def _low_bit(vr: int, size: int) -> int:
    """The mask of ``vr``'s parent edge (``vr``'s lowest set bit); for the root, the
    smallest power of two >= size."""
    if vr:
        return vr & -vr
    return 1 << (size - 1).bit_length()


async def bcast_binomial(ex: Exchange, buf: Array, root: int) -> None:
    p, r = ex.size, ex.rank
    vr = (r - root) % p
    mask = _low_bit(vr, p)
    if vr:
        await ex.recv_wait(buf, (r - mask) % p)
    mask >>= 1
    while mask:  # Rule 2: largest subtree first
        if vr + mask < p:
            await ex.send_wait(buf, (r + mask) % p)
        mask >>= 1


async def reduce_binomial(ex: Exchange, acc: Array, op: ReduceOp, root: int) -> None:
    """``acc`` holds this rank's data and ends with its subtree's reduction (the root's,
    everything)."""
    p, r = ex.size, ex.rank
    vr = (r - root) % p
    tmp = ex.empty(acc.size, acc.dtype)
    mask = 1
    while mask < p:
        if vr & mask:
            await ex.send_wait(acc, (r - mask) % p)
            return
        if vr + mask < p:
            await ex.recv_wait(tmp, (r + mask) % p)
            op.combine(acc, tmp, acc)  # the child's ranks come after this one's
        mask <<= 1


async def gather_binomial(ex: Exchange, mine: Array, out: Array | None, root: int) -> None:
    p, r, m = ex.size, ex.rank, mine.size
    vr = (r - root) % p
    sub = min(_low_bit(vr, p), p - vr)  # the blocks of this rank's subtree
    loc = out if out is not None and root == 0 else ex.empty(sub * m, mine.dtype)
    loc[:m] = mine
    mask = 1
    while mask < p:
        if vr & mask:
            await ex.send_wait(loc[:sub * m], (r - mask) % p)
            return
        if vr + mask < p:
            cnt = min(mask, p - vr - mask)
            await ex.recv_wait(loc[mask * m:(mask + cnt) * m], (r + mask) % p)
        mask <<= 1
    if out is not None and loc is not out:
        out[root * m:] = loc[:(p - root) * m]
        out[:root * m] = loc[(p - root) * m:]


async def scatter_binomial(ex: Exchange, send: Array | None, out: Array, root: int) -> None:
    p, r, m = ex.size, ex.rank, out.size
    vr = (r - root) % p
    mask = _low_bit(vr, p)
    if vr == 0:
        assert send is not None
        loc = send
        if root:
            loc = ex.empty(send.size, send.dtype)
            loc[:(p - root) * m] = send[root * m:]
            loc[(p - root) * m:] = send[:root * m]
    else:
        loc = ex.empty(min(mask, p - vr) * m, out.dtype)
        await ex.recv_wait(loc, (r - mask) % p)
    mask >>= 1
    while mask:  # Rule 2: largest subtree first
        if vr + mask < p:
            cnt = min(mask, p - vr - mask)
            await ex.send_wait(loc[mask * m:(mask + cnt) * m], (r + mask) % p)
        mask >>= 1
    out[...] = loc[:m]


# -- linear and pairwise -----------------------------------------------------------------------

async def gather_linear(ex: Exchange, mine: Array, out: Array | None, root: int) -> None:
    p, r, m = ex.size, ex.rank, mine.size
    if r != root:
        await ex.send_wait(mine, root)
        return
    assert out is not None
    reqs = [ex.recv(out[i * m:(i + 1) * m], i) for i in range(p) if i != r]
    out[r * m:(r + 1) * m] = mine
    await ex.wait(*reqs)


async def scatter_linear(ex: Exchange, send: Array | None, out: Array, root: int) -> None:
    p, r, m = ex.size, ex.rank, out.size
    if r != root:
        await ex.recv_wait(out, root)
        return
    assert send is not None
    reqs = [ex.send(send[i * m:(i + 1) * m], i) for i in range(p) if i != r]
    out[...] = send[r * m:(r + 1) * m]
    await ex.wait(*reqs)


async def alltoall_pairwise(ex: Exchange, send: Array, out: Array) -> None:
    """p - 1 steps; in step s a rank sends to rank + s and receives from rank - s."""
    p, r = ex.size, ex.rank
    m = out.size // p
    out[r * m:(r + 1) * m] = send[r * m:(r + 1) * m]
    for s in range(1, p):
        dst, src = (r + s) % p, (r - s) % p
        await ex.exchange(send[dst * m:(dst + 1) * m], dst, out[src * m:(src + 1) * m], src)


async def barrier_dissemination(ex: Exchange) -> None:
    """ceil(log2 p) steps; in step k a rank signals rank + 2^k and hears from rank - 2^k."""
    p, r = ex.size, ex.rank
    token, got = np.empty(0, np.uint8), np.empty(0, np.uint8)
    k = 1
    while k < p:
        await ex.exchange(token, (r + k) % p, got, (r - k) % p)
        k <<= 1


#: The algorithms of each collective (the first is the default at world size 1).
ALGORITHMS: dict[str, dict[str, Callable[..., Any]]] = {
    "barrier": {"dissemination": barrier_dissemination},
    "bcast": {"binomial": bcast_binomial},
    "reduce": {"binomial": reduce_binomial},
    "allreduce": {"ring": allreduce_ring, "recursive_doubling": allreduce_recursive_doubling},
    "allgather": {"ring": allgather_ring, "bruck": allgather_bruck},
    "reduce_scatter": {"ring": reduce_scatter_ring,
                       "recursive_doubling": reduce_scatter_recursive_doubling},
    "gather": {"linear": gather_linear, "binomial": gather_binomial},
    "scatter": {"linear": scatter_linear, "binomial": scatter_binomial},
    "alltoall": {"pairwise": alltoall_pairwise},
}
