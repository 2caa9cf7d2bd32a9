"""The error hierarchy.

Every error raised by asynccomm is an :class:`AsyncCommError` except argument errors, which
are the builtin :class:`ValueError` and :class:`TypeError` (raised before anything is posted),
and cancellation, which is the standard :class:`asyncio.CancelledError`.

Each class says *who is to blame*: the caller (``CommClosedError``: you closed it), a peer
or the machine underneath (``CommBrokenError``, ``TransportError``), or the pairing of a
send with a recv (``MatchError``).  Errors carry the fields that caused them, so handlers
never parse messages.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AsyncCommError",
    "CommBrokenError",
    "CommClosedError",
    "CommRevokedError",
    "CommTimeoutError",
    "DTypeMismatchError",
    "DeadlockError",
    "MatchError",
    "OutOfDeviceMemoryError",
    "TransportError",
    "TruncationError",
]


class AsyncCommError(Exception):
    """Base class of asynccomm's errors; abstract, so it is never raised itself.

    Attributes:
        rank: the rank that raised it, when known.
    """

    rank: int | None

    def __init__(self, msg: str, *, rank: int | None = None) -> None:
        if type(self) is AsyncCommError:
            raise TypeError("AsyncCommError is abstract: raise one of its subclasses")
        super().__init__(msg)
        self.rank = rank

    def __reduce__(self) -> tuple[Any, ...]:
        # The fields are keyword-only, so the default (cls(*args)) cannot rebuild them:
        # rebuild from the message and the attributes instead (pickle, copy).
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[AsyncCommError], args: tuple[Any, ...],
             state: dict[str, Any]) -> AsyncCommError:
    exc = cls.__new__(cls, *args)  # (the class's own: OSError's for CommTimeoutError)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class CommClosedError(AsyncCommError):
    """Raised when *this side* closed the communicator (or its world) and then used it, or
    for operations still pending when it was closed.  The caller is to blame."""


class CommBrokenError(AsyncCommError):
    """Raised when a peer or link failed underneath the caller: the peer closed or crashed
    while an operation with it was pending or was about to be posted.  ``__cause__`` holds
    the original error when there is one.

    Attributes:
        peer: the rank that failed.
    """

    peer: int | None

    def __init__(self, msg: str, *, rank: int | None = None, peer: int | None = None) -> None:
        super().__init__(msg, rank=rank)
        self.peer = peer


class CommRevokedError(AsyncCommError):
    """Raised by every pending and later operation of a communicator that a rank revoked
    (``Communicator.revoke``, ULFM's ``MPI_ERR_REVOKED``): the program chose to stop using
    it, typically after a peer failed.  ``agree``, ``shrink``, ``failed``, ``ack_failed``
    and ``aclose`` still work on it.

    Attributes:
        revoked_by: the rank that revoked the communicator.
    """

    revoked_by: int

    def __init__(self, msg: str, *, rank: int | None = None, revoked_by: int) -> None:
        super().__init__(msg, rank=rank)
        self.revoked_by = revoked_by


class MatchError(AsyncCommError):
    """A send matched a recv by envelope (source, tag) but the message cannot be placed in
    the recv's buffer.  The recv fails; the message is not lost: it stays first in line for
    the next recv that fits, and the sender is not failed.

    Attributes:
        source, tag: the message's envelope.
        nbytes: the message's size in bytes.
        capacity: the recv buffer's size in bytes.
        send_dtype, recv_dtype: the dtype names on both sides.
    """

    source: int
    tag: int
    nbytes: int
    capacity: int
    send_dtype: str
    recv_dtype: str

    def __init__(self, msg: str, *, rank: int | None, source: int, tag: int, nbytes: int,
                 capacity: int, send_dtype: str, recv_dtype: str) -> None:
        super().__init__(msg, rank=rank)
        self.source = source
        self.tag = tag
        self.nbytes = nbytes
        self.capacity = capacity
        self.send_dtype = send_dtype
        self.recv_dtype = recv_dtype


class TruncationError(MatchError):
    """The message is larger than the recv buffer (``MPI_ERR_TRUNCATE``).  The buffer is
    untouched; receive it with a larger buffer or ``recv_new``."""


class DTypeMismatchError(MatchError, TypeError):
    """The message's dtype differs from the recv buffer's.  The buffer is untouched; receive
    it with a buffer of the sender's dtype or ``recv_new``."""


class CommTimeoutError(AsyncCommError, TimeoutError):
    """An operation's ``timeout=`` (or ``ASYNCCOMM_TIMEOUT``) expired before it matched.  The
    operation was withdrawn: nothing was written and no message was lost.  The message says
    what the peer had posted at that moment.

    Attributes:
        op: ``"send"``, ``"recv"`` or ``"probe"``.
        peer: the peer rank (``ANY_SOURCE`` for a wildcard recv).
        tag: the operation's tag.
        timeout: the timeout in seconds.
    """

    op: str
    peer: int
    tag: int
    timeout: float

    def __init__(self, msg: str, *, rank: int | None, op: str, peer: int, tag: int,
                 timeout: float) -> None:
        super().__init__(msg, rank=rank)
        self.op = op
        self.peer = peer
        self.tag = tag
        self.timeout = timeout


class DeadlockError(AsyncCommError):
    """Every rank is blocked and nothing can ever wake them (detected on the virtual clock).

    Attributes:
        pending: for each rank, the descriptions of its unmatched operations.
    """

    pending: dict[int, list[str]]

    def __init__(self, msg: str, *, pending: dict[int, list[str]]) -> None:
        super().__init__(msg)
        self.pending = pending


class OutOfDeviceMemoryError(AsyncCommError, MemoryError):
    """A buffer allocated through a simulated device would exceed its memory capacity.

    Attributes:
        requested, in_use, capacity: bytes.
    """

    requested: int
    in_use: int
    capacity: int

    def __init__(self, msg: str, *, rank: int | None, requested: int, in_use: int,
                 capacity: int) -> None:
        super().__init__(msg, rank=rank)
        self.requested = requested
        self.in_use = in_use
        self.capacity = capacity


class TransportError(AsyncCommError):
    """A failure of the transport underneath (for example an MPI error), translated in one
    place; ``__cause__`` holds the original exception."""

