"""Every example runs as a script with small flags, and its printed result says it worked.

The examples' functions are tested in depth under tests/examples/; these runs check the
command lines people type, end to end.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from asynccomm.transports import shm

ROOT = Path(__file__).resolve().parents[1]


def run_example(script: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def result_line(stdout: str) -> dict[str, str]:
    lines = [line for line in stdout.splitlines() if line.startswith("result: ")]
    assert len(lines) == 1, stdout
    return dict(field.split("=", 1) for field in lines[0].removeprefix("result: ").split())


@pytest.mark.parametrize(("mode", "compression", "loop"), [
    ("ssp", "int8", "uvloop"), ("async", "none", "asyncio")])
def test_parameter_server_script(mode: str, compression: str, loop: str) -> None:
    out = run_example("parameter_server.py", "--mode", mode, "--compression", compression,
                      "--workers", "2", "--epochs", "2", "--train-samples", "8000",
                      "--loop", loop)
    result = result_line(out)
    assert (result["mode"], result["compression"], result["workers"]) == (mode, compression,
                                                                           "2")
    assert result["reached"] == "yes"
    assert float(result["test_accuracy"]) >= float(result["target"]) >= 0.95
    assert 0 <= float(result["comm_share"]) < 1
    if mode == "ssp":
        assert int(result["max_ahead"]) <= 2
    table = re.findall(rf"^\s+(\d+)\s+{mode}\s+([\d.]+)\s+([\d.]+)%", out, re.MULTILINE)
    assert [int(epoch) for epoch, _, _ in table] == [1, 2]
    assert float(table[1][1]) < float(table[0][1])  # the loss fell


def test_parameter_server_script_without_overlap() -> None:
    result = result_line(run_example("parameter_server.py", "--no-overlap", "--workers", "2",
                                     "--epochs", "1", "--train-samples", "8000"))
    assert result["overlap"] == "off" and result["reached"] == "yes"


def test_training_loop_script() -> None:
    result = result_line(run_example("training_loop.py", "--ranks", "3", "--epochs", "2",
                                     "--train-samples", "9000"))
    assert result["replicas_identical"] == "yes"
    assert result["reached"] == "yes"
    assert float(result["test_accuracy"]) >= float(result["target"])


def test_ring_script() -> None:
    out = run_example("ring.py", "--ranks", "5")
    match = re.search(r"token after one lap: (\d+) \(expected (\d+)\)", out)
    assert match is not None, out
    assert match[1] == match[2] == "10"


def test_parameter_server_survives_a_worker_death() -> None:
    out = run_example("parameter_server.py", "--kill-worker-at", "20", "--kill-worker", "2",
                      "--epochs", "1", "--train-samples", "12000")
    assert "the server lost worker rank 2 (rank 2 " in out
    assert "shrank to 4 ranks (server + workers 1, 3, 4)" in out
    result = result_line(out)
    assert result["killed"] == "2" and result["workers_left"] == "3"
    assert result["reached"] == "yes", out


@pytest.mark.skipif(shm.missing() is not None, reason=str(shm.missing()))
def test_parameter_server_survives_a_worker_process_killed() -> None:
    """Each rank in a process of its own (``--processes``: shared memory, no MPI), trained
    to the target before and after one is killed."""
    out = run_example("parameter_server.py", "--kill-worker-at", "20", "--kill-worker", "2",
                      "--epochs", "1", "--train-samples", "12000", "--processes")
    assert "the server lost worker rank 2 (rank 2 died (its process ended)" in out
    assert "shrank to 4 ranks (server + workers 1, 3, 4)" in out
    result = result_line(out)
    assert result["workers"] == "4" and result["killed"] == "2"
    assert result["workers_left"] == "3" and result["reached"] == "yes", out


def test_parameter_server_refuses_a_kill_it_cannot_survive() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "parameter_server.py"),
                           "--kill-worker-at", "3", "--mode", "async"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1 and "needs --mode sync" in proc.stderr
