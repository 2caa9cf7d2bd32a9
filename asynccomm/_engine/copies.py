"""Large copies off the loop: one pool of copy threads per process, a copy cut in pieces.

Rule 1 (off the loop).  A payload of ``THREAD_COPY_MIN`` bytes or more is copied on a worker
thread (numpy releases the GIL while it copies), so the loop runs other tasks meanwhile;
``copy`` calls ``on_done`` on the loop once every byte is in place.
Rule 2 (in pieces, side by side).  One core's copy of a few tens of MiB is bound by how
many cache misses it has in flight, not by the memory: on this 2-core machine a 16 or 64 MiB
``np.copyto`` runs at 8.3-8.8 GB/s on one thread and at 13-16 GB/s cut in two halves copied
on two threads at once.  So a copy of at least ``2 * PIECE_MIN`` and under ``SPLIT_MAX``
bytes is cut in as many equal pieces as there are copy threads (at most one per
``PIECE_MIN``), each its own job; pieces copied one after another on one thread ran at
three quarters of one large copy's speed.  From ``SPLIT_MAX`` on, the C library copies
with non-temporal stores and one thread already streams at about 16 GB/s: two halves of
a 256 MiB copy ran at 81-107% of it from run to run, of 1 GiB at 123-190%, so a copy that
large stays one piece.
Rule 3 (one pool per process).  The copy threads serve every rank of the process: as many
as the cores this process may run on, at most ``MAX_THREADS``, so ranks' copies at once
share the cores instead of each rank taking one more thread.  Jobs start in the order they
are given; a copy's pieces may end in any order, and ``on_done`` runs after the last.  A
process forked from one whose pool had started makes a pool of its own (threads do not
survive a fork).
Rule 4 (the loop meanwhile).  While a copy runs in pieces on every core, the loop's thread
waits for a core when it wakes: on this 2-core machine, while a 96 MiB transfer ran in
halves, a task on a 1 ms timer went 5.2-6.2 ms without a turn (1.9-2.1 ms beside the same
copy on one thread; ``benchmarks.bandwidth``), within the ~10 ms the loop may be held.
A copy cut in pieces is under ``SPLIT_MAX``, under about 10 ms here, which bounds it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["MAX_THREADS", "PIECE_MIN", "SPLIT_MAX", "copy", "pieces", "threads"]

#: Copy threads at most, whatever the cores (Rule 3).
MAX_THREADS = 4
#: No piece of a copy is smaller than this (Rule 2).
PIECE_MIN = 4 << 20
#: Copies this large or larger are one piece (Rule 2).
SPLIT_MAX = 128 << 20

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_threads = 1


def threads() -> int:
    """How many copy threads this process has (or will have): its usable cores, at most
    ``MAX_THREADS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cores))


def pieces(nbytes: int, workers: int) -> int:
    """How many pieces a copy of ``nbytes`` is cut in on ``workers`` threads (Rule 2)."""
    if nbytes >= SPLIT_MAX:
        return 1
    return max(1, min(workers, nbytes // PIECE_MIN))


def _executor() -> tuple[concurrent.futures.ThreadPoolExecutor, int]:
    """This process's pool and its thread count (Rule 3)."""
    global _pool, _pool_pid, _pool_threads
    pid = os.getpid()
    if _pool is None or _pool_pid != pid:
        _pool_threads = threads()
        _pool = concurrent.futures.ThreadPoolExecutor(max_workers=_pool_threads,
                                                      thread_name_prefix="asynccomm-copy")
        _pool_pid = pid
    return _pool, _pool_threads


def copy(loop: asyncio.AbstractEventLoop, dst: np.ndarray[Any, Any],
         src: np.ndarray[Any, Any], on_done: Callable[[BaseException | None], None]) -> None:
    """Copy ``src`` into ``dst`` (flat uint8 arrays of one size) on the copy threads, and call
    ``on_done`` on ``loop`` once every piece is in place, with the first error a piece
    raised (None: none)."""
    ex, workers = _executor()
    n = pieces(dst.nbytes, workers)
    if n == 1:
        jobs = [loop.run_in_executor(ex, np.copyto, dst, src)]
    else:
        cuts = [dst.nbytes * i // n for i in range(n + 1)]
        jobs = [loop.run_in_executor(ex, np.copyto, dst[a:b], src[a:b])
                for a, b in zip(cuts, cuts[1:], strict=False)]
    left = [len(jobs)]
    failed: list[BaseException] = []

    def piece_done(job: asyncio.Future[None]) -> None:
        exc = asyncio.CancelledError() if job.cancelled() else job.exception()
        if exc is not None and not failed:
            failed.append(exc)
        left[0] -= 1
        if not left[0]:
            on_done(failed[0] if failed else None)

    for job in jobs:
        job.add_done_callback(piece_done)
