"""The collectives as communicator methods: on a cluster world they pick the algorithm
the model says is fastest and take its closed-form time, on sub-communicators too (whose
messages cost the links of their ranks' devices)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm._collectives import functions as coll
from asynccomm._collectives.costs import CollectiveCosts, model_chooser
from asynccomm.sim.model import ClusterModel

MiB = 1 << 20


async def _aligned(comm: ac.Communicator) -> None:
    """Every rank starts at the same model time, the next whole millisecond."""
    await comm.barrier()
    now = comm.model_time()
    await asyncio.sleep(math.floor(now * 1000 + 1) / 1000 - now)


def _timed(preset: str, size: int, nbytes: int, group: list[int] | None
           ) -> tuple[float, float, str]:
    """(modelled seconds, closed form, algorithm) of ``comm.allreduce`` of ``nbytes`` over
    the world, or over a sub-communicator of the world ranks ``group``."""
    async def main(comm: ac.Communicator) -> Any:
        async with asyncio.timeout(60):
            model = comm._engine.link.timing.model  # type: ignore[union-attr]
            assert isinstance(model, ClusterModel)
            members = group if group is not None else list(range(comm.size))
            sub = await comm.split(0 if comm.rank in members else None,
                                   key=members.index(comm.rank) if comm.rank in members else 0)
            if sub is None:
                await _aligned(comm)
                return None
            names = [f"allreduce.{a}" for a in coll.algorithms("allreduce")]
            chosen = model_chooser(model, members)(names, nbytes, sub.size)
            form = CollectiveCosts(model, members).cost(chosen, nbytes)
            await _aligned(comm)
            t0 = comm.model_time()
            await sub.allreduce(np.ones(nbytes // 4, np.float32))
            return t0, comm.model_time(), form, chosen

    out = [r for r in ac.run(main, world_size=size, cluster=ac.Cluster.preset(preset))
           if r is not None]
    return (max(r[1] for r in out) - max(r[0] for r in out), out[0][2], out[0][3])


@pytest.mark.parametrize(("preset", "size", "nbytes", "group"), [
    ("ascend910b", 8, 16 * MiB, None),
    ("ascend910b", 8, 8 << 10, None),
    ("ascend910b", 8, 4 * MiB, [0, 2, 4, 6]),
    ("ascend910", 8, 16 * MiB, [4, 5, 6, 7]),
    ("ascend910", 8, 16 * MiB, [0, 1, 4, 5]),  # across the two groups' PCIe switch
], ids=["910b-world-16M", "910b-world-8K", "910b-even-4M", "910-group-16M", "910-mixed-16M"])
def test_the_method_takes_the_chosen_algorithms_closed_form(
        preset: str, size: int, nbytes: int, group: list[int] | None) -> None:
    took, form, chosen = _timed(preset, size, nbytes, group)
    assert 1 / 1.1 <= took / form <= 1.1, (chosen, took, form)


def test_a_sub_communicator_pays_for_the_links_of_its_ranks_devices() -> None:
    """On two ascend910b servers, a message between the two ranks of a sub-communicator of
    world ranks 0 and 8 costs what one from world rank 0 to 8 does (across the servers),
    not what one from 0 to 1 does."""
    async def one(comm: ac.Communicator, dst: int) -> float:
        t0 = comm.model_time()
        if comm.rank == 0:
            await comm.send(np.ones(4 * MiB, np.uint8), dst)
        elif comm.rank == dst:
            await comm.recv(np.ones(4 * MiB, np.uint8), 0)
        took = comm.model_time() - t0
        # The others wait it out: their next barrier's messages would share dst's NIC.
        await asyncio.sleep(max(0.0, t0 + 1e-3 - comm.model_time()))
        return took

    async def main(comm: ac.Communicator) -> tuple[float, float, float]:
        near = await one(comm, 1)
        await _aligned(comm)
        far = await one(comm, 8)
        await _aligned(comm)
        sub = await comm.split(0 if comm.rank in (0, 8) else None)
        await _aligned(comm)  # (rank 0 decides a split: it may leave it last)
        mapped = await one(sub, 1) if sub is not None else 0.0
        return near, far, mapped

    near, far, mapped = ac.run(main, world_size=16,
                               cluster=ac.Cluster.preset("ascend910b"))[0]
    assert mapped == pytest.approx(far, abs=2e-9) and far > 1.1 * near  # (ns rounding)


def test_collectives_at_world_size_one() -> None:
    async def main(comm: ac.Communicator) -> list[Any]:
        x = np.arange(3.0)
        await comm.allreduce(x, op=ac.PROD)
        g = np.zeros((1, 3))
        await comm.allgather(x, g)
        await comm.barrier()
        sub = await comm.split(0)
        assert sub is not None and sub.size == 1
        await sub.bcast(x)
        return [x.tolist(), g.tolist()]

    assert ac.run(main, world_size=1) == [[[0.0, 1.0, 2.0], [[0.0, 1.0, 2.0]]]]


def test_a_bad_op_is_refused_on_every_rank_and_the_next_call_works() -> None:
    async def main(comm: ac.Communicator) -> int:
        with pytest.raises(ValueError, match="allreduce"):
            await comm.allreduce(np.ones(2), op="avg")
        with pytest.raises(TypeError, match="allreduce"):
            await comm.allreduce([1, 2])
        x = np.ones(2)
        await comm.allreduce(x)
        return int(x[0])

    assert ac.run(main, world_size=3) == [3, 3, 3]


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_collective_after_a_peer_closed_fails_instead_of_hanging(loop: str) -> None:
    """In one process the private contexts are made on first use: one made after a rank
    closed is closed for that rank too, so the others get CommBrokenError, not a hang."""
    async def main(comm: ac.Communicator) -> str:
        if comm.rank == 1:
            return "left"
        with pytest.raises(ac.CommBrokenError):  # returns once rank 1 has closed
            await comm.probe(1, 5)
        with pytest.raises(ac.CommBrokenError):
            async with asyncio.timeout(10):
                await comm.barrier()
        with pytest.raises(ac.CommBrokenError):
            async with asyncio.timeout(10):
                await comm.send_obj({"w": np.ones(1 << 17)}, 1)
        return "broken"

    assert ac.run(main, world_size=2, loop=loop) == ["broken", "left"]
