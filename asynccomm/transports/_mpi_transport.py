"""The MPI transport: the shell that runs one rank's ``Wire`` (``_core/wire.py``) on mpi4py.

Matching stays in the receiving rank's own ``Matcher`` (MPI's matching is never used for
user messages), so a program behaves exactly as it does in-process.  Eager messages travel
inline with their header and are staged in the engine's pool only if no recv is waiting;
rendezvous data goes from the send buffer straight into the recv buffer, in chunks.

Progress: MPI cannot be awaited, so one task per world polls it (the control recv at the
head of the queue with ``Test``, every other request with ``Testsome``) and never blocks
the loop.  After any activity it polls back to back for a moment, then backs off to at most
1 ms between polls (``Backoff``); while data moves it keeps polling.

MPI errors become ``TransportError`` through ``_mpi_lib.translate``: at the transport's
entry points (a failed op), and in the progress task (which fails everything pending).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from .._core import wire as w
from .._core.chunking import Chunk, ChunkSender
from .._core.descriptors import Envelope
from .._core.wire import DTYPE_FIELDS, DTYPE_NAMES, EAGER, HEADER, Wire, decode_dtype, encode_dtype
from .._exceptions import CommBrokenError, TransportError
from .._request import ACTIVE, DONE, POSTED, Request
from . import _mpi_lib as lib
from ._mpi_lib import Backoff, mpi_errors, translate, yield_now
from .base import ASKED, TOO_LATE, WITHDRAWN, Transport

if TYPE_CHECKING:
    from mpi4py import MPI

    from .._engine import DeviceEngine

__all__ = ["MPITransport"]

#: The MPI tag of every control message; data tags are 1 and up.
CTRL_TAG = 0
#: Control recvs kept posted; more let bursts of small messages land without MPI-level
#: unexpected-message buffering.
CTRL_SLOTS = 8
#: Rendezvous data moves in chunks of this size, ``MAX_INFLIGHT`` at a time per transfer,
#: so MPI's progress calls copy a bounded amount each while the loop waits for them.
CHUNK_BYTES = 16 << 20
MAX_INFLIGHT = 2
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

_HSIZE = HEADER.size
#: Eager payloads up to this size are packed with one concatenation (cheapest for small
#: ones); larger ones are copied once into a preallocated message.
_CONCAT_MAX = 1024


class _Slot:
    """A posted control recv: its buffer and persistent MPI request."""

    __slots__ = ("buf", "payload", "req")

    def __init__(self, comm: MPI.Intracomm, nbytes: int) -> None:
        self.buf = bytearray(_HSIZE + nbytes)
        self.payload = memoryview(self.buf)[_HSIZE:]
        self.req = comm.Recv_init(self.buf, lib.MPI.ANY_SOURCE, CTRL_TAG)


class _Staged:
    """``Envelope.handle`` of an unexpected eager payload, staged in the pool (``pooled``)
    or, if the pool refused it, in a private buffer (still within the sender's credit)."""

    __slots__ = ("buf", "pooled")

    def __init__(self, buf: memoryview | bytes, pooled: bool) -> None:
        self.buf = buf
        self.pooled = pooled


class _Remote:
    """``Envelope.handle`` of a rendezvous message whose payload is still at its sender."""

    __slots__ = ("ident", "source")

    def __init__(self, source: int, ident: int) -> None:
        self.source = source
        self.ident = ident


class _OneChunk:
    """``ChunkSender``'s interface for a transfer of a single chunk (most of them), at a
    fraction of its cost."""

    __slots__ = ("done", "handed_out", "nbytes")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.handed_out = False
        self.done = False

    def next_chunk(self) -> Chunk | None:
        if self.handed_out:
            return None
        self.handed_out = True
        return Chunk(0, 0, self.nbytes)

    def chunk_done(self, chunk: Chunk) -> None:
        self.done = True


class _Transfer:
    """One side of a rendezvous data transfer: its chunks and their MPI requests."""

    __slots__ = ("chunks", "env", "ident", "inflight", "mv", "peer", "req", "tag")

    def __init__(self, req: Request, peer: int, ident: int, tag: int, mv: memoryview,
                 env: Envelope | None) -> None:
        self.req = req
        self.peer = peer
        self.ident = ident
        self.tag = tag
        self.mv = mv
        self.env = env
        nbytes = len(mv)
        self.chunks = (_OneChunk(nbytes) if nbytes <= CHUNK_BYTES else
                       ChunkSender(nbytes, chunk_bytes=CHUNK_BYTES, max_inflight=MAX_INFLIGHT))
        self.inflight: dict[int, MPI.Request] = {}


class MPITransport(Transport):
    """Runs one rank's side of the wire protocol on a private communicator (see module
    docs).  Created by ``open_mpi_world``; it owns its progress task.

    Args:
        comm: the world's private communicator.
        eager_limit: this rank's eager limit (at most ``wire.INLINE_MAX`` travels inline).
        pools: every rank's staging cap, in rank order: each grants every rank an equal
            share of it as eager credit.
    """

    def __init__(self, comm: MPI.Intracomm, *, eager_limit: int, pools: list[int]) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.wire = Wire(self.rank, self.size, inline_max=eager_limit,
                         credits=[p // self.size for p in pools],
                         grant=pools[self.rank] // self.size)
        self.wire.data_tag_ub = int(comm.Get_attr(lib.MPI.TAG_UB) or 32767)
        self.close_reason = "has closed its communicator"
        self._engine: DeviceEngine  # set by start()
        self._slots: deque[_Slot] = deque()
        # Requests in flight and what to do when each completes (None: a send whose
        # buffer the request itself keeps alive).
        self._reqs: list[MPI.Request] = []
        self._testsome = lib.MPI.Request.Testsome
        self._cbs: list[Callable[[], None] | None] = []
        self._data = 0  # data chunks in flight: poll without backing off
        self._sent = False  # this rank sent something: an answer may follow, spin
        self._sends: dict[int, Request] = {}  # announced sends, until CTS or WITHDRAWN
        self._withdraw_exc: dict[int, BaseException | None] = {}  # why each is withdrawn
        self._announced: dict[tuple[int, int], Envelope] = {}  # RTS not matched yet
        self._pulls: dict[tuple[int, int], _Transfer] = {}
        self._pushes: set[_Transfer] = set()
        self._broken: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def broken(self) -> BaseException | None:
        """The MPI failure that broke this transport, if one did (it then stops, and the
        world cannot close cleanly)."""
        return self._broken

    # -- lifetime -------------------------------------------------------------------------

    def start(self, engine: DeviceEngine) -> None:
        """Post the control recvs and start the progress task on the engine's loop.

        Raises:
            TransportError: MPI failed.
        """
        self._engine = engine
        with mpi_errors("posting control recvs", self.rank):
            for _ in range(CTRL_SLOTS):
                # Sized for any rank's inline messages, whatever its own eager limit.
                slot = _Slot(self.comm, w.INLINE_MAX)
                slot.req.Start()
                self._slots.append(slot)
        self._task = engine.loop.create_task(self._progress(),
                                             name=f"asynccomm-mpi-progress-{self.rank}")

    async def wait_closed(self) -> None:
        """Wait until every rank has closed (``FIN`` both ways), then free the communicator.
        If this wait is cancelled the progress task is cancelled too and the communicator
        is left as it is (not freed)."""
        task = self._task
        if task is None:
            return
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            raise

    async def _progress(self) -> None:
        backoff = Backoff(spin=SPIN)
        clock = time.perf_counter
        try:
            while not self._finished():
                hit = self._poll()
                if not (hit or self._sent):
                    delay = 0.0 if self._data else backoff.delay(clock())
                    if delay:
                        await asyncio.sleep(delay)
                        continue
                    until = clock() + (DATA_BURST if self._data else SPIN_BURST)
                    while not (hit := self._poll()) and clock() < until:
                        pass
                if hit or self._sent:
                    self._sent = False
                    backoff.reset(clock())
                await yield_now()
            if self._broken is None:
                await self._teardown(backoff)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            err = (translate(exc, "progress", self.rank) if isinstance(exc, lib.MPI.Exception)
                   else TransportError(f"rank {self.rank}: the MPI transport failed: {exc!r}",
                                       rank=self.rank))
            err.__cause__ = exc
            self._break(err)

    def _finished(self) -> bool:
        return self._broken is not None or self.wire.finished

    async def _teardown(self, backoff: Backoff) -> None:
        # Every rank has sent its last message to this one: the control recvs can only be
        # cancelled now, and this rank's own last sends complete without anyone's help.
        slots = [s.req for s in self._slots]
        for req in slots:
            req.Cancel()
        while not lib.MPI.Request.Testall(slots) or self._reqs:
            if self._reqs:
                self._test_requests()
            await asyncio.sleep(backoff.delay(time.perf_counter()))
        for req in slots:
            req.Free()
        self.comm.Free()

    def _break(self, err: TransportError) -> None:
        """MPI failed underneath: fail everything pending on this rank with ``err``."""
        self._broken = err
        engine = self._engine
        engine.log.error("mpi.broken", error=str(err))
        for req in [*self._sends.values(), *(t.req for t in self._pushes),
                    *(t.req for t in self._pulls.values())]:
            if req._state < DONE:
                engine.fail(req, self._error(err))
        self._sends.clear()
        self._withdraw_exc.clear()
        self._pushes.clear()
        self._pulls.clear()
        for req in engine.live_requests():
            if req._state == POSTED and req.kind != "send":
                engine.withdraw(req, self._error(err))

    def _error(self, err: BaseException) -> TransportError:
        fresh = TransportError(str(err), rank=self.rank)
        fresh.__cause__ = err.__cause__
        return fresh

    # -- polling --------------------------------------------------------------------------

    def _poll(self) -> bool:
        """Test what is in flight and act on what completed; True if anything did."""
        slots = self._slots
        head = slots[0]
        hit = False
        while head.req.Test():
            hit = True
            self._on_message(head)
            head.req.Start()
            slots.rotate(-1)
            head = slots[0]
        if self._reqs and self._test_requests():
            hit = True
        return hit

    def _test_requests(self) -> bool:
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

    def _track(self, req: MPI.Request, cb: Callable[[], None] | None) -> None:
        self._reqs.append(req)
        self._cbs.append(cb)

    def _send(self, dest: int, msg: bytes | bytearray) -> None:
        req = self.comm.Isend(msg, dest, CTRL_TAG)
        if not req.Test():
            self._track(req, None)
        self._sent = True

    def _send_all(self, out: list[tuple[int, bytes]]) -> None:
        for dest, msg in out:
            self._send(dest, msg)

    # -- control messages -----------------------------------------------------------------

    def _on_message(self, slot: _Slot) -> None:
        kind, dlen, src, tag, nbytes, count, ident, dfield = HEADER.unpack_from(slot.buf)
        engine = self._engine
        if kind == EAGER:  # the hot path, outside the wire
            if engine.closed:  # a closed rank drops what arrives, as in-process
                return
            dtype = DTYPE_NAMES.get(dfield) or decode_dtype(dfield, dlen)
            engine.deliver(Envelope(src, tag, nbytes, count, dtype, slot))
            return
        dtype = decode_dtype(dfield, dlen) if kind == w.RTS else ""
        payload = bytes(slot.payload[:nbytes]) if kind == w.CLOSE else b""
        event, out = self.wire.receive(kind, src, tag, nbytes, count, ident, dtype, payload)
        self._send_all(out)
        match event:
            case w.Announced(source, tag, nbytes, count, dtype, ident):
                if not engine.closed:
                    env = Envelope(source, tag, nbytes, count, dtype, _Remote(source, ident))
                    self._announced[(source, ident)] = env
                    engine.deliver(env)
            case w.ClearToSend(dest, ident, data_tag):
                self._withdraw_exc.pop(ident, None)  # a withdrawal under way lost
                req = self._sends.pop(ident)
                req._state = ACTIVE
                push = _Transfer(req, dest, ident, data_tag, req.buf.mv, None)  # type: ignore[union-attr]
                self._pushes.add(push)
                self._push_more(push)
            case w.WithdrawRequested(source, ident):
                dropped = self._announced.pop((source, ident), None)
                if dropped is not None:
                    engine.matcher.withdraw(dropped)
            case w.WithdrawAnswered(dest, ident):
                self._withdrawn(ident)
            case w.PeerClosed(source, reason, announced, withdrawing):
                self._on_peer_closed(source, reason, announced, withdrawing)
            case _:
                pass

    def _withdrawn(self, ident: int) -> None:
        req = self._sends.pop(ident)
        self._engine.withdrawn(req, self._withdraw_exc.pop(ident))

    def _on_peer_closed(self, source: int, reason: str, announced: tuple[int, ...],
                        withdrawing: tuple[int, ...]) -> None:
        engine = self._engine
        engine.log.info("mpi.peer_closed", peer=source, reason=reason)
        exc = self._broken_error(source)
        for ident in announced:  # never matched: it never will be
            engine.fail(self._sends.pop(ident), exc)
        for ident in withdrawing:  # dropped unmatched by the closing rank
            self._withdrawn(ident)
        if not engine.closed:
            engine.peer_gone(source, exc)

    def _broken_error(self, peer: int) -> CommBrokenError:
        reason = self.wire.closed_by.get(peer, "has closed its communicator")
        return CommBrokenError(f"rank {peer} {reason}", rank=self.rank, peer=peer)

    # -- rendezvous data ------------------------------------------------------------------

    def _push_more(self, push: _Transfer) -> None:
        comm, mv = self.comm, push.mv
        while (chunk := push.chunks.next_chunk()) is not None:
            end = chunk.offset + chunk.nbytes
            req = comm.Isend(mv[chunk.offset:end], push.peer, push.tag)
            push.inflight[chunk.index] = req
            self._data += 1
            self._track(req, partial(self._pushed, push, chunk))

    def _pushed(self, push: _Transfer, chunk: Chunk) -> None:
        self._data -= 1
        del push.inflight[chunk.index]
        push.chunks.chunk_done(chunk)
        if push.chunks.done:
            self._pushes.discard(push)
            self._engine.send_done(push.req)
        else:
            self._push_more(push)

    def _pull_more(self, pull: _Transfer) -> None:
        comm, mv = self.comm, pull.mv
        while (chunk := pull.chunks.next_chunk()) is not None:
            end = chunk.offset + chunk.nbytes
            req = comm.Irecv(mv[chunk.offset:end], pull.peer, pull.tag)
            pull.inflight[chunk.index] = req
            self._data += 1
            self._track(req, partial(self._pulled, pull, chunk))

    def _pulled(self, pull: _Transfer, chunk: Chunk) -> None:
        self._data -= 1
        del pull.inflight[chunk.index]
        pull.chunks.chunk_done(chunk)
        if pull.chunks.done:
            del self._pulls[(pull.peer, pull.ident)]
            assert pull.env is not None
            self._engine.recv_done(pull.req, pull.env)
        else:
            self._pull_more(pull)

    # -- the Transport interface ----------------------------------------------------------

    def post_send(self, engine: DeviceEngine, req: Request) -> None:
        dst = req.peer
        wire = self.wire
        if dst in wire.closed_by or self._broken is not None:
            engine.fail(req, self._error(self._broken) if self._broken is not None
                        else self._broken_error(dst))
            return
        buf = req.buf
        assert buf is not None
        n = buf.nbytes
        try:
            dt = DTYPE_FIELDS.get(buf.dtype) or encode_dtype(buf.dtype)
            if wire.eager(dst, n):
                msg: bytes | bytearray
                if n <= _CONCAT_MAX:
                    msg = wire.pack_eager(req.tag, n, buf.count, dt) + buf.mv.tobytes()
                else:
                    msg = bytearray(_HSIZE + n)
                    HEADER.pack_into(msg, 0, EAGER, len(dt), self.rank, req.tag, n, buf.count,
                                     0, dt)
                    msg[_HSIZE:] = buf.mv
                self._send(dst, msg)
                engine.send_done(req)
                return
            ident, msg = wire.announce(dst, req.tag, n, buf.count, dt)
            req.desc = ident
            self._sends[ident] = req
            self._send(dst, msg)
        except lib.MPI.Exception as exc:
            if self._sends.pop(req.desc, None) is not None:
                wire.unsent(req.desc)
            engine.fail(req, translate(exc, f"send to rank {dst}", self.rank))

    def unexpected(self, engine: DeviceEngine, env: Envelope) -> None:
        slot = env.handle
        if type(slot) is not _Slot:
            return
        n = env.nbytes
        staged = engine.pool.acquire(n)
        if staged is None:  # within the sender's credit, so bounded all the same
            env.handle = _Staged(bytes(slot.payload[:n]), False)
        else:
            staged[:n] = slot.payload[:n]
            env.handle = _Staged(staged, True)

    def pull(self, engine: DeviceEngine, env: Envelope, req: Request, dst: memoryview) -> None:
        handle = env.handle
        n = env.nbytes
        if type(handle) is _Slot:  # eager, and the recv was waiting: one copy
            dst[:n] = handle.payload[:n]
            self._consumed(env)
            engine.recv_done(req, env)
            return
        if type(handle) is _Staged:
            dst[:n] = handle.buf[:n]
            self._consumed(env)
            engine.recv_done(req, env)
            return
        assert isinstance(handle, _Remote)
        key = (handle.source, handle.ident)
        self._announced.pop(key, None)
        tag, cts = self.wire.clear_to_send(handle.source, handle.ident)
        pull = _Transfer(req, handle.source, handle.ident, tag, dst[:n], env)
        self._pulls[key] = pull
        try:
            # Recvs first, so the data never lands as an MPI-level unexpected message.
            self._pull_more(pull)
            self._send(handle.source, cts)
        except lib.MPI.Exception as exc:
            del self._pulls[key]
            engine.fail(req, translate(exc, f"recv from rank {handle.source}", self.rank))

    def _consumed(self, env: Envelope) -> None:
        """An eager message left staging: release its buffer, owe its credit back."""
        handle = env.handle
        if type(handle) is _Staged and handle.pooled:
            self._engine.pool.release(handle.buf)  # type: ignore[arg-type]
        credit = self.wire.consumed(env.source, env.nbytes)
        if credit is not None:
            self._send(env.source, credit)

    def discard(self, engine: DeviceEngine, env: Envelope) -> None:
        if type(env.handle) is _Staged:
            self._consumed(env)

    def withdraw_send(self, engine: DeviceEngine, req: Request, exc: BaseException | None,
                      ask: bool) -> int:
        ident = req.desc
        verdict, msg = self.wire.withdraw(ident, ask=ask)
        if verdict == w.TOO_LATE:
            return TOO_LATE
        if verdict == w.GONE:
            del self._sends[ident]
            return WITHDRAWN
        self._withdraw_exc[ident] = exc
        try:
            assert msg is not None
            self._send(req.peer, msg)
        except lib.MPI.Exception as err:
            self._break(translate(err, "withdraw", self.rank))
        return ASKED

    def describe_peer(self, engine: DeviceEngine, peer: int) -> list[str]:
        closed_by = self.wire.closed_by
        if peer in closed_by:
            return [f"nothing more: it {closed_by[peer]}"]
        if any(e.source == peer for e in engine.matcher.unexpected()):
            return []  # the engine lists them
        return [f"no message rank {self.rank} can see yet (its recvs live in its own process)"]

    def engine_closed(self, engine: DeviceEngine) -> None:
        if self._broken is not None:
            return
        self._announced.clear()
        try:
            self._send_all(self.wire.close(self.close_reason))
        except lib.MPI.Exception as exc:
            self._break(translate(exc, "close", self.rank))
