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
Rule 4: a communicator closes its sub-communicators (and its private context) before
itself; closing one sub-communicator leaves its parent and siblings open.

The world makes the new communicators (``Family.child``): in-process worlds share one
link per new group, MPI worlds create an MPI communicator for it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ._collectives import allgather
from ._options import check_timeout
from ._types import TAG_UB
from ._waits import during

if TYPE_CHECKING:
    from ._communicator import Communicator

__all__ = ["OBJECT_TAGS", "TAG_SPAN", "Family", "GroupsMixin"]

#: The tags one collective call may use on the private context (its base is a multiple).
TAG_SPAN = 4096
#: The private context's tags from here up carry objects' buffers (see ``_objects.py``).
OBJECT_TAGS = (TAG_UB + 1) // 2
_BLOCKS = OBJECT_TAGS // TAG_SPAN


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

    def _check_ready(self) -> None:
        raise NotImplementedError  # the communicator's

    def _self(self) -> Communicator:
        return self  # type: ignore[return-value]

    async def split(self, color: int | None, key: int = 0, *,
                    timeout: float | None = None) -> Communicator | None:
        """A new communicator for the ranks that pass the same ``color``, ranked by
        (``key``, rank here): ``MPI_Comm_split``.  Collective: every rank calls it.

        Args:
            color: an int >= 0, or None to join no group (returns None).
            key: orders the ranks of the new communicator (ties keep this one's order).
            timeout: bounds the exchange of colors and keys (None: the default op timeout).

        Raises:
            TypeError, ValueError: a bad color or key (nothing is sent).
            CommClosedError, CommBrokenError, CommTimeoutError: as the point-to-point ops.
        """
        self._check_ready()
        c = -1 if color is None else _check_int(color, "color", minimum=0)
        k = _check_int(key, "key")
        if timeout is not None:
            check_timeout(timeout)
        private = self._private()
        with during("split"):  # hang reports say what the allgather is for
            table = await _allgather_pair(private, (c, k), self._next_tags(), timeout)
        seq = self._next_seq()
        if c < 0:
            members = None
        else:
            members = sorted((r for r in range(self.size) if table[r][0] == c),
                             key=lambda r: (table[r][1], r))
        return await self._adopt(await self._family.child(self._self(), members, c,
                                                          ("split", seq, c)))

    async def dup(self) -> Communicator:
        """A new communicator with the same ranks: messages on it never match this one's.
        Collective: every rank calls it.

        Raises:
            CommClosedError, TransportError: this communicator is closed, or MPI failed.
        """
        self._check_ready()
        seq = self._next_seq()
        sub = await self._adopt(await self._family.child(
            self._self(), list(range(self.size)), 0, ("dup", seq)))
        assert sub is not None
        return sub

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
        return block * TAG_SPAN

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


async def _allgather_pair(comm: Communicator, pair: tuple[int, int], tag: int,
                          timeout: float | None) -> list[tuple[int, int]]:
    """Every rank's ``pair``, in rank order (an allgather on ``comm``)."""
    table = np.zeros((comm.size, 2), np.int64)
    await allgather(comm, np.array(pair, np.int64), table, tag=tag, timeout=timeout)
    return [(int(a), int(b)) for a, b in table]
