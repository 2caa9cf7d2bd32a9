"""The scratch arrays of the collectives: one pool per rank, kept warm between calls.

How it works
------------
Rule 1 (one pool per rank).  A rank's pool hangs on its ``Device`` (``comm.device``), which
the rank's communicators share: the world's, its sub-communicators' and their private
contexts'.  A communicator without a device (a stand-in in a test) gets no pool: its calls
allocate afresh, as before.  Closing the world's communicator empties the pool (``clear``).
Rule 2 (by bytes).  Free arrays are flat ``uint8`` buffers kept by their exact size in bytes;
a call takes one and views it as the dtype and shape it needs, so calls of one size and
different dtypes share.  A buffer comes from ``np.empty``, aligned for every dtype numpy
reduces.  Arrays under ``MIN_POOLED`` bytes are not pooled: malloc serves those from the
warm heap, and the pool would cost more than it saves.
Rule 3 (taken, never shared).  ``take`` removes the buffer from the pool: two calls in flight
at once on one rank never hold the same one.  A call gives its buffers back (``Scratch.done``)
only once it succeeded, every op of it completed and its output written; a call that raises
(a timeout, a cancellation, a failed peer, a bad block) drops them instead, since an op
withdrawn or still in flight may yet write into them.
Rule 4 (bounded).  The pool keeps at most ``capacity`` bytes of free buffers; giving one back
past the cap drops the buffers of the sizes given back least recently (a buffer larger than
the cap is never kept).  The default, ``SCRATCH_BYTES`` = 32 MiB, holds the scratch of a few
calls of the largest sizes a rank repeats (a 4 MiB ring allreduce takes 6 MiB: its work
array and a block-sized temporary), while a world of 8 in-process ranks keeps at most 256
MiB it would otherwise have handed back to the allocator.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["FRESH", "MIN_POOLED", "SCRATCH_BYTES", "Scratch", "ScratchPool", "clear",
           "pool_of", "scratch_for"]

Array = np.ndarray[Any, Any]

#: The default cap on a rank's free scratch bytes (Rule 4).
SCRATCH_BYTES = 32 << 20
#: Arrays under this many bytes are allocated afresh (Rule 2).
MIN_POOLED = 64 << 10


class ScratchPool:
    """A rank's free scratch buffers, by size in bytes, at most ``capacity`` bytes of them."""

    __slots__ = ("_free", "capacity", "dropped", "kept", "reused", "taken")

    def __init__(self, capacity: int = SCRATCH_BYTES) -> None:
        self.capacity = capacity
        #: Free buffers by their size, the size given back least recently first.
        self._free: dict[int, list[Array]] = {}
        self.kept = 0  # bytes free in the pool
        self.taken = 0  # buffers handed out
        self.reused = 0  # of those, from the pool
        self.dropped = 0  # buffers given back and not kept (the cap)

    def take(self, nbytes: int) -> Array:
        """A flat uint8 buffer of ``nbytes`` bytes, now the caller's alone (Rule 3)."""
        self.taken += 1
        free = self._free.get(nbytes)
        if free:
            buf = free.pop()
            if not free:
                del self._free[nbytes]
            self.kept -= nbytes
            self.reused += 1
            return buf
        return np.empty(nbytes, np.uint8)

    def give(self, bufs: list[Array]) -> None:
        """Keep ``bufs`` (from ``take``, no longer used) for later calls, within the cap."""
        free = self._free
        for buf in bufs:
            n = buf.nbytes
            if n > self.capacity:
                self.dropped += 1
                continue
            same = free.pop(n, [])  # back in at the end: the most recent size
            same.append(buf)
            free[n] = same
            self.kept += n
        while self.kept > self.capacity:  # the least recent sizes go first
            n = next(iter(free))
            same = free[n]
            same.pop(0)
            if not same:
                del free[n]
            self.kept -= n
            self.dropped += 1

    def clear(self) -> None:
        """Drop every free buffer."""
        self._free.clear()
        self.kept = 0

    def held(self) -> list[Array]:
        """The free buffers (for tests and diagnostics)."""
        return [b for same in self._free.values() for b in same]


class Scratch:
    """One collective call's scratch: taken from its rank's pool (or allocated afresh), and
    given back by ``done`` once the call succeeded (Rule 3)."""

    __slots__ = ("_pool", "_taken")

    def __init__(self, pool: ScratchPool | None) -> None:
        self._pool = pool
        self._taken: list[Array] = []

    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> Array:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype`` of this call's own."""
        dt = np.dtype(dtype)
        nbytes = (shape if isinstance(shape, int) else math.prod(shape)) * dt.itemsize
        pool = self._pool
        if pool is None or nbytes < MIN_POOLED:
            return np.empty(shape, dt)
        buf = pool.take(nbytes)
        self._taken.append(buf)
        out: Array = buf.view(dt).reshape(shape)
        return out

    def empty_like(self, a: Array) -> Array:
        return self.empty(a.shape, a.dtype)

    def copy(self, a: Array) -> Array:
        """A flat copy of ``a`` in this call's scratch."""
        out = self.empty(a.size, a.dtype)
        out[...] = a.reshape(-1)
        return out

    def done(self) -> None:
        """The call succeeded: its buffers go back to the pool."""
        if self._taken:
            assert self._pool is not None
            self._pool.give(self._taken)
            self._taken = []


class _Fresh(Scratch):
    """The scratch of a call whose arrays are all under ``MIN_POOLED``: allocated afresh, as
    cheaply as numpy allocates (one shared instance: it holds nothing)."""

    __slots__ = ()

    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> Array:
        return np.empty(shape, dtype)

    def empty_like(self, a: Array) -> Array:
        return np.empty_like(a)

    def copy(self, a: Array) -> Array:
        return a.reshape(-1).copy()

    def done(self) -> None:
        pass


#: The scratch of every small call.
FRESH: Scratch = _Fresh(None)


def scratch_for(comm: object, nbytes: int) -> Scratch:
    """A new call's scratch on ``comm``'s rank (Rule 1), for a call whose largest array has
    ``nbytes`` bytes (under ``MIN_POOLED``: ``FRESH``, no pool)."""
    if nbytes < MIN_POOLED:
        return FRESH
    device = getattr(comm, "device", None)
    if device is None:
        return FRESH
    pool = getattr(device, "_scratch", None)
    if pool is None:
        try:
            pool = device._scratch = ScratchPool()
        except AttributeError:  # a device that takes no attributes: no pool
            return FRESH
    return Scratch(pool)


def pool_of(comm: object) -> ScratchPool | None:
    """``comm``'s rank's pool, if it has one yet."""
    return getattr(getattr(comm, "device", None), "_scratch", None)


def clear(device: object) -> None:
    """Empty the pool of ``device``'s rank (the world closed)."""
    pool = getattr(device, "_scratch", None)
    if pool is not None:
        pool.clear()
