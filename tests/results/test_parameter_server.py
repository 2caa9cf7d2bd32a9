"""results.parameter_server: the four configurations on the two presets, small."""

from __future__ import annotations

import pytest

from results import parameter_server


@pytest.fixture(scope="module")
def data() -> dict:
    return parameter_server.measure(("resnet50",), ("roce100g",), workers=2, servers=2,
                                    batch=16)


def test_each_configuration_reports_share_and_throughput(data: dict) -> None:
    rows = data["rows"]
    assert [r["config"] for r in rows] == ["no-overlap", "overlap", "overlap-onebit",
                                          "overlap-onebit-sharded"]
    for r in rows:
        assert 0 <= r["comm_share"] < 1
        assert r["step_s"] >= r["compute_s"] > 0
        assert r["samples_per_s"] == pytest.approx(2 * 16 / r["step_s"])
        assert r["samples_per_s"] <= r["compute_bound_samples_per_s"]
        assert r["result_line"].startswith("result: workload=resnet50 cluster=roce100g")
    shares = [r["comm_share"] for r in rows]
    assert shares[0] > shares[1] > shares[2]
    # 1-bit: 1/32 of the fp32 bytes, plus a 4-byte scale per message
    assert rows[2]["push_bytes"] < rows[0]["push_bytes"] / 31


def test_the_report_names_the_article_inconsistency(data: dict) -> None:
    text = parameter_server.report(data)
    assert "= 1.6x, not 8.5x" in text and "97% less" in text
