"""The boundary between a rank's engine and the transport underneath: plain data both ways.

A transport (a ``Link``) moves messages between the engines of one world: their headers,
their payloads, and the news of ranks closing.  It never matches (each receiving engine's
``Matcher`` does, for every transport) and never sees an engine's requests: it sees
``Message`` objects (``_core.descriptors``: an envelope, a size, and where the payload is)
and ``memoryview``s, and reports back through the ``Endpoint`` each engine offers.

A message's life, seen from the link:

1. ``send(msg, dest)``: the engine posted a send.  The link carries ``msg`` to ``dest``,
   whose endpoint gets ``arrived(msg)``; the payload travels with it (``STAGED``,
   ``INLINE``) or stays at the sender (``AT_SENDER`` in-process, ``REMOTE`` elsewhere).
   An endpoint may ``stage(msg)``: copy an eager payload into its staging pool.
2. ``staged(msg)`` (receiver): the payload of an ``AT_SENDER`` message is staged at the
   receiver; the link tells the sender (``Endpoint.sent``).
3. ``fetch(msg, rank, into, ready)`` (receiver ``rank``): a recv matched a message whose
   payload is not here; the link tells the sender (``Endpoint.activate``: it can no longer
   be withdrawn), then calls ``ready(view, record)`` once the payload can be copied from
   ``view`` into ``into`` (or ``ready(None, record)`` once it is in ``into`` already).
4. ``received(msg, rank)`` (receiver): the payload is in its recv buffer; the link
   completes the sender if it was waiting for that, and returns the receiver's modelled
   record, if it keeps any.
5. ``withdraw(msg, dest, ask)`` (sender): withdraw a posted send: ``WITHDRAWN`` at once,
   ``TOO_LATE`` (a recv matched it), or ``ASKED``: only its receiver, in another process,
   can tell; the link later calls ``Endpoint.withdrawn`` if the withdrawal won, or
   ``activate`` and ``sent`` if it lost.  Without ``ask`` it never asks.
6. ``close(rank, reason)``: the rank's engine closed; the others get ``peer_closed``.
   A link may tell only the endpoints that wait for that rank: each endpoint's first recv
   or probe that waits for a source is reported to ``waiting(rank, source)``, and a link
   may share one ``gone`` set among its endpoints (see ``Endpoint.gone``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

from .._exceptions import CommBrokenError

if TYPE_CHECKING:
    from .._core.descriptors import Message

__all__ = ["ASKED", "CLOSED", "TOO_LATE", "WITHDRAWN", "Endpoint", "Link", "Ready", "gone_error"]

#: Outcomes of ``Link.withdraw``.
TOO_LATE: Final = 0
WITHDRAWN: Final = 1
ASKED: Final = 2

#: ``fetch``'s callback: the payload's readable view (None: already in place) and the
#: transfer's modelled record (None without a model).
Ready = Callable[["memoryview | bytearray | None", object], None]


class Endpoint(Protocol):
    """What a rank's engine offers its link (the link calls nothing else)."""

    rank: int
    closed: bool
    #: The ranks known to have closed, but for those in ``unheard``.  The endpoint's own
    #: set, filled by ``peer_closed``; or one set that a link shares among its endpoints
    #: and fills itself (a close is then one insert), which may hold the endpoint's own
    #: rank, and whose ranks in ``unheard`` (still sending it what they sent before they
    #: closed) this endpoint has not heard of yet.
    gone: set[int]
    unheard: set[int]

    def arrived(self, msg: Message) -> None:
        """A message for this rank arrived (or was announced)."""

    def stage(self, msg: Message) -> bool:
        """Copy ``msg``'s eager payload into this rank's staging pool if it fits (then
        ``msg.where`` is ``STAGED``); False if it is too large or the pool is full."""

    def retract(self, msg: Message) -> bool:
        """Remove ``msg`` from this rank's unexpected messages; False if a recv took it."""

    def activate(self, msg: Message) -> None:
        """A recv matched this rank's send ``msg``: it can no longer be withdrawn."""

    def sent(self, msg: Message, record: object = None) -> None:
        """This rank's send ``msg`` is complete: its buffer may be reused."""

    def withdrawn(self, msg: Message) -> None:
        """The withdrawal of this rank's send ``msg``, asked of its receiver, won."""

    def failed(self, msg: Message, exc: BaseException) -> None:
        """This rank's send ``msg`` failed before any recv took it."""

    def peer_closed(self, rank: int, exc: BaseException | None) -> None:
        """``rank`` closed (or failed with ``exc``): nothing more comes from it."""

    def broke(self, exc: BaseException) -> None:
        """The transport failed underneath: fail every unfinished op with ``exc``."""

    def describe_pending(self, peer: int) -> list[str]:
        """This rank's unfinished ops that involve ``peer`` and that ``peer`` cannot see."""


#: What a rank that closed normally is said to have done (a failed rank says why).
CLOSED: Final = "has closed its communicator"


def gone_error(rank: int, peer: int, why: str | None, cause: BaseException | None, *,
               unreceived: bool = False) -> CommBrokenError:
    """The error of ``rank``'s op that ``peer``, gone, will never complete: it closed
    normally (``why`` None) or said ``why`` (``failed with ValueError: ...``); with
    ``unreceived``, a send it closed without receiving.  Every transport says it alike."""
    if why is None:
        text = (f"rank {peer} closed its communicator before receiving this message"
                if unreceived else f"rank {peer} {CLOSED}")
    else:
        text = f"rank {peer} {why}" + (", before receiving this message" if unreceived else "")
    err = CommBrokenError(text, rank=rank, peer=peer)
    err.__cause__ = cause
    return err


class Link(abc.ABC):
    """Moves messages between the engines of one world (see the module docs)."""

    #: The ranks are in other processes: their pending ops cannot be seen from here.
    remote = False
    #: Called once, just before a task waits on the loop, with the op it waits for (one not
    #: done): by a ``recv`` or ``sendrecv`` whose message has not come (the recv), by
    #: awaiting an op (a ``send`` that has not finished), and by ``wait_all`` and
    #: ``wait_any`` (their first recv, else their first op).  A link whose messages are
    #: looked for by polling may look once more, or poll a while, and take what came, so
    #: that the wait ends without a turn of the loop (``transports.shm``, for recvs; the
    #: MPI link, ``Progress.wait_here``); None: nothing to do.
    before_wait: Callable[..., None] | None = None

    @abc.abstractmethod
    def send(self, msg: Message, dest: int) -> None:
        """Carry a posted send's ``msg`` to ``dest``."""

    @abc.abstractmethod
    def fetch(self, msg: Message, rank: int, into: memoryview, ready: Ready) -> None:
        """Make the payload of a message that a recv of ``rank`` matched (``AT_SENDER``,
        ``REMOTE``) available, then call ``ready``."""

    @abc.abstractmethod
    def withdraw(self, msg: Message, dest: int, ask: bool) -> int:
        """Withdraw a posted send: ``WITHDRAWN``, ``TOO_LATE`` or ``ASKED``."""

    def send_now(self, dest: int, tag: int, array: object, nbytes: int, count: int,
                 dtype: str) -> bool:
        """The fast lane: send a small message (a 1-D numpy array) that no request tracks,
        if it can go eagerly now; False, having done nothing, for the usual way."""
        return False

    def staged(self, msg: Message) -> None:  # noqa: B027
        """The receiver staged the payload of an ``AT_SENDER`` message."""

    def received(self, msg: Message, rank: int) -> object:
        """``rank`` has ``msg``'s payload in its recv buffer; returns its modelled record
        (None without a model)."""
        return None

    def discard(self, msg: Message, rank: int) -> None:  # noqa: B027
        """``rank`` closed with ``msg`` unreceived (its staged payload is released by the
        engine); the link fails or forgets what it holds for it."""

    @abc.abstractmethod
    def close(self, rank: int, reason: str) -> None:
        """``rank``'s engine closed: tell the other ranks, once what it sent has arrived."""

    @abc.abstractmethod
    def describe(self, rank: int, peer: int) -> list[str]:
        """What ``peer`` has posted that involves ``rank``, for error messages."""

    def why_gone(self, peer: int) -> tuple[str | None, BaseException | None]:
        """What ``peer``, which closed, said then: None if it closed normally, or
        ``failed with ValueError: ...``; and its exception where it is known here."""
        return None, None

    def waiting(self, rank: int, source: int) -> None:  # noqa: B027
        """A recv or probe of ``rank`` waits for ``source`` (``ANY_SOURCE``: any rank), the
        first of that rank's to wait for it."""

    def busy_time(self, rank: int) -> float:
        """Seconds of modelled link time used by ``rank``'s sends (0 without a model)."""
        return 0.0
