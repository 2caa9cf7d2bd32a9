"""Fault plans: what goes wrong on a modelled cluster, and when, as data.

A ``FaultPlan`` is frozen, seeded and replayable: the same plan on the same program gives
the same run (the virtual clock is deterministic, and jitter is drawn from the plan's
seed, one stream per directed pair of ranks).  ``to_dict``/``from_dict`` round-trip it
through JSON-able dicts.  A world opened with ``open_world(..., fault_plan=plan)`` (or
``ac.run(..., fault_plan=plan)``) applies it; ``PlannedFaults`` is the plan compiled for
one world, which the model and the world's links ask.

Rule 1 (links).  A ``LinkFault`` selects directed pairs of ranks (``src``/``dst``, either
None for any rank; ``link`` a ``LinkSpec`` name, for every pair that uses such a link;
``both_ways`` the reverse direction too) and, for messages *sent* in [start, end): adds
``delay`` seconds, plus up to ``jitter`` more (uniform, seeded), to when each message
(control or payload) leaves; multiplies the link's bandwidth by ``bandwidth``; and with
``partition`` holds it until ``end`` (links are reliable: a partition delays, never
drops).  Faults on one pair add up; messages between two ranks still arrive in order.
Rule 2 (ranks).  A ``RankFault`` crashes ``rank`` at model time ``crash_at`` or right
after its ``crash_at_event``-th engine event (a send posted, a recv matched at its
sender, a payload copied into a recv buffer; any communicator counts), the first that
comes: its communicators close as failed, as a rank that raised does, and its peers hear
of it after what it sent them has arrived.  ``slowdown`` multiplies its compute and copy
times.  ``hang_at`` makes it alive but silent from then on: everything it sends is held.
Rule 3 (detection).  With ``detection_timeout`` = T (the modelled heartbeat timeout), a
rank silent to every other rank (hung, or each of its outgoing directions partitioned) for
longer than T is declared failed at T after it fell silent: it crashes then, and what it
sent that is still held is dropped (so its peers hear at once).  Without it a hang or a
partition holds messages as long as it lasts; a hang, for ever (``HELD``, a million
model seconds).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .cluster import Cluster, LinkSpec, to_ns

__all__ = ["HELD", "FaultEvent", "FaultPlan", "LinkFault", "PlannedCrash", "PlannedFaults",
           "RankFault"]

#: When a message held for ever (by a hang) would leave, in model ns: a million model
#: seconds, past any bound a program sets, and still exact as a loop's float time.
HELD = 10**15


class PlannedCrash(RuntimeError):
    """Why a rank that its fault plan crashed failed (its peers' ``CommBrokenError`` say
    so; its own later ops raise ``CommClosedError``)."""


def _seconds(owner: str, name: str, value: object, *, inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner} {name} must be a number of seconds, got "
                        f"{type(value).__name__}")
    v = float(value)
    if not v >= 0 or (math.isinf(v) and not inf):
        raise ValueError(f"{owner} {name} must be {'' if inf else 'finite and '}>= 0 "
                         f"seconds, got {value!r}")
    return v


def _rank(owner: str, name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner} {name} must be an int{' or None' if optional else ''}, "
                        f"got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{owner} {name} must be >= 0, got {value}")


@dataclass(frozen=True)
class LinkFault:
    """Delay, jitter, degraded bandwidth or a partition on some directed pairs of ranks,
    for messages sent in [start, end) (module docs, Rule 1).

    Raises:
        TypeError: a field of the wrong type.
        ValueError: a negative time or rank, ``end <= start``, ``bandwidth`` outside
            (0, 1], or a fault that does nothing.
    """

    src: int | None = None
    dst: int | None = None
    link: str | None = None
    both_ways: bool = True
    start: float = 0.0
    end: float = math.inf
    delay: float = 0.0
    jitter: float = 0.0
    bandwidth: float = 1.0
    partition: bool = False

    def __post_init__(self) -> None:
        _rank("LinkFault", "src", self.src, optional=True)
        _rank("LinkFault", "dst", self.dst, optional=True)
        if self.link is not None and not isinstance(self.link, str):
            raise TypeError(f"LinkFault link must be a link name or None, got "
                            f"{type(self.link).__name__}")
        for name in ("both_ways", "partition"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"LinkFault {name} must be a bool")
        _seconds("LinkFault", "start", self.start)
        _seconds("LinkFault", "end", self.end, inf=True)
        if not self.end > self.start:
            raise ValueError(f"LinkFault end ({self.end}) must be after start ({self.start})")
        _seconds("LinkFault", "delay", self.delay)
        _seconds("LinkFault", "jitter", self.jitter)
        if isinstance(self.bandwidth, bool) or not isinstance(self.bandwidth, int | float):
            raise TypeError("LinkFault bandwidth must be a number (a factor)")
        if not 0 < self.bandwidth <= 1:
            raise ValueError(f"LinkFault bandwidth is a factor in (0, 1], got "
                             f"{self.bandwidth!r}")
        if self.partition and math.isinf(self.end):
            raise ValueError("a LinkFault partition must heal (a finite end): links are "
                             "reliable; a rank that never speaks again is a RankFault hang")
        if not (self.partition or self.delay or self.jitter or self.bandwidth < 1):
            raise ValueError("a LinkFault must delay, jitter, slow down or partition")

    def covers(self, src: int, dst: int, name: str) -> bool:
        """Whether the directed pair (src, dst), over a link named ``name``, is selected."""
        if self.link is not None and self.link != name:
            return False
        if (self.src is None or self.src == src) and (self.dst is None or self.dst == dst):
            return True
        return self.both_ways and ((self.src is None or self.src == dst)
                                   and (self.dst is None or self.dst == src))


@dataclass(frozen=True)
class RankFault:
    """A crash (at a model time, or at the rank's k-th engine event), a slowdown, or a
    hang of one rank (module docs, Rule 2).

    Raises:
        TypeError: a field of the wrong type.
        ValueError: a negative time or rank, ``crash_at_event`` < 1, ``slowdown`` < 1 or
            infinite, or a fault that does nothing.
    """

    rank: int
    crash_at: float | None = None
    crash_at_event: int | None = None
    slowdown: float = 1.0
    hang_at: float | None = None

    def __post_init__(self) -> None:
        _rank("RankFault", "rank", self.rank)
        if self.crash_at is not None:
            _seconds("RankFault", "crash_at", self.crash_at)
        if self.hang_at is not None:
            _seconds("RankFault", "hang_at", self.hang_at)
        if self.crash_at_event is not None:
            _rank("RankFault", "crash_at_event", self.crash_at_event)
            if self.crash_at_event < 1:
                raise ValueError("RankFault crash_at_event counts from 1")
        if isinstance(self.slowdown, bool) or not isinstance(self.slowdown, int | float):
            raise TypeError("RankFault slowdown must be a number (a factor)")
        if not 1 <= self.slowdown < math.inf:
            raise ValueError(f"RankFault slowdown must be a finite factor >= 1, got "
                             f"{self.slowdown!r}")
        if (self.crash_at is None and self.crash_at_event is None and self.hang_at is None
                and self.slowdown == 1):
            raise ValueError("a RankFault must crash, hang or slow its rank down")


@dataclass(frozen=True)
class FaultPlan:
    """What goes wrong in one run: link faults, rank faults, the jitter seed and the
    modelled heartbeat timeout (module docs).

    Raises:
        TypeError: a field of the wrong type (``links``/``ranks`` are tuples of
            ``LinkFault``/``RankFault``).
        ValueError: a negative seed or timeout.
    """

    links: tuple[LinkFault, ...] = ()
    ranks: tuple[RankFault, ...] = ()
    seed: int = 0
    detection_timeout: float | None = None

    def __post_init__(self) -> None:
        for name, kind in (("links", LinkFault), ("ranks", RankFault)):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(f, kind) for f in value):
                raise TypeError(f"FaultPlan {name} must be a tuple of {kind.__name__}")
        _rank("FaultPlan", "seed", self.seed)
        if self.detection_timeout is not None:
            _seconds("FaultPlan", "detection_timeout", self.detection_timeout)
            if self.detection_timeout == 0:
                raise ValueError("FaultPlan detection_timeout must be > 0 (or None)")

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-able data (an infinite ``end`` is None)."""
        def clean(d: dict[str, Any]) -> dict[str, Any]:
            return {k: (None if isinstance(v, float) and math.isinf(v) else v)
                    for k, v in d.items()}
        return {"seed": self.seed, "detection_timeout": self.detection_timeout,
                "links": [clean(asdict(f)) for f in self.links],
                "ranks": [asdict(f) for f in self.ranks]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultPlan:
        """The plan ``to_dict`` gave.

        Raises:
            TypeError, ValueError: unknown keys, or as the constructors.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"a fault plan is a mapping, got {type(data).__name__}")
        _known("FaultPlan", data, {"seed", "detection_timeout", "links", "ranks"})
        links = []
        for d in data.get("links", ()):
            _known("LinkFault", d, {f.name for f in fields(LinkFault)})
            links.append(LinkFault(**{**d, "end": math.inf if d.get("end") is None
                                      else d["end"]}))
        ranks = []
        for d in data.get("ranks", ()):
            _known("RankFault", d, {f.name for f in fields(RankFault)})
            ranks.append(RankFault(**d))
        return cls(tuple(links), tuple(ranks), data.get("seed", 0),
                   data.get("detection_timeout"))


def _known(owner: str, data: object, names: set[str]) -> None:
    if not isinstance(data, Mapping):
        raise TypeError(f"a {owner} is a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{owner} has no field {', '.join(map(repr, unknown))}")


@dataclass(frozen=True)
class FaultEvent:
    """One fault as it happened (model seconds), for traces and tests: ``what`` is
    "crash", "declared failed", "hang", "held" (a message held by a partition or a hang,
    with the pair in ``peer``) or "slow"."""

    time: float
    rank: int
    what: str
    peer: int | None = None
    detail: str = ""


@dataclass
class _Pair:
    """The faults of one directed pair of ranks."""

    faults: list[LinkFault] = field(default_factory=list)
    rng: random.Random | None = None


class PlannedFaults:
    """A ``FaultPlan`` compiled for a world of ``size`` ranks on ``cluster``.

    Raises:
        TypeError: ``plan`` not a FaultPlan.
        ValueError: a rank out of range or a link name the cluster does not have, two
            faults for one rank, or a crash and a hang of one rank.
    """

    def __init__(self, plan: FaultPlan, cluster: Cluster, size: int) -> None:
        if not isinstance(plan, FaultPlan):
            raise TypeError(f"fault_plan must be a FaultPlan, got {type(plan).__name__}")
        self.plan = plan
        self.size = size
        cluster = cluster.fit(size)
        names = {cluster.link(a, b).name for a in range(size) for b in range(size) if a != b}
        for f in plan.links:
            for end in (f.src, f.dst):
                if end is not None and end >= size:
                    raise ValueError(f"LinkFault rank {end} out of range for a world of {size}")
            if f.link is not None and f.link not in names:
                raise ValueError(f"LinkFault link {f.link!r}: this world's links are "
                                 f"{', '.join(sorted(names)) or 'none'}")
        self.by_rank: dict[int, RankFault] = {}
        for r in plan.ranks:
            if r.rank >= size:
                raise ValueError(f"RankFault rank {r.rank} out of range for a world of {size}")
            if r.rank in self.by_rank:
                raise ValueError(f"two RankFaults for rank {r.rank}: give one with every field")
            self.by_rank[r.rank] = r
        self._pairs: dict[tuple[int, int], _Pair] = {}
        for a in range(size):
            for b in range(size):
                if a == b:
                    continue
                name = cluster.link(a, b).name
                chosen = [f for f in plan.links if f.covers(a, b, name)]
                if chosen:
                    self._pairs[(a, b)] = _Pair(chosen, random.Random(
                        (plan.seed * size + a) * size + b) if any(f.jitter for f in chosen)
                        else None)
        #: What happened, in order (``FaultEvent``; a pair's held messages once per cause).
        self.events: list[FaultEvent] = []
        self._noted: set[tuple[int, str, int | None, str]] = set()
        #: When each rank is declared failed by the detector (model ns), if it is.
        self.declared = self._declarations()

    # -- links ----------------------------------------------------------------------------

    def depart(self, src: int, dst: int, now: int) -> int:
        """When a message ``src`` sends ``dst`` at ``now`` (ns) leaves: after its pair's
        delays, jitter and partitions (Rule 1) and its sender's hang (Rule 2)."""
        t = now
        rank = self.by_rank.get(src)
        if rank is not None and rank.hang_at is not None and now >= to_ns(rank.hang_at):
            self.note(now, src, "held", dst, "hung")
            return HELD
        pair = self._pairs.get((src, dst))
        if pair is None:
            return t
        for f in pair.faults:
            if not to_ns(f.start) <= now < (HELD if math.isinf(f.end) else to_ns(f.end)):
                continue
            if f.partition:
                t = max(t, to_ns(f.end))
                self.note(now, src, "held", dst, f"partitioned until {f.end:g} s")
            t += to_ns(f.delay)
            if f.jitter and pair.rng is not None:
                t += to_ns(f.jitter * pair.rng.random())
        return t

    def link(self, src: int, dst: int, spec: LinkSpec, now: int) -> LinkSpec:
        """``spec`` with the bandwidth of the pair's faults active at ``now``."""
        pair = self._pairs.get((src, dst))
        if pair is None:
            return spec
        factor = 1.0
        for f in pair.faults:
            if to_ns(f.start) <= now < (HELD if math.isinf(f.end) else to_ns(f.end)):
                factor *= f.bandwidth
        if factor == 1.0:
            return spec
        return LinkSpec(spec.name, spec.bandwidth * factor, spec.latency, spec.efficiency,
                        spec.sharing, *(tuple((n, lat, bw * factor) for n, lat, bw in segments)
                                        for segments in (spec.segments, spec.crowded)))

    def slowdown(self, rank: int) -> float:
        """The factor on ``rank``'s compute and copy times."""
        fault = self.by_rank.get(rank)
        return 1.0 if fault is None else fault.slowdown

    # -- ranks ----------------------------------------------------------------------------

    def crash_time(self, rank: int) -> int | None:
        """When ``rank`` crashes (ns): its planned crash or its declaration, the first."""
        fault = self.by_rank.get(rank)
        times = [t for t in (None if fault is None or fault.crash_at is None
                             else to_ns(fault.crash_at), self.declared.get(rank))
                 if t is not None]
        return min(times) if times else None

    def crash_event(self, rank: int) -> int | None:
        """The engine event after which ``rank`` crashes (1-based), if any."""
        fault = self.by_rank.get(rank)
        return None if fault is None else fault.crash_at_event

    def _declarations(self) -> dict[int, int]:
        """Rule 3: for each rank silent to all others for longer than the timeout, when it
        is declared failed (ns)."""
        timeout = self.plan.detection_timeout
        if timeout is None or self.size < 2:
            return {}
        out: dict[int, int] = {}
        for rank in range(self.size):
            fault = self.by_rank.get(rank)
            if fault is not None and fault.hang_at is not None:
                out[rank] = to_ns(fault.hang_at) + to_ns(timeout)
                continue
            # Silent to every peer: the intersection of each direction's partitions.
            silent: list[tuple[float, float]] | None = None
            for peer in range(self.size):
                if peer == rank:
                    continue
                pair = self._pairs.get((rank, peer))
                windows = sorted((f.start, f.end) for f in (pair.faults if pair else ())
                                 if f.partition)
                silent = windows if silent is None else _intersect(silent, windows)
            for start, end in _merge(silent or []):
                if end - start > timeout:
                    out[rank] = to_ns(start) + to_ns(timeout)
                    break
        return out

    def note(self, now_ns: int, rank: int, what: str, peer: int | None = None,
             detail: str = "") -> None:
        """Record a ``FaultEvent`` at ``now_ns`` (once per rank, kind, peer and detail)."""
        key = (rank, what, peer, detail)
        if key in self._noted:
            return
        self._noted.add(key)
        self.events.append(FaultEvent(now_ns * 1e-9, rank, what, peer, detail))


def _merge(windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(windows):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _intersect(a: list[tuple[float, float]],
               b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for s1, e1 in _merge(a):
        for s2, e2 in _merge(b):
            s, e = max(s1, s2), min(e1, e2)
            if e > s:
                out.append((s, e))
    return out
