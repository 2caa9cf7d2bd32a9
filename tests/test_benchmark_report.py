"""``python -m benchmarks.report`` assembles docs/performance.md from the benchmarks' JSON.

Small fixture JSON stands in for the benchmarks' (nothing is run or timed here): the page
says when and where, carries every benchmark's printed tables, judges each against its
targets, and says which results are missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import report

ENV = {"python": "3.11.7", "numpy": "2.4.6", "uvloop": "0.23.0", "asynccomm": "0.1.0",
       "cpu_count": 2, "cpus_usable": 2, "cpu_model": "Fixture CPU 9000",
       "platform": "Linux-fixture", "fast_lane": "C accelerator", "loadavg_1min": 0.5,
       "loadavg_1min_at_end": 1.5}
MPI_ENV = {**ENV, "mpi4py": "4.1.2", "mpi": "MPICH Version:      5.0.2"}


def _check(what: str, value: Any, passed: bool, **extra: Any) -> dict[str, Any]:
    return {"what": what, "value": value, "target": "<= 3x", "passed": passed, **extra}


def _docs() -> dict[str, dict[str, Any]]:
    """One JSON per benchmark, each with a table of its own and the checks it judged."""
    head = {"timestamp": "2026-12-04T05:40:00+00:00", "quick": False, "elapsed_seconds": 12.0}
    ring = {"suite": "mpi_ring", **head, "environment": MPI_ENV, "loop": "uvloop"}
    return {
        "p2p.json": {"suite": "p2p", **head, "environment": ENV, "loops": ["uvloop", "asyncio"],
                     "report": "TABLE p2p latency 4.37x", "sections": {"latency": {
                         "uvloop": {"rows": [], "checks": [
                             _check("latency 8 B / Future hand-off", 2.5, True, loop="uvloop",
                                    unit="x", binding=True)]},
                         "asyncio": {"rows": [], "checks": [
                             _check("latency 8 B / Future hand-off", 3.5, False, loop="asyncio",
                                    unit="x", binding=False)]}}}},
        "instructions.json": {"suite": "instructions", **head, "environment": ENV,
                              "report": "TABLE instructions per message", "rows": [],
                              "checks": []},
        "cluster.json": {"suite": "cluster", **head, "environment": ENV,
                         "report": "TABLE cluster ring",
                         "checks": [_check("comm + compute together", "1.00 ms", True)]},
        "collectives.json": {"suite": "collectives", **head,
                             "timestamp": "2026-12-04T05:47:00+00:00", "environment": ENV,
                             "report": "TABLE collectives allreduce",
                             "checks": [_check("allreduce 1 MiB / closed form", "1.300", False)]},
        "mpi_p2p.json": {"suite": "mpi_p2p", **head, "environment": MPI_ENV,
                         "report": "TABLE mpi_p2p bandwidth",
                         "checks": [_check("one-way 8 B latency", 1.2, True, unit="x floor",
                                           us=7.7)]},
        "mpi_ring_n2.json": {**ring, "processes": 2, "report": "TABLE ring n2",
                             "checks": [_check("ring sendrecv 8 KiB per hop", 4.0, False,
                                               unit="x raw", binding=False)]},
        "mpi_ring_n3.json": {**ring, "processes": 3, "report": "TABLE ring n3",
                             "checks": [_check("idle rank CPU (worst rank)", 0.02, True,
                                               unit="of a core", binding=True)]},
        "ps_ceiling.json": {"suite": "ps_ceiling", **head, "environment": ENV,
                            "report": "TABLE parameter server ceiling", "checks": []},
        "hybrid.json": {"suite": "hybrid", **head, "environment": ENV,
                        "report": "TABLE hybrid link", "checks": []},
    }


def _assemble(tmp_path: Path, docs: dict[str, dict[str, Any]]) -> tuple[int, str]:
    results = tmp_path / "results"
    results.mkdir()
    for name, doc in docs.items():
        (results / name).write_text(json.dumps(doc), encoding="utf-8")
    out = tmp_path / "docs" / "performance.md"
    status = report.main(["--results", str(results), "--out", str(out)])
    return status, out.read_text(encoding="utf-8")


def test_the_page_says_when_where_and_with_what(tmp_path: Path) -> None:
    _, page = _assemble(tmp_path, _docs())
    assert page.startswith("# Performance\n")
    assert "2026-12-04 (runs started 05:40 to 05:47 UTC)" in page
    assert "2 cores (`nproc`), Fixture CPU 9000" in page
    for version in ("Python 3.11.7", "numpy 2.4.6", "mpi4py 4.1.2, MPICH Version: 5.0.2,"):
        assert version in page, version


def test_every_benchmark_has_its_tables_and_verdict(tmp_path: Path) -> None:
    status, page = _assemble(tmp_path, _docs())
    assert status == 1  # a target missed, and a benchmark's results missing
    for suite in report.SUITES:
        assert f"\n## {suite.title}\n" in page, suite.title
    for name, doc in _docs().items():
        assert f"```text\n{doc['report']}\n```" in page, name
    rows = {line.split(" | ")[0].lstrip("| "): line for line in page.splitlines()
            if line.startswith("| [") or line.startswith("| MPI ring, 4")}
    assert rows["[In-process point-to-point](#in-process-point-to-point)"].endswith(
        "| 1/1 | PASS |")  # asyncio's latency is shown, not judged
    assert rows["[Collectives on the cluster model](#collectives-on-the-cluster-model)"
                ].endswith("| 0/1 | FAIL |")
    assert rows["[MPI ring, 2 processes](#mpi-ring-2-processes)"].endswith("| 0/0 | PASS |")
    assert "no `mpi_ring_n4.json`" in rows["MPI ring, 4 processes"]
    missed = page.split("Targets missed:", 1)[1].split("\n## ", 1)[0]
    assert "| Collectives on the cluster model | allreduce 1 MiB / closed form | 1.300 |" in missed
    assert "asyncio" not in missed and "ring sendrecv" not in missed


def test_every_target_met_exits_zero(tmp_path: Path) -> None:
    docs = _docs()
    docs["collectives.json"]["checks"][0]["passed"] = True
    docs["mpi_ring_n4.json"] = {**docs["mpi_ring_n3.json"], "processes": 4}
    for n in (2, 3, 4):
        docs[f"shm_p2p_n{n}.json"] = {**docs["mpi_ring_n3.json"], "suite": "shm_p2p",
                                       "processes": n}
    status, page = _assemble(tmp_path, docs)
    assert status == 0
    assert "## Summary: 13 of 13 benchmarks met every target" in page
    assert "Targets missed" not in page


@pytest.mark.parametrize("broken", ["{not json", json.dumps({"suite": "cluster"})])
def test_an_unreadable_result_is_said_not_raised(tmp_path: Path, broken: str) -> None:
    docs = _docs()
    results = tmp_path / "results"
    results.mkdir()
    for name, doc in docs.items():
        (results / name).write_text(json.dumps(doc), encoding="utf-8")
    (results / "cluster.json").write_text(broken, encoding="utf-8")
    out = tmp_path / "performance.md"
    assert report.main(["--results", str(results), "--out", str(out)]) == 1
    assert "`cluster.json` cannot be read" in out.read_text(encoding="utf-8")


def test_results_without_printed_tables_still_show_their_targets(tmp_path: Path) -> None:
    docs = _docs()
    del docs["mpi_p2p.json"]["report"]
    _, page = _assemble(tmp_path, docs)
    section = page.split("\n## MPI, two processes\n", 1)[1].split("\n## ", 1)[0]
    assert "| one-way 8 B latency | 1.20x floor (7.70 us) | <= 3x | PASS |" in section


def test_a_benchmark_of_processes_shows_the_cpu_state_taken_before_it(tmp_path: Path) -> None:
    """``benchmarks.cpu_state NAME`` writes the cross-CPU probe beside the results, and
    the page gives it as a rate in the run line of benchmark ``NAME``, and nowhere else."""
    from benchmarks import cpu_state

    results = tmp_path / "results"
    assert cpu_state.main(["mpi_p2p", "--results", str(results)]) == 0
    written = json.loads((results / "cpu_state_mpi_p2p.json").read_text())
    assert written["name"] == "mpi_p2p" and (written["cross_cpu_s"] is None
                                             or written["cross_cpu_s"] > 0)
    (results / "cpu_state_mpi_p2p.json").write_text(json.dumps(
        {"name": "mpi_p2p", "cross_cpu_s": 64 * 1024 / 10e9}))
    (results / "cpu_state_shm_p2p_n2.json").write_text("not json")  # an aside: ignored
    for name, doc in _docs().items():
        (results / name).write_text(json.dumps(doc), encoding="utf-8")
    out = tmp_path / "performance.md"
    report.main(["--results", str(results), "--out", str(out)])
    page = out.read_text(encoding="utf-8")
    mpi = page[page.index("## MPI, two processes"):]
    mpi = mpi[:mpi.index("\n## ")]
    assert "copied out on another at 10.0 GB/s" in mpi
    assert page.count("copied out on another at") == 1
