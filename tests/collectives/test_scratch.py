"""The collectives' scratch pool (``_collectives.scratch``): repeated large calls fault no
fresh pages in, a call that raises never gives its scratch back, calls in flight at once
never share it, and the pool keeps within its cap; on every in-process environment."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asynccomm as ac
from asynccomm._collectives import scratch as _scratch
from asynccomm._collectives.algorithms import ALGORITHMS
from asynccomm._collectives.scratch import MIN_POOLED, ScratchPool

from ..transports.environments import ENVIRONMENTS, run_world
from .cases import LIMIT

ENVS = sorted(ENVIRONMENTS)
COLLECTIVES = ["allgather", "allreduce", "alltoall", "reduce_scatter", "bcast", "gather",
               "scatter", "reduce"]
#: Elements (int64) of each rank's large buffer: 4 MiB, as large calls in programs are.
LARGE = (4 << 20) // 8


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


def _call(comm: ac.Communicator, name: str, send: Any, out: Any, root: Any,
          algorithm: str | None = None, **kw: Any) -> Any:
    """The call (it takes its place, its tags, now: ``_comm.collective_api``)."""
    algo = {} if algorithm is None else {"algorithm": algorithm}
    if name == "allgather":
        return comm.allgather(send, out, **algo, **kw)
    if name == "allreduce":
        return comm.allreduce(send, out, **algo, **kw)
    if name == "alltoall":
        return comm.alltoall(send, out, **kw)
    if name == "reduce_scatter":
        return comm.reduce_scatter(send, out, **algo, **kw)
    if name == "bcast":
        return comm.bcast(out, root, **kw)
    if name == "gather":
        return comm.gather(send, out, root, **algo, **kw)
    if name == "scatter":
        return comm.scatter(send, out, root, **algo, **kw)
    return comm.reduce(send, out, "sum", root, **kw)


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


# -- what the pool hands out -----------------------------------------------------------------

class Spy:
    """Every buffer each pool hands out and takes back; fails at once if a buffer is handed
    out while another call holds it."""

    def __init__(self) -> None:
        self.taken: list[tuple[ScratchPool, np.ndarray]] = []
        self.out: dict[int, np.ndarray] = {}  # by id: held by a call now
        self.took: asyncio.Event | None = None  # set at each buffer handed out

    @contextmanager
    def watching(self) -> Iterator[Spy]:
        take, give = ScratchPool.take, ScratchPool.give
        spy = self

        def spied_take(pool: ScratchPool, nbytes: int) -> np.ndarray:
            buf = take(pool, nbytes)
            assert id(buf) not in spy.out, "a buffer handed out twice at once"
            spy.out[id(buf)] = buf
            spy.taken.append((pool, buf))
            if spy.took is not None:
                spy.took.set()
            return buf

        def spied_give(pool: ScratchPool, bufs: list[np.ndarray]) -> None:
            for buf in bufs:
                assert spy.out.pop(id(buf), None) is buf, "given back, never handed out"
            give(pool, bufs)

        with patch.object(ScratchPool, "take", spied_take), \
                patch.object(ScratchPool, "give", spied_give):
            yield self

    def since(self, mark: int, pool: ScratchPool) -> list[np.ndarray]:
        return [b for p, b in self.taken[mark:] if p is pool]


def _held_by(pool: ScratchPool, bufs: list[np.ndarray]) -> bool:
    ids = {id(b) for b in pool.held()}
    return any(id(b) in ids for b in bufs)


FAILURES = ["timeout", "cancel", "mismatch"]


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("how", FAILURES)
@pytest.mark.parametrize("name", ["allreduce", "allgather", "reduce_scatter", "bcast"])
def test_a_failed_call_never_gives_its_scratch_back(env: str, how: str, name: str) -> None:
    """A call that times out, is cancelled or meets a block of another size leaves its
    scratch out of the pool: the next call gets other arrays, and computes right."""
    n = 48 << 10  # int64s per block: every scratch array is pooled
    f = 1 if name == "bcast" else 0  # the rank watched (bcast's root takes no scratch)
    spy = Spy()

    async def body(world: ac.World) -> None:
        dups = await asyncio.gather(*(c.dup() for c in world.comms))
        await asyncio.gather(*(_one(c, name, n) for c in world.comms))  # the pool is warm
        pool = _scratch.pool_of(world.comms[f])
        assert pool is not None and pool.kept > 0
        mark = len(spy.taken)

        async def failing(comm: ac.Communicator) -> None:
            send, shape, want, root = _case(name, 2, comm.rank, n)
            out = _outputs(name, comm, shape, want)
            if how == "timeout":  # the other rank never calls
                if comm.rank == f:
                    with pytest.raises(ac.CommTimeoutError):
                        await _call(comm, name, send, out, root, timeout=0.5)
            elif how == "cancel":
                if comm.rank == f:
                    spy.took = asyncio.Event()
                    task = asyncio.ensure_future(_call(comm, name, send, out, root))
                    await spy.took.wait()  # the call is under way: it took its scratch
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
            else:  # rank 1's blocks are one element short
                if comm.rank == 1:
                    send, shape, want, root = _case(name, 2, 1, n - 1)
                    out = _outputs(name, comm, shape, want)
                with pytest.raises(ac.AsyncCommError):  # (a bcast's root: its timeout)
                    await _call(comm, name, send, out, root, timeout=1.0)

        await asyncio.gather(*(failing(d) for d in dups))
        failed = spy.since(mark, pool)
        assert failed, "the failing call took no scratch"
        assert not _held_by(pool, failed)
        mark = len(spy.taken)
        await asyncio.gather(*(_one(c, name, n, seed=1) for c in world.comms))
        later = spy.since(mark, pool)
        assert later and not {id(b) for b in later} & {id(b) for b in failed}
        assert not _held_by(pool, failed)

    with spy.watching():
        run_world(env, 2, lambda world: asyncio.wait_for(body(world), LIMIT))


CALLS_OF = st.tuples(st.integers(0, 2), st.sampled_from(COLLECTIVES),
                     st.integers(MIN_POOLED // 8 // 2, 3 * MIN_POOLED // 8), st.integers(0, 9))


@settings(max_examples=30, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(env=st.sampled_from(ENVS), size=st.integers(2, 4),
       calls=st.lists(CALLS_OF, min_size=2, max_size=8), data=st.data())
def test_concurrent_calls_never_share_scratch(env: str, size: int,
                                              calls: list[tuple[int, str, int, int]],
                                              data: st.DataObject) -> None:
    """Collectives in flight at once on three communicators of the same ranks (the world
    and two dups), each rank starting them in an order and at moments of its own: no array
    is handed to two calls at once, and every result is exact."""
    starts = [data.draw(st.permutations(range(len(calls))), label=f"rank {r} order")
              for r in range(size)]
    pauses = [data.draw(st.lists(st.integers(0, 3), min_size=len(calls), max_size=len(calls)),
                        label=f"rank {r} pauses") for r in range(size)]
    algorithms = [data.draw(st.sampled_from(sorted(ALGORITHMS[name])), label="algorithm")
                  for _, name, _, _ in calls]
    spy = Spy()

    async def rank(comm: ac.Communicator) -> None:
        a, b = await comm.dup(), await comm.dup()
        comms = [comm, a, b]
        made = []
        for (which, name, n, seed), algo in zip(calls, algorithms, strict=True):
            send, shape, want, root = _case(name, size, comm.rank, n, seed)
            out = _outputs(name, comm, shape, want)
            algorithm = algo if name not in ("alltoall", "bcast", "reduce") else None
            made.append((_call(comms[which], name, send, out, root, algorithm), out, want))

        async def run(i: int) -> None:
            for _ in range(pauses[comm.rank][i]):
                await asyncio.sleep(0)
            await made[i][0]

        await asyncio.gather(*(asyncio.ensure_future(run(i)) for i in starts[comm.rank]))
        for _, out, want in made:
            assert out is None or np.array_equal(out, want)

    with spy.watching():
        run_world(env, size, lambda world: asyncio.wait_for(
            asyncio.gather(*(rank(c) for c in world.comms)), LIMIT))
    assert not spy.out  # every call succeeded: every array went back


# -- the cap --------------------------------------------------------------------------------

def test_the_pool_keeps_within_its_cap() -> None:
    """Buffers go back up to the cap; past it the least recently given sizes go, and one
    larger than the cap is never kept; ``take`` returns a kept buffer of the exact size."""
    pool = ScratchPool(10 << 20)
    a, b, c = pool.take(4 << 20), pool.take(4 << 20), pool.take(3 << 20)
    pool.give([a, b])
    assert pool.kept == 8 << 20
    pool.give([c])  # 11 MiB > 10: one of the 4 MiB ones (the older size) goes
    assert pool.kept == 7 << 20 and pool.kept <= pool.capacity
    assert pool.take(3 << 20) is c
    big = pool.take(11 << 20)
    pool.give([big])
    assert all(x is not big for x in pool.held()) and pool.kept == 4 << 20
    assert pool.take(1 << 20) is not None and pool.kept == 4 << 20  # another size: fresh
    pool.clear()
    assert pool.kept == 0 and not pool.held()


@pytest.mark.parametrize("env", ENVS)
def test_calls_keep_the_pool_within_its_cap_and_closing_empties_it(env: str) -> None:
    """Calls of many sizes on a rank whose pool is capped at 1 MiB: it never keeps more,
    results stay exact, and the world's close empties the pool."""
    cap = 1 << 20
    pools: list[ScratchPool] = []

    async def body(world: ac.World) -> None:
        for comm in world.comms:
            comm.device._scratch = ScratchPool(cap)
            pools.append(comm.device._scratch)
        for i, n in enumerate([16 << 10, 40 << 10, 100 << 10, 16 << 10, 70 << 10, 200 << 10]):
            for name in ("allreduce", "allgather"):
                await asyncio.gather(*(_one(c, name, n, seed=i) for c in world.comms))
                assert all(p.kept <= cap for p in pools)
        assert all(p.kept > 0 for p in pools)

    run_world(env, 2, lambda world: asyncio.wait_for(body(world), LIMIT))
    assert all(p.kept == 0 and not p.held() for p in pools)
