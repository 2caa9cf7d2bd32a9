"""How a communicator's collective methods call the collectives (each returns a coroutine).

Each call runs the algorithms of ``_collectives.functions`` on the communicator's private context
(``_comm.groups``, Rule 3), on the next block of its tags, so collectives never match the
program's messages and calls in flight at once never match each other.  Every rank must
call the same collectives in the same order.  On a cluster world the algorithm is the one
the model says is fastest for the size (``_collectives.costs.model_chooser``); elsewhere it
switches by size (``default_choice``).  ``algorithm=`` names one instead (``"ring"``,
``"recursive_doubling"``, ``"bruck"``, ``"binomial"``, ``"linear"``: the collective's own).

A call takes its place in that order (its tags) when it is *called*, not when its coroutine
first runs (``_comm.calls``): a call cancelled before it ran, or one that raised, still used up
its place on this rank, so the next call pairs with the other ranks' next call.  A call
that leaves unfinished has its block noted (``_left_block``), and messages the other ranks
sent for it are dropped from staging.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from .._collectives.costs import Chooser, default_choice, model_chooser
from .._collectives.ops import ReduceOp
from .calls import Call
from .faults import lost_member
from .view import CommView

__all__ = ["Op", "collective"]

Op = ReduceOp | str


def collective(comm: CommView, run: Callable[..., Awaitable[None]], algorithm: str | None,
               *args: Any, **kwargs: Any) -> Call[None]:
    """The call of ``run`` (a collective of ``_collectives.functions``) by ``comm``: its
    place (its tags) is taken now, whatever happens to the coroutine."""
    tag = comm._next_tags()
    return Call(_run(comm, run, tag, algorithm, args, kwargs),
                lambda _: comm._left_block(tag))


async def _run(comm: CommView, run: Callable[..., Awaitable[None]], tag: int,
               algorithm: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    try:
        private, choose = _setup(comm, algorithm)
        timing = getattr(private._engine.link, "timing", None)
        if timing is not None:  # on a cluster model: the call's own CPU work, once checked
            kwargs = {**kwargs, "host": partial(timing.collective_work, private.rank,
                                                size=comm.size)}
        await run(private, *args, tag=tag, choose=choose, **kwargs)
    except BaseException as exc:
        comm._left_block(tag)
        lost_member(comm, exc)  # a member failed: the others stop waiting for it too
        raise


def _setup(comm: CommView, algorithm: str | None) -> tuple[CommView, Chooser]:
    """The private context to run on, and the chooser of the algorithm."""
    comm._check_ready()
    if algorithm is not None:
        if not isinstance(algorithm, str):
            raise TypeError(f"algorithm must be a str or None, got {type(algorithm).__name__}")
        return comm._private(), lambda *_: algorithm
    private = comm._private()
    if comm._chooser is None:
        timing = getattr(private._engine.link, "timing", None)
        if timing is None:
            comm._chooser = default_choice
        else:
            ranks = timing.ranks if timing.ranks is not None else range(comm.size)
            comm._chooser = model_chooser(timing.model, list(ranks),
                                          private._engine.eager_limit)
    return private, comm._chooser
