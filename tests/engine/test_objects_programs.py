"""Random object programs keep the objects' invariant (``objects_programs.py``) in every
in-process environment: each object arrives once and intact, or both its ends raise typed
errors; nothing hangs, even when a rank fails mid-way; the communicator works after.

The suite runs a fixed, bounded sample; ``make test-stress`` runs many more examples.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import asynccomm as ac

from ..transports.contract import bounded
from ..transports.environments import mpi_env
from .objects_cases import ENVS, Boom
from .objects_programs import Plan, plans, program

#: Seconds one example may take before it fails as hung.
LIMIT = 10.0
EXAMPLES = int(os.environ.get("ASYNCCOMM_STRESS_EXAMPLES", "15"))

keeping = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("env", list(ENVS))
@keeping
@given(plan=plans())
def test_random_object_programs_lose_duplicate_and_hang_nothing(env: str, plan: Plan) -> None:
    if plan.fail_after is None:
        got = ac.run(bounded(program(plan), LIMIT), world_size=2, **ENVS[env])
        assert got[0] == got[1]  # what rank 0 sent successfully is what rank 1 received
        return
    with pytest.raises(Boom):  # the failed rank's error alone, at once
        ac.run(bounded(program(plan), LIMIT), world_size=2, **ENVS[env])


MPIEXEC = Path(sys.executable).parent / "mpiexec"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec is not installed in the venv "
                    "(pip install -e '.[mpi]')")
@pytest.mark.skipif(ac.launched_by_mpi(), reason="this test starts mpiexec itself")
def test_random_object_programs_on_mpi() -> None:
    env = mpi_env()
    cmd = [str(MPIEXEC), "-n", "2", sys.executable, "-m", "tests.engine.mpi_objects_runner"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the MPI object programs hung:\n{exc.stdout!r}\n{exc.stderr!r}")
    out = f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, out
    assert "object programs on MPI, 2 ranks:" in proc.stdout and " 0 failed" in proc.stdout, out
