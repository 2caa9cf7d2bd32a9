"""A rank's compute stream: numpy kernels run on a host thread of their own.

In-process, every rank shares one event loop.  If a worker ran its matrix products on the
loop, nothing else could happen meanwhile: no message would move and the server could not
aggregate.  Like a device's compute stream, ``ComputeStream.run`` hands a kernel to the
rank's own thread (numpy releases the GIL while it computes) and returns to the loop, so
communication proceeds while the rank computes, and overlap is real, on wall time.

Where the rank has a process of its own (``backend="processes"``, or under ``mpiexec``)
nothing else runs on its loop, and a kernel runs on the loop's own thread instead
(``inline``): handing it to a thread and back costs a wake-up of each and the GIL passed
between them every few numpy calls, which on cores shared by more ranks than there are
cost more than the overlap hides (the parameter server as 5 processes on 2 cores made
about 60 futex calls a step with the thread, none without, and trained faster without).
Messages still move meanwhile: a send is posted before the next kernel runs, and a large
one is copied by its receiver's process.

numpy's BLAS starts threads of its own for each product; with several ranks per host they
only fight over the same cores, so ``limit_blas_threads`` pins it to one thread per call
(the ranks are the parallelism), as ``OPENBLAS_NUM_THREADS=1`` would.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

__all__ = ["ComputeStream", "limit_blas_threads"]

T = TypeVar("T")
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_", "openblas_set_num_threads")


@functools.cache
def limit_blas_threads(threads: int = 1) -> bool:
    """Pin numpy's bundled OpenBLAS to ``threads`` threads; False if it has no OpenBLAS
    of its own (another BLAS is left as it is)."""
    libs = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for path in sorted(libs.glob("lib*openblas*.so*")):
        lib = ctypes.CDLL(str(path))
        for name in _SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(ctypes.c_int(threads))
                return True
    return False


class ComputeStream:
    """One rank's compute: kernels run one at a time, in the order queued, off the loop
    (or, ``inline``, on it: see the module's notes)."""

    def __init__(self, name: str, inline: bool = False) -> None:
        limit_blas_threads()
        self.inline = inline
        self._pool = None if inline else ThreadPoolExecutor(max_workers=1,
                                                            thread_name_prefix=name)

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue ``fn(*args)`` behind the kernels already queued and return at once; the
        future completes when it has run.  Queue a whole pass up front, like kernels on a
        device stream, so the thread never idles waiting for the loop to hand it work.
        Inline, ``fn`` runs now, and the future is done when this returns.

        Through ``run_in_executor``: asynccomm's virtual-time loop counts that as thread
        work outstanding (it takes no model time, and is no deadlock)."""
        loop = asyncio.get_running_loop()
        if self._pool is not None:
            return loop.run_in_executor(self._pool, fn, *args)
        done: asyncio.Future[T] = loop.create_future()
        try:
            done.set_result(fn(*args))
        except Exception as exc:  # (raised where it is awaited, as from the thread)
            done.set_exception(exc)
        return done

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on this rank's thread and return its result."""
        return await self.submit(fn, *args)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> ComputeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
