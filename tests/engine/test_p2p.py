"""Point-to-point semantics on the in-process transport, on both loops."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
import uvloop

import asynccomm as ac
from asynccomm._core.states import Kind
from asynccomm._core.wire import MESSAGE_OVERHEAD
from asynccomm._engine import engine as engine_module
from asynccomm._engine.fast import LOOP_COPY_MAX, THREAD_COPY_MIN
from asynccomm.testing import posted

EAGER = ac.EAGER_LIMIT


def arange(n: int, dtype: str = "<f4", start: int = 0) -> np.ndarray:
    return (np.arange(n) + start).astype(dtype)


@pytest.mark.parametrize("nbytes", [0, 8, EAGER, EAGER + 1, (1 << 20) + 3, (4 << 20) + 8])
@pytest.mark.parametrize("dtype", ["|u1", "<i8", "<f8"])
@pytest.mark.parametrize("recv_first", [True, False])
async def test_data_arrives_intact(nbytes: int, dtype: str, recv_first: bool) -> None:
    itemsize = np.dtype(dtype).itemsize
    n = nbytes // itemsize
    src = arange(n, dtype, start=3)
    out = np.full(n, 77, dtype=dtype)
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        if recv_first:
            rreq = c1.irecv(out, 0, 5)
            await c0.send(src, 1, 5)
        else:
            sreq = c0.isend(src, 1, 5)
            rreq = c1.irecv(out, 0, 5)
            await sreq
        status = await rreq
    assert status == ac.Status(source=0, tag=5, nbytes=n * itemsize, count=n)
    np.testing.assert_array_equal(out, src)


async def test_eager_send_completes_before_any_recv_and_is_staged() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        req = c0.isend(arange(16), 1, 1)
        assert req.done()  # eager: complete at once, buffer reusable
        stats = c1.statistics()
        assert stats.matcher.unexpected_messages == 1
        assert stats.pool.in_use_bytes >= 64
        out = np.empty(16, dtype="<f4")
        await c1.recv(out, 0, 1)
        np.testing.assert_array_equal(out, arange(16))
        assert c1.statistics().pool.in_use_bytes == 0


async def test_eager_limit_is_inclusive_and_larger_messages_wait_for_their_recv() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        at_limit = c0.isend(np.zeros(EAGER, dtype=np.uint8), 1, 1)
        above = c0.isend(np.zeros(EAGER + 1, dtype=np.uint8), 1, 2)
        assert at_limit.done()
        assert not above.done()  # rendezvous: waits for its recv, nothing staged
        assert c1.statistics().pool.in_use_bytes == (1 << 16) + MESSAGE_OVERHEAD
        await c1.recv(np.empty(EAGER + 1, dtype=np.uint8), 0, 2)
        await above
        await c1.recv(np.empty(EAGER, dtype=np.uint8), 0, 1)


async def test_full_pool_falls_back_to_rendezvous() -> None:
    async with ac.open_world(2, pool_bytes=2 * (512 + MESSAGE_OVERHEAD)) as world:
        c0, c1 = world.comms
        reqs = [c0.isend(np.full(64, i, dtype=np.int64), 1, 0) for i in range(4)]
        assert [r.done() for r in reqs] == [True, True, False, False]
        assert c1.statistics().pool.refused == 2
        out = np.empty(64, dtype=np.int64)
        for i in range(4):  # order is kept across staged and waiting messages
            await c1.recv(out, 0, 0)
            assert out[0] == i
        await ac.wait_all(reqs)


async def test_a_flood_of_empty_messages_is_bounded_by_the_pool() -> None:
    cap = 1 << 20
    async with ac.open_world(2, pool_bytes=cap) as world:
        c0, c1 = world.comms
        reqs = [c0.isend(b"", 1, 0) for _ in range(3000)]
        staged = sum(r.done() for r in reqs)
        assert staged == cap // MESSAGE_OVERHEAD  # each counts its bookkeeping
        assert c1.statistics().pool.in_use_bytes <= cap
        for _ in reqs:  # the rest wait for their recvs, in order
            await c1.recv(bytearray(0), 0, 0)
        await ac.wait_all(reqs)
        assert c1.statistics().pool.in_use_bytes == 0


async def test_non_overtaking_order_per_source_and_tag() -> None:
    async with ac.open_world(3) as world:
        c0, c1, c2 = world.comms
        for i in range(5):
            c0.isend(np.array([i], dtype=np.int64), 2, tag=i % 2)
            c1.isend(np.array([100 + i], dtype=np.int64), 2, tag=0)
        out = np.empty(1, dtype=np.int64)
        seen = []
        for _ in range(3):
            await c2.recv(out, 0, 0)
            seen.append(int(out[0]))
        assert seen == [0, 2, 4]
        for _ in range(2):
            await c2.recv(out, 0, 1)
            seen.append(int(out[0]))
        assert seen[3:] == [1, 3]
        from1 = []
        for _ in range(5):
            await c2.recv(out, 1, 0)
            from1.append(int(out[0]))
        assert from1 == [100, 101, 102, 103, 104]


async def test_wildcard_recv_takes_the_earliest_arrived_message() -> None:
    async with ac.open_world(3) as world:
        c0, c1, c2 = world.comms
        await c1.send(np.array([1.0]), 2, tag=9)
        await c0.send(np.array([2.0]), 2, tag=4)
        out = np.empty(1)
        first = await c2.recv(out, ac.ANY_SOURCE, ac.ANY_TAG)
        assert (first.source, first.tag, out[0]) == (1, 9, 1.0)
        second = await c2.recv(out)
        assert (second.source, second.tag, out[0]) == (0, 4, 2.0)


async def test_message_takes_the_earliest_posted_recv_that_fits() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        a, b, c = (np.zeros(1) for _ in range(3))
        r_any = c1.irecv(a, ac.ANY_SOURCE, ac.ANY_TAG)
        r_exact = c1.irecv(b, 0, 3)
        r_tag = c1.irecv(c, ac.ANY_SOURCE, 3)
        await c0.send(np.array([5.0]), 1, 3)
        assert r_any.done() and not r_exact.done() and not r_tag.done()
        await c0.send(np.array([6.0]), 1, 3)
        await c0.send(np.array([7.0]), 1, 3)
        await ac.wait_all([r_any, r_exact, r_tag])
        assert (a[0], b[0], c[0]) == (5.0, 6.0, 7.0)


async def test_shorter_message_fills_the_front_of_the_buffer() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        out = np.full(10, -1, dtype=np.int32)
        req = c1.irecv(out, 0)
        await c0.send(np.arange(4, dtype=np.int32), 1)
        status = await req
        assert (status.count, status.nbytes) == (4, 16)
        np.testing.assert_array_equal(out, [0, 1, 2, 3, -1, -1, -1, -1, -1, -1])


@pytest.mark.parametrize("size", [3, EAGER * 2])
@pytest.mark.parametrize("recv_first", [True, False])
async def test_truncation_leaves_buffer_untouched_and_keeps_the_message(
        size: int, recv_first: bool) -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        small = np.full(2, 9, dtype=np.int16)
        payload = np.arange(size, dtype=np.int16)
        if recv_first:
            bad = c1.irecv(small, 0, 1)
            send = c0.isend(payload, 1, 1)
            with pytest.raises(ac.TruncationError) as info:
                await bad
        else:
            send = c0.isend(payload, 1, 1)
            with pytest.raises(ac.TruncationError) as info:
                await c1.recv(small, 0, 1)
        assert (info.value.nbytes, info.value.capacity) == (size * 2, 4)
        np.testing.assert_array_equal(small, [9, 9])
        assert not send.exception()
        arr, status = await c1.recv_new(0, 1)
        await send
        np.testing.assert_array_equal(arr, payload)
        assert status.count == size


async def test_dtype_mismatch_keeps_the_message_for_the_right_recv() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        await c0.send(np.array([1.5, 2.5], dtype=np.float64), 1, 2)
        wrong = np.full(2, 7, dtype=np.int64)
        with pytest.raises(ac.DTypeMismatchError) as info:
            await c1.recv(wrong, 0, 2)
        assert (info.value.send_dtype, info.value.recv_dtype) == ("<f8", "<i8")
        np.testing.assert_array_equal(wrong, [7, 7])
        right = np.empty(2)
        await c1.recv(right, 0, 2)
        np.testing.assert_array_equal(right, [1.5, 2.5])


async def test_bytes_like_buffers_carry_uint8_and_hccl_count_form() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        await c0.send(b"hello", 1)
        await c0.send(np.arange(10, dtype=np.float32), 1, count=3, dtype=ac.float32)
        got = bytearray(8)
        status = await c1.recv(got, 0)
        assert bytes(got[: status.nbytes]) == b"hello"
        arr, status = await c1.recv_new(0)
        assert arr.dtype == np.float32 and status.count == 3
        np.testing.assert_array_equal(arr, [0, 1, 2])


async def test_multidimensional_arrays_travel_flat() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        src = np.arange(12, dtype=np.float64).reshape(3, 4)
        out = np.zeros((2, 6))
        req = c1.irecv(out, 0)
        await c0.send(src, 1)
        assert (await req).count == 12
        np.testing.assert_array_equal(out.ravel(), src.ravel())


async def test_probe_and_iprobe_do_not_consume() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        assert c1.iprobe(0, 4) is None
        waiting = await posted(c1.probe(0, ac.ANY_TAG))
        assert not waiting.done()
        await c0.send(np.arange(6, dtype=np.int32), 1, tag=4)
        status = await waiting
        assert status == ac.Status(source=0, tag=4, nbytes=24, count=6)
        assert c1.iprobe(ac.ANY_SOURCE, 4) == status
        assert c1.iprobe(0, 5) is None
        arr, got = await c1.recv_new(0, 4)
        assert got == status and arr.tolist() == list(range(6))
        assert c1.iprobe() is None


async def test_probe_does_not_see_a_message_a_posted_recv_took() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        out = np.zeros(1)
        recv = c1.irecv(out, 0, 1)
        probe = await posted(c1.probe(0, 1, timeout=0.05))
        await c0.send(np.ones(1), 1, 1)
        assert recv.done() and out[0] == 1.0
        with pytest.raises(ac.CommTimeoutError):
            await probe


async def test_wait_any_returns_the_first_done_request() -> None:
    async with ac.open_world(3) as world:
        c0, c1, c2 = world.comms
        bufs = [np.zeros(1) for _ in range(2)]
        reqs = [c0.irecv(bufs[0], 1), c0.irecv(bufs[1], 2)]
        await c2.send(np.array([2.0]), 0)
        index, status = await ac.wait_any(reqs)
        assert index == 1 and status.source == 2 and bufs[1][0] == 2.0
        assert not reqs[0].done()
        await c1.send(np.array([1.0]), 0)
        results = await ac.wait_all(reqs)
        assert [s.source for s in results] == [1, 2]
        assert reqs[0].status == results[0]


async def test_batch_and_sendrecv_exchange_large_messages_without_deadlock() -> None:
    n = EAGER  # float32: 4x the eager limit, rendezvous both ways
    async with ac.open_world(2) as world:

        async def rank(comm: ac.Communicator) -> np.ndarray:
            other = 1 - comm.rank
            out = np.empty(n, dtype=np.float32)
            results = await comm.batch([ac.SendOp(np.full(n, comm.rank, np.float32), other, 3),
                                        ac.RecvOp(out, other, 3)])
            assert results[0] is None and results[1].source == other
            back = np.empty(n, dtype=np.float32)
            status = await comm.sendrecv(out, other, back, other, sendtag=4, recvtag=4)
            assert status.nbytes == n * 4
            return back

        backs = await asyncio.gather(*(rank(c) for c in world.comms))
    assert backs[0][0] == 0.0 and backs[1][0] == 1.0


async def test_batch_reports_the_failed_op_after_the_others_finish() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        await c1.send(np.arange(8, dtype=np.int64), 0, 1)
        too_small = np.zeros(2, dtype=np.int64)
        peer = asyncio.ensure_future(c1.recv(np.zeros(1), 0, 2))
        with pytest.raises(ac.TruncationError):
            await c0.batch([ac.SendOp(np.ones(1), 1, 2), ac.RecvOp(too_small, 1, 1)])
        assert (await peer).source == 0
        arr, _ = await c0.recv_new(1, 1)
        assert arr.size == 8


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_run_returns_results_in_rank_order(loop: str) -> None:
    async def main(comm: ac.Communicator) -> int:
        return comm.rank * 10

    assert ac.run(main, 3, loop=loop) == [0, 10, 20]


def _looker(c0: ac.Communicator, buf: np.ndarray,
            looks: list[str]) -> Callable[..., None]:
    """A ``Link.before_wait`` that notes each call in ``looks`` (the kind of op it was given,
    or "look") and has rank 0 send ``buf`` to rank 1 with tag 7 meanwhile (the message a
    waiting recv of rank 1 wants)."""
    def look(op: Any = None) -> None:
        looks.append("look" if op is None else op.kind.value)
        c0.isend(buf, 1, 7)

    return look


@pytest.mark.parametrize("native", [pytest.param(True, marks=pytest.mark.native), False])
async def test_a_recv_that_must_wait_lets_its_link_look_once_before(native: bool) -> None:
    """``Link.before_wait``: called once by a ``recv`` or ``sendrecv`` whose message has not
    come, just before it waits; a message the link delivers then ends the wait at once. A
    recv whose message was there calls nothing."""
    buf, out = arange(4), np.zeros(4, "<f4")
    async with ac.open_world(2, native=native) as world:
        c0, c1 = world.comms
        looks: list[str] = []
        c1._before_wait = _looker(c0, buf, looks)
        await c0.send(buf, 1, 6)
        await c1.recv(out, 0, 6)  # there already
        assert looks == []
        status = await c1.recv(out, 0, 7)
        assert looks == ["recv"] and status.tag == 7
        status = await c1.sendrecv(buf, 0, out, 0, sendtag=8, recvtag=7)
        assert looks == ["recv", "recv"] and status.tag == 7
        await c0.recv(out, 1, 8)
    np.testing.assert_array_equal(out, buf)


@pytest.mark.parametrize("native", [pytest.param(True, marks=pytest.mark.native), False])
@pytest.mark.parametrize("nbytes", [16, 1 << 20])
async def test_the_lane_counts_each_waiting_task_its_steps_wake(native: bool,
                                                                nbytes: int) -> None:
    """``Lane.woken`` (what the MPI link's own waits read) moves by one for a task woken
    by a message it waited for, eager or rendezvous, and not for a recv whose message was
    there already."""
    buf = np.arange(nbytes // 4, dtype="<f4")
    out = np.zeros_like(buf)
    async with ac.open_world(2, native=native) as world:
        c0, c1 = world.comms
        woken = c1._engine.lane.woken
        assert woken is world.comms[0]._engine.lane.woken
        before = woken()
        waiting = asyncio.ensure_future(c1.recv(out, 0, 5))
        await asyncio.sleep(0)  # (one turn: it posts its recv and waits)
        assert not waiting.done() and woken() == before
        await c0.send(buf, 1, 5)
        assert woken() == before + 1
        await waiting
        c0.isend(buf, 1, 6)
        await c1.recv(out, 0, 6)  # there already
        assert woken() == before + 1
    np.testing.assert_array_equal(out, buf)


@pytest.mark.parametrize("native", [pytest.param(True, marks=pytest.mark.native), False])
async def test_a_send_that_must_wait_lets_its_link_look_once_before(native: bool) -> None:
    """``Link.before_wait`` is called once, with the send, by a ``send`` not finished when
    posted (a rendezvous one whose recv is not posted), just before it waits (as it is
    by awaiting any op not done); a recv the link lets match then ends the wait at once.
    A send finished at once calls nothing."""
    big = np.arange(1 << 18, dtype="<f4")  # 1 MiB: above any eager limit
    into = np.zeros_like(big)
    async with ac.open_world(2, native=native) as world:
        c0, c1 = world.comms
        looks: list[Any] = []
        took: list[Any] = []

        def look(op: Any = None) -> None:
            looks.append(op)
            took.append(c0.irecv(into, 1, 9))  # the recv the send waits for

        c1._engine.link.before_wait = look
        await c1.send(arange(4), 0, 8)  # eager: done as posted
        assert looks == []
        await asyncio.wait_for(c1.send(big, 0, 9), 10)  # (bounded: nothing else recvs it)
        assert len(looks) == 1 and looks[0].kind is Kind.SEND and looks[0].tag == 9
        assert took[0].done()
        await c0.recv(np.zeros(4, "<f4"), 1, 8)
    np.testing.assert_array_equal(into, big)


async def _waited(how: str, reqs: list[Any]) -> Any:
    """The last op's outcome, waited for by ``how``: ``wait_all``, ``wait_any`` or ``await``."""
    if how == "wait_all":
        return (await ac.wait_all(reqs))[-1]
    if how == "wait_any":
        return (await ac.wait_any(reqs))[1]
    return await reqs[-1]


@pytest.mark.parametrize("native", [pytest.param(True, marks=pytest.mark.native), False])
@pytest.mark.parametrize("how", ["wait_all", "wait_any", "await"])
async def test_waiting_on_ops_lets_their_link_look_once_before(native: bool, how: str) -> None:
    """``wait_all`` of ops with a recv not done, ``wait_any`` of ops none of which is done,
    and awaiting one op not done call the link's ``before_wait`` once, with their (first)
    recv, before they wait (as ``recv`` does); a message the link delivers then ends the
    wait at once.  Ops done already call nothing."""
    buf, out = arange(4), np.zeros(4, "<f4")
    async with ac.open_world(2, native=native) as world:
        c0, c1 = world.comms
        looks: list[str] = []
        c1._engine.link.before_wait = _looker(c0, buf, looks)
        await c0.send(buf, 1, 6)
        done = c1.irecv(out, 0, 6)
        assert (await _waited(how, [done])).tag == 6 and looks == []
        # (an eager send, done as posted, first: the recv is the one looked for)
        ops = [c1.isend(buf, 0, 8)] if how == "wait_all" else []
        ops.append(c1.irecv(out, 0, 7))
        # (Bounded: without the look nothing would send tag 7.)
        status = await asyncio.wait_for(_waited(how, ops), 10)
        assert looks == ["recv"] and status.tag == 7
        if ops[0] is not ops[-1]:
            await c0.recv(out, 1, 8)
    np.testing.assert_array_equal(out, buf)



class HeldCopies(concurrent.futures.Executor):
    """A rank's copy worker that runs nothing until ``release``: what the loop copied
    meanwhile can be seen alone."""

    def __init__(self) -> None:
        self.held: list[tuple[concurrent.futures.Future[None], Callable[..., None],
                              tuple[Any, ...]]] = []

    def submit(self, fn: Callable[..., None], /, *args: Any,  # type: ignore[override]
               **kwargs: Any) -> concurrent.futures.Future[None]:
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.held.append((fut, fn, args))
        return fut

    async def submitted(self) -> None:
        for _ in range(100):
            if self.held:
                return
            await asyncio.sleep(0)
        raise AssertionError("no copy came to the worker")

    def release(self, jobs: int | None = None) -> list[Any]:
        """Run the held jobs (the first ``jobs`` of them) here and now; what each
        returned."""
        done = []
        run, self.held = self.held[:jobs], self.held[len(self.held[:jobs]):]
        for fut, fn, args in run:
            done.append(fn(*args))
            fut.set_result(done[-1])
        return done


@contextlib.asynccontextmanager
async def sent_into_held(src: np.ndarray, out: np.ndarray
                         ) -> AsyncIterator[tuple[HeldCopies, ac.Request, ac.Request]]:
    """Rank 1 of a world, its copy worker held, posts a recv into ``out``; rank 0 sends
    ``src`` into it."""
    worker = HeldCopies()
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        c1._engine._executor = worker
        rreq = c1.irecv(out, 0, 5)
        yield worker, rreq, c0.isend(src, 1, 5)


def random_bytes(n: int, seed: int) -> np.ndarray:
    return np.frombuffer(np.random.default_rng(seed).bytes(n), np.uint8).copy()


@pytest.mark.parametrize("nbytes", [(4 << 20) + 8, (16 << 20) + 3])
async def test_the_loop_copies_the_front_of_a_worker_copy_at_its_turn_the_worker_the_rest(
        nbytes: int) -> None:
    """A copy for the worker thread (``THREAD_COPY_MIN`` or more) is shared: the send
    returns at once, the loop copies the first half (at most ``LOOP_COPY_MAX`` bytes, whole
    pages) at its next turn, the worker the rest; the recv completes once both are in."""
    assert nbytes >= THREAD_COPY_MIN
    ours = min(nbytes // 2, LOOP_COPY_MAX) & ~4095
    src, out = random_bytes(nbytes, nbytes), np.zeros(nbytes, np.uint8)
    async with sent_into_held(src, out) as (worker, rreq, sreq):
        await worker.submitted()
        try:
            assert not out.any()  # nothing copied within the send
            for _ in range(3):
                await asyncio.sleep(0)
            np.testing.assert_array_equal(out[:ours], src[:ours])  # the loop's share: in
            assert not out[ours:].any() and not rreq.done()  # the worker's: not yet
            (_, _, args), = worker.held
            assert [len(a) for a in args] == [nbytes - ours] * 2
        finally:  # (the world closes once its copies are done)
            copied_share = worker.release()
        status = await asyncio.wait_for(rreq, 10)
        await asyncio.wait_for(sreq, 10)
    assert copied_share == [False]  # the loop had taken it
    assert status.nbytes == nbytes
    np.testing.assert_array_equal(out, src)


async def test_the_worker_copies_the_loops_share_too_if_the_loop_has_not_begun_it() -> None:
    """A loop busy with other work is not held for a copy: a worker that is done with its
    part before the loop's turn copies the loop's share as well, and the loop then copies
    nothing."""
    src, out = random_bytes(16 << 20, 2), np.zeros(16 << 20, np.uint8)
    async with sent_into_held(src, out) as (worker, rreq, _):
        assert worker.held  # submitted within the send, and the loop has not turned since
        assert worker.release() == [True]  # the whole copy, before the loop's turn
        np.testing.assert_array_equal(out, src)
        await asyncio.wait_for(rreq, 10)
    np.testing.assert_array_equal(out, src)


async def test_a_burst_of_worker_copies_holds_the_loop_for_one_share_a_turn() -> None:
    """The loop copies the shares of its ranks' worker copies one a turn, oldest first,
    whichever rank's: a burst of large messages holds it for one share at a time, and
    every copy is in once the workers are done."""
    n = 16 << 20
    ours = min(n // 2, LOOP_COPY_MAX)
    srcs = [random_bytes(n, seed) for seed in (11, 12, 13)]
    outs = [np.zeros(n, np.uint8) for _ in srcs]
    workers = [HeldCopies(), HeldCopies()]
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        c0._engine._executor, c1._engine._executor = workers
        # rank 0 -> 1, rank 1 -> 0, rank 0 -> 1: three ranks' worth of copies, two workers
        route = [(c0, c1), (c1, c0), (c0, c1)]
        recvs = [dst.irecv(out, src.rank, 5 + i) for i, ((src, dst), out)
                 in enumerate(zip(route, outs, strict=True))]
        sends = [src.isend(data, dst.rank, 5 + i) for i, ((src, dst), data)
                 in enumerate(zip(route, srcs, strict=True))]
        try:
            assert not any(out.any() for out in outs)  # nothing within the sends
            for turn in range(3):
                await asyncio.sleep(0)  # one turn of the loop
                for i, (out, src) in enumerate(zip(outs, srcs, strict=True)):
                    if i <= turn:
                        np.testing.assert_array_equal(out[:ours], src[:ours])
                    else:
                        assert not out.any(), (turn, i)
                    assert not out[ours:].any()
        finally:
            copied_shares = workers[0].release() + workers[1].release()
        for req in recvs + sends:
            await asyncio.wait_for(req, 10)
    assert copied_shares == [False] * 3  # the loop had taken them all
    for out, src in zip(outs, srcs, strict=True):
        np.testing.assert_array_equal(out, src)


async def test_the_loop_skips_a_share_its_worker_took_and_copies_the_next_in_that_turn(
        ) -> None:
    """A worker done with its part before the loop's turn copies its share itself; the
    loop then copies the next share that is still free, in the same turn."""
    n = 16 << 20
    ours = min(n // 2, LOOP_COPY_MAX)
    srcs = [random_bytes(n, seed) for seed in (21, 22)]
    outs = [np.zeros(n, np.uint8) for _ in srcs]
    worker = HeldCopies()
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        c1._engine._executor = worker
        recvs = [c1.irecv(out, 0, 5 + i) for i, out in enumerate(outs)]
        sends = [c0.isend(data, 1, 5 + i) for i, data in enumerate(srcs)]
        try:
            assert worker.release(1) == [True]  # the first copy whole, before the turn
            np.testing.assert_array_equal(outs[0], srcs[0])
            await asyncio.sleep(0)
            np.testing.assert_array_equal(outs[1][:ours], srcs[1][:ours])
            assert not outs[1][ours:].any()
        finally:
            copied_share = worker.release()
        for req in recvs + sends:
            await asyncio.wait_for(req, 10)
    assert copied_share == [False]
    for out, src in zip(outs, srcs, strict=True):
        np.testing.assert_array_equal(out, src)


async def test_a_worker_copy_between_overlapping_buffers_moves_them_as_memmove() -> None:
    """Ranks of one process may send from and receive into views of one array (an
    erroneous program, yet one copy keeps its data): a copy shared with the loop would
    overwrite bytes the worker has yet to read."""
    n, shift = 2 * THREAD_COPY_MIN, 4096
    arr = random_bytes(n + shift, 1)
    want = arr[:n].copy()
    # the send's bytes, moved up a page
    async with sent_into_held(arr[:n], arr[shift:]) as (worker, rreq, sreq):
        await worker.submitted()
        for _ in range(3):  # the loop's turns first: a share of it would overwrite the
            await asyncio.sleep(0)  # bytes the worker is to read
        worker.release()
        await asyncio.wait_for(rreq, 10)
        await asyncio.wait_for(sreq, 10)
    np.testing.assert_array_equal(arr[shift:], want)


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop],
                         ids=["asyncio", "uvloop"])
def test_the_shares_of_a_loop_do_not_keep_it_alive(
        new_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    """The loop's queue of shares (``_LoopShares``) lives as long as its loop, no longer:
    loops that ran shared copies are freed once closed (the last to run may be kept a
    while by the process's caches, so two run)."""
    n = 16 << 20
    src = random_bytes(n, 31)
    loops = []
    for _ in range(2):
        out = np.zeros(n, np.uint8)

        async def main(out: np.ndarray = out) -> None:
            async with ac.open_world(2) as world:
                c0, c1 = world.comms
                await asyncio.wait_for(asyncio.gather(c1.recv(out, 0), c0.send(src, 1)), 10)

        loop = new_loop()
        try:
            loop.run_until_complete(main())
            assert loop in engine_module._SHARES  # a shared copy ran on it
        finally:
            loop.close()
        np.testing.assert_array_equal(out, src)
        loops.append(weakref.ref(loop))
        del loop
    gc.collect()
    assert loops[0]() is None
