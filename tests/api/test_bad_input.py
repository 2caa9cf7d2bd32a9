"""Every bad input gets a typed error with an exact message, before anything is posted, and
the communicator keeps working afterwards."""

from __future__ import annotations

import asyncio
import inspect
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asynccomm as ac

# -- helpers --------------------------------------------------------------------------------


def i8(n: int = 4) -> np.ndarray[Any, Any]:
    """A fresh int64 send buffer."""
    return np.arange(n, dtype=np.int64)


def out8(n: int = 4) -> np.ndarray[Any, Any]:
    """A fresh int64 recv buffer."""
    return np.zeros(n, dtype=np.int64)


#: One buffer that several ops of a call share.
SHARED = np.zeros(64, dtype=np.int64)


def snapshot(world: ac.World) -> list[tuple[object, ...]]:
    """Everything a posted op would change, on every rank: pending ops, copies, the matcher
    queues and counters, and the staging pool (streams are not counted: making one is not
    posting anything)."""
    out = []
    for comm in world.comms:
        s = comm.statistics()
        out.append((s.pending_ops, s.active_copies, s.matcher, s.pool))
    return out


async def check_works(world: ac.World) -> None:
    """A real exchange in both directions (recv posted first, then send posted first) that
    checks the data that arrived."""
    c0, c1 = world.comms
    for src, dst in ((c0, c1), (c1, c0)):
        data = np.arange(5, dtype=np.int64) * 10 + src.rank
        out = np.full(5, -1, dtype=np.int64)
        rreq = dst.irecv(out, src.rank, 11)
        await src.send(data, dst.rank, 11)
        assert await rreq == ac.Status(source=src.rank, tag=11, nbytes=40, count=5)
        np.testing.assert_array_equal(out, data)

        out2 = np.full(5, -1, dtype=np.int64)
        await src.send(data + 1, dst.rank, 12)
        status = await dst.recv(out2, src.rank, 12)
        assert status == ac.Status(source=src.rank, tag=12, nbytes=40, count=5)
        np.testing.assert_array_equal(out2, data + 1)
    for comm in world.comms:
        stats = comm.statistics()
        assert stats.pending_ops == 0
        assert stats.matcher.posted_recvs == 0
        assert stats.matcher.unexpected_messages == 0


async def call(fn: Callable[[], object]) -> object:
    """Call ``fn`` and await what it returns if that is awaitable."""
    result = fn()
    if inspect.isawaitable(result):
        return await result
    return result


C = ac.Communicator
Case = Callable[[C, C], object]

# -- argument errors, table driven ---------------------------------------------------------

SIZE_2 = "for a world of size 2"
SEND_CONTIG = r"C-contiguous: send numpy\.ascontiguousarray\(buf\) \(a contiguous copy\)"
RECV_CONTIG = (r"C-contiguous: receive into a contiguous buffer, then copy it into this view "
               r"\(numpy\.ascontiguousarray would make a copy, and the data would land in the "
               r"copy\)")
NOT_A_BUFFER = (r"buffer must be a numpy array or a buffer-protocol object "
                r"\(bytes, bytearray, memoryview\), got ")
OBJECTS = ", which holds Python objects; only numeric, bool and fixed-size dtypes can be sent"


def _readonly(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    arr.setflags(write=False)
    return arr


STRUCT = np.dtype([("a", "<i4"), ("b", "<f8")])

ARG_CASES: list[Any] = [
    # -- ranks
    pytest.param(lambda c0, c1: c0.isend(i8(), 2), ValueError,
                 rf"^dst=2 is out of range {SIZE_2}$", id="isend-dst-too-large"),
    pytest.param(lambda c0, c1: c0.send(i8(), 5), ValueError,
                 rf"^dst=5 is out of range {SIZE_2}$", id="send-dst-too-large"),
    pytest.param(lambda c0, c1: c0.irecv(out8(), 2), ValueError,
                 rf"^src=2 is out of range {SIZE_2}$", id="irecv-src-too-large"),
    pytest.param(lambda c0, c1: c0.recv(out8(), 9), ValueError,
                 rf"^src=9 is out of range {SIZE_2}$", id="recv-src-too-large"),
    pytest.param(lambda c0, c1: c0.isend(i8(), -2), ValueError,
                 rf"^dst=-2 is out of range {SIZE_2}$", id="isend-dst-negative"),
    pytest.param(lambda c0, c1: c0.irecv(out8(), -2), ValueError,
                 rf"^src=-2 is out of range {SIZE_2}$", id="irecv-src-negative"),
    pytest.param(lambda c0, c1: c0.isend(i8(), ac.ANY_SOURCE), ValueError,
                 r"^dst=ANY_SOURCE is only allowed on receives$", id="isend-dst-any-source"),
    pytest.param(lambda c0, c1: c0.send(i8(), ac.ANY_SOURCE), ValueError,
                 r"^dst=ANY_SOURCE is only allowed on receives$", id="send-dst-any-source"),
    pytest.param(lambda c0, c1: c0.isend(i8(), True), TypeError,
                 r"^dst must be an int rank, got bool$", id="isend-dst-bool"),
    pytest.param(lambda c0, c1: c0.irecv(out8(), True), TypeError,
                 r"^src must be an int rank, got bool$", id="irecv-src-bool"),
    pytest.param(lambda c0, c1: c0.isend(i8(), np.bool_(True)), TypeError,
                 r"^dst must be an int rank, got bool$", id="isend-dst-numpy-bool"),
    pytest.param(lambda c0, c1: c0.isend(i8(), 1.0), TypeError,
                 r"^dst must be an int rank, got float$", id="isend-dst-float"),
    pytest.param(lambda c0, c1: c0.irecv(out8(), 1.0), TypeError,
                 r"^src must be an int rank, got float$", id="irecv-src-float"),
    pytest.param(lambda c0, c1: c0.isend(i8(), "1"), TypeError,
                 r"^dst must be an int rank, got str$", id="isend-dst-str"),
    pytest.param(lambda c0, c1: c0.isend(i8(), None), TypeError,
                 r"^dst must be an int rank, got NoneType$", id="isend-dst-none"),
    pytest.param(lambda c0, c1: c0.isend(i8(), np.int64(2)), ValueError,
                 rf"^dst=2 is out of range {SIZE_2}$", id="isend-dst-numpy-too-large"),
    # -- tags
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, ac.ANY_TAG), ValueError,
                 r"^tag=ANY_TAG is only allowed on receives$", id="isend-tag-any-tag"),
    pytest.param(lambda c0, c1: c0.send(i8(), 1, tag=ac.ANY_TAG), ValueError,
                 r"^tag=ANY_TAG is only allowed on receives$", id="send-tag-any-tag"),
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, -5), ValueError,
                 r"^tag=-5 is out of range 0\.\.2147483647$", id="isend-tag-negative"),
    pytest.param(lambda c0, c1: c0.irecv(out8(), 1, -5), ValueError,
                 r"^tag=-5 is out of range 0\.\.2147483647$", id="irecv-tag-negative"),
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, ac.TAG_UB + 1), ValueError,
                 r"^tag=2147483648 is out of range 0\.\.2147483647$", id="isend-tag-too-large"),
    pytest.param(lambda c0, c1: c0.irecv(out8(), 1, ac.TAG_UB + 1), ValueError,
                 r"^tag=2147483648 is out of range 0\.\.2147483647$", id="irecv-tag-too-large"),
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, np.int64(ac.TAG_UB + 1)), ValueError,
                 r"^tag=2147483648 is out of range 0\.\.2147483647$",
                 id="isend-tag-numpy-too-large"),
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, True), TypeError,
                 r"^tag must be an int, got bool$", id="isend-tag-bool"),
    pytest.param(lambda c0, c1: c0.irecv(out8(), 1, False), TypeError,
                 r"^tag must be an int, got bool$", id="irecv-tag-bool"),
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, 3.0), TypeError,
                 r"^tag must be an int, got float$", id="isend-tag-float"),
    # -- buffers: layout, writability, element type
    pytest.param(lambda c0, c1: c0.isend(np.arange(8)[::2], 1), ValueError,
                 rf"^send buffer must be {SEND_CONTIG}$", id="isend-non-contiguous"),
    pytest.param(lambda c0, c1: c0.send(np.arange(8)[::2], 1), ValueError,
                 rf"^send buffer must be {SEND_CONTIG}$", id="send-non-contiguous"),
    pytest.param(lambda c0, c1: c0.irecv(np.zeros(8)[::2], 1), ValueError,
                 rf"^recv buffer must be {RECV_CONTIG}$", id="irecv-non-contiguous"),
    pytest.param(lambda c0, c1: c0.recv(np.zeros(8)[::2], 1), ValueError,
                 rf"^recv buffer must be {RECV_CONTIG}$", id="recv-non-contiguous"),
    pytest.param(lambda c0, c1: c0.isend(np.zeros((3, 4), order="F"), 1), ValueError,
                 rf"^send buffer must be {SEND_CONTIG}$", id="isend-fortran-order"),
    pytest.param(lambda c0, c1: c0.isend(memoryview(bytearray(8))[::2], 1), ValueError,
                 r"^send buffer must be C-contiguous", id="isend-non-contiguous-memoryview"),
    pytest.param(lambda c0, c1: c0.irecv(_readonly(out8()), 1), ValueError,
                 r"^recv buffer is read-only$", id="irecv-read-only-array"),
    pytest.param(lambda c0, c1: c0.recv(_readonly(out8()), 1), ValueError,
                 r"^recv buffer is read-only$", id="recv-read-only-array"),
    pytest.param(lambda c0, c1: c0.irecv(bytes(32), 1), ValueError,
                 r"^recv buffer is read-only$", id="irecv-bytes"),
    pytest.param(lambda c0, c1: c0.irecv(memoryview(bytearray(8)).toreadonly(), 1),
                 ValueError, r"^recv buffer is read-only$", id="irecv-read-only-memoryview"),
    pytest.param(lambda c0, c1: c0.isend(np.array([1, "a"], dtype=object), 1), TypeError,
                 rf"^send buffer has dtype object{OBJECTS}$", id="isend-object-array"),
    pytest.param(lambda c0, c1: c0.irecv(np.empty(2, dtype=object), 1), TypeError,
                 rf"^recv buffer has dtype object{OBJECTS}$", id="irecv-object-array"),
    pytest.param(lambda c0, c1: c0.isend(np.zeros(2, dtype=STRUCT), 1), TypeError,
                 r"^send buffer has dtype .*structured", id="isend-structured-array"),
    pytest.param(lambda c0, c1: c0.isend(np.zeros(3, dtype="datetime64[s]"), 1), TypeError,
                 r"^send buffer has dtype datetime64\[s\], which has no buffer protocol support$",
                 id="isend-datetime64"),
    pytest.param(lambda c0, c1: c0.irecv(np.zeros(3, dtype="datetime64[s]"), 1), TypeError,
                 r"^recv buffer has dtype datetime64\[s\], which has no buffer protocol support$",
                 id="irecv-datetime64"),
    pytest.param(lambda c0, c1: c0.isend(None, 1), TypeError,
                 rf"^send {NOT_A_BUFFER}NoneType$", id="isend-none"),
    pytest.param(lambda c0, c1: c0.isend([1, 2, 3], 1), TypeError,
                 rf"^send {NOT_A_BUFFER}list$", id="isend-list"),
    pytest.param(lambda c0, c1: c0.send("text", 1), TypeError,
                 rf"^send {NOT_A_BUFFER}str$", id="send-str"),
    pytest.param(lambda c0, c1: c0.irecv(None, 1), TypeError,
                 rf"^recv {NOT_A_BUFFER}NoneType$", id="irecv-none"),
    pytest.param(lambda c0, c1: c0.recv([0, 0], 1), TypeError,
                 rf"^recv {NOT_A_BUFFER}list$", id="recv-list"),
    # -- count= and dtype=
    pytest.param(lambda c0, c1: c0.isend(i8(4), 1, count=5), ValueError,
                 r"^count=5 is larger than the send buffer \(4 elements\)$",
                 id="isend-count-too-large"),
    pytest.param(lambda c0, c1: c0.irecv(out8(4), 1, count=5), ValueError,
                 r"^count=5 is larger than the recv buffer \(4 elements\)$",
                 id="irecv-count-too-large"),
    pytest.param(lambda c0, c1: c0.isend(bytearray(4), 1, count=5), ValueError,
                 r"^count=5 is larger than the send buffer \(4 elements\)$",
                 id="isend-bytearray-count-too-large"),
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, count=-1), ValueError,
                 r"^count must be >= 0, got -1$", id="isend-count-negative"),
    pytest.param(lambda c0, c1: c0.irecv(out8(), 1, count=-1), ValueError,
                 r"^count must be >= 0, got -1$", id="irecv-count-negative"),
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, count=2.0), TypeError,
                 r"^count must be an int, got float$", id="isend-count-float"),
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, count=True), TypeError,
                 r"^count must be an int, got bool$", id="isend-count-bool"),
    pytest.param(lambda c0, c1: c0.irecv(out8(), 1, count="2"), TypeError,
                 r"^count must be an int, got str$", id="irecv-count-str"),
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, dtype=ac.float32), TypeError,
                 r"^dtype=float32 disagrees with the send buffer's dtype int64$",
                 id="isend-dtype-disagrees"),
    pytest.param(lambda c0, c1: c0.irecv(out8(), 1, dtype="f8"), TypeError,
                 r"^dtype=float64 disagrees with the recv buffer's dtype int64$",
                 id="irecv-dtype-disagrees"),
    pytest.param(lambda c0, c1: c0.isend(b"abcd", 1, dtype=ac.int32), TypeError,
                 r"^dtype=int32 disagrees with the send buffer's dtype uint8$",
                 id="isend-bytes-dtype-disagrees"),
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, dtype="nonsense"), TypeError,
                 r"^dtype='nonsense' is not a data type$", id="isend-dtype-unknown"),
    pytest.param(lambda c0, c1: c0.irecv(out8(), 1, dtype="int7"), TypeError,
                 r"^dtype='int7' is not a data type$", id="irecv-dtype-unknown"),
    # -- timeouts
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, timeout=-1), ValueError,
                 r"^timeout must be a finite number >= 0, got -1$", id="isend-timeout-negative"),
    pytest.param(lambda c0, c1: c0.recv(out8(), 1, timeout=-0.5), ValueError,
                 r"^timeout must be a finite number >= 0, got -0\.5$",
                 id="recv-timeout-negative"),
    pytest.param(lambda c0, c1: c0.irecv(out8(), 1, timeout=math.nan), ValueError,
                 r"^timeout must be a finite number >= 0, got nan$", id="irecv-timeout-nan"),
    pytest.param(lambda c0, c1: c0.send(i8(), 1, timeout=math.inf), ValueError,
                 r"^timeout must be a finite number >= 0, got inf$", id="send-timeout-inf"),
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, timeout=True), TypeError,
                 r"^timeout must be a number of seconds or None, got bool$",
                 id="isend-timeout-bool"),
    pytest.param(lambda c0, c1: c0.irecv(out8(), 1, timeout="1"), TypeError,
                 r"^timeout must be a number of seconds or None, got str$",
                 id="irecv-timeout-str"),
    pytest.param(lambda c0, c1: c0.probe(1, 0, timeout=-1), ValueError,
                 r"^timeout must be a finite number >= 0, got -1$", id="probe-timeout-negative"),
    pytest.param(lambda c0, c1: c0.recv_new(1, 0, timeout=math.nan), ValueError,
                 r"^timeout must be a finite number >= 0, got nan$", id="recv-new-timeout-nan"),
    # -- streams and events
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, stream=object()), TypeError,
                 r"^stream must be a Stream or None, got object$", id="isend-stream-object"),
    pytest.param(lambda c0, c1: c0.irecv(out8(), 1, stream="default"), TypeError,
                 r"^stream must be a Stream or None, got str$", id="irecv-stream-str"),
    pytest.param(lambda c0, c1: c0.isend(i8(), 1, stream=c1.stream()), ValueError,
                 r"^the stream belongs to another communicator$", id="isend-stream-of-peer"),
    pytest.param(lambda c0, c1: c0.recv(out8(), 1, stream=c1.default_stream), ValueError,
                 r"^the stream belongs to another communicator$",
                 id="recv-default-stream-of-peer"),
    pytest.param(lambda c0, c1: c0.stream().wait(object()), TypeError,
                 r"^expected an Event, got object$", id="stream-wait-object"),
    pytest.param(lambda c0, c1: c0.stream().wait(c1.stream().record()), ValueError,
                 r"^the event belongs to another communicator$", id="stream-wait-peer-event"),
    # -- probes and recv_new
    pytest.param(lambda c0, c1: c0.iprobe(2), ValueError,
                 rf"^src=2 is out of range {SIZE_2}$", id="iprobe-src-too-large"),
    pytest.param(lambda c0, c1: c0.iprobe(1, ac.TAG_UB + 1), ValueError,
                 r"^tag=2147483648 is out of range 0\.\.2147483647$", id="iprobe-tag-too-large"),
    pytest.param(lambda c0, c1: c0.probe(1.0), TypeError,
                 r"^src must be an int rank, got float$", id="probe-src-float"),
    pytest.param(lambda c0, c1: c0.probe(1, True), TypeError,
                 r"^tag must be an int, got bool$", id="probe-tag-bool"),
    pytest.param(lambda c0, c1: c0.recv_new(-2), ValueError,
                 rf"^src=-2 is out of range {SIZE_2}$", id="recv-new-src-negative"),
    pytest.param(lambda c0, c1: c0.recv_new(1, -5), ValueError,
                 r"^tag=-5 is out of range 0\.\.2147483647$", id="recv-new-tag-negative"),
    # -- sendrecv and batch: one bad part, nothing posted for the good parts either
    pytest.param(lambda c0, c1: c0.sendrecv(i8(), 2, out8(), 1), ValueError,
                 rf"^dst=2 is out of range {SIZE_2}$", id="sendrecv-bad-dst"),
    pytest.param(lambda c0, c1: c0.sendrecv(i8(), 1, bytes(32), 1), ValueError,
                 r"^recv buffer is read-only$", id="sendrecv-read-only-recvbuf"),
    pytest.param(lambda c0, c1: c0.batch([ac.SendOp(i8(), 1, 3), ac.RecvOp(out8(), 1, 3),
                                          "not an op"]),
                 TypeError, r"^batch takes SendOp and RecvOp items, got str$",
                 id="batch-non-op-item"),
    pytest.param(lambda c0, c1: c0.batch([ac.SendOp(i8(), 1, 3), (i8(), 1, 3)]),
                 TypeError, r"^batch takes SendOp and RecvOp items, got tuple$",
                 id="batch-tuple-item"),
    pytest.param(lambda c0, c1: c0.batch([ac.SendOp(i8(), 1, 3), ac.RecvOp(out8(), 5, 3),
                                          ac.SendOp(i8(), 1, 4)]),
                 ValueError, rf"^src=5 is out of range {SIZE_2}$", id="batch-bad-src-in-middle"),
    pytest.param(lambda c0, c1: c0.batch([ac.RecvOp(out8(), 1, 3), ac.SendOp(i8(), 1, -1)]),
                 ValueError, r"^tag=ANY_TAG is only allowed on receives$",
                 id="batch-send-any-tag"),
    pytest.param(lambda c0, c1: c0.batch([ac.SendOp(i8(), 1, 3)], timeout=-1), ValueError,
                 r"^timeout must be a finite number >= 0, got -1$", id="batch-timeout-negative"),
    # -- one buffer, two ops: a recv would write what another op reads or writes
    pytest.param(lambda c0, c1: c0.sendrecv(SHARED, 1, SHARED, 1), ValueError,
                 r"^ops 0 \(send\) and 1 \(recv\) of the batch share buffer memory",
                 id="sendrecv-same-buffer"),
    pytest.param(lambda c0, c1: c0.batch([ac.RecvOp(SHARED[:10], 1, 3),
                                          ac.RecvOp(SHARED[5:15], 1, 4)]), ValueError,
                 r"^ops 0 \(recv\) and 1 \(recv\) of the batch share buffer memory",
                 id="batch-overlapping-recvs"),
    pytest.param(lambda c0, c1: c0.batch([ac.SendOp(SHARED[:10], 1, 3),
                                          ac.SendOp(SHARED[:10], 1, 4),
                                          ac.RecvOp(SHARED[9:20], 1, 4)]), ValueError,
                 r"^ops [01] \(send\) and 2 \(recv\) of the batch share buffer memory",
                 id="batch-recv-into-a-send-buffer"),
    # -- masked arrays: the mask would not travel
    pytest.param(lambda c0, c1: c0.send(np.ma.array([1.0, 2.0], mask=[0, 1]), 1), TypeError,
                 r"^send buffer is a masked array", id="send-masked-array"),
    pytest.param(lambda c0, c1: c0.recv(np.ma.zeros(2), 1), TypeError,
                 r"^recv buffer is a masked array", id="recv-masked-array"),
    # -- compute
    pytest.param(lambda c0, c1: c0.compute(), TypeError,
                 r"^compute\(\) takes exactly one of seconds= or flops=$", id="compute-nothing"),
    pytest.param(lambda c0, c1: c0.compute(1, 1), TypeError,
                 r"^compute\(\) takes exactly one of seconds= or flops=$", id="compute-both"),
    pytest.param(lambda c0, c1: c0.compute(seconds=-1), ValueError,
                 r"^seconds must be a finite number >= 0, got -1$", id="compute-negative"),
    pytest.param(lambda c0, c1: c0.compute(seconds=math.nan), ValueError,
                 r"^seconds must be a finite number >= 0, got nan$", id="compute-nan"),
    pytest.param(lambda c0, c1: c0.compute(seconds=True), TypeError,
                 r"^seconds must be a number, got bool$", id="compute-bool"),
    pytest.param(lambda c0, c1: c0.compute(flops="1e9"), TypeError,
                 r"^flops must be a number, got str$", id="compute-flops-str"),
    pytest.param(lambda c0, c1: c0.compute(flops=1e9), ValueError,
                 r"^compute\(flops=\.\.\.\) needs a device compute rate",
                 id="compute-flops-without-cluster"),
    pytest.param(lambda c0, c1: c0.compute(seconds=0, stream=object()), TypeError,
                 r"^stream must be a Stream or None, got object$", id="compute-stream-object"),
    pytest.param(lambda c0, c1: c0.compute(seconds=0, stream=c1.stream()), ValueError,
                 r"^the stream belongs to another communicator$", id="compute-stream-of-peer"),
    # -- wait_all / wait_any
    pytest.param(lambda c0, c1: ac.wait_any([]), ValueError,
                 r"^wait_any needs at least one request$", id="wait-any-empty"),
    pytest.param(lambda c0, c1: ac.wait_all([1]), TypeError,
                 r"^expected Request objects, got int$", id="wait-all-non-request"),
    pytest.param(lambda c0, c1: ac.wait_any([None]), TypeError,
                 r"^expected Request objects, got NoneType$", id="wait-any-non-request"),
]


@pytest.mark.parametrize(("case", "exc", "match"), ARG_CASES)
async def test_bad_argument(case: Case, exc: type[Exception], match: str) -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        before = snapshot(world)
        with pytest.raises(exc, match=match):
            await call(lambda: case(c0, c1))
        assert snapshot(world) == before, "something was posted before the error"
        await check_works(world)


@pytest.mark.parametrize("view", [slice(None), slice(10, 20), slice(0, 1), slice(99, 100)])
async def test_a_recv_into_a_pending_recvs_buffer_is_refused(view: slice) -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        buf = np.zeros(100, np.uint8)
        first = c1.irecv(buf, 0, 1)
        before = snapshot(world)
        with pytest.raises(ValueError, match=r"^rank 1: the recv buffer overlaps the buffer "
                           r"of recv\(src=0, tag=1\), which is still pending"):
            c1.irecv(buf[view], 0, 2)
        with pytest.raises(ValueError, match="overlaps the buffer of recv"):
            await c1.sendrecv(np.ones(1, np.uint8), 0, buf[view], 0)
        assert snapshot(world) == before
        neighbour = c1.irecv(np.zeros(100, np.uint8), 0, 2)  # separate memory is fine
        assert first.cancel() and neighbour.cancel()
        again = c1.irecv(buf, 0, 1)  # the first recv is gone: its buffer is free again
        assert again.cancel()
        await check_works(world)


async def test_recvs_into_disjoint_parts_of_one_array_are_fine() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        buf = np.zeros(100, np.uint8)
        reqs = [c1.irecv(buf[i * 10:(i + 1) * 10], 0, i) for i in range(10)]
        for i in reversed(range(10)):
            await c0.send(np.full(10, i, np.uint8), 1, i)
        await ac.wait_all(reqs)
        assert list(buf[::10]) == list(range(10))


async def test_wait_all_with_a_non_request_leaves_real_requests_alone() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        out = np.full(3, -1, dtype=np.int64)
        rreq = c1.irecv(out, 0, 2)
        with pytest.raises(TypeError, match=r"^expected Request objects, got str$"):
            await ac.wait_all([rreq, "req"])  # type: ignore[list-item]
        assert not rreq.done()
        await c0.send(np.array([7, 8, 9]), 1, 2)
        assert await ac.wait_all([rreq]) == [ac.Status(0, 2, 24, 3)]
        np.testing.assert_array_equal(out, [7, 8, 9])
        await check_works(world)


async def test_numpy_integer_ranks_and_tags_are_accepted() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        out = np.full(4, -1, dtype=np.int64)
        rreq = c1.irecv(out, np.int64(0), np.int32(6))
        sreq = c0.isend(i8(), np.int64(1), np.uint16(6))
        assert await rreq == ac.Status(0, 6, 32, 4)
        assert await sreq is None
        np.testing.assert_array_equal(out, i8())
        assert c1.iprobe(np.int8(0), np.int64(6)) is None
        await check_works(world)


@pytest.mark.parametrize("kind", ["send", "recv"])
async def test_buffer_without_buffer_protocol_is_rejected_every_time(kind: str) -> None:
    """The same TypeError the second time too (not only while the dtype is new)."""
    async with ac.open_world(2) as world:
        c0, _ = world.comms
        dt = "timedelta64[ms]"  # no other test uses it, so the first call sees it new
        for _ in range(2):
            arr = np.zeros(3, dtype=dt)
            with pytest.raises(TypeError, match=(
                    rf"^{kind} buffer has dtype timedelta64\[ms\], which has no buffer "
                    r"protocol support$")):
                if kind == "send":
                    c0.isend(arr, 1)
                else:
                    c0.irecv(arr, 1)
        await check_works(world)


async def test_bytes_like_buffers_carry_uint8() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        out = bytearray(8)
        rreq = c1.irecv(out, 0, 1)
        await c0.send(b"abc", 1, 1)
        assert await rreq == ac.Status(0, 1, 3, 3)
        assert out == b"abc" + bytes(5)
        arr = np.zeros(3, dtype=np.uint8)
        await c0.send(memoryview(b"xyz"), 1, 2)
        await c1.recv(arr, 0, 2)
        assert arr.tobytes() == b"xyz"


# -- dtype mismatch and truncation: the recv fails, the buffer is untouched, nothing lost ---

PROTOCOLS = {
    "eager": 4,  # 32 B
    "eager-limit": ac.EAGER_LIMIT // 8,  # exactly the eager limit: still eager
    "rendezvous": 10_000,  # 80,000 B > EAGER_LIMIT
}


def _is_eager(n: int) -> bool:
    return n * 8 <= ac.EAGER_LIMIT


@pytest.mark.parametrize("order", ["recv-first", "send-first"])
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
async def test_dtype_mismatch_keeps_the_message(protocol: str, order: str) -> None:
    n = PROTOCOLS[protocol]
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        data = np.arange(n, dtype=np.int64) + 1
        wrong = np.full(n, -7.5, dtype=np.float64)
        expected = (r"^rank 1: recv from rank 0 tag 5: message dtype int64 differs from the recv "
                    r"buffer's float64; the buffer is untouched and the message waits for the next "
                    r"recv that fits$")
        if order == "recv-first":
            rreq = c1.irecv(wrong, 0, 5)
            sreq = c0.isend(data, 1, 5)
            with pytest.raises(ac.DTypeMismatchError, match=expected):
                await rreq
        else:
            sreq = c0.isend(data, 1, 5)
            with pytest.raises(ac.DTypeMismatchError, match=expected):
                await c1.recv(wrong, 0, 5)
        assert np.all(wrong == -7.5), "the recv buffer was written"
        # The sender is not failed: an eager send is complete, a rendezvous one still waits.
        assert sreq.exception() is None
        assert sreq.done() is _is_eager(n)
        m = c1.statistics().matcher
        assert (m.posted_recvs, m.unexpected_messages) == (0, 1)
        assert c1.iprobe(0, 5) == ac.Status(0, 5, n * 8, n)

        right = np.full(n, -1, dtype=np.int64)
        assert await c1.recv(right, 0, 5) == ac.Status(0, 5, n * 8, n)
        np.testing.assert_array_equal(right, data)
        assert await sreq is None
        await check_works(world)


@pytest.mark.parametrize("then", ["larger-recv", "recv_new"])
@pytest.mark.parametrize("order", ["recv-first", "send-first"])
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
async def test_truncation_keeps_the_message(protocol: str, order: str, then: str) -> None:
    n = PROTOCOLS[protocol]
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        data = np.arange(n, dtype=np.int64) * 3
        small = np.full(n // 2, -7, dtype=np.int64)
        expected = (rf"^rank 1: recv from rank 0 tag 5: message of {n * 8} B does not fit the "
                    rf"recv buffer of {n // 2 * 8} B; the buffer is untouched and the message "
                    r"waits for the next recv that fits$")
        if order == "recv-first":
            rreq = c1.irecv(small, 0, 5)
            sreq = c0.isend(data, 1, 5)
            with pytest.raises(ac.TruncationError, match=expected):
                await rreq
        else:
            sreq = c0.isend(data, 1, 5)
            with pytest.raises(ac.TruncationError, match=expected):
                await c1.recv(small, 0, 5)
        assert np.all(small == -7), "the recv buffer was written"
        assert sreq.exception() is None
        assert sreq.done() is _is_eager(n)
        m = c1.statistics().matcher
        assert (m.posted_recvs, m.unexpected_messages) == (0, 1)

        if then == "larger-recv":
            big = np.full(n + 3, -1, dtype=np.int64)
            # A smaller message than the buffer is fine; Status.count says how much arrived.
            assert await c1.recv(big, 0, 5) == ac.Status(0, 5, n * 8, n)
            np.testing.assert_array_equal(big[:n], data)
            np.testing.assert_array_equal(big[n:], [-1, -1, -1])
        else:
            arr, status = await c1.recv_new(0, 5)
            assert status == ac.Status(0, 5, n * 8, n)
            assert arr.dtype == np.int64
            np.testing.assert_array_equal(arr, data)
        assert await sreq is None
        await check_works(world)


# -- closed communicator --------------------------------------------------------------------

CLOSED_OPS: dict[str, Callable[[C, ac.Stream], object]] = {
    "send": lambda c, s: c.send(i8(), 1),
    "recv": lambda c, s: c.recv(out8(), 1),
    "isend": lambda c, s: c.isend(i8(), 1),
    "irecv": lambda c, s: c.irecv(out8(), 1),
    "recv_new": lambda c, s: c.recv_new(1),
    "sendrecv": lambda c, s: c.sendrecv(i8(), 1, out8(), 1),
    "batch": lambda c, s: c.batch([ac.SendOp(i8(), 1)]),
    "probe": lambda c, s: c.probe(1, 0),
    "iprobe": lambda c, s: c.iprobe(1, 0),
    "stream": lambda c, s: c.stream(),
    "compute": lambda c, s: c.compute(seconds=0),
    "send-on-stream": lambda c, s: c.send(i8(), 1, stream=s),
}


@pytest.mark.parametrize("op", list(CLOSED_OPS))
async def test_closed_communicator_raises(op: str) -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        stream = c0.stream()
        await c0.aclose()
        assert c0.closed
        before = snapshot(world)
        with pytest.raises(ac.CommClosedError, match=r"^rank 0's communicator is closed$") as info:
            await call(lambda: CLOSED_OPS[op](c0, stream))
        assert info.value.rank == 0
        assert snapshot(world) == before
        await c0.aclose()  # idempotent


@pytest.mark.parametrize("what", ["record", "synchronize", "wait"])
async def test_stream_of_closed_communicator_raises(what: str) -> None:
    async with ac.open_world(2) as world:
        c0, _ = world.comms
        stream = c0.stream()
        event = c0.default_stream.record()
        await c0.aclose()
        with pytest.raises(ac.CommClosedError, match=r"^rank 0's communicator is closed$"):
            if what == "record":
                stream.record()
            elif what == "synchronize":
                await stream.synchronize()
            else:
                stream.wait(event)


# -- wrong thread, wrong loop ---------------------------------------------------------------

THREAD_OPS: dict[str, Callable[[C], object]] = {
    "isend": lambda c: c.isend(i8(), 1),
    "irecv": lambda c: c.irecv(out8(), 1),
    "iprobe": lambda c: c.iprobe(1),
    "stream": lambda c: c.stream(),
}


@pytest.mark.parametrize("op", list(THREAD_OPS))
async def test_call_from_another_thread_raises(op: str) -> None:
    async with ac.open_world(2) as world:
        c0, _ = world.comms
        before = snapshot(world)
        with pytest.raises(RuntimeError, match=(
                r"^rank 0's communicator was called outside its event loop \(from another "
                r"thread\?\); call it from the loop that opened its world$")):
            await asyncio.to_thread(THREAD_OPS[op], c0)
        assert snapshot(world) == before
        await check_works(world)


async def _isend_in_coroutine(c: C) -> object:
    return c.isend(i8(), 1)


LOOP_OPS: dict[str, Callable[[C], Any]] = {
    "send": lambda c: c.send(i8(), 1),
    "recv": lambda c: c.recv(out8(), 1),
    "recv_new": lambda c: c.recv_new(1),
    "probe": lambda c: c.probe(1),
    "sendrecv": lambda c: c.sendrecv(i8(), 1, out8(), 1),
    "batch": lambda c: c.batch([ac.SendOp(i8(), 1)]),
    "compute": lambda c: c.compute(seconds=0),
    "isend": _isend_in_coroutine,
}


@pytest.mark.parametrize("op", list(LOOP_OPS))
async def test_call_from_another_event_loop_raises(op: str) -> None:
    async with ac.open_world(2) as world:
        c0, _ = world.comms
        before = snapshot(world)
        with pytest.raises(RuntimeError,
                           match=r"^rank 0's communicator belongs to another event loop$"):
            await asyncio.to_thread(asyncio.run, LOOP_OPS[op](c0))
        assert snapshot(world) == before
        await check_works(world)


# -- run() and open_world() -----------------------------------------------------------------

RUN_CASES: list[Any] = [
    pytest.param({"world_size": 0}, ValueError, r"^world size must be >= 1, got 0$", id="size-0"),
    pytest.param({"world_size": -3}, ValueError, r"^world size must be >= 1, got -3$",
                 id="size-negative"),
    pytest.param({"world_size": "2"}, TypeError, r"^world size must be an int, got str$",
                 id="size-str"),
    pytest.param({"world_size": True}, TypeError, r"^world size must be an int, got bool$",
                 id="size-bool"),
    pytest.param({"world_size": 2.0}, TypeError, r"^world size must be an int, got float$",
                 id="size-float"),
    pytest.param({"world_size": None}, TypeError, r"^run\(\) needs world_size",
                 id="size-none"),
    pytest.param({"world_size": 2, "loop": "trio"}, ValueError,
                 r"^loop must be one of \[.*'asyncio'.*'uvloop'.*\], got 'trio'$", id="loop-name"),
    pytest.param({"world_size": 2, "loop": 5}, ValueError,
                 r"^loop must be one of \[.*\], got 5$", id="loop-int"),
    pytest.param({"world_size": 2, "cluster": object()}, TypeError,
                 r"^cluster must be an asynccomm\.Cluster or None, got object$", id="cluster"),
    pytest.param({"world_size": 2, "clock": "realtime"}, ValueError,
                 r"^clock must be 'auto', 'wall' or 'virtual', got 'realtime'$",
                 id="clock-name"),
    pytest.param({"world_size": 2, "clock": "virtual", "loop": "uvloop"}, ValueError,
                 r"^loop='uvloop' does not go with clock='virtual'", id="clock-virtual-uvloop"),
    pytest.param({"world_size": 2, "backend": "tcp"}, ValueError,
                 r"^backend must be 'local', 'mpi' or 'processes', got 'tcp'$",
                 id="backend-name"),
    pytest.param({"world_size": 2, "eager_limit": -1}, ValueError,
                 r"^eager_limit must be an int >= 0, got -1$", id="eager-limit-negative"),
    pytest.param({"world_size": 2, "timeout": -1}, ValueError,
                 r"^timeout must be a finite number >= 0, got -1$", id="timeout-negative"),
    pytest.param({"world_size": 2, "bogus": 1}, TypeError,
                 r"unexpected keyword argument 'bogus'", id="unknown-option"),
]


@pytest.mark.parametrize(("kwargs", "exc", "match"), RUN_CASES)
def test_run_rejects_bad_arguments(kwargs: dict[str, Any], exc: type[Exception],
                                   match: str) -> None:
    called: list[int] = []

    async def main(comm: ac.Communicator) -> None:
        called.append(comm.rank)

    with pytest.raises(exc, match=match):
        ac.run(main, **kwargs)
    assert called == []
    assert ac.run(main, world_size=2, loop="asyncio") == [None, None]
    assert sorted(called) == [0, 1]


def test_run_rejects_a_non_callable_main() -> None:
    with pytest.raises(TypeError, match=r"^main must be an async function taking a Communicator"):
        ac.run(42, world_size=2)  # type: ignore[arg-type]


OPEN_WORLD_CASES: list[Any] = [
    pytest.param((0,), {}, ValueError, r"^world size must be >= 1, got 0$", id="size-0"),
    pytest.param(("2",), {}, TypeError, r"^world size must be an int, got str$", id="size-str"),
    pytest.param((True,), {}, TypeError, r"^world size must be an int, got bool$",
                 id="size-bool"),
    pytest.param((2,), {"cluster": object()}, TypeError,
                 r"^cluster must be an asynccomm\.Cluster or None, got object$",
                 id="cluster-object"),
    pytest.param((2,), {"cluster": "ascend910b"}, TypeError,
                 r"^cluster must be an asynccomm\.Cluster or None, got str$",
                 id="cluster-name"),
    # The test's loop (asyncio or uvloop) is not the virtual-time loop.
    pytest.param((2,), {"clock": "virtual"}, ValueError,
                 r"^clock='virtual' needs the virtual-time loop", id="clock-virtual"),
    pytest.param((2,), {"clock": None}, ValueError,
                 r"^clock must be 'auto', 'wall' or 'virtual', got None$", id="clock-none"),
    pytest.param((2,), {"clock": "realtime"}, ValueError,
                 r"^clock must be 'auto', 'wall' or 'virtual', got 'realtime'$",
                 id="clock-name"),
    pytest.param((2,), {"eager_limit": -1}, ValueError,
                 r"^eager_limit must be an int >= 0, got -1$", id="eager-limit-negative"),
    pytest.param((2,), {"pool_bytes": -1}, ValueError,
                 r"^pool_bytes must be an int >= 0, got -1$", id="pool-bytes-negative"),
    # A value of the wrong type is a TypeError everywhere else in the API (ranks, tags,
    # count, timeout, world size).
    pytest.param((2,), {"eager_limit": "1024"}, TypeError, r"^eager_limit must be an int",
                 id="eager-limit-str"),
    pytest.param((2,), {"pool_bytes": 1.5}, TypeError, r"^pool_bytes must be an int",
                 id="pool-bytes-float"),
    pytest.param((2,), {"timeout": -1}, ValueError,
                 r"^timeout must be a finite number >= 0, got -1$", id="timeout-negative"),
    pytest.param((2,), {"timeout": "1"}, TypeError,
                 r"^timeout must be a number of seconds or None, got str$", id="timeout-str"),
]


@pytest.mark.parametrize(("args", "kwargs", "exc", "match"), OPEN_WORLD_CASES)
async def test_open_world_rejects_bad_arguments(args: tuple[Any, ...], kwargs: dict[str, Any],
                                                exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        async with ac.open_world(*args, **kwargs):
            pytest.fail("the world opened")
    async with ac.open_world(2, cluster=None, clock="wall") as world:
        await check_works(world)


# -- ASYNCCOMM_TIMEOUT -----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc", "1s", "-1", "nan", "inf", "-inf"])
async def test_invalid_env_timeout_is_rejected_at_open_world(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ASYNCCOMM_TIMEOUT", value)
    # The message must name the variable: open_world() has no timeout argument here, so
    # "timeout must be ..." alone would not tell the user where the bad value came from.
    with pytest.raises(ValueError, match=rf"ASYNCCOMM_TIMEOUT.*{re.escape(value)}"):
        async with ac.open_world(2):
            pytest.fail("the world opened")


@pytest.mark.parametrize("value", ["", "   "])
async def test_empty_env_timeout_means_no_timeout(monkeypatch: pytest.MonkeyPatch,
                                                  value: str) -> None:
    monkeypatch.setenv("ASYNCCOMM_TIMEOUT", value)
    async with ac.open_world(2) as world:
        await check_works(world)


async def test_env_timeout_expires_and_names_what_the_peer_posted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCOMM_TIMEOUT", "0.05")
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        await c0.send(np.array([42], dtype=np.int64), 1, 4)  # eager, sits unmatched at rank 1
        out = np.full(1, -1, dtype=np.int64)
        with pytest.raises(TimeoutError) as info:
            await c1.recv(out, 0, 3)
        exc = info.value
        assert isinstance(exc, ac.CommTimeoutError)
        assert (exc.rank, exc.op, exc.peer, exc.tag, exc.timeout) == (1, "recv", 0, 3, 0.05)
        assert re.search(r"^rank 1: recv\(src=0, tag=3\) timed out after 0\.05 s; "
                         r"rank 0 had posted send\(dst=1, tag=4, 8 B <i8\)", str(exc)), str(exc)
        assert out[0] == -1
        assert c1.statistics().matcher.posted_recvs == 0
        assert c1.statistics().pending_ops == 0
        # Nothing was lost: the other message is still there.
        assert await c1.recv(out, 0, 4) == ac.Status(0, 4, 8, 1)
        assert out[0] == 42


async def test_env_timeout_when_the_peer_posted_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCOMM_TIMEOUT", "0.05")
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        with pytest.raises(ac.CommTimeoutError, match=(
                r"^rank 0: recv\(src=1, tag=3\) timed out after 0\.05 s; "
                r"rank 1 had posted nothing for rank 0$")):
            await c0.recv(out8(), 1, 3)
        await check_works(world)


def test_a_plain_def_main_is_refused_before_any_rank_runs() -> None:
    ran: list[int] = []

    def main(comm: ac.Communicator) -> int:  # forgot async
        ran.append(comm.rank)
        return comm.rank

    with pytest.raises(TypeError, match=r"async function \(async def main\(comm\)"):
        ac.run(main, world_size=3)  # type: ignore[arg-type]

    async def inner(comm: ac.Communicator, x: int) -> int:
        return x + comm.rank

    assert ac.run(lambda comm: inner(comm, 10), world_size=2) == [10, 11]  # a lambda is fine


def test_match_errors_name_dtypes_as_people_do() -> None:
    async def main(comm: ac.Communicator) -> str:
        if comm.rank == 0:
            await comm.send(np.arange(3, dtype=np.int64), 1)
            return ""
        with pytest.raises(ac.DTypeMismatchError) as info:
            await comm.recv(np.zeros(3, np.float32), 0)
        await comm.recv(np.zeros(3, np.int64), 0)
        return str(info.value)

    message = ac.run(main, world_size=2)[1]
    assert "message dtype int64 differs from the recv buffer's float32" in message


def test_a_non_contiguous_recv_buffer_gets_advice_that_works() -> None:
    async def main(comm: ac.Communicator) -> None:
        with pytest.raises(ValueError, match="receive into a contiguous buffer, then copy"):
            comm.irecv(np.zeros((4, 4))[:, 0], 0)
        with pytest.raises(ValueError, match=r"send numpy.ascontiguousarray\(buf\)"):
            comm.isend(np.zeros((4, 4))[:, 0], 0)

    ac.run(main, world_size=1)


def test_help_lists_the_public_attributes() -> None:
    import pydoc

    text = pydoc.render_doc(ac.Communicator, renderer=pydoc.plaintext)
    for name in ("rank:", "size:", "device:", "split(", "allreduce(", "send_obj(", "ibatch("):
        assert name in text
    assert "run_ranks" not in pydoc.render_doc(ac.run, renderer=pydoc.plaintext)
