"""Cancellation and timeouts withdraw an op atomically and lose no message."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import asynccomm as ac
from asynccomm.testing import posted

BIG = ac.EAGER_LIMIT + 1


async def test_cancelled_recv_leaves_the_message_for_the_next_recv() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        first = np.full(1, -1.0)
        req = c1.irecv(first, 0, 1)
        assert req.cancel() and req.cancelled() and req.done()
        assert not req.cancel()  # already cancelled
        with pytest.raises(asyncio.CancelledError):
            await req
        await c0.send(np.array([4.0]), 1, 1)
        second = np.zeros(1)
        await c1.recv(second, 0, 1)
        assert first[0] == -1.0 and second[0] == 4.0
        assert c1.statistics().pending_ops == 0


async def test_cancel_after_match_returns_false_and_the_op_completes() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        out = np.zeros(1)
        req = c1.irecv(out, 0)
        await c0.send(np.ones(1), 1)
        assert not req.cancel()
        assert (await req).count == 1 and out[0] == 1.0


async def test_task_cancellation_withdraws_a_waiting_recv() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        task = await posted(c1.recv(np.zeros(1), 0, 3))
        assert c1.statistics().matcher.posted_recvs == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert c1.statistics().matcher.posted_recvs == 0
        await c0.send(np.array([8.0]), 1, 3)
        out = np.zeros(1)
        await c1.recv(out, 0, 3)
        assert out[0] == 8.0


async def test_asyncio_timeout_withdraws_a_rendezvous_send() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await c0.send(np.zeros(BIG, np.uint8), 1, 2)
        assert c1.iprobe(0, 2) is None  # withdrawn from the receiver's queue
        again = c0.isend(np.ones(BIG, np.uint8), 1, 2)  # the next send still works
        out = np.zeros(BIG, np.uint8)
        await c1.recv(out, 0, 2)
        await again
        assert out.min() == 1


async def test_a_task_cancelled_during_its_matched_transfer_returns_the_completed_recv() -> None:
    n = 64 << 20  # big enough to be copied on worker threads
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        out = np.zeros(n, np.uint8)
        task = await posted(c1.recv(out, 0, 1))
        send = c0.isend(np.full(n, 5, np.uint8), 1, 1)
        assert not send.done()  # matched, copy running on threads
        task.cancel()
        status = await task  # the recv completed: never reported cancelled
        assert status == ac.Status(0, 1, n, n) and not task.cancelled()
        await send
        assert out[0] == 5 and out[-1] == 5  # no partial write: all of it arrived
        assert c1.statistics().active_copies == 0


@pytest.mark.parametrize("size", [8, BIG])
async def test_timeout_raises_comm_timeout_naming_what_the_peer_posted(size: int) -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        c0.irecv(np.zeros(4), 1, 7)  # rank 0 waits for something else
        with pytest.raises(ac.CommTimeoutError) as info:
            await c1.recv(np.zeros(size, np.uint8), 0, 3, timeout=0.05)
        err = info.value
        assert isinstance(err, TimeoutError)
        assert (err.op, err.peer, err.tag, err.timeout, err.rank) == ("recv", 0, 3, 0.05, 1)
        assert "rank 0 had posted recv(src=1, tag=7)" in str(err)
        # Nothing was lost: a later message with that tag is received normally.
        send = c0.isend(np.ones(size, np.uint8), 1, 3)
        out = np.zeros(size, np.uint8)
        await c1.recv(out, 0, 3)
        await send
        assert out.min() == 1


async def test_send_timeout_names_unmatched_messages_and_withdraws() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        with pytest.raises(ac.CommTimeoutError) as info:
            await c0.send(np.zeros(BIG, np.uint8), 1, 1, timeout=0.05)
        assert "rank 1 had posted nothing for rank 0" in str(info.value)
        assert c1.statistics().matcher.unexpected_messages == 0


async def test_default_timeout_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCOMM_TIMEOUT", "0.05")
    async with ac.open_world(2) as world:
        with pytest.raises(ac.CommTimeoutError) as info:
            await world.comms[0].recv(np.zeros(1), 1)
        assert info.value.timeout == 0.05
        # An explicit timeout overrides it.
        req = world.comms[0].irecv(np.zeros(1), 1, timeout=30)
        await world.comms[1].send(np.ones(1), 0)
        await req


async def test_wildcard_recv_timeout_lists_every_rank_that_posted() -> None:
    async with ac.open_world(3) as world:
        c0, c1, c2 = world.comms
        c2.irecv(np.zeros(1), 0, 5)
        with pytest.raises(ac.CommTimeoutError) as info:
            await c0.recv(np.zeros(1), ac.ANY_SOURCE, 1, timeout=0.02)
        assert "rank 2 had posted recv(src=0, tag=5)" in str(info.value)
        assert "rank 1" not in str(info.value)


async def test_wait_all_cancellation_leaves_requests_running() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        req = c1.irecv(np.zeros(1), 0)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.02):
                await ac.wait_all([req])
        assert not req.done()
        await c0.send(np.ones(1), 1)
        await req


async def test_batch_cancellation_withdraws_every_unmatched_op() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.02):
                await c0.batch([ac.SendOp(np.zeros(BIG, np.uint8), 1, 1),
                                ac.RecvOp(np.zeros(1), 1, 2)])
        assert c0.statistics().pending_ops == 0
        assert c1.statistics().matcher.unexpected_messages == 0


async def test_a_timeout_while_queued_on_its_stream_blames_the_stream() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        s = c0.stream()
        first = c0.isend(np.zeros(BIG, np.uint8), 1, 1, stream=s)
        with pytest.raises(ac.CommTimeoutError) as info:
            await c0.send(np.ones(4, np.uint8), 1, 2, stream=s, timeout=0.02)
        assert "never posted" in str(info.value) and "behind 1 earlier op" in str(info.value)
        await c1.recv(np.empty(BIG, np.uint8), 0, 1)
        await first
        assert c1.iprobe(0, 2) is None  # the timed-out send was never posted
