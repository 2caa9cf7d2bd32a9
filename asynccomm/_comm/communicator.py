"""The public communicator: argument checks, then requests handed to the engine.

Every check runs before anything is posted, so a bad call raises ``TypeError`` or
``ValueError`` (or ``RuntimeError`` for the wrong thread or loop, ``CommClosedError`` for a
closed communicator) and leaves the communicator exactly as it was.
"""

from __future__ import annotations

import asyncio
import copy
import math
from asyncio.events import _get_running_loop
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, cast, final

import numpy as np

from .._buffers import BufferView, as_recv_buffer, as_send_buffer
from .._collectives import functions as coll
from .._collectives import scratch as _scratch
from .._collectives.costs import Chooser
from .._collectives.ops import ReduceOp
from .._core.states import DONE, Kind
from .._engine.engine import DeviceEngine
from .._engine.lane import Lane, choose
from .._engine.options import check_timeout
from .._engine.request import Request, TaskRequest, wait_all
from .._engine.steps import finished, offer, probe_found
from .._engine.stream import Stream, idle
from .._engine.summary import measured_records, rank_summary
from .._engine.take import post_now, take_now
from .._engine.traced import recv_traced, send_traced
from .._exceptions import CommClosedError
from .._types import ANY_SOURCE, ANY_TAG, TAG_UB, Status
from ..sim.device import Device
from . import batches as _batches
from . import faults as _faults
from . import groups as _groups
from . import native as _native
from . import objects as _objects
from .batches import RecvOp, SendOp, _shape_of
from .calls import Call
from .collective_api import Op, collective
from .groups import _BLOCKS, _SWEEP_CALLS, OBJECT_TAGS, TAG_SPAN
from .view import CommView, Family

if TYPE_CHECKING:
    from .._engine.engine import DeviceEngine, EngineStatistics
    from ..sim.records import OpRecord, RankSummary

__all__ = ["Communicator"]

SEND: Final = Kind.SEND
RECV: Final = Kind.RECV


@final
class Communicator:
    """One rank's endpoint: point-to-point operations with the other ranks of its world
    (or of a sub-communicator: ``split``, ``dup``), and collectives over them.

    Instances are created by ``open_world``/``run`` (and ``split``/``dup``), not directly.

    Attributes:
        rank: this rank, 0 .. size - 1.
        size: the number of ranks.
        device: this rank's device (``device.name``; on a cluster world its compute rate
            ``flops`` and memory, with ``device.alloc``/``free``).
    """

    # Slots: the C lane (``_lane.c``) reads these at their offsets, once per message.
    __slots__ = ("_after_close", "_before_wait", "_children", "_chooser", "_dead",
                 "_default_timeout", "_engine", "_family", "_lane_recv", "_lane_send",
                 "_lingering", "_loop", "_obj_seq", "_parent", "_private_comm", "_seq",
                 "_tag_block", "device", "rank", "size")

    def __init__(self, engine: DeviceEngine, *, default_timeout: float | None,
                 device: Device, family: Family) -> None:
        self._engine = engine
        self._loop = engine.loop
        #: The C lane's entry points in a world on the C lane (its engine's lane), else
        #: None: ``send`` and ``recv`` try them first for the commonest op, and take the
        #: Python steps when they say "not handled".
        self._lane_send = engine.lane.send
        self._lane_recv = engine.lane.recv
        #: What an op not done calls before it waits (``Link.before_wait``).
        self._before_wait = getattr(engine.link, "before_wait", None)
        self._default_timeout = default_timeout
        self.rank: int = engine.rank
        self.size: int = engine.size
        self.device = device
        self._family = family
        self._children: set[Communicator] = set()  # open sub-communicators
        self._private_comm: Communicator | None = None  # made on first use in-process
        self._seq = 0  # split and dup calls so far
        self._tag_block = 0  # the next collective call's block of tags
        self._parent: Communicator | None = None
        self._after_close: Callable[[], Awaitable[None]] | None = None  # the link's goodbyes
        self._lingering: set[asyncio.Future[Any]] = set()  # closes still saying goodbye
        self._obj_seq = 0  # objects sent so far (their buffers' tags)
        self._chooser: Chooser | None = None  # the collectives' algorithm chooser
        self._dead: dict[int, int] = {}  # blocks left unfinished here: calls left to sweep

    def __repr__(self) -> str:
        return f"<Communicator rank={self.rank} size={self.size}>"

    # -- checks ---------------------------------------------------------------------------

    def _check_ready(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(f"rank {self.rank}'s communicator was called outside its event "
                               "loop (from another thread?); call it from the loop that "
                               "opened its world") from None
        if loop is not self._loop:
            raise RuntimeError(f"rank {self.rank}'s communicator belongs to another event loop")
        if self._engine.closed:
            raise CommClosedError(f"rank {self.rank}'s communicator is closed", rank=self.rank)
        if self._engine.revoked is not None:
            raise copy.copy(self._engine.revoked)

    def _check_rank(self, peer: object, what: str, *, wildcard: bool) -> int:
        if type(peer) is int and 0 <= peer < self.size:
            return peer
        if type(peer) is bool or not isinstance(peer, int | np.integer):
            raise TypeError(f"{what} must be an int rank, got {type(peer).__name__}")
        p = int(peer)
        if 0 <= p < self.size or (wildcard and p == ANY_SOURCE):
            return p
        if p == ANY_SOURCE:
            raise ValueError(f"{what}=ANY_SOURCE is only allowed on receives")
        raise ValueError(f"{what}={p} is out of range for a world of size {self.size}")

    def _check_tag(self, tag: object, *, wildcard: bool) -> int:
        if type(tag) is int and 0 <= tag <= TAG_UB:
            return tag
        if type(tag) is bool or not isinstance(tag, int | np.integer):
            raise TypeError(f"tag must be an int, got {type(tag).__name__}")
        t = int(tag)
        if 0 <= t <= TAG_UB or (wildcard and t == ANY_TAG):
            return t
        if t == ANY_TAG:
            raise ValueError("tag=ANY_TAG is only allowed on receives")
        raise ValueError(f"tag={t} is out of range 0..{TAG_UB}")

    def _check_stream(self, stream: object) -> Stream:
        if stream is None:
            return self._engine.default_stream
        if not isinstance(stream, Stream):
            raise TypeError(f"stream must be a Stream or None, got {type(stream).__name__}")
        if stream._owner is not self._engine:
            raise ValueError("the stream belongs to another communicator")
        return stream

    def _timeout(self, timeout: object) -> float | None:
        return self._default_timeout if timeout is None else check_timeout(timeout)

    def _make(self, kind: Kind, buf: BufferView | None, peer: object, tag: object,
              stream: object, timeout: object) -> Request:
        if kind is SEND:
            p = self._check_rank(peer, "dst", wildcard=False)
            t = self._check_tag(tag, wildcard=False)
        else:
            p = self._check_rank(peer, "src", wildcard=True)
            t = self._check_tag(tag, wildcard=True)
        if buf is None:
            return Request(self._engine, kind, p, t, None, -1, 0, None,
                           self._check_stream(stream), self._timeout(timeout))
        return Request(self._engine, kind, p, t, buf.mv, buf.nbytes, buf.count, buf.dtype,
                       self._check_stream(stream), self._timeout(timeout))

    # -- point to point -------------------------------------------------------------------

    def isend(self, buf: Any, dst: int, tag: int = 0, *, stream: Stream | None = None,
              timeout: float | None = None, count: int | None = None,
              dtype: Any = None) -> Request:
        """Post a send and return its request at once.

        The buffer must not change until the request is done.  Messages up to the eager
        limit complete as soon as they are posted; larger ones when a recv has taken them.

        Raises:
            TypeError, ValueError: bad arguments (nothing is posted).
            RuntimeError: called from another thread or event loop.
            CommClosedError: this communicator is closed.
        """
        if (count is None and dtype is None and (lane := self._lane_send) is not None
                and (req := lane(self, buf, dst, tag, True, stream, timeout)) is not False):
            return req  # type: ignore[no-any-return]  # the C lane did it all
        return self._send_op(buf, dst, tag, stream, timeout, count, dtype, True)  # type: ignore[return-value]

    def irecv(self, buf: Any, src: int = ANY_SOURCE, tag: int = ANY_TAG, *,
              stream: Stream | None = None, timeout: float | None = None,
              count: int | None = None, dtype: Any = None) -> Request:
        """Post a recv into ``buf`` and return its request at once; awaiting it gives the
        ``Status``.

        Raises:
            TypeError, ValueError, RuntimeError, CommClosedError: as ``isend``.
        """
        if (count is None and dtype is None and (lane := self._lane_recv) is not None
                and (req := lane(self, buf, src, tag, True, stream, timeout)) is not None):
            return req  # type: ignore[no-any-return]  # the C lane: taken or posted
        return self._recv_op(buf, src, tag, stream, timeout, count, dtype, True)  # type: ignore[return-value]

    async def send(self, buf: Any, dst: int, tag: int = 0, *, stream: Stream | None = None,
                   timeout: float | None = None, count: int | None = None,
                   dtype: Any = None) -> None:
        """Send ``buf`` to rank ``dst`` with ``tag``; return when the buffer may be reused.

        Raises:
            TypeError, ValueError: bad arguments (nothing is posted).
            RuntimeError: called from another thread or event loop.
            CommClosedError: this communicator is closed.
            CommBrokenError: ``dst`` closed or failed.
            CommTimeoutError: no recv took the message within ``timeout`` (withdrawn).
                An eager message (up to the eager limit) completes as soon as it is
                staged, so only larger messages, or ops held on their stream, time out.
        """
        req = (lane(self, buf, dst, tag, False, stream, timeout)
               if (count is None and dtype is None
                   and (lane := self._lane_send) is not None) else False)
        if req is True:
            return  # the C lane did it all (the commonest case)
        if req is False:  # (else the C lane posted it: a send to another process)
            req = self._send_op(buf, dst, tag, stream, timeout, count, dtype, False)
        if req is not None and (req._state is not DONE or req._exc is not None):
            await req  # (the link may poll for it a while first: ``Link.before_wait``)

    async def recv(self, buf: Any, src: int = ANY_SOURCE, tag: int = ANY_TAG, *,
                   stream: Stream | None = None, timeout: float | None = None,
                   count: int | None = None, dtype: Any = None) -> Status:
        """Receive a message from ``src`` with ``tag`` (wildcards allowed) into ``buf``.

        A shorter message is fine (``Status.count`` says how much arrived).

        Raises:
            TypeError, ValueError, RuntimeError, CommClosedError: as ``isend``.
            TruncationError: the message is larger than ``buf`` (buffer untouched, message
                kept for the next recv).
            DTypeMismatchError: the message has another dtype (likewise).
            CommBrokenError: ``src`` closed or failed.
            CommTimeoutError: nothing matched within ``timeout`` (withdrawn).
        """
        out = (lane(self, buf, src, tag, False, stream, timeout)  # the C lane's, where it fits
               if (count is None and dtype is None
                   and (lane := self._lane_recv) is not None) else None)
        if out is None:
            out = self._recv_op(buf, src, tag, stream, timeout, count, dtype, False)
        if type(out) is Status:
            return out
        req: Request = out  # type: ignore[assignment]  # (a Status returned above)
        if req._state is not DONE and (look := self._before_wait) is not None:
            look(req)  # (the link looks once more: the message may have come meanwhile)
        if req._state is not DONE and req._waiters is None:
            # What ``await req`` does, one generator fewer: this is the hot path.
            fut = self._loop.create_future()
            req._waiters = [fut]
            try:
                await fut
            except asyncio.CancelledError as exc:
                req._discard_waiter(fut)
                return await req._after_cancel(exc)  # type: ignore[no-any-return]
        if req._state is DONE and req._exc is None:
            return req._result  # type: ignore[no-any-return]
        result: Status = await req
        return result

    # The two below run once per message: the checks are inlined for the common case and
    # fall back to the helpers, which say exactly what is wrong.  The fast lane (an
    # in-process world without a model, the default stream, a numpy buffer) hands a small
    # message straight to a recv waiting at its destination, or to its staging pool, and a
    # recv takes a message already waiting, with no request at all when none is asked for.

    def _send_op(self, buf: Any, dst: Any, tag: Any, stream: Any, timeout: Any, count: Any,
                 dtype: Any, handle: bool) -> Request | None:
        engine = self._engine
        if _get_running_loop() is not self._loop or engine.closed:
            self._check_ready()
        if type(dst) is not int or not 0 <= dst < self.size:
            dst = self._check_rank(dst, "dst", wildcard=False)
        if type(tag) is not int or not 0 <= tag <= TAG_UB:
            tag = self._check_tag(tag, wildcard=False)
        if count is None and dtype is None and (info := engine.inspect(buf, False)) is not None:
            name, nbytes, n = info  # a 1-D array: copies to and from it are numpy's
            arr, mv = buf, None
        else:
            arr = None
            view = as_send_buffer(buf, count, dtype)
            mv, nbytes, n, name = view.mv, view.nbytes, view.count, view.dtype
        timeout = self._default_timeout if timeout is None else check_timeout(timeout)
        if (engine.fast and arr is not None
                and (not engine.default_stream._queue if stream is None else idle(stream, engine))
                and (offer(peers[dst], self.rank, tag, arr, nbytes, n, name)
                     if (peers := engine.peers) is not None
                     else engine.link.send_now(dst, tag, arr, nbytes, n, name))):
            if stream is not None:  # (done as posted: never tracked, as Stream._submit does)
                return finished(engine, Request(engine, SEND, dst, tag, None, nbytes, n, name,
                                                stream, timeout, arr), None)
            if not handle:
                t = engine.now()  # FlightRecorder.add, inlined (done as posted)
                (flight := engine.flight).ring.append((0, dst, tag, nbytes, 0, 0, t, t, t))
                tally = flight.sends[dst]
                tally.n += 1
                tally.nbytes += nbytes
                return None
            return finished(engine, Request(engine, SEND, dst, tag, None, nbytes, n, name,
                                            engine.default_stream, timeout, arr), None)
        if (engine.traced and arr is not None and stream is None
                and not engine.default_stream._queue and (done := send_traced(
                    engine, dst, tag, arr, nbytes, n, name, handle, timeout)) is not False):
            return done
        req = Request(engine, SEND, dst, tag, mv, nbytes, n, name,
                      engine.default_stream if stream is None else self._check_stream(stream),
                      timeout, arr)
        if arr is None:
            req.shape = _shape_of(buf, count, dtype)
        req.stream._submit(req)  # type: ignore[union-attr]
        return req

    def _recv_op(self, buf: Any, src: Any, tag: Any, stream: Any, timeout: Any, count: Any,
                 dtype: Any, handle: bool) -> Request | Status:
        engine = self._engine
        if _get_running_loop() is not self._loop or engine.closed:
            self._check_ready()
        if type(src) is not int or not 0 <= src < self.size:
            src = self._check_rank(src, "src", wildcard=True)
        if type(tag) is not int or not 0 <= tag <= TAG_UB:
            tag = self._check_tag(tag, wildcard=True)
        if count is None and dtype is None and (info := engine.inspect(buf, True)) is not None:
            name, nbytes, n = info
            arr, mv = buf, None
        else:
            arr = None
            view = as_recv_buffer(buf, count, dtype)
            mv, nbytes, n, name = view.mv, view.nbytes, view.count, view.dtype
        timeout = self._default_timeout if timeout is None else check_timeout(timeout)
        if engine._pending_recvs:
            engine.check_recv_buffer(buf if mv is None else mv, nbytes)
        if (stream is not None and engine.fast and arr is not None and idle(stream, engine)
                and (status := take_now(engine, src, tag, arr, nbytes, name)) is not None):
            # (a message was waiting: done as posted)
            return finished(engine, Request(engine, RECV, src, tag, None, nbytes, n, name,
                                            stream, timeout, arr), status, engine.taken_at)
        if (engine.fast and arr is not None and stream is None
                and not engine.default_stream._queue):
            status = take_now(engine, src, tag, arr, nbytes, name)
            if status is not None:
                if not handle:
                    t = engine.now()  # FlightRecorder.add, inlined (done as posted)
                    t0 = engine.taken_at  # a timed copy's start
                    if t0 < 0:
                        t0 = t
                    source = status[0]  # what arrived (a wildcard's is the message's)
                    (flight := engine.flight).ring.append(
                        (1, source, status[1], status.nbytes, 0, 0, t0, t0, t))
                    tally = flight.recvs[source]
                    tally.n += 1
                    tally.nbytes += status.nbytes
                    tally.c += t - t0
                    return status
                return finished(engine, Request(engine, RECV, src, tag, None, nbytes, n,
                                                name, engine.default_stream, timeout, arr),
                                        status, engine.taken_at)
            req = Request(engine, RECV, src, tag, None, nbytes, n, name,
                          engine.default_stream, timeout, arr)
            post_now(engine, req)
            return req
        if (engine.traced and arr is not None and stream is None
                and not engine.default_stream._queue):
            return recv_traced(engine, src, tag, arr, nbytes, n, name, handle, timeout)
        req = Request(engine, RECV, src, tag, mv, nbytes, n, name,
                      engine.default_stream if stream is None else self._check_stream(stream),
                      timeout, arr)
        req.stream._submit(req)  # type: ignore[union-attr]
        return req

    async def recv_new(self, src: int = ANY_SOURCE, tag: int = ANY_TAG, *,
                       stream: Stream | None = None,
                       timeout: float | None = None) -> tuple[np.ndarray[Any, Any], Status]:
        """Receive a message of unknown size into a new array of the sender's dtype and
        shape (``Status.shape``).

        Raises:
            TypeError, ValueError, RuntimeError, CommClosedError, CommBrokenError,
            CommTimeoutError: as ``recv``.
        """
        self._check_ready()
        req = self._make(RECV, None, src, tag, stream, timeout)
        req.stream._submit(req)  # type: ignore[union-attr]
        arr, status = await req
        if arr.shape != status.shape:
            arr = arr.reshape(status.shape)
        return arr, status

    # -- exchanges that cannot deadlock (see batches) --------------------------------------

    async def sendrecv(self, sendbuf: Any, dst: int, recvbuf: Any, src: int = ANY_SOURCE, *,
                       sendtag: int = 0, recvtag: int = ANY_TAG,
                       stream: Stream | None = None, timeout: float | None = None) -> Status:
        """Send to ``dst`` and receive from ``src`` at once, without deadlock.

        Returns:
            The recv's Status.

        Raises:
            As ``batch``.
        """
        if stream is None and _batches.simple_pair(self, sendbuf, dst, sendtag, recvbuf, src,
                                                   recvtag):
            # Every check batch makes holds already: post the two at once the fast way (the
            # C lane's, where it takes them, else the Python steps').
            lane = self._lane_recv
            posted = None if lane is None else lane(self, recvbuf, src, recvtag, True, None,
                                                    timeout)
            # (No ``cast``: a call, where this runs per message.)
            recv: Request = posted if posted is not None else self._recv_op(  # type: ignore[assignment]
                recvbuf, src, recvtag, None, timeout, None, None, True)
            lane = self._lane_send
            went = False if lane is None else lane(self, sendbuf, dst, sendtag, True, None,
                                                   timeout)
            send: Request = went if went is not False else self._send_op(  # type: ignore[assignment]
                sendbuf, dst, sendtag, None, timeout, None, None, True)
            reqs = [send, recv]
            if recv._state is not DONE and (look := self._before_wait) is not None:
                look(recv)  # (as ``recv``)
            if recv._state is not DONE and send._state is DONE and recv._waiters is None:
                # The commonest wait (an eager send is done): on the recv alone, as
                # ``Communicator.recv`` waits, one generator fewer than ``settle``.
                fut = self._engine.loop.create_future()
                recv._waiters = [fut]
                try:
                    await fut
                except asyncio.CancelledError as exc:
                    recv._discard_waiter(fut)
                    await _batches.cancel_batch(self, reqs, exc)
            if not (recv._state is DONE and send._state is DONE):
                await _batches.settle_all(self, reqs)
            if send._exc is not None or recv._exc is not None:
                _batches.raise_failed(self, reqs)
            return recv._outcome()  # type: ignore[no-any-return]
        results = await self.batch([SendOp(sendbuf, dst, sendtag), RecvOp(recvbuf, src, recvtag)],
                                   stream=stream, timeout=timeout)
        status = results[1]
        assert status is not None
        return status

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
        await _batches.settle_all(self, reqs)
        _batches.raise_failed(self, reqs)
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
        made = [_batches.batch_op(self, op, stream, timeout) for op in ops]
        reqs = [r for r, _ in made]
        if reqs:
            _batches.check_aliasing(self, reqs, [v for _, v in made])
            reqs[0].stream._submit(reqs)  # type: ignore[union-attr]
        return reqs

    # -- compute --------------------------------------------------------------------------

    async def compute(self, seconds: float | None = None, flops: float | None = None, *,
                      stream: Stream | None = None) -> None:
        """Run a simulated compute task on this rank's device: it occupies the device's
        compute stream (one task at a time, in order) for ``seconds`` of model time, or for
        ``flops`` at the device's compute rate.  Communication overlaps it only when the
        program issues both concurrently (an isend before it, or another task).

        On an explicit stream the task is ordered with that stream's other operations.

        Raises:
            TypeError, ValueError: neither or both of ``seconds``/``flops``, a negative or
                non-finite amount, ``flops`` without a device compute rate.
            RuntimeError, CommClosedError: as ``isend``.
        """
        self._check_ready()
        duration = self._compute_seconds(seconds, flops)
        req = Request(self._engine, Kind.COMPUTE, self.rank, 0, None, 0, 0, None,
                      self._check_stream(stream), None)
        req.duration_ns = round(duration * 1e9)  # model nanoseconds
        req.stream._submit(req)  # type: ignore[union-attr]
        if req._state is not DONE:
            await req

    def _compute_seconds(self, seconds: object, flops: object) -> float:
        if (seconds is None) == (flops is None):
            raise TypeError("compute() takes exactly one of seconds= or flops=")
        amount = seconds if seconds is not None else flops
        name = "seconds" if seconds is not None else "flops"
        if type(amount) is bool or not isinstance(amount, int | float):
            raise TypeError(f"{name} must be a number, got {type(amount).__name__}")
        if not (math.isfinite(amount) and amount >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {amount}")
        if seconds is not None:
            return float(amount)
        if not self.device.flops:
            raise ValueError(f"compute(flops=...) needs a device compute rate; {self.device.name}"
                             " has none (open the world with a cluster, or pass seconds=)")
        return float(amount) / self.device.flops

    def summary(self) -> RankSummary:
        """This rank's totals on every world: ops, bytes sent and received, time waiting
        (post to match) and copying (match to finish), per peer (``peers``).  With a
        cluster model it adds the modelled figures: link busy time, compute time, and how
        much communication was hidden behind compute (``modelled`` is then True)."""
        return rank_summary(self._engine)

    def records(self) -> list[OpRecord]:
        """This rank's completed ops' records so far, in completion order: modelled (start,
        end, bytes, chunks, mode) with a cluster model; elsewhere measured from the flight
        recorder (its last ``ASYNCCOMM_FLIGHT`` ops, seconds since the world opened,
        ``mode="measured"``)."""
        records = self._engine.records
        if records is not None:
            return list(records)

        return measured_records(self._engine)

    def flight_record(self) -> list[dict[str, Any]]:
        """This rank's last ops (``ASYNCCOMM_FLIGHT``, default 1024), oldest first, then its
        pending ones: dicts with ``op``, ``peer``, ``tag``, ``nbytes``, ``stream``,
        ``state`` (done, cancelled, timed out, failed; pending: queued, posted, matched)
        and the ``post``, ``match`` and ``finish`` times (seconds since the world opened,
        model time on the virtual clock; None where unknown).  Always on.  The pending
        ones include the buffers of objects in flight (on the private context, each on its
        object's own tag, from ``OBJECT_TAGS``)."""
        engine = self._engine
        pending = engine.live_requests()
        private = self._private_comm
        if private is not None:
            pending += [r for r in private._engine.live_requests() if r.tag >= OBJECT_TAGS]
        return engine.flight.dicts(self.rank, pending)

    def model_time(self) -> float:
        """Model seconds since the world opened: the virtual clock, or wall time divided
        by the world's ``time_scale``."""
        return self._engine.clock.now()

    # -- probes ---------------------------------------------------------------------------

    def iprobe(self, src: int = ANY_SOURCE, tag: int = ANY_TAG) -> Status | None:
        """The Status of the message a recv(src, tag) would take now, or None; nothing is
        received.

        Raises:
            TypeError, ValueError, RuntimeError, CommClosedError: as ``isend``.
            TransportError: none is here, and the transport failed underneath (nothing
                more can arrive).
        """
        self._check_ready()
        s = self._check_rank(src, "src", wildcard=True)
        t = self._check_tag(tag, wildcard=True)
        return self._engine.probe_now(s, t)

    async def probe(self, src: int = ANY_SOURCE, tag: int = ANY_TAG, *,
                    timeout: float | None = None) -> Status:
        """Wait for a message that a recv(src, tag) would take; nothing is received.

        Raises:
            TypeError, ValueError, RuntimeError, CommClosedError: as ``isend``.
            CommBrokenError: ``src`` closed or failed.
            CommTimeoutError: nothing arrived within ``timeout``.
            TransportError: the transport failed underneath, and nothing fitting is here.
        """
        self._check_ready()
        engine = self._engine
        if engine.fast and engine.tracer is None and not engine.trace and engine.revoked is None:
            s = self._check_rank(src, "src", wildcard=True)
            t = self._check_tag(tag, wildcard=True)
            self._timeout(timeout)  # (refused as a probe posted refuses it)
            msg = engine.matcher.probe(s, t)
            if msg is not None:  # here already: found as it is made, with no request
                return probe_found(engine, s, t, msg)  # type: ignore[arg-type]
        req = self._make(Kind.PROBE, None, src, tag, None, timeout)
        req.stream = None  # a probe waits on no stream
        engine.post_probe(req)
        status: Status = await req
        return status

    # -- groups (see groups): sub-communicators, the private context, tag blocks --------

    def split(self, color: int | None, key: int = 0, *,
              timeout: float | None = None) -> Call[Communicator | None]:
        """A new communicator for the ranks that pass the same ``color``, ranked by
        (``key``, rank here): ``MPI_Comm_split``.  Collective: every rank calls it.

        The ranks agree through rank 0 (``_comm.forming``): the call makes a communicator on
        every rank or on none, and a call that fails on one rank (a bad color, a
        cancellation, a timeout) fails on every rank; the parent keeps working.

        Args:
            color: an int >= 0, or None to join no group (returns None).
            key: orders the ranks of the new communicator (ties keep this one's order).
            timeout: bounds the whole call (None: the default op timeout).

        Raises:
            TypeError, ValueError: a bad color, key or timeout (on this rank; the others
                get ``CommBrokenError`` naming it).
            CommClosedError: this communicator is closed.
            CommBrokenError: another rank left the call or failed, or a rank closed.
            CommTimeoutError: a rank's timeout expired before every rank was ready.
        """
        return cast("Call[Communicator | None]",  # the family makes Communicators
                    _groups.split(self, color, key, timeout=timeout))

    def dup(self, *, timeout: float | None = None) -> Call[Communicator]:
        """A new communicator with the same ranks: messages on it never match this one's.
        Collective: every rank calls it; as ``split``, it succeeds on every rank or none.

        Raises:
            CommClosedError, CommBrokenError, CommTimeoutError: as ``split``.
            TransportError: MPI failed.
        """
        return cast("Call[Communicator]", _groups.dup(self, timeout=timeout))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _next_tags(self) -> int:
        """The tag base of the next collective call on the private context (Rule 3)."""
        block = self._tag_block
        self._tag_block = (block + 1) % _BLOCKS
        if self._dead:
            self._sweep(block)
        return block * TAG_SPAN

    def _left_block(self, tag: int) -> None:
        """The call on the block of ``tag`` left without finishing here (Rule 5): drop the
        messages the other ranks sent it, now and for the next ``_SWEEP_CALLS`` calls."""
        self._dead[tag // TAG_SPAN] = _SWEEP_CALLS
        self._sweep(-1)

    def _sweep(self, reused: int) -> None:
        dead = self._dead
        private = self._private_comm
        if private is not None and not private._engine.closed:
            private._engine.discard_staged(
                lambda tag: tag < OBJECT_TAGS and tag // TAG_SPAN in dead)
        for block in list(dead):
            dead[block] -= 1
            if dead[block] <= 0 or block == reused:
                del dead[block]

    def _private(self) -> Communicator:
        """This communicator's private context (Rule 3)."""
        private = self._private_comm
        if private is None:
            self._family.open_private(self)
            private = self._private_comm
            assert private is not None, "a private context has no private context"
        return private

    def _adopt_private(self, private: CommView) -> None:
        assert isinstance(private, Communicator)
        self._private_comm = private
        private._parent = self  # its close is waited for by this one's

    def _adopt(self, sub: CommView) -> None:
        """``sub`` is a new sub-communicator of this one (closed with it)."""
        assert isinstance(sub, Communicator)
        sub._parent = self
        self._children.add(sub)

    async def _close_children(self) -> None:
        for sub in list(self._children):
            await sub.aclose()
        if self._private_comm is not None:
            await self._private_comm.aclose()

    def _linger(self, task: asyncio.Future[Any]) -> None:
        self._lingering.add(task)
        task.add_done_callback(self._lingering.discard)

    async def _wait_lingering(self) -> None:
        """Wait until the sub-communicators closed here have said goodbye to their peers
        (on MPI: every member closed too); errors there are their own ranks' to report."""
        while self._lingering:
            await asyncio.gather(*list(self._lingering), return_exceptions=True)

    def _orphan(self) -> None:
        if self._parent is not None:
            self._parent._children.discard(self)
            self._parent = None

    async def __aenter__(self) -> Communicator:
        return self

    # -- objects (see objects) ------------------------------------------------------------

    async def send_obj(self, obj: Any, dst: int, tag: int = 0, *,
                       timeout: float | None = None) -> None:
        """Send a picklable object (pickle protocol 5; numpy arrays inside it travel as
        buffers, not through the pickle) to ``dst`` with ``tag``.

        Raises:
            TypeError: the object cannot be pickled; bad arguments (nothing is sent).
            ValueError, RuntimeError, CommClosedError: as ``send``.
            CommBrokenError: as ``send``.
            CommTimeoutError: ``timeout=`` bounds the whole call: before the header was
                taken or staged the object is withdrawn; after, the object is abandoned
                and the receiver's ``recv_obj`` raises ``CommTimeoutError`` too (Rule 3).
        """
        await self.isend_obj(obj, dst, tag, timeout=timeout)

    def isend_obj(self, obj: Any, dst: int, tag: int = 0, *,
                  timeout: float | None = None) -> TaskRequest:
        """Post ``send_obj`` and return its request (await it, or pass it to ``wait_all``).

        Raises:
            TypeError, ValueError, RuntimeError, CommClosedError: as ``send_obj``.
        """
        return _objects.isend_obj(self, obj, dst, tag, timeout=timeout)

    async def recv_obj(self, src: int = ANY_SOURCE, tag: int = ANY_TAG, *,
                       timeout: float | None = None) -> tuple[Any, Status]:
        """Receive an object sent with ``send_obj`` from ``src`` with ``tag`` (wildcards
        allowed).  Unpickling runs code the sender chose: receive only from peers you trust.

        Returns:
            The object and a ``Status`` (``nbytes``: the header's and buffers' bytes;
            ``count`` 1; ``shape`` ``()``).

        Raises:
            TypeError, ValueError, RuntimeError, CommClosedError: as ``recv``.
            DTypeMismatchError: the next fitting message is an array, not an object (it
                waits for an array recv).
            CommBrokenError: as ``recv`` (the sender closed or failed mid-object too).
            CommTimeoutError: ``timeout=`` expired before a header matched, or the sender
                abandoned the object (its own timeout expired after the header went).
            Exception: whatever unpickling raised (the message was taken).
        """
        result: tuple[Any, Status] = await self.irecv_obj(src, tag, timeout=timeout)
        return result

    def irecv_obj(self, src: int = ANY_SOURCE, tag: int = ANY_TAG, *,
                  timeout: float | None = None) -> TaskRequest:
        """Post ``recv_obj`` and return its request; awaiting it gives ``(obj, status)``.

        Raises:
            TypeError, ValueError, RuntimeError, CommClosedError: as ``recv``.
        """
        return _objects.irecv_obj(self, src, tag, timeout=timeout)

    # -- collectives (see collective_api) -------------------------------------------------

    def barrier(self, *, timeout: float | None = None) -> Call[None]:
        """Return once every rank has entered the barrier (dissemination).

        Raises:
            TypeError, ValueError: bad arguments (nothing is sent).
            CommClosedError, CommBrokenError, CommTimeoutError, DeadlockError: as the
                point-to-point ops, with a note naming the collective and this rank;
                ``timeout`` bounds the whole call.
        """
        return collective(self, coll.barrier, None, timeout=timeout)

    def bcast(self, buf: Any, root: int = 0, *, timeout: float | None = None) -> Call[None]:
        """Copy the root's ``buf`` into every rank's ``buf`` (binomial tree).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return collective(self, coll.bcast, None, buf, root, timeout=timeout)

    def reduce(self, sendbuf: Any, recvbuf: Any, op: Op = ReduceOp.SUM, root: int = 0,
               *, timeout: float | None = None) -> Call[None]:
        """Reduce every rank's ``sendbuf`` with ``op`` into the root's ``recvbuf`` (binomial
        tree).  ``recvbuf`` is used at the root only (None elsewhere is fine) and may be
        ``sendbuf`` there (in place).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return collective(self, coll.reduce, None, sendbuf, recvbuf, op, root,
                          timeout=timeout)

    def allreduce(self, sendbuf: Any, recvbuf: Any = None, op: Op = ReduceOp.SUM, *,
                  timeout: float | None = None,
                  algorithm: str | None = None) -> Call[None]:
        """Reduce every rank's ``sendbuf`` with ``op`` into every rank's ``recvbuf`` (None:
        in place, in ``sendbuf``).  Every rank gets the same bits.  Ring for large arrays,
        recursive doubling for small ones, or the ``algorithm`` named (``"ring"``,
        ``"recursive_doubling"``).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return collective(self, coll.allreduce, algorithm, sendbuf, recvbuf, op,
                          timeout=timeout)

    def allgather(self, sendbuf: Any, recvbuf: Any, *,
                  timeout: float | None = None,
                  algorithm: str | None = None) -> Call[None]:
        """Gather every rank's ``sendbuf`` into every rank's ``recvbuf``, of shape
        ``(size, *sendbuf.shape)`` (``algorithm``: ``"ring"`` or ``"bruck"``; None chooses).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return collective(self, coll.allgather, algorithm, sendbuf, recvbuf, timeout=timeout)

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, op: Op = ReduceOp.SUM, *,
                       timeout: float | None = None,
                       algorithm: str | None = None) -> Call[None]:
        """Reduce every rank's ``sendbuf``, of shape ``(size, *recvbuf.shape)``, with
        ``op``; rank i gets row i of the result in ``recvbuf``.

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return collective(self, coll.reduce_scatter, algorithm,
                                sendbuf, recvbuf, op, timeout=timeout)

    def gather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
               timeout: float | None = None,
               algorithm: str | None = None) -> Call[None]:
        """Gather every rank's ``sendbuf`` into the root's ``recvbuf``, of shape
        ``(size, *sendbuf.shape)``; ``recvbuf`` is used at the root only.

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return collective(self, coll.gather, algorithm, sendbuf, recvbuf, root,
                          timeout=timeout)

    def scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                timeout: float | None = None,
                algorithm: str | None = None) -> Call[None]:
        """Send row i of the root's ``sendbuf``, of shape ``(size, *recvbuf.shape)``, to
        rank i's ``recvbuf``; ``sendbuf`` is used at the root only.

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return collective(self, coll.scatter, algorithm, sendbuf, recvbuf, root,
                          timeout=timeout)

    def alltoall(self, sendbuf: Any, recvbuf: Any, *,
                 timeout: float | None = None) -> Call[None]:
        """Send row j of ``sendbuf`` to rank j, which puts it in row i (this rank) of its
        ``recvbuf``; both have shape ``(size, ...)`` (pairwise exchange).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return collective(self, coll.alltoall, None, sendbuf, recvbuf, timeout=timeout)

    # -- faults (see faults): revoke, failure acknowledgement, agree, shrink -------------

    def revoke(self) -> None:
        """Revoke this communicator on every rank (ULFM's ``MPI_Comm_revoke``), at once:
        every op of it that has not matched, pending or posted later, on every rank
        (point-to-point, probes, collectives, objects, ``split``/``dup``), raises
        ``CommRevokedError`` naming this rank.  Matched transfers finish.  Not
        collective: any one rank calls it, typically on catching ``CommBrokenError``, so
        that the others stop waiting too.  Revoking again changes nothing.  ``agree``,
        ``shrink``, ``failed``, ``ack_failed`` and ``aclose`` still work.

        Raises:
            RuntimeError, CommClosedError: as ``isend``.
            NotImplementedError: on an MPI world (in-process worlds and processes only).
        """
        _faults.revoke(self)

    def failed(self) -> tuple[int, ...]:
        """The ranks of this communicator known here to have failed (their end closed:
        their program raised, returned or closed it; or an ``agree`` or ``shrink`` here
        decided they had, which a rank may learn before it sees their end close), sorted.
        It only grows.

        Raises:
            RuntimeError, CommClosedError, NotImplementedError: as ``revoke``.
        """
        return _faults.failed(self)

    def ack_failed(self) -> tuple[int, ...]:
        """Acknowledge every rank ``failed()`` names now (ULFM's ``MPI_Comm_ack_failed``)
        and return the acknowledged ranks, sorted (these and those acknowledged before).

        Raises:
            RuntimeError, CommClosedError, NotImplementedError: as ``revoke``.
        """
        return _faults.ack_failed(self)

    def acked_failed(self) -> tuple[int, ...]:
        """The ranks acknowledged as failed here (``ack_failed``, ``agree``, ``shrink``),
        sorted.  After an ``agree`` or ``shrink`` it is the same on every rank that
        returned from it: the ranks that had failed when it decided.

        Raises:
            RuntimeError, CommClosedError, NotImplementedError: as ``revoke``.
        """
        return _faults.acked_failed(self)

    async def agree(self, flag: int) -> int:
        """A fault-tolerant agreement (ULFM's ``MPI_Comm_agree``): the bitwise AND of
        ``flag`` over the ranks that had not failed when it decided, the same on every
        rank that returns, even when ranks fail during the call.  It decides once every
        rank has called it or failed; on return ``acked_failed()`` is the ranks that had
        failed then (the same on every survivor).  Works on a revoked communicator.
        Every rank makes its ``agree`` and ``shrink`` calls in the same order.

        Raises:
            TypeError, ValueError: ``flag`` is not an int of 64 bits, or another rank's
                call in this place is a ``shrink``.
            RuntimeError, CommClosedError, NotImplementedError: as ``revoke``.
        """
        return await _faults.agree(self, flag)

    async def shrink(self) -> Communicator:
        """A new communicator of the ranks that had not failed (ULFM's
        ``MPI_Comm_shrink``): they agree, as ``agree`` does, on who failed, then every
        survivor gets the same group, ranked in their order here
        (``new.parent_rank(r)``: new rank r's rank here).  Works on a revoked
        communicator; the new one is a sub-communicator of this one (closed with it).

        Raises:
            ValueError: another rank's call in this place is an ``agree``.
            RuntimeError, CommClosedError, NotImplementedError: as ``revoke``.
        """
        return cast("Communicator", await _faults.shrink(self))

    def parent_rank(self, rank: int) -> int:
        """Rank ``rank`` of this communicator in the one it was made from (``shrink``,
        ``split``, ``dup``).

        Raises:
            TypeError, ValueError: a bad rank, or this communicator was made from none
                (a world's), or that one is closed.
        """
        return _faults.parent_rank(self, rank)

    # -- streams and lifetime -------------------------------------------------------------

    def stream(self) -> Stream:
        """A new stream: its operations are posted strictly in order (HCCL semantics).

        Raises:
            RuntimeError, CommClosedError: as ``isend``.
        """
        self._check_ready()
        return self._engine.new_stream()

    @property
    def default_stream(self) -> Stream:
        """The stream used when ``stream=None``: ops are posted as soon as they are made."""
        return self._engine.default_stream

    def statistics(self) -> EngineStatistics:
        """A snapshot of this rank's engine: pending ops, matcher queues, staging pool."""
        return self._engine.statistics()

    @property
    def closed(self) -> bool:
        return self._engine.closed

    async def __aexit__(self, *exc_info: object) -> None:
        """Close; if the block raised, the peers hear that this rank failed, and why."""
        exc = exc_info[1] if len(exc_info) > 1 else None
        if isinstance(exc, BaseException):
            self._mark_failed(exc)
        await self.aclose()

    def _mark_failed(self, exc: BaseException) -> None:
        """This rank failed with ``exc``: its peers, on this communicator, its private
        context and its sub-communicators, hear so when they close."""
        self._engine.failed_with = exc
        for sub in list(self._children):
            sub._mark_failed(exc)
        if self._private_comm is not None:
            self._private_comm._mark_failed(exc)

    async def aclose(self) -> None:
        """Close this rank's communicator: unmatched ops fail with ``CommClosedError``,
        matched transfers finish, peers waiting for this rank get ``CommBrokenError``.
        Idempotent.  Closes its sub-communicators first."""
        await self._close_children()
        await self._engine.aclose()
        parent = self._parent
        self._orphan()
        after, self._after_close = self._after_close, None
        if after is not None:  # the link's goodbyes with the other ranks (on MPI: until
            self._linger(asyncio.ensure_future(after()))  # every member closed too)
        if parent is None:
            await self._wait_lingering()
            _scratch.clear(self.device)  # the world's communicator: its rank's pool goes
        else:  # waited for by the parent's close, not here
            for task in self._lingering:
                parent._linger(task)
            self._lingering.clear()


#: The C lane's entry points (None where it is not built, or does not fit these classes:
#: ``_comm.native``): the communicators of a world on the C lane try them first for the
#: commonest op (``world_lane``), and take the Python steps when they say "not handled".
_lane_send, _lane_recv = _native.configure_lane(Communicator)


def world_lane(native: object) -> Lane:
    """The fast lane of a world opened with ``native=`` (``_engine.lane.choose``).

    Raises:
        TypeError, ValueError: as ``choose``.
    """
    return choose(native, _lane_send, _lane_recv)
