"""The shared-memory link: ranks in separate processes of one machine, with no MPI.

The ranks are the processes of a group (``Node``: started together by
``asynccomm.run(main, n, backend="processes")``, see ``_comm/process_runner.py``).  Each
world the group opens has a segment of rings, one per ordered pair of ranks
(``_shm_ring``), that carries the wire protocol of ``_core/wire.py``: control messages
(eager payloads inline, announcements, answers, closes).  A rendezvous message, once its
receiver matched it, is copied once: the receiver reads it from the sender's buffer
(``process_vm_readv``, with the C extension).  Its announcement (``RTS``) carries the
buffer's address (``OFFER``), so the receiver copies as soon as a recv matches and answers
once (``DATA_DONE``): no ``CTS`` and no round trip before the data moves.  Where that copy
is refused, the message comes on the ring after the ``CTS``, in fragments that land
straight in the recv buffer: both processes copy at once, the sender into the ring and
the receiver out of it (in C, each waits a little for the other's progress rather than
turn its loop).
The protocol's shell (turning the wire's events into the endpoint's, and the link's
``send``, ``fetch`` and ``withdraw``) is the MPI link's; only the channels underneath
differ.

Waiting is the kernel's.  A process polls its rings while it is busy (and spins a little
after activity: where it has a core of its own, ranks no more than usable cores, ``SPIN``;
else for ``CROWDED_SPIN``, giving its core away after each look; meanwhile a recv about
to wait looks a burst more itself and takes what came, ``Node.before_wait``); once idle it
arms its doorbell words, looks once more, and sleeps in its loop until a sender rings: on its
eventfd, which each peer took (``pidfd_getfd``) once told its number, or (where it could
not) on its datagram socket.  A process that rang a sleeping peer out of the blue (no
peer's doorbell woke it, no record came since it slept) sleeps at once rather than spin:
the peer may need its core.  No timer ticks while idle.  A peer that dies is known at once: each
peer process's ``pidfd`` is in the loop too, and its ranks' pending ops fail with
``CommBrokenError`` (as if it had closed, saying it died).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import socket
import struct
import sys
import time
from array import array
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar, cast

from .._core import wire as w
from .._core.descriptors import INLINE, Message
from .._core.states import ACTIVE, Kind
from .._core.wire import CLOSE, CTS, FIN, FT, HEADER, RTS, WITHDRAW, Wire
from .._exceptions import CommBrokenError, TransportError
from ._mpi_lib import sched_yield, yield_now
from ._mpi_transport import MPITransport, OfferBytes, deliver
from ._shm_ring import ARMED, RING_BYTES, WRAP, Ring, Segment, segment_bytes, single_copy
from .base import Endpoint, Ready

__all__ = ["DATA", "FRAGMENT", "Channels", "Node", "ShmTransport", "missing"]

#: Records of rendezvous data (not wire kinds; the header's tag is the data tag): bytes;
#: where the bytes are in the sender (``ident``: their address), for the receiver to copy
#: them itself; that copy is done (the sender's buffer is free); that copy was refused
#: (send the bytes on the ring instead).  A ``DATA_DONE`` or ``DATA_REFUSED`` whose
#: ``ident`` is not 0 answers an offer instead (see ``OFFER``): the sender's message
#: ``ident`` was copied, or is to come on the ring on the data tag given.
DATA = 11
DATA_AT = 12
DATA_DONE = 13
DATA_REFUSED = 14
#: The receiver of offer ``ident`` (``nbytes``) copies it now: its sender keeps its loop
#: awake (it spins rather than sleeps) until the answer, or until the copy would have
#: taken ``nbytes / COPY_LEAST_RATE`` seconds (``Channels.copying``).  Sent for copies of
#: more than one ``READ_CHUNK``: those outlast the sender's ``SPIN``, and its doorbell's
#: wake would come on the answer's way.
DATA_COPYING = 15
#: The receiver of offer ``ident`` shares its copy with the sender (see ``SHARE_MIN``): the
#: header's tag is the copy's generation on the receiver's board, its count the piece
#: size, and ``SHARE`` follows (the recv buffer's address, then the send buffer's).  Like
#: ``DATA_COPYING``, the sender's loop stays awake until the answer.
DATA_SHARE = 17
SHARE = struct.Struct("<QQ")
#: The least rate (bytes per second) a copy announced by ``DATA_COPYING`` is waited for
#: at, awake; ``COPY_GRACE`` seconds more (an answer that never comes: a bound).
COPY_LEAST_RATE = 1e9
COPY_GRACE = 10e-3
#: An offer: where single copy is on, an ``RTS`` carries its send buffer's address after
#: its header, so that the receiver, once a recv matches, copies at once and answers only
#: ``DATA_DONE`` (no ``CTS``, no ``DATA_AT``).  Until that answer (or ``WITHDRAWN``, or
#: the receiver's ``CLOSE`` or death) the buffer is lent.
OFFER = struct.Struct("<Q")
#: The receiver of a single copy copies this much per turn of its loop.
READ_CHUNK = 4 << 20
#: An offer of at least this many bytes is copied by both processes at once, where each
#: has a core of its own (a group no larger than the usable cores): the receiver reads
#: pieces from the sender's buffer (``process_vm_readv``) while the sender, told so
#: (``DATA_SHARE``), writes pieces into the recv buffer (``process_vm_writev``), each
#: claiming the next piece from the receiver's board in the segment (``lane.share``).  A
#: piece the sender could not copy is given back, and the receiver copies it; the recv is
#: complete once every piece is in, and only then answered ``DATA_DONE``.  Two cores copy
#: a message 1.5-2.2x as fast as one (measured here: one process_vm_readv of 1 MiB, 16 MiB
#: and 256 MiB at 6.5, 5.1 and 5.5 GB/s; two processes copying half each at 10.0, 11.4
#: and 9.4 GB/s).  Not where the sender sleeps (its doorbell armed), unless the copy is of
#: more than one ``READ_CHUNK``: its wake-up takes about as long as the copy of 1 MiB, and
#: the receiver would have claimed every piece by then.
SHARE_MIN = 256 << 10
#: A shared copy is cut in about this many pieces, of at least ``SHARE_PIECE_MIN`` and at
#: most ``SHARE_PIECE_MAX`` bytes (whole pages).
SHARE_PIECES = 16
SHARE_PIECE_MIN = 64 << 10
SHARE_PIECE_MAX = 1 << 20
#: Once no piece is left to claim, the receiver waits this long (ns), awake, for the
#: sender's last pieces before its loop turns (it looks again on the next turn).
SHARE_WAIT_NS = 1_000_000
#: A recv whose shared copy stops unfinished (its own read failed, or its link failed) has
#: its board closed, so that the sender claims no more pieces, and its buffer goes back to
#: its user only once no piece of the sender's can still be written into it: after the
#: piece the sender may be copying is counted or given back, the sender's process is gone,
#: or this many seconds (a bound: a piece is at most ``SHARE_PIECE_MAX``, copied in well
#: under a millisecond by a running process).
SHARE_SETTLE = 1.0
#: A board's claim word once closed: no piece is left to claim (with the generation above).
CLOSED = 0xFFFF_FFFF
#: The offsets in a board (``Segment.board``) of its words: the next piece to claim, the
#: pieces copied, a piece given back (``lane.share``).
CLAIM, COPIED, BACK = 0, 8, 16
#: Rendezvous data moves in fragments of this many bytes: records of a quarter of a ring
#: (four at once on it: one being written, one read, two waiting), a multiple of 64.
FRAGMENT = (RING_BYTES // 4 - 8 - HEADER.size) & ~63
#: After activity, a process with a core of its own polls this long before it sleeps.
SPIN = 1e-3
#: A process of a group with more processes than cores polls this long, giving its core
#: away (``sched_yield``) after each look that found nothing: the peer it waits for may be
#: queued behind it, and a yield hands the core over at once, where a sleep in the kernel
#: costs both a wake-up (the peer's doorbell) and a turn of its loop.  Short, so that a
#: rank waiting longer sleeps, and its core stays free for the others; and only while it
#: pays: once a wait outlasted it (the cores are busy with other work, or the peers are
#: slow to answer), the process sleeps at once, until a wait shorter than it comes again.
#: Measured (alternating builds on a shared 2-core machine, loaded by other work): the
#: parameter server of ``examples/parameter_server.py`` as 5 processes (4 workers waiting
#: on the server's replies while the others compute), 5 epochs, medians of 5-6: with no
#: ``sched_yield`` per doorbell rung (``Node.wake``) 69.2k samples/s against 49.2k with
#: one (5 of 6 runs better); 500 us here 64.8k in that series (3 of 6 better than 200 us)
#: and 1 ms 91.5k against 75.9k with a yield per ring in a quieter one, neither kept: the
#: 8 KiB ring of ``benchmarks.shm_p2p`` at 4 processes took 54 us a hop at 500 us in one
#: of two runs and 56-70 us at 1 ms, against 24-29 us; at 200 us with no yield per ring,
#: 16.5 us at 3 processes and 22.2 us at 4 (with one: 18-169 us and 24-29 us), the idle
#: ranks' CPU 0% and their wake from idle within 0.08 ms of the bare datagram's.
CROWDED_SPIN = 200e-6
#: While spinning, the rings are looked at up to this many times per turn of the loop, the
#: core given away (``sched_yield``) after each look that found nothing...
BURST = 8
#: ... once it has spun this long with nothing found (an answer comes sooner on a core of
#: its own, and yielding then could only delay it behind another process).
SHARE_AFTER = 50e-6
#: Before that (the core kept), the rings are looked at up to this many times per turn (a
#: few microseconds: a turn of the loop costs more than a look); a look that finds a
#: record has it taken in the same turn.
SPIN_BURST = 64
_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = 2**64 - 1
#: How long ``open_world`` waits for a peer whose socket is full before trying again.
_RETRY = 1e-3
#: Ancillary room for the one file descriptor a datagram may carry.
_FD_SPACE = socket.CMSG_SPACE(array("i").itemsize)
#: The first byte of a datagram saying that its sender will never attach to a world
#: (``Node.forfeit``); a doorbell's ring is any other datagram with no file descriptor.
_FORFEIT = b"\x02"
#: The first byte of a datagram telling a peer the number of this process's eventfd
#: doorbell (``Node.watch``), which the peer takes with ``pidfd_getfd`` to ring it.
_EVENTFD = b"\x03"
_SYS_PIDFD_GETFD = 438  # (the same number on every architecture)
_libc = ctypes.CDLL(None, use_errno=True)


def pidfd_getfd(pidfd: int, fd: int) -> int:
    """A file descriptor of this process for ``fd`` of the process of ``pidfd``.

    Raises:
        OSError: the kernel refused (no such call, or no permission to take it).
    """
    got = int(_libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0))
    if got < 0:
        errno_ = ctypes.get_errno()
        raise OSError(errno_, os.strerror(errno_))
    return got


def missing() -> str | None:
    """What this platform lacks for the shared-memory link (None: nothing)."""
    if not sys.platform.startswith("linux"):
        return f"it needs Linux (memfd, pidfd, abstract sockets); this is {sys.platform}"
    for name in ("pidfd_open", "memfd_create"):
        if not hasattr(os, name):
            return f"it needs os.{name} (Linux 5.3 or later, Python 3.9 or later)"
    if not hasattr(socket, "recv_fds"):
        return "it needs socket.recv_fds"
    return None


def _address(group: str, rank: int) -> bytes:
    return f"\0asynccomm-shm-{group}-{rank}".encode()


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class _Push:
    """A rendezvous payload on its way out, fragment by fragment."""

    __slots__ = ("done", "off", "tag", "view")

    def __init__(self, view: memoryview, tag: int, done: Callable[[], None]) -> None:
        self.view = view
        self.tag = tag
        self.done = done
        self.off = 0


class _Pull:
    """A recv buffer that rendezvous fragments land in."""

    __slots__ = ("address", "done", "gen", "ident", "off", "share", "view")

    def __init__(self, view: memoryview, done: Callable[[], None]) -> None:
        self.view = view
        self.done = done
        self.off = 0
        self.address = 0  # a single copy: where the bytes are in the sender
        self.ident = 0  # an offer's copy: the sender's message id
        self.share = False  # an offer's copy shared with its sender (``SHARE_MIN``)...
        self.gen = 0  # ... and its generation on this rank's board, once started


def share_piece(nbytes: int) -> int:
    """The piece size of a shared copy of ``nbytes`` (see ``SHARE_PIECES``)."""
    return max(SHARE_PIECE_MIN, min(SHARE_PIECE_MAX, nbytes // SHARE_PIECES)) & ~4095


class _Slot:
    """A control message as ``MPITransport._on_control`` reads it."""

    __slots__ = ("buf", "payload")

    def __init__(self, view: memoryview) -> None:
        self.buf = view
        self.payload = view[HEADER.size:]


def _bytes(buffer: Any) -> memoryview:
    view = memoryview(buffer)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class Channels:
    """One rank's rings of one world, and what waits to go on them (the link's
    ``progress``, as the MPI link calls it)."""

    def __init__(self, node: Node, segment: Segment, rank: int, procs: list[int],
                 on_control: Callable[[Any], None],
                 on_answer: Callable[[int, int, int], None] | None = None,
                 places: list[int] | None = None) -> None:
        self.node = node
        self.segment = segment
        self.rank = rank
        self.size = size = len(procs)
        #: The group rank (process) of each rank of this world; -1: a rank on no ring of
        #: this segment (the hybrid link's peers on other hosts).
        self.procs = procs
        #: Where each rank's rings are in the segment (-1: none); each rank's own number
        #: where every rank of the world is on it.
        self.places = places = list(range(size)) if places is None else places
        here = places[rank]
        self._on_control = on_control
        #: ``on_answer(dest, ident, tag)``: the receiver of this rank's offer ``ident``
        #: copied it (``tag`` 0), or asks for it on the ring on data tag ``tag``.
        self._on_answer = on_answer
        self.out: list[Ring | None] = [
            None if d == rank or places[d] < 0 else segment.ring(here, places[d], True)
            for d in range(size)]
        self.incoming = [(s, segment.ring(places[s], here, False)) for s in range(size)
                         if s != rank and places[s] >= 0]
        self._ctrl: list[deque[bytes]] = [deque() for _ in range(size)]
        self._data: list[deque[_Push | bytes]] = [deque() for _ in range(size)]
        self._blocked: set[int] = set()  # ranks with something waiting to go
        self._local: deque[bytes] = deque()  # this rank's messages to itself
        self._pulls: dict[tuple[int, int], _Pull] = {}
        #: Single copies: this rank's send buffers lent to their receivers, by (receiver,
        #: data tag); the recvs that copy from their senders, in order.
        self._lent: dict[tuple[int, int], _Push] = {}
        self._reading: deque[tuple[int, int, _Pull]] = deque()
        #: Offers arrived (the sender's buffer address, by (source, message id)), until a
        #: recv matches them (``take``), or they are withdrawn or dropped.
        self.offers: dict[tuple[int, int], int] = {}
        #: The data tags of offers whose receiver could not copy: those go on the ring.
        self._on_ring: dict[tuple[int, int], bool] = {}
        #: This rank's offers being copied (``DATA_COPYING``), by (receiver, message id):
        #: until when its loop stays awake for the answer.
        self.copying: dict[tuple[int, int], float] = {}
        #: This rank's offers whose copy it shares (``DATA_SHARE``), by (receiver, message
        #: id): the generation, the recv buffer's address, the send buffer's, the bytes
        #: and the piece size; and this rank's board, with the last generation started.
        self._helping: dict[tuple[int, int], tuple[int, int, int, int, int]] = {}
        self._board = segment.board(here)
        self._gen = 0
        self._bell = segment.bell(here)
        self.words = segment.words
        self.closing = False  # set by the link when it closes (its last messages queue)
        self.stopped = False  # the link broke: poll it no more
        self.dead: set[int] = set()  # ranks whose process died

    # -- sending --------------------------------------------------------------------------

    def send(self, dest: int, raw: bytes | bytearray) -> None:
        """Send one control message to ``dest`` (queued if its ring is full; ``CLOSE`` and
        ``FIN`` queue behind data still going to it)."""
        if dest == self.rank:
            self._local.append(bytes(raw))
            self.node.kick()
            return
        if dest in self.dead:
            return
        if ((self._data[dest] or (self._reading and self._copying(dest)))
                and (self.closing or raw[0] == CLOSE or raw[0] == FIN)):
            self._data[dest].append(bytes(raw))
            self._blocked.add(dest)
        elif self._ctrl[dest] or not self._put(dest, raw):
            self._ctrl[dest].append(bytes(raw))
            self._blocked.add(dest)
        self.node.kick()

    def push(self, view: memoryview, dest: int, tag: int, done: Callable[[], None]) -> None:
        """Send ``view`` to ``dest`` as data on ``tag``; ``done()`` once it is all out."""
        if dest == self.rank:  # to itself: its recv is posted (CTS came after it)
            pull = self._pulls.pop((dest, tag), None)
            if pull is not None:
                pull.view[:] = _bytes(view)
                pull.done()
            done()
            return
        if dest in self.dead:
            return
        push = _Push(_bytes(view), tag, done)
        if (self.node.single_copy and not self._on_ring.pop((dest, tag), False)
                and len(push.view)):  # (nothing to copy: its recv is done already)
            # The receiver copies it from here (not after it refused an offer).
            self._lent[(dest, tag)] = push
            self.send(dest, HEADER.pack(DATA_AT, 0, self.rank, tag, len(push.view), 0,
                                        single_copy.address(push.view), b""))
            return
        self._data[dest].append(push)
        self._flush(dest)
        if self._data[dest] or self._ctrl[dest]:
            self._blocked.add(dest)
        self.node.kick()

    def pull(self, view: memoryview, source: int, tag: int, done: Callable[[], None]) -> None:
        """Receive ``source``'s data on ``tag`` into ``view``; ``done()`` once it is in."""
        view = _bytes(view)
        if not len(view):
            done()
            return
        self._pulls[(source, tag)] = _Pull(view, done)

    def take(self, view: memoryview, source: int, ident: int, address: int, tag: int,
             done: Callable[[], None]) -> None:
        """A recv matched ``source``'s offer ``ident`` (its bytes at ``address`` there):
        copy them into ``view`` (``done()`` once they are in), then answer ``DATA_DONE``;
        where this rank may not read other processes, ask for them on the ring on data
        tag ``tag`` (``DATA_REFUSED``)."""
        pull = _Pull(_bytes(view), done)
        pull.address = address
        pull.ident = ident
        self._pulls[(source, tag)] = pull
        if not self.node.single_copy or single_copy is None:
            self._answer(source, HEADER.pack(DATA_REFUSED, 0, self.rank, tag, 0, 0, ident,
                                             b""))
            return
        if (self.node.share_copies and len(pull.view) >= SHARE_MIN
                and (len(pull.view) > READ_CHUNK
                     or not self.words.load(self.segment.bell(self.places[source])) & ARMED)):
            pull.share = True  # (``DATA_SHARE`` once it is the first copy under way)
        elif len(pull.view) > READ_CHUNK and not self.node.crowded:
            self._answer(source, HEADER.pack(DATA_COPYING, 0, self.rank, 0, len(pull.view),
                                             0, ident, b""))
        self._reading.append((source, tag, pull))
        if len(self._reading) == 1:  # its first chunk now, not a turn of the loop later
            self._read()
        self.node.kick()

    def _copying(self, source: int) -> bool:
        """Whether a single copy from ``source`` is under way (its buffer lent to this
        rank: a ``CLOSE`` or ``FIN`` to it waits for the ``DATA_DONE``)."""
        return any(s == source and p.ident for s, _, p in self._reading)

    def _answer(self, dest: int, raw: bytes) -> None:
        """An offer's answer: ahead of what waits behind data (a ``CLOSE`` waits for it)."""
        if dest in self.dead:
            return
        if self._ctrl[dest] or not self._put(dest, raw):
            self._ctrl[dest].append(raw)
            self._blocked.add(dest)
        self.node.kick()

    def _put(self, dest: int, raw: bytes | bytearray) -> bool:
        """Put the record ``raw`` on ``dest``'s ring and wake ``dest`` if it sleeps; False
        (nothing written) if the ring has no room for it now (the C lane's
        ``ShmPath.put`` once the link is ``accelerate``d)."""
        ring = self.out[dest]
        assert ring is not None
        if not ring.put((raw,), len(raw)):
            return False
        self.ring(dest)
        return True

    def ring(self, dest: int) -> None:
        """Wake ``dest`` if it sleeps (after publishing to it)."""
        segment = self.segment
        bell = segment.bell(self.places[dest])
        words = self.words
        if words.load(bell) & ARMED and words.cas(bell, ARMED, 0):
            self.node.wake(self.procs[dest])

    def _flush(self, dest: int) -> bool:
        """Put what waits for ``dest`` on its ring; True if anything went."""
        ring = self.out[dest]
        assert ring is not None
        moved = False
        ctrl = self._ctrl[dest]
        while ctrl:
            raw = ctrl[0]
            if not ring.put((raw,), len(raw)):
                break
            ctrl.popleft()
            moved = True
        data = self._data[dest]
        while data and not ctrl:
            item = data[0]
            if isinstance(item, bytes):
                if (self._reading and self._copying(dest)) or not ring.put((item,), len(item)):
                    break
            else:
                off = self._fragments(dest, item.view, item.off, item.tag)
                if off != item.off:
                    item.off = off
                    moved = True
                if off < len(item.view):
                    break
                item.done()
            data.popleft()
            moved = True
        if moved:
            self.ring(dest)
        return moved

    def _fragments(self, dest: int, view: memoryview, off: int, tag: int) -> int:
        """Put ``view[off:]`` on ``dest``'s ring as ``DATA`` records of up to ``FRAGMENT``
        bytes while it has room; the offset reached (the C lane's ``ShmPath.fragments``
        once the link is ``accelerate``d: it waits a little for room while the receiver
        takes them, so that both copy at once)."""
        ring = self.out[dest]
        assert ring is not None
        header = HEADER.pack
        n = len(view)
        while off < n:
            piece = view[off:off + FRAGMENT]
            head = header(DATA, 0, self.rank, tag, len(piece), 0, 0, b"")
            if not ring.put((head, piece), len(head) + len(piece)):
                break
            self.ring(dest)  # (asleep, its receiver takes the first while this copies on)
            off += len(piece)
        return off

    # -- polling --------------------------------------------------------------------------

    def poll(self) -> bool:
        """Take every record that arrived, and send what waited for room; True if anything
        happened."""
        hit = False
        handle = self._handle
        for source, ring in self.incoming:
            n, wants = ring.take(handle)
            if n:
                hit = True
            if wants:
                self.ring(source)
        return self._poll_rest() or hit

    def _poll_rest(self) -> bool:
        """What ``poll`` does after the rings: this rank's messages to itself, what waited
        for room, the single copies under way, this rank's offers being copied (the C
        lane's ``ShmPath.poll`` calls it when any of them waits); True if anything
        happened (or an offer's copy is under way: the loop stays awake for its answer)."""
        hit = False
        handle = self._handle
        local = self._local
        while local:
            handle(memoryview(local.popleft()))
            hit = True
        if self._blocked:
            hit = self._send_waiting() or hit
        if self._reading:
            self._read()
            hit = True
        if self.copying:
            hit = self._awaiting_copy() or hit
        return hit

    def _awaiting_copy(self) -> bool:
        """Whether a receiver still copies one of this rank's offers (``DATA_COPYING``,
        ``DATA_SHARE``): its answer comes soon, and the loop stays awake for it (not past
        the bound); meanwhile this rank copies its share of those it was asked to."""
        if self._helping:
            self._help()
        now = time.perf_counter()
        for key in [k for k, until in self.copying.items() if until < now]:
            del self.copying[key]
        return bool(self.copying)

    def _help(self) -> None:
        """Copy this rank's pieces of the shared copies it was asked to (``DATA_SHARE``),
        up to ``READ_CHUNK`` bytes each this turn."""
        for key, (gen, into, at, nbytes, piece) in list(self._helping.items()):
            dest = key[0]
            finished = True
            if key in self.copying and dest not in self.dead:
                try:
                    finished = single_copy.share(
                        self.words, self.segment.board(self.places[dest]), gen,
                        self.node.pids[self.procs[dest]], at, into, nbytes, piece,
                        READ_CHUNK, 0, True)
                except OSError as exc:  # (the piece is given back: the receiver copies it)
                    if exc.errno in (errno.EPERM, errno.EACCES):
                        self.node.share_copies = False  # (not allowed: never again)
            if finished:
                del self._helping[key]

    def _read(self) -> None:
        """Copy the next chunk of the first single copy under way."""
        source, tag, pull = self._reading[0]
        if pull.share:
            self._read_shared(source, tag, pull)
            return
        off = pull.off
        n = min(READ_CHUNK, len(pull.view) - off)
        try:
            n = single_copy.readv(self.node.pids[self.procs[source]],
                                  pull.view[off:off + n], pull.address + off)
        except OSError as exc:
            self._read_failed(source, tag, pull, exc)
            return
        if n <= 0:  # (the kernel copies all it can, or fails)
            raise OSError(errno.EFAULT, f"nothing could be read from rank {source}")
        pull.off = off + n
        if pull.off >= len(pull.view):
            self._read_done(source, tag, pull)

    def _read_shared(self, source: int, tag: int, pull: _Pull) -> None:
        """``_read`` for a copy shared with its sender (``SHARE_MIN``): started (its board
        set, ``DATA_SHARE`` sent) the first time, then pieces claimed and copied, up to
        ``READ_CHUNK`` bytes a turn; done once the sender's pieces are in too."""
        nbytes = len(pull.view)
        piece = share_piece(nbytes)
        board, words = self._board, self.words
        if not pull.gen:
            self._gen = pull.gen = self._gen % 0x7FFF_FFFF + 1  # (a tag: 31 bits)
            words.store(board + BACK, 0)  # (nothing given back; none copied; none claimed)
            words.store(board + COPIED, pull.gen << 32)
            words.store(board + CLAIM, pull.gen << 32)
            self._answer(source, HEADER.pack(DATA_SHARE, 0, self.rank, pull.gen, nbytes, piece,
                                             pull.ident, b"")
                         + SHARE.pack(single_copy.address(pull.view), pull.address))
        try:
            done = single_copy.share(words, board, pull.gen, self.node.pids[self.procs[source]],
                                     single_copy.address(pull.view), pull.address, nbytes,
                                     piece, READ_CHUNK, SHARE_WAIT_NS, False)
        except OSError as exc:  # (its one piece claimed and not copied: ``lost``)
            self._settle(source, pull, lost=1)
            self._read_failed(source, tag, pull, exc)
            return
        if done:
            self._read_done(source, tag, pull)

    def _settle(self, source: int, pull: _Pull, lost: int = 0) -> None:
        """Stop ``pull``'s shared copy, started and unfinished: close its board (the sender
        claims no more), then wait until the pieces claimed are all counted, given back or
        ``lost`` (claimed by this rank, and not copied), so that none is being written into
        the buffer any longer; or until the sender's process is gone, or ``SHARE_SETTLE``."""
        board, words, gen = self._board, self.words, pull.gen
        while True:
            c = words.load(board + CLAIM)
            if c >> 32 != gen or c & CLOSED == CLOSED:
                return  # (not this copy's board, or closed already)
            if words.cas(board + CLAIM, c, (gen << 32) | CLOSED):
                break
        claimed = min(c & CLOSED, -(-len(pull.view) // share_piece(len(pull.view))))
        pid = self.node.pids[self.procs[source]]
        until = time.perf_counter() + SHARE_SETTLE
        while True:
            done, back = words.load(board + COPIED), words.load(board + BACK)
            settled = (lost + (done & CLOSED if done >> 32 == gen else 0)
                       + (1 if back >> 32 == gen and back & CLOSED else 0))
            if settled >= claimed or time.perf_counter() > until:
                return
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            except PermissionError:  # (there, but another user's: it may still write)
                pass
            sched_yield()

    def settle(self) -> None:
        """The link fails: stop the shared copy under way, if one is (``_settle``), before
        its recv fails and its buffer goes back to its user."""
        if self._reading:
            source, _, pull = self._reading[0]
            if pull.share and pull.gen and source not in self.dead:
                self._settle(source, pull)

    def _read_failed(self, source: int, tag: int, pull: _Pull, exc: OSError) -> None:
        """The first single copy under way failed with ``exc``."""
        self._reading.popleft()
        if source in self.dead or exc.errno == errno.ESRCH:
            return  # its process is gone: ``peer_died`` (its ``pidfd``) fails the recv
        if exc.errno not in (errno.EPERM, errno.EACCES):
            raise exc  # (EFAULT: the lent buffer is not there: the link fails)
        # Refused (no permission to read another process): the bytes come on the ring.
        self.node.single_copy = self.node.share_copies = False
        pull.off = 0
        if pull.ident:
            self._answer(source, HEADER.pack(DATA_REFUSED, 0, self.rank, tag, 0, 0,
                                             pull.ident, b""))
        else:
            self.send(source, HEADER.pack(DATA_REFUSED, 0, self.rank, tag, 0, 0, 0, b""))

    def _read_done(self, source: int, tag: int, pull: _Pull) -> None:
        """The first single copy under way is in: answer it, and complete its recv."""
        self._reading.popleft()
        del self._pulls[(source, tag)]
        if pull.ident:
            self._answer(source, HEADER.pack(DATA_DONE, 0, self.rank, 0, 0, 0,
                                             pull.ident, b""))
        else:
            self.send(source, HEADER.pack(DATA_DONE, 0, self.rank, tag, 0, 0, 0, b""))
        pull.done()

    def _send_waiting(self) -> bool:
        moved = False
        for dest in list(self._blocked):
            moved = self._flush(dest) or moved
            if not (self._ctrl[dest] or self._data[dest]):
                self._blocked.discard(dest)
            else:  # still no room: ask the receiver to say when there is
                ring = self.out[dest]
                assert ring is not None
                ring.want_room()
                moved = self._flush(dest) or moved
        return moved

    def _handle(self, view: memoryview) -> None:
        kind = view[0]
        if kind < DATA:
            if kind == RTS and len(view) > HEADER.size:  # an offer: its address first
                _, _, source, _, _, _, ident, _ = HEADER.unpack_from(view)
                self.offers[(source, ident)] = OFFER.unpack_from(view, HEADER.size)[0]
            elif kind == WITHDRAW:  # (matched already: its copy has the address)
                _, _, source, _, _, _, ident, _ = HEADER.unpack_from(view)
                self.offers.pop((source, ident), None)
            self._on_control(_Slot(view))
            return
        _, _, source, tag, nbytes, count, address, _ = HEADER.unpack_from(view)
        if kind == DATA_AT:
            pull = self._pulls[(source, tag)]
            pull.address = address
            self._reading.append((source, tag, pull))
            return
        if kind == DATA_COPYING or kind == DATA_SHARE:  # (``ident``: an offer being copied)
            self.copying[(source, address)] = (time.perf_counter() + COPY_GRACE
                                               + nbytes / COPY_LEAST_RATE)
            if kind == DATA_SHARE and self.node.share_copies:  # (its pieces copied now)
                # (the tag: the copy's generation; the count: its piece size)
                self._helping[(source, address)] = (tag, *SHARE.unpack_from(view, HEADER.size),
                                                    nbytes, count)
                self._help()
            return
        if kind == DATA_DONE:
            if address:  # ``ident``: an offer copied
                self.copying.pop((source, address), None)
                self._helping.pop((source, address), None)
                self._on_answer(source, address, 0)  # type: ignore[misc]
            else:
                self._lent.pop((source, tag)).done()
            return
        if kind == DATA_REFUSED:
            if address:  # an offer the receiver could not copy: on the ring, on ``tag``
                self.copying.pop((source, address), None)
                self._on_ring[(source, tag)] = True
                self._on_answer(source, address, tag)  # type: ignore[misc]
            else:
                self._data[source].append(self._lent.pop((source, tag)))
                self._blocked.add(source)
            return
        if kind == FT:  # fault tolerance's control messages (the link's ``ft`` hook)
            self._on_control(_Slot(view))
            return
        pull = self._pulls[(source, tag)]  # (a missing one is a bug: the link fails)
        off = pull.off
        pull.view[off:off + nbytes] = view[HEADER.size:HEADER.size + nbytes]
        pull.off = off + nbytes
        if pull.off >= len(pull.view):
            del self._pulls[(source, tag)]
            pull.done()

    # -- sleeping -------------------------------------------------------------------------

    def arm(self) -> bool:
        """About to sleep: ask to be rung, then look again.  True if something is here
        (or room came) after all: then stay awake (``disarm``)."""
        self.words.cas(self._bell, 0, ARMED)
        if self._local or any(ring.ready() for _, ring in self.incoming):
            return True
        return bool(self._blocked) and self._send_waiting()

    def disarm(self) -> None:
        self.words.store(self._bell, 0)

    # -- a dead peer ----------------------------------------------------------------------

    def peer_died(self, rank: int) -> bool:
        """``rank``'s process died (what it published was taken already): forget what
        waits to go to it.  Returns whether data was moving to or from it."""
        self.dead.add(rank)
        moving = (bool(self._data[rank]) or any(s == rank for s, _ in self._pulls)
                  or any(d == rank for d, _ in self._lent))
        for key in [k for k in self._lent if k[0] == rank]:
            del self._lent[key]
        self._reading = deque(r for r in self._reading if r[0] != rank)
        self._ctrl[rank].clear()
        self._data[rank].clear()
        self._blocked.discard(rank)
        for key in [k for k in self._pulls if k[0] == rank]:
            del self._pulls[key]
        for key in [k for k in self.offers if k[0] == rank]:
            del self.offers[key]
        for key in [k for k in self.copying if k[0] == rank]:
            del self.copying[key]
        for key in [k for k in self._helping if k[0] == rank]:
            del self._helping[key]
        return moving

    def close(self) -> None:
        self.stopped = True
        self.segment.close()


class ShmTransport(MPITransport):
    """One rank's side of the wire protocol on a world's rings (see module docs).  Made
    by ``Node.open_world``; the node polls it."""

    remote = True
    #: The link's per-message steps in C (``lane.ShmPath``), once ``accelerate``d.
    path: Any = None
    #: The name of the world whose rings this link uses (``Node.open_world``).
    world = ""
    #: No foreign errors here: the MPI link's handlers of MPI's errors catch none of ours
    #: (an error of ours goes up as itself, mpi4py imported or not).
    _foreign = ()
    #: No early data sends (``MPITransport.early_max``): a ring's copy waits for the match.
    early_max = 0

    def __init__(self, node: Node, segment: Segment, rank: int, procs: list[int], *,
                 eager_limit: int, pools: list[int]) -> None:
        self.node = node
        self.rank = rank
        self.size = size = len(procs)
        self.wire = Wire(rank, size, inline_max=eager_limit,
                         credits=[p // size for p in pools], grant=pools[rank] // size)
        self.wire.data_tag_ub = (1 << 31) - 1
        self.offer_bytes: OfferBytes = deliver  # the world gives the fast lane's
        self.endpoint: Endpoint
        self.progress = Channels(node, segment, rank, procs,  # type: ignore[assignment]
                                 self._on_control, self._answered)
        self._sends: dict[int, Message] = {}
        self._early: dict[int, Any] = {}  # (none: early_max)
        self._announced: dict[tuple[int, int], Message] = {}
        self._broken = None
        self.dump_request = None
        self.on_dump = None
        self._finished: asyncio.Future[None] | None = None

    @property
    def channels(self) -> Channels:
        return self.progress  # type: ignore[return-value]

    @property
    def before_wait(self) -> Callable[..., None]:  # type: ignore[override]
        """``Link.before_wait``: the node's (``Node.before_wait``), read once per
        communicator."""
        return self.node.before_wait

    def accelerate(self, lane: Any) -> None:
        """Run the per-message steps in C, with the C lane ``lane`` (call it before
        ``start``): ``send_now`` and the poll of the rings run with no Python frame
        (``lane.ShmPath``, which does what ``send_now`` and ``Channels.poll`` do: an eager
        message that lands goes straight into the recv posted for it, or, with none
        posted, into the engine's staging pool, a rendezvous fragment into its recv;
        an offer whose recv is posted, up to ``READ_CHUNK``, is matched, copied and
        answered (``fetch``, ``Channels.take``), a larger one matched and handed to
        ``Channels.take`` (its recv completed in C once its copy is in), the answer to
        this rank's offer (``DATA_DONE``) completes its send (``_answered``);
        everything else takes the Python steps), and the fragments go on the ring in C
        (``Channels._fragments``)."""
        channels = self.channels
        segment = channels.segment
        if not isinstance(segment.words, lane.Words):  # the rings' words are libatomic's
            return

        def offsets(ring: Ring) -> tuple[Ring, int, int, int, int]:
            return ring, ring._tail, ring._head, ring._want, ring._data

        path = lane.ShmPath(
            self, channels, self.wire, w.DTYPE_FIELDS, w.DTYPE_NAMES, INLINE,
            segment.words, segment.view, channels.procs, self.node, channels.dead,
            channels._ctrl, [-1 if at < 0 else segment.bell(at) for at in channels.places],
            [None if ring is None else offsets(ring) for ring in channels.out],
            [(source, *offsets(ring)) for source, ring in channels.incoming],
            RING_BYTES, WRAP, ARMED)
        self.send_now = path.send_now  # type: ignore[method-assign]
        channels.poll = path.poll  # type: ignore[method-assign]
        channels._put = path.put  # type: ignore[method-assign]
        path.fragmenting(DATA, FRAGMENT, channels._pulls, self.node.crowded)
        # (offers, answers: one to be shared is copied by ``Channels.take``)
        path.answering(DATA_DONE, ACTIVE,
                       SHARE_MIN - 1 if self.node.share_copies else READ_CHUNK, channels.take)
        channels._fragments = path.fragments  # type: ignore[method-assign]
        self.path = path
        self.node.accelerate(lane)

    def start(self, endpoint: Endpoint, loop: asyncio.AbstractEventLoop) -> None:
        """Join the node's poll."""
        self.endpoint = endpoint
        self._finished = loop.create_future()
        self.node.add(self)

    def check_finished(self) -> bool:
        """True once every rank has closed (``FIN`` both ways): the rings are released."""
        if not self.wire.finished:
            return False
        self.node.remove(self)
        self.channels.close()
        if self._finished is not None and not self._finished.done():
            self._finished.set_result(None)
        return True

    async def wait_closed(self) -> None:
        if self._finished is not None:
            await asyncio.shield(self._finished)

    def _failed(self, exc: Exception) -> None:
        """A message could not be handled (a bug underneath): fail everything pending on
        this rank, and stop (its peers see this rank as gone once its process ends)."""
        err = TransportError(f"rank {self.rank}: the shared-memory transport failed: "
                             f"{exc!r}", rank=self.rank)
        err.__cause__ = exc
        self.channels.settle()
        self._break(err)
        self.node.remove(self)
        if self._finished is not None and not self._finished.done():
            self._finished.set_result(None)

    def _send(self, dest: int, msg: bytes | bytearray) -> None:
        if msg[0] == RTS and dest != self.rank and self.node.single_copy:
            msg = self._offer(msg)
        self.channels.send(dest, msg)

    # -- rendezvous with an offer (``OFFER``) ---------------------------------------------

    def _offer(self, rts: bytes | bytearray) -> bytes | bytearray:
        """The ``RTS`` of an announced send, with its buffer's address after it: lent to
        the receiver from now on (until ``_answered``, ``WITHDRAWN`` or the receiver's
        ``CLOSE`` or death)."""
        view = _bytes(self._sends[HEADER.unpack_from(rts)[6]].view)
        if not len(view):
            return rts
        return b"".join((rts, OFFER.pack(single_copy.address(view))))

    def _answered(self, dest: int, ident: int, tag: int) -> None:
        """The receiver of this rank's offer ``ident`` copied it (``tag`` 0: the send is
        complete), or could not and asks for it on the ring on data tag ``tag``: as if it
        had answered ``CTS`` (a withdrawal under way lost)."""
        if tag:  # (``Channels`` sends it on the ring: the tag is marked)
            self._on_control(cast(Any, _Slot(memoryview(HEADER.pack(CTS, 0, dest, tag, 0, 0,
                                                                    ident, b"")))))
            return
        event, _ = self.wire.receive(CTS, dest, 0, 0, 0, ident, "", b"")
        if event is None:  # (not this rank's to complete any more: it failed already)
            return
        sent = self._sends.pop(ident)
        self.endpoint.activate(sent)
        self.endpoint.sent(sent)

    def fetch(self, msg: Message, rank: int, into: memoryview, ready: Ready) -> None:
        """A recv matched ``msg``: where it came with an offer, copy it now (no ``CTS``);
        else as the MPI link does."""
        source, ident = msg.source, msg.ident
        address = self.channels.offers.pop((source, ident), None)
        if address is None:
            super().fetch(msg, rank, into, ready)
            return
        self._announced.pop((source, ident), None)
        tag, _ = self.wire.clear_to_send(source, ident)  # committed; the copy answers
        self.channels.take(into, source, ident, address, tag, lambda: ready(None, None))

    # -- the Link interface (``send``, ``fetch``, ``withdraw``, ``received`` and ``ask_dump``
    # are the MPI link's: they only send control messages, and a ring never fails) -------

    def _send_parts(self, dest: int, header: bytes, payload: Any) -> None:
        """An eager message: straight onto the ring when it has room (one copy)."""
        channels = self.channels
        ring = channels.out[dest] if dest != self.rank else None
        body = _bytes(payload)
        if (ring is not None and not channels._ctrl[dest] and dest not in channels.dead
                and ring.put((header, body), len(header) + body.nbytes)):
            channels.ring(dest)
            self.node.kick()
        else:
            self._send(dest, b"".join((header, body)))

    def send_now(self, dest: int, tag: int, array: Any, nbytes: int, count: int,
                 dtype: str) -> bool:
        wire = self.wire
        if dest in wire.closed_by or self._broken is not None:
            return False
        header = wire.eager_header(dest, tag, nbytes, count,
                                   w.DTYPE_FIELDS.get(dtype) or w.encode_dtype(dtype))
        if header is None:
            return False
        self._send_parts(dest, header, array)
        return True

    def close(self, rank: int, reason: str) -> None:
        if self._broken is not None:  # its last words, best effort: it waits for no answer
            reason = f"failed ({self._broken})"
        self._announced.clear()
        self.channels.offers.clear()
        self.channels.closing = True
        for dest, raw in self.wire.close(reason):
            self._send(dest, raw)

    # -- a dead peer ----------------------------------------------------------------------

    def peer_died(self, rank: int) -> None:
        """``rank``'s process died: what it had not said, say for it (it closed, saying it
        died); ops whose data was moving with it fail."""
        self.peer_gone(rank, b"died (its process ended)")

    def peer_gone(self, rank: int, why: bytes) -> None:
        """``rank`` will say nothing more here (its process died, or it will never attach
        to this world): it closed, saying ``why`` (as ``peer_died``)."""
        wire = self.wire
        if rank in wire.fin_from:
            return
        moving = self.channels.peer_died(rank)
        if moving and not self.endpoint.closed:
            err = CommBrokenError(f"rank {rank} died while data moved with it",
                                  rank=self.rank, peer=rank)
            self._sends.clear()
            self.endpoint.broke(err)
        if rank not in wire.closed_by:
            self._on_control(cast(Any, _Slot(memoryview(
                HEADER.pack(CLOSE, 0, rank, 0, len(why), 0, 0, b"") + why))))
        self._on_control(cast(Any, _Slot(memoryview(
            HEADER.pack(FIN, 0, rank, 0, 0, 0, 0, b"")))))


class Node:
    """This process as a member of a group of processes on one machine (see module docs):
    its datagram socket (its doorbell and the way segments are handed over), its peers'
    ``pidfd``s, and the poll of every link it has open on the running loop."""

    _current: ClassVar[Node | None] = None

    def __init__(self, group: str, rank: int, size: int) -> None:
        self.group = group
        self.rank = rank
        self.size = size
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK
                                  | socket.SOCK_CLOEXEC)
        self.sock.bind(_address(group, rank))
        self._addresses = [_address(group, r) for r in range(size)]
        self.crowded = size > _usable_cores()
        self.pids: list[int] = []
        self._pidfds: dict[int, int] = {}
        self.dead: set[int] = set()  # group ranks whose process died
        self._links: list[ShmTransport] = []
        #: The C steps of the links (``ShmPath``), and the node's turn over them in C
        #: (``lane.ShmNode``), made by the first link ``accelerate``d; ``_native`` is it while
        #: every link has its steps in C (else None: the Python methods below run).
        self._paths: list[Any] = []
        self._lane_node: Any = None
        self._native: Any = None
        self._offers: dict[str, int] = {}  # segments handed over, by world name
        #: The members that will never attach to a world, by world name: who kept them
        #: away (themselves, or a member that died before the world opened), by member.
        self._forfeits: dict[str, dict[int, int]] = {}
        self._forfeited: set[str] = set()  # the worlds this process will never attach to
        #: The segments this process waits for, by world name: their maker, and the future.
        self._expected: dict[str, tuple[int, asyncio.Future[int]]] = {}
        self._worlds = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._kicked = False
        #: This process rang a sleeping peer's doorbell since its poll task last saw
        #: activity (``wake``): see ``_run``.
        self._rang = False
        #: When a recv last took what came on the rings just before it waited
        #: (``before_wait``), since the poll task last saw activity (0.0: it did not):
        #: activity, as if that task had taken it then (see ``_run``).
        self._took_at = 0.0
        self.rings_heard = 0
        #: The doorbell peers ring once they have it (``watch``, ``wake``): an eventfd, whose
        #: write wakes this process as any wake-up does, where a datagram's is synchronous
        #: (the kernel takes its sender for about to sleep and runs the woken process on the
        #: sender's core, behind it, where the other cores are busy); None where there is
        #: none (the socket alone then).
        self.eventfd: int | None = (os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                                    if hasattr(os, "eventfd") else None)
        #: Each peer's eventfd doorbell as this process holds it (None: it could not be
        #: taken, ring its socket), and the numbers peers said theirs have (``_heard_eventfd``)
        #: that are yet to be taken.
        self._peer_eventfds: dict[int, int | None] = {}
        self._eventfd_numbers: dict[int, int] = {}
        #: Rendezvous data is copied once, by its receiver, from its sender's buffer
        #: (``process_vm_readv``): where the C extension is built, until a copy is refused.
        self.single_copy = single_copy is not None
        if self.single_copy:
            self.allow_readers()
        #: Large offers' copies are shared by their two processes (``SHARE_MIN``): where
        #: single copy is on and each process has a core of its own, until a copy into
        #: another process is refused.
        self.share_copies = self.single_copy and not self.crowded

    def share_cores_with(self, processes: int) -> None:
        """The cores this process runs on are shared by ``processes`` processes in all, not
        only by this group's (several groups on one machine: ``ASYNCCOMM_TEST_HOSTS``'s
        fake hosts): crowded, and no copy shared, where they outnumber the cores."""
        if processes > _usable_cores():
            self.crowded = True
            self.share_copies = False

    @staticmethod
    def allow_readers() -> None:
        """Let this process's peers read its send buffers where the kernel asks a process to
        allow it (Yama's ``ptrace_scope`` 1): ``PR_SET_PTRACER_ANY``."""
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)
        except (OSError, AttributeError):
            pass

    @classmethod
    def current(cls) -> Node | None:
        """This process's node, if it belongs to a group."""
        return cls._current

    @classmethod
    def join(cls, group: str, rank: int, size: int) -> Node:
        """Make this process rank ``rank`` of the group (its socket is bound now)."""
        cls._current = cls(group, rank, size)
        return cls._current

    def watch(self, pids: list[int]) -> None:
        """The group's processes, by rank: each peer's ``pidfd`` is watched from now on."""
        self.pids = list(pids)
        for r, pid in enumerate(pids):
            if r != self.rank:
                try:
                    self._pidfds[r] = os.pidfd_open(pid)
                except ProcessLookupError:
                    self.dead.add(r)
        if self.eventfd is not None:  # each peer takes it at its first ring (``wake``)
            said = _EVENTFD + f"{self.rank} {self.eventfd}".encode()
            for r in self._pidfds:
                with contextlib.suppress(OSError):  # (then it rings the socket)
                    self.sock.sendto(said, self._addresses[r])

    # -- opening worlds -------------------------------------------------------------------

    def next_world(self) -> str:
        """The name of the next world the whole group opens (each member counts alike)."""
        self._worlds += 1
        return f"w{self._worlds}"

    async def open_world(self, name: str, members: list[int], *, eager_limit: int,
                         pools: list[int]) -> ShmTransport:
        """This process's link in the world ``name`` of ``members`` (group ranks, in the
        world's rank order; collective among them): the first member makes the segment
        and hands it to the others."""
        segment = await self.open_segment(name, members)
        link = ShmTransport(self, segment, members.index(self.rank), members,
                            eager_limit=eager_limit, pools=pools)
        link.world = name
        return link

    async def open_segment(self, name: str, members: list[int]) -> Segment:
        """The rings of the world ``name`` of ``members`` (as ``open_world``), for a link
        made elsewhere (``hybrid``)."""
        self._attach()
        rank = members.index(self.rank)
        if rank == 0:
            fd = os.memfd_create(f"asynccomm-{name}", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, segment_bytes(len(members)))
                for m in members[1:]:
                    await self._offer(name, fd, m)
                segment = Segment(fd, len(members))
            finally:
                os.close(fd)
        else:
            fd = await self._expect(name, members[0])
            try:
                segment = Segment(fd, len(members))
            finally:
                os.close(fd)
        return segment

    async def _offer(self, name: str, fd: int, peer: int) -> None:
        while True:
            if peer in self.dead:
                raise CommBrokenError(f"rank {peer} died before the world opened",
                                      rank=self.rank, peer=peer)
            try:
                self.sock.sendmsg([name.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                      array("i", [fd]))], 0,
                                  self._addresses[peer])
                return
            except BlockingIOError:
                await asyncio.sleep(_RETRY)
            except (ConnectionRefusedError, FileNotFoundError):  # its socket is gone
                raise CommBrokenError(f"rank {peer} died before the world opened",
                                      rank=self.rank, peer=peer) from None

    async def _expect(self, name: str, creator: int) -> int:
        if creator in self.dead:  # what it handed over before it died is taken first
            self._readable()
        fd = self._offers.pop(name, None)
        if fd is not None:
            return fd
        if creator in self.dead:
            raise CommBrokenError(f"rank {creator} died before the world opened",
                                  rank=self.rank, peer=creator)
        if creator in self._forfeits.get(name, {}):
            raise self._never_made(name, creator)
        assert self._loop is not None
        fut: asyncio.Future[int] = self._loop.create_future()
        self._expected[name] = (creator, fut)
        try:
            return await fut
        finally:
            self._expected.pop(name, None)

    def forfeit(self, name: str, members: list[int], culprit: int | None = None) -> None:
        """This process will never attach to the world ``name`` (it left the call that
        makes it, or ``culprit``, a member, died before it opened): tell the other
        ``members`` (group ranks), so that none waits for it.  Their ops with it fail with
        ``CommBrokenError``, as if it had closed; if it makes the world, their open fails,
        naming ``culprit``."""
        self._forfeited.add(name)
        fd = self._offers.pop(name, None)
        if fd is not None:  # handed over already: never used
            os.close(fd)
        said = _FORFEIT + f"{self.rank} {self.rank if culprit is None else culprit} {name}".encode()
        for m in members:
            if m != self.rank and m not in self.dead:
                self._say(said, m)

    def _say(self, said: bytes, peer: int) -> None:
        """Send ``said`` to group rank ``peer`` (again, a little later, while its socket is
        full; never if it is gone)."""
        try:
            self.sock.sendto(said, self._addresses[peer])
        except BlockingIOError:
            assert self._loop is not None
            self._loop.call_later(_RETRY, self._say, said, peer)
        except (ConnectionRefusedError, FileNotFoundError):
            pass

    def _heard_forfeit(self, said: bytes) -> None:
        """A member said that it will never attach to a world (``forfeit``)."""
        sender, culprit, name = said.decode().split(" ", 2)
        member = int(sender)
        self._forfeits.setdefault(name, {})[member] = int(culprit)
        waiting = self._expected.get(name)
        if waiting is not None and waiting[0] == member and not waiting[1].done():
            waiting[1].set_exception(self._never_made(name, member))
        for link in list(self._links):
            if link.world == name:
                self._absent(link, name, member)

    def _absent(self, link: ShmTransport, name: str, member: int) -> None:
        """Group rank ``member`` will never attach to ``link``'s world: as if it died."""
        procs = link.channels.procs
        if member not in procs or member in self.dead:
            return
        culprit = self._forfeits[name][member]
        why = ("never joined the communicator (it left the call that made it)"
               if culprit == member else f"never joined the communicator (rank {culprit} "
               "died before it opened)")
        link.peer_gone(procs.index(member), why.encode())
        link.check_finished()
        self.kick()

    def _never_made(self, name: str, creator: int) -> CommBrokenError:
        culprit = self._forfeits[name][creator]
        if culprit == creator:
            return CommBrokenError(
                f"rank {creator} left before it made world {name} (it left the call that "
                "makes it)", rank=self.rank, peer=creator)
        return CommBrokenError(f"rank {culprit} died before world {name} opened",
                               rank=self.rank, peer=culprit)

    # -- the poll on the loop -------------------------------------------------------------

    def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        self._detach()
        self._loop = loop
        loop.add_reader(self.sock.fileno(), self._readable, False)
        if self.eventfd is not None:
            loop.add_reader(self.eventfd, self._rung)
        for r, fd in self._pidfds.items():
            loop.add_reader(fd, self._died, r)

    def _detach(self) -> None:
        loop = self._loop
        if loop is None:
            return
        self._loop = None
        if not loop.is_closed():
            loop.remove_reader(self.sock.fileno())
            if self.eventfd is not None:
                loop.remove_reader(self.eventfd)
            for fd in self._pidfds.values():
                loop.remove_reader(fd)
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def accelerate(self, lane: Any) -> None:
        """Run the node's turn in C (``lane.ShmNode``) while its links run their steps in C
        (``ShmTransport.accelerate`` calls it), and its ``kick`` from now on."""
        if self._lane_node is None:
            self._lane_node = lane.ShmNode(self._paths, self)
            self.kick = self._lane_node.kick  # type: ignore[method-assign]

    def _relink(self) -> None:
        every = len(self._paths) == len(self._links)
        self._native = self._lane_node if every else None

    def add(self, link: ShmTransport) -> None:
        self._links.append(link)
        if link.path is not None:
            self._paths.append(link.path)
        self._relink()
        if self._task is None or self._task.done():
            assert self._loop is not None
            self._task = self._loop.create_task(self._run(), name="asynccomm-shm-poll")
        for r in self.dead:
            if r in link.channels.procs:
                link.peer_died(link.channels.procs.index(r))
        for r in self._forfeits.get(link.world, ()):
            self._absent(link, link.world, r)

    def remove(self, link: ShmTransport) -> None:
        with contextlib.suppress(ValueError):
            self._links.remove(link)
            if link.path is not None:
                self._paths.remove(link.path)
        self._relink()
        self.kick()

    def kick(self) -> None:
        """Something was sent: poll now (an answer may follow)."""
        self._kicked = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def wake(self, peer: int) -> None:
        """Ring group rank ``peer``'s doorbell (it was armed): its eventfd where this process
        holds it, else its socket.  No core is given away here (no ``sched_yield``).  A
        datagram's wake-up is synchronous: where the cores are busy the kernel often runs
        the woken peer at once, on this core, before this process goes on (measured with
        datagrams: a server's ``sendto`` to a sleeping worker took 73 us on average, 5
        processes on 2 cores, and 69% of the workers it woke ran next on its core); an
        eventfd's is not."""
        self._rang = True
        bell = self._peer_eventfds.get(peer)
        if bell is None and peer in self._eventfd_numbers:  # its first ring since it said
            bell = self._take_eventfd(peer)
        if bell is not None:
            os.eventfd_write(bell, 1)
            return
        try:
            self.sock.sendto(b"\x01", self._addresses[peer])
        except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
            return  # a datagram waits there already, or it is gone

    def before_wait(self, req: Any = None) -> None:
        """A recv of this process (``recv``, ``sendrecv``, or one that ``wait_all`` waits
        for) found its message not come and is about to wait on its loop
        (``Link.before_wait``; a send, ``req``, waits as it is: its answer comes from a
        peer that copies): look at the rings a few times more first, as the spin of
        ``_run`` does (``BURST`` looks, the core given away after each that found nothing,
        where crowded; else ``SPIN_BURST``, the core kept), and take what came now.  The
        wait then often ends where it began, without the turns of the loop that the poll
        task's look and the recv's wake-up would cost (where the cores are crowded those
        turns are most of a rank's time, and the others wait for it).  With the C steps
        only (``accelerate``d links); not after ringing a sleeping peer (its core is the
        woken peer's, as in ``_run``).  It looks also while the poll task's spin is off (the
        waits outlasting ``CROWDED_SPIN``): looking only while the spin was on measured
        worse (the parameter server of ``examples/parameter_server.py`` 27.6k samples/s
        against 40.1k, medians of 5, on 2 cores loaded by other work).  Measured so, with
        the waits timed from the last record it took (see ``_run``), the 8 KiB ring of
        ``benchmarks.shm_p2p`` took 92-105 us a hop at 4 processes against 132-140 without
        it (5 of 5 alternating pairs), 32-34 us at 3 against 43-46."""
        native = self._native
        if native is None or self._rang or (req is not None and req.kind is not Kind.RECV):
            return
        crowded = self.crowded
        if native.spin(BURST if crowded else SPIN_BURST, crowded):
            native.poll()
            self._took_at = time.perf_counter()
            if self._waiter is not None:  # the poll task sleeps, armed: awake now
                self.kick()

    def _take_eventfd(self, peer: int) -> int | None:
        """Peer ``peer``'s eventfd doorbell, taken now (``pidfd_getfd``) from the number it
        said; None if it cannot be (its socket is rung instead, from now on)."""
        pidfd = self._pidfds.get(peer)
        if pidfd is None:  # not watched yet, or it died: ask again at its next ring
            return None
        number = self._eventfd_numbers.pop(peer)
        try:
            bell: int | None = pidfd_getfd(pidfd, number)
        except OSError:
            bell = None
        self._peer_eventfds[peer] = bell
        return bell

    def _heard_eventfd(self, said: bytes) -> None:
        """A peer said the number of its eventfd doorbell (``watch``)."""
        rank, number = (int(x) for x in said.decode().split())
        if rank not in self._peer_eventfds:
            self._eventfd_numbers[rank] = number

    def _rung(self) -> None:
        """The loop's callback of the eventfd doorbell: a peer rang it (as a ring on the
        socket, ``_readable``)."""
        assert self.eventfd is not None
        try:
            os.eventfd_read(self.eventfd)
        except BlockingIOError:
            return
        self.rings_heard += 1
        self._take_rung()

    def _take_rung(self) -> None:
        """Rung while asleep: take what came now, not a turn of the loop later (the poll
        task wakes too, and looks again)."""
        if self._waiter is not None:
            native = self._native
            if native is not None:
                native.disarm()
                native.poll()
            else:
                self._disarm()
                self._poll()
        self.kick()

    def _readable(self, drain: bool = True) -> None:
        """Take what came on the socket: every datagram, or (the loop's callback, not
        ``drain``) one: its reader is level-triggered, so a second one calls it again, and a
        doorbell rings once per arming (another read would only find nothing, a system
        call on every wake)."""
        sock = self.sock
        rung = False
        while True:
            try:
                data, ancillary, _, _ = sock.recvmsg(256, _FD_SPACE)
            except (BlockingIOError, InterruptedError):
                break
            fds = array("i")
            for level, kind, raw in ancillary:  # a segment handed over (``_offer``)
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(raw[:len(raw) - len(raw) % fds.itemsize])
            if fds:
                name = data.decode()
                _, fut = self._expected.get(name, (0, None))
                if name in self._forfeited:  # a world this process will never attach to
                    os.close(fds[0])
                elif fut is not None and not fut.done():
                    fut.set_result(fds[0])
                else:
                    self._offers[name] = fds[0]
            elif data[:1] == _FORFEIT:
                self._heard_forfeit(data[1:])
            elif data[:1] == _EVENTFD:
                self._heard_eventfd(data[1:])
            else:
                self.rings_heard += 1
                rung = True
            if not drain:
                break
        if rung:
            self._take_rung()
        else:
            self.kick()

    def _died(self, peer: int) -> None:
        assert self._loop is not None
        self._loop.remove_reader(self._pidfds[peer])
        os.close(self._pidfds.pop(peer))
        bell = self._peer_eventfds.pop(peer, None)
        if bell is not None:
            os.close(bell)
        self.dead.add(peer)
        self._readable()  # a segment it handed over before it died is taken first
        for name, (creator, fut) in list(self._expected.items()):
            if creator == peer and not fut.done():
                fut.set_exception(CommBrokenError(
                    f"rank {peer} died before world {name} opened", rank=self.rank, peer=peer))
        if self._native is not None:  # what it published before it died is taken first
            self._native.poll()
        else:
            self._poll()
        for link in list(self._links):
            procs = link.channels.procs
            if peer in procs:
                link.peer_died(procs.index(peer))
                link.check_finished()
        self.kick()

    def _poll(self) -> bool:
        hit = False
        for link in list(self._links):
            channels = link.channels
            if channels.stopped:
                continue
            try:
                if channels.poll():
                    hit = True
                    if channels.closing:
                        link.check_finished()
            except Exception as exc:  # that link fails, the others go on
                link._failed(exc)
                hit = True
        return hit

    def _peek(self) -> bool:
        """Whether a record waits on any ring of this process (loads only)."""
        for link in self._links:
            channels = link.channels
            if channels._local or any(ring.ready() for _, ring in channels.incoming):
                return True
        return False

    def _arm(self) -> bool:
        found = False
        for link in self._links:
            if link.channels.arm():
                found = True
        if found:
            self._disarm()
        return found

    def _disarm(self) -> None:
        for link in self._links:
            if not link.channels.stopped:
                link.channels.disarm()

    async def _run(self) -> None:
        clock = time.perf_counter
        crowded = self.crowded
        spin = CROWDED_SPIN if crowded else SPIN
        spin_until = 0.0
        active = clock()  # when activity was last seen
        woke = False
        rushed = False  # the last turn found a record and went on to take it at once
        self._rang = False
        exchanging = False  # since the last sleep: a peer's doorbell woke it, or a record came
        loop = asyncio.get_running_loop()
        while self._links:
            self._kicked = False
            native = self._native  # (the turn in C: the same steps as the methods above)
            # (Woken: what rang may have been taken in the doorbell's callback already, and
            # its answers are yet to be sent: activity all the same.)
            hit = native.poll() if native is not None else self._poll()
            took = self._took_at
            if hit or self._kicked or woke or took:
                self._took_at = 0.0
                exchanging = exchanging or hit or took > 0.0
                woke = rushed = False
                now = clock()
                if crowded:  # a spin only while the waits end within one
                    # (Timed from the last record a recv took itself, if later: where the
                    # recvs take every record, this task turns seldom, and the time since
                    # its own last find is no wait.)
                    spin = CROWDED_SPIN if now - max(active, took) < CROWDED_SPIN else 0.0
                active = now
                # A peer woken from its sleep (this process rang its doorbell) takes a
                # while to run, and where the other cores are busy the kernel runs it on
                # this one only once it is idle: this process sleeps at once rather than
                # spin (a spin would add its length to that peer's wake-up); unless it
                # is in an exchange (a peer's doorbell woke it, or it took a record since
                # it slept): the spin catches the answers, and both stay awake.
                spin_until = now if self._rang and not exchanging else now + spin
                self._rang = False
                await yield_now()
                continue
            now = clock()
            if now < spin_until:  # spinning: look at the rings (cheap) a while first
                # An answer slow to come: the rank this one waits for may be queued behind
                # it on this core (other processes compete for the cores too): each look
                # that found nothing then gives the core away.
                share = crowded or now - spin_until + spin > SHARE_AFTER
                burst = BURST if share else SPIN_BURST
                if native is not None:
                    found = native.spin(burst, share)
                else:
                    found = False
                    peek = self._peek
                    for _ in range(burst):
                        if peek():
                            found = True
                            break
                        if share:
                            sched_yield()
                # Found: taken now, not a turn of the loop later (once: a record the poll
                # does not take, a stopped link's, must not keep the loop from turning).
                if found and not rushed:
                    rushed = True
                    continue
                rushed = False
                await yield_now()
                continue
            if native.arm() if native is not None else self._arm():
                continue
            heard = self.rings_heard
            self._waiter = loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
                native = self._native
                if native is not None:
                    native.disarm()
                else:
                    self._disarm()
            woke = True
            exchanging = self.rings_heard != heard
        self._task = None

