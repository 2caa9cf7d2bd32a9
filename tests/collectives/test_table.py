"""Every collective with every algorithm at world sizes 1 to 9, checked exactly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm._collectives import functions as coll

from .cases import ENVIRONMENTS, Case, all_cases, bounded, call, check

CASES = all_cases()


def program(cases: list[Case]) -> Any:
    async def main(comm: ac.Communicator) -> list[np.ndarray[Any, Any] | None]:
        out = []
        for i, case in enumerate(cases):
            root = (i * 7) % comm.size  # roots other than 0 too
            case = Case(case.collective, case.algorithm, root=root, tag=i * 4096)
            out.append(await call(comm, case))
        return out

    return main


@pytest.mark.parametrize("env", ["uvloop", "asyncio", "ascend910b"])
@pytest.mark.parametrize("size", range(1, 10))
def test_every_algorithm_at_every_size(size: int, env: str) -> None:
    results = ac.run(bounded(program(CASES)), world_size=size, **ENVIRONMENTS[env])
    for i, case in enumerate(CASES):
        case = Case(case.collective, case.algorithm, root=(i * 7) % size, tag=i * 4096)
        for rank in range(size):
            check(case, rank, size, results[rank][i])


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling"])
def test_allreduce_gives_the_same_bits_on_every_rank(algorithm: str) -> None:
    """Floats that round differently in different orders still agree on every rank."""
    async def main(comm: ac.Communicator) -> bytes:
        rng = np.random.default_rng(comm.rank)
        x = (rng.standard_normal(1001) * 10.0 ** rng.integers(-8, 8, 1001)).astype(np.float32)
        await coll.allreduce(comm, x, tag=0, choose=lambda names, n, s: algorithm)
        return x.tobytes()

    for size in (3, 6, 7):
        results = ac.run(bounded(main), world_size=size)
        assert len(set(results)) == 1


@pytest.mark.parametrize("shape", [(), (0,), (3,)])
def test_in_place_forms(shape: tuple[int, ...]) -> None:
    """MPI's in-place forms: sendbuf is recvbuf's own row (allgather, gather at the root),
    recvbuf is sendbuf's own row (reduce_scatter, scatter at the root)."""
    async def main(comm: ac.Communicator) -> None:
        p, r = comm.size, comm.rank
        rows = np.stack([np.full(shape, i + 1, np.int64) for i in range(p)])
        out = np.zeros((p, *shape), np.int64)
        out[r, ...] = rows[r]
        await coll.allgather(comm, out[r, ...], out, tag=0)
        assert (out == rows).all()
        out = np.zeros((p, *shape), np.int64)
        out[r, ...] = rows[r]
        await coll.gather(comm, out[r, ...], out, root=p - 1, tag=0)
        assert r != p - 1 or (out == rows).all()
        send = rows * (r + 1)
        await coll.reduce_scatter(comm, send, send[r, ...], tag=0)
        assert (send[r] == rows[r] * p * (p + 1) // 2).all()
        send = rows.copy()
        await coll.scatter(comm, send if r == 0 else None, send[r, ...], root=0, tag=0)
        assert (send[r] == rows[r]).all()

    for size in (1, 3, 4):
        ac.run(bounded(main), world_size=size)
