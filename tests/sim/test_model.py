"""The cost model: closed forms, bounds, the pipelining target, contention,
double buffering, determinism, and the chunk-by-chunk simulation the fast path must equal."""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asynccomm.sim import (
    ChunkPlan,
    ChunkTiming,
    Cluster,
    ClusterModel,
    DefaultStrategy,
    DeviceSpec,
    LinkSpec,
    Pipelined,
    Resource,
    StoreAndForward,
    TransferPlan,
    adaptive_chunk,
)

INF = float("inf")
MB, MiB, GB, GiB = 10**6, 1 << 20, 10**9, 1 << 30


def exact(message: str) -> str:
    return "^" + re.escape(message) + "$"


def path(*, link_bw: float = 10e9, link_lat: float = 2e-6, eff: float = 1.0,
         copy_bw: float = INF, copy_lat: float = 0.0, devices: int = 4,
         sharing: str = "fair") -> Cluster:
    """One node of ``devices`` devices, each pair on its own link."""
    return Cluster(nodes=1, devices_per_node=devices,
                   intra=LinkSpec("l", link_bw, link_lat, eff, sharing),
                   inter=None, device=DeviceSpec("d", 1e12, 1 << 30, copy_bw, copy_lat))


def fifo(cluster: Cluster) -> Cluster:
    """``cluster`` with every link FIFO."""
    changed = copy.copy(cluster)
    for field in ("intra", "inter", "cross_group"):
        link = getattr(cluster, field)
        if link is not None:
            setattr(changed, field, dataclasses.replace(link, sharing="fifo"))
    return changed


def stage_ns(latency: float, nbytes: int, bandwidth: float) -> float:
    return (latency + nbytes / bandwidth) * 1e9


def fresh(cluster: Cluster, world: int = 2, **kw: Any) -> ClusterModel:
    return ClusterModel(cluster, world, **kw)


def solo(cluster: Cluster, src: int, dst: int, nbytes: int, plan: ChunkPlan | None = None,
         world: int = 16, **kw: Any) -> TransferPlan:
    return ClusterModel(cluster, world, **kw).transfer(src, dst, nbytes, now=0, plan=plan)


# -- closed forms -------------------------------------------------------------------------

@pytest.mark.parametrize(("nbytes", "latency", "bandwidth"), [
    (1, 1e-6, 12.5e9), (4096, 2e-6, 25e9), (1 << 20, 5e-6, 1e9), (GiB, 1.5e-6, 50e9),
    (12345, 0.0, 3e9), (0, 3e-6, 10e9),
])
@pytest.mark.parametrize("mode", ["sync", "pipelined"])
def test_one_transfer_with_infinitely_fast_copies_is_alpha_plus_size_over_bandwidth(
        nbytes: int, latency: float, bandwidth: float, mode: str) -> None:
    model = fresh(path(link_bw=bandwidth, link_lat=latency))
    plan = model.transfer(0, 1, nbytes, now=1000, plan=ChunkPlan(mode, max(1, nbytes)))
    assert (plan.start, plan.chunks) == (1000, 1)
    assert abs(plan.duration - stage_ns(latency, nbytes, bandwidth)) <= 1
    assert plan.link_busy == plan.duration


@pytest.mark.parametrize(("nbytes", "link_bw", "link_lat", "copy_bw", "copy_lat"), [
    (1 << 20, 12.5e9, 2e-6, 12.5e9, 1e-6),
    (100 * MB, 25e9, 2e-6, 200e9, 1e-6),
    (7, 1e9, 5e-6, 1e8, 3e-6),
    (GiB, 50e9, 1e-6, 20e9, 0.0),
])
def test_store_and_forward_is_the_sum_of_the_three_stages(
        nbytes: int, link_bw: float, link_lat: float, copy_bw: float, copy_lat: float) -> None:
    plan = solo(path(link_bw=link_bw, link_lat=link_lat, copy_bw=copy_bw, copy_lat=copy_lat),
                0, 1, nbytes, StoreAndForward().choose(nbytes, None, None, 2), world=2)  # type: ignore[arg-type]
    expected = 2 * stage_ns(copy_lat, nbytes, copy_bw) + stage_ns(link_lat, nbytes, link_bw)
    assert plan.mode == "sync" and plan.chunks == 1
    assert abs(plan.duration - expected) <= 3
    assert plan.sender_done == plan.end


@pytest.mark.parametrize("chunks", [1, 2, 7, 64, 1000])
@pytest.mark.parametrize(("link_bw", "copy_bw", "link_lat", "copy_lat"), [
    (10e9, 10e9, 2e-6, 2e-6),  # balanced
    (10e9, 40e9, 2e-6, 1e-6),  # link-bound
    (40e9, 10e9, 1e-6, 3e-6),  # copy-bound
    (12.5e9, 12.25e9, 2e-6, 1e-6),  # roce100g-like
])
def test_pipelined_is_sum_of_stages_plus_n_minus_one_slowest(
        chunks: int, link_bw: float, copy_bw: float, link_lat: float, copy_lat: float) -> None:
    chunk = 256 * 1024
    cluster = path(link_bw=link_bw, link_lat=link_lat, copy_bw=copy_bw, copy_lat=copy_lat)
    plan = solo(cluster, 0, 1, chunks * chunk, ChunkPlan("pipelined", chunk), world=2,
                staging_slots=chunks)
    stages = [stage_ns(copy_lat, chunk, copy_bw), stage_ns(link_lat, chunk, link_bw),
              stage_ns(copy_lat, chunk, copy_bw)]
    assert plan.chunks == chunks
    # each stage time is rounded up to a whole ns: < 1 ns per term of the sum
    assert 0 <= plan.duration - (sum(stages) + (chunks - 1) * max(stages)) < chunks + 2
    # double buffering is enough for a three-stage pipeline: same time with two slots
    assert solo(cluster, 0, 1, chunks * chunk, ChunkPlan("pipelined", chunk),
                world=2).end == plan.end


def test_one_staging_slot_serialises_copy_out_and_link() -> None:
    """With one slot, chunk i's copy-out waits for chunk i-1's link stage and its link
    stage for chunk i-1's copy-in: the period is d2 + max(d1, d3), not max(d1, d2, d3)."""
    d1, d2, d3, n = 3000, 5000, 3000, 50  # 6000-byte chunks: copies at 2 GB/s, link 1.2 GB/s
    cluster = path(link_bw=1.2e9, link_lat=0.0, copy_bw=2e9, copy_lat=0.0)
    plan = ChunkPlan("pipelined", 6000)
    for trace in (None, []):
        one = fresh(cluster, staging_slots=1).transfer(0, 1, n * 6000, now=0, plan=plan,
                                                        trace=trace)
        assert one.duration == d1 + d2 + d3 + (n - 1) * (d2 + max(d1, d3))
        two = fresh(cluster, staging_slots=2).transfer(0, 1, n * 6000, now=0, plan=plan,
                                                        trace=trace)
        assert two.duration == d1 + d2 + d3 + (n - 1) * max(d1, d2, d3)


# -- bounds -------------------------------------------------------------------------------

rates = st.floats(1e8, 1e12)


@settings(max_examples=150, deadline=None)
@given(nbytes=st.integers(1, GiB), link_bw=rates, copy_bw=st.one_of(rates, st.just(INF)),
       link_lat=st.floats(1e-7, 2e-5), copy_lat=st.floats(0, 1e-5), slots=st.integers(1, 4),
       split=st.one_of(st.none(), st.integers(1, 1 << 20)))
def test_speedup_never_passes_the_number_of_stages(
        nbytes: int, link_bw: float, copy_bw: float, link_lat: float, copy_lat: float,
        slots: int, split: int | None) -> None:
    cluster = path(link_bw=link_bw, link_lat=link_lat, copy_bw=copy_bw, copy_lat=copy_lat)
    sf = solo(cluster, 0, 1, nbytes, ChunkPlan("sync", nbytes), world=2, staging_slots=slots)
    plan = None if split is None else ChunkPlan("pipelined", max(1, nbytes // split))
    pipe = solo(cluster, 0, 1, nbytes, plan, world=2, strategy=Pipelined(),
                staging_slots=slots)
    assert sf.duration <= 3 * pipe.duration
    slowest = min(link_bw, copy_bw)
    assert pipe.bandwidth <= slowest * (1 + 1e-9)
    assert sf.bandwidth <= slowest * (1 + 1e-9)


def _pairs(cluster: Cluster) -> list[tuple[int, int]]:
    """One (src, dst) pair of each kind the cluster has, for 16 ranks."""
    found: dict[str, tuple[int, int]] = {}
    for dst in range(1, 16):
        found.setdefault(cluster.link_kind(0, dst), (0, dst))
    return list(found.values())


@settings(max_examples=200, deadline=None)
@given(preset=st.sampled_from(Cluster.presets()), nbytes=st.integers(1, GiB),
       strategy=st.sampled_from([DefaultStrategy(), StoreAndForward(), Pipelined()]))
def test_bandwidth_never_passes_the_line_rate(preset: str, nbytes: int, strategy: Any) -> None:
    cluster = Cluster.preset(preset).fit(16)
    for src, dst in _pairs(cluster):
        plan = solo(cluster, src, dst, nbytes, strategy=strategy)
        link = cluster.link(src, dst)
        assert plan.bandwidth <= link.effective_bandwidth * (1 + 1e-9) <= link.bandwidth * 1.001


def test_the_seed_articles_roce_figures_are_impossible() -> None:
    """Its table claims 28.1 GB/s at 128 MB and 35.4 GB/s at 1 GB over 100G RoCE: above the
    12.5 GB/s line rate.  Its 'default' 11.7 GB/s at 1 GB is possible."""
    cluster = Cluster.preset("roce100g")
    for nbytes, claimed in ((128 * MiB, 28.1e9), (GiB, 35.4e9)):
        best = max(solo(cluster, 0, 1, nbytes, strategy=s).bandwidth
                   for s in (StoreAndForward(), Pipelined(), DefaultStrategy(),
                             Pipelined(4 * MiB), Pipelined(16 * MiB)))
        assert best < 12.5e9 < claimed
    assert solo(cluster, 0, 1, GiB).bandwidth > 11.7e9


@pytest.mark.parametrize("nbytes", [128 * MB, 128 * MiB, 256 * MiB, GB, GiB])
def test_roce100g_pipelining_meets_the_design_target(nbytes: int) -> None:
    """The pipelining target: on a balanced 3-stage path, pipelined >= 2.8x store-and-forward at
    >= 128 MB, and >= 95% of the slowest stage."""
    cluster = Cluster.preset("roce100g")
    sf = solo(cluster, 0, 1, nbytes, strategy=StoreAndForward())
    pipe = solo(cluster, 0, 1, nbytes)  # the default strategy
    assert pipe.mode == "pipelined"
    assert sf.duration / pipe.duration >= 2.8
    assert cluster.inter is not None
    slowest = min(cluster.inter.effective_bandwidth, cluster.device.copy_bandwidth)
    assert pipe.bandwidth >= 0.95 * slowest


# -- contention ---------------------------------------------------------------------------

ONE_LINK = [
    ("ascend910b", (0, 1), (0, 1)),  # the same HCCS link
    ("ascend910", (0, 4), (1, 5)),  # the same PCIe group-to-group path of node 0
    ("ascend910b", (0, 8), (1, 8)),  # the same destination NIC
    ("nvlink4", (1, 0), (2, 0)),  # the same NVSwitch ingress port
]


@pytest.mark.parametrize(("preset", "first", "second"), ONE_LINK)
def test_transfers_on_one_fifo_link_queue(preset: str, first: tuple[int, int],
                                          second: tuple[int, int]) -> None:
    cluster = fifo(Cluster.preset(preset).fit(16))
    alone = solo(cluster, *first, 128 * MiB)
    model = ClusterModel(cluster, 16)
    a = model.transfer(*first, 128 * MiB, now=0)
    b = model.transfer(*second, 128 * MiB, now=0)
    assert a == alone
    assert b.end > a.end
    assert b.end == pytest.approx(2 * alone.duration, rel=0.05)


@pytest.mark.parametrize(("preset", "first", "second"), ONE_LINK)
def test_transfers_on_one_fair_link_share_it(preset: str, first: tuple[int, int],
                                             second: tuple[int, int]) -> None:
    cluster = Cluster.preset(preset).fit(16)
    alone = solo(cluster, *first, 128 * MiB)
    model = ClusterModel(cluster, 16)
    a = model.start(*first, 128 * MiB, now=0)
    b = model.start(*second, 128 * MiB, now=0)
    assert a.end is None and b.end is None  # moving: their rates may still change
    assert model.settle() == [a, b]
    assert a.end is not None and b.end is not None
    assert a.end == pytest.approx(2 * alone.duration, rel=0.05)  # both at half the rate
    assert b.end == pytest.approx(2 * alone.duration, rel=0.05)


@pytest.mark.parametrize(("preset", "first", "second"), [
    ("ascend910b", (0, 1), (2, 3)),
    ("ascend910b", (0, 1), (1, 0)),  # links are directed
    ("ascend910b", (0, 8), (1, 9)),  # one NIC per device
    ("ascend910", (0, 4), (4, 0)),  # PCIe paths are directed
    ("ascend910", (0, 4), (8, 12)),  # each server has its own PCIe switch
    ("nvlink4", (0, 1), (2, 3)),
    ("roce100g", (0, 1), (2, 3)),
])
def test_transfers_on_different_links_do_not_interfere(
        preset: str, first: tuple[int, int], second: tuple[int, int]) -> None:
    cluster = Cluster.preset(preset).fit(16)
    model = ClusterModel(cluster, 16)
    assert model.transfer(*first, 64 * MiB, now=0) == solo(cluster, *first, 64 * MiB)
    assert model.transfer(*second, 64 * MiB, now=0) == solo(cluster, *second, 64 * MiB)


def test_a_later_transfer_starts_when_the_resource_is_free() -> None:
    model = fresh(path(copy_bw=INF))
    a = model.transfer(0, 1, 10 * MB, now=0, plan=ChunkPlan("sync", 10 * MB))
    b = model.transfer(0, 1, 10 * MB, now=a.end + 5, plan=ChunkPlan("sync", 10 * MB))
    assert b.start == a.end + 5 and b.duration == a.duration


# -- the fast path equals the chunk-by-chunk simulation, and the rules hold per chunk ------

def _check_rules(trace: list[ChunkTiming], slots: int, now: int) -> None:
    assert trace[0].copy_out[0] >= now
    for i, t in enumerate(trace):
        assert t.index == i
        assert t.copy_out[1] <= t.link[0] and t.link[1] <= t.copy_in[0]  # stages in order
        if i:
            prev = trace[i - 1]  # FIFO: each resource serves one chunk at a time
            assert prev.copy_out[1] <= t.copy_out[0]
            assert prev.link[1] <= t.link[0]
            assert prev.copy_in[1] <= t.copy_in[0]
        if i >= slots:  # double buffering: a staging slot frees when its chunk moves on
            assert t.copy_out[0] >= trace[i - slots].link[1]
            assert t.link[0] >= trace[i - slots].copy_in[1]


transfers = st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 4 * MiB),
                      st.integers(0, 2_000_000))


@settings(max_examples=150, deadline=None)
@given(history=st.lists(transfers, max_size=4), nbytes=st.integers(0, 64 * MiB),
       chunks=st.integers(1, 2000), extra=st.integers(0, 4096), slots=st.integers(1, 5),
       link_bw=rates, copy_bw=rates, link_lat=st.floats(0, 1e-5), copy_lat=st.floats(0, 1e-5))
def test_fast_path_equals_chunk_by_chunk(
        history: list[tuple[int, int, int, int]], nbytes: int, chunks: int, extra: int,
        slots: int, link_bw: float, copy_bw: float, link_lat: float, copy_lat: float) -> None:
    chunk = max(1, nbytes // chunks + extra)  # at most ~2 * chunks, the last one short
    cluster = path(link_bw=link_bw, link_lat=link_lat, copy_bw=copy_bw, copy_lat=copy_lat,
                   sharing="fifo")
    fast, slow = (ClusterModel(cluster, 4, staging_slots=slots) for _ in range(2))
    for src, dst, size, now in history:  # contention left behind by earlier transfers
        assert fast.transfer(src, dst, size, now=now) == slow.transfer(src, dst, size, now=now,
                                                                         trace=[])
    trace: list[ChunkTiming] = []
    plan = ChunkPlan("pipelined", chunk)
    got = fast.transfer(0, 1, nbytes, now=1_000_000, plan=plan)
    assert got == slow.transfer(0, 1, nbytes, now=1_000_000, plan=plan, trace=trace)
    assert {k: (r.free_at, r.busy) for k, r in fast.resources.items()} == {
        k: (r.free_at, r.busy) for k, r in slow.resources.items()}
    assert len(trace) == got.chunks and sum(t.nbytes for t in trace) == nbytes
    assert (trace[0].copy_out[0], trace[-1].copy_in[1]) == (got.start, got.end)
    _check_rules(trace, slots, 1_000_000)


def test_many_chunks_plan_in_closed_form() -> None:
    """16384 chunks of 64 KiB: the fast path takes a handful of steps (it must equal the
    traced simulation, which takes one per chunk)."""
    cluster = Cluster.preset("roce100g")
    plan = ChunkPlan("pipelined", 64 * 1024)
    trace: list[ChunkTiming] = []
    traced = ClusterModel(cluster, 2).transfer(0, 1, GiB, now=0, plan=plan, trace=trace)
    assert ClusterModel(cluster, 2).transfer(0, 1, GiB, now=0, plan=plan) == traced
    assert traced.chunks == len(trace) == 16384


def test_same_calls_give_same_plans() -> None:
    calls = [(s, d, n, t) for s, d, n, t in
             [(0, 1, 1 << 26, 0), (1, 0, 4096, 10), (2, 9, 1 << 30, 10), (0, 1, 70_000, 500),
              (3, 3, 1 << 20, 900), (9, 2, 0, 1000), (0, 15, 5 << 20, 1000)]]
    runs = []
    for _ in range(2):
        model = ClusterModel(Cluster.preset("ascend910"), 16)
        runs.append([model.transfer(s, d, n, now=t) for s, d, n, t in calls])
    assert runs[0] == runs[1]


# -- modes, special cases, accounting ----------------------------------------------------

@pytest.mark.parametrize(("nbytes", "mode"), [
    (0, "async"), (1, "async"), (65536, "async"), (65537, "sync"), (MiB - 1, "sync"),
    (MiB, "pipelined"), (GiB, "pipelined"),
])
def test_default_strategy_thresholds(nbytes: int, mode: str) -> None:
    c = Cluster.preset("roce100g")
    assert c.inter is not None
    for world in (2, 1024):  # the rank count does not move the thresholds
        assert DefaultStrategy().choose(nbytes, c.inter, c.device, world).mode == mode


def test_async_frees_the_sender_when_its_data_is_staged() -> None:
    model = fresh(path(copy_bw=1e9, copy_lat=1e-6))
    plan = model.transfer(0, 1, 4096, now=0)
    assert plan.mode == "async"
    assert plan.sender_done == round(stage_ns(1e-6, 4096, 1e9)) < plan.end


def test_zero_bytes_cost_latencies_only() -> None:
    plan = solo(path(link_lat=2e-6, copy_bw=1e9, copy_lat=1e-6), 0, 1, 0, world=2)
    assert (plan.chunks, plan.duration, plan.bandwidth) == (1, 1000 + 2000 + 1000, 0.0)


def test_a_same_rank_transfer_is_one_device_copy() -> None:
    model = fresh(path(copy_bw=10e9, copy_lat=1e-6))
    plan = model.transfer(1, 1, 10 * MB, now=7)
    assert plan == TransferPlan(10 * MB, "sync", 1, 10 * MB, 7, 7 + 1_001_000, 7 + 1_001_000, 0)
    assert model.link_busy(1) == 0


def test_link_busy_counts_the_link_stage_of_each_sender() -> None:
    model = ClusterModel(Cluster.preset("ascend910b"), 16)
    plans = [model.transfer(0, 1, MiB, now=0), model.transfer(0, 9, 8 * MiB, now=0),
             model.transfer(2, 0, MiB, now=0)]
    assert model.link_busy(0) == plans[0].link_busy + plans[1].link_busy
    assert model.link_busy(2) == plans[2].link_busy and model.link_busy(1) == 0
    assert plans[1].link_busy >= round(8 * MiB / model.cluster.link(0, 9).effective_bandwidth
                                       * 1e9)
    assert model.resources["inter:roce200g-out[0]"].busy == plans[1].link_busy


def test_control_messages_take_one_latency() -> None:
    model = ClusterModel(Cluster.preset("ascend910"), 16)
    assert model.control(0, 1, now=100) == 2100
    assert model.control(0, 4, now=100) == 3100
    assert model.control(0, 8, now=0) == 2000
    assert model.control(3, 3, now=5) == 5
    assert model.resources == {}  # holds nothing


def test_compute_durations() -> None:
    model = ClusterModel(Cluster.preset("ascend910"), 2)
    assert model.compute_ns(0, seconds=1.5e-3) == 1_500_000
    assert model.compute_ns(1, flops=256e12 * 2e-3) == 2_000_000
    assert model.compute_ns(1, flops=0) == 0


@pytest.mark.parametrize(("kwargs", "exc", "message"), [
    ({}, TypeError, "compute takes exactly one of seconds= or flops="),
    ({"seconds": 1, "flops": 1}, TypeError, "compute takes exactly one of seconds= or flops="),
    ({"seconds": -1.0}, ValueError, "seconds must be a finite number >= 0, got -1.0"),
    ({"flops": INF}, ValueError, "flops must be a finite number >= 0, got inf"),
    ({"seconds": "1"}, TypeError, "seconds must be a number, got str"),
])
def test_compute_validation(kwargs: dict[str, Any], exc: type[Exception], message: str) -> None:
    with pytest.raises(exc, match=exact(message)):
        ClusterModel(Cluster.preset("ascend910"), 2).compute_ns(0, **kwargs)


@pytest.mark.parametrize(("call", "exc", "message"), [
    (lambda m: m.transfer(0, 2, 1, now=0), ValueError, "dst 2 out of range for a world of 2"),
    (lambda m: m.transfer(-1, 0, 1, now=0), ValueError, "src must be >= 0, got -1"),
    (lambda m: m.transfer(0, 1, -1, now=0), ValueError, "nbytes must be >= 0, got -1"),
    (lambda m: m.transfer(0, 1, 1.0, now=0), TypeError, "nbytes must be an int, got float"),
    (lambda m: m.transfer(0, 1, 1, now=-5), ValueError, "now must be >= 0, got -5"),
    (lambda m: m.transfer(0, 1, 1, now=0.5), TypeError, "now must be an int, got float"),
    (lambda m: m.transfer(True, 1, 1, now=0), TypeError, "src must be an int, got bool"),
    (lambda m: m.transfer(0, 1, 1, now=0, plan="sync"), TypeError,
     "plan must be a ChunkPlan or None, got str"),
    (lambda m: m.control(0, 5, now=0), ValueError, "dst 5 out of range for a world of 2"),
    (lambda m: m.link_busy(2), ValueError, "rank 2 out of range for a world of 2"),
    (lambda m: ClusterModel(Cluster.preset("roce100g", nodes=2), 3), ValueError,
     "world_size 3 does not fit cluster 'roce100g': 2 nodes x 1 ranks per node = 2 ranks"),
    (lambda m: ClusterModel("roce100g", 3), TypeError,  # type: ignore[arg-type]
     "cluster must be a Cluster, got str"),
    (lambda m: ClusterModel(m.cluster, 2, staging_slots=0), ValueError,
     "staging_slots must be >= 1, got 0"),
    (lambda m: ChunkPlan("eager", 1), ValueError,
     "mode must be one of sync, async, pipelined; got 'eager'"),
    (lambda m: ChunkPlan("sync", 0), ValueError, "chunk_bytes must be >= 1, got 0"),
    (lambda m: DefaultStrategy(async_max=MiB, pipeline_min=MiB), ValueError,
     "async_max (1048576) must be < pipeline_min (1048576)"),
    (lambda m: Pipelined(0), ValueError, "chunk_bytes must be >= 1, got 0"),
    (lambda m: Resource("r").reserve(0, -1), ValueError, "duration must be >= 0 ns, got -1"),
])
def test_bad_arguments(call: Any, exc: type[Exception], message: str) -> None:
    with pytest.raises(exc, match=exact(message)):
        call(fresh(path()))


def test_a_strategy_must_return_a_chunk_plan() -> None:
    class Bad:
        def choose(self, *args: object) -> object:
            return "pipelined"

    model = fresh(path(), strategy=Bad())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=exact("the strategy must return a ChunkPlan, got str")):
        model.transfer(0, 1, 10, now=0)


def test_resource_is_fifo() -> None:
    r = Resource("link")
    assert r.reserve(10, 5) == (10, 15)
    assert r.reserve(0, 5) == (15, 20)  # ready earlier, but the resource was busy
    assert r.reserve(100, 0) == (100, 100)
    assert (r.free_at, r.busy) == (100, 10)


# -- the adaptive chunk -------------------------------------------------------------------

@pytest.mark.parametrize(("args", "kwargs", "expected"), [
    # c* = sqrt(S a B / 2) = 3,626,753 -> 296 equal chunks of ceil(S / 296)
    ((GiB, 2e-6, 12.25e9), {}, 3_627_507),
    ((128 * MiB, 2e-6, 12.25e9), {}, 1_278_265),  # c* = 1,282,251 -> 105 chunks
    ((MiB, 2e-6, 12.25e9), {}, 116_509),  # c* = 113,336 -> 9 chunks
    ((MiB, 2e-6, 12.25e9), {"min_chunk": 512 * 1024}, 512 * 1024),
    ((100_000, 2e-6, 12.25e9), {}, 65536),  # c* below min_chunk
    ((1000, 2e-6, 12.25e9), {}, 1000),  # never more than the message
    ((0, 2e-6, 12.25e9), {}, 1),
    ((GiB, 0.0, 12.25e9), {}, 65536),  # no per-chunk cost: the smallest chunk
    ((GiB, 2e-6, INF), {}, GiB),  # bytes cost nothing: one chunk
    ((GiB, 2e-6, 12.25e9), {"stages": 1}, GiB),  # one stage: nothing to overlap
    # fast copies count less than a stage: fewer, bigger chunks (c* = 29.3 MB, 37 chunks)
    ((GiB, 2e-6, 28e9), {"stages": 1.07}, 29_020_050),
])
def test_adaptive_chunk(args: tuple[int, float, float], kwargs: dict[str, Any],
                        expected: int) -> None:
    assert adaptive_chunk(*args, **kwargs) == expected


def test_adaptive_chunk_is_the_optimum_of_the_model() -> None:
    """On the balanced roce100g path no fixed chunk size beats the adaptive one by > 1%."""
    cluster = Cluster.preset("roce100g")
    best = solo(cluster, 0, 1, 256 * MiB, strategy=Pipelined()).duration
    for chunk in (256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20):
        assert best <= 1.01 * solo(cluster, 0, 1, 256 * MiB, ChunkPlan("pipelined", chunk)).duration


@pytest.mark.parametrize(("args", "message"), [
    ((10, -1.0, 1e9), "need latency >= 0, bandwidth > 0 and stages >= 1; got latency=-1.0, "
                      "bandwidth=1000000000.0, stages=3"),
    ((10, 1e-6, 0.0), "need latency >= 0, bandwidth > 0 and stages >= 1; got latency=1e-06, "
                      "bandwidth=0.0, stages=3"),
    ((-1, 1e-6, 1e9), "nbytes must be >= 0, got -1"),
])
def test_adaptive_chunk_validation(args: tuple[int, float, float], message: str) -> None:
    with pytest.raises(ValueError, match=exact(message)):
        adaptive_chunk(*args)
