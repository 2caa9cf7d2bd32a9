"""The validation experiment runs end to end on a small scale: it calibrates the in-process
transport, measures again, and sets the calibrated model's predictions beside it."""

from __future__ import annotations

import math

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
