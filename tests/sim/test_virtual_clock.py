"""The virtual-time loop and worlds on it: time jumps, compute, deadlock detection."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import numpy as np
import pytest

import asynccomm as ac
from asynccomm.sim.loop import VirtualTimeLoop, new_virtual_loop


def run_virtual(coro_fn: object) -> object:
    with asyncio.Runner(loop_factory=new_virtual_loop) as runner:
        return runner.run(coro_fn())  # type: ignore[operator]


def test_time_jumps_to_the_next_timer_and_stands_still_otherwise() -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        seen = [loop.time_ns()]
        for _ in range(1000):  # ready callbacks take no virtual time
            await asyncio.sleep(0)
        seen.append(loop.time_ns())
        await asyncio.sleep(86400)  # a day, in no wall time
        seen.append(loop.time_ns())
        await asyncio.sleep(1e-9)
        seen.append(loop.time_ns())
        return seen

    assert run_virtual(main) == [0, 0, 86400 * 10**9, 86400 * 10**9 + 1]


def test_timers_fire_in_deadline_order() -> None:
    async def main() -> list[str]:
        order: list[str] = []
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        for name, delay in [("c", 3e-6), ("a", 1e-6), ("b", 2e-6)]:
            loop.call_later(delay, order.append, name)
        loop.call_later(4e-6, done.set_result, None)
        await done
        return order

    assert run_virtual(main) == ["a", "b", "c"]


def test_thread_work_takes_no_virtual_time() -> None:
    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        value = await asyncio.to_thread(sum, range(100_000))
        return value, loop.time_ns()  # type: ignore[attr-defined]

    assert run_virtual(main) == (sum(range(100_000)), 0)


def test_a_loop_with_nothing_to_wake_raises_deadlock_error() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(ac.DeadlockError):
        run_virtual(main)


def test_compute_occupies_the_compute_stream_in_model_time() -> None:
    async def main(comm: ac.Communicator) -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        await comm.compute(seconds=2.0)
        first = loop.time()
        # Two tasks issued together queue on the one compute stream: 3 s + 1 s.
        await asyncio.gather(comm.compute(seconds=3.0), comm.compute(seconds=1.0))
        return first, loop.time()

    assert ac.run(main, 2, clock="virtual") == [(2.0, 6.0), (2.0, 6.0)]


def test_compute_needs_exactly_one_amount_and_a_rate_for_flops() -> None:
    async def main(comm: ac.Communicator) -> None:
        with pytest.raises(TypeError, match="exactly one of"):
            await comm.compute()
        with pytest.raises(TypeError, match="exactly one of"):
            await comm.compute(seconds=1, flops=1)
        with pytest.raises(ValueError, match="finite number >= 0"):
            await comm.compute(seconds=-1)
        with pytest.raises(ValueError, match="needs a device compute rate"):
            await comm.compute(flops=1e9)
        await comm.compute(seconds=0)

    ac.run(main, 1, clock="virtual")


def test_deadlock_names_every_unmatched_op_per_rank() -> None:
    async def main(comm: ac.Communicator) -> None:
        big = np.zeros(ac.EAGER_LIMIT + 1, np.uint8)
        await comm.send(big, 1 - comm.rank, tag=comm.rank)  # both wait for a recv

    with pytest.raises(ac.DeadlockError) as info:
        ac.run(main, 2, clock="virtual")
    err = info.value
    assert err.pending == {0: [f"send(dst=1, tag=0, {ac.EAGER_LIMIT + 1} B |u1)"],
                           1: [f"send(dst=0, tag=1, {ac.EAGER_LIMIT + 1} B |u1)"]}
    assert "rank 0: send(dst=1, tag=0" in str(err)


def test_deadlock_includes_ops_queued_behind_a_stuck_stream() -> None:
    async def main(comm: ac.Communicator) -> None:
        s = comm.stream()
        comm.irecv(np.zeros(1), 1 - comm.rank, 1, stream=s)
        await comm.recv(np.zeros(1), 1 - comm.rank, 2, stream=s)

    with pytest.raises(ac.DeadlockError) as info:
        ac.run(main, 2, clock="virtual")
    assert info.value.pending[0] == ["recv(src=1, tag=1)",
                                     "recv(src=1, tag=2) queued on its stream"]


def test_virtual_clock_needs_the_virtual_loop() -> None:
    async def main() -> None:
        async with ac.open_world(2, clock="virtual"):
            pass

    with pytest.raises(ValueError, match="needs the virtual-time loop"):
        asyncio.run(main())
    with pytest.raises(ValueError, match="does not go with"):
        ac.run(lambda comm: comm.compute(seconds=1), 1, clock="virtual", loop="uvloop")


def test_timeouts_run_on_virtual_time() -> None:
    async def main(comm: ac.Communicator) -> float:
        loop = asyncio.get_running_loop()
        if comm.rank == 0:
            with pytest.raises(ac.CommTimeoutError):
                await comm.recv(np.zeros(1), 1, timeout=30.0)
            return loop.time()
        await comm.compute(seconds=60)
        return loop.time()

    assert ac.run(main, 2, clock="virtual") == [30.0, 60.0]


def test_timers_due_at_the_same_time_fire_in_scheduling_order() -> None:
    async def main() -> list[int]:
        order: list[int] = []
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        when = loop.time() + 1e-6
        for i in range(64):  # more than a heap keeps in insertion order by accident
            loop.call_at(when, order.append, i)
        loop.call_at(when + 1e-6, done.set_result, None)
        await done
        return order

    assert run_virtual(main) == list(range(64))


_PROGRAM = """
import numpy as np, asynccomm as ac
from asynccomm.sim import Cluster

async def main(comm):
    data = np.full(1 << 16, comm.rank, np.float32)
    for root in range(comm.size):
        await comm.bcast(data, root=root)
    await comm.allreduce(data)
    await comm.alltoall(np.zeros((comm.size, 1 << 12), np.float32),
                        np.zeros((comm.size, 1 << 12), np.float32))
    return comm.model_time()

times = ac.run(main, 12, cluster=Cluster.preset("ascend910"), clock="virtual")
print(repr(times))
"""


# the same with each collective call's CPU work on cores the ranks share (sim/host.py)
_HOST_PROGRAM = """
from asynccomm.sim import Cluster, HostSpec
c = Cluster.preset("ascend910")
HOSTED = Cluster(nodes=None, devices_per_node=c.devices_per_node, intra=c.intra,
                 inter=c.inter, device=c.device, groups_per_node=c.groups_per_node,
                 cross_group=c.cross_group,
                 host=HostSpec(cores=3, call=2e-5, step=3e-6, copy_bandwidth=4e9,
                               reduce_bandwidth=2e9, switch=1e-5, touch=1e-11,
                               memory=((1 << 16, 4e10), (1 << 20, 1e10))))
""" + _PROGRAM.replace('cluster=Cluster.preset("ascend910")', "cluster=HOSTED")


@pytest.mark.parametrize("program", [_PROGRAM, _HOST_PROGRAM], ids=["messages", "host"])
def test_a_programs_model_time_does_not_depend_on_hash_order(program: str) -> None:
    seen = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                             text=True, timeout=60, check=True)
        seen.add(out.stdout)
    assert len(seen) == 1
