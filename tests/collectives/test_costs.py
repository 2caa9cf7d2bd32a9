"""The α–β closed forms against the cluster model: on the virtual clock, a collective's
modelled time equals its algorithm's closed form within 1.1x; the choosers."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm._collectives import functions as coll
from asynccomm._collectives.costs import CollectiveCosts, default_choice, model_chooser
from asynccomm.sim.model import ClusterModel

KiB, MiB = 1 << 10, 1 << 20


def world_model(comm: ac.Communicator) -> ClusterModel:
    model = comm._engine.link.timing.model  # type: ignore[union-attr]
    assert isinstance(model, ClusterModel)
    return model


async def _once(comm: ac.Communicator, collective: str, nbytes: int, choose: Any,
                tag: int) -> tuple[float, float]:
    """One call of ``nbytes`` (nccl-tests sizes, float32): (start, end).  Every rank starts
    at the same model time, the next whole millisecond after a barrier."""
    p = comm.size
    await coll.barrier(comm, tag=tag + coll.TAG_SPAN)
    now = comm.model_time()
    await asyncio.sleep(math.floor(now * 1000 + 1) / 1000 - now)
    n = nbytes // 4
    t0 = comm.model_time()
    if collective == "allreduce":
        await coll.allreduce(comm, np.ones(n, np.float32), tag=tag, choose=choose)
    elif collective == "allgather":
        await coll.allgather(comm, np.ones(n // p, np.float32),
                             np.empty((p, n // p), np.float32), tag=tag, choose=choose)
    else:
        await coll.reduce_scatter(comm, np.ones((p, n // p), np.float32),
                                  np.empty(n // p, np.float32), tag=tag, choose=choose)
    return t0, comm.model_time()


def measure(preset: str, size: int, runs: list[tuple[str, str | None, int]]
            ) -> list[tuple[str, float, float]]:
    """(algorithm, modelled seconds, closed form) of each (collective, algorithm or None
    for the model's choice, nbytes)."""
    async def main(comm: ac.Communicator) -> list[tuple[str, float, float, float]]:
        costs = CollectiveCosts(world_model(comm), range(comm.size))
        chooser = model_chooser(world_model(comm), range(comm.size))
        out = []
        for i, (collective, algo, nbytes) in enumerate(runs):
            names = [f"{collective}.{a}" for a in coll.algorithms(collective)]
            name = chooser(names, nbytes, comm.size) if algo is None else f"{collective}.{algo}"
            t0, t1 = await _once(comm, collective, nbytes, lambda *_, n=name: n,
                                 2 * i * coll.TAG_SPAN)
            out.append((name, t0, t1, costs.cost(name, nbytes)))
        return out

    async def bounded(comm: ac.Communicator) -> Any:
        async with asyncio.timeout(60):
            return await main(comm)

    per_rank = ac.run(bounded, world_size=size, cluster=ac.Cluster.preset(preset))
    return [(per_rank[0][i][0], max(r[i][2] for r in per_rank) - max(r[i][1] for r in per_rank),
             per_rank[0][i][3]) for i in range(len(runs))]


ASCEND910B = [("allreduce", "ring", 32 * KiB), ("allreduce", "ring", 1 * MiB),
              ("allreduce", "ring", 16 * MiB), ("allreduce", "recursive_doubling", 8 * KiB),
              ("allreduce", "recursive_doubling", 256 * KiB), ("allgather", "ring", 1 * MiB),
              ("allgather", "ring", 16 * MiB), ("allgather", "bruck", 8 * KiB),
              ("allgather", "bruck", 256 * KiB), ("reduce_scatter", "ring", 16 * MiB),
              ("reduce_scatter", "recursive_doubling", 64 * KiB)]
ASCEND910 = [("allreduce", "ring", 1 * MiB), ("allreduce", "ring", 16 * MiB),
             ("allreduce", "recursive_doubling", 256 * KiB), ("allgather", "ring", 16 * MiB),
             ("reduce_scatter", "ring", 16 * MiB)]
CHOSEN = [(c, None, n) for c in ("allreduce", "allgather", "reduce_scatter")
          for n in (4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB)]


@pytest.mark.parametrize(("preset", "size", "runs"), [
    ("ascend910b", 8, ASCEND910B), ("ascend910b", 6, ASCEND910B[:3] + ASCEND910B[4:5]),
    ("ascend910", 8, ASCEND910), ("ascend910b", 8, CHOSEN)],
    ids=["ascend910b-8", "ascend910b-6", "ascend910-8", "ascend910b-chosen"])
def test_modelled_time_equals_the_closed_form(preset: str, size: int,
                                              runs: list[tuple[str, str | None, int]]) -> None:
    for (_c, _, nbytes), (name, took, form) in zip(runs, measure(preset, size, runs),
                                                   strict=True):
        assert form > 0
        assert 1 / 1.1 <= took / form <= 1.1, (name, nbytes, took, form)


def test_eager_folds_overlap_so_the_closed_form_is_an_upper_bound() -> None:
    """At a world size that is not a power of two, an eager recursive doubling beats
    lockstep: the unfolded ranks' messages leave while the pairs fold, so the closed form
    bounds the modelled time from above."""
    [(_, took, form)] = measure("ascend910b", 6, [("allreduce", "recursive_doubling", 8 * KiB)])
    assert 0.8 * form <= took <= form


def test_the_cost_model_leaves_the_live_model_alone() -> None:
    model = ClusterModel(ac.Cluster.preset("ascend910b"), 8)
    before = dict(model.resources)
    costs = CollectiveCosts(model, range(8))
    assert costs.cost("allreduce.ring", 16 * MiB) > costs.cost("allreduce.ring", 1 * MiB) > 0
    assert dict(model.resources) == before == {}
    assert costs.alpha > 0 and 20e9 < costs.bandwidth() <= 28e9


def test_closed_forms_follow_alpha_and_beta() -> None:
    """Ring allreduce = 2(p-1)·α + 2(p-1)/p·n/B: doubling n adds 2(p-1)/p·n/B."""
    costs = CollectiveCosts(ClusterModel(ac.Cluster.preset("ascend910b"), 8), range(8))
    b = costs.bandwidth(2 * MiB)  # the per-message slope at the ring's 2 MiB blocks
    grow = costs.cost("allreduce.ring", 32 * MiB) - costs.cost("allreduce.ring", 16 * MiB)
    assert grow == pytest.approx(2 * 7 / 8 * 16 * MiB / b, rel=0.05)
    assert costs.cost("barrier.dissemination", 0) == pytest.approx(3 * costs.alpha, rel=0.05)


def test_sub_communicators_map_their_ranks() -> None:
    model = ClusterModel(ac.Cluster.preset("ascend910"), 8)
    inside = CollectiveCosts(model, [0, 1, 2, 3])  # one HCCS group
    across = CollectiveCosts(model, [0, 4, 1, 5])  # every ring hop crosses the PCIe switch
    assert across.cost("allreduce.ring", MiB) > inside.cost("allreduce.ring", MiB)
    with pytest.raises(ValueError, match="ranks must be world ranks"):
        CollectiveCosts(model, [0, 8])
    with pytest.raises(ValueError, match="no closed form"):
        inside.cost("allreduce.tree", MiB)


def test_model_chooser_prefers_latency_small_and_bandwidth_large() -> None:
    choose = model_chooser(ClusterModel(ac.Cluster.preset("ascend910b"), 8), range(8))
    names = ["allreduce.ring", "allreduce.recursive_doubling"]
    assert choose(names, 8 * KiB, 8) == "allreduce.recursive_doubling"
    assert choose(names, 64 * MiB, 8) == "allreduce.ring"


def test_default_choice_switches_by_size() -> None:
    ar = ["allreduce.ring", "allreduce.recursive_doubling"]
    assert default_choice(ar, MiB - 1, 8) == "allreduce.recursive_doubling"
    assert default_choice(ar, MiB, 8) == "allreduce.ring"
    ag = ["allgather.ring", "allgather.bruck"]
    assert default_choice(ag, KiB, 8) == "allgather.bruck"
    assert default_choice(ag, 64 * MiB, 8) == "allgather.ring"
    rs = ["reduce_scatter.ring", "reduce_scatter.recursive_doubling"]
    assert default_choice(rs, 256 * KiB - 1, 8) == "reduce_scatter.recursive_doubling"
    assert default_choice(rs, 256 * KiB, 8) == "reduce_scatter.ring"
    for c in ("gather", "scatter"):
        names = [f"{c}.linear", f"{c}.binomial"]
        assert default_choice(names, KiB, 8) == f"{c}.binomial"
        assert default_choice(names, MiB, 8) == f"{c}.linear"
    assert default_choice(["bcast.binomial"], MiB, 8) == "bcast.binomial"


def test_choose_sees_qualified_names_and_nccl_sizes() -> None:
    seen: list[tuple[tuple[str, ...], int, int]] = []

    def spy(names: Any, nbytes: int, size: int) -> str:
        seen.append((tuple(names), nbytes, size))
        return names[-1].partition(".")[2]  # a short name is fine too

    async def main(comm: ac.Communicator) -> None:
        p = comm.size
        await coll.allreduce(comm, np.ones(10, np.float32), tag=0, choose=spy)
        await coll.allgather(comm, np.ones(10, np.float32), np.empty((p, 10), np.float32),
                             tag=0, choose=spy)
        await coll.gather(comm, np.ones(10, np.float32), np.empty((p, 10), np.float32),
                          tag=0, choose=spy)
        await coll.barrier(comm, tag=0, choose=spy)

    ac.run(main, world_size=3)
    assert len(seen) == 4 * 3  # asked once per call on every rank, alike
    assert set(seen) == {(("allreduce.ring", "allreduce.recursive_doubling"), 40, 3),
                         (("allgather.ring", "allgather.bruck"), 120, 3),
                         (("gather.linear", "gather.binomial"), 120, 3),
                         (("barrier.dissemination",), 0, 3)}


def test_closed_forms_add_the_ranks_work_on_the_busiest_core() -> None:
    from asynccomm.sim.calibration import Segment, calibrated_cluster
    from asynccomm.sim.host import HostSpec, collective_seconds

    segments = [Segment(1 << 30, 5e-6, 1 / 10e9)]
    host = HostSpec(cores=2, call=1e-5, step=2e-6, copy_bandwidth=1e9, switch=3e-6)
    bare = CollectiveCosts(ClusterModel(calibrated_cluster(  # the same cores, no work
        segments, name="x", host=HostSpec(cores=2)), 3), range(3))
    busy = CollectiveCosts(ClusterModel(calibrated_cluster(segments, name="x", host=host), 3),
                           range(3))
    # 3 ranks on 2 cores: the busiest does two ranks' work, each the call, its steps (and
    # their switch: more ranks than cores) and its copies
    for name in ("allreduce.ring", "allgather.bruck", "barrier.dissemination"):
        work = 2 * collective_seconds(host, name, 4 * KiB, 3)
        assert busy.cost(name, 4 * KiB) == pytest.approx(bare.cost(name, 4 * KiB) + work)
    assert busy.work("allgather.ring", 4 * KiB) == pytest.approx(
        2 * (1e-5 + 2 * 5e-6 + (4 * KiB / 3 + 4 * KiB) / 1e9))
    assert bare.work("allgather.ring", 4 * KiB) == 0.0  # no host work: messages only
    # a sub-communicator of ranks on two cores: one rank's work each
    assert CollectiveCosts(busy_model := ClusterModel(
        calibrated_cluster(segments, name="x", host=host), 3), [0, 1]).work(
        "barrier.dissemination", 0) == collective_seconds(host, "barrier", 0, 2)
    assert dict(busy_model.resources) == {}  # the live model is left alone


def test_closed_forms_add_the_rendezvous_switch_of_steps_past_the_eager_limit() -> None:
    from asynccomm.sim.calibration import Segment, calibrated_cluster
    from asynccomm.sim.host import HostSpec

    segments = [Segment(1 << 30, 5e-6, 1 / 10e9)]
    host = HostSpec(cores=2, call=1e-5, step=2e-6, switch=3e-6, rendezvous_switch=4e-5)
    costs = CollectiveCosts(ClusterModel(calibrated_cluster(segments, name="x", host=host),
                                         3), range(3))
    # 3 ranks on 2 cores, the busiest doing two ranks' work: a ring allgather's 2 steps
    # of 64 KiB messages (eager) a switch more each, of 72 KiB (rendezvous) 40 us more again
    assert costs.work("allgather.ring", 3 * 64 * KiB) == pytest.approx(
        2 * (1e-5 + 2 * (2e-6 + 3e-6)))
    assert costs.work("allgather.ring", 3 * 72 * KiB) == pytest.approx(
        2 * (1e-5 + 2 * (2e-6 + 3e-6 + 4e-5)))


def test_model_chooser_weighs_the_ranks_work() -> None:
    from asynccomm.sim.calibration import Segment, calibrated_cluster
    from asynccomm.sim.host import HostSpec

    # 8 ranks on a fast link: by their messages Bruck's 3 steps beat the ring's 7 below a
    # MiB; copies at 100 MB/s make Bruck's extra copy of the whole buffer cost more
    segments = [Segment(1 << 30, 20e-6, 1 / 10e9)]
    names = ["allgather.ring", "allgather.bruck"]
    fast = model_chooser(ClusterModel(calibrated_cluster(segments, name="x"), 8), range(8))
    assert fast(names, 64 * KiB, 8) == "allgather.bruck"
    slow = HostSpec(cores=8, copy_bandwidth=1e8)
    copying = model_chooser(ClusterModel(calibrated_cluster(segments, name="x", host=slow), 8),
                            range(8))
    assert copying(names, 64 * KiB, 8) == "allgather.ring"
