"""Every collective and algorithm on MPI: ``mpiexec -n 3`` runs ``mpi_runner``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import asynccomm as ac

from ..transports.environments import mpi_env

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"

pytestmark = [
    pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec is not installed in the venv "
                       "(pip install -e '.[mpi]')"),
    pytest.mark.skipif(ac.launched_by_mpi(), reason="this test starts mpiexec itself"),
]


def _mpi(ranks: int, module: str, *args: str, timeout: float = 120) -> str:
    """``mpiexec -n ranks python -m module args``'s output; it must exit 0."""
    env = mpi_env()
    proc = subprocess.run([str(MPIEXEC), "-n", str(ranks), sys.executable, "-m", module,
                           *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    out = f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, out
    return proc.stdout


def test_every_collective_on_mpi() -> None:
    out = _mpi(3, "tests.collectives.mpi_runner", timeout=90)
    assert "collectives on MPI, 3 ranks: 28 passed, 0 failed" in out, out


@pytest.mark.parametrize("ranks", [2, 4])
def test_random_collectives_on_mpi_through_the_methods(ranks: int) -> None:
    out = _mpi(ranks, "tests.collectives.mpi_property_runner", "--examples", "25")
    assert f"random collectives on MPI, {ranks} ranks: 25 examples, 0 failures" in out, out


@pytest.mark.parametrize("ranks", [3])
def test_calls_keep_their_place_and_split_is_all_or_nothing_on_mpi(ranks: int) -> None:
    out = _mpi(ranks, "tests.collectives.mpi_sequencing_runner", timeout=90)
    assert f"sequencing on MPI, {ranks} ranks: 4 passed, 0 failed" in out, out


@pytest.mark.parametrize("ranks", [2, 4])
def test_random_programs_with_a_misbehaving_rank_on_mpi(ranks: int) -> None:
    out = _mpi(ranks, "tests.collectives.mpi_adversity_runner", "--examples", "8")
    assert f"random programs on MPI, {ranks} ranks: 8 examples, 0 failures" in out, out
