"""results.bandwidth: one transfer on roce100g against the model's closed forms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asynccomm.sim import Cluster, Pipelined
from results import bandwidth
from results._model import Path as StagePath

MiB = 1 << 20


@pytest.fixture(scope="module")
def data() -> dict:
    return bandwidth.measure([MiB, 16 * MiB, 128 * MiB])


def test_store_and_forward_is_the_handshake_plus_the_sum_of_the_stages(data: dict) -> None:
    for row in data["rows"]:
        # each stage is rounded up to a whole nanosecond, no more
        assert row["saf_s"] == pytest.approx(row["saf_closed_form_s"], abs=5e-9)


def test_pipelined_is_the_slowest_stage_plus_the_fill(data: dict) -> None:
    path = StagePath.of(Cluster.preset("roce100g"), 2, 0, 1)
    d, link = path.device, path.link

    def copy(b: int) -> float:
        return d.copy_latency + b / d.copy_bandwidth

    def wire(b: int) -> float:
        return link.latency + b / link.effective_bandwidth

    for row in data["rows"]:
        n, chunk = row["nbytes"], row["chunk_bytes"]
        assert chunk == Pipelined().choose(n, link, d, 2).chunk_bytes
        count = -(-n // chunk)
        last = n - (count - 1) * chunk
        # first chunk's copy-out, every chunk on the wire (the slowest stage), last copy-in
        closed = (path.handshake() + copy(chunk) + (count - 1) * wire(chunk) + wire(last)
                  + copy(last))
        assert row["pipelined_s"] == pytest.approx(closed, abs=count * 3e-9)


def test_never_above_the_line_rate_and_the_speed_up_approaches_the_stages(data: dict) -> None:
    line = data["line_rate_gbps"]
    assert line == 12.5 and data["payload_rate_gbps"] < line
    for row in data["rows"]:
        assert row["saf_gbps"] < row["pipelined_gbps"] < data["bottleneck_gbps"] < line
        assert row["speedup"] < 3
    big = data["rows"][-1]
    assert big["nbytes"] == 128 * MiB
    assert big["speedup"] >= 2.8 and big["pipelined_gbps"] >= 0.95 * data["bottleneck_gbps"]
    # the article's optimised figures at 128 MB and 1 GB are above the line rate
    assert [r["article"][1] > line for r in data["rows"]] == [False, False, True]


def test_the_report_says_the_article_is_above_the_line_rate(data: dict) -> None:
    text = bandwidth.report(data)
    assert "ABOVE line rate" in text and "exceed the 12.5 GB/s line rate" in text


def test_the_command_writes_json_and_a_picture(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    bandwidth.main(["--quick", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "bandwidth.json").read_text())
    assert doc["preset"] == "roce100g" and len(doc["rows"]) == 5
    png = (tmp_path / "bandwidth.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) < 200_000
