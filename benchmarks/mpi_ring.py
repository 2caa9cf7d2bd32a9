"""asynccomm on MPI beside raw mpi4py at any process count: ring exchange and idle ranks.

Run: ``mpiexec -n N .venv/bin/python -m benchmarks.mpi_ring [--quick] [--loop L] [--out DIR]``

Meant for more ranks than cores (``-n 3`` and ``-n 4`` on two cores), where a rank that
polls takes the core its peer needs.  Two measurements:

- ring: every rank ``sendrecv``s to rank+1 from rank-1, repeatedly; the time per hop is
  the median over repeats, raw mpi4py ``Sendrecv`` with numpy buffers alternating repeat
  by repeat with asynccomm in the same processes.  Beside it, the CPU time per hop summed
  over the ranks (``time.process_time``): divided by the cores it bounds the hop from
  below, which says whether the ranks wait for each other or for the cores.  A third
  column, the asyncio floor, is the least an asyncio library on mpi4py does per hop
  (``floor_ring``: ``Isend``, and a task polling a persistent recv that wakes a future;
  where ranks outnumber cores it gives its core away between polls, as asynccomm does):
  what no asyncio library beats, so ``asynccomm/floor`` is asynccomm's own overhead.
- idle: every rank awaits a recv that nothing satisfies for a while.  Its process CPU time
  (``time.process_time``) over its first idle second is the idle cost; then rank 0 sends,
  and each rank passes the message on a second after it arrived, so every message finds
  its receiver idle for at least a second.  The wake time is from the sender's clock
  just before ``send`` to the receiver's just after ``recv`` returned (``CLOCK_MONOTONIC``
  is system-wide, and the ranks share a host).

The ring's target (within ``RING_RATIO_TARGET`` of raw) is judged only where the ranks
outnumber the cores; the idle targets at any count.  Rank 0 prints the tables and writes
``mpi_ring_n<N>.json``.  Exit status: 1 when a full run missed a target (``--quick``
judges nothing), 0 otherwise, 2 for bad arguments or fewer than 2 processes.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import asynccomm as ac
from asynccomm.transports._mpi_lib import yield_now

from ._common import (
    KiB,
    MiB,
    fill_array,
    launched_args,
    load_average,
    median,
    mpi_environment,
    print_table,
    printed,
    quiet,
    size_label,
    write_json,
)

RING_RATIO_TARGET = 3.0
IDLE_CPU_TARGET = 0.10
WAKE_TARGET_MS = 1.0
TAG = 11
IDLE_TAG = 12
#: Each repeat of a ring size runs about this long (the iteration count is agreed from a
#: warm-up, so slow oversubscribed hops do not stretch the run).
REPEAT_SECONDS = 0.25
#: Rank 0 idles this much longer than the others before it sends, so that every receiver
#: waits in its recv when its message comes (the ranks' sleeps end up to a timer tick
#: apart, and a receiver still asleep would add the difference to its wake time).
SEND_MARGIN = 0.05


@dataclass(frozen=True)
class Plan:
    ring_sizes: tuple[int, ...]
    repeats: int
    idle_seconds: float
    idle_repeats: int

    @classmethod
    def make(cls, quick: bool) -> Plan:
        if quick:
            return cls((8 * KiB, 1 * MiB), 3, 0.3, 1)
        return cls((8 * KiB, 1 * MiB), 7, 1.0, 3)


@dataclass
class RingRow:
    nbytes: int
    iters: int
    raw: list[float] = field(default_factory=list)
    asynccomm: list[float] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)
    #: Per repeat, the CPU seconds per hop of all the ranks together.
    raw_cpu: list[float] = field(default_factory=list)
    asynccomm_cpu: list[float] = field(default_factory=list)
    floor_cpu: list[float] = field(default_factory=list)

    def ratio(self) -> float:
        return median(self.asynccomm) / median(self.raw)

    def floor_ratio(self) -> float:
        return median(self.asynccomm) / median(self.floor)


@dataclass
class IdleRow:
    """One idle round: per rank, the CPU share of its idle second and its wake time."""

    cpu_share: list[float]
    wake_ms: list[float]
    #: Per rank, the floor measured beside it where a benchmark does (``shm_p2p``): a bare
    #: datagram waking the rank's idle loop.
    bare_ms: list[float] = field(default_factory=list)


# -- ring ------------------------------------------------------------------------------------


def raw_ring(comm: Any, sbuf: np.ndarray[Any, Any], rbuf: np.ndarray[Any, Any],
             iters: int) -> tuple[float, float]:
    """(Seconds per hop, this rank's CPU seconds per hop), blocking mpi4py ``Sendrecv`` on
    ``comm``."""
    rank, size = comm.Get_rank(), comm.Get_size()
    dest, source = (rank + 1) % size, (rank - 1) % size
    comm.Barrier()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(iters):
        comm.Sendrecv(sbuf, dest, TAG, rbuf, source, TAG)
    return (time.perf_counter() - start) / iters, (time.process_time() - cpu) / iters


async def floor_ring(comm: Any, sbuf: np.ndarray[Any, Any], rbuf: np.ndarray[Any, Any],
                     iters: int, share_core: bool) -> tuple[float, float]:
    """As ``raw_ring``, for the asyncio floor: each hop ``Isend``s, waits for the recv that
    ``Floor`` polls, then polls the send until MPI is done with it (``Sendrecv``'s
    guarantee); ``share_core`` as in ``Floor``."""
    from ._mpi_floor import Floor

    rank, size = comm.Get_rank(), comm.Get_size()
    dest, source = (rank + 1) % size, (rank - 1) % size
    async with Floor(comm, rbuf, source, TAG, share_core=share_core) as floor:
        comm.Barrier()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(iters):
            req = comm.Isend(sbuf, dest, TAG)
            await floor.recv()
            while not req.Test():
                await yield_now()
        elapsed, used = time.perf_counter() - start, time.process_time() - cpu
        comm.Barrier()  # no rank stops polling while a peer still sends to it
    return elapsed / iters, used / iters


async def ac_ring(comm: ac.Communicator, sbuf: np.ndarray[Any, Any],
                  rbuf: np.ndarray[Any, Any], iters: int) -> tuple[float, float]:
    """As ``raw_ring``, with asynccomm's ``sendrecv``."""
    dest, source = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    await comm.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(iters):
        await comm.sendrecv(sbuf, dest, rbuf, source, sendtag=TAG, recvtag=TAG)
    return (time.perf_counter() - start) / iters, (time.process_time() - cpu) / iters


async def measure_ring(comm: ac.Communicator, raw: Any, nbytes: int, repeats: int,
                       share_core: bool,
                       beside: Callable[[int], Awaitable[None]] | None = None) -> RingRow:
    """The ring's row; ``beside(iters)``, where given, measures more in each repeat, after
    the three here (``shm_p2p``'s floors).  The floors run once asynccomm's progress has
    gone idle (``quiet``)."""
    from mpi4py import MPI

    sbuf, rbuf = fill_array(nbytes, 1), fill_array(nbytes, 0)
    warm = max(raw_ring(raw, sbuf, rbuf, 10)[0], (await ac_ring(comm, sbuf, rbuf, 10))[0],
               (await floor_ring(raw, sbuf, rbuf, 10, share_core))[0])
    iters = int(raw.allreduce(int(min(2000, max(10, REPEAT_SECONDS / warm))), op=MPI.MAX))
    row = RingRow(nbytes, iters)
    for _ in range(repeats):
        seconds, cpu = raw_ring(raw, sbuf, rbuf, iters)
        row.raw.append(seconds)
        row.raw_cpu.append(float(raw.allreduce(cpu)))  # outside the timed loops
        seconds, cpu = await ac_ring(comm, sbuf, rbuf, iters)
        row.asynccomm.append(seconds)
        row.asynccomm_cpu.append(float(raw.allreduce(cpu)))
        await quiet()
        seconds, cpu = await floor_ring(raw, sbuf, rbuf, iters, share_core)
        row.floor.append(seconds)
        row.floor_cpu.append(float(raw.allreduce(cpu)))
        if beside is not None:
            await beside(iters)
    return row


# -- idle ------------------------------------------------------------------------------------


def monotonic() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


async def idle_round(comm: ac.Communicator, seconds: float) -> tuple[float, float]:
    """(CPU share over this rank's first idle ``seconds``, wake time in ms)."""
    dest, source = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    stamp = np.zeros(1)
    await comm.barrier()
    req = comm.irecv(stamp, source, IDLE_TAG)
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    share = (time.process_time() - cpu) / (time.perf_counter() - wall)
    if comm.rank == 0:
        await asyncio.sleep(SEND_MARGIN)
        await comm.send(np.array([monotonic()]), dest, IDLE_TAG)
    await req
    woke = monotonic()
    wake_ms = (woke - float(stamp[0])) * 1e3
    if comm.rank != 0:
        await asyncio.sleep(seconds)  # idle again, so the next rank has waited too
        await comm.send(np.array([monotonic()]), dest, IDLE_TAG)
    # Idle after the message too, as the bare datagram's round does: what a sender does
    # next (the next round's messages, the gather of the results) would compete with the
    # rank it woke for a core, and count in that rank's wake.
    await asyncio.sleep(SEND_MARGIN)
    return share, wake_ms


async def measure_idle(comm: ac.Communicator, seconds: float) -> IdleRow:
    share, wake = await idle_round(comm, seconds)
    mine = np.array([share, wake])
    every = np.zeros((comm.size, 2))
    await comm.allgather(mine, every)
    return IdleRow([float(x) for x in every[:, 0]], [float(x) for x in every[:, 1]])


async def measure(comm: ac.Communicator, plan: Plan,
                  crowded: bool) -> tuple[list[RingRow], list[IdleRow]]:
    from mpi4py import MPI

    raw = MPI.COMM_WORLD.Dup()
    try:
        rings = [await measure_ring(comm, raw, n, plan.repeats, crowded)
                 for n in plan.ring_sizes]
    finally:
        raw.Free()
    idles = [await measure_idle(comm, plan.idle_seconds) for _ in range(plan.idle_repeats)]
    return rings, idles


# -- report ----------------------------------------------------------------------------------


def checks(rings: list[RingRow], idles: list[IdleRow], crowded: bool) -> list[dict[str, Any]]:
    """The targets; the ring's is set for more ranks than cores, and only shown otherwise
    (``binding`` False)."""
    out: list[dict[str, Any]] = []
    for row in rings:
        ratio = row.ratio()
        out.append({"what": f"ring sendrecv {size_label(row.nbytes)} per hop", "value": ratio,
                    "unit": "x raw", "target": f"<= {RING_RATIO_TARGET:g}x raw",
                    "passed": ratio <= RING_RATIO_TARGET, "binding": crowded})
    # Per rank the median over rounds; judged on the worst rank.
    cpu = max(median([r.cpu_share[k] for r in idles]) for k in range(len(idles[0].cpu_share)))
    wake = max(median([r.wake_ms[k] for r in idles]) for k in range(len(idles[0].wake_ms)))
    out.append({"what": "idle rank CPU (worst rank)", "value": cpu, "unit": "of a core",
                "target": f"< {IDLE_CPU_TARGET:.0%} of a core", "passed": cpu < IDLE_CPU_TARGET,
                "binding": True})
    out.append({"what": "idle rank wake (worst rank)", "value": wake, "unit": "ms",
                "target": f"<= {WAKE_TARGET_MS:g} ms", "passed": wake <= WAKE_TARGET_MS,
                "binding": True})
    return out


def _verdict(c: dict[str, Any]) -> str:
    word = "PASS" if c["passed"] else "FAIL"
    return word if c["binding"] else f"({word.lower()})"


def _value(c: dict[str, Any]) -> str:
    if c["unit"] == "of a core":
        return f"{c['value']:.1%} of a core"
    return f"{c['value']:.2f} {c['unit']}"


def print_report(rings: list[RingRow], idles: list[IdleRow], judged: list[dict[str, Any]],
                 env: dict[str, Any], size: int, loop: str, quick: bool) -> None:
    print(f"asynccomm {env['asynccomm']} on MPI ({env['mpi']}), {size} processes on "
          f"{env['cpus_usable']} cores, loop {loop}{' (--quick)' if quick else ''}; "
          f"load average {env['loadavg_1min']:.2f} at start, "
          f"{env['loadavg_1min_at_end']:.2f} at end")
    print_table("Ring sendrecv, time per hop (median, us), and CPU time per hop of all "
                "the ranks together (median, us); asyncio floor: the least an asyncio "
                "library on mpi4py does per hop",
                ["size", "iters", "raw mpi4py", "asyncio floor", "asynccomm", "asynccomm/raw",
                 "asynccomm/floor", "raw CPU", "floor CPU", "asynccomm CPU"],
                [[size_label(r.nbytes), r.iters, f"{median(r.raw) * 1e6:.1f}",
                  f"{median(r.floor) * 1e6:.1f}", f"{median(r.asynccomm) * 1e6:.1f}",
                  f"{r.ratio():.2f}x", f"{r.floor_ratio():.2f}x",
                  f"{median(r.raw_cpu) * 1e6:.1f}", f"{median(r.floor_cpu) * 1e6:.1f}",
                  f"{median(r.asynccomm_cpu) * 1e6:.1f}"]
                 for r in rings])
    print_table("Idle ranks (per rank: median over rounds)",
                ["rank", "CPU while idle", "wake after idle (ms)"],
                [[str(k), f"{median([r.cpu_share[k] for r in idles]):.1%}",
                  f"{median([r.wake_ms[k] for r in idles]):.3f}"]
                 for k in range(size)])
    print_table("Targets (MPI transport; parenthesised: the ring's target is set for more "
                "ranks than cores, shown, not judged)",
                ["check", "value", "target", "status"],
                [[c["what"], _value(c), c["target"], _verdict(c)] for c in judged])
    binding = [c for c in judged if c["binding"]]
    print(f"\n{sum(c['passed'] for c in binding)}/{len(binding)} targets met")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return launched_args("mpi_ring", __doc__, "few repeats and a short idle wait",
                         "mpi_ring_n<N>.json", argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = Plan.make(args.quick)
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    if size < 2:
        print("run with 2 or more processes: mpiexec -n 3 python -m benchmarks.mpi_ring",
              file=sys.stderr)
        return 2
    stamp = datetime.datetime.now(datetime.UTC)
    env = mpi_environment()
    started = time.perf_counter()

    crowded = size > (env["cpus_usable"] or env["cpu_count"] or 1)

    async def bench(comm: ac.Communicator) -> tuple[list[RingRow], list[IdleRow]]:
        return await measure(comm, plan, crowded)

    os.environ["ASYNCCOMM_TRANSPORT"] = "mpi"  # this measures the MPI link
    rings, idles = ac.run(bench, loop=args.loop, backend="mpi")
    if MPI.COMM_WORLD.Get_rank() != 0:
        return 0
    elapsed = time.perf_counter() - started
    env["loadavg_1min_at_end"] = load_average()
    judged = checks(rings, idles, crowded=crowded)
    with printed() as report:
        print_report(rings, idles, judged, env, size, args.loop, args.quick)
    doc = {"suite": "mpi_ring", "schema": 1, "timestamp": stamp.isoformat(timespec="seconds"),
           "quick": args.quick, "loop": args.loop, "processes": size,
           "elapsed_seconds": elapsed, "environment": env,
           "ring": [asdict(r) for r in rings], "idle": [asdict(r) for r in idles],
           "checks": judged,
           "targets_met": sum(c["passed"] for c in judged if c["binding"]),
           "targets_judged": sum(c["binding"] for c in judged),
           "report": report.getvalue()}
    write_json(args.out, f"mpi_ring_n{size}.json", doc, started)
    missed = any(c["binding"] and not c["passed"] for c in judged)
    return 1 if missed and not args.quick else 0


if __name__ == "__main__":
    sys.exit(main())
