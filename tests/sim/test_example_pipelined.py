"""examples/pipelined_overlap.py: its strategies and their results, with small sizes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import asynccomm as ac

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipelined_overlap.py"


def test_overlap_beats_pipelining_beats_store_and_forward() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--layers", "4", "--layer-mb", "16"],
                          capture_output=True, text=True, timeout=120, check=True)
    times = {}
    for line in proc.stdout.splitlines():
        for name in ("serial, store-and-forward", "serial, pipelined", "overlapped, pipelined"):
            if line.startswith(name):
                times[name] = float(line[len(name):].split()[0])
    assert len(times) == 3, proc.stdout
    saf, pipe, overlap = times.values()
    assert saf > pipe > overlap
    # Overlapped: the longer of compute and communication, plus one layer of the other
    # to fill the pipeline, no more.
    compute_ms = 4 * (16 << 20) / ac.Cluster.preset("roce100g").fit(2).link(0, 1).bandwidth * 1e3
    comm_ms = pipe - compute_ms
    assert overlap <= 1.05 * max(compute_ms, comm_ms) + max(compute_ms, comm_ms) / 4
    assert "hidden %" in proc.stdout
