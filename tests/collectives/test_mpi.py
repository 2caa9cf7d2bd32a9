"""Every collective and algorithm on MPI, and the randomized and sequencing runners, under
``mpiexec``: the runners of one number of ranks in one job."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import asynccomm as ac

from ..mpi_sections import section
from ..transports.environments import mpi_env

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"

pytestmark = [
    pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec is not installed in the venv "
                       "(pip install -e '.[mpi]')"),
    pytest.mark.skipif(ac.launched_by_mpi(), reason="this test starts mpiexec itself"),
]


#: The runners, one after another in one job per number of ranks (``mpi_sections``: each
#: opens and closes its own worlds), each by its spec: module and arguments.
RUNNERS = "tests.collectives.mpi_runner"
SEQUENCING = "tests.collectives.mpi_sequencing_runner"
PROPERTIES = "tests.collectives.mpi_property_runner --examples 25"
ADVERSITY = "tests.collectives.mpi_adversity_runner --examples 8"
JOBS = {3: (RUNNERS, SEQUENCING), 2: (PROPERTIES, ADVERSITY), 4: (PROPERTIES, ADVERSITY)}
#: Seconds each job may take (a few, unhurried; below pytest's timeout of a test, so that
#: a hang fails the test with the job's output).
TIMEOUT = 100


@pytest.fixture(scope="module")
def mpi() -> Callable[[int, str], str]:
    """``mpi(ranks, spec)``: that runner's output in the job of ``JOBS[ranks]`` (started
    the first time one of its runners is asked for); it must have passed on every rank."""
    jobs: dict[int, subprocess.CompletedProcess[str] | str] = {}

    def run(ranks: int, spec: str) -> str:
        if ranks not in jobs:
            cmd = [str(MPIEXEC), "-n", str(ranks), sys.executable, "-m", "tests.mpi_sections",
                   *JOBS[ranks]]
            try:
                jobs[ranks] = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True,
                                             text=True, timeout=TIMEOUT, check=False)
            except subprocess.TimeoutExpired as exc:
                jobs[ranks] = f"mpiexec -n {ranks} hung for {TIMEOUT} s:\n{exc.stdout!r}\n" \
                              f"{exc.stderr!r}"
        job = jobs[ranks]
        if isinstance(job, str):
            pytest.fail(job)
        proc = section(job, spec, ranks)
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    return run


def test_every_collective_on_mpi(mpi: Callable[[int, str], str]) -> None:
    out = mpi(3, RUNNERS)
    assert "collectives on MPI, 3 ranks: 28 passed, 0 failed" in out, out


@pytest.mark.parametrize("ranks", [2, 4])
def test_random_collectives_on_mpi_through_the_methods(
        ranks: int, mpi: Callable[[int, str], str]) -> None:
    out = mpi(ranks, PROPERTIES)
    assert f"random collectives on MPI, {ranks} ranks: 25 examples, 0 failures" in out, out


@pytest.mark.parametrize("ranks", [3])
def test_calls_keep_their_place_and_split_is_all_or_nothing_on_mpi(
        ranks: int, mpi: Callable[[int, str], str]) -> None:
    out = mpi(ranks, SEQUENCING)
    assert f"sequencing on MPI, {ranks} ranks: 4 passed, 0 failed" in out, out


@pytest.mark.parametrize("ranks", [2, 4])
def test_random_programs_with_a_misbehaving_rank_on_mpi(
        ranks: int, mpi: Callable[[int, str], str]) -> None:
    out = mpi(ranks, ADVERSITY)
    assert f"random programs on MPI, {ranks} ranks: 8 examples, 0 failures" in out, out
