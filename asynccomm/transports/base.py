"""The transport interface: how envelopes and payloads move between device engines.

A transport never matches; matching happens in the receiving engine's ``Matcher`` for
every transport, so all of them follow the same rules.  The engine calls the transport at
four points of a message's life:

1. ``post_send``: a send reached the head of its stream.  The transport carries an
   ``Envelope`` to the destination, where it calls ``DeviceEngine.deliver(env)``.  The
   envelope's ``handle`` is either a staged ``memoryview`` holding the whole payload (eager:
   the destination engine copies it and releases it to its pool) or anything else, which
   only this transport understands (rendezvous: the payload is still at the sender).
2. ``unexpected``: the envelope arrived and no recv was posted.  The transport may stage an
   eager payload now (and complete the sender), or leave it to wait for its recv.
3. ``pull``: a recv matched a rendezvous envelope.  The transport moves the payload into
   the recv buffer, then calls ``engine.recv_done`` and completes the sender.
4. ``withdraw_send``: a posted send is cancelled or timed out.  It is withdrawn at once
   (``WITHDRAWN``), or it has matched already (``TOO_LATE``), or only its receiver can tell
   (a receiver in another process): then the transport asks it (``ASKED``) and later calls
   ``engine.withdrawn(req, exc)`` if the withdrawal won, or completes the send if it lost.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .._core.descriptors import Envelope
    from .._engine import DeviceEngine
    from .._request import Request

__all__ = ["ASKED", "TOO_LATE", "WITHDRAWN", "Transport"]

#: Outcomes of ``Transport.withdraw_send``.
TOO_LATE: Final = 0
WITHDRAWN: Final = 1
ASKED: Final = 2


class Transport(abc.ABC):
    """Moves envelopes and payloads between the engines of one world (see module docs)."""

    @abc.abstractmethod
    def post_send(self, engine: DeviceEngine, req: Request) -> None:
        """Carry ``req``'s envelope to its destination engine."""

    @abc.abstractmethod
    def unexpected(self, engine: DeviceEngine, env: Envelope) -> None:
        """``env`` arrived at ``engine`` and waits for a recv; stage it if it is eager."""

    @abc.abstractmethod
    def pull(self, engine: DeviceEngine, env: Envelope, req: Request, dst: memoryview) -> None:
        """Move a rendezvous payload into ``dst`` for the matched recv ``req``."""

    @abc.abstractmethod
    def withdraw_send(self, engine: DeviceEngine, req: Request, exc: BaseException | None,
                      ask: bool) -> int:
        """Withdraw a posted send: ``WITHDRAWN``, ``TOO_LATE`` (a recv matched it), or
        ``ASKED`` (only with ``ask``: the receiver decides, see the module docs)."""

    def discard(self, engine: DeviceEngine, env: Envelope) -> None:  # noqa: B027
        """``engine`` closed with ``env`` unreceived; release what the transport holds for
        it (staged payloads are the engine's own)."""

    @abc.abstractmethod
    def describe_peer(self, engine: DeviceEngine, peer: int) -> list[str]:
        """What ``peer`` has posted that involves ``engine``'s rank, for error messages."""

    def matched(self, engine: DeviceEngine, env: Envelope, req: Request) -> None:  # noqa: B027
        """A recv matched ``env`` (called only in worlds that keep records); an optional
        hook, a no-op unless the transport keeps per-message records."""

    def link_busy(self, rank: int) -> float:
        """Seconds of modelled link time used by ``rank``'s transfers (0 without a model)."""
        return 0.0

    @abc.abstractmethod
    def engine_closed(self, engine: DeviceEngine) -> None:
        """``engine`` closed: fail what its peers can no longer get from it."""
