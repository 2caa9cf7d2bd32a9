"""Requests: awaitable handles of posted operations, and ``wait_all``/``wait_any``."""

from __future__ import annotations

import asyncio
from asyncio.events import _get_running_loop
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any, Final, final

from ._types import Status

if TYPE_CHECKING:
    from ._buffers import BufferView
    from ._engine import DeviceEngine
    from ._stream import Stream
    from .sim.records import OpRecord

__all__ = ["Request", "defer_cancellation", "wait_all", "wait_any"]

# Request states, in order: an op moves only forward.
QUEUED: Final = 0  # waiting on its stream, not posted yet
POSTED: Final = 1  # descriptor posted: withdrawable
ACTIVE: Final = 2  # matched, data moving: no longer withdrawable
DONE: Final = 3  # finished with a result or an exception
CANCELLED: Final = 4  # withdrawn before it matched

_STATE_NAMES: Final = ("queued", "posted", "active", "done", "cancelled")


@final
class Request:
    """An operation in flight, returned by ``Communicator.isend`` and ``irecv``.

    ``await req`` returns the op's result (``None`` for a send, a ``Status`` for a recv) or
    raises its error.  Cancelling the awaiting task withdraws the op like ``req.cancel()``.
    If the op has already matched, its transfer completes first (the buffer is never left
    half written) and the cancellation is raised after it.

    Instances are created by ``Communicator`` and cannot be created directly.
    """

    __slots__ = (
        "_engine", "_exc", "_result", "_state", "_timer", "_track", "_waiters", "buf", "desc",
        "kind", "peer", "record", "seq", "stream", "tag", "timeout",
    )

    def __init__(self, engine: DeviceEngine, kind: str, peer: int, tag: int,
                 buf: BufferView | None, stream: Stream, timeout: float | None) -> None:
        self._engine = engine
        self.kind = kind
        self.peer = peer
        self.tag = tag
        self.buf = buf
        self.stream = stream
        self.timeout = timeout
        self.desc: Any = None
        #: The op's modelled record (start, end, bytes, chunks) once it completed, in worlds
        #: with a cluster model; None elsewhere.
        self.record: OpRecord | None = None
        self.seq = 0
        self._state = QUEUED
        self._result: Any = None
        self._exc: BaseException | None = None
        self._waiters: list[asyncio.Future[None]] | None = None
        self._timer: asyncio.TimerHandle | None = None
        # 0: not tracked (finished as it was posted, or not submitted yet); 1: tracked by
        # its engine and stream, waiting in the stream's queue; 2: tracked and posted.
        self._track = 0

    def __repr__(self) -> str:
        who = "dst" if self.kind == "send" else "src"
        return (f"<Request {self.kind} rank={self._engine.rank} {who}={self.peer} "
                f"tag={self.tag} {_STATE_NAMES[self._state]}>")

    # -- public ---------------------------------------------------------------------------

    def done(self) -> bool:
        """True once the op finished, failed or was cancelled."""
        return self._state >= DONE

    def cancelled(self) -> bool:
        """True if the op was withdrawn before it matched."""
        return self._state == CANCELLED

    def cancel(self) -> bool:
        """Withdraw the op if it has not matched yet.

        Returns:
            True if it was withdrawn (awaiting it then raises ``CancelledError``); False if
            it had already matched or finished, or if only its receiver can tell: a send
            larger than the eager limit on MPI, announced to another process, can only be
            withdrawn by asking that process, which a plain call cannot wait for.  Cancel
            the task awaiting it (or use ``timeout=``): those ask, and wait for the answer.

        Raises:
            RuntimeError: called from another thread or event loop.
        """
        engine = self._engine
        if _get_running_loop() is not engine.loop:
            raise RuntimeError(f"rank {engine.rank}'s request was cancelled outside its event "
                               "loop (from another thread?); call cancel() from the loop that "
                               "opened its world, e.g. with loop.call_soon_threadsafe")
        if self._state >= ACTIVE:
            return False
        return engine.withdraw(self, None, ask=False)

    @property
    def status(self) -> Status | None:
        """The recv's ``Status`` once it completed; None before, and for sends."""
        if self._state != DONE or self._exc is not None:
            return None
        result = self._result
        if isinstance(result, Status):
            return result
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], Status):
            return result[1]
        return None

    def exception(self) -> BaseException | None:
        """The op's error once it failed, else None."""
        return self._exc

    def __await__(self) -> Generator[Any, None, Any]:
        while self._state < DONE:
            fut = self._engine.loop.create_future()
            self._add_waiter(fut)
            try:
                yield from fut
            except asyncio.CancelledError as exc:
                self._discard_waiter(fut)
                return (yield from self._cancelled_while_waiting(exc))
        return self._outcome()

    # -- engine side ----------------------------------------------------------------------

    def _outcome(self) -> Any:
        if self._state == CANCELLED:
            raise asyncio.CancelledError(f"{self!r} was cancelled")
        if self._exc is not None:
            raise self._exc
        return self._result

    def _cancelled_while_waiting(self, exc: asyncio.CancelledError) -> Generator[Any, None, Any]:
        """The task awaiting this op was cancelled: withdraw the op if it has not matched,
        else let it finish.  An op that finished is never reported cancelled: its outcome
        is returned and the cancellation is delivered at the task's next await."""
        if self._state < ACTIVE:
            self._engine.withdraw(self, None)
        yield from self._settle()
        if self._state == CANCELLED:
            raise exc
        defer_cancellation(exc)
        return self._outcome()

    def _settle(self) -> Generator[Any, None, None]:
        """Wait, ignoring cancellation, until the op has finished or been withdrawn."""
        while self._state < DONE:
            fut = self._engine.loop.create_future()
            self._add_waiter(fut)
            try:
                yield from fut
            except asyncio.CancelledError:
                self._discard_waiter(fut)

    def _add_waiter(self, fut: asyncio.Future[None]) -> None:
        if self._waiters is None:
            self._waiters = [fut]
        else:
            self._waiters.append(fut)

    def _discard_waiter(self, fut: asyncio.Future[None]) -> None:
        if self._waiters is not None and fut in self._waiters:
            self._waiters.remove(fut)

    def _wake(self) -> None:
        """Stop the timer and wake every waiter (engine only, once the outcome is set)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiters = self._waiters
        if waiters is not None:
            self._waiters = None
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)


def defer_cancellation(exc: asyncio.CancelledError) -> None:
    """Deliver a cancellation that arrived after an op had finished at the task's next
    await instead of now, so the op's outcome is not lost.

    Called where the ``CancelledError`` was caught and is not re-raised.  If, by the task's
    next wait, something took the cancellation as its own (``asyncio.timeout`` and
    ``TaskGroup`` call ``Task.uncancel()`` when they handle theirs), it is not delivered
    again; otherwise the task is cancelled anew at that wait, its ``cancelling()`` count
    unchanged.
    """
    task = asyncio.current_task()
    if task is None:
        return
    expected = task.cancelling()
    if expected == 0:
        return
    msg = exc.args[0] if exc.args else None

    def deliver() -> None:
        if not task.done() and task.cancelling() >= expected:
            task.cancel(msg)
            task.uncancel()

    task.get_loop().call_soon(deliver)


def _check_requests(reqs: Sequence[Request]) -> list[Request]:
    out = list(reqs)
    for r in out:
        if not isinstance(r, Request):
            raise TypeError(f"expected Request objects, got {type(r).__name__}")
    return out


async def wait_all(reqs: Sequence[Request]) -> list[Any]:
    """Wait for every request; return their results in order.

    Cancelling ``wait_all`` leaves the requests running (they are the caller's handles).

    Raises:
        TypeError: if an item is not a Request.
        Exception: the first failed request's error, in list order, once all are done.
        asyncio.CancelledError: if a request was cancelled.
    """
    items = _check_requests(reqs)
    pending = [r for r in items if not r.done()]
    if pending:
        await _wait(pending, all_done=True)
    return [r._outcome() for r in items]


async def wait_any(reqs: Sequence[Request]) -> tuple[int, Any]:
    """Wait until one request is done; return ``(index, result)`` of the first done.

    Raises:
        TypeError: if an item is not a Request.
        ValueError: if ``reqs`` is empty.
        Exception: the done request's error, if it failed.
    """
    items = _check_requests(reqs)
    if not items:
        raise ValueError("wait_any needs at least one request")
    if not any(r.done() for r in items):
        await _wait(items, all_done=False)
    index = next(i for i, r in enumerate(items) if r.done())
    return index, items[index]._outcome()


async def settle(reqs: list[Request], *, shield: bool = False) -> None:
    """Wait until every request is done, whatever its outcome.  With ``shield``, keep
    waiting through cancellation (for transfers that already matched)."""
    while not all(r.done() for r in reqs):
        try:
            await _wait(reqs, all_done=True)
        except asyncio.CancelledError:
            if not shield:
                raise


class _Countdown:
    """A waiter shared by many requests: it resolves ``fut`` when ``left`` of them have
    finished.  Requests call ``set_result`` once each, so every completion costs O(1)."""

    __slots__ = ("fut", "left")

    def __init__(self, fut: asyncio.Future[None], left: int) -> None:
        self.fut = fut
        self.left = left

    def done(self) -> bool:
        return self.fut.done()

    def set_result(self, _: None) -> None:
        self.left -= 1
        if self.left <= 0 and not self.fut.done():
            self.fut.set_result(None)


async def _wait(reqs: list[Request], *, all_done: bool) -> None:
    pending = [r for r in reqs if not r.done()]
    if not pending or not all_done and len(pending) < len(reqs):
        return
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiter = _Countdown(fut, len(pending) if all_done else 1)
    for r in pending:
        r._add_waiter(waiter)  # type: ignore[arg-type]
    try:
        await fut
    finally:
        for r in pending:
            r._discard_waiter(waiter)  # type: ignore[arg-type]
