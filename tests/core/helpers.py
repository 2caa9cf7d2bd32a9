"""Helpers for the sans-IO core tests, in the spirit of h11's ``tests/helpers.py``.

A *case* is a list of ops on the ``Matcher`` of one destination rank:

- ``Send``: an envelope arrives (``deliver``);
- ``Recv``: a recv is posted (``post_recv``);
- ``Probe``: a blocking probe is posted (``post_probe``);
- ``Peek``: a non-blocking probe (``probe``);
- ``Cancel``: a posted recv or probe is cancelled, by name;
- ``Withdraw``: an envelope is withdrawn, by name.

Every descriptor carries its op's name as its ``handle``, so ``play`` can report what
happened as a log of plain tuples that a table can spell out:

- ``("match", recv, send)``
- ``("reject", recv, send, reason)``
- ``("probe", probe, send)``
- ``("peek", send or None)``
- ``("cancel", name, result)`` and ``("withdraw", name, result)``

``feed_all_orders`` yields every interleaving of a case that a real run could produce, and
``WorldSim`` wires one matcher per rank with a FIFO channel per (source, destination) pair.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from asynccomm._core.descriptors import STAGED, Descriptor, Message
from asynccomm._core.matching import Matcher, MatchEvent, ProbeMatched, RecvRejected


class Envelope(Message):
    """A message with a label (``handle``) for the tests to name it by."""

    __slots__ = ("handle",)

    def __init__(self, source: int, tag: int, nbytes: int, count: int, dtype: str,
                 handle: object = None) -> None:
        super().__init__(source, tag, nbytes, count, dtype, STAGED)
        self.handle = handle


class RecvDescriptor(Descriptor):
    """A posted recv with a label; ``capacity`` None takes any size."""

    __slots__ = ("handle",)

    def __init__(self, source: int, tag: int, capacity: int | None, dtype: str | None,
                 handle: object = None) -> None:
        super().__init__(source, tag, -1 if capacity is None else capacity, 0, dtype)
        self.handle = handle

    @property
    def capacity(self) -> int | None:
        return None if self.nbytes < 0 else self.nbytes


class ProbeDescriptor(Descriptor):
    """A blocking probe with a label."""

    __slots__ = ("handle",)

    def __init__(self, source: int, tag: int, handle: object = None) -> None:
        super().__init__(source, tag, -1, 0, None)
        self.handle = handle


def cancel(matcher: Matcher, desc: Descriptor) -> bool:
    """Withdraw a posted recv or probe."""
    if isinstance(desc, ProbeDescriptor):
        return matcher.cancel_probe(desc)
    return matcher.cancel(desc)

__all__ = [
    "F4",
    "Envelope",
    "ProbeDescriptor",
    "RecvDescriptor",
    "cancel",
    "I4",
    "Cancel",
    "Op",
    "Outcome",
    "Peek",
    "Probe",
    "Recv",
    "Send",
    "Withdraw",
    "WorldSim",
    "drain",
    "feed_all_orders",
    "play",
]

F4 = "<f4"
I4 = "<i4"

LogEntry = tuple[object, ...]


@dataclass(frozen=True, eq=False)
class Send:
    """An envelope from ``source`` with ``tag`` arrives at the matcher."""

    name: str
    source: int
    tag: int
    nbytes: int = 8
    dtype: str = F4


@dataclass(frozen=True, eq=False)
class Recv:
    """A recv for (``source``, ``tag``) is posted."""

    name: str
    source: int
    tag: int
    capacity: int | None = 64
    dtype: str | None = F4


@dataclass(frozen=True, eq=False)
class Probe:
    """A blocking probe for (``source``, ``tag``) is posted."""

    name: str
    source: int
    tag: int


@dataclass(frozen=True, eq=False)
class Peek:
    """A non-blocking probe for (``source``, ``tag``)."""

    source: int
    tag: int


@dataclass(frozen=True, eq=False)
class Cancel:
    """The recv or probe called ``target`` is cancelled."""

    target: str


@dataclass(frozen=True, eq=False)
class Withdraw:
    """The envelope called ``target`` is withdrawn."""

    target: str


Op = Send | Recv | Probe | Peek | Cancel | Withdraw


@dataclass
class Outcome:
    """What ``play`` saw: the log, and the names left in each of the matcher's queues."""

    log: list[LogEntry]
    posted: list[str]
    unexpected: list[str]
    probes: list[str]
    matcher: Matcher

    @property
    def pairs(self) -> set[tuple[object, object]]:
        """The (recv, send) pairs that matched."""
        return {(e[1], e[2]) for e in self.log if e[0] == "match"}


def drain(matcher: Matcher) -> list[MatchEvent]:
    """Every event queued in ``matcher``, in order."""
    out: list[MatchEvent] = []
    while (event := matcher.next_event()) is not None:
        out.append(event)
    return out


def _entry(event: MatchEvent) -> LogEntry:
    if isinstance(event, RecvRejected):
        return ("reject", event.recv.handle, event.envelope.handle, event.reason)
    assert isinstance(event, ProbeMatched)
    return ("probe", event.probe.handle, event.envelope.handle)


Desc = Envelope | RecvDescriptor | ProbeDescriptor


def apply(matcher: Matcher, op: Op, descs: dict[str, Desc]) -> list[LogEntry]:
    """Run one op on ``matcher``; ``descs`` maps names to the descriptors posted so far."""
    out: list[LogEntry] = []
    if isinstance(op, Send):
        env = descs[op.name] = Envelope(op.source, op.tag, op.nbytes, op.nbytes, op.dtype,
                                        op.name)
        recv = matcher.deliver(env)
        out += [_entry(e) for e in drain(matcher)]
        if recv is not None:
            out.append(("match", recv.handle, op.name))
    elif isinstance(op, Recv):
        desc = descs[op.name] = RecvDescriptor(op.source, op.tag, op.capacity, op.dtype,
                                               op.name)
        found = matcher.post_recv(desc)
        if found is not None:
            out.append(("match", op.name, found.handle))
        out += [_entry(e) for e in drain(matcher)]
    elif isinstance(op, Probe):
        probe = descs[op.name] = ProbeDescriptor(op.source, op.tag, op.name)
        found = matcher.post_probe(probe)
        if found is not None:
            out.append(("probe", op.name, found.handle))
        out += [_entry(e) for e in drain(matcher)]
    elif isinstance(op, Peek):
        found = matcher.probe(op.source, op.tag)
        out.append(("peek", None if found is None else found.handle))
    elif isinstance(op, Cancel):
        target = descs[op.target]
        assert not isinstance(target, Envelope)
        out.append(("cancel", op.target, cancel(matcher, target)))
    else:
        target = descs[op.target]
        assert isinstance(target, Envelope)
        out.append(("withdraw", op.target, matcher.withdraw(target)))
    return out


def play(ops: Iterable[Op]) -> Outcome:
    """Run a case on a fresh matcher and report what happened."""
    matcher = Matcher()
    descs: dict[str, Desc] = {}
    log: list[LogEntry] = []
    for op in ops:
        log += apply(matcher, op, descs)
    return Outcome(
        log=log,
        posted=[str(r.handle) for r in matcher.posted_recvs()],
        unexpected=[str(e.handle) for e in matcher.unexpected()],
        probes=[str(p.handle) for p in matcher.probes()],
        matcher=matcher,
    )


def _constraints(ops: Sequence[Op]) -> list[tuple[int, int]]:
    """(before, after) index pairs that every interleaving must keep."""
    pairs: list[tuple[int, int]] = []
    last_send: dict[int, int] = {}
    where: dict[str, int] = {}
    for i, op in enumerate(ops):
        if isinstance(op, Send):
            # One sender's envelopes arrive in the order it posted them.
            if op.source in last_send:
                pairs.append((last_send[op.source], i))
            last_send[op.source] = i
        if isinstance(op, Send | Recv | Probe):
            where[op.name] = i
        if isinstance(op, Cancel | Withdraw):
            pairs.append((where[op.target], i))
    return pairs


def feed_all_orders(ops: Sequence[Op]) -> Iterator[list[Op]]:
    """Every order of ``ops`` that keeps each sender's envelopes in their relative order
    and puts each cancel or withdraw after what it names.  Keep cases small (≤ 7 ops)."""
    pairs = _constraints(ops)
    for perm in itertools.permutations(range(len(ops))):
        pos = {index: p for p, index in enumerate(perm)}
        if all(pos[a] < pos[b] for a, b in pairs):
            yield [ops[i] for i in perm]


class WorldSim:
    """One ``Matcher`` per destination rank, with a FIFO channel per (source, destination).

    ``send`` puts an envelope in its channel (and by default delivers the channel at
    once); ``deliver_one`` lets one envelope arrive, so tests can delay a channel while
    keeping each sender's order.  Every match and event lands in ``log`` as
    ``("match", dest, recv, env)``, ``("reject", dest, recv, env, reason)`` or
    ``("probe", dest, probe, env)``; each method also returns the entries it added.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.matchers = [Matcher() for _ in range(size)]
        self.channels: dict[tuple[int, int], deque[Envelope]] = {
            (s, d): deque() for s in range(size) for d in range(size)
        }
        self.log: list[LogEntry] = []

    def send(self, source: int, dest: int, tag: int, nbytes: int = 8, dtype: str = F4, *,
             handle: object = None, deliver: bool = True) -> Envelope:
        """Post a send; with ``deliver``, flush its channel too."""
        env = Envelope(source, tag, nbytes, nbytes, dtype, handle)
        self.channels[source, dest].append(env)
        if deliver:
            self.flush(source, dest)
        return env

    def deliver_one(self, source: int, dest: int) -> list[LogEntry]:
        """The oldest envelope in flight from ``source`` to ``dest`` arrives (if any)."""
        channel = self.channels[source, dest]
        if not channel:
            return []
        env = channel.popleft()
        matcher = self.matchers[dest]
        recv = matcher.deliver(env)
        out = self._events(dest)
        if recv is not None:
            out.append(("match", dest, recv, env))
        self.log += out
        return out

    def flush(self, source: int | None = None, dest: int | None = None) -> list[LogEntry]:
        """Deliver everything in flight (from ``source``, to ``dest``, when given)."""
        out: list[LogEntry] = []
        for s, d in self.channels:
            if source in (None, s) and dest in (None, d):
                while self.channels[s, d]:
                    out += self.deliver_one(s, d)
        return out

    def in_flight(self) -> int:
        return sum(len(c) for c in self.channels.values())

    def recv(self, dest: int, source: int, tag: int, capacity: int | None = 64,
             dtype: str | None = F4, *, handle: object = None
             ) -> tuple[RecvDescriptor, list[LogEntry]]:
        """Post a recv at ``dest``."""
        desc = RecvDescriptor(source, tag, capacity, dtype, handle)
        env = self.matchers[dest].post_recv(desc)
        out: list[LogEntry] = [] if env is None else [("match", dest, desc, env)]
        out += self._events(dest)
        self.log += out
        return desc, out

    def post_probe(self, dest: int, source: int, tag: int, *, handle: object = None
                   ) -> tuple[ProbeDescriptor, list[LogEntry]]:
        """Post a blocking probe at ``dest``."""
        probe = ProbeDescriptor(source, tag, handle)
        env = self.matchers[dest].post_probe(probe)
        out: list[LogEntry] = [] if env is None else [("probe", dest, probe, env)]
        self.log += out
        return probe, out

    def probe(self, dest: int, source: int, tag: int) -> Envelope | None:
        return self.matchers[dest].probe(source, tag)

    def cancel(self, dest: int, desc: RecvDescriptor | ProbeDescriptor) -> bool:
        return cancel(self.matchers[dest], desc)

    def withdraw(self, dest: int, env: Envelope) -> bool:
        return self.matchers[dest].withdraw(env)

    def _events(self, dest: int) -> list[LogEntry]:
        out: list[LogEntry] = []
        for event in drain(self.matchers[dest]):
            if isinstance(event, RecvRejected):
                out.append(("reject", dest, event.recv, event.envelope, event.reason))
            else:
                out.append(("probe", dest, event.probe, event.envelope))
        return out
