"""The test environments themselves leave nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_environments_makes_no_folder(tmp_path: Path) -> None:
    # A spawned rank imports the test module of its program, and so this one, and ends
    # with os._exit: nothing it made on import would be cleaned up.
    code = "import os, tests.transports.environments; os._exit(0)"
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, timeout=60,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_traced_run_writes_its_trace_and_the_folder_goes_at_exit(tmp_path: Path) -> None:
    code = ("import asynccomm as ac\n"
            "from tests.transports.environments import ENVIRONMENTS, _TRACES\n"
            "async def main(comm):\n"
            "    return comm.rank\n"
            "assert ac.run(main, world_size=2, **ENVIRONMENTS['traced']) == [0, 1]\n"
            "assert (_TRACES / 'run.json').is_file()\n"
            "print(_TRACES)\n")
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, timeout=60,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent == tmp_path
    assert list(tmp_path.iterdir()) == []
