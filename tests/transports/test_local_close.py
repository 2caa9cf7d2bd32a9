"""Who the in-process link tells of a close, with endpoints that only record what they
hear: the ranks that waited for the closed one, not every rank (size² over a world)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from asynccomm._core.descriptors import AT_SENDER, STAGED, Message
from asynccomm._types import ANY_SOURCE
from asynccomm.transports.local import LocalLink


class Ear:
    """An endpoint that records the closes it hears of and stages every message."""

    def __init__(self, rank: int, told: list[tuple[int, int]]) -> None:
        self.rank = rank
        self.closed = False
        self.gone: set[int] = set()
        self.unheard: set[int] = set()
        self.told = told
        self.arrivals: list[Message] = []

    def peer_closed(self, rank: int, exc: BaseException | None) -> None:
        self.told.append((self.rank, rank))

    def stage(self, msg: Message) -> bool:
        msg.where = STAGED
        return True

    def arrived(self, msg: Message) -> None:
        self.arrivals.append(msg)

    def sent(self, msg: Message, record: object = None) -> None:
        pass


class Clock:
    """Just enough of ``ModelledTiming``: an eager message lands 10 ns after it is posted,
    its sender is done after 1 ns; timers run when ``run`` is called."""

    def __init__(self) -> None:
        self.t = 0
        self.timers: list[tuple[int, int, Callable[..., Any], tuple[Any, ...]]] = []
        self.order = itertools.count()

    def now(self) -> int:
        return self.t

    def call_at(self, t: int, callback: Callable[..., Any], *args: Any) -> None:
        heapq.heappush(self.timers, (t, next(self.order), callback, args))

    def eager(self, src: int, dst: int, nbytes: int, now: int) -> SimpleNamespace:
        return SimpleNamespace(sender_done=now + 1, end=now + 10)

    def record(self, *args: Any) -> None:
        return None

    def run(self, until: int) -> None:
        while self.timers and self.timers[0][0] <= until:
            t, _, callback, args = heapq.heappop(self.timers)
            self.t = t
            callback(*args)
        self.t = until


def world(size: int, timing: Clock | None = None) -> tuple[LocalLink, list[Ear],
                                                             list[tuple[int, int]]]:
    told: list[tuple[int, int]] = []
    link = LocalLink(timing)  # type: ignore[arg-type]
    ears = [Ear(rank, told) for rank in range(size)]
    for ear in ears:
        link.attach(ear)  # type: ignore[arg-type]
    return link, ears, told


def close(link: LocalLink, ear: Ear) -> None:
    ear.closed = True
    link.close(ear.rank, "has closed its communicator")


def test_every_rank_closing_tells_only_those_that_waited_for_it() -> None:
    size = 64
    link, ears, told = world(size)
    for rank in range(size):  # a ring: each rank waited for its left neighbour
        link.waiting(rank, (rank - 1) % size)
    for ear in ears:
        close(link, ear)
    # Rank r hears of r - 1 only, and only while it is open: rank 0 closed before 63 did.
    assert told == [(r + 1, r) for r in range(size - 1)]
    assert ears[5].gone is link.gone and link.gone == set(range(size))


def test_the_ranks_told_are_told_in_rank_order() -> None:
    link, ears, told = world(6)
    for rank in (4, 1, 5, 2):
        link.waiting(rank, 0)
    close(link, ears[0])
    assert told == [(1, 0), (2, 0), (4, 0), (5, 0)]


def test_wildcard_waiters_are_told_once_at_most_one_rank_is_left() -> None:
    link, ears, told = world(4)
    link.waiting(3, ANY_SOURCE)
    close(link, ears[0])
    close(link, ears[1])
    assert told == []  # ranks 2 and 3 are still open: rank 3's wildcard may match rank 2
    close(link, ears[2])
    assert told == [(3, 2)]  # rank 3 decides whether it waits for nobody now


def test_timed_a_rank_hears_of_a_close_after_what_was_sent_to_it_has_landed() -> None:
    clock = Clock()
    link, ears, told = world(3, clock)
    link.waiting(1, 0)
    link.waiting(2, 0)
    msg = Message(0, 5, 8, 1, "<f8", AT_SENDER, memoryview(bytearray(8)))
    link.send(msg, 2)  # lands at 10
    clock.run(until=2)
    close(link, ears[0])
    assert told == [(1, 0)]  # nothing on its way to rank 1: at once
    assert ears[2].unheard == {0} and ears[1].unheard == set()
    clock.run(until=10)
    assert ears[2].arrivals == [msg] and told == [(1, 0)]
    clock.run(until=11)  # one nanosecond after the message landed
    assert told == [(1, 0), (2, 0)] and ears[2].unheard == set()
