"""Calibration: the piecewise alpha-beta fit recovers known segments from synthetic data,
the preset it makes loads back and times messages as fitted, and the command runs."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import platform
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm.sim import Cluster, ClusterModel, LinkSpec
from asynccomm.sim.calibration import Segment, calibrated_cluster, fit_line, fit_segments, predict

SIZES = [8 << i for i in range(24)]  # 8 B to 64 MiB


def eager_rendezvous(n: int) -> float:
    """5 us + n / 2 GB/s up to 64 KiB, then 20 us + n / 8 GB/s."""
    return 5e-6 + n / 2e9 if n <= 65536 else 20e-6 + n / 8e9


def test_one_line_is_recovered_exactly() -> None:
    alpha, beta, cost = fit_line([(n, 3e-6 + n * 1e-10) for n in SIZES])
    assert alpha == pytest.approx(3e-6, rel=1e-9) and beta == pytest.approx(1e-10, rel=1e-9)
    assert cost == pytest.approx(0, abs=1e-15)


@pytest.mark.parametrize("noise", [0.0, 0.01])
def test_the_eager_rendezvous_break_and_both_lines_are_recovered(noise: float) -> None:
    rng = random.Random(7)
    points = [(n, eager_rendezvous(n) * (1 + rng.gauss(0, noise))) for n in SIZES]
    segments = fit_segments(points)
    assert [s.up_to for s in segments] == [65536, SIZES[-1]]
    small, large = segments
    assert small.alpha == pytest.approx(5e-6, rel=0.05 + 5 * noise)
    assert small.bandwidth == pytest.approx(2e9, rel=0.05 + 5 * noise)
    assert large.alpha == pytest.approx(20e-6, rel=0.1 + 10 * noise)
    assert large.bandwidth == pytest.approx(8e9, rel=0.02 + noise)
    for n, t in points:
        assert predict(segments, n) == pytest.approx(t, rel=0.01 + 3 * noise)


def test_a_negative_slope_or_intercept_is_clamped() -> None:
    alpha, beta, _ = fit_line([(10, 2e-6), (20, 1.9e-6), (30, 1.8e-6)])
    assert beta == 0 and alpha > 0
    alpha, beta, _ = fit_line([(1000, 1e-6), (2000, 2.5e-6), (3000, 4e-6)])
    assert alpha == 0 and beta > 0


@pytest.mark.parametrize(("points", "kwargs", "message"), [
    ([(8, 1e-6)], {}, "need at least 3 points, got 1"),
    ([(8, 1e-6), (8, 2e-6), (16, 1e-6)], {}, "each size must appear once"),
    ([(8, 1e-6), (16, 0.0), (32, 1e-6)], {}, "every time must be > 0"),
    ([(8, 1e-6), (16, 1e-6), (32, 1e-6)], {"max_segments": 0}, "must be >= 1"),
])
def test_bad_fits(points: list[tuple[int, float]], kwargs: dict[str, int],
                  message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit_segments(points, **kwargs)


def test_a_calibrated_cluster_times_messages_as_fitted(tmp_path: Path) -> None:
    segments = [Segment(65536, 5e-6, 1 / 2e9), Segment(1 << 26, 20e-6, 1 / 8e9)]
    cluster = calibrated_cluster(segments, name="fitted", ranks=4, shared=True)
    path = tmp_path / "preset.json"
    path.write_text(json.dumps({"cluster": cluster.to_dict()}))
    loaded = Cluster.load(path)
    assert loaded.to_dict() == cluster.to_dict() and loaded.shared_intra
    for n in (8, 65536, 65537, 1 << 20):
        took = ClusterModel(loaded, 2).transfer(0, 1, n, now=0).duration * 1e-9
        assert took == pytest.approx(predict(segments, n), abs=2e-9)

    async def main(comm: ac.Communicator) -> float:
        buf = np.zeros(1 << 20, np.uint8)
        t0 = comm.model_time()
        if comm.rank == 0:
            await comm.send(buf, 1)
        else:
            await comm.recv(buf, 0)
        return comm.model_time() - t0

    assert ac.run(main, 2, cluster=loaded)[1] == pytest.approx(predict(segments, 1 << 20),
                                                                abs=2e-9)


def test_a_shared_node_puts_every_transfer_on_one_resource() -> None:
    segments = [Segment(1 << 26, 0.0, 1e-9)]
    model = ClusterModel(calibrated_cluster(segments, name="bus", ranks=4, shared=True), 4)
    a = model.start(0, 1, 1000, now=0)
    b = model.start(2, 3, 1000, now=0)
    model.settle()
    assert (a.end, b.end) == (1000, 2000)  # two pairs, one bus: in turn


def test_in_process_ranks_work_and_move_messages_in_turn_on_one_cpu() -> None:
    from asynccomm.calibrate import time_calls
    from asynccomm.sim.host import HostSpec

    # two in-process ranks: a call costs each a millisecond of CPU, and each of the four
    # messages of a ring allreduce 0.1 ms of the same CPU: 2.4 ms a call, back to back
    segments = [Segment(1 << 20, 1e-4, 0.0)]
    host = HostSpec(cores=1, call=1e-3)
    one_cpu = calibrated_cluster(segments, name="cpu", ranks=2, shared=True, host=host)
    model = ClusterModel(one_cpu, 2)
    assert model.core(0) is model.core(1) is model._link_resources(0, 1)[0]
    # a node of its own core per rank, or of fair links, keeps the two apart
    assert ClusterModel(calibrated_cluster(segments, name="x", ranks=2, host=host),
                        2).core(0).name.startswith("core")

    async def main(comm: ac.Communicator) -> float:
        buf = np.zeros(2, np.float32)
        return (await time_calls(comm, lambda: comm.allreduce(buf, algorithm="ring"), 1,
                                 comm.model_time, iterations=3))[0]

    assert ac.run(main, 2, cluster=one_cpu)[0] == pytest.approx(2.4e-3, rel=1e-3)


@pytest.mark.parametrize(("segments", "error", "message"), [
    ((1,), TypeError, "a LinkSpec segment is"),
    (((100, 1e-6, 1e9), (50, 1e-6, 1e9)), ValueError, "increasing size"),
    (((100, -1.0, 1e9),), ValueError, "segment latency"),
    (((100, 1e-6, 0.0),), ValueError, "segment bandwidth"),
    ([(100, 1e-6, 1e9)], TypeError, "segments must be a tuple"),
])
def test_bad_segments(segments: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        LinkSpec("l", 1e9, 0.0, segments=segments)  # type: ignore[arg-type]


def test_a_preset_that_is_not_one_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"cluster": {"name": "x"}}))
    with pytest.raises(ValueError, match="not a cluster preset"):
        Cluster.load(path)


def test_the_command_calibrates_the_in_process_transport(tmp_path: Path) -> None:
    out = tmp_path / "local.json"
    done = subprocess.run([sys.executable, "-m", "asynccomm.calibrate", "--transport", "local",
                           "--sizes", "8", "64", "512", "4096", "--repeats", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=60,
                          check=True)
    assert "segment" in done.stdout
    cluster = Cluster.load(out)
    assert cluster.shared_intra and cluster.intra.segments
    assert all(math.isfinite(s[1]) for s in cluster.intra.segments)


def test_the_second_pass_measures_between_each_break_and_its_neighbours() -> None:
    from asynccomm.calibrate import near_breaks

    segments = [Segment(4096, 1e-6, 1e-10), Segment(1 << 20, 2e-6, 1e-10),
                Segment(SIZES[-1], 3e-6, 1e-10)]
    assert near_breaks(SIZES, segments) == [2896, 5793, 65544, 741455, 1482910]
    assert near_breaks([8, 16, 32], [Segment(32, 1e-6, 0.0)]) == []


def test_a_preset_with_host_work_round_trips(tmp_path: Path) -> None:
    from asynccomm.calibrate import preset
    from asynccomm.sim.host import HostSpec

    host = HostSpec(cores=2, call=1.2e-5, step=3e-6, copy_bandwidth=5e9, reduce_bandwidth=1e9)
    segments = [Segment(65536, 5e-6, 1 / 2e9), Segment(1 << 26, 20e-6, 1 / 8e9)]
    doc = preset("mpi", {8: 5e-6}, segments, ranks=4, host=host)
    path = tmp_path / "mpi.json"
    path.write_text(json.dumps(doc))
    loaded = Cluster.load(path)
    assert loaded.host == host
    assert loaded.intra.segments == calibrated_cluster(segments, name="x").intra.segments
    assert not loaded.shared_intra


@pytest.mark.parametrize("memory", [(), ((1 << 20, 4e10), (1 << 23, 3e10), (1 << 25, 1e10))],
                         ids=["flat", "by working set"])
def test_the_host_rates_are_recovered_from_calls_that_follow_them(
        memory: tuple[tuple[int, float], ...]) -> None:
    import resource

    from asynccomm.calibrate import HOST_SIZES, fit_host
    from asynccomm.sim.host import HostSpec, collective_seconds, work_of

    want = HostSpec(cores=1, call=2e-5, step=4e-6, copy_bandwidth=4e9, reduce_bandwidth=2e9,
                    cached=((HOST_SIZES[1], 1e10, 5e9),), touch=1e-10, memory=memory)
    halves = {max(1, n // 2): 1e-6 + n / 2 / 3e9 for n in HOST_SIZES}
    messages = {"allgather": 2, "allreduce": 4}  # ring steps on two ranks
    # two ranks in one process take turns on its CPU: twice a rank's work (with what its
    # messages cost more than their ping-pong, by working set), then messages
    two: dict[str, dict[object, float]] = {
        name: {n: 2 * collective_seconds(want, f"{name}.ring", n, 2)
               + k * halves[max(1, n // 2)] for n in HOST_SIZES}
        for name, k in messages.items()}
    top, page = HOST_SIZES[-1], resource.getpagesize()
    # half the fresh scratch faults: a page's first touch costs twice the average
    two["faults"] = {name: work_of(f"{name}.ring", top, 2).fresh / page for name in messages}
    got = fit_host(2e-5, two, halves, 2e-10, memory)
    assert got.touch == pytest.approx(1e-10) and got.memory == memory
    assert got.working_set == (20 << 20 if memory else 0)  # the largest calls' (5 n)
    assert (got.call, got.step) == pytest.approx((2e-5, 4e-6), rel=1e-3)  # 8 B copies aside
    assert (got.copy_bandwidth, got.reduce_bandwidth) == pytest.approx((4e9, 2e9), rel=1e-3)
    assert got.cached[0] == pytest.approx((HOST_SIZES[1], 1e10, 5e9), rel=1e-3)
    # a first touch measured dearer than the calls' whole work is capped by what the
    # largest calls leave once they have copied at the cached calls' rate: they still copy
    capped = fit_host(2e-5, two, halves, 1.0, memory)
    assert 0 < capped.touch < 1e-9
    assert math.isfinite(capped.copy_bandwidth) and capped.copy_bandwidth <= 1e10 * 1.001
    if memory:  # without the working set's rates the large calls' copies take the
        # messages' share
        assert fit_host(2e-5, two, halves, 2e-10).copy_bandwidth < 0.95 * 4e9


def test_sums_that_cost_nothing_at_a_size_are_free_there_and_a_size_load_hid_takes_the_other(
        ) -> None:
    """A cached allreduce that takes no more than its copies at the allgather's rate
    (its own copies ran faster: the residual is below nothing) gets free sums at that
    size; they were priced at the large calls' rate, and cached allreduce calls came out
    13% over their measurements.  One whose call took no longer than the 8-byte call's
    (load hid it) still takes the other size's rate."""
    from asynccomm.calibrate import HOST_SIZES, fit_host
    from asynccomm.sim.host import HostSpec, collective_seconds

    halves = {max(1, n // 2): 1e-6 + n / 2 / 3e9 for n in HOST_SIZES}
    messages = {"allgather": 2, "allreduce": 4}

    def calls(name: str, want: HostSpec) -> dict[object, float]:
        return {n: 2 * collective_seconds(want, f"{name}.ring", n, 2)
                + messages[name] * halves[max(1, n // 2)] for n in HOST_SIZES}

    large = HostSpec(cores=1, call=2e-5, step=4e-6, copy_bandwidth=4e9, reduce_bandwidth=2e9)
    two: dict[str, dict[object, float]] = {
        "allgather": calls("allgather", dataclasses.replace(
            large, cached=((HOST_SIZES[1], 1e10, 1e10),))),
        "allreduce": calls("allreduce", dataclasses.replace(
            large, cached=((HOST_SIZES[1], 2e10, math.inf),))),
        "faults": dict.fromkeys(messages, 0.0)}
    got = fit_host(2e-5, two, halves, 0.0)
    assert got.cached[0][1] == pytest.approx(1e10, rel=1e-3)
    assert got.cached[0][2] == math.inf
    hidden = {**two, "allreduce": dict(two["allreduce"])}
    hidden["allreduce"][HOST_SIZES[1]] = hidden["allreduce"][HOST_SIZES[0]]
    got = fit_host(2e-5, hidden, halves, 0.0)
    assert got.cached[0][2] == got.reduce_bandwidth < 1e11


def test_copy_rates_are_measured_by_working_set_and_never_rise_with_it() -> None:
    from asynccomm import calibrate

    got = calibrate.measure_memory((1 << 12, 1 << 16), repeats=1, budget=1e-4)
    assert [n for n, _ in got] == [1 << 12, 1 << 16]
    assert all(r > 0 for _, r in got) and got[0][1] >= got[1][1]
    # a rate that falls and rises again was slowed by load: it takes the larger's
    assert calibrate.envelope([(1, 2.0), (2, 1.0), (4, 1.5), (8, 0.5)]) == (
        (1, 2.0), (2, 1.5), (4, 1.5), (8, 0.5))


def test_in_process_ranks_are_timed_on_the_process_cpu_clock() -> None:
    import time

    from asynccomm.calibrate import clock_of

    # in-process ranks: the time they would take with a core to themselves, not the time
    # they wait for one on a shared machine; processes wait for each other: the wall clock
    assert clock_of("local") is time.process_time
    assert clock_of("processes") is clock_of("mpi") is time.perf_counter


def test_the_loop_of_calls_times_every_rank_s_share_of_a_call() -> None:
    import numpy as np

    import asynccomm as ac
    from asynccomm.calibrate import time_calls
    from asynccomm.sim.host import HostSpec

    # two ranks on one core, each call costs a millisecond of CPU per rank: back to back,
    # a call takes both ranks' work; the messages of 8 bytes are nearly free
    cluster = calibrated_cluster([Segment(1 << 20, 1e-9, 0.0)], name="x",
                                 host=HostSpec(cores=1, call=1e-3))

    async def main(comm: ac.Communicator) -> tuple[float, float]:
        buf = np.zeros(2, np.float32)
        return await time_calls(comm, lambda: comm.allreduce(buf, algorithm="ring"), 2,
                                comm.model_time, iterations=3)

    per_call, faults = ac.run(main, 2, cluster=cluster, clock="virtual")[0]
    assert per_call == pytest.approx(2e-3, rel=1e-3) and faults >= 0


def test_the_switch_of_mpi_is_measured_on_mpi_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    import asynccomm.calibrate as calibrate
    from asynccomm.sim.host import HostSpec

    launched: list[tuple[list[str], int]] = []

    def fake_mpi_run(args: list[str], ranks: int) -> None:  # a barrier of 130 us
        launched.append((list(args), ranks))
        Path(args[args.index("--barrier") + 1]).write_text(json.dumps(130e-6))

    monkeypatch.setattr(calibrate, "mpi_run", fake_mpi_run)
    host, segments = HostSpec(call=10e-6, step=1e-6), [Segment(1 << 20, 5e-6, 0.0)]
    switch = calibrate.measure_switch(2, host, segments, 1, transport="mpi")
    assert [ranks for _, ranks in launched] == [3]
    assert all(args[:5] == ["-m", "asynccomm.calibrate", "--transport", "mpi", "--barrier"]
               for args, _ in launched)
    # 3 ranks on 2 cores, 2 on the busiest, a barrier of 2 steps of 5 us messages, each
    # held on its receiver's core (Rule 4c) and for half on its sender's, if another
    # (Rule 4d): the busiest core's two ranks' calls 2 (10 + 2) us, one switch each (rank
    # 0 hears from rank 2, its core's other rank, in the first step, rank 2 from rank 0
    # in the second: Rule 2e), and in each step two messages into it (5 + 5) and one out
    # of it (2.5): 49 us and two switches (48.375 past a switch of 10 us, where the
    # ranks' steps fall otherwise on the cores), read off in more than one line
    assert switch == pytest.approx((130 - 48.375) / 2 * 1e-6, rel=1e-4)
    # the model with that switch times the barrier as measured, on the virtual clock
    crowded = calibrated_cluster(segments, name="x", ranks=3,
                                 host=HostSpec(cores=2, call=10e-6, step=1e-6, switch=switch))
    assert ac.run(calibrate._model_barriers, 3, cluster=crowded,
                  clock="virtual")[0] == pytest.approx(130e-6, abs=2e-9)  # (ns ticks)
    # a barrier no dearer than the model's without a switch: none
    monkeypatch.setattr(calibrate, "_barrier_call", lambda transport, ranks, repeats: 1e-6)
    assert calibrate.measure_switch(2, host, segments, 1, transport="mpi") == 0.0


def test_the_rendezvous_switch_is_what_makes_the_model_s_calls_differ_as_measured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import asynccomm.calibrate as calibrate
    from asynccomm.sim.host import HostSpec

    launched: list[tuple[list[str], int]] = []

    def fake_mpi_run(args: list[str], ranks: int) -> None:  # calls past the limit 300 us dearer
        launched.append((list(args), ranks))
        Path(args[args.index("--rendezvous") + 1]).write_text(json.dumps(300e-6))

    monkeypatch.setattr(calibrate, "mpi_run", fake_mpi_run)
    host = HostSpec(call=10e-6, step=1e-6, switch=20e-6)
    segments = [Segment(65536, 5e-6, 1e-10), Segment(1 << 20, 15e-6, 1e-10)]
    extra = calibrate.measure_rendezvous_switch(2, host, segments, 1, transport="mpi")
    assert [ranks for _, ranks in launched] == [3]  # one process more than the cores
    assert launched[0][0][:5] == ["-m", "asynccomm.calibrate", "--transport", "mpi",
                                  "--rendezvous"]
    assert extra > 0

    def model(rendezvous_switch: float) -> float:
        crowded = calibrated_cluster(segments, name="x", ranks=3, host=dataclasses.replace(
            host, cores=2, rendezvous_switch=rendezvous_switch))
        return ac.run(lambda comm: calibrate.rendezvous_calls(
            comm, 1, comm.model_time, calibrate.MODEL_CALLS), 3, cluster=crowded,
            clock="virtual")[0]

    # the model with it makes the calls differ as measured, on the virtual clock
    assert model(extra) == pytest.approx(300e-6, rel=1e-4)
    # calls no further apart than the model's without it: none
    monkeypatch.setattr(calibrate, "_rendezvous_call", lambda *a: model(0.0) / 2)
    assert calibrate.measure_rendezvous_switch(2, host, segments, 1) == 0.0


def test_the_rendezvous_calls_run_on_processes() -> None:
    from asynccomm.calibrate import _rendezvous_call

    # the measurement's shape (not its timing): rank 0's seconds, a difference that load
    # can make negative, well under a second either way
    took = _rendezvous_call("processes", 3, 1)
    assert isinstance(took, float) and abs(took) < 1.0


def test_the_switch_s_barrier_calls_run_on_one_process_more_than_the_cores() -> None:
    from asynccomm.calibrate import _barrier_call

    # the measurement's shape (not its timing): rank 0's seconds per barrier call
    took = _barrier_call("processes", 3, 1)
    assert isinstance(took, float) and 0 < took < 1.0


def test_each_size_is_timed_after_one_untimed_bounce(monkeypatch: pytest.MonkeyPatch) -> None:
    import asynccomm.calibrate as calibrate

    laps: list[tuple[int, int]] = []  # rank 0's (bytes, laps) in turn
    real = calibrate._laps

    async def counted(comm: ac.Communicator, buf: np.ndarray, right: int, left: int,
                      k: int, clock: object = None) -> float:
        if comm.rank == 0:
            laps.append((buf.nbytes, k))
        return await real(comm, buf, right, left, k)

    monkeypatch.setattr(calibrate, "_laps", counted)
    got = ac.run(lambda comm: calibrate.pingpong(comm, (8, 1024), 2, budget=1e-3), 2,
                 backend="local")[0]
    assert sorted(got) == [8, 1024] and all(t > 0 for t in got.values())
    sizing, timed = laps[:4], laps[4:]
    assert sizing == [(8, 1)] * 2 + [(1024, 1)] * 2  # each sized after an untimed bounce
    assert len(timed) == 2 * 2 * 2  # each repeat, each size: a bounce, then the timed laps
    assert [n for n, _ in timed] == [8, 8, 1024, 1024] * 2
    assert [k for _, k in timed[::2]] == [1] * 4  # the untimed bounce: one lap


def test_the_first_size_is_not_sized_by_the_worlds_first_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The world's first message is slow (tens of milliseconds); the iterations of the
    first size are counted from a bounce after it, so it is timed in as many laps as the
    others, not one at a time."""
    import asynccomm.calibrate as calibrate

    laps: list[tuple[int, int]] = []
    real = calibrate._laps
    first = [True]

    async def slow_first(comm: ac.Communicator, buf: np.ndarray, right: int, left: int,
                         k: int, clock: object = None) -> float:
        took = await real(comm, buf, right, left, k)
        if comm.rank == 0:
            laps.append((buf.nbytes, k))
            if first[0]:  # as the world's first message is
                first[0] = False
                return took + 0.05
        return took

    monkeypatch.setattr(calibrate, "_laps", slow_first)
    # (a budget of 10 ms: a bounce the machine holds up for 5 ms still leaves laps)
    ac.run(lambda comm: calibrate.pingpong(comm, (8, 16), 1, budget=1e-2), 2,
           backend="local")
    timed = dict(laps[-4:][1::2])  # the repeat: an untimed bounce, then the timed laps
    assert timed[8] > 1  # (it was 1: the world's first message took 50 ms)


def test_a_break_given_ends_a_segment_where_the_error_alone_would_not() -> None:
    # 10 us + n / 40 GB/s up to the eager limit, 0.1 us more past it (a clear-to-send):
    # within the tolerance of one segment, which the fit alone keeps
    sizes = [*SIZES[:14], 65544, *SIZES[14:]]
    points = [(n, 10e-6 + n / 40e9 + (1e-7 if n > 65536 else 0.0)) for n in sizes]
    assert len(fit_segments(points, max_segments=6)) == 1
    broken = fit_segments(points, max_segments=6, breaks=(65536,))
    assert broken[0].up_to == 65536
    assert all(predict(broken, n) == pytest.approx(t, rel=1e-6) for n, t in points)
    # a break with too few points on one side is left out
    assert fit_segments(points[:5], breaks=(points[3][0],)) == fit_segments(points[:5])


def test_a_step_on_the_model_is_what_two_steps_cost_more_than_one_and_a_message() -> None:
    from asynccomm.calibrate import MODEL_CALLS, step_calls
    from asynccomm.sim.host import HostSpec

    # two ranks on cores of their own, free copies: an 8-byte ring allreduce is the call,
    # two steps and two messages of its 4-byte blocks, an allgather the call, one step and
    # one message, so the difference less a message is the step, whatever the latency
    for latency in (2e-6, 9e-6):
        cluster = calibrated_cluster([Segment(1 << 20, latency, 0.0)], name="x", ranks=2,
                                     host=HostSpec(cores=2, call=10e-6, step=3e-6))
        got = ac.run(lambda comm: step_calls(comm, 1, comm.model_time, MODEL_CALLS), 2,
                     cluster=cluster, clock="virtual")
        assert got[0] == pytest.approx(3e-6, abs=1e-9) and got[1] == 0.0  # ns rounding


def test_the_step_of_a_transport_is_solved_on_the_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import asynccomm.calibrate as calibrate
    from asynccomm.sim.host import HostSpec

    launched: list[tuple[list[str], int]] = []

    def fake_mpi_run(args: list[str], ranks: int) -> None:  # a step 7 us dearer than one
        launched.append((list(args), ranks))
        Path(args[args.index("--steps") + 1]).write_text(json.dumps(8e-6))

    monkeypatch.setattr(calibrate, "mpi_run", fake_mpi_run)
    host, segments = HostSpec(call=10e-6, step=1e-6), [Segment(1 << 20, 5e-6, 0.0)]
    step = calibrate.measure_step(host, segments, 1, transport="mpi")
    assert [ranks for _, ranks in launched] == [2]
    assert launched[0][0][:5] == ["-m", "asynccomm.calibrate", "--transport", "mpi", "--steps"]
    assert step == pytest.approx(8e-6, abs=1e-9)  # the model's own step was 1 us of it
    # the model with that step times the program as measured, on the virtual clock
    stepped = calibrated_cluster(segments, name="x", ranks=2,
                                 host=HostSpec(cores=2, call=10e-6, step=step))
    assert ac.run(lambda comm: calibrate.step_calls(comm, 1, comm.model_time, 2), 2,
                  cluster=stepped, clock="virtual")[0] == pytest.approx(8e-6, abs=1e-9)
    # a program no dearer on the transport than on the model: the in-process step, never
    # less than none
    monkeypatch.setattr(calibrate, "_step_call", lambda transport, repeats: -5e-6)
    assert calibrate.measure_step(host, segments, 1, transport="mpi") == 0.0


def test_the_step_s_calls_run_on_two_processes() -> None:
    from asynccomm.calibrate import _step_call

    # the measurement's shape (not its timing): rank 0's seconds, a difference that load
    # can make negative, well under a second either way
    took = _step_call("processes", 1)
    assert isinstance(took, float) and abs(took) < 1.0


def test_the_calibrated_host_of_processes_has_the_transport_s_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import asynccomm.calibrate as calibrate
    from asynccomm.sim.host import HostSpec

    monkeypatch.setattr(calibrate.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(calibrate, "measure_step", lambda host, segments, repeats, transport:
                        host.step + 7e-6)
    seen: list[HostSpec] = []
    monkeypatch.setattr(calibrate, "measure_switch", lambda cores, host, *a, **k:
                        seen.append(host) or 2e-6)
    monkeypatch.setattr(calibrate, "measure_rendezvous_switch", lambda cores, host, *a, **k:
                        seen.append(host) or 3e-6)
    monkeypatch.setattr(calibrate, "measure_shared_copy", lambda host, segments, repeats,
                        transport: seen.append(host) or 0.75)
    in_process = HostSpec(cores=1, call=10e-6, step=1e-6)
    got = calibrate.measure_host("processes", 1, in_process)
    assert (got.cores, got.step, got.switch, got.rendezvous_switch, got.shared_copy) == (
        2, pytest.approx(8e-6), 2e-6, 3e-6, 0.75)
    assert seen[0].step == pytest.approx(8e-6)  # the share is solved on top of that step
    assert seen[1].step == pytest.approx(8e-6)  # and the switch
    assert seen[1].shared_copy == 0.75  # (with the share)
    assert seen[2].switch == 2e-6  # and a rendezvous step's on top of the switch
    assert calibrate.measure_host("local", 1, in_process) == in_process  # one loop: as is


def test_ranks_in_processes_of_their_own_have_no_steps_of_one_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import asynccomm.calibrate as calibrate
    from asynccomm.sim.host import HostSpec

    monkeypatch.setattr(calibrate.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(calibrate, "measure_step", lambda host, *a: host.step)
    monkeypatch.setattr(calibrate, "measure_switch", lambda cores, host, *a, **k: 0.0)
    monkeypatch.setattr(calibrate, "measure_rendezvous_switch", lambda *a, **k: 0.0)
    monkeypatch.setattr(calibrate, "measure_shared_copy", lambda *a, **k: 0.0)
    in_process = HostSpec(cores=1, call=10e-6, unwaited=(("allgather.ring", 3, 1e-6),))
    assert calibrate.measure_host("processes", 1, in_process).unwaited == ()
    assert calibrate.measure_host("local", 1, in_process).unwaited == in_process.unwaited


def test_the_step_of_ranks_of_one_loop_is_what_their_calls_take_less_than_the_model() -> None:
    from asynccomm.calibrate import LOOP_BYTES, unwaited_of
    from asynccomm.sim.host import HostSpec, collective_seconds, work_of

    host = HostSpec(cores=1, call=12e-6, step=0.5e-6, copy_bandwidth=1e10,
                    reduce_bandwidth=1e10)
    for name, p in (("allgather.ring", 4), ("allreduce.ring", 3)):
        steps = work_of(name, LOOP_BYTES, p).steps
        model = p * (collective_seconds(host, name, LOOP_BYTES, p) + steps * 9e-6)
        took = model - p * steps * 2.5e-6  # every step of every rank 2.5 us less
        assert unwaited_of(host, 9e-6, name, p, took) == pytest.approx(2.5e-6)
        assert unwaited_of(host, 9e-6, name, p, model + p * steps * 1e-6) \
            == pytest.approx(-1e-6)  # dearer than the model: kept, negative


def test_the_steps_of_ranks_of_one_loop_are_measured_by_algorithm_and_rank_count() -> None:
    from asynccomm.calibrate import measure_unwaited
    from asynccomm.sim.host import HostSpec

    host = HostSpec(cores=1, call=12e-6, copy_bandwidth=1e10, reduce_bandwidth=1e10)
    got = measure_unwaited(host, 9e-6, repeats=1, ranks=(3,))
    assert [u[:2] for u in got] == [("allgather.ring", 3), ("allreduce.ring", 3)]
    assert all(abs(u[2]) < 1e-3 for u in got)  # seconds per step: well under a millisecond
    HostSpec(unwaited=got)  # a valid table


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator")
def test_a_settled_allocator_hands_a_call_s_scratch_back_warm() -> None:
    from asynccomm import calibrate

    from ..transports.shm_cases import faults_of_fresh_arrays

    calibrate.settle_allocator()
    assert faults_of_fresh_arrays() < 8  # where a fresh process maps each one afresh


def cache_cliff(n: int) -> float:
    """One-way seconds of an in-process message on a machine with a 16 MiB last cache (as
    measured here): 21 us + n / 28 GB/s while the message and its copy stay in the cache,
    n / 7 GB/s once they are far past it, in between from 2 MiB to 8 MiB."""
    cached, memory = 21e-6 + n / 28e9, n / 7e9 + 0.3e-3
    if n <= 2 << 20:
        return cached
    if n >= 8 << 20:
        return memory
    f = math.log2(n / (2 << 20)) / 2  # 0 at 2 MiB, 1 at 8 MiB
    return cached * (memory / cached) ** f


def test_a_cache_cliff_is_followed_by_a_segment_with_a_negative_intercept() -> None:
    from asynccomm.calibrate import steep_steps

    points = {n: cache_cliff(n) for n in SIZES}
    # the second pass measures inside the cliff, where the time grows faster than the size
    steps = steep_steps(points)
    assert steps == [round(math.sqrt((1 << 21) * (1 << 22))),
                     round(math.sqrt((1 << 22) * (1 << 23)))]
    assert steep_steps({n: eager_rendezvous(n) for n in SIZES}) == []
    points.update({n: cache_cliff(n) for n in steps})
    segments = fit_segments(list(points.items()), max_segments=6, breaks=(65536,))
    # a line through the origin (alpha clamped to 0) missed 4 MiB by 40%, 8 MiB by 20%
    for n, t in points.items():
        assert predict(segments, n) == pytest.approx(t, rel=0.1), n
    assert segments[0].alpha > 0 and any(s.alpha < 0 for s in segments[1:])
    # every segment's line is above 0 from the size before its first on
    for before, seg in zip(segments, segments[1:], strict=False):
        assert seg.alpha + (before.up_to + 1) * seg.beta > 0
    cluster = calibrated_cluster(segments, name="cliff", ranks=2, shared=True)
    for n in (4 << 20, 5 << 20, 8 << 20):
        took = ClusterModel(cluster, 2).transfer(0, 1, n, now=0).duration * 1e-9
        assert took == pytest.approx(predict(segments, n), abs=2e-9)


def test_a_segment_s_line_is_fitted_above_0_from_its_floor() -> None:
    points = [(4 << 20, 400e-6), (6 << 20, 700e-6), (8 << 20, 1000e-6)]
    alpha, beta, _ = fit_line(points, floor=2 << 20)  # steep: a negative intercept
    assert alpha == pytest.approx(-200e-6) and beta == pytest.approx(300e-6 / (2 << 20))
    steeper = [(4 << 20, 100e-6), (6 << 20, 900e-6), (8 << 20, 1700e-6)]
    alpha, beta, _ = fit_line(steeper, floor=3 << 20)  # through 0 at the floor
    assert alpha + beta * (3 << 20) == pytest.approx(0, abs=1e-12) and beta > 0
    assert fit_line(points)[0] == 0  # the first segment's alpha is a latency: >= 0


@pytest.mark.parametrize(("segments", "ok"), [
    (((100, 1e-6, 1e9), (1000, -0.05e-6, 1e9)), True),  # 101 B: 0.051 us
    (((100, 1e-6, 1e9), (1000, -0.2e-6, 1e9)), False),  # 101 B: below 0
    (((100, 1e-6, 1e9), (1000, -math.inf, 1e9)), False),
])
def test_a_later_segment_may_have_a_negative_latency_if_its_time_stays_above_0(
        segments: tuple[tuple[int, float, float], ...], ok: bool) -> None:
    if ok:
        assert LinkSpec("l", 1e9, 0.0, segments=segments).stage_time(101) > 0
    else:
        with pytest.raises(ValueError, match="smallest size"):
            LinkSpec("l", 1e9, 0.0, segments=segments)


def _write_faults(arrays: tuple[np.ndarray, ...]) -> int:
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for arr in arrays:
        arr.fill(3)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_the_calls_timed_run_on_arrays_of_real_pages() -> None:
    # Arrays past glibc's largest mmap threshold come fresh from the system: untouched,
    # their pages all read as one shared page of zeros, and a call reading them is timed
    # on the caches.  Every page written when made, writing them again faults nothing.
    from types import SimpleNamespace

    from asynccomm.calibrate import _ring_calls

    def call(*args: object, **kwargs: object) -> None:
        return None

    comm = SimpleNamespace(size=2, allgather=call, allreduce=call)
    nbytes = 128 << 20
    calls = _ring_calls(comm, nbytes)  # type: ignore[arg-type]
    arrays = tuple(a for c in calls.values() for a in c.args)
    assert [a.nbytes for a in arrays] == [nbytes // 2, nbytes, nbytes]
    assert _write_faults(arrays) <= 2


def test_validation_times_the_calls_on_arrays_of_real_pages() -> None:
    from asynccomm.calibrate import call_buffers

    nbytes = 128 << 20
    for name in ("allreduce", "allgather", "alltoall"):
        bufs = call_buffers(name, nbytes, 4)
        assert all(not a.any() for a in bufs)
        assert _write_faults(bufs) <= 2
    with pytest.raises(ValueError, match="no arrays for 'bcast'"):
        call_buffers("bcast", 8, 2)


def test_a_record_keeps_what_the_calibration_measured_and_gives_it_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``recording``: the timed calls (and ping-pongs) of a calibration go into its
    ``Record`` as JSON, and a replaying record gives them back without measuring; one it
    does not hold is an error."""
    import asynccomm.calibrate as calibrate

    timed: list[tuple[object, ...]] = []

    def call_timed(*args: object) -> float:
        timed.append(args)
        return 42e-6

    monkeypatch.setattr(calibrate, "_call_timed", call_timed)
    with calibrate.recording(calibrate.Record()) as record:
        assert calibrate._barrier_call("processes", 3, 7) == 42e-6
        assert calibrate._barrier_call("processes", 3, 7) == 42e-6  # measured once
    assert timed == [("barrier", "processes", 3, 7)]
    assert calibrate._barrier_call("processes", 3, 7) == 42e-6 and len(timed) == 2  # no record
    kept = json.loads(json.dumps(record.taken))
    with calibrate.recording(calibrate.Record(kept, replay=True)):
        assert calibrate._barrier_call("processes", 3, 7) == 42e-6
        with pytest.raises(LookupError, match="no call"):
            calibrate._barrier_call("processes", 4, 7)
    assert len(timed) == 2


def test_the_cross_cpu_probe_times_a_read_of_bytes_another_cpu_just_wrote(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``cross_cpu``: where this process may run on CPUs 0 and 1, a positive time (a read
    of 64 KiB at more than 100 MB/s and less than 1 TB/s); else None."""
    import asynccomm.calibrate as calibrate

    if {0, 1} <= os.sched_getaffinity(0):
        took = calibrate.cross_cpu(rounds=200)
        assert took is not None and 64e-9 < took < 64e-5
    monkeypatch.setattr(calibrate.os, "sched_getaffinity", lambda pid: {0})
    assert calibrate.cross_cpu() is None


async def _cpus(comm: ac.Communicator) -> set[int]:
    """The CPUs this rank's process may run on (a module function: it pickles)."""
    return os.sched_getaffinity(0)


def test_placed_ranks_run_each_on_the_cpu_the_model_places_it_on() -> None:
    """Rank r's process on the r % n-th of the n CPUs the parent may use, as the model's
    ``HostSpec.core`` has it (and ``mpiexec -bind-to core``)."""
    from asynccomm.calibrate import placed

    cpus = sorted(os.sched_getaffinity(0))
    got = ac.run(placed(_cpus), 3, backend="processes")
    assert got == [{cpus[r % len(cpus)]} for r in range(3)]


@pytest.mark.parametrize("fails", [False, True])
async def test_a_placed_program_gives_its_process_its_cpus_back(fails: bool) -> None:
    from types import SimpleNamespace

    from asynccomm.calibrate import placed

    before = os.sched_getaffinity(0)
    cpus = sorted(before)
    during: list[set[int]] = []

    async def main(comm: Any) -> None:
        during.append(os.sched_getaffinity(0))
        if fails:
            raise RuntimeError("the program failed")

    async with asyncio.timeout(10):
        try:
            await placed(main)(SimpleNamespace(rank=1))
        except RuntimeError:
            assert fails
    assert during == [{cpus[1 % len(cpus)]}]
    assert os.sched_getaffinity(0) == before
