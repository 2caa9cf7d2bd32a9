"""The fault-tolerance contract (``_comm.faults``): revoke, failed/ack_failed, agree and
shrink, and collectives that lose a member, in every in-process environment."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm.testing import posted

from .common import ENVS, Died, outcome, run_ranks, virtual

pytestmark = pytest.mark.parametrize("env", ENVS)


def test_a_failure_alone_reads_as_before(env: str) -> None:
    async def program(comm: ac.Communicator) -> Any:
        if comm.rank == 1:
            raise Died
        if comm.rank == 0:
            err = await outcome(comm.recv(np.zeros(1), 1))
            return err, comm.failed(), comm.acked_failed()
        return None

    (err, failed, acked), died = run_ranks(env, 2, program)
    assert isinstance(died, Died)
    assert type(err) is ac.CommBrokenError and err.peer == 1 and err.rank == 0
    assert failed == (1,) and acked == ()


def test_revoke_fails_pending_and_later_ops_on_every_rank(env: str) -> None:
    waiting = 0
    all_waiting = asyncio.Event()

    async def program(comm: ac.Communicator) -> Any:
        nonlocal waiting
        if comm.rank == 2:
            await comm.send(np.ones(1), 1, tag=5)  # here before the revoke, never taken
        if comm.rank == 0:
            await all_waiting.wait()
            comm.revoke()
            comm.revoke()  # twice: nothing more
            pending: list[Any] = []
        elif comm.rank == 1:
            pending = [await posted(comm.recv(np.zeros(1), 0)),
                       await posted(comm.probe(ac.ANY_SOURCE, 9)),
                       await posted(comm.barrier())]
        else:
            pending = [await posted(comm.barrier()), await posted(comm.recv_obj(0))]
        if comm.rank:
            waiting += 1
            if waiting == 2:
                all_waiting.set()
        errors = [await outcome(t) for t in pending]
        later = [await outcome(comm.send(np.ones(1), (comm.rank + 1) % 3)),
                 await outcome(comm.recv(np.zeros(1), 2, tag=5)),
                 await outcome(comm.isend(np.ones(1 << 18), (comm.rank + 1) % 3)),
                 await outcome(comm.allreduce(np.ones(3))),
                 await outcome(comm.send_obj({"a": 1}, (comm.rank + 1) % 3)),
                 await outcome(comm.dup()),
                 await outcome(comm.split(0))]
        try:
            comm.iprobe()
        except ac.CommRevokedError as exc:
            later.append(exc)
        comm.revoke()  # revoked already: nothing
        return errors + later

    for rank, errors in enumerate(run_ranks(env, 3, program)):
        assert errors, rank
        for exc in errors:
            assert type(exc) is ac.CommRevokedError, (rank, exc)
            assert exc.revoked_by == 0 and exc.rank == rank
            assert "revoked by rank 0" in str(exc)


def test_revoke_lets_a_matched_transfer_finish_and_loses_nothing(env: str) -> None:
    big = np.arange(1 << 20, dtype=np.float64)  # 8 MiB: rendezvous, model time to move

    async def program(comm: ac.Communicator) -> Any:
        if comm.rank == 0:
            early = np.arange(4.0)
            await comm.send(early, 1, tag=1)  # completed before: never reported failed
            send = comm.isend(big, 1, tag=2)
            unmatched = comm.isend(big, 1, tag=3)  # no recv ever takes it
            await comm.barrier()
            await comm.compute(seconds=1e-4)  # the transfer is under way (modelled)
            comm.revoke()
            return [await outcome(send), await outcome(unmatched)]
        buf, first = np.zeros(1 << 20), np.zeros(4)
        await comm.recv(first, 0, tag=1)
        recv = comm.irecv(buf, 0, tag=2)
        await comm.barrier()
        status = await outcome(recv)
        held = await outcome(comm.recv(np.zeros(1), 0, tag=9))  # open until the revoke
        assert type(held) is ac.CommRevokedError
        return [status, first, buf]

    (sent, unmatched), (status, first, buf) = run_ranks(env, 2, program)
    if virtual(env) and env != "virtual":  # matched when the revoke came: both finish
        assert sent is None and isinstance(status, ac.Status)
    # Either the transfer finished on both sides, or it failed on both: never half.
    assert (sent is None) == isinstance(status, ac.Status)
    if sent is None:
        assert np.array_equal(buf, big)
    else:
        assert type(sent) is ac.CommRevokedError and type(status) is ac.CommRevokedError
    assert type(unmatched) is ac.CommRevokedError
    assert np.array_equal(first, np.arange(4.0))


def test_agree_is_the_and_of_the_survivors_flags(env: str) -> None:
    flags = {0: 0b0111, 1: 0b1101, 3: 0b0110, 4: -1}

    async def program(comm: ac.Communicator) -> Any:
        if comm.rank == 2:
            raise Died
        first = await comm.agree(flags[comm.rank])
        acked = comm.acked_failed()
        failed = comm.failed()
        second = await comm.agree(1)
        return first, acked, second, failed

    results = run_ranks(env, 5, program)
    assert isinstance(results[2], Died)
    for rank in (0, 1, 3, 4):
        assert results[rank] == (0b0100, (2,), 1, (2,)), rank


def test_agree_decides_without_a_rank_that_fails_during_the_call(env: str) -> None:
    in_call = asyncio.Event()
    count = 0

    async def program(comm: ac.Communicator) -> Any:
        nonlocal count
        if comm.rank == 1:
            await in_call.wait()  # the others wait in the call: its failure decides it
            raise Died
        task = await posted(comm.agree(0b11 if comm.rank == 0 else 0b10))
        count += 1
        if count == 2:
            in_call.set()
        return await task, comm.acked_failed()

    zero, died, two = run_ranks(env, 3, program)
    assert isinstance(died, Died)
    assert zero == two == (0b10, (1,))


def test_agree_and_shrink_work_on_a_revoked_communicator(env: str) -> None:
    async def tolerant(comm: ac.Communicator) -> Any:
        if comm.rank == 1:
            comm.revoke()
        err = await outcome(comm.barrier())
        value = await comm.agree(comm.rank + 1)
        new = await comm.shrink()
        buf = np.array([comm.rank], np.int64)
        await new.allreduce(buf)
        return type(err), value, new.size, int(buf[0])

    for rank, got in enumerate(run_ranks(env, 3, tolerant)):
        assert got == (ac.CommRevokedError, 1 & 2 & 3, 3, 3), rank


def test_shrink_gives_one_membership_in_the_old_order(env: str) -> None:
    async def program(comm: ac.Communicator) -> Any:
        if comm.rank in (1, 3):
            if comm.rank == 3:
                return "returned early"  # a main that returns early has failed too
            raise Died
        new = await comm.shrink()
        failed = new.failed()
        parents = [new.parent_rank(r) for r in range(new.size)]
        buf = np.array([10.0 * comm.rank + 1])
        await new.allreduce(buf)
        out = np.zeros(1)
        status = await new.sendrecv(np.array([float(comm.rank)]), (new.rank + 1) % new.size,
                                    out, (new.rank - 1) % new.size)
        again = await new.shrink()  # nobody failed there: the same group
        return (new.rank, new.size, parents, float(buf[0]), float(out[0]), status.source,
                again.size, comm.acked_failed(), failed)

    results = run_ranks(env, 5, program)
    assert isinstance(results[1], Died) and results[3] == "returned early"
    survivors = [0, 2, 4]
    for new_rank, old in enumerate(survivors):
        rank, size, parents, total, got, source, again, acked, failed = results[old]
        assert (rank, size, parents) == (new_rank, 3, survivors)
        assert total == sum(10.0 * r + 1 for r in survivors)
        assert got == float(survivors[new_rank - 1]) and source == (new_rank - 1) % 3
        assert again == 3 and acked == (1, 3) and failed == ()


def test_a_world_has_no_parent_rank(env: str) -> None:
    async def program(comm: ac.Communicator) -> Any:
        with pytest.raises(ValueError, match="not made from"):
            comm.parent_rank(0)
        with pytest.raises(ValueError, match="out of range"):
            comm.parent_rank(5)
        sub = await comm.split(0, key=-comm.rank)
        assert sub is not None
        return [sub.parent_rank(r) for r in range(sub.size)]

    assert run_ranks(env, 2, program) == [[1, 0], [1, 0]]


def test_bad_flags_are_refused_before_anything_is_taken(env: str) -> None:
    agreeing = asyncio.Event()

    async def program(comm: ac.Communicator) -> Any:
        for bad, error in (("1", TypeError), (True, TypeError), (1.5, TypeError),
                           (2**64, ValueError)):
            with pytest.raises(error):
                await comm.agree(bad)  # type: ignore[arg-type]
        if comm.rank == 0:
            task = await posted(comm.agree(np.int64(5)))
            agreeing.set()
            return await task
        await agreeing.wait()  # a shrink where rank 0 calls agree: refused, nothing taken
        with pytest.raises(ValueError, match="same order"):
            await comm.shrink()
        return await comm.agree(7)

    assert run_ranks(env, 2, program) == [5, 5]


def test_wildcard_recvs_fail_on_failures_not_acknowledged(env: str) -> None:
    sent = asyncio.Event()

    async def program(comm: ac.Communicator) -> Any:
        if comm.rank == 2:
            raise Died
        if comm.rank == 1:
            await sent.wait()
            await comm.send(np.array([7.0]), 0)
            return None
        assert comm.ack_failed() == ()  # from now on, wildcards follow ULFM
        buf = np.zeros(1)
        task = await posted(comm.recv(buf, ac.ANY_SOURCE))
        err = await outcome(task)
        again = await outcome(comm.recv(buf, ac.ANY_SOURCE))  # still not acknowledged
        acked = comm.ack_failed()
        sent.set()
        status = await comm.recv(buf, ac.ANY_SOURCE)
        return err, again, acked, status.source, float(buf[0])

    (err, again, acked, source, value), _, died = run_ranks(env, 3, program)
    assert isinstance(died, Died)
    for exc in (err, again):
        assert type(exc) is ac.CommBrokenError and exc.peer == 2
    assert acked == (2,) and source == 1 and value == 7.0


def test_wildcard_recvs_wait_on_without_acknowledgement(env: str) -> None:
    async def program(comm: ac.Communicator) -> Any:
        if comm.rank == 2:
            raise Died
        if comm.rank == 1:
            assert type(await outcome(comm.recv(np.zeros(1), 2))) is ac.CommBrokenError
            await comm.send(np.array([7.0]), 0)
            return None
        status = await comm.recv(np.zeros(1), ac.ANY_SOURCE)
        return status.source

    assert run_ranks(env, 3, program)[0] == 1


COLLECTIVES = {
    "barrier": lambda c: c.barrier(),
    "bcast": lambda c: c.bcast(np.ones(4), root=0),
    "allreduce": lambda c: c.allreduce(np.ones(1000)),
    "allreduce_ring": lambda c: c.allreduce(np.ones(1000), algorithm="ring"),
    "reduce": lambda c: c.reduce(np.ones(4), np.zeros(4), root=3),
    "allgather": lambda c: c.allgather(np.ones(4), np.zeros((c.size, 4))),
    "gather": lambda c: c.gather(np.ones(4), np.zeros((c.size, 4)), root=0),
    "scatter": lambda c: c.scatter(np.ones((c.size, 4)), np.zeros(4), root=0),
    "reduce_scatter": lambda c: c.reduce_scatter(np.ones((c.size, 4)), np.zeros(4)),
    "alltoall": lambda c: c.alltoall(np.ones((c.size, 4)), np.zeros((c.size, 4))),
}


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
@pytest.mark.parametrize("victim", [0, 2])
def test_a_collective_that_loses_a_member_does_not_hang(env: str, name: str,
                                                        victim: int) -> None:
    """Every survivor gets a result or ``CommBrokenError`` naming the failed rank, at once
    (bounded: the model's time too), and the next collective fails the same way."""
    run = COLLECTIVES[name]

    async def program(comm: ac.Communicator) -> Any:
        if comm.rank == victim:
            await comm.barrier()
            return "left"  # returns before the collective: failed, for the others
        await comm.barrier()
        first = await outcome(run(comm))
        second = await outcome(comm.barrier())
        return first, second

    results = run_ranks(env, 5, program)
    for rank, got in enumerate(results):
        if rank == victim:
            continue
        for exc in got:
            assert exc is None or (type(exc) is ac.CommBrokenError and exc.peer == victim), (
                rank, exc)
        assert got[1] is not None  # the barrier needs the failed rank


def test_a_rank_that_leaves_shrink_has_its_end_closed(env: str) -> None:
    """A survivor cancelled in ``shrink`` still has a place in the new communicator (the
    others could not tell): its end closes at once, so the others see it failed there."""
    in_call = asyncio.Event()

    async def program(comm: ac.Communicator) -> Any:
        if comm.rank == 1:
            task = await posted(comm.shrink())
            in_call.set()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return await outcome(comm.recv(np.zeros(1), 0, tag=3))  # open until told
        await in_call.wait()
        new = await comm.shrink()
        err = await outcome(new.barrier())
        if comm.rank == 0:
            await comm.send(np.zeros(1), 1, tag=3)
        return new.size, type(err), 1 in new.failed()

    zero, one, two = run_ranks(env, 3, program)
    assert isinstance(one, ac.Status)
    assert zero == two == (3, ac.CommBrokenError, True)
