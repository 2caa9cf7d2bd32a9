"""``python -m asynccomm.calibrate``: calibrate the cluster model from a real transport.

Measures one-way message times on this machine (half a ping-pong round trip between two
ranks, the median of ``--repeats`` runs; in-process ranks on this process's CPU clock,
``clock_of``) for sizes from 8 B to 64 MiB on a real transport:
``local`` (in-process ranks on one event loop, no model) or ``mpi`` (two processes; started
under ``mpiexec`` itself when not already under a launcher).  It fits a piecewise
alpha-beta model with break points found from the data (``asynccomm.sim.calibration``,
as SMPI does) and writes a preset that ``Cluster.load`` reads::

    python -m asynccomm.calibrate --transport local --out local.json
    world = await ac.open_cluster_world(4, ac.Cluster.load("local.json"))

In-process ranks share one CPU, so its preset puts every transfer of the node on one
shared resource (``Cluster(shared_intra=True)``) and its ranks' own work on one core; MPI
ranks (and ``processes`` ranks) are processes of their own, on this machine's cores, and
are timed again between two of one process more than the cores (``Crowded``): where ranks
outnumber cores one process copies each message, and the preset's link times the
messages of such a world by that ping-pong (``LinkSpec.crowded``).

Besides messages it measures, in this process and on its CPU clock, what a collective call
costs on a rank's CPU (``asynccomm.sim.host``, ``measure_host``): the Python of one call
and of one step of its algorithm, and the rates of its copies (into scratch arrays) and
of a float32 sum, from ring allgather and allreduce calls on in-process ranks less their
messages, the first touch of the scratch pages they fault in (few: their rank's pool hands
back the scratch of the call before, ``_collectives.scratch``), the copy rate at working
sets from 1 MiB to 128 MiB (``measure_memory``: a call's messages move among every rank's
arrays, a ping-pong's among one buffer and its copy), what a step of small ring calls on 3
to 6 in-process ranks costs less than that model gives it (``measure_unwaited``: their
ranks share one event loop, and find many messages arrived), and on processes and MPI
what a step costs on two ranks of the transport (small allreduce calls less allgather
calls less a message, ``measure_step``), how much of a large message's copy its sender's
core takes (an exchange of 2 MiB each way less a one-way message, ``measure_shared_copy``)
and what a step costs more on more ranks than cores (barrier calls on one process more
than the cores); the preset's ``host`` holds them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import mmap
import multiprocessing
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextvars import ContextVar
from functools import partial
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np

from . import Communicator, launched_by_mpi, run
from ._comm.process_runner import settle_allocator
from ._types import EAGER_LIMIT
from .sim.calibration import Segment, calibrated_cluster, fit_segments, predict
from .sim.host import HostSpec, collective_seconds, footprint, work_of

__all__ = ["SIZES", "TRANSPORTS", "Record", "calibrate", "clock_of", "cross_cpu", "fit_host",
           "measure_host", "envelope", "in_process_host", "measure_memory", "measure_pingpong",
           "measure_step", "measure_shared_copy", "exchange_calls",
           "measure_rendezvous_switch", "measure_switch", "measure_touch", "measure_unwaited",
           "rendezvous_calls", "settle_allocator",
           "recording", "steep_steps", "step_calls", "pingpong", "preset", "time_calls",
           "placed", "unwaited_of"]

TRANSPORTS = ("local", "mpi", "processes")
#: 8 B to 64 MiB, every power of two.
SIZES = tuple(8 << i for i in range(24))
#: Wall seconds one repeat of one size should take, about (more iterations for small ones).
BUDGET = 0.03
#: The fit's limits (``fit_segments``): enough segments for an eager/rendezvous break and
#: the caches' steps in a memory copy's rate.
MAX_SEGMENTS = 6
MIN_POINTS = 3


class Record:
    """What a calibration measured on the machine (its ping-pongs and the timed calls of
    processes and MPI ranks: barriers, rendezvous, steps), by what was asked, so that the
    same calibration can be solved again on another model without measuring
    (``recording``): ``taken`` is JSON.  With ``replay`` every measurement comes from
    ``taken``, and one not there is an error (``LookupError``)."""

    def __init__(self, taken: dict[str, Any] | None = None, *, replay: bool = False) -> None:
        self.taken: dict[str, Any] = dict(taken or {})
        self.replay = replay

    def measured(self, what: str, measure: Callable[..., Any], *args: Any) -> Any:
        """``measure(*args)``, or what it gave when recorded."""
        key = json.dumps([what, *args], default=list)
        if key not in self.taken:
            if self.replay:
                raise LookupError(f"no {what} {list(args)} recorded")
            got = measure(*args)
            self.taken[key] = ({str(n): t for n, t in got.items()} if isinstance(got, dict)
                               else got)
        kept = self.taken[key]
        return {int(n): t for n, t in kept.items()} if isinstance(kept, dict) else kept


#: The ``Record`` of the calibration under way, if one is kept (``recording``).
_RECORD: ContextVar[Record | None] = ContextVar("asynccomm_calibration_record", default=None)


@contextlib.contextmanager
def recording(record: Record) -> Iterator[Record]:
    """Within it, what ``calibrate`` measures goes into ``record``, or with a replaying
    one comes from it (the in-process part of the host, measured on this process's CPU
    clock whatever the transport, is ``calibrate``'s ``host`` argument, kept apart)."""
    token = _RECORD.set(record)
    try:
        yield record
    finally:
        _RECORD.reset(token)


def _measured(what: str, measure: Callable[..., Any], *args: Any) -> Any:
    record = _RECORD.get()
    return measure(*args) if record is None else record.measured(what, measure, *args)


def clock_of(transport: str) -> Callable[[], float]:
    """The clock that times ``transport``: the CPU seconds of this process for in-process
    ranks (their work is this process's and runs one piece at a time, so on a machine
    that others share it is the wall time they would take with a core to themselves, not
    the time they wait for one), the wall clock for ranks in processes of their own
    (they wait for each other: a wait is part of their time)."""
    return time.process_time if transport == "local" else time.perf_counter


def placed(main: Callable[[Communicator], Awaitable[Any]]
           ) -> Callable[[Communicator], Coroutine[Any, Any, Any]]:
    """``main`` with each rank's process bound, while it runs, to the CPU the model places
    its rank on (``HostSpec.core``: rank r on the ``r % n``-th of the ``n`` CPUs the
    process may use, as ``mpiexec -bind-to core`` places MPI ranks), for ranks in
    processes of their own.  Unbound, the system places and moves them as it likes: four
    processes on two CPUs share them in pairs ranks 0 and 2, 1 and 3 in one world and 0
    and 1, 2 and 3 in the next, and a 4 KiB ring allreduce on them took 490-590 us a call
    or 760-810 from one world to the next (the model places them the first way).  The
    world opens before the bind, so a transport that counts the CPUs its ranks share
    counts them all.  A partial of a module function: it pickles if ``main`` does."""
    return partial(_placed, main)


async def _placed(main: Callable[[Communicator], Awaitable[Any]], comm: Communicator) -> Any:
    if not hasattr(os, "sched_setaffinity"):
        return await main(comm)
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[comm.rank % len(cpus)]})
    try:
        return await main(comm)
    finally:
        os.sched_setaffinity(0, cpus)


async def pingpong(comm: Communicator, sizes: Sequence[int], repeats: int,
                   budget: float = BUDGET,
                   clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """Ranks 0 and 1 bounce a message of each size; return (on rank 0; others get {})
    the median over ``repeats`` of the one-way seconds, half a round trip, each timed after
    one bounce untimed: the first small bounce after the largest size can take
    milliseconds (its peer still busy with, or put to sleep by, the size before), a tenth
    of an 8-byte size's whole sample, which no later bounce pays.  Each size is timed in as
    many laps as fit in ``budget``, counted from a bounce after an untimed one: the
    world's first message takes tens of milliseconds, and the first size, timed one lap
    at a time, came out 3-4 us a message dearer than the next on every transport.  Other ranks
    wait for a message rank 0 sends them at the end, as a collective's ranks wait for
    theirs (on more ranks than cores they take turns on the cores with 0 and 1).  The
    repeats go round every size in turn, so a burst of load from elsewhere on the machine
    spoils one sample of many sizes, not every sample of one.  ``clock``: ``clock_of`` the
    transport."""
    if comm.rank > 1:
        await comm.recv(np.zeros(1, np.uint8), 0)
        return {}
    peer = 1 - comm.rank
    buf = touched(max(sizes))

    async def bounce(nbytes: int, iters: int) -> float:
        return await _laps(comm, buf[:nbytes], peer, peer, iters, clock)

    async def sized(nbytes: int) -> int:
        await bounce(nbytes, 1)  # untimed: the world's first message
        return max(1, min(2000, int(budget / max(await bounce(nbytes, 1), 1e-7))))

    # A warm-up round sizes each size's iterations (rank 0's choice, so both agree).
    iters = np.array([await sized(n) for n in sizes], np.int64)
    if comm.rank == 0:
        await comm.send(iters, peer)
    else:
        await comm.recv(iters, peer)
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n, k in zip(sizes, iters.tolist(), strict=True):
            await bounce(n, 1)  # untimed: the first bounce after the size before
            samples[n].append(await bounce(n, k) / k / 2)
    if comm.rank == 1:
        return {}
    for other in range(2, comm.size):
        await comm.send(np.zeros(1, np.uint8), other)
    return {n: statistics.median(s) for n, s in samples.items()}


def measure_pingpong(transport: str, sizes: Sequence[int] = SIZES,
                     repeats: int = 7, ranks: int = 2) -> dict[int, float]:
    """One-way seconds per size on ``transport`` (see the module docs), between two of
    ``ranks`` ranks (the others wait: ``pingpong``).

    Raises:
        ValueError: an unknown transport.
        RuntimeError: MPI asked for, and no ``mpiexec`` (or the run failed).
    """
    if transport == "local":
        points: dict[int, float] = run(
            lambda comm: pingpong(comm, sizes, repeats, clock=clock_of("local")), ranks,
            backend="local")[0]
        return points
    if transport == "processes":
        # its ranks are processes: the program must pickle (a partial of a module function)
        got: dict[int, float] = run(placed(partial(pingpong, sizes=tuple(sizes),
                                                    repeats=repeats)),
                                    ranks, backend="processes")[0]
        return got
    if transport != "mpi":
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    if launched_by_mpi():
        mine: dict[int, float] = run(placed(lambda comm: pingpong(comm, sizes, repeats)),
                                     backend="mpi")
        return mine
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "points.json"
        mpi_run(["-m", "asynccomm.calibrate", "--transport", "mpi", "--points", str(path),
                 "--sizes", *map(str, sizes), "--repeats", str(repeats)], ranks)
        return {int(k): float(v) for k, v in json.loads(path.read_text()).items()}


#: Sizes of the collective calls that calibrate a rank's CPU work: one small (its Python),
#: one whose arrays stay in a core's cache, one whose arrays go to memory (``HostSpec``
#: ``cached``: calls up to the middle size copy and reduce at its rates).
HOST_SIZES = (8, 256 << 10, 4 << 20)


#: Wall seconds one repeat of a loop of collective calls should take, about.
CALL_BUDGET = 0.05


async def time_calls(comm: Communicator, call: Callable[[], Awaitable[object]], repeats: int,
                     clock: Callable[[], float], budget: float = CALL_BUDGET,
                     iterations: int | None = None,
                     samples: list[float] | None = None) -> tuple[float, float]:
    """The loop that times a collective call, in calibration and validation alike: a
    warm-up repeat that sizes the iterations (rank 0's choice, sent to all; or
    ``iterations`` each time), then ``repeats`` repeats of that many calls back to back,
    each after a barrier.  Returns the median seconds per call (on ``clock``) and this
    process's page faults per timed call.  A rank's calls back to back take turns with the
    other ranks' (on one CPU, or on the cores), so a call's time in the loop holds what
    every rank does per call, where one call after a barrier may end on one rank before
    the others have done their part.  ``samples``, when given, gets each repeat's seconds
    per call.

    A call's scratch comes from its rank's pool (``_collectives.scratch``): after the
    warm-up repeat, calls of one size, back to back or apart, reuse the scratch of the
    call before and fault (almost) no pages in; a size past the pool's cap faults its
    scratch in afresh on every call, several times slower on large buffers."""
    iters = np.full(1, iterations or 1, np.int64)
    got: list[float] = []
    faults, timed = 0, 0
    for rep in range(repeats + 1):
        await comm.barrier()
        before = _faults()
        t0 = clock()
        for _ in range(int(iters[0])):
            await call()
        took = clock() - t0
        if rep == 0 and iterations is None:
            iters[0] = max(1, min(500, int(budget / max(took, 1e-6))))
            await comm.bcast(iters, root=0)
        else:
            got.append(took / int(iters[0]))
            faults, timed = faults + _faults() - before, timed + int(iters[0])
    if samples is not None:
        samples.extend(got)
    return statistics.median(got), faults / timed


async def _collective_calls(comm: Communicator, sizes: Sequence[int], repeats: int,
                            clock: Callable[[], float]) -> dict[str, dict[int, float]]:
    """Median seconds (on ``clock``) of one ring allgather and one ring allreduce call of
    each size, timed as ``time_calls`` does (rank 0's; others {}),
    and under ``"faults"`` the page faults of this process per call of the largest size
    (``"allgather"``, ``"allreduce"``)."""
    out: dict[str, dict[Any, float]] = {"allgather": {}, "allreduce": {}, "faults": {}}
    for n in sizes:
        for name, call in _ring_calls(comm, n).items():
            out[name][n], out["faults"][name] = await time_calls(comm, call, repeats, clock)
    return out if comm.rank == 0 else {}


def touched(shape: int | tuple[int, ...], dtype: Any = np.uint8,
            value: int = 0) -> np.ndarray[Any, Any]:
    """An array of ``value`` whose every page has been written: a real page of memory each.

    ``np.zeros`` asks ``calloc``, which hands out memory fresh from the system untouched:
    until written, each of its pages reads as the system's one shared page of zeros, which
    stays in the caches.  A call that only reads such an array (an allgather's input)
    copies from the caches, whatever the array's size: a 4 MiB allgather on two ranks so
    timed ran 30% faster than on arrays a program has written, and a model calibrated on
    it put such calls that much under their measurements."""
    arr = np.empty(shape, dtype)
    arr.fill(value)
    return arr


def call_buffers(name: str, nbytes: int, p: int) -> tuple[np.ndarray[Any, Any], ...]:
    """The arrays of a call of collective ``name`` (``"allreduce"``, ``"allgather"``,
    ``"alltoall"``) of ``nbytes`` (the whole buffer, nccl-tests' convention) on ``p``
    ranks, as calibration and validation time it: float32 for allreduce, bytes otherwise,
    every page written (``touched``)."""
    per = max(1, nbytes // p)
    if name == "allreduce":
        return (touched(max(1, nbytes // 4), np.float32),)
    if name == "allgather":
        return touched(per), touched((p, per))
    if name == "alltoall":
        return touched((p, per)), touched((p, per))
    raise ValueError(f"call_buffers: no arrays for {name!r}")


def _ring_calls(comm: Communicator, nbytes: int) -> dict[str, Callable[[], Awaitable[object]]]:
    """A ring allgather and a ring allreduce call of ``nbytes`` on ``comm``, on arrays of
    their own (``call_buffers``)."""
    return {"allgather": partial(comm.allgather, *call_buffers("allgather", nbytes, comm.size),
                                 algorithm="ring"),
            "allreduce": partial(comm.allreduce, call_buffers("allreduce", nbytes, comm.size)[0],
                                 algorithm="ring")}


def _faults() -> int:
    """Page faults of this process so far (minor: a page's first touch)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def measure_touch(nbytes: int = 4 << 20, repeats: int = 7,
                  clock: Callable[[], float] = time.process_time) -> float:
    """Seconds per byte (on ``clock``) that writing fresh pages costs more than writing
    them again: the median over ``repeats`` of a fill of ``nbytes`` of new anonymous memory
    less a second fill of the same."""
    extra = []
    for _ in range(repeats):
        with mmap.mmap(-1, nbytes) as mem:
            view = np.frombuffer(mem, np.uint8)
            t0 = clock()
            view.fill(1)
            t1 = clock()
            view.fill(2)
            extra.append((t1 - t0) - (clock() - t1))
            del view
    return max(0.0, statistics.median(extra)) / nbytes


#: Working sets at which ``measure_memory`` times copies: 1 MiB to 128 MiB, from a core's
#: cache to well past the last cache of this kind of machine.
MEMORY_SIZES = tuple(1 << i for i in range(20, 28))

#: Bytes the cross-CPU probe (``cross_cpu``) writes on one CPU and copies out on another.
CROSS_CPU_BYTES = 64 << 10


def cross_cpu(rounds: int = 1000, timeout: float = 30.0) -> float | None:
    """Seconds a process on CPU 1 takes to copy out ``CROSS_CPU_BYTES`` that a process on
    CPU 0 has just written (the median over ``rounds``, each written afresh); None where
    this process may not run on both.  What a message between processes costs past a few
    kilobytes is mostly this read: on the 2-CPU virtual machine these figures come from,
    it took 6.2-6.7 us (10 GB/s) and, for spells of seconds to minutes, 2.3-2.4 us (27
    GB/s), the host having moved the two CPUs nearer each other; a 16 KiB ping-pong
    between two processes took 21-23 us one way in the first state and 12.7-12.9 in the
    second, 1 MiB 152-169 and 135-156.  The second state is two hardware threads of one
    core: a 4 MiB copy on each CPU at once took 2.0-2.4 times as long as on one alone
    there, 0.9-1.04 times in the first state.  A calibration and a check that ran in
    different states disagree by that much, whatever the model (``results.validation``
    reports the state at each measurement).

    Raises:
        RuntimeError: the probe's processes did not finish within ``timeout`` seconds.
    """
    if not hasattr(os, "sched_getaffinity") or not {0, 1} <= os.sched_getaffinity(0):
        return None
    ctx = multiprocessing.get_context("spawn")
    shm = shared_memory.SharedMemory(create=True, size=4096 + CROSS_CPU_BYTES)
    try:
        np.ndarray((2,), np.int64, shm.buf)[:] = 0
        took = ctx.Queue()
        procs = [ctx.Process(target=_cross_cpu_side, args=(shm.name, cpu, rounds, took),
                             daemon=True) for cpu in (0, 1)]
        for proc in procs:
            proc.start()
        try:
            got = float(took.get(timeout=timeout))
        except Exception as exc:  # (queue.Empty: a side never finished)
            raise RuntimeError(f"the cross-CPU probe did not finish in {timeout} s") from exc
        finally:
            for proc in procs:
                proc.join(1.0)
                if proc.is_alive():
                    proc.kill()
        return got
    finally:
        shm.close()
        shm.unlink()


def _cross_cpu_side(name: str, cpu: int, rounds: int, took: Any) -> None:
    """One side of ``cross_cpu``: on CPU 0 write each round's bytes and count the round
    (word 0); on CPU 1 wait for it, copy the bytes out (timed), and count it read (word
    1), which the writer waits for before the next round."""
    os.sched_setaffinity(0, {cpu})
    shm = shared_memory.SharedMemory(name)
    try:
        words = np.ndarray((2,), np.int64, shm.buf)
        data = np.ndarray((CROSS_CPU_BYTES,), np.uint8, shm.buf, 4096)
        out = np.empty_like(data)
        times = []
        for i in range(1, rounds + 1):
            if cpu == 0:
                while words[1] != i - 1:
                    pass
                data[:] = i & 0xFF
                words[0] = i
            else:
                while words[0] != i:
                    pass
                t0 = time.perf_counter()
                np.copyto(out, data)
                times.append(time.perf_counter() - t0)
                words[1] = i
        if cpu == 1:
            took.put(statistics.median(times[len(times) // 10:]))
        del words, data
    finally:
        shm.close()


def measure_memory(sizes: Sequence[int] = MEMORY_SIZES, repeats: int = 5,
                   clock: Callable[[], float] = time.process_time,
                   budget: float = 0.01) -> tuple[tuple[int, float], ...]:
    """The copy rate (bytes/s on ``clock``) at each working set of ``sizes``
    (``HostSpec`` ``memory``): blocks of at most 1 MiB copied each into the next around
    arrays of that many bytes, for at least ``budget`` seconds and the whole set once a
    repeat; the median over ``repeats`` after one untimed.  Load from elsewhere only
    slows a copy, and a larger working set never speeds one up: each rate is raised to
    the fastest at any larger working set (the rates' upper envelope)."""
    out = []
    for size in sizes:
        block = max(1, min(1 << 20, size // 8))
        k = max(2, size // block)
        # mapped apart from the allocator's heap, whose state (how much of a call's
        # scratch it hands back warm) the collective calls timed after this depend on
        with mmap.mmap(-1, k * block) as mem:
            bufs = np.frombuffer(mem, np.uint8).reshape(k, block)
            bufs.fill(1)
            samples = []
            for rep in range(repeats + 1):
                t0, moved = clock(), 0
                while (took := clock() - t0) < budget or moved < size:
                    for i in range(k):
                        np.copyto(bufs[(i + 1) % k], bufs[i])
                    moved += k * block
                if rep:
                    samples.append(moved / max(took, 1e-9))
            del bufs
        out.append((int(size), statistics.median(samples)))
    return envelope(out)


def envelope(points: Sequence[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """``points`` (working set, rate), each rate raised to the fastest at any larger
    working set: a rate that falls and rises again was slowed by load."""
    return tuple((size, max(r for _, r in points[i:])) for i, (size, _) in enumerate(points))


async def _timed_ranked(comm: Communicator, timed: Callable[..., Awaitable[Any]],
                        repeats: int) -> tuple[int, Any]:
    """``timed(comm, repeats)`` with this rank (``_ranked``): what a parent process asks of
    ranks under ``mpiexec``."""
    return await _ranked(comm, timed(comm, repeats))


async def _barriers(comm: Communicator, repeats: int) -> float:
    """Median wall seconds of one barrier call, in the calibration's loop of calls
    (``time_calls``; rank 0's, others 0)."""
    per_call, _ = await time_calls(comm, comm.barrier, repeats, time.perf_counter)
    return per_call if comm.rank == 0 else 0.0


#: The tag of the messages the calibration times: its recvs name their source and tag, as
#: a collective's do.
LAP_TAG = 7


async def _laps(comm: Communicator, buf: np.ndarray[Any, Any], right: int, left: int,
                laps: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds (on ``clock``) of ``laps`` turns of ``buf`` around the ranks: rank 0 sends
    it right and waits for it from the left, the others pass it on."""
    t0 = clock()
    for _ in range(laps):
        if comm.rank == 0:
            await comm.send(buf, right, LAP_TAG)
            await comm.recv(buf, left, LAP_TAG)
        else:
            await comm.recv(buf, left, LAP_TAG)
            await comm.send(buf, right, LAP_TAG)
    return clock() - t0


def measure_switch(cores: int, host: HostSpec, segments: Sequence[Segment],
                   repeats: int = 7, transport: str = "processes",
                   crowded: Sequence[Segment] = ()) -> float:
    """Seconds more per step of a collective call on ``cores + 1`` ranks than on as many
    ranks as cores (``HostSpec`` ``switch``), on ``transport`` (``processes`` or ``mpi``:
    how its waiting processes hold a core decides what a step costs): barrier calls
    (``_barriers``: all waits, no data) timed on ``cores + 1`` processes, and the switch
    that makes the model (``segments``' link, ``host`` on ``cores`` cores) time them so.

    In the model a barrier's ``s`` steps each cost an empty message, and its call and
    steps ``host.call + s * (host.step + switch)`` of CPU on each rank's core, ``k`` ranks
    on the busiest one (``sim/host.py`` Rule 2): back to back, about ``k (call + s (step
    + switch))`` plus its messages a call, linear in the switch.  The model's barrier is
    timed (virtual clock, ``MODEL_CALLS`` calls) without a switch and with that closed
    form's, and the switch read off the line through them.  A barrier's ranks all wait at
    once, as a collective's do at each step, where a token passed around them has one rank
    busy and the others idle.  ``crowded``: the link's segments on more ranks than cores
    (``LinkSpec.crowded``)."""
    p = max(2, cores) + 1
    took = _barrier_call(transport, p, repeats)

    def model(switch: float) -> float:
        cluster = calibrated_cluster(segments, name="switch", ranks=p, host=dataclasses.replace(
            host, cores=max(1, cores), switch=switch), crowded=crowded)
        return float(run(_model_barriers, p, cluster=cluster, clock="virtual")[0])

    return _read_off(model, took, -(-p // max(1, cores)) * work_of("barrier", 0, p).steps)


def _read_off(model: Callable[[float], float], took: float, per_unit: float,
              rounds: int = 4) -> float:
    """The value ``x`` with which ``model(x)`` (seconds, growing with ``x``, linear or
    nearly: where hand-offs overlap other work it is linear by pieces) takes ``took``:
    read off the line through ``model(0)`` and ``model(guess)``, ``guess`` the closed
    form's ``(took - model(0)) / per_unit``, then off the line through the last two
    points, up to ``rounds`` times, until the model takes ``took`` to a nanosecond; 0
    where ``model(0)`` takes as long already."""
    bare = model(0.0)
    if took <= bare:
        return 0.0
    (x0, y0), x = (0.0, bare), (took - bare) / per_unit
    for _ in range(rounds):
        y = model(x)
        if abs(y - took) < 1e-9 or y == y0:
            break
        (x0, y0), x = (x, y), x + (took - y) * (x - x0) / (y - y0)
    return max(0.0, x)


#: Calls back to back of a collective on the model's clock (which does not vary).
MODEL_CALLS = 4


async def _model_barriers(comm: Communicator) -> float:
    """Seconds per barrier call on the model's clock, ``MODEL_CALLS`` calls back to back
    (rank 0's, others too)."""
    return (await time_calls(comm, comm.barrier, 1, comm.model_time,
                             iterations=MODEL_CALLS))[0]


def _barrier_call(transport: str, ranks: int, repeats: int) -> float:
    """``_barriers`` on ``ranks`` ranks of ``transport`` (MPI: under ``mpiexec``)."""
    return _timed_call("barrier", transport, ranks, repeats)


#: The messages of the ring allgather calls that time a rendezvous step on more ranks than
#: cores (``measure_rendezvous_switch``): one at the eager limit, one just past it.
RENDEZVOUS_MESSAGES = (EAGER_LIMIT, EAGER_LIMIT + (8 << 10))


async def rendezvous_calls(comm: Communicator, repeats: int,
                           clock: Callable[[], float] = time.perf_counter,
                           iterations: int | None = None) -> float:
    """Seconds (on ``clock``) a ring allgather call whose messages are just past the eager
    limit takes more than one whose messages are at it (``RENDEZVOUS_MESSAGES``), each in
    the calibration's loop (``time_calls``), the two one after the other in each of
    ``repeats`` turns so that a burst of load falls on both: the median over the turns
    (rank 0's; others 0).  ``iterations``: calls per loop (else sized from ``CALL_BUDGET``
    by a warm-up loop of the larger, rank 0's choice)."""
    p = comm.size
    eager, rendezvous = (partial(comm.allgather, touched(m), touched((p, m)), algorithm="ring")
                         for m in RENDEZVOUS_MESSAGES)
    return await _difference(comm, rendezvous, eager, repeats, clock, iterations)


async def _difference(comm: Communicator, more: Callable[[], Awaitable[object]],
                      less: Callable[[], Awaitable[object]], repeats: int,
                      clock: Callable[[], float], iterations: int | None) -> float:
    """Seconds (on ``clock``) a call of ``more`` takes more than one of ``less``, each in
    the calibration's loop (``time_calls``), the two one after the other in each of
    ``repeats`` turns: the median over the turns (rank 0's; others 0).  ``iterations``:
    calls per loop (else sized from ``CALL_BUDGET`` by a warm-up loop of ``more``, rank
    0's choice)."""
    iters = np.full(1, iterations or 1, np.int64)
    if iterations is None:
        warm, _ = await time_calls(comm, more, 1, clock, iterations=1)
        iters[0] = max(1, min(500, int(CALL_BUDGET / max(warm, 1e-6))))
        await comm.bcast(iters, root=0)
    k = int(iters[0])
    differences = []
    for _ in range(repeats):
        took = (await time_calls(comm, more, 1, clock, iterations=k))[0]
        differences.append(took - (await time_calls(comm, less, 1, clock, iterations=k))[0])
    return statistics.median(differences) if comm.rank == 0 else 0.0


def _rendezvous_call(transport: str, ranks: int, repeats: int) -> float:
    """``rendezvous_calls`` on ``ranks`` ranks of ``transport`` (MPI: under ``mpiexec``)."""
    return _timed_call("rendezvous", transport, ranks, repeats)


def measure_rendezvous_switch(cores: int, host: HostSpec, segments: Sequence[Segment],
                              repeats: int = 7, transport: str = "processes",
                              crowded: Sequence[Segment] = ()) -> float:
    """Seconds more per step whose message is past the eager limit, on ``cores + 1`` ranks
    of ``transport`` (``HostSpec`` ``rendezvous_switch``): a rendezvous message wakes its
    receiver for the announcement and its sender again for the completion, where an eager
    one hands off once.  Ring allgather calls of messages just past the limit less calls
    of messages at it (``rendezvous_calls``), timed on ``cores + 1`` processes, and the
    ``rendezvous_switch`` with which the model (``segments``' link, ``host`` on ``cores``
    cores, its ``switch`` calibrated already) makes the same difference: the difference
    is linear in it, so it is read off the line through the model's without one and with
    a closed-form guess, as ``measure_switch`` reads the switch (``crowded`` as there)."""
    p = max(2, cores) + 1
    took = _rendezvous_call(transport, p, repeats)

    def model(extra: float) -> float:
        cluster = calibrated_cluster(segments, name="rendezvous", ranks=p,
                                     host=dataclasses.replace(host, cores=max(1, cores),
                                                              rendezvous_switch=extra),
                                     crowded=crowded)
        return float(run(lambda comm: rendezvous_calls(comm, 1, comm.model_time,
                                                       MODEL_CALLS),
                         p, cluster=cluster, clock="virtual")[0])

    return _read_off(model, took, -(-p // max(1, cores)) * work_of("allgather", 0, p).steps)


#: The size of the calls that time a step on a transport (``measure_step``): their
#: messages a latency, their copies next to nothing.
STEP_SIZE = 8


async def step_calls(comm: Communicator, repeats: int,
                     clock: Callable[[], float] = time.perf_counter,
                     iterations: int | None = None) -> float:
    """Seconds (on ``clock``) a ring allreduce call of ``STEP_SIZE`` bytes (two steps on
    two ranks) takes more than a ring allgather of as many (one step) and a one-way
    message of its step's block (a token passed around the ranks, ``_laps``), each in a
    loop (the calls in the calibration's, ``time_calls``), the three one after the other
    in each of ``repeats`` turns so that a burst of load from elsewhere, or a spell of
    ranks put to sleep and woken for each message, falls on all three: the median over
    the turns (rank 0's; others 0).  ``iterations``: calls and laps per loop (else sized
    from ``CALL_BUDGET`` by a warm-up loop, rank 0's choice)."""
    p = comm.size
    calls = _ring_calls(comm, STEP_SIZE)
    gather, reduce = calls["allgather"], calls["allreduce"]
    iters = np.full(1, iterations or 1, np.int64)
    if iterations is None:
        warm, _ = await time_calls(comm, reduce, 1, clock, iterations=1)
        iters[0] = max(1, min(500, int(CALL_BUDGET / max(warm, 1e-6))))
        await comm.bcast(iters, root=0)
    k, block = int(iters[0]), touched(max(1, STEP_SIZE // p))
    more = []
    for _ in range(repeats):
        two = (await time_calls(comm, reduce, 1, clock, iterations=k))[0]
        one = (await time_calls(comm, gather, 1, clock, iterations=k))[0]
        await comm.barrier()
        message = await _laps(comm, block, (comm.rank + 1) % p, (comm.rank - 1) % p, k,
                              clock) / k / p
        more.append(two - one - message)
    return statistics.median(more) if comm.rank == 0 else 0.0


def _step_call(transport: str, repeats: int) -> float:
    """``step_calls`` on two ranks of ``transport`` (MPI: under ``mpiexec``)."""
    return _timed_call("steps", transport, 2, repeats)


#: The messages of the exchanges that time a large transfer's copy on both cores
#: (``measure_shared_copy``): past ``sim/model.py``'s ``SHARED_COPY_MIN``, as those of a 4 MiB
#: call on two ranks are.
SHARED_COPY_SIZE = 2 << 20


async def exchange_calls(comm: Communicator, repeats: int,
                         clock: Callable[[], float] = time.perf_counter,
                         iterations: int | None = None) -> float:
    """Seconds (on ``clock``) ranks 0 and 1 exchanging ``SHARED_COPY_SIZE`` bytes, each
    sending the other its message at once (``sendrecv``), take more than rank 0 sending
    the other one such message and waiting for a byte back, each in a loop, the two one
    after the other in each of ``repeats`` turns so that a burst of load falls on both:
    the median over the turns (rank 0's; others 0).  ``iterations``: exchanges and
    messages per loop (else sized from ``CALL_BUDGET`` by a warm-up loop of exchanges,
    rank 0's choice)."""
    peer = 1 - comm.rank
    out, into, answer = (touched(SHARED_COPY_SIZE), touched(SHARED_COPY_SIZE),
                         touched(1))

    async def exchange() -> None:
        await comm.sendrecv(out, peer, into, peer, sendtag=LAP_TAG, recvtag=LAP_TAG)

    async def one_way() -> None:
        if comm.rank == 0:
            await comm.send(out, peer, LAP_TAG)
            await comm.recv(answer, peer, LAP_TAG)
        else:
            await comm.recv(into, peer, LAP_TAG)
            await comm.send(answer, peer, LAP_TAG)

    return await _difference(comm, exchange, one_way, repeats, clock, iterations)


def measure_shared_copy(host: HostSpec, segments: Sequence[Segment], repeats: int = 7,
                        transport: str = "processes") -> float:
    """The share of a large transfer's link time its sender's core spends copying it too,
    on two ranks of ``transport`` each on a core of its own (``HostSpec`` ``shared_copy``,
    ``sim/model.py`` Rule 4e): how much longer an exchange of ``SHARED_COPY_SIZE`` bytes
    each way takes than one such message (``exchange_calls``), read off the model of
    ``segments`` and ``host`` (on two cores), where that difference is linear in the
    share: with none the two messages move as on links of their own, with all of it each
    core copies both.  Clipped to 0..1."""
    took = float(_timed_call("exchange", transport, 2, repeats))

    def model(share: float) -> float:
        cluster = calibrated_cluster(segments, name="shared-copy", ranks=2,
                                     host=dataclasses.replace(host, cores=2,
                                                              shared_copy=share))
        return float(run(lambda comm: exchange_calls(comm, 1, comm.model_time, MODEL_CALLS),
                         2, cluster=cluster, clock="virtual")[0])

    none, whole = model(0.0), model(1.0)
    if whole <= none:
        return 0.0
    return min(1.0, max(0.0, (took - none) / (whole - none)))


#: The calls timed on ranks of a transport, by the option of ``main`` that has them timed
#: under ``mpiexec`` (its file takes rank 0's figure).
_TIMED: dict[str, Callable[..., Coroutine[Any, Any, float]]] = {
    "barrier": _barriers, "rendezvous": rendezvous_calls, "steps": step_calls,
    "exchange": exchange_calls}


def _timed_call(option: str, transport: str, ranks: int, repeats: int) -> float:
    """Rank 0's figure of ``_TIMED[option]`` on ``ranks`` ranks of ``transport``: in
    processes of this machine, or on MPI under ``mpiexec`` (``main``'s ``--<option>``)."""
    return float(_measured("call", _call_timed, option, transport, ranks, repeats))


def _call_timed(option: str, transport: str, ranks: int, repeats: int) -> float:
    if transport != "mpi":
        return float(run(placed(partial(_TIMED[option], repeats=repeats)), ranks,
                         backend="processes")[0])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{option}.json"
        mpi_run(["-m", "asynccomm.calibrate", "--transport", "mpi", f"--{option}", str(path),
                 "--repeats", str(repeats)], ranks)
        return float(json.loads(path.read_text()))


def measure_step(host: HostSpec, segments: Sequence[Segment], repeats: int = 7,
                 transport: str = "processes") -> float:
    """Seconds per step of a collective call on two ranks of ``transport`` (``processes``
    or ``mpi``), each on a core of its own (``HostSpec`` ``step``): what an allreduce of
    ``STEP_SIZE`` bytes (two ring steps) costs more than an allgather of as many (one) and
    a message (``step_calls``), beyond what the model of ``segments`` and ``host`` makes
    of the same (the copies and ``host.step``), added to ``host.step``.  The two calls
    have the same Python per call, so their difference less a message is a step's: its
    block views, posts, waits and reduction, on each rank's own CPU while the other does
    its own.  On in-process ranks (``fit_host``) a step is read beside the in-process
    messages, whose CPU seconds a ping-pong counts with a step's bookkeeping among them;
    the ranks of a transport whose messages cost their CPU less pay it apart."""
    measured = _step_call(transport, repeats)
    cluster = calibrated_cluster(segments, name="step", ranks=2,
                                 host=dataclasses.replace(host, cores=2, switch=0.0))
    model = float(run(lambda comm: step_calls(comm, 1, comm.model_time, MODEL_CALLS), 2,
                      cluster=cluster, clock="virtual")[0])
    return max(0.0, host.step + measured - model)


def measure_host(transport: str, repeats: int = 7, in_process: HostSpec | None = None,
                 segments: Sequence[Segment] = (Segment(1, 0.0, 0.0),),
                 crowded: Sequence[Segment] = ()) -> HostSpec:
    """What a collective call costs on a rank's CPU (see the module docs), measured on
    in-process ranks (one CPU): ring allgather and allreduce calls of ``HOST_SIZES`` on one
    rank (the call alone) and on two, less their messages (in-process ping-pong times of
    half the size; the two ranks' messages and work take turns on the one CPU).

    Per rank, an allgather of n bytes works call + step + 1.5 n / copy + n touch, an
    allreduce call + 2 step + n (2 / copy + 0.5 / reduce + 1.5 touch) (``sim.host.WORK``):
    the smallest size gives the Python, each larger one the rates of calls up to its size
    (its work above the smallest's, per byte).  ``touch`` is the cost of a fresh page
    (``measure_touch``) times the pages the largest calls fault per byte of their fresh
    scratch (counted).  On processes and MPI, ``step`` is a step's on two ranks of the
    transport (``measure_step``, where there are two cores), and ``switch`` what a step
    costs more on one process more than the cores (``measure_switch``, from barrier
    calls; and ``rendezvous_switch`` what a step past the eager limit costs more again
    there, ``measure_rendezvous_switch``), solved on the model of ``segments`` (the fitted
    messages, free by default; ``crowded`` theirs on more ranks than cores) and timed on
    the wall clock.
    The other calls are timed on this process's CPU clock whatever the transport: their rates
    are a rank's own work, which the turns other programs take on a shared machine would
    only blur (a burst of load during the few seconds they take made a reduction ten times
    dearer for every cell of a run); the turns that a transport's own ranks take on more
    ranks than cores are the switch's, and its messages' share of the cores the model's
    (``sim/model.py`` Rule 4b).  ``in_process``: ``in_process_host`` measured already (the
    same for every transport), to which processes and MPI add what is theirs.

    More repeats do not steady the calls' medians: what moves them from run to run is the
    state of the caches and the allocator (a 4 MiB allgather's median moves by 40% between
    runs with 7 repeats as with 21), so ``repeats`` is the ping-pong's (the switch, a
    wall-clock median that load moves, takes three times as many)."""
    host = (in_process if in_process is not None
            else in_process_host(repeats))
    if transport == "local":
        return host
    host = dataclasses.replace(host, unwaited=())  # ranks of their own loops (Rule 2c)
    # processes of their own: a step on two of them, each on a core of its own, then one
    # more than the cores take turns
    cores = os.cpu_count() or 1
    if cores > 1:
        host = dataclasses.replace(host, step=measure_step(host, segments, repeats, transport))
        # a large message's copy, split between two processes' cores (sim/model.py Rule 4e)
        host = dataclasses.replace(host, shared_copy=measure_shared_copy(
            host, segments, repeats, transport))
    # a wall-clock median, which load moves: three times the samples
    host = dataclasses.replace(host, cores=cores, switch=measure_switch(
        cores, host, segments, 3 * repeats, transport=transport, crowded=crowded))
    # a rendezvous step's second hand-off, on top of that switch
    return dataclasses.replace(host, rendezvous_switch=measure_rendezvous_switch(
        cores, host, segments, 3 * repeats, transport=transport, crowded=crowded))


def in_process_host(repeats: int = 7,
                    clock: Callable[[], float] = time.process_time) -> HostSpec:
    """The part of ``measure_host`` measured on in-process ranks, on ``clock``, in a
    process whose allocator has settled (``settle_allocator``), with the steps of ranks of
    one loop (``measure_unwaited``)."""
    settle_allocator()
    call = run(partial(_collective_calls, sizes=(8,), repeats=repeats, clock=clock), 1,
               backend="local")[0]["allgather"][8]
    two = run(partial(_collective_calls, sizes=HOST_SIZES, repeats=repeats, clock=clock), 2,
              backend="local")[0]
    halves = sorted({max(1, n // 2) for n in HOST_SIZES})
    half: dict[int, float] = run(lambda comm: pingpong(comm, halves, repeats, clock=clock), 2,
                                 backend="local")[0]
    host = fit_host(call, two, half, measure_touch(HOST_SIZES[-1], repeats, clock),
                    measure_memory(clock=clock))
    return dataclasses.replace(host, unwaited=measure_unwaited(
        host, half[min(half)], repeats, clock))


#: The rank counts on one event loop whose step ``measure_unwaited`` measures (past the
#: last, the last's), on calls of ``LOOP_BYTES``: small, yet a block on every rank (an
#: 8-byte allreduce on 4 ranks has empty blocks, whose steps send nothing).
LOOP_RANKS = (3, 4, 5, 6)
LOOP_BYTES = 1024


def measure_unwaited(host: HostSpec, message: float, repeats: int = 7,
                     clock: Callable[[], float] = time.process_time,
                     ranks: Sequence[int] = LOOP_RANKS) -> tuple[tuple[str, int, float], ...]:
    """What a step of a ring allgather and a ring allreduce call on each of ``ranks``
    in-process ranks costs less than the model of ``host`` (fitted on two) gives it
    (``HostSpec`` ``unwaited``, ``sim/host.py`` Rule 2c): calls of ``LOOP_BYTES`` timed on
    ``clock`` as ``time_calls`` does (``unwaited_of``)."""
    out = []
    for p in ranks:
        got = run(partial(_collective_calls, sizes=(LOOP_BYTES,), repeats=repeats,
                          clock=clock), p, backend="local")[0]
        out += [(f"{name}.ring", p, unwaited_of(host, message, f"{name}.ring", p,
                                                got[name][LOOP_BYTES]))
                for name in ("allgather", "allreduce")]
    return tuple(sorted(out))


def unwaited_of(host: HostSpec, message: float, algorithm: str, p: int, took: float) -> float:
    """The seconds per step of a rank by which a call of ``algorithm`` of ``LOOP_BYTES`` on
    ``p`` ranks of one loop (``took`` seconds) comes in under the model of ``host``: ``p``
    times the call's work on the one core and its steps' messages (``message``: the
    one-way seconds of the smallest ping-pong; ``measure_unwaited``)."""
    steps = work_of(algorithm, LOOP_BYTES, p).steps
    return (p * (collective_seconds(host, algorithm, LOOP_BYTES, p) + steps * message)
            - took) / (p * steps)


def fit_host(call: float, two: dict[str, dict[Any, float]], halves: dict[int, float],
             fresh_page: float, memory: tuple[tuple[int, float], ...] = ()) -> HostSpec:
    """The rates of ``measure_host`` (one core) from its measurements: ``call`` the seconds
    of a call on one rank, ``two`` those of ``_collective_calls`` on two in-process ranks
    (and their page faults per call), ``halves`` the in-process one-way seconds of half of
    each size, ``fresh_page`` the seconds per byte of a first touch (``measure_touch``),
    ``memory`` the copy rates by working set (``measure_memory``): a call's messages cost
    their ping-pong's time and what the call's working set slows their bytes more
    (``sim/host.py`` Rule 1d), the rest is the call's own work, whose rates hold at the
    largest calls' working set (``working_set``; the allgather's and allreduce's alike).
    The copy rates come from the allgather calls, the reduce rates are what the
    allreduce calls take more than their copies at those rates, per byte they reduce;
    the large calls' rates of their bytes beyond the cached calls' (Rule 1b).

    So a reduce rate holds whatever else of the allreduce calls the model misprices, and
    where the allreduce's copies ran faster than the allgather's rate has them (its cached
    calls' often do: what is left for the sums is a small difference of large times), its
    sums at that size come free, not at the other size's rate (which put cached allreduce
    calls 13% over their measurements).  On
    arrays of written pages (``call_buffers``) the 4 MiB calls' comes out at 9.4 to 12.6
    GB/s, about what their float32 sums run at timed alone as the ring does them around
    the call's working set (10.5 to 11.5).  While the calls were timed on ``np.zeros``
    arrays, whose untouched pages all read as one page of zeros, the allgather's copies
    came out 30% fast and this residual at 2.6 to 4.2 GB/s: it held the copies the
    allgather's rate left out."""
    n_top, page = HOST_SIZES[-1], resource.getpagesize()
    mem = HostSpec(cores=1, memory=memory)  # (the ranks of one loop share its core)

    def slower(name: str, n: int) -> float:
        """Seconds a message of the two-rank call of ``n`` costs more than its ping-pong
        (``sim/host.py`` Rules 1d and 1e)."""
        return mem.slower_messages(footprint(f"{name}.ring", n, 2))

    faulted = statistics.fmean(  # per byte of fresh scratch, both ranks in this process
        min(1.0, two["faults"][name] * page / (2 * work_of(f"{name}.ring", n_top, 2).fresh))
        for name in ("allgather", "allreduce"))

    def work(name: str, messages: int, touch: float) -> list[float]:
        return [max(0.0, (two[name][n] - messages * halves[max(1, n // 2)]
                          - 2 * slower(name, n)) / 2
                    - touch * work_of(f"{name}.ring", n, 2).fresh) for n in HOST_SIZES]

    # The faults are part of the calls' work: never more than what the largest allgather
    # leaves once it has copied at the rate of the cached calls (whose scratch the pool
    # hands back warm), so a large call still copies at a finite rate.
    bare = work("allgather", 2, 0.0)
    cached_copy = max(0.0, bare[1] - bare[0]) / HOST_SIZES[1] / 1.5  # seconds per byte
    touch = min(fresh_page * faulted, max(0.0, bare[-1] - bare[0] - 1.5 * n_top * cached_copy)
                / work_of("allgather.ring", n_top, 2).fresh)
    gather, reduce = work("allgather", 2, touch), work("allreduce", 4, touch)
    # (seconds per byte copied, per byte reduced) of the first cached calls' bytes, then
    # of the bytes each size has beyond the size before (``sim/host.py`` Rule 1b: a call
    # past a piece pays the piece's rates up to its size)
    per_byte = []
    for i, n in enumerate(HOST_SIZES[1:], 1):
        more = n - (HOST_SIZES[i - 1] if i > 1 else 0)
        per_copy = max(0.0, gather[i] - gather[i - 1]) / more / 1.5
        grew = reduce[i] - reduce[i - 1]
        # (an allreduce whose copies at the allgather's rate take all it took more than
        # the size before: nothing left for its sums, which come free at that size)
        per_byte.append((per_copy, max(0.0, grew / more - 2 * per_copy) / 0.5
                         if grew > 0 else -1.0))
    # a rate that load made vanish (its time no more than the small call's: -1 for the
    # sums) is the other size's, when that one is known
    rates: list[tuple[int, float, float]] = []
    for n, (copy, add) in zip(HOST_SIZES[1:], per_byte, strict=True):
        other = next((b for b in reversed(per_byte) if b[0] > 0 and b[1] > 0), (0.0, 0.0))
        copy, add = copy if copy > 0 else other[0], add if add >= 0 else other[1]
        rates.append((n, 1 / copy if copy > 0 else math.inf, 1 / add if add > 0 else math.inf))
    step = max(0.0, (reduce[0] - call) / 2)  # an allreduce of 8 B: the call and 2 steps
    return HostSpec(cores=1, call=call, step=step, copy_bandwidth=rates[-1][1],
                    reduce_bandwidth=rates[-1][2], cached=tuple(rates[:-1]), touch=touch,
                    memory=tuple(memory), working_set=int(footprint(
                        "allgather.ring", n_top, 2).working_set) if memory else 0)


def mpiexec() -> str | None:
    """The ``mpiexec`` beside this Python, or on the PATH; None if there is none."""
    here = Path(sys.executable).with_name("mpiexec")
    return str(here) if here.exists() else shutil.which("mpiexec")


def mpi_run(args: Sequence[str], ranks: int, timeout: float = 300) -> None:
    """Run ``python args...`` under ``mpiexec -n ranks``.

    Raises:
        RuntimeError: no ``mpiexec``, or the run failed.
    """
    exe = mpiexec()
    if exe is None:
        raise RuntimeError("no mpiexec: install an MPI library (the 'mpi' extra)")
    done = subprocess.run([exe, "-n", str(ranks), sys.executable, *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONHASHSEED": "0"})
    if done.returncode:
        raise RuntimeError(f"mpiexec -n {ranks} failed ({done.returncode}):\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


#: The largest size whose one-way time on more ranks than cores is all hand-off
#: (``Crowded.lift``): small enough that no copy counts.
HANDOFF_SIZE = 1024


@dataclasses.dataclass(frozen=True)
class Crowded:
    """The ping-pong between two of ``ranks`` ranks, one more than the cores, and the
    segments (``LinkSpec.crowded``) fitted to its ``points`` less ``lift`` seconds each:
    the median of what its sizes up to ``HANDOFF_SIZE`` took more than on two ranks (at
    least 0)."""

    ranks: int
    points: dict[int, float]
    lift: float
    segments: list[Segment]


def preset(transport: str, points: dict[int, float], segments: list[Segment],
           ranks: int = 8, host: HostSpec | None = None,
           crowded: Crowded | None = None) -> dict[str, Any]:
    """The preset document: the cluster (``Cluster.load`` reads it) and how it was made;
    ``crowded``: the ping-pong on more ranks than cores, if one was timed."""
    cluster = calibrated_cluster(segments, name=f"calibrated-{transport}", ranks=ranks,
                                 shared=transport == "local", host=host,
                                 crowded=crowded.segments if crowded else ())
    made = {"transport": transport, "host": os.uname().nodename,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **_fitted_doc(points, segments)}
    if crowded is not None:
        made["crowded"] = {"ranks": crowded.ranks, "lift": crowded.lift,
                           **_fitted_doc({n: t - crowded.lift
                                          for n, t in crowded.points.items()},
                                         crowded.segments)}
    return {"cluster": cluster.to_dict(), "calibration": made}


def _fitted_doc(points: dict[int, float], segments: Sequence[Segment]) -> dict[str, Any]:
    """A ping-pong's points and the segments fitted to them, as a preset records them."""
    return {"points": {str(n): t for n, t in sorted(points.items())},
            "segments": [{"up_to": s.up_to, "alpha": s.alpha, "beta": s.beta}
                         for s in segments]}


def near_breaks(sizes: Sequence[int], segments: Sequence[Segment]) -> list[int]:
    """Sizes to measure between each break of ``segments`` and the measured ``sizes``
    either side of it (their geometric means), and just past the eager limit when it lies
    inside the sizes: where the fit's segments meet, so the break is placed between
    points a factor of about 1.4 apart rather than 2, and a rendezvous step is seen."""
    out = set()
    for seg in segments[:-1]:
        i = sizes.index(seg.up_to) if seg.up_to in sizes else -1
        for lo, hi in ((i - 1, i), (i, i + 1)):
            if 0 <= lo and hi < len(sizes) and sizes[hi] > sizes[lo] + 1:
                out.add(round(math.sqrt(sizes[lo] * sizes[hi])))
    if sizes and sizes[0] <= EAGER_LIMIT < sizes[-1]:
        out.add(EAGER_LIMIT + 8)
    return sorted(out - set(sizes))


def steep_steps(points: dict[int, float], margin: float = 1.1) -> list[int]:
    """Sizes to measure between each two neighbours of the measured ``points`` (bytes,
    seconds) whose time grows more than ``margin`` times as fast as their size (their
    geometric means): a message's time with a latency grows more slowly than its size,
    faster only where its working set (it and its copy) outgrows a cache, over a factor
    of 2 to 4 of sizes (2 MiB to 8 MiB on this machine's 16 MiB last cache), which a
    segment of the fit (at least ``MIN_POINTS`` points) can follow only with points
    between."""
    sizes = sorted(points)
    return [round(math.sqrt(lo * hi)) for lo, hi in itertools.pairwise(sizes)
            if hi > lo + 1 and points[hi] / points[lo] > margin * hi / lo]


def calibrate(transport: str, sizes: Sequence[int] = SIZES,
              repeats: int = 7, *, host: bool | HostSpec = True) -> dict[str, Any]:
    """Measure, fit and return the preset document (see the module docs); ``host=False``
    leaves out the CPU work of collective calls (messages only), a ``HostSpec`` is its
    in-process part measured already on the transport's clock (``in_process_host``).

    Ranks in processes of their own (``processes``, ``mpi``) are timed again on one
    process more than the cores (``crowded``): there one process copies each message, where
    two on cores of their own copy a large one together (a 4 MiB message on the
    shared-memory link took about twice as long, 1 MiB 1.7 times, 256 KiB 1.25 times).
    Their ``crowded`` segments are fitted to those times less what a small message
    (``HANDOFF_SIZE`` or less; nothing, if no size is that small) took more there than on
    two ranks (``Crowded.lift``): the hand-off to a rank that waits on crowded cores, which
    the host's ``switch`` prices per step (solved on this same model, ``measure_switch``).
    Their two-rank ping-pong is framed by ``cross_cpu`` probes, which the preset's
    ``calibration.cross_cpu`` keeps (seconds, before and after; None where not measured):
    the state of the machine it was timed in."""
    cores = os.cpu_count() or 1
    # processes of their own: the machine's state (``cross_cpu``), from the one process
    # that starts them (not from every rank of a launcher's job)
    probed = transport != "local" and cores > 1 and not launched_by_mpi()
    before = _measured("cross_cpu", _cross_cpu_at, "before") if probed else None
    points, segments = fitted_pingpong(transport, sizes, repeats)
    after = _measured("cross_cpu", _cross_cpu_at, "after") if probed else None
    crowded = None
    if transport != "local" and cores > 1:  # (on one core, two ranks are crowded already)
        crowded_points, _ = fitted_pingpong(transport, sizes, repeats, cores + 1)
        small = [n for n in sizes if n <= HANDOFF_SIZE]
        lift = max(0.0, statistics.median(crowded_points[n] - points[n] for n in small)
                   ) if small else 0.0
        crowded = Crowded(cores + 1, crowded_points, lift, _fit(
            {n: t - lift for n, t in crowded_points.items()}))
    in_process = host if isinstance(host, HostSpec) else None
    doc = preset(transport, points, segments, host=measure_host(
        transport, repeats, in_process, segments, crowded.segments if crowded else ())
        if host else None, crowded=crowded)
    if probed:
        doc["calibration"]["cross_cpu"] = [before, after]
    return doc


def _cross_cpu_at(when: str) -> float | None:
    """``cross_cpu`` (``when``: which of a calibration's probes, for its ``Record``)."""
    return cross_cpu()


def fitted_pingpong(transport: str, sizes: Sequence[int], repeats: int, ranks: int = 2
                    ) -> tuple[dict[int, float], list[Segment]]:
    """The one-way times of ``sizes`` between two of ``ranks`` ranks of ``transport``
    (``measure_pingpong``) and the segments fitted to them, measured again near the fit's
    breaks and steep steps and fitted again."""
    points = _measured("pingpong", measure_pingpong, transport, list(sizes), repeats, ranks)
    segments = _fit(points)
    extra = sorted({n for n in [*near_breaks(sorted(points), segments), *steep_steps(points)]
                    if n not in points})
    if extra:  # a second pass where the first found its breaks and steps, then fit again
        points.update(_measured("pingpong", measure_pingpong, transport, extra, repeats, ranks))
        segments = _fit(points)
    return points, segments


def _fit(points: dict[int, float]) -> list[Segment]:
    """The calibration's segments of one-way times ``points`` (``fit_segments``)."""
    return fit_segments(list(points.items()), max_segments=MAX_SEGMENTS,
                        min_points=MIN_POINTS, breaks=(EAGER_LIMIT,))


def _report(doc: dict[str, Any]) -> str:
    cal = doc["calibration"]
    lines = _fitted_lines(f"{cal['transport']}:", cal)
    if "crowded" in cal:
        crowded = cal["crowded"]
        lines += _fitted_lines(f"  on {crowded['ranks']} ranks (more than the cores), less "
                               f"{crowded['lift'] * 1e6:.2f} us a message:", crowded)
    if doc["cluster"].get("host"):
        lines.append(f"  host: {HostSpec.from_dict(doc['cluster']['host']).describe()}")
    return "\n".join(lines)


def _fitted_lines(title: str, fitted: dict[str, Any]) -> list[str]:
    """A ping-pong's segments, and its points against them (``_fitted_doc``)."""
    segs = [Segment(s["up_to"], s["alpha"], s["beta"]) for s in fitted["segments"]]
    lines = [f"{title} {len(segs)} segment(s)"]
    lines += [f"  up to {s.up_to:>9} B: alpha {s.alpha * 1e6:8.2f} us, "
              f"bandwidth {s.bandwidth / 1e9:8.3f} GB/s" for s in segs]
    lines.append(f"  {'bytes':>9}  {'measured us':>12}  {'fitted us':>10}  error")
    for n, t in fitted["points"].items():
        fit = predict(segs, int(n))
        lines.append(f"  {n:>9}  {t * 1e6:12.2f}  {fit * 1e6:10.2f}  {fit / t - 1:+.1%}")
    return lines


async def _ranked(comm: Communicator, measured: Awaitable[float]) -> tuple[int, float]:
    """This rank and what it ``measured`` (under ``mpiexec`` only rank 0 writes it)."""
    return comm.rank, await measured


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m asynccomm.calibrate",
                                description=__doc__.splitlines()[0])
    p.add_argument("--transport", choices=TRANSPORTS, default="local")
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES),
                   help="message sizes in bytes (default: 8 B to 64 MiB)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path, help="the preset file (default: calibrated-<transport>"
                   ".json here)")
    p.add_argument("--points", type=Path, help=argparse.SUPPRESS)  # an MPI run's rank 0
    p.add_argument("--barrier", type=Path, help=argparse.SUPPRESS)  # the same, _barriers
    p.add_argument("--steps", type=Path, help=argparse.SUPPRESS)  # the same, _step_call
    p.add_argument("--rendezvous", type=Path, help=argparse.SUPPRESS)  # rendezvous_calls
    p.add_argument("--exchange", type=Path, help=argparse.SUPPRESS)  # exchange_calls
    args = p.parse_args(argv)
    if args.repeats < 1 or any(n < 1 for n in args.sizes):
        p.error("--repeats and every size must be >= 1")
    if args.points is not None:  # measuring for a parent process, under mpiexec
        points = measure_pingpong(args.transport, sorted(set(args.sizes)), args.repeats)
        if points:
            args.points.write_text(json.dumps(points))
        return 0
    for option, timed in _TIMED.items():  # the same, for the calls of _timed_call
        path = getattr(args, option)
        if path is not None:
            rank, got = run(placed(partial(_timed_ranked, timed=timed,
                                           repeats=args.repeats)), backend="mpi")
            if rank == 0:
                path.write_text(json.dumps(got))
            return 0
    doc = calibrate(args.transport, sorted(set(args.sizes)), args.repeats)
    out = args.out or Path(f"calibrated-{args.transport}.json")
    out.write_text(json.dumps(doc, indent=2) + "\n")
    sys.stdout.write(f"{_report(doc)}\nwrote {out}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
