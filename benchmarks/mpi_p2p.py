"""asynccomm on MPI beside raw mpi4py, 2 processes: one-way latency and bandwidth.

Run: ``mpiexec -n 2 .venv/bin/python -m benchmarks.mpi_p2p [--quick] [--loop L] [--out DIR]``

Latency is half a ping-pong round trip (8 B to 1 MiB), bandwidth is a one-way transfer
closed by a 1-byte acknowledgement (1 MiB to 256 MiB); both report the median over repeats.
Raw mpi4py ``Send``/``Recv`` with numpy buffers runs in the same processes, alternating
repeat by repeat with asynccomm (on its own communicator), so both see the same machine;
so does the asyncio floor (the least an asyncio library on mpi4py does: a task polling a
persistent recv wakes the waiter, a turn of the loop later), for latency and bandwidth.
The targets (DESIGN §7): one-way 8 B latency within ``FLOOR_RATIO_TARGET`` of the asyncio
floor measured in the same run, bandwidth within ``BANDWIDTH_TARGETS`` of raw mpi4py.
Beside the 8 B latency, alternating repeat by repeat (``measure_engine``, shown, not
judged): the same engine between two in-process ranks in rank 0's process (no transport)
and a bare ``Future`` hand-off, so that what the link costs can be told from what the
engine's steps cost.
Rank 0 prints the tables and writes ``mpi_p2p.json``.  Exit status: 1 when a full run
missed a target (``--quick`` judges nothing), 0 otherwise, 2 for bad arguments or a wrong
process count.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import asynccomm as ac

from . import p2p
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

#: One-way 8 B latency: at most this many times the asyncio floor measured in the same run
#: (the least any asyncio library on mpi4py can do; an absolute figure would judge the
#: machine, not asynccomm).
FLOOR_RATIO_TARGET = 1.5
#: Bandwidth, as a share of raw mpi4py's, by message size.
BANDWIDTH_TARGETS = {1 * MiB: 0.90, 16 * MiB: 0.95, 256 * MiB: 0.95}
TAG = 7
ACK_TAG = 8
#: The matched floor's announcements (``floor_stream``).
HEADER_TAG = ACK_TAG + 3


@dataclass(frozen=True)
class Plan:
    latency_sizes: tuple[int, ...]
    latency_iters: int
    bandwidth_sizes: tuple[int, ...]
    repeats: int
    responsiveness_bytes: int
    #: Messages a repeat of a bandwidth row, and bytes at most (fewer for big messages):
    #: a ratio of rows of 50 messages (6.5 ms at 1 MiB) moved by 2 points from run to run,
    #: where alternating rows of 200 told 1-point changes apart.
    bandwidth_iters: int = 200
    bandwidth_bytes: int = 1 << 30

    @classmethod
    def make(cls, quick: bool) -> Plan:
        if quick:
            return cls((8, 1 * KiB, 64 * KiB), 300, (1 * MiB, 16 * MiB), 3, 64 * MiB, 50,
                       256 * MiB)
        return cls((8, 64, 1 * KiB, 8 * KiB, 64 * KiB, 1 * MiB), 5_000,
                   (1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB), 7, 256 * MiB)

    def iters_for(self, nbytes: int, *, bandwidth: bool) -> int:
        """Fewer iterations for big messages: ``bandwidth_bytes`` moved per repeat of a
        bandwidth row at most, 256 MiB of a latency row."""
        if bandwidth:
            return max(2, min(self.bandwidth_iters, self.bandwidth_bytes // max(nbytes, 1)))
        return max(20, min(self.latency_iters, (256 * MiB) // max(nbytes, 1)))


# -- raw mpi4py ------------------------------------------------------------------------------


def raw_pingpong(comm: Any, buf: np.ndarray[Any, Any], iters: int) -> float:
    """Seconds per one-way message, half a round trip, blocking mpi4py on ``comm``."""
    peer = 1 - comm.Get_rank()
    comm.Barrier()
    start = time.perf_counter()
    if comm.Get_rank() == 0:
        for _ in range(iters):
            comm.Send(buf, peer, TAG)
            comm.Recv(buf, peer, TAG)
    else:
        for _ in range(iters):
            comm.Recv(buf, peer, TAG)
            comm.Send(buf, peer, TAG)
    return (time.perf_counter() - start) / (2 * iters)


def raw_stream(comm: Any, buf: np.ndarray[Any, Any], ack: np.ndarray[Any, Any],
               iters: int) -> float:
    """Seconds per one-way transfer of ``buf`` (acknowledged with one byte)."""
    comm.Barrier()
    start = time.perf_counter()
    if comm.Get_rank() == 0:
        for _ in range(iters):
            comm.Send(buf, 1, TAG)
            comm.Recv(ack, 1, ACK_TAG)
    else:
        for _ in range(iters):
            comm.Recv(buf, 0, TAG)
            comm.Send(ack, 0, ACK_TAG)
    return (time.perf_counter() - start) / iters


async def floor_pingpong(comm: Any, buf: np.ndarray[Any, Any], iters: int) -> float:
    """Seconds per one-way message for the least any asyncio library on mpi4py can do: a
    task polls a persistent recv posted into ``buf`` and wakes the waiting task with a
    future (no matching, checks, protocol or bookkeeping; a ping-pong never has two
    messages in flight one way, so the recv is simply restarted)."""
    from ._mpi_floor import Floor

    peer = 1 - comm.Get_rank()
    comm.Barrier()
    async with Floor(comm, buf, peer, TAG) as floor:
        start = time.perf_counter()
        if comm.Get_rank() == 0:
            for _ in range(iters):
                comm.Send(buf, peer, TAG)
                await floor.recv()
        else:
            for _ in range(iters):
                await floor.recv()
                comm.Send(buf, peer, TAG)
        elapsed = time.perf_counter() - start
    return elapsed / (2 * iters)


async def floor_stream(comm: Any, buf: np.ndarray[Any, Any], ack: np.ndarray[Any, Any],
                       iters: int, matched: bool = False) -> float:
    """Seconds per one-way transfer of ``buf`` (acknowledged with one byte) for the least
    any asyncio library on mpi4py can do: ``raw_stream``'s blocking sends, each rank waiting
    for what it receives in a task that polls a persistent recv (``floor_pingpong``'s), its
    waiter resumed at the next turn of the loop.  (That recv is posted again as soon as
    one completes, before the next message comes, where ``raw_stream``'s ``Recv`` may come
    after it: the floor can beat raw mpi4py.)

    With ``matched``, the floor of a library that must match a message before it receives
    it (``_mpi_floor.MatchedFloor``): each message is an announcement on one tag and its
    data on another, and the receiver's task posts the data's recv once the announcement
    lands.  Beside the other it shows what that hop costs any library with MPI's matching
    rules: asynccomm's floor for large messages."""
    from ._mpi_floor import Floor, MatchedFloor

    rank = comm.Get_rank()
    header = np.zeros(1, np.int64)
    comm.Barrier()
    floor = (Floor(comm, ack, 1, ACK_TAG) if rank == 0
             else MatchedFloor(comm, buf, 0, HEADER_TAG, TAG) if matched
             else Floor(comm, buf, 0, TAG))
    async with floor:
        start = time.perf_counter()
        if rank == 0:
            for _ in range(iters):
                if matched:
                    comm.Send(header, 1, HEADER_TAG)
                comm.Send(buf, 1, TAG)
                await floor.recv()
        else:
            for _ in range(iters):
                await floor.recv()
                comm.Send(ack, 0, ACK_TAG)
        elapsed = time.perf_counter() - start
    return elapsed / iters


async def matched_stream(comm: Any, buf: np.ndarray[Any, Any], ack: np.ndarray[Any, Any],
                         iters: int) -> float:
    """``floor_stream``'s matched floor."""
    return await floor_stream(comm, buf, ack, iters, matched=True)


# -- asynccomm -------------------------------------------------------------------------------


async def ac_barrier(comm: ac.Communicator) -> None:
    token = np.zeros(1, np.uint8)
    peer = 1 - comm.rank
    await comm.sendrecv(token, peer, token.copy(), peer, sendtag=ACK_TAG + 1,
                        recvtag=ACK_TAG + 1)


async def ac_pingpong(comm: ac.Communicator, buf: np.ndarray[Any, Any], iters: int) -> float:
    peer = 1 - comm.rank
    await ac_barrier(comm)
    start = time.perf_counter()
    if comm.rank == 0:
        for _ in range(iters):
            await comm.send(buf, peer, TAG)
            await comm.recv(buf, peer, TAG)
    else:
        for _ in range(iters):
            await comm.recv(buf, peer, TAG)
            await comm.send(buf, peer, TAG)
    return (time.perf_counter() - start) / (2 * iters)


async def ac_stream(comm: ac.Communicator, buf: np.ndarray[Any, Any],
                    ack: np.ndarray[Any, Any], iters: int) -> float:
    await ac_barrier(comm)
    start = time.perf_counter()
    if comm.rank == 0:
        for _ in range(iters):
            await comm.send(buf, 1, TAG)
            await comm.recv(ack, 1, ACK_TAG)
    else:
        for _ in range(iters):
            await comm.recv(buf, 0, TAG)
            await comm.send(ack, 0, ACK_TAG)
    return (time.perf_counter() - start) / iters


async def ac_responsiveness(comm: ac.Communicator, nbytes: int) -> float:
    """The longest the loop went without running another task (ms, the worse of both
    ranks) while ``nbytes`` moved from rank 0 to rank 1."""
    buf = fill_array(nbytes, 3)
    gaps = [0.0]
    done = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    await ac_barrier(comm)
    task = asyncio.create_task(ticker())
    if comm.rank == 0:
        await comm.send(buf, 1, TAG)
    else:
        await comm.recv(buf, 0, TAG)
    done = True
    await task
    mine = np.array([max(gaps) * 1e3])
    theirs = np.zeros(1)
    peer = 1 - comm.rank
    await comm.sendrecv(mine, peer, theirs, peer, sendtag=ACK_TAG + 2, recvtag=ACK_TAG + 2)
    return float(max(mine[0], theirs[0]))


@dataclass
class Engine:
    """8 B one-way (half a ping-pong, seconds), repeat by repeat, alternating: asynccomm on
    the link between the two processes, and in rank 0's process alone asynccomm between two
    in-process ranks (the engine with no transport: the same steps of a send and a recv,
    matching, requests, the waiter's wake) and a bare ``Future`` hand-off."""

    iters: int
    link: list[float] = field(default_factory=list)
    in_process: list[float] = field(default_factory=list)
    future: list[float] = field(default_factory=list)


async def measure_engine(comm: ac.Communicator, repeats: int, iters: int) -> Engine:
    """``Engine``'s rows; rank 1 waits in a recv while rank 0 times the engine alone."""
    out = Engine(iters)
    buf = fill_array(8, 1)
    token = np.zeros(1, np.uint8)
    async with ac.open_world(2) as alone:
        c0, c1 = alone.comms
        await p2p.comm_pingpong(c0, c1, 8, max(100, iters // 10))  # warm up
        await ac_pingpong(comm, buf, max(10, iters // 10))
        for _ in range(repeats):
            out.link.append(await ac_pingpong(comm, buf, iters))
            if comm.rank == 0:
                await quiet()  # (the link's poll spins a while after the ping-pong)
                out.in_process.append(await p2p.comm_pingpong(c0, c1, 8, iters))
                out.future.append(await p2p.future_pingpong(iters))
                await comm.send(token, 1, ACK_TAG)
            else:
                await comm.recv(token, 0, ACK_TAG)
    return out


def print_engine(engine: Engine, floor: float, link: str) -> None:
    """``engine``'s table beside the asyncio floor on mpi4py (``floor``, seconds); ``link``
    names the link's row."""
    future = median(engine.future)
    print_table(f"8 B one-way beside the engine alone (median, us; alternating repeat by "
                f"repeat: the ping-pong on {link}, then in rank 0's process two in-process "
                f"ranks and a bare Future hand-off; the asyncio floor on mpi4py from the "
                f"latency table)",
                ["way", "one-way", "x Future hand-off", "x asyncio floor"],
                [[way, f"{t * 1e6:.2f}", f"{t / future:.2f}x", f"{t / floor:.2f}x"]
                 for way, t in ((f"asynccomm, {link}", median(engine.link)),
                                ("asynccomm in-process (no transport)",
                                 median(engine.in_process)),
                                ("asyncio floor on mpi4py", floor),
                                ("Future hand-off", future))])


@dataclass
class Row:
    kind: str
    nbytes: int
    iters: int
    raw: list[float]
    asynccomm: list[float]
    #: The asyncio floor, repeat by repeat: latency rows ``floor_pingpong``'s, bandwidth
    #: rows ``floor_stream``'s.
    floor: list[float] = field(default_factory=list)
    #: A second floor, where a benchmark has one (``shm_p2p``: two processes' copy;
    #: bandwidth rows here: ``matched_stream``'s, the floor of a library that matches).
    floor2: list[float] = field(default_factory=list)

    def raw_median(self) -> float:
        return median(self.raw)

    def ac_median(self) -> float:
        return median(self.asynccomm)


async def measure(comm: ac.Communicator, plan: Plan) -> tuple[list[Row], float]:
    """Both benchmarks, raw, the floor and asynccomm alternating repeat by repeat (raw
    mpi4py blocks the loop while it runs, which is fine: nothing else is in flight; the
    floor waits for asynccomm's progress task to go idle, ``quiet``)."""
    from mpi4py import MPI

    raw = MPI.COMM_WORLD.Dup()
    rows: list[Row] = []
    try:
        for nbytes in plan.latency_sizes:
            buf = fill_array(nbytes, 1)
            iters = plan.iters_for(nbytes, bandwidth=False)
            row = Row("latency", nbytes, iters, [], [])
            raw_pingpong(raw, buf, max(10, iters // 10))  # warm up all three
            await floor_pingpong(raw, buf, max(10, iters // 10))
            await ac_pingpong(comm, buf, max(10, iters // 10))
            for _ in range(plan.repeats):
                row.raw.append(raw_pingpong(raw, buf, iters))
                await quiet()
                row.floor.append(await floor_pingpong(raw, buf, iters))
                row.asynccomm.append(await ac_pingpong(comm, buf, iters))
            rows.append(row)
        ack = np.zeros(1, np.uint8)
        for nbytes in plan.bandwidth_sizes:
            buf = fill_array(nbytes, 2)
            iters = plan.iters_for(nbytes, bandwidth=True)
            row = Row("bandwidth", nbytes, iters, [], [])
            raw_stream(raw, buf, ack, 1)
            await floor_stream(raw, buf, ack, 1)
            await matched_stream(raw, buf, ack, 1)
            await ac_stream(comm, buf, ack, 1)
            for _ in range(plan.repeats):
                row.raw.append(raw_stream(raw, buf, ack, iters))
                await quiet()
                row.floor.append(await floor_stream(raw, buf, ack, iters))
                row.floor2.append(await matched_stream(raw, buf, ack, iters))
                row.asynccomm.append(await ac_stream(comm, buf, ack, iters))
            rows.append(row)
        gap_ms = await ac_responsiveness(comm, plan.responsiveness_bytes)
    finally:
        raw.Free()
    return rows, gap_ms


# -- report ----------------------------------------------------------------------------------


def checks(rows: list[Row]) -> list[dict[str, Any]]:
    """The targets (DESIGN §7): 8 B one-way latency within ``FLOOR_RATIO_TARGET`` of the
    asyncio floor of the same run, bandwidth at the sizes of ``BANDWIDTH_TARGETS``."""
    out: list[dict[str, Any]] = []
    for row in rows:
        if row.kind == "latency" and row.nbytes == 8 and row.floor:
            ratio = row.ac_median() / median(row.floor)
            out.append({"what": "one-way 8 B latency", "value": ratio, "unit": "x floor",
                        "us": row.ac_median() * 1e6,
                        "target": f"<= {FLOOR_RATIO_TARGET:g}x the asyncio floor",
                        "passed": ratio <= FLOOR_RATIO_TARGET})
        need = BANDWIDTH_TARGETS.get(row.nbytes) if row.kind == "bandwidth" else None
        if need is not None:
            ratio = row.raw_median() / row.ac_median()
            out.append({"what": f"bandwidth {size_label(row.nbytes)}", "value": ratio,
                        "unit": "of raw", "target": f">= {need:.0%} of raw",
                        "passed": ratio >= need})
    return out


def _value(c: dict[str, Any]) -> str:
    if c["unit"] == "x floor":
        return f"{c['value']:.2f}x floor ({c['us']:.2f} us)"
    return f"{c['value']:.1%}"


def print_report(rows: list[Row], judged: list[dict[str, Any]], env: dict[str, Any],
                 loop: str, quick: bool) -> None:
    print(f"asynccomm {env['asynccomm']} on MPI ({env['mpi']}), 2 processes, loop {loop}"
          f"{' (--quick)' if quick else ''}; load average {env['loadavg_1min']}")
    lat = [[size_label(r.nbytes), f"{r.raw_median() * 1e6:.2f}",
            f"{median(r.floor) * 1e6:.2f}", f"{r.ac_median() * 1e6:.2f}",
            f"{r.ac_median() / r.raw_median():.2f}x", f"{r.ac_median() / median(r.floor):.2f}x"]
           for r in rows if r.kind == "latency"]
    print_table("One-way latency (half ping-pong, median, us; asyncio floor: a task polling "
                "one persistent recv and waking a future, the least an asyncio library on "
                "mpi4py can do)",
                ["size", "raw mpi4py", "asyncio floor", "asynccomm", "asynccomm/raw",
                 "asynccomm/floor"], lat)
    def share(base: list[float], r: Row) -> str:
        return f"{median(base) / r.ac_median():.1%}" if base else "-"

    bw = [[size_label(r.nbytes), f"{r.nbytes / r.raw_median() / 1e9:.2f}",
           f"{r.nbytes / median(r.floor) / 1e9:.2f}" if r.floor else "-",
           f"{r.nbytes / median(r.floor2) / 1e9:.2f}" if r.floor2 else "-",
           f"{r.nbytes / r.ac_median() / 1e9:.2f}", f"{r.raw_median() / r.ac_median():.1%}",
           share(r.floor, r), share(r.floor2, r),
           f"{r.raw_median() / median(r.floor):.1%}" if r.floor else "-",
           f"{r.raw_median() / median(r.floor2):.1%}" if r.floor2 else "-"]
          for r in rows if r.kind == "bandwidth"]
    print_table("Bandwidth (one-way, median, GB/s; asyncio floor: raw mpi4py's blocking "
                "sends, each rank waiting for what it receives as the latency's floor waits: "
                "a task polling a persistent recv, its waiter resumed a turn of the loop later; "
                "matched floor: the same where each message is announced and its data's recv "
                "posted when the announcement lands, the least a library that matches "
                "messages as MPI does can do)",
                ["size", "raw mpi4py", "asyncio floor", "matched floor", "asynccomm",
                 "of raw", "of floor", "of matched", "floor/raw", "matched/raw"], bw)
    print_table("Targets (MPI transport)", ["check", "value", "target", "status"],
                [[c["what"], _value(c), c["target"], "PASS" if c["passed"] else "FAIL"]
                 for c in judged])
    print(f"\n{sum(c['passed'] for c in judged)}/{len(judged)} targets met")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return launched_args("mpi_p2p", __doc__, "few sizes and iterations", "mpi_p2p.json", argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = Plan.make(args.quick)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() != 2:
        if MPI.COMM_WORLD.Get_rank() == 0:
            print("run with exactly 2 processes: mpiexec -n 2 python -m benchmarks.mpi_p2p",
                  file=sys.stderr)
        return 2
    stamp = datetime.datetime.now(datetime.UTC)
    env = mpi_environment()
    started = time.perf_counter()

    async def bench(comm: ac.Communicator) -> tuple[list[Row], float, Engine]:
        rows, gap_ms = await measure(comm, plan)
        return rows, gap_ms, await measure_engine(comm, plan.repeats, plan.latency_iters)

    os.environ["ASYNCCOMM_TRANSPORT"] = "mpi"  # this measures the MPI link
    rows, gap_ms, engine = ac.run(bench, loop=args.loop, backend="mpi")
    if MPI.COMM_WORLD.Get_rank() != 0:
        return 0
    elapsed = time.perf_counter() - started
    env["loadavg_1min_at_end"] = load_average()
    judged = checks(rows)
    with printed() as report:
        print_report(rows, judged, env, args.loop, args.quick)
        floor = median(next(r.floor for r in rows if r.kind == "latency" and r.nbytes == 8))
        print_engine(engine, floor, "MPI")
        print(f"\nloop responsiveness: while {size_label(plan.responsiveness_bytes)} moved, "
              f"the longest any rank's loop went without running another task was "
              f"{gap_ms:.2f} ms")
    doc = {"suite": "mpi_p2p", "schema": 1, "timestamp": stamp.isoformat(timespec="seconds"),
           "quick": args.quick, "loop": args.loop, "elapsed_seconds": elapsed,
           "environment": env, "rows": [asdict(r) for r in rows], "engine": asdict(engine),
           "checks": judged,
           "responsiveness": {"nbytes": plan.responsiveness_bytes, "max_gap_ms": gap_ms},
           "targets_met": sum(c["passed"] for c in judged), "targets_judged": len(judged),
           "report": report.getvalue()}
    write_json(args.out, "mpi_p2p.json", doc, started)
    return 1 if not args.quick and not all(c["passed"] for c in judged) else 0


if __name__ == "__main__":
    sys.exit(main())
