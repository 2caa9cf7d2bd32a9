"""Helpers for tests of programs written with asynccomm."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .transports import _mpi_lib
from .transports.mpi import MPITransport

__all__ = ["fail_next_mpi_call", "posted"]

T = TypeVar("T")


async def posted(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Run ``coro`` (say ``comm.recv(...)``) in a task and return the task once the
    coroutine has run up to its first wait, so its operation is posted: no sleeps, no
    polling.  Cancel or await the task as any other.
    """
    running = asyncio.Event()

    async def body() -> T:
        running.set()  # wakes the caller only after this step ends, at the first wait
        return await coro

    task = asyncio.ensure_future(body())
    await running.wait()
    return task


def fail_next_mpi_call(comm: Any, call: str) -> None:
    """Make this rank's next MPI ``call`` fail as if MPI had failed underneath (fault
    injection, for tests of a program's error handling on MPI).

    ``"Isend"``: this rank's next MPI send fails.  The op that made it fails with
    ``TransportError`` and the communicator stays usable; but where the fast lane made it
    (a small message), the message is sent once more the usual way, which then succeeds
    (so a test of the failure sends a message above the eager limit).  ``"Testsome"``: the
    next poll of pending MPI requests fails (every pending op fails with
    ``TransportError``; the world cannot close cleanly, so ``ac.run`` aborts the job).

    Raises:
        TypeError: ``comm`` is not a communicator of an MPI world.
        ValueError: ``call`` is neither of those.
    """
    link = getattr(getattr(comm, "_engine", None), "link", None)
    if not isinstance(link, MPITransport):
        raise TypeError("fail_next_mpi_call needs a communicator of an MPI world")
    progress = link.progress
    if call == "Isend":
        progress.comm = _FailOnce(progress.comm, "Isend", lambda real: setattr(  # type: ignore[assignment]
            progress, "comm", real))
    elif call == "Testsome":
        real_testsome = progress._testsome

        def failing(reqs: Any) -> Any:
            progress._testsome = real_testsome
            raise _mpi_error()

        progress._testsome = failing  # type: ignore[assignment]
    else:
        raise ValueError(f"call must be 'Isend' or 'Testsome', got {call!r}")


class _FailOnce:
    """An MPI communicator whose next ``name`` call fails (everything else is the real one's,
    and the real one is put back by ``restore`` at that failure)."""

    def __init__(self, real: Any, name: str, restore: Callable[[Any], None]) -> None:
        self._real = real
        self._name = name
        self._restore = restore

    def __getattr__(self, name: str) -> Any:
        if name == self._name:
            self._restore(self._real)

            def fail(*args: Any) -> Any:
                raise _mpi_error()

            return fail
        return getattr(self._real, name)


def _mpi_error() -> Exception:
    _mpi_lib.load_mpi()
    mpi = _mpi_lib.MPI
    return mpi.Exception(mpi.ERR_OTHER)
