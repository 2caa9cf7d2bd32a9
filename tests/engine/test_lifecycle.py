"""Closing, failures, run(), and a loop that stays responsive during large copies."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm.sim.loop import new_virtual_loop

BIG = ac.EAGER_LIMIT + 1


async def test_close_fails_pending_ops_and_breaks_peers() -> None:
    async with ac.open_world(3) as world:
        c0, c1, c2 = world.comms
        mine = c0.irecv(np.zeros(1), 2, 9)
        waiting_for_me = c1.irecv(np.zeros(1), 0, 4)
        from_anyone = c1.irecv(np.zeros(1), ac.ANY_SOURCE, 5)
        sending_to_me = c2.isend(np.zeros(BIG, np.uint8), 0, 1)
        await c0.aclose()
        await c0.aclose()  # idempotent
        with pytest.raises(ac.CommClosedError):
            await mine
        with pytest.raises(ac.CommBrokenError) as info:
            await waiting_for_me
        assert info.value.peer == 0
        with pytest.raises(ac.CommBrokenError):
            await sending_to_me
        assert not from_anyone.done()  # rank 2 may still send it
        with pytest.raises(ac.CommBrokenError):
            await c1.send(np.zeros(1), 0)
        with pytest.raises(ac.CommBrokenError):
            await c1.recv(np.zeros(1), 0)
        with pytest.raises(ac.CommClosedError):
            await c0.send(np.zeros(1), 1)
        await c2.send(np.ones(1), 1, 5)
        await from_anyone


async def test_a_closed_rank_keeps_no_staging_memory() -> None:
    """Staged messages and the pool's free buffers go at close, not when the collector
    finds the closed world's cycles: worlds opened one after another do not pile up."""
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        for tag in range(4):  # staged at rank 1, taken, their buffers kept for reuse
            await c0.send(np.ones(4096), 1, tag)
        for tag in range(4):
            await c1.recv(np.empty(4096), 0, tag)
        await c0.send(np.ones(4096), 1, 9)  # staged, never received
        stats = c1.statistics().pool
        assert stats.cached_bytes > 0 and stats.in_use_bytes > 0
    for comm in world.comms:
        stats = comm.statistics().pool
        assert (stats.cached_bytes, stats.in_use_bytes) == (0, 0)


async def test_eager_message_from_a_closed_rank_is_still_delivered() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        await c0.send(np.array([3.0]), 1)
        await c0.aclose()
        out = np.zeros(1)
        await c1.recv(out, 0)
        assert out[0] == 3.0


async def test_close_lets_a_matched_copy_finish() -> None:
    n = 32 << 20
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        out = np.zeros(n, np.uint8)
        recv = c1.irecv(out, 0)
        send = c0.isend(np.full(n, 9, np.uint8), 1)
        await c1.aclose()
        assert (await recv).nbytes == n and out[-1] == 9
        await send


def test_one_failing_rank_raises_itself_with_its_rank_and_cancels_the_rest() -> None:
    async def main(comm: ac.Communicator) -> None:
        if comm.rank == 1:
            raise KeyError("boom")
        await comm.recv(np.zeros(1), 1)  # would wait forever

    with pytest.raises(KeyError) as info:
        ac.run(main, 3)
    assert "(raised on rank 1)" in info.value.__notes__


def test_several_failing_ranks_raise_an_exception_group() -> None:
    async def main(comm: ac.Communicator) -> None:
        if comm.rank:
            raise ValueError(f"rank {comm.rank}")

    with pytest.raises(ExceptionGroup) as info:
        ac.run(main, 3, loop="asyncio")
    assert sorted(str(e) for e in info.value.exceptions) == ["rank 1", "rank 2"]


def test_a_rank_that_returns_early_breaks_peers_instead_of_hanging() -> None:
    async def main(comm: ac.Communicator) -> str:
        if comm.rank == 0:
            return "done"
        try:
            await comm.recv(np.zeros(1), 0)
        except ac.CommBrokenError as exc:
            return f"broken by {exc.peer}"
        return "received"

    assert ac.run(main, 2) == ["done", "broken by 0"]


async def test_loop_keeps_running_during_a_256mb_transfer() -> None:
    n = 256 << 20
    ticks = 0
    stop = False

    async def ticker() -> None:
        nonlocal ticks
        while not stop:
            ticks += 1
            await asyncio.sleep(0)

    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        src = np.ones(n, np.uint8)
        out = np.zeros(n, np.uint8)
        task = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        recv = c1.irecv(out, 0)
        before = ticks
        await c0.send(src, 1)
        during = ticks - before
        stop = True
        await task
        await recv
    # The copy ran on worker threads: the ticker kept turning while it moved. A copy on
    # the loop would leave `during` at 0.
    assert during > 10
    assert out[0] == 1 and out[-1] == 1


# -- who hears of a close ------------------------------------------------------------------

PRESETS = [None, "roce100g"]  # instant, and timed by a cluster model


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("op", ["recv", "probe", "recv ANY_SOURCE", "probe ANY_SOURCE"])
def test_an_op_waiting_for_a_rank_fails_the_moment_it_closes(op: str, preset: str | None) -> None:
    """Rank 0's op waits (posted at model time 0); rank 1 computes for 1 s and returns, and
    the op fails at once, at model time 1 (a close missed would end in DeadlockError)."""

    async def main(comm: ac.Communicator) -> float:
        if comm.rank == 1:
            await comm.compute(seconds=1.0)
            return 0.0
        src = ac.ANY_SOURCE if "ANY_SOURCE" in op else 1
        with pytest.raises(ac.CommBrokenError):
            if op.startswith("probe"):
                await comm.probe(src, 3)
            else:
                await comm.recv(np.zeros(4), src, 3)
        return asyncio.get_running_loop().time()

    cluster = None if preset is None else ac.Cluster.preset(preset)
    assert ac.run(main, 2, cluster=cluster, clock="virtual")[0] == 1.0


def run_virtual(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    with asyncio.Runner(loop_factory=new_virtual_loop) as runner:
        runner.run(body())


def test_a_recv_posted_after_a_close_gets_what_the_rank_sent_before_it() -> None:
    """Timed: rank 1 hears that rank 0 closed only once rank 0's last message to it has
    landed, so a recv it posts in between takes that message instead of failing."""

    async def body() -> None:
        async with ac.open_world(2, ac.Cluster.preset("roce100g")) as world:
            c0, c1 = world.comms
            await c0.send(np.arange(8.0), 1)  # eager: done once staged, still on its way
            await c0.aclose()
            assert c1.iprobe(0) is None  # not landed yet
            out = np.zeros(8)
            assert (await c1.recv(out, 0)).source == 0
            assert out[-1] == 7.0
            with pytest.raises(ac.CommBrokenError):
                await c1.recv(out, 0)

    run_virtual(body)


def test_a_wildcard_recv_fails_once_the_news_of_every_close_has_landed() -> None:
    """Timed: rank 0 waits for ANY_SOURCE (tag 7); rank 1 sends it a message on tag 5 and
    closes, then rank 2 closes.  Rank 0 hears of rank 1's close only after that message
    landed, and only then is nobody left for its wildcard recv."""

    async def body() -> None:
        loop = asyncio.get_running_loop()
        async with ac.open_world(3, ac.Cluster.preset("roce100g")) as world:
            c0, c1, c2 = world.comms
            wild = c0.irecv(np.zeros(1), ac.ANY_SOURCE, 7)
            await c1.send(np.ones(8), 0, 5)  # eager: staged, still on its way
            await c1.aclose()
            await c2.aclose()
            closed_at = loop.time()
            assert not wild.done()  # rank 1 is not known to be gone yet
            with pytest.raises(ac.CommBrokenError, match=r"\(ranks 1, 2\)"):
                await wild
            assert loop.time() > closed_at
            status = c0.iprobe(1, 5)  # it landed before the news
            assert status is not None and status.nbytes == 64

    run_virtual(body)
