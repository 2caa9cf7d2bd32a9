"""Hangs on the wall clock: deadlocks proven in-process, cases that are not proven, the
watchdog, and the dumps on Ctrl-C and SIGUSR1."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import asynccomm as ac

LOOPS = ["asyncio", "uvloop"]
ROOT = Path(__file__).resolve().parents[2]


async def _both_recv_first(comm: ac.Communicator) -> None:
    buf = np.zeros(4)
    await comm.recv(buf, 1 - comm.rank, tag=0)
    await comm.send(buf, 1 - comm.rank, tag=0)


@pytest.mark.parametrize("loop", LOOPS)
def test_the_readme_deadlock_raises_within_two_seconds(loop: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(ac.DeadlockError) as info:
        ac.run(_both_recv_first, 2, loop=loop)
    assert time.perf_counter() - t0 < 2.0
    text = str(info.value)
    assert info.value.pending == {0: ["recv(src=1, tag=0)"], 1: ["recv(src=0, tag=0)"]}
    assert ("wait-for cycle: rank 0 waits for 1 on tag 0 (recv), rank 1 waits for 0 on "
            "tag 0 (recv)") in text
    assert "rank 1: 1 pending op(s)" in text and "pending  recv src=0 tag=0 32 B" in text


@pytest.mark.parametrize("loop", LOOPS)
def test_a_deadlock_through_tasks_gathers_and_streams_is_proven(loop: str) -> None:
    async def main(comm: ac.Communicator) -> None:
        peer = 1 - comm.rank
        s = comm.stream()
        big = np.zeros(ac.EAGER_LIMIT, np.uint8) if comm.rank else np.zeros(1)

        async def sender() -> None:
            await comm.send(np.zeros(ac.EAGER_LIMIT + 1, np.uint8), peer, tag=5, stream=s)

        async def receiver() -> None:
            await comm.recv(big, peer, tag=9)

        await asyncio.gather(asyncio.create_task(sender()), receiver())

    with pytest.raises(ac.DeadlockError, match="wait-for cycle: rank 0 waits for 1"):
        ac.run(main, 2, loop=loop)


def _late_sender(wait):  # type: ignore[no-untyped-def]
    """Rank 0 waits on something that is not asynccomm's, then sends: no deadlock."""
    async def main(comm: ac.Communicator) -> float:
        buf = np.arange(4.0)
        if comm.rank == 0:
            await wait()
            await comm.send(buf, 1)
            return 0.0
        await comm.recv(buf, 0)
        return float(buf[-1])
    return main


async def _sleep() -> None:
    await asyncio.sleep(0.5)


async def _thread() -> None:
    await asyncio.to_thread(time.sleep, 0.5)


async def _user_future() -> None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.call_later(0.5, fut.set_result, None)
    await fut


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("wait", [_sleep, _thread, _user_future])
def test_a_rank_awaiting_anything_else_is_not_a_deadlock(loop: str, wait) -> None:  # type: ignore[no-untyped-def]
    assert ac.run(_late_sender(wait), 2, loop=loop) == [0.0, 3.0]


@pytest.mark.parametrize("loop", LOOPS)
def test_an_armed_timeout_is_not_a_deadlock(loop: str) -> None:
    async def main(comm: ac.Communicator) -> None:
        await comm.recv(np.zeros(1), 1 - comm.rank, timeout=0.5)

    # Both time out: together (a group), or one first and the other is cancelled (its own
    # error), as the loop's timers happen to fire; never a DeadlockError.
    with pytest.raises((ExceptionGroup, ac.CommTimeoutError)) as info:
        ac.run(main, 2, loop=loop)
    errors = info.value.exceptions if isinstance(info.value, ExceptionGroup) else [info.value]
    assert all(type(e) is ac.CommTimeoutError for e in errors)


def test_a_timer_callback_that_will_send_is_not_a_deadlock() -> None:
    # asyncio shows its timers (uvloop does not: see _hang's module docs).
    async def main(comm: ac.Communicator) -> float:
        buf = np.arange(4.0)
        if comm.rank == 0:
            asyncio.get_running_loop().call_later(0.5, comm.isend, buf, 1)
            await comm.recv(np.zeros(1), 1)  # both ranks wait on asynccomm; a timer will send
            return 0.0
        await comm.recv(buf, 0)
        await comm.send(np.zeros(1), 0)
        return float(buf[-1])

    assert ac.run(main, 2, loop="asyncio") == [0.0, 3.0]


def test_the_watchdog_reports_pending_ops_and_keeps_waiting(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ASYNCCOMM_HANG_TIMEOUT", "0.3")

    async def main(comm: ac.Communicator) -> float:
        buf = np.arange(4.0)
        if comm.rank == 0:
            await asyncio.sleep(1.0)  # not provably stuck: the watchdog speaks, nothing fails
            await comm.send(buf, 1, tag=3)
            return 0.0
        await comm.recv(buf, 0, tag=3)
        return float(buf[-1])

    assert ac.run(main, 2) == [0.0, 3.0]
    err = capsys.readouterr().err
    assert "no op finished for" in err and "pending  recv src=0 tag=3" in err


def test_a_bad_hang_timeout_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCOMM_HANG_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="ASYNCCOMM_HANG_TIMEOUT"):
        ac.run(_both_recv_first, 2)


_STUCK = textwrap.dedent("""
    import asyncio, sys
    import numpy as np
    import asynccomm as ac

    async def main(comm):
        if comm.rank == 0:
            req = comm.irecv(np.zeros(2), 1, tag=7)
            print("ready", flush=True)
            await req
        else:
            await asyncio.get_running_loop().create_future()  # never: not provable

    ac.run(main, 2, loop=sys.argv[1])
""")


def _start(loop: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _STUCK, loop], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("loop", LOOPS)
def test_ctrl_c_prints_every_ranks_pending_ops(loop: str) -> None:
    proc = _start(loop)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert "interrupted; every rank's pending ops" in err
    assert "rank 0: 1 pending op(s)" in err and "pending  recv src=1 tag=7 16 B" in err
    assert "rank 1: 0 pending op(s)" in err


def test_sigusr1_dumps_the_flight_record_and_goes_on() -> None:
    proc = _start("uvloop")
    try:
        proc.send_signal(signal.SIGUSR1)
        assert proc.stderr is not None
        lines = [proc.stderr.readline() for _ in range(3)]
        assert "flight record (SIGUSR1)" in lines[0] and "rank 0: 1 pending" in lines[1]
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)


_SLOW_RANK = textwrap.dedent("""
    import asyncio
    import numpy as np
    import asynccomm as ac

    async def main(comm):
        buf = np.arange(4.0)
        if comm.rank == 0:
            await asyncio.sleep(1.5)
            await comm.send(buf, 1, tag=2)
        else:
            await comm.recv(buf, 0, tag=2)
        return float(buf[-1])

    print(ac.run(main))
""")


def _mpiexec_with_watchdog(program: str) -> subprocess.CompletedProcess[str]:
    """``program`` on two MPI processes, with a 0.4 s hang watchdog."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "ASYNCCOMM_HANG_TIMEOUT": "0.4"}
    return subprocess.run([str(Path(sys.executable).with_name("mpiexec")), "-n", "2",
                           sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, env=env, cwd=ROOT)


@pytest.mark.skipif(not Path(sys.executable).with_name("mpiexec").exists(),
                    reason="needs mpiexec")
def test_the_watchdog_watches_each_mpi_rank() -> None:
    proc = _mpiexec_with_watchdog(_SLOW_RANK)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["3.0", "3.0"] or sorted(proc.stdout.split()) == ["3.0"] * 2
    assert "no op finished for" in proc.stderr and "pending  recv src=0 tag=2" in proc.stderr


@pytest.mark.parametrize("loop", LOOPS)
def test_a_deadlock_between_two_ranks_while_a_third_has_finished(loop: str) -> None:
    async def main(comm: ac.Communicator) -> None:
        if comm.rank < 2:
            await _both_recv_first(comm)

    with pytest.raises(ac.DeadlockError) as info:
        ac.run(main, 3, loop=loop)
    assert set(info.value.pending) == {0, 1}


_MPI_SIGNALS = textwrap.dedent("""
    import asyncio, os, signal
    import numpy as np
    import asynccomm as ac

    async def main(comm):
        if comm.rank == 1:
            comm.irecv(np.zeros(2), 0, tag=7)
            os.kill(os.getpid(), signal.SIGUSR1)  # a dump, and on
            os.kill(os.getpid(), signal.SIGINT)  # a dump, and Ctrl-C
            await asyncio.sleep(3600)
        try:
            await comm.recv(np.zeros(1), 1, tag=1)
        except ac.CommBrokenError:
            pass

    ac.run(main)
""")


@pytest.mark.skipif(not Path(sys.executable).with_name("mpiexec").exists(),
                    reason="needs mpiexec")
def test_each_mpi_rank_dumps_its_own_ops_on_a_signal() -> None:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([str(Path(sys.executable).with_name("mpiexec")), "-n", "2",
                           sys.executable, "-c", _MPI_SIGNALS], capture_output=True,
                          text=True, timeout=60, env=env, cwd=ROOT)
    err = proc.stderr
    assert "flight record (SIGUSR1)" in err and "rank 1 interrupted; its pending ops" in err
    assert err.count("pending  recv src=0 tag=7 16 B") == 2, err
    assert "rank 0:" not in err  # each process dumps its own rank only


_WAITING_FOR_EACH_OTHER = textwrap.dedent("""
    import numpy as np
    import asynccomm as ac

    async def main(comm):
        buf = np.zeros(2)
        if comm.rank == 0:
            await comm.recv(buf, 1, tag=1)
        else:
            try:  # waits for rank 0 on the wrong tag, then gives up and sends
                await comm.recv(buf, 0, tag=2, timeout=1.5)
            except ac.CommTimeoutError:
                pass
            await comm.send(buf, 0, tag=1)
        return "ok"

    print(ac.run(main))
""")


@pytest.mark.skipif(not Path(sys.executable).with_name("mpiexec").exists(),
                    reason="needs mpiexec")
def test_an_mpi_watchdog_asks_the_ranks_it_waits_for() -> None:
    proc = _mpiexec_with_watchdog(_WAITING_FOR_EACH_OTHER)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ok", "ok"]
    # rank 0's watchdog asked rank 1, which told it what it was waiting for
    assert ("rank 0 asked rank 1, which it waits for; rank 1 says:\nrank 1: 1 pending op(s)"
            in proc.stderr), proc.stderr
    assert "pending  recv src=0 tag=2" in proc.stderr
