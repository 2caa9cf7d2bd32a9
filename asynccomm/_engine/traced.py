"""The fast lane in a traced world: the same steps, with each message numbered and each op
handed to the rank's trace.

Tracing needs every op's flight-recorder entry and every message's flow id (``_engine.tracing``
Rule 4: the k-th message from rank s to rank d).  On the general path a request carries
both.  Here, in-process, the sender numbers the message before offering it (the number is
kept only if the offer is taken) and the destination's recv or staged message carries the
id (``offer``); across processes the sender counts what it sent and the receiver numbers
what arrives (``offer_bytes``, or ``arrived``), in the order MPI keeps.  A recv that takes
a staged message reads the id off it.  Ops that finish here are traced here; a recv posted
here and completed later is traced where it completes (``_complete_fast`` or the general
path).  What the fast lane cannot do goes the general way, which traces as always.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from .._core.states import Kind
from .fast import FastLane
from .request import Request

if TYPE_CHECKING:
    from .._types import Status

__all__ = ["TracedLane"]

SEND = Kind.SEND
RECV = Kind.RECV


class TracedLane(FastLane):
    """The fast lane's steps with the traced ones of ``DeviceEngine`` (see module docs)."""

    if not TYPE_CHECKING:  # (mypy would refuse the fields the class that mixes it in lists)
        __slots__ = ()  # that class lists the fields

    peers: list[Any] | None

    def send_traced(self, dst: int, tag: int, array: Any, nbytes: int, count: int,
                    dtype: str, handle: bool,
                    timeout: float | None) -> Request | None | Literal[False]:
        """``_send_op``'s fast lane, traced: the finished request (``handle``), None, or
        False, having done nothing, when the send must go the general way."""
        tracer = self.tracer
        assert tracer is not None
        k = tracer.sent[dst] + 1
        flow = tracer.fid(self.rank, dst, k)
        if self.peers is not None:  # in-process: the message carries its number
            if not self.peers[dst].offer(self.rank, tag, array, nbytes, count, dtype, flow):
                return False
        elif not self.link.send_now(dst, tag, array, nbytes, count, dtype):
            return False  # (across processes the receiver numbers what arrives)
        tracer.sent[dst] = k
        if not handle:
            self.done_as_posted(0, dst, tag, nbytes, -1.0, flow)
            return None
        req = Request(self, SEND, dst, tag, None, nbytes, count, dtype,
                      self.default_stream, timeout, array)
        req.flow = flow
        return self.finished(req, None)  # traces it

    def recv_traced(self, src: int, tag: int, array: Any, nbytes: int, count: int,
                    dtype: str, handle: bool, timeout: float | None) -> Request | Status:
        """``_recv_op``'s fast lane, traced (an exact source and tag): the Status of a recv
        a staged message completes at once (``handle`` False), else its request."""
        waiting = self.matcher.waiting(src, tag)  # what take_now takes, if it takes one
        status = self.take_now(src, tag, array, nbytes, dtype)
        if status is not None and not handle:
            self.done_as_posted(1, status.source, status.tag, status.nbytes, self.taken_at,
                                getattr(waiting, "flow", 0))
            return status
        req = Request(self, RECV, src, tag, None, nbytes, count, dtype,
                      self.default_stream, timeout, array)
        if status is None:
            self.post_now(req)  # traced where it completes
            return req
        req.flow = getattr(waiting, "flow", 0)
        return self.finished(req, status, self.taken_at)  # traces it
