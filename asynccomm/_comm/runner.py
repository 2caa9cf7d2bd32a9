"""Worlds and the runner: ``open_world`` builds N ranks on this loop, ``run`` drives a
program on every rank and returns (or raises) what the ranks did."""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import uvloop

from .._engine import tracing as _trace
from .._engine.engine import DeviceEngine
from .._engine.lane import Lane
from .._engine.options import (
    POOL_BYTES,
    check_timeout,
    check_world,
    clock_mode,
    default_timeout,
    not_async,
)
from .._exceptions import CommBrokenError, DeadlockError
from .._types import EAGER_LIMIT
from ..sim.clock import ModelClock
from ..sim.device import Device
from ..sim.faults import FaultPlan, PlannedFaults
from ..sim.loop import VirtualTimeLoop, new_virtual_loop
from ..sim.model import ClusterModel
from ..sim.timing import ModelledTiming
from ..transports._mpi_lib import comm_world
from ..transports.local import LocalLink
from . import hang as _hang
from .communicator import Communicator, world_lane
from .planned import FaultRuntime
from .process_runner import check_processes, run_processes
from .view import CommView

if TYPE_CHECKING:
    from ..sim.cluster import Cluster
    from ..sim.model import Strategy
    from ..sim.timing import ModelledTiming

__all__ = ["World", "launched_by_mpi", "mpi_world_size", "open_world", "run",
           "run_async"]

T = TypeVar("T")

_LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
    "virtual": new_virtual_loop,
}


@dataclass(frozen=True)
class World:
    """The ranks of one in-process world; ``comms[i]`` is rank i's communicator."""

    comms: tuple[Communicator, ...]

    @property
    def size(self) -> int:
        return len(self.comms)


@asynccontextmanager
async def open_world(size: int, cluster: Cluster | None = None, clock: str = "auto", *,
                     eager_limit: int = EAGER_LIMIT, pool_bytes: int = POOL_BYTES,
                     timeout: float | None = None, time_scale: float = 1.0,
                     strategy: Strategy | None = None,
                     trace: str | os.PathLike[str] | None = None,
                     native: bool | None = None,
                     fault_plan: FaultPlan | None = None) -> AsyncIterator[World]:
    """Open ``size`` in-process ranks on the running loop; close them all on exit.

    Args:
        size: the number of ranks.
        cluster: a cluster model (``ac.Cluster.preset("ascend910b")``): transfers and
            compute then take modelled time, and ops keep records.  None: instant.
        clock: ``"virtual"`` (model time on the virtual-time loop: jumps when every task
            waits, raises ``DeadlockError`` when nothing can wake), ``"wall"`` (real time),
            or ``"auto"``: virtual with a cluster, wall without.
        eager_limit: messages up to this many bytes (inclusive) are sent eagerly.
        pool_bytes: the cap on staged eager bytes per rank.
        timeout: the default per-op timeout; None takes ``ASYNCCOMM_TIMEOUT``.
        time_scale: on the wall clock, real seconds per modelled second (uvloop's timers
            have millisecond resolution: a scale of 1000 makes modelled microseconds real).
        strategy: how the cluster model chooses store-and-forward or pipelined transfers
            and chunk sizes (``asynccomm.sim.DefaultStrategy`` unless given).
        trace: write a Chrome trace-event JSON file of every op here when the world
            closes (None: ``ASYNCCOMM_TRACE``, if set).  See ``asynccomm.trace``.
        native: the fast lane of this world's small messages: True the C accelerator,
            False the pure-Python steps (they behave the same), None the C accelerator
            where it is built (``ASYNCCOMM_PURE_PYTHON=1`` switches it off everywhere).
        fault_plan: an ``asynccomm.sim.FaultPlan`` (needs ``cluster``): delays, jitter,
            degraded bandwidth and partitions on links, crashes, slowdowns and hangs of
            ranks, as the plan says (``docs/faults.md``).  The ranks go on when one fails
            (what ``ac.run(..., faults="tolerate")`` does); the trace shows the faults.

    Raises:
        TypeError, ValueError: bad arguments, a bad ``ASYNCCOMM_TIMEOUT``,
            ``clock="virtual"`` on a loop that is not the virtual-time loop, or
            ``native=True`` where the C accelerator is not built (or is switched off).
    """
    mode = check_world(size, cluster, clock, eager_limit, pool_bytes)
    lane = world_lane(native)
    trace_file = _trace.trace_path(trace)
    op_timeout = default_timeout() if timeout is None else check_timeout(timeout)
    loop = asyncio.get_running_loop()
    if mode == "virtual" and not isinstance(loop, VirtualTimeLoop):
        raise ValueError("clock='virtual' needs the virtual-time loop: use "
                         "ac.run(main, n, clock='virtual') or asyncio.Runner("
                         "loop_factory=asynccomm.sim.new_virtual_loop)")
    model_clock = ModelClock(loop, time_scale=time_scale if mode == "wall" else 1.0)
    timing, devices = _fabric(size, cluster, model_clock, strategy)
    runtime = _fault_runtime(fault_plan, timing, model_clock)
    registry: list[DeviceEngine] = []  # every engine of the world, sub-communicators' too
    family = _LocalFamily(timing, list(range(size)), devices, registry, loop=loop,
                          clock=model_clock, eager_limit=eager_limit, pool_bytes=pool_bytes,
                          timeout=op_timeout, mode=mode, record=cluster is not None, lane=lane,
                          faults=runtime)
    comms = [family.make(rank, size) for rank in range(size)]
    sink = None if trace_file is None else _trace.attach(
        trace_file, [c._engine for c in comms], model=cluster is not None,
        time_scale=time_scale if mode == "wall" and cluster is not None else 1.0)
    family.trace(sink, comms)
    family.connect(comms)
    if runtime is not None:
        runtime.start(comms)
    for comm in comms:
        comm._engine.log.info("comm.opened", clock=mode, fast_lane=lane.name)
    if isinstance(loop, VirtualTimeLoop):
        loop.on_idle = lambda: _hang.fail_deadlocked(registry)
    try:
        yield World(tuple(comms))
    finally:
        for comm in comms:
            await comm.aclose()
        if isinstance(loop, VirtualTimeLoop):
            loop.on_idle = None
        if sink is not None:
            if runtime is not None:
                sink.notes.extend(_trace.fault_events(runtime.faults.events))
            sink.write()


def _fault_runtime(plan: FaultPlan | None, timing: ModelledTiming | None,
                   clock: ModelClock) -> FaultRuntime | None:
    """The world's fault plan compiled and armed on its model, or None."""
    if plan is None:
        return None
    if not isinstance(plan, FaultPlan):
        raise TypeError(f"fault_plan must be an asynccomm.sim.FaultPlan or None, got "
                        f"{type(plan).__name__}")
    if timing is None:
        raise ValueError("a fault plan runs on the cluster model: open the world with a "
                         "cluster (ac.Cluster.preset(...))")
    faults = PlannedFaults(plan, timing.model.cluster, timing.model.world_size)
    timing.model.faults = faults
    return FaultRuntime(faults, clock)


class _Forming:
    """A new group's communicators while its members arrive (in-process)."""

    def __init__(self, family: _LocalFamily, size: int) -> None:
        self.family = family
        self.comms: dict[int, Communicator] = {}
        self.size = size
        self.ready = asyncio.Event()
        self.lost: int | None = None  # a member that failed (or forfeited) before it arrived
        self.recheck: Callable[[], None] | None = None  # while members are awaited


class _LocalFamily:
    """Makes the communicators of one group of an in-process world (the world itself, or a
    sub-communicator): each group has a link of its own (its own matching context), and
    its private context another, both timed on the world's model with the group's ranks
    mapped to the world's devices."""

    def __init__(self, timing: ModelledTiming | None, ranks: list[int],
                 devices: list[Device], registry: list[DeviceEngine], *,
                 loop: asyncio.AbstractEventLoop, clock: ModelClock, eager_limit: int,
                 pool_bytes: int, timeout: float | None, mode: str, record: bool,
                 lane: Lane, world: list[int] | None = None, label: str = "",
                 faults: FaultRuntime | None = None) -> None:
        self.faults = faults  # the world's fault plan as it runs, if it has one
        self.link = LocalLink(timing) if faults is None else faults.link(timing)
        self.label = label  # where in the world's communicators (traces): "" the world
        self.sink: _trace.TraceSink | None = None
        self.private_link = LocalLink(timing) if faults is None else faults.link(timing)
        self.ranks = ranks  # world rank of each rank of this group
        self.devices = devices  # the world's, by world rank
        self.registry = registry
        self.loop = loop
        self.clock = clock
        self.eager_limit = eager_limit
        self.pool_bytes = pool_bytes
        self.timeout = timeout
        self.mode = mode
        self.record = record
        self.lane = lane  # the world's fast lane
        self.forming: dict[tuple[Any, ...], _Forming] = {}
        #: The parent ranks that will not join each group (``forfeit``; kept, as the
        #: world's ``gone`` is, for a member that arrives after the group was given up).
        self.forfeited: dict[tuple[Any, ...], set[int]] = {}
        self.world = ranks if world is None else world
        self.group: list[Communicator] = []  # the group's communicators, once connected

    def _engine(self, link: LocalLink, rank: int, size: int, context: str) -> DeviceEngine:
        engine = DeviceEngine(rank, size, link, loop=self.loop,
                              eager_limit=self.eager_limit, pool_bytes=self.pool_bytes,
                              clock=self.clock, device=self.devices[self.ranks[rank]],
                              lane=self.lane, record=self.record,
                              inline_copies=self.mode == "virtual", instant=link.timing is None)
        engine.world_rank = self.ranks[rank]
        engine.world_ranks = self.ranks
        engine.context = context
        if len(self.registry) > 64 and len(self.registry) & 63 == 0:  # forget closed ones
            self.registry[:] = [e for e in self.registry if not e.closed]
        self.registry.append(engine)
        return engine

    def _where(self, rank: int, size: int) -> str:
        return ("" if self.ranks is self.world
                else f"(on a sub-communicator, as its rank {rank} of {size})")

    def make(self, rank: int, size: int) -> Communicator:
        """Rank ``rank``'s communicator (not connected yet).  Its private context is made
        on first use, for the whole group at once (``open_private``)."""
        return Communicator(self._engine(self.link, rank, size, self._where(rank, size)),
                            default_timeout=self.timeout, device=self.devices[self.ranks[rank]],
                            family=self)

    def open_private(self, comm: CommView) -> None:
        """Make the private contexts of every rank of ``comm``'s group: in one process a
        group can make them all at once, when the first rank needs one (a world that only
        sends and receives never has them).  Those of ranks that closed close at once."""
        size = len(self.group)
        privates = []
        for member in self.group:
            rank = member.rank
            private = Communicator(
                self._engine(self.private_link, rank, size,
                             f"(inside a collective){self._where(rank, size)}"),
                default_timeout=member._default_timeout, device=member.device, family=self)
            private._engine.private = True
            # One staging pool per rank and group: what its objects' buffers and its
            # collectives stage counts against the same ``pool_bytes`` as its messages.
            private._engine.pool = member._engine.pool
            if self.sink is not None:
                private._engine.tracer = self.sink.rank(
                    rank, label=_trace.join(self.label, "collectives"),
                    pid=private._engine.world_rank)
            member._adopt_private(private)
            privates.append(private)
        self._attach(self.private_link, [p._engine for p in privates])
        for member, private in zip(self.group, privates, strict=True):
            if member.closed:
                member._private_comm = None
                private._parent = None
                self.loop.create_task(private.aclose())

    def trace(self, sink: _trace.TraceSink | None, comms: list[Communicator]) -> None:
        """Trace the group's ops into ``sink`` (its world's), under the group's label (the
        world's own communicator is traced by the world)."""
        self.sink = sink
        if sink is None or not self.label:
            return
        for comm in comms:
            engine = comm._engine
            engine.tracer = sink.rank(engine.rank, label=self.label, pid=engine.world_rank)

    def connect(self, comms: list[Communicator]) -> None:
        """Attach every rank's engine to the link, in rank order."""
        self.group = comms
        self._attach(self.link, [c._engine for c in comms])

    def _attach(self, link: LocalLink, engines: list[DeviceEngine]) -> None:
        for engine in engines:
            link.attach(engine)
        if link.timing is None and not any(e.trace for e in engines):
            for engine in engines:  # instant, in this process, not logging every message:
                engine.peers = engines  # the fast lane is open (traced, if tracing)
                if self.sink is None:
                    engine.fast = True
                else:
                    engine.traced = True

    async def child(self, parent: CommView, members: list[int] | None, color: int,
                    key: tuple[Any, ...]) -> Communicator | None:
        if members is None:
            return None
        forming = self.forming.get(key)
        if forming is None:
            timing = self.link.timing
            sub = _LocalFamily(None if timing is None else timing.for_ranks(members),
                               [self.ranks[m] for m in members], self.devices,
                               self.registry, loop=self.loop, clock=self.clock,
                               eager_limit=self.eager_limit, pool_bytes=self.pool_bytes,
                               timeout=self.timeout, mode=self.mode, record=self.record,
                               lane=self.lane, world=self.world, label=_trace.join(
                                   self.label, _trace.context_label(key)), faults=self.faults)
            forming = self.forming[key] = _Forming(sub, len(members))
        rank = members.index(parent.rank)
        comm = forming.comms[rank] = forming.family.make(rank, forming.size)
        comm._default_timeout = parent._default_timeout
        if len(forming.comms) == forming.size:  # the last member: connect the group
            del self.forming[key]
            group = [forming.comms[r] for r in range(forming.size)]
            forming.family.trace(self.sink, group)
            forming.family.connect(group)
            forming.ready.set()
        elif key[0] == "shrink":  # made for every survivor at once (``_comm.faults``)
            await forming.ready.wait()
        else:
            await self._formed(forming, members, key)
        if forming.lost is not None:
            raise CommBrokenError(
                f"rank {forming.lost} failed or left before it joined the new communicator "
                f"of rank {parent.rank} (split or dup)", rank=parent.rank, peer=forming.lost)
        return comm

    def forfeit(self, parent: CommView, key: tuple[Any, ...]) -> None:
        """``parent``'s rank will not join the group ``key`` (it could not hear whether the
        group is made): the members that came, or come, do not wait for it."""
        self.forfeited.setdefault(key, set()).add(parent.rank)
        forming = self.forming.get(key)
        if forming is not None and forming.recheck is not None:
            forming.recheck()

    async def _formed(self, forming: _Forming, members: list[int], key: tuple[Any, ...]) -> None:
        """Wait until every member arrived, or one failed before it did (its end of this
        group's link closed): then nobody waits for it, and every member that came hears
        of it (``forming.lost``)."""
        gone = self.link.gone

        def watch(rank: int) -> None:
            forfeited = self.forfeited.get(key, ())
            lost = [m for i, m in enumerate(members)
                    if i not in forming.comms and (m in gone or m in forfeited)]
            if lost and not forming.ready.is_set():
                forming.lost = lost[0]
                self.forming.pop(key, None)
                forming.ready.set()

        self.link.watchers.append(watch)
        forming.recheck = lambda: watch(-1)
        try:
            watch(-1)  # one may have failed (or forfeited) already
            await forming.ready.wait()
        finally:
            forming.recheck = None
            self.link.watchers.remove(watch)


def _fabric(size: int, cluster: Cluster | None, clock: ModelClock,
            strategy: Strategy | None) -> tuple[ModelledTiming | None, list[Device]]:
    """The timing and devices of a world: instant, or timed by a cluster model."""
    if cluster is None:
        return None, [Device(rank, f"sim:{rank}") for rank in range(size)]

    fitted = cluster.fit(size)
    spec = fitted.device
    devices = [Device(rank, f"{fitted.name}:{rank}", flops=spec.flops, capacity=spec.memory)
               for rank in range(size)]
    model = ClusterModel(fitted, size, strategy=strategy)
    return ModelledTiming(model, clock), devices


def _watch(comms: tuple[Communicator, ...]) -> _hang.Watch:
    """The hang watchdog of a world, with the deadlock proof when its ranks are instant
    and on the wall clock (the virtual clock proves deadlocks itself).  It watches every
    engine of the world: its sub-communicators' and private contexts' too."""
    family = comms[0]._family
    engines = (family.registry if isinstance(family, _LocalFamily)
               else [c._engine for c in comms])
    loop = asyncio.get_running_loop()
    if isinstance(loop, VirtualTimeLoop):  # a timer there would keep virtual time moving
        return _hang.Watch(engines, loop, timeout=0.0, driver=None, warn=0.0)
    provable = all(isinstance(e.link, LocalLink) and e.link.timing is None for e in engines)
    return _hang.Watch(engines, loop, timeout=_hang.hang_timeout(),
                       driver=asyncio.current_task() if provable else None)


async def run_ranks(main: Callable[[Communicator], Awaitable[T]],
                    comms: tuple[Communicator, ...],
                    on_cancel: Callable[[], None] | None = None, *,
                    faults: str = "abort") -> list[T]:
    """Run ``main(comm)`` for every rank concurrently; each rank's communicator closes when
    its ``main`` returns, so peers still waiting for it get ``CommBrokenError`` instead of
    hanging.  When a rank fails the others are cancelled first (so they do not fail in turn
    for want of it), then the failed rank's communicator closes (what a peer still moves
    with it fails, and is not reported: the failed rank's error is), then every
    communicator closes with the world.

    Raises:
        Exception: the failure of the one rank that failed (with a note naming the rank),
            or an ``ExceptionGroup`` of every rank's failure.
    """
    watch = _watch(comms)  # first: it may refuse a bad ASYNCCOMM_HANG_TIMEOUT
    coros = [main(c) for c in comms]
    if not all(inspect.isawaitable(c) for c in coros):
        for c in coros:
            if inspect.iscoroutine(c):
                c.close()
        raise not_async(main, coros[0])

    async def one(comm: Communicator, coro: Awaitable[T]) -> T:
        if faults == "tolerate":
            return await _tolerated(comm, coro)  # type: ignore[no-any-return]
        result = await coro
        await comm.aclose()
        return result

    tasks = [asyncio.create_task(one(c, coro), name=f"asynccomm-rank-{c.rank}")
             for c, coro in zip(comms, coros, strict=True)]
    watch.start()
    try:
        pending: set[asyncio.Task[T]] = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            if any(not t.cancelled() and t.exception() is not None for t in done):
                break
    except asyncio.CancelledError:
        if on_cancel is not None:  # before the ranks are cancelled: what they waited for
            on_cancel()
        raise
    finally:
        failed = [t.done() and not t.cancelled() and t.exception() is not None
                  for t in tasks]
        for t in tasks:
            t.cancel()
        # The failed ranks close now, as a failed process's do: what their peers still
        # move with them (an object's committed buffers) fails with CommBrokenError
        # instead of waiting for a rank that is gone.  The watchdog watches until the end.
        closing = [asyncio.ensure_future(c.aclose())
                   for c, f in zip(comms, failed, strict=True) if f]
        await asyncio.wait([*tasks, *closing])
        watch.stop()
    failures: list[Exception] = []
    for rank, t in enumerate(tasks):
        if not t.cancelled() and (exc := t.exception()) is not None:
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: as they are
                raise exc
            if not failed[rank] and any(failed) and isinstance(exc, CommBrokenError):
                continue  # cancelled, it lost a peer that had failed: that rank's error
            if isinstance(exc, DeadlockError):  # one error for the whole world
                _one_deadlock(failures, exc)
                continue
            exc.add_note(f"(raised on rank {rank})")
            failures.append(exc)
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise ExceptionGroup(f"{len(failures)} ranks failed", failures)
    return [t.result() for t in tasks]


async def _tolerated(comm: Communicator, coro: Awaitable[Any]) -> Any:
    """``faults="tolerate"``: a rank that raises has failed; its communicators close as
    failed (its peers get ``CommBrokenError``, and go on) and its error is its result."""
    try:
        result = await coro
    except DeadlockError:
        raise  # the whole world's: reported as ever
    except Exception as exc:
        comm._mark_failed(exc)
        await comm.aclose()
        exc.add_note(f"(raised on rank {comm.rank})")
        return exc
    await comm.aclose()
    return result


def _faults(options: dict[str, Any]) -> str:
    """Take ``faults=`` out of ``options`` and check it (a fault plan implies and needs
    "tolerate")."""
    planned = options.get("fault_plan") is not None
    faults = options.pop("faults", "tolerate" if planned else "abort")
    if faults not in ("abort", "tolerate"):
        raise ValueError(f"faults must be 'abort' or 'tolerate', got {faults!r}")
    if planned and faults != "tolerate":
        raise ValueError("a fault_plan makes ranks fail on purpose: it needs "
                         "faults='tolerate' (its default)")
    return faults  # type: ignore[no-any-return]


def _one_deadlock(failures: list[Exception], exc: DeadlockError) -> None:
    """Add ``exc`` to ``failures`` unless it is the world's deadlock already there (the
    same error, or a copy a collective made to note itself: its notes join the first)."""
    for f in failures:
        if f is exc:
            return
        if isinstance(f, DeadlockError) and f.args == exc.args:
            for note in getattr(exc, "__notes__", ()):
                if note not in getattr(f, "__notes__", ()):
                    f.add_note(note)
            return
    failures.append(exc)


#: Variables that MPI launchers (MPICH/Hydra, Open MPI, PMIx, Slurm's PMI) set in each process.
_MPI_LAUNCH_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                    "MPI_LOCALRANKID")


def launched_by_mpi() -> bool:
    """True if this process was started by an MPI launcher (mpiexec, srun with PMI)."""
    return any(var in os.environ for var in _MPI_LAUNCH_VARS)


#: Variables that carry the number of processes, by launcher (MPICH/Hydra and Intel MPI,
#: Open MPI, Slurm).
_MPI_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")


def mpi_world_size() -> int | None:
    """The number of processes an MPI launcher started, or None when this process was not
    started by one: the world size ``run`` uses there, known before anything runs (so a
    program can size its work for ``mpiexec -n N`` as for ``world_size=N``).  Read from the
    launcher's environment, or from MPI itself (which it then starts) when that is silent.
    """
    if not launched_by_mpi():
        return None
    for var in _MPI_SIZE_VARS:
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)

    return int(comm_world().Get_size())


def _no_mpi_faults(backend: str, options: dict[str, Any]) -> None:
    """Check ``faults=`` before any rank runs; MPI worlds abort on a failure (mpi4py 4.1.2
    has no ``Comm.Revoke``/``Agree``/``Shrink`` here: see ``faults``)."""
    faults = _faults(dict(options))
    if backend == "mpi" and faults != "abort":
        raise NotImplementedError("faults='tolerate' runs in-process worlds and worlds of "
                                  "processes, not MPI (mpi4py 4.1.2 has no Comm.Revoke, "
                                  "Agree or Shrink here)")
    if backend == "mpi":
        options.pop("faults", None)


def _running() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _backend(main: object, backend: str | None, processes: bool = False) -> str:
    """Check ``main`` and ``backend``; return the backend (``"local"``, ``"mpi"`` or
    ``"processes"``; ``processes=True`` says the last)."""
    if not callable(main):
        raise TypeError(f"main must be an async function taking a Communicator, got {main!r}")
    if processes is not False:
        if processes is not True or backend not in (None, "processes"):
            raise ValueError(f"processes=True is backend='processes' (got processes="
                             f"{processes!r}, backend={backend!r})")
        return "processes"
    if backend is None:
        return "mpi" if launched_by_mpi() else "local"
    if backend not in ("local", "mpi", "processes"):
        raise ValueError(f"backend must be 'local', 'mpi' or 'processes', got {backend!r}")
    return backend


async def _run_world(main: Callable[[Communicator], Coroutine[Any, Any, T]],
                     world_size: int | None, cluster: Cluster | None, clock: str,
                     options: dict[str, Any], interrupted: list[str] | None) -> list[T]:
    """Open an in-process world on the running loop and run ``main`` on every rank (as
    ``run_ranks``); a cancellation appends the ranks' pending ops to ``interrupted``."""
    if world_size is None:
        raise TypeError("run_async() needs world_size for in-process ranks "
                        "(or an MPI launch: mpiexec -n N python script.py)")
    faults = _faults(options)
    async with open_world(world_size, cluster, clock, **options) as world:
        family = world.comms[0]._family
        # every engine: sub-communicators' and private contexts' too
        engines = (family.registry if isinstance(family, _LocalFamily)
                   else [c._engine for c in world.comms])
        uninstall = _hang.install_dump_signal(asyncio.get_running_loop(), lambda: engines)
        on_cancel = None if interrupted is None else (
            lambda: interrupted.append(_hang.dump(engines)))
        try:
            return await run_ranks(main, world.comms, on_cancel=on_cancel, faults=faults)
        finally:
            uninstall()


def run(main: Callable[[Communicator], Coroutine[Any, Any, T]], world_size: int | None = None,
        *, cluster: Cluster | None = None, clock: str = "auto", loop: str | None = None,
        backend: str | None = None, processes: bool = False, **options: Any) -> Any:
    """Run ``main(comm)`` on every rank and return what the ranks returned.

    In-process (the default), ``world_size`` ranks run as coroutines on a new event loop
    and the result is the list of their return values, in rank order.  Under an MPI
    launcher (``mpiexec -n N python script.py``), or with ``backend="mpi"``, this process
    runs ``main`` for its own rank on the MPI transport and gets its own rank's value.
    Inside a running event loop (Jupyter, an ``async def``) use ``await run_async(...)``.

    Args:
        main: an async function taking a Communicator.
        world_size: the number of ranks: in-process, how many to make; under an MPI
            launcher, None or the number of processes it started (another number is an
            error: ``backend="local"`` asks for an in-process world there).
        cluster, clock: as ``open_world``.
        loop: ``"uvloop"`` (the default on the wall clock) or ``"asyncio"``; the virtual
            clock always runs on asynccomm's virtual-time loop.
        backend: ``"local"`` (in-process), ``"mpi"``, or ``"processes"``: ``world_size``
            processes on this machine (Linux), over shared memory, no MPI needed; ``main``
            must be importable (defined at the top level of a module), and each rank
            runs it on an event loop of its own.  None: MPI under an MPI launcher,
            in-process elsewhere.
        processes: True is ``backend="processes"``.
        options: more ``open_world`` keywords (``eager_limit``, ``pool_bytes``, ``timeout``,
            ``native``, ``trace``: under MPI each process writes ``<name>.rank<N>.json``;
            with processes the parent merges those into ``<name>`` once every rank has
            ended, failed or not), and
            ``faults``: ``"abort"`` (the default: a rank that raises ends the run, as
            below) or ``"tolerate"`` (in-process and with processes: a rank that raises,
            or whose process dies, has failed, its communicators close as failed and the
            other ranks go on: ``revoke``,
            ``agree``, ``shrink``; its error, noted with its rank, is its result).
            ``fault_plan``: an ``asynccomm.sim.FaultPlan`` (with ``cluster``), as
            ``open_world``'s; it implies ``faults="tolerate"`` (and refuses "abort").

    Ctrl-C (SIGINT) writes every rank's pending ops and recent ops to stderr before the
    ``KeyboardInterrupt``; SIGUSR1 writes them and goes on.

    Raises:
        RuntimeError: called while an event loop runs on this thread.
        TypeError, ValueError: bad arguments (``main`` that is not an async function
            among them: said before any rank runs).
        Exception: the failure of the one rank that failed (with a note naming the
            rank), or an ``ExceptionGroup`` of every rank's failure.
    """
    if _running() is not None:  # before any coroutine is made: none is left unawaited
        raise RuntimeError("ac.run() starts an event loop of its own and cannot be called "
                           "where one is running (Jupyter, or inside an async function): "
                           "use `await ac.run_async(main, world_size, ...)` there")
    backend = _backend(main, backend, processes)
    if backend == "processes":
        return run_processes(main, world_size, loop=loop or "uvloop",  # type: ignore[arg-type]
                             options=check_processes(world_size, cluster, clock,
                                                     loop or "uvloop", options))
    mode = clock_mode(cluster, clock)
    if loop is None:
        loop = "virtual" if mode == "virtual" else "uvloop"
    factory = _LOOPS.get(loop)
    if factory is None:
        raise ValueError(f"loop must be one of {sorted(_LOOPS)}, got {loop!r}")
    if (loop == "virtual") != (mode == "virtual"):
        raise ValueError(f"loop={loop!r} does not go with clock={clock!r}: the virtual clock "
                         "runs on the virtual-time loop, the wall clock on uvloop or asyncio")
    _no_mpi_faults(backend, options)
    if backend == "mpi":
        from .mpi_runner import run_mpi  # noqa: PLC0415  (mpi4py: only when a world opens)

        return run_mpi(main, world_size, loop_factory=factory, cluster=cluster, clock=clock,
                       **options)
    if world_size is None:
        raise TypeError("run() needs world_size for in-process ranks "
                        "(or an MPI launch: mpiexec -n N python script.py)")
    check_world(world_size, cluster, clock, options.get("eager_limit", 0),
                options.get("pool_bytes", 0))
    world_lane(options.get("native"))  # (a lane that is not here: said before the loop runs)

    results: list[T] = []
    interrupted: list[str] = []

    async def world_main() -> None:
        # The results leave through `results`, not as the task's value: asyncio formats a
        # main task's result on the way out, which costs real time for large arrays.
        results.extend(await _run_world(main, world_size, cluster, clock, options,
                                        interrupted))

    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(world_main())
    except KeyboardInterrupt:
        if interrupted:
            sys.stderr.write(f"asynccomm: interrupted; every rank's pending ops and last "
                             f"ops:\n{interrupted[0]}\n")
            sys.stderr.flush()
        raise
    return results


async def run_async(main: Callable[[Communicator], Coroutine[Any, Any, T]],
                    world_size: int | None = None, *, cluster: Cluster | None = None,
                    clock: str = "auto", backend: str | None = None,
                    **options: Any) -> Any:
    """``run`` on the running event loop: ``await ac.run_async(main, 4)`` in Jupyter or
    an ``async def``.  The arguments, results, failures (rank notes, ``ExceptionGroup``)
    and deadlock proof are ``run``'s; the proof needs every task of the loop to be
    waiting on the world, so on a loop that runs other tasks (Jupyter's) a hang is
    reported by the watchdog (``ASYNCCOMM_HANG_TIMEOUT``) instead.

    The virtual clock (the default with a cluster) needs asynccomm's virtual-time loop:
    on another loop pass ``clock="wall"``, or call ``run`` from synchronous code.  Under
    an MPI launcher (or with ``backend="mpi"``) this process runs its own rank on the
    running loop, as ``run`` does on its own, and returns that rank's value; Ctrl-C is
    then the loop owner's (no dump, no second-Ctrl-C abort).

    Raises:
        TypeError, ValueError: bad arguments, said before any rank runs (``loop=``, which
            the running loop decides, and ``clock="virtual"`` on another loop among them).
        Exception: the failure of the one rank that failed (with a note naming the
            rank), or an ``ExceptionGroup`` of every rank's failure.
    """
    backend = _backend(main, backend)
    if backend == "processes":
        raise ValueError("backend='processes' starts its processes from ac.run(), not from "
                         "a running event loop")
    if "loop" in options:
        raise TypeError("run_async() runs on the running event loop: loop= is for ac.run()")
    mode = clock_mode(cluster, clock)
    if mode == "virtual" and not isinstance(asyncio.get_running_loop(), VirtualTimeLoop):
        raise ValueError("the virtual clock (clock='virtual', the default with a cluster) "
                         "runs on a loop of its own: pass clock='wall' here, or call "
                         "ac.run(main, n, ...) from synchronous code, or use open_world on "
                         "asynccomm.sim.new_virtual_loop()")
    _no_mpi_faults(backend, options)
    if backend == "mpi":
        from .mpi_runner import run_mpi_async  # noqa: PLC0415  (as run's)

        return await run_mpi_async(main, world_size, cluster=cluster, clock=clock, **options)
    if world_size is not None:
        check_world(world_size, cluster, clock, options.get("eager_limit", 0),
                    options.get("pool_bytes", 0))
    return await _run_world(main, world_size, cluster, clock, options, None)
