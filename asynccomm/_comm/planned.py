"""A fault plan applied to an in-process world on the cluster model (``sim/faults.py``).

The model delays, degrades and holds messages (``ClusterModel.faults``); this module does
what the model cannot: it counts each rank's engine events (a send posted, a recv matched
at its sender, a payload copied), on every communicator of the world, and crashes a rank
when its plan says (at a model time, after its k-th event, or when the modelled detector
declares it failed).  A crash is what a rank that raised does: its communicators close as
failed (``PlannedCrash``), so its peers get ``CommBrokenError`` naming it once what it sent
them has arrived; a rank declared failed first loses what it sent that is still in flight
(it was held: the rank is fenced off), so its peers hear of it at once.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Any

from .._exceptions import CommClosedError
from ..sim.cluster import to_ns
from ..sim.faults import PlannedCrash, PlannedFaults
from ..transports.local import LocalLink

if TYPE_CHECKING:
    from .._core.descriptors import Message
    from ..sim.clock import ModelClock
    from ..sim.timing import ModelledTiming

__all__ = ["FaultRuntime", "PlannedLink"]


class PlannedLink(LocalLink):
    """The in-process link of a world with a fault plan: it reports every engine event."""

    def __init__(self, timing: ModelledTiming | None, runtime: FaultRuntime) -> None:
        super().__init__(timing)
        self.runtime = runtime
        self._dropped: set[int] = set()  # ids of eager messages dropped in flight

    def _world(self, rank: int) -> int:
        return self.endpoints[rank].world_rank  # type: ignore[attr-defined, no-any-return]

    def send(self, msg: Message, dest: int) -> None:
        world = self._world(msg.source)
        if world in self.runtime.crashed:  # a crashed rank is silent: nothing leaves
            self.endpoints[msg.source].failed(msg, self._crashed(msg.source))
            return
        super().send(msg, dest)
        self.runtime.event(world)

    def _eager_sent(self, msg: Message, dest: int, plan: Any) -> None:
        if id(msg) in self._dropped:  # (dropped: its sender's send failed then)
            self._dropped.discard(id(msg))
        else:
            super()._eager_sent(msg, dest, plan)

    @staticmethod
    def _crashed(rank: int) -> CommClosedError:
        return CommClosedError(f"rank {rank} crashed (its fault plan says so): its "
                               "messages are not sent", rank=rank)

    def fetch(self, msg: Message, rank: int, into: memoryview, ready: Any) -> None:
        super().fetch(msg, rank, into, ready)
        self.runtime.event(self._world(rank))

    def received(self, msg: Message, rank: int) -> object:
        record = super().received(msg, rank)
        self.runtime.event(self._world(rank))
        return record

    def drop_in_flight(self, world_rank: int) -> None:
        """Forget every message ``world_rank`` sent on this link that has not arrived; its
        sends not complete yet fail (they never will)."""
        for rank, endpoint in enumerate(self.endpoints):
            if getattr(endpoint, "world_rank", None) != world_rank:
                continue
            for channel in self._channels.get(rank, {}).values():
                for _, msg in channel:
                    self._announced.discard(msg)
                    eager = self._plans.pop(msg, None) is not None
                    if not msg.done():  # type: ignore[attr-defined]
                        if eager:  # its ``_eager_sent`` timer is still to come
                            self._dropped.add(id(msg))
                        endpoint.failed(msg, self._crashed(rank))
                channel.clear()


class FaultRuntime:
    """One world's plan as it runs: event counts, crashes, the links it made."""

    def __init__(self, faults: PlannedFaults, clock: ModelClock) -> None:
        self.faults = faults
        self.clock = clock
        self.counts = [0] * faults.size  # engine events, by world rank
        self.crashed: set[int] = set()
        self.comms: list[Any] = []  # the world's communicators, by rank
        self._links: weakref.WeakSet[PlannedLink] = weakref.WeakSet()
        self._closing: set[asyncio.Future[None]] = set()

    def link(self, timing: ModelledTiming | None) -> PlannedLink:
        """A new link of the world (its own, a private context's, a sub-communicator's)."""
        link = PlannedLink(timing, self)
        self._links.add(link)
        return link

    def start(self, comms: list[Any]) -> None:
        """Arm the timed faults of the world whose communicators are ``comms``."""
        self.comms = comms
        faults = self.faults
        for rank in range(faults.size):
            fault = faults.by_rank.get(rank)
            if fault is not None and fault.hang_at is not None:
                hang = to_ns(fault.hang_at)
                self.clock.call_at(hang, faults.note, hang, rank, "hang")
            if fault is not None and fault.slowdown != 1:
                comms[rank].device.slowdown = fault.slowdown
                faults.note(0, rank, "slow", detail=f"x{fault.slowdown:g}")
            when = faults.crash_time(rank)
            if when is not None:
                declared = faults.declared.get(rank) == when
                self.clock.call_at(when, self.crash, rank,
                                   "declared failed" if declared else "crash")

    def event(self, rank: int) -> None:
        """Rank ``rank`` had an engine event: crash it after its planned one."""
        self.counts[rank] += 1
        if self.counts[rank] == self.faults.crash_event(rank):
            # Not inside the engine's step: the rank dies at its next await.
            self.clock.loop.call_soon(self.crash, rank, "crash",
                                      f"after engine event {self.counts[rank]}")

    def crash(self, rank: int, what: str, detail: str = "") -> None:
        """Rank ``rank`` fails now (module docs)."""
        if rank in self.crashed or not self.comms:
            return
        self.crashed.add(rank)
        now = self.clock.now_ns()
        self.faults.note(now, rank, what, detail=detail)
        if what == "declared failed":
            for link in list(self._links):
                link.drop_in_flight(rank)
        comm = self.comms[rank]
        if comm.closed:
            return
        comm._mark_failed(PlannedCrash(f"rank {rank} crashed as its fault plan says "
                                       f"({what}{', ' + detail if detail else ''}, at "
                                       f"{now * 1e-9:.9g} s model time)"))
        closing = asyncio.ensure_future(comm.aclose())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
