"""The engine's fast lane: small messages with no request, or a request that finishes as
it is made, where the general path (streams, events, the link) has nothing to add.

The fast lane is open (``DeviceEngine.fast``) in-process on an instant link, and across
processes, but never while every message is logged; a traced world takes these steps
through the traced lane (``traced``, ``DeviceEngine.traced``).  A sender's engine
hands a small message to the destination's engine (``offer``, or ``offer_bytes`` for bytes
that arrived from another process): a recv waiting there takes it at once, or the staging
pool keeps it.  A recv takes a message already waiting (``take_now``), or is posted on the
default stream directly (``post_now``).  Each step returns "not handled", having changed
nothing, whenever the full rules are needed (wildcards, a misfit, a full pool, ops queued
on the stream): the general path then runs.  These run once per message, so the bodies of
what they share with the general path are inlined.

Where the C lane is built (``_fastlane.LANE``, ``_lane*.c``), ``offer``, ``take_now``,
``post_now`` and ``_complete_fast`` have C counterparts for the commonest op, which write
the same fields in the same order and hand anything else back; the steps here stay the
reference, and run where the lane does not (``ASYNCCOMM_PURE_PYTHON=1``, other ops).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast

from .._buffers import PendingBuffers, StagingPool, new_array
from .._core.descriptors import AT_SENDER, STAGED, Descriptor, Message
from .._core.matching import Matcher
from .._core.states import DONE, NEXT, POSTED, check
from .._types import Status
from . import flight as _flight
from .lane import copy as fast_copy
from .request import Request

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from .._exceptions import CommBrokenError
    from ..transports.base import Link
    from .stream import Stream
    from .tracing import RankTrace

__all__ = ["THREAD_COPY_MIN", "FastLane", "byte_view"]

#: Payloads at least this large are copied on the rank's worker thread; smaller ones are
#: cheaper inline (a 4 MiB copy holds the loop well under a millisecond or two).
THREAD_COPY_MIN = 4 << 20
#: Inline copies at least this large are timed (matched before the copy, finished after
#: it, as on the general path): a clock read costs nothing beside them.
TIMED_COPY_MIN = 64 << 10

# Status(...) goes through NamedTuple's Python-level __new__; this is half the cost, and it
# runs once per message.
_new_status = tuple.__new__


def _status_of(msg: Descriptor) -> Status:
    """The Status of a message a recv or probe took (only messages wait unexpected)."""
    shape = cast(Message, msg).shape
    return _new_status(Status, (msg.source, msg.tag, msg.nbytes, msg.count,
                                (msg.count,) if shape is None else shape))


def _bytes_of(array: Any) -> memoryview:
    """A 1-D array's bytes."""
    mv: memoryview = array.data
    return mv if mv.format == "B" else mv.cast("B")


def byte_view(req: Request) -> memoryview:
    """A request's buffer as bytes, made the first time it is needed."""
    view = req.view
    if view is None:
        view = req.view = _bytes_of(req.array)
    return view




class FastLane:
    """The fast-lane steps of ``DeviceEngine`` (see module docs)."""

    if not TYPE_CHECKING:  # (mypy would refuse the fields the class that mixes it in lists)
        __slots__ = ()  # that class lists the fields

    rank: int
    closed: bool
    instant: bool
    eager_limit: int
    matcher: Matcher
    pool: StagingPool
    link: Link
    loop: asyncio.AbstractEventLoop
    now: Callable[[], float]
    flight: _flight.FlightRecorder
    tracer: RankTrace | None
    #: When ``take_now``'s last timed copy began (-1: it was not timed).
    taken_at: float
    default_stream: Stream
    gone: set[int]
    _n_pending: int
    _pending_recvs: int
    _recv_buffers: PendingBuffers | None
    _idle: asyncio.Future[None] | None

    if TYPE_CHECKING:
        def _drain(self) -> None: ...
        def _take(self, recv: Request, msg: Message) -> None: ...
        def _untrack(self, req: Request) -> None: ...
        def _on_timeout(self, req: Request) -> None: ...
        def _unreachable(self, peer: int) -> bool: ...
        def broken(self, peer: int) -> CommBrokenError: ...
        def withdraw(self, req: Request, exc: BaseException | None, *,
                     ask: bool = True) -> bool: ...
        @staticmethod
        def _add_buffer(pending: PendingBuffers, req: Request) -> None: ...

    def offer(self, source: int, tag: int, array: Any, nbytes: int, count: int,
              dtype: str, flow: int | str = 0) -> bool:
        """A small message from ``source``'s engine, in this process: a recv waiting here
        takes it at once, or the staging pool keeps it (its sender is then done).  Returns
        False, having done nothing, when it must go the usual way (rendezvous, a full pool,
        wildcards or a misfit to judge).  ``flow``: its id in a traced world."""
        if self.closed or nbytes >= THREAD_COPY_MIN:
            return False
        matcher = self.matcher
        recv: Request | Literal[False] | None = matcher.claim_posted(  # type: ignore[assignment]
            source, tag, nbytes, dtype)
        if recv is False:
            return False
        if recv is not None:
            if nbytes >= TIMED_COPY_MIN:
                recv.t_match = self.now()
            if recv.array is not None:  # both 1-D arrays of one dtype: a numpy copy
                if fast_copy is not None:
                    fast_copy(recv.array, array, nbytes)
                else:
                    recv.array[:count] = array
            elif recv.nbytes < 0:  # recv_new: a buffer made to the message's measure
                recv._result = array.copy()
            elif nbytes:
                recv.view[:nbytes] = _bytes_of(array)  # type: ignore[index]
            if flow:
                recv.flow = flow
            self._complete_fast(recv, source, tag, nbytes, count)
            return True
        if nbytes > self.eager_limit:
            return False
        buf = self.pool.acquire(nbytes, tentative=True)
        if buf is None:
            return False
        if fast_copy is not None:
            fast_copy(buf, array, nbytes)
        elif nbytes:
            buf[:nbytes] = _bytes_of(array)
        msg = Message(source, tag, nbytes, count, dtype, STAGED, buf)
        if flow:
            msg.flow = flow
        matcher.enqueue(msg)
        if matcher.events:  # a probe saw it
            self._drain()
        return True

    def offer_bytes(self, source: int, tag: int, view: memoryview, nbytes: int, count: int,
                    dtype: str) -> bool:
        """``offer`` for a message whose payload is bytes that are readable only now (one
        that arrived inline from another process): a recv waiting here takes it at once;
        False, having done nothing, when it must be delivered the usual way."""
        recv: Request | Literal[False] | None = self.matcher.claim_posted(  # type: ignore[assignment]
            source, tag, nbytes, dtype)
        if not recv:
            return False  # (``arrived`` numbers it, in a traced world)
        if self.tracer is not None:  # number it as it arrives (``_engine.tracing`` Rule 4)
            recv.flow = self.tracer.arrived_from(source)
        if nbytes >= TIMED_COPY_MIN:
            recv.t_match = self.now()
        dst: Any
        if recv.nbytes < 0:  # recv_new
            arr = recv._result = new_array(dtype, count)
            dst = arr.data.cast("B")
        elif fast_copy is not None:  # the array itself: no byte view to make
            dst = recv.array if recv.array is not None else recv.view
        else:
            dst = byte_view(recv)
        if fast_copy is not None:
            fast_copy(dst, view, nbytes)
        elif nbytes:
            dst[:nbytes] = view[:nbytes]
        self._complete_fast(recv, source, tag, nbytes, count)
        return True

    def _complete_fast(self, recv: Request, source: int, tag: int, nbytes: int,
                       count: int) -> None:
        """What ``_received`` and ``_finish`` do for a recv the fast lane filled."""
        status = _new_status(Status, (source, tag, nbytes, count, (count,)))
        recv._result = status if recv._result is None else (recv._result, status)
        if DONE not in NEXT[recv._state]:  # what _finish does, inlined: the hot path
            check(recv._state, DONE)
        recv._state = DONE
        recv.t_fin = t = self.now()
        flight = self.flight  # what FlightRecorder.add does, inlined: the hot path
        t_post = recv.t_post
        t_match = recv.t_match  # before a timed copy, else now
        if t_match < 0:
            t_match = t
        entry = (1, source, tag, nbytes, recv.stream.sid, 0, t_post, t_match, t)  # type: ignore[union-attr]
        flight.ring.append(entry)
        if self.tracer is not None:  # RankTrace.add, inlined (offer set the flow)
            self.tracer.ops.append((entry, getattr(recv, "flow", 0), None))
        tally = flight.recvs[source]
        tally.n += 1
        tally.nbytes += nbytes
        tally.w += t_match - t_post
        tally.c += t - t_match
        waiters = recv._waiters
        if waiters is not None:
            recv._waiters = None
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        if recv._timer is not None:
            recv._timer.cancel()
            recv._timer = None
        if recv._tracked:
            stream = recv.stream
            if (self._recv_buffers is None and stream is not None and not stream._queue
                    and not stream._events and self._idle is None):
                recv._tracked = False  # what _untrack does, inlined: the hot path
                self._n_pending -= 1
                if recv.nbytes > 0:
                    self._pending_recvs -= 1
                del stream._pending[recv.sseq]
            else:
                self._untrack(recv)

    def post_now(self, req: Request) -> None:
        """Post a recv on the default stream with nothing queued there (the fast lane's
        ``Stream._submit`` and ``start`` in one)."""
        if POSTED not in NEXT[req._state]:
            check(req._state, POSTED)
        req._state = POSTED
        req.t_post = self.now()
        matcher = self.matcher
        msg = matcher.post_recv(req)
        if msg is not None:
            self._take(req, msg)  # type: ignore[arg-type]
        elif matcher.events:
            self._drain()
        if req._state is not POSTED:
            return
        stream = self.default_stream  # what Stream._track and track do, inlined
        stream._seq = seq = stream._seq + 1
        req.sseq = seq
        stream._pending[seq] = req
        req._tracked = True
        self._n_pending += 1
        if req.nbytes > 0:
            self._pending_recvs += 1
            if self._recv_buffers is not None:
                self._add_buffer(self._recv_buffers, req)
        if req.timeout is not None:
            req._timer = self.loop.call_later(req.timeout, self._on_timeout, req)
        if self.gone and self._unreachable(req.peer):
            self.withdraw(req, self.broken(req.peer))

    def finished(self, req: Request, result: Status | None,
                 started: float = -1.0) -> Request:
        """``req`` finished as it was made (the fast lane did its work): mark it done.
        ``result``: a recv's Status (None for a send); ``started``: when its timed copy
        began (``take_now``'s ``taken_at``), else it took no time."""
        if DONE not in NEXT[req._state]:
            check(req._state, DONE)
        req._state = DONE
        req._result = result
        flow = 0 if self.tracer is None else getattr(req, "flow", 0)
        if result is None:  # the fast lane makes sends and recvs only
            t0, t = self.done_as_posted(0, req.peer, req.tag, req.nbytes, started, flow)
        else:  # what arrived (from whom, with what tag), not what was asked
            t0, t = self.done_as_posted(1, result.source, result.tag, result.nbytes, started,
                                        flow)
        req.t_post = req.t_match = t0
        req.t_fin = t
        return req

    def done_as_posted(self, kind: int, peer: int, tag: int, nbytes: int, started: float,
                       flow: int | str) -> tuple[float, float]:
        """Record an op of ``kind`` (0 send, 1 recv) done as it was posted: what
        ``FlightRecorder.add`` does, inlined, and ``RankTrace.add`` in a traced world
        (``flow``: its message's id).  ``started``: when its timed copy began (-1: none).
        Returns its (post and match, finish) times."""
        t = self.now()
        t0 = started if started >= 0 else t
        entry = (kind, peer, tag, nbytes, 0, 0, t0, t0, t)
        flight = self.flight
        flight.ring.append(entry)
        tally = (flight.recvs if kind else flight.sends)[peer]
        tally.n += 1
        tally.nbytes += nbytes
        tally.c += t - t0
        if self.tracer is not None:
            self.tracer.ops.append((entry, flow, None))
        return t0, t

    def take_now(self, source: int, tag: int, array: Any, nbytes: int,
                 dtype: str) -> Status | None:
        """The Status of a recv (into the 1-D ``array``; wildcards allowed) that a message
        already here completes at once; None, having done nothing, when the recv must be
        posted the usual way."""
        matcher = self.matcher
        msg: Message | None = matcher.waiting(source, tag)  # type: ignore[assignment]
        if msg is None:
            return None
        n = msg.nbytes
        where = msg.where
        if (msg.dtype != dtype or n > nbytes or not (
                where == STAGED or (where == AT_SENDER and self.instant and n < THREAD_COPY_MIN))):
            return None
        matcher.take(msg)
        self.taken_at = self.now() if n >= TIMED_COPY_MIN else -1.0
        if fast_copy is not None:
            fast_copy(array, msg.view, n)
        elif n:
            _bytes_of(array)[:n] = memoryview(msg.view)[:n]  # type: ignore[arg-type]
        if where == STAGED:
            self.pool.release(msg.view)  # type: ignore[arg-type]
        self.link.received(msg, self.rank)  # its sender may complete, its credit go back
        return _status_of(msg)  # the message's own source and tag
