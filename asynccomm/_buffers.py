"""User buffers as flat byte views, their checks, copies, and the eager staging pool.

Every check that can fail on a user buffer lives here and raises ``TypeError`` or
``ValueError`` with an exact message, before anything is posted.
"""

from __future__ import annotations

import bisect
import ctypes
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ._core.wire import MESSAGE_OVERHEAD, MIN_BUCKET
from ._types import DataType

__all__ = [
    "BufferView",
    "PendingBuffers",
    "PendingIndex",
    "address",
    "memory_owner",
    "overlapping",
    "PoolStatistics",
    "StagingPool",
    "as_recv_buffer",
    "as_send_buffer",
    "resolve_dtype",
]

_UINT8 = np.dtype(np.uint8)


class BufferView:
    """A checked buffer: a flat, C-contiguous byte view plus what its elements are.

    Attributes:
        mv: the first ``nbytes`` bytes as a 1-D ``memoryview`` of format ``B``.
        dtype: the element type's name (``numpy.dtype.str``, for example ``"<f4"``).
        count: the number of elements.
        nbytes: ``count`` times the item size.
    """

    __slots__ = ("count", "dtype", "mv", "nbytes")

    def __init__(self, mv: memoryview, dtype: str, count: int, nbytes: int) -> None:
        self.mv = mv
        self.dtype = dtype
        self.count = count
        self.nbytes = nbytes


def resolve_dtype(dtype: object) -> np.dtype[Any]:
    """The numpy dtype for a ``dtype=`` argument (a ``DataType`` or anything numpy takes).

    Raises:
        TypeError: if numpy does not know it.
    """
    if isinstance(dtype, DataType):
        return np.dtype(dtype.value)
    try:
        return np.dtype(dtype)  # type: ignore[call-overload, no-any-return]
    except TypeError:
        raise TypeError(f"dtype={dtype!r} is not a data type") from None


_NAMES: dict[np.dtype[Any], str] = {}


def dtype_name(dt: np.dtype[Any], what: str) -> str:
    """The name a dtype travels under (``dtype.str``), once checked that it can travel.

    Raises:
        TypeError: object dtypes (they hold Python objects) and structured or subarray
            dtypes (their names would not tell them apart).
    """
    name = _NAMES.get(dt)
    if name is not None:
        return name
    if dt.hasobject:
        raise TypeError(f"{what} buffer has dtype {dt}, which holds Python objects; "
                        "only numeric, bool and fixed-size dtypes can be sent")
    if dt.fields is not None or dt.subdtype is not None or dt.kind == "V":
        raise TypeError(f"{what} buffer has dtype {dt}: structured and void dtypes are not "
                        "supported; send a view of its bytes (uint8) instead")
    name = dt.str
    # Cache only what the fast paths can take whole: a name that round-trips (so the
    # receiver can rebuild the dtype) and a kind with buffer-protocol support (numpy has
    # none for datetime64/timedelta64, which _view reports as a TypeError every time).
    if np.dtype(name) == dt and dt.kind not in "mM":
        _NAMES[dt] = name
    return name


def _view(buf: object, what: str) -> tuple[memoryview, np.dtype[Any]]:
    """A flat byte view of ``buf`` and its element dtype (uint8 for bytes-like buffers, the
    format's dtype for typed ones, ``array('d')`` float64).

    Raises:
        TypeError, ValueError: as ``as_send_buffer``.
    """
    ma = sys.modules.get("numpy.ma")
    if ma is not None and isinstance(buf, ma.MaskedArray):
        raise TypeError(f"{what} buffer is a masked array: its mask would not travel; send "
                        "arr.filled(fill_value) or arr.data (and the mask as a second message)")
    if isinstance(buf, np.ndarray):
        dt = buf.dtype
        dtype_name(dt, what)
        if not buf.flags.c_contiguous:
            raise ValueError(f"{what} buffer must be C-contiguous: "
                             + ("send numpy.ascontiguousarray(buf) (a contiguous copy)"
                                if what == "send" else
                                "receive into a contiguous buffer, then copy it into this "
                                "view (numpy.ascontiguousarray would make a copy, and the "
                                "data would land in the copy)"))
        try:
            mv = buf.reshape(-1).data  # flat: a view of 0-d or empty n-d casts too
        except ValueError:
            raise TypeError(f"{what} buffer has dtype {dt}, "
                            "which has no buffer protocol support") from None
        return (mv.cast("B") if mv.format != "B" else mv), dt
    _not_numpy(buf, what)
    try:
        mv = memoryview(buf)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} buffer must be a numpy array or a buffer-protocol object "
                        f"(bytes, bytearray, memoryview), got {type(buf).__name__}") from None
    if not mv.c_contiguous:
        raise ValueError(f"{what} buffer must be C-contiguous")
    if mv.format not in _BYTE_FORMATS:  # typed (array('d'), ctypes): its elements travel
        return _view(_typed(mv, what), what)
    return (mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv), _UINT8


#: Buffer formats that are bytes (uint8 on the wire): ``bytes``, ``bytearray``, ``char``.
_BYTE_FORMATS = frozenset({"B", "c"})


def _not_numpy(buf: object, what: str) -> None:
    """Refuse what looks like an array but is not a numpy one, and numpy scalars: their
    buffers, if any, would travel as bytes, not as their elements.

    Raises:
        TypeError: a numpy scalar, or an object with ``__array__`` or ``__dlpack__``.
    """
    if isinstance(buf, np.generic):
        raise TypeError(f"{what} buffer is a numpy scalar ({type(buf).__name__}), which "
                        + ("would travel as bytes: send np.asarray(x) (a 0-d array) or a "
                           "1-element array" if what == "send" else
                           "cannot be written: receive into an array, np.empty(1, dtype)"))
    if hasattr(buf, "__array__") or hasattr(buf, "__dlpack__"):
        raise TypeError(f"{what} buffer is a {type(buf).__name__}, not a numpy array: pass "
                        "np.asarray(x) or np.from_dlpack(x)" + (
                            "" if what == "send" else
                            " (one that shares x's memory, or the data lands in a copy)"))


def _typed(mv: memoryview, what: str) -> np.ndarray[Any, Any]:
    """An array over a typed buffer's memory, of the dtype its format says.

    Raises:
        TypeError: a format numpy does not know.
    """
    try:
        return np.asarray(mv)
    except (TypeError, ValueError, NotImplementedError):
        raise TypeError(f"{what} buffer has format {mv.format!r}, which names no numpy dtype: "
                        "pass memoryview(x).cast('B') to send its bytes") from None


def _element_range(mv: memoryview, dt: np.dtype[Any], count: object, dtype: object,
                   what: str) -> BufferView:
    if dtype is not None:
        want = resolve_dtype(dtype)
        if want != dt:
            raise TypeError(f"dtype={want} disagrees with the {what} buffer's dtype {dt}")
    itemsize = dt.itemsize
    capacity = mv.nbytes // itemsize if itemsize else 0
    if count is None:
        n = capacity
    else:
        if type(count) is bool or not isinstance(count, int | np.integer):
            raise TypeError(f"count must be an int, got {type(count).__name__}")
        n = int(count)
        if n < 0:
            raise ValueError(f"count must be >= 0, got {n}")
        if n > capacity:
            raise ValueError(f"count={n} is larger than the {what} buffer ({capacity} elements)")
    nbytes = n * itemsize
    return BufferView(mv if nbytes == mv.nbytes else mv[:nbytes], dtype_name(dt, what), n,
                      nbytes)


def as_send_buffer(buf: object, count: object = None, dtype: object = None) -> BufferView:
    """Check a send buffer (any readable buffer; numpy arrays keep their dtype, typed
    buffers the dtype of their format, bytes-like ones are uint8).

    Raises:
        TypeError: not a buffer, a numpy scalar, an array that is not numpy's (with
            ``__array__`` or ``__dlpack__``), an object or structured dtype, a bad ``count`` type, a
            ``dtype=`` that disagrees with the buffer.
        ValueError: not C-contiguous, ``count`` negative or larger than the buffer.
    """
    if type(buf) is np.ndarray and count is None and dtype is None:
        # The common case, kept short: it runs once per message.
        name = _NAMES.get(buf.dtype)
        if name is not None and buf.flags.c_contiguous:
            mv = (buf if buf.ndim == 1 else buf.reshape(-1)).data
            if mv.format != "B":
                mv = mv.cast("B")
            return BufferView(mv, name, buf.size, mv.nbytes)
    mv, dt = _view(buf, "send")
    return _element_range(mv, dt, count, dtype, "send")


def as_recv_buffer(buf: object, count: object = None, dtype: object = None) -> BufferView:
    """Check a recv buffer: as ``as_send_buffer``, and it must be writable.

    Raises:
        TypeError, ValueError: as ``as_send_buffer``; ValueError if it is read-only.
    """
    if type(buf) is np.ndarray and count is None and dtype is None:
        name = _NAMES.get(buf.dtype)
        flags = buf.flags
        if name is not None and flags.c_contiguous and flags.writeable:
            mv = (buf if buf.ndim == 1 else buf.reshape(-1)).data
            if mv.format != "B":
                mv = mv.cast("B")
            return BufferView(mv, name, buf.size, mv.nbytes)
    mv, dt = _view(buf, "recv")
    if mv.readonly:
        raise ValueError("recv buffer is read-only")
    return _element_range(mv, dt, count, dtype, "recv")


def address(buf: Any) -> int:
    """The address of a non-empty buffer's first byte (an ndarray or a memoryview)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))
    except TypeError:  # read-only
        return int(np.frombuffer(buf, np.uint8).__array_interface__["data"][0])


def overlapping(views: list[memoryview], writes: list[bool]) -> tuple[int, int] | None:
    """Two indexes of ``views`` that share memory while at least one of them is written
    (``writes[i]``), or None.  Empty views share nothing; views only read may share."""
    spans = sorted((address(v), address(v) + v.nbytes, i) for i, v in enumerate(views)
                   if v.nbytes)
    any_end, any_i = 0, -1  # the furthest end so far, of any view and of a written one
    w_end, w_i = 0, -1
    for start, end, i in spans:
        if writes[i] and start < any_end:
            return min(i, any_i), max(i, any_i)
        if start < w_end:
            return min(i, w_i), max(i, w_i)
        if end > any_end:
            any_end, any_i = end, i
        if writes[i] and end > w_end:
            w_end, w_i = end, i
    return None


def memory_owner(buf: Any) -> object:
    """The object that owns a buffer's memory (an array's base, a memoryview's exporter,
    followed to the end): two buffers can share memory only if they share an owner."""
    obj = buf
    while True:
        if isinstance(obj, np.ndarray):
            base = obj.base
            if base is None:
                return obj
            obj = base
        elif isinstance(obj, memoryview) and obj.obj is not None:
            obj = obj.obj
        else:
            return obj


class _Spans:
    """Sorted, non-overlapping spans of one memory owner's pending buffers (starts kept
    sorted: ints bisect fast; a removed span leaves its start until a sweep)."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: dict[int, tuple[int, object]] = {}  # start -> (end, request)

    def conflict(self, start: int, end: int) -> object | None:
        starts, ends = self.starts, self.ends
        i = bisect.bisect_left(starts, start)
        j = i - 1
        while j >= 0 and starts[j] not in ends:  # the nearest live span before
            j -= 1
        if j >= 0 and ends[starts[j]][0] > start:
            return ends[starts[j]][1]
        while i < len(starts) and starts[i] not in ends:  # and after
            i += 1
        if i < len(starts) and starts[i] < end:
            return ends[starts[i]][1]
        return None

    def add(self, start: int, end: int, req: object) -> None:
        starts = self.starts
        if starts and start < starts[-1]:
            bisect.insort(starts, start)
        else:  # rows posted in order: the commonest case
            starts.append(start)
        self.ends[start] = (end, req)

    def remove(self, start: int) -> None:
        del self.ends[start]
        if len(self.starts) > 2 * len(self.ends) + 32:
            self.starts = sorted(self.ends)


class PendingIndex(Protocol):
    """What the engine asks of an index of pending recv buffers: ``PendingBuffers`` here,
    or its C twin (``_native/_lane_pending.c``, on the C lane: ``_engine.lane.Lane``)."""

    def __len__(self) -> int: ...

    def conflict(self, buf: Any, nbytes: int, /) -> object | None: ...

    def add(self, buf: Any, nbytes: int, req: object, /) -> None: ...

    def remove(self, req: object, /) -> None: ...


class PendingBuffers:
    """The buffers of this rank's pending recvs, to refuse a recv into memory that another
    pending recv will write (two writers, one buffer: data corrupted).

    Buffers are grouped by the object that owns their memory, so a recv into an array of
    its own costs a dict lookup: addresses are taken only when a second pending buffer
    shares an owner (disjoint slices of one array are fine, overlapping ones are not), and
    then kept sorted, so each check is a bisection that looks at the two neighbours.  A
    recv is checked, then added: what the check found of its buffer (owner, address) is
    kept for the add, so each is looked up once.  ``address`` finds a buffer's address
    (the C accelerator's where it is built: ``_engine.lane.address``).  The C lane has a
    twin of this class (``_native/_lane_pending.c``), which the engine uses on it.
    """

    __slots__ = ("_address", "_by_owner", "_last", "_where")

    def __init__(self, address: Callable[[Any], int] = address) -> None:
        self._address = address
        # id(memory owner) -> the one pending (request, buffer, nbytes) of that owner, or
        # the spans of several
        self._by_owner: dict[int, tuple[object, Any, int] | _Spans] = {}
        self._where: dict[int, tuple[int, int]] = {}  # id(request) -> (owner id, start)
        self._last: tuple[Any, int, int] = (None, 0, -1)  # the last checked: buf, owner, start

    def __len__(self) -> int:
        return len(self._where)

    def conflict(self, buf: Any, nbytes: int) -> object | None:
        """The request whose pending buffer overlaps the first ``nbytes`` of ``buf``."""
        base = getattr(buf, "base", None)  # the owner of a row of an array, inlined
        if type(base) is np.ndarray and base.base is None:
            key = id(base)
        else:
            key = id(memory_owner(buf))
        group = self._by_owner.get(key)
        if group is None or nbytes <= 0:
            self._last = (buf, key, -1)
            return None
        start = self._address(buf)
        self._last = (buf, key, start)
        if type(group) is _Spans:
            return group.conflict(start, start + nbytes)
        req, other, size = group  # type: ignore[misc]
        other_start = self._address(other)
        return req if other_start < start + nbytes and start < other_start + size else None

    def add(self, buf: Any, nbytes: int, req: object) -> None:
        last_buf, key, start = self._last
        if last_buf is not buf:
            key, start = id(memory_owner(buf)), -1
        self._last = (None, 0, -1)
        group = self._by_owner.get(key)
        if group is None:
            self._by_owner[key] = (req, buf, nbytes)
            self._where[id(req)] = (key, -1)
            return
        if type(group) is not _Spans:  # a second buffer of one owner: index them
            first, first_buf, first_size = group  # type: ignore[misc]
            group = self._by_owner[key] = _Spans()
            first_start = self._address(first_buf)
            group.add(first_start, first_start + first_size, first)
            self._where[id(first)] = (key, first_start)
        if start < 0:
            start = self._address(buf)
        group.add(start, start + nbytes, req)
        self._where[id(req)] = (key, start)

    def remove(self, req: object) -> None:
        where = self._where.pop(id(req), None)
        if where is None:
            return
        key, start = where
        group = self._by_owner[key]
        if type(group) is _Spans:
            group.remove(start)
            if not group.ends:
                del self._by_owner[key]
        else:
            del self._by_owner[key]


def new_array(dtype: str, count: int) -> np.ndarray[Any, Any]:
    """A fresh 1-D array for ``recv_new``."""
    return np.empty(count, dtype=np.dtype(dtype))


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """A snapshot of a staging pool."""

    capacity_bytes: int
    """The cap on bytes held by staged messages at once."""
    in_use_bytes: int
    """Bytes counted for the messages staged now: their buffers and their bookkeeping."""
    peak_bytes: int
    """The most ``in_use_bytes`` has been."""
    cached_bytes: int
    """Bytes of free buffers kept for reuse."""
    acquired: int
    """Buffers handed out."""
    reused: int
    """Of those, how many came from the free lists."""
    refused: int
    """Requests refused because the cap was reached (those messages went rendezvous)."""


class StagingPool:
    """Size-bucketed, capped pool of staging buffers for eager messages.

    Buckets are powers of two from 64 bytes up; a message takes the smallest bucket that
    holds it, and counts against the cap as its bucket plus ``MESSAGE_OVERHEAD`` bytes of
    bookkeeping (so a flood of empty messages is bounded too; an empty message has no
    buffer at all).  When one more message would pass ``capacity_bytes``, ``acquire``
    returns None and the caller falls back to rendezvous: the sender then waits for its
    recv instead of memory growing without bound.  Free buffers are cached per bucket up
    to ``capacity_bytes`` in all.
    """

    # Slots: the fast lane reads these once per message (the C lane, ``_lane.c``, at their
    # offsets).
    __slots__ = ("_acquired", "_cached", "_free", "_in_use", "_peak", "_refused", "_reused",
                 "capacity_bytes")

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._free: dict[int, list[bytearray]] = {}
        self._in_use = 0
        self._peak = 0
        self._cached = 0
        self._acquired = 0
        self._reused = 0
        self._refused = 0

    def acquire(self, nbytes: int, *, force: bool = False,
                tentative: bool = False) -> bytearray | None:
        """A buffer of at least ``nbytes`` bytes, or None if the cap is reached (with
        ``force``, one all the same: for a payload that must be kept, whose sender was
        already told it fits; with ``tentative``, a refusal is not counted: the caller
        will ask again the usual way)."""
        size = max(MIN_BUCKET, 1 << (nbytes - 1).bit_length()) if nbytes else 0
        cost = size + MESSAGE_OVERHEAD
        if self._in_use + cost > self.capacity_bytes and not force:
            if not tentative:
                self._refused += 1
            return None
        self._acquired += 1
        self._in_use += cost
        if self._in_use > self._peak:
            self._peak = self._in_use
        if not size:
            return _EMPTY
        free = self._free.get(size)
        if free:
            self._reused += 1
            self._cached -= size
            return free.pop()
        return bytearray(size)

    def release(self, buf: bytearray) -> None:
        """Give a buffer from ``acquire`` back."""
        size = len(buf)
        self._in_use -= size + MESSAGE_OVERHEAD
        if size and self._cached + size <= self.capacity_bytes:
            self._free.setdefault(size, []).append(buf)
            self._cached += size

    def trim(self) -> None:
        """Let the free buffers go (a closed rank stages nothing more: its memory need not
        wait for the collector to find the closed world's reference cycles)."""
        self._free.clear()
        self._cached = 0

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(
            capacity_bytes=self.capacity_bytes,
            in_use_bytes=self._in_use,
            peak_bytes=self._peak,
            cached_bytes=self._cached,
            acquired=self._acquired,
            reused=self._reused,
            refused=self._refused,
        )


_EMPTY = bytearray(0)
