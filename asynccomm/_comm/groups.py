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
(``_comm.forming``): the ranks agree through rank 0, and a call that fails on one rank fails on
every rank, the parent left usable.
Rule 5: a collective call that leaves unfinished on this rank (an error, a timeout, a
cancellation, even before it ran) marks its block dead here: the messages the other ranks
sent it are dropped from staging at once, and again at each of the next ``_SWEEP_CALLS``
calls for those that arrive late, so they never fill the staging pool.
Rule 6: a communicator closes its sub-communicators (and its private context) before
itself; closing one sub-communicator leaves its parent and siblings open.

The world makes the new communicators (``view.Family.child``): in-process worlds share one
link per new group, MPI worlds create an MPI communicator for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._engine.options import check_timeout
from .._exceptions import AsyncCommError
from .._types import TAG_UB
from .calls import Call
from .forming import form, leave
from .view import CommView

__all__ = ["OBJECT_TAGS", "TAG_SPAN", "dup", "split"]

#: The tags one collective call may use on the private context (its base is a multiple).
TAG_SPAN = 4096
#: The private context's tags from here up carry objects' buffers (see ``_comm/objects.py``).
OBJECT_TAGS = (TAG_UB + 1) // 2
_BLOCKS = OBJECT_TAGS // TAG_SPAN
#: For how many later calls a block left unfinished here is swept of late messages.
_SWEEP_CALLS = 64


def _check_int(value: object, what: str, *, minimum: int | None = None) -> int:
    if type(value) is bool or not isinstance(value, int | np.integer):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    v = int(value)
    if minimum is not None and v < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {v}")
    if not -(2**62) <= v < 2**62:
        raise ValueError(f"{what}={v} is out of range")
    return v


def split(comm: CommView, color: int | None, key: int = 0, *,
          timeout: float | None = None) -> Call[CommView | None]:
    """``Communicator.split`` (see there): its place is taken now."""
    tag, seq = comm._next_tags(), comm._next_seq()
    return Call(_form(comm, "split", tag, seq, color, key, timeout),
                lambda exc: _leave(comm, tag, exc))


def dup(comm: CommView, *, timeout: float | None = None) -> Call[CommView]:
    """``Communicator.dup`` (see there): its place is taken now."""
    tag, seq = comm._next_tags(), comm._next_seq()
    return Call(_dup(comm, tag, seq, timeout), lambda exc: _leave(comm, tag, exc))


async def _dup(comm: CommView, tag: int, seq: int, timeout: float | None) -> CommView:
    sub = await _form(comm, "dup", tag, seq, 0, 0, timeout)
    assert sub is not None
    return sub


async def _form(comm: CommView, what: str, tag: int, seq: int, color: object, key: object,
                timeout: object) -> CommView | None:
    try:
        comm._check_ready()
        c = -1 if color is None else _check_int(color, "color", minimum=0)
        k = _check_int(key, "key")
        limit = comm._default_timeout if timeout is None else check_timeout(timeout)
        private = comm._private()
    except BaseException as exc:
        _leave(comm, tag, exc)
        raise
    family = comm._family

    async def make(table: list[tuple[int, int]]) -> CommView | None:
        members = None if c < 0 else sorted(
            (r for r in range(comm.size) if table[r][0] == c),
            key=lambda r: (table[r][1], r))
        return await _adopt(comm, await family.child(comm, members, c, group_key()))

    def group_key() -> tuple[Any, ...]:  # the new group's name, alike on every member
        return ("split", seq, c) if what == "split" else ("dup", seq)

    def forfeit() -> None:
        if c >= 0:
            family.forfeit(comm, group_key())

    try:
        sub = await form(private, tag, what, c, k, limit, make, comm._linger, forfeit)
    except BaseException:
        comm._left_block(tag)  # what the others send this call is dropped
        raise
    if private.rank == 0:
        comm._left_block(tag)  # the late word of a rank that left after GO, dropped
    return sub


def _leave(comm: CommView, tag: int, exc: BaseException | None) -> None:
    """This rank left a split or dup before it said it was ready."""
    try:
        private = None if comm.closed else comm._private()
    except (AsyncCommError, RuntimeError):
        private = None
    leave(private, tag, exc)
    comm._left_block(tag)


async def _adopt(comm: CommView, sub: CommView | None) -> CommView | None:
    if sub is not None:
        comm._adopt(sub)
    return sub

