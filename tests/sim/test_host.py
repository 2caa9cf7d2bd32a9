"""The CPU work of collective calls on a cluster model (``asynccomm.sim.host``): a program
whose messages and work are known takes exactly their virtual time, ranks that share a
core queue on it, and the rates round-trip through a preset file."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm._collectives.functions import algorithms
from asynccomm.sim import Cluster
from asynccomm.sim.calibration import Segment, calibrated_cluster
from asynccomm.sim.host import (
    COLD_SOURCE,
    CallWork,
    Footprint,
    HostSpec,
    call_work,
    collective_seconds,
    footprint,
    work_of,
)
from asynccomm.sim.model import Resource

MSG = 1e-6  # every message takes 1 us whatever its size


def cluster(host: HostSpec | None, ranks: int = 4) -> Cluster:
    c = calibrated_cluster([Segment(1 << 30, MSG, 0.0)], name="flat", ranks=ranks)
    return Cluster(nodes=1, devices_per_node=ranks, intra=c.intra, inter=None,
                   device=c.device, name="flat", host=host)


HOST = HostSpec(call=1e-3, step=1e-4, copy_bandwidth=1e9, reduce_bandwidth=5e8)


async def calls(comm: ac.Communicator) -> list[float]:
    """Model seconds of a ring allreduce of 4000 B, a ring allgather of 2 * 500 B and a
    pairwise alltoall of 2 * 300 B, one after another."""
    p = comm.size
    out = []
    for coll in (lambda: comm.allreduce(np.zeros(1000, np.float32), algorithm="ring"),
                 lambda: comm.allgather(np.zeros(500, np.uint8), np.zeros((p, 500), np.uint8),
                                        algorithm="ring"),
                 lambda: comm.alltoall(np.zeros((p, 300), np.uint8),
                                       np.zeros((p, 300), np.uint8))):
        t0 = comm.model_time()
        await coll()
        out.append(comm.model_time() - t0)
    return out


def test_two_ranks_take_their_work_plus_their_messages_exactly() -> None:
    got = ac.run(calls, 2, cluster=cluster(HOST), clock="virtual")
    # allreduce: 2 steps, copies 2 n, reduces n / 2; then 2 messages in turn
    allreduce = 1e-3 + 2 * 1e-4 + 8000 / 1e9 + 2000 / 5e8 + 2 * MSG
    allgather = 1e-3 + 1e-4 + (500 + 1000) / 1e9 + MSG
    alltoall = 1e-3 + 1e-4 + (300 + 600) / 1e9 + MSG
    for rank in got:
        assert rank == pytest.approx([allreduce, allgather, alltoall], abs=1e-8)


def test_without_host_rates_a_call_costs_its_messages_only() -> None:
    got = ac.run(calls, 2, cluster=cluster(None), clock="virtual")
    assert got[0] == pytest.approx([2 * MSG, MSG, MSG], abs=1e-8)


@pytest.mark.parametrize(("ranks", "cores", "factor"), [(2, 1, 2), (4, 2, 2), (4, 4, 1),
                                                        (3, 0, 1)])
def test_ranks_that_share_a_core_queue_their_work(ranks: int, cores: int, factor: int) -> None:
    host = HostSpec(cores=cores, call=1e-3)

    async def main(comm: ac.Communicator) -> float:
        t0 = comm.model_time()
        await comm.allgather(np.zeros(8, np.uint8), np.zeros((ranks, 8), np.uint8),
                             algorithm="ring")
        return comm.model_time() - t0

    got = ac.run(main, ranks, cluster=cluster(host, ranks), clock="virtual")
    # the calls of a core in turn, then the ring's messages (1 us each, p - 1 steps in
    # series once every rank has sent; a rank later than its neighbours delays them, and
    # messages into the ranks of one core share it: ``sim/model.py`` Rule 4b)
    cpu = factor * 1e-3
    if ranks == 2:
        assert max(got) == pytest.approx(cpu + MSG, abs=1e-8)
    assert (cpu + (ranks - 1) * MSG - 1e-8 <= max(got)
            <= cpu + 2 * factor * (ranks - 1) * MSG + 1e-8)


def test_the_work_of_each_collective() -> None:
    # (steps, copied, reduced, fresh scratch)
    assert work_of("allreduce", 1200, 3) == (4, 2400.0, 800.0, 1600.0)
    assert work_of("allreduce.ring", 1200, 3) == work_of("allreduce", 1200, 3)
    assert work_of("allgather", 1200, 3) == (2, 1600.0, 0.0, 1200.0)
    assert work_of("barrier", 0, 5) == (3, 0.0, 0.0, 0.0)
    assert work_of("allreduce", 1200, 1) == (0, 0.0, 0.0, 0.0)
    assert collective_seconds(HOST, "allreduce", 1200, 1) == 1e-3
    assert HostSpec().free and not HOST.free and not HostSpec(touch=1e-10).free


@pytest.mark.parametrize(("name", "p", "work"), [
    # log2 of the power of two, two steps more where ranks fold; a full scratch per round
    ("allreduce.recursive_doubling", 4, (2, 2400.0, 2400.0, 2400.0)),
    ("allreduce.recursive_doubling", 5, (4, 2400.0, 3600.0, 2400.0)),
    ("allgather.bruck", 5, (3, 2640.0, 0.0, 2400.0)),
    ("reduce_scatter.ring", 4, (3, 1800.0, 900.0, 1800.0)),
    ("reduce_scatter.recursive_doubling", 4, (2, 1800.0, 900.0, 2700.0)),
    ("reduce_scatter.recursive_doubling", 3, (3, 2000.0, 1800.0, 2800.0)),
    ("gather.linear", 4, (1, 1500.0, 0.0, 1200.0)),
    ("gather.binomial", 4, (2, 1500.0, 0.0, 1200.0)),
    ("scatter.linear", 4, (1, 600.0, 0.0, 300.0)),
    ("bcast.binomial", 3, (2, 1200.0, 0.0, 1200.0)),
    ("reduce.binomial", 4, (2, 2400.0, 2400.0, 2400.0)),
])
def test_each_algorithm_has_its_own_work(name: str, p: int, work: tuple[float, ...]) -> None:
    assert work_of(name, 1200, p) == pytest.approx(work)


@pytest.mark.parametrize(("algorithm", "steps"), [("ring", 6), ("recursive_doubling", 2)])
def test_a_call_is_charged_the_steps_of_the_algorithm_it_runs(algorithm: str,
                                                              steps: int) -> None:
    host = HostSpec(step=1e-4)

    async def main(comm: ac.Communicator) -> float:
        t0 = comm.model_time()
        await comm.allreduce(np.zeros(1000, np.float32), algorithm=algorithm)
        return comm.model_time() - t0

    got = ac.run(main, 4, cluster=cluster(host), clock="virtual")
    # every rank works at once on its own core, then the algorithm's messages in series
    assert got == pytest.approx([steps * 1e-4 + steps * MSG] * 4, abs=1e-8)


def test_the_default_choice_is_charged_as_the_algorithm_it_picks() -> None:
    host = HostSpec(step=1e-4)

    async def main(comm: ac.Communicator) -> float:
        t0 = comm.model_time()
        await comm.allgather(np.zeros(8, np.uint8), np.zeros((4, 8), np.uint8))
        return comm.model_time() - t0

    got = ac.run(main, 4, cluster=cluster(host), clock="virtual")
    # 1 us messages whatever their size: the model picks Bruck, 2 steps (the ring has 3)
    assert got == pytest.approx([2 * 1e-4 + 2 * MSG] * 4, abs=1e-8)


def test_fresh_scratch_costs_its_first_touch() -> None:
    host = HostSpec(touch=1e-9)

    async def main(comm: ac.Communicator) -> float:
        t0 = comm.model_time()
        await comm.allgather(np.zeros(500, np.uint8), np.zeros((2, 500), np.uint8),
                             algorithm="ring")
        return comm.model_time() - t0

    got = ac.run(main, 2, cluster=cluster(host), clock="virtual")
    assert got == pytest.approx([1000 * 1e-9 + MSG] * 2, abs=1e-8)


def test_a_refused_call_spends_no_model_time() -> None:
    async def main(comm: ac.Communicator) -> tuple[float, float]:
        t0 = comm.model_time()
        with pytest.raises(ValueError, match="allreduce: recvbuf shape"):
            await comm.allreduce(np.zeros(4, np.float32), np.zeros(5, np.float32))
        with pytest.raises(TypeError, match="alltoall: sendbuf must be a numpy array"):
            await comm.alltoall([1, 2], np.zeros((2, 1), np.uint8))
        refused = comm.model_time() - t0
        t0 = comm.model_time()
        await comm.allreduce(np.zeros(4, np.float32), algorithm="ring")  # still works
        return refused, comm.model_time() - t0

    got = ac.run(main, 2, cluster=cluster(HostSpec(call=1e-3)), clock="virtual")
    assert got == [(0.0, pytest.approx(1e-3 + 2 * MSG, abs=1e-8))] * 2


@pytest.mark.parametrize(("host", "again"), [(HostSpec(call=1.0), 1.0),
                                           (HostSpec(step=1.0), 2.0)])
def test_a_timeout_bounds_the_host_work_too(host: HostSpec, again: float) -> None:
    """The call's work before its first message, and a step's after its wait (Rule 2d),
    are within the call's timeout; what a timed-out call abandons leaves the core."""
    async def main(comm: ac.Communicator) -> tuple[float, float]:
        t0 = comm.model_time()
        with pytest.raises(ac.CommTimeoutError, match="did not finish within 0.25 s"):
            await comm.allreduce(np.zeros(4, np.float32), algorithm="ring", timeout=0.25)
        timed_out = comm.model_time() - t0
        t0 = comm.model_time()
        await comm.allreduce(np.zeros(4, np.float32), algorithm="ring")
        return timed_out, comm.model_time() - t0

    got = ac.run(main, 2, cluster=cluster(host), clock="virtual")
    # the abandoned work leaves the core at the timeout: the next call waits for none of it
    # (its own: the call's 1 s, or its two steps' 1 s each, and two messages)
    assert got == [pytest.approx((0.25, again + 2 * MSG), abs=1e-8)] * 2


def test_a_call_that_fits_a_cached_piece_takes_its_rates() -> None:
    host = HostSpec(copy_bandwidth=1e9, reduce_bandwidth=1e9,
                    cached=((1000, 4e9, 2e9), (4000, 2e9, 1e9)))
    # allgather of n on 2 ranks copies 1.5 n; allreduce copies 2 n and reduces n / 2
    assert collective_seconds(host, "allgather", 1000, 2) == pytest.approx(1500 / 4e9)
    # the bytes beyond the first piece's at the next piece's rates
    assert collective_seconds(host, "allgather", 1001, 2) == pytest.approx(
        1500 / 4e9 + 1.5 / 2e9)
    # each piece's bytes at its rates, those past the last at the large calls'
    assert collective_seconds(host, "allreduce", 8000, 2) == pytest.approx(
        2000 / 4e9 + 500 / 2e9 + 6000 / 2e9 + 1500 / 1e9 + 8000 / 1e9 + 2000 / 1e9)
    assert not HostSpec(cached=((10, 1e9, math.inf),)).free
    assert "calls <= 1000 B: copy 4.00, reduce 2.00" in host.describe()


def test_a_call_just_past_the_cached_pieces_costs_no_less_than_the_last_piece_s() -> None:
    # large calls' rates fitted among 20 MiB, far faster among the 2 MiB of a call of
    # 384 KiB on 2 ranks: its bytes up to the piece's size still take the piece's rates
    host = HostSpec(copy_bandwidth=15e9, reduce_bandwidth=4e9, memory=MEMORY.memory,
                    working_set=20 * MiB, cached=((256 << 10, 17e9, 31e9),))
    for name in ("allgather", "allreduce", "alltoall"):
        times = [collective_seconds(host, name, n << 10, 2) for n in (128, 256, 384, 512)]
        assert times == sorted(times), name
    among = footprint("allgather", 384 << 10, 2).working_set  # 1.875 MiB
    faster = MEMORY.per_byte(20 * MiB) / MEMORY.per_byte(among)
    assert faster > 2  # all its bytes at that rate: cheaper than a call of 256 KiB
    assert host.work_seconds("allgather", 384 << 10, 2, among) == pytest.approx(
        1.5 * (256 << 10) / 17e9 + 1.5 * (128 << 10) / (15e9 * faster))
    # a call of the piece's own size takes its rates alone
    assert host.work_seconds("allreduce", 256 << 10, 2) == pytest.approx(
        2 * (256 << 10) / 17e9 + (128 << 10) / 31e9)


def test_steps_cost_the_switch_on_more_ranks_than_cores() -> None:
    host = HostSpec(cores=2, call=1e-5, step=1e-6, switch=1e-4)
    assert collective_seconds(host, "allgather", 0, 2) == pytest.approx(1e-5 + 1e-6)
    assert collective_seconds(host, "allgather", 0, 3) == pytest.approx(1e-5 + 2 * 1.01e-4)
    assert collective_seconds(HostSpec(switch=1e-4), "allgather", 0, 8) == 0  # core per rank
    assert not HostSpec(switch=1e-4).free


def test_steps_past_the_eager_limit_cost_the_rendezvous_switch_on_more_ranks_than_cores(
        ) -> None:
    host = HostSpec(cores=2, call=1e-5, step=1e-6, switch=1e-4, rendezvous_switch=3e-5)
    at, past = 65536, 65536 + 8192  # an allgather's messages: at the eager limit, past it
    # 3 ranks on 2 cores: each of the ring's 2 steps a switch more, and past the eager
    # limit (rendezvous: two hand-offs) the rendezvous switch more again
    assert collective_seconds(host, "allgather", 3 * at, 3) == pytest.approx(
        1e-5 + 2 * (1e-6 + 1e-4))
    assert collective_seconds(host, "allgather", 3 * past, 3) == pytest.approx(
        1e-5 + 2 * (1e-6 + 1e-4 + 3e-5))
    # a ring allreduce's 4 steps, each of a block of n / p
    assert collective_seconds(host, "allreduce", 3 * past, 3) == pytest.approx(
        1e-5 + 4 * (1e-6 + 1e-4 + 3e-5))
    # as many ranks as cores, or a core per rank: none
    assert collective_seconds(host, "allgather", 2 * past, 2) == pytest.approx(1e-5 + 1e-6)
    assert collective_seconds(HostSpec(rendezvous_switch=3e-5), "allgather", 8 * past,
                              8) == 0
    assert not HostSpec(rendezvous_switch=3e-5).free
    assert "+30.0 us more past the eager limit" in host.describe()


MiB = 1 << 20
#: Copies at 40 GB/s among 1 MiB, 10 GB/s among 16 MiB and more.
MEMORY = HostSpec(memory=((MiB, 4e10), (16 * MiB, 1e10)))


def test_copies_slow_down_as_the_working_set_grows() -> None:
    assert MEMORY.per_byte(1000) == MEMORY.per_byte(MiB) == 1 / 4e10
    assert MEMORY.per_byte(4 * MiB) == pytest.approx(0.5 / 4e10 + 0.5 / 1e10)  # log2 midway
    assert MEMORY.per_byte(16 * MiB) == MEMORY.per_byte(1 << 40) == 1 / 1e10
    assert HostSpec().per_byte(1 << 40) == 0 and not MEMORY.free
    assert "copies among 1 MiB 40.0, 16 MiB 10.0 GB/s" in MEMORY.describe()


def test_the_footprint_of_a_call_is_every_rank_s_arrays_and_scratch() -> None:
    # allgather ring: its block, the output and a scratch of the output; p - 1 blocks in,
    # the first from the caller's array (Rule 1e)
    assert footprint("allgather", 3 * MiB, 3) == Footprint(3 * 7.0 * MiB, 2.0 * MiB, 2, MiB)
    # allreduce ring: its buffer, a scratch of it and of a block; p - 1 blocks into the
    # buffer (the reduce-scatter's p - 1 into the block, which the caches keep, uncounted),
    # each sent just reduced
    assert footprint("allreduce.ring", 4 * MiB, 2) == Footprint(2 * 10.0 * MiB, 2.0 * MiB, 1)
    # alltoall: every block from the caller's array
    assert footprint("alltoall", 4 * MiB, 4) == Footprint(4 * 12.0 * MiB, 3.0 * MiB, 3,
                                                          3.0 * MiB)
    assert footprint("bcast", MiB, 4).messages == 0  # not counted: no more than before
    # every algorithm the chooser weighs against another has its messages counted
    for name in ("allreduce", "allgather", "gather"):
        for algorithm in algorithms(name):
            for p in (2, 3, 4, 5):
                fp = footprint(f"{name}.{algorithm}", 1200, p)
                assert fp.messages > 0 and 0 < fp.received <= 1200 * p
    assert footprint("allgather", MiB, 1) == Footprint(0.0, 0.0, 0)


def test_messages_of_a_call_past_the_caches_cost_its_working_set_s_rate() -> None:
    # 21 MiB in use (past 16 MiB), where a ping-pong of 1 MiB messages had 2 MiB
    extra = 2 * MiB * (1 / 1e10 - (0.75 / 4e10 + 0.25 / 1e10))
    assert collective_seconds(MEMORY, "allgather", 3 * MiB, 3) == pytest.approx(extra)
    # a call whose working set is no larger than its messages' ping-pong costs nothing more
    assert collective_seconds(MEMORY, "allgather", 1200, 3) == 0

    async def main(comm: ac.Communicator) -> float:
        t0 = comm.model_time()
        await comm.allgather(np.zeros(MiB, np.uint8), np.zeros((3, MiB), np.uint8),
                             algorithm="ring")
        return comm.model_time() - t0

    got = ac.run(main, 3, cluster=cluster(MEMORY, 3), clock="virtual")
    assert got == pytest.approx([extra + 2 * MSG] * 3, abs=1e-8)  # a core per rank


def test_a_message_from_the_caller_s_array_costs_more_where_the_ranks_share_a_core() -> None:
    """Rule 1e: on one core, the bytes a rank receives from a source no step has just
    written cost ``COLD_SOURCE`` of Rule 1d's more again; on cores of their own, nothing."""
    more = MEMORY.per_byte(21 * MiB) - MEMORY.per_byte(2 * MiB)  # Rule 1d's, per byte
    plain = collective_seconds(MEMORY, "allgather", 3 * MiB, 3)
    one = dataclasses.replace(MEMORY, cores=1)
    assert collective_seconds(one, "allgather", 3 * MiB, 3) == pytest.approx(
        plain + COLD_SOURCE * MiB * more)  # its first block, from the caller's array
    assert collective_seconds(dataclasses.replace(MEMORY, cores=2), "allgather", 3 * MiB,
                              3) == pytest.approx(plain)
    # the ring allreduce sends only blocks it has just written
    assert collective_seconds(one, "allreduce.ring", 3 * MiB, 3) == pytest.approx(
        collective_seconds(MEMORY, "allreduce.ring", 3 * MiB, 3))


def test_copies_past_the_cached_pieces_take_the_working_set_s_rate() -> None:
    host = HostSpec(copy_bandwidth=1e9, reduce_bandwidth=5e8, memory=MEMORY.memory,
                    working_set=4 * MiB, cached=((1000, 4e9, 2e9),))
    slower = 1 / (MEMORY.per_byte(4 * MiB) * 1e10)  # per byte among 21 MiB over 4 MiB
    assert host.rates(3 * MiB, 21 * MiB) == pytest.approx((1e9 / slower, 5e8 / slower))
    assert host.rates(3 * MiB, 4 * MiB) == host.rates(3 * MiB) == (1e9, 5e8)  # as fitted
    assert host.rates(1000, 21 * MiB) == (4e9, 2e9)  # a cached piece's arrays stay cached
    assert HostSpec(copy_bandwidth=1e9, memory=MEMORY.memory).rates(3 * MiB, 21 * MiB)[0] == 1e9
    # allgather of 3 MiB on 3 ranks: copies n / p + n, among 21 MiB (those of a call of
    # the cached piece's 1000 bytes at its rate)
    assert collective_seconds(host, "allgather", 3 * MiB, 3) == pytest.approx(
        4000 / 3 / 4e9 + (4 * MiB - 4000 / 3) * slower / 1e9
        + collective_seconds(MEMORY, "allgather", 3 * MiB, 3))
    assert "(among 4 MiB)" in host.describe()


def test_host_rates_round_trip_through_a_preset(tmp_path: Path) -> None:
    c = cluster(HostSpec(cores=2, call=3e-5, step=2e-6, reduce_bandwidth=2e9,
                         cached=((4096, 8e9, math.inf),), switch=5e-5, rendezvous_switch=2e-5,
                         touch=1e-10,
                         memory=MEMORY.memory, working_set=20 * MiB))
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"cluster": c.to_dict()}))
    assert Cluster.load(path).host == c.host
    assert math.isinf(Cluster.load(path).host.copy_bandwidth)
    doc = c.to_dict()
    del doc["host"]  # a preset of before: no host work
    path.write_text(json.dumps(doc))
    assert Cluster.load(path).host.free


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"cores": -1}, ValueError, "cores must be >= 0"),
    ({"cores": 1.5}, TypeError, "cores must be an int"),
    ({"call": -1e-6}, ValueError, "call must be a finite number >= 0"),
    ({"step": math.nan}, ValueError, "step must be a finite number >= 0"),
    ({"switch": -1.0}, ValueError, "switch must be a finite number >= 0"),
    ({"rendezvous_switch": math.nan}, ValueError,
     "rendezvous_switch must be a finite number >= 0"),
    ({"touch": math.inf}, ValueError, "touch must be a finite number >= 0"),
    ({"call": "1"}, TypeError, "call must be a number"),
    ({"copy_bandwidth": 0}, ValueError, "copy_bandwidth must be > 0"),
    ({"reduce_bandwidth": True}, TypeError, "reduce_bandwidth must be a number"),
    ({"cached": [(8, 1e9, 1e9)]}, TypeError, "cached must be a tuple"),
    ({"cached": ((-1, 1e9, 1e9),)}, ValueError, "up_to must be an int >= 0"),
    ({"cached": ((8, 0.0, 1e9),)}, ValueError, "cached copy_bandwidth must be > 0"),
    ({"cached": ((16, 1e9, 1e9), (8, 1e9, 1e9))}, ValueError, "cached must be sorted"),
    ({"cached": ((8, 1e9, 1e9), (8, 2e9, 1e9))}, ValueError, "cached must be sorted"),
    ({"memory": [(8, 1e9)]}, TypeError, "memory must be a tuple"),
    ({"memory": ((0, 1e9),)}, ValueError, "memory bytes must be an int >= 1"),
    ({"memory": ((8, -1.0),)}, ValueError, "memory copy_bandwidth must be > 0"),
    ({"memory": ((16, 1e9), (8, 1e9))}, ValueError, "memory must be sorted"),
    ({"memory": ((8, 1e9), (8, 2e9))}, ValueError, "memory must be sorted"),
    ({"working_set": -1}, ValueError, "working_set must be an int >= 0"),
    ({"unwaited": [("allgather.ring", 3, 1e-6)]}, TypeError, "unwaited must be a tuple"),
    ({"unwaited": ((3, 1e-6),)}, TypeError, "unwaited must be a tuple"),
    ({"unwaited": (("allgather.ring", 1, 1e-6),)}, ValueError, "ranks must be an int >= 2"),
    ({"unwaited": (("allgather.ring", 3, math.nan),)}, ValueError, "must be a finite number"),
    ({"unwaited": (("allgather.ring", 4, 1e-6), ("allgather.ring", 3, 1e-6))}, ValueError,
     "unwaited must be sorted"),
])
def test_bad_host_rates(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        HostSpec(**kwargs)
    with pytest.raises(TypeError, match="host must be a HostSpec"):
        cluster("fast", 2)  # type: ignore[arg-type]


def test_a_core_gives_back_abandoned_work_only_when_nothing_queued_behind_it() -> None:
    core = Resource("core[0]")
    start, end = core.reserve(100, 1000)
    core.release(start, end, 400)
    assert (core.free_at, core.busy) == (400, 300)
    first = core.reserve(400, 1000)
    core.reserve(0, 50)  # queued behind it: the first hold stays
    core.release(*first, 500)
    assert (core.free_at, core.busy) == (1450, 1350)
    core.release(1400, 1450, 2000)  # already over: nothing to give back
    assert core.free_at == 1450


def test_messages_into_ranks_of_one_core_share_it() -> None:
    from asynccomm.sim import ClusterModel

    # 3 ranks on 2 cores (0 and 2 on core 0), a link of 2 us + n / 1 GB/s: transfers into
    # ranks 0 and 2 at once share core 0's copy rate, one into rank 1 has core 1 alone
    segments = [Segment(1 << 30, 2e-6, 1e-9)]
    crowded = calibrated_cluster(segments, name="x", ranks=3,
                                 host=HostSpec(cores=2, call=1e-6))
    model = ClusterModel(crowded, 3)
    into = [model.start(src, dst, 10**6, now=0) for src, dst in ((2, 0), (1, 2), (0, 1))]
    model.settle()
    ends = [t.end * 1e-9 for t in into if t.end is not None]
    assert ends[2] == pytest.approx(2e-6 + 1e-3, rel=1e-6)
    assert ends[0] == ends[1] == pytest.approx(2 * (2e-6 + 1e-3), rel=1e-6)
    # a core per rank (a host without cores), or as many cores as ranks: each alone
    for host in (HostSpec(call=1e-6), HostSpec(cores=3, call=1e-6)):
        alone = ClusterModel(calibrated_cluster(segments, name="x", ranks=3, host=host), 3)
        moving = [alone.start(src, dst, 10**6, now=0) for src, dst in ((2, 0), (1, 2))]
        alone.settle()
        assert all(t.end == pytest.approx(1e9 * (2e-6 + 1e-3), rel=1e-6) for t in moving)


#: A step of a ring allgather on 3 and 4 ranks of one loop, and of a ring allreduce on 3.
UNWAITED = HostSpec(cores=1, call=20e-6, step=1e-6,
                    unwaited=(("allgather.ring", 3, 2e-6), ("allgather.ring", 4, 3e-6),
                              ("allreduce.ring", 3, 4e-6)))


def test_a_step_on_ranks_of_one_loop_costs_what_was_measured_for_its_rank_count_less() -> None:
    plain = dataclasses.replace(UNWAITED, unwaited=())
    for p, less in ((2, 0.0), (3, 2e-6), (4, 3e-6), (6, 3e-6)):  # the most ranks up to p
        steps = work_of("allgather.ring", 64, p).steps
        assert collective_seconds(UNWAITED, "allgather", 64, p) == pytest.approx(
            collective_seconds(plain, "allgather", 64, p) - steps * less, abs=1e-12)
    # an algorithm without entries: the mean of the others' (4 ranks: 3 us and 4 us)
    assert UNWAITED.step_less("alltoall.pairwise", 4) == pytest.approx(3.5e-6)
    assert UNWAITED.step_less("allreduce.ring", 5) == pytest.approx(4e-6)
    assert HostSpec().step_less("allgather.ring", 4) == 0.0
    assert not UNWAITED.free and "allgather.ring on 4 3.0" in UNWAITED.describe()


def test_an_eager_message_found_arrived_pays_its_staging_copy_and_a_rendezvous_one_saves_nothing(
        ) -> None:
    from asynccomm import EAGER_LIMIT
    from asynccomm.sim import host

    assert host.EAGER_LIMIT == EAGER_LIMIT  # the transports' own
    assert UNWAITED.step_less("allgather.ring", 4, 1000, 1e9) == pytest.approx(2e-6)
    assert UNWAITED.step_less("allgather.ring", 4, 5000, 1e9) == 0.0  # never below nothing
    assert UNWAITED.step_less("allgather.ring", 4, EAGER_LIMIT + 1) == 0.0
    dearer = HostSpec(unwaited=(("allgather.ring", 3, -1e-6),))  # measured dearer: kept
    assert dearer.step_less("allgather.ring", 3, 1000, 1e9) == pytest.approx(-1e-6)


def test_a_staged_message_s_copy_runs_at_the_rate_of_its_own_working_set() -> None:
    # the call's copies at 10 GB/s; the staging copy of a 64 KiB message runs among it
    # and its copy, at 40 GB/s (MEMORY among 1 MiB or less)
    host = dataclasses.replace(UNWAITED, unwaited=(("allgather.ring", 4, 10e-6),),
                               copy_bandwidth=1e10, cached=((1 << 30, 1e10, 1e10),),
                               memory=MEMORY.memory)
    plain = dataclasses.replace(host, unwaited=())
    n, p = 256 << 10, 4  # 64 KiB messages, eager
    steps = work_of("allgather.ring", n, p).steps
    assert collective_seconds(host, "allgather", n, p) == pytest.approx(
        collective_seconds(plain, "allgather", n, p) - steps * (10e-6 - (64 << 10) / 4e10))
    # without copy rates by working set, at the call's copy rate
    bare = dataclasses.replace(host, memory=())
    assert collective_seconds(bare, "allgather", n, p) == pytest.approx(
        collective_seconds(dataclasses.replace(bare, unwaited=()), "allgather", n, p)
        - steps * (10e-6 - (64 << 10) / 1e10))


def test_a_call_s_work_never_goes_below_nothing() -> None:
    host = HostSpec(cores=1, call=1e-6, unwaited=(("allreduce.ring", 3, 1e-3),))
    assert collective_seconds(host, "allreduce", 64, 4) == 0.0


@pytest.mark.parametrize(("name", "nbytes", "p"), [("allreduce.ring", 4000, 3),
                                                  ("allgather.ring", 1 << 20, 4),
                                                  ("alltoall", 96 << 10, 3), ("barrier", 0, 3)])
def test_a_call_s_work_is_what_comes_first_and_each_step_s(name: str, nbytes: int,
                                                          p: int) -> None:
    """Rule 2d: a step's work is spent after each wait, the rest first; on more ranks than
    cores its switches are a hand-off apart (Rule 2e); in all, at most, the call's
    ``collective_seconds``."""
    host = dataclasses.replace(HOST, cores=2, switch=2e-5, rendezvous_switch=3e-5)
    work = call_work(host, name, nbytes, p)
    each = footprint(name, nbytes, p)
    past = each.messages and each.received / each.messages > 65536
    assert work.steps == work_of(name, nbytes, p).steps
    assert work.step == pytest.approx(1e-4)
    assert work.handoff == pytest.approx(2e-5 + (3e-5 if past else 0.0))  # Rule 2e
    assert work.first + work.steps * (work.step + work.handoff) == pytest.approx(
        collective_seconds(host, name, nbytes, p))
    # a step less than nothing (ranks of one loop, Rule 2c): all of it first, never below 0
    loop = HostSpec(cores=1, call=1e-6, unwaited=(("allreduce.ring", 3, 1e-3),))
    assert call_work(loop, "allreduce", 64, 4) == CallWork(0.0, 0.0, 0)
    # ... and one whose hand-offs are more than nothing keeps them, its step's less first
    crowded = dataclasses.replace(loop, call=8e-3, switch=2e-3)  # 6 steps of 1 ms less
    assert call_work(crowded, "allreduce", 64, 4) == CallWork(
        pytest.approx(2e-3), 0.0, 6, 2e-3)


def test_a_modelled_call_spends_each_step_s_work_after_its_wait() -> None:
    """Rule 2d: a call's first messages leave once the work before its steps' is done, and
    each step's work runs after its wait, before the next step's messages."""
    host = HostSpec(call=1e-3, step=1e-4)

    async def main(comm: ac.Communicator) -> list[float]:
        await comm.allreduce(np.zeros(1000, np.float32), algorithm="ring")  # 2 steps
        # (the call's messages go on its communicator's private context)
        return sorted(r.start for r in comm._private().records() if r.kind == "send")

    got = ac.run(main, 2, cluster=cluster(host, 2), clock="virtual")
    # the first send after the call's 1 ms; the second after a message (1 us) and a step
    assert got == [[pytest.approx(1e-3, abs=1e-8), pytest.approx(1.101e-3, abs=1e-8)]] * 2


def test_a_rank_spends_at_most_its_call_s_steps_and_a_leaf_fewer() -> None:
    """Rule 2d: ``steps`` is a bound; a rank that waits less (a leaf of a tree) spends
    a step's work per wait only."""
    host = HostSpec(step=1e-3)

    async def main(comm: ac.Communicator) -> tuple[float, float, float]:
        timing = comm._engine.link.timing
        steps = await timing.collective_work(comm.rank, "bcast.binomial", 64, 4)  # 2 steps
        t0 = comm.model_time()
        for _ in range(3):
            await steps.step()
        spent = comm.model_time() - t0
        core = timing.model.core(comm.rank)  # a core per rank
        t0, busy = comm.model_time(), core.busy
        await comm.bcast(np.zeros(16, np.float32), root=0)  # binomial
        return spent, comm.model_time() - t0, (core.busy - busy) * 1e-9

    got = ac.run(main, 4, cluster=cluster(host, 4), clock="virtual")
    assert [spent for spent, _, _ in got] == [pytest.approx(2e-3, abs=1e-9)] * 4
    # the root sends to ranks 2 and 1, rank 2 passes it on to rank 3: the root and rank 2
    # wait twice, the leaves 1 and 3 once, and each runs a step's work after each wait
    assert [work for _, _, work in got] == pytest.approx([2e-3, 1e-3, 2e-3, 1e-3], abs=1e-9)
    assert [took for _, took, _ in got] == pytest.approx([2e-3, 2e-3 + MSG, 2e-3 + MSG,
                                                          2e-3 + 2 * MSG], abs=1e-8)


@pytest.mark.parametrize(("name", "handoffs"), [
    ("allgather", 0),  # a ring on ranks placed 0, 1, 0, 1: every message crosses cores
    ("alltoall", 1),   # pairwise: its second step's messages stay on a core
    ("barrier", 1),    # dissemination: its second step's too
])
def test_a_step_pays_the_switch_only_after_a_wait_for_a_rank_of_its_own_core(
        name: str, handoffs: int) -> None:
    """Rule 2e: four ranks on two cores (rank r on core r % 2); a step's switch goes on
    its core only where the rank it received from shares that core."""
    host = HostSpec(cores=2, switch=1e-3)

    async def main(comm: ac.Communicator) -> float:
        core = comm._engine.link.timing.model.core(comm.rank)
        busy = core.busy
        if name == "barrier":
            await comm.barrier()
        else:
            if name == "allgather":
                await comm.allgather(np.zeros(4, np.float32), np.zeros((4, 4), np.float32),
                                     algorithm="ring")
            else:
                await comm.alltoall(np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float32))
        await comm.barrier()  # every rank's work on the core done (a hand-off each)
        return (core.busy - busy) * 1e-9

    got = ac.run(main, 4, cluster=cluster(host, 4), clock="virtual")
    # each core runs two ranks, each paying its call's hand-offs and the barrier's one
    # there, beside its messages' few microseconds (sim/model.py Rule 4b); a switch on
    # every step would be 2 * (3 + 2) ms
    assert got == [pytest.approx(2 * (handoffs + 1) * 1e-3, abs=1e-4)] * 4


def test_a_modelled_call_on_ranks_of_one_loop_takes_its_steps_less() -> None:
    plain = dataclasses.replace(UNWAITED, unwaited=())
    took = [ac.run(calls, 4, cluster=calibrated_cluster(
        [Segment(1 << 30, MSG, 0.0)], name="loop", ranks=4, shared=True, host=h),
        clock="virtual")[0] for h in (plain, UNWAITED)]
    # the allgather: 3 steps of 3 us less on each of 4 ranks, all on the one core (in-process
    # ranks: their messages take turns with their work on it)
    assert took[0][1] - took[1][1] == pytest.approx(4 * 3 * 3e-6, abs=1e-8)  # whole ns


def test_the_steps_of_ranks_of_one_loop_round_trip_through_a_preset() -> None:
    assert HostSpec.from_dict(json.loads(json.dumps(UNWAITED.to_dict()))) == UNWAITED
    assert HostSpec.from_dict({"call": 1e-6}).unwaited == ()  # presets written before
