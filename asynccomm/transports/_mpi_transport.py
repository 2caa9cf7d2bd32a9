"""The MPI transport: one rank's side of the ``_mpi_protocol`` protocol, on mpi4py.

Matching stays in the receiving rank's own ``Matcher`` (MPI's matching is never used for
user messages), so a program behaves exactly as it does in-process.  Eager messages travel
inline with their header and are staged in the engine's pool only if no recv is waiting;
rendezvous data goes from the send buffer straight into the recv buffer, in chunks.

Progress: MPI cannot be awaited, so one task per world polls it (the control recv at the
head of the queue with ``Test``, every other request with ``Testsome``) and never blocks
the loop.  After any activity it polls back to back for a moment, then backs off to at most
1 ms between polls (``_mpi_protocol.Backoff``); while data moves it keeps polling.

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

from .._core.chunking import Chunk, ChunkSender
from .._core.descriptors import Envelope
from .._exceptions import CommBrokenError, CommClosedError, TransportError
from .._request import ACTIVE, DONE, POSTED, Request
from . import _mpi_lib as lib
from . import _mpi_protocol as proto
from ._mpi_lib import mpi_errors, translate, yield_now
from ._mpi_protocol import (
    CTRL_TAG,
    DTYPE_FIELDS,
    DTYPE_NAMES,
    EAGER,
    HEADER,
    Backoff,
    decode_dtype,
    encode_dtype,
)
from .base import Transport

if TYPE_CHECKING:
    from mpi4py import MPI

    from .._engine import DeviceEngine

__all__ = ["MPITransport"]

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
    """An unexpected eager payload held outside the staging pool (the pool was full), so
    the engine never releases it into the pool."""

    __slots__ = ("buf",)

    def __init__(self, buf: bytes) -> None:
        self.buf = buf


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

    __slots__ = ("chunks", "env", "gone", "ident", "inflight", "mv", "peer", "req", "tag")

    def __init__(self, req: Request, peer: int, ident: int, tag: int, mv: memoryview,
                 env: Envelope | None) -> None:
        self.req = req
        self.peer = peer
        self.ident = ident
        self.tag = tag
        self.mv = mv
        self.env = env
        self.gone = False
        nbytes = len(mv)
        self.chunks = (_OneChunk(nbytes) if nbytes <= CHUNK_BYTES else
                       ChunkSender(nbytes, chunk_bytes=CHUNK_BYTES, max_inflight=MAX_INFLIGHT))
        self.inflight: dict[int, MPI.Request] = {}


class MPITransport(Transport):
    """Runs one rank's side of the MPI protocol on a private communicator (see module
    docs).  Created by ``open_mpi_world``; it owns its progress task."""

    def __init__(self, comm: MPI.Intracomm, *, eager_limit: int) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.inline_max = min(eager_limit, proto.INLINE_MAX)
        self.close_reason = "has closed its communicator"
        self._engine: DeviceEngine  # set by start()
        self._tag_ub = int(comm.Get_attr(lib.MPI.TAG_UB) or 32767)
        self._next_tag = 0
        self._next_ident = 0
        self._slots: deque[_Slot] = deque()
        # Requests in flight and what to do when each completes (None: a send whose
        # buffer the request itself keeps alive).
        self._reqs: list[MPI.Request] = []
        self._testsome = lib.MPI.Request.Testsome
        self._cbs: list[Callable[[], None] | None] = []
        self._data = 0  # data chunks in flight: poll without backing off
        self._sent = False  # this rank sent something: an answer may follow, spin
        self._sends: dict[int, Request] = {}  # rendezvous sends waiting for CTS
        self._withdrawn: dict[int, int] = {}  # withdrawn message id -> peer, until ACK
        self._announced: dict[tuple[int, int], Envelope] = {}  # RTS not pulled yet
        self._pulls: dict[tuple[int, int], _Transfer] = {}
        self._pushes: set[_Transfer] = set()
        self._closed_by: dict[int, str] = {}  # peer -> the reason it gave
        self._close_sent = False
        self._fin_sent: set[int] = set()
        self._fin_from: set[int] = set()
        self._broken: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._handlers: dict[int, Callable[[int, int, int, int, memoryview], None]] = {
            proto.CTS: self._on_cts,
            proto.WITHDRAW: self._on_withdraw, proto.ACK: self._on_ack,
            proto.GONE: self._on_gone, proto.CLOSE: self._on_close, proto.FIN: self._on_fin,
        }

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
                slot = _Slot(self.comm, proto.INLINE_MAX)
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
        return self._broken is not None or (self._close_sent and len(self._fin_from) == self.size
                                            and len(self._fin_sent) == self.size)

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

    def _ctrl(self, dst: int, kind: int, *, tag: int = 0, nbytes: int = 0, count: int = 0,
              ident: int = 0, dtype: bytes = b"", payload: bytes = b"") -> None:
        msg = HEADER.pack(kind, len(dtype), self.rank, tag, nbytes, count, ident, dtype)
        if payload:
            msg += payload
        req = self.comm.Isend(msg, dst, CTRL_TAG)
        if not req.Test():
            self._track(req, None)
        self._sent = True

    # -- control messages -----------------------------------------------------------------

    def _on_message(self, slot: _Slot) -> None:
        kind, dlen, src, tag, nbytes, count, ident, dfield = HEADER.unpack_from(slot.buf)
        engine = self._engine
        if kind == EAGER:
            if not engine.closed:  # a closed rank drops what arrives, as in-process
                dtype = DTYPE_NAMES.get(dfield) or decode_dtype(dfield, dlen)
                engine.deliver(Envelope(src, tag, nbytes, count, dtype, slot))
        elif kind == proto.RTS:
            if not engine.closed:
                env = Envelope(src, tag, nbytes, count, decode_dtype(dfield, dlen),
                               _Remote(src, ident))
                self._announced[(src, ident)] = env
                engine.deliver(env)
        else:
            self._handlers[kind](src, tag, nbytes, ident, slot.payload)

    def _on_cts(self, src: int, tag: int, nbytes: int, ident: int, payload: memoryview) -> None:
        req = self._sends.pop(ident, None)
        if req is None:
            if ident in self._withdrawn:  # crossed our WITHDRAW: the receiver re-posts
                self._ctrl(src, proto.GONE, ident=ident)
            return
        req._state = ACTIVE
        push = _Transfer(req, src, ident, tag, req.buf.mv, None)  # type: ignore[union-attr]
        self._pushes.add(push)
        self._push_more(push)

    def _on_withdraw(self, src: int, tag: int, nbytes: int, ident: int,
                     payload: memoryview) -> None:
        env = self._announced.pop((src, ident), None)
        if env is not None:
            self._engine.matcher.withdraw(env)
        self._ctrl(src, proto.ACK, ident=ident)

    def _on_ack(self, src: int, tag: int, nbytes: int, ident: int, payload: memoryview) -> None:
        self._withdrawn.pop(ident, None)

    def _on_gone(self, src: int, tag: int, nbytes: int, ident: int, payload: memoryview) -> None:
        pull = self._pulls.get((src, ident))
        if pull is None:
            return
        pull.gone = True
        if not pull.inflight:
            self._pull_withdrawn(self._engine, pull)
        for req in pull.inflight.values():
            req.Cancel()  # nothing was sent on this tag, so every recv cancels

    def _on_close(self, src: int, tag: int, nbytes: int, ident: int,
                  payload: memoryview) -> None:
        reason = bytes(payload[:nbytes]).decode("utf-8", "replace")
        self._closed_by[src] = reason
        engine = self._engine
        if src != self.rank:
            engine.log.info("mpi.peer_closed", peer=src, reason=reason)
            exc = self._broken_error(src)
            for key, req in list(self._sends.items()):
                if req.peer == src:  # never pulled: it will never be
                    del self._sends[key]
                    engine.fail(req, exc)
            if not engine.closed:
                engine.peer_gone(src, exc)
        if self._close_sent:
            self._send_fin(src)

    def _on_fin(self, src: int, tag: int, nbytes: int, ident: int, payload: memoryview) -> None:
        self._fin_from.add(src)
        for key, peer in list(self._withdrawn.items()):
            if peer == src:
                del self._withdrawn[key]

    def _send_fin(self, dst: int) -> None:
        self._ctrl(dst, proto.FIN)
        self._fin_sent.add(dst)

    def _broken_error(self, peer: int) -> CommBrokenError:
        reason = self._closed_by.get(peer, "has closed its communicator")
        return CommBrokenError(f"rank {peer} {reason}", rank=self.rank, peer=peer)

    # -- rendezvous data ------------------------------------------------------------------

    def _data_tag(self) -> int:
        self._next_tag = self._next_tag % self._tag_ub + 1  # 1..TAG_UB; 0 is CTRL_TAG
        return self._next_tag

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
        engine = self._engine
        if pull.gone:
            if not pull.inflight:
                self._pull_withdrawn(engine, pull)
            return
        pull.chunks.chunk_done(chunk)
        if pull.chunks.done:
            del self._pulls[(pull.peer, pull.ident)]
            assert pull.env is not None
            engine.recv_done(pull.req, pull.env)
        else:
            self._pull_more(pull)

    def _pull_withdrawn(self, engine: DeviceEngine, pull: _Transfer) -> None:
        """The sender withdrew a message we had matched: re-post the recv in its place."""
        del self._pulls[(pull.peer, pull.ident)]
        if engine.closed:
            engine.fail(pull.req, CommClosedError(
                f"rank {self.rank}'s communicator was closed with the op pending",
                rank=self.rank))
            return
        engine.unmatch(pull.req)
        if pull.peer in self._closed_by:
            engine.peer_gone(pull.peer, self._broken_error(pull.peer))

    # -- the Transport interface ----------------------------------------------------------

    def post_send(self, engine: DeviceEngine, req: Request) -> None:
        dst = req.peer
        if dst in self._closed_by or self._broken is not None:
            engine.fail(req, self._error(self._broken) if self._broken is not None
                        else self._broken_error(dst))
            return
        buf = req.buf
        assert buf is not None
        n = buf.nbytes
        try:
            if n <= self.inline_max:
                dt = DTYPE_FIELDS.get(buf.dtype) or encode_dtype(buf.dtype)
                msg: bytes | bytearray
                if n <= _CONCAT_MAX:
                    msg = HEADER.pack(EAGER, len(dt), self.rank, req.tag, n, buf.count, 0,
                                      dt) + buf.mv.tobytes()
                else:
                    msg = bytearray(_HSIZE + n)
                    HEADER.pack_into(msg, 0, EAGER, len(dt), self.rank, req.tag, n, buf.count,
                                     0, dt)
                    msg[_HSIZE:] = buf.mv
                mreq = self.comm.Isend(msg, dst, CTRL_TAG)
                if not mreq.Test():
                    self._track(mreq, None)
                self._sent = True
                engine.send_done(req)
                return
            self._next_ident += 1
            ident = req.desc = self._next_ident
            self._sends[ident] = req
            self._ctrl(dst, proto.RTS, tag=req.tag, nbytes=n, count=buf.count, ident=ident,
                       dtype=encode_dtype(buf.dtype))
        except lib.MPI.Exception as exc:
            self._sends.pop(req.desc, None)
            engine.fail(req, translate(exc, f"send to rank {dst}", self.rank))

    def unexpected(self, engine: DeviceEngine, env: Envelope) -> None:
        slot = env.handle
        if type(slot) is not _Slot:
            return
        n = env.nbytes
        staged = engine.pool.acquire(n)
        if staged is None:  # pool full; the sender has completed, so keep it privately
            env.handle = _Staged(bytes(slot.payload[:n]))
        else:
            staged[:n] = slot.payload[:n]
            env.handle = staged

    def pull(self, engine: DeviceEngine, env: Envelope, req: Request, dst: memoryview) -> None:
        handle = env.handle
        if type(handle) is _Slot:  # eager, and the recv was waiting: one copy
            n = env.nbytes
            dst[:n] = handle.payload[:n]
            engine.recv_done(req, env)
            return
        if type(handle) is _Staged:
            n = env.nbytes
            dst[:n] = handle.buf[:n]
            engine.recv_done(req, env)
            return
        assert isinstance(handle, _Remote)
        key = (handle.source, handle.ident)
        self._announced.pop(key, None)
        pull = _Transfer(req, handle.source, handle.ident, self._data_tag(), dst[:env.nbytes],
                         env)
        self._pulls[key] = pull
        try:
            # Recvs first, so the data never lands as an MPI-level unexpected message.
            self._pull_more(pull)
            self._ctrl(handle.source, proto.CTS, tag=pull.tag, ident=handle.ident)
        except lib.MPI.Exception as exc:
            del self._pulls[key]
            engine.fail(req, translate(exc, f"recv from rank {handle.source}", self.rank))

    def withdraw_send(self, engine: DeviceEngine, req: Request) -> bool:
        ident = req.desc
        if self._sends.pop(ident, None) is None:
            return False  # CTS came: data is moving
        if req.peer in self._closed_by:
            return True
        self._withdrawn[ident] = req.peer
        try:
            self._ctrl(req.peer, proto.WITHDRAW, ident=ident)
        except lib.MPI.Exception as exc:
            self._break(translate(exc, "withdraw", self.rank))
        return True

    def describe_peer(self, engine: DeviceEngine, peer: int) -> list[str]:
        if peer in self._closed_by:
            return [f"nothing more: it {self._closed_by[peer]}"]
        if any(e.source == peer for e in engine.matcher.unexpected()):
            return []  # the engine lists them
        return [f"no message rank {self.rank} can see yet (its recvs live in its own process)"]

    def engine_closed(self, engine: DeviceEngine) -> None:
        if self._broken is not None:
            return
        self._close_sent = True
        self._announced.clear()
        payload = self.close_reason.encode("utf-8", "replace")[:proto.INLINE_MAX]
        try:
            for dst in range(self.size):
                self._ctrl(dst, proto.CLOSE, nbytes=len(payload), payload=payload)
                if dst in self._closed_by:
                    self._send_fin(dst)
        except lib.MPI.Exception as exc:
            self._break(translate(exc, "close", self.rank))
