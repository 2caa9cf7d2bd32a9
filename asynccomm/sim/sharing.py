"""Max-min fair sharing of links and copy engines by concurrent transfers (a flow model
after SimGrid's: max-min sharing as in its LV08 network model, each flow using several
resources at once as its parallel tasks do).

How it works
------------
A ``Flow`` is one transfer: ``work`` ns of progress (how long it takes alone, on idle
resources), from ``start``, using each of its resources (a copy engine, a link, a NIC port)
for a fraction of that time, its ``uses``: ``(name, share)`` with ``share`` = the ns the
transfer holds the resource alone / ``work``.  A flow progressing at rate x (x = 1: as
fast as alone) loads each of its resources by x * share.

Rule 1 (max-min).  Every resource has capacity 1.  A flow's demand is its load alone on
its most used resource (1 for a transfer that fills its link; 0.5 for one whose slower copy
engine keeps its link half busy).  The loads are the max-min fair allocation of the
demands (progressive filling: raise every flow's load on its most used resource together,
its other resources in proportion; a flow stops at its demand or when one of its resources
is full).  So k equal flows that fill one link each get 1/k of it, and a flow that cannot
use its fair share leaves the rest to the others.
Rule 2 (events).  Rates are recomputed when a flow starts or ends, only among the flows
that share a resource with it, directly or through others (its component).  Between events
each flow's remaining work falls linearly.
Rule 3 (order).  Events are processed in time order, ties in the order the flows were
added, and every collection iterates in insertion order: the same calls give the same
times, whatever the hash seed.
Rule 4 (integers).  A flow ends at the first integer nanosecond at or after its remaining
work reaches zero (within float error of an integer, at that integer).

Times are integer nanoseconds; nothing here reads a clock.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import math

__all__ = ["FairShare", "Flow"]

_START, _END = 0, 1


class Flow:
    """One flow: ``work`` ns of progress from ``start``, loading each resource of ``uses``
    (``(name, share)``) by its share of its rate; ``finish`` is set when it has ended.

    Raises:
        ValueError: ``work`` < 0, a share outside [0, 1].
    """

    __slots__ = ("finish", "left", "rate", "seq", "since", "start", "uses", "version", "work")

    def __init__(self, uses: tuple[tuple[str, float], ...], work: int, start: int) -> None:
        if work < 0 or not all(0 <= share <= 1 for _, share in uses):
            raise ValueError(f"need work >= 0 and shares in [0, 1], got work={work}, "
                             f"uses={uses}")
        self.uses = tuple((name, share) for name, share in uses if share > 0)
        self.work = work
        self.start = start
        self.left = float(work)  # remaining work at ``since``
        self.rate = 0.0
        self.since = start
        self.finish: int | None = None
        self.seq = -1
        self.version = 0

    def __repr__(self) -> str:
        return f"Flow({self.uses}, work={self.work}, start={self.start}, finish={self.finish})"


def _ceil_ns(t: float) -> int:
    r = round(t)
    return int(r) if abs(t - r) <= 1e-9 * max(1.0, abs(t)) else math.ceil(t)


class FairShare:
    """The flows of one cluster and their max-min fair rates (see module docs)."""

    def __init__(self) -> None:
        self.time = 0  # every event before this has been processed
        self._on: dict[str, dict[Flow, None]] = {}  # resource -> its active flows, in order
        self._events: list[tuple[int, int, int, int, Flow]] = []  # (t, seq, kind, ver, flow)
        self._seq = itertools.count()

    def add(self, flow: Flow) -> None:
        """Add a flow; it starts at ``max(flow.start, self.time)``."""
        flow.start = flow.since = max(flow.start, self.time)
        flow.seq = next(self._seq)
        heapq.heappush(self._events, (flow.start, flow.seq, _START, 0, flow))

    def next_time(self) -> int | None:
        """When the next event (a flow starting or ending) is due; None if none is."""
        events = self._events
        while events and not self._valid(events[0]):
            heapq.heappop(events)
        return events[0][0] if events else None

    @staticmethod
    def _valid(event: tuple[int, int, int, int, Flow]) -> bool:
        _, _, kind, version, flow = event
        return flow.finish is None and (kind == _START or version == flow.version)

    def advance(self, until: int | None = None) -> list[Flow]:
        """Process every event due at or before ``until`` (None: until no flow is left);
        return the flows that ended, in the order they ended."""
        ended: list[Flow] = []
        events = self._events
        while (t := self.next_time()) is not None and (until is None or t <= until):
            touched: list[Flow] = []
            while events and events[0][0] == t:
                event = heapq.heappop(events)
                if not self._valid(event):
                    continue
                flow = event[4]
                touched.append(flow)
                if event[2] == _START:
                    for name, _ in flow.uses:
                        self._on.setdefault(name, {})[flow] = None
            self.time = t
            component = self._component(touched)
            for flow in component:  # bring every flow's remaining work to t
                flow.left = max(0.0, flow.left - flow.rate * (t - flow.since))
                flow.since = t
            # float residue of a flow due now is far below a nanosecond of work
            done = [f for f in component if f.left <= 1e-12 * f.work + 1e-9]
            for flow in done:
                flow.finish, flow.left, flow.rate = t, 0.0, 0.0
                for name, _ in flow.uses:
                    del self._on[name][flow]
                ended.append(flow)
            self._share([f for f in component if f.finish is None])
        if until is not None:
            self.time = max(self.time, until)
        return ended

    def _component(self, seeds: list[Flow]) -> list[Flow]:
        """The active flows linked to ``seeds`` through shared resources, in the order
        they were added."""
        seen: dict[Flow, None] = {}
        names_seen: set[str] = set()
        stack = list(seeds)
        while stack:
            flow = stack.pop()
            if flow in seen:
                continue
            seen[flow] = None
            for name, _ in flow.uses:
                if name not in names_seen:
                    names_seen.add(name)
                    stack.extend(self._on.get(name, ()))
        return sorted(seen, key=lambda f: f.seq)

    def _share(self, flows: list[Flow]) -> None:
        """Max-min fair rates for ``flows`` (Rule 1), and their next end events."""
        room: dict[str, float] = {}
        users: dict[str, list[tuple[Flow, float]]] = {}
        demand: dict[Flow, float] = {}  # the load on its most used resource, alone
        for flow in flows:
            demand[flow] = top = max((share for _, share in flow.uses), default=0.0)
            for name, share in flow.uses:
                room[name] = 1.0
                users.setdefault(name, []).append((flow, share / top))
        free = dict.fromkeys(flows)
        while free:
            # Raise every free flow's load together: up to the smallest demand, or until a
            # resource is full.
            level = min(demand[f] for f in free)
            full = None
            for name, fl in users.items():
                load = sum(weight for f, weight in fl if f in free)
                if load > 0 and room[name] / load < level:
                    level, full = room[name] / load, name
            if full is None:
                fixed = [f for f in free if demand[f] <= level]
            else:
                fixed = [f for f, _ in users[full] if f in free]
            for flow in fixed:
                del free[flow]
                top = demand[flow]
                load = min(level, top)
                flow.rate = max(load / top, 1e-12) if top else 1.0  # residue never stops it
                for name, share in flow.uses:
                    room[name] = max(0.0, room[name] - load * share / top)
        for flow in flows:
            flow.version += 1
            end = flow.since + _ceil_ns(flow.left / flow.rate)
            heapq.heappush(self._events, (end, flow.seq, _END, flow.version, flow))

    def predict(self, flow: Flow) -> int:
        """When ``flow`` would end if no other flow were added (the state is unchanged).

        Raises:
            ValueError: the flow was never added.
        """
        if flow.finish is not None:
            return flow.finish
        memo: dict[int, object] = {}
        twin = copy.deepcopy(self, memo)
        twin_flow = memo.get(id(flow))
        if not isinstance(twin_flow, Flow):
            raise ValueError("the flow was never added")
        twin.advance()
        assert twin_flow.finish is not None
        return twin_flow.finish
