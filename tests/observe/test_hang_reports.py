"""Hang reports and dumps name what a rank is stuck in: the collective, its algorithm,
its step and the peer it waits on; ops of sub-communicators and private contexts are
counted and shown under their communicator."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import IO

import numpy as np
import pytest

import asynccomm as ac

LOOPS = ["asyncio", "uvloop"]
ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).with_name("mpiexec")


#: What a rank stuck in the first step of an allreduce on 2 ranks waits for (the
#: algorithm and its tag are the library's choice).
STEP_1 = (r"inside allreduce \(\w+\), tags 0\.\.4095, step 1, waiting on rank {peer} "
          r"\(recv tag \d+\)")


@pytest.mark.parametrize("loop", LOOPS)
def test_the_watchdog_names_the_collective_its_step_and_peer(
        loop: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ASYNCCOMM_HANG_TIMEOUT", "0.3")

    async def main(comm: ac.Communicator) -> float:
        x = np.ones(4)
        if comm.rank == 0:
            await asyncio.sleep(1.0)  # not provably stuck: the watchdog speaks
        await comm.allreduce(x)
        return float(x[0])

    assert ac.run(main, 2, loop=loop) == [2.0, 2.0]
    err = capsys.readouterr().err
    assert "rank 1: 1 pending op(s)" in err, err
    assert "the private context (collectives, objects): 1 pending op(s)" in err
    assert re.search(STEP_1.format(peer=0), err), err


@pytest.mark.parametrize("loop", LOOPS)
def test_the_watchdog_shows_a_sub_communicators_ops_under_it(
        loop: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ASYNCCOMM_HANG_TIMEOUT", "0.3")

    async def main(comm: ac.Communicator) -> None:
        sub = await comm.split(0, key=-comm.rank)  # ranks reversed there
        buf = np.zeros(2)
        if comm.rank == 0:
            await asyncio.sleep(1.0)
            await sub.send(buf, 0, tag=4)
        else:
            await sub.recv(buf, 1, tag=4)

    ac.run(main, 2, loop=loop)
    err = capsys.readouterr().err
    assert ("rank 1: 1 pending op(s)" in err and "  on a sub-communicator, as its rank 0 of 2: "
            "1 pending op(s)\n  pending  recv src=1 tag=4" in err), err


@pytest.mark.parametrize("loop", LOOPS)
def test_a_deadlock_inside_a_collective_names_it(loop: str) -> None:
    async def main(comm: ac.Communicator) -> None:
        if comm.rank == 0:
            await comm.recv(np.zeros(2), 1, tag=1)
        else:
            await comm.allreduce(np.ones(4))

    with pytest.raises(ac.DeadlockError) as info:
        ac.run(main, 2, loop=loop)
    text = str(info.value)
    assert re.search("rank 1: " + STEP_1.format(peer=0), text), text
    assert "rank 1: 1 pending op(s)" in text


_STUCK_IN_A_COLLECTIVE = textwrap.dedent("""
    import asyncio, sys
    import numpy as np
    import asynccomm as ac

    async def main(comm):
        sub = await comm.split(0)
        if comm.rank == 0:
            task = asyncio.ensure_future(sub.allreduce(np.ones(4)))
            await asyncio.sleep(0)
            print("ready", flush=True)
            await task
        else:
            await asyncio.get_running_loop().create_future()  # never: not provable

    ac.run(main, 2, loop=sys.argv[1])
""")


def _read_lines(stream: IO[str], n: int) -> list[str]:
    """Up to ``n`` lines of ``stream``, those that come within 10 s."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(stream.readline() for _ in range(n)),
                              daemon=True)
    reader.start()
    reader.join(10.0)
    return lines + [""] * (n - len(lines))


@pytest.mark.parametrize("loop", LOOPS)
def test_ctrl_c_and_sigusr1_name_a_collective_on_a_sub_communicator(loop: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _STUCK_IN_A_COLLECTIVE, loop],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGUSR1)
        assert proc.stderr is not None
        lines = _read_lines(proc.stderr, 4)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    _, _, interrupted = err.partition("interrupted; every rank's pending ops")
    assert "flight record (SIGUSR1)" in lines.pop(0)
    assert "rank 0: 1 pending op(s)" in lines[0], err
    assert ("the private context (collectives, objects), on a sub-communicator, as its "
            "rank 0 of 2: 1 pending op(s)") in lines[1], err
    assert re.search(STEP_1.format(peer=1), lines[2]), err
    assert "rank 0: 1 pending op(s)" in interrupted, err
    assert re.search(STEP_1.format(peer=1), interrupted), err


_MPI_STUCK_IN_A_COLLECTIVE = textwrap.dedent("""
    import asyncio, os, signal
    import numpy as np
    import asynccomm as ac

    async def main(comm):
        buf = np.zeros(2)
        if comm.rank == 0:  # never joins the allreduce: waits for rank 1 to give up
            await comm.recv(buf, 1, tag=1, timeout=30.0)
            return
        task = asyncio.ensure_future(comm.allreduce(np.ones(4), timeout=2.0))
        await asyncio.sleep(0)  # (posted)
        os.kill(os.getpid(), signal.SIGUSR1)  # a dump, and on
        try:
            await task
        except ac.CommTimeoutError:
            await comm.send(buf, 0, tag=1)

    ac.run(main)
""")


@pytest.mark.skipif(not MPIEXEC.exists(), reason="needs mpiexec")
def test_an_mpi_dump_names_the_collective() -> None:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-c",
                           _MPI_STUCK_IN_A_COLLECTIVE], capture_output=True, text=True,
                          timeout=60, env=env, cwd=ROOT)
    err = proc.stderr
    assert "flight record (SIGUSR1)" in err and "rank 1: 1 pending op(s)" in err, err
    assert re.search(STEP_1.format(peer=0), err), err
    assert proc.returncode == 0, err


# -- the first warning: a line in seconds, not a report in minutes --------------------------

_MPI_DEADLOCK_FOR_A_WHILE = textwrap.dedent("""
    import numpy as np
    import asynccomm as ac

    async def main(comm):
        try:  # rank 0 in an allreduce, rank 1 waiting for a message: neither can move
            if comm.rank == 0:
                await comm.allreduce(np.ones(4), timeout=3.0)
            else:
                await comm.recv(np.zeros(2), 0, tag=1, timeout=3.0)
        except (ac.CommTimeoutError, ac.CommBrokenError):  # (or the other gave up first)
            pass
        return "ok"

    print(ac.run(main))
""")


@pytest.mark.skipif(not MPIEXEC.exists(), reason="needs mpiexec")
def test_an_mpi_deadlock_is_named_in_seconds_and_each_rank_asks_the_other() -> None:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "ASYNCCOMM_HANG_WARN": "0.5"}
    proc = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-c",
                           _MPI_DEADLOCK_FOR_A_WHILE], capture_output=True, text=True,
                          timeout=60, env=env, cwd=ROOT)
    err = proc.stderr
    assert proc.returncode == 0 and proc.stdout.split() == ["ok", "ok"], err
    # one line each, long before the watchdog's limit (300 s by default) ...
    assert re.search(r"rank 1: no op finished for \d\.\d s \(ASYNCCOMM_HANG_WARN\); waiting on: "
                     r"recv\(src=0, tag=1\)\n", err), err
    assert re.search(r"rank 0: no op finished for \d\.\d s \(ASYNCCOMM_HANG_WARN\); waiting on: "
                     + STEP_1.format(peer=1).removeprefix("inside ")
                     + r" \[the private context \(collectives, objects\)\]\n", err), err
    # ... and what the other rank says it waits for
    assert "rank 0 asked rank 1, which it waits for; rank 1 says:" in err, err
    assert "rank 1 asked rank 0, which it waits for; rank 0 says:" in err, err
    assert "ASYNCCOMM_HANG_TIMEOUT" not in err  # the full report only at its limit


def test_the_first_warning_in_process(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ASYNCCOMM_HANG_WARN", "0.3")

    async def main(comm: ac.Communicator) -> None:
        buf = np.zeros(2)
        if comm.rank == 0:
            await asyncio.sleep(1.0)  # not provably stuck
            await comm.send(buf, 1, tag=3)
        else:
            await comm.recv(buf, 0, tag=3)

    ac.run(main, 2)
    err = capsys.readouterr().err
    assert err.count("(ASYNCCOMM_HANG_WARN)") == 1, err  # once per stall
    assert "rank 1: no op finished for" in err and "waiting on: recv(src=0, tag=3)\n" in err


def test_a_bad_first_warning_delay_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCOMM_HANG_WARN", "soon")

    async def main(comm: ac.Communicator) -> None:
        pass

    with pytest.raises(ValueError, match="ASYNCCOMM_HANG_WARN"):
        ac.run(main, 2)
