"""The collectives as coroutine methods of every communicator.

Each call runs the algorithms of ``_collectives`` on the communicator's private context
(``_groups``, Rule 3), on the next block of its tags, so collectives never match the
program's messages and calls in flight at once never match each other.  Every rank must
call the same collectives in the same order.  On a cluster world the algorithm is the one
the model says is fastest for the size (``_collective_costs.model_chooser``); elsewhere it
switches by size (``default_choice``).  ``algorithm=`` names one instead (``"ring"``,
``"recursive_doubling"``, ``"bruck"``, ``"binomial"``, ``"linear"``: the collective's own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _collectives as coll
from ._collective_costs import Chooser, default_choice, model_chooser
from ._reduce_ops import ReduceOp

if TYPE_CHECKING:
    from ._communicator import Communicator

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

    def _call(self, algorithm: str | None = None) -> tuple[Communicator, int, Chooser]:
        self._check_ready()
        if algorithm is not None:
            if not isinstance(algorithm, str):
                raise TypeError(f"algorithm must be a str or None, got "
                                f"{type(algorithm).__name__}")
            return self._private(), self._next_tags(), lambda *_: algorithm
        private = self._private()
        if self._chooser is None:
            timing = getattr(private._engine.link, "timing", None)
            if timing is None:
                self._chooser = default_choice
            else:
                ranks = timing.ranks if timing.ranks is not None else range(self.size)
                self._chooser = model_chooser(timing.model, list(ranks),
                                              private._engine.eager_limit)
        return private, self._next_tags(), self._chooser

    async def barrier(self, *, timeout: float | None = None) -> None:
        """Return once every rank has entered the barrier (dissemination).

        Raises:
            TypeError, ValueError: bad arguments (nothing is sent).
            CommClosedError, CommBrokenError, CommTimeoutError, DeadlockError: as the
                point-to-point ops, with a note naming the collective and this rank;
                ``timeout`` bounds the whole call.
        """
        private, tag, choose = self._call()
        await coll.barrier(private, tag=tag, timeout=timeout, choose=choose)

    async def bcast(self, buf: Any, root: int = 0, *, timeout: float | None = None) -> None:
        """Copy the root's ``buf`` into every rank's ``buf`` (binomial tree).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        private, tag, choose = self._call()
        await coll.bcast(private, buf, root, tag=tag, timeout=timeout, choose=choose)

    async def reduce(self, sendbuf: Any, recvbuf: Any, op: Op = ReduceOp.SUM, root: int = 0,
                     *, timeout: float | None = None) -> None:
        """Reduce every rank's ``sendbuf`` with ``op`` into the root's ``recvbuf`` (binomial
        tree).  ``recvbuf`` is used at the root only (None elsewhere is fine) and may be
        ``sendbuf`` there (in place).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        private, tag, choose = self._call()
        await coll.reduce(private, sendbuf, recvbuf, op, root, tag=tag, timeout=timeout,
                          choose=choose)

    async def allreduce(self, sendbuf: Any, recvbuf: Any = None, op: Op = ReduceOp.SUM, *,
                        timeout: float | None = None,
                        algorithm: str | None = None) -> None:
        """Reduce every rank's ``sendbuf`` with ``op`` into every rank's ``recvbuf`` (None:
        in place, in ``sendbuf``).  Every rank gets the same bits.  Ring for large arrays,
        recursive doubling for small ones, or the ``algorithm`` named (``"ring"``,
        ``"recursive_doubling"``).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        private, tag, choose = self._call(algorithm)
        await coll.allreduce(private, sendbuf, recvbuf, op, tag=tag, timeout=timeout,
                             choose=choose)

    async def allgather(self, sendbuf: Any, recvbuf: Any, *,
                        timeout: float | None = None,
                        algorithm: str | None = None) -> None:
        """Gather every rank's ``sendbuf`` into every rank's ``recvbuf``, of shape
        ``(size, *sendbuf.shape)`` (``algorithm``: ``"ring"`` or ``"bruck"``; None chooses).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        private, tag, choose = self._call(algorithm)
        await coll.allgather(private, sendbuf, recvbuf, tag=tag, timeout=timeout,
                             choose=choose)

    async def reduce_scatter(self, sendbuf: Any, recvbuf: Any, op: Op = ReduceOp.SUM, *,
                             timeout: float | None = None,
                             algorithm: str | None = None) -> None:
        """Reduce every rank's ``sendbuf``, of shape ``(size, *recvbuf.shape)``, with
        ``op``; rank i gets row i of the result in ``recvbuf``.

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        private, tag, choose = self._call(algorithm)
        await coll.reduce_scatter(private, sendbuf, recvbuf, op, tag=tag, timeout=timeout,
                                  choose=choose)

    async def gather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                     timeout: float | None = None,
                     algorithm: str | None = None) -> None:
        """Gather every rank's ``sendbuf`` into the root's ``recvbuf``, of shape
        ``(size, *sendbuf.shape)``; ``recvbuf`` is used at the root only.

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        private, tag, choose = self._call(algorithm)
        await coll.gather(private, sendbuf, recvbuf, root, tag=tag, timeout=timeout,
                          choose=choose)

    async def scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                      timeout: float | None = None,
                      algorithm: str | None = None) -> None:
        """Send row i of the root's ``sendbuf``, of shape ``(size, *recvbuf.shape)``, to
        rank i's ``recvbuf``; ``sendbuf`` is used at the root only.

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        private, tag, choose = self._call(algorithm)
        await coll.scatter(private, sendbuf, recvbuf, root, tag=tag, timeout=timeout,
                           choose=choose)

    async def alltoall(self, sendbuf: Any, recvbuf: Any, *,
                       timeout: float | None = None) -> None:
        """Send row j of ``sendbuf`` to rank j, which puts it in row i (this rank) of its
        ``recvbuf``; both have shape ``(size, ...)`` (pairwise exchange).

        Raises:
            TypeError, ValueError, CommClosedError, CommBrokenError, CommTimeoutError,
            DeadlockError: as ``barrier``.
        """
        private, tag, choose = self._call()
        await coll.alltoall(private, sendbuf, recvbuf, tag=tag, timeout=timeout,
                            choose=choose)
