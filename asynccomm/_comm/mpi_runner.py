"""Ranks in separate processes on MPI: ``mpiexec -n N python script.py``.

``asynccomm.run(main)`` comes here when an MPI launcher started the process (or with
``backend="mpi"``): this process runs ``main`` for its own rank and gets its own rank's
value.  ``open_mpi_world()`` is the same inside a running loop.  The semantics are those of
the in-process world; only the transport underneath (``MPITransport``) differs.

Each world runs on its own duplicate of ``COMM_WORLD`` (``Idup``), freed when the world
closes, so worlds never see each other's traffic.  Closing waits until every rank of the
world has closed (a barrier-free exchange, see ``_core/wire.py``), like ``MPI_Comm_free``.
MPI itself is initialised when the first world opens, not when this module is imported.

The ranks of one host talk over the shared-memory link (``transports.shm``) where this
platform has it, MPI only setting it up: at the first such world the ranks of each host
(``COMM_TYPE_SHARED``) form a group of processes (``Node``), and every communicator of the
world then opens on it (``_comm.process_runner``'s family).  ``ASYNCCOMM_TRANSPORT=mpi``
puts every world on MPI; ``=shm`` asks for shared memory (an error where it is missing).
A traced world keeps its link (each process writes its own rank's file).  A world whose
ranks are on several hosts has a hybrid link (``transports.hybrid``): shared memory within
each host, MPI across hosts.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import secrets
import signal
import socket
import sys
import threading
import time
import traceback
from array import array
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from .._engine import tracing as _trace
from .._engine.engine import DeviceEngine
from .._engine.lane import Lane
from .._engine.options import POOL_BYTES, check_timeout, check_world, default_timeout, not_async
from .._engine.steps import offer_bytes
from .._types import EAGER_LIMIT
from ..sim.clock import ModelClock
from ..sim.device import Device
from ..transports import _mpi_lib
from ..transports._doorbell import Bell, Doorbell
from ..transports._mpi_lib import comm_world, mpi_errors, wait_request
from ..transports.hybrid import HybridTransport, open_hybrid
from ..transports.mpi import MPITransport
from ..transports.shm import Node, missing
from . import hang as _hang
from .communicator import Communicator, world_lane
from .process_runner import _ProcessFamily
from .view import CommView

__all__ = ["ABORT_GRACE", "open_mpi_world", "run_mpi", "run_mpi_async"]

T = TypeVar("T")

#: How long a failed rank waits for the other ranks to close before aborting the MPI job.
ABORT_GRACE = 10.0


#: What carries the ranks of one host to each other: "shm" (the default where the platform
#: has it) or "mpi" (everything on MPI).
TRANSPORT_VARIABLE = "ASYNCCOMM_TRANSPORT"
#: A test hook: host names, comma-separated, one per rank of ``COMM_WORLD``, that group the
#: ranks into hosts in place of the machines they run on (several "hosts" on one machine).
HOSTS_VARIABLE = "ASYNCCOMM_TEST_HOSTS"


def transport_choice() -> str | None:
    """``ASYNCCOMM_TRANSPORT``: ``"mpi"``, ``"shm"``, or None (unset or empty).

    Raises:
        ValueError: any other value.
    """
    value = os.environ.get(TRANSPORT_VARIABLE, "")
    if value and value not in ("mpi", "shm"):
        raise ValueError(f"{TRANSPORT_VARIABLE} must be 'mpi' or 'shm' (or unset), "
                         f"got {value!r}")
    return value or None


def _shared_memory() -> bool:
    """Whether the ranks of one host talk over shared memory (see module docs).

    Raises:
        ValueError: a bad ``ASYNCCOMM_TRANSPORT``.
        RuntimeError: ``=shm`` where this platform lacks the shared-memory link.
    """
    choice = transport_choice()
    if choice == "mpi":
        return False
    why = missing()
    if why is not None:
        if choice == "shm":
            raise RuntimeError(f"{TRANSPORT_VARIABLE}=shm, but the shared-memory link is not "
                               f"available here: {why}")
        return False
    return True


def _fake_hosts(size: int) -> list[str] | None:
    """``ASYNCCOMM_TEST_HOSTS``: each rank's host name (None: unset).

    Raises:
        ValueError: not one name per rank.
    """
    value = os.environ.get(HOSTS_VARIABLE, "")
    if not value:
        return None
    names = value.split(",")
    if len(names) != size or not all(names):
        raise ValueError(f"{HOSTS_VARIABLE} must name one host per rank ({size}), comma-"
                         f"separated, got {value!r}")
    return names


class _Hosts:
    """The ranks of ``COMM_WORLD`` by host, and this process's group of processes
    (``Node``) with the others of its host: made at the first world that uses shared memory
    (collective over ``COMM_WORLD``), kept for the life of the process."""

    _current: ClassVar[_Hosts | None] = None

    def __init__(self, node: Node, where: list[tuple[int, int]]) -> None:
        self.node = node
        #: Each world rank's host (its first world rank) and rank in that host's group.
        self.where = where

    @property
    def single(self) -> bool:
        """Every rank is on this host."""
        return all(host == self.where[0][0] for host, _ in self.where)

    @classmethod
    def get(cls) -> _Hosts:
        """The hosts (made now if this is the first call: collective over COMM_WORLD).

        Raises:
            ValueError: a bad ``ASYNCCOMM_TEST_HOSTS``.
            TransportError: MPI failed.
        """
        if cls._current is None:
            world = comm_world()
            rank = world.Get_rank()
            names = _fake_hosts(world.Get_size())
            with mpi_errors("grouping the ranks by host"):
                machine = world.Split_type(_mpi_lib.MPI.COMM_TYPE_SHARED, key=rank)
                if names is None:
                    local = machine
                else:  # (fake hosts: the machine's processes share its cores all the same)
                    sharing = machine.Get_size()
                    machine.Free()
                    local = world.Split(sorted(set(names)).index(names[rank]), rank)
                try:
                    host, token = local.bcast((rank, secrets.token_hex(8))
                                              if local.Get_rank() == 0 else None)
                    node = Node.join(f"mpi-{token}", local.Get_rank(), local.Get_size())
                    if names is not None:
                        node.share_cores_with(sharing)
                    local.Barrier()  # every socket of the host is bound
                    node.watch(local.allgather(os.getpid()))
                finally:
                    local.Free()
                cls._current = cls(node, world.allgather((host, node.rank)))
        return cls._current


def _host_id() -> int:
    """This host, as a number every process on it agrees on."""
    digest = hashlib.blake2b(socket.gethostname().encode(), digest_size=7).digest()
    return int.from_bytes(digest, "little")


def _usable_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class _MPIWorld:
    """This process's rank of a world: its transport and Communicator."""

    def __init__(self, transport: MPITransport, comm: Communicator,
                 sink: _trace.TraceSink | None, engines: list[DeviceEngine]) -> None:
        self.transport = transport
        self.comm = comm
        self.sink = sink  # this rank's trace file, written once every rank has closed
        # every engine of this rank: its sub-communicators' and private contexts' too
        self.watch = _hang.Watch(engines, comm._engine.loop,
                                 timeout=_hang.hang_timeout(), driver=None)
        self.watch.start()

    @classmethod
    async def open(cls, *, eager_limit: int, pool_bytes: int, timeout: float | None,
                   trace: str | os.PathLike[str] | None = None,
                   native: bool | None = None) -> _MPIWorld:
        """Open this rank (collective over ``COMM_WORLD``).

        Raises:
            TypeError, ValueError: bad arguments, a bad ``ASYNCCOMM_TIMEOUT``,
                ``ASYNCCOMM_TRANSPORT`` or ``ASYNCCOMM_TEST_HOSTS``.
            RuntimeError: ``ASYNCCOMM_TRANSPORT=shm`` where shared memory is missing.
            TransportError: MPI failed.
        """
        check_world(1, None, "auto", eager_limit, pool_bytes)
        lane = world_lane(native)
        op_timeout = default_timeout() if timeout is None else check_timeout(timeout)
        trace_file = _trace.trace_path(trace)
        _hang.hang_timeout()  # a bad ASYNCCOMM_HANG_TIMEOUT fails before MPI is touched
        _hang.hang_warning()
        shm = _shared_memory()
        with mpi_errors("duplicating COMM_WORLD"):
            mpi_comm, req = comm_world().Idup()
            await wait_request(req)
            # Every rank's staging cap (each grants every rank a share of it as credit),
            # host (ranks that outnumber their host's cores must not spin) and doorbell.
            bell = Doorbell.get()
            mine = array("q", [pool_bytes, _host_id(), 0 if bell is None else bell.pid,
                               0 if bell is None else bell.token])
            every = array("q", [0]) * (4 * mpi_comm.Get_size())
            await wait_request(mpi_comm.Iallgather(mine, every))
            bells, opened = _bells(bell, mpi_comm.Get_rank(), every)
            # Every rank has opened the bells it can (its own may go from /dev/shm now);
            # where one could not, nobody relies on being rung.
            agreed = array("i", [0])
            await wait_request(mpi_comm.Iallreduce(array("i", [opened]), agreed,
                                                   _mpi_lib.MPI.MIN))
        if bell is not None:
            bell.published()
        if not agreed[0]:
            bells = [None] * len(bells)
        pools = list(every[0::4])
        registry: list[DeviceEngine] = []
        hosts = _Hosts.get() if shm else None
        if hosts is not None and hosts.single:  # MPI has done its part
            return await cls._open_shm(hosts, mpi_comm, pools, lane, registry,
                                       eager_limit=eager_limit, pool_bytes=pool_bytes,
                                       timeout=op_timeout, trace_file=trace_file)
        neighbours = sum(1 for host in every[1::4] if host == mine[1])
        family = _MPIFamily(mpi_comm, pools, crowded=neighbours > _usable_cores(),
                            eager_limit=eager_limit, pool_bytes=pool_bytes, timeout=op_timeout,
                            registry=registry, bells=bells, lane=lane, hosts=hosts,
                            name="" if hosts is None else hosts.node.next_world())
        rank = mpi_comm.Get_rank()
        transport, comm = await family.open(mpi_comm, pools, Device(rank, f"mpi:{rank}"))
        sink = None if trace_file is None else _trace.attach(
            _trace.rank_path(trace_file, rank), [comm._engine], model=False, partial=True)
        family.trace(sink, comm)
        comm._engine.log.info("comm.opened", transport="mpi" if hosts is None else "hybrid",
                              fast_lane=lane.name)
        return cls(transport, comm, sink, registry)

    @classmethod
    async def _open_shm(cls, hosts: _Hosts, mpi_comm: Any, pools: list[int], lane: Lane,
                        registry: list[DeviceEngine], *, eager_limit: int, pool_bytes: int,
                        timeout: float | None, trace_file: Path | None = None) -> _MPIWorld:
        """This rank of a world on one host, on the shared-memory link (traced: into its
        own file, as on MPI)."""
        rank = mpi_comm.Get_rank()
        mpi_comm.Free()
        node = hosts.node
        family = _ProcessFamily(node, node.next_world(), [r for _, r in hosts.where], pools,
                                eager_limit=eager_limit, pool_bytes=pool_bytes,
                                timeout=timeout, registry=registry, lane=lane)
        transport, comm = await family.open(Device(rank, f"mpi:{rank}"))
        sink = family.traced(trace_file, comm)
        comm._engine.log.info("comm.opened", transport="shm", fast_lane=lane.name)
        return cls(transport, comm, sink, registry)

    async def aclose(self, failure: BaseException | None = None) -> None:
        """Close this rank, telling the others why if it failed, and wait until every rank
        of the world has closed."""
        if failure is not None:  # said on every communicator of this rank
            self.comm._mark_failed(failure)
        self.watch.stop()
        await self.comm.aclose()
        await self.transport.wait_closed()
        if self.sink is not None:
            self.sink.write()


def _bells(bell: Doorbell | None, rank: int,
           every: array[int]) -> tuple[list[Bell | None], bool]:
    """The doorbell of each world rank that shares this host (None for the others, for
    this rank, and for all where this process has none), from every rank's ``(pool, host,
    pid, token)``; and whether each one there was could be opened."""
    host = every[4 * rank + 1]
    out: list[Bell | None] = []
    opened = True
    for r in range(len(every) // 4):
        _, their_host, pid, token = every[4 * r:4 * r + 4]
        found = None
        if bell is not None and r != rank and their_host == host and pid:
            found = bell.bell(pid, token)
            opened = opened and found is not None
        out.append(found)
    return out, opened


class _MPIFamily:
    """Makes the communicators of an MPI world: each one runs on an MPI communicator of its
    own (``Idup`` for ``dup`` and private contexts; ``Split`` for ``split``, run on a
    thread so that this rank's progress goes on while the others arrive).  With ``hosts``
    (ranks on several hosts, shared memory asked for) each one's link is a
    ``HybridTransport``: the rings of its ranks on this host (``name``d in the host's group),
    MPI to the others."""

    def __init__(self, mpi_comm: Any, pools: list[int], *, crowded: bool, eager_limit: int,
                 pool_bytes: int, timeout: float | None, registry: list[DeviceEngine],
                 bells: list[Bell | None], lane: Lane, ranks: list[int] | None = None,
                 label: str = "", hosts: _Hosts | None = None, name: str = "") -> None:
        self.mpi_comm = mpi_comm
        self.hosts = hosts
        self.name = name
        self.bells = bells  # each world rank's doorbell (see _bells)
        self.registry = registry  # every engine of this rank
        self.ranks = ranks  # the world rank of each rank here (None: the world itself)
        self.label = label  # where in the world's communicators (traces): "" the world
        self.sink: _trace.TraceSink | None = None
        self.pools = pools
        self.crowded = crowded
        self.eager_limit = eager_limit
        self.pool_bytes = pool_bytes
        self.timeout = timeout
        self.lane = lane  # the world's fast lane

    async def open(self, mpi_comm: Any, pools: list[int],
                   device: Device) -> tuple[MPITransport, Communicator]:
        """This rank's communicator on ``mpi_comm`` and its private context (on a duplicate
        of it), their progress tasks started."""
        with mpi_errors("duplicating a communicator for its private context"):
            private_comm, req = mpi_comm.Idup()
            await wait_request(req)
        link = await self._hybrid(mpi_comm, pools, self.name)
        private_link = await self._hybrid(private_comm, pools, self.name + "p")
        transport, comm = self._open(mpi_comm, pools, device, link)
        private_transport, private = self._open(private_comm, pools, device, private_link)
        private._engine.context = "(inside a collective)"
        private._engine.private = True
        private._after_close = private_transport.wait_closed
        comm._adopt_private(private)
        return transport, comm

    async def _hybrid(self, mpi_comm: Any, pools: list[int],
                      name: str) -> HybridTransport | None:
        """The hybrid link on ``mpi_comm`` (None without ``hosts``: the MPI link)."""
        hosts = self.hosts
        if hosts is None:
            return None
        where = hosts.where
        world = range(mpi_comm.Get_size()) if self.ranks is None else self.ranks
        mine = where[world[mpi_comm.Get_rank()]][0]
        members = [r for r, w in enumerate(world) if where[w][0] == mine]
        return await open_hybrid(hosts.node, name, mpi_comm, members,
                                 [where[world[r]][1] for r in members],
                                 eager_limit=self.eager_limit, pools=pools)

    def forfeit(self, parent: CommView, key: tuple[Any, ...]) -> None:
        """Nothing to do: on MPI a rank fails only with its job (every rank hears rank 0's
        decision, or the job ends)."""

    def open_private(self, comm: CommView) -> None:
        raise AssertionError("an MPI communicator is made with its private context")

    def trace(self, sink: _trace.TraceSink | None, comm: Communicator) -> None:
        """Trace this rank's ops on ``comm`` and its private context into ``sink``, each
        under its label (the world's own communicator is traced by the world)."""
        self.sink = sink
        comm._family.sink = comm._private()._family.sink = sink  # type: ignore[attr-defined]
        if sink is not None:
            _trace.trace_remote(sink, self.label, comm._engine, comm._private()._engine)

    def _open(self, mpi_comm: Any, pools: list[int], device: Device,
              link: HybridTransport | None = None) -> tuple[MPITransport, Communicator]:
        loop = asyncio.get_running_loop()
        transport = (MPITransport(mpi_comm, eager_limit=self.eager_limit, pools=pools)
                     if link is None else link)
        progress = transport.progress if link is None else link.mpi
        progress.crowded = self.crowded
        progress.woken = self.lane.woken  # (what a task's own wait reads: ``wait_here``)
        world = range(transport.size) if self.ranks is None else self.ranks
        progress.bells = [None if r == transport.rank else self.bells[w]
                          for r, w in enumerate(world)]
        progress.ringable = all(b is not None for r, b in enumerate(progress.bells)
                                if r != transport.rank)
        engine = DeviceEngine(transport.rank, transport.size, transport, loop=loop,
                              eager_limit=self.eager_limit, pool_bytes=self.pool_bytes,
                              clock=ModelClock(loop), device=device, lane=self.lane)
        # The fast lane, unless logging or tracing every message (``trace`` opens the
        # traced one).
        engine.fast = not engine.trace and self.sink is None
        engine.world_ranks = self.ranks
        if self.ranks is not None:
            engine.world_rank = self.ranks[engine.rank]
        if len(self.registry) > 64 and len(self.registry) & 63 == 0:  # forget closed ones
            self.registry[:] = [e for e in self.registry if not e.closed]
        self.registry.append(engine)
        registry, ranks = self.registry, self.ranks
        transport.offer_bytes = offer_bytes  # the fast lane's, for what lands
        if self.lane.module is not None:  # the per-message steps in C (hybrid: MPI's)
            transport.accelerate(self.lane.module)
        transport.dump_request = lambda: _hang.dump(registry)  # asked by a peer's watchdog
        transport.on_dump = lambda peer, text: _hang.peer_report(
            registry, engine.world_rank, peer if ranks is None else ranks[peer], text)
        family = _MPIFamily(mpi_comm, pools, crowded=self.crowded,
                            eager_limit=self.eager_limit, pool_bytes=self.pool_bytes,
                            timeout=self.timeout, registry=self.registry, bells=self.bells,
                            lane=self.lane, ranks=self.ranks, label=self.label,
                            hosts=self.hosts, name=self.name if link is None else link.name)
        family.sink = self.sink
        comm = Communicator(engine, default_timeout=self.timeout, device=device,
                            family=family)
        transport.start(engine, loop)  # last: from here on its progress task runs
        return transport, comm

    async def child(self, parent: CommView, members: list[int] | None, color: int,
                    key: tuple[Any, ...]) -> Communicator | None:
        with mpi_errors(f"making a communicator ({key[0]})", parent.rank):
            if key[0] == "split":
                position = 0 if members is None else members.index(parent.rank)
                split = partial(self.mpi_comm.Split,
                                _mpi_lib.MPI.UNDEFINED if members is None else color, position)
                mpi = _mpi_lib.MPI
                # On a thread, so this rank's progress goes on while the others arrive; MPI
                # without thread support gets the blocking call on the loop.
                new = (await asyncio.to_thread(split)
                       if mpi.Query_thread() >= mpi.THREAD_MULTIPLE else split())
            else:
                new, req = self.mpi_comm.Idup()
                await wait_request(req)
        if members is None:
            return None
        pools = [self.pools[m] for m in members]
        sub = _MPIFamily(new, pools, crowded=self.crowded, eager_limit=self.eager_limit,
                         pool_bytes=self.pool_bytes, timeout=self.timeout,
                         registry=self.registry, bells=self.bells, lane=self.lane,
                         label=_trace.join(
                             self.label, _trace.context_label(key)),
                         ranks=[m if self.ranks is None else self.ranks[m] for m in members],
                         hosts=self.hosts, name=f"{self.name}/{'.'.join(map(str, key))}")
        sub.sink = self.sink
        transport, comm = await sub.open(new, pools, parent.device)
        sub.trace(self.sink, comm)
        comm._default_timeout = comm._private()._default_timeout = parent._default_timeout
        where = f"(on a sub-communicator, as its rank {comm.rank} of {comm.size})"
        comm._engine.context = where
        comm._private()._engine.context += where
        comm._after_close = transport.wait_closed
        return comm


@asynccontextmanager
async def open_mpi_world(*, eager_limit: int = EAGER_LIMIT, pool_bytes: int = POOL_BYTES,
                         timeout: float | None = None,
                         trace: str | os.PathLike[str] | None = None,
                         native: bool | None = None) -> AsyncIterator[Communicator]:
    """Open this process's rank of an MPI world and yield its ``Communicator``.

    Every process of ``COMM_WORLD`` must open its worlds in the same order (it is
    collective).  Leaving the block closes this rank (ranks still waiting for it get
    ``CommBrokenError``, naming the exception if the block raised) and then waits until
    every rank has closed.

    The ranks of one host talk over shared memory, MPI carrying only what goes between
    hosts, unless ``ASYNCCOMM_TRANSPORT=mpi`` (see the module docs), traced or not.

    Args:
        eager_limit, pool_bytes, timeout: as ``asynccomm.open_world``.
        trace: a trace file name (None: ``ASYNCCOMM_TRACE``): this rank writes
            ``<name>.rank<N>.json`` once every rank has closed; ``python -m
            asynccomm.trace merge`` joins the ranks' files.
        native: the fast lane, as ``asynccomm.open_world``'s (on the C lane the MPI
            link's per-message steps are in C too).

    Raises:
        TypeError, ValueError: bad arguments (``native=True`` where the C accelerator is
            not built among them) or a bad ``ASYNCCOMM_TIMEOUT`` or ``ASYNCCOMM_TRANSPORT``.
        RuntimeError: ``ASYNCCOMM_TRANSPORT=shm`` where shared memory is missing.
        TransportError: MPI failed.
    """
    world = await _MPIWorld.open(eager_limit=eager_limit, pool_bytes=pool_bytes,
                                 timeout=timeout, trace=trace, native=native)
    failure: BaseException | None = None
    try:
        yield world.comm
    except BaseException as exc:
        failure = exc
        raise
    finally:
        await world.aclose(failure)


def _report(text: str) -> None:
    """Write a failure report on stderr (the one place the library writes to a stream)."""
    sys.stderr.write(f"asynccomm: {text}\n")
    sys.stderr.flush()


#: Seconds a rank waits, after writing why it aborts, before MPI_Abort: the launcher
#: forwards a rank's output asynchronously and drops what it has not forwarded when the
#: job is killed.
ABORT_FLUSH = 0.3


def _abort(rank: int, why: str, exc: BaseException | None) -> None:
    trace = "".join(traceback.format_exception(exc)).rstrip() if exc is not None else ""
    _report(f"rank {rank}: {why}; aborting the MPI job" + (f" after:\n{trace}" if trace else ""))
    time.sleep(ABORT_FLUSH)
    comm_world().Abort(1)


class _Interrupt:
    """Ctrl-C (SIGINT) on this rank: cancel its main task, and remember why, so that the
    other ranks hear "interrupted" rather than an anonymous cancellation.  A second Ctrl-C
    aborts the job."""

    def __init__(self) -> None:
        self.hit = False
        self.rank = -1
        self.engines: Sequence[DeviceEngine] = []

    def install(self) -> Callable[[], None]:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def on_sigint() -> None:
            if self.hit:
                _abort(self.rank, "interrupted twice (KeyboardInterrupt)", None)
            self.hit = True
            if self.engines:  # this rank's own ops: the others dump theirs
                _report(f"rank {self.rank} interrupted; its pending ops and last ops:\n"
                        f"{_hang.dump(self.engines)}")
            task.cancel("KeyboardInterrupt")

        try:
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        except (NotImplementedError, RuntimeError, ValueError):  # no signals here
            return lambda: None
        def uninstall() -> None:
            loop.remove_signal_handler(signal.SIGINT)

        return uninstall


async def _run_rank(main: Callable[[Communicator], Coroutine[Any, Any, T]], grace: float,
                    options: dict[str, Any]) -> T:
    interrupt = _Interrupt()
    uninstall = interrupt.install()
    try:
        return await _run_rank_body(main, grace, options, interrupt)
    finally:
        uninstall()


async def _run_rank_body(main: Callable[[Communicator], Coroutine[Any, Any, T]],
                         grace: float, options: dict[str, Any], interrupt: _Interrupt) -> T:
    world = await _MPIWorld.open(**options)
    comm = world.comm
    interrupt.rank = comm.rank
    interrupt.engines = world.watch.engines  # every engine of this rank, sub-communicators'
    uninstall = _hang.install_dump_signal(comm._engine.loop, lambda: interrupt.engines)
    try:
        coro = main(comm)
        if not inspect.isawaitable(coro):
            raise not_async(main, coro)
        result = await coro
    except BaseException as caught:
        exc = KeyboardInterrupt() if interrupt.hit else caught
        exc.add_note(f"(raised on rank {comm.rank})")
        what = "was interrupted" if interrupt.hit else "failed"
        detail = f": {exc}" if str(exc) else ""
        _report(f"rank {comm.rank} of {comm.size} {what}: {type(exc).__name__}{detail}")
        try:
            async with asyncio.timeout(grace):
                await world.aclose(exc)
        except TimeoutError:
            _abort(comm.rank, f"the other ranks did not close within {grace:g} s", exc)
        if world.transport.broken is not None:
            _abort(comm.rank, f"MPI failed ({world.transport.broken})", exc)
        if exc is caught:
            raise
        raise exc from None
    finally:
        uninstall()
    broken = world.transport.broken is not None
    try:  # with a broken link the ranks cannot close together: wait the grace at most
        async with asyncio.timeout(grace if broken else None):
            await world.aclose()
    except TimeoutError:
        pass  # (broken: aborted below)
    if world.transport.broken is not None:  # the others may wait for this rank forever
        _abort(comm.rank, f"MPI failed ({world.transport.broken})", None)
    return result


def run_mpi(main: Callable[[Communicator], Coroutine[Any, Any, T]], world_size: int | None,
            *, loop_factory: Callable[[], asyncio.AbstractEventLoop], cluster: object,
            clock: str, abort_grace: float = ABORT_GRACE, **options: Any) -> T:
    """Run ``main(comm)`` for this process's rank on MPI and return its value
    (``asynccomm.run`` calls this under an MPI launcher).

    When ``main`` raises, the rank reports it on stderr, the other ranks get
    ``CommBrokenError`` naming it, and the exception is raised here once every rank has
    closed.  If they have not closed within ``abort_grace`` seconds (a rank stuck on
    something else), or if MPI itself failed (``TransportError``), the MPI job is aborted
    (``MPI_Abort``) rather than left hanging.

    Args:
        main: an async function taking a Communicator.
        world_size: None, or the MPI world size (checked).
        loop_factory: makes the event loop.
        cluster: must be None (cluster models are in-process only).
        clock: ``"auto"`` or ``"wall"``.
        abort_grace: seconds a failed rank waits for the others before aborting the job.
        options: ``eager_limit``, ``pool_bytes``, ``timeout``, ``trace``, ``native`` (as
            ``open_mpi_world``).

    Raises:
        TypeError, ValueError: bad arguments, or ``world_size`` is not the MPI world size.
        TransportError: MPI failed.
        Exception: what ``main`` raised on this rank (with a note naming the rank).
    """
    grace, opts = _mpi_options(world_size, cluster, clock, abort_grace, options)
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(_run_rank(main, grace, opts))


async def run_mpi_async(main: Callable[[Communicator], Coroutine[Any, Any, T]],
                        world_size: int | None, *, cluster: object, clock: str,
                        abort_grace: float = ABORT_GRACE, **options: Any) -> T:
    """``run_mpi`` on the running loop (``asynccomm.run_async`` under an MPI launcher).
    Ctrl-C stays the loop owner's: this rank sees it as a cancellation.

    Raises:
        as ``run_mpi``.
    """
    grace, opts = _mpi_options(world_size, cluster, clock, abort_grace, options)
    return await _run_rank_body(main, grace, opts, _Interrupt())


def _mpi_options(world_size: int | None, cluster: object, clock: str, abort_grace: float,
                 options: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Check ``run_mpi``'s arguments; return the abort grace and ``_MPIWorld.open``'s
    keywords.

    Raises:
        TypeError, ValueError: as ``run_mpi``.
    """
    if cluster is not None:
        raise ValueError("cluster models run in-process only: under an MPI launcher, pass "
                         "backend='local' to run one in each process, or run without mpiexec")
    if clock not in ("auto", "wall"):
        raise ValueError(f"clock must be 'auto' or 'wall' under MPI, got {clock!r}")
    if world_size is not None and (type(world_size) is not int or world_size < 1):
        raise ValueError(f"world_size must be None or an int >= 1, got {world_size!r}")
    unknown = set(options) - {"eager_limit", "pool_bytes", "timeout", "trace", "native"}
    if unknown:
        raise TypeError(f"unexpected options for the MPI backend: {sorted(unknown)}")
    grace = check_timeout(abort_grace)
    with mpi_errors("initialisation"):
        size = comm_world().Get_size()
    if world_size is not None and world_size != size:
        raise ValueError(f"world_size={world_size} but MPI started {size} processes: under "
                         f"mpiexec the world is its processes (pass world_size={size} or None), "
                         "or pass backend='local' for an in-process world in each process")
    opts: dict[str, Any] = {"eager_limit": EAGER_LIMIT, "pool_bytes": POOL_BYTES,
                            "timeout": None, **options}
    return ABORT_GRACE if grace is None else grace, opts
