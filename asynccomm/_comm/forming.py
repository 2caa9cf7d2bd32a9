"""How the ranks of a communicator agree to make a sub-communicator (``split``, ``dup``).

How it works
------------
Rule 1 (one decision).  A call takes its place (a block of tags, a sequence number) when
it is called (``_comm.calls``).  Each rank then tells rank 0 of the parent, the coordinator,
that it is ready (with its color and key), or that it left the call (a bad argument, a
cancellation, its timeout, a failure).  Rank 0 decides GO once every rank is ready, and
ABORT as soon as one left, when its own timeout expires or when it is cancelled; it tells
every rank that may be waiting.  Only a GO makes communicators, on every rank that was
ready.
Rule 2 (leaving).  A rank that was ready may still leave while it waits (its timeout, a
cancellation): it tells rank 0, which aborts if it has not decided yet.  If rank 0 had
said GO already, the rank that left still takes its part in making the communicator, in
the background, and closes its end at once: the others get a communicator on which that
rank is closed (``CommBrokenError`` when they need it), never a hang and never a
communicator made on some ranks only.
Rule 2b (not hearing).  A rank that was ready but cannot hear rank 0's decision (its
private context failed: a member failed, with ``faults="tolerate"``) cannot tell whether
the group is made: it forfeits its place (``Family.forfeit``) and fails, and the members
that came, if rank 0 said GO, get ``CommBrokenError`` naming it instead of waiting for it.
Rule 3 (outcome).  An ABORT fails the call on every rank with the same message, naming the
rank and why: ``CommTimeoutError`` when a timeout expired, else ``CommBrokenError``.  The
parent keeps working: its next collective calls pair as before.  A call that completed is
never reported cancelled (the cancellation is delivered at the task's next await).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from .._engine.request import Request, defer_cancellation, settle, wait_any
from .._engine.waits import armed_timeout
from .._exceptions import AsyncCommError, CommBrokenError, CommClosedError, CommTimeoutError
from .._types import ANY_SOURCE
from .view import CommView

__all__ = ["form", "leave"]

READY, LEFT = 1, 0  # what a rank tells rank 0 (on the call's first tag)
GO, ABORT = 1, 0  # rank 0's decision (on the call's second tag)
#: Why a rank left (sent as a number).
WHY = {1: "passed a bad argument", 2: "was cancelled", 3: "timed out", 4: "failed",
       5: "was closed"}
BAD, CANCELLED, TIMED_OUT, FAILED, CLOSED = 1, 2, 3, 4, 5
#: Where a rank that was ready says it left after all (the call's third tag).
LATE = 2

Table = list[tuple[int, int]]
Make = Callable[[Table], Awaitable["CommView | None"]]


def why_of(exc: BaseException | None) -> int:
    if exc is None or isinstance(exc, asyncio.CancelledError):
        return CANCELLED
    if isinstance(exc, TimeoutError):
        return TIMED_OUT
    if isinstance(exc, CommClosedError):
        return CLOSED
    if isinstance(exc, TypeError | ValueError):
        return BAD
    return FAILED


def leave(private: CommView | None, tag: int, exc: BaseException | None) -> None:
    """This rank leaves the call before it said it was ready: tell rank 0 (or, on rank 0,
    tell every rank that the call is off).  Quietly nothing where it cannot be told (a
    closed communicator, outside its loop)."""
    if private is None:
        return
    try:
        if private.rank == 0:
            _decide(private, tag, np.zeros(private.size, np.int64),
                    np.zeros(private.size, np.int64), ABORT, why_of(exc), 0, set())
        else:
            private.isend(np.array([LEFT, why_of(exc), 0, 0], np.int64), 0, tag)
    except (AsyncCommError, RuntimeError):
        pass  # closed, or not on its loop: nobody is waiting for this rank's word there


async def form(private: CommView, tag: int, what: str, color: int, key: int,
               limit: float | None, make: Make,
               linger: Callable[[asyncio.Future[Any]], None],
               forfeit: Callable[[], None]) -> CommView | None:
    """Agree with every rank on ``(color, key)`` of each (Rule 1), then ``make`` the new
    communicator from the table of every rank's pair.  ``linger`` is given the task that
    finishes the call in the background if this rank leaves it (Rule 2); ``forfeit`` is
    called if this rank cannot hear the decision (Rule 2b).

    Raises:
        CommTimeoutError: a rank's timeout expired before GO (this one's or another's).
        CommBrokenError: a rank left the call, failed or closed before GO.
        asyncio.CancelledError: this task was cancelled before the call completed.
    """
    loop = asyncio.get_running_loop()
    deadline = None if limit is None else loop.time() + limit
    left = [False]  # set when the caller leaves: what the task makes, it closes
    if private.rank == 0:
        table, told = await _coordinate(private, tag, what, color, key, deadline, limit)
        rest = loop.create_task(_closing_if_left(_made(told, make, table), left))
    else:
        private.isend(np.array([READY, color, key, 0], np.int64), 0, tag)
        rest = loop.create_task(_closing_if_left(
            _follow(private, tag, what, make, forfeit), left))
    try:
        async with armed_timeout(_left_of(deadline)):  # (seen by the deadlock proof)
            return await asyncio.shield(rest)
    except (asyncio.CancelledError, TimeoutError) as exc:
        if rest.done() and not rest.cancelled():  # it had finished: its outcome stands
            if isinstance(exc, asyncio.CancelledError):
                defer_cancellation(exc)
            failure = rest.exception()
            if failure is not None:
                raise failure from None
            return rest.result()  # it completed: never reported cancelled
        if not rest.done():
            left[0] = True
            rest.add_done_callback(_retrieved)  # its error is the others' to report
            linger(rest)
            if private.rank != 0:  # rank 0 aborts if it has not decided yet (Rule 2)
                try:
                    private.isend(np.array([LEFT, why_of(exc), 0, 0], np.int64), 0,
                                  tag + LATE)
                except (AsyncCommError, RuntimeError):
                    pass
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise CommTimeoutError(f"{what}: rank {private.rank} did not finish within {limit} "
                               "s and left the call", rank=private.rank, op=what, peer=0,
                               tag=tag, timeout=limit or 0.0) from None


def _left_of(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def _made(told: list[Request], make: Make, table: Table) -> CommView | None:
    """Rank 0 after GO: its word delivered (so that no later message of this rank waits
    behind it on a modelled link), then its communicator."""
    await settle(told)
    return await make(table)


async def _closing_if_left(made: Awaitable[CommView | None],
                           left: list[bool]) -> CommView | None:
    """``made``'s communicator, closed at once if the caller left meanwhile (Rule 2)."""
    comm = await made
    if comm is not None and left[0]:
        await comm.aclose()
    return comm


async def _follow(private: CommView, tag: int, what: str, make: Make,
                  forfeit: Callable[[], None]) -> CommView | None:
    """A rank that said it was ready: rank 0's decision, then its communicator."""
    size = private.size
    decision = np.zeros(3 + 2 * size, np.int64)
    try:
        await private.irecv(decision, 0, tag + 1)
    except AsyncCommError:
        forfeit()  # (Rule 2b) rank 0 may have said GO: nobody waits for this rank
        raise
    verdict, why, culprit = (int(v) for v in decision[:3])
    if verdict != GO:
        raise _aborted(what, private.rank, why, culprit, tag)
    colors, keys = decision[3:3 + size], decision[3 + size:]
    return await make([(int(c), int(k)) for c, k in zip(colors, keys, strict=True)])


async def _coordinate(private: CommView, tag: int, what: str, color: int, key: int,
                      deadline: float | None, limit: float | None
                      ) -> tuple[Table, list[Request]]:
    """Rank 0: wait until every rank is ready (GO) or one left (ABORT), and tell them.

    Raises:
        CommTimeoutError, CommBrokenError, asyncio.CancelledError: as ``form``.
    """
    size = private.size
    rows = np.zeros((size, 4), np.int64)
    rows[0] = (READY, color, key, 0)
    got = {r: private.irecv(rows[r], r, tag) for r in range(1, size)}
    late = np.zeros(4, np.int64)
    notice = private.irecv(late, ANY_SOURCE, tag + LATE) if size > 1 else None
    gone: set[int] = set()  # ranks that wait for no decision
    verdict, why, culprit = ABORT, CANCELLED, 0
    error: BaseException | None = None
    told: list[Request] = []
    try:
        async with armed_timeout(_left_of(deadline)):
            verdict, why, culprit, error = await _hear(got, rows, notice, late, gone)
    except TimeoutError:
        why, culprit = TIMED_OUT, next((r for r, q in got.items() if not q.done()), 0)
    finally:  # whatever happened, every rank that may wait hears the decision
        for req in [*got.values(), notice]:
            if req is not None and not req.done():
                req.cancel()
        told = _decide(private, tag, rows[:, 1].copy(), rows[:, 2].copy(), verdict, why,
                       culprit, gone)
    if verdict == GO:
        return [(int(c), int(k)) for c, k in rows[:, 1:3]], told
    if why == TIMED_OUT and culprit != 0 and culprit not in gone:
        raise CommTimeoutError(f"{what}: rank 0 waited {limit} s for rank {culprit}, which "
                               "had not called it; the call is off on every rank", rank=0,
                               op=what, peer=culprit, tag=tag, timeout=limit or 0.0)
    raise _aborted(what, 0, why, culprit, tag) from error


async def _hear(got: dict[int, Request], rows: Any, notice: Request | None, late: Any,
                gone: set[int]) -> tuple[int, int, int, BaseException | None]:
    """(verdict, why, culprit, error) once every rank is ready or one left."""
    while True:
        for r, req in got.items():
            if req.done():
                error = req.exception()
                if error is not None or rows[r, 0] == LEFT:
                    gone.add(r)
                    return ABORT, FAILED if error is not None else int(rows[r, 1]), r, error
        if notice is not None and notice.done():
            if notice.exception() is not None:
                return ABORT, FAILED, 0, notice.exception()
            status = notice.status
            assert status is not None
            return ABORT, int(late[1]), status.source, None
        pending: list[Request] = [q for q in got.values() if not q.done()]
        if not pending:
            return GO, 0, 0, None
        try:
            await wait_any([*pending, notice] if notice is not None else pending)
        except AsyncCommError:
            pass  # the loop above names it


def _decide(private: CommView, tag: int, colors: Any, keys: Any, verdict: int,
            why: int, culprit: int, gone: set[int]) -> list[Request]:
    """Rank 0 tells every rank that may wait for it (not those that left)."""
    decision = np.concatenate([np.array([verdict, why, culprit], np.int64), colors, keys])
    told = []
    for r in range(1, private.size):
        if r not in gone:
            try:
                told.append(private.isend(decision, r, tag + 1))
            except AsyncCommError:
                pass  # that rank closed: it waits for nothing
    return told


def _aborted(what: str, rank: int, why: int, culprit: int, tag: int) -> AsyncCommError:
    msg = (f"{what}: rank {culprit} {WHY.get(why, 'left')} before every rank was ready; "
           f"no communicator was made on any rank (seen by rank {rank})")
    if why == TIMED_OUT:
        return CommTimeoutError(msg, rank=rank, op=what, peer=culprit, tag=tag, timeout=0.0)
    return CommBrokenError(msg, rank=rank, peer=culprit)
