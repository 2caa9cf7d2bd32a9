"""``python -m benchmarks --quick`` runs and writes well-formed JSON.

Nothing here judges performance: the numbers only have to exist and be positive.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("latency", "rate", "tracing", "bandwidth", "responsiveness", "waits")
LOOPS = ("uvloop", "asyncio")

# Numbers every row of a section must carry, each > 0.
POSITIVE: dict[str, tuple[str, ...]] = {
    "latency": ("nbytes", "one_way_us", "baseline_one_way_us", "ratio", "calls_per_message"),
    "rate": ("messages", "rate_per_s", "baseline_rate_per_s", "ratio"),
    "tracing": ("off", "on", "ratio", "repeats"),
    "bandwidth": ("nbytes", "gbps", "baseline_gbps", "ratio", "to_thread_gbps"),
    "memory": ("nbytes",),
    "responsiveness": ("nbytes", "ticks", "max_gap_ms", "baseline_max_gap_ms",
                       "to_thread_max_gap_ms", "transfer_gbps_with_ticker"),
    "waits": ("requests", "one_by_one_s", "wait_all_s", "ratio"),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Summary against the performance targets" in proc.stdout
    path = out / "p2p.json"
    assert path.is_file(), f"no JSON written; stdout:\n{proc.stdout[-2000:]}"
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def test_header(results: dict[str, Any]) -> None:
    assert results["suite"] == "p2p"
    assert results["quick"] is True
    assert results["timestamp"]
    env = results["environment"]
    for key in ("python", "numpy", "uvloop", "asynccomm", "cpu_count", "cpu_model"):
        assert env[key], key
    # the tables as printed, for the performance page
    assert "One-way latency" in results["report"]
    assert "Summary against the performance targets" in results["report"]
    assert results["loops"] == list(LOOPS)
    assert results["targets_judged"] > 0
    assert 0 <= results["targets_met"] <= results["targets_judged"]


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("section", SECTIONS)
def test_section_rows(results: dict[str, Any], section: str, loop: str) -> None:
    res = results["sections"][section][loop]
    assert res["rows"], f"{section} on {loop} has no rows"
    for row in res["rows"]:
        kind = row.get("kind", section)
        for key in POSITIVE[kind]:
            assert row[key] > 0, (section, loop, key, row[key])
        if kind == "memory":
            assert row["extra_bytes"] >= 0
            assert row["extra_fraction"] >= 0


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("section", SECTIONS)
def test_section_checks(results: dict[str, Any], section: str, loop: str) -> None:
    checks = results["sections"][section][loop]["checks"]
    assert checks, f"{section} on {loop} judged nothing"
    for check in checks:
        assert check["loop"] == loop
        assert check["target"] and check["what"]
        assert isinstance(check["passed"], bool)
        assert check["value"] >= 0


def test_bad_arguments_are_refused() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--only", "nonsense"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "latency" in proc.stderr


def test_the_cluster_benchmark_judges_its_targets(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.cluster", "--quick", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Targets (cluster model)" in proc.stdout
    doc = json.loads((tmp_path / "cluster.json").read_text())
    assert doc["checks"] and all(isinstance(c["passed"], bool) for c in doc["checks"])
    assert doc["suite"] == "cluster" and doc["environment"]["cpu_count"]
    assert "Modelled P2P bandwidth" in doc["report"] and "Targets (cluster model)" in doc["report"]


def test_the_instruction_count_takes_the_difference_of_two_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Per message: the difference of two totals over the difference of the counts (the
    start-up cancels); the children it counts run the cases for real."""
    from benchmarks import instructions

    totals = {512: 1_000_000, 1536: 3_048_000}
    monkeypatch.setattr(instructions, "count", lambda case, n, env: totals[n])
    rows = instructions.measure(quick=True)
    assert [r["per_message"] for r in rows] == [2_000.0] * len(instructions.CASES)
    for case in ("pair", "rows"):
        instructions.child(case, 300)
    assert instructions._COLLECTED.findall("==1== Events : Ir\n==1== Collected : 1234\n") == [
        "1234"]
