"""results.scaling: weak scaling, small: the ring against its closed form, one server
against its port."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from results import scaling


@pytest.fixture(scope="module")
def data() -> dict:
    return scaling.measure((8, 16), ring_up_to=16, sharded_up_to=16)


def test_the_ring_simulation_matches_its_closed_form(data: dict) -> None:
    closed = {r["workers"]: r for r in data["series"]["ring"]}
    for sim in data["series"]["ring-sim"]:
        assert sim["step_s"] == pytest.approx(closed[sim["workers"]]["step_s"], rel=0.01)
        assert sim["step_s"] >= sim["compute_s"]


def test_one_server_does_not_scale(data: dict) -> None:
    single = data["series"]["single"]
    assert single[1]["efficiency"] < single[0]["efficiency"] / 1.5
    # its one port carries every worker's gradient in: a floor on the step
    workload = scaling._workload()
    for row in single:
        inter = 12.5e9 * 4096 / 4178
        floor = (row["workers"] - 7) * 4 * workload.parameters / inter  # 7 share its node
        assert row["step_s"] >= floor
    for kind in ("single", "sharded", "ring", "ring-sim", "sharded-bound"):
        for row in data["series"][kind]:
            assert 0 < row["efficiency"] <= 1


def test_the_command_writes_json_and_a_picture(tmp_path: Path) -> None:
    """Twice, the second time with its picture: the same JSON bytes, without wall times
    (which go to their own file; ``test_walls.py``)."""
    picture = importlib.util.find_spec("matplotlib") is not None
    texts = []
    for draw in (False, picture):
        scaling.main(["--quick", "--out", str(tmp_path), *([] if draw else ["--no-plot"])])
        texts.append((tmp_path / "scaling.json").read_text(encoding="utf-8"))
    assert texts[0] == texts[1] and "wall" not in texts[0]
    assert json.loads((tmp_path / "scaling.walls.json").read_text())["wall_seconds"] >= 0
    doc = json.loads(texts[0])
    assert doc["byte_scale"] == 64 and [r["workers"] for r in doc["series"]["single"]] == [8, 16]
    if not picture:
        pytest.skip("matplotlib is not installed: no picture")
    assert (tmp_path / "scaling.png").stat().st_size < 200_000
