"""mpi4py, loaded lazily, and the one place where MPI's errors are translated.

Importing asynccomm's MPI modules must not start MPI (``from mpi4py import MPI``
initialises it), so ``MPI`` here is bound by ``load_mpi()`` when the first MPI world opens.
``translate`` turns ``MPI.Exception`` into ``TransportError``; ``mpi_errors`` applies it to
a block (httpcore's ``map_exceptions``).
"""

from __future__ import annotations

import asyncio
import os
import time
import types
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .._exceptions import TransportError

if TYPE_CHECKING:
    from mpi4py import MPI
else:
    MPI = None  # bound by load_mpi()

__all__ = ["MPI", "Backoff", "comm_world", "direct_calls", "handle_address", "load_mpi",
           "mpi_errors", "real_mpi", "sched_yield", "translate", "wait_request", "yield_now"]


def load_mpi() -> None:
    """Import ``mpi4py.MPI`` (initialising MPI) if it is not imported yet.

    Raises:
        ImportError: mpi4py is not installed.
    """
    global MPI  # bound lazily, see the module docs
    if MPI is None:
        try:
            from mpi4py import MPI  # noqa: PLC0415  (optional: the mpi extra, bound lazily)
        except ImportError as exc:
            raise ImportError("the MPI transport needs mpi4py and an MPI library: "
                              "pip install 'asynccomm[mpi]'") from exc


def comm_world() -> MPI.Intracomm:
    """``MPI.COMM_WORLD``, MPI initialised.

    Raises:
        ImportError: mpi4py is not installed.
    """
    load_mpi()
    return MPI.COMM_WORLD


def real_mpi() -> bool:
    """Whether ``MPI`` is mpi4py's module (loaded, and not a test's stand-in)."""
    return getattr(MPI, "__name__", None) == "mpi4py.MPI"


def handle_address(req: object) -> int:
    """Where mpi4py keeps the MPI handle of ``req`` (0: it is not an mpi4py request, as a
    test's fake is not)."""
    if not real_mpi() or not isinstance(req, MPI.Request):
        return 0
    return int(MPI._addressof(req))


def direct_calls() -> tuple[str, int] | None:
    """What the C lane needs to call the MPI library mpi4py loaded without mpi4py
    (``lane.mpi_calls``): the library's path and ``MPI_BYTE``'s handle; None where its
    handles are not C ints (only MPICH's ABI is called so), or the library is not found
    among this process's mappings."""
    if not real_mpi() or any(MPI._sizeof(t) != 4 for t in (MPI.Comm, MPI.Request, MPI.Datatype)):
        return None
    try:
        with open("/proc/self/maps") as maps:
            fields = (line.split(None, 5) for line in maps)
            paths = {f[5].strip() for f in fields if len(f) == 6}
    except OSError:
        return None
    found = sorted(p for p in paths if os.path.basename(p).startswith(("libmpi.so", "libmpich.so")))
    return (found[0], int(MPI._handleof(MPI.BYTE))) if found else None


def translate(exc: BaseException, what: str, rank: int | None) -> TransportError:
    """The ``TransportError`` for a foreign error (``__cause__`` keeps the original)."""
    detail = exc.Get_error_string() if isinstance(exc, MPI.Exception) else repr(exc)
    where = f"rank {rank}: " if rank is not None else ""
    err = TransportError(f"{where}MPI {what} failed: {detail}", rank=rank)
    err.__cause__ = exc
    return err


@contextmanager
def mpi_errors(what: str, rank: int | None = None) -> Iterator[None]:
    """Raise ``MPI.Exception`` in the block as ``TransportError``.

    Raises:
        ImportError: mpi4py is not installed.
        TransportError: an MPI call in the block failed.
    """
    load_mpi()
    try:
        yield
    except MPI.Exception as exc:
        raise translate(exc, what, rank) from exc


class Backoff:
    """How long the progress task waits between polls (mpi4py.futures' ``Backoff``, plus a
    spin phase for latency).

    After activity it polls back to back (delay 0) for ``spin`` seconds, so a reply that
    comes within that window is seen at once; then it sleeps ``tmin`` (``tmax / 1024``),
    doubling up to ``tmax``, so an idle rank costs almost nothing.  Time is passed in.
    """

    __slots__ = ("spin", "spin_until", "tmax", "tmin", "tval")

    def __init__(self, *, tmax: float = 1e-3, spin: float = 1e-3) -> None:
        self.tmax = tmax
        self.tmin = tmax / 1024
        self.spin = spin
        self.spin_until = 0.0
        self.tval = 0.0

    def reset(self, now: float) -> None:
        """Something happened: spin again."""
        self.spin_until = now + self.spin
        self.tval = 0.0

    def since_reset(self, now: float) -> float:
        """Seconds since the last activity (``reset``)."""
        return now - self.spin_until + self.spin

    def delay(self, now: float) -> float:
        """The next wait, in seconds (0: poll again as soon as other tasks ran)."""
        if now < self.spin_until:
            return 0.0
        tval = self.tval
        self.tval = min(self.tmax, max(self.tmin, tval * 2))
        return tval


def _no_yield() -> None:
    """Where there is no ``os.sched_yield``: nothing to give."""


#: Give the core to another runnable process, if one waits (a no-op elsewhere).  Bound
#: once: spinning pollers call it between polls.
sched_yield: Callable[[], None] = getattr(os, "sched_yield", _no_yield)


@types.coroutine
def yield_now() -> Generator[None, None, None]:
    """Let every other ready task run once (``asyncio.sleep(0)`` without its wrapper)."""
    yield


async def wait_request(req: MPI.Request) -> None:
    """Wait for an MPI request without blocking the loop (where no progress task runs)."""
    backoff = Backoff()
    backoff.reset(time.perf_counter())
    while not req.Test():  # noqa: ASYNC110  # MPI cannot wake us: poll, backing off
        await asyncio.sleep(backoff.delay(time.perf_counter()))
