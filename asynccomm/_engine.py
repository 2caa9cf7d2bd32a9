"""The device engine: the asyncio shell around the matcher, one per rank.

It turns core events into copies and request outcomes and nothing else (the aioquic
``_process_events`` pattern): the matcher decides who matches whom, the transport moves
envelopes and payloads, streams decide when an op is posted, and the engine wires them
together.  Copies of large payloads run on the rank's worker thread (numpy releases the
GIL while copying) so the loop keeps running; everything else runs inline on the loop.

Closing the engine withdraws every op that has not matched (failing it with
``CommClosedError``), lets matched transfers finish, and tells the transport, which fails
what peers were waiting for from this rank with ``CommBrokenError``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _logging
from ._buffers import BufferView, PoolStatistics, SpanIndex, StagingPool, new_array
from ._core.descriptors import Envelope, ProbeDescriptor, RecvDescriptor
from ._core.matching import Matcher, MatcherStatistics, ProbeMatched, RecvRejected
from ._exceptions import (
    CommBrokenError,
    CommClosedError,
    CommTimeoutError,
    DTypeMismatchError,
    TruncationError,
)
from ._request import ACTIVE, CANCELLED, DONE, POSTED, QUEUED, Request
from ._stream import Stream
from ._types import ANY_SOURCE, Status
from .sim.clock import ModelClock
from .transports.base import ASKED, WITHDRAWN

if TYPE_CHECKING:
    from .sim.records import OpRecord
    from .transports.base import Transport

__all__ = ["DeviceEngine", "EngineStatistics"]

# Status(...) goes through NamedTuple's Python-level __new__; this is half the cost, and it
# runs once per message.
_new_status = tuple.__new__

#: Payloads at least this large are copied on a worker thread, in chunks; smaller ones are
#: cheaper inline (a 4 MiB copy holds the loop well under a millisecond or two).
THREAD_COPY_MIN = 4 << 20


@dataclass(frozen=True, slots=True)
class EngineStatistics:
    """A snapshot of one rank's engine."""

    pending_ops: int
    """Operations submitted and not finished."""
    active_copies: int
    """Payload copies running on worker threads."""
    streams: int
    """Streams of this rank, the default one included."""
    matcher: MatcherStatistics
    pool: PoolStatistics


def _describe(req: Request) -> str:
    if req.kind == "send":
        buf = req.buf
        size = f", {buf.nbytes} B {buf.dtype}" if buf is not None else ""
        return f"send(dst={req.peer}, tag={req.tag}{size})"
    if req.kind == "compute":
        return f"compute({req.desc * 1e-9:g} s)"
    src = "ANY_SOURCE" if req.peer == ANY_SOURCE else str(req.peer)
    tag = "ANY_TAG" if req.tag < 0 else str(req.tag)
    return f"{req.kind}(src={src}, tag={tag})"


class DeviceEngine:
    """One rank's engine (see module docs).  Created by the world, not by users."""

    def __init__(self, rank: int, size: int, transport: Transport, *,
                 loop: asyncio.AbstractEventLoop, eager_limit: int, pool_bytes: int,
                 clock: ModelClock | None = None, record: bool = False,
                 inline_copies: bool = False) -> None:
        self.rank = rank
        self.size = size
        self.loop = loop
        self.transport = transport
        self.eager_limit = eager_limit
        self.matcher = Matcher()
        self.pool = StagingPool(pool_bytes)
        self.closed = False
        self.log, self.trace = _logging.engine_logger(rank=rank, size=size)
        self.default_stream = Stream(self, 0, in_order=False)
        # Streams the program still holds: a dropped stream with nothing pending goes (its
        # pending requests keep it alive until they finish).
        self._streams: weakref.WeakSet[Stream] = weakref.WeakSet((self.default_stream,))
        self._next_sid = 0
        self._live: dict[Request, None] = {}
        #: Ops withdrawn lately (timed out, cancelled), for the messages of peers' timeouts.
        self._recent: deque[tuple[Request, str, float]] = deque(maxlen=16)
        self._pending_recvs = 0  # tracked recvs with a non-empty buffer
        self._recv_spans: SpanIndex | None = None  # their buffers, once two were pending
        self.gone: set[int] = set()
        self._copies = 0
        self._idle: asyncio.Future[None] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        #: Model time (the virtual clock, or scaled wall time) for compute and transfers.
        self.clock = clock if clock is not None else ModelClock(loop)
        #: Completed ops' records (modelled worlds only; None keeps the hot path bare).
        self.records: list[OpRecord] | None = [] if record else None
        #: Copy large payloads on the loop too (virtual time: threads would be real time).
        self.inline_copies = inline_copies
        self._compute_free_at = 0

    # -- submission -----------------------------------------------------------------------

    def new_stream(self) -> Stream:
        self._next_sid += 1
        stream = Stream(self, self._next_sid, in_order=True)
        self._streams.add(stream)
        return stream

    def track(self, req: Request) -> None:
        """Keep a request that did not finish as it was posted, and arm its timeout."""
        self._live[req] = None
        if req.kind == "recv" and req.buf is not None and req.buf.nbytes:
            self._pending_recvs += 1
            if self._recv_spans is not None:
                self._recv_spans.add(req.buf.mv, req)
        if req.timeout is not None and req._timer is None:
            req._timer = self.loop.call_later(req.timeout, self._on_timeout, req)

    def check_recv_buffer(self, buf: BufferView) -> None:
        """Refuse a recv buffer that overlaps the buffer of a pending recv of this rank.

        Raises:
            ValueError: it does (nothing is posted).
        """
        spans = self._recv_spans
        if spans is None:  # built on first need: most programs never have two pending
            spans = self._recv_spans = SpanIndex()
            for r in self._live:
                if r.kind == "recv" and r.buf is not None:
                    spans.add(r.buf.mv, r)
        owner = spans.conflict(buf.mv)
        if isinstance(owner, Request):
            raise ValueError(f"rank {self.rank}: the recv buffer overlaps the buffer of "
                             f"{_describe(owner)}, which is still pending: two recvs would "
                             "write the same memory")

    def start(self, req: Request) -> None:
        """Post a request that reached its turn on its stream (streams only)."""
        req._state = POSTED
        if req.kind == "compute":
            self._start_compute(req)
            return
        if req.kind == "send":
            if self.trace:
                self.log.debug("p2p.send.posted", peer=req.peer, tag=req.tag,
                               nbytes=req.buf.nbytes)  # type: ignore[union-attr]
            self.transport.post_send(self, req)
            return
        if self.trace:
            self.log.debug("p2p.recv.posted", peer=req.peer, tag=req.tag)
        buf = req.buf
        if buf is None:
            desc = req.desc = RecvDescriptor(req.peer, req.tag, None, None, req)
        else:
            desc = req.desc = RecvDescriptor(req.peer, req.tag, buf.nbytes, buf.dtype, req)
        env = self.matcher.post_recv(desc)
        if env is not None:
            self._receive(req, env)
            return
        if self.matcher.events:
            self._drain()
        # A message the gone peer sent before it left was taken above; nothing more comes.
        if req._state == POSTED and self.gone and self._unreachable(req.peer):
            self.withdraw(req, self.broken(req.peer))

    def probe_now(self, source: int, tag: int) -> Status | None:
        env = self.matcher.probe(source, tag)
        return None if env is None else Status(env.source, env.tag, env.nbytes, env.count)

    def post_probe(self, req: Request) -> None:
        """Post a blocking probe; it finishes with the Status of a fitting message."""
        req._state = POSTED
        req.desc = ProbeDescriptor(req.peer, req.tag, req)
        env = self.matcher.post_probe(req.desc)
        if env is not None:
            self._finish(req, DONE, Status(env.source, env.tag, env.nbytes, env.count), None)
            return
        req._track = 2
        self.track(req)
        if self.gone and self._unreachable(req.peer):
            self.withdraw(req, self.broken(req.peer))

    # -- arrival and matching -------------------------------------------------------------

    def deliver(self, env: Envelope) -> None:
        """An envelope arrived for this rank (transports only)."""
        matcher = self.matcher
        recv = matcher.deliver(env)
        if recv is not None:
            self._receive(recv.handle, env)  # type: ignore[arg-type]
        else:
            self.transport.unexpected(self, env)
        if matcher.events:
            self._drain()

    def _start_compute(self, req: Request) -> None:
        """A compute task occupies this rank's compute stream (FIFO) for its duration."""
        req._state = ACTIVE  # running compute cannot be withdrawn
        start = max(self.clock.now_ns(), self._compute_free_at)
        end = self._compute_free_at = start + req.desc
        self.clock.call_at(end, self._compute_done, req, start, end)

    def _compute_done(self, req: Request, start: int, end: int) -> None:
        if self.records is not None:
            from .sim.records import OpRecord

            req.record = OpRecord(rank=self.rank, kind="compute", peer=self.rank, tag=0,
                                  nbytes=0, chunks=1, start=start * 1e-9, end=end * 1e-9,
                                  mode="compute")
            self.records.append(req.record)
        self._finish(req, DONE, None, None)

    def _receive(self, req: Request, env: Envelope) -> None:
        req._state = ACTIVE
        if self.records is not None:
            self.transport.matched(self, env, req)
        if self.trace:
            self.log.debug("p2p.matched", peer=env.source, tag=env.tag, nbytes=env.nbytes)
        buf = req.buf
        if buf is None:  # recv_new: the buffer is made to the message's measure
            arr = new_array(env.dtype, env.count)
            req._result = arr
            dst = arr.data.cast("B")
        else:
            dst = buf.mv
        handle = env.handle
        if type(handle) is memoryview:  # eager: staged here on arrival
            n = env.nbytes
            dst[:n] = handle[:n]
            self.pool.release(handle)
            self.recv_done(req, env)
        else:
            self.transport.pull(self, env, req, dst)

    def _drain(self) -> None:
        matcher = self.matcher
        while (event := matcher.next_event()) is not None:
            if isinstance(event, RecvRejected):
                self._reject(event)
            elif isinstance(event, ProbeMatched):
                env = event.envelope
                status = Status(env.source, env.tag, env.nbytes, env.count)
                self._finish(event.probe.handle, DONE, status, None)  # type: ignore[arg-type]

    def _reject(self, event: RecvRejected) -> None:
        recv, env = event.recv, event.envelope
        cls = DTypeMismatchError if event.reason == "dtype" else TruncationError
        what = (f"message dtype {env.dtype} differs from the recv buffer's {recv.dtype}"
                if event.reason == "dtype" else
                f"message of {env.nbytes} B does not fit the recv buffer of {recv.capacity} B")
        exc = cls(f"rank {self.rank}: recv from rank {env.source} tag {env.tag}: {what}; "
                  "the buffer is untouched and the message waits for the next recv that fits",
                  rank=self.rank, source=env.source, tag=env.tag, nbytes=env.nbytes,
                  capacity=recv.capacity or 0, send_dtype=env.dtype, recv_dtype=recv.dtype or "")
        self._finish(recv.handle, DONE, None, exc)  # type: ignore[arg-type]

    # -- completion -----------------------------------------------------------------------

    def recv_done(self, req: Request, env: Envelope) -> None:
        """The payload is in the recv buffer (transports only)."""
        status = _new_status(Status, (env.source, env.tag, env.nbytes, env.count))
        result = status if req.buf is not None else (req._result, status)
        self._finish(req, DONE, result, None)

    def send_done(self, req: Request) -> None:
        """The send buffer may be reused (transports only)."""
        self._finish(req, DONE, None, None)

    def fail(self, req: Request, exc: BaseException) -> None:
        """Fail a request that has not matched (transports only)."""
        self._finish(req, DONE, None, exc)

    def _finish(self, req: Request, state: int, result: Any, exc: BaseException | None) -> None:
        req._state = state
        req._result = result
        req._exc = exc
        req.desc = None  # the descriptor points back at the request: break the cycle
        if req._waiters is not None or req._timer is not None:
            req._wake()
        if req._track:
            del self._live[req]
            if req.kind == "recv" and req.buf is not None and req.buf.nbytes:
                self._pending_recvs -= 1
                if self._recv_spans is not None:
                    if self._pending_recvs:
                        self._recv_spans.remove(req)
                    else:
                        self._recv_spans = None
            if req.kind == "probe":
                req._track = 0
            else:
                req.stream.finished(req)
            if self._idle is not None and not self._live:
                self._idle.set_result(None)
                self._idle = None

    def withdraw(self, req: Request, exc: BaseException | None, *, ask: bool = True) -> bool:
        """Withdraw a request that has not matched: cancel it (``exc`` None) or fail it.

        Returns True if it was withdrawn, or if its withdrawal was asked of its receiver
        (only with ``ask``: a send whose receiver is in another process decides; the
        transport then calls ``withdrawn`` or completes the send); False if it had matched
        or finished already.
        """
        state = req._state
        if state == QUEUED:
            req.stream.withdraw_queued(req)
        elif state != POSTED:
            return False
        elif req.kind == "send":
            verdict = self.transport.withdraw_send(self, req, exc, ask)
            if verdict != WITHDRAWN:
                return verdict == ASKED
        elif not self.matcher.cancel(req.desc):
            return False
        self.withdrawn(req, exc)
        return True

    def withdrawn(self, req: Request, exc: BaseException | None) -> None:
        """Finish a request that was withdrawn before it matched (a send's withdrawal may
        be asked of its receiver, which answers through the transport)."""
        if isinstance(exc, CommTimeoutError) or exc is None:
            how = "timed out" if exc is not None else "was cancelled"
            self._recent.append((req, how, self.loop.time()))
        self._finish(req, CANCELLED if exc is None else DONE, None, exc)

    def _on_timeout(self, req: Request) -> None:
        req._timer = None
        if req._state < ACTIVE:
            self.withdraw(req, self._timeout_error(req))

    def _timeout_error(self, req: Request) -> CommTimeoutError:
        """The error for a timed-out op, naming what its peer(s) had posted for this rank."""
        wild = req.kind != "send" and req.peer == ANY_SOURCE
        peers = [r for r in range(self.size) if r != self.rank] if wild else [req.peer]
        parts = []
        for peer in peers:
            posted = self.transport.describe_peer(self, peer) + [
                f"send(dst={self.rank}, tag={e.tag}, {e.nbytes} B {e.dtype}) unmatched here"
                for e in self.matcher.unexpected() if e.source == peer]
            if posted:
                parts.append(f"rank {peer} had posted {', '.join(posted)}")
            elif not wild:
                parts.append(f"rank {peer} had posted nothing for rank {self.rank}")
        timeout = req.timeout or 0.0
        if self.trace:
            self.log.debug("p2p.timeout", peer=req.peer, tag=req.tag, timeout=timeout)
        if req._state == QUEUED:  # its own stream held it: the peer is not to blame
            ahead = req.stream.statistics().active
            parts = [f"it was never posted: it waited on its stream behind {ahead} earlier "
                     "op(s) that had not finished"] + parts
        return CommTimeoutError(
            f"rank {self.rank}: {_describe(req)} timed out after {timeout:g} s; "
            + ("; ".join(parts) or "no rank had posted anything for it"),
            rank=self.rank, op=req.kind, peer=req.peer, tag=req.tag, timeout=timeout)

    # -- copies ---------------------------------------------------------------------------

    def copy_on_thread(self, dst: memoryview, src: memoryview, nbytes: int,
                       on_done: Callable[[], None]) -> None:
        """Copy ``nbytes`` from ``src`` to ``dst`` on this rank's worker thread and call
        ``on_done`` on the loop when it is in place.

        numpy releases the GIL while it copies, so the loop keeps running meanwhile.  The
        copy is one piece: cut into chunks (8-64 MiB) it ran at three quarters of the speed
        of one large copy here, which the C library makes with non-temporal stores, and
        every chunk that is its own job also waits for a round trip through the loop.  One
        worker per rank: the copy is memory-bound, a second thread would only take the
        loop's core.
        """
        if self.inline_copies:
            dst[:nbytes] = src[:nbytes]
            on_done()
            return
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"asynccomm-copy-{self.rank}")
        self._copies += 1
        d = np.frombuffer(dst, dtype=np.uint8, count=nbytes)
        s = np.frombuffer(src, dtype=np.uint8, count=nbytes)
        fut = self.loop.run_in_executor(self._executor, np.copyto, d, s)

        def copied(f: asyncio.Future[None]) -> None:
            f.result()
            self._copies -= 1
            if self.trace:
                self.log.debug("chunk.copied", offset=0, nbytes=nbytes)
            on_done()

        fut.add_done_callback(copied)

    # -- peers, diagnostics, closing ------------------------------------------------------

    def peer_gone(self, peer: int, exc: BaseException | None = None) -> None:
        """``peer`` closed or failed: fail recvs and probes that only it could have matched,
        and wildcard ones once no other rank is left (with ``exc``, or a
        ``CommBrokenError`` naming it)."""
        self.gone.add(peer)
        everyone = len(self.gone) >= self.size - 1
        for req in [r for r in self._live if r.kind in ("recv", "probe")
                    and (r.peer == peer or (everyone and r.peer == ANY_SOURCE))]:
            if req._state == POSTED:
                self.withdraw(req, exc if exc is not None and req.peer == peer
                              else self.broken(req.peer))

    def _unreachable(self, peer: int) -> bool:
        """True if no rank is left that could send what an op from ``peer`` waits for.  A
        wildcard gives up once every other rank has closed (a message to itself is matched
        when it is posted, so a rank waiting on ANY_SOURCE alone would wait forever)."""
        if peer == ANY_SOURCE:
            return self.size > 1 and len(self.gone) >= self.size - 1
        return peer in self.gone

    def broken(self, peer: int) -> CommBrokenError:
        """The error for an op of this rank that ``peer`` (``ANY_SOURCE``: every other
        rank), now closed, can never complete."""
        if peer == ANY_SOURCE:
            ranks = ", ".join(str(r) for r in sorted(self.gone))
            return CommBrokenError(f"every other rank has closed its communicator (ranks "
                                   f"{ranks}): nothing can match a recv from ANY_SOURCE",
                                   rank=self.rank, peer=ANY_SOURCE)
        return CommBrokenError(f"rank {peer} has closed its communicator", rank=self.rank,
                               peer=peer)

    def describe_pending(self, peer: int) -> list[str]:
        """This rank's unfinished ops that involve ``peer`` and that ``peer`` cannot see
        (posted sends sit in the peer's own matcher), for error messages."""
        out = []
        for r in self._live:
            if r.kind == "send":
                if r.peer == peer and r._state == QUEUED:
                    out.append(_describe(r) + " queued on its stream")
            elif r.peer in (peer, ANY_SOURCE):
                out.append(_describe(r))
        now = self.loop.time()
        for r, how, when in self._recent:  # withdrawn a moment ago: say so, not "nothing"
            if r.peer in (peer, ANY_SOURCE) and (r.kind != "send" or r.peer == peer):
                out.append(f"{_describe(r)}, which {how} {now - when:.3g} s before")
        return out

    @property
    def pending_ops(self) -> int:
        """How many ops of this rank are unfinished."""
        return len(self._live)

    def live_requests(self) -> list[Request]:
        """Every unfinished op of this rank (a copy)."""
        return list(self._live)

    def describe_all(self) -> list[str]:
        """Every unfinished op of this rank, for deadlock reports."""
        return [_describe(r) + ("" if r._state != QUEUED else " queued on its stream")
                for r in self._live]

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(pending_ops=len(self._live), active_copies=self._copies,
                                streams=len(self._streams), matcher=self.matcher.statistics(),
                                pool=self.pool.statistics())

    async def aclose(self) -> None:
        """Close: fail unmatched ops with ``CommClosedError``, let matched transfers finish,
        drop staged messages, and tell the transport.  Idempotent."""
        if self.closed:
            return
        self.closed = True
        exc = CommClosedError(f"rank {self.rank}'s communicator was closed with the op pending",
                              rank=self.rank)
        for req in list(self._live):
            self.withdraw(req, exc)
        if self._live:  # matched transfers still moving: they finish, they are not torn
            self._idle = self.loop.create_future()
            await asyncio.shield(self._idle)
        for env in self.matcher.unexpected():
            self.matcher.withdraw(env)
            handle = env.handle
            if type(handle) is memoryview:
                self.pool.release(handle)
            elif isinstance(handle, Request):
                handle._engine.fail(handle, self._closed_peer_error(handle))
            else:
                self.transport.discard(self, env)
        self.transport.engine_closed(self)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        self.log.info("comm.closed")

    def _closed_peer_error(self, sreq: Request) -> BaseException:
        return CommBrokenError(f"rank {self.rank} closed its communicator before receiving "
                               f"this message", rank=sreq._engine.rank, peer=self.rank)
