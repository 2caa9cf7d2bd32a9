"""The device engine: the asyncio shell around the matcher, one per rank.

It owns this rank's requests and is the only code that changes their state (each change
checked against ``_core.states``).  The matcher decides who matches whom, the link (the
transport) moves messages, streams decide when an op is posted, and the engine turns what
happens into copies and request outcomes (the aioquic ``_process_events`` pattern).  Copies
of large payloads run on the rank's worker thread (numpy releases the GIL while copying)
so the loop keeps running; everything else runs inline on the loop.

Closing the engine withdraws every op that has not matched (failing it with
``CommClosedError``), lets matched transfers finish, and tells the link, which tells the
other ranks (their ops waiting for this rank fail with ``CommBrokenError``).

The Python fast lane is free functions of the engine in modules of their own, twins of the
C lane's files (``steps``: a message offered, a recv completed, an op finished as it was
made; ``take``: a recv taken or posted; ``traced``: a traced world's entries); the steps
that read the whole rank (peers that closed or failed, diagnostics, statistics) are its
own methods.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import functools
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, cast

import numpy as np

from .._buffers import PendingIndex, StagingPool, new_array
from .._core.descriptors import AT_SENDER, INLINE, STAGED, Message
from .._core.matching import Matcher, ProbeMatched, RecvRejected
from .._core.states import ACTIVE, CANCELLED, DONE, NEXT, POSTED, QUEUED, Kind, State, check
from .._deadlines import deadlines_of
from .._exceptions import CommBrokenError, CommClosedError, CommTimeoutError
from .._types import ANY_SOURCE, Status
from ..sim.records import OpRecord
from ..transports.base import ASKED, WITHDRAWN
from . import diagnostics as diag
from . import flight as _flight
from . import log as _logging
from .fast import LOOP_COPY_MAX, THREAD_COPY_MIN, byte_view, status_of
from .lane import PYTHON, Lane
from .peers import EngineStatistics
from .request import Request
from .stream import Stream
from .waits import communicator_label

if TYPE_CHECKING:
    from ..sim.clock import ModelClock
    from ..sim.device import Device
    from ..sim.records import OpRecord
    from ..transports.base import Link
    from .tracing import RankTrace
    from .waits import Scope

__all__ = ["THREAD_COPY_MIN", "DeviceEngine", "EngineStatistics", "byte_view"]

SEND: Final = Kind.SEND
RECV: Final = Kind.RECV
PROBE: Final = Kind.PROBE
COMPUTE: Final = Kind.COMPUTE


class _LoopShare:
    """The part of a worker's copy that the loop may copy meanwhile: whoever claims it
    first, the loop at its turn (``_LoopShares``) or the worker once its own part is done
    (``after``), copies it, once.  The worker's copy completes only after the share is in:
    the loop's share runs in a callback of the loop, which the worker's completion (a
    callback of the same loop) cannot overtake."""

    __slots__ = ("dst", "src", "token")

    def __init__(self, dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
        self.dst, self.src = dst, src
        self.token = [True] if dst.size else []  # (list.pop: one claim, under the GIL)

    def take(self) -> bool:
        """Copy the share unless it was claimed already; whether this call copied it."""
        try:
            self.token.pop()
        except IndexError:
            return False
        np.copyto(self.dst, self.src)
        return True

    def after(self, dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> bool:
        """The worker's job: copy ``src`` to ``dst``, then ``take`` the share."""
        np.copyto(dst, src)
        return self.take()


class _LoopShares:
    """The shares (``_LoopShare``) of every worker copy of one event loop's ranks, in the
    order their copies began: the loop copies at most one a turn, the oldest that no
    worker has claimed, so that a burst of large messages holds it for one share at a
    time, whichever ranks and workers they are for.  (It holds no reference to its loop,
    which keeps it in ``_SHARES`` only as long as the loop lives.)"""

    __slots__ = ("armed", "queue")

    def __init__(self) -> None:
        self.queue: deque[_LoopShare] = deque()
        self.armed = False

    def add(self, loop: asyncio.AbstractEventLoop, share: _LoopShare) -> None:
        self.queue.append(share)
        if not self.armed:
            self.armed = True
            loop.call_soon(self.turn, loop)

    def turn(self, loop: asyncio.AbstractEventLoop) -> None:
        queue = self.queue
        while queue and not queue.popleft().take():
            pass  # (claimed by its worker already)
        if queue:
            loop.call_soon(self.turn, loop)  # the next turn of the loop, not this one
        else:
            self.armed = False


#: Each event loop's shares of worker copies, created with its first.
_SHARES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopShares] = (
    weakref.WeakKeyDictionary())


class DeviceEngine:
    """One rank's engine (see module docs).  Created by the world, not by users."""

    # Slots: the fast lane reads these once per message (the C lane, ``_lane.c``, at their
    # offsets).
    __slots__ = (
        "_copies", "_executor", "_idle", "_n_pending", "_next_sid", "_pending_recvs",
        "_probes", "_recv_buffers", "_streams", "acked", "clock", "closed", "context", "copy",
        "deadlines", "default_stream", "device", "eager_limit", "failed_with", "failure", "fast",
        "flight", "gone", "inline_copies", "inspect", "instant", "lane", "link", "log", "loop",
        "matcher", "now", "peers", "pool", "private", "rank", "recent", "records", "revoked",
        "scopes", "size", "taken_at", "trace", "traced", "tracer", "unheard", "world_rank",
        "world_ranks"
    )

    def __init__(self, rank: int, size: int, link: Link, *, loop: asyncio.AbstractEventLoop,
                 eager_limit: int, pool_bytes: int, clock: ModelClock, device: Device,
                 lane: Lane = PYTHON, record: bool = False, inline_copies: bool = False,
                 instant: bool = False) -> None:
        self.rank = rank
        self.size = size
        #: This rank in the world, and where these ops are if not on the world's
        #: communicator (for reports that span a world's communicators).
        self.world_rank = rank
        self.world_ranks: list[int] | None = None  # of every rank here (None: the same)
        self.context = ""
        #: A private context's engine: it does not log its opening and closing.
        self.private = False
        self.loop = loop
        #: The deadlines of timed ops, behind one loop timer shared by the loop's engines
        #: (``asynccomm._deadlines``).
        self.deadlines = deadlines_of(loop)
        self.link = link
        self.eager_limit = eager_limit
        self.matcher = Matcher(on_wait=functools.partial(link.waiting, rank))
        self.pool = StagingPool(pool_bytes)
        self.closed = False
        self.log, self.trace = _logging.engine_logger(rank=rank, size=size)
        #: The clock ops are timed with (seconds), and the last ops of this rank.
        self.now = _flight.clock_for(loop)
        #: Its world's fast lane (``_engine.lane``), and the lane's two primitives: a
        #: buffer judged, bytes copied (None: the callers' own assignment).
        self.lane = lane
        self.inspect = lane.inspect
        self.copy = lane.copy
        self.flight = _flight.FlightRecorder(_flight.flight_size(), self.now(), lane.module)
        #: Collects every op for a trace file (set by the world when tracing), or None.
        self.tracer: RankTrace | None = None
        #: Model time (the virtual clock, or scaled wall time) for compute and transfers.
        self.clock = clock
        self.device = device
        #: Completed ops' modelled records (cluster worlds only; None keeps the hot path bare).
        self.records: list[OpRecord] | None = [] if record else None
        #: Copy large payloads on the loop too (virtual time: threads would be real time).
        self.inline_copies = inline_copies
        #: The link delivers at once, in this process: an ``AT_SENDER`` payload may be
        #: copied as soon as a recv matches it.
        self.instant = instant
        self.default_stream = Stream(self, 0, in_order=False)
        # Streams the program still holds, by weak reference: a dropped stream with nothing
        # pending goes (its pending requests keep it alive until they finish).  A set of
        # references rather than a WeakSet, whose iterator guards against removals with a
        # context manager that costs more than the scan of ``_live`` (2 us of 3 for two
        # streams, paid each time a rank's pending recvs go from one to two).
        self._streams: set[weakref.ref[Stream]] = set()
        self._streams.add(weakref.ref(self.default_stream, self._streams.discard))
        self._next_sid = 0
        self._probes: dict[Request, None] = {}  # waiting probes (on no stream)
        #: The other ranks' endpoints when the link is instant and in-process: the fast lane
        #: hands a small message straight to a recv waiting there (set by the world).
        self.peers: list[DeviceEngine] | None = None
        #: The fast lane is open: small messages on the default stream skip requests where
        #: they can (in-process and instant, or across processes; never while logging every
        #: message; set by the world).
        self.fast = False
        #: The fast lane of a traced in-process world (``traced``; set by the world).
        self.traced = False
        #: What broke the link underneath (``broke``): every op posted since fails with it
        #: (a fresh copy), unless a message already here completes it.
        self.failure: BaseException | None = None
        #: What this rank failed with, if it did: its peers hear it at close.
        self.failed_with: BaseException | None = None
        #: Why this communicator was revoked (``revoke``): every op posted since fails
        #: with a copy of it.
        self.revoked: BaseException | None = None
        #: The failed ranks acknowledged here (``_comm.faults``), once the program asked:
        #: a wildcard recv or probe then fails while a failed rank is not acknowledged.
        self.acked: frozenset[int] | None = None
        #: When ``take.take_now``'s last timed copy began (-1: it was not timed).
        self.taken_at = -1.0
        #: Ranks that have closed (their messages sent before closing were delivered),
        #: but for those in ``unheard``; an in-process link shares one set among its
        #: engines, which may hold this rank (see ``transports.base.Endpoint``).
        self.gone: set[int] = set()
        self.unheard: set[int] = set()
        #: Ops withdrawn lately (timed out, cancelled), for the messages of peers' timeouts.
        self.recent: deque[tuple[Request, str, float]] = deque(maxlen=16)
        #: The collective calls run on this engine, for reports (``_engine.waits``).
        self.scopes: list[Scope] = []
        self._n_pending = 0  # tracked (unfinished) ops
        self._pending_recvs = 0  # of them, recvs with a non-empty buffer
        self._recv_buffers: PendingIndex | None = None  # theirs, once two were pending
        self._copies = 0
        self._idle: asyncio.Future[None] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    # -- streams and tracking -------------------------------------------------------------

    def new_stream(self) -> Stream:
        self._next_sid += 1
        stream = Stream(self, self._next_sid, in_order=True)
        self._streams.add(weakref.ref(stream, self._streams.discard))
        return stream

    def streams(self) -> list[Stream]:
        """The streams the program still holds, in no order."""
        return [s for ref in list(self._streams) if (s := ref()) is not None]

    def track(self, req: Request) -> None:
        """Keep a request that did not finish as it was posted, and arm its timeout (its
        stream keeps it; probes, on no stream, are kept here)."""
        req._tracked = True
        self._n_pending += 1
        if req.kind is PROBE:
            self._probes[req] = None
        if req.kind is RECV and req.nbytes > 0:
            self._pending_recvs += 1
            if self._recv_buffers is not None:
                self._add_buffer(self._recv_buffers, req)
        if req.timeout is not None and req._timer is None:
            self.deadlines.arm(req, req.timeout)

    def _untrack(self, req: Request) -> None:
        req._tracked = False
        self._n_pending -= 1
        if req.kind is RECV and req.nbytes > 0:
            self._pending_recvs -= 1
            if self._recv_buffers is not None:
                if self._pending_recvs:
                    self._recv_buffers.remove(req)
                else:
                    self._recv_buffers = None
        stream = req.stream
        if stream is None:
            del self._probes[req]
        elif stream._queue or stream._events:
            stream._finished(req)
        else:  # nothing waits behind it: what _finished does, inlined
            del stream._pending[req.sseq]
        if self._idle is not None and not self._n_pending:
            self._idle.set_result(None)
            self._idle = None

    def _live(self) -> list[Request]:
        """Every unfinished op of this rank: its streams' and its probes'."""
        out = [r for stream in self.streams() for r in stream._pending.values()]
        out += self._probes
        return out

    def check_recv_buffer(self, buf: Any, nbytes: int) -> None:
        """Refuse a recv buffer (its first ``nbytes``) that overlaps the buffer of a pending
        recv of this rank.

        Raises:
            ValueError: it does (nothing is posted).
        """
        pending = self._recv_buffers
        if pending is None:  # built on first need: most programs never have two pending
            pending = self._recv_buffers = self.lane.pending(self.lane.address)
            for r in self._live():
                if r.kind is RECV and r.nbytes > 0:
                    self._add_buffer(pending, r)
        owner = pending.conflict(buf, nbytes)
        if isinstance(owner, Request):
            raise ValueError(f"rank {self.rank}: the recv buffer overlaps the buffer of "
                             f"{diag.describe(owner)}, which is still pending: two recvs "
                             "would write the same memory")

    @staticmethod
    def _add_buffer(pending: PendingIndex, req: Request) -> None:
        pending.add(req.array if req.array is not None else req.view, req.nbytes, req)

    # -- posting --------------------------------------------------------------------------

    def start(self, req: Request) -> None:
        """Post a request that reached its turn on its stream (streams only)."""
        check(req._state, POSTED)
        req._state = POSTED
        req.t_post = self.now()
        if self.revoked is not None:
            self._finish(req, DONE, copy.copy(self.revoked))
            return
        kind = req.kind
        if kind is SEND:
            byte_view(req)  # the link reads it
            if self.trace:
                self.log.debug("p2p.send.posted", peer=req.peer, tag=req.tag, nbytes=req.nbytes)
            tracer = self.tracer
            if tracer is not None:  # RankTrace.flow_out, inlined: number the message
                sent = tracer.sent
                dst = req.peer
                sent[dst] += 1
                req.flow = tracer.fid(self.rank, dst, sent[dst])
            self.link.send(req, req.peer)
        elif kind is RECV:
            if self.trace:
                self.log.debug("p2p.recv.posted", peer=req.peer, tag=req.tag)
            msg = self.matcher.post_recv(req)
            if msg is not None:
                self._take(req, msg)  # type: ignore[arg-type]
                return
            if self.matcher.events:
                self._drain()
            # A message the gone peer sent before it left was taken above; nothing more.
            if req._state is POSTED and self.gone and self._unreachable(req.peer):
                self.withdraw(req, self.broken(req.peer))
            elif req._state is POSTED and self.failure is not None:
                self.withdraw(req, diag.fresh_copy(self.failure))
        else:
            self._start_compute(req)

    def probe_now(self, source: int, tag: int) -> Status | None:
        """The Status of a message here that a recv(source, tag) would take, or None.

        Raises:
            TransportError: none is here, and the link broke (nothing more will come).
        """
        msg = self.matcher.probe(source, tag)
        if msg is None and self.failure is not None:
            raise diag.fresh_copy(self.failure)
        return None if msg is None else status_of(msg)

    def post_probe(self, req: Request) -> None:
        """Post a blocking probe; it finishes with the Status of a fitting message."""
        check(req._state, POSTED)
        req._state = POSTED
        req.t_post = self.now()
        if self.revoked is not None:
            self._finish(req, DONE, copy.copy(self.revoked))
            return
        msg = self.matcher.post_probe(req)
        if msg is not None:
            req._result = status_of(msg)
            self._finish(req, DONE, None)
            return
        self.track(req)
        if self.gone and self._unreachable(req.peer):
            self.withdraw(req, self.broken(req.peer))
        elif self.failure is not None:
            self.withdraw(req, diag.fresh_copy(self.failure))

    def _start_compute(self, req: Request) -> None:
        """A compute task occupies this rank's compute stream (FIFO) for its duration."""
        check(req._state, ACTIVE)
        req._state = ACTIVE  # running compute cannot be withdrawn
        start, end = self.device.reserve_compute(self.clock.now_ns(), req.duration_ns)
        self.clock.call_at(end, self._compute_done, req, start, end)

    def _compute_done(self, req: Request, start: int, end: int) -> None:
        if self.records is not None:
            req.record = OpRecord(rank=self.rank, kind="compute", peer=self.rank, tag=0,
                                  nbytes=0, chunks=1, start=start * 1e-9, end=end * 1e-9,
                                  mode="compute")
            self.records.append(req.record)
        self._finish(req, DONE, None)

    # -- arrivals and matching (the link calls these) -------------------------------------

    def arrived(self, msg: Message) -> None:
        """A message for this rank arrived (or was announced)."""
        if self.tracer is not None and type(msg) is not Request:  # from another process
            self.tracer.arrival(msg)
        matcher = self.matcher
        recv = matcher.deliver(msg)
        if recv is not None:
            self._take(recv, msg)  # type: ignore[arg-type]
        elif msg.where != STAGED:
            if msg.where == INLINE:  # its bytes are only readable now: keep them
                self._stage(msg, force=True)
            elif msg.where == AT_SENDER and self.stage(msg):
                self.link.staged(msg)  # the sender may reuse its buffer
        if matcher.events:
            self._drain()

    def stage(self, msg: Message) -> bool:
        """Copy ``msg``'s eager payload into the staging pool if it is eager and fits."""
        return msg.nbytes <= self.eager_limit and self._stage(msg, force=False)

    def _stage(self, msg: Message, *, force: bool) -> bool:
        n = msg.nbytes
        buf = self.pool.acquire(n, force=force)
        if buf is None:
            return False
        if n:
            buf[:n] = msg.view[:n]  # type: ignore[index]
        msg.view = buf
        msg.where = STAGED
        return True

    def retract(self, msg: Message) -> bool:
        """Remove an unexpected message (its send is being withdrawn)."""
        if not self.matcher.withdraw(msg):
            return False
        if msg.where == STAGED:
            self.pool.release(msg.view)  # type: ignore[arg-type]
        return True

    def discard_staged(self, dead: Callable[[int], bool]) -> int:
        """Drop the staged messages whose tag is ``dead(tag)``: eager messages of calls
        this rank left unfinished, which nothing will receive (their senders completed
        long ago); their bytes go back to the pool.  Returns how many were dropped."""
        dropped = 0
        if self.matcher.statistics().unexpected_messages:
            for desc in self.matcher.unexpected():
                msg = cast(Message, desc)  # only messages wait unexpected
                if msg.where == STAGED and dead(msg.tag) and self.matcher.withdraw(msg):
                    self.pool.release(msg.view)  # type: ignore[arg-type]
                    dropped += 1
        return dropped

    def _take(self, recv: Request, msg: Message) -> None:
        """``recv`` matched ``msg``: move the payload into its buffer."""
        check(recv._state, ACTIVE)
        recv._state = ACTIVE
        recv.t_match = t = self.now()
        if type(msg) is Request:  # in-process, the message is the send: it matched now
            msg.t_match = t
        if self.trace:
            self.log.debug("p2p.matched", peer=msg.source, tag=msg.tag, nbytes=msg.nbytes)
        if recv.nbytes < 0:  # recv_new: a buffer made to the message's measure
            arr = recv._result = new_array(msg.dtype, msg.count)  # type: ignore[arg-type]
            dst = arr.data.cast("B")
        else:
            dst = byte_view(recv)
        n = msg.nbytes
        where = msg.where
        if where == STAGED or where == INLINE:
            if n:
                dst[:n] = memoryview(msg.view)[:n]  # type: ignore[arg-type]
            if where == STAGED:
                self.pool.release(msg.view)  # type: ignore[arg-type]
            self._received(recv, msg, None)
        elif where == AT_SENDER and self.instant and n < THREAD_COPY_MIN:
            dst[:n] = msg.view  # type: ignore[assignment]  # the direct path: in-process
            self._received(recv, msg, None)
        else:
            self.link.fetch(msg, self.rank, dst[:n], lambda view, record: self._fetched(
                recv, msg, dst, view, record))
            if self.failure is not None and recv._state is ACTIVE:
                # The link broke in ``fetch``, before ``recv`` was tracked (``broke``
                # failed what was): its data never comes.
                self._finish(recv, DONE, diag.fresh_copy(self.failure))

    def _fetched(self, recv: Request, msg: Message, dst: memoryview,
                 view: memoryview | bytearray | None, record: object) -> None:
        n = msg.nbytes
        if view is None:  # already in place
            self._received(recv, msg, record)
        elif n < THREAD_COPY_MIN or self.inline_copies:
            dst[:n] = memoryview(view)[:n]
            self._received(recv, msg, record)
        else:
            self.copy_on_thread(dst, memoryview(view), n,
                                lambda: self._received(recv, msg, record))

    def _received(self, recv: Request, msg: Message, record: object) -> None:
        """The payload is in ``recv``'s buffer: complete it, and let the link complete the
        sender."""
        link_record = self.link.received(msg, self.rank)
        record = record if link_record is None else link_record
        if record is not None and self.records is not None:
            recv.record = record
            self.records.append(record)  # type: ignore[arg-type]
        status = status_of(msg)
        recv._result = status if recv._result is None else (recv._result, status)
        if self.tracer is not None:  # in-process, the message is the send, numbered
            recv.flow = self.tracer.flow_in(msg)  # the send's own, or its arrival's
        self._finish(recv, DONE, None)

    def _drain(self) -> None:
        matcher = self.matcher
        while (event := matcher.next_event()) is not None:
            if isinstance(event, RecvRejected):
                self._finish(event.recv, DONE, diag.rejection(  # type: ignore[arg-type]
                    self.rank, event))
            elif isinstance(event, ProbeMatched):
                probe: Request = event.probe  # type: ignore[assignment]
                msg = event.envelope
                probe._result = status_of(msg)
                self._finish(probe, DONE, None)

    # -- the sending side (the link calls these) ------------------------------------------

    def activate(self, msg: Message) -> None:
        """A recv matched this rank's send: it can no longer be withdrawn."""
        req: Request = msg  # type: ignore[assignment]
        if req._state is POSTED:
            req._state = ACTIVE
            req.t_match = self.now()

    def sent(self, msg: Message, record: object = None) -> None:
        """This rank's send is complete: its buffer may be reused."""
        req: Request = msg  # type: ignore[assignment]
        if record is not None and self.records is not None:
            req.record = record
            self.records.append(record)  # type: ignore[arg-type]
        self._finish(req, DONE, None)

    def failed(self, msg: Message, exc: BaseException) -> None:
        """This rank's send failed before any recv took it."""
        self._finish(msg, DONE, exc)  # type: ignore[arg-type]

    def withdrawn(self, msg: Message) -> None:
        """The withdrawal asked of the receiver won."""
        req: Request = msg  # type: ignore[assignment]
        self._withdrawn(req, getattr(req, "_withdraw_exc", None))

    # -- completion and withdrawal --------------------------------------------------------

    def _finish(self, req: Request, state: State, exc: BaseException | None) -> None:
        """The one way a request ends (DONE or CANCELLED), checked against the table."""
        if state not in NEXT[req._state]:
            check(req._state, state)
        req._state = state
        req._exc = exc
        req.t_fin = t = self.now()
        entry = _flight.finish(self.flight, req, state, exc, t)
        if self.tracer is not None:  # RankTrace.add, inlined
            self.tracer.ops.append((entry, getattr(req, "flow", 0), req._record))
        if self.trace:
            _logging.op_finished(self.log, _flight.named(entry))
        if req._waiters is not None or req._timer is not None:
            req._wake()
        if req._tracked:
            self._untrack(req)

    def withdraw(self, req: Request, exc: BaseException | None, *, ask: bool = True) -> bool:
        """Withdraw a request that has not matched: cancel it (``exc`` None) or fail it.

        Returns True if it was withdrawn, or if its withdrawal was asked of its receiver
        (only with ``ask``: a send whose receiver is in another process decides, and the
        link then reports ``withdrawn``, or completes the send); False if it had matched
        or finished already.
        """
        state = req._state
        if state is QUEUED:
            req.stream._withdraw_queued(req)  # type: ignore[union-attr]
        elif state is not POSTED:
            return False
        elif req.kind is SEND:
            verdict = self.link.withdraw(req, req.peer, ask)
            if verdict != WITHDRAWN:
                if verdict == ASKED:
                    req._withdraw_exc = exc
                return verdict == ASKED
        elif req.kind is RECV:
            if not self.matcher.cancel(req):
                return False
        elif not self.matcher.cancel_probe(req):
            return False
        self._withdrawn(req, exc)
        return True

    def _withdrawn(self, req: Request, exc: BaseException | None) -> None:
        if exc is None or isinstance(exc, CommTimeoutError):
            how = "timed out" if exc is not None else "was cancelled"
            self.recent.append((req, how, self.loop.time()))
        self._finish(req, CANCELLED if exc is None else DONE, exc)

    def _on_timeout(self, req: Request) -> None:
        req._timer = None
        if req._state < ACTIVE:
            exc = diag.timeout_error(self, req)
            if not isinstance(self.log, _logging.NullLogger):
                self.log.info("p2p.timeout.flight", error=str(exc), flight=diag.flight_dump(self))
            self.withdraw(req, exc)

    def dropped_late(self, source: int, tag: int, nbytes: int) -> None:
        """A message came after this rank closed (sent before its sender heard of the
        close) and was dropped: say so, as the close said of those before it."""
        _logging.dropped(self.log, [(source, tag, nbytes)],
                         communicator_label(self) or "world", late=True)

    # -- copies ---------------------------------------------------------------------------

    def copy_on_thread(self, dst: memoryview, src: memoryview, nbytes: int,
                       on_done: Callable[[], None]) -> None:
        """Copy ``nbytes`` from ``src`` to ``dst`` on this rank's worker thread and call
        ``on_done`` on the loop when it is all in place.  The first half (at most
        ``LOOP_COPY_MAX`` bytes, whole pages) is the loop's to copy at a turn of its own
        while the worker copies the rest; the worker copies it too if the loop has not
        begun it by the time the rest is done (``_LoopShare``).  The loop copies one share
        a turn, the oldest still free, of any of its ranks' copies (``_LoopShares``): a
        loop that is free copies beside the worker, a burst of large messages holds it
        for one share at a time, and the caller (a send whose recv was waiting) returns
        at once.  Measured in-process, 16 MiB messages (medians of runs alternating the
        two; the loop's gap: its longest wait for a turn meanwhile):

        ===============================================  ===================  ==========
        case                                             each share at its    one share
                                                         turn, if not late    a turn
        ===============================================  ===================  ==========
        ``isend``, 2.9 ms of numpy on the loop, wait     2.90-3.25 ms         2.91-3.00
        ``isend`` into a waiting recv, done              0.92-1.50 ms         1.12-1.31
        6 ``isend`` into waiting recvs: all done         11.97-12.63 ms       7.34-7.49
        ... the loop's longest gap meanwhile             0.93-1.05 ms         1.18-1.24
        ===============================================  ===================  ==========

        (Before, each copy's share was the loop's only if its turn came within 0.3 ms, so
        that the shares of a burst, all due at one turn, did not hold the loop for one
        after another: a burst's worker then copied all but the first.  Before that, a
        share copied within the send held its caller 1.1-1.3 ms, and every share at its
        turn however late held the loop 6.3 ms for the 6 messages.)  Buffers that
        may overlap are copied whole on the worker, as one ``np.copyto`` (which copies
        overlapping memory as memmove does).

        numpy releases the GIL while it copies, so the worker's part runs beside the loop.
        The worker's part is one piece: cut into chunks (8-64 MiB) it ran at three quarters
        of the speed of one large copy here, which the C library makes with non-temporal
        stores, and every chunk that is its own job also waits for a round trip through
        the loop.  One worker per rank.  A copy of 16-64 MiB is bound by one core's cache
        misses in flight, not by the memory: two cores copy it nearly twice as fast as
        one (14.7-15.8 GB/s for halves of 16-64 MiB, 7.4-8.5 for the whole on one thread
        or inline, on this 2-core machine).  The second core is the loop's own: cut in
        halves copied side by side on two threads of a pool shared by the process, the
        loop waited for a core (a task on a 1 ms timer went 5-6 ms without a turn while
        such a copy ran, and 4-5.5 ms in about half the repeats of later 1 GiB copies on
        one thread, once the pool had a second thread at all: the system wakes the worker
        on the loop's core and moves one of them away only milliseconds later), where the
        loop's own share holds it no longer than an inline copy of ``LOOP_COPY_MAX``.
        """
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"asynccomm-copy-{self.rank}")
        self._copies += 1
        d = np.frombuffer(dst, dtype=np.uint8, count=nbytes)
        s = np.frombuffer(src, dtype=np.uint8, count=nbytes)
        # (none where the buffers may overlap, as an erroneous program's may in one
        # process: one copy moves them as memmove would)
        ours = 0 if np.may_share_memory(d, s) else min(nbytes // 2, LOOP_COPY_MAX) & ~4095
        share = _LoopShare(d[:ours], s[:ours])
        fut = self.loop.run_in_executor(self._executor, share.after, d[ours:], s[ours:])
        if ours:
            shares = _SHARES.get(self.loop)
            if shares is None:
                shares = _SHARES[self.loop] = _LoopShares()
            shares.add(self.loop, share)

        def copied(f: asyncio.Future[bool]) -> None:
            f.result()
            self._copies -= 1
            if self.trace:
                self.log.debug("chunk.copied", offset=0, nbytes=nbytes)
            on_done()

        fut.add_done_callback(copied)

    # -- peers that closed or failed; the whole rank --------------------------------------

    def peer_closed(self, rank: int, exc: BaseException | None) -> None:
        """``rank`` closed or failed: fail recvs and probes that only it could have matched,
        and wildcard ones once no other rank is left (with ``exc``, or a
        ``CommBrokenError`` naming it)."""
        self.gone.add(rank)
        if self.closed or not self._n_pending:
            return
        everyone = self._heard() >= self.size - 1 or self._unacked() is not None
        if not self.matcher.waits_for(rank, wildcards=everyone):
            return  # (a queued recv meets the closed peer when it is posted)
        for req in [r for r in self._live() if r.kind is not SEND and r.kind is not COMPUTE
                    and (r.peer == rank or (everyone and r.peer == ANY_SOURCE))]:
            if req._state is POSTED:
                self.withdraw(req, exc if exc is not None and req.peer == rank
                              else self.broken(req.peer))

    def _unreachable(self, peer: int) -> bool:
        """True if no rank is left that could send what an op from ``peer`` waits for.  A
        wildcard gives up once every other rank has closed (a message to itself is matched
        when it is posted, so a rank waiting on ANY_SOURCE alone would wait forever)."""
        if peer == ANY_SOURCE:
            return self.size > 1 and (self._heard() >= self.size - 1
                                      or self._unacked() is not None)
        return peer in self.gone and peer != self.rank and peer not in self.unheard

    def _unacked(self) -> int | None:
        """The lowest failed rank not acknowledged here, where the program acknowledges."""
        if self.acked is None:
            return None
        return min((r for r in self.gone if r != self.rank and r not in self.unheard
                    and r not in self.acked), default=None)

    def _heard(self) -> int:
        """How many other ranks this rank knows to have closed."""
        gone = self.gone
        return len(gone) - (self.rank in gone) - len(self.unheard)

    def broken(self, peer: int) -> CommBrokenError:
        """The error for an op of this rank that ``peer`` (``ANY_SOURCE``: every other
        rank), now closed, can never complete."""
        if peer == ANY_SOURCE and (unacked := self._unacked()) is not None:
            peer = unacked  # a failure not acknowledged (``acked``): that rank's error
        if peer != ANY_SOURCE:  # (the closed ranks are named for wildcards only)
            why, cause = self.link.why_gone(peer)
            return diag.broken(self.rank, peer, self.gone, why, cause)
        return diag.broken(self.rank, peer, self.gone - self.unheard - {self.rank})

    def broke(self, exc: BaseException) -> None:
        """The link failed underneath: fail every unfinished op of this rank with ``exc``,
        and every op posted from now on that no message already here completes (the fast
        lanes close: the usual way checks)."""
        self.failure = exc
        self.fast = self.traced = False
        for req in self._live():
            if req._state < DONE:
                self._finish(req, DONE, diag.fresh_copy(exc))

    def revoke(self, exc: BaseException) -> None:
        """This communicator was revoked (``_comm.faults``): every op that has not matched
        fails with a copy of ``exc`` (copied with ``copy.copy``), and so does every op
        posted from now on; matched transfers finish.  The fast lanes close (the usual way
        checks)."""
        self.revoked = exc
        self.fast = self.traced = False
        for req in self._live():
            self.withdraw(req, copy.copy(exc), ask=False)

    @property
    def pending_ops(self) -> int:
        """How many ops of this rank are unfinished."""
        return self._n_pending

    def live_requests(self) -> list[Request]:
        """Every unfinished op of this rank (a copy)."""
        return self._live()

    def describe_all(self) -> list[str]:
        """Every unfinished op of this rank, for deadlock reports."""
        return [diag.describe(r) + ("" if r._state is not QUEUED else " queued on its stream")
                for r in self._live()]

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(pending_ops=self.pending_ops, active_copies=self._copies,
                                streams=len(self._streams), matcher=self.matcher.statistics(),
                                pool=self.pool.statistics())

    # -- diagnostics and closing ----------------------------------------------------------

    def describe_pending(self, peer: int) -> list[str]:
        """This rank's unfinished ops that involve ``peer`` and that ``peer`` cannot see
        (posted sends sit in the peer's own matcher), for error messages."""
        return diag.pending_for(self, peer)

    async def aclose(self, reason: str = "has closed its communicator") -> None:
        """Close: fail unmatched ops with ``CommClosedError``, let matched transfers finish,
        drop the messages no recv took (a ``p2p.dropped`` warning counts them by source and
        tag; a send still waiting for this rank fails, see ``LocalLink.discard``), and tell
        the link.  Idempotent."""
        if self.closed:
            return
        self.closed = True
        exc = CommClosedError(f"rank {self.rank}'s communicator was closed with the op pending",
                              rank=self.rank)
        for req in self._live():
            self.withdraw(req, exc)
        if self.pending_ops:  # matched transfers still moving: they finish, not torn
            self._idle = self.loop.create_future()
            await asyncio.shield(self._idle)
        dropped = []
        for desc in self.matcher.unexpected():
            msg = cast(Message, desc)  # only messages wait unexpected
            self.matcher.withdraw(msg)
            if msg.where == STAGED:
                self.pool.release(msg.view)  # type: ignore[arg-type]
            self.link.discard(msg, self.rank)
            dropped.append((msg.source, msg.tag, msg.nbytes))
        if dropped:
            _logging.dropped(self.log, dropped, communicator_label(self) or "world")
        self.pool.trim()
        if self.failed_with is not None:
            reason = diag.failed_reason(self.failed_with)
        self.link.close(self.rank, reason)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        self.deadlines.close()
        if not self.private:
            self.log.info("comm.closed")
