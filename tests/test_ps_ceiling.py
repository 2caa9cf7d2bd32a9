"""``python -m benchmarks.ps_ceiling`` puts each transport's samples/s beside the compute
ceiling of the same ranks (figures given here; nothing is run or timed)."""

from __future__ import annotations

import pytest

from benchmarks import ps_ceiling

ENV = {"cpus_usable": 2, "cpu_count": 2, "loadavg_1min": 0.5}


def _samples(mpi: float, ceiling: float) -> dict[str, list[float]]:
    return {"in_process": [60_000, 70_000, 65_000], "processes": [50_000] * 3,
            "mpi": [mpi] * 3, "plain": [55_000] * 3, "in_process_async": [45_000] * 3,
            "processes_async": [42_000] * 3, "mpi_async": [30_000] * 3,
            "ceiling_in_process": [100_000] * 3,
            "ceiling_processes": [ceiling, ceiling + 5_000, ceiling - 5_000]}


def test_each_transport_is_set_beside_its_own_ceiling() -> None:
    rows = {r["key"]: r for r in ps_ceiling.rows(_samples(40_000, 80_000))}
    assert set(rows) == {"in_process", "processes", "mpi", "plain", "in_process_async",
                         "processes_async", "mpi_async"}
    assert (rows["in_process"]["samples_per_s"], rows["in_process"]["ceiling"]) == (65_000,
                                                                                     100_000)
    assert rows["processes"]["of_ceiling"] == pytest.approx(50_000 / 80_000)
    assert rows["mpi"]["of_ceiling"] == pytest.approx(0.5)
    assert rows["plain"]["ceiling"] == 80_000
    assert rows["in_process_async"]["ceiling"] == 100_000  # (the same work: one ceiling)
    assert rows["mpi_async"]["of_ceiling"] == pytest.approx(30_000 / 80_000)


@pytest.mark.parametrize(("mpi", "reachable"), [(40_000, False), (30_000, True)])
def test_the_report_says_whether_twice_the_mpi_figure_is_within_the_ceiling(
        capsys: pytest.CaptureFixture[str], mpi: float, reachable: bool) -> None:
    ps_ceiling.print_report(_samples(mpi, 70_000), ENV, 3, 5, False)
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("mpiexec"))
    assert row[-3:] == [f"{mpi:,.0f}", "70,000", f"{mpi / 70_000:.1%}"]
    assert f"2x the MPI figure is {2 * mpi:,.0f} samples/s" in out
    assert ("out of reach of any transport" in out) is not reachable
    assert "blocking processes (no library) reaches 55,000 samples/s" in out
    assert f"the MPI figure is {2 * mpi / 55_000:.2f}x that" in out
    assert "Shared memory reaches 91% of it" in out


def test_the_example_result_line_is_read() -> None:
    out = "epoch ...\nresult: mode=sync exchange=off samples_per_s=101678 seconds=1.2\n"
    assert ps_ceiling.result_fields(out)["samples_per_s"] == "101678"
    with pytest.raises(ValueError, match="one result line"):
        ps_ceiling.result_fields("no result here")


def test_the_ceiling_runs_the_example_without_the_exchange() -> None:
    runs = {key: (args, launcher) for key, _what, args, launcher, _of in ps_ceiling.RUNS}
    for key in ("ceiling_in_process", "ceiling_processes"):
        assert "--no-exchange" in runs[key][0]
    for key in ("in_process", "processes", "mpi"):  # each mode on each transport
        assert runs[f"{key}_async"] == ((*runs[key][0], "--mode", "async"), runs[key][1])
    cmd = ps_ceiling.command(*runs["mpi"])
    assert cmd[1:3] == ["-n", "5"] and cmd[0].endswith("mpiexec")
    assert ps_ceiling.command(*runs["plain"])[1:] == ["-m", "benchmarks.ps_blocking",
                                                       "--workers", "4"]
    assert ps_ceiling.command(("--processes",), ps_ceiling.EXAMPLE)[-3:] == [
        "--workers", "4", "--processes"]


def test_the_plain_program_trains_the_example_model() -> None:
    """The plain program of blocking processes does the example's work: the same data,
    shards, kernels and messages, so the model it trains is the example's."""
    import sys
    from pathlib import Path

    from benchmarks import ps_blocking

    sys.path.insert(0, str(Path(ps_blocking.__file__).resolve().parents[1] / "examples"))
    from ps import Config, train

    cfg = Config(mode="sync", workers=2, epochs=2)
    got = ps_blocking.run(cfg)
    assert got["samples_per_s"] > 0 and 0 < got["comm_share"] < 1
    report = train(cfg)  # (in-process, on asynccomm: the same result, to the bit)
    assert report is not None and got["test_accuracy"] == report.test_accuracy >= 0.9


def test_the_plain_program_fails_when_a_rank_dies(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank that dies ends the run with an error naming the exit codes, not a hang."""
    import sys
    from pathlib import Path

    from benchmarks import ps_blocking

    sys.path.insert(0, str(Path(ps_blocking.__file__).resolve().parents[1] / "examples"))
    from ps import Config

    def dies(*args: object) -> None:
        raise SystemExit(3)

    monkeypatch.setattr(ps_blocking, "_worker", dies)  # (the forked ranks run it)
    with pytest.raises(RuntimeError, match="exit codes"):
        ps_blocking.run(Config(mode="sync", workers=2, epochs=1))
