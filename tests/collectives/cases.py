"""What the collective tests share: environments, inputs that reduce exactly in any order,
one call of any collective, and numpy's answer for it."""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

import asynccomm as ac
from asynccomm._collectives import functions as coll
from asynccomm._collectives.algorithms import ALGORITHMS
from asynccomm._collectives.ops import ReduceOp
from asynccomm.sim import DeviceSpec, LinkSpec
from asynccomm.sim.loop import new_virtual_loop

#: Seconds (wall or model) any one test program may take before it fails as hung.
LIMIT = 30.0

T = TypeVar("T")

#: Every message takes 0.3 s of model time: a ring allreduce of 4 ranks takes ~1.8 s.
SLOW = ac.Cluster(nodes=1, devices_per_node=8, intra=LinkSpec("slow", 1e9, 0.3), inter=None,
                  device=DeviceSpec("dev", 1e12, 1 << 34, 1e12), name="slow")


def virtual(size: int, body: Callable[[ac.World], Awaitable[T]],
            cluster: ac.Cluster | None = None, limit: float | None = 60.0) -> T:
    """``body(world)`` on the virtual clock, bounded by ``limit`` model seconds (None: by
    the virtual loop's deadlock detection, which a pending timer would defeat)."""
    async def main() -> T:
        async with asyncio.timeout(limit), ac.open_world(size, cluster, "virtual") as world:
            return await body(world)

    with asyncio.Runner(loop_factory=new_virtual_loop) as runner:
        return runner.run(main())


ENVIRONMENTS: dict[str, dict[str, Any]] = {
    "uvloop": {"loop": "uvloop"},
    "asyncio": {"loop": "asyncio"},
    "virtual": {"clock": "virtual"},
    "ascend910b": {"cluster": ac.Cluster.preset("ascend910b")},
}

REDUCING = {"reduce", "allreduce", "reduce_scatter"}
ROOTED = {"bcast", "reduce", "gather", "scatter"}
DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
          "float32", "float64", "complex64", "complex128", "bool"]


def bounded(program: Callable[[ac.Communicator], Awaitable[Any]],
            limit: float = LIMIT) -> Callable[[ac.Communicator], Awaitable[Any]]:
    async def run(comm: ac.Communicator) -> Any:
        async with asyncio.timeout(limit):
            return await program(comm)

    return run


@dataclass(frozen=True)
class Case:
    """One call: ``collective`` with ``algorithm`` on blocks of ``shape`` and ``dtype``."""

    collective: str
    algorithm: str
    shape: tuple[int, ...] = (5,)
    dtype: str = "int32"
    op: str = "sum"
    root: int = 0
    in_place: bool = False
    tag: int = 0


def data(case: Case, rank: int, size: int) -> np.ndarray[Any, Any]:
    """Rank ``rank``'s input: small values, so that every dtype reduces exactly in any order
    (products of ones and twos; sums of at most nine twos)."""
    shape = (size, *case.shape) if case.collective in {"reduce_scatter", "alltoall",
                                                      "scatter"} else case.shape
    rng = np.random.default_rng([rank, size, len(case.shape), sum(case.shape)])
    values = rng.integers(0, 3, size=shape)
    if case.op == "prod":
        values = 1 + (values > 1)
    if case.dtype == "bool":
        values = values > 0
    return np.ascontiguousarray(values.astype(case.dtype))


def expected(case: Case, rank: int, size: int) -> np.ndarray[Any, Any] | None:
    """What ``rank``'s output must be (None: no output on this rank)."""
    inputs = [data(case, r, size) for r in range(size)]
    c = case.collective
    if c == "barrier":
        return None
    if c in REDUCING:
        ufunc = ReduceOp(case.op).ufunc
        total = functools.reduce(lambda a, b: ufunc(a, b), inputs)
        if c == "reduce":
            return total if rank == case.root else None
        return total if c == "allreduce" else total[rank]
    if c == "bcast":
        return inputs[case.root]
    if c == "allgather":
        return np.stack(inputs)
    if c == "gather":
        return np.stack(inputs) if rank == case.root else None
    if c == "scatter":
        return inputs[case.root][rank]
    assert c == "alltoall"
    return np.stack([inputs[j][rank] for j in range(size)])


async def call(comm: ac.Communicator, case: Case,
               **options: Any) -> np.ndarray[Any, Any] | None:
    """Run ``case`` on this rank and return its output (None where it has none)."""
    r, p, c = comm.rank, comm.size, case.collective
    x = data(case, r, p)
    choose = options.pop("choose", lambda names, nbytes, size: case.algorithm)
    kw: dict[str, Any] = {"tag": case.tag, "choose": choose, **options}
    if c == "barrier":
        await coll.barrier(comm, **kw)
        return None
    if c == "bcast":
        buf = x if r == case.root else np.zeros_like(x)
        await coll.bcast(comm, buf, case.root, **kw)
        return buf
    if c == "reduce":
        out = x if case.in_place else np.empty_like(x)
        await coll.reduce(comm, x, out if r == case.root else None, case.op, case.root, **kw)
        return out if r == case.root else None
    if c == "allreduce":
        if case.in_place:
            await coll.allreduce(comm, x, None, case.op, **kw)
            return x
        out = np.empty_like(x)
        await coll.allreduce(comm, x, out, case.op, **kw)
        return out
    if c == "allgather":
        out = np.empty((p, *x.shape), x.dtype)
        send = out[r, ...] if case.in_place else x
        send[...] = x
        await coll.allgather(comm, send, out, **kw)
        return out
    if c == "reduce_scatter":
        out = np.empty(x.shape[1:], x.dtype)
        await coll.reduce_scatter(comm, x, out, case.op, **kw)
        return out
    if c == "gather":
        out = np.empty((p, *x.shape), x.dtype)
        await coll.gather(comm, x, out if r == case.root else None, case.root, **kw)
        return out if r == case.root else None
    if c == "scatter":
        out = np.empty(x.shape[1:], x.dtype)
        await coll.scatter(comm, x if r == case.root else None, out, case.root, **kw)
        return out
    assert c == "alltoall"
    out = np.empty_like(x)
    await coll.alltoall(comm, x, out, **kw)
    return out


async def call_method(comm: ac.Communicator, case: Case) -> np.ndarray[Any, Any] | None:
    """``call`` through the communicator's methods (its private context and tags), naming
    the case's algorithm where the collective has a choice."""
    r, p, c = comm.rank, comm.size, case.collective
    x = data(case, r, p)
    algo: dict[str, Any] = {"algorithm": case.algorithm} if len(ALGORITHMS[c]) > 1 else {}
    if c == "barrier":
        await comm.barrier()
        return None
    if c == "bcast":
        buf = x if r == case.root else np.zeros_like(x)
        await comm.bcast(buf, case.root)
        return buf
    if c == "reduce":
        out = x if case.in_place else np.empty_like(x)
        await comm.reduce(x, out if r == case.root else None, case.op, case.root)
        return out if r == case.root else None
    if c == "allreduce":
        if case.in_place:
            await comm.allreduce(x, None, case.op, **algo)
            return x
        out = np.empty_like(x)
        await comm.allreduce(x, out, case.op, **algo)
        return out
    if c == "allgather":
        out = np.empty((p, *x.shape), x.dtype)
        send = out[r, ...] if case.in_place else x
        send[...] = x
        await comm.allgather(send, out, **algo)
        return out
    if c == "reduce_scatter":
        out = np.empty(x.shape[1:], x.dtype)
        await comm.reduce_scatter(x, out, case.op, **algo)
        return out
    if c == "gather":
        out = np.empty((p, *x.shape), x.dtype)
        await comm.gather(x, out if r == case.root else None, case.root, **algo)
        return out if r == case.root else None
    if c == "scatter":
        out = np.empty(x.shape[1:], x.dtype)
        await comm.scatter(x if r == case.root else None, out, case.root, **algo)
        return out
    assert c == "alltoall"
    out = np.empty_like(x)
    await comm.alltoall(x, out)
    return out


def report_on_mpi(failures: list[str], summary: Callable[[int], str]) -> int:
    """Sum the failures of every MPI rank; rank 0 prints ``summary(failed)``; each rank
    prints its own failures.  The exit status: 1 if any rank failed."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    failed = int(world.allreduce(len(failures)))
    if world.Get_rank() == 0:
        sys.stdout.write(summary(failed) + "\n")
    for line in failures:
        sys.stdout.write(line + "\n")
    return 1 if failed else 0


def check(case: Case, rank: int, size: int, got: np.ndarray[Any, Any] | None) -> None:
    want = expected(case, rank, size)
    if want is None:
        assert got is None
        return
    assert got is not None
    assert got.shape == want.shape and got.dtype == want.dtype, (case, rank, got, want)
    assert got.tobytes() == want.tobytes(), (case, rank, got, want)


def all_cases() -> list[Case]:
    return [Case(c, a) for c, algos in ALGORITHMS.items() for a in algos]
