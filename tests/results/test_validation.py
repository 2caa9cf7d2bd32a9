"""The validation experiment runs end to end on a small scale: it calibrates the in-process
transport, measures again, and sets the calibrated model's predictions beside it."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from results import validation


def test_a_small_validation_compares_prediction_and_measurement() -> None:
    data = validation.measure(("local",), (8, 4096, 65536), (4096,), (2,), repeats=1)
    local = data["transports"]["local"]
    assert [r["nbytes"] for r in local["p2p"]] == [8, 4096, 65536]
    assert all(r["measured_s"] > 0 and r["predicted_s"] > 0 for r in local["p2p"])
    assert {(c["collective"], c["ranks"]) for c in local["cells"]} == {
        (name, 2) for name in validation.COLLECTIVES}
    assert all(math.isfinite(c["error"]) and c["error"] >= 0 for c in local["cells"])
    assert "geomean error" in validation.report(data)
    assert local["host"]["cores"] == 1 and local["host"]["call"] > 0  # the calls' own work
    assert all(math.isfinite(c["messages_only_error"]) for c in local["cells"])
    assert all(c["spread"] >= 0 and all(r["spread"] >= 0 and r["faults_per_call"] >= 0
                                        for r in c["rows"])
               for c in local["cells"])
    assert "spread" in validation.report(data)
    # every cell measured in two passes, judged against their geometric mean
    for cell in local["cells"]:
        assert cell["drift"] >= 0
        for row in cell["rows"]:
            first, again = row["passes_s"]
            assert row["measured_s"] == pytest.approx(math.sqrt(first * again))
    assert "drift" in validation.report(data) and "cells met the target" in validation.report(data)


def test_a_cell_whose_own_spread_passes_the_target_is_called_noisy() -> None:
    assert validation.spread([1.0]) == 0 and validation.spread([2.0, 2.0, 2.0]) == 0
    assert validation.spread([0.0, 1.0]) == 0  # a repeat timed at 0 s says nothing
    # one repeat of three twice the median: mean |log| is log(2) / 3
    assert validation.spread([1.0, 1.0, 2.0]) == pytest.approx(2 ** (1 / 3) - 1)
    cell = {"error": 0.05, "spread": 0.02}
    assert validation._met(cell) == "yes"
    assert validation._met({**cell, "spread": 0.2}) == "yes (noisy)"
    assert validation._met({"error": 0.3, "spread": 0.2}) == "no (noisy)"


def test_a_cell_whose_passes_drift_past_the_target_is_called_unsteady() -> None:
    assert validation.drift([[1.0]]) == 0 and validation.drift([]) == 0
    assert validation.drift([[1.0, 1.0], [2.0, 2.0]]) == 0
    # one size moved by 2x (either way), the other not: mean |log| is log(2) / 2
    assert validation.drift([[1.0, 2.0], [3.0, 3.0]]) == pytest.approx(math.sqrt(2) - 1)
    assert validation.drift([[2.0, 1.0], [3.0, 3.0]]) == pytest.approx(math.sqrt(2) - 1)
    cell = {"error": 0.05, "spread": 0.02, "drift": 0.03}
    assert validation._met(cell) == "yes"
    assert validation._met({**cell, "drift": 0.2}) == "yes (unsteady)"
    assert validation._met({**cell, "spread": 0.2, "drift": 0.2}) == "yes (noisy, unsteady)"
    assert validation._met({"error": 0.3, "spread": 0.0, "drift": 0.25}) == "no (unsteady)"
    cells = [{"error": 0.05, "spread": 0.0, "drift": 0.0},   # met, steady
             {"error": 0.30, "spread": 0.0, "drift": 0.02},  # missed, steady: the model's
             {"error": 0.30, "spread": 0.0, "drift": 0.40},  # missed, unsteady
             {"error": 0.08, "spread": 0.15, "drift": 0.0}]  # met, noisy
    assert validation._tally(cells) == ("2 of 4 cells met the target; of the 2 whose "
                                        "measurement held within it (spread and drift), 1")


def test_cells_after_a_point_to_point_check_that_missed_its_target_say_so() -> None:
    cell = {"collective": "allreduce", "ranks": 2, "error": 0.05, "spread": 0.01,
            "messages_only_error": 1.0,
            "rows": [{"nbytes": 4096, "measured_s": 1e-4, "predicted_s": 1.05e-4}]}
    p2p = [{"nbytes": 8, "measured_s": 1e-5, "predicted_s": 1.2e-5}]
    steady = {"segments": [], "p2p": p2p, "p2p_error": 0.02, "cells": [cell]}
    moved = {**steady, "p2p_error": 0.19}
    assert "pace moved" not in validation.report({"transports": {"mpi": steady}})
    text = validation.report({"transports": {"mpi": moved}})
    assert "missed its target (19.0%)" in text and "pace moved" in text
    assert " yes " in text  # the cells are judged all the same


def test_the_validation_runs_the_transports_asked_for(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    asked: list[tuple[str, ...]] = []

    def fake_measure(transports: tuple[str, ...], *args: object,
                     **kwargs: object) -> dict[str, Any]:
        asked.append(transports)
        return {"transports": {}}

    monkeypatch.setattr(validation, "measure", fake_measure)
    validation.main(["--no-plot", "--out", str(tmp_path), "--transport", "local"])
    validation.main(["--no-plot", "--out", str(tmp_path), "--transport", "local",
                     "--transport", "processes"])
    assert asked == [("local",), ("local", "processes")]
    with pytest.raises(SystemExit):
        validation.main(["--transport", "nowhere"])


def test_a_replay_judges_the_model_again_against_the_same_measurements(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``replay`` solves each transport's calibration again from what it measured (no
    measurement is taken) and sets the predictions beside the run's own measurements: on
    the same model it gives the run's tables back; on recorded ping-pongs twice as slow,
    its point-to-point predictions double and the measurements stay."""
    import asynccomm.calibrate as calibrate

    data = validation.measure(("local",), (8, 4096, 65536), (4096,), (2,), repeats=1)
    kept = json.dumps(data)
    data = json.loads(kept)  # as its JSON keeps it
    local = data["transports"]["local"]
    assert local["recorded"] and all(k.startswith('["pingpong"') for k in local["recorded"])

    def measuring(*args: object, **kwargs: object) -> None:
        raise AssertionError("a replay measured")

    monkeypatch.setattr(calibrate, "measure_pingpong", measuring)
    monkeypatch.setattr(calibrate, "in_process_host", measuring)
    again = validation.replay(data)["transports"]["local"]
    for key in ("p2p", "cells", "segments", "host"):
        assert again[key] == local[key], key
    slower = copy.deepcopy(data)
    for points in slower["transports"]["local"]["recorded"].values():
        for n in points:
            points[n] *= 2
    judged = validation.replay(slower)["transports"]["local"]
    for old, new in zip(local["p2p"], judged["p2p"], strict=True):
        assert new["measured_s"] == old["measured_s"]
        assert new["predicted_s"] == pytest.approx(2 * old["predicted_s"], rel=0.05)
    assert [r["measured_s"] for c in judged["cells"] for r in c["rows"]] == [
        r["measured_s"] for c in local["cells"] for r in c["rows"]]
    # a run that kept no record cannot be replayed, nor a record missing a measurement
    del slower["transports"]["local"]["recorded"]
    with pytest.raises(ValueError, match="run python -m results.validation again"):
        validation.replay(slower)
    data["transports"]["local"]["recorded"] = {}
    with pytest.raises(LookupError, match="no pingpong"):
        validation.replay(data)
    # the command line: replays a JSON file and writes its own
    path = tmp_path / "validation.json"
    path.write_text(kept)
    validation.main(["--no-plot", "--out", str(tmp_path), "--replay", str(path)])
    assert json.loads((tmp_path / "validation.replay.json").read_text())["replayed"]


def test_the_report_gives_the_machine_s_state_at_each_measurement() -> None:
    """The ``cross_cpu`` probes of a run are reported as rates, and a point-to-point check
    that missed its target after a calibration in another state says so."""
    from asynccomm.calibrate import CROSS_CPU_BYTES

    slow, fast = CROSS_CPU_BYTES / 10e9, CROSS_CPU_BYTES / 27e9
    probes = {"calibration": [slow, slow], "check": fast, "passes": {"2": [fast, slow]}}
    line = validation._probes(probes)
    assert "10.0, 10.0 GB/s around the calibration's ping-pong, 27.0 before the check" in line
    assert "2 ranks 27.0, 10.0" in line
    assert validation._probes(None) == "" and validation._probes(
        {"calibration": None, "check": None, "passes": {}}) == ""
    assert "the host moved the CPUs" in validation._moved(probes)
    assert validation._moved({**probes, "check": slow * 1.2}) == ""  # the same state
    cell = {"collective": "allreduce", "ranks": 2, "error": 0.05, "spread": 0.01,
            "drift": 0.0, "messages_only_error": 1.0,
            "rows": [{"nbytes": 4096, "measured_s": 1e-4, "predicted_s": 1.05e-4}]}
    moved = {"segments": [], "p2p": [{"nbytes": 8, "measured_s": 1e-5, "predicted_s": 2e-5}],
             "p2p_error": 1.0, "cells": [cell], "cross_cpu": probes}
    text = validation.report({"transports": {"processes": moved}})
    assert "the host moved the CPUs" in text and "27.0 before the check" in text
