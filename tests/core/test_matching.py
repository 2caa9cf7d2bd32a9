"""The matcher's rules (MPI semantics), table-driven and without an event loop.

``MATCH_CASES`` spells out each case as the ops in order, the log they must produce and what
must be left in the queues (see ``helpers.play`` for the log's format).  Cases marked
``any_order`` must also give the same pairs and leftovers in every interleaving that keeps
each sender's order.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest

from asynccomm._core.matching import Matcher, MatcherStatistics, ProbeMatched, RecvRejected
from asynccomm._types import ANY_SOURCE, ANY_TAG

from .helpers import (
    F4,
    I4,
    Cancel,
    Envelope,
    LogEntry,
    Op,
    Peek,
    Probe,
    ProbeDescriptor,
    Recv,
    RecvDescriptor,
    Send,
    Withdraw,
    drain,
    feed_all_orders,
    play,
)

ANY = ANY_SOURCE
assert ANY_SOURCE == ANY_TAG  # the table writes both as ANY


class Case(NamedTuple):
    name: str
    ops: list[Op]
    log: list[LogEntry]
    posted: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    probes: tuple[str, ...] = ()
    any_order: bool = False


# A recv that fits (0, 5) in each of the four buckets a message looks at.
_BUCKETS = {"exact": (0, 5), "src_any": (0, ANY), "any_tag": (ANY, 5), "any_any": (ANY, ANY)}
# Recvs that never fit (0, 5), one per bucket kind; posted first, so they are the earliest.
_DECOYS: list[Op] = [Recv("x1", 1, 5), Recv("x2", 0, 6), Recv("x3", 1, ANY), Recv("x4", ANY, 6)]


def _bucket_order_cases() -> Iterator[Case]:
    """For every posting order of the four buckets, four messages go to them in that order."""
    for order in itertools.permutations(_BUCKETS):
        recvs: list[Op] = [Recv(name, *_BUCKETS[name]) for name in order]
        sends: list[Op] = [Send(f"m{i}", 0, 5) for i in range(4)]
        yield Case(
            f"earliest-posted:{','.join(order)}",
            _DECOYS + recvs + sends,
            [("match", name, f"m{i}") for i, name in enumerate(order)],
            posted=("x1", "x2", "x3", "x4"),
        )


MATCH_CASES: list[Case] = [
    # -- exact matching ---------------------------------------------------------------------
    Case("exact send-first", [Send("a", 0, 5), Recv("r", 0, 5)], [("match", "r", "a")],
         any_order=True),
    Case("exact recv-first", [Recv("r", 0, 5), Send("a", 0, 5)], [("match", "r", "a")],
         any_order=True),
    Case("other tag does not match", [Send("a", 0, 5), Recv("r", 0, 6)], [],
         posted=("r",), unexpected=("a",), any_order=True),
    Case("other source does not match", [Recv("r", 1, 5), Send("a", 0, 5)], [],
         posted=("r",), unexpected=("a",), any_order=True),
    Case("distinct keys pair up in any order",
         [Send("a", 0, 5), Send("b", 1, 5), Send("c", 0, 6),
          Recv("rc", 0, 6), Recv("ra", 0, 5), Recv("rb", 1, 5)],
         [("match", "rc", "c"), ("match", "ra", "a"), ("match", "rb", "b")], any_order=True),
    # -- a message takes the earliest posted recv (Rule 1) -----------------------------------
    *_bucket_order_cases(),
    Case("earliest posted: same bucket is FIFO among other buckets",
         [Recv("r1", 0, 5), Recv("r2", ANY, ANY), Recv("r3", 0, 5), Recv("r4", ANY, 5),
          Send("a", 0, 5), Send("b", 0, 5), Send("c", 0, 5), Send("d", 0, 5)],
         [("match", "r1", "a"), ("match", "r2", "b"), ("match", "r3", "c"),
          ("match", "r4", "d")]),
    Case("earliest posted: exact-only fast path after the wildcards are gone",
         [Recv("w", ANY, ANY), Recv("e1", 0, 5), Recv("e2", 0, 5),
          Send("a", 0, 5), Send("b", 0, 5), Send("c", 1, 5)],
         [("match", "w", "a"), ("match", "e1", "b")], posted=("e2",), unexpected=("c",)),
    Case("earliest posted: a cancelled earlier recv is skipped",
         [Recv("r1", 0, 5), Recv("r2", ANY, 5), Cancel("r1"), Send("a", 0, 5)],
         [("cancel", "r1", True), ("match", "r2", "a")]),
    # -- a recv takes the earliest arrived message (Rule 2) ----------------------------------
    Case("earliest arrived: each wildcard kind",
         [Send("a", 1, 5), Send("b", 0, 6), Send("c", 0, 5), Send("d", 1, 6),
          Recv("r1", ANY, 5), Recv("r2", 0, ANY), Recv("r3", ANY, ANY), Recv("r4", 1, 6)],
         [("match", "r1", "a"), ("match", "r2", "b"), ("match", "r3", "c"),
          ("match", "r4", "d")]),
    Case("earliest arrived: wildcard index built lazily, then kept up to date",
         [Send("a", 1, 5), Send("b", 0, 5), Recv("r1", 0, 5),  # exact: no index yet
          Send("c", 2, 5), Recv("r2", ANY, 5),  # index built from a, c
          Send("d", 0, 5), Recv("r3", ANY, 5), Recv("r4", ANY, ANY), Recv("r5", ANY, ANY)],
         [("match", "r1", "b"), ("match", "r2", "a"), ("match", "r3", "c"),
          ("match", "r4", "d")], posted=("r5",)),
    Case("earliest arrived: exact matches keep the wildcard index in step",
         [Peek(ANY, ANY), Send("e", 3, 7), Send("f", 3, 7), Send("g", 2, 7),
          Recv("r1", 3, 7), Recv("r2", ANY, 7), Recv("r3", 3, ANY), Recv("r4", ANY, ANY)],
         [("peek", None), ("match", "r1", "e"), ("match", "r2", "f"), ("match", "r4", "g")],
         posted=("r3",)),
    Case("earliest arrived: a wildcard recv skips messages that do not fit",
         [Send("a", 1, 6), Send("b", 2, 5), Send("c", 0, 5), Recv("r", 0, ANY)],
         [("match", "r", "c")], unexpected=("a", "b")),
    # -- non-overtaking (Rule 3) -------------------------------------------------------------
    Case("non-overtaking send-first",
         [Send("a1", 0, 5), Send("a2", 0, 5), Send("a3", 0, 5),
          Recv("r1", 0, 5), Recv("r2", 0, 5), Recv("r3", 0, 5)],
         [("match", "r1", "a1"), ("match", "r2", "a2"), ("match", "r3", "a3")]),
    Case("non-overtaking recv-first",
         [Recv("r1", 0, 5), Recv("r2", 0, 5), Send("a1", 0, 5), Send("a2", 0, 5)],
         [("match", "r1", "a1"), ("match", "r2", "a2")]),
    Case("non-overtaking under a tag wildcard",
         [Send("a1", 0, 5), Send("b1", 0, 6), Send("a2", 0, 5),
          Recv("r1", 0, ANY), Recv("r2", 0, ANY), Recv("r3", 0, ANY)],
         [("match", "r1", "a1"), ("match", "r2", "b1"), ("match", "r3", "a2")]),
    Case("non-overtaking with a withdrawn message in the middle",
         [Send("a1", 0, 5), Send("a2", 0, 5), Send("a3", 0, 5), Withdraw("a2"),
          Recv("r1", 0, 5), Recv("r2", 0, 5)],
         [("withdraw", "a2", True), ("match", "r1", "a1"), ("match", "r2", "a3")]),
    # -- dtype and size (Rule 4), recv first -------------------------------------------------
    Case("recv-first dtype mismatch: recv rejected, message queued",
         [Recv("r1", 0, 5, dtype=I4), Send("a", 0, 5), Recv("r2", 0, 5)],
         [("reject", "r1", "a", "dtype"), ("match", "r2", "a")]),
    Case("recv-first truncation: recv rejected, message queued",
         [Recv("r1", 0, 5, capacity=4), Send("a", 0, 5, nbytes=8)],
         [("reject", "r1", "a", "truncated")], unexpected=("a",)),
    Case("recv-first rejection: the message tries the next posted recv",
         [Recv("r1", ANY, ANY, capacity=4), Recv("r2", 0, 5, dtype=I4), Recv("r3", 0, ANY),
          Recv("r4", 0, 5), Send("a", 0, 5)],
         [("reject", "r1", "a", "truncated"), ("reject", "r2", "a", "dtype"),
          ("match", "r3", "a")], posted=("r4",)),
    Case("recv-first rejection among exact recvs only: the next one in the bucket",
         [Recv("r1", 0, 5, dtype=I4), Recv("r2", 0, 5, capacity=4), Recv("r3", 0, 5),
          Recv("r4", 0, 5), Send("a", 0, 5)],
         [("reject", "r1", "a", "dtype"), ("reject", "r2", "a", "truncated"),
          ("match", "r3", "a")], posted=("r4",)),
    Case("recv-first rejection among exact recvs only: then queued",
         [Recv("r1", 0, 5, dtype=I4), Recv("r2", 0, 6), Send("a", 0, 5), Send("b", 0, 5)],
         [("reject", "r1", "a", "dtype")], posted=("r2",), unexpected=("a", "b")),
    Case("recv-first rejection: dtype checked before size",
         [Recv("r", 0, 5, capacity=1, dtype=I4), Send("a", 0, 5)],
         [("reject", "r", "a", "dtype")], unexpected=("a",)),
    # -- dtype and size (Rule 4), send first -------------------------------------------------
    Case("send-first dtype mismatch: message stays for the next recv",
         [Send("a", 0, 5), Recv("r1", 0, 5, dtype=I4), Recv("r2", 0, 5)],
         [("reject", "r1", "a", "dtype"), ("match", "r2", "a")]),
    Case("send-first truncation: message stays first in line",
         [Send("a", 0, 5, nbytes=32), Send("b", 0, 5, nbytes=8),
          Recv("r1", 0, 5, capacity=16), Recv("r2", 0, 5), Recv("r3", 0, 5)],
         [("reject", "r1", "a", "truncated"), ("match", "r2", "a"), ("match", "r3", "b")]),
    Case("send-first wildcard rejection does not skip to a later message",
         [Send("a", 1, 5, dtype=I4), Send("b", 0, 5), Recv("r1", ANY, 5),
          Recv("r2", 1, 5, dtype=I4)],
         [("reject", "r1", "a", "dtype"), ("match", "r2", "a")], unexpected=("b",)),
    Case("a rejected recv cannot be cancelled",
         [Send("a", 0, 5), Recv("r", 0, 5, capacity=0), Cancel("r")],
         [("reject", "r", "a", "truncated"), ("cancel", "r", False)], unexpected=("a",)),
    # -- what fits ---------------------------------------------------------------------------
    Case("capacity None and dtype None take anything, send first",
         [Send("a", 0, 5, nbytes=10**12, dtype="<c16"), Recv("r", 0, 5, None, None)],
         [("match", "r", "a")], any_order=True),
    Case("capacity None and dtype None take anything, recv first",
         [Recv("r", ANY, ANY, None, None), Send("a", 3, 9, nbytes=10**12, dtype="|b1")],
         [("match", "r", "a")]),
    Case("dtype None still checks capacity",
         [Send("a", 0, 5, nbytes=65), Recv("r", 0, 5, 64, None)],
         [("reject", "r", "a", "truncated")], unexpected=("a",)),
    Case("capacity None still checks dtype",
         [Send("a", 0, 5), Recv("r", 0, 5, None, I4)],
         [("reject", "r", "a", "dtype")], unexpected=("a",)),
    Case("smaller message fits", [Send("a", 0, 5, nbytes=4), Recv("r", 0, 5, capacity=64)],
         [("match", "r", "a")], any_order=True),
    Case("message exactly the buffer's size fits",
         [Recv("r", 0, 5, capacity=64), Send("a", 0, 5, nbytes=64)], [("match", "r", "a")],
         any_order=True),
    Case("zero-byte message fits a zero-byte buffer",
         [Send("a", 0, 5, nbytes=0), Recv("r", 0, 5, capacity=0)], [("match", "r", "a")],
         any_order=True),
    # -- cancel and withdraw (Rule 5) --------------------------------------------------------
    Case("cancel a posted recv", [Recv("r", 0, 5), Cancel("r"), Send("a", 0, 5)],
         [("cancel", "r", True)], unexpected=("a",)),
    Case("cancel twice", [Recv("r", 0, 5), Cancel("r"), Cancel("r")],
         [("cancel", "r", True), ("cancel", "r", False)]),
    Case("cancel a matched recv", [Send("a", 0, 5), Recv("r", 0, 5), Cancel("r")],
         [("match", "r", "a"), ("cancel", "r", False)]),
    Case("cancel a wildcard recv restores exact matching",
         [Recv("w", ANY, ANY), Cancel("w"), Recv("r", 0, 5), Send("a", 0, 5),
          Send("b", 1, 5)],
         [("cancel", "w", True), ("match", "r", "a")], unexpected=("b",)),
    Case("withdraw an unexpected message", [Send("a", 0, 5), Withdraw("a"), Recv("r", 0, 5)],
         [("withdraw", "a", True)], posted=("r",)),
    Case("withdraw after it matched", [Send("a", 0, 5), Recv("r", 0, 5), Withdraw("a")],
         [("match", "r", "a"), ("withdraw", "a", False)]),
    Case("withdraw a message that matched on arrival",
         [Recv("r", 0, 5), Send("a", 0, 5), Withdraw("a")],
         [("match", "r", "a"), ("withdraw", "a", False)]),
    Case("withdraw twice", [Send("a", 0, 5), Withdraw("a"), Withdraw("a")],
         [("withdraw", "a", True), ("withdraw", "a", False)]),
    Case("withdraw after the wildcard index was built",
         [Send("a", 0, 5), Send("b", 1, 6), Peek(ANY, ANY), Withdraw("a"),
          Recv("r1", ANY, ANY), Recv("r2", ANY, 5)],
         [("peek", "a"), ("withdraw", "a", True), ("match", "r1", "b")], posted=("r2",)),
    # -- probes ------------------------------------------------------------------------------
    Case("peek finds the earliest fitting message and removes nothing",
         [Send("a", 1, 6), Send("b", 0, 5), Peek(ANY, ANY), Peek(0, 5), Peek(ANY, 5),
          Peek(1, ANY), Peek(0, 6), Peek(2, ANY)],
         [("peek", "a"), ("peek", "b"), ("peek", "b"), ("peek", "a"), ("peek", None),
          ("peek", None)], unexpected=("a", "b")),
    Case("peek on an empty matcher", [Peek(0, 5), Peek(ANY, ANY)],
         [("peek", None), ("peek", None)]),
    Case("post_probe finds a message at once and leaves it for the recv",
         [Send("a", 0, 5), Probe("p", ANY, 5), Recv("r", 0, 5)],
         [("probe", "p", "a"), ("match", "r", "a")]),
    Case("post_probe waits for a fitting arrival",
         [Probe("p", ANY, 5), Send("a", 0, 6), Send("b", 1, 5), Send("c", 2, 5)],
         [("probe", "p", "b")], unexpected=("a", "b", "c")),
    Case("a message that matches a posted recv does not fire a probe",
         [Probe("p", 0, 5), Recv("r", 0, 5), Send("a", 0, 5), Send("b", 0, 5)],
         [("match", "r", "a"), ("probe", "p", "b")], unexpected=("b",)),
    Case("a message that matches a wildcard recv does not fire a probe",
         [Probe("p", ANY, 5), Recv("r", 0, ANY), Send("a", 0, 5)],
         [("match", "r", "a")], probes=("p",)),
    Case("a message that matches after a rejection does not fire a probe",
         [Probe("p", 0, 5), Recv("r1", 0, 5, dtype=I4), Recv("r2", 0, 5), Send("a", 0, 5)],
         [("reject", "r1", "a", "dtype"), ("match", "r2", "a")], probes=("p",)),
    Case("one arrival fires every fitting probe, in posting order",
         [Probe("p1", ANY, ANY), Probe("p2", 0, 6), Probe("p3", 0, 5), Send("a", 0, 5)],
         [("probe", "p1", "a"), ("probe", "p3", "a")], unexpected=("a",), probes=("p2",)),
    Case("a probe fires after a rejection queues the message",
         [Probe("p", 0, 5), Recv("r", 0, 5, dtype=I4), Send("a", 0, 5)],
         [("reject", "r", "a", "dtype"), ("probe", "p", "a")], unexpected=("a",)),
    Case("cancel a waiting probe", [Probe("p", 0, 5), Cancel("p"), Send("a", 0, 5)],
         [("cancel", "p", True)], unexpected=("a",)),
    Case("cancel a probe that fired",
         [Probe("p", 0, 5), Send("a", 0, 5), Cancel("p")],
         [("probe", "p", "a"), ("cancel", "p", False)], unexpected=("a",)),
    Case("cancel a probe that found a message at once",
         [Send("a", 0, 5), Probe("p", 0, 5), Cancel("p")],
         [("probe", "p", "a"), ("cancel", "p", False)], unexpected=("a",)),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in MATCH_CASES])
def test_match_case(case: Case) -> None:
    out = play(case.ops)
    assert out.log == case.log
    assert out.posted == list(case.posted)
    assert out.unexpected == list(case.unexpected)
    assert out.probes == list(case.probes)
    assert out.matcher.next_event() is None


ANY_ORDER_CASES = [pytest.param(c, id=c.name) for c in MATCH_CASES if c.any_order]


@pytest.mark.parametrize("case", ANY_ORDER_CASES)
def test_match_case_in_every_order(case: Case) -> None:
    expected = {(e[1], e[2]) for e in case.log if e[0] == "match"}
    orders = 0
    for ops in feed_all_orders(case.ops):
        out = play(ops)
        assert out.pairs == expected, [type(op).__name__ for op in ops]
        assert sorted(out.posted) == sorted(case.posted)
        assert sorted(out.unexpected) == sorted(case.unexpected)
        orders += 1
    assert orders >= 2


def test_feed_all_orders_keeps_sender_order_and_targets() -> None:
    ops: list[Op] = [Send("a1", 0, 5), Send("a2", 0, 5), Send("b", 1, 5), Recv("r", 0, 5),
                     Cancel("r")]
    orders = list(feed_all_orders(ops))
    # 5! orders, halved by a1 < a2 and halved again by r < cancel.
    assert len(orders) == 30
    for order in orders:
        assert order.index(ops[0]) < order.index(ops[1])
        assert order.index(ops[3]) < order.index(ops[4])


def test_non_overtaking_in_every_order() -> None:
    """Whatever the interleaving, two messages of one (source, tag) go in send order."""
    ops: list[Op] = [Send("a1", 0, 5), Send("a2", 0, 5), Send("b", 1, 5),
                     Recv("r", 0, 5), Recv("w", ANY, 5)]
    seen: set[frozenset[tuple[object, object]]] = set()
    for order in feed_all_orders(ops):
        out = play(order)
        matched = [e[2] for e in out.log if e[0] == "match"]
        if "a1" in matched or "a2" in matched:
            assert "a1" in matched
        if "a1" in matched and "a2" in matched:
            assert matched.index("a1") < matched.index("a2")
        seen.add(frozenset(out.pairs))
    # The interleaving really changes the outcome (so the loop above tests something).
    assert len(seen) > 2


# -- events, descriptors, statistics ----------------------------------------------------------


def test_events_carry_the_descriptors() -> None:
    m = Matcher()
    recv = RecvDescriptor(0, 5, 4, F4, "r")
    probe = ProbeDescriptor(0, 5, "p")
    assert m.post_recv(recv) is None
    assert m.post_probe(probe) is None
    env = Envelope(0, 5, 8, 2, F4, "a")
    assert m.deliver(env) is None
    assert m.next_event() == RecvRejected(recv, env, "truncated")
    event = m.next_event()
    assert isinstance(event, ProbeMatched)
    assert event.probe is probe and event.envelope is env
    assert m.next_event() is None
    assert drain(m) == []


def test_matched_descriptors_are_returned_as_posted() -> None:
    m = Matcher()
    env = Envelope(2, 9, 12, 3, F4, handle=object())
    assert m.deliver(env) is None
    recv = RecvDescriptor(ANY, 9, 64, F4, handle=object())
    assert m.post_recv(recv) is env
    recv2 = RecvDescriptor(2, ANY, 64, F4)
    assert m.post_recv(recv2) is None
    env2 = Envelope(2, 1, 0, 0, F4)
    assert m.deliver(env2) is recv2


def test_sequence_numbers_follow_posting_order() -> None:
    m = Matcher()
    descs: list[Any] = [Envelope(0, 1, 8, 2, F4), RecvDescriptor(0, 2, 8, F4),
                        Envelope(1, 1, 8, 2, F4), RecvDescriptor(ANY, 3, 8, F4),
                        ProbeDescriptor(4, 4)]
    m.deliver(descs[0])
    m.post_recv(descs[1])
    m.deliver(descs[2])
    m.post_recv(descs[3])
    m.post_probe(descs[4])
    seqs = [d.seq for d in descs]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_statistics() -> None:
    m = Matcher()
    assert m.statistics() == MatcherStatistics(0, 0, 0, 0, 0)
    a = Envelope(0, 5, 10, 10, F4)
    b = Envelope(1, 5, 20, 20, F4)
    c = Envelope(1, 6, 300, 300, F4)
    for env in (a, b, c):
        assert m.deliver(env) is None
    assert m.post_recv(RecvDescriptor(2, 5, 64, F4)) is None
    assert m.post_recv(RecvDescriptor(ANY, 7, 64, F4)) is None
    assert m.post_probe(ProbeDescriptor(3, 3)) is None
    assert m.post_recv(RecvDescriptor(0, 5, 64, F4)) is a
    assert m.post_recv(RecvDescriptor(1, 5, 4, F4)) is None  # rejected: not a match
    assert drain(m) != []
    assert m.withdraw(c)
    assert m.statistics() == MatcherStatistics(
        posted_recvs=2, unexpected_messages=1, unexpected_bytes=20, probes=1, matched=1)
    m.deliver(Envelope(2, 5, 1, 1, F4))  # matches the posted (2, 5) on arrival
    assert m.statistics() == MatcherStatistics(
        posted_recvs=1, unexpected_messages=1, unexpected_bytes=20, probes=1, matched=2)


def test_statistics_is_a_frozen_snapshot() -> None:
    m = Matcher()
    stats = m.statistics()
    m.deliver(Envelope(0, 5, 8, 2, F4))
    assert stats.unexpected_messages == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.matched = 3  # type: ignore[misc]


def test_posted_recvs_and_unexpected_are_in_posting_order_across_buckets() -> None:
    m = Matcher()
    recvs = [RecvDescriptor(s, t, 8, F4, i) for i, (s, t) in
             enumerate([(0, 5), (ANY, 5), (1, 6), (0, 5), (ANY, ANY), (1, ANY), (1, 6)])]
    for r in recvs:
        assert m.post_recv(r) is None
    assert m.posted_recvs() == recvs
    m2 = Matcher()
    envs = [Envelope(s, t, 8, 2, F4, i) for i, (s, t) in
            enumerate([(0, 5), (1, 5), (0, 6), (0, 5), (2, 5), (1, 5)])]
    for e in envs:
        assert m2.deliver(e) is None
    assert m2.unexpected() == envs
    m2.post_recv(RecvDescriptor(1, 5, 8, F4))
    assert m2.unexpected() == [envs[i] for i in (0, 2, 3, 4, 5)]
    probes = [ProbeDescriptor(9, t) for t in (3, 1, 2)]
    for p in probes:
        assert m2.post_probe(p) is None
    assert m2.probes() == probes


# -- cost: exact matching is O(1) ---------------------------------------------------------------


class CountingDict(dict[Any, Any]):
    """A dict that counts lookups and writes, and counts a scan as one touch per item."""

    touches = 0

    def get(self, key: Any, default: Any = None) -> Any:
        self.touches += 1
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.touches += 1
        return super().__getitem__(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.touches += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        self.touches += 1
        super().__delitem__(key)

    def __contains__(self, key: object) -> bool:
        self.touches += 1
        return super().__contains__(key)

    def __iter__(self) -> Iterator[Any]:
        self.touches += len(self)
        return super().__iter__()

    def values(self) -> Any:
        self.touches += len(self)
        return super().values()

    def items(self) -> Any:
        self.touches += len(self)
        return super().items()


N_OTHER = 10_000


def _crowded_matcher() -> Matcher:
    """A matcher holding N_OTHER unexpected messages and N_OTHER posted recvs, none of
    which fits (0, 5); its queue dicts are swapped for counting ones."""
    m = Matcher()
    for i in range(N_OTHER):
        assert m.deliver(Envelope(1 + i % 100, i // 100, 8, 2, F4)) is None
        assert m.post_recv(RecvDescriptor(101 + i % 100, i // 100, 8, F4)) is None
    assert m.statistics().unexpected_messages == N_OTHER
    assert m.statistics().posted_recvs == N_OTHER
    m._unexp = CountingDict(m._unexp)
    m._posted = CountingDict(m._posted)
    return m


def _touches(m: Matcher) -> int:
    assert isinstance(m._unexp, CountingDict) and isinstance(m._posted, CountingDict)
    return m._unexp.touches + m._posted.touches


def test_exact_recv_post_is_constant_cost() -> None:
    m = _crowded_matcher()
    recv = RecvDescriptor(0, 5, 8, F4)
    assert m.post_recv(recv) is None
    assert _touches(m) <= 4
    before = _touches(m)
    env = Envelope(0, 5, 8, 2, F4)
    assert m.deliver(env) is recv
    assert _touches(m) - before <= 4
    # No wildcard was ever posted, so the wildcard indexes were never built.
    assert m._by_source is None
    assert m._by_tag == {} and len(m._all) == 0


def test_exact_send_first_is_constant_cost() -> None:
    m = _crowded_matcher()
    env = Envelope(0, 5, 8, 2, F4)
    assert m.deliver(env) is None
    assert _touches(m) <= 4
    before = _touches(m)
    assert m.post_recv(RecvDescriptor(0, 5, 8, F4)) is env
    assert m.withdraw(env) is False
    assert _touches(m) - before <= 6
    assert m._by_source is None


def test_exact_cancel_and_withdraw_are_constant_cost() -> None:
    m = _crowded_matcher()
    recv = RecvDescriptor(0, 5, 8, F4)
    m.post_recv(recv)
    env = Envelope(0, 6, 8, 2, F4)
    m.deliver(env)
    before = _touches(m)
    assert m.cancel(recv) is True
    assert m.withdraw(env) is True
    assert _touches(m) - before <= 8


def test_wildcard_recv_with_wildcards_posted_is_constant_cost() -> None:
    """Once the index exists, a wildcard recv or an arrival looks at a few heads only."""
    m = _crowded_matcher()
    assert m.probe(ANY, ANY) is not None  # builds the index (one scan, once)
    w = RecvDescriptor(ANY, 10_000, 8, F4)
    m.post_recv(w)
    before = _touches(m)
    env = Envelope(7, 10_000, 8, 2, F4)
    assert m.deliver(env) is w
    assert m.post_recv(RecvDescriptor(ANY, 10_001, 8, F4)) is None
    assert _touches(m) - before <= 12


def test_on_wait_hears_each_source_the_first_time_a_recv_or_probe_waits_for_it() -> None:
    heard: list[int] = []
    m = Matcher(on_wait=heard.append)
    assert m.deliver(Envelope(1, 5, 4, 1, F4)) is None
    assert m.post_recv(RecvDescriptor(1, 5, 4, F4)) is not None  # matched: never waited
    assert heard == []
    assert m.post_recv(RecvDescriptor(1, 6, 4, F4)) is None
    assert m.post_recv(RecvDescriptor(1, 7, 4, F4)) is None  # the same source again
    assert m.post_recv(RecvDescriptor(ANY, 5, 4, F4)) is None
    assert m.post_probe(ProbeDescriptor(3, ANY_TAG)) is None
    assert m.post_probe(ProbeDescriptor(ANY, 9)) is None  # ANY_SOURCE heard already
    assert heard == [1, ANY, 3]
