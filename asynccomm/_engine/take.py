"""The fast lane's steps for a new recv: a message already here taken at once
(``take_now``), or the recv posted on the default stream directly (``post_now``).  Free
functions of the engine (``engine.DeviceEngine``), twins of the C lane's
(``_native/_lane_recv.c``: ``take``, ``post``); each returns "not handled", having changed
nothing, wherever the full rules are needed (see ``steps``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._core.descriptors import AT_SENDER, STAGED, Message
from .._core.states import DONE, NEXT, POSTED, check
from .fast import THREAD_COPY_MIN, TIMED_COPY_MIN, bytes_of, status_of

if TYPE_CHECKING:
    from .._types import Status
    from .engine import DeviceEngine
    from .request import Request

__all__ = ["post_now", "take_now"]


def take_now(engine: DeviceEngine, source: int, tag: int, array: Any, nbytes: int,
             dtype: str) -> Status | None:
    """The Status of a recv (into the 1-D ``array``; wildcards allowed) that a message
    already at ``engine`` completes at once (``engine.taken_at``: when its timed copy
    began, else -1); None, having done nothing, when the recv must be posted the usual
    way."""
    matcher = engine.matcher
    msg: Message | None = matcher.waiting(source, tag)  # type: ignore[assignment]
    if msg is None:
        return None
    n = msg.nbytes
    where = msg.where
    if (msg.dtype != dtype or n > nbytes or not (
            where == STAGED or (where == AT_SENDER and engine.instant
                                and n < THREAD_COPY_MIN))):
        return None
    matcher.take(msg)
    engine.taken_at = engine.now() if n >= TIMED_COPY_MIN else -1.0
    fast_copy = engine.copy  # (None: a Python world's)
    if fast_copy is not None:
        fast_copy(array, msg.view, n)
    elif n:
        bytes_of(array)[:n] = memoryview(msg.view)[:n]  # type: ignore[arg-type]
    if where == STAGED:
        engine.pool.release(msg.view)  # type: ignore[arg-type]
    engine.link.received(msg, engine.rank)  # its sender may complete, its credit go back
    return status_of(msg)  # the message's own source and tag


def post_now(engine: DeviceEngine, req: Request) -> None:
    """Post a recv on ``engine``'s default stream with nothing queued there (the fast
    lane's ``Stream._submit`` and ``DeviceEngine.start`` in one)."""
    if POSTED not in NEXT[req._state]:
        check(req._state, POSTED)
    req._state = POSTED
    req.t_post = engine.now()
    matcher = engine.matcher
    msg = matcher.post_recv(req)
    if msg is not None:
        engine._take(req, msg)  # type: ignore[arg-type]
    elif matcher.events:
        engine._drain()
    if req._state >= DONE:  # (a matched one is pending until its data lands)
        return
    stream = engine.default_stream  # what Stream._track and track do, inlined
    stream._seq = seq = stream._seq + 1
    req.sseq = seq
    stream._pending[seq] = req
    req._tracked = True
    engine._n_pending += 1
    if req.nbytes > 0:
        engine._pending_recvs += 1
        if engine._recv_buffers is not None:
            engine._add_buffer(engine._recv_buffers, req)
    if req.timeout is not None:
        engine.deadlines.arm(req, req.timeout)
    if engine.gone and engine._unreachable(req.peer):
        engine.withdraw(req, engine.broken(req.peer))
