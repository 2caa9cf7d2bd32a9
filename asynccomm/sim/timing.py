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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .clock import ModelClock
from .model import ChunkPlan, ClusterModel, TransferPlan
from .records import OpRecord

__all__ = ["ModelledTiming"]


class ModelledTiming:
    """Times every step of in-process messages with a ``ClusterModel`` (see module docs)."""

    def __init__(self, model: ClusterModel, clock: ModelClock,
                 ranks: list[int] | None = None) -> None:
        self.model = model
        self.clock = clock
        #: The world rank of each rank of the link this times (a sub-communicator's), or
        #: None for the world's own link.
        self.ranks = ranks

    def for_ranks(self, ranks: list[int]) -> ModelledTiming:
        """The same model and clock for a link whose rank ``i`` is ``ranks[i]`` here: a
        sub-communicator's messages cost the links of its ranks' devices."""
        mine = self.ranks
        return ModelledTiming(self.model, self.clock,
                              ranks if mine is None else [mine[r] for r in ranks])

    def now(self) -> int:
        """Model time now, ns."""
        return self.clock.now_ns()

    def call_at(self, t_ns: int, callback: Callable[..., Any], *args: Any) -> None:
        """Call ``callback(*args)`` at model time ``t_ns``."""
        self.clock.call_at(t_ns, callback, *args)

    def eager(self, src: int, dst: int, nbytes: int, now: int) -> TransferPlan:
        """An eager message staged at ``now``: store-and-forward whose sender is free once
        its data is staged, whatever the strategy picks for this size (the world's eager
        limit may differ from the strategy's)."""
        if (ranks := self.ranks) is not None:
            src, dst = ranks[src], ranks[dst]
        return self.model.transfer(src, dst, nbytes, now=now,
                                   plan=ChunkPlan("async", max(nbytes, 1)))

    def control(self, src: int, dst: int, now: int) -> int:
        """When a control message (request- or clear-to-send) sent at ``now`` arrives."""
        if (ranks := self.ranks) is not None:
            src, dst = ranks[src], ranks[dst]
        return self.model.control(src, dst, now=now)

    def transfer(self, src: int, dst: int, nbytes: int, now: int) -> TransferPlan:
        """A rendezvous payload cleared to move at ``now``."""
        if (ranks := self.ranks) is not None:
            src, dst = ranks[src], ranks[dst]
        return self.model.transfer(src, dst, nbytes, now=now)

    @staticmethod
    def record(rank: int, kind: str, peer: int, tag: int, plan: TransferPlan,
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
