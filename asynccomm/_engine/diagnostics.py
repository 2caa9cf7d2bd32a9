"""What the engine says when something goes wrong: descriptions of ops and the errors that
name who is to blame (a peer's pending ops in a timeout, the misfit of a rejected recv,
the closed ranks of a broken op)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import numpy as np

from .._core.states import QUEUED, Kind
from .._exceptions import (
    CommBrokenError,
    CommTimeoutError,
    DTypeMismatchError,
    TransportError,
    TruncationError,
)
from .._types import ANY_SOURCE
from ..transports.base import gone_error
from .flight import format_dump
from .waits import EngineView

if TYPE_CHECKING:
    from .._core.matching import RecvRejected
    from .request import Request

__all__ = ["broken", "describe", "failed_reason", "flight_dump", "fresh_copy", "pending_for",
           "rejection", "timeout_error"]


def describe(req: Request) -> str:
    """``send(dst=1, tag=0, 8 B <f8)``, ``recv(src=ANY_SOURCE, tag=3)``, ``compute(0.5 s)``."""
    kind = req.kind
    if kind is Kind.SEND:
        return f"send(dst={req.peer}, tag={req.tag}, {req.nbytes} B {req.dtype})"
    if kind is Kind.COMPUTE:
        return f"compute({req.duration_ns * 1e-9:g} s)"
    src = "ANY_SOURCE" if req.peer == ANY_SOURCE else str(req.peer)
    tag = "ANY_TAG" if req.tag < 0 else str(req.tag)
    return f"{kind.value}(src={src}, tag={tag})"


def dtype_label(code: str | None) -> str:
    """A dtype's name for people (``int64``, not ``<i8``)."""
    if code is None:
        return "any"
    if code == "|V1":
        return "object (send_obj)"
    try:
        return np.dtype(code).name
    except TypeError:
        return code


def rejection(rank: int, event: RecvRejected) -> Exception:
    """The error of a recv that matched a message it cannot take (Rule 4 of matching)."""
    recv, env = event.recv, event.envelope
    cls = DTypeMismatchError if event.reason == "dtype" else TruncationError
    what = (f"message dtype {dtype_label(env.dtype)} differs from the recv buffer's "
            f"{dtype_label(recv.dtype)}"
            if event.reason == "dtype" else
            f"message of {env.nbytes} B does not fit the recv buffer of {recv.nbytes} B")
    if env.dtype == "|V1" and recv.dtype != "|V1":
        what += " (the message is an object, sent with send_obj: receive it with recv_obj)"
    return cls(f"rank {rank}: recv from rank {env.source} tag {env.tag}: {what}; "
               "the buffer is untouched and the message waits for the next recv that fits",
               rank=rank, source=env.source, tag=env.tag, nbytes=env.nbytes,
               capacity=max(recv.nbytes, 0), send_dtype=env.dtype or "",
               recv_dtype=recv.dtype or "")


def failed_reason(exc: BaseException) -> str:
    """What a rank that failed with ``exc`` is said to have done, for its peers."""
    if isinstance(exc, KeyboardInterrupt):
        return "was interrupted (KeyboardInterrupt)"
    if isinstance(exc, asyncio.CancelledError):
        return "was cancelled"
    return f"failed with {type(exc).__name__}: {exc}".replace("\n", " ")


def broken(rank: int, peer: int, gone: set[int], why: str | None = None,
           cause: BaseException | None = None) -> CommBrokenError:
    """The error for an op of ``rank`` that ``peer`` (``ANY_SOURCE``: every other rank),
    now closed, can never complete; ``why`` is what ``peer`` said when it closed (None:
    it closed normally), ``cause`` its failure, where it is known here."""
    if peer != ANY_SOURCE:
        return gone_error(rank, peer, why, cause)
    if peer == ANY_SOURCE:
        ranks = ", ".join(str(r) for r in sorted(gone))
        return CommBrokenError(f"every other rank has closed its communicator (ranks "
                               f"{ranks}): nothing can match a recv from ANY_SOURCE",
                               rank=rank, peer=ANY_SOURCE)
    return CommBrokenError(f"rank {peer} has closed its communicator", rank=rank, peer=peer)


def fresh_copy(exc: BaseException) -> BaseException:
    """A copy of a transport failure for one more op (each op raises its own instance)."""
    if isinstance(exc, TransportError):
        fresh = TransportError(str(exc), rank=exc.rank)
        fresh.__cause__ = exc.__cause__
        return fresh
    return exc


def pending_for(engine: EngineView, peer: int) -> list[str]:
    """``engine``'s unfinished ops that involve ``peer`` and that ``peer`` cannot see
    (posted sends sit in the peer's own matcher), and those it withdrew a moment ago."""
    out = []
    for r in engine.live_requests():
        if r.kind is Kind.SEND:
            if r.peer == peer and r._state is QUEUED:
                out.append(describe(r) + " queued on its stream")
        elif r.peer in (peer, ANY_SOURCE):
            out.append(describe(r))
    now = engine.loop.time()
    for r, how, when in engine.recent:  # withdrawn a moment ago: say so, not "nothing"
        if r.peer in (peer, ANY_SOURCE) and (r.kind is not Kind.SEND or r.peer == peer):
            out.append(f"{describe(r)}, which {how} {now - when:.3g} s before")
    return out


def flight_dump(engine: EngineView, last: int = 16) -> str:
    """The flight records of ``engine``'s rank and, in-process, of every rank of its world
    (their pending ops and last ``last`` finished ones), for a timeout's log event."""
    engines = getattr(engine.link, "endpoints", None) or [engine]
    return format_dump({e.rank: e.flight.dicts(e.rank, e.live_requests()) for e in engines},
                       last=last)


def timeout_error(engine: EngineView, req: Request) -> CommTimeoutError:
    """The error for a timed-out op, naming what its peer(s) had posted for this rank."""
    rank = engine.rank
    wild = req.kind is not Kind.SEND and req.peer == ANY_SOURCE
    peers = [r for r in range(engine.size) if r != rank] if wild else [req.peer]
    parts = []
    for peer in peers:
        posted = engine.link.describe(rank, peer) + [
            f"send(dst={rank}, tag={e.tag}, {e.nbytes} B {e.dtype}) unmatched here"
            for e in engine.matcher.unexpected() if e.source == peer]
        if posted:
            parts.append(f"rank {peer} had posted {', '.join(posted)}")
        elif engine.link.remote:
            if not wild:
                parts.append(f"no message from rank {peer} had arrived (its recvs live in its "
                             "own process, out of sight)")
        elif not wild:
            parts.append(f"rank {peer} had posted nothing for rank {rank}")
    timeout = req.timeout or 0.0
    if engine.trace:
        engine.log.debug("p2p.timeout", peer=req.peer, tag=req.tag, timeout=timeout)
    if req._state is QUEUED:  # its own stream held it: the peer is not to blame
        ahead = req.stream.statistics().active if req.stream is not None else 0
        parts = [f"it was never posted: it waited on its stream behind {ahead} earlier "
                 "op(s) that had not finished"] + parts
    return CommTimeoutError(
        f"rank {rank}: {describe(req)} timed out after {timeout:g} s; "
        + ("; ".join(parts) or "no rank had posted anything for it"),
        rank=rank, op=req.kind.value, peer=req.peer, tag=req.tag, timeout=timeout)
