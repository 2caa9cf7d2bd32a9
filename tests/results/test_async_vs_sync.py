"""results.async_vs_sync: the gain of overlap against the closed form of the step."""

from __future__ import annotations

import pytest

from results import async_vs_sync

MiB = 1 << 20
LAYERS = 4


@pytest.fixture(scope="module")
def data() -> dict:
    return async_vs_sync.measure([0.25, 1.0, 4.0], layers=LAYERS, layer_bytes=4 * MiB)


def test_sync_costs_compute_plus_communication(data: dict) -> None:
    for row in data["rows"]:
        assert row["sync_s"] == pytest.approx(row["compute_s"] + row["comm_s"], rel=1e-6)


def test_overlap_is_within_the_bound_and_matches_the_closed_form(data: dict) -> None:
    for row in data["rows"]:
        assert row["async_s"] <= row["bound_s"]
        assert row["async_s"] == pytest.approx(row["closed_form_async_s"], rel=0.01)
        assert row["async_s"] >= max(row["compute_s"], data["together_s"])


def test_the_gain_peaks_where_compute_equals_communication(data: dict) -> None:
    gains = [row["gain"] for row in data["rows"]]
    assert gains[1] == max(gains)
    # at C = M: 2L/(L+1) - 1, never 100%
    assert gains[1] == pytest.approx(2 * LAYERS / (LAYERS + 1) - 1, abs=0.02)
    assert all(0 < g < 1 for g in gains)
    assert async_vs_sync.band(data["rows"]) == (1.0, 1.0)
