"""The flight recorder: the last N operations of a rank, always on, and its running totals.

How it works
------------
Rule 1: the engine adds one small tuple per finished op (``Entry``: kind and outcome as
small ints, peer, tag, bytes, stream, post/match/finish times) to a ring of N (a
``deque`` with ``maxlen``); dicts are built only when someone asks
(``Communicator.flight_record()``, a dump).
Rule 2: the same step adds the op to per-peer totals (ops, bytes, seconds waiting and
copying: what ``Communicator.summary()`` reports on every world), one ``Tally`` per peer
and kind, made on first use (a rank of a large world talks to few peers).  The fast lane
does both inline: a clock read, a tuple, an append and a few attribute updates per op.
In a world on the C lane (``_engine.lane``), the ring is its ``Ring`` and the tallies its
``Tally``: the same entries and totals, kept as numbers, so recording an op makes no
Python objects.
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
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Final, Protocol

from .._core.states import ACTIVE, CANCELLED, QUEUED, Kind, State
from .._exceptions import CommTimeoutError
from .._types import ANY_SOURCE, Status
from ..sim.loop import VirtualTimeLoop
from ..sim.records import OpRecord, PeerTotals


class Op(Protocol):
    """What the recorder reads of an op (``request.Request``, which records itself here:
    named by what it has, so neither module imports the other)."""

    kind: Kind
    peer: int
    tag: int
    nbytes: int
    t_post: float
    t_match: float
    _result: Any

    @property
    def state(self) -> State: ...

    @property
    def status(self) -> Status | None: ...

    @property
    def stream(self) -> Any: ...


__all__ = ["DEFAULT_SIZE", "Entry", "FlightRecorder", "PeerTotals", "clock_for",
           "flight_size", "format_dump"]

#: Ops kept by default (``ASYNCCOMM_FLIGHT`` overrides).
DEFAULT_SIZE: Final = 1024

_SEND: Final = Kind.SEND
_RECV: Final = Kind.RECV
_PROBE: Final = Kind.PROBE

#: Kind codes in entries, and their names.
RECV_C: Final = 1
KIND_NAMES: Final = ("send", "recv", "probe", "compute")
KIND_CODE: Final = {Kind.SEND: 0, Kind.RECV: 1, Kind.PROBE: 2, Kind.COMPUTE: 3}
#: Outcome codes in entries (the last three only for ops still pending), and their names.
DONE_C: Final = 0
CANCELLED_C: Final = 1
TIMED_OUT_C: Final = 2
FAILED_C: Final = 3
OUTCOMES: Final = ("done", "cancelled", "timed out", "failed", "queued", "posted", "matched")

#: (kind code, peer, tag, nbytes, stream id (-1: none), outcome code, t_post, t_match,
#: t_finish); times on the engine clock, negative where unknown.
Entry = tuple[int, int, int, int, int, int, float, float, float]


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
    return loop.time if isinstance(loop, VirtualTimeLoop) else time.perf_counter


class Tally:
    """Running totals of one kind of op (sends or recvs) with one peer."""

    __slots__ = ("c", "n", "nbytes", "w")

    def __init__(self) -> None:
        self.n = 0  # ops
        self.nbytes = 0
        self.w = 0.0  # seconds from post to match
        self.c = 0.0  # seconds from match to finish


_NONE = Tally()  # read only: a peer with no ops of a kind


class Tallies(dict[int, Tally]):
    """Tallies by peer, made on first use: a rank of a large world that talks to a few
    peers keeps a few (per-peer lists would cost size² objects over a world)."""

    __slots__ = ("new",)

    def __init__(self, new: Callable[[], Tally]) -> None:
        super().__init__()
        #: Makes a tally (the C lane's ``Tally``: the same fields, kept as numbers).
        self.new = new

    def __missing__(self, peer: int) -> Tally:
        tally = self[peer] = self.new()
        return tally


class FlightRecorder:
    """One rank's recorder (see module docs)."""

    __slots__ = ("origin", "others", "recvs", "ring", "sends", "size")

    def __init__(self, size: int, origin: float, native: Any = None) -> None:
        """``native``: the C lane (``_engine.lane.Lane.module``), whose ``Ring`` and
        ``Tally`` keep the entries and totals; None: a deque and Python tallies."""
        self.size = size
        self.origin = origin
        #: The last ``size`` entries, oldest first.
        self.ring: deque[Entry] = deque(maxlen=size) if native is None else native.Ring(size)
        # Totals of finished sends and recvs, per peer.  The fast lane updates them inline.
        new = Tally if native is None else native.Tally
        self.sends = Tallies(new)
        self.recvs = Tallies(new)
        self.others = 0  # other finished ops: probes, computes, failed or cancelled ones

    def add(self, entry: Entry) -> None:
        """Record a finished op."""
        self.ring.append(entry)
        kind, peer, _tag, nbytes, _sid, how, t_post, t_match, t_fin = entry
        if how != DONE_C or kind > RECV_C or peer < 0:
            self.others += 1
            return
        tally = (self.recvs if kind else self.sends)[peer]
        post = t_post if t_post >= 0 else t_fin
        match = t_match if t_match >= 0 else post
        tally.n += 1
        tally.nbytes += nbytes
        tally.w += match - post
        tally.c += t_fin - match

    def finished(self) -> int:
        """How many ops have finished since the world opened."""
        return (sum(t.n for t in self.sends.values()) + sum(t.n for t in self.recvs.values())
                + self.others)

    def entries(self) -> list[Entry]:
        """The last ``size`` entries, oldest first."""
        return list(self.ring)

    def totals(self) -> tuple[int, list[PeerTotals]]:
        """(ops finished, per-peer totals), over every op since the world opened."""
        out = []
        for peer in sorted(self.sends.keys() | self.recvs.keys()):
            s, r = self.sends.get(peer, _NONE), self.recvs.get(peer, _NONE)
            if s.n or r.n:
                out.append(PeerTotals(peer, s.n, r.n, s.nbytes, r.nbytes, s.w + r.w,
                                      s.c + r.c))
        return self.finished(), out

    def dicts(self, rank: int, pending: Iterable[Op] = ()) -> list[dict[str, Any]]:
        """The last ops as dicts (``Communicator.flight_record()``), then the pending ones."""
        out = [self._dict(rank, e) for e in self.entries()]
        out += [self._dict(rank, pending_entry(r), pending=r) for r in pending]
        return out

    def _dict(self, rank: int, e: Entry, pending: Op | None = None) -> dict[str, Any]:
        kind, peer, tag, nbytes, sid, how, t_post, t_match, t_fin = e

        def rel(t: float) -> float | None:
            return t - self.origin if t >= 0 else None

        return {"rank": rank, "op": KIND_NAMES[kind], "peer": peer, "tag": tag,
                "nbytes": nbytes, "stream": sid if sid >= 0 else None, "state": OUTCOMES[how],
                "post": rel(t_post), "match": rel(t_match), "finish": rel(t_fin)}


def pending_entry(req: Op) -> Entry:
    """An entry for an op that has not finished (state: queued, posted or matched)."""
    state = req.state
    how = 4 if state is QUEUED else 6 if state is ACTIVE else 5
    sid = req.stream.sid if req.stream is not None else -1
    return (KIND_CODE[req.kind], req.peer, req.tag, req.nbytes, sid, how, req.t_post,
            req.t_match, -1.0)


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


def measured_record(req: Op, rank: int, origin: float) -> Any:
    """The ``OpRecord`` of a finished send, recv or compute, from its measured times (seconds
    since the world opened); None for other ops or when the times are unknown."""
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


def named(e: Entry) -> tuple[Any, ...]:
    """An entry with its kind and outcome as words."""
    return (KIND_NAMES[e[0]], *e[1:5], OUTCOMES[e[5]], *e[6:])


def finish(flight: FlightRecorder, req: Op, state: State, exc: BaseException | None,
           t_fin: float) -> Entry:
    """Record ``req``, which just ended (``state``, ``exc``), and return its entry: what
    ``entry`` and ``FlightRecorder.add`` do, in one call (it runs for every op that is not
    on the fast lane)."""
    kind = req.kind
    k = 0 if kind is _SEND else 1 if kind is _RECV else 2 if kind is _PROBE else 3
    peer, tag, nbytes, t_post, t_match = req.peer, req.tag, req.nbytes, req.t_post, req.t_match
    if state is CANCELLED:
        how = CANCELLED_C
    elif exc is None:
        how = DONE_C
        if k == 1:  # a recv: what arrived, not what was asked
            res = req._result
            status = res if type(res) is Status else res[1] if res is not None else None
            if status is not None:
                peer, tag, nbytes = status[0], status[1], status[2]
    else:
        how = TIMED_OUT_C if isinstance(exc, CommTimeoutError) else FAILED_C
    stream = req.stream
    e = (k, peer, tag, nbytes, -1 if stream is None else stream.sid, how, t_post, t_match,
         t_fin)
    flight.ring.append(e)
    if how == DONE_C and k < 2 and peer >= 0:
        tally = (flight.recvs if k else flight.sends)[peer]
        tally.n += 1
        tally.nbytes += nbytes
        post = t_post if t_post >= 0 else t_fin
        if t_match >= 0:
            tally.w += t_match - post
            tally.c += t_fin - t_match
        else:
            tally.c += t_fin - post
    else:
        flight.others += 1
    return e
