"""Trace files: every op of every rank as Chrome trace-event JSON (Perfetto,
chrome://tracing).

How it works
------------
Rule 1 (collecting).  While a world traces, its engines hand every finished op to their
``RankTrace`` (the flight recorder's entry, the message's flow id, the modelled record);
events are built only when the file is written, when the world closes.  Traced ops have
a fast lane of their own (``traced``), which numbers each message as Rule 4 says.
Rule 2 (layout).  One process per rank (``pid`` = rank, named "rank N"), one thread per
stream ("stream 0" is the default one), one for compute, and on a cluster world one per
outgoing link with the modelled transfers.  Ops that overlap on one stream (the default
stream posts at once) go on extra lanes of it ("stream 0 #2"), so slices on one thread
always nest.
Rule 3 (slices).  An op is a complete event (``"ph": "X"``) from post to finish, args
``op``, ``peer``, ``tag``, ``nbytes``, ``stream``, ``outcome`` (done, cancelled, timed out,
failed); when its match time is known it has two children, ``wait`` (post to match) and
``copy`` (match to finish).
Rule 4 (flows).  The k-th message from rank s to rank d has the flow id
``((s * size + d) << 32) + k``, counted by the sender as it posts and (across processes)
by the receiver as messages arrive, which MPI keeps in order.  On a sub-communicator or a
private context (whose ops are traced under a label that also names their threads, e.g.
``split1/collectives``) the id is the string ``"<label>:s>d#k"``.  A flow start
(``"ph": "s"``) on the send and a flow end (``"ph": "f"``, ``"bp": "e"``) on the recv
join them.
Rule 5 (time).  Microseconds from the world's start: model time on cluster worlds (the
virtual clock, or wall time over ``time_scale``), wall time otherwise.  Under MPI each
rank writes ``<name>.rank<N>.json``, with its start's epoch, and ``python -m
asynccomm.trace merge`` joins them on one time axis.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from .flight import KIND_NAMES, OUTCOMES

__all__ = ["RankTrace", "TraceSink", "attach", "context_label", "join", "load", "merge",
           "merge_ranks", "paired_flows", "rank_path", "trace_path", "trace_remote"]

_ORDER: Final = {"stream": 0, "compute": 1, "probes": 2, "link": 3}


def trace_path(trace: str | os.PathLike[str] | None) -> Path | None:
    """The trace file asked for: ``trace=`` or else ``ASYNCCOMM_TRACE``; None for none.

    Raises:
        TypeError: ``trace`` is not a path.
    """
    if trace is None:
        raw = os.environ.get("ASYNCCOMM_TRACE", "").strip()
        return Path(raw) if raw else None
    if not isinstance(trace, str | os.PathLike):
        raise TypeError(f"trace must be a file path or None, got {type(trace).__name__}")
    return Path(trace)


def rank_path(path: Path, rank: int) -> Path:
    """``run.json`` -> ``run.rank3.json`` (each MPI process writes its own)."""
    suffix = path.suffix or ".json"
    return path.with_name(f"{path.stem if path.suffix else path.name}.rank{rank}{suffix}")


def context_label(key: tuple[Any, ...]) -> str:
    """A sub-communicator's label from its key: ``split1.0`` (the first split made on its
    parent, color 0), ``dup2``."""
    return f"{key[0]}{key[1]}" + (f".{key[2]}" if len(key) > 2 else "")


def join(label: str, part: str) -> str:
    """The label of a context made inside the one labelled ``label``."""
    return f"{label}/{part}" if label else part


class RankTrace:
    """One rank's collected ops and message counters (see module docs), on one
    communicator: the world's (``label`` ""), a sub-communicator's or a private context's;
    ``pid`` is the rank in the world."""

    __slots__ = ("_arrived", "label", "ops", "pid", "rank", "sent", "size")

    def __init__(self, rank: int, size: int, label: str = "", pid: int | None = None) -> None:
        self.rank = rank
        self.size = size
        self.label = label
        self.pid = rank if pid is None else pid
        self.ops: list[tuple[tuple[Any, ...], int | str, Any]] = []
        self.sent: dict[int, int] = defaultdict(int)  # messages posted to each rank so far
        self._arrived: dict[int, int] = defaultdict(int)

    def fid(self, src: int, dst: int, k: int) -> int | str:
        if self.label:
            return f"{self.label}:{src}>{dst}#{k}"
        return ((src * self.size + dst) << 32) + k

    def flow_out(self, req: Any) -> None:
        """A send is posted: number its message."""
        dst = req.peer
        self.sent[dst] += 1
        req.flow = self.fid(self.rank, dst, self.sent[dst])

    def arrival(self, msg: Any) -> None:
        """A message arrived; one from another process is numbered here (in-process, the
        message is the send itself, or carries its number)."""
        if getattr(msg, "flow", None) is None:
            msg.flow = self.arrived_from(msg.source)

    def arrived_from(self, source: int) -> int | str:
        """Number the next message from ``source`` in another process (MPI keeps each
        pair's messages in order, so the k-th to arrive is the k-th sent)."""
        self._arrived[source] += 1
        return self.fid(source, self.rank, self._arrived[source])

    def flow_in(self, msg: Any) -> int | str:
        """The flow id of the message a recv took."""
        return getattr(msg, "flow", 0)

    def add(self, entry: tuple[Any, ...], flow: int | str, record: Any) -> None:
        self.ops.append((entry, flow, record))


class TraceSink:
    """The ranks' traces of one world (in-process) or one process (MPI), and the file."""

    def __init__(self, path: Path, *, size: int, origin: float, time_scale: float,
                 model: bool) -> None:
        self.path = path
        self.size = size
        self.origin = origin
        self.scale = 1e6 / time_scale  # engine seconds -> trace microseconds
        self.model = model
        #: When ``origin`` was, in seconds since the epoch (to merge MPI ranks' files).
        self.epoch = time.time() - (time.perf_counter() - origin) if not model else time.time()
        self.ranks: dict[tuple[int, str], RankTrace] = {}  # (pid, label)
        self.partial = False
        #: Events beside the ops' (a fault plan's: ``fault_events``).
        self.notes: list[dict[str, Any]] = []

    def rank(self, rank: int, *, label: str = "", pid: int | None = None) -> RankTrace:
        """The trace of rank ``rank`` of a communicator (the world's: ``label`` "")."""
        trace = RankTrace(rank, self.size, label, pid)
        self.ranks[(trace.pid, label)] = trace
        return trace

    def write(self, path: Path | None = None) -> Path:
        """Write the file (``path``, or the sink's own); returns where it went."""
        out = path or self.path
        events = self.events()
        doc = {"traceEvents": events if self.partial else paired_flows(events),
               "displayTimeUnit": "ns",
               "otherData": {"generator": "asynccomm", "clock": "model" if self.model
                             else "wall", "epoch": self.epoch,
                             "ranks": sorted({pid for pid, _ in self.ranks})}}
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
        tmp.replace(out)
        return out

    # -- building events ------------------------------------------------------------------

    def _us(self, t: float) -> float:
        return round((t - self.origin) * self.scale, 3)

    def events(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        tids: dict[int, int] = {}  # the last thread id of each process
        for key in sorted(self.ranks):
            trace = self.ranks[key]
            more, tids[trace.pid] = self._rank_events(trace, tids.get(trace.pid))
            events += more
        return events + self.notes

    def _rank_events(self, trace: RankTrace,
                     tid: int | None) -> tuple[list[dict[str, Any]], int]:
        pid = trace.pid
        prefix = f"{trace.label}: " if trace.label else ""
        slices: dict[tuple[int, str], list[tuple[float, float, dict[str, Any]]]] = (
            defaultdict(list))
        for entry, flow, record in trace.ops:
            code, peer, tag, nbytes, sid, how_code, t_post, t_match, t_fin = entry
            kind, how = KIND_NAMES[code], OUTCOMES[how_code]
            start = self._us(t_post if t_post >= 0 else t_fin)
            end = max(self._us(t_fin), start)
            group = ((1, prefix + "compute") if kind == "compute" else (2, prefix + "probes")
                     if sid < 0 else (0, f"{prefix}stream {sid}"
                                      + (" (default)" if sid == 0 else "")))
            op = {"name": _name(kind, peer), "cat": kind, "args": {
                "op": kind, "peer": peer, "tag": tag, "nbytes": nbytes,
                "stream": sid if sid >= 0 else None, "outcome": how}}
            children = []
            if t_match >= 0 and t_post >= 0 and kind != "compute":
                mid = min(max(self._us(t_match), start), end)
                children = [("wait", start, mid), ("copy", mid, end)]
            slices[group].append((start, end, {"op": op, "children": children, "flow": flow,
                                               "kind": kind, "match": children[0][2]
                                               if children else end}))
            if record is not None and kind == "send" and self.model:
                rs, re_ = round(record.start * 1e6, 3), round(record.end * 1e6, 3)
                where = f"{prefix}link to {peer}" if prefix else f"link {pid}->{peer}"
                slices[(3, where)].append((rs, max(re_, rs), {
                    "op": {"name": f"{record.mode} x{record.chunks}", "cat": "link", "args": {
                        "peer": peer, "nbytes": record.nbytes, "chunks": record.chunks,
                        "mode": record.mode}}, "children": [], "flow": 0, "kind": None,
                    "match": rs}))
        events: list[dict[str, Any]] = []
        if tid is None:  # the first of this process's traces
            events += [{"ph": "M", "pid": pid, "tid": 0, "name": "process_name",
                        "args": {"name": f"rank {pid}"}},
                       {"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index",
                        "args": {"sort_index": pid}}]
            tid = 0
        for group in sorted(slices):
            lanes: list[float] = []
            named: dict[int, int] = {}
            for start, end, item in sorted(slices[group], key=lambda s: (s[0], -s[1])):
                lane = next((i for i, last in enumerate(lanes) if last <= start), len(lanes))
                if lane == len(lanes):
                    lanes.append(end)
                    tid += 1
                    named[lane] = tid
                    events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                                   "args": {"name": group[1] + (f" #{lane + 1}" if lane
                                                                else "")}})
                    events.append({"ph": "M", "pid": pid, "tid": tid,
                                   "name": "thread_sort_index", "args": {"sort_index": tid}})
                lanes[lane] = end
                events += _op_events(pid, named[lane], start, end, item)
        return events, tid


def _name(kind: str, peer: int) -> str:
    if kind == "send":
        return f"send to {peer}"
    if kind == "recv":
        return f"recv from {peer}" if peer >= 0 else "recv"
    return kind


def _op_events(pid: int, tid: int, start: float, end: float,
               item: dict[str, Any]) -> list[dict[str, Any]]:
    out = [{"ph": "X", "pid": pid, "tid": tid, "ts": start, "dur": round(end - start, 3),
            **item["op"]}]
    for name, s, e in item["children"]:
        out.append({"ph": "X", "pid": pid, "tid": tid, "ts": s, "dur": round(e - s, 3),
                    "name": name, "cat": "phase"})
    flow = item["flow"]
    if flow:
        if item["kind"] == "send":
            out.append({"ph": "s", "pid": pid, "tid": tid, "ts": start, "id": flow,
                        "name": "message", "cat": "message"})
        else:
            out.append({"ph": "f", "bp": "e", "pid": pid, "tid": tid, "ts": item["match"],
                        "id": flow, "name": "message", "cat": "message"})
    out.sort(key=lambda e: e["ts"])  # stable: the op before its phases at one time
    return out


def fault_events(faults: list[Any]) -> list[dict[str, Any]]:
    """A fault plan's ``FaultEvent`` s as instant events on their ranks' rows, at their
    model times (as the link slices are)."""
    return [{"ph": "i", "s": "p", "pid": f.rank, "tid": 0, "ts": round(f.time * 1e6, 3),
             "cat": "fault",
             "name": f"fault: {f.what}" + ("" if f.peer is None else f" to {f.peer}"),
             "args": {"detail": f.detail}} for f in faults]


def paired_flows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` without flow halves whose other half is missing (a send nobody received,
    a file of one rank alone)."""
    starts = {e["id"] for e in events if e.get("ph") == "s"}
    ends = {e["id"] for e in events if e.get("ph") == "f"}
    both = starts & ends
    return [e for e in events if e.get("ph") not in ("s", "f") or e["id"] in both]


def attach(path: Path, engines: list[Any], *, model: bool, time_scale: float = 1.0,
           partial: bool = False) -> TraceSink:
    """Make every engine trace into one new sink writing ``path`` (``partial``: this
    process holds only some ranks, so flows are kept for a merge to pair)."""
    first = engines[0]
    sink = TraceSink(path, size=first.size, origin=first.flight.origin,
                     time_scale=time_scale, model=model)
    sink.partial = partial
    for engine in engines:
        engine.tracer = sink.rank(engine.rank)
    return sink


def trace_remote(sink: TraceSink, label: str, engine: Any, private: Any) -> None:
    """Trace a communicator of processes (MPI or shared memory) into ``sink``: its
    ``private`` context's engine under ``label``'s ``collectives``, and its own ``engine``
    under ``label`` (a world's own, ``label`` "", is traced by ``attach``), both on the
    traced lane (its Python steps number what arrives), unless logging every message."""
    engines = [(private, join(label, "collectives"))]
    if label:
        engines.append((engine, label))
    for e, name in engines:
        e.tracer = sink.rank(e.rank, label=name, pid=e.world_rank)
    for e in (engine, private):
        e.fast = False
        e.traced = not e.trace


def load(path: str | Path) -> dict[str, Any]:
    """A trace file as a dict (``{"traceEvents": [...], ...}``).

    Raises:
        OSError: it cannot be read.
        ValueError: it is not a trace-event JSON object.
    """
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{path}: not a trace-event file (no traceEvents list)")
    return doc


def merge(paths: Sequence[str | Path], out: str | Path, *,
          missing: Sequence[int] = ()) -> Path:
    """Merge the per-rank files of an MPI run into one file at ``out``; the ranks of
    ``missing`` wrote none (their processes died first): each gets a row named so, and
    they are listed in ``otherData["missing"]``.

    Raises:
        OSError, ValueError: as ``load``; ValueError also for no files, or files of
            different clocks.
    """
    if not paths:
        raise ValueError("merge needs at least one trace file")
    docs = [load(p) for p in paths]
    clocks = {d.get("otherData", {}).get("clock", "wall") for d in docs}
    if len(clocks) > 1:
        raise ValueError(f"the files mix clocks ({', '.join(sorted(clocks))}): not one run")
    epochs = [float(d.get("otherData", {}).get("epoch", 0.0)) for d in docs]
    first = min(epochs)
    events: list[dict[str, Any]] = []
    ranks: list[int] = []
    for doc, epoch in zip(docs, epochs, strict=True):
        shift = round((epoch - first) * 1e6, 3)
        for e in doc["traceEvents"]:
            if "ts" in e and shift:
                e = {**e, "ts": round(e["ts"] + shift, 3)}
            events.append(e)
        ranks += doc.get("otherData", {}).get("ranks", [])
    for rank in missing:
        events += [{"ph": "M", "pid": rank, "tid": 0, "name": "process_name",
                    "args": {"name": f"rank {rank} (no trace: its process died first)"}},
                   {"ph": "M", "pid": rank, "tid": 0, "name": "process_sort_index",
                    "args": {"sort_index": rank}}]
    other = {"generator": "asynccomm", "clock": clocks.pop(), "epoch": first,
             "ranks": sorted(ranks)}
    if missing:
        other["missing"] = sorted(missing)
    target = Path(out)
    target.write_text(json.dumps({
        "traceEvents": paired_flows(events), "displayTimeUnit": "ns", "otherData": other},
        separators=(",", ":")), encoding="utf-8")
    return target


def merge_ranks(path: Path, size: int) -> Path | None:
    """Merge the files ``rank_path(path, r)`` the ranks ``0 .. size-1`` of a world of
    processes wrote (those that did: a process that was killed wrote none, and is named
    in the merged file as ``merge``'s ``missing``) into ``path``, and remove them; None
    (and nothing written) when no rank wrote one.  When the merge fails the rank files
    are kept.

    Raises:
        OSError, ValueError: as ``merge``.
    """
    paths = [rank_path(path, r) for r in range(size)]
    files = [f for f in paths if f.exists()]
    if not files:
        return None
    out = merge(files, path, missing=[r for r, f in enumerate(paths) if f not in files])
    for f in files:
        f.unlink(missing_ok=True)
    return out
