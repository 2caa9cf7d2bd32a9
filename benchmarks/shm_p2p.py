"""asynccomm's shared-memory link (``backend="processes"``) beside raw mpi4py, in the same
processes: one-way latency and bandwidth at 2 processes, the ring at any count, and idle
ranks.

Run: ``mpiexec -n N .venv/bin/python -m benchmarks.shm_p2p [--quick] [--ring-only] [--loop L]
[--out DIR]`` (``--ring-only``: the ring and its floors alone, for quick comparisons,
written to ``shm_p2p_n<N>_ring.json``).

MPI starts the processes only so that raw mpi4py and the asyncio floor on mpi4py
(``_mpi_floor``) run beside asynccomm, alternating repeat by repeat, as in
``benchmarks.mpi_p2p`` and ``benchmarks.mpi_ring`` (whose measurements these are): the
processes also form a group of the shared-memory link (``transports.shm.Node``), and
asynccomm's worlds open on it, with no MPI underneath.

- At 2 processes: one-way latency (half a ping-pong; 8 B judged against the asyncio floor
  on mpi4py measured in the same run: ``FLOOR_RATIO_TARGET``) and bandwidth
  (``BANDWIDTH_TARGETS``, a share of raw mpi4py's).  Beside the bandwidth, alternating with
  raw mpi4py and asynccomm repeat by repeat, the floor a single copy sets (``copy_stream``):
  one bare ``process_vm_readv`` of the whole message from the sender's buffer, acknowledged
  by a datagram the sender waits for as asynccomm waits (``BANDWIDTH_FLOOR_TARGETS``:
  asynccomm's share of it); and the floor of the copy both processes make at once
  (``pair_stream``, shown, not judged: the receiver reads the first half while the sender
  writes the second, each told of the other's end by a datagram), which asynccomm's copy
  of a message of ``shm.SHARE_MIN`` or more is.  Beside the 8 B latency, alternating
  repeat by repeat (``mpi_p2p.measure_engine``, shown, not judged): the same engine
  between two in-process ranks in rank 0's process (no transport) and a bare ``Future``
  hand-off, so that what the link costs can be told from what the engine's steps cost.
- At every count: the 8 KiB ring (``sendrecv`` to rank+1; per hop, against raw mpi4py's
  ``Sendrecv``: ``RING_RATIO_TARGET``, judged where the ranks outnumber the cores).  Beside
  it, alternating repeat by repeat, the floors of a ring with no library (``_ring_floors``):
  the kernel-wait floor, a datagram per hop that each rank's loop waits for on its socket
  (what a process that sleeps until its peer writes pays at least:
  ``KERNEL_FLOOR_TARGET``, judged where the ranks outnumber the cores), and the yield-spin
  floor, a shared counter looked at with ``sched_yield`` between looks (how MPICH waits).
- Idle: each rank waits in a recv for ``IDLE_SECONDS``; its CPU share over that time
  (``IDLE_CPU_TARGET``) and its wake time, from the sender's clock before ``send`` to the
  receiver's after ``recv``.  Then ``WAKE_ROUNDS`` rounds after ``WAKE_IDLE_SECONDS`` of
  idle each, alternating asynccomm's wake (the same round) with the floor the kernel and
  the loop set (``bare_wake``: a bare datagram for the message, the receiver's loop waiting
  on its socket); per rank, the median of each is judged (``WAKE_TARGET_MS``, and
  ``WAKE_OVER_FLOOR_MS`` over the floor).

Rank 0 prints the tables and writes ``shm_p2p_n<N>.json``.  Exit status: 1 when a full
run missed a target (``--quick`` judges nothing), 0 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import dataclasses
import datetime
import os
import secrets
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import asynccomm as ac
from asynccomm._comm.process_runner import run_rank
from asynccomm.transports import _shm_ring
from asynccomm.transports.shm import SPIN, Node

from . import mpi_p2p, mpi_ring
from ._common import (
    KiB,
    MiB,
    bench_address,
    datagram_socket,
    fill_array,
    launched_args,
    load_average,
    median,
    mpi_environment,
    print_table,
    printed,
    size_label,
    write_json,
)
from ._ring_floors import BareRings

#: One-way 8 B latency: at most this many times the asyncio floor on mpi4py.
FLOOR_RATIO_TARGET = 1.0
#: Bandwidth, as a share of raw mpi4py's, by message size.
BANDWIDTH_TARGETS = {1 * MiB: 1.0, 16 * MiB: 1.0, 256 * MiB: 1.0}
#: The 8 KiB ring's hop: at most this many times raw mpi4py's (ranks outnumbering cores).
RING_RATIO_TARGET = 0.5
#: The same hop: at most this many times the kernel-wait floor measured beside it (ranks
#: outnumbering cores).  Waiting on the kernel alone costs more than ``RING_RATIO_TARGET``
#: allows (about 1.5-1.9x raw mpi4py's hop at 3 and 4 processes on two cores); a link that
#: spins briefly, giving its core away, and sleeps on the kernel when its peer is slow
#: comes near that floor (0.6-1.2x at 3 processes, 1.0-1.8x at 4 here; 2-4x where it
#: always slept).
KERNEL_FLOOR_TARGET = 1.5
RING_BYTES = 8 * KiB
IDLE_SECONDS = 10.0
IDLE_CPU_TARGET = 0.01
WAKE_TARGET_MS = 0.2
#: Bandwidth, as a share of the single-copy floor's (``copy_stream``) measured beside it,
#: by message size.  The floor moves a message with one copy and one datagram; the link
#: adds its announcement and the copy's answer: two small messages (one-way 8 B: ~4 us
#: here) on a 1 MiB copy of ~85 us leave it ~91% at best, so 85%; from 16 MiB on the copy
#: goes in 4 MiB reads, a turn of the loop between two, so 90%.  What a 16 MiB message
#: costs besides its copy (timelines, medians of ~40 messages, three runs): ~16 us from
#: the send to the first read (the offer put on the ring, seen, matched in C, its
#: ``DATA_COPYING`` answered), ~8 us for each turn between two reads, ~28 us from the
#: copy's ``DATA_DONE`` to the 1-byte ack received: ~70 us, ~6% of a ~1.1 ms copy.  No
#: page faults (about 0.1 a message on either rank).  (Where each process has a core of
#: its own, the link's copy of a message of ``shm.SHARE_MIN`` or more is made by both
#: processes at once, so it may beat this floor of one process's copy.)
BANDWIDTH_FLOOR_TARGETS = {1 * MiB: 0.85, 16 * MiB: 0.90, 256 * MiB: 0.90}
#: Rounds of the wake from idle (asynccomm's and the bare datagram's, alternating), and
#: the idle seconds before each.
WAKE_ROUNDS = 5
WAKE_IDLE_SECONDS = 1.0
#: A rank's median wake: at most this many ms over the bare datagram's median.
WAKE_OVER_FLOOR_MS = 0.1


@dataclass
class RingFloors:
    """The ring's floors measured beside it (``_ring_floors``), per repeat: seconds per hop,
    and the CPU seconds per hop of all the ranks together."""

    kernel: list[float] = field(default_factory=list)
    kernel_cpu: list[float] = field(default_factory=list)
    spin: list[float] = field(default_factory=list)
    spin_cpu: list[float] = field(default_factory=list)

    async def measure(self, bare: BareRings, iters: int) -> None:
        """One repeat of each floor, on ``bare``."""
        seconds, cpu = await bare.kernel_ring(iters)
        self.kernel.append(seconds)
        self.kernel_cpu.append(float(bare.raw.allreduce(cpu)))  # outside the timed loops
        seconds, cpu = bare.spin_ring(iters)
        self.spin.append(seconds)
        self.spin_cpu.append(float(bare.raw.allreduce(cpu)))


def join_group(world: Any) -> None:
    """Make the MPI processes of ``world`` a group of the shared-memory link too."""
    group = world.bcast(secrets.token_hex(8) if world.Get_rank() == 0 else None)
    node = Node.join(group, world.Get_rank(), world.Get_size())
    world.Barrier()  # every socket is bound
    node.watch(world.allgather(os.getpid()))


def plans(quick: bool, size: int) -> tuple[mpi_p2p.Plan | None, int, float]:
    """The p2p plan (2 processes only), the ring's repeats, the idle seconds."""
    p2p = None
    if size == 2:
        p2p = (mpi_p2p.Plan((8, 1 * KiB, 64 * KiB), 300, (1 * MiB, 16 * MiB), 3, 16 * MiB,
                            50, 256 * MiB)
               if quick else
               mpi_p2p.Plan((8, 1 * KiB, 8 * KiB, 64 * KiB, 1 * MiB), 5_000,
                            (1 * MiB, 16 * MiB, 256 * MiB), 7, 64 * MiB))
    return p2p, 3 if quick else 7, 0.5 if quick else IDLE_SECONDS


def wake_plan(quick: bool) -> tuple[int, float]:
    """The wake's rounds and the idle seconds before each."""
    return (2, 0.2) if quick else (WAKE_ROUNDS, WAKE_IDLE_SECONDS)


@dataclass
class Wakes:
    """Per rank, its wake times (ms) round by round: asynccomm's and the bare datagram's."""

    idle_seconds: float
    asynccomm: list[list[float]]
    bare: list[list[float]]

    def ac_medians(self) -> list[float]:
        return [median(w) for w in self.asynccomm]

    def bare_medians(self) -> list[float]:
        return [median(w) for w in self.bare]

    def over_floor(self) -> list[float]:
        """Per rank, its median wake less the bare datagram's (ms)."""
        return [a - b for a, b in zip(self.ac_medians(), self.bare_medians(), strict=True)]


async def measure(comm: ac.Communicator, quick: bool, ring_only: bool = False) -> dict[str, Any]:
    """Every figure, or (``ring_only``) the ring and its floors alone."""
    from mpi4py import MPI

    p2p, repeats, idle = plans(quick, comm.size)
    if ring_only:
        p2p = None
    crowded = comm.size > len(os.sched_getaffinity(0))
    out: dict[str, Any] = {}
    if p2p is not None:
        rows, _ = await mpi_p2p.measure(comm, dataclasses.replace(p2p, bandwidth_sizes=()))
        out["p2p"] = rows + await measure_bandwidth(comm, p2p)
        out["engine"] = await mpi_p2p.measure_engine(comm, p2p.repeats, p2p.latency_iters)
    raw = MPI.COMM_WORLD.Dup()
    rings = BareRings(raw, RING_BYTES)
    floors = out["ring_floors"] = RingFloors()

    async def beside(iters: int) -> None:
        await floors.measure(rings, iters)

    try:
        out["ring"] = await mpi_ring.measure_ring(comm, raw, RING_BYTES, repeats, crowded,
                                                  beside)
    finally:
        rings.close()
        raw.Free()
    if not ring_only:
        out["idle"] = await mpi_ring.measure_idle(comm, idle)
        out["wakes"] = await measure_wakes(comm, *wake_plan(quick))
    return out


def copy_stream(comm: Any, buf: np.ndarray[Any, Any], iters: int, pid: int, address: int,
                ack: socket.socket, ack_to: bytes) -> float:
    """As ``mpi_p2p.raw_stream``, for the floor of a single copy: rank 1 copies rank 0's
    ``buf`` (process ``pid``, at ``address``) into its own ``buf`` with bare
    ``process_vm_readv`` calls (one, unless the kernel copies less), then acknowledges it
    with a datagram to ``ack_to``, which rank 0 waits for as asynccomm waits (``wait``)."""
    comm.Barrier()
    start = time.perf_counter()
    if comm.Get_rank() == 0:
        for _ in range(iters):
            wait(ack)
    else:
        view = buf.data
        for _ in range(iters):
            off = 0
            while off < len(view):
                off += _shm_ring.single_copy.readv(pid, view[off:], address + off)
            ack.sendto(b"\0", ack_to)
    return (time.perf_counter() - start) / iters


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)


def _writev(pid: int, local: int, remote: int, nbytes: int) -> None:
    """``process_vm_writev`` of ``nbytes`` from ``local`` here to ``remote`` in ``pid``."""
    libc = _libc
    while nbytes > 0:
        here, there = _Iovec(local, nbytes), _Iovec(remote, nbytes)
        n = libc.process_vm_writev(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)
        if n <= 0:
            raise OSError(ctypes.get_errno(), "process_vm_writev")
        local, remote, nbytes = local + n, remote + n, nbytes - n


def pair_stream(comm: Any, buf: np.ndarray[Any, Any], iters: int, pids: list[int],
                addresses: list[int], socks: list[socket.socket], to: list[bytes]) -> float:
    """The floor of a copy two processes make at once: each message, rank 1 reads the first
    half of rank 0's ``buf`` into its own (``process_vm_readv``) while rank 0 writes the
    second half into rank 1's (``process_vm_writev``); rank 0 says it is done with a
    datagram to ``to[1]``, and rank 1, once both halves are in, acknowledges the message
    with one to ``to[0]``, which rank 0 waits for (``wait``) before the next."""
    comm.Barrier()
    half = len(buf) // 2
    start = time.perf_counter()
    if comm.Get_rank() == 0:
        local = _shm_ring.single_copy.address(buf)
        for _ in range(iters):
            _writev(pids[1], local + half, addresses[1] + half, len(buf) - half)
            socks[0].sendto(b"\0", to[1])
            wait(socks[0])
    else:
        view = buf.data
        for _ in range(iters):
            off = 0
            while off < half:
                off += _shm_ring.single_copy.readv(pids[0], view[off:half], addresses[0] + off)
            wait(socks[1])
            socks[1].sendto(b"\0", to[0])
    return (time.perf_counter() - start) / iters


def wait(sock: socket.socket) -> None:
    """A datagram on ``sock``, waited for as the link waits where a process has a core of
    its own: spinning for ``SPIN``, then asleep in the kernel (rank 0 of ``raw_stream``
    spins in MPI all along, which takes a core from the copy on a loaded machine)."""
    until = time.perf_counter() + SPIN
    while time.perf_counter() < until:
        try:
            sock.recv(1, socket.MSG_DONTWAIT)
            return
        except BlockingIOError:
            pass
    sock.recv(1)


async def measure_bandwidth(comm: ac.Communicator, plan: mpi_p2p.Plan) -> list[mpi_p2p.Row]:
    """``mpi_p2p.measure``'s bandwidth rows, with the single-copy floor (``copy_stream``)
    alternating with raw mpi4py and asynccomm repeat by repeat (``Row.floor``; empty where
    the kernel refuses the copy or the C extension is not built)."""
    from mpi4py import MPI

    raw = MPI.COMM_WORLD.Dup()
    ack = np.zeros(1, np.uint8)
    token = raw.bcast(secrets.token_hex(8))
    ack_to = bench_address(f"ack-{token}")
    to = [ack_to, bench_address(f"half-{token}")]  # (``pair_stream``'s: rank 0's, rank 1's)
    sock = datagram_socket(blocking=True)
    rows = []
    try:
        sock.bind(to[raw.Get_rank()])
        for nbytes in plan.bandwidth_sizes:
            buf = fill_array(nbytes, 2)
            iters = plan.iters_for(nbytes, bandwidth=True)
            row = mpi_p2p.Row("bandwidth", nbytes, iters, [], [])
            where = raw.bcast((os.getpid(), _shm_ring.single_copy.address(buf))
                              if _shm_ring.single_copy is not None else None)
            if where is not None and raw.Get_rank() == 1:
                try:
                    _shm_ring.single_copy.readv(where[0], buf[:1], where[1])
                except OSError:  # (EPERM: not allowed to read the peer's memory)
                    where = None
            where = raw.bcast(where, root=1)  # (and rank 0's socket is bound)
            pair = None
            if where is not None:
                copy_stream(raw, buf, 1, where[0], where[1], sock, ack_to)
                pair = raw.allgather((os.getpid(), _shm_ring.single_copy.address(buf)))
                pids, addresses = [p for p, _ in pair], [a for _, a in pair]
                socks = [sock, sock]
                ok = True
                if raw.Get_rank() == 0:  # (it may be refused to write where rank 1 may read)
                    half = nbytes // 2
                    try:
                        _writev(pids[1], addresses[0] + half, addresses[1] + half, 1)
                    except OSError:
                        ok = False
                pair = pair if all(raw.allgather(ok)) else None
                if pair is not None:
                    pair_stream(raw, buf, 1, pids, addresses, socks, to)
            mpi_p2p.raw_stream(raw, buf, ack, 1)
            await mpi_p2p.ac_stream(comm, buf, ack, 1)
            for _ in range(plan.repeats):
                row.raw.append(mpi_p2p.raw_stream(raw, buf, ack, iters))
                if where is not None:
                    row.floor.append(copy_stream(raw, buf, iters, where[0], where[1], sock,
                                                  ack_to))
                if pair is not None:
                    row.floor2.append(pair_stream(raw, buf, iters, pids, addresses, socks, to))
                row.asynccomm.append(await mpi_p2p.ac_stream(comm, buf, ack, iters))
            rows.append(row)
    finally:
        sock.close()
        raw.Free()
    return rows


async def measure_wakes(comm: ac.Communicator, rounds: int, seconds: float) -> Wakes:
    """``rounds`` rounds of the wake from ``seconds`` idle, asynccomm's
    (``mpi_ring.idle_round``) and the bare datagram's (``bare_wake``) alternating."""
    mine = np.zeros((2, rounds))
    for i in range(rounds):
        mine[0, i] = (await mpi_ring.idle_round(comm, seconds))[1]
        mine[1, i] = await bare_wake(comm, seconds)
    every = np.zeros((comm.size, 2, rounds))
    await comm.allgather(mine, every)
    return Wakes(seconds, every[:, 0].tolist(), every[:, 1].tolist())


async def bare_wake(comm: ac.Communicator, seconds: float) -> float:
    """The floor of the wake from idle: ``mpi_ring.idle_round`` with a bare datagram (the
    sender's clock) for the message, on a socket the receiver's idle loop waits on; this
    rank's wake time in ms, taken after the task awaiting the datagram resumed."""
    loop = asyncio.get_running_loop()
    dest = (comm.rank + 1) % comm.size
    token = np.array([secrets.randbits(62) if comm.rank == 0 else 0], dtype=np.int64)
    await comm.bcast(token, 0)

    def address(rank: int) -> bytes:
        return bench_address(f"wake-{int(token[0]):x}-{rank}")

    sock = datagram_socket()
    got: asyncio.Future[float] = loop.create_future()

    def readable() -> None:
        loop.remove_reader(sock.fileno())
        got.set_result(float(sock.recv(64)))

    try:
        sock.bind(address(comm.rank))
        loop.add_reader(sock.fileno(), readable)
        await comm.barrier()  # every socket is bound
        await asyncio.sleep(seconds)
        if comm.rank == 0:
            await asyncio.sleep(mpi_ring.SEND_MARGIN)
            sock.sendto(repr(mpi_ring.monotonic()).encode(), address(dest))
        stamp = await got
        wake_ms = (mpi_ring.monotonic() - stamp) * 1e3
        if comm.rank != 0:
            await asyncio.sleep(seconds)
            sock.sendto(repr(mpi_ring.monotonic()).encode(), address(dest))
        # The barrier's messages wait till the next rank is awake: they would wake it too,
        # and its loop, busy with the link, would take the datagram late.
        await asyncio.sleep(mpi_ring.SEND_MARGIN)
        await comm.barrier()  # no socket closes while a datagram is on its way to it
        return wake_ms
    finally:
        if not got.done():
            loop.remove_reader(sock.fileno())
        sock.close()


def checks(result: dict[str, Any], crowded: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for row in result.get("p2p", []):
        if row.kind == "latency" and row.nbytes == 8:
            ratio = row.ac_median() / median(row.floor)
            out.append({"what": "one-way 8 B latency", "value": ratio, "unit": "x floor",
                        "us": row.ac_median() * 1e6, "raw_ratio": row.ac_median()
                        / row.raw_median(),
                        "target": f"<= {FLOOR_RATIO_TARGET:g}x the asyncio floor on mpi4py",
                        "passed": ratio <= FLOOR_RATIO_TARGET, "binding": True})
        need = BANDWIDTH_TARGETS.get(row.nbytes) if row.kind == "bandwidth" else None
        if need is not None:
            ratio = row.raw_median() / row.ac_median()
            out.append({"what": f"bandwidth {size_label(row.nbytes)}", "value": ratio,
                        "unit": "of raw", "target": f">= {need:.0%} of raw mpi4py",
                        "passed": ratio >= need, "binding": True})
        floor = BANDWIDTH_FLOOR_TARGETS.get(row.nbytes) if row.kind == "bandwidth" else None
        if floor is not None and row.floor:
            share = median(row.floor) / row.ac_median()
            out.append({"what": f"bandwidth {size_label(row.nbytes)}, of the single copy",
                        "value": share, "unit": "of floor",
                        "floor_of_raw": row.raw_median() / median(row.floor),
                        "target": f">= {floor:.0%} of the single-copy floor",
                        "passed": share >= floor, "binding": True})
    ring = result["ring"]
    out.append({"what": f"{size_label(ring.nbytes)} ring hop", "value": ring.ratio(),
                "unit": "x raw", "target": f"<= {RING_RATIO_TARGET:g}x raw mpi4py"
                + ("" if crowded else " (judged only with more ranks than cores)"),
                "passed": ring.ratio() <= RING_RATIO_TARGET, "binding": crowded})
    floors = result.get("ring_floors")
    if floors is not None and floors.kernel:
        ratio = median(ring.asynccomm) / median(floors.kernel)
        out.append({"what": f"{size_label(ring.nbytes)} ring hop, against the kernel",
                    "value": ratio, "unit": "x kernel floor",
                    "target": f"<= {KERNEL_FLOOR_TARGET:g}x the kernel-wait floor"
                    + ("" if crowded else " (judged only with more ranks than cores)"),
                    "passed": ratio <= KERNEL_FLOOR_TARGET, "binding": crowded})
    idle = result.get("idle")
    if idle is None:  # (--ring-only)
        return out
    out.append({"what": "idle rank's CPU", "value": max(idle.cpu_share), "unit": "of a core",
                "target": f"<= {IDLE_CPU_TARGET:.0%} of a core",
                "passed": max(idle.cpu_share) <= IDLE_CPU_TARGET, "binding": True})
    wakes = result.get("wakes")
    wake = max(wakes.ac_medians() if wakes is not None else idle.wake_ms)
    out.append({"what": "wake from idle", "value": wake, "unit": "ms",
                "target": f"<= {WAKE_TARGET_MS:g} ms", "passed": wake <= WAKE_TARGET_MS,
                "binding": True})
    if wakes is not None:
        over = max(wakes.over_floor())
        out.append({"what": "wake from idle, over its floor", "value": over,
                    "unit": "ms over floor",
                    "target": f"<= the bare datagram's + {WAKE_OVER_FLOOR_MS:g} ms",
                    "passed": over <= WAKE_OVER_FLOOR_MS, "binding": True})
    return out


def _value(c: dict[str, Any]) -> str:
    if c["unit"] == "x floor":
        return f"{c['value']:.2f}x floor ({c['us']:.2f} us; {c['raw_ratio']:.2f}x raw)"
    if c["unit"] in ("of raw", "of a core"):
        return f"{c['value']:.1%}"
    if c["unit"] == "ms":
        return f"{c['value']:.3f} ms"
    if c["unit"] == "of floor":
        return f"{c['value']:.1%} (floor: {c['floor_of_raw']:.1%} of raw)"
    if c["unit"] == "ms over floor":
        return f"{c['value']:+.3f} ms"
    return f"{c['value']:.2f}x"


def print_report(result: dict[str, Any], judged: list[dict[str, Any]], env: dict[str, Any],
                 size: int, loop: str, quick: bool) -> None:
    print(f"asynccomm {env['asynccomm']} on shared memory ({size} processes, atomics: "
          f"{'C' if _shm_ring.NATIVE else 'libatomic'}), beside {env['mpi']}, loop {loop}"
          f"{' (--quick)' if quick else ''}; load average {env['loadavg_1min']}")
    rows = result.get("p2p", [])
    if rows:
        print_table("One-way latency (half ping-pong, median, us)",
                    ["size", "raw mpi4py", "asyncio floor", "asynccomm shm", "shm/raw",
                     "shm/floor"],
                    [[size_label(r.nbytes), f"{r.raw_median() * 1e6:.2f}",
                      f"{median(r.floor) * 1e6:.2f}", f"{r.ac_median() * 1e6:.2f}",
                      f"{r.ac_median() / r.raw_median():.2f}x",
                      f"{r.ac_median() / median(r.floor):.2f}x"]
                     for r in rows if r.kind == "latency"])
        print_table("Bandwidth (one-way, median, GB/s; single-copy floor: one bare "
                    "process_vm_readv of the message, acknowledged by a datagram waited for "
                    "as asynccomm waits; two-process floor: half of it read by the "
                    "receiver while the sender writes the other half, bare, as asynccomm "
                    "copies from 256 KiB)",
                    ["size", "raw mpi4py", "single-copy floor", "two-process floor",
                     "asynccomm shm", "of raw", "of floor", "floor/raw", "of two-process"],
                    [[size_label(r.nbytes), f"{r.nbytes / r.raw_median() / 1e9:.2f}",
                      f"{r.nbytes / median(r.floor) / 1e9:.2f}" if r.floor else "-",
                      f"{r.nbytes / median(r.floor2) / 1e9:.2f}" if r.floor2 else "-",
                      f"{r.nbytes / r.ac_median() / 1e9:.2f}",
                      f"{r.raw_median() / r.ac_median():.1%}",
                      f"{median(r.floor) / r.ac_median():.1%}" if r.floor else "-",
                      f"{r.raw_median() / median(r.floor):.1%}" if r.floor else "-",
                      f"{median(r.floor2) / r.ac_median():.1%}" if r.floor2 else "-"]
                     for r in rows if r.kind == "bandwidth"])
    engine = result.get("engine")
    if engine is not None:
        floor = median(next(r.floor for r in rows if r.kind == "latency" and r.nbytes == 8))
        mpi_p2p.print_engine(engine, floor, "shared memory")
    print_ring(result)
    idle = result.get("idle")
    if idle is not None:
        print_idle(result, idle, size, quick)
    print_targets(judged)


def print_idle(result: dict[str, Any], idle: Any, size: int, quick: bool) -> None:
    """The idle ranks' table."""
    wakes = result.get("wakes")
    none = ["-"] * len(idle.wake_ms)
    ac_ms, bare_ms, over = ((f"{a:.3f}" for a in wakes.ac_medians()),
                            (f"{b:.3f}" for b in wakes.bare_medians()),
                            (f"{d:+.3f}" for d in wakes.over_floor())) if wakes else (none,) * 3
    rounds = f"{len(wakes.asynccomm[0])} after {wakes.idle_seconds:g} s idle" if wakes else "-"
    print_table(f"Idle ranks (CPU share and first wake: each waits in a recv, "
                f"{plans(quick, size)[2]:g} s or more; wakes: median of {rounds}, asynccomm's "
                "and the floor's alternating; floor: a bare datagram waking the loop)",
                ["rank", "CPU share", "wake, first (ms)", "wake (ms)", "floor: bare wake (ms)",
                 "over floor (ms)"],
                [[r, f"{c:.2%}", f"{w:.3f}", a, b, d]
                 for r, (c, w, a, b, d) in enumerate(zip(idle.cpu_share, idle.wake_ms, ac_ms,
                                                         bare_ms, over, strict=True))])


def print_targets(judged: list[dict[str, Any]]) -> None:
    print_table("Targets (shared-memory link)", ["check", "value", "target", "status"],
                [[c["what"], _value(c), c["target"],
                  ("PASS" if c["passed"] else "FAIL") if c["binding"] else
                  f"({'pass' if c['passed'] else 'miss'}, not judged)"] for c in judged])
    print(f"\n{sum(c['passed'] for c in judged if c['binding'])}/"
          f"{sum(c['binding'] for c in judged)} targets met")


def print_ring(result: dict[str, Any]) -> None:
    """The ring's table: asynccomm beside raw mpi4py, the asyncio floor on mpi4py and the
    floors with no library (where measured)."""
    ring = result["ring"]
    floors = result.get("ring_floors") or RingFloors()
    kernel = median(floors.kernel) if floors.kernel else float("nan")
    ways = [("raw mpi4py (Sendrecv)", ring.raw, ring.raw_cpu),
            ("asyncio floor on mpi4py", ring.floor, ring.floor_cpu),
            ("kernel-wait floor (datagram, loop)", floors.kernel, floors.kernel_cpu),
            ("yield-spin floor (shared counter)", floors.spin, floors.spin_cpu),
            ("asynccomm shm", ring.asynccomm, ring.asynccomm_cpu)]
    print_table(f"Ring {size_label(ring.nbytes)}, {ring.iters} hops a repeat (per hop, "
                "median, us; CPU: all ranks, per hop)",
                ["way", "hop", "x raw", "x kernel floor", "CPU"],
                [[name, f"{median(hops) * 1e6:.1f}", f"{median(hops) / median(ring.raw):.2f}x",
                  f"{median(hops) / kernel:.2f}x", f"{median(cpu) * 1e6:.1f}" if cpu else "-"]
                 for name, hops, cpu in ways if hops])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return launched_args("shm_p2p", __doc__, "few sizes and iterations", "shm_p2p_n<N>.json", argv,
                         [("--ring-only", "the ring and its floors alone (no latency, bandwidth, "
                           "idle ranks or wakes): quick runs to compare two builds")])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    size = world.Get_size()
    if size < 2:
        print("run with 2 or more processes: mpiexec -n 2 python -m benchmarks.shm_p2p",
              file=sys.stderr)
        return 2
    stamp = datetime.datetime.now(datetime.UTC)
    env = mpi_environment()
    started = time.perf_counter()
    crowded = size > (env["cpus_usable"] or env["cpu_count"] or 1)
    # The idle ranks wait 10 s on purpose: no hang warning (its dumps would wake them).
    os.environ.setdefault("ASYNCCOMM_HANG_WARN", "0")
    join_group(world)

    async def bench(comm: ac.Communicator) -> dict[str, Any]:
        return await measure(comm, args.quick, args.ring_only)

    result = run_rank(bench, args.loop, {"eager_limit": ac.EAGER_LIMIT,
                                         "pool_bytes": 64 * MiB, "timeout": None})
    if world.Get_rank() != 0:
        return 0
    elapsed = time.perf_counter() - started
    env["loadavg_1min_at_end"] = load_average()
    env["atomics"] = "C" if _shm_ring.NATIVE else "libatomic"
    judged = checks(result, crowded)
    with printed() as report:
        print_report(result, judged, env, size, args.loop, args.quick)
    doc = {"suite": "shm_p2p", "schema": 1, "timestamp": stamp.isoformat(timespec="seconds"),
           "quick": args.quick, "loop": args.loop, "processes": size,
           "elapsed_seconds": elapsed, "environment": env,
           "p2p": [asdict(r) for r in result.get("p2p", [])],
           "engine": asdict(result["engine"]) if "engine" in result else None,
           "ring": asdict(result["ring"]),
           "ring_floors": asdict(result["ring_floors"]),
           "idle": asdict(result["idle"]) if "idle" in result else None,
           "wakes": asdict(result["wakes"]) if "wakes" in result else None,
           "checks": judged,
           "targets_met": sum(c["passed"] for c in judged if c["binding"]),
           "targets_judged": sum(c["binding"] for c in judged),
           "report": report.getvalue()}
    # (The ring alone is written apart: the full figures' file stays whole.)
    write_json(args.out, f"shm_p2p_n{size}{'_ring' if args.ring_only else ''}.json", doc,
               started)
    missed = any(c["binding"] and not c["passed"] for c in judged)
    return 1 if missed and not args.quick else 0


if __name__ == "__main__":
    sys.exit(main())
