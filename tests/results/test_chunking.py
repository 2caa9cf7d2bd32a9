"""results.chunking: the article's rule, c* and a sweep, on the model's own plans."""

from __future__ import annotations

import pytest

from asynccomm.sim import Cluster, Pipelined
from results import chunking
from results._model import Path

MiB = 1 << 20


def test_the_article_rule_branches() -> None:
    assert chunking.article_chunk(11.4, 2) == 16 * MiB
    assert chunking.article_chunk(5.0, 2) == 4 * MiB
    assert chunking.article_chunk(1.0, 20) == 1 * MiB
    assert chunking.article_chunk(11.4, 2000) == 8 * MiB
    assert chunking.article_chunk(1.0, 2000) == 512 << 10


def test_c_star_is_what_pipelined_uses_and_follows_the_closed_form() -> None:
    path = Path.of(Cluster.preset("roce100g"), 2, 0, 1)
    assert path.stages == pytest.approx(3)  # three balanced stages
    for nbytes in (4 * MiB, 256 * MiB):
        c = chunking.model_chunk(path, nbytes)
        assert c == Pipelined().choose(nbytes, path.link, path.device, 2).chunk_bytes
        ideal = (nbytes * path.alpha * path.bottleneck / (path.stages - 1)) ** 0.5
        chunks = round(nbytes / ideal)
        assert c == -(-nbytes // chunks)


@pytest.fixture(scope="module")
def data() -> dict:
    return chunking.measure((4 * MiB, 64 * MiB), names=("roce100g", "10GbE (made up)",
                                                       "RoCE 400 km (made up)"))


def test_c_star_is_near_the_best_and_the_engine_agrees(data: dict) -> None:
    for row in data["rows"]:
        assert row["best_s"] <= min(row["model_s"], row["article_s"])
        assert row["model_s"] <= 1.03 * row["best_s"]
        if "engine_s" in row:  # the engine adds the rendezvous handshake, nothing else
            assert row["engine_minus_handshake_s"] == pytest.approx(row["model_s"], abs=5e-9)
    roce = [r for r in data["rows"] if r["path"] == "roce100g"]
    # 16 MiB chunks leave a 4 MiB message in one piece: store-and-forward, ~3x slower
    assert roce[0]["article_chunk"] == 16 * MiB
    assert roce[0]["article_s"] > 2 * roce[0]["best_s"]
    assert "article's rule: worst" in chunking.report(data)
