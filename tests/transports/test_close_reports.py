"""What a close says: a peer that failed is reported as failed, with its error (one that
returned, as closed), and the messages a rank closes without receiving are counted in a
``p2p.dropped`` warning while their senders see the same on every transport (a send still
waiting for the receiver fails, one the receiver had staged completed).  In-process here,
and on MPI through ``mpi_close_runner``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog

import asynccomm as ac

from .environments import mpi_env

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"
BIG = ac.EAGER_LIMIT + 1  # bytes: a send that waits for its recv




async def _fails_inside(comm: ac.Communicator) -> None:
    async with comm:
        raise ValueError("boom")


async def test_a_peer_that_failed_is_reported_failed_with_its_error() -> None:
    async with asyncio.timeout(10), ac.open_world(2) as world:
        c0, c1 = world.comms
        recv = asyncio.ensure_future(c0.recv(np.zeros(2), 1))
        await asyncio.sleep(0)  # (posted)
        with pytest.raises(ValueError, match="boom"):
            await _fails_inside(c1)
        with pytest.raises(ac.CommBrokenError) as info:
            await recv
        with pytest.raises(ac.CommBrokenError, match="rank 1 failed with ValueError: boom"):
            await c0.recv(np.zeros(2), 1)  # posted after: the same
        with pytest.raises(ac.CommBrokenError, match="rank 1 failed with ValueError: boom"):
            await c0.send(np.zeros(2), 1)
    assert str(info.value) == "rank 1 failed with ValueError: boom"
    assert isinstance(info.value.__cause__, ValueError)


async def test_a_peer_that_failed_inside_a_collective_is_reported_failed() -> None:
    async with asyncio.timeout(10), ac.open_world(2) as world:
        c0, c1 = world.comms
        sub0, sub1 = await asyncio.gather(c0.split(0), c1.split(0))
        assert sub0 is not None and sub1 is not None
        reduce = asyncio.ensure_future(sub0.allreduce(np.ones(4)))
        await asyncio.sleep(0)
        with pytest.raises(ValueError):
            async with c1:  # its sub-communicator and private contexts say it too
                raise ValueError("boom in a collective")
        with pytest.raises(ac.CommBrokenError) as info:
            await reduce
    assert str(info.value).startswith("rank 1 failed with ValueError: boom in a collective")


async def test_a_peer_that_returned_is_reported_closed() -> None:
    async with asyncio.timeout(10), ac.open_world(2) as world:
        c0, c1 = world.comms
        recv = asyncio.ensure_future(c0.recv(np.zeros(2), 1))
        await asyncio.sleep(0)
        async with c1:
            pass
        with pytest.raises(ac.CommBrokenError) as info:
            await recv
    assert str(info.value) == "rank 1 has closed its communicator"
    assert info.value.__cause__ is None


async def test_a_close_reports_what_it_dropped_and_the_sender_hears_alike(
        restore_structlog: None) -> None:
    with structlog.testing.capture_logs() as logs:
        async with asyncio.timeout(10), ac.open_world(2) as world:
            c0, c1 = world.comms
            await c0.send(np.zeros(2), 1, tag=3)  # staged: the send completes
            await c0.send(np.zeros(2), 1, tag=3)
            big = c0.isend(np.zeros(BIG, np.uint8), 1, tag=4)  # waits for its recv
            await c1.aclose()
            with pytest.raises(ac.CommBrokenError) as info:
                await big
    assert str(info.value) == "rank 1 closed its communicator before receiving this message"
    dropped = [e for e in logs if e["event"] == "p2p.dropped"]
    assert dropped == [_dropped_event(rank=1)], logs


def _dropped_event(rank: int) -> dict[str, Any]:
    return {"event": "p2p.dropped", "log_level": "warning", "rank": rank, "size": 2,
            "messages": 3, "nbytes": 32 + BIG, "communicator": "world",
            "by_source_tag": [{"source": 0, "tag": 3, "messages": 2, "nbytes": 32},
                              {"source": 0, "tag": 4, "messages": 1, "nbytes": BIG}]}


# -- on MPI ---------------------------------------------------------------------------------

def _mpi(case: str) -> subprocess.CompletedProcess[str]:
    env = mpi_env()
    return subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-m",
                           "tests.transports.mpi_close_runner", case], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=90, check=False)


mpi = pytest.mark.skipif(not MPIEXEC.exists() or ac.launched_by_mpi(),
                         reason="needs mpiexec (and starts it itself)")


@mpi
@pytest.mark.parametrize(("case", "said"), [
    ("failed", "rank 0: recv: rank 1 failed with ValueError: boom"),
    ("failed_in_collective", "rank 0: allreduce: rank 1 failed with ValueError: boom in a "
     "collective"),
    ("returned", "rank 0: recv: rank 1 has closed its communicator"),
])
def test_on_mpi_a_peer_that_failed_is_reported_failed(case: str, said: str) -> None:
    proc = _mpi(case)
    assert said in proc.stdout.splitlines(), proc.stdout + proc.stderr


@mpi
def test_on_mpi_a_close_reports_what_it_dropped_and_the_sender_hears_alike() -> None:
    proc = _mpi("dropped")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert ("rank 0: large send: rank 1 closed its communicator before receiving this "
            "message") in lines, proc.stdout
    event = _dropped_event(rank=1)
    del event["log_level"]
    shown = " ".join(f"{k}={v!r}" for k, v in sorted(event.items()))  # the runner's way
    assert shown in lines, proc.stdout


async def test_a_peer_cancelled_inside_its_block_is_reported_cancelled() -> None:
    async with asyncio.timeout(10), ac.open_world(2) as world:
        c0, c1 = world.comms

        async def rank_1() -> None:
            async with c1:
                await asyncio.get_running_loop().create_future()  # until cancelled

        task = asyncio.ensure_future(rank_1())
        recv = asyncio.ensure_future(c0.recv(np.zeros(2), 1))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(ac.CommBrokenError, match="^rank 1 was cancelled$"):
            await recv
