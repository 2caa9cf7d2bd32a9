"""The in-process transport: every rank's engine lives on one event loop.

Delivery is a direct call into the destination engine.  An eager message that finds no
recv is copied into the destination's staging pool and its send completes at once; any
other message waits at the destination holding a reference to the sender's request, and
its payload is copied straight from the send buffer into the recv buffer when a recv
matches (rendezvous: no intermediate copy).  When the pool is full, eager messages wait the
same way, which is the back-pressure that keeps staging memory bounded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core.descriptors import Envelope
from .._engine import THREAD_COPY_MIN
from .._request import ACTIVE
from .base import TOO_LATE, WITHDRAWN, Transport

if TYPE_CHECKING:
    from .._buffers import BufferView
    from .._engine import DeviceEngine
    from .._request import Request

__all__ = ["LocalTransport"]


class LocalTransport(Transport):
    """Connects the engines of one in-process world."""

    def __init__(self) -> None:
        self.engines: list[DeviceEngine] = []

    def attach(self, engine: DeviceEngine) -> None:
        """Add the next rank's engine (ranks attach in order)."""
        self.engines.append(engine)

    def post_send(self, engine: DeviceEngine, req: Request) -> None:
        env = self._envelope(engine, req)
        if env is not None:
            self.engines[req.peer].deliver(env)

    def _envelope(self, engine: DeviceEngine, req: Request) -> Envelope | None:
        """The envelope of a send, or None (and the send failed) if its peer is closed."""
        if self.engines[req.peer].closed:
            engine.fail(req, engine.broken(req.peer))
            return None
        buf: BufferView = req.buf  # type: ignore[assignment]
        env = req.desc = Envelope(engine.rank, req.tag, buf.nbytes, buf.count, buf.dtype, req)
        return env

    def unexpected(self, engine: DeviceEngine, env: Envelope) -> None:
        if env.nbytes > engine.eager_limit:
            return
        staged = engine.pool.acquire(env.nbytes)
        if staged is None:
            return
        sreq: Request = env.handle  # type: ignore[assignment]
        staged[: env.nbytes] = sreq.buf.mv  # type: ignore[union-attr]
        env.handle = staged
        sreq._engine.send_done(sreq)

    def pull(self, engine: DeviceEngine, env: Envelope, req: Request, dst: memoryview) -> None:
        sreq: Request = env.handle  # type: ignore[assignment]
        sreq._state = ACTIVE
        src: memoryview = sreq.buf.mv  # type: ignore[union-attr]
        if env.nbytes < THREAD_COPY_MIN:
            dst[: env.nbytes] = src
            sreq._engine.send_done(sreq)
            engine.recv_done(req, env)
            return


        def done() -> None:
            sreq._engine.send_done(sreq)
            engine.recv_done(req, env)

        engine.copy_on_thread(dst, src, env.nbytes, done)

    def withdraw_send(self, engine: DeviceEngine, req: Request, exc: BaseException | None,
                      ask: bool) -> int:
        return WITHDRAWN if self.engines[req.peer].matcher.withdraw(req.desc) else TOO_LATE

    def describe_peer(self, engine: DeviceEngine, peer: int) -> list[str]:
        return self.engines[peer].describe_pending(engine.rank)

    def engine_closed(self, engine: DeviceEngine) -> None:
        # Every rank hears of every close (O(size) per close, kept to a set insert for
        # ranks with nothing pending); errors are built only for ops that wait on it.
        rank = engine.rank
        for other in self.engines:
            if other is not engine and not other.closed:
                other.gone.add(rank)
                if other.pending_ops:
                    other.peer_gone(rank)

    def _tell_gone(self, other: DeviceEngine, rank: int) -> None:
        if not other.closed:
            other.peer_gone(rank)
