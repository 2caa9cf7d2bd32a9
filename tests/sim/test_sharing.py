"""Fair sharing: concurrent transfers on a link share it max-min fairly, in closed form
(equal flows, a flow joining half-way, incast, all-to-all on a full mesh and on a switch),
and the flow engine is deterministic and work-conserving."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asynccomm as ac
from asynccomm.sim import ChunkPlan, Cluster, ClusterModel, DeviceSpec, LinkSpec
from asynccomm.sim.sharing import FairShare, Flow

INF = float("inf")
MB = 10**6
T = 1_000_000  # ns: one MB over the 1 GB/s links below
FREE_COPIES = DeviceSpec("d", 1e12, 1 << 30, INF, 0.0)  # copies cost nothing


def mesh(devices: int = 4, *, switched: bool = False, sharing: str = "fair") -> Cluster:
    """One node; a dedicated 1 GB/s link per pair (or a switch port per device), no
    latency, free copies: a transfer of 1 MB takes exactly T alone."""
    return Cluster(nodes=1, devices_per_node=devices, switched_intra=switched,
                   intra=LinkSpec("l", 1e9, 0.0, sharing=sharing), inter=None,
                   device=FREE_COPIES)


def start(model: ClusterModel, src: int, dst: int, now: int = 0, nbytes: int = MB):
    return model.start(src, dst, nbytes, now=now, plan=ChunkPlan("sync", nbytes))


def test_a_lone_transfer_takes_its_idle_time() -> None:
    model = ClusterModel(mesh(), 4)
    moving = start(model, 0, 1)
    assert model.next_event() == 0 and moving.end is None
    assert model.advance(T - 1) == [] and moving.end is None
    assert model.advance(T) == [moving] and moving.end == T
    assert model.next_event() is None


def test_two_equal_flows_on_one_link_each_take_twice_as_long() -> None:
    model = ClusterModel(mesh(), 4)
    a, b = start(model, 0, 1), start(model, 0, 1)
    model.settle()
    assert (a.end, b.end) == (2 * T, 2 * T)


def test_a_flow_joining_half_way_slows_the_first_from_then_on() -> None:
    model = ClusterModel(mesh(), 4)
    a = start(model, 0, 1)
    assert model.advance(T // 2) == []
    b = start(model, 0, 1, now=T // 2)
    model.settle()
    # a: half alone, the other half at half rate; b: half at half rate, the rest alone
    assert (a.end, b.end) == (3 * T // 2, 2 * T)


def test_a_predicted_end_counts_the_transfers_known_so_far() -> None:
    model = ClusterModel(mesh(), 4)
    first = model.transfer(0, 1, MB, now=0, plan=ChunkPlan("sync", MB))
    second = model.transfer(0, 1, MB, now=T // 2, plan=ChunkPlan("sync", MB))
    assert (first.end, second.end) == (T, 2 * T)  # the first's prediction came before
    assert [t.end for t in model.settle()] == [3 * T // 2, 2 * T]


@pytest.mark.parametrize("k", [2, 3, 7])
def test_incast_of_k_flows_shares_the_destination_port(k: int) -> None:
    cluster = Cluster(nodes=k + 1, devices_per_node=1, intra=LinkSpec("l", 1e9, 0.0),
                      inter=LinkSpec("nic", 1e9, 0.0), device=FREE_COPIES)
    model = ClusterModel(cluster, k + 1)
    flows = [start(model, src, 0) for src in range(1, k + 1)]
    model.settle()
    assert [f.end for f in flows] == [k * T] * k


@pytest.mark.parametrize("p", [3, 4, 8])
def test_all_to_all_on_a_full_mesh_and_on_a_switch(p: int) -> None:
    pairs = [(s, d) for s in range(p) for d in range(p) if s != d]
    on_mesh = ClusterModel(mesh(p), p)
    mesh_flows = [start(on_mesh, s, d) for s, d in pairs]
    on_mesh.settle()
    assert {f.end for f in mesh_flows} == {T}  # a link of its own per pair
    on_switch = ClusterModel(mesh(p, switched=True), p)
    switch_flows = [start(on_switch, s, d) for s, d in pairs]
    on_switch.settle()
    assert {f.end for f in switch_flows} == {(p - 1) * T}  # p-1 flows per port
    ring = ClusterModel(mesh(p, switched=True), p)
    ring_flows = [start(ring, r, (r + 1) % p) for r in range(p)]
    ring.settle()
    assert {f.end for f in ring_flows} == {T}  # one flow per port


def test_fifo_links_queue_instead() -> None:
    model = ClusterModel(mesh(sharing="fifo"), 4)
    a, b = start(model, 0, 1), start(model, 0, 1)
    assert (a.end, b.end) == (T, 2 * T)  # known at once: nothing to settle
    assert model.settle() == []


def test_a_flow_below_its_fair_share_leaves_the_rest_to_the_other() -> None:
    share = FairShare()
    slow = Flow((("link", 0.5),), 1000, 0)  # its copy engine keeps the link half busy
    fast = Flow((("link", 1.0),), 1000, 0)
    share.add(slow)
    share.add(fast)
    assert share.advance() == [slow, fast]
    # slow keeps its 0.5; fast gets the other half, then the whole link
    assert (slow.finish, fast.finish) == (1000, 1500)


def test_flows_on_different_resources_do_not_interfere() -> None:
    share = FairShare()
    flows = [Flow(((f"link{i}", 1.0), ("engine", 0.1)), 1000, 0) for i in range(5)]
    for flow in flows:
        share.add(flow)
    share.advance()
    assert [f.finish for f in flows] == [1000] * 5  # the engine has room for all five


@settings(max_examples=60, deadline=None)
@given(works=st.lists(st.integers(0, 10**9), min_size=1, max_size=12))
def test_processor_sharing_closed_form(works: list[int]) -> None:
    """Flows that start together on one link end as processor sharing says: the i-th
    smallest at sum(smaller works) + (n - i) * its work."""
    share = FairShare()
    flows = [Flow((("link", 1.0),), w, 0) for w in works]
    for flow in flows:
        share.add(flow)
    share.advance()
    ordered = sorted(works)
    n = len(works)
    for flow in flows:
        i = ordered.index(flow.work)
        expected = sum(ordered[:i]) + (n - i) * flow.work
        assert flow.finish is not None and abs(flow.finish - expected) <= n


@settings(max_examples=40, deadline=None)
@given(calls=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3),
                                st.integers(0, 4 * MB), st.integers(0, 3 * T)),
                      min_size=1, max_size=10))
def test_same_calls_give_same_times_and_sharing_never_speeds_a_transfer(
        calls: list[tuple[int, int, int, int]]) -> None:
    runs = []
    for _ in range(2):
        model = ClusterModel(Cluster.preset("ascend910b"), 16)
        moving = [(model.start(s, d, n, now=t), ClusterModel(Cluster.preset("ascend910b"), 16)
                   .transfer(s, d, n, now=t)) for s, d, n, t in sorted(calls, key=lambda c: c[3])]
        model.settle()
        for m, alone in moving:
            assert m.end is not None and m.end >= alone.end
        runs.append([m.end for m, _ in moving])
    assert runs[0] == runs[1]


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 8, 4096, 60_000, 70_000, 1 << 20]), min_size=2,
                      max_size=6),
       flood=st.sampled_from([0, 4096, 1 << 20]))
def test_messages_do_not_overtake_while_they_share_a_port(sizes: list[int],
                                                          flood: int) -> None:
    """Rank 0's messages to rank 8 (another server: a NIC port each) arrive in posting
    order, though a small one behind a large one would end first on its own and rank 1
    floods the same ingress port."""
    async def main(comm: ac.Communicator) -> list[int]:
        if comm.rank == 0:
            await ac.wait_all([comm.isend(np.full(max(n, 1), i, np.uint8), 8, 5)
                               for i, n in enumerate(sizes)])
        elif comm.rank == 1 and flood:
            await comm.send(np.zeros(flood, np.uint8), 8, 6)
        elif comm.rank == 8:
            seen = []
            for _ in sizes:
                arr, _status = await comm.recv_new(0, 5)
                seen.append(int(arr[0]))
            if flood:
                await comm.recv(np.zeros(flood, np.uint8), 1, 6)
            return seen
        return []

    assert ac.run(main, 16, cluster=Cluster.preset("ascend910b"))[8] == list(range(len(sizes)))
