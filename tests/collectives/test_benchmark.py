"""The collectives benchmark runs, judges its targets and writes its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_collectives_benchmark_judges_its_targets(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.collectives", "--quick", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Targets (collectives)" in proc.stdout and "FAIL" not in proc.stdout
    doc = json.loads((tmp_path / "collectives.json").read_text())
    assert {r["collective"] for r in doc["rows"]} == {"allreduce", "allgather"}
    assert all(c["passed"] for c in doc["checks"])
    assert all(r["busbw"] <= r["line_rate"] for r in doc["rows"])
