"""Errors carry the fields that caused them and say who is to blame; raised from
real operations wherever the current version can produce them."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

import asynccomm as ac


async def _truncation(world: ac.World) -> ac.TruncationError:
    c0, c1 = world.comms
    await c0.send(np.arange(4, dtype=np.int64), 1, 5)
    small = np.zeros(2, dtype=np.int64)
    with pytest.raises(ac.TruncationError) as info:
        await c1.recv(small, 0, 5)
    await c1.recv_new(0, 5)
    return info.value


async def test_truncation_error_fields() -> None:
    async with ac.open_world(2) as world:
        exc = await _truncation(world)
    assert isinstance(exc, ac.MatchError)
    assert not isinstance(exc, ac.DTypeMismatchError)
    assert (exc.rank, exc.source, exc.tag) == (1, 0, 5)
    assert (exc.nbytes, exc.capacity) == (32, 16)
    assert (exc.send_dtype, exc.recv_dtype) == ("<i8", "<i8")
    # Who: this rank's recv, the sender's rank and tag; what: both sizes.
    assert re.match(r"^rank 1: recv from rank 0 tag 5: message of 32 B does not fit the recv "
                    r"buffer of 16 B", str(exc)), str(exc)


async def test_truncation_error_with_wildcards_names_the_actual_envelope() -> None:
    async with ac.open_world(3) as world:
        c0, _, c2 = world.comms
        await c2.send(np.arange(10, dtype=np.float32), 0, 9)
        with pytest.raises(ac.TruncationError) as info:
            await c0.recv(np.zeros(3, dtype=np.float32), ac.ANY_SOURCE, ac.ANY_TAG)
        exc = info.value
        assert (exc.rank, exc.source, exc.tag, exc.nbytes, exc.capacity) == (0, 2, 9, 40, 12)
        assert (exc.send_dtype, exc.recv_dtype) == ("<f4", "<f4")
        assert "recv from rank 2 tag 9" in str(exc)
        arr, status = await c0.recv_new()
        assert status == ac.Status(2, 9, 40, 10)
        np.testing.assert_array_equal(arr, np.arange(10, dtype=np.float32))


@pytest.mark.parametrize("order", ["recv-first", "send-first"])
async def test_dtype_mismatch_error_fields(order: str) -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        buf = np.zeros(8, dtype=np.float64)
        if order == "recv-first":
            rreq = c1.irecv(buf, 0, 2)
            await c0.send(np.arange(3, dtype=np.int32), 1, 2)
            with pytest.raises(ac.DTypeMismatchError) as info:
                await rreq
        else:
            await c0.send(np.arange(3, dtype=np.int32), 1, 2)
            with pytest.raises(TypeError) as info:  # a DTypeMismatchError is a TypeError
                await c1.recv(buf, 0, 2)
        exc = info.value
        assert isinstance(exc, ac.DTypeMismatchError)
        assert (exc.rank, exc.source, exc.tag, exc.nbytes, exc.capacity) == (1, 0, 2, 12, 64)
        assert (exc.send_dtype, exc.recv_dtype) == ("<i4", "<f8")
        assert "message dtype int32 differs from the recv buffer's float64" in str(exc)
        assert "recv from rank 0 tag 2" in str(exc)
        await c1.recv(np.zeros(3, dtype=np.int32), 0, 2)


async def test_recv_timeout_error_fields_and_message() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        # What the peer posted is named: a recv of its own from rank 1 on another tag.
        other = c0.irecv(np.zeros(1), 1, 9)
        with pytest.raises(ac.CommTimeoutError) as info:
            await c1.recv(np.zeros(1), 0, 3, timeout=0.01)
        exc = info.value
        assert isinstance(exc, TimeoutError)
        assert (exc.rank, exc.op, exc.peer, exc.tag, exc.timeout) == (1, "recv", 0, 3, 0.01)
        assert str(exc) == ("rank 1: recv(src=0, tag=3) timed out after 0.01 s; "
                            "rank 0 had posted recv(src=1, tag=9)")
        assert c1.statistics().pending_ops == 0
        assert other.cancel()


async def test_wildcard_recv_timeout_when_nothing_was_posted() -> None:
    async with ac.open_world(3) as world:
        c0 = world.comms[0]
        with pytest.raises(ac.CommTimeoutError) as info:
            await c0.recv(np.zeros(1), timeout=0.01)
        exc = info.value
        assert (exc.rank, exc.op, exc.peer, exc.tag) == (0, "recv", ac.ANY_SOURCE, ac.ANY_TAG)
        assert str(exc) == ("rank 0: recv(src=ANY_SOURCE, tag=ANY_TAG) timed out after 0.01 s; "
                            "no rank had posted anything for it")


async def test_send_timeout_error_fields_and_message() -> None:
    n = 10_000  # rendezvous: the send waits for a recv
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        theirs = c1.irecv(np.zeros(n, dtype=np.int64), 0, 9)
        with pytest.raises(ac.CommTimeoutError) as info:
            await c0.send(np.arange(n, dtype=np.int64), 1, 2, timeout=0.01)
        exc = info.value
        assert (exc.rank, exc.op, exc.peer, exc.tag, exc.timeout) == (0, "send", 1, 2, 0.01)
        assert str(exc) == (f"rank 0: send(dst=1, tag=2, {n * 8} B <i8) timed out after "
                            "0.01 s; rank 1 had posted recv(src=0, tag=9)")
        # withdrawn: nothing left at the destination
        assert c1.statistics().matcher.unexpected_messages == 0
        assert theirs.cancel()


async def test_probe_timeout_error_fields() -> None:
    async with ac.open_world(2) as world:
        _, c1 = world.comms
        with pytest.raises(ac.CommTimeoutError) as info:
            await c1.probe(0, 4, timeout=0.01)
        exc = info.value
        assert (exc.rank, exc.op, exc.peer, exc.tag, exc.timeout) == (1, "probe", 0, 4, 0.01)
        assert str(exc).startswith("rank 1: probe(src=0, tag=4) timed out after 0.01 s")
        assert c1.statistics().matcher.probes == 0


async def test_timeout_error_is_caught_as_builtin_timeout() -> None:
    async with ac.open_world(2) as world:
        c0, _ = world.comms
        try:
            await c0.recv(np.zeros(1), 1, timeout=0)
        except TimeoutError as exc:
            assert type(exc) is ac.CommTimeoutError
        else:
            pytest.fail("no timeout")


async def test_send_to_a_closed_peer_is_broken() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        await c1.aclose()
        with pytest.raises(ac.CommBrokenError) as info:
            await c0.send(np.arange(3), 1, 0)
        exc = info.value
        assert (exc.rank, exc.peer) == (0, 1)
        assert not isinstance(exc, ac.CommClosedError)
        # The peer is to blame, not the caller.
        assert str(exc) == "rank 1 has closed its communicator"
        assert not c0.closed


async def test_recv_from_a_closed_peer_is_broken() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        await c1.aclose()
        with pytest.raises(ac.CommBrokenError) as info:
            await c0.recv(np.zeros(3), 1, 0)
        assert (info.value.rank, info.value.peer) == (0, 1)
        assert "rank 1" in str(info.value)


async def test_pending_recv_breaks_when_the_peer_closes() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        rreq = c0.irecv(np.zeros(3), 1, 0)
        await c1.aclose()
        with pytest.raises(ac.CommBrokenError) as info:
            await rreq
        assert (info.value.rank, info.value.peer) == (0, 1)
        assert str(info.value) == "rank 1 has closed its communicator"


async def test_pending_rendezvous_send_breaks_when_the_peer_closes() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        sreq = c0.isend(np.arange(10_000, dtype=np.int64), 1, 0)
        await c1.aclose()
        with pytest.raises(ac.CommBrokenError) as info:
            await sreq
        assert (info.value.rank, info.value.peer) == (0, 1)
        assert str(info.value) == "rank 1 closed its communicator before receiving this message"


async def test_pending_op_fails_closed_when_this_side_closes() -> None:
    async with ac.open_world(2) as world:
        c0, _ = world.comms
        rreq = c0.irecv(np.zeros(3), 1, 0)
        await c0.aclose()
        with pytest.raises(ac.CommClosedError) as info:
            await rreq
        assert info.value.rank == 0
        # This side is to blame: the message names this rank.
        assert str(info.value) == "rank 0's communicator was closed with the op pending"


async def test_cancelled_request_raises_cancelled_error() -> None:
    async with ac.open_world(2) as world:
        c0, _ = world.comms
        rreq = c0.irecv(np.zeros(3), 1, 0)
        assert rreq.cancel()
        with pytest.raises(asyncio.CancelledError):
            await rreq
        assert rreq.cancelled()
        assert rreq.exception() is None


def test_fields_of_errors_the_in_process_world_cannot_raise_yet() -> None:
    dl = ac.DeadlockError("all ranks blocked", pending={0: ["recv(src=1, tag=0)"], 1: []})
    assert dl.pending == {0: ["recv(src=1, tag=0)"], 1: []}
    assert dl.rank is None

    oom = ac.OutOfDeviceMemoryError("too big", rank=2, requested=10, in_use=5, capacity=12)
    assert (oom.rank, oom.requested, oom.in_use, oom.capacity) == (2, 10, 5, 12)
    assert isinstance(oom, MemoryError)

    cause = OSError("link down")
    try:
        try:
            raise cause
        except OSError as e:
            raise ac.TransportError("transport failed", rank=1) from e
    except ac.TransportError as te:
        assert te.__cause__ is cause
        assert te.rank == 1

    broken = ac.CommBrokenError("peer died", rank=0, peer=3)
    assert (broken.rank, broken.peer) == (0, 3)


def test_every_error_survives_pickling_with_its_fields() -> None:
    """Errors cross processes (MPI dumps, a rank's failure reported to its peers,
    ``multiprocessing``): pickled and back, each keeps its type, message and fields."""
    import pickle

    errors = [
        ac.CommClosedError("closed", rank=1),
        ac.CommBrokenError("broken", rank=1, peer=2),
        ac.TruncationError("t", rank=0, source=1, tag=2, nbytes=8, capacity=4,
                           send_dtype="<i8", recv_dtype="<i8"),
        ac.DTypeMismatchError("d", rank=0, source=1, tag=2, nbytes=8, capacity=8,
                              send_dtype="<i8", recv_dtype="<f8"),
        ac.CommTimeoutError("late", rank=0, op="recv", peer=1, tag=3, timeout=1.5),
        ac.TransportError("mpi failed", rank=0),
    ]
    for exc in errors:
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)
        assert back.__dict__ == exc.__dict__, (back.__dict__, exc.__dict__)
