"""Requests: awaitable handles of posted operations, and ``wait_all``/``wait_any``.

A request doubles as its own descriptor and message (``_core.descriptors``): the matcher
queues it as a posted recv, and an in-process send travels to its receiver as itself, so a
message costs one object.  Its state moves only through ``_core.states`` (the engine's
``Owner.finish`` and ``Owner.move``); this module only reads it.
"""

from __future__ import annotations

import asyncio
import weakref
from asyncio.events import _get_running_loop
from collections.abc import Callable, Coroutine, Generator, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, final

from .._core.descriptors import AT_SENDER, Message
from .._core.states import ACTIVE, CANCELLED, DONE, QUEUED, Kind, State
from .._deadlines import end
from .._types import Status
from .flight import measured_record

if TYPE_CHECKING:
    from .flight import FlightRecorder

__all__ = ["Owner", "Request", "TaskRequest", "Wakes", "awaiting", "defer_cancellation", "settle",
           "wait_all", "wait_any"]

SEND: Final = Kind.SEND
RECV: Final = Kind.RECV
PROBE: Final = Kind.PROBE
COMPUTE: Final = Kind.COMPUTE

class Owner(Protocol):
    """What a request needs of the engine that owns it."""

    rank: int
    loop: asyncio.AbstractEventLoop
    flight: FlightRecorder

    def withdraw(self, req: Request, exc: BaseException | None, *, ask: bool = True) -> bool:
        ...


class OpStream(Protocol):
    """What those that hold a request use of its stream (``stream.Stream``, which holds
    requests itself: named here by what it does, so neither module imports the other)."""

    sid: int
    _queue: Any
    _events: Any
    _pending: Any

    def _submit(self, item: Request | list[Request]) -> None: ...

    def _finished(self, req: Request) -> None: ...

    def _withdraw_queued(self, req: Request) -> None: ...

    def statistics(self) -> Any: ...


@final
class Wakes:
    """How many waiting tasks the Python steps have woken (a request's waiter future set):
    a poll that sees the count move has made a task ready, which runs once it yields.  (The
    C lane keeps its own count: ``_lane.woken()``.)"""

    n: int = 0


@final
class Request(Message):
    """An operation in flight, returned by ``Communicator.isend`` and ``irecv``.

    ``await req`` returns the op's result (``None`` for a send, a ``Status`` for a recv) or
    raises its error.  Cancelling the awaiting task withdraws the op if it has not matched
    yet; an op that has matched finishes (its buffer is never left half written), its
    result is returned, and the cancellation reaches the task at its next await.

    Instances are created by ``Communicator`` and cannot be created directly.
    """

    # Set only on the ops that use them: the order on a tracked op's stream, a compute
    # task's duration (model ns), why a send whose withdrawal was asked is withdrawn.
    sseq: int
    duration_ns: int
    _withdraw_exc: BaseException | None
    #: When the op finished (the engine's clock): set when known.  (A send's message id
    #: in a trace, ``flow``, is ``Message``'s.)
    t_fin: float
    #: An op's own buffer, as bytes (never a staging pool's).
    view: memoryview | None

    __slots__ = (
        "_exc", "_owner", "_record", "_result", "_state", "_timer", "_tracked", "_waiters",
        "_withdraw_exc", "array", "duration_ns", "kind", "peer", "sseq", "stream",
        "t_fin", "t_match", "t_post", "timeout",
    )

    def __init__(self, owner: Owner, kind: Kind, peer: int, tag: int,
                 view: memoryview | None, nbytes: int, count: int, dtype: str | None,
                 stream: OpStream | None, timeout: float | None, array: Any = None) -> None:
        # Message's fields, set here directly: this runs once per message, so the fields
        # only some ops use (duration_ns, _withdraw_exc, sseq) are set when they are.
        self.source = owner.rank if kind is SEND else peer
        self.tag = tag
        self.nbytes = nbytes
        self.count = count
        self.dtype = dtype
        self.seq = -1
        self.where = AT_SENDER
        self.view = view
        self.ident = 0
        self.shape = None
        #: The buffer as a 1-D numpy array, when it is one: copies between two of them are
        #: a numpy slice assignment, and ``view`` is made only if a byte view is needed.
        self.array = array
        self._owner = owner
        self.kind = kind
        #: The other rank: the destination of a send, the source (or ANY_SOURCE) of a recv.
        self.peer = peer
        self.stream = stream
        self.timeout = timeout
        self._record: Any = None
        #: When the op was posted and matched, on the engine's clock (-1.0: not yet, or
        #: unknown); the flight recorder and traces read them.
        self.t_post = -1.0
        self.t_match = -1.0
        self._state = QUEUED
        # A recv's Status (recv_new: its array and Status) or a probe's; None otherwise.
        self._result: Any = None
        self._exc: BaseException | None = None
        self._waiters: list[Any] | None = None
        #: Its deadline's entry while a timeout is armed (``asynccomm._deadlines``).
        self._timer: list[Any] | None = None
        self._tracked = False

    def __repr__(self) -> str:
        who = "dst" if self.kind is SEND else "src"
        return (f"<Request {self.kind.value} rank={self._owner.rank} {who}={self.peer} "
                f"tag={self.tag} {self._state.name.lower()}>")

    # -- public ---------------------------------------------------------------------------

    @property
    def record(self) -> Any:
        """The op's record once it completed (an ``asynccomm.sim.OpRecord``): modelled
        (start, end, bytes, chunks) in worlds with a cluster model; elsewhere measured, in
        seconds since the world opened (``mode="measured"``).  None before it completed,
        and for ops that failed or were cancelled."""
        if self._record is None and self._state is DONE and self._exc is None:
            self._record = measured_record(self, self._owner.rank, self._owner.flight.origin)
        return self._record

    @record.setter
    def record(self, value: Any) -> None:
        self._record = value

    @property
    def state(self) -> State:
        """Where the op is: QUEUED, POSTED, ACTIVE (matched), DONE or CANCELLED."""
        return self._state

    def done(self) -> bool:
        """True once the op finished, failed or was cancelled."""
        return self._state >= DONE

    def cancelled(self) -> bool:
        """True if the op was withdrawn before it matched."""
        return self._state is CANCELLED

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
        owner = self._owner
        if _get_running_loop() is not owner.loop:
            raise RuntimeError(f"rank {owner.rank}'s request was cancelled outside its event "
                               "loop (from another thread?); call cancel() from the loop that "
                               "opened its world, e.g. with loop.call_soon_threadsafe")
        if self._state >= ACTIVE:
            return False
        return owner.withdraw(self, None, ask=False)

    @property
    def status(self) -> Status | None:
        """The recv's ``Status`` once it completed; None before, and for sends."""
        result = self._result
        if self._state is not DONE or self._exc is not None or result is None:
            return None
        return result if type(result) is Status else result[1]

    def exception(self) -> BaseException | None:
        """The op's error once it failed, else None."""
        return self._exc

    def __await__(self) -> Generator[Any, None, Any]:
        if self._state < DONE:
            _look_for(self)
        while self._state < DONE:
            fut = self._owner.loop.create_future()
            self._add_waiter(fut)
            try:
                yield from fut
            except asyncio.CancelledError as exc:
                self._discard_waiter(fut)
                return (yield from self._cancelled_while_waiting(exc))
        return self._outcome()

    # -- engine side ----------------------------------------------------------------------

    def _outcome(self) -> Any:
        if self._state is CANCELLED:
            raise asyncio.CancelledError(f"{self!r} was cancelled")
        if self._exc is not None:
            raise self._exc
        return self._result

    async def _after_cancel(self, exc: asyncio.CancelledError) -> Any:
        """``_cancelled_while_waiting`` for a coroutine that awaited the op's future itself."""
        return await _Awaiting(self._cancelled_while_waiting(exc))

    def _cancelled_while_waiting(self, exc: asyncio.CancelledError) -> Generator[Any, None, Any]:
        """The task awaiting this op was cancelled: withdraw the op if it has not matched,
        else let it finish.  An op that finished is never reported cancelled: its outcome
        is returned and the cancellation is delivered at the task's next await."""
        if self._state < ACTIVE:
            self._owner.withdraw(self, None)
        yield from self._settle()
        if self._state is CANCELLED:
            raise exc
        defer_cancellation(exc)
        return self._outcome()

    def _settle(self) -> Generator[Any, None, None]:
        """Wait, ignoring cancellation, until the op has finished or been withdrawn."""
        while self._state < DONE:
            fut = self._owner.loop.create_future()
            self._add_waiter(fut)
            try:
                yield from fut
            except asyncio.CancelledError:
                self._discard_waiter(fut)

    def _add_waiter(self, waiter: Any) -> None:
        if self._waiters is None:
            self._waiters = [waiter]
        else:
            self._waiters.append(waiter)

    def _discard_waiter(self, waiter: Any) -> None:
        if self._waiters is not None and waiter in self._waiters:
            self._waiters.remove(waiter)

    def _wake(self) -> None:
        """Stop the timer and wake every waiter (engine only, once the outcome is set)."""
        if self._timer is not None:
            end(self)
        waiters = self._waiters
        if waiters is not None:
            self._waiters = None
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
                    Wakes.n += 1


class _Awaiting:
    """Makes a generator (of futures) awaitable."""

    __slots__ = ("gen",)

    def __init__(self, gen: Generator[Any, None, Any]) -> None:
        self.gen = gen

    def __await__(self) -> Generator[Any, None, Any]:
        return self.gen


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


class TaskRequest:
    """The request of an op that is several messages (``isend_obj``, ``irecv_obj``): a
    first op (the object's header), then a task that finishes the rest.  Await it for its
    result, or pass it to ``wait_all``/``wait_any`` with other requests.  Cancelling it, or
    a task awaiting it, withdraws the first op if it has not matched; once it has, the op
    completes (or fails) all the same, ``cancel()`` returns False and a cancelled awaiting
    task gets its outcome, the cancellation being delivered at its next await, as for a
    single op."""

    __slots__ = ("_cancel_on_start", "_first", "_started", "_task", "_waiters", "_what")

    def __init__(self, first: Request, body: Callable[[], Coroutine[Any, Any, Any]],
                 what: str) -> None:
        self._first = first
        self._what = what
        self._started = False
        self._cancel_on_start = False
        self._waiters: dict[Any, Any] = {}
        self._task = first._owner.loop.create_task(self._run(body))
        # Its outcome is the request's, as a Request's: one never awaited is not logged
        # as an error never retrieved.
        self._task.add_done_callback(_retrieved)

    async def _run(self, body: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        self._started = True
        if self._cancel_on_start and not self._first.done():
            # Cancelled before it ran, too late to withdraw at once (an MPI send only its
            # receiver can withdraw): awaiting the first op, cancelled, asks.  A first op
            # that finished meanwhile has its outcome, and the rest follows.
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
        return await body()

    def __repr__(self) -> str:
        state = ("cancelled" if self._task.cancelled() else "done" if self._task.done()
                 else "pending")
        return f"<TaskRequest {self._what} {state}>"

    def done(self) -> bool:
        """True once the op finished, failed or was cancelled."""
        return self._task.done() or self._first._state is CANCELLED

    def cancelled(self) -> bool:
        """True if the op was withdrawn (its first op, before it matched)."""
        return self._task.cancelled() or self._first._state is CANCELLED

    def cancel(self) -> bool:
        """Withdraw the op if its first op has not matched yet, as ``Request.cancel``.

        Returns:
            True if it was withdrawn (awaiting it then raises ``CancelledError``); False if
            its first op had already matched (the op then completes, or fails, as if
            ``cancel`` had not been called) or finished, or if only its receiver can tell
            (see ``Request.cancel``; cancelling the task awaiting it asks).

        Raises:
            RuntimeError: called from another thread or event loop.
        """
        if self._task.done():
            return False
        return self._first.cancel()  # the body, awaiting it, raises CancelledError

    def _ask_withdrawal(self) -> None:
        """The task awaiting this op was cancelled: withdraw the first op if it has not
        matched, asking its receiver where only it can tell; once it has matched the op
        finishes all the same."""
        if not self._started:
            if not self._first.cancel():
                self._cancel_on_start = True  # awaiting the first op, cancelled, asks
            return
        self._task.cancel()

    def exception(self) -> BaseException | None:
        """The op's error once it failed, else None."""
        task = self._task
        return None if not task.done() or task.cancelled() else task.exception()

    def __await__(self) -> Generator[Any, None, Any]:
        return self._wait().__await__()

    async def _wait(self) -> Any:
        task = self._task
        if task.done():
            return task.result()
        fut = task.get_loop().create_future()
        self._add_waiter(fut)  # (a future the hang proof knows: see ``awaiting``)
        try:
            await fut
            return task.result()
        except asyncio.CancelledError as exc:
            self._discard_waiter(fut)
            if not task.done():
                self._ask_withdrawal()
                while not task.done():
                    try:
                        await asyncio.shield(task)
                    except asyncio.CancelledError:
                        continue  # it finishes either way
                    except Exception:  # reported below, as the op's error
                        break
            if task.cancelled():
                raise exc from None
            defer_cancellation(exc)  # it completed: its outcome wins
            return task.result()

    # what wait_all and wait_any use
    def _add_waiter(self, waiter: Any) -> None:
        def wake(_: asyncio.Task[Any]) -> None:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters[waiter] = wake
        self._task.add_done_callback(wake)
        _AWAITING.add(waiter.fut if isinstance(waiter, _Countdown) else waiter)

    def _discard_waiter(self, waiter: Any) -> None:
        _AWAITING.discard(waiter.fut if isinstance(waiter, _Countdown) else waiter)
        wake = self._waiters.pop(waiter, None)
        if wake is not None:
            self._task.remove_done_callback(wake)

    def _outcome(self) -> Any:
        if not self._task.done():  # withdrawn: its body has yet to see it
            raise asyncio.CancelledError(f"{self!r} was cancelled")
        return self._task.result()


#: The futures that tasks await until a ``TaskRequest`` finishes (its own ``await``, and
#: ``wait_all``/``wait_any``): only that request's task resolves them.
_AWAITING: weakref.WeakSet[Any] = weakref.WeakSet()


def awaiting() -> list[Any]:
    """The futures some task awaits until a ``TaskRequest`` finishes (the hang proof
    follows them to that request's task, which it checks in turn)."""
    return [f for f in _AWAITING if not f.done()]


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _check_requests(reqs: Sequence[Request]) -> list[Request]:
    out = list(reqs)
    for r in out:
        if type(r) is not Request and not isinstance(r, (Request, TaskRequest)):
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
    # A list is read as it is (not copied, nor its items checked first) while every item
    # is a Request already done and well: nothing runs meanwhile that could change it.
    items = reqs if type(reqs) is list else _check_requests(reqs)
    results = []
    for r in items:  # the common case, one request at a time: each already done and well
        if type(r) is not Request or r._state is not DONE or r._exc is not None:
            break
        results.append(r._result)
    else:
        return results
    if items is reqs:
        items = _check_requests(reqs)
    pending = [r for r in items if not r.done()]
    if pending:
        _look(pending)
        pending = [r for r in pending if not r.done()]
        if pending:
            await _wait(pending, all_done=True)
    return [r._outcome() for r in items]


def _look(pending: list[Any]) -> None:
    """Before a task waits on the loop for ``pending`` (``wait_all``, ``wait_any``, or
    awaiting one request): the link of its first recv, else of its first op, looks for that
    op once more, or polls for it a while (``Link.before_wait``, as ``Communicator.recv``
    and ``send`` call it), so that a wait the link ends meanwhile costs no wake-up."""
    first = None
    for r in pending:
        if type(r) is Request:
            if r.kind is RECV:
                first = r
                break
            if first is None:
                first = r
    if first is not None and first._state < DONE:
        _look_for(first)


def _look_for(op: Request) -> None:
    """``_look`` for one op not done: its link's ``before_wait``, if it has one."""
    look = getattr(getattr(op._owner, "link", None), "before_wait", None)
    if look is not None:
        look(op)


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
        _look(items)
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
        r._add_waiter(waiter)
    try:
        await fut
    finally:
        for r in pending:
            r._discard_waiter(waiter)
