"""Timed-out pushes are retried with exponential back-off, then given up with a clear error.

The servers here decide when to listen from what the worker has seen (its retry callback),
never from the clock, so the outcome does not depend on timing.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from ps.retry import PushFailedError, RetryPolicy, push

import asynccomm as ac

LOOPS = ["uvloop", "asyncio"]
TAG = 1001
GRADIENT = np.arange(100_000, dtype=np.float32)  # 400 KB: above the eager limit


def test_backoff_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(base=0.01, factor=2, cap=0.05)
    assert [policy.backoff(a) for a in range(1, 6)] == [0.01, 0.02, 0.04, 0.05, 0.05]


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="bad retry policy"):
        RetryPolicy(max_attempts=0)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("in_flight", [False, True], ids=["send", "isend"])
@pytest.mark.parametrize("ignored", [1, 3])
def test_a_push_the_server_ignores_is_retried_until_it_listens(loop: str, in_flight: bool,
                                                              ignored: int) -> None:
    seen: list[int] = []

    async def program(comm: ac.Communicator) -> object:
        if comm.rank == 1:
            return await worker(comm)
        await listening.wait()  # the first `ignored` pushes find no recv posted
        got = np.zeros_like(GRADIENT)
        status = await comm.recv(got, 1, TAG)
        duplicate = comm.iprobe(1, TAG)  # a withdrawn attempt must leave nothing behind
        return int(status.count), bool(np.array_equal(got, GRADIENT)), duplicate

    async def worker(comm: ac.Communicator) -> int:
        def on_retry(attempt: int, exc: ac.CommTimeoutError) -> None:
            assert exc.peer == 0 and exc.tag == TAG
            seen.append(attempt)
            if len(seen) == ignored:
                listening.set()

        policy = RetryPolicy(timeout=0.02, base=0.005, cap=0.02, max_attempts=5,
                             on_retry=on_retry)
        first = comm.isend(GRADIENT, 0, TAG, timeout=policy.timeout) if in_flight else None
        return await push(comm, GRADIENT, 0, TAG, policy, first=first)

    listening = asyncio.Event()
    server, attempts = ac.run(program, world_size=2, loop=loop)
    assert attempts == ignored + 1
    assert seen == list(range(1, ignored + 1))
    assert server == (GRADIENT.size, True, None)  # delivered once, intact


@pytest.mark.parametrize("loop", LOOPS)
def test_a_worker_gives_up_on_a_server_that_never_answers(loop: str) -> None:
    retries: list[int] = []
    policy = RetryPolicy(timeout=0.01, base=0.002, cap=0.004, max_attempts=3,
                         on_retry=lambda attempt, exc: retries.append(attempt))

    async def program(comm: ac.Communicator) -> None:
        if comm.rank == 1:
            await push(comm, GRADIENT, 0, TAG, policy)
        else:
            await comm.probe(1, TAG + 1)  # never sent: the server stays up, deaf to TAG

    with pytest.raises(PushFailedError) as info:
        ac.run(program, world_size=2, loop=loop)
    err = info.value
    assert (err.rank, err.server, err.tag, err.attempts) == (1, 0, TAG, 3)
    assert "server rank 0" in str(err) and "after 3 attempts" in str(err)
    assert isinstance(err.__cause__, ac.CommTimeoutError)
    assert isinstance(err, TimeoutError)
    assert retries == [1, 2]
