"""The cluster model's timing for in-process worlds: when each step of a message happens.

The in-process link (``transports/local.py``) asks this object, and schedules each step on
the model clock, instead of doing it at once.  Its rules:

Rule 1: an eager message is staged at the destination when it is posted (the sender may
reuse its buffer), its sender completes at the plan's ``sender_done``, and its envelope
reaches the destination's matcher at the plan's ``end``.
Rule 2: a rendezvous message sends a request-to-send, which arrives one link latency
later; when a recv matches it, a clear-to-send travels back, then the payload crosses the
three stages of the plan, and both sides complete at its ``end``, when the bytes are
copied.  A receiver never sees data before its modelled arrival.
Rule 3: envelopes from one rank to another are delivered in posting order (each arrives no
earlier than the one before it), so MPI's non-overtaking order holds under the model.
Rule 4: a request-to-send still in flight can be withdrawn; an eager message in flight
cannot (its send is as good as complete).
Rule 5: when a rank closes, its peers learn of it only after everything it sent them has
arrived.
Rule 6: a transfer that shares a fair link (``sim/model.py`` Rule 1b) ends when its flow
does, which later transfers may delay or earlier ones' ends advance: one timer, at the next
event of the model's flows, moves them on, and what waits for a transfer (``when_done``)
is called at its end once that is known.
Rule 7: a collective call spends its CPU work (``sim/host.py``: the call, the steps,
copies, reductions and fresh scratch of the algorithm it runs, at the rates of
``Cluster.host``) on the rank's core, in model time, within its timeout
(``_collectives.functions`` Rule 5b): a step's after each of its waits, the rest once its
arguments are checked and before its first message (``sim/host.py`` Rule 2d); a
``HostSpec()`` that costs nothing leaves it at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .clock import ModelClock
from .cluster import to_ns
from .host import call_work
from .model import ChunkPlan, ClusterModel, Resource, Transfer
from .records import OpRecord

__all__ = ["ModelledTiming"]


class ModelledTiming:
    """Times every step of in-process messages with a ``ClusterModel`` (see module docs)."""

    def __init__(self, model: ClusterModel, clock: ModelClock,
                 ranks: list[int] | None = None, flows: _Flows | None = None) -> None:
        self.model = model
        self.clock = clock
        #: The world rank of each rank of the link this times (a sub-communicator's), or
        #: None for the world's own link.
        self.ranks = ranks
        self._flows = flows if flows is not None else _Flows(model, clock)

    def for_ranks(self, ranks: list[int]) -> ModelledTiming:
        """The same model and clock for a link whose rank ``i`` is ``ranks[i]`` here: a
        sub-communicator's messages cost the links of its ranks' devices."""
        mine = self.ranks
        return ModelledTiming(self.model, self.clock,
                              ranks if mine is None else [mine[r] for r in ranks], self._flows)

    def now(self) -> int:
        """Model time now, ns."""
        return self.clock.now_ns()

    def call_at(self, t_ns: int, callback: Callable[..., Any], *args: Any) -> None:
        """Call ``callback(*args)`` at model time ``t_ns``."""
        self.clock.call_at(t_ns, callback, *args)

    def eager(self, src: int, dst: int, nbytes: int, now: int) -> Transfer:
        """An eager message staged at ``now``: store-and-forward whose sender is free once
        its data is staged, whatever the strategy picks for this size (the world's eager
        limit may differ from the strategy's)."""
        if (ranks := self.ranks) is not None:
            src, dst = ranks[src], ranks[dst]
        return self._flows.started(self.model.start(src, dst, nbytes, now=now,
                                                    plan=ChunkPlan("async", max(nbytes, 1))))

    def control(self, src: int, dst: int, now: int) -> int:
        """When a control message (request- or clear-to-send) sent at ``now`` arrives."""
        if (ranks := self.ranks) is not None:
            src, dst = ranks[src], ranks[dst]
        return self.model.control(src, dst, now=now)

    def transfer(self, src: int, dst: int, nbytes: int, now: int) -> Transfer:
        """A rendezvous payload cleared to move at ``now``."""
        if (ranks := self.ranks) is not None:
            src, dst = ranks[src], ranks[dst]
        return self._flows.started(self.model.start(src, dst, nbytes, now=now))

    def when_done(self, moving: Transfer, callback: Callable[..., Any], *args: Any) -> None:
        """Call ``callback(*args)`` at the end of ``moving`` (Rule 6)."""
        if moving.end is not None:
            self.clock.call_at(moving.end, callback, *args)
        else:
            moving.when_done.append((callback, args))

    def cpu(self, rank: int, seconds: float) -> int:
        """Reserve ``seconds`` of ``rank``'s core from now (after the work queued on it);
        return when that work ends, model ns."""
        return self._core(rank).reserve(self.now(), to_ns(seconds))[1]

    def _core(self, rank: int) -> Resource:
        if (ranks := self.ranks) is not None:
            rank = ranks[rank]
        return self.model.core(rank)

    async def collective_work(self, rank: int, name: str, nbytes: int, size: int
                              ) -> _Steps | None:
        """Spend the CPU work of a call of ``name`` (``"allreduce.ring"``, Rule 7) that
        comes before its first message; return what spends its steps' (``_Steps``), or None
        where it has none.  A call cancelled (or timed out) meanwhile gives its core back
        from then on."""
        host = self.model.cluster.host
        if host.free:
            return None
        work = call_work(host, name, nbytes, size)
        await self._spend(rank, work.first)
        return (_Steps(self, rank, work.step, work.steps, work.handoff) if work.steps
                else None)

    async def _spend(self, rank: int, seconds: float) -> None:
        """Reserve ``seconds`` of ``rank``'s core from now (after the work queued on it)
        and wait for their end; cancelled meanwhile, give the core back from then on."""
        core = self._core(rank)
        start, end = core.reserve(self.now(), to_ns(seconds))
        if end > self.now():
            woken = asyncio.get_running_loop().create_future()
            self.clock.call_at(end, _wake, woken)
            try:
                await woken
            except asyncio.CancelledError:
                core.release(start, end, self.now())
                raise

    @staticmethod
    def record(rank: int, kind: str, peer: int, tag: int, plan: Transfer,
               end: int) -> OpRecord:
        """The record of one side of a planned transfer, ending at ``end`` (ns)."""
        return OpRecord(rank=rank, kind=kind, peer=peer, tag=tag, nbytes=plan.nbytes,
                        chunks=plan.chunks, start=plan.start * 1e-9, end=end * 1e-9,
                        mode=plan.mode)

    def busy(self, rank: int) -> float:
        """Seconds of link time held by ``rank``'s sends."""
        if (ranks := self.ranks) is not None:
            rank = ranks[rank]
        return self.model.link_busy(rank) * 1e-9


class _Steps:
    """The steps' CPU work of one call (Rule 7): ``seconds`` after each of its first
    ``count`` waits, and ``handoff`` more after a wait for a rank on its own core
    (``sim/host.py`` Rule 2e)."""

    __slots__ = ("handoff", "left", "rank", "seconds", "timing")

    def __init__(self, timing: ModelledTiming, rank: int, seconds: float, count: int,
                 handoff: float = 0.0) -> None:
        self.timing = timing
        self.rank = rank
        self.seconds = seconds
        self.left = count
        self.handoff = handoff

    async def step(self, peers: tuple[int, ...] = ()) -> None:
        if self.left > 0:
            self.left -= 1
            seconds = self.seconds
            if self.handoff:
                core = self.timing._core(self.rank)
                if any(q >= 0 and self.timing._core(q) is core for q in peers):
                    seconds += self.handoff
            await self.timing._spend(self.rank, seconds)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Flows:
    """The one timer that moves a world's fair-link flows on (Rule 6), shared by the
    timings of the world and its sub-communicators."""

    def __init__(self, model: ClusterModel, clock: ModelClock) -> None:
        self.model = model
        self.clock = clock
        self._armed: int | None = None  # when the timer is set for
        self._timer: asyncio.TimerHandle | None = None

    def started(self, moving: Transfer) -> Transfer:
        if moving.end is None:
            self._arm()
        return moving

    def _arm(self) -> None:
        due = self.model.next_event()
        if due is None or (self._armed is not None and self._armed <= due):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._armed = due
        self._timer = self.clock.call_at(due, self._tick, due)

    def _tick(self, due: int) -> None:
        # A real loop may fire a timer up to its resolution early: trust its time.
        self._armed = self._timer = None
        for moving in self.model.advance(max(self.clock.now_ns(), due)):
            assert moving.end is not None
            for callback, args in moving.when_done:
                self.clock.call_at(moving.end, callback, *args)
            moving.when_done.clear()
        self._arm()
