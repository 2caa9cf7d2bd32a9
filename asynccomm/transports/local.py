"""The in-process link: every rank's engine lives on one event loop.

Instant (no timing): a send is a direct call into the destination engine
(``Endpoint.arrived``), with its payload still in the sender's buffer (``AT_SENDER``).  The
destination matches it at once; if no recv waits, it stages an eager payload in its pool
(the sender completes) or keeps the message waiting for its recv, whose copy then comes
straight from the send buffer (rendezvous: no intermediate copy).  When the pool is full,
eager messages wait the same way: the back-pressure that keeps staging memory bounded.

Timed (``timing``, a ``sim.timing.ModelledTiming``): the same messages, each step at the
time the cluster model gives (see ``sim/timing.py`` for its rules): eager payloads are
staged when posted and arrive at their modelled end, rendezvous ones are announced after
one latency and move when matched.  On a fair link an end is known only once the transfer
has ended (other transfers may still slow it): messages from one rank to another wait in
posting order behind any before them whose end is not known yet.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from .._core.descriptors import AT_SENDER, STAGED
from .._exceptions import CommBrokenError
from .._types import ANY_SOURCE
from .base import CLOSED, TOO_LATE, WITHDRAWN, Endpoint, Link, Ready, gone_error

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._core.descriptors import Message
    from ..sim.model import Transfer
    from ..sim.timing import ModelledTiming

__all__ = ["LocalLink"]


class LocalLink(Link):
    """Connects the engines of one in-process world (see module docs)."""

    def __init__(self, timing: ModelledTiming | None = None) -> None:
        self.endpoints: list[Endpoint] = []
        self.timing = timing
        #: The ranks that have closed: every endpoint's ``gone`` (see ``close``).
        self.gone: set[int] = set()
        #: Why ranks that did not close normally closed, and their failures (``why_gone``).
        self._why: dict[int, tuple[str, BaseException | None]] = {}
        # The ranks with a recv or probe that waited for a source (ANY_SOURCE included),
        # by source: those a close of that source may concern.
        self._waiters: dict[int, set[int]] = {}
        # Timed only: messages on their way, per source and destination, in posting order,
        # each with its arrival time (or its transfer, while its end is not known).
        self._channels: dict[int, dict[int, deque[tuple[int | Transfer, Message]]]] = {}
        # Timed only: the peers to tell of a closed rank once its channel to them is empty,
        # by (closed rank, peer).
        self._closing: dict[tuple[int, int], Endpoint] = {}
        self._announced: set[Message] = set()  # requests-to-send in flight
        self._plans: dict[Message, tuple[int, Transfer]] = {}  # (receiver, transfer)
        #: Called with each rank that closes, after its peers were told (``_comm.faults``).
        self.watchers: list[Callable[[int], None]] = []

    def attach(self, endpoint: Endpoint) -> None:
        """Add the next rank's engine (ranks attach in order)."""
        endpoint.gone = self.gone
        self.endpoints.append(endpoint)

    def waiting(self, rank: int, source: int) -> None:
        waiters = self._waiters.get(source)
        if waiters is None:
            waiters = self._waiters[source] = set()
        waiters.add(rank)

    # -- sending --------------------------------------------------------------------------

    def send(self, msg: Message, dest: int) -> None:
        ep = self.endpoints[dest]
        if ep.closed:
            self.endpoints[msg.source].failed(msg, self._closed(msg.source, dest))
        elif self.timing is None:
            ep.arrived(msg)
        else:
            self._send_timed(msg, dest, ep)

    def _send_timed(self, msg: Message, dest: int, ep: Endpoint) -> None:
        timing = self.timing
        assert timing is not None
        src, now = msg.source, timing.now()
        if ep.stage(msg):  # eager (Rule 1)
            plan = timing.eager(src, dest, msg.nbytes, now)
            self._plans[msg] = (dest, plan)
            timing.call_at(plan.sender_done, self._eager_sent, msg, dest, plan)
            self._arrive(src, dest, plan if plan.end is None else plan.end, msg)
        else:  # rendezvous: announce it, move it when a recv matches (Rule 2)
            self._announced.add(msg)
            self._arrive(src, dest, timing.control(src, dest, now), msg)

    def _eager_sent(self, msg: Message, dest: int, plan: Transfer) -> None:
        assert self.timing is not None
        self.endpoints[msg.source].sent(msg, self.timing.record(
            msg.source, "send", dest, msg.tag, plan, plan.sender_done))

    def withdraw(self, msg: Message, dest: int, ask: bool) -> int:
        if msg in self._announced:  # Rule 4
            self._announced.discard(msg)
            return WITHDRAWN
        if msg in self._plans:  # an eager message in flight, or a matched one
            return TOO_LATE
        return WITHDRAWN if self.endpoints[dest].retract(msg) else TOO_LATE

    # -- arrival (timed) ------------------------------------------------------------------

    def _arrive(self, src: int, dst: int, when: int | Transfer, msg: Message) -> None:
        assert self.timing is not None
        channels = self._channels.get(src)
        if channels is None:
            channels = self._channels[src] = {}
        channel = channels.get(dst)
        if channel is None:
            channel = channels[dst] = deque()
        channel.append((when, msg))
        if len(channel) == 1:
            self._wait_for_head(src, dst, channel)

    def _wait_for_head(self, src: int, dst: int,
                       channel: deque[tuple[int | Transfer, Message]]) -> None:
        assert self.timing is not None
        when = channel[0][0]
        if isinstance(when, int):
            self.timing.call_at(when, self._drain, src, dst, when)
        else:  # its end is not known yet
            self.timing.when_done(when, self._drain, src, dst, 0)

    def _drain(self, src: int, dst: int, due: int) -> None:
        # Rule 3: a message arrives no earlier than the one before it.  A real loop may fire
        # a timer up to its resolution early (uvloop: 1 ms): trust the time the drain was
        # set for, or a message could be held past a later event.
        assert self.timing is not None
        channel = self._channels[src][dst]
        now = max(self.timing.now(), due)
        while channel:
            when = channel[0][0]
            end = when if isinstance(when, int) else when.end
            if end is None or end > now:
                self._wait_for_head(src, dst, channel)
                return
            self._deliver(dst, channel.popleft()[1])
        other = self._closing.pop((src, dst), None)
        if other is not None:  # Rule 5: one nanosecond after the last arrival
            self.timing.call_at(now + 1, self._tell_closed, other, src)

    def _deliver(self, dest: int, msg: Message) -> None:
        if msg.where == AT_SENDER:
            if msg not in self._announced:
                return  # withdrawn while in flight
            self._announced.discard(msg)
        ep = self.endpoints[dest]
        if not ep.closed:
            ep.arrived(msg)
        elif msg.where == AT_SENDER:
            self.endpoints[msg.source].failed(msg, self._closed(msg.source, dest))
        else:  # staged at the sender's side, in flight: dropped here, and said so
            self._plans.pop(msg, None)
            late = getattr(ep, "dropped_late", None)
            if late is not None:
                late(msg.source, msg.tag, msg.nbytes)

    # -- receiving ------------------------------------------------------------------------

    def fetch(self, msg: Message, rank: int, into: memoryview, ready: Ready) -> None:
        self.endpoints[msg.source].activate(msg)
        timing = self.timing
        if timing is None:
            ready(msg.view, None)
            return
        clear_to_send = timing.control(rank, msg.source, timing.now())
        plan = timing.transfer(msg.source, rank, msg.nbytes, clear_to_send)
        self._plans[msg] = (rank, plan)
        timing.when_done(plan, ready, msg.view, None)

    def staged(self, msg: Message) -> None:
        self.endpoints[msg.source].sent(msg)

    def received(self, msg: Message, rank: int) -> object:
        timing = self.timing
        if timing is None:
            # (Nothing for a staged message here: the C lane, ``_lane_recv.c``, takes staged
            # messages on an instant link without calling this, and completes most sends
            # waiting at their sender itself, as this does: ``_lane_steps.c`` ``sent_here``.)
            if msg.where == AT_SENDER:  # rendezvous: the sender was waiting for this
                self.endpoints[msg.source].sent(msg)
            return None
        entry = self._plans.pop(msg, None)
        if entry is None:
            return None
        plan = entry[1]
        assert plan.end is not None  # a message is received after it has arrived
        if msg.where == AT_SENDER:  # rendezvous: both sides end with the transfer
            self.endpoints[msg.source].sent(msg, timing.record(
                msg.source, "send", rank, msg.tag, plan, plan.end))
            return timing.record(rank, "recv", msg.source, msg.tag, plan, plan.end)
        return timing.record(rank, "recv", msg.source, msg.tag, plan,
                             max(plan.end, timing.now()))

    def discard(self, msg: Message, rank: int) -> None:
        self._plans.pop(msg, None)
        if msg.where == AT_SENDER:  # a rendezvous send still waiting: it never will be taken
            self.endpoints[msg.source].failed(msg, self._closed(msg.source, rank,
                                                               unreceived=True))
        elif msg.where != STAGED:
            raise AssertionError(f"an in-process message is never {msg.where}")

    # -- closing and diagnostics ----------------------------------------------------------

    def close(self, rank: int, reason: str) -> None:
        """The closed rank joins ``gone``, the set every endpoint shares, and only the ranks
        it may concern hear of it (``peer_closed``), in rank order: those with a recv or
        probe that waited for it, and when at most one rank is left, those with one that
        waited for ANY_SOURCE.  Timed, a peer hears of it only after everything this rank
        sent it has arrived (Rule 5), and until then has it in its ``unheard``: a message in
        flight is delivered, as on the wire.  O(the ranks it concerns), not O(size)."""
        self.gone.add(rank)
        if reason != CLOSED:
            self._why[rank] = (reason, getattr(self.endpoints[rank], "failed_with", None))
        timing = self.timing
        later: set[int] = set()
        if timing is not None:
            later = {dst for dst, channel in self._channels.get(rank, {}).items() if channel}
        concerned = later | self._waiters.get(rank, set())
        if len(self.gone) >= len(self.endpoints) - 1:  # ANY_SOURCE may have no rank left
            concerned |= self._waiters.get(ANY_SOURCE, set())
        for other_rank in sorted(concerned):
            other = self.endpoints[other_rank]
            if other_rank == rank or other.closed:
                continue
            if other_rank not in later:
                other.peer_closed(rank, None)
            else:  # once everything in flight to it has arrived (see ``_drain``)
                other.unheard.add(rank)
                self._closing[(rank, other_rank)] = other
        for watcher in self.watchers:
            watcher(rank)

    def _tell_closed(self, other: Endpoint, rank: int) -> None:
        other.unheard.discard(rank)
        if not other.closed:
            other.peer_closed(rank, None)

    def why_gone(self, peer: int) -> tuple[str | None, BaseException | None]:
        return self._why.get(peer, (None, None))

    def _closed(self, rank: int, peer: int, *, unreceived: bool = False) -> CommBrokenError:
        """The error of ``rank``'s send that ``peer``, closed, will never take."""
        return gone_error(rank, peer, *self.why_gone(peer), unreceived=unreceived)

    def describe(self, rank: int, peer: int) -> list[str]:
        return self.endpoints[peer].describe_pending(rank)

    def busy_time(self, rank: int) -> float:
        return self.timing.busy(rank) if self.timing is not None else 0.0
