"""Rings and doorbell words in shared memory: the channels of the shared-memory link.

A world's segment (a ``memfd``: it has no name, so nothing is ever left in ``/dev/shm``)
holds one doorbell word per rank, one board per rank, then one ring per ordered pair of
ranks::

    [bell 0][bell 1]...[bell n-1]            one cache line each
    [board 0][board 1]...[board n-1]         one cache line each
    [ring 0->0][ring 0->1]...[ring n-1->n-1] (the diagonal is unused)

A rank's board is the state of the copy it shares with a sender (``shm.SHARE_MIN``): the
next piece to claim, the pieces copied, a piece given back.

A ring is single-producer, single-consumer: its ``tail`` line (the sender's count of bytes
published, and ``want``: the sender waits for room), its ``head`` line (the receiver's
count of bytes consumed), then ``RING_BYTES`` of records.  A record is an 8-byte length,
then the bytes, padded to 8; a record never wraps: a ``WRAP`` length skips to the start.

Publication: the sender writes the record, then stores ``tail`` (sequentially consistent,
so a release); the receiver loads ``tail`` (an acquire) before it reads the records, and
stores ``head`` once they are consumed.  Sleeping and waking (the armed doorbell, as
UCX's ``mm``): a receiver about to sleep sets ``ARMED`` in its bell word (a CAS), loads
every ``tail`` of its rings once more, and sleeps only if they are all empty; a sender
that published loads the receiver's bell word, and if it is armed clears it (a CAS: of
several senders only one wins) and sends the process one datagram.  All four accesses are
sequentially consistent, so either the receiver's second look sees the record or the
sender sees ``ARMED`` (``tests/transports/test_shm_protocol.py`` explores every
interleaving of a model of these steps).  Room works the same way round: a sender whose
ring is full sets ``want`` and looks at ``head`` again; a receiver that stored ``head``
loads ``want``, and if it is set clears it and wakes the sender.

The atomic accesses are ``Words``': those of the C extension ``asynccomm._native._lane``
(C11 ``<stdatomic.h>``), or, where it is not built, ``libatomic``'s through ``ctypes``
(slower, and correct on any CPU: they are the compiler's own atomic operations;
``ASYNCCOMM_PURE_PYTHON=1`` takes this path even where the extension is built).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import struct
from collections.abc import Callable
from typing import Any, Final, Protocol

_native_shm: Any  # the extension's module, or None
try:
    from .._native import _lane as _native_shm
except ImportError:  # not built: the libatomic path
    _native_shm = None
    if (os.environ.get("ASYNCCOMM_REQUIRE_NATIVE", "") not in ("", "0")
            and os.environ.get("ASYNCCOMM_PURE_PYTHON", "") in ("", "0")):
        raise ImportError("ASYNCCOMM_REQUIRE_NATIVE is set but asynccomm's C extension "
                          "(_native._lane) is not built") from None
if os.environ.get("ASYNCCOMM_PURE_PYTHON", "") not in ("", "0"):
    _native_shm = None  # the path taken where the extension is not built
#: The extension's single copy of rendezvous data (``address``, ``readv``), if built.
single_copy = _native_shm

__all__ = ["ARMED", "LINE", "NATIVE", "RING_BYTES", "WRAP", "Ring", "Segment", "Words",
           "segment_bytes", "single_copy"]

LINE: Final = 64
#: Bytes of records per ring (a power of two; a record takes at most half of it).
RING_BYTES: Final = 1 << 19
_RING_SPAN: Final = 2 * LINE + RING_BYTES
ARMED: Final = 1
WRAP: Final = 0xFFFF_FFFF
_REC = struct.Struct("<Q")
#: Whether the atomic accesses are the C extension's.
NATIVE: Final = _native_shm is not None


class Words(Protocol):
    """Sequentially consistent 64-bit accesses to a mapping, by byte offset."""

    def load(self, off: int) -> int: ...
    def store(self, off: int, value: int) -> None: ...
    def cas(self, off: int, expected: int, new: int) -> bool: ...
    def release(self) -> None: ...


_SEQ_CST = 5
_libatomic: ctypes.CDLL | None = None


def _atomic_lib() -> ctypes.CDLL:
    global _libatomic  # loaded once, on first use
    if _libatomic is None:
        name = ctypes.util.find_library("atomic") or "libatomic.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            raise RuntimeError(
                "the shared-memory transport needs its C extension (asynccomm._native._lane) "
                "or libatomic (the C compiler's runtime): neither is here") from exc
        u64, vp, i = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int
        lib.__atomic_load_8.argtypes = [vp, i]
        lib.__atomic_load_8.restype = u64
        lib.__atomic_store_8.argtypes = [vp, u64, i]
        lib.__atomic_store_8.restype = None
        lib.__atomic_compare_exchange_8.argtypes = [vp, vp, u64, i, i]
        lib.__atomic_compare_exchange_8.restype = ctypes.c_bool
        _libatomic = lib
    return _libatomic


class LibatomicWords:
    """``Words`` through libatomic and ctypes (the path without the C extension)."""

    def __init__(self, mm: mmap.mmap) -> None:
        lib = _atomic_lib()
        self._anchor: ctypes.Array[ctypes.c_char] | None = (
            ctypes.c_char * len(mm)).from_buffer(mm)
        self._base = ctypes.addressof(self._anchor)
        # (getattr: the names would be mangled in a class body)
        self._load = getattr(lib, "__atomic_load_8")
        self._store = getattr(lib, "__atomic_store_8")
        self._cas = getattr(lib, "__atomic_compare_exchange_8")
        self._expected = ctypes.c_uint64()
        self._expected_at = ctypes.addressof(self._expected)

    def load(self, off: int) -> int:
        return int(self._load(self._base + off, _SEQ_CST))

    def store(self, off: int, value: int) -> None:
        self._store(self._base + off, value, _SEQ_CST)

    def cas(self, off: int, expected: int, new: int) -> bool:
        self._expected.value = expected
        return bool(self._cas(self._base + off, self._expected_at, new, _SEQ_CST, _SEQ_CST))

    def release(self) -> None:
        self._anchor = None


def words(mm: mmap.mmap) -> Words:
    """The atomic accesses to ``mm``: the C extension's where it is built."""
    if _native_shm is not None:
        return _native_shm.Words(mm)  # type: ignore[no-any-return]
    return LibatomicWords(mm)


def segment_bytes(size: int) -> int:
    """The size of a world segment of ``size`` ranks."""
    return 2 * size * LINE + size * size * _RING_SPAN


class Segment:
    """A world's mapped segment (see module docs)."""

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self.mm = mmap.mmap(fd, segment_bytes(size))
        self.view = memoryview(self.mm)
        self.words = words(self.mm)

    def bell(self, rank: int) -> int:
        """The offset of ``rank``'s doorbell word."""
        return rank * LINE

    def board(self, rank: int) -> int:
        """The offset of ``rank``'s board (three words: see ``shm.SHARE_MIN``)."""
        return (self.size + rank) * LINE

    def ring(self, source: int, dest: int, sender: bool) -> Ring:
        """The ring from ``source`` to ``dest``, as its sender or its receiver sees it."""
        off = 2 * self.size * LINE + (source * self.size + dest) * _RING_SPAN
        return Ring(self, off, sender)

    def close(self) -> None:
        """Unmap (best effort: a view that someone kept holds the mapping until it goes)."""
        self.words.release()
        try:
            self.view.release()
            self.mm.close()
        except BufferError:
            pass


class Ring:
    """One direction of one pair: ``put`` on the sender's side, ``take`` on the
    receiver's (see module docs)."""

    __slots__ = ("_data", "_head", "_pos", "_seen", "_tail", "_want", "view", "words")

    def __init__(self, segment: Segment, off: int, sender: bool) -> None:
        self.view = segment.view
        self.words = segment.words
        self._tail = off
        self._want = off + 8
        self._head = off + LINE
        self._data = off + 2 * LINE
        #: The sender's tail, or the receiver's head (each kept here by its only writer).
        self._pos = 0
        #: The sender: the head it last loaded (room is at least what it says).
        self._seen = 0

    def put(self, parts: tuple[bytes | bytearray | memoryview, ...], nbytes: int) -> bool:
        """Publish one record of ``parts`` (``nbytes`` in all); False (nothing written) if
        the ring has no room for it now."""
        need = 8 + ((nbytes + 7) & ~7)
        tail = self._pos
        off = tail & (RING_BYTES - 1)
        skip = RING_BYTES - off if off + need > RING_BYTES else 0
        if tail + skip + need - self._seen > RING_BYTES:
            self._seen = self.words.load(self._head)
            if tail + skip + need - self._seen > RING_BYTES:
                return False
        view, data = self.view, self._data
        if skip:
            _REC.pack_into(view, data + off, WRAP)
            tail += skip
            off = 0
        at = data + off + 8
        for part in parts:
            n = len(part) if not isinstance(part, memoryview) else part.nbytes
            view[at:at + n] = part
            at += n
        _REC.pack_into(view, data + off, nbytes)
        self._pos = tail + need
        self.words.store(self._tail, self._pos)
        return True

    def want_room(self) -> bool:
        """The sender found no room: ask to be woken when there is; True if there is room
        already (look again)."""
        self.words.store(self._want, 1)
        self._seen = self.words.load(self._head)
        return self._pos - self._seen < RING_BYTES // 2

    def ready(self) -> bool:
        """The receiver: whether a record waits."""
        return self.words.load(self._tail) != self._pos

    def take(self, handle: Callable[[memoryview], object]) -> tuple[int, bool]:
        """Hand every published record to ``handle`` (the view is valid only during the
        call), then free their room.  Returns how many there were, and whether the sender
        asked to be woken (``want`` is cleared)."""
        words = self.words
        tail = words.load(self._tail)
        head = self._pos
        if tail == head:
            return 0, False
        view, data = self.view, self._data
        n = 0
        while head != tail:
            off = head & (RING_BYTES - 1)
            length = _REC.unpack_from(view, data + off)[0]
            if length == WRAP:
                head += RING_BYTES - off
                continue
            handle(view[data + off + 8:data + off + 8 + length])
            head += 8 + ((length + 7) & ~7)
            n += 1
            self._pos = head
        words.store(self._head, head)
        if words.load(self._want):
            words.store(self._want, 0)
            return n, True
        return n, False
