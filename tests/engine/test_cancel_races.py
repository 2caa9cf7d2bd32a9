"""A cancellation that arrives as an op completes: the op's outcome wins, nothing is lost
or duplicated, and the cancellation reaches the task at its next await.  Every case runs
in every in-process environment (both real loops, the virtual clock, the cluster model)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import asynccomm as ac
from asynccomm._engine.fast import TIMED_COPY_MIN
from asynccomm.testing import posted

from ..transports.environments import ENVIRONMENTS, run_world

ENVS = list(ENVIRONMENTS)
BIG = ac.EAGER_LIMIT + 1
TIMED = TIMED_COPY_MIN  # (staged when no recv waits, and copied timed)


class _CancelOnCompletion:
    """A request waiter that cancels ``task`` the moment the request completes, after the
    task was woken with the result and before it runs: the race of a timeout or a cancel
    arriving just as an op finishes, made exact."""

    def __init__(self, task: asyncio.Task[object]) -> None:
        self.task = task

    def done(self) -> bool:
        return False

    def set_result(self, _: None) -> None:
        self.task.cancel()


async def _wait(req: ac.Request) -> object:
    return await req


@pytest.mark.parametrize("nbytes", [8, TIMED, BIG, 1 << 20])
@pytest.mark.parametrize("env", ENVS)
def test_a_cancellation_at_the_moment_a_recv_completes_loses_nothing(env: str,
                                                                     nbytes: int) -> None:
    async def body(world: ac.World) -> None:
        c0, c1 = world.comms
        buf = np.zeros(nbytes, np.uint8)
        req = c1.irecv(buf, 0, tag=7)
        task = await posted(_wait(req))  # what comm.recv does: post, then await
        req._add_waiter(_CancelOnCompletion(task))  # type: ignore[arg-type]
        send = c0.isend(np.full(nbytes, 9, np.uint8), 1, tag=7)
        status = await task  # completed: returned, never reported cancelled
        assert status == ac.Status(0, 7, nbytes, nbytes) and buf[0] == 9 and buf[-1] == 9
        await send
        assert c1.iprobe(0, 7) is None  # taken once, and not left behind as well

    run_world(env, 2, body)


@pytest.mark.parametrize("nbytes", [8, TIMED, BIG, 1 << 20])
@pytest.mark.parametrize("env", ENVS)
def test_a_cancellation_at_the_moment_a_send_completes_loses_nothing(env: str,
                                                                     nbytes: int) -> None:
    async def body(world: ac.World) -> None:
        c0, c1 = world.comms
        out = np.zeros(nbytes, np.uint8)
        recv = c1.irecv(out, 0, 8)
        send = c0.isend(np.full(nbytes, 4, np.uint8), 1, 8)
        if send.done():  # matched and copied as it was posted: nothing left to race
            return
        task = await posted(_wait(send))
        send._add_waiter(_CancelOnCompletion(task))  # type: ignore[arg-type]
        assert await task is None
        assert (await recv).nbytes == nbytes and out[-1] == 4
        assert c1.iprobe(0, 8) is None

    run_world(env, 2, body)


@pytest.mark.parametrize("nbytes", [1 << 20, (4 << 20) + 8])
@pytest.mark.parametrize("env", ENVS)
def test_a_send_cancelled_after_its_recv_matched_reports_success(env: str, nbytes: int) -> None:
    async def body(world: ac.World) -> None:
        c0, c1 = world.comms
        task = await posted(c0.send(np.full(nbytes, 3, np.uint8), 1, 1))
        await c1.probe(0, 1)  # announced (on a cluster, after its modelled latency)
        out = np.zeros(nbytes, np.uint8)
        recv = c1.irecv(out, 0, 1)  # matches the waiting send
        task.cancel()
        assert await task is None and not task.cancelled()  # sent: never reported cancelled
        await recv
        assert out[0] == 3 and out[-1] == 3
        assert c1.iprobe(0, 1) is None  # and not a second time

    run_world(env, 2, body)


@pytest.mark.parametrize("env", ENVS)
def test_the_cancellation_is_delivered_at_the_next_await(env: str) -> None:
    async def body(world: ac.World) -> list[str]:
        c0, c1 = world.comms
        steps: list[str] = []
        req = c1.irecv(np.zeros(1), 0, 2)

        async def receiver() -> None:
            await req
            steps.append("received")
            await asyncio.sleep(3600)
            steps.append("slept")

        task = await posted(receiver())
        req._add_waiter(_CancelOnCompletion(task))  # type: ignore[arg-type]
        c0.isend(np.ones(1), 1, 2)
        with pytest.raises(asyncio.CancelledError):
            await task
        return steps

    assert run_world(env, 2, body) == ["received"]


class _ExpireOnCompletion:
    """A request waiter that makes an ``asyncio.timeout`` expire the moment the request
    completes (what its timer does when it fires then)."""

    def __init__(self, timeout: asyncio.Timeout) -> None:
        self.timeout = timeout

    def done(self) -> bool:
        return False

    def set_result(self, _: None) -> None:
        self.timeout._on_timeout()  # type: ignore[attr-defined]


@pytest.mark.parametrize("more_awaits", [False, True])
@pytest.mark.parametrize("env", ENVS)
def test_asyncio_timeout_that_expires_as_the_op_completes(env: str, more_awaits: bool) -> None:
    """The op's result wins; a timeout whose block ends there raises nothing, and one whose
    block goes on raises TimeoutError at the block's next await, as asyncio.timeout
    does."""
    async def body(world: ac.World) -> None:
        c0, c1 = world.comms
        req = c1.irecv(np.zeros(1), 0, 3)
        got: list[ac.Status] = []

        async def receiver() -> str:
            try:
                async with asyncio.timeout(None) as timeout:
                    req._add_waiter(_ExpireOnCompletion(timeout))  # type: ignore[arg-type]
                    got.append(await req)
                    if more_awaits:
                        await asyncio.sleep(3600)
            except TimeoutError:
                return "timed out"
            await asyncio.sleep(0)  # no stray cancellation after the block
            return "done"

        task = await posted(receiver())
        c0.isend(np.ones(1), 1, 3)
        assert await task == ("timed out" if more_awaits else "done")
        assert got[0].tag == 3

    run_world(env, 2, body)


@pytest.mark.parametrize("env", ENVS)
def test_a_cancelled_batch_whose_ops_all_finished_returns_their_results(env: str) -> None:
    async def body(world: ac.World) -> None:
        c0, c1 = world.comms
        out = np.zeros(BIG, np.uint8)
        task = await posted(c0.sendrecv(np.ones(8, np.uint8), 1, out, 1, sendtag=4,
                                        recvtag=4))
        await c1.sendrecv(np.full(BIG, 6, np.uint8), 0, np.zeros(8, np.uint8), 0, sendtag=4,
                          recvtag=4)
        task.cancel()
        status = await task
        assert status.nbytes == BIG and out[0] == 6

    run_world(env, 2, body)


@pytest.mark.parametrize("env", ENVS)
def test_a_cancelled_batch_names_the_ops_that_finished_all_the_same(env: str) -> None:
    async def body(world: ac.World) -> None:
        c0, c1 = world.comms
        task = await posted(c0.batch([ac.SendOp(np.ones(8, np.uint8), 1, 5),
                                      ac.RecvOp(np.zeros(8, np.uint8), 1, 6)]))
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as info:
            await task
        assert "ops 0 (send, done) had matched and finished" in "".join(
            getattr(info.value, "__notes__", []))
        out = np.zeros(8, np.uint8)
        await c1.recv(out, 0, 5)  # the send that finished did arrive
        assert out[0] == 1
        assert c0.statistics().pending_ops == 0

    run_world(env, 2, body)


async def test_req_cancel_from_another_thread_is_refused() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        req = c1.irecv(np.zeros(1), 0)
        errors: list[BaseException] = []

        def cancel() -> None:
            try:
                req.cancel()
            except RuntimeError as exc:
                errors.append(exc)

        thread = threading.Thread(target=cancel)
        thread.start()
        await asyncio.to_thread(thread.join)
        assert len(errors) == 1 and "outside its event loop" in str(errors[0])
        assert not req.done()  # nothing changed
        await c0.send(np.ones(1), 1)
        await req


async def test_a_second_timeout_names_the_op_that_timed_out_before_it() -> None:
    async def main(comm: ac.Communicator) -> str:
        peer = 1 - comm.rank
        message = ""
        try:
            await comm.recv(np.zeros(1), peer, tag=comm.rank, timeout=0.02 * (1 + comm.rank))
        except ac.CommTimeoutError as exc:
            message = str(exc)
        await comm.sendrecv(np.zeros(1), peer, np.zeros(1), peer, sendtag=9, recvtag=9)
        return message

    async with ac.open_world(2) as world:
        first, second = await asyncio.gather(*(main(c) for c in world.comms))
    assert "rank 1 had posted recv(src=0, tag=1)" in first
    assert "recv(src=1, tag=0), which timed out" in second
    assert "had posted nothing" not in second
