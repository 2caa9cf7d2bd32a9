"""Sub-communicators: ``split`` and ``dup``, and each communicator's private context.

Rule 1: a communicator is a matching context.  Messages on different communicators never
match each other, whatever their source and tag, wildcards included: each has its own
engine (matcher, streams, staging pool) and its own link (in-process, a link object of its
own; on MPI, a communicator of its own).
Rule 2: ``split`` and ``dup`` are collective over the parent: every rank calls them, in
the same order as every other collective call on that parent.  ``split`` orders the new
ranks by (key, old rank), as ``MPI_Comm_split`` does; ``color=None`` returns None.
Rule 3: every communicator has a private context, a hidden duplicate (made with it on
MPI; in one process made on first use, for the whole group at once) that carries the
traffic of collectives and of objects' buffers, so it never matches the program's
messages.  Each collective call takes the next block of ``TAG_SPAN`` tags of its lower
half, in call order, so calls in flight at once never match each other; the upper half
(from ``OBJECT_TAGS``) carries objects' out-of-band buffers.
Rule 4: ``split`` and ``dup`` make a communicator on every rank or on none
(``_forming``): the ranks agree through rank 0, and a call that fails on one rank fails on
every rank, the parent left usable.
Rule 5: a collective call that leaves unfinished on this rank (an error, a timeout, a
cancellation, even before it ran) marks its block dead here: the messages the other ranks
sent it are dropped from staging at once, and again at each of the next ``_SWEEP_CALLS``
calls for those that arrive late, so they never fill the staging pool.
Rule 6: a communicator closes its sub-communicators (and its private context) before
itself; closing one sub-communicator leaves its parent and siblings open.

The world makes the new communicators (``Family.child``): in-process worlds share one
link per new group, MPI worlds create an MPI communicator for it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .._engine.options import check_timeout
from .._exceptions import AsyncCommError
from .._types import TAG_UB
from .calls import Call
from .forming import form, leave

if TYPE_CHECKING:
    from .communicator import Communicator

__all__ = ["OBJECT_TAGS", "TAG_SPAN", "Family", "GroupsMixin"]

#: The tags one collective call may use on the private context (its base is a multiple).
TAG_SPAN = 4096
#: The private context's tags from here up carry objects' buffers (see ``_objects.py``).
OBJECT_TAGS = (TAG_UB + 1) // 2
_BLOCKS = OBJECT_TAGS // TAG_SPAN
#: For how many later calls a block left unfinished here is swept of late messages.
_SWEEP_CALLS = 64


class Family(Protocol):
    """How a world makes new communicators for a group of a parent's ranks."""

    async def child(self, parent: Communicator, members: list[int] | None, color: int,
                    key: tuple[Any, ...]) -> Communicator | None:
        """The new communicator of this rank: ``members`` are parent ranks in new-rank
        order (None: this rank joins none, but must still take part).  ``key`` names the
        group the same way on every member rank; ``color`` is the same for all members."""
        ...

    def open_private(self, comm: Communicator) -> None:
        """Give ``comm`` (and, where the world can, its group) a private context now, for
        a world that makes them on first use; others make them with the communicator."""
        ...


def _check_int(value: object, what: str, *, minimum: int | None = None) -> int:
    if type(value) is bool or not isinstance(value, int | np.integer):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    v = int(value)
    if minimum is not None and v < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {v}")
    if not -(2**62) <= v < 2**62:
        raise ValueError(f"{what}={v} is out of range")
    return v


class GroupsMixin:
    """``split``, ``dup``, the private context and the lifetime of sub-communicators."""

    if not TYPE_CHECKING:  # (mypy would refuse the fields the class that mixes it in lists)
        __slots__ = ()  # that class lists the fields

    rank: int
    size: int
    _family: Family
    _children: set[Communicator]
    _private_comm: Communicator | None
    _seq: int
    _tag_block: int
    _parent: GroupsMixin | None
    _after_close: Any
    _lingering: set[asyncio.Future[Any]]
    _dead: dict[int, int]
    _default_timeout: float | None

    if TYPE_CHECKING:
        def _check_ready(self) -> None: ...

    def _self(self) -> Communicator:
        return self  # type: ignore[return-value]

    def split(self, color: int | None, key: int = 0, *,
              timeout: float | None = None) -> Call[Communicator | None]:
        """A new communicator for the ranks that pass the same ``color``, ranked by
        (``key``, rank here): ``MPI_Comm_split``.  Collective: every rank calls it.

        The ranks agree through rank 0 (``_forming``): the call makes a communicator on
        every rank or on none, and a call that fails on one rank (a bad color, a
        cancellation, a timeout) fails on every rank; the parent keeps working.

        Args:
            color: an int >= 0, or None to join no group (returns None).
            key: orders the ranks of the new communicator (ties keep this one's order).
            timeout: bounds the whole call (None: the default op timeout).

        Raises:
            TypeError, ValueError: a bad color, key or timeout (on this rank; the others
                get ``CommBrokenError`` naming it).
            CommClosedError: this communicator is closed.
            CommBrokenError: another rank left the call or failed, or a rank closed.
            CommTimeoutError: a rank's timeout expired before every rank was ready.
        """
        tag, seq = self._next_tags(), self._next_seq()
        return Call(self._form("split", tag, seq, color, key, timeout),
                    lambda exc: self._leave(tag, exc))

    def dup(self, *, timeout: float | None = None) -> Call[Communicator]:
        """A new communicator with the same ranks: messages on it never match this one's.
        Collective: every rank calls it; as ``split``, it succeeds on every rank or none.

        Raises:
            CommClosedError, CommBrokenError, CommTimeoutError: as ``split``.
            TransportError: MPI failed.
        """
        tag, seq = self._next_tags(), self._next_seq()
        return Call(self._dup(tag, seq, timeout), lambda exc: self._leave(tag, exc))

    async def _dup(self, tag: int, seq: int, timeout: float | None) -> Communicator:
        sub = await self._form("dup", tag, seq, 0, 0, timeout)
        assert sub is not None
        return sub

    async def _form(self, what: str, tag: int, seq: int, color: object, key: object,
                    timeout: object) -> Communicator | None:
        try:
            self._check_ready()
            c = -1 if color is None else _check_int(color, "color", minimum=0)
            k = _check_int(key, "key")
            limit = self._default_timeout if timeout is None else check_timeout(timeout)
            private = self._private()
        except BaseException as exc:
            self._leave(tag, exc)
            raise
        family, me = self._family, self._self()

        async def make(table: list[tuple[int, int]]) -> Communicator | None:
            members = None if c < 0 else sorted(
                (r for r in range(self.size) if table[r][0] == c),
                key=lambda r: (table[r][1], r))
            name = ("split", seq, c) if what == "split" else ("dup", seq)
            return await self._adopt(await family.child(me, members, c, name))

        try:
            sub = await form(private, tag, what, c, k, limit, make, self._linger)
        except BaseException:
            self._left_block(tag)  # what the others send this call is dropped
            raise
        if private.rank == 0:
            self._left_block(tag)  # the late word of a rank that left after GO, dropped
        return sub

    def _leave(self, tag: int, exc: BaseException | None) -> None:
        """This rank left a split or dup before it said it was ready."""
        try:
            private = None if self._self().closed else self._private()
        except (AsyncCommError, RuntimeError):
            private = None
        leave(private, tag, exc)
        self._left_block(tag)

    async def _adopt(self, sub: Communicator | None) -> Communicator | None:
        if sub is not None:
            sub._parent = self
            self._children.add(sub)
        return sub

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _next_tags(self) -> int:
        """The tag base of the next collective call on the private context (Rule 3)."""
        block = self._tag_block
        self._tag_block = (block + 1) % _BLOCKS
        if self._dead:
            self._sweep(block)
        return block * TAG_SPAN

    def _left_block(self, tag: int) -> None:
        """The call on the block of ``tag`` left without finishing here (Rule 5): drop the
        messages the other ranks sent it, now and for the next ``_SWEEP_CALLS`` calls."""
        self._dead[tag // TAG_SPAN] = _SWEEP_CALLS
        self._sweep(-1)

    def _sweep(self, reused: int) -> None:
        dead = self._dead
        private = self._private_comm
        if private is not None and not private._engine.closed:
            private._engine.discard_staged(
                lambda tag: tag < OBJECT_TAGS and tag // TAG_SPAN in dead)
        for block in list(dead):
            dead[block] -= 1
            if dead[block] <= 0 or block == reused:
                del dead[block]

    def _private(self) -> Communicator:
        """This communicator's private context (Rule 3)."""
        private = self._private_comm
        if private is None:
            self._family.open_private(self._self())
            private = self._private_comm
            assert private is not None, "a private context has no private context"
        return private

    def _adopt_private(self, private: Communicator) -> None:
        self._private_comm = private
        private._parent = self  # its close is waited for by this one's

    async def _close_children(self) -> None:
        for sub in list(self._children):
            await sub.aclose()
        if self._private_comm is not None:
            await self._private_comm.aclose()

    def _linger(self, task: asyncio.Future[Any]) -> None:
        self._lingering.add(task)
        task.add_done_callback(self._lingering.discard)

    async def _wait_lingering(self) -> None:
        """Wait until the sub-communicators closed here have said goodbye to their peers
        (on MPI: every member closed too); errors there are their own ranks' to report."""
        while self._lingering:
            await asyncio.gather(*list(self._lingering), return_exceptions=True)

    def _orphan(self) -> None:
        if self._parent is not None:
            self._parent._children.discard(self._self())
            self._parent = None

    async def __aenter__(self) -> Communicator:
        return self._self()

    async def __aexit__(self, *exc_info: object) -> None:
        await self._self().aclose()
