"""Exchanges posted at once: ``batch``, ``ibatch`` and ``sendrecv`` (HcclBatchSendRecv).

Every op of a batch is checked before any is posted, and a recv buffer that shares memory
with another op's buffer (or a pending recv's) is refused, as MPI forbids it.  A batch
whose task is cancelled withdraws the ops that have not matched and waits for the others
(see ``cancel_batch``).  ``sendrecv`` of two plain 1-D arrays posts its pair the fast way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from .._buffers import BufferView, as_recv_buffer, as_send_buffer, memory_owner, overlapping
from .._core.states import Kind
from .._engine.request import Request, defer_cancellation, settle
from .._types import ANY_SOURCE, ANY_TAG, TAG_UB
from .view import CommView

__all__ = ["RecvOp", "SendOp", "batch_op", "cancel_batch", "check_aliasing", "raise_failed",
           "settle_all", "simple_pair"]

SEND: Final = Kind.SEND
RECV: Final = Kind.RECV


@dataclass(frozen=True, slots=True)
class SendOp:
    """A send in ``Communicator.batch`` (like one entry of HcclBatchSendRecv)."""

    buf: Any
    dst: int
    tag: int = 0
    count: int | None = None
    dtype: Any = None


@dataclass(frozen=True, slots=True)
class RecvOp:
    """A recv in ``Communicator.batch``."""

    buf: Any
    src: int = ANY_SOURCE
    tag: int = ANY_TAG
    count: int | None = None
    dtype: Any = None


def _shape_of(buf: object, count: object, dtype: object) -> tuple[int, ...] | None:
    """The shape a send of ``buf`` tells its receiver, if it is not the flat ``(count,)``:
    that of a whole numpy array that is not 1-D."""
    if count is None and dtype is None and isinstance(buf, np.ndarray) and buf.ndim != 1:
        return tuple(int(d) for d in buf.shape)
    return None


def simple_pair(comm: CommView, sendbuf: Any, dst: Any, sendtag: Any, recvbuf: Any, src: Any,
                 recvtag: Any) -> bool:
    """A sendrecv of 1-D contiguous arrays of known dtypes (the recv's writeable) and
    plain ranks and tags, whose buffers share no memory: nothing the checks of ``batch``
    would refuse."""
    size = comm.size
    inspect = comm._engine.inspect
    if not (type(dst) is int and 0 <= dst < size and type(src) is int
            and (0 <= src < size or src == ANY_SOURCE)
            and type(sendtag) is int and 0 <= sendtag <= TAG_UB
            and type(recvtag) is int and (0 <= recvtag <= TAG_UB or recvtag == ANY_TAG)
            and inspect(sendbuf, False) is not None and inspect(recvbuf, True) is not None):
        return False
    if sendbuf.base is None and recvbuf.base is None:  # (both arrays: inspect said so)
        return sendbuf is not recvbuf  # each owns its memory
    return memory_owner(sendbuf) is not memory_owner(recvbuf)


async def settle_all(comm: CommView, reqs: list[Request]) -> None:
    """Wait until every op of a batch finished; if the task is cancelled meanwhile,
    withdraw what has not matched (``cancel_batch``)."""
    try:
        await settle(reqs)
    except asyncio.CancelledError as exc:
        await cancel_batch(comm, reqs, exc)


def raise_failed(comm: CommView, reqs: list[Request]) -> None:
    """Raise the error of the one op of a finished batch that failed, or a group of
    them if several did."""
    failed = [r.exception() for r in reqs if r.exception() is not None]
    if len(failed) == 1:
        raise failed[0]  # type: ignore[misc]
    if failed:
        raise ExceptionGroup(f"rank {comm.rank}: {len(failed)} ops of a batch failed",
                             failed)  # type: ignore[type-var]


async def cancel_batch(comm: CommView, reqs: list[Request],
                       exc: asyncio.CancelledError) -> None:
    """A batch's task was cancelled: withdraw the ops that have not matched and wait for
    the others.  If none was withdrawn the batch completed, and the cancellation waits
    for the task's next await; otherwise it is raised, with a note naming the ops that
    completed all the same (their messages went, or arrived)."""
    engine = comm._engine
    for r in reqs:
        engine.withdraw(r, None)
    await settle(reqs, shield=True)
    if not any(r.cancelled() for r in reqs):
        defer_cancellation(exc)
        return
    done = [f"{i} ({r.kind.value}, {'failed' if r.exception() else 'done'})"
            for i, r in enumerate(reqs) if not r.cancelled()]
    if done:
        exc.add_note(f"rank {comm.rank}: batch cancelled; ops {', '.join(done)} "
                     "had matched and finished all the same, the others were withdrawn")
    raise exc


def check_aliasing(comm: CommView, reqs: list[Request], views: list[BufferView]) -> None:
    """Refuse a batch in which a recv buffer shares memory with another op's buffer, or
    with a pending recv's (MPI forbids it: the data would be corrupted).

    Raises:
        ValueError: the buffers overlap (nothing is posted).
    """
    recvs = [(r, v) for r, v in zip(reqs, views, strict=True) if r.kind is RECV]
    if recvs and len(reqs) > 1:
        clash = overlapping([v.mv for v in views], [r.kind is RECV for r in reqs])
        if clash is not None:
            i, j = clash
            raise ValueError(f"ops {i} ({reqs[i].kind.value}) and {j} "
                             f"({reqs[j].kind.value}) of the batch share buffer memory: a "
                             "recv would write what the other op reads or writes; use "
                             "separate buffers")
    if comm._engine._pending_recvs:
        for _, view in recvs:
            comm._engine.check_recv_buffer(view.mv, view.nbytes)


def batch_op(comm: CommView, op: object, stream: object,
              timeout: object) -> tuple[Request, BufferView]:
    if isinstance(op, SendOp):
        view = as_send_buffer(op.buf, op.count, op.dtype)
        req = comm._make(SEND, view, op.dst, op.tag, stream, timeout)
        req.shape = _shape_of(op.buf, op.count, op.dtype)
        return req, view
    if isinstance(op, RecvOp):
        view = as_recv_buffer(op.buf, op.count, op.dtype)
        return comm._make(RECV, view, op.src, op.tag, stream, timeout), view
    raise TypeError(f"batch takes SendOp and RecvOp items, got {type(op).__name__}")
