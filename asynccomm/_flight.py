"""The flight recorder: the last N operations of a rank, always on, and its running totals.

How it works
------------
Rule 1: the engine adds one small tuple per finished op (``Entry``: kind, peer, tag, bytes,
stream, outcome, post/match/finish times); dicts are built only when someone asks
(``Communicator.flight_record()``, a dump).  That is one method call and one list append
per op on the hot path.
Rule 2: entries go to a current list; when it holds N, it becomes the previous list and
the one before that is folded into the totals.  So the last N ops are always at hand, and
``totals()`` (what ``Communicator.summary()`` reports on every world) counts every op.
Rule 3: times are seconds on the engine's clock (``clock_for``: the virtual loop's clock,
else ``time.perf_counter``); dicts give them relative to the world's start, None when
unknown (a send never sees its match when its message was staged; a queued op never
posted).

``ASYNCCOMM_FLIGHT=N`` sets N (default 1024).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from ._core.states import CANCELLED, QUEUED, Kind, State
from ._exceptions import CommTimeoutError
from ._types import ANY_SOURCE
from .sim.records import PeerTotals

if TYPE_CHECKING:
    from ._request import Request

__all__ = ["DEFAULT_SIZE", "Entry", "FlightRecorder", "PeerTotals", "clock_for",
           "flight_size", "format_dump", "outcome"]

#: Ops kept by default (``ASYNCCOMM_FLIGHT`` overrides).
DEFAULT_SIZE: Final = 1024

DONE_S: Final = "done"
CANCELLED_S: Final = "cancelled"
TIMED_OUT_S: Final = "timed out"
FAILED_S: Final = "failed"

#: (kind, peer, tag, nbytes, stream id (-1: none), outcome, t_post, t_match, t_finish);
#: times on the engine clock, negative where unknown.
Entry = tuple[Kind, int, int, int, int, str, float, float, float]


def flight_size() -> int:
    """N from ``ASYNCCOMM_FLIGHT`` (default 1024).

    Raises:
        ValueError: the variable is set to something that is not an int >= 0.
    """
    raw = os.environ.get("ASYNCCOMM_FLIGHT", "").strip()
    if not raw:
        return DEFAULT_SIZE
    if not raw.isdigit():
        raise ValueError(f"ASYNCCOMM_FLIGHT={raw!r} must be a number of ops >= 0")
    return int(raw)


def clock_for(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The clock ops are timed with: the virtual loop's own (model time), else the
    process's monotonic high-resolution clock (uvloop's ``time()`` has millisecond steps)."""
    from .sim.loop import VirtualTimeLoop

    return loop.time if isinstance(loop, VirtualTimeLoop) else time.perf_counter


def outcome(state: State, exc: BaseException | None) -> str:
    """How an op ended, in words."""
    if state is CANCELLED:
        return CANCELLED_S
    if exc is None:
        return DONE_S
    return TIMED_OUT_S if isinstance(exc, CommTimeoutError) else FAILED_S


class FlightRecorder:
    """One rank's recorder (see module docs)."""

    __slots__ = ("_cap", "_cur", "_ops", "_peers", "_prev", "origin", "size")

    def __init__(self, size: int, origin: float) -> None:
        self.size = size
        self._cap = max(size, 64)  # a list this long is rotated (size 0 keeps none)
        self.origin = origin
        self._cur: list[Entry] = []
        self._prev: list[Entry] = []
        self._peers: dict[int, list[Any]] = {}
        self._ops = 0  # folded ops of every kind

    def add(self, entry: Entry) -> None:
        """Record a finished op (the hot path: an append, a length test)."""
        cur = self._cur
        cur.append(entry)
        if len(cur) >= self._cap:
            self._prev, self._cur = cur, self._prev
            self._fold(self._cur)
            self._cur.clear()

    def _fold(self, entries: Iterable[Entry]) -> None:
        peers = self._peers
        for kind, peer, _tag, nbytes, _sid, how, t_post, t_match, t_fin in entries:
            self._ops += 1
            if how != DONE_S or (kind is not Kind.SEND and kind is not Kind.RECV):
                continue
            row = peers.get(peer)
            if row is None:
                row = peers[peer] = [0, 0, 0, 0, 0.0, 0.0]
            if kind is Kind.SEND:
                row[0] += 1
                row[2] += nbytes
            else:
                row[1] += 1
                row[3] += nbytes
            if t_match >= 0:
                row[4] += max(t_match - t_post, 0.0) if t_post >= 0 else 0.0
                row[5] += max(t_fin - t_match, 0.0)
            elif t_post >= 0:
                row[5] += max(t_fin - t_post, 0.0)

    def finished(self) -> int:
        """How many ops have finished since the world opened."""
        return self._ops + len(self._prev) + len(self._cur)

    def entries(self) -> list[Entry]:
        """The last ``size`` entries, oldest first."""
        both = self._prev + self._cur
        return both[len(both) - self.size:] if self.size else []

    def totals(self) -> tuple[int, list[PeerTotals]]:
        """(ops finished, per-peer totals), over every op since the world opened."""
        snapshot = FlightRecorder(0, self.origin)
        snapshot._peers = {p: list(row) for p, row in self._peers.items()}
        snapshot._ops = self._ops
        snapshot._fold(self._prev)
        snapshot._fold(self._cur)
        return snapshot._ops, [PeerTotals(p, *row) for p, row in sorted(snapshot._peers.items())]

    def dicts(self, rank: int, pending: Iterable[Request] = ()) -> list[dict[str, Any]]:
        """The last ops as dicts (``Communicator.flight_record()``), then the pending ones."""
        out = [self._dict(rank, e) for e in self.entries()]
        out += [self._dict(rank, pending_entry(r), pending=r) for r in pending]
        return out

    def _dict(self, rank: int, e: Entry, pending: Request | None = None) -> dict[str, Any]:
        kind, peer, tag, nbytes, sid, how, t_post, t_match, t_fin = e

        def rel(t: float) -> float | None:
            return t - self.origin if t >= 0 else None

        return {"rank": rank, "op": kind.value, "peer": peer, "tag": tag, "nbytes": nbytes,
                "stream": sid if sid >= 0 else None, "state": how,
                "post": rel(t_post), "match": rel(t_match), "finish": rel(t_fin)}


def pending_entry(req: Request) -> Entry:
    """An entry for an op that has not finished (state: queued, posted or matched)."""
    state = req.state
    how = "queued" if state is QUEUED else state.name.lower()
    if how == "active":
        how = "matched"
    sid = req.stream.sid if req.stream is not None else -1
    return (req.kind, req.peer, req.tag, req.nbytes, sid, how, req.t_post, req.t_match, -1.0)


def _fmt_t(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f}ms"


def format_entry(d: dict[str, Any]) -> str:
    """One line of a dump: ``recv src=1 tag=0 8 B stream 0 posted post=1.234ms ...``."""
    op = d["op"]
    who = "dst" if op == "send" else "src"
    peer = d["peer"]
    peer_s = "ANY_SOURCE" if peer == ANY_SOURCE and op != "send" else str(peer)
    tag = "ANY_TAG" if d["tag"] < 0 else str(d["tag"])
    where = f"stream {d['stream']}" if d["stream"] is not None else "no stream"
    size = f" {d['nbytes']} B" if d["nbytes"] >= 0 and op in ("send", "recv") else ""
    return (f"{op} {who}={peer_s} tag={tag}{size} {where} {d['state']} "
            f"post={_fmt_t(d['post'])} match={_fmt_t(d['match'])} "
            f"finish={_fmt_t(d['finish'])}")


def format_dump(records: dict[int, list[dict[str, Any]]], *, last: int | None = None) -> str:
    """Every rank's flight record, human-readable (the last ``last`` finished ops of each,
    and every pending one)."""
    lines = []
    for rank in sorted(records):
        rows = records[rank]
        finished = [d for d in rows if d["finish"] is not None]
        pending = [d for d in rows if d["finish"] is None]
        shown = finished if last is None else finished[-last:] if last else []
        lines.append(f"rank {rank}: {len(pending)} pending op(s), last {len(shown)} of "
                     f"{len(finished)} finished op(s) recorded")
        lines += [f"  pending  {format_entry(d)}" for d in pending]
        lines += [f"  finished {format_entry(d)}" for d in shown]
    return "\n".join(lines)


def measured_record(req: Request, rank: int, origin: float) -> Any:
    """The ``OpRecord`` of a finished send, recv or compute, from its measured times (seconds
    since the world opened); None for other ops or when the times are unknown."""
    from .sim.records import OpRecord

    t_fin = getattr(req, "t_fin", -1.0)
    if req.kind is Kind.PROBE or t_fin < 0:
        return None
    start = (req.t_post if req.t_post >= 0 else t_fin) - origin
    peer = req.peer
    status = req.status
    if status is not None:
        peer = status.source
    nbytes = status.nbytes if status is not None else max(req.nbytes, 0)
    return OpRecord(rank=rank, kind=req.kind.value, peer=peer, tag=req.tag if req.tag >= 0
                    else (status.tag if status is not None else 0), nbytes=nbytes, chunks=1,
                    start=start, end=max(t_fin - origin, start), mode="measured")


def entry(req: Request, how: str, t_fin: float) -> Entry:
    """The entry of an op that just finished (a recv names the rank it took from)."""
    peer, tag, nbytes = req.peer, req.tag, req.nbytes
    if how == DONE_S and req.kind is Kind.RECV:  # what arrived, not what was asked
        status = req.status
        if status is not None:
            peer, tag, nbytes = status.source, status.tag, status.nbytes
    sid = req.stream.sid if req.stream is not None else -1
    return (req.kind, peer, tag, nbytes, sid, how, req.t_post, req.t_match, t_fin)
