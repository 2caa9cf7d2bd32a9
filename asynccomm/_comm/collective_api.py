"""The collectives as methods of every communicator (each returns a coroutine).

Each call runs the algorithms of ``_collectives`` on the communicator's private context
(``_groups``, Rule 3), on the next block of its tags, so collectives never match the
program's messages and calls in flight at once never match each other.  Every rank must
call the same collectives in the same order.  On a cluster world the algorithm is the one
the model says is fastest for the size (``_collective_costs.model_chooser``); elsewhere it
switches by size (``default_choice``).  ``algorithm=`` names one instead (``"ring"``,
``"recursive_doubling"``, ``"bruck"``, ``"binomial"``, ``"linear"``: the collective's own).

A call takes its place in that order (its tags) when it is *called*, not when its coroutine
first runs (``_calls``): a call cancelled before it ran, or one that raised, still used up
its place on this rank, so the next call pairs with the other ranks' next call.  A call
that leaves unfinished has its block noted (``_left_block``), and messages the other ranks
sent for it are dropped from staging.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .._collectives import functions as coll
from .._collectives.costs import Chooser, default_choice, model_chooser
from .._collectives.ops import ReduceOp
from .calls import Call

if TYPE_CHECKING:
    from .communicator import Communicator

__all__ = ["CollectivesMixin"]

Op = ReduceOp | str


class CollectivesMixin:
    """``barrier``, ``bcast``, ``reduce``, ``allreduce``, ``allgather``, ``reduce_scatter``,
    ``gather``, ``scatter`` and ``alltoall`` (see the module docs)."""

    if not TYPE_CHECKING:  # (mypy would refuse the fields the class that mixes it in lists)
        __slots__ = ()  # that class lists the fields

    size: int
    _chooser: Chooser | None

    if TYPE_CHECKING:
        def _check_ready(self) -> None: ...
        def _private(self) -> Communicator: ...
        def _next_tags(self) -> int: ...
        def _left_block(self, tag: int) -> None: ...

    def _setup(self, algorithm: str | None) -> tuple[Communicator, Chooser]:
        self._check_ready()
        if algorithm is not None:
            if not isinstance(algorithm, str):
                raise TypeError(f"algorithm must be a str or None, got "
                                f"{type(algorithm).__name__}")
            return self._private(), lambda *_: algorithm
        private = self._private()
        if self._chooser is None:
            timing = getattr(private._engine.link, "timing", None)
            if timing is None:
                self._chooser = default_choice
            else:
                ranks = timing.ranks if timing.ranks is not None else range(self.size)
                self._chooser = model_chooser(timing.model, list(ranks),
                                              private._engine.eager_limit)
        return private, self._chooser

    def _collective(self, run: Callable[..., Awaitable[None]], algorithm: str | None,
              *args: Any, **kwargs: Any) -> Call[None]:
        """The call's place (its tags) is taken now, whatever happens to the coroutine."""
        tag = self._next_tags()
        return Call(self._run_collective(run, tag, algorithm, args, kwargs),
                    lambda _: self._left_block(tag))

    async def _run_collective(self, run: Callable[..., Awaitable[None]], tag: int,
                              algorithm: str | None, args: tuple[Any, ...],
                              kwargs: dict[str, Any]) -> None:
        try:
            private, choose = self._setup(algorithm)
            await run(private, *args, tag=tag, choose=choose, **kwargs)
        except BaseException:
            self._left_block(tag)
            raise

    def barrier(self, *, timeout: float | None = None) -> Call[None]:
        """Return once every rank has entered the barrier (dissemination).

        Raises:
            TypeError, ValueError: bad arguments (nothing is sent).
            CommClosedError, CommBrokenError, CommTimeoutError, DeadlockError: as the
                point-to-point ops, with a note naming the collective and this rank;
                ``timeout`` bounds the whole call.
        """
        return self._collective(coll.barrier, None, timeout=timeout)

    def bcast(self, buf: Any, root: int = 0, *, timeout: float | None = None) -> Call[None]:
        """Copy the root's ``buf`` into every rank's ``buf`` (binomial tree).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return self._collective(coll.bcast, None, buf, root, timeout=timeout)

    def reduce(self, sendbuf: Any, recvbuf: Any, op: Op = ReduceOp.SUM, root: int = 0,
               *, timeout: float | None = None) -> Call[None]:
        """Reduce every rank's ``sendbuf`` with ``op`` into the root's ``recvbuf`` (binomial
        tree).  ``recvbuf`` is used at the root only (None elsewhere is fine) and may be
        ``sendbuf`` there (in place).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return self._collective(coll.reduce, None, sendbuf, recvbuf, op, root,
                                timeout=timeout)

    def allreduce(self, sendbuf: Any, recvbuf: Any = None, op: Op = ReduceOp.SUM, *,
                  timeout: float | None = None,
                  algorithm: str | None = None) -> Call[None]:
        """Reduce every rank's ``sendbuf`` with ``op`` into every rank's ``recvbuf`` (None:
        in place, in ``sendbuf``).  Every rank gets the same bits.  Ring for large arrays,
        recursive doubling for small ones, or the ``algorithm`` named (``"ring"``,
        ``"recursive_doubling"``).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return self._collective(coll.allreduce, algorithm, sendbuf, recvbuf, op,
                                timeout=timeout)

    def allgather(self, sendbuf: Any, recvbuf: Any, *,
                  timeout: float | None = None,
                  algorithm: str | None = None) -> Call[None]:
        """Gather every rank's ``sendbuf`` into every rank's ``recvbuf``, of shape
        ``(size, *sendbuf.shape)`` (``algorithm``: ``"ring"`` or ``"bruck"``; None chooses).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return self._collective(coll.allgather, algorithm, sendbuf, recvbuf, timeout=timeout)

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, op: Op = ReduceOp.SUM, *,
                       timeout: float | None = None,
                       algorithm: str | None = None) -> Call[None]:
        """Reduce every rank's ``sendbuf``, of shape ``(size, *recvbuf.shape)``, with
        ``op``; rank i gets row i of the result in ``recvbuf``.

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return self._collective(coll.reduce_scatter, algorithm,
                                sendbuf, recvbuf, op, timeout=timeout)

    def gather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
               timeout: float | None = None,
               algorithm: str | None = None) -> Call[None]:
        """Gather every rank's ``sendbuf`` into the root's ``recvbuf``, of shape
        ``(size, *sendbuf.shape)``; ``recvbuf`` is used at the root only.

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return self._collective(coll.gather, algorithm, sendbuf, recvbuf, root,
                                timeout=timeout)

    def scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                timeout: float | None = None,
                algorithm: str | None = None) -> Call[None]:
        """Send row i of the root's ``sendbuf``, of shape ``(size, *recvbuf.shape)``, to
        rank i's ``recvbuf``; ``sendbuf`` is used at the root only.

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return self._collective(coll.scatter, algorithm, sendbuf, recvbuf, root,
                                timeout=timeout)

    def alltoall(self, sendbuf: Any, recvbuf: Any, *,
                 timeout: float | None = None) -> Call[None]:
        """Send row j of ``sendbuf`` to rank j, which puts it in row i (this rank) of its
        ``recvbuf``; both have shape ``(size, ...)`` (pairwise exchange).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        return self._collective(coll.alltoall, None, sendbuf, recvbuf, timeout=timeout)
