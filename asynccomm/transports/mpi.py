"""The MPI transport: one rank per process, launched by ``mpiexec -n N python script.py``.

Matching stays in each rank's own ``Matcher`` (MPI's matching is never used for user
messages), so a program behaves exactly as it does in-process.  What travels and when is
the protocol of ``_mpi_protocol`` (eager messages inline, rendezvous with chunked data straight
into the recv buffer, withdrawal, a barrier-free close); this module runs it on mpi4py.

Progress: MPI cannot be awaited, so one task per world polls it (the control recv at the
head of the queue with ``Test``, every other request with ``Testsome``) and never blocks
the loop.  After any activity it polls back to back for a moment, then backs off to at most
1 ms between polls (``_mpi_protocol.Backoff``); while data moves it keeps polling.

Every world runs on its own duplicate of ``COMM_WORLD`` (``Idup``), freed when the world
closes, so worlds never see each other's traffic.  ``mpi4py.MPI`` is imported (and MPI
initialised) only when the first MPI world opens.  ``MPI.Exception`` becomes
``TransportError`` in one place, ``_translate``.
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from .._communicator import Communicator, Device, _check_timeout
from .._core.chunking import Chunk, ChunkSender
from .._core.descriptors import Envelope
from .._engine import DeviceEngine
from .._exceptions import CommBrokenError, CommClosedError, TransportError
from .._request import ACTIVE, DONE, POSTED, Request
from .._runner import POOL_BYTES, _check_world, default_timeout
from .._types import EAGER_LIMIT
from . import _mpi_protocol as proto
from ._mpi_protocol import CTRL_TAG, EAGER, HEADER, Backoff, decode_dtype, encode_dtype
from .base import Transport

if TYPE_CHECKING:
    from mpi4py import MPI
else:
    MPI = None  # bound by _load_mpi() when the first world opens

__all__ = ["MPITransport", "open_mpi_world", "run_mpi"]

T = TypeVar("T")

#: Control recvs kept posted; more let bursts of small messages land without MPI-level
#: unexpected-message buffering.
CTRL_SLOTS = 8
#: Rendezvous data moves in chunks of this size, ``MAX_INFLIGHT`` at a time per transfer,
#: so one MPI progress call never copies more than a chunk while the loop waits.
CHUNK_BYTES = 8 << 20
MAX_INFLIGHT = 4
#: How long a failed rank waits for its peers to close before aborting the MPI job.
ABORT_GRACE = 10.0

_HSIZE = HEADER.size


def _load_mpi() -> None:
    global MPI  # noqa: PLW0603  # lazily bound: importing this module must not start MPI
    if MPI is None:
        from mpi4py import MPI


def _translate(exc: BaseException, what: str, rank: int | None) -> TransportError:
    """The one place where a foreign (MPI) error becomes a ``TransportError``."""
    detail = exc.Get_error_string() if isinstance(exc, MPI.Exception) else repr(exc)
    where = f"rank {rank}: " if rank is not None else ""
    err = TransportError(f"{where}MPI {what} failed: {detail}", rank=rank)
    err.__cause__ = exc
    return err


@contextmanager
def _mpi_errors(what: str, rank: int | None = None) -> Iterator[None]:
    """Raise ``MPI.Exception`` in the block as ``TransportError`` (httpcore's
    ``map_exceptions``); for paths off the hot one.

    Raises:
        TransportError: an MPI call in the block failed.
    """
    try:
        yield
    except MPI.Exception as exc:
        raise _translate(exc, what, rank) from exc


class _Slot:
    """A posted control recv: its buffer and persistent MPI request."""

    __slots__ = ("buf", "payload", "req")

    def __init__(self, comm: MPI.Intracomm, nbytes: int) -> None:
        self.buf = bytearray(_HSIZE + nbytes)
        self.payload = memoryview(self.buf)[_HSIZE:]
        self.req = comm.Recv_init(self.buf, MPI.ANY_SOURCE, CTRL_TAG)


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
        self.chunks = ChunkSender(len(mv), chunk_bytes=CHUNK_BYTES, max_inflight=MAX_INFLIGHT)
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
        self._engine: DeviceEngine | None = None
        self._tag_ub = int(comm.Get_attr(MPI.TAG_UB) or 32767)
        self._next_tag = 0
        self._next_ident = 0
        self._slots: deque[_Slot] = deque()
        # Requests in flight and what to do when each completes (None: a send whose
        # buffer the request itself keeps alive).
        self._reqs: list[MPI.Request] = []
        self._cbs: list[Callable[[], None] | None] = []
        self._data = 0  # data chunks in flight: poll without backing off
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

    # -- lifetime -------------------------------------------------------------------------

    def start(self, engine: DeviceEngine) -> None:
        """Post the control recvs and start the progress task on the engine's loop.

        Raises:
            TransportError: MPI failed.
        """
        self._engine = engine
        with _mpi_errors("posting control recvs", self.rank):
            for _ in range(CTRL_SLOTS):
                slot = _Slot(self.comm, self.inline_max)
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
        backoff = Backoff()
        clock = time.perf_counter
        try:
            while not self._finished():
                if self._poll():
                    backoff.reset(clock())
                    await asyncio.sleep(0)
                elif self._data:
                    await asyncio.sleep(0)
                else:
                    await asyncio.sleep(backoff.delay(clock()))
            if self._broken is None:
                await self._teardown(backoff)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            err = (_translate(exc, "progress", self.rank) if isinstance(exc, MPI.Exception)
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
        while not MPI.Request.Testall(slots) or self._reqs:
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
        if engine is None:
            return
        engine.log.error("mpi.broken", error=str(err))
        for req in [*self._sends.values(), *(t.req for t in self._pushes),
                    *(t.req for t in self._pulls.values())]:
            if req._state < DONE:
                engine.fail(req, self._error(err))
        self._sends.clear()
        self._pushes.clear()
        self._pulls.clear()
        for req in list(engine._live):
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
        done = MPI.Request.Testsome(reqs)
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
        msg = bytearray(_HSIZE + len(payload))
        HEADER.pack_into(msg, 0, kind, len(dtype), self.rank, tag, nbytes, count, ident, dtype)
        if payload:
            msg[_HSIZE:] = payload
        req = self.comm.Isend(msg, dst, CTRL_TAG)
        if not req.Test():
            self._track(req, None)

    # -- control messages -----------------------------------------------------------------

    def _on_message(self, slot: _Slot) -> None:
        kind, dlen, src, tag, nbytes, count, ident, dfield = HEADER.unpack_from(slot.buf)
        engine = self._engine
        assert engine is not None
        if kind == EAGER:
            if not engine.closed:  # a closed rank drops what arrives, as in-process
                engine.deliver(Envelope(src, tag, nbytes, count, decode_dtype(dfield, dlen),
                                        slot))
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
        if env is not None and self._engine is not None:
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
            assert self._engine is not None
            self._pull_withdrawn(self._engine, pull)
        for req in pull.inflight.values():
            req.Cancel()  # nothing was sent on this tag, so every recv cancels

    def _on_close(self, src: int, tag: int, nbytes: int, ident: int,
                  payload: memoryview) -> None:
        reason = bytes(payload[:nbytes]).decode("utf-8", "replace")
        self._closed_by[src] = reason
        engine = self._engine
        assert engine is not None
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
            assert self._engine is not None
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
        assert engine is not None
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
                msg = bytearray(_HSIZE + n)
                dt = encode_dtype(buf.dtype)
                HEADER.pack_into(msg, 0, EAGER, len(dt), self.rank, req.tag, n, buf.count, 0,
                                 dt)
                msg[_HSIZE:] = buf.mv
                mreq = self.comm.Isend(msg, dst, CTRL_TAG)
                if not mreq.Test():
                    self._track(mreq, None)
                engine.send_done(req)
                return
            self._next_ident += 1
            ident = req.desc = self._next_ident
            self._sends[ident] = req
            self._ctrl(dst, proto.RTS, tag=req.tag, nbytes=n, count=buf.count, ident=ident,
                       dtype=encode_dtype(buf.dtype))
        except MPI.Exception as exc:
            self._sends.pop(req.desc, None)
            engine.fail(req, _translate(exc, f"send to rank {dst}", self.rank))

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
        kind = type(handle)
        if kind is _Slot or kind is _Staged:
            n = env.nbytes
            src = handle.payload if kind is _Slot else handle.buf  # type: ignore[union-attr]
            dst[:n] = src[:n]
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
        except MPI.Exception as exc:
            del self._pulls[key]
            engine.fail(req, _translate(exc, f"recv from rank {handle.source}", self.rank))

    def withdraw_send(self, engine: DeviceEngine, req: Request) -> bool:
        ident = req.desc
        if self._sends.pop(ident, None) is None:
            return False  # CTS came: data is moving
        if req.peer in self._closed_by:
            return True
        self._withdrawn[ident] = req.peer
        try:
            self._ctrl(req.peer, proto.WITHDRAW, ident=ident)
        except MPI.Exception as exc:
            self._break(_translate(exc, "withdraw", self.rank))
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
        payload = self.close_reason.encode("utf-8", "replace")[:4096]
        try:
            for dst in range(self.size):
                self._ctrl(dst, proto.CLOSE, nbytes=len(payload), payload=payload)
                if dst in self._closed_by:
                    self._send_fin(dst)
        except MPI.Exception as exc:
            self._break(_translate(exc, "close", self.rank))


# -- worlds ---------------------------------------------------------------------------------


async def _complete(req: MPI.Request) -> None:
    """Wait for an MPI request without blocking the loop (before a progress task exists)."""
    backoff = Backoff()
    backoff.reset(time.perf_counter())
    while not req.Test():
        await asyncio.sleep(backoff.delay(time.perf_counter()))


class _MPIWorld:
    """This process's rank: a private communicator, its transport, engine and
    Communicator."""

    def __init__(self, transport: MPITransport, comm: Communicator) -> None:
        self.transport = transport
        self.comm = comm

    @classmethod
    async def open(cls, *, eager_limit: int, pool_bytes: int,
                   timeout: float | None) -> _MPIWorld:
        _load_mpi()
        _check_world(1, None, "auto", eager_limit, pool_bytes)
        op_timeout = default_timeout() if timeout is None else _check_timeout(timeout)
        loop = asyncio.get_running_loop()
        with _mpi_errors("duplicating COMM_WORLD"):
            mpi_comm, req = MPI.COMM_WORLD.Idup()
            await _complete(req)
        transport = MPITransport(mpi_comm, eager_limit=eager_limit)
        rank, size = transport.rank, transport.size
        engine = DeviceEngine(rank, size, transport, loop=loop, eager_limit=eager_limit,
                              pool_bytes=pool_bytes)
        transport.start(engine)
        comm = Communicator(engine, default_timeout=op_timeout,
                            device=Device(rank, f"mpi:{rank}"))
        engine.log.info("comm.opened", transport="mpi")
        return cls(transport, comm)

    async def aclose(self, failure: BaseException | None = None) -> None:
        """Close this rank (telling peers why, if it failed) and wait until every rank of
        the world has closed."""
        if failure is not None:
            self.transport.close_reason = (f"failed with {type(failure).__name__}: {failure}"
                                           .replace("\n", " "))
        await self.comm.aclose()
        await self.transport.wait_closed()


@asynccontextmanager
async def open_mpi_world(*, eager_limit: int = EAGER_LIMIT, pool_bytes: int = POOL_BYTES,
                         timeout: float | None = None) -> AsyncIterator[Communicator]:
    """Open this process's rank of an MPI world and yield its ``Communicator``.

    Collective: every process of ``COMM_WORLD`` must open its worlds in the same order.
    The world runs on a private duplicate of ``COMM_WORLD``.  Leaving the block closes this
    rank (peers still waiting for it get ``CommBrokenError``, naming the exception if the
    block raised) and then waits until every rank has closed, as ``MPI_Comm_free`` would.

    Args:
        eager_limit, pool_bytes, timeout: as ``asynccomm.open_world``.

    Raises:
        TypeError, ValueError: bad arguments or a bad ``ASYNCCOMM_TIMEOUT``.
        TransportError: MPI failed.
    """
    world = await _MPIWorld.open(eager_limit=eager_limit, pool_bytes=pool_bytes,
                                 timeout=timeout)
    failure: BaseException | None = None
    try:
        yield world.comm
    except BaseException as exc:
        failure = exc
        raise
    finally:
        await world.aclose(failure)


def _report(rank: int, size: int, exc: BaseException, *, full: bool) -> None:
    text = "".join(traceback.format_exception(exc)) if full else f"{type(exc).__name__}: {exc}\n"
    sys.stderr.write(f"asynccomm: rank {rank} of {size} failed: {text}")
    sys.stderr.flush()


async def _run_rank(main: Callable[[Communicator], Coroutine[Any, Any, T]], grace: float,
                    options: dict[str, Any]) -> T:
    world = await _MPIWorld.open(**options)
    comm = world.comm
    try:
        result = await main(comm)
    except BaseException as exc:
        exc.add_note(f"(raised on rank {comm.rank})")
        _report(comm.rank, comm.size, exc, full=False)
        try:
            async with asyncio.timeout(grace):
                await world.aclose(exc)
        except TimeoutError:
            sys.stderr.write(f"asynccomm: rank {comm.rank}: the other ranks did not close "
                             f"within {grace:g} s; aborting the MPI job\n")
            _report(comm.rank, comm.size, exc, full=True)
            MPI.COMM_WORLD.Abort(1)
        raise
    await world.aclose()
    return result


def run_mpi(main: Callable[[Communicator], Coroutine[Any, Any, T]], world_size: int | None,
            *, loop_factory: Callable[[], asyncio.AbstractEventLoop], cluster: object,
            clock: str, abort_grace: float = ABORT_GRACE, **options: Any) -> T:
    """Run ``main(comm)`` for this process's rank on the MPI transport and return its value
    (``asynccomm.run`` calls this under ``mpiexec``).

    When ``main`` raises, the rank reports it on stderr, its peers get ``CommBrokenError``
    naming it, and the exception is raised once every rank has closed; if they have not
    within ``abort_grace`` seconds (a peer stuck elsewhere), the MPI job is aborted
    (``MPI_Abort``) so that nothing hangs.

    Args:
        main: an async function taking a Communicator.
        world_size: None, or the MPI world size (a check).
        loop_factory: makes the event loop.
        cluster: must be None (cluster models are in-process only).
        clock: ``"auto"`` or ``"wall"``.
        abort_grace: seconds a failed rank waits for its peers before aborting the job.
        options: ``eager_limit``, ``pool_bytes``, ``timeout`` (as ``open_world``).

    Raises:
        TypeError, ValueError: bad arguments, or ``world_size`` is not the MPI world size.
        TransportError: MPI failed.
        Exception: what ``main`` raised on this rank (with a note naming the rank).
    """
    if cluster is not None:
        raise ValueError("cluster models run in-process only; use cluster=None under MPI")
    if clock not in ("auto", "wall"):
        raise ValueError(f"clock must be 'auto' or 'wall' under MPI, got {clock!r}")
    if world_size is not None and (type(world_size) is not int or world_size < 1):
        raise ValueError(f"world_size must be None or an int >= 1, got {world_size!r}")
    unknown = set(options) - {"eager_limit", "pool_bytes", "timeout"}
    if unknown:
        raise TypeError(f"unexpected options for the MPI backend: {sorted(unknown)}")
    _load_mpi()
    size = MPI.COMM_WORLD.Get_size()
    if world_size is not None and world_size != size:
        raise ValueError(f"world_size={world_size} but MPI started {size} processes; pass "
                         "world_size=None (or the same number) under mpiexec")
    grace = _check_timeout(abort_grace)
    opts = {"eager_limit": EAGER_LIMIT, "pool_bytes": POOL_BYTES, "timeout": None, **options}
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(_run_rank(main, ABORT_GRACE if grace is None else grace, opts))
