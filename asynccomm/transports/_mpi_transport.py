"""The MPI link: one rank's side of the wire protocol (``_core/wire.py``) on mpi4py.

Matching stays in the receiving rank's own ``Matcher`` (MPI's matching is never used for
user messages), so a program behaves exactly as it does in-process.  Eager messages travel
inline with their header (``INLINE``: the engine consumes or stages them as they land);
rendezvous ones are announced (``REMOTE``) and their data goes from the send buffer
straight into the recv buffer, in chunks, on a data tag the receiver picks; or, up to
``EARLY_MAX`` bytes, in one data send posted right behind the announcement, on a tag the
sender picks (``wire``'s early announcements: MPI's own rendezvous holds the data until
the receiver, matching it, posts the data recv, and the ``CTS`` only settles the send).
Polling and data movement are ``_mpi_progress``'s; this module turns the wire's events
into the endpoint's.

MPI errors become ``TransportError`` through ``_mpi_lib.translate``: at the link's entry
points (a failed op), and in the progress task (which fails everything pending).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._core import wire as w
from .._core.descriptors import INLINE, REMOTE, STAGED, Message
from .._core.states import ACTIVE
from .._core.wire import (
    DTYPE_FIELDS,
    DTYPE_NAMES,
    EAGER,
    HEADER,
    INLINE_MAX,
    Wire,
    data_tag_of,
    decode_dtype,
    encode_dtype,
    split_shape,
    with_shape,
)
from .._exceptions import CommBrokenError, TransportError
from . import _mpi_lib as lib
from ._mpi_chunks import CHUNK_BYTES, MAX_INFLIGHT
from ._mpi_lib import mpi_errors, translate
from ._mpi_progress import CTRL_SLOTS, Progress, Slot
from .base import ASKED, CLOSED, TOO_LATE, WITHDRAWN, Endpoint, Link, Ready, gone_error

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["EARLY_MAX", "MPITransport", "OfferBytes", "deliver"]

#: Rendezvous messages above ``INLINE_MAX`` and up to this size post their data send
#: right behind the ``RTS`` (see module docs): the data moves as soon as the receiver has
#: matched, not a ``CTS`` landing and a data send later, and MPICH (5.0, shared memory)
#: finds the transfer already announced when the data recv is posted.  A 1 MiB message
#: streamed with a 1-byte ack (2 ranks on one host; the medians of 7 runs, each the
#: median of 380 messages, timed at the link's MPI calls, alternating with the ``CTS``
#: first protocol): its data started moving 6.6 us after the ``RTS`` left instead of
#: 7.4, was in after 93.0 us instead of 96.7, and the ack was back after 107.4 us instead
#: of 111.9 (raw mpi4py's message and ack: ~85 us).  Smaller rendezvous messages are those
#: of a sender out of credit (MPI would send them eagerly, staging them unbounded).
#: Up to ``CHUNK_BYTES`` (one data send): larger ones keep the ``CTS`` first, their data
#: moving in chunks.  Withdrawing an early message costs its receiver a scratch buffer of
#: its size (16 MiB at most).
EARLY_MAX = CHUNK_BYTES

#: The largest control message (header included) the C lane sends by its own ``MPI_Isend``
#: (``accelerate``); larger ones (eager messages of more than 4 KiB) go through mpi4py's.
#: One-way latency (half a ping-pong, 2 ranks, MPICH 5.0 on one host, against the asyncio
#: floor of the same run; one run each), direct against mpi4py's: 8 B 1.54x vs 1.72x, 1-4 KiB
#: 1.60-1.62x vs 1.80-1.91x; but 8 KiB 2.25x vs 1.86x and 16 KiB 2.22x vs 1.81x, and
#: 64 KiB ~2.7x vs ~1.9x (the turn is between 4 and 8 KiB, inside MPICH; why, is not known).
DIRECT_MAX = HEADER.size + 4096

#: What ``MPITransport.offer_bytes`` is.
OfferBytes = Callable[[Any, int, int, memoryview, int, int, str], bool]


def _direct_calls(lane: Any) -> bool:
    """Whether the C lane calls MPI directly (of mpi4py's MPI, not of a test's stand-in)."""
    return lib.real_mpi() and _took_calls(lane)


@functools.cache
def _took_calls(lane: Any) -> bool:
    """``lane.mpi_calls``, asked once a process."""
    calls = lib.direct_calls()
    return calls is not None and bool(lane.mpi_calls(*calls))


def deliver(endpoint: Any, source: int, tag: int, view: memoryview, nbytes: int, count: int,
             dtype: str) -> bool:
    """No recv takes a message as it lands: it is delivered as a ``Message``."""
    return False


class MPITransport(Link):
    """Runs one rank's side of the wire protocol on a private communicator (see module
    docs).  Created by ``open_mpi_world``; it owns its progress task.

    Args:
        comm: the world's private communicator.
        eager_limit: this rank's eager limit (at most ``wire.INLINE_MAX`` travels inline).
        pools: every rank's staging cap, in rank order: each grants every rank an equal
            share of it as eager credit.
    """

    remote = True
    #: Fault tolerance's side of this link (``_comm/agreement.py`` sets it on the links of
    #: communicators that support it): ``message(source, payload)`` for each ``FT`` message,
    #: ``closed(source)`` after a peer closed or died.
    ft: Any = None
    #: Rendezvous payloads of more than ``early_min`` and at most ``early_max`` bytes are
    #: sent early (see module docs).
    early_min = INLINE_MAX
    early_max = EARLY_MAX
    #: The C lane calls MPI itself for the control messages (``accelerate``).
    direct = False
    #: The ranks this link reaches another way (the hybrid link's: this host's rings);
    #: their sends and fetches keep the Python steps where the C lane runs the rest
    #: (``accelerate``).  None: every peer is on MPI.
    ring_peers: frozenset[int] | None = None

    def __init__(self, comm: MPI.Intracomm, *, eager_limit: int, pools: list[int]) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.wire = Wire(self.rank, self.size, inline_max=eager_limit,
                         credits=[p // self.size for p in pools],
                         grant=pools[self.rank] // self.size)
        self.wire.data_tag_ub = int(comm.Get_attr(lib.MPI.TAG_UB) or 32767)
        #: The errors of what carries the wire (MPI's), which become ``TransportError``.
        self._foreign: type[BaseException] | tuple[type[BaseException], ...] = (
            lib.MPI.Exception)
        self.endpoint: Endpoint  # set by start()
        #: The fast lane's step for an eager message that lands, ``offer_bytes(endpoint,
        #: source, tag, view, nbytes, count, dtype)``: True if a recv posted there took it
        #: (the world gives its engines', ``_engine.steps.offer_bytes``).  Without one,
        #: every such message is delivered as a ``Message``.
        self.offer_bytes: OfferBytes = deliver
        self.progress = Progress(comm, on_control=self._on_control,
                                 finished=lambda: self.wire.finished, failed=self._failed)
        #: ``Link.before_wait``: the task polls for its op itself a while first.
        self.before_wait = self.progress.wait_here
        self._sends: dict[int, Message] = {}  # announced sends, until CTS or WITHDRAWN
        #: The data sends of the early ones among them, by id: tracked once answered.
        self._early: dict[int, MPI.Request] = {}
        self._announced: dict[tuple[int, int], Message] = {}  # arrived, not matched yet
        self._broken: TransportError | None = None
        #: What this rank is waiting for, as text (asked by a peer's hang watchdog), and
        #: what to do with a peer's answer (set by the world).
        self.dump_request: Callable[[], str] | None = None
        self.on_dump: Callable[[int, str], None] | None = None

    @property
    def broken(self) -> BaseException | None:
        """The MPI failure that broke this link, if one did (it then stops, and the world
        cannot close cleanly)."""
        return self._broken

    def accelerate(self, lane: Any) -> None:
        """Run the per-message steps in C, with the C lane ``lane`` (call it before
        ``start``): ``send_now`` and the progress task's landing of control messages run
        with no Python frame (``lane.Path``, which does what ``send_now`` and
        ``Progress._land`` do: an eager message that lands goes
        straight into the recv posted for it; a traced engine's take the Python steps).
        So do a rendezvous message's steps: its announcement (``send``: the ``RTS``), its
        ``RTS`` landing, ``fetch`` (the data recv and the ``CTS``), the ``CTS`` landing and
        the data send, and the completion of the data requests
        (``Progress._test_requests``: the chunks of a larger payload, as ``_mpi_chunks``
        moves them, and the recv's or the send's completion); a withdrawal under way and a
        traced engine's take the Python steps.  The progress task's polls between two turns
        of the loop run there too (``Progress._spin``), and the reposting of the slots they
        handed on (``Progress._repost``).  Where MPI's handles are C ints (MPICH's ABI),
        the control recvs' ``Test`` and ``Start``, the control sends' ``Isend`` (up to
        ``DIRECT_MAX``) and a rendezvous payload's data requests there call the MPI
        library itself, not mpi4py
        (``direct``: no arguments parsed, no request object made but for a request still
        in flight, the GIL kept)."""
        self._run_in_c(lane, self.progress)

    def _run_in_c(self, lane: Any, progress: Progress) -> None:
        """``accelerate`` with the MPI side's progress ``progress`` (the hybrid link's is
        not its ``progress``)."""
        path = lane.Path(self, progress, self.wire, DTYPE_FIELDS, DTYPE_NAMES,
                         lib.MPI.Exception, INLINE, CTRL_SLOTS, REMOTE, CHUNK_BYTES, ACTIVE,
                         MAX_INFLIGHT)
        self.send_now = path.send_now  # type: ignore[method-assign]
        self.send = path.send  # type: ignore[method-assign]
        self.fetch = path.fetch  # type: ignore[method-assign]
        progress._land = path.land  # type: ignore[method-assign]
        progress._repost = path.repost  # type: ignore[method-assign]
        progress._test_requests = path.test  # type: ignore[method-assign]
        progress._spin = path.spin  # type: ignore[method-assign]
        if _direct_calls(lane) and isinstance(self.comm, lib.MPI.Comm):
            self.direct = path.direct(self.comm, lib.MPI._handleof(self.comm),
                                      lib.MPI.Request.fromhandle, DIRECT_MAX)

    # -- lifetime -------------------------------------------------------------------------

    def start(self, endpoint: Endpoint, loop: asyncio.AbstractEventLoop) -> None:
        """Post the control recvs and start the progress task.

        Raises:
            TransportError: MPI failed.
        """
        self.endpoint = endpoint
        with mpi_errors("posting control recvs", self.rank):
            self.progress.start(loop, f"asynccomm-mpi-progress-{self.rank}")

    async def wait_closed(self) -> None:
        """Wait until every rank has closed (``FIN`` both ways), then free the communicator.
        If this wait is cancelled the progress task is cancelled too and the communicator
        is left as it is (not freed)."""
        task = self.progress.task
        if task is None:
            return
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            raise

    def _failed(self, exc: Exception) -> None:
        err = (translate(exc, "progress", self.rank) if isinstance(exc, self._foreign)
               else TransportError(f"rank {self.rank}: the MPI transport failed: {exc!r}",
                                   rank=self.rank))
        err.__cause__ = exc
        self._break(err)

    def _break(self, err: TransportError) -> None:
        """MPI failed underneath: stop, and fail everything pending on this rank."""
        self._broken = err
        self.progress.stopped = True
        self._sends.clear()
        self._early.clear()
        self._announced.clear()
        self.endpoint.broke(err)

    # -- control messages -----------------------------------------------------------------

    def _send(self, dest: int, msg: bytes | bytearray) -> None:
        self.progress.send(dest, msg)

    def _on_control(self, slot: Slot) -> None:
        kind, dlen, src, tag, nbytes, count, ident, dfield = HEADER.unpack_from(slot.buf)
        endpoint = self.endpoint
        if kind == EAGER:  # the hot path, outside the wire
            if endpoint.closed:  # a closed rank drops what arrives, and says so
                late = getattr(endpoint, "dropped_late", None)
                if late is not None:
                    late(src, tag, nbytes)
            else:
                dtype = DTYPE_NAMES.get(dfield) or decode_dtype(dfield, dlen)
                if ";" in dtype:  # not 1-D: the usual way, which keeps its shape
                    dtype, shape = split_shape(dtype)
                    msg = Message(src, tag, nbytes, count, dtype, INLINE, slot.payload)
                    msg.shape = shape
                    endpoint.arrived(msg)
                elif self.offer_bytes(endpoint, src, tag, slot.payload, nbytes, count, dtype):
                    credit = self.wire.consumed(src, nbytes)
                    if credit is not None:
                        self._send(src, credit)
                else:
                    endpoint.arrived(Message(src, tag, nbytes, count, dtype, INLINE,
                                             slot.payload))
            return
        if kind == w.FT:
            if self.ft is not None:
                self.ft.message(src, bytes(slot.payload[:nbytes]))
            return
        data_tag = 0
        dtype = ""
        if kind == w.RTS:
            dtype = DTYPE_NAMES.get(dfield) or decode_dtype(dfield, dlen)
            data_tag = data_tag_of(slot.buf)
        payload = bytes(slot.payload[:nbytes]) if kind == w.CLOSE or kind == w.DUMP else b""
        event, out = self.wire.receive(kind, src, tag, nbytes, count, ident, dtype, payload,
                                       data_tag)
        for dest, raw in out:
            self._send(dest, raw)
        match event:
            case w.Announced(source, tag, nbytes, count, dtype, ident):
                if not endpoint.closed:
                    name, shape = split_shape(dtype) if ";" in dtype else (dtype, None)
                    msg = Message(source, tag, nbytes, count, name, REMOTE, ident=ident)
                    msg.shape = shape
                    self._announced[(source, ident)] = msg
                    endpoint.arrived(msg)
            case w.ClearToSend(dest, ident, data_tag):
                sent = self._sends.pop(ident)
                endpoint.activate(sent)  # a withdrawal under way, if any, lost
                early = self._early.pop(ident, None)
                if early is not None:  # its data is on its way: the send ends with it
                    self.progress.adopt(early, lambda: endpoint.sent(sent))
                else:
                    assert sent.view is not None
                    self.progress.push(memoryview(sent.view), dest, data_tag,
                                       lambda: endpoint.sent(sent))
            case w.WithdrawRequested(source, ident, data_tag, nbytes):
                dropped = self._announced.pop((source, ident), None)
                if data_tag:
                    self._drain(source, data_tag, nbytes)
                if dropped is not None:
                    endpoint.retract(dropped)
            case w.WithdrawAnswered(dest, ident):
                sent = self._sends.pop(ident)
                early = self._early.pop(ident, None)
                if early is not None:  # withdrawn once its data is drained: out of use
                    self.progress.adopt(early, lambda: endpoint.withdrawn(sent))
                else:
                    endpoint.withdrawn(sent)
            case w.Drain(source, data_tag, nbytes):
                self._drain(source, data_tag, nbytes)
            case w.DumpAsked(source):
                if source not in self.wire.closed_by and self._broken is None:
                    text = self.dump_request() if self.dump_request is not None else ""
                    self._send(source, self.wire.dump(text))
            case w.Dumped(source, text):
                if self.on_dump is not None:
                    self.on_dump(source, text)
            case w.PeerClosed(source, _, announced, withdrawing):
                exc = self._peer_error(source)
                for ident in announced:  # never matched: it never will be
                    endpoint.failed(self._sends.pop(ident),
                                    self._peer_error(source, unreceived=True))
                    self._let_go(ident)
                for ident in withdrawing:  # dropped unmatched by the closing rank
                    endpoint.withdrawn(self._sends.pop(ident))
                    self._let_go(ident)
                endpoint.peer_closed(source, exc)
                if self.ft is not None:
                    self.ft.closed(source)
            case _:
                pass

    def _drain(self, source: int, data_tag: int, nbytes: int) -> None:
        """Receive and throw away the data of an early announcement this rank dropped
        unmatched (its sender's data send completes; nothing is left in MPI)."""
        self.progress.pull(memoryview(bytearray(nbytes)), source, data_tag, _drained)

    def _let_go(self, ident: int) -> None:
        """The early data send of message ``ident``, which its receiver dropped, is
        tracked until the receiver has drained it (the send was settled already)."""
        early = self._early.pop(ident, None)
        if early is not None:
            self.progress.adopt(early, _drained)

    def _peer_error(self, peer: int, *, unreceived: bool = False) -> CommBrokenError:
        return gone_error(self.rank, peer, self.why_gone(peer)[0], None, unreceived=unreceived)

    def why_gone(self, peer: int) -> tuple[str | None, BaseException | None]:
        reason = self.wire.closed_by.get(peer)
        return (None if reason == CLOSED else reason), None

    # -- the Link interface ---------------------------------------------------------------

    def send(self, msg: Message, dest: int) -> None:
        wire = self.wire
        if dest in wire.closed_by or self._broken is not None:
            self.endpoint.failed(msg, TransportError(str(self._broken), rank=self.rank)
                                 if self._broken is not None else self._peer_error(dest))
            return
        n = msg.nbytes
        view = msg.view
        assert view is not None and msg.dtype is not None
        header = None
        try:
            dt = (DTYPE_FIELDS.get(msg.dtype) or encode_dtype(msg.dtype)
                  if msg.shape is None else encode_dtype(with_shape(msg.dtype, msg.shape)))
            header = wire.eager_header(dest, msg.tag, n, msg.count, dt)
            if header is not None:
                self._send(dest, b"".join((header, view)))  # one copy of the payload
                self.endpoint.sent(msg)
                return
            early = self.early_min < n <= self.early_max and n <= CHUNK_BYTES  # (one send)
            ident, rts = wire.announce(dest, msg.tag, n, msg.count, dt, early=early)
            early = ident in wire.early  # (not if every early data tag is held)
            msg.ident = ident
            self._sends[ident] = msg
            self._send(dest, rts)
        except self._foreign as exc:
            if header is not None:  # not sent: its credit returns (as in send_now)
                wire.refund(dest, n)
                self.endpoint.failed(msg, translate(exc, f"send to rank {dest}", self.rank))
            else:
                self._send_failed(exc, msg, dest)
            return
        if early:
            self._send_early(msg, dest, ident)

    def _send_early(self, msg: Message, dest: int, ident: int) -> None:
        """Post the data send of the early message ``ident`` (announced to ``dest``),
        kept untested until its ``RTS`` is answered.  An MPI error breaks the link (the
        receiver, told of the data, would wait for it), and the send fails."""
        try:
            self._early[ident] = self.progress.comm.Isend(msg.view, dest,
                                                          self.wire.early[ident])
        except self._foreign as exc:
            self._early_failed(exc, dest, msg)

    def _early_failed(self, exc: BaseException, dest: int, msg: Message) -> None:
        """MPI failed while ``send`` posted the data send of the early message ``msg``:
        the link breaks, and ``msg`` fails with it (it is not pending yet: the break does
        not reach it)."""
        self._break(translate(exc, f"send to rank {dest}", self.rank))
        self.endpoint.failed(msg, translate(exc, f"send to rank {dest}", self.rank))

    def _send_failed(self, exc: BaseException, msg: Message, dest: int) -> None:
        """MPI failed while ``send`` announced ``msg`` to ``dest``: the wire and the link
        forget it, and the send fails."""
        if self._sends.pop(msg.ident, None) is not None:
            self.wire.unsent(msg.ident)
        self.endpoint.failed(msg, translate(exc, f"send to rank {dest}", self.rank))

    def send_now(self, dest: int, tag: int, array: Any, nbytes: int, count: int,
                 dtype: str) -> bool:
        wire = self.wire
        if self._broken is not None or dest in wire.closed_by:
            return False
        header = wire.eager_header(dest, tag, nbytes, count,
                                   DTYPE_FIELDS.get(dtype) or encode_dtype(dtype))
        if header is None:
            return False
        progress = self.progress
        try:
            progress.send(dest, b"".join((header, array)))  # one copy of the payload
        except self._foreign:
            wire.refund(dest, nbytes)
            return False  # the usual way reports the error on a request
        return True

    def fetch(self, msg: Message, rank: int, into: memoryview, ready: Ready) -> None:
        source, ident = msg.source, msg.ident
        self._announced.pop((source, ident), None)
        tag, cts = self.wire.clear_to_send(source, ident)
        try:
            # The CTS first: the data recvs are posted while it travels (the sender's data
            # leaves only once it has landed there, so it all but always finds them posted;
            # MPI matches any that came sooner).
            self._send(source, cts)
            self.progress.pull(into, source, tag, lambda: ready(None, None))
        except self._foreign as exc:
            self._fetch_failed(exc, source)

    def _fetch_failed(self, exc: BaseException, source: int) -> None:
        """MPI failed while ``fetch`` posted the data recv or sent the ``CTS``."""
        self._break(translate(exc, f"recv from rank {source}", self.rank))

    def received(self, msg: Message, rank: int) -> object:
        if msg.where == INLINE or msg.where == STAGED:  # it left staging: credit back
            credit = self.wire.consumed(msg.source, msg.nbytes)
            if credit is not None:
                self._send(msg.source, credit)
        return None

    def discard(self, msg: Message, rank: int) -> None:
        self.received(msg, rank)

    def withdraw(self, msg: Message, dest: int, ask: bool) -> int:
        ident = msg.ident
        verdict, ask_msg = self.wire.withdraw(ident, ask=ask)
        if verdict == w.TOO_LATE:
            return TOO_LATE
        if verdict == w.GONE:
            del self._sends[ident]
            self._let_go(ident)
            return WITHDRAWN
        try:
            assert ask_msg is not None
            self._send(dest, ask_msg)
        except self._foreign as err:
            self._break(translate(err, "withdraw", self.rank))
        return ASKED

    def ask_dump(self, peer: int) -> None:
        """Ask ``peer`` what it is waiting for; its answer goes to ``on_dump`` (best effort:
        a peer that closed, or a broken link, is not asked)."""
        if peer == self.rank or peer in self.wire.closed_by or self._broken is not None:
            return
        try:
            self._send(peer, self.wire.ask_dump())
        except self._foreign:
            pass  # best effort: the report goes on without it

    def describe(self, rank: int, peer: int) -> list[str]:
        closed_by = self.wire.closed_by
        return [f"nothing more: it {closed_by[peer]}"] if peer in closed_by else []

    def close(self, rank: int, reason: str) -> None:
        if self._broken is not None:
            return
        self._announced.clear()
        self.progress.closing = True
        try:
            for source, data_tag, nbytes in self.wire.drop_early():
                self._drain(source, data_tag, nbytes)
            for dest, raw in self.wire.close(reason):
                self._send(dest, raw)
        except self._foreign as exc:
            self._break(translate(exc, "close", self.rank))


def _drained() -> None:
    """Data drained, or the data send of a dropped message done: nothing to report."""
