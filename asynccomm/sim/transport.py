"""The modelled in-process transport: data moves as in-process, at modelled times.

How it works
------------
Every message still moves through the in-process path (the same matcher, staging pool and
buffer-to-buffer copies), but each step happens when the cluster model says it does:

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

from collections import deque
from typing import TYPE_CHECKING

from .._core.descriptors import Envelope
from .._engine import THREAD_COPY_MIN
from .._request import ACTIVE
from ..transports.base import WITHDRAWN
from ..transports.local import LocalTransport
from .model import ChunkPlan
from .records import OpRecord

if TYPE_CHECKING:
    from .._buffers import BufferView
    from .._engine import DeviceEngine
    from .._request import Request
    from .clock import ModelClock
    from .model import ClusterModel, TransferPlan

__all__ = ["ModelledTransport"]


class ModelledTransport(LocalTransport):
    """In-process delivery timed by a ``ClusterModel`` (see module docs)."""

    def __init__(self, model: ClusterModel, clock: ModelClock) -> None:
        super().__init__()
        self.model = model
        self.clock = clock
        self._channels: dict[tuple[int, int], deque[tuple[int, Envelope]]] = {}
        self._last_arrival: dict[tuple[int, int], int] = {}
        self._rts_in_flight: set[Envelope] = set()
        self._eager_plans: dict[Envelope, TransferPlan] = {}

    # -- sending --------------------------------------------------------------------------

    def post_send(self, engine: DeviceEngine, req: Request) -> None:
        env = self._envelope(engine, req)
        if env is None:
            return
        dst = self.engines[req.peer]
        buf: BufferView = req.buf  # type: ignore[assignment]
        now = self.clock.now_ns()
        staged = dst.pool.acquire(buf.nbytes) if buf.nbytes <= dst.eager_limit else None
        if staged is None:  # rendezvous: announce it, move it when a recv matches
            self._rts_in_flight.add(env)
            self._arrive(engine.rank, req.peer, self.model.control(engine.rank, req.peer, now=now),
                         env)
            return
        staged[: buf.nbytes] = buf.mv
        env.handle = staged
        # Eager is store-and-forward whose sender is free once its data is staged, whatever
        # the strategy picks for this size (the world's eager limit may differ from it).
        plan = self.model.transfer(engine.rank, req.peer, buf.nbytes, now=now,
                                   plan=ChunkPlan("async", max(buf.nbytes, 1)))
        self._eager_plans[env] = plan
        self.clock.call_at(plan.sender_done, self._eager_sent, engine, req, plan)
        self._arrive(engine.rank, req.peer, plan.end, env)

    def _eager_sent(self, engine: DeviceEngine, req: Request, plan: TransferPlan) -> None:
        self._record(engine, req, "send", req.peer, plan, plan.sender_done)
        engine.send_done(req)

    def unexpected(self, engine: DeviceEngine, env: Envelope) -> None:
        """Nothing to do: eager payloads were staged when posted (Rule 1)."""

    def withdraw_send(self, engine: DeviceEngine, req: Request, exc: BaseException | None,
                      ask: bool) -> int:
        env = req.desc
        if env in self._rts_in_flight:  # Rule 4
            self._rts_in_flight.discard(env)
            return WITHDRAWN
        return super().withdraw_send(engine, req, exc, ask)

    # -- arrival --------------------------------------------------------------------------

    def _arrive(self, src: int, dst: int, when: int, env: Envelope) -> None:
        key = (src, dst)
        when = max(when, self._last_arrival.get(key, 0))  # Rule 3
        self._last_arrival[key] = when
        channel = self._channels.get(key)
        if channel is None:
            channel = self._channels[key] = deque()
        channel.append((when, env))
        if len(channel) == 1:
            self.clock.call_at(when, self._drain_channel, key, when)

    def _drain_channel(self, key: tuple[int, int], due: int) -> None:
        # A real loop may fire a timer up to its resolution early (uvloop: 1 ms): trust
        # the time the drain was set for, or a message could be held past a later event.
        channel = self._channels[key]
        now = max(self.clock.now_ns(), due)
        while channel and channel[0][0] <= now:
            self._deliver(key[1], channel.popleft()[1])
        if channel:
            self.clock.call_at(channel[0][0], self._drain_channel, key, channel[0][0])

    def _deliver(self, dst_rank: int, env: Envelope) -> None:
        handle = env.handle
        if type(handle) is not memoryview:
            if env not in self._rts_in_flight:
                return  # withdrawn while in flight
            self._rts_in_flight.discard(env)
        dst = self.engines[dst_rank]
        if not dst.closed:
            dst.deliver(env)
        elif type(handle) is memoryview:
            self._eager_plans.pop(env, None)
            dst.pool.release(handle)
        else:
            sreq: Request = handle  # type: ignore[assignment]
            sreq._engine.fail(sreq, sreq._engine.broken(dst_rank))

    def engine_closed(self, engine: DeviceEngine) -> None:
        """Peers learn of the close only after what this rank sent them has arrived: a
        message in flight is delivered, as it would be on the wire."""
        now = self.clock.now_ns()
        for other in self.engines:
            if other is engine or other.closed:
                continue
            last = self._last_arrival.get((engine.rank, other.rank), 0)
            if last < now:
                other.gone.add(engine.rank)
                if other.pending_ops:
                    other.peer_gone(engine.rank)
            else:  # one nanosecond after the last arrival's delivery
                self.clock.call_at(last + 1, self._tell_gone, other, engine.rank)

    def _tell_gone(self, other: DeviceEngine, rank: int) -> None:
        channel = self._channels.get((rank, other.rank))
        if channel:  # still in flight (the timers fired in another order): after them
            self.clock.call_at(channel[-1][0] + 1, self._tell_gone, other, rank)
        else:
            super()._tell_gone(other, rank)

    # -- receiving ------------------------------------------------------------------------

    def matched(self, engine: DeviceEngine, env: Envelope, req: Request) -> None:
        plan = self._eager_plans.pop(env, None)
        if plan is not None:
            self._record(engine, req, "recv", env.source, plan,
                         max(plan.end, self.clock.now_ns()))

    def pull(self, engine: DeviceEngine, env: Envelope, req: Request, dst: memoryview) -> None:
        sreq: Request = env.handle  # type: ignore[assignment]
        sreq._state = ACTIVE
        clear_to_send = self.model.control(engine.rank, env.source, now=self.clock.now_ns())
        plan = self.model.transfer(env.source, engine.rank, env.nbytes, now=clear_to_send)
        self.clock.call_at(plan.end, self._transfer_done, engine, env, req, dst, plan)

    def _transfer_done(self, engine: DeviceEngine, env: Envelope, req: Request,
                       dst: memoryview, plan: TransferPlan) -> None:
        sreq: Request = env.handle  # type: ignore[assignment]
        src: memoryview = sreq.buf.mv  # type: ignore[union-attr]

        def done() -> None:
            self._record(sreq._engine, sreq, "send", engine.rank, plan, plan.end)
            self._record(engine, req, "recv", env.source, plan, plan.end)
            sreq._engine.send_done(sreq)
            engine.recv_done(req, env)

        if env.nbytes < THREAD_COPY_MIN:
            dst[: env.nbytes] = src
            done()
        else:
            engine.copy_on_thread(dst, src, env.nbytes, done)

    # -- records --------------------------------------------------------------------------

    def _record(self, engine: DeviceEngine, req: Request, kind: str, peer: int,
                plan: TransferPlan, end: int) -> None:
        if engine.records is None:
            return
        req.record = OpRecord(rank=engine.rank, kind=kind, peer=peer, tag=req.tag,
                              nbytes=plan.nbytes, chunks=plan.chunks, start=plan.start * 1e-9,
                              end=end * 1e-9, mode=plan.mode)
        engine.records.append(req.record)

    def link_busy(self, rank: int) -> float:
        return self.model.link_busy(rank) * 1e-9
