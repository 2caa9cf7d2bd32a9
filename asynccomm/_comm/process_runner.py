"""Ranks in separate processes of this machine, with no MPI: ``asynccomm.run(main, n,
backend="processes")``.

The parent starts ``n`` processes (multiprocessing's ``spawn``: ``main`` travels by
pickle, so it must be importable, a module-level function); each joins the group
(``transports.shm.Node``: a datagram socket, its peers' ``pidfd``s), runs ``main`` for its
rank on an event loop of its own over the shared-memory link, and sends back what it
returned or raised.  The parent returns the values in rank order, or raises a rank's
failure with a note naming the rank, as in-process.

Nothing is left behind: the segments are ``memfd``s (no name in ``/dev/shm``), every child
dies with its parent (``PR_SET_PDEATHSIG``), a child that dies is seen by its peers at
once (its ``pidfd``), and the parent kills whatever still runs when it returns.  Ctrl-C
in the parent interrupts every rank (the children are in a process group of their own, so
the parent alone forwards it).

Traced (``trace=``, ``ASYNCCOMM_TRACE``), each rank writes its own file, ``<name>.rank<N>.json``
(``_engine.tracing``, as under MPI), and the parent merges them into ``<name>`` once every
rank has ended, whether or not one failed, and removes them (``tracing.merge_ranks``).
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import multiprocessing
import os
import pickle
import secrets
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Coroutine, Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, TypeVar

import uvloop

from .._engine import tracing as _trace
from .._engine.engine import DeviceEngine
from .._engine.lane import Lane
from .._engine.options import POOL_BYTES, check_timeout, check_world, default_timeout, not_async
from .._engine.steps import offer_bytes
from .._exceptions import CommBrokenError, DeadlockError
from .._types import EAGER_LIMIT
from ..sim.clock import ModelClock
from ..sim.device import Device
from ..transports.shm import Node, ShmTransport, missing
from . import hang as _hang
from .agreement import attach
from .communicator import Communicator, world_lane
from .view import CommView

__all__ = ["GRACE", "RemoteTraceback", "check_processes", "launch", "run_processes",
           "run_rank"]

T = TypeVar("T")

#: Seconds the other ranks have to end once one has failed, before they are killed (a rank
#: stuck on something that does not involve the failed one would otherwise hang the run).
GRACE = 10.0
#: Seconds a started process has to join its group (import asynccomm, bind its socket).
START_LIMIT = 60.0
_LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}
_PR_SET_PDEATHSIG = 1


def _died(rank: int, exitcode: int | None) -> RuntimeError:
    """What the parent says of a rank that ended without a word."""
    how = (f"killed by signal {-exitcode}" if exitcode is not None and exitcode < 0
           else f"exit status {exitcode}")
    return RuntimeError(f"rank {rank}'s process ended without a result ({how})")


class RemoteTraceback(Exception):
    """Where a rank's exception was raised, in its process (the exception's cause, as
    ``concurrent.futures``' process pool gives it)."""

    def __str__(self) -> str:
        return f"\n\n{self.args[0]}"


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to kill this process when its parent ends (and end now if it has)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


#: A block whose release makes glibc's allocator serve blocks up to its size from the
#: heap from then on (it raises its mmap threshold to a freed mapped block's size, for
#: blocks up to 32 MiB on 64 bits, its bookkeeping included: 16 MiB is under it).
SETTLE_BYTES = 16 << 20


def settle_allocator() -> None:
    """Put this process's allocator in the state of a program that has run a while: a
    block of ``SETTLE_BYTES`` made and released.

    A new process's glibc maps each block past 128 KiB afresh and unmaps it when freed,
    and gives the top of its heap back past twice that; releasing a mapped block raises
    both to its size.  A program that has freed a large array is in that state; a rank
    handed its arrays (unpickled, as a rank's arguments are) that never frees a large one
    is not, and a loop whose temporaries pass those limits faults their pages in afresh at
    every pass: the parameter server's 5 processes made over 400 page faults a step, and
    spent about an eighth of their CPU on them.  Settled, arrays up to ``SETTLE_BYTES``
    come from memory the process holds.  ``bytes`` asks ``calloc``, which maps the block
    untouched: two system calls, no page touched.  Elsewhere than glibc it costs as little
    and does nothing."""
    bytes(SETTLE_BYTES)


def _child(group: str, rank: int, size: int, parent: int, conn: Connection,
           target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """A rank's process: join the group, run ``target(*args)``, send back the outcome."""
    _die_with_parent(parent)
    settle_allocator()
    os.setpgrp()  # Ctrl-C reaches the parent alone, which forwards it
    node = Node.join(group, rank, size)
    conn.send(("ready", None))
    node.watch(conn.recv())
    try:
        outcome: tuple[Any, ...] = ("ok", target(*args))
    except BaseException as exc:  # every failure goes back to the parent, with its trace
        outcome = ("err", exc, "".join(traceback.format_exception(exc)).rstrip())
    try:
        conn.send(outcome)
    except Exception as exc:  # an outcome that does not pickle
        what = ("value" if outcome[0] == "ok" else
                f"{type(outcome[1]).__name__}: {outcome[1]}")
        conn.send(("err", RuntimeError(f"rank {rank}'s {what} could not be sent back to "
                                       f"the parent: {exc!r}")))
    conn.close()


def _check_platform() -> None:
    why = missing()
    if why is not None:
        raise RuntimeError(f"backend='processes' is not available here: {why}")


def launch(target: Callable[..., Any], size: int, args: tuple[Any, ...] = (), *,
           grace: float | None = GRACE) -> list[tuple[str, Any]]:
    """Run ``target(*args)`` in ``size`` new processes that form a group (each a
    ``Node``); return each rank's ``("ok", value)`` or ``("err", exception)``, in rank
    order.  Once a rank has failed the others have ``grace`` seconds to end (None: as
    long as they take, they go on without it); Ctrl-C is forwarded to them all.  No
    process outlives this call.

    Raises:
        RuntimeError: not Linux, or a process could not start.
        TypeError: ``target`` or ``args`` cannot be sent to a new process (pickle).
    """
    _check_platform()
    for f in (target, *args):
        if (callable(f) and getattr(f, "__module__", None) == "__main__"
                and not getattr(sys.modules["__main__"], "__file__", None)):
            raise TypeError(f"{getattr(f, '__qualname__', f)!r} must be importable to run in "
                            "other processes: it was defined in a program with no file "
                            "(python -c, a notebook, the REPL); define it in a module or a "
                            "script file")
    try:
        pickle.dumps((target, args))
    except Exception as exc:
        raise TypeError(f"{getattr(target, '__qualname__', target)!r} and its arguments must "
                        "be picklable to run in other processes (a function defined at the "
                        f"top level of an importable module): {exc}") from exc
    ctx = multiprocessing.get_context("spawn")
    group = secrets.token_hex(8)
    conns: list[Connection] = []
    procs: list[Any] = []
    try:
        for rank in range(size):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_child, name=f"asynccomm-rank-{rank}",
                               args=(group, rank, size, os.getpid(), theirs, target, args))
            proc.start()
            theirs.close()
            conns.append(mine)
            procs.append(proc)
        _start(conns, procs)
        return _collect(conns, procs, grace)
    except KeyboardInterrupt:
        _interrupt(procs)
        raise
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
            proc.close()
        for conn in conns:
            conn.close()


def _start(conns: list[Connection], procs: list[Any]) -> None:
    """Wait until every process has joined, then tell each one the others' pids."""
    deadline = time.monotonic() + START_LIMIT
    for rank, (conn, proc) in enumerate(zip(conns, procs, strict=True)):
        while not conn.poll(0):
            if not wait([conn, proc.sentinel], max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"rank {rank}'s process did not start in {START_LIMIT:g} s")
            if not conn.poll(0) and not proc.is_alive():
                raise RuntimeError(f"rank {rank}'s process failed to start "
                                   f"(exit status {proc.exitcode})")
        conn.recv()
    pids = [p.pid for p in procs]
    for conn in conns:
        conn.send(pids)


def _collect(conns: list[Connection], procs: list[Any],
             grace: float | None) -> list[tuple[str, Any]]:
    outcomes: list[tuple[str, Any] | None] = [None] * len(conns)
    left = set(range(len(conns)))
    deadline: float | None = None
    while left:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = wait([x for r in left for x in (conns[r], procs[r].sentinel)], timeout)
        if not ready:  # a rank failed and the others did not end in time
            for r in left:
                procs[r].kill()
                outcomes[r] = ("err", RuntimeError(
                    f"rank {r} did not end within {grace:g} s of another rank's failure"))
            break
        for r in list(left):
            if conns[r] in ready or procs[r].sentinel in ready:
                outcome = _outcome(r, conns[r], procs[r])
                if outcome is None:
                    continue
                outcomes[r] = outcome
                left.discard(r)
                if outcome[0] == "err" and deadline is None and grace is not None:
                    deadline = time.monotonic() + grace
    return [o if o is not None else ("err", _died(r, None)) for r, o in enumerate(outcomes)]


def _outcome(rank: int, conn: Connection, proc: Any) -> tuple[str, Any] | None:
    if conn.poll(0):
        try:
            outcome = conn.recv()
            if len(outcome) == 3:  # a failure, and where it was raised
                outcome[1].__cause__ = RemoteTraceback(outcome[2])
            return outcome[0], outcome[1]
        except EOFError:
            pass
        except Exception as exc:  # an exception that does not unpickle
            return ("err", RuntimeError(f"rank {rank}'s outcome could not be read: {exc!r}"))
    if proc.is_alive():
        proc.join(0.1)  # its pipe closed: it is ending
        if proc.is_alive():
            return None
    return ("err", _died(rank, proc.exitcode))


def _interrupt(procs: Sequence[Any]) -> None:
    """Ctrl-C: interrupt every rank, and give them a moment to say so to each other."""
    for proc in procs:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + 5.0
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))


def check_processes(world_size: object, cluster: object, clock: str, loop: str,
                    options: dict[str, Any]) -> dict[str, Any]:
    """Check ``run``'s arguments for the processes backend; return the world options.

    Raises:
        TypeError, ValueError: bad arguments.
        RuntimeError: this platform cannot run it.
    """
    if cluster is not None:
        raise ValueError("cluster models run in-process only: pass backend='local'")
    if clock not in ("auto", "wall"):
        raise ValueError(f"clock must be 'auto' or 'wall' with processes, got {clock!r}")
    if loop not in _LOOPS:
        raise ValueError(f"loop must be 'uvloop' or 'asyncio' with processes, got {loop!r}")
    if type(world_size) is not int or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1 with processes, got {world_size!r}")
    unknown = set(options) - {"eager_limit", "faults", "native", "pool_bytes", "timeout",
                              "trace"}
    if unknown:
        raise TypeError(f"unexpected options for the processes backend: {sorted(unknown)}")
    opts: dict[str, Any] = {"eager_limit": EAGER_LIMIT, "pool_bytes": POOL_BYTES,
                            "timeout": None, "native": None, "faults": "abort", **options}
    trace = _trace.trace_path(opts.get("trace"))  # the file the parent merges the ranks' into
    opts["trace"] = None if trace is None else trace.absolute()
    check_world(world_size, None, "auto", opts["eager_limit"], opts["pool_bytes"])
    world_lane(opts["native"])  # refused here, before any process starts
    if opts["timeout"] is not None:
        check_timeout(opts["timeout"])
    _check_platform()
    return opts


def run_processes(main: Callable[[Communicator], Coroutine[Any, Any, T]], world_size: int,
                  *, loop: str, options: dict[str, Any]) -> list[T]:
    """Run ``main(comm)`` on ``world_size`` ranks, each in a process of its own (see the
    module docs); the values in rank order.  With ``faults="tolerate"`` in ``options`` a
    rank that failed (raised, or its process died) has its error, noted with its rank, as
    its value, and the others go on.

    Raises:
        Exception: the failure of the one rank that failed (with a note naming the rank),
            or an ``ExceptionGroup`` of every rank's failure.
    """
    options = dict(options)
    tolerate = options.pop("faults", "abort") == "tolerate"
    trace: Path | None = options.get("trace")
    if trace is not None:  # (a file of an earlier run is not this run's)
        for r in range(world_size):
            _trace.rank_path(trace, r).unlink(missing_ok=True)
    try:
        outcomes = launch(run_rank, world_size, (main, loop, options, tolerate),
                          grace=None if tolerate else GRACE)
    finally:  # every rank has ended (or was killed): the trace of a failed run too
        if trace is not None:
            _merge_trace(trace, world_size)
    failures: list[tuple[int, BaseException]] = [
        (r, exc) for r, (kind, exc) in enumerate(outcomes) if kind == "err"]
    if not failures:
        return [value for _, value in outcomes]
    for _, exc in failures:
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: as they are
            raise exc
    if tolerate:  # (a rank that raised returned its error: these processes died)
        for rank, exc in failures:
            exc.add_note(f"(raised on rank {rank})")
        return [value for _, value in outcomes]
    # A rank that lost a peer that had failed reports that peer's error, not its own.
    first = [(r, e) for r, e in failures if not isinstance(e, CommBrokenError)] or failures
    for rank, exc in first:
        exc.add_note(f"(raised on rank {rank})")
    if len(first) == 1:
        raise first[0][1]
    raise ExceptionGroup(f"{len(first)} ranks failed", [e for _, e in first])  # type: ignore[type-var]


def _merge_trace(trace: Path, size: int) -> None:
    """Merge the ranks' trace files into ``trace``; where that fails, warn, keeping them
    (the run's own outcome goes on)."""
    try:
        _trace.merge_ranks(trace, size)
    except (OSError, ValueError) as exc:
        warnings.warn(f"the ranks' trace files could not be merged into {trace} (kept as "
                      f"{_trace.rank_path(trace, 0).name} ...): {exc}", RuntimeWarning,
                      stacklevel=3)


# -- in each rank's process ------------------------------------------------------------------


def run_rank(main: Callable[[Communicator], Coroutine[Any, Any, T]], loop: str,
             options: dict[str, Any], tolerate: bool = False) -> T:
    """This process's rank of a new world of its group: ``main(comm)`` on a loop of its
    own; its value (or what it raised; with ``tolerate``, an ``Exception`` it raised is
    its value, noted with its rank)."""
    with asyncio.Runner(loop_factory=_LOOPS[loop]) as runner:
        return runner.run(_rank(main, options, tolerate))


async def _rank(main: Callable[[Communicator], Coroutine[Any, Any, T]],
                options: dict[str, Any], tolerate: bool = False) -> T:
    world = await _ProcessWorld.open(**options)
    comm = world.comm
    try:
        try:
            coro = main(comm)
            if not inspect.isawaitable(coro):
                raise not_async(main, coro)
            result = await coro
        except BaseException as caught:
            # Cancelled by the loop's Ctrl-C handler: the peers hear it was interrupted.
            exc = KeyboardInterrupt() if isinstance(caught, asyncio.CancelledError) else caught
            try:
                async with asyncio.timeout(GRACE):
                    await world.aclose(exc)
            except TimeoutError:
                pass  # the process ends: its peers see it die
            if tolerate and isinstance(caught, Exception) and not isinstance(
                    caught, DeadlockError):
                caught.add_note(f"(raised on rank {comm.rank})")
                return caught  # type: ignore[return-value]
            raise
        await world.aclose()
        return result
    finally:  # closed (or given up on): what this rank did, for the parent to merge
        if world.sink is not None:
            world.sink.write()


class _ProcessWorld:
    """This process's rank of a world of its group: its link and Communicator."""

    def __init__(self, transport: ShmTransport, comm: Communicator,
                 engines: list[DeviceEngine], sink: _trace.TraceSink | None = None) -> None:
        self.transport = transport
        self.comm = comm
        self.sink = sink  # this rank's trace file, written once it has closed
        self.watch = _hang.Watch(engines, comm._engine.loop, timeout=_hang.hang_timeout(),
                                 driver=None)
        self.watch.start()

    @classmethod
    async def open(cls, *, eager_limit: int = EAGER_LIMIT, pool_bytes: int = POOL_BYTES,
                   timeout: float | None = None, native: bool | None = None,
                   trace: Path | None = None) -> _ProcessWorld:
        node = Node.current()
        if node is None:
            raise RuntimeError("this process does not belong to a group of processes: "
                               "start them with ac.run(main, n, backend='processes')")
        check_world(1, None, "auto", eager_limit, pool_bytes)
        op_timeout = default_timeout() if timeout is None else check_timeout(timeout)
        registry: list[DeviceEngine] = []
        family = _ProcessFamily(node, node.next_world(), list(range(node.size)),
                                [pool_bytes] * node.size, eager_limit=eager_limit,
                                pool_bytes=pool_bytes, timeout=op_timeout, registry=registry,
                                lane=world_lane(native))
        transport, comm = await family.open(Device(node.rank, f"proc:{node.rank}"))
        sink = family.traced(trace, comm)
        comm._engine.log.info("comm.opened", transport="shm")
        return cls(transport, comm, registry, sink)

    async def aclose(self, failure: BaseException | None = None) -> None:
        """Close this rank (saying why, if it failed) and wait until every rank of the
        world has closed."""
        if failure is not None:
            self.comm._mark_failed(failure)
        self.watch.stop()
        await self.comm.aclose()
        await self.transport.wait_closed()


def _never_joins(node: Node, name: str, members: list[int], culprit: int | None) -> None:
    """This process will never attach to the worlds of the communicator ``name`` (its own
    and its private context's): ``members`` (group ranks) are told, and none waits for it.
    Their ops with it fail with ``CommBrokenError``; if it makes the worlds, opening them
    fails, naming ``culprit`` (a member that died before they opened), or it."""
    for world in (name, name + "p"):
        node.forfeit(world, members, culprit)


class _ProcessFamily:
    """Makes the communicators of a world of processes: each (and its private context,
    and each ``dup`` and ``split``) has a segment of its own, made by its first member."""

    def __init__(self, node: Node, name: str, members: list[int], pools: list[int], *,
                 eager_limit: int, pool_bytes: int, timeout: float | None,
                 registry: list[DeviceEngine], lane: Lane,
                 world: list[int] | None = None, label: str = "") -> None:
        self.node = node
        self.lane = lane  # the world's fast lane (its sub-communicators' too)
        self.name = name
        self.members = members  # the group rank of each rank here
        self.pools = pools
        self.eager_limit = eager_limit
        self.pool_bytes = pool_bytes
        self.timeout = timeout
        self.registry = registry  # every engine of this rank
        self.world = world  # the world rank of each rank here (None: the world itself)
        self.label = label  # where in the world's communicators (traces): "" the world
        self.sink: _trace.TraceSink | None = None

    async def open(self, device: Device) -> tuple[ShmTransport, Communicator]:
        """This rank's communicator and its private context, their links polled."""
        opts: dict[str, Any] = {"eager_limit": self.eager_limit, "pools": self.pools}
        try:
            transport = await self.node.open_world(self.name, self.members, **opts)
            private_transport = await self.node.open_world(self.name + "p", self.members,
                                                           **opts)
        except BaseException as exc:  # this rank will not join: nobody waits for it
            _never_joins(self.node, self.name, self.members,
                         exc.peer if isinstance(exc, CommBrokenError) else None)
            raise
        comm = self._make(transport, device)
        private = self._make(private_transport, device)
        private._engine.context = "(inside a collective)"
        private._engine.private = True
        private._after_close = private_transport.wait_closed
        comm._adopt_private(private)
        attach(comm, transport)  # revoke, agree, shrink: before any message of theirs
        return transport, comm

    def _make(self, transport: ShmTransport, device: Device) -> Communicator:
        loop = asyncio.get_running_loop()
        engine = DeviceEngine(transport.rank, transport.size, transport, loop=loop,
                              eager_limit=self.eager_limit, pool_bytes=self.pool_bytes,
                              clock=ModelClock(loop), device=device, lane=self.lane)
        transport.offer_bytes = offer_bytes  # the fast lane's, for what lands
        if self.lane.module is not None:  # the per-message steps in C
            transport.accelerate(self.lane.module)
        engine.fast = not engine.trace and self.sink is None  # (traced: ``trace`` says)
        engine.world_ranks = self.world
        if self.world is not None:
            engine.world_rank = self.world[engine.rank]
        self.registry.append(engine)
        registry, world = self.registry, self.world
        transport.dump_request = lambda: _hang.dump(registry)
        transport.on_dump = lambda peer, text: _hang.peer_report(
            registry, engine.world_rank, peer if world is None else world[peer], text)
        comm = Communicator(engine, default_timeout=self.timeout, device=device, family=self)
        transport.start(engine, loop)
        return comm

    def forfeit(self, parent: CommView, key: tuple[Any, ...]) -> None:
        """``parent``'s rank will never join the group ``key`` (it could not hear whether
        the group is made): the members of ``parent`` are told (the group's members are
        not known here), and those that came, or come, do not wait for it."""
        _never_joins(self.node, self._child_name(key), self.members, None)

    def open_private(self, comm: CommView) -> None:
        raise AssertionError("a communicator of processes is made with its private context")

    def _child_name(self, key: tuple[Any, ...]) -> str:
        """The name of the world of the group ``key`` (alike on every member)."""
        return f"{self.name}/{'.'.join(map(str, key))}"

    def traced(self, path: Path | None, comm: Communicator) -> _trace.TraceSink | None:
        """Trace this rank of a world (``comm``, made here) into its own file,
        ``rank_path(path, rank)``, with every communicator made from it; the sink (None:
        ``path`` None, no trace)."""
        if path is None:
            return None
        sink = _trace.attach(_trace.rank_path(path, comm.rank), [comm._engine], model=False,
                             partial=True)
        self.trace(sink, comm)
        return sink

    def trace(self, sink: _trace.TraceSink | None, comm: Communicator) -> None:
        """Trace this rank's ops on ``comm`` and its private context into ``sink``, each
        under its label (the world's own communicator is traced by the world)."""
        self.sink = sink
        if sink is not None:
            _trace.trace_remote(sink, self.label, comm._engine, comm._private()._engine)

    async def child(self, parent: CommView, members: list[int] | None, color: int,
                    key: tuple[Any, ...]) -> Communicator | None:
        if members is None:
            return None
        sub = _ProcessFamily(
            self.node, self._child_name(key),
            [self.members[m] for m in members], [self.pools[m] for m in members],
            eager_limit=self.eager_limit, pool_bytes=self.pool_bytes, timeout=self.timeout,
            registry=self.registry, lane=self.lane,
            world=[m if self.world is None else self.world[m] for m in members],
            label=_trace.join(self.label, _trace.context_label(key)))
        sub.sink = self.sink
        transport, comm = await sub.open(parent.device)
        sub.trace(self.sink, comm)
        comm._default_timeout = comm._private()._default_timeout = parent._default_timeout
        where = f"(on a sub-communicator, as its rank {comm.rank} of {comm.size})"
        comm._engine.context = where
        comm._private()._engine.context += where
        comm._after_close = transport.wait_closed
        return comm

