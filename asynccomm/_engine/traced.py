"""The fast lane in a traced world: the same steps, with each message numbered and each op
handed to the rank's trace.  Free functions of the engine (``engine.DeviceEngine``): the
entries ``Communicator._send_op``/``_recv_op`` take in a traced world, as the C lane's
``send``/``recv`` (``_native/_lane.c``) are in a traced world of its own.

Tracing needs every op's flight-recorder entry and every message's flow id (``_engine.tracing``
Rule 4: the k-th message from rank s to rank d).  On the general path a request carries
both.  Here, in-process, the sender numbers the message before offering it (the number is
kept only if the offer is taken) and the destination's recv or staged message carries the
id (``steps.offer``); across processes the sender counts what it sent and the receiver
numbers what arrives (``steps.offer_bytes``, or ``arrived``), in the order MPI keeps.  A
recv that takes a staged message reads the id off it.  Ops that finish here are traced
here; a recv posted here and completed later is traced where it completes
(``steps.complete`` or the general path).  What the fast lane cannot do goes the general
way, which traces as always.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from .._core.states import Kind
from .request import Request
from .steps import done_as_posted, finished, offer
from .take import post_now, take_now

if TYPE_CHECKING:
    from .._types import Status
    from .engine import DeviceEngine

__all__ = ["recv_traced", "send_traced"]

SEND = Kind.SEND
RECV = Kind.RECV


def send_traced(engine: DeviceEngine, dst: int, tag: int, array: Any, nbytes: int,
                count: int, dtype: str, handle: bool,
                timeout: float | None) -> Request | None | Literal[False]:
    """``_send_op``'s fast lane, traced: the finished request (``handle``), None, or
    False, having done nothing, when the send must go the general way."""
    tracer = engine.tracer
    assert tracer is not None
    k = tracer.sent[dst] + 1
    flow = tracer.fid(engine.rank, dst, k)
    if engine.peers is not None:  # in-process: the message carries its number
        if not offer(engine.peers[dst], engine.rank, tag, array, nbytes, count, dtype, flow):
            return False
    elif not engine.link.send_now(dst, tag, array, nbytes, count, dtype):
        return False  # (across processes the receiver numbers what arrives)
    tracer.sent[dst] = k
    if not handle:
        done_as_posted(engine, 0, dst, tag, nbytes, -1.0, flow)
        return None
    req = Request(engine, SEND, dst, tag, None, nbytes, count, dtype,
                  engine.default_stream, timeout, array)
    req.flow = flow
    return finished(engine, req, None)  # traces it


def recv_traced(engine: DeviceEngine, src: int, tag: int, array: Any, nbytes: int,
                count: int, dtype: str, handle: bool,
                timeout: float | None) -> Request | Status:
    """``_recv_op``'s fast lane, traced (wildcards allowed, as the C lane takes them): the
    Status of a recv a staged message completes at once (``handle`` False), else its
    request."""
    waiting = engine.matcher.waiting(src, tag)  # what take_now takes, if it takes one
    status = take_now(engine, src, tag, array, nbytes, dtype)
    if status is not None and not handle:
        done_as_posted(engine, 1, status.source, status.tag, status.nbytes,
                       engine.taken_at, getattr(waiting, "flow", 0))
        return status
    req = Request(engine, RECV, src, tag, None, nbytes, count, dtype,
                  engine.default_stream, timeout, array)
    if status is None:
        post_now(engine, req)  # traced where it completes
        return req
    req.flow = getattr(waiting, "flow", 0)
    return finished(engine, req, status, engine.taken_at)  # traces it
