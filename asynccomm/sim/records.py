"""What happened in a modelled run: one record per completed op, and per-rank summaries.

Records are in model seconds.  ``summarize`` measures a rank's communication as the union of
its send and recv intervals (overlapping transfers count once), its compute as the union of
its compute intervals, and how much communication was *hidden*: the measure of comm ∩
compute.  Everything is O(n log n): sort, merge, then one two-pointer sweep.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["KINDS", "OpRecord", "PeerTotals", "RankSummary", "format_table", "summarize"]

KINDS = ("send", "recv", "compute")

Intervals = list[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One completed op on one rank, in model seconds.

    ``mode`` is the transfer's mode ("sync", "async", "pipelined") or, for compute, free
    text; ``peer`` is the other rank (compute records conventionally name their own rank).

    Raises:
        ValueError: ``kind`` not one of ``KINDS``, ``end`` before ``start``, ``nbytes`` < 0.
    """

    rank: int
    kind: str
    peer: int
    tag: int
    nbytes: int
    chunks: int
    start: float
    end: float
    mode: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {self.kind!r}")
        if not self.end >= self.start:
            raise ValueError(f"end ({self.end}) is before start ({self.start})")
        if self.nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {self.nbytes}")

    @property
    def duration(self) -> float:
        """Seconds from start to end."""
        return self.end - self.start

    @property
    def bandwidth(self) -> float:
        """Bytes/s over the op's duration (0 for an instant op)."""
        duration = self.end - self.start
        return self.nbytes / duration if duration > 0 else 0.0


@dataclass(frozen=True, slots=True)
class PeerTotals:
    """One rank's traffic with one peer: finished sends and recvs, on every world."""

    peer: int
    sends: int
    recvs: int
    bytes_sent: int
    bytes_received: int
    wait_time: float
    """Seconds from post to match (a send whose message was staged counts none)."""
    copy_time: float
    """Seconds from match to finish (post to finish when the match is unknown)."""


@dataclass(frozen=True, slots=True)
class RankSummary:
    """One rank's totals; times in model seconds with a cluster model (``modelled``), else
    measured seconds (the modelled fields are then 0)."""

    rank: int
    bytes_sent: int
    bytes_received: int
    messages: int  # sends and recvs
    link_busy: float  # link time held by this rank's sends
    compute_time: float  # measure of the union of compute intervals
    comm_time: float  # measure of the union of send/recv intervals
    hidden: float  # measure of comm ∩ compute
    hidden_fraction: float  # hidden / comm_time (0 with no comm)
    span: float  # first start to last end, over every record
    ops: int = 0  # every finished op (compute and probes included)
    wait_time: float = 0.0  # summed over sends and recvs: post to match
    copy_time: float = 0.0  # summed: match to finish
    peers: tuple[PeerTotals, ...] = ()
    modelled: bool = True


def _union(intervals: Intervals) -> Intervals:
    """Sorted, disjoint intervals covering the same points."""
    merged: Intervals = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _measure(intervals: Intervals) -> float:
    return sum(end - start for start, end in intervals)


def _overlap(a: Intervals, b: Intervals) -> float:
    """Measure of the intersection of two sorted, disjoint interval lists."""
    total = 0.0
    i = j = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:  # the one that ends first cannot meet anything later
            i += 1
        else:
            j += 1
    return total


def summarize(rank: int, records: Iterable[OpRecord], *, link_busy: float = 0.0) -> RankSummary:
    """Sum up ``rank``'s records (records of other ranks are ignored).

    ``link_busy`` (seconds) comes from the model, which knows it; records do not.
    """
    sent = received = messages = 0
    comm: Intervals = []
    compute: Intervals = []
    first = last = None
    for rec in records:
        if rec.rank != rank:
            continue
        first = rec.start if first is None else min(first, rec.start)
        last = rec.end if last is None else max(last, rec.end)
        if rec.kind == "compute":
            compute.append((rec.start, rec.end))
            continue
        messages += 1
        comm.append((rec.start, rec.end))
        if rec.kind == "send":
            sent += rec.nbytes
        else:
            received += rec.nbytes
    comm_u, compute_u = _union(comm), _union(compute)
    comm_time = _measure(comm_u)
    hidden = _overlap(comm_u, compute_u)
    return RankSummary(
        rank=rank, bytes_sent=sent, bytes_received=received, messages=messages,
        link_busy=link_busy, compute_time=_measure(compute_u), comm_time=comm_time,
        hidden=hidden, hidden_fraction=hidden / comm_time if comm_time > 0 else 0.0,
        span=0.0 if first is None or last is None else last - first)


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _fmt_seconds(s: float) -> str:
    if s == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3f} {unit}"
    return f"{s * 1e9:.0f} ns"


_COLUMNS = ("rank", "sent", "received", "msgs", "link busy", "compute", "comm", "hidden",
            "hidden %", "span")


def format_table(summaries: Iterable[RankSummary]) -> str:
    """A plain-text table, one row per rank, columns aligned, units in the cells."""
    rows = [_COLUMNS] + [
        (str(s.rank), _fmt_bytes(s.bytes_sent), _fmt_bytes(s.bytes_received), str(s.messages),
         _fmt_seconds(s.link_busy), _fmt_seconds(s.compute_time), _fmt_seconds(s.comm_time),
         _fmt_seconds(s.hidden), f"{100 * s.hidden_fraction:.1f}", _fmt_seconds(s.span))
        for s in summaries
    ]
    widths = [max(len(row[c]) for row in rows) for c in range(len(_COLUMNS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
