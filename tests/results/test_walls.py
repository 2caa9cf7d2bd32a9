"""Wall times stay out of the tracked JSON under docs/: they change from run to run, the
model figures do not, so writing the results twice leaves the files as they were."""

from __future__ import annotations

import json
from pathlib import Path

from results import chunking
from results._common import split_walls


def test_split_walls_takes_every_wall_field_out() -> None:
    data = {"wall_seconds": 1.5, "n": 2,
            "series": {"ring": [{"step_s": 0.1, "wall_s": 0.2}, {"step_s": 0.3}]}}
    kept, walls = split_walls(data)
    assert kept == {"n": 2, "series": {"ring": [{"step_s": 0.1}, {"step_s": 0.3}]}}
    assert walls == {"wall_seconds": 1.5, "series.ring[0].wall_s": 0.2}
    assert data["wall_seconds"] == 1.5  # the caller's data is left whole


def test_results_written_twice_are_the_same_bytes(tmp_path: Path) -> None:
    """(And ``results.scaling``'s: ``test_scaling.py``, whose command test writes twice.)"""
    texts = []
    for _ in range(2):
        chunking.main(["--quick", "--no-plot", "--out", str(tmp_path)])
        texts.append((tmp_path / "chunking.json").read_text(encoding="utf-8"))
    assert texts[0] == texts[1]
    assert "wall" not in texts[0]
    walls = json.loads((tmp_path / "chunking.walls.json").read_text(encoding="utf-8"))
    assert walls["wall_seconds"] >= 0
