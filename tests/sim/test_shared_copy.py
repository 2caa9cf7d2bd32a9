"""Rule 4e of ``sim/model.py``: where ranks have cores of their own, a large message is
copied by both its processes, so two large messages crossing each other share the two
cores, and the calibration reads that share off an exchange against a one-way message."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import asynccomm as ac
from asynccomm.sim import Cluster, ClusterModel
from asynccomm.sim.calibration import Segment, calibrated_cluster
from asynccomm.sim.host import HostSpec
from asynccomm.sim.model import SHARED_COPY_MIN

MiB = 1 << 20
SEGMENTS = [Segment(64 << 10, 10e-6, 1 / 10e9), Segment(1 << 30, 20e-6, 1 / 10e9)]
CROWDED = [Segment(64 << 10, 10e-6, 1 / 5e9), Segment(1 << 30, 20e-6, 1 / 5e9)]


def _link_ns(nbytes: int) -> float:
    segment = next(s for s in SEGMENTS if nbytes <= s.up_to)
    return (segment.alpha + nbytes * segment.beta) * 1e9


def _cluster(ranks: int, share: float, cores: int = 2) -> Cluster:
    return calibrated_cluster(SEGMENTS, name="x", ranks=ranks,
                              host=HostSpec(cores=cores, shared_copy=share), crowded=CROWDED)


def _ends(cluster: Cluster, world: int, pairs: list[tuple[int, int]], nbytes: int
          ) -> list[int]:
    model = ClusterModel(cluster, world)
    moving = [model.start(src, dst, nbytes, now=0) for src, dst in pairs]
    model.settle()
    return [m.end for m in moving]


@pytest.mark.parametrize("share", [0.0, 0.25, 0.8, 1.0])
def test_two_large_messages_crossing_share_both_cores(share: float) -> None:
    """Each loads its destination's core for its link time and its source's for ``share``
    of it: crossing, each core carries 1 + share of a message, so both end at
    (1 + share) link times; alone, one ends at its link time whatever the share."""
    link = _link_ns(4 * MiB)
    assert _ends(_cluster(2, share), 2, [(0, 1)], 4 * MiB) == [pytest.approx(link, abs=2)]
    crossing = _ends(_cluster(2, share), 2, [(0, 1), (1, 0)], 4 * MiB)
    assert crossing == [pytest.approx((1 + share) * link, abs=2)] * 2


def test_messages_below_the_size_and_crowded_nodes_keep_their_links() -> None:
    """Below ``SHARED_COPY_MIN`` one process copies (the receiver): crossing messages move
    as on links of their own.  On a node that runs more ranks than cores, the crowded
    segments and Rules 4b-4d time them, as before."""
    small = SHARED_COPY_MIN - 1
    assert _ends(_cluster(2, 1.0), 2, [(0, 1), (1, 0)], small) == [
        pytest.approx(_link_ns(small), abs=2)] * 2
    at = _ends(_cluster(2, 1.0), 2, [(0, 1), (1, 0)], SHARED_COPY_MIN)
    assert at == [pytest.approx(2 * _link_ns(SHARED_COPY_MIN), abs=2)] * 2
    # 3 ranks on 2 cores: the same with and without a share
    for pairs in ([(0, 1), (1, 0)], [(0, 1), (1, 2)], [(0, 2), (2, 0)]):
        assert (_ends(_cluster(3, 1.0), 3, pairs, 4 * MiB)
                == _ends(_cluster(3, 0.0), 3, pairs, 4 * MiB))


def test_messages_between_other_cores_do_not_share() -> None:
    """On four cores, 0 -> 1 and 2 -> 3 load cores 0, 1 and 2, 3: apart, each takes its
    link time; 0 -> 1 and 1 -> 2 share core 1 (the first's destination, the second's
    source)."""
    link = _link_ns(4 * MiB)
    apart = _ends(_cluster(4, 1.0, cores=4), 4, [(0, 1), (2, 3)], 4 * MiB)
    assert apart == [pytest.approx(link, abs=2)] * 2
    chained = _ends(_cluster(4, 1.0, cores=4), 4, [(0, 1), (1, 2)], 4 * MiB)
    assert chained == [pytest.approx(2 * link, abs=2)] * 2


def test_a_host_without_a_share_or_cores_and_a_shared_node_move_as_before() -> None:
    link = _link_ns(4 * MiB)
    # cores 0 (a core per rank, as presets of published hardware): no core to share
    free = calibrated_cluster(SEGMENTS, name="x", ranks=2, host=HostSpec(shared_copy=1.0))
    assert _ends(free, 2, [(0, 1), (1, 0)], 4 * MiB) == [pytest.approx(link, abs=2)] * 2
    # one resource for the node already (in-process ranks): each after the other
    one = calibrated_cluster(SEGMENTS, name="x", ranks=2, shared=True,
                             host=HostSpec(cores=1, shared_copy=1.0))
    assert sorted(_ends(one, 2, [(0, 1), (1, 0)], 4 * MiB)) == [
        pytest.approx(link, abs=2), pytest.approx(2 * link, abs=4)]


@pytest.mark.parametrize("bad, error", [("0.5", TypeError), (True, TypeError),
                                        (-0.1, ValueError), (1.5, ValueError),
                                        (math.nan, ValueError)])
def test_a_bad_share_is_a_clear_error(bad: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="shared_copy"):
        HostSpec(cores=2, shared_copy=bad)  # type: ignore[arg-type]


def test_a_preset_keeps_its_share(tmp_path: Path) -> None:
    host = HostSpec(cores=2, step=3e-6, shared_copy=0.8)
    assert HostSpec.from_dict(json.loads(json.dumps(host.to_dict()))) == host
    assert not host.free and HostSpec(shared_copy=0.0).free
    preset = tmp_path / "p.json"
    preset.write_text(json.dumps(_cluster(2, 0.8).to_dict()))
    assert Cluster.load(preset).host.shared_copy == 0.8
    # a preset written before the share had one: none
    doc = _cluster(2, 0.0).to_dict()
    del doc["host"]["shared_copy"]
    preset.write_text(json.dumps(doc))
    assert Cluster.load(preset).host.shared_copy == 0.0


def test_the_share_is_read_off_the_model_s_exchange(monkeypatch: pytest.MonkeyPatch) -> None:
    """``measure_shared_copy``: the model with the share it returns makes the exchange
    cost as much more than the one-way message as the transport did (``exchange_calls``,
    here a stand-in's figure); clipped to 0..1."""
    import asynccomm.calibrate as calibrate

    host = HostSpec(cores=2, call=10e-6, step=3e-6)

    def exchange_more(share: float) -> float:
        cluster = calibrated_cluster(SEGMENTS, name="x", ranks=2,
                                     host=HostSpec(cores=2, call=10e-6, step=3e-6,
                                                   shared_copy=share))
        return float(ac.run(lambda comm: calibrate.exchange_calls(
            comm, 1, comm.model_time, calibrate.MODEL_CALLS), 2, cluster=cluster,
            clock="virtual")[0])

    # the model's exchange costs the share of a link time more than the one-way message
    none, whole = exchange_more(0.0), exchange_more(1.0)
    link = _link_ns(calibrate.SHARED_COPY_SIZE) * 1e-9
    assert whole - none == pytest.approx(link, rel=1e-3)
    for share in (0.3, 0.75):
        measured = exchange_more(share)
        monkeypatch.setattr(calibrate, "_timed_call", lambda *a, m=measured: m)
        assert calibrate.measure_shared_copy(host, SEGMENTS, 1) == pytest.approx(
            share, abs=1e-4)
    for measured, share in ((none - 50e-6, 0.0), (whole + 1e-3, 1.0)):
        monkeypatch.setattr(calibrate, "_timed_call", lambda *a, m=measured: m)
        assert calibrate.measure_shared_copy(host, SEGMENTS, 1) == share


def test_the_exchange_runs_on_two_processes() -> None:
    from asynccomm.calibrate import _timed_call

    # the measurement's shape (not its timing): rank 0's seconds, a difference that load
    # can make negative, well under a second either way
    took = _timed_call("exchange", "processes", 2, 1)
    assert isinstance(took, float) and abs(took) < 1.0
