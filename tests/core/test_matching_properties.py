"""Property tests: random programs over several ranks, checked against a brute-force model.

A program is a list of steps over 2-5 ranks: sends (put in a FIFO channel per (source,
destination) pair), deliveries (the oldest envelope of one channel arrives), recvs (exact or
wildcard, buffers sometimes too small or of the wrong dtype), cancels of recvs and probes,
withdrawals of envelopes, non-blocking and blocking probes.  ``WorldSim`` runs it on the real
matchers; ``RefMatcher`` runs it on plain lists scanned from the front, which is MPI's rule
written the slow, obvious way.  At the end every channel is flushed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from asynccomm._types import ANY_SOURCE, ANY_TAG

from .helpers import F4, I4, Envelope, LogEntry, ProbeDescriptor, RecvDescriptor, WorldSim

TAGS = (0, 1)
SIZES = (0, 1, 8, 16, 64)
CAPACITIES = (None, 0, 8, 16, 64)
SETTINGS = settings(max_examples=200, deadline=None)


# -- the reference model ----------------------------------------------------------------------


def _fits(source: int, tag: int, env: Envelope) -> bool:
    return source in (ANY_SOURCE, env.source) and tag in (ANY_TAG, env.tag)


def _misfit(recv: RecvDescriptor, env: Envelope) -> str | None:
    if recv.dtype is not None and recv.dtype != env.dtype:
        return "dtype"
    if recv.capacity is not None and env.nbytes > recv.capacity:
        return "truncated"
    return None


def _remove(items: list[Any], item: object) -> bool:
    """Remove ``item`` (by identity) from ``items``; False if it is not there."""
    for i, x in enumerate(items):
        if x is item:
            del items[i]
            return True
    return False


class RefMatcher:
    """MPI matching with lists scanned linearly: obviously right, and slow."""

    def __init__(self) -> None:
        self.posted: list[RecvDescriptor] = []
        self.unexpected: list[Envelope] = []
        self.probes: list[ProbeDescriptor] = []

    def deliver(self, env: Envelope) -> list[LogEntry]:
        out: list[LogEntry] = []
        for recv in list(self.posted):
            if _fits(recv.source, recv.tag, env):
                _remove(self.posted, recv)
                reason = _misfit(recv, env)
                if reason is None:
                    out.append(("match", recv, env))
                    return out
                out.append(("reject", recv, env, reason))
        self.unexpected.append(env)
        for probe in list(self.probes):
            if _fits(probe.source, probe.tag, env):
                _remove(self.probes, probe)
                out.append(("probe", probe, env))
        return out

    def post_recv(self, recv: RecvDescriptor) -> list[LogEntry]:
        for i, env in enumerate(self.unexpected):
            if _fits(recv.source, recv.tag, env):
                reason = _misfit(recv, env)
                if reason is not None:
                    return [("reject", recv, env, reason)]
                del self.unexpected[i]
                return [("match", recv, env)]
        self.posted.append(recv)
        return []

    def peek(self, source: int, tag: int) -> Envelope | None:
        return next((e for e in self.unexpected if _fits(source, tag, e)), None)

    def post_probe(self, probe: ProbeDescriptor) -> list[LogEntry]:
        env = self.peek(probe.source, probe.tag)
        if env is None:
            self.probes.append(probe)
            return []
        return [("probe", probe, env)]

    def cancel(self, desc: RecvDescriptor | ProbeDescriptor) -> bool:
        return _remove(self.probes if isinstance(desc, ProbeDescriptor) else self.posted, desc)

    def withdraw(self, env: Envelope) -> bool:
        return _remove(self.unexpected, env)


# -- programs ---------------------------------------------------------------------------------

Step = tuple[Any, ...]
Channel = tuple[int, int]

# Sends and recvs dominate, so that most programs match, reject and overtake-test something.
KINDS = ("send",) * 4 + ("recv",) * 4 + ("deliver", "cancel", "withdraw", "probe") * 2 + (
    "peek",)

# Strategies built once: building them per step costs more than the matching under test.
_KIND = st.sampled_from(KINDS)
_PICK = st.integers(0, 1000)
_SOURCE = st.integers(0, 9)
_TAG = st.sampled_from((ANY_TAG, *TAGS, *TAGS))
_SEND_TAG = st.sampled_from(TAGS)
_SIZE = st.sampled_from(SIZES)
_CAPACITY = st.sampled_from(CAPACITIES)
_SEND_DTYPE = st.sampled_from((F4, F4, I4))
_RECV_DTYPE = st.sampled_from((None, F4, F4, I4))
_NOW = st.booleans()


@st.composite
def steps(draw: st.DrawFn, size: int, channels: list[Channel]) -> Step:
    """One step.  Traffic stays on a few (source, dest) channels so that messages meet
    their recvs; recvs name the channel's source mostly, and now and then any rank or a
    wildcard (rarely enough that some ranks see only exact recvs, the matcher's fast path)."""
    kind = draw(_KIND)
    src, dest = channels[draw(_PICK) % len(channels)]
    pick = draw(_SOURCE)
    source = ANY_SOURCE if pick == 0 else src if pick <= 4 else pick % size
    if kind == "send":
        return (kind, src, dest, draw(_SEND_TAG), draw(_SIZE), draw(_SEND_DTYPE), draw(_NOW))
    if kind == "deliver":
        return (kind, src, dest)
    if kind == "recv":
        return (kind, dest, source, draw(_TAG), draw(_CAPACITY), draw(_RECV_DTYPE))
    if kind in ("cancel", "withdraw"):
        return (kind, dest, draw(_PICK))
    return (kind, dest, source, draw(_TAG))


@st.composite
def programs(draw: st.DrawFn) -> tuple[int, list[Step]]:
    """(number of ranks, steps); see ``_STEPS`` for what each step's fields mean."""
    size = draw(st.integers(2, 5))
    rank = st.integers(0, size - 1)
    channels = draw(st.lists(st.tuples(rank, rank), min_size=1, max_size=4, unique=True))
    return size, draw(st.lists(steps(size, channels), min_size=10, max_size=60))


@dataclass
class Trace:
    """What a program did, with the reference model's verdict checked at every step."""

    sim: WorldSim
    refs: list[RefMatcher]
    sends: list[tuple[int, Envelope]] = field(default_factory=list)  # (dest, env), send order
    recvs: list[tuple[int, RecvDescriptor]] = field(default_factory=list)
    probes: list[tuple[int, ProbeDescriptor]] = field(default_factory=list)
    withdrawn: list[Envelope] = field(default_factory=list)


def _tag(dest: int, entries: list[LogEntry]) -> list[LogEntry]:
    return [(e[0], dest, *e[1:]) for e in entries]


def _deliver(t: Trace, source: int, dest: int) -> None:
    channel = t.sim.channels[source, dest]
    if not channel:
        return
    env = channel[0]
    got = t.sim.deliver_one(source, dest)
    assert got == _tag(dest, t.refs[dest].deliver(env))


def _send(t: Trace, source: int, dest: int, tag: int, nbytes: int, dtype: str,
          now: bool) -> None:
    """Post a send; with ``now``, its channel is flushed at once (in order)."""
    env = t.sim.send(source, dest, tag, nbytes, dtype, deliver=False)
    t.sends.append((dest, env))
    while now and t.sim.channels[source, dest]:
        _deliver(t, source, dest)


def _recv(t: Trace, dest: int, source: int, tag: int, cap: int | None, dtype: str | None) -> None:
    desc, got = t.sim.recv(dest, source, tag, cap, dtype)
    t.recvs.append((dest, desc))
    assert got == _tag(dest, t.refs[dest].post_recv(desc))
    if got and got[0][0] == "reject":
        # Send first: nothing was consumed, the message is still waiting, first in line.
        assert t.sim.matchers[dest].probe(source, tag) is got[0][3]


def _cancel(t: Trace, dest: int, pick: int) -> None:
    mine: list[RecvDescriptor | ProbeDescriptor] = [d for r, d in t.recvs if r == dest]
    mine += [p for r, p in t.probes if r == dest]
    if mine:
        desc = mine[pick % len(mine)]
        assert t.sim.cancel(dest, desc) == t.refs[dest].cancel(desc)


def _withdraw(t: Trace, dest: int, pick: int) -> None:
    mine = [e for d, e in t.sends if d == dest]
    if mine:
        env = mine[pick % len(mine)]
        ok = t.sim.withdraw(dest, env)
        assert ok == t.refs[dest].withdraw(env)
        if ok:
            t.withdrawn.append(env)


def _peek(t: Trace, dest: int, source: int, tag: int) -> None:
    assert t.sim.probe(dest, source, tag) is t.refs[dest].peek(source, tag)


def _probe(t: Trace, dest: int, source: int, tag: int) -> None:
    probe, got = t.sim.post_probe(dest, source, tag)
    t.probes.append((dest, probe))
    assert got == _tag(dest, t.refs[dest].post_probe(probe))


_STEPS: dict[str, Callable[..., None]] = {
    "send": _send,
    "deliver": _deliver,
    "recv": _recv,
    "cancel": _cancel,
    "withdraw": _withdraw,
    "peek": _peek,
    "probe": _probe,
}


def run(size: int, program: list[Step]) -> Trace:
    """Run ``program`` on a WorldSim and the reference model side by side; flush at the end."""
    t = Trace(WorldSim(size), [RefMatcher() for _ in range(size)])
    for kind, *args in program:
        _STEPS[kind](t, *args)
    for source, dest in list(t.sim.channels):
        while t.sim.channels[source, dest]:
            _deliver(t, source, dest)
    assert t.sim.in_flight() == 0
    return t


def _matches(t: Trace) -> list[tuple[Any, ...]]:
    """(dest, recv, env) for every match, in the order they happened."""
    return [e[1:] for e in t.sim.log if e[0] == "match"]


# -- properties -------------------------------------------------------------------------------


@SETTINGS
@given(programs())
def test_agrees_with_the_reference_model(prog: tuple[int, list[Step]]) -> None:
    """Earliest posted recv, earliest arrived message, rejections, probes, cancels and
    withdrawals: the matcher does step for step what the linear scan does."""
    t = run(*prog)  # every step is compared inside run()
    for dest, (matcher, ref) in enumerate(zip(t.sim.matchers, t.refs, strict=True)):
        assert matcher.posted_recvs() == ref.posted, dest
        assert matcher.unexpected() == ref.unexpected, dest
        assert matcher.probes() == ref.probes, dest
        assert matcher.next_event() is None


@SETTINGS
@given(programs())
def test_nothing_lost_or_duplicated(prog: tuple[int, list[Step]]) -> None:
    t = run(*prog)
    matched = Counter(id(env) for _, _, env in _matches(t))
    assert all(n == 1 for n in matched.values()), "an envelope matched twice"
    recv_matched = Counter(id(recv) for _, recv, _ in _matches(t))
    assert all(n == 1 for n in recv_matched.values()), "a recv matched twice"
    withdrawn = Counter(id(env) for env in t.withdrawn)
    assert all(n == 1 for n in withdrawn.values())
    waiting = Counter(id(e) for m in t.sim.matchers for e in m.unexpected())
    for dest, env in t.sends:
        fates = matched[id(env)] + withdrawn[id(env)] + waiting[id(env)]
        assert fates == 1, (dest, env)
    # And nothing appears that was never sent.
    sent = {id(env) for _, env in t.sends}
    assert set(matched) | set(withdrawn) | set(waiting) <= sent


@SETTINGS
@given(programs())
def test_rejected_recvs_consume_nothing(prog: tuple[int, list[Step]]) -> None:
    t = run(*prog)
    rejected = {id(e[2]) for e in t.sim.log if e[0] == "reject"}
    assert rejected.isdisjoint(id(recv) for _, recv, _ in _matches(t))
    posted = {id(r) for m in t.sim.matchers for r in m.posted_recvs()}
    assert rejected.isdisjoint(posted)
    for e in t.sim.log:
        if e[0] == "reject":
            _, dest, recv, env, reason = e
            assert reason in ("dtype", "truncated")
            assert isinstance(recv, RecvDescriptor) and isinstance(env, Envelope)
            assert _fits(recv.source, recv.tag, env)  # it did fit by envelope
            assert _misfit(recv, env) == reason
    stats = [m.statistics() for m in t.sim.matchers]
    assert sum(s.matched for s in stats) == len(_matches(t))


@SETTINGS
@given(programs())
def test_non_overtaking(prog: tuple[int, list[Step]]) -> None:
    """Per (source, destination, tag), messages are matched in the order they were sent."""
    t = run(*prog)
    send_order = {id(env): i for i, (_, env) in enumerate(t.sends)}
    last: dict[tuple[int, int, int], int] = {}
    for dest, _, env in _matches(t):
        key = (env.source, dest, env.tag)
        i = send_order[id(env)]
        assert i > last.get(key, -1), key
        last[key] = i
    # A message still waiting was never overtaken by a later one of its stream that matched.
    for dest, matcher in enumerate(t.sim.matchers):
        for env in matcher.unexpected():
            key = (env.source, dest, env.tag)
            assert send_order[id(env)] > last.get(key, -1)


@SETTINGS
@given(programs())
def test_matched_pairs_fit(prog: tuple[int, list[Step]]) -> None:
    t = run(*prog)
    sent_to = {id(env): dest for dest, env in t.sends}
    for dest, recv, env in _matches(t):
        assert sent_to[id(env)] == dest
        assert recv.source in (ANY_SOURCE, env.source)
        assert recv.tag in (ANY_TAG, env.tag)
        assert recv.dtype in (None, env.dtype)
        assert recv.capacity is None or env.nbytes <= recv.capacity


@SETTINGS
@given(programs())
def test_statistics_agree_with_the_queues(prog: tuple[int, list[Step]]) -> None:
    t = run(*prog)
    for dest, matcher in enumerate(t.sim.matchers):
        stats = matcher.statistics()
        assert stats.posted_recvs == len(matcher.posted_recvs())
        assert stats.unexpected_messages == len(matcher.unexpected())
        assert stats.unexpected_bytes == sum(e.nbytes for e in matcher.unexpected())
        assert stats.probes == len(matcher.probes())
        assert stats.matched == sum(1 for d, _, _ in _matches(t) if d == dest)
