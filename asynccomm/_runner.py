"""Worlds and the runner: ``open_world`` builds N ranks on this loop, ``run`` drives a
program on every rank and returns (or raises) what the ranks did."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import uvloop

from ._communicator import Communicator, Device, _check_timeout
from ._engine import DeviceEngine
from ._types import EAGER_LIMIT
from .transports.local import LocalTransport

__all__ = ["World", "launched_by_mpi", "open_world", "run"]

T = TypeVar("T")

#: Default cap on staged eager messages per rank.
POOL_BYTES = 64 << 20

_LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


@dataclass(frozen=True)
class World:
    """The ranks of one in-process world; ``comms[i]`` is rank i's communicator."""

    comms: tuple[Communicator, ...]

    @property
    def size(self) -> int:
        return len(self.comms)


def default_timeout() -> float | None:
    """The default per-op timeout from ``ASYNCCOMM_TIMEOUT`` (seconds; unset or empty: none).

    Raises:
        ValueError: if the variable is set to something that is not a timeout.
    """
    raw = os.environ.get("ASYNCCOMM_TIMEOUT", "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"ASYNCCOMM_TIMEOUT={raw!r} is not a number of seconds") from None
    return _check_timeout(value)


def _check_world(size: object, cluster: object, clock: object, eager_limit: object,
                 pool_bytes: object) -> int:
    if type(size) is not int:
        raise TypeError(f"world size must be an int, got {type(size).__name__}")
    if size < 1:
        raise ValueError(f"world size must be >= 1, got {size}")
    if cluster is not None:
        raise ValueError("cluster models are not available in this version; use cluster=None")
    if clock not in ("auto", "wall"):
        raise ValueError(f"clock must be 'auto' or 'wall' without a cluster, got {clock!r}")
    for name, value in (("eager_limit", eager_limit), ("pool_bytes", pool_bytes)):
        if type(value) is not int or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return size


@asynccontextmanager
async def open_world(size: int, cluster: object = None, clock: str = "auto", *,
                     eager_limit: int = EAGER_LIMIT, pool_bytes: int = POOL_BYTES,
                     timeout: float | None = None) -> AsyncIterator[World]:
    """Open ``size`` in-process ranks on the running loop; close them all on exit.

    Args:
        size: the number of ranks.
        cluster: reserved for cluster models; must be None.
        clock: ``"auto"`` or ``"wall"`` (real time).
        eager_limit: messages up to this many bytes (inclusive) are sent eagerly.
        pool_bytes: the cap on staged eager bytes per rank.
        timeout: the default per-op timeout; None takes ``ASYNCCOMM_TIMEOUT``.

    Raises:
        TypeError, ValueError: bad arguments or a bad ``ASYNCCOMM_TIMEOUT``.
    """
    n = _check_world(size, cluster, clock, eager_limit, pool_bytes)
    op_timeout = default_timeout() if timeout is None else _check_timeout(timeout)
    loop = asyncio.get_running_loop()
    transport = LocalTransport()
    comms = []
    for rank in range(n):
        engine = DeviceEngine(rank, n, transport, loop=loop, eager_limit=eager_limit,
                              pool_bytes=pool_bytes)
        transport.attach(engine)
        comms.append(Communicator(engine, default_timeout=op_timeout,
                                  device=Device(rank, f"sim:{rank}")))
        engine.log.info("comm.opened")
    try:
        yield World(tuple(comms))
    finally:
        for comm in comms:
            await comm.aclose()


async def run_ranks(main: Callable[[Communicator], Awaitable[T]],
                    comms: tuple[Communicator, ...]) -> list[T]:
    """Run ``main(comm)`` for every rank concurrently; each rank's communicator closes when
    its ``main`` returns, so peers still waiting for it get ``CommBrokenError`` instead of
    hanging.  When a rank fails the others are cancelled first (so they do not fail in turn
    for want of it), then every communicator closes with the world.

    Raises:
        Exception: the failure of the one rank that failed (with a note naming the rank),
            or an ``ExceptionGroup`` of every rank's failure.
    """
    async def one(comm: Communicator) -> T:
        result = await main(comm)
        await comm.aclose()
        return result

    tasks = [asyncio.create_task(one(c), name=f"asynccomm-rank-{c.rank}") for c in comms]
    try:
        pending: set[asyncio.Task[T]] = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            if any(not t.cancelled() and t.exception() is not None for t in done):
                break
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks)
    failures: list[Exception] = []
    for rank, t in enumerate(tasks):
        if not t.cancelled() and (exc := t.exception()) is not None:
            exc.add_note(f"(raised on rank {rank})")
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: as they are
                raise exc
            failures.append(exc)
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise ExceptionGroup(f"{len(failures)} ranks failed", failures)
    return [t.result() for t in tasks]


#: Variables that MPI launchers (MPICH/Hydra, Open MPI, PMIx, Slurm's PMI) set in each process.
_MPI_LAUNCH_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                    "MPI_LOCALRANKID")


def launched_by_mpi() -> bool:
    """True if this process was started by an MPI launcher (mpiexec, srun with PMI)."""
    return any(var in os.environ for var in _MPI_LAUNCH_VARS)


def run(main: Callable[[Communicator], Coroutine[Any, Any, T]], world_size: int | None = None,
        *, cluster: object = None, clock: str = "auto", loop: str = "uvloop",
        backend: str | None = None, **options: Any) -> Any:
    """Run ``main(comm)`` on every rank and return what the ranks returned.

    In-process (the default), ``world_size`` ranks run as coroutines on a new event loop
    and the result is the list of their return values, in rank order.  Under an MPI
    launcher (``mpiexec -n N python script.py``), or with ``backend="mpi"``, this process
    runs ``main`` for its own rank on the MPI transport and gets its own rank's value.

    Args:
        main: an async function taking a Communicator.
        world_size: the number of in-process ranks; under MPI, None or the MPI world size.
        cluster, clock: as ``open_world``.
        loop: ``"uvloop"`` (default) or ``"asyncio"``.
        backend: ``"local"`` (in-process) or ``"mpi"``; None picks MPI when launched by MPI.
        options: more ``open_world`` keywords (``eager_limit``, ``pool_bytes``, ``timeout``).

    Raises:
        TypeError, ValueError: bad arguments.
        Exception: as ``run_ranks``.
    """
    if not callable(main):
        raise TypeError(f"main must be an async function taking a Communicator, got {main!r}")
    factory = _LOOPS.get(loop)
    if factory is None:
        raise ValueError(f"loop must be one of {sorted(_LOOPS)}, got {loop!r}")
    if backend is None:
        backend = "mpi" if world_size is None and launched_by_mpi() else "local"
    if backend == "mpi":
        from .transports.mpi import run_mpi  # mpi4py is imported only here

        return run_mpi(main, world_size, loop_factory=factory, cluster=cluster, clock=clock,
                       **options)
    if backend != "local":
        raise ValueError(f"backend must be 'local' or 'mpi', got {backend!r}")
    if world_size is None:
        raise TypeError("run() needs world_size for in-process ranks "
                        "(or an MPI launch: mpiexec -n N python script.py)")
    _check_world(world_size, cluster, clock, options.get("eager_limit", 0),
                 options.get("pool_bytes", 0))

    async def world_main() -> list[T]:
        async with open_world(world_size, cluster, clock, **options) as world:
            return await run_ranks(main, world.comms)

    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(world_main())
