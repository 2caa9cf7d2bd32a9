"""Objects never lost, duplicated or hung: timeouts, cancellation, ``recv_new`` and a
rank failing mid-object, in-process (both loops, the virtual clock) and on MPI (the
cases are ``objects_cases.py``'s SPMD programs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import asynccomm as ac

from ..transports.environments import mpi_env
from .objects_cases import CASES, ENVS, FAILING

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"
#: Seconds a run in a subprocess may take before it fails as hung.
LIMIT = 60.0


def _env() -> dict[str, str]:
    return mpi_env()


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(cmd), cwd=ROOT, env=_env(), capture_output=True, text=True,
                              timeout=LIMIT, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd[-3:])} hung for {LIMIT} s:\n{exc.stdout!r}\n{exc.stderr!r}")


def _output(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


@pytest.mark.parametrize("env", list(ENVS))
@pytest.mark.parametrize("case", list(CASES))
def test_object_case(case: str, env: str) -> None:
    from tests.transports.contract import bounded

    ac.run(bounded(CASES[case], 20.0), world_size=2, **ENVS[env])


@pytest.mark.parametrize("env", list(ENVS))
@pytest.mark.parametrize("case", list(FAILING))
def test_a_rank_failing_mid_object_fails_the_run_at_once(case: str, env: str) -> None:
    """The run raises the failed rank's error alone, and its peer's object finishes or
    fails with CommBrokenError: it never waits for the rank that is gone (a subprocess,
    so that a hang fails the test)."""
    proc = _run(sys.executable, "-m", "tests.engine.objects_cases", "--env", env, case)
    assert proc.returncode == 0, _output(proc)
    line = proc.stdout.strip()
    assert line.startswith(f"{case}: raised Boom: rank 1 fails"), _output(proc)
    assert line.endswith(("rank 0 CommBrokenError", "rank 0 sent")), _output(proc)


mpi = [pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec is not installed in the venv "
                          "(pip install -e '.[mpi]')"),
       pytest.mark.skipif(ac.launched_by_mpi(), reason="this test starts mpiexec itself")]


@pytest.mark.parametrize("x", [None], ids=["mpi"])
@mpi[0]
@mpi[1]
def test_object_cases_on_mpi(x: None) -> None:
    proc = _run(str(MPIEXEC), "-n", "2", sys.executable, "-m", "tests.engine.objects_cases")
    assert proc.returncode == 0, _output(proc)
    assert sorted(proc.stdout.split()) == sorted(
        w for name in CASES for w in ("ok", name)), _output(proc)


@pytest.mark.parametrize("case", ["fail_before_no_timeout", "fail_after_no_timeout"])
@mpi[0]
@mpi[1]
def test_a_rank_failing_mid_object_ends_the_mpi_job(case: str) -> None:
    """Under mpiexec the failed rank's error ends the job, which does not hang."""
    proc = _run(str(MPIEXEC), "-n", "2", sys.executable, "-m", "tests.engine.objects_cases",
                case)
    assert "rank 1 fails" in proc.stdout + proc.stderr, _output(proc)


POOL = 64 * 1024


async def _flood(comm: ac.Communicator) -> int:
    """Rank 0 posts 48 objects of two small arrays each (their buffers eager) before rank
    1 receives any; rank 1 returns the peak of bytes staged in its pools."""
    n = 48
    if comm.rank == 0:
        reqs = [comm.isend_obj({"i": i, "a": np.full(1000, i, np.uint8),
                                "b": np.full(3000, i, np.uint8)}, 1, 1) for i in range(n)]
        await comm.send(np.zeros(1), 1, 2)  # only now does rank 1 start receiving
        await ac.wait_all(reqs)
        return 0
    await comm.recv(np.zeros(1), 0, 2)
    for i in range(n):
        obj, _ = await comm.recv_obj(0, 1)
        assert obj["i"] == i and (obj["a"] == i).all() and (obj["b"] == i).all()
    pools = {id(e.pool): e.pool for e in (comm._engine, comm._private()._engine)}
    return sum(p.statistics().peak_bytes for p in pools.values())


@pytest.mark.parametrize("env", list(ENVS))
def test_staged_objects_respect_the_pool_bound(env: str) -> None:
    """An object's header and its buffers are staged in the rank's one pool: however many
    objects wait, what they stage stays within ``pool_bytes`` (the rest waits at its
    sender), and every object arrives whole."""
    from tests.transports.contract import bounded

    peak = ac.run(bounded(_flood, 20.0), world_size=2, pool_bytes=POOL, **ENVS[env])[1]
    assert 0 < peak <= POOL



@pytest.mark.parametrize("env", list(ENVS))
def test_a_deadlock_on_an_objects_buffers_is_proven_and_named(env: str) -> None:
    """The deadlock proof follows a task awaiting an object to the object's own task: the
    world fails with DeadlockError, which names the object's pending buffer (a
    subprocess, as the program has no bound of its own: a timer would defeat the proof)."""
    proc = _run(sys.executable, "-m", "tests.engine.objects_cases", "--env", env, "deadlock")
    assert proc.returncode == 0, _output(proc)
    assert proc.stdout.startswith("deadlock: raised DeadlockError: "), _output(proc)
    assert "a buffer of an object" in proc.stdout and "262144 B" in proc.stdout, _output(proc)
