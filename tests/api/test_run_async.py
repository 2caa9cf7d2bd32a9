"""``ac.run`` refuses a running loop clearly; ``ac.run_async`` is ``run`` on that loop."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

import asynccomm as ac
from asynccomm.sim.loop import new_virtual_loop
from tests.transports.test_mpi import MPIEXEC, _output, mpiexec


async def _ring(comm: ac.Communicator) -> float:
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    out, incoming = np.full(4, float(comm.rank)), np.empty(4)
    await comm.sendrecv(out, right, incoming, left)
    return float(incoming[0])


async def test_run_inside_a_running_loop_names_run_async_and_leaks_no_coroutine() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match=r"await ac\.run_async\(main, world_size"):
            ac.run(_ring, 2)
        with pytest.raises(RuntimeError, match="run_async"):
            ac.run(_ring, 2, backend="mpi")  # refused before MPI is touched
        gc.collect()
    assert [str(w.message) for w in caught] == []


async def test_run_async_returns_every_rank_result_in_rank_order() -> None:
    async with asyncio.timeout(10):
        assert await ac.run_async(_ring, 4) == [3.0, 0.0, 1.0, 2.0]
        assert await ac.run_async(_ring, world_size=2, eager_limit=8) == [1.0, 0.0]


async def test_run_async_raises_one_failure_with_its_rank() -> None:
    async def main(comm: ac.Communicator) -> None:
        if comm.rank == 1:
            raise KeyError("boom")
        await comm.recv(np.zeros(1), 1)  # would wait forever: cancelled

    async with asyncio.timeout(10):
        with pytest.raises(KeyError) as info:
            await ac.run_async(main, 3)
    assert "(raised on rank 1)" in info.value.__notes__


async def test_run_async_raises_an_exception_group_for_several_failures() -> None:
    async def main(comm: ac.Communicator) -> None:
        if comm.rank:
            raise ValueError(f"rank {comm.rank}")

    async with asyncio.timeout(10):
        with pytest.raises(ExceptionGroup) as info:
            await ac.run_async(main, 3)
    assert sorted(str(e) for e in info.value.exceptions) == ["rank 1", "rank 2"]


_DEADLOCK = """
import asyncio, numpy as np, asynccomm as ac

async def main(comm):
    await comm.recv(np.zeros(4), 1 - comm.rank, tag=0)

async def outer():
    try:
        await ac.run_async(main, 2)
    except ac.DeadlockError as exc:
        print(exc)

asyncio.run(outer())
"""


def test_run_async_proves_a_deadlock() -> None:
    # In a process of its own: the proof needs a loop on which nothing else can wake a
    # rank (a test's asyncio.timeout is such a timer), so the bound is the subprocess's.
    proc = subprocess.run([sys.executable, "-c", _DEADLOCK], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "wait-for cycle: rank 0 waits for 1" in proc.stdout


async def test_run_async_refuses_what_cannot_apply_on_a_running_loop() -> None:
    with pytest.raises(TypeError, match="loop= is for ac.run"):
        await ac.run_async(_ring, 2, loop="asyncio")
    cluster = ac.Cluster.preset("ascend910b")
    for kwargs in ({"cluster": cluster}, {"clock": "virtual"}):
        with pytest.raises(ValueError, match=r"clock='wall'.*ac\.run\(main, n"):
            await ac.run_async(_ring, 2, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="async function"):
        await ac.run_async(lambda comm: None, 2)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="needs world_size"):
        await ac.run_async(_ring)
    async with asyncio.timeout(10):  # and nothing was left behind: it runs after them
        assert await ac.run_async(_ring, 2, cluster=cluster, clock="wall",
                                  time_scale=1e-3) == [1.0, 0.0]


def test_run_async_keeps_the_virtual_clock_on_the_virtual_loop() -> None:
    async def main(comm: ac.Communicator) -> float:
        await _ring(comm)
        return asyncio.get_running_loop().time()

    async def outer() -> list[float]:
        result: list[float] = await ac.run_async(main, 2,
                                                 cluster=ac.Cluster.preset("ascend910b"))
        return result

    with asyncio.Runner(loop_factory=new_virtual_loop) as runner:
        times = runner.run(outer())
    assert len(times) == 2 and all(t > 0 for t in times)  # modelled time went by


@pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec is not installed in the venv")
@pytest.mark.skipif(ac.launched_by_mpi(), reason="this test starts mpiexec itself")
def test_run_async_under_mpi_runs_this_rank_on_the_running_loop() -> None:
    proc = mpiexec(2, "-m", "tests.api.mpi_run_async_runner", limit=60)
    assert proc.returncode == 0, _output(proc)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted((d["rank"], d["value"], d["error"], d["why"]) for d in lines) == [
        (0, 1.0, "CommBrokenError", True), (1, 0.0, "KeyError", True)]
