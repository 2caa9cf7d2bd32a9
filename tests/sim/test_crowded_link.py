"""A link's crowded segments: where a node runs more ranks than its host has cores, one
process copies each message that two on cores of their own copy together, so the
calibration times a ping-pong there too and the model times that node's transfers by it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asynccomm.sim import Cluster, ClusterModel, DeviceSpec, LinkSpec
from asynccomm.sim.calibration import Segment, calibrated_cluster
from asynccomm.sim.host import HostSpec

MiB = 1 << 20
#: two cores copy at 10 GB/s, one at 5
SEGMENTS = [Segment(64 << 10, 10e-6, 1 / 10e9), Segment(1 << 30, 20e-6, 1 / 10e9)]
CROWDED = [Segment(64 << 10, 10e-6, 1 / 5e9), Segment(1 << 30, 20e-6, 1 / 5e9)]


def _transfer_s(cluster: Cluster, world: int, src: int = 0, dst: int = 1,
                nbytes: int = 4 * MiB) -> float:
    model = ClusterModel(cluster, world)
    return model.transfer(src, dst, nbytes, now=0).end * 1e-9


def test_a_crowded_node_times_its_transfers_by_the_crowded_segments() -> None:
    host = HostSpec(cores=2)
    cluster = calibrated_cluster(SEGMENTS, name="x", ranks=4, host=host, crowded=CROWDED)
    alone = 20e-6 + 4 * MiB / 10e9
    assert _transfer_s(cluster, 2) == pytest.approx(alone, rel=1e-5)  # a core each
    assert _transfer_s(cluster, 3) == pytest.approx(20e-6 + 4 * MiB / 5e9, rel=1e-5)
    assert _transfer_s(cluster, 4, 2, 3) == pytest.approx(20e-6 + 4 * MiB / 5e9, rel=1e-5)
    # without crowded segments, or without cores to count, the segments as before
    plain = calibrated_cluster(SEGMENTS, name="x", ranks=4, host=host)
    assert _transfer_s(plain, 3) == pytest.approx(alone, rel=1e-5)
    uncounted = calibrated_cluster(SEGMENTS, name="x", ranks=4, crowded=CROWDED)
    assert _transfer_s(uncounted, 3) == pytest.approx(alone, rel=1e-5)


def _two_nodes() -> Cluster:
    """Two nodes of 3 devices on 2 cores each, whose link's crowded segments run at half
    its rate (10 and 5 GB/s), joined by a NIC of 10 GB/s."""
    link = LinkSpec("l", 10e9, 0.0, segments=((1 << 30, 0.0, 10e9),),
                    crowded=((1 << 30, 0.0, 5e9),))
    nic = LinkSpec("nic", 10e9, 0.0)
    return Cluster(nodes=2, devices_per_node=3, intra=link, inter=nic,
                   device=DeviceSpec("d", 1e12, 1 << 40, float("inf"), 0.0),
                   host=HostSpec(cores=2))


def test_only_the_nodes_that_run_more_ranks_than_cores_are_crowded() -> None:
    cluster = _two_nodes()
    # 5 ranks: node 0 runs 3 (crowded), node 1 runs 2 (a core each)
    assert _transfer_s(cluster, 5, 0, 1, MiB) == pytest.approx(MiB / 5e9, rel=1e-5)
    assert _transfer_s(cluster, 5, 3, 4, MiB) == pytest.approx(MiB / 10e9, rel=1e-5)
    # between nodes: the inter link, whatever the nodes' crowding
    assert _transfer_s(cluster, 5, 0, 3, MiB) == pytest.approx(MiB / 10e9, rel=1e-5)


def test_crowded_segments_are_checked_as_segments_are() -> None:
    with pytest.raises(ValueError, match="crowded must be in increasing size"):
        LinkSpec("l", 1e9, 0.0, crowded=((100, 1e-6, 1e9), (50, 1e-6, 1e9)))
    with pytest.raises(TypeError, match="crowded must be a tuple"):
        LinkSpec("l", 1e9, 0.0, crowded=[(100, 1e-6, 1e9)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="segment bandwidth"):
        LinkSpec("l", 1e9, 0.0, crowded=((100, 1e-6, 0.0),))


def test_a_preset_keeps_its_crowded_segments(tmp_path: Path) -> None:
    from asynccomm.calibrate import Crowded, preset

    doc = preset("processes", {8: 10e-6}, SEGMENTS, ranks=4, host=HostSpec(cores=2),
                 crowded=Crowded(3, {8: 17e-6}, 7e-6, CROWDED))
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    loaded = Cluster.load(path)
    assert loaded.intra.crowded == calibrated_cluster(
        SEGMENTS, name="x", crowded=CROWDED).intra.crowded
    assert loaded.intra.crowded and loaded.intra.crowded != loaded.intra.segments
    made = doc["calibration"]["crowded"]
    assert made["ranks"] == 3 and made["lift"] == 7e-6
    assert made["points"] == {"8": pytest.approx(10e-6)}  # what the segments were fitted to
    # a preset written before crowded segments existed loads, without them
    del doc["cluster"]["intra"]["crowded"]
    path.write_text(json.dumps(doc))
    assert Cluster.load(path).intra.crowded == ()


def test_calibration_times_a_ping_pong_on_one_process_more_than_the_cores(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The crowded ping-pong runs on cores + 1 ranks; its segments are fitted to its times
    less what its small messages took more than on two ranks (the hand-off, which the
    host's switch prices), and the host's switches are solved on the model with them."""
    import asynccomm.calibrate as calibrate

    sizes = [8 << i for i in range(24)]

    def two(n: int) -> float:
        return 10e-6 + n / 10e9 if n <= 65536 else 30e-6 + n / 10e9

    def crowded(n: int) -> float:  # 7 us more a hand-off, one core copies
        return 17e-6 + n / 10e9 if n <= 65536 else 37e-6 + n / 5e9

    asked: list[int] = []

    def fake_pingpong(transport: str, sizes: Any, repeats: int, ranks: int = 2
                      ) -> dict[int, float]:
        asked.append(ranks)
        return {n: (crowded if ranks > 2 else two)(n) for n in sizes}

    solved_on: list[Any] = []
    monkeypatch.setattr(calibrate.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(calibrate, "measure_pingpong", fake_pingpong)
    monkeypatch.setattr(calibrate, "measure_host", lambda transport, repeats, in_process,
                        segments, crowded=(): solved_on.append(crowded) or HostSpec(cores=2))
    doc = calibrate.calibrate("processes", sizes, 1)
    assert set(asked) == {2, 3}
    made = doc["calibration"]["crowded"]
    assert made["ranks"] == 3 and made["lift"] == pytest.approx(7e-6)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    link = Cluster.load(path).intra
    for n in (8, 4096, 1 << 20, 16 << 20):
        assert link.stage_time(n, crowded=True) == pytest.approx(crowded(n) - 7e-6, rel=0.02)
        assert link.stage_time(n) == pytest.approx(two(n), rel=0.02)
    assert solved_on == [calibrate._fit({int(n): t for n, t in made["points"].items()})]
    # in-process ranks share one core: no crowded ping-pong
    asked.clear()
    monkeypatch.setattr(calibrate, "measure_host", lambda *a, **k: HostSpec())
    assert "crowded" not in calibrate.calibrate("local", sizes, 1)["calibration"]
    assert set(asked) == {2}


def test_the_switches_are_solved_on_the_model_with_the_crowded_segments(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import asynccomm.calibrate as calibrate

    monkeypatch.setattr(calibrate.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(calibrate, "measure_step", lambda host, *a: host.step)
    got: list[Any] = []
    monkeypatch.setattr(calibrate, "measure_switch", lambda cores, host, segments, repeats,
                        transport, crowded: got.append(crowded) or 0.0)
    monkeypatch.setattr(calibrate, "measure_rendezvous_switch",
                        lambda cores, host, segments, repeats, transport, crowded:
                        got.append(crowded) or 0.0)
    calibrate.measure_host("processes", 1, HostSpec(cores=1), SEGMENTS, CROWDED)
    assert got == [CROWDED, CROWDED]


def test_a_crowded_core_runs_no_work_while_it_copies_a_message_in() -> None:
    """Rule 4c: on a node that runs more ranks than cores, a transfer holds its
    destination's core for its link time, and the work queued there after it waits; with a
    core per rank, or between nodes, the work runs beside it."""
    link_s = 20e-6 + 4 * MiB / 5e9
    crowded = ClusterModel(calibrated_cluster(SEGMENTS, name="x", ranks=3,
                                              host=HostSpec(cores=2), crowded=CROWDED), 3)
    moving = crowded.start(0, 1, 4 * MiB, now=1000)
    assert moving.link_busy == pytest.approx(link_s * 1e9, abs=1)
    start, _ = crowded.core(1).reserve(1000, 10)
    assert start == 1000 + moving.link_busy  # after the copy
    # two messages into ranks of one core (0 and 2) share it, and hold it as long in all
    both = ClusterModel(calibrated_cluster(SEGMENTS, name="x", ranks=3,
                                           host=HostSpec(cores=2), crowded=CROWDED), 3)
    into = [both.start(1, 0, 4 * MiB, now=0), both.start(1, 2, 4 * MiB, now=0)]
    both.settle()
    ends = [t.end for t in into]
    assert ends[0] == ends[1] == pytest.approx(2 * link_s * 1e9, rel=1e-6)
    assert both.core(0).reserve(0, 10)[0] == pytest.approx(2 * link_s * 1e9, abs=2)
    # a core per rank: nothing held
    alone = ClusterModel(calibrated_cluster(SEGMENTS, name="x", ranks=2,
                                            host=HostSpec(cores=2), crowded=CROWDED), 2)
    alone.start(0, 1, 4 * MiB, now=1000)
    assert alone.core(1).reserve(1000, 10)[0] == 1000


def test_a_crowded_sender_spends_half_the_link_time_on_its_core() -> None:
    """Rule 4d: on a crowded node a transfer between ranks on two cores also holds its
    source's core for half its link time, from its start; between ranks of one core it
    holds that core once, for its link time."""
    link_s = 20e-6 + 4 * MiB / 5e9
    cluster = calibrated_cluster(SEGMENTS, name="x", ranks=3, host=HostSpec(cores=2),
                                 crowded=CROWDED)
    model = ClusterModel(cluster, 3)  # ranks 0 and 2 on core 0, rank 1 on core 1
    moving = model.start(0, 1, 4 * MiB, now=1000)
    assert moving.link_busy == pytest.approx(link_s * 1e9, abs=1)
    assert model.core(0).reserve(1000, 10)[0] == 1000 + round(moving.link_busy / 2)
    assert model.core(1).reserve(1000, 10)[0] == 1000 + moving.link_busy
    # ranks 0 and 2 share core 0: held once
    one = ClusterModel(cluster, 3)
    within = one.start(0, 2, 4 * MiB, now=1000)
    assert one.core(0).reserve(1000, 10)[0] == 1000 + within.link_busy
    assert one.core(1).reserve(1000, 10)[0] == 1000
    # a core per rank: the sender's core holds nothing either
    alone = ClusterModel(calibrated_cluster(SEGMENTS, name="x", ranks=2,
                                            host=HostSpec(cores=2), crowded=CROWDED), 2)
    alone.start(0, 1, 4 * MiB, now=1000)
    assert alone.core(0).reserve(1000, 10)[0] == 1000


def test_a_crowded_node_holds_no_core_for_a_message_from_another_node() -> None:
    cluster = _two_nodes()
    model = ClusterModel(cluster, 6)  # node 0 runs ranks 0-2, node 1 ranks 3-5: crowded
    model.start(3, 0, MiB, now=0)  # from node 1 into node 0: the NIC's
    assert model.core(0).reserve(0, 10) == (0, 10)
    moving = model.start(1, 0, MiB, now=0)  # within node 0: rank 0's core copies it
    assert model.core(0).reserve(0, 10)[0] == 10 + moving.link_busy  # (after the above)


def test_a_message_from_a_hung_rank_holds_no_core() -> None:
    """A transfer that never leaves (its sender hung: ``HELD``) holds nothing, its
    destination's core included: the work queued there runs at once."""
    from asynccomm.sim import FaultPlan, RankFault
    from asynccomm.sim.faults import PlannedFaults

    cluster = calibrated_cluster(SEGMENTS, name="x", ranks=3, host=HostSpec(cores=2),
                                 crowded=CROWDED)
    model = ClusterModel(cluster, 3)
    model.faults = PlannedFaults(FaultPlan(ranks=(RankFault(0, hang_at=0.0),)), cluster, 3)
    model.start(0, 1, MiB, now=1000)
    assert model.core(1).reserve(1000, 10) == (1000, 1010)
