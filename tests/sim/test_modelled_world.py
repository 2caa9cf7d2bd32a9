"""Worlds on a cluster model: transfers and compute take modelled time, on the virtual clock
(and on the scaled wall clock), and the numbers agree with the model's closed forms."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import asynccomm as ac
from asynccomm.sim import Cluster, ClusterModel, Pipelined, StoreAndForward

MB = 1 << 20


def one_transfer(nbytes: int, preset: str, strategy: object = None) -> tuple[float, ac.Request]:
    """Model seconds from posting a pre-posted recv's matching send to its completion."""

    async def main(comm: ac.Communicator) -> tuple[float, ac.Request]:
        loop = asyncio.get_running_loop()
        if comm.rank == 1:
            out = np.zeros(nbytes, np.uint8)
            req = comm.irecv(out, 0)
            await req
            assert out[-1:].tolist() == [7] * min(1, nbytes)
            return loop.time(), req
        await comm.compute(seconds=1.0)  # the recv is posted long before the send
        req = comm.isend(np.full(nbytes, 7, np.uint8), 1)
        await req
        return loop.time() - 1.0, req

    results = ac.run(main, 2, cluster=Cluster.preset(preset), strategy=strategy)
    return results[1][0] - 1.0, results[1][1]


@pytest.mark.parametrize("preset", ["roce100g", "ascend910b"])
@pytest.mark.parametrize("nbytes", [MB, 16 * MB, 128 * MB])
def test_a_transfer_takes_what_the_model_plans(preset: str, nbytes: int) -> None:
    elapsed, req = one_transfer(nbytes, preset)
    model = ClusterModel(Cluster.preset(preset).fit(2), 2)
    cts = model.control(1, 0, now=model.control(0, 1, now=0))  # request-to-send, clear-to-send
    plan = model.transfer(0, 1, nbytes, now=cts)
    assert elapsed == pytest.approx(plan.end * 1e-9, abs=1e-9)
    assert req.record is not None
    assert req.record.nbytes == nbytes and req.record.chunks == plan.chunks
    line_rate = Cluster.preset(preset).fit(2).link(0, 1).bandwidth
    assert req.record.bandwidth <= line_rate


def test_pipelining_beats_store_and_forward_on_a_balanced_three_stage_path() -> None:
    saf, _ = one_transfer(128 * MB, "roce100g", StoreAndForward())
    pipe, _ = one_transfer(128 * MB, "roce100g", Pipelined())
    assert 2.8 <= saf / pipe <= 3.0  # approaches the number of stages, never passes it


def test_eager_messages_arrive_after_their_modelled_transfer() -> None:
    async def main(comm: ac.Communicator) -> float:
        loop = asyncio.get_running_loop()
        if comm.rank == 0:
            await comm.send(np.ones(1024, np.uint8), 1)
            return loop.time()  # the sender is free once its data is staged
        await comm.recv(np.zeros(1024, np.uint8), 0)
        return loop.time()

    sent, received = ac.run(main, 2, cluster=Cluster.preset("roce100g"))
    link = Cluster.preset("roce100g").fit(2).link(0, 1)
    assert 0 < sent < received
    assert received >= link.latency + 1024 / link.bandwidth


def test_messages_do_not_overtake_under_the_model() -> None:
    async def main(comm: ac.Communicator) -> list[int]:
        if comm.rank == 0:
            sizes = [4 * MB, 8, 2 * MB, 16]  # rendezvous and eager, interleaved, one tag
            await ac.wait_all([comm.isend(np.full(n, i, np.uint8), 1, 3)
                               for i, n in enumerate(sizes)])
            return []
        seen = []
        for _ in range(4):
            arr, _status = await comm.recv_new(0, 3)
            seen.append(int(arr[0]))
        return seen

    assert ac.run(main, 2, cluster=Cluster.preset("ascend910b"))[1] == [0, 1, 2, 3]


def test_two_transfers_on_one_link_queue_and_on_two_links_do_not() -> None:
    n = 64 * MB

    async def main(comm: ac.Communicator) -> float:
        loop = asyncio.get_running_loop()
        if comm.rank == 0:
            await ac.wait_all([comm.isend(np.zeros(n, np.uint8), 1, t) for t in (1, 2)])
        elif comm.rank == 1:
            await ac.wait_all([comm.irecv(np.zeros(n, np.uint8), 0, t) for t in (1, 2)])
        elif comm.rank == 2:
            await comm.send(np.zeros(n, np.uint8), 3)
        else:
            await comm.recv(np.zeros(n, np.uint8), 2)
        return loop.time()

    t = ac.run(main, 4, cluster=Cluster.preset("ascend910b"))
    assert t[1] == pytest.approx(2 * t[3], rel=0.05)  # same link: one after the other
    assert t[3] == pytest.approx(t[2], rel=1e-6)


@pytest.mark.parametrize("compute_s", [0.002, 0.02])
def test_communication_overlaps_compute_issued_together(compute_s: float) -> None:
    n = 128 * MB
    model = ClusterModel(Cluster.preset("roce100g").fit(2), 2)
    plan = model.transfer(0, 1, n, now=0)
    comm_s = plan.end * 1e-9

    async def main(comm: ac.Communicator) -> tuple[float, ac.RankSummary]:
        loop = asyncio.get_running_loop()
        if comm.rank == 0:
            req = comm.isend(np.zeros(n, np.uint8), 1)
            await comm.compute(seconds=compute_s)  # the next layer computes meanwhile
            await req
        else:
            await comm.recv(np.zeros(n, np.uint8), 0)
        return loop.time(), comm.summary()

    (t0, summary), _ = ac.run(main, 2, cluster=Cluster.preset("roce100g"))
    bound = 1.05 * max(comm_s, compute_s) + plan.chunk_bytes / 12.5e9
    assert t0 <= bound
    assert summary.hidden == pytest.approx(min(compute_s, summary.comm_time), rel=0.05)
    assert summary.bytes_sent == n and summary.compute_time == pytest.approx(compute_s)


def test_two_virtual_runs_are_identical() -> None:
    async def main(comm: ac.Communicator) -> list[tuple[float, float]]:
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        for step in range(3):
            await comm.compute(seconds=1e-3 * (comm.rank + 1))
            await comm.sendrecv(np.zeros((step + 1) * MB, np.uint8), right,
                                np.zeros((step + 1) * MB, np.uint8), left)
        return [(r.start, r.end) for r in comm.records()]

    first = ac.run(main, 6, cluster=Cluster.preset("ascend910"))
    assert first == ac.run(main, 6, cluster=Cluster.preset("ascend910"))
    assert len(first[0]) == 9  # 3 compute, 3 sends, 3 recvs


def test_device_memory_is_counted_and_returned() -> None:
    async def main(comm: ac.Communicator) -> tuple[int, int]:
        dev = comm.device
        assert dev.capacity == Cluster.preset("ascend910").device.memory
        a = dev.alloc((1024, 1024), np.float32)
        assert dev.in_use == 4 * MB
        with pytest.raises(ac.OutOfDeviceMemoryError) as info:
            dev.alloc(dev.capacity, np.uint8)
        assert info.value.requested == dev.capacity and info.value.in_use == 4 * MB
        dev.free(a)
        with pytest.raises(ValueError, match="was not allocated"):
            dev.free(a)
        b = dev.alloc(10, np.float64)
        del b  # garbage collected: returned
        return dev.in_use, dev.capacity

    in_use, _ = ac.run(main, 1, cluster=Cluster.preset("ascend910"))[0]
    assert in_use == 0


def test_flops_use_the_device_rate() -> None:
    async def main(comm: ac.Communicator) -> float:
        await comm.compute(flops=comm.device.flops * 0.5)
        return asyncio.get_running_loop().time()

    assert ac.run(main, 1, cluster=Cluster.preset("ascend910b")) == [pytest.approx(0.5)]


def test_wall_clock_runs_the_model_in_scaled_real_time() -> None:
    async def main(comm: ac.Communicator) -> float:
        if comm.rank == 0:
            await comm.send(np.zeros(16 * MB, np.uint8), 1)
        else:
            await comm.recv(np.zeros(16 * MB, np.uint8), 0)
        return comm.model_time()

    virtual = ac.run(main, 2, cluster=Cluster.preset("roce100g"))
    wall = ac.run(main, 2, cluster=Cluster.preset("roce100g"), clock="wall", time_scale=10.0)
    # Real timers fire late, never early: model time on the wall clock is at least the plan.
    assert wall[1] >= virtual[1] * 0.999


def test_summary_without_a_cluster_is_measured() -> None:
    async def main(comm: ac.Communicator) -> ac.sim.RankSummary:
        buf = np.zeros(8)
        if comm.rank == 0:
            await comm.send(buf, 1)
        else:
            await comm.recv(buf, 0)
        return comm.summary()

    sender, receiver = ac.run(main, 2)
    assert not sender.modelled and sender.link_busy == 0.0
    assert (sender.bytes_sent, receiver.bytes_received, sender.messages) == (64, 64, 1)
    assert [p.peer for p in receiver.peers] == [0] and receiver.peers[0].recvs == 1


@pytest.mark.parametrize("clock", ["virtual", "wall"])
def test_a_message_in_flight_from_a_closing_rank_is_delivered(clock: str) -> None:
    async def main(comm: ac.Communicator) -> float:
        if comm.rank == 0:
            await comm.send(np.arange(8.0), 1)  # eager: done once staged, then rank 0 closes
            return 0.0
        out = np.zeros(8)
        await comm.recv(out, 0)  # posted before the message lands
        return float(out[-1])

    for _ in range(5):  # real timers fire up to their resolution early: try a few times
        assert ac.run(main, 2, cluster=Cluster.preset("roce100g"), clock=clock,
                      time_scale=100.0)[1] == 7.0
