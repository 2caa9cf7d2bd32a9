"""The collectives' scratch pool (``_collectives.scratch``): repeated large calls fault no
fresh pages in, a call that raises never gives its scratch back, calls in flight at once
never share it, and the pool keeps within its cap; on every in-process environment."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asynccomm as ac
from asynccomm._collectives import scratch as _scratch
from asynccomm._collectives.scratch import MIN_POOLED, ScratchPool

from ..transports.environments import ENVIRONMENTS
from .cases import LIMIT

ENVS = sorted(ENVIRONMENTS)
COLLECTIVES = ["allgather", "allreduce", "alltoall", "reduce_scatter", "bcast", "gather",
               "scatter", "reduce"]
#: Elements (int64) of each rank's large buffer: 4 MiB, as large calls in programs are.
LARGE = (4 << 20) // 8


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _case(name: str, p: int, r: int, n: int, seed: int = 0
          ) -> tuple[Any, Any, Any, Any]:
    """Rank ``r``'s arguments of ``name`` on blocks of ``n`` int64s (of ``p`` ranks): its
    send buffer, a new output buffer's shape (None: no output), numpy's answer, the root
    (None: none)."""
    rows = np.arange(p * n, dtype=np.int64).reshape(p, n) * (seed + 1)
    mine = rows[r] + r  # rank r's block
    every = rows + np.arange(p, dtype=np.int64)[:, None]  # every rank's block
    if name == "allgather":
        return mine, (p, n), every, None
    if name == "allreduce":
        return mine, (n,), every.sum(axis=0), None
    if name == "alltoall":
        send = np.arange(p * n, dtype=np.int64).reshape(p, n) + 1000 * r + seed
        want = np.stack([np.arange(r * n, (r + 1) * n) + 1000 * i + seed for i in range(p)])
        return send, (p, n), want, None
    if name == "reduce_scatter":
        return every * (r + 1), (n,), every[r] * sum(range(1, p + 1)), None
    if name == "bcast":
        return None, (n,), every[0], 0
    if name == "gather":
        return mine, (p, n) if r == 0 else None, every, 0
    if name == "scatter":
        return every if r == 0 else None, (n,), every[r], 0
    if name == "reduce":
        return mine, (n,) if r == 0 else None, every.sum(axis=0), 0
    raise AssertionError(name)


def _outputs(name: str, comm: Any, shape: Any, want: Any) -> Any:
    """A new output buffer (bcast: the root's filled with the data)."""
    if shape is None:
        return None
    out = np.full(shape, -1, np.int64)  # written: its pages are in
    if name == "bcast" and comm.rank == 0:
        out[...] = want
    return out


async def _call(comm: ac.Communicator, name: str, send: Any, out: Any, root: Any,
                algorithm: str | None = None, **kw: Any) -> None:
    algo = {} if algorithm is None else {"algorithm": algorithm}
    if name == "allgather":
        await comm.allgather(send, out, **algo, **kw)
    elif name == "allreduce":
        await comm.allreduce(send, out, **algo, **kw)
    elif name == "alltoall":
        await comm.alltoall(send, out, **kw)
    elif name == "reduce_scatter":
        await comm.reduce_scatter(send, out, **algo, **kw)
    elif name == "bcast":
        await comm.bcast(out, root, **kw)
    elif name == "gather":
        await comm.gather(send, out, root, **algo, **kw)
    elif name == "scatter":
        await comm.scatter(send, out, root, **algo, **kw)
    else:
        await comm.reduce(send, out, "sum", root, **kw)


async def _one(comm: ac.Communicator, name: str, n: int, seed: int = 0,
               algorithm: str | None = None, **kw: Any) -> None:
    """One call of ``name`` on blocks of ``n`` int64s per rank, its result checked."""
    send, shape, want, root = _case(name, comm.size, comm.rank, n, seed)
    out = _outputs(name, comm, shape, want)
    await _call(comm, name, send, out, root, algorithm, **kw)
    if out is not None:
        assert np.array_equal(out, want), (name, algorithm, comm.rank)


# -- page faults ---------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("env", ENVS)
def test_repeated_large_calls_fault_no_pages_in(env: str) -> None:
    """After a warm-up, 4 MiB calls of every collective back to back fault (almost) no
    fresh pages in, and every result is right.  In a process of its own whose malloc maps
    every array of 128 KiB or more afresh (glibc's fixed mmap threshold: what the dynamic
    one gives a program that has freed a smaller array since, or trimmed its heap), so the
    count does not depend on what the allocator did before."""
    env_vars = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 << 10), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.collectives.scratch_runner", env],
                          cwd=ROOT, env=env_vars, capture_output=True, text=True,
                          timeout=LIMIT * 4)
    assert done.returncode == 0, done.stderr[-3000:]
    per_call = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(per_call) == sorted(COLLECTIVES)
    many = {name: f for name, f in per_call.items() if f > 8}
    assert not many, f"fresh page faults per call: {many}"
