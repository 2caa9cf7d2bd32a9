"""The timeline picture: a per-rank Gantt chart of a trace, and the example that draws one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import asynccomm as ac
from asynccomm.timeline import hidden_intervals, main

pytest.importorskip("matplotlib")
ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def test_hidden_time_is_communication_during_compute() -> None:
    events = [
        {"ph": "X", "pid": 0, "tid": 1, "ts": 0.0, "dur": 10.0, "cat": "compute"},
        {"ph": "X", "pid": 0, "tid": 1, "ts": 20.0, "dur": 10.0, "cat": "compute"},
        {"ph": "X", "pid": 0, "tid": 2, "ts": 5.0, "dur": 20.0, "cat": "send"},
        {"ph": "X", "pid": 1, "tid": 2, "ts": 0.0, "dur": 30.0, "cat": "recv"},
    ]
    assert hidden_intervals(events, 0) == [(5.0, 10.0), (20.0, 25.0)]
    assert hidden_intervals(events, 1) == []


def test_the_cli_draws_a_trace(tmp_path: Path) -> None:
    async def prog(comm: ac.Communicator) -> None:
        buf = np.zeros(1 << 20, np.uint8)
        if comm.rank == 0:
            req = comm.isend(buf, 1)
            await comm.compute(seconds=1e-4)
            await req
        else:
            await comm.recv(buf, 0)

    trace = tmp_path / "run.json"
    ac.run(prog, 2, cluster=ac.Cluster.preset("roce100g"), trace=trace)
    assert main([str(trace), "-o", str(tmp_path / "run.png")]) == 0
    assert (tmp_path / "run.png").read_bytes()[:8] == PNG
    assert main([str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.png")]) == 1


def test_the_example_plots_store_and_forward_against_overlap(tmp_path: Path) -> None:
    out = tmp_path / "overlap.png"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "pipelined_overlap.py"),
                           "--layers", "3", "--layer-mb", "4", "--plot", str(out)],
                          capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert f"wrote {out}" in proc.stdout
    assert out.read_bytes()[:8] == PNG
