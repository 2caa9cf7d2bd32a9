"""mpi4py, loaded lazily, and the one place where MPI's errors are translated.

Importing asynccomm's MPI modules must not start MPI (``from mpi4py import MPI``
initialises it), so ``MPI`` here is bound by ``load_mpi()`` when the first MPI world opens.
``translate`` turns ``MPI.Exception`` into ``TransportError``; ``mpi_errors`` applies it to
a block (httpcore's ``map_exceptions``).
"""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .._exceptions import TransportError
from ._mpi_protocol import Backoff

if TYPE_CHECKING:
    from mpi4py import MPI
else:
    MPI = None  # bound by load_mpi()

__all__ = ["MPI", "comm_world", "load_mpi", "mpi_errors", "translate", "wait_request",
           "yield_now"]


def load_mpi() -> None:
    """Import ``mpi4py.MPI`` (initialising MPI) if it is not imported yet.

    Raises:
        ImportError: mpi4py is not installed.
    """
    global MPI  # bound lazily, see the module docs
    if MPI is None:
        try:
            from mpi4py import MPI
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
