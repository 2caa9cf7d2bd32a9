"""Progress for the MPI link: MPI cannot be awaited, so one task per world polls it.

It keeps ``CTRL_SLOTS`` persistent control recvs posted and hands each control message
that lands to the link; it tracks every other MPI request (control sends, data chunks)
with the callback to run when it completes; and it moves rendezvous payloads in chunks
with a window (``_mpi_chunks``).  It never blocks the loop: the control recv at the head
of the queue is polled with ``Test``, the rest with ``Testsome``.  After any activity it
polls back to back for a moment (``Backoff``), then parks on the loop's shared idle tick
(``_ticker``: one wake-up every 0.4 ms for all the idle progress tasks of the loop, which
polls each and wakes only those with work, or dozes on the process's doorbell where every
peer rings it: ``_doorbell``); while data moves it keeps polling.  While it is at work it
polls the loop's parked progress tasks itself each millisecond, before it spins
(``Ticker.poll_parked``).  A task about to wait for an op not done (a ``send``, ``recv``
or ``sendrecv``, an awaited op, ``wait_all``, ``wait_any``) polls for it itself first, as
the task would (``wait_here``): a wait that ends there, as a reply, a ``sendrecv`` whose
answer is here or the copy of a large message often does, costs no wake-up (no future
set, no turn of the loop before the task runs on); the polls stop once another task has
been woken.  (A send does not look for what landed meanwhile: the task that waits for it
does, and after a large message's copy, whose caches it finds cold, such a look took
about 2 us of the answer's way out.)

When the link says the world is finished (``FIN`` both ways with every rank), it cancels
the control recvs, lets its last sends complete and frees the communicator.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._core.states import DONE
from .._core.wire import HEADER, INLINE_MAX
from . import _mpi_lib as lib
from ._doorbell import Bell
from ._mpi_chunks import Mover
from ._mpi_lib import Backoff, sched_yield, yield_now
from ._ticker import BUSY_PERIOD, Ticker

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["CTRL_TAG", "Progress", "Slot"]


#: The MPI tag of every control message; data tags are 1 and up.
CTRL_TAG = 0
#: Control recvs kept posted; more let bursts of small messages land without MPI-level
#: unexpected-message buffering.
CTRL_SLOTS = 8
#: After anything happens (a completion, or a send from this rank), poll back to back for
#: this long before backing off.  It must outlast a sleeping peer's reaction time (one
#: back-off sleep, which uvloop's millisecond timers round up to 1 ms, plus scheduling),
#: else two ranks can settle into answering each other one sleep late forever.
SPIN = 5e-3
#: Each turn of the loop polls back to back for up to this long before yielding to other
#: tasks: while data moves (MPI copies only inside its calls, and a blocking call would
#: poll all the time), and while spinning (an answer is seen sooner than one turn later).
DATA_BURST = 200e-6
SPIN_BURST = 10e-6
#: Spinning this long without an answer, a poller yields its core after each burst.
SHARE_AFTER = 100e-6
#: A task about to wait for its op polls for it itself first (``Progress.wait_here``), for
#: up to this long while nothing but control messages is in flight ...
WAIT_SPIN = 20e-6
#: ... and up to this long in all while data moves (a progress task's turn, ``DATA_BURST``).
WAIT_DATA = DATA_BURST


def _uncounted() -> int:
    """``Progress.woken`` until the world gives the engine's count."""
    return 0


class Slot:
    """A posted control recv: its buffer and persistent MPI request, and where mpi4py keeps
    that request's handle (``addr``, for the C lane's direct calls; 0: not a real one)."""

    __slots__ = ("addr", "buf", "payload", "req")

    def __init__(self, comm: MPI.Intracomm) -> None:
        # Sized for any rank's inline messages, whatever its own eager limit.
        self.buf = bytearray(HEADER.size + INLINE_MAX)
        self.payload = memoryview(self.buf)[HEADER.size:]
        self.req = comm.Recv_init(self.buf, lib.MPI.ANY_SOURCE, CTRL_TAG)
        self.addr = lib.handle_address(self.req)


class Progress(Mover):
    """Polls one world's MPI requests on the loop (see module docs).

    Args:
        comm: the world's private communicator.
        on_control: called with each control message's slot as it lands (the slot is
            reposted when it returns).
        finished: True once the world may be torn down.
        failed: called with the exception that broke progress (an MPI error).
    """

    def __init__(self, comm: MPI.Intracomm, *, on_control: Callable[[Slot], None],
                 finished: Callable[[], bool], failed: Callable[[Exception], None]) -> None:
        self.comm = comm
        self._on_control = on_control
        self._finished = finished
        self._failed = failed
        self._slots: deque[Slot] = deque()
        self._reqs: list[MPI.Request] = []
        #: Control sends MPI has not finished with: nothing waits for them (testing them on
        #: every poll would double its cost), so they are reaped now and then.
        self._ctrl: list[MPI.Request] = []
        #: The buffers of the control sends among them that the C lane posted by a direct
        #: call (mpi4py's own requests keep theirs): let go once every one is reaped.
        self._held: list[bytes] = []
        self._cbs: list[Callable[[], None] | None] = []
        self._testsome = lib.MPI.Request.Testsome
        self._data = 0  # data chunks in flight: poll without backing off
        self.sent = False  # this rank sent something: an answer may follow, spin
        self.stopped = False  # MPI failed: poll no more, tear nothing down
        #: More ranks on this host than cores for them: a rank that spins waiting for an
        #: answer holds the core its peer needs to give it, so it yields between polls.
        self.crowded = False
        #: Each rank's doorbell (None: it has none, or it is this rank), and whether every
        #: other rank rings this one's: set by the world.
        self.bells: list[Bell | None] | None = None
        self.ringable = False
        self.task: asyncio.Task[None] | None = None
        self._parked: asyncio.Future[None] | None = None  # waiting for the idle tick
        self._error: Exception | None = None  # raised by a poll at the idle tick
        self._woke = False  # the ticker (or a send) woke the parked task: activity
        self._dispatching = False  # a control message is being handed to the link
        #: The last slots of the queue, handed on by ``_spin`` and not posted again yet:
        #: their ``Start`` waits for the next poll (``_repost``), so that the task a
        #: landing woke runs one MPI call sooner (the other slots stay posted meanwhile).
        self._restart = 0
        #: The link has begun to close: from now on, ask ``finished`` when idle.
        self.closing = False
        #: How many waiting tasks the engine has woken so far (``wait_here`` polls on only
        #: while it stays the same): the world gives its lane's count (``Lane.woken``).
        self.woken: Callable[[], int] = _uncounted

    def start(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        """Post the control recvs and start polling."""
        for _ in range(CTRL_SLOTS):
            slot = Slot(self.comm)
            slot.req.Start()
            self._slots.append(slot)
        self.task = loop.create_task(self._run(), name=name)

    # -- sending ----------------------------------------------------------

    def send(self, dest: int, msg: bytes | bytearray) -> None:
        """Send one control message (kept alive until MPI is done with it)."""
        req = self.comm.Isend(msg, dest, CTRL_TAG)
        if not req.Test():
            self._ctrl.append(req)
            if len(self._ctrl) >= CTRL_SLOTS:
                self._reap()
        # After the send (see _doorbell for the order): wake the receiver if it sleeps.
        if (bells := self.bells) is not None and (bell := bells[dest]) is not None \
                and bell.flag[0]:
            bell.ring()
        self.sent = True
        parked = self._parked  # what _wake does, inlined: the hot path
        if parked is not None and not parked.done():
            self._woke = True
            parked.set_result(None)

    def _dispatch(self, slot: Slot, *, later: bool = False) -> None:
        """Hand the control message that landed in ``slot`` (the head) to the link, and
        post the slot again at the back (``later``: at the next poll, ``_repost``)."""
        self._dispatching = True
        try:
            self._on_control(slot)
        finally:
            self._dispatching = False
        if later:
            self._restart += 1
        else:
            slot.req.Start()
        self._slots.rotate(-1)

    def _repost(self) -> None:
        """Post again, in their order, the slots at the back that ``_spin`` handed on.
        (The MPI link may put the C lane's ``Path.repost`` here, which does the same for
        the slots its ``spin`` handed on: it keeps their count.)"""
        slots = self._slots
        n = len(slots)
        for i in range(n - self._restart, n):
            self._restart -= 1
            slots[i].req.Start()

    @property
    def dozable(self) -> bool:
        """Whether this task may sleep until a peer rings: every peer rings, and no control
        send of its own is still out (MPI moves it only inside this rank's MPI calls, and a
        large one needs them while the receiver takes it)."""
        return self.ringable and not self._ctrl

    def _wake(self) -> None:
        """Poll now, not at the next idle tick (an answer may follow, or data moves)."""
        parked = self._parked
        if parked is not None and not parked.done():
            self._woke = True
            parked.set_result(None)

    def wait_here(self, req: Any) -> None:
        """What a task does before it waits on the loop for its op ``req``, one not done
        (``Link.before_wait``: a ``send``, ``recv`` or ``sendrecv``, awaiting an op,
        ``wait_all`` or ``wait_any``, so the collectives too): poll for it itself, the
        bursts of ``_spin`` back to back, until it is done, for up to ``WAIT_SPIN`` while
        only control messages are in flight and ``WAIT_DATA`` in all while data moves.
        What lands meanwhile is handed on as in the task; a burst that woke another task
        ends the wait (that task runs once this returns, as after the task's turn).  A
        wait that ends here costs no wake-up: no future set, no turn of the loop before the
        task runs on (a one-way 8 B message over 2 ranks, and the completion of a large
        send or recv, each took a turn of the loop or two).  It gives its core away
        between polls where the ranks outnumber the cores, as the task does.  Anything it
        took counts as activity: the progress task spins on (``sent``).  An MPI error
        fails the link, as in the task (the op then fails with it)."""
        if self.stopped or self._dispatching:
            return
        clock = time.perf_counter
        share = sched_yield if self.crowded else None
        start = clock()
        end, spin_end = start + WAIT_DATA, start + WAIT_SPIN
        woken = self.woken
        seen = woken()
        took = False
        try:
            while self._spin(until := end if self._reqs else spin_end, share):
                took = True
                if req._state >= DONE or woken() != seen or clock() >= until:
                    break
        except Exception as exc:  # an MPI error fails the link, as in the task
            self._failed(exc)
            return
        if took:
            self.sent = True  # (activity: see above)
            self._wake()

    # -- polling --------------------------------------------------------------------------

    def _reap(self) -> None:
        """Forget the control sends MPI has finished with."""
        ctrl = self._ctrl
        if ctrl and (done := self._testsome(ctrl)):
            finished = set(done)
            self._ctrl = [r for i, r in enumerate(ctrl) if i not in finished]
            if not self._ctrl:
                self._held.clear()

    def _track(self, req: MPI.Request, cb: Callable[[], None] | None) -> None:
        self._reqs.append(req)
        self._cbs.append(cb)

    def _poll(self) -> bool:
        """Test what is in flight and act on what completed; True if anything did."""
        hit = self._land()
        if self._reqs and self._test_requests():
            hit = True
        return hit

    def _land(self) -> bool:
        """Hand every control message that landed to the link, in order; True if any did.
        (The MPI link may put the C lane's ``Path.land`` here, which does the same but for
        one thing: it ends the turn at a message that woke a task, as ``_spin`` does, the
        messages behind it landing at the next poll, unless the last turn ended so too
        and more have landed since, a burst, which it hands on all at once.)"""
        slots = self._slots
        hit = False
        if self._restart:
            self._repost()
        while (head := slots[0]).req.Test():  # a completed slot stays so until restarted
            hit = True
            self._dispatch(head)
        return hit

    def _test_requests(self) -> bool:
        """Act on the data requests that completed; True if any did.  (The MPI link may put
        the C lane's ``Path.test`` here, which does the same.)"""
        reqs = self._reqs
        done = self._testsome(reqs)
        if not done:
            return False
        cbs = self._cbs
        finished = set(done)
        fire = [cbs[i] for i in done]
        self._reqs = [r for i, r in enumerate(reqs) if i not in finished]
        self._cbs = [c for i, c in enumerate(cbs) if i not in finished]
        for cb in fire:
            if cb is not None:
                cb()
        return True

    def _spin(self, until: float, share: Callable[[], None] | None) -> bool:
        """Poll back to back until something completes (True) or the clock passes
        ``until`` (False), calling ``share`` between two polls.  A control message that
        lands is handed on alone, its slot posted again at the next poll, and the turn
        ends: the task it woke runs two MPI calls sooner, and any that landed behind it
        land at the next turn (``_land``); data requests are acted on as ``_poll`` does.
        (The MPI link may put the C lane's ``Path.spin`` here, which does the same.)"""
        slots = self._slots
        clock = time.perf_counter
        if self._restart:
            self._repost()
        while True:
            if (head := slots[0]).req.Test():
                self._dispatch(head, later=True)
                if self._reqs:
                    self._test_requests()
                return True
            if self._reqs and self._test_requests():
                return True
            if share is not None:
                share()
            if clock() >= until:
                return False

    async def _run(self) -> None:
        backoff = Backoff(spin=SPIN)
        clock = time.perf_counter
        ticker = Ticker.for_loop(asyncio.get_running_loop())
        try:
            while not self.stopped:
                hit = self._land()  # what _poll does, inlined: every turn runs it
                if self._reqs and self._test_requests():
                    hit = True
                if not (hit or self.sent):
                    if self.closing and self._finished():  # (asked only when idle)
                        break
                    # Backoff.delay and since_reset, inlined where they answer at once: a
                    # spinning rank runs this between every two polls.
                    now = clock()
                    if (not self._data and now >= backoff.spin_until
                            and backoff.delay(now)):
                        if await self._idle(ticker):
                            backoff.reset(clock())
                        continue
                    if now >= ticker.due:  # (it waits anyway: the parked tasks' turn)
                        ticker.poll_parked(now)
                    # (a rank that shares this core answers sooner if given it)
                    hit = self._spin(now + (DATA_BURST if self._data else SPIN_BURST),
                                     sched_yield if self.crowded else None)
                    # A wake-up may have put a rank that polls too on this core (the
                    # kernel wakes a doorbell's owner near its ringer): once an answer is
                    # slow to come, take turns with it, not time slices of milliseconds.
                    if not hit and clock() - backoff.spin_until + backoff.spin > SHARE_AFTER:
                        sched_yield()
                active = hit or self.sent
                await yield_now()  # first: a task that a landing woke runs now
                if active:  # (a send in that turn is seen: it came before this reset)
                    self.sent = False
                    now = clock()
                    backoff.spin_until = now + backoff.spin  # backoff.reset, inlined
                    backoff.tval = 0.0
                    if now >= ticker.due + BUSY_PERIOD:  # never idle: poll them now
                        ticker.poll_parked(now)
            if not self.stopped:
                await self._teardown(backoff)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(exc)
        finally:
            ticker.release()

    async def _idle(self, ticker: Ticker) -> bool:
        """Park on the idle tick until there is work (True), or for a while where there is
        no tick (False)."""
        self._woke = False
        self._parked = ticker.park(self)
        try:
            await self._parked
        finally:
            self._parked = None
            ticker.unpark(self)
        if self._error is not None:
            raise self._error
        return self._woke

    def poll_idle(self) -> bool:
        """Poll for the idle tick while parked: True to run the task (it has work, or MPI
        failed: the task raises it)."""
        try:
            self._reap()
            woke = (self.sent or self._data > 0 or self.stopped
                    or (self.closing and self._finished())
                    or self._poll())
        except Exception as exc:
            self._error = exc
            return True
        if woke:
            self._woke = True
        return woke

    async def _teardown(self, backoff: Backoff) -> None:
        # Every rank has sent its last message to this one: the control recvs can only be
        # cancelled now, and this rank's own last sends complete without anyone's help.
        self._repost()
        slots = [s.req for s in self._slots]
        for req in slots:
            req.Cancel()
        while not lib.MPI.Request.Testall(slots) or self._reqs or self._ctrl:
            if self._reqs:
                self._test_requests()
            self._reap()
            await asyncio.sleep(backoff.delay(time.perf_counter()))
        for req in slots:
            req.Free()
        self.comm.Free()
