"""Streams: ordered queues of operations, like an ``aclrtStream`` or a CUDA stream.

How it works
------------
Rule 1: an explicit stream (``comm.stream()``) is strictly in order: an operation is posted
only when every operation before it on the stream has finished, as in HCCL.  So an
``irecv`` followed by an ``isend`` on one stream does not post the send until the recv has
completed: a ring exchange on one explicit stream deadlocks.  Put the two on two streams,
or use ``batch(..., stream=s)``, whose ops are posted together.
Rule 2: the default stream posts each operation as soon as it is submitted, so posting
order decides matching and isend/irecv exchanges between two ranks cannot deadlock.
Rule 3: ``stream.wait(event)`` holds every later operation of the stream until the event
fires, on either kind of stream.
Rule 4: ``stream.record()`` returns an event that fires when every operation submitted to
the stream before it has finished (succeeded, failed or been cancelled).

Items in the queue are single requests, groups (a ``batch``, posted together) or event
waits.  Pending requests are kept in submission order, so the oldest unfinished one is the
first key: that is all ``record()`` needs.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Protocol, final

from .._core.states import DONE, QUEUED
from .._exceptions import CommClosedError
from .request import Request

__all__ = ["Event", "Stream", "StreamOwner", "StreamStatistics", "idle"]


class StreamOwner(Protocol):
    """What a stream needs of the engine that owns it."""

    rank: int
    loop: asyncio.AbstractEventLoop
    closed: bool

    def start(self, req: Request) -> None:
        """Post a request whose turn has come."""

    def track(self, req: Request) -> None:
        """Keep a request that did not finish as it was posted."""


@final
class Event:
    """A point in a stream, from ``Stream.record()``: it fires when every operation
    submitted to the stream before it has finished.

    Instances are created by ``Stream.record`` and cannot be created directly.
    """

    __slots__ = ("_fired", "_loop", "_streams", "_waiters", "seq", "stream")

    def __init__(self, stream: Stream, seq: int) -> None:
        self.stream = stream
        self.seq = seq
        self._loop = stream._owner.loop
        self._fired = False
        self._waiters: list[asyncio.Future[None]] = []
        self._streams: list[Stream] = []  # streams holding ops until this fires

    def __repr__(self) -> str:
        return f"<Event {self.stream!r} seq={self.seq} {'fired' if self._fired else 'pending'}>"

    def done(self) -> bool:
        """True once the event fired (aclrtQueryEvent)."""
        return self._fired

    async def synchronize(self) -> None:
        """Wait until the event fires (aclrtSynchronizeEvent)."""
        if not self._fired:
            fut = self._loop.create_future()
            self._waiters.append(fut)
            await fut

    def _fire(self) -> None:
        self._fired = True
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()
        streams, self._streams = self._streams, []
        for stream in streams:
            stream._event_fired()


@dataclass(frozen=True, slots=True)
class StreamStatistics:
    """A snapshot of a stream."""

    queued: int
    """Operations waiting to be posted (behind earlier ones or an event wait)."""
    active: int
    """Operations posted and not finished."""
    submitted: int
    """Operations submitted so far."""


class _Wait:
    __slots__ = ("event",)

    def __init__(self, event: Event) -> None:
        self.event = event


@final
class Stream:
    """An ordered queue of operations on one communicator (see module docs).

    Instances are created by ``Communicator.stream()`` and cannot be created directly.
    """

    __slots__ = ("__weakref__", "_events", "_owner", "_pending", "_pumping", "_queue",
                 "_queued", "_seq", "in_order", "sid")

    def __init__(self, owner: StreamOwner, sid: int, *, in_order: bool) -> None:
        self._owner = owner
        self.sid = sid
        self.in_order = in_order
        self._queue: deque[Request | list[Request] | _Wait] = deque()
        # Unfinished requests in submission order (queued ones included), so the oldest is
        # the first key: that is all record() needs.
        self._pending: OrderedDict[int, Request] = OrderedDict()
        self._queued = 0  # of them, how many wait in the queue (not posted yet)
        self._events: deque[Event] = deque()
        self._seq = 0
        self._pumping = False

    def __repr__(self) -> str:
        kind = "default" if not self.in_order else f"stream {self.sid}"
        return f"<Stream rank={self._owner.rank} {kind}>"

    # -- public ---------------------------------------------------------------------------

    async def synchronize(self) -> None:
        """Wait until every operation submitted so far has finished (aclrtSynchronizeStream).

        Raises:
            CommClosedError: if the communicator is closed.
        """
        await self.record().synchronize()

    def record(self) -> Event:
        """An event that fires when every operation submitted so far has finished.

        Raises:
            CommClosedError: if the communicator is closed.
        """
        self._check_open()
        # Ops that finished as they were posted are not tracked and not counted: the event
        # covers every op still pending now.
        event = Event(self, self._seq)
        if not self._pending or next(iter(self._pending)) > event.seq:
            event._fire()
        else:
            self._events.append(event)
        return event

    def wait(self, event: Event) -> None:
        """Hold every later operation of this stream until ``event`` fires.

        Raises:
            TypeError: if ``event`` is not an Event.
            ValueError: if it belongs to another communicator.
            CommClosedError: if the communicator is closed.
        """
        if not isinstance(event, Event):
            raise TypeError(f"expected an Event, got {type(event).__name__}")
        if event.stream._owner is not self._owner:
            raise ValueError("the event belongs to another communicator")
        self._check_open()
        if not event._fired:
            self._queue.append(_Wait(event))
            event._streams.append(self)

    def statistics(self) -> StreamStatistics:
        return StreamStatistics(queued=self._queued, active=len(self._pending) - self._queued,
                                submitted=self._seq)

    # -- engine side ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._owner.closed:
            raise CommClosedError(f"rank {self._owner.rank}'s communicator is closed",
                                  rank=self._owner.rank)

    def _submit(self, item: Request | list[Request]) -> None:
        """Post a request or a group now if the stream allows it, else queue it."""
        if self._queue or (self.in_order and len(self._pending) > self._queued):
            for req in (item if isinstance(item, list) else (item,)):
                self._track(req)
                self._queued += 1
            self._queue.append(item)
        elif isinstance(item, list):
            self._launch(item)
        else:
            # The hot path: one op on an idle stream.  An op that finishes as it is posted
            # (an eager send, a recv whose message was waiting) is never tracked at all.
            self._owner.start(item)
            if item._state < DONE:
                self._track(item)

    def _launch(self, reqs: list[Request]) -> None:
        """Post a group together and track the members that did not finish at once."""
        owner = self._owner
        for req in reqs:
            if req._state is QUEUED:  # a member withdrawn while queued is not posted
                owner.start(req)
        for req in reqs:
            if req._state < DONE:
                self._track(req)

    def _track(self, req: Request) -> None:
        if req._tracked:
            return
        self._seq += 1
        req.sseq = self._seq
        self._pending[req.sseq] = req
        self._owner.track(req)

    def _finished(self, req: Request) -> None:
        """A tracked request of this stream reached its end (engine only)."""
        del self._pending[req.sseq]
        if self._queue:
            self._pump()
        if self._events:
            self._fire_events()

    def _withdraw_queued(self, req: Request) -> None:
        """Remove a request that was never posted from the queue (engine only)."""
        for item in self._queue:
            if item is req:
                self._queue.remove(item)
                self._queued -= 1
                break
            if isinstance(item, list) and req in item:
                self._queued -= 1
                if all(r is req or r._state >= DONE for r in item):
                    self._queue.remove(item)
                break

    def _event_fired(self) -> None:
        """Some event fired: a wait at the head of the queue may be over (engine only)."""
        if self._queue and isinstance(self._queue[0], _Wait):
            self._pump()

    def _pump(self) -> None:
        # Ops that finish as they start call finished() -> _pump() again; the guard keeps
        # that flat (one loop here) instead of recursing once per queued op.
        if self._pumping:
            return
        self._pumping = True
        try:
            queue = self._queue
            while queue:
                head = queue[0]
                if isinstance(head, _Wait):
                    if not head.event._fired:
                        return
                    queue.popleft()
                    continue
                if self.in_order and len(self._pending) > self._queued:
                    return
                queue.popleft()
                group = head if isinstance(head, list) else [head]
                self._queued -= sum(1 for r in group if r._state is QUEUED)
                self._launch(group)
        finally:
            self._pumping = False

    def _fire_events(self) -> None:
        pending = self._pending
        events = self._events
        while events and (not pending or next(iter(pending)) > events[0].seq):
            events.popleft()._fire()


def idle(stream: object, engine: object) -> bool:
    """Whether an op posted on ``stream`` now would start at once (``Stream._submit``):
    ``stream`` is a Stream of ``engine`` with nothing queued on it, nor, where it keeps
    its order, pending.  False for anything else (``Communicator._check_stream`` then says
    what is wrong)."""
    return (type(stream) is Stream and stream._owner is engine and not stream._queue
            and not (stream.in_order and len(stream._pending) > stream._queued))
