"""Streams: strict order on explicit streams, concurrency on the default one,
events across streams."""

from __future__ import annotations

import numpy as np
import pytest

import asynccomm as ac

BIG = ac.EAGER_LIMIT + 1  # bytes: rendezvous


async def test_explicit_stream_posts_in_order() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        s = c0.stream()
        first = c0.isend(np.zeros(BIG, np.uint8), 1, 1, stream=s)
        second = c0.isend(np.ones(4, np.uint8), 1, 2, stream=s)
        stats = s.statistics()
        assert (stats.active, stats.queued, stats.submitted) == (1, 1, 2)
        # The eager second send is not even posted: rank 1 sees nothing with tag 2.
        assert c1.iprobe(0, 2) is None and not second.done()
        await c1.recv(np.empty(BIG, np.uint8), 0, 1)
        assert first.done() and second.done()
        assert c1.iprobe(0, 2) is not None


async def test_default_stream_exchange_cannot_deadlock_but_explicit_streams_can() -> None:
    async with ac.open_world(2, timeout=0.2) as world:
        # Default stream: both ranks isend then irecv a rendezvous message: fine.
        reqs = []
        outs = []
        for c in world.comms:
            out = np.empty(BIG, np.uint8)
            outs.append(out)
            reqs += [c.isend(np.full(BIG, c.rank, np.uint8), 1 - c.rank, 0),
                     c.irecv(out, 1 - c.rank, 0)]
        await ac.wait_all(reqs)
        assert outs[0][0] == 1 and outs[1][0] == 0
        # Explicit streams are strictly in order, as in HCCL: the same program deadlocks
        # (each recv waits behind a send that waits for it) until a timeout breaks it.
        reqs = []
        for c in world.comms:
            s = c.stream()
            reqs += [c.isend(np.zeros(BIG, np.uint8), 1 - c.rank, 1, stream=s),
                     c.irecv(np.empty(BIG, np.uint8), 1 - c.rank, 1, stream=s)]
        assert c.statistics().matcher.posted_recvs == 0
        with pytest.raises(ac.CommTimeoutError) as info:
            await reqs[0]
        assert f"send(dst=0, tag=1, {BIG} B |u1) unmatched here" in str(info.value)
        # Rank 0's withdrawn send freed its stream: its recv took rank 1's send.
        await reqs[1]
        await reqs[2]


async def test_record_and_synchronize_cover_ops_submitted_before() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        s = c0.stream()
        assert s.record().done()  # nothing pending
        send = c0.isend(np.zeros(BIG, np.uint8), 1, 1, stream=s)
        event = s.record()
        later = c0.isend(np.zeros(BIG, np.uint8), 1, 2, stream=s)
        assert not event.done()
        await c1.recv(np.empty(BIG, np.uint8), 0, 1)
        assert send.done() and event.done() and not later.done()
        await event.synchronize()
        await c1.recv(np.empty(BIG, np.uint8), 0, 2)
        await s.synchronize()
        assert later.done()


async def test_stream_wait_orders_two_streams() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        a, b = c0.stream(), c0.stream()
        big = c0.isend(np.zeros(BIG, np.uint8), 1, 1, stream=a)
        b.wait(a.record())
        small = c0.isend(np.ones(1, np.uint8), 1, 2, stream=b)
        assert not small.done() and c1.iprobe(0, 2) is None
        await c1.recv(np.empty(BIG, np.uint8), 0, 1)
        assert big.done() and small.done()
        assert c1.iprobe(0, 2) is not None


async def test_default_stream_wait_holds_later_ops() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        s = c0.stream()
        c0.isend(np.zeros(BIG, np.uint8), 1, 1, stream=s)
        c0.default_stream.wait(s.record())
        held = c0.isend(np.ones(1, np.uint8), 1, 2)
        assert not held.done()
        await c1.recv(np.empty(BIG, np.uint8), 0, 1)
        await held


async def test_failed_and_cancelled_ops_release_the_stream() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        s = c1.stream()
        await c0.send(np.arange(8, dtype=np.int64), 1, 1)
        too_small = c1.irecv(np.empty(2, np.int64), 0, 1, stream=s)
        never = c1.irecv(np.empty(1), 0, 9, stream=s)
        after = c1.irecv(np.empty(8, np.int64), 0, 1, stream=s)
        with pytest.raises(ac.TruncationError):
            await too_small
        assert never.cancel()
        assert (await after).count == 8
        assert s.statistics().active == 0


async def test_batch_on_an_explicit_stream_posts_together_after_earlier_ops() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        s = c0.stream()
        first = c0.isend(np.zeros(BIG, np.uint8), 1, 1, stream=s)
        out = np.empty(BIG, np.uint8)
        peer = c1.isend(np.full(BIG, 7, np.uint8), 0, 2)
        recv_first = c1.irecv(np.empty(BIG, np.uint8), 0, 1)
        results = await c0.batch([ac.SendOp(np.ones(1), 1, 3), ac.RecvOp(out, 1, 2)], stream=s)
        assert first.done() and recv_first.done() and peer.done()
        assert results[1].nbytes == BIG and out[0] == 7
        await c1.recv(np.empty(1), 0, 3)


async def test_dropped_streams_are_released() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        for _ in range(3000):
            c0.stream()
        assert c0.statistics().streams == 1  # only the default stream is left
        busy = c0.stream()  # a dropped stream with an op pending lives until it finishes
        req = c0.isend(np.zeros(BIG, np.uint8), 1, 1, stream=busy)
        del busy
        assert c0.statistics().streams == 2
        await c1.recv(np.empty(BIG, np.uint8), 0, 1)
        await req
        del req  # a request keeps its stream
        assert c0.statistics().streams == 1


async def test_an_event_wakes_only_the_streams_that_wait_for_it() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        first, second = c0.stream(), c0.stream()
        rendezvous = c0.isend(np.zeros(BIG, np.uint8), 1, 1, stream=first)
        second.wait(first.record())
        held = c0.isend(np.ones(4, np.uint8), 1, 2, stream=second)
        assert c1.iprobe(0, 2) is None and not held.done()  # held behind the event
        await c1.recv(np.empty(BIG, np.uint8), 0, 1)
        await rendezvous
        await held  # the event fired and released it
        assert c1.iprobe(0, 2) is not None


async def test_ops_on_an_idle_stream_finish_as_they_are_posted() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        s0, s1 = c0.stream(), c1.stream()
        sent = c0.isend(np.arange(4, dtype=np.int64), 1, 3, stream=s0, timeout=5.0)
        assert sent.done() and sent.stream is s0  # eager: staged at once
        out = np.empty(4, np.int64)
        got = c1.irecv(out, 0, 3, stream=s1, timeout=5.0)  # the message was waiting
        assert got.done() and got.stream is s1 and (await got).count == 4
        assert list(out) == [0, 1, 2, 3]
        assert s0.statistics().submitted == s1.statistics().submitted == 0
        assert s0.record().done() and s1.record().done()


async def test_a_busy_stream_leaves_a_waiting_message_to_its_turn() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        s = c1.stream()
        await c0.send(np.full(4, 2, np.int64), 1, 2)  # waiting at rank 1 before its recv
        first = c1.irecv(np.empty(4, np.int64), 0, 1, stream=s)  # nothing came yet
        out = np.zeros(4, np.int64)
        second = c1.irecv(out, 0, 2, stream=s)
        assert not second.done() and not out.any()  # in order: behind the first
        assert c1.iprobe(0, 2) is not None  # still waiting, not taken
        held = c1.stream()
        held.wait(s.record())
        third = c1.irecv(np.empty(4, np.int64), 0, 2, stream=held)  # held by the event
        await c0.send(np.full(4, 2, np.int64), 1, 2)
        assert not third.done()
        await c0.send(np.full(4, 1, np.int64), 1, 1)
        await ac.wait_all([first, second, third])
        assert list(out) == [2, 2, 2, 2]
