"""Python objects as messages: ``send_obj``/``recv_obj`` and their non-blocking forms.

Rule 1: an object is pickled with protocol 5.  Contiguous buffers inside it (numpy arrays,
bytes-like objects that offer them) travel out of band, as messages of their own, so they
are never copied into the pickle.  Everything else travels in the object's header.
Rule 2: the header is one message on the communicator itself, matched like any other (by
source and tag, wildcards included, in order).  Its dtype is ``OBJECT_DTYPE`` (bytes of a
kind no array recv takes, not even ``recv_new``), so an array recv never takes an object
and ``recv_obj`` never takes an array: each fails with ``DTypeMismatchError`` and the
message waits for the right recv.  The out-of-band buffers follow on the private context,
on a tag the header names (unique to the object), so they never match anything else.
Rule 3: the buffers are sent only once the header is done (taken or staged at its
destination, when it can no longer be withdrawn); from then on the object is committed.
Cancelling or timing out a send before that withdraws the header and nothing else was
sent.  After it, a cancellation lets the object complete (the send reports success, the
cancellation being delivered at the task's next await), as for any op that matched; but
``timeout=`` (or ``ASYNCCOMM_TIMEOUT``) bounds the whole call: the buffers get the time
left, a buffer that matched finishes, and if one is withdrawn unmatched the object is
abandoned: the send raises ``CommTimeoutError`` and tells the receiver on the object's
tag (after the buffers that went), so its ``recv_obj`` raises ``CommTimeoutError`` too
and takes the notice: nothing is half delivered, nothing stays behind.  The receiving
side's ``timeout=`` bounds the wait for the header; once ``recv_obj`` took it, the op has
matched and it receives the buffers (which the sender posts at once), or fails with the
sender's abandonment or its failure (``CommBrokenError``: the buffers follow the rules of
any point-to-point op).
Rule 4: unpickling runs code chosen by the sender.  Receive objects only from peers you
trust, as with ``pickle`` itself.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

import numpy as np

from .._core.matching import OBJECT_DTYPE
from .._core.states import Kind
from .._engine.request import Request, TaskRequest, defer_cancellation, settle
from .._exceptions import CommClosedError, CommTimeoutError, DTypeMismatchError
from .._types import ANY_SOURCE, ANY_TAG, Status
from .groups import OBJECT_TAGS
from .view import CommView

__all__ = ["OBJECT_DTYPE", "irecv_obj", "isend_obj"]

#: magic, the buffers' tag on the private context, the number of buffers; then one size
#: (8 bytes) per buffer, then the pickle.
_HEAD = struct.Struct("<4sII")
_MAGIC = b"ACo1"
_SIZE = struct.Struct("<Q")


def _pickle(obj: object, what: str) -> tuple[bytes, list[memoryview]]:
    """The pickle of ``obj`` and its out-of-band buffers (contiguous ones only).

    Raises:
        TypeError: ``obj`` cannot be pickled.
    """
    buffers: list[memoryview] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        try:
            raw = buf.raw()
        except BufferError:
            return True  # not contiguous: in the pickle
        buffers.append(raw)
        return False

    try:
        data = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    except Exception as exc:  # pickling fails with many types: one typed error
        raise TypeError(f"{what}: the object cannot be pickled: {type(exc).__name__}: "
                        f"{exc}") from exc
    return data, buffers


def isend_obj(comm: CommView, obj: Any, dst: int, tag: int = 0, *,
              timeout: float | None = None) -> TaskRequest:
    """``Communicator.isend_obj`` (see there)."""
    comm._check_ready()
    d = comm._check_rank(dst, "dst", wildcard=False)
    t = comm._check_tag(tag, wildcard=False)
    limit = comm._timeout(timeout)
    data, buffers = _pickle(obj, "send_obj")
    comm._obj_seq = seq = (comm._obj_seq + 1) % OBJECT_TAGS
    parts_tag = OBJECT_TAGS + seq
    head = bytearray(_HEAD.pack(_MAGIC, parts_tag, len(buffers)))
    for buf in buffers:
        head += _SIZE.pack(buf.nbytes)
    head += data
    engine = comm._engine
    header = Request(engine, Kind.SEND, d, t, memoryview(head), len(head), len(head),
                     OBJECT_DTYPE, engine.default_stream, limit)
    deadline = None if limit is None else comm._loop.time() + limit
    engine.default_stream._submit(header)  # posted now: headers go in call order
    return TaskRequest(header, lambda: _send_buffers(comm, header, buffers, d, t, parts_tag,
                                                          limit, deadline),
                       f"send_obj to {d}")


async def _send_buffers(comm: CommView, header: Request, buffers: list[memoryview], dst: int,
                        tag: int, parts_tag: int, limit: float | None,
                        deadline: float | None) -> None:
    await header  # cancelled or timed out before it was done: withdrawn, nothing sent
    if not buffers:
        return
    private = _parts_context(comm, )
    left = None if deadline is None else max(0.0, deadline - comm._loop.time())
    parts = [_part(private, Kind.SEND, dst, parts_tag, np.frombuffer(buf, np.uint8), left)
             for buf in buffers]
    await _committed(parts)
    failed = [r.exception() for r in parts if r.exception() is not None]
    if not failed:
        return
    if not all(isinstance(e, CommTimeoutError) for e in failed):
        raise next(e for e in failed if not isinstance(e, CommTimeoutError))  # type: ignore[misc]
    # Some buffers were withdrawn unmatched: the receiver is told on the object's own
    # tag, after the buffers that went, and its recv_obj fails too (Rule 3).
    _post(private, Kind.SEND, dst, parts_tag, np.empty(0, np.uint8), OBJECT_DTYPE)
    raise CommTimeoutError(
        f"rank {comm.rank}: send_obj to rank {dst} tag {tag} timed out after {limit:g} s: "
        f"its header was taken or staged, but {len(failed)} of its {len(parts)} buffers "
        "had not been received; the object was abandoned and the receiver's recv_obj "
        "fails with CommTimeoutError too", rank=comm.rank, op="send", peer=dst, tag=tag,
        timeout=limit or 0.0)


def _parts_context(comm: CommView) -> CommView:
    """The private context that carries the buffers of this rank's objects.

    Raises:
        CommClosedError: this communicator closed after the object's header was done.
    """
    if comm._engine.closed:
        raise CommClosedError(f"rank {comm.rank}'s communicator was closed with an "
                              "object in flight", rank=comm.rank)
    return comm._private()


def irecv_obj(comm: CommView, src: int = ANY_SOURCE, tag: int = ANY_TAG, *,
              timeout: float | None = None) -> TaskRequest:
    """``Communicator.irecv_obj`` (see there)."""
    comm._check_ready()
    s = comm._check_rank(src, "src", wildcard=True)
    t = comm._check_tag(tag, wildcard=True)
    limit = comm._timeout(timeout)
    engine = comm._engine
    header = Request(engine, Kind.RECV, s, t, None, -1, 0, OBJECT_DTYPE,
                     engine.default_stream, limit)
    engine.default_stream._submit(header)
    return TaskRequest(header, lambda: _recv_buffers(comm, header), f"recv_obj from {s}")


async def _recv_buffers(comm: CommView, header: Request) -> tuple[Any, Status]:
    try:
        arr, status = await header
    except DTypeMismatchError as exc:
        exc.add_note(f"rank {comm.rank}: recv_obj matched a message that is an array, not "
                     "an object (sent with send, not send_obj); it waits for an array "
                     "recv")
        raise
    raw = memoryview(arr).cast("B")
    magic, parts_tag, n = _HEAD.unpack_from(raw)
    if magic != _MAGIC:
        raise ValueError(f"rank {comm.rank}: recv_obj from rank {status.source} tag "
                         f"{status.tag}: the header is not an object's")
    sizes = [_SIZE.unpack_from(raw, _HEAD.size + 8 * i)[0] for i in range(n)]
    data = raw[_HEAD.size + 8 * n:]
    buffers = [np.empty(size, np.uint8) for size in sizes]
    if buffers:
        private = _parts_context(comm, )
        parts = [_part(private, Kind.RECV, status.source, parts_tag, buf, None)
                 for buf in buffers]
        await _committed(parts)
        failed = [r.exception() for r in parts if r.exception() is not None]
        if failed:
            await _abandoned(comm, private, failed, status, parts_tag)
    obj = pickle.loads(data, buffers=buffers)
    return obj, Status(status.source, status.tag, status.nbytes + sum(sizes), 1, ())


async def _abandoned(comm: CommView, private: CommView, failed: list[BaseException | None],
                     status: Status, parts_tag: int) -> None:
    """Raise the error of an object whose buffers did not all arrive: the sender's
    failure, or its abandonment (its notice, which the buffers' recvs refused as an
    object's, is taken here: nothing is left behind).

    Raises:
        CommTimeoutError: the sender abandoned the object (its timeout expired).
        CommBrokenError, CommClosedError: the sender or this rank closed.
    """
    if not all(isinstance(e, DTypeMismatchError) for e in failed):
        raise next(e for e in failed if not isinstance(e, DTypeMismatchError))  # type: ignore[misc]
    notice = _post(private, Kind.RECV, status.source, parts_tag, np.empty(0, np.uint8),
                   OBJECT_DTYPE)
    await _committed([notice])
    raise CommTimeoutError(
        f"rank {comm.rank}: recv_obj from rank {status.source} tag {status.tag}: the "
        f"sender abandoned the object after its header was taken ({len(failed)} "
        "buffers were not sent: its send_obj timed out and raised CommTimeoutError); "
        "nothing was received", rank=comm.rank, op="recv", peer=status.source,
        tag=status.tag, timeout=0.0)


def _part(private: CommView, kind: Kind, peer: int, tag: int,
          buf: np.ndarray[Any, Any], timeout: float | None) -> Request:
    """Post one buffer of a committed object on the private context: a send with the time
    its ``send_obj`` has left, if any (Rule 3); a recv with none, not even
    ``ASYNCCOMM_TIMEOUT``, as for any recv that matched (its header)."""
    return _post(private, kind, peer, tag, buf, "|u1", timeout)


def _post(private: CommView, kind: Kind, peer: int, tag: int, buf: np.ndarray[Any, Any],
          dtype: str, timeout: float | None = None) -> Request:
    """Post one op of an object's protocol on the private context.

    Raises:
        CommClosedError: this rank's communicator closed after the object's header was
            done (nothing is posted: no peer could ever complete it).
    """
    engine = private._engine
    if engine.closed:
        raise CommClosedError(f"rank {engine.rank}'s communicator was closed with an object "
                              "in flight", rank=engine.rank)
    req = Request(engine, kind, peer, tag, None, buf.nbytes, buf.size, dtype,
                  engine.default_stream, timeout, buf)
    engine.default_stream._submit(req)
    return req


async def _committed(reqs: list[Request]) -> None:
    """Wait for the buffers of a committed object, whatever their outcome (the caller
    reads them): a cancellation waits until they are done and is delivered at the task's
    next await (Rule 3)."""
    try:
        await settle(reqs)
    except asyncio.CancelledError as exc:
        await settle(reqs, shield=True)
        defer_cancellation(exc)
