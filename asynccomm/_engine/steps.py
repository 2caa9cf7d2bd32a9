"""The fast lane's steps on an engine: small messages with no request, or a request that
finishes as it is made, where the general path (streams, events, the link) has nothing to
add.  Free functions of the engine (``engine.DeviceEngine``), twins of the C lane's
(``_native/_lane_steps.c``); a recv's own steps are in ``take``, a traced world's entries
in ``traced``.

The fast lane is open (``DeviceEngine.fast``) in-process on an instant link, and across
processes, but never while every message is logged; a traced world takes these steps
through the traced entries (``traced``, ``DeviceEngine.traced``).  A sender hands a small
message to the destination's engine (``offer``, or ``offer_bytes`` for bytes that arrived
from another process): a recv waiting there takes it at once (``complete``), or the
staging pool keeps it.  An op the lane finished as it was made is recorded here
(``finished``, ``done_as_posted``).  Each step returns "not handled", having changed
nothing, whenever the full rules are needed (wildcards, a misfit, a full pool): the
general path then runs.  These run once per message, so the bodies of what they share with
the general path are inlined.

Where the C lane is built (``_engine.lane``, ``_lane*.c``), ``offer`` and ``complete``
have C counterparts for the commonest op, which write the same fields in the same order
and hand anything else back; the steps here stay the reference, and run where the lane
does not (a world opened with ``native=False``, ``ASYNCCOMM_PURE_PYTHON=1``, other ops).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal

from .._buffers import new_array
from .._core.descriptors import STAGED, Message
from .._core.states import DONE, NEXT, Kind, check
from .._deadlines import end
from .._types import Status
from .fast import THREAD_COPY_MIN, TIMED_COPY_MIN, byte_view, bytes_of, new_status, status_of
from .flight import DONE_C, KIND_CODE
from .request import Wakes

if TYPE_CHECKING:
    from .engine import DeviceEngine
    from .request import Request

__all__ = ["complete", "done_as_posted", "finished", "offer", "offer_bytes", "probe_found"]


def offer(engine: DeviceEngine, source: int, tag: int, array: Any, nbytes: int, count: int,
          dtype: str, flow: int | str = 0) -> bool:
    """A small message from ``source``'s engine, in this process: a recv waiting at
    ``engine`` takes it at once, or the staging pool keeps it (its sender is then done).
    Returns False, having done nothing, when it must go the usual way (rendezvous, a full
    pool, wildcards or a misfit to judge).  ``flow``: its id in a traced world."""
    if engine.closed or nbytes >= THREAD_COPY_MIN:
        return False
    matcher = engine.matcher
    recv: Request | Literal[False] | None = matcher.claim_posted(  # type: ignore[assignment]
        source, tag, nbytes, dtype)
    if recv is False:
        return False
    if recv is not None:
        if nbytes >= TIMED_COPY_MIN:
            recv.t_match = engine.now()
        fast_copy = engine.copy  # (None: a Python world's)
        if recv.array is not None:  # both 1-D arrays of one dtype: a numpy copy
            if fast_copy is not None:
                fast_copy(recv.array, array, nbytes)
            else:
                recv.array[:count] = array
        elif recv.nbytes < 0:  # recv_new: a buffer made to the message's measure
            recv._result = array.copy()
        elif nbytes:
            recv.view[:nbytes] = bytes_of(array)  # type: ignore[index]
        if flow:
            recv.flow = flow
        complete(engine, recv, source, tag, nbytes, count)
        return True
    if nbytes > engine.eager_limit:
        return False
    buf = engine.pool.acquire(nbytes, tentative=True)
    if buf is None:
        return False
    fast_copy = engine.copy
    if fast_copy is not None:
        fast_copy(buf, array, nbytes)
    elif nbytes:
        buf[:nbytes] = bytes_of(array)
    msg = Message(source, tag, nbytes, count, dtype, STAGED, buf)
    if flow:
        msg.flow = flow
    matcher.enqueue(msg)
    if matcher.events:  # a probe saw it
        engine._drain()
    return True


def offer_bytes(engine: DeviceEngine, source: int, tag: int, view: memoryview, nbytes: int,
                count: int, dtype: str) -> bool:
    """``offer`` for a message whose payload is bytes that are readable only now (one
    that arrived inline from another process): a recv waiting at ``engine`` takes it at
    once; False, having done nothing, when it must be delivered the usual way."""
    recv: Request | Literal[False] | None = engine.matcher.claim_posted(  # type: ignore[assignment]
        source, tag, nbytes, dtype)
    if not recv:
        return False  # (``arrived`` numbers it, in a traced world)
    if engine.tracer is not None:  # number it as it arrives (``_engine.tracing`` Rule 4)
        recv.flow = engine.tracer.arrived_from(source)
    if nbytes >= TIMED_COPY_MIN:
        recv.t_match = engine.now()
    dst: Any
    fast_copy = engine.copy  # (None: a Python world's)
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
    complete(engine, recv, source, tag, nbytes, count)
    return True


def complete(engine: DeviceEngine, recv: Request, source: int, tag: int, nbytes: int,
             count: int) -> None:
    """What ``_received`` and ``_finish`` do for a recv the fast lane filled."""
    status = new_status(Status, (source, tag, nbytes, count, (count,)))
    recv._result = status if recv._result is None else (recv._result, status)
    if DONE not in NEXT[recv._state]:  # what _finish does, inlined: the hot path
        check(recv._state, DONE)
    recv._state = DONE
    recv.t_fin = t = engine.now()
    flight = engine.flight  # what FlightRecorder.add does, inlined: the hot path
    t_post = recv.t_post
    t_match = recv.t_match  # before a timed copy, else now
    if t_match < 0:
        t_match = t
    entry = (1, source, tag, nbytes, recv.stream.sid, 0, t_post, t_match, t)  # type: ignore[union-attr]
    flight.ring.append(entry)
    if engine.tracer is not None:  # RankTrace.add, inlined (offer set the flow)
        engine.tracer.ops.append((entry, getattr(recv, "flow", 0), None))
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
                Wakes.n += 1
    if recv._timer is not None:
        end(recv)
    if recv._tracked:
        stream = recv.stream
        if (stream is not None and not stream._queue and not stream._events
                and engine._idle is None):
            recv._tracked = False  # what _untrack does, inlined: the hot path
            engine._n_pending -= 1
            if recv.nbytes > 0:
                engine._pending_recvs -= 1
                if engine._recv_buffers is not None:  # (rows of one array)
                    if engine._pending_recvs:
                        engine._recv_buffers.remove(recv)
                    else:
                        engine._recv_buffers = None
            del stream._pending[recv.sseq]
        else:
            engine._untrack(recv)


def finished(engine: DeviceEngine, req: Request, result: Status | None,
             started: float = -1.0) -> Request:
    """``req`` finished as it was made (the fast lane did its work): mark it done.
    ``result``: a recv's Status (None for a send); ``started``: when its timed copy began
    (``take_now``'s ``taken_at``), else it took no time."""
    if DONE not in NEXT[req._state]:
        check(req._state, DONE)
    req._state = DONE
    req._result = result
    flow = 0 if engine.tracer is None else getattr(req, "flow", 0)
    if result is None:  # the fast lane makes sends and recvs only
        t0, t = done_as_posted(engine, 0, req.peer, req.tag, req.nbytes, started, flow)
    else:  # what arrived (from whom, with what tag), not what was asked
        t0, t = done_as_posted(engine, 1, result.source, result.tag, result.nbytes, started,
                               flow)
    req.t_post = req.t_match = t0
    req.t_fin = t
    return req


def done_as_posted(engine: DeviceEngine, kind: int, peer: int, tag: int, nbytes: int,
                   started: float, flow: int | str) -> tuple[float, float]:
    """Record an op of ``kind`` (0 send, 1 recv) done as it was posted: what
    ``FlightRecorder.add`` does, inlined, and ``RankTrace.add`` in a traced world
    (``flow``: its message's id).  ``started``: when its timed copy began (-1: none).
    Returns its (post and match, finish) times."""
    t = engine.now()
    t0 = started if started >= 0 else t
    entry = (kind, peer, tag, nbytes, 0, 0, t0, t0, t)
    flight = engine.flight
    flight.ring.append(entry)
    tally = (flight.recvs if kind else flight.sends)[peer]
    tally.n += 1
    tally.nbytes += nbytes
    tally.c += t - t0
    if engine.tracer is not None:
        engine.tracer.ops.append((entry, flow, None))
    return t0, t


#: A probe's kind in a flight entry.
_PROBE_C: Final = KIND_CODE[Kind.PROBE]


def probe_found(engine: DeviceEngine, source: int, tag: int, msg: Message) -> Status:
    """A blocking probe (``source``, ``tag``: wildcards allowed) that finds ``msg`` here as
    it is made: its Status, with no request, recorded as ``post_probe`` and ``_finish``
    record a probe that found its message at once (posted, then finished: two readings
    of the clock; no stream, no byte count, one op more that is neither a send nor a
    recv).  For an untraced engine that logs nothing."""
    t_post = engine.now()
    flight = engine.flight
    flight.ring.append((_PROBE_C, source, tag, -1, -1, DONE_C, t_post, -1.0, engine.now()))
    flight.others += 1
    return status_of(msg)
