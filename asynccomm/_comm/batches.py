"""Exchanges posted at once: ``batch``, ``ibatch`` and ``sendrecv`` (HcclBatchSendRecv).

Every op of a batch is checked before any is posted, and a recv buffer that shares memory
with another op's buffer (or a pending recv's) is refused, as MPI forbids it.  A batch
whose task is cancelled withdraws the ops that have not matched and waits for the others
(see ``_cancel_batch``).  ``sendrecv`` of two plain 1-D arrays posts its pair the fast way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from .._buffers import BufferView, as_recv_buffer, as_send_buffer, memory_owner, overlapping
from .._core.states import DONE, Kind
from .._engine.lane import LANE as _LANE
from .._engine.lane import inspect
from .._engine.request import Request, defer_cancellation, settle, wait_all
from .._types import ANY_SOURCE, ANY_TAG, TAG_UB, Status

if TYPE_CHECKING:
    from .._engine.engine import DeviceEngine
    from .._engine.stream import Stream

__all__ = ["BatchesMixin", "RecvOp", "SendOp"]

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


class BatchesMixin:
    """``sendrecv``, ``batch`` and ``ibatch`` (see the module docs)."""

    if not TYPE_CHECKING:  # (mypy would refuse the fields the class that mixes it in lists)
        __slots__ = ()  # that class lists the fields

    rank: int
    size: int
    _engine: DeviceEngine

    if TYPE_CHECKING:
        def _check_ready(self) -> None: ...
        def _make(self, kind: Kind, buf: BufferView | None, peer: object, tag: object,
                  stream: object, timeout: object) -> Request: ...
        def _send_op(self, buf: Any, dst: Any, tag: Any, stream: Any, timeout: Any,
                     count: Any, dtype: Any, handle: bool) -> Request | None: ...
        def _recv_op(self, buf: Any, src: Any, tag: Any, stream: Any, timeout: Any,
                     count: Any, dtype: Any, handle: bool) -> Request | Status: ...

    async def sendrecv(self, sendbuf: Any, dst: int, recvbuf: Any, src: int = ANY_SOURCE, *,
                       sendtag: int = 0, recvtag: int = ANY_TAG,
                       stream: Stream | None = None, timeout: float | None = None) -> Status:
        """Send to ``dst`` and receive from ``src`` at once, without deadlock.

        Returns:
            The recv's Status.

        Raises:
            As ``batch``.
        """
        if stream is None and self._simple_pair(sendbuf, dst, sendtag, recvbuf, src, recvtag):
            # Every check batch makes holds already: post the two at once the fast way (the
            # C lane's, where it takes them, else the Python steps').
            lane = _LANE if timeout is None else None
            posted = None if lane is None else lane.recv(self, recvbuf, src, recvtag, True)
            # (No ``cast``: a call, where this runs per message.)
            recv: Request = posted if posted is not None else self._recv_op(  # type: ignore[assignment]
                recvbuf, src, recvtag, None, timeout, None, None, True)
            went = False if lane is None else lane.send(self, sendbuf, dst, sendtag, True)
            send: Request = went if went is not False else self._send_op(  # type: ignore[assignment]
                sendbuf, dst, sendtag, None, timeout, None, None, True)
            reqs = [send, recv]
            if recv._state is not DONE and send._state is DONE and recv._waiters is None:
                # The commonest wait (an eager send is done): on the recv alone, as
                # ``Communicator.recv`` waits, one generator fewer than ``settle``.
                fut = self._engine.loop.create_future()
                recv._waiters = [fut]
                try:
                    await fut
                except asyncio.CancelledError as exc:
                    recv._discard_waiter(fut)
                    await self._cancel_batch(reqs, exc)
            if not (recv._state is DONE and send._state is DONE):
                await self._settle(reqs)
            if send._exc is not None or recv._exc is not None:
                self._raise_failed(reqs)
            return recv._outcome()  # type: ignore[no-any-return]
        results = await self.batch([SendOp(sendbuf, dst, sendtag), RecvOp(recvbuf, src, recvtag)],
                                   stream=stream, timeout=timeout)
        status = results[1]
        assert status is not None
        return status

    def _simple_pair(self, sendbuf: Any, dst: Any, sendtag: Any, recvbuf: Any, src: Any,
                     recvtag: Any) -> bool:
        """A sendrecv of 1-D contiguous arrays of known dtypes (the recv's writeable) and
        plain ranks and tags, whose buffers share no memory: nothing the checks of ``batch``
        would refuse."""
        size = self.size
        if not (type(dst) is int and 0 <= dst < size and type(src) is int
                and (0 <= src < size or src == ANY_SOURCE)
                and type(sendtag) is int and 0 <= sendtag <= TAG_UB
                and type(recvtag) is int and (0 <= recvtag <= TAG_UB or recvtag == ANY_TAG)
                and inspect(sendbuf, False) is not None and inspect(recvbuf, True) is not None):
            return False
        if sendbuf.base is None and recvbuf.base is None:  # (both arrays: inspect said so)
            return sendbuf is not recvbuf  # each owns its memory
        return memory_owner(sendbuf) is not memory_owner(recvbuf)

    async def batch(self, ops: Sequence[SendOp | RecvOp], *, stream: Stream | None = None,
                    timeout: float | None = None) -> list[Status | None]:
        """Post every op at once (HcclBatchSendRecv) and wait for all: exchanges that cannot
        deadlock.  Every op is checked before any is posted.

        Returns:
            One result per op, in order: ``None`` for a send, a ``Status`` for a recv.

        Raises:
            TypeError, ValueError, RuntimeError, CommClosedError: as ``isend``.
            Exception: the error of the one op that failed, once all are done, or an
                ``ExceptionGroup`` if several failed.
        """
        reqs = self.ibatch(ops, stream=stream, timeout=timeout)
        if not reqs:
            return []
        await self._settle(reqs)
        self._raise_failed(reqs)
        return await wait_all(reqs)

    def ibatch(self, ops: Sequence[SendOp | RecvOp], *, stream: Stream | None = None,
               timeout: float | None = None) -> list[Request]:
        """Post every op at once, as ``batch`` does, and return their requests without
        waiting (torch's ``batch_isend_irecv``): ``await ac.wait_all(reqs)``.

        Raises:
            TypeError, ValueError, RuntimeError, CommClosedError: as ``batch`` (every op is
                checked before any is posted).
        """
        self._check_ready()
        made = [self._batch_op(op, stream, timeout) for op in ops]
        reqs = [r for r, _ in made]
        if reqs:
            self._check_aliasing(reqs, [v for _, v in made])
            reqs[0].stream._submit(reqs)  # type: ignore[union-attr]
        return reqs

    async def _settle(self, reqs: list[Request]) -> None:
        """Wait until every op of a batch finished; if the task is cancelled meanwhile,
        withdraw what has not matched (``_cancel_batch``)."""
        try:
            await settle(reqs)
        except asyncio.CancelledError as exc:
            await self._cancel_batch(reqs, exc)

    def _raise_failed(self, reqs: list[Request]) -> None:
        """Raise the error of the one op of a finished batch that failed, or a group of
        them if several did."""
        failed = [r.exception() for r in reqs if r.exception() is not None]
        if len(failed) == 1:
            raise failed[0]  # type: ignore[misc]
        if failed:
            raise ExceptionGroup(f"rank {self.rank}: {len(failed)} ops of a batch failed",
                                 failed)  # type: ignore[type-var]

    async def _cancel_batch(self, reqs: list[Request], exc: asyncio.CancelledError) -> None:
        """A batch's task was cancelled: withdraw the ops that have not matched and wait for
        the others.  If none was withdrawn the batch completed, and the cancellation waits
        for the task's next await; otherwise it is raised, with a note naming the ops that
        completed all the same (their messages went, or arrived)."""
        engine = self._engine
        for r in reqs:
            engine.withdraw(r, None)
        await settle(reqs, shield=True)
        if not any(r.cancelled() for r in reqs):
            defer_cancellation(exc)
            return
        done = [f"{i} ({r.kind.value}, {'failed' if r.exception() else 'done'})"
                for i, r in enumerate(reqs) if not r.cancelled()]
        if done:
            exc.add_note(f"rank {self.rank}: batch cancelled; ops {', '.join(done)} "
                         "had matched and finished all the same, the others were withdrawn")
        raise exc

    def _check_aliasing(self, reqs: list[Request], views: list[BufferView]) -> None:
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
        if self._engine._pending_recvs:
            for _, view in recvs:
                self._engine.check_recv_buffer(view.mv, view.nbytes)

    def _batch_op(self, op: object, stream: object,
                  timeout: object) -> tuple[Request, BufferView]:
        if isinstance(op, SendOp):
            view = as_send_buffer(op.buf, op.count, op.dtype)
            req = self._make(SEND, view, op.dst, op.tag, stream, timeout)
            req.shape = _shape_of(op.buf, op.count, op.dtype)
            return req, view
        if isinstance(op, RecvOp):
            view = as_recv_buffer(op.buf, op.count, op.dtype)
            return self._make(RECV, view, op.src, op.tag, stream, timeout), view
        raise TypeError(f"batch takes SendOp and RecvOp items, got {type(op).__name__}")
