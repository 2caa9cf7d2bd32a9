"""Python objects as messages: ``send_obj``/``recv_obj`` and their non-blocking forms.

Rule 1: an object is pickled with protocol 5.  Contiguous buffers inside it (numpy arrays,
bytes-like objects that offer them) travel out of band, as messages of their own, so they
are never copied into the pickle.  Everything else travels in the object's header.
Rule 2: the header is one message on the communicator itself, matched like any other (by
source and tag, wildcards included, in order).  Its dtype is ``OBJECT_DTYPE`` (bytes of a
kind no array recv takes), so an array recv never takes an object and ``recv_obj`` never
takes an array: each fails with ``DTypeMismatchError`` and the message waits for the right
recv.  The out-of-band buffers follow on the private context, on a tag the header names
(unique to the object), so they never match anything else.
Rule 3: the buffers are sent only once the header is done (taken or staged at its
destination, when it can no longer be withdrawn); from then on the object is committed,
and its buffers wait for the receiver with no timeout (``timeout=`` bounds the header).
Cancelling or timing out a send before that withdraws the header and nothing else was sent;
after it, the buffers go all the same and the send reports success (the cancellation is
delivered at the task's next await), as for any op that completed.  The receiving side is
the same: once ``recv_obj`` took a header it receives the buffers whatever happens.
Rule 4: unpickling runs code chosen by the sender.  Receive objects only from peers you
trust, as with ``pickle`` itself.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from ._core.states import Kind
from ._exceptions import DTypeMismatchError
from ._groups import OBJECT_TAGS
from ._request import Request, TaskRequest, defer_cancellation, settle
from ._types import ANY_SOURCE, ANY_TAG, Status

if TYPE_CHECKING:
    from ._communicator import Communicator
    from ._engine import DeviceEngine

__all__ = ["OBJECT_DTYPE", "ObjectsMixin"]

#: The dtype name of object headers (numpy's one-byte void).
OBJECT_DTYPE = "|V1"
#: magic, the buffers' tag on the private context, the number of buffers; then one size
#: (8 bytes) per buffer, then the pickle.
_HEAD = struct.Struct("<4sII")
_MAGIC = b"ACo1"
_SIZE = struct.Struct("<Q")


def _pickle(obj: object, what: str) -> tuple[bytes, list[memoryview]]:
    """The pickle of ``obj`` and its out-of-band buffers (contiguous ones only).

    Raises:
        TypeError: ``obj`` cannot be pickled.
    """
    buffers: list[memoryview] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        try:
            raw = buf.raw()
        except BufferError:
            return True  # not contiguous: in the pickle
        buffers.append(raw)
        return False

    try:
        data = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    except Exception as exc:  # pickling fails with many types: one typed error
        raise TypeError(f"{what}: the object cannot be pickled: {type(exc).__name__}: "
                        f"{exc}") from exc
    return data, buffers


class ObjectsMixin:
    """``send_obj``, ``recv_obj``, ``isend_obj`` and ``irecv_obj`` (see the module docs)."""

    if not TYPE_CHECKING:  # (mypy would refuse the fields the class that mixes it in lists)
        __slots__ = ()  # that class lists the fields

    rank: int
    _engine: DeviceEngine
    _loop: asyncio.AbstractEventLoop
    _obj_seq: int

    if TYPE_CHECKING:
        def _check_ready(self) -> None: ...
        def _check_rank(self, peer: object, what: str, *, wildcard: bool) -> int: ...
        def _check_tag(self, tag: object, *, wildcard: bool) -> int: ...
        def _timeout(self, timeout: object) -> float | None: ...
        def _private(self) -> Communicator: ...

    async def send_obj(self, obj: Any, dst: int, tag: int = 0, *,
                       timeout: float | None = None) -> None:
        """Send a picklable object (pickle protocol 5; numpy arrays inside it travel as
        buffers, not through the pickle) to ``dst`` with ``tag``.

        Raises:
            TypeError: the object cannot be pickled; bad arguments (nothing is sent).
            ValueError, RuntimeError, CommClosedError: as ``send``.
            CommBrokenError, CommTimeoutError: as ``send`` (a timeout withdraws the object
                only while its header has not been taken or staged; after that its buffers
                wait for the receiver, whatever the timeout).
        """
        await self.isend_obj(obj, dst, tag, timeout=timeout)

    def isend_obj(self, obj: Any, dst: int, tag: int = 0, *,
                  timeout: float | None = None) -> TaskRequest:
        """Post ``send_obj`` and return its request (await it, or pass it to ``wait_all``).

        Raises:
            TypeError, ValueError, RuntimeError, CommClosedError: as ``send_obj``.
        """
        self._check_ready()
        d = self._check_rank(dst, "dst", wildcard=False)
        t = self._check_tag(tag, wildcard=False)
        limit = self._timeout(timeout)
        data, buffers = _pickle(obj, "send_obj")
        self._obj_seq = seq = (self._obj_seq + 1) % OBJECT_TAGS
        parts_tag = OBJECT_TAGS + seq
        head = bytearray(_HEAD.pack(_MAGIC, parts_tag, len(buffers)))
        for buf in buffers:
            head += _SIZE.pack(buf.nbytes)
        head += data
        engine = self._engine
        header = Request(engine, Kind.SEND, d, t, memoryview(head), len(head), len(head),
                         OBJECT_DTYPE, engine.default_stream, limit)
        engine.default_stream._submit(header)  # posted now: headers go in call order
        return TaskRequest(header, lambda: self._send_buffers(header, buffers, d, parts_tag),
                           f"send_obj to {d}")

    async def _send_buffers(self, header: Request, buffers: list[memoryview], dst: int,
                            parts_tag: int) -> None:
        await header  # cancelled or timed out before it was done: withdrawn, nothing sent
        if buffers:
            private = self._private()
            await _committed([_part(private, Kind.SEND, dst, parts_tag,
                                    np.frombuffer(buf, np.uint8)) for buf in buffers])

    async def recv_obj(self, src: int = ANY_SOURCE, tag: int = ANY_TAG, *,
                       timeout: float | None = None) -> tuple[Any, Status]:
        """Receive an object sent with ``send_obj`` from ``src`` with ``tag`` (wildcards
        allowed).  Unpickling runs code the sender chose: receive only from peers you trust.

        Returns:
            The object and a ``Status`` (``nbytes``: the header's and buffers' bytes;
            ``count`` 1; ``shape`` ``()``).

        Raises:
            TypeError, ValueError, RuntimeError, CommClosedError: as ``recv``.
            DTypeMismatchError: the next fitting message is an array, not an object (it
                waits for an array recv).
            CommBrokenError, CommTimeoutError: as ``recv``.
            Exception: whatever unpickling raised (the message was taken).
        """
        result: tuple[Any, Status] = await self.irecv_obj(src, tag, timeout=timeout)
        return result

    def irecv_obj(self, src: int = ANY_SOURCE, tag: int = ANY_TAG, *,
                  timeout: float | None = None) -> TaskRequest:
        """Post ``recv_obj`` and return its request; awaiting it gives ``(obj, status)``.

        Raises:
            TypeError, ValueError, RuntimeError, CommClosedError: as ``recv``.
        """
        self._check_ready()
        s = self._check_rank(src, "src", wildcard=True)
        t = self._check_tag(tag, wildcard=True)
        limit = self._timeout(timeout)
        engine = self._engine
        header = Request(engine, Kind.RECV, s, t, None, -1, 0, OBJECT_DTYPE,
                         engine.default_stream, limit)
        engine.default_stream._submit(header)
        return TaskRequest(header, lambda: self._recv_buffers(header), f"recv_obj from {s}")

    async def _recv_buffers(self, header: Request) -> tuple[Any, Status]:
        try:
            arr, status = await header
        except DTypeMismatchError as exc:
            exc.add_note(f"rank {self.rank}: recv_obj matched a message that is an array, not "
                         "an object (sent with send, not send_obj); it waits for an array "
                         "recv")
            raise
        raw = memoryview(arr).cast("B")
        magic, parts_tag, n = _HEAD.unpack_from(raw)
        if magic != _MAGIC:
            raise ValueError(f"rank {self.rank}: recv_obj from rank {status.source} tag "
                             f"{status.tag}: the header is not an object's")
        sizes = [_SIZE.unpack_from(raw, _HEAD.size + 8 * i)[0] for i in range(n)]
        data = raw[_HEAD.size + 8 * n:]
        buffers = [np.empty(size, np.uint8) for size in sizes]
        if buffers:
            private = self._private()
            await _committed([_part(private, Kind.RECV, status.source, parts_tag, buf)
                              for buf in buffers])
        obj = pickle.loads(data, buffers=buffers)
        return obj, Status(status.source, status.tag, status.nbytes + sum(sizes), 1, ())


def _part(private: Communicator, kind: Kind, peer: int, tag: int,
          buf: np.ndarray[Any, Any]) -> Request:
    """Post one buffer of a committed object on the private context, with no timeout (not
    even ``ASYNCCOMM_TIMEOUT``): once a header is done, its buffers must arrive, or the
    object would be half delivered (Rule 3)."""
    engine = private._engine
    req = Request(engine, kind, peer, tag, None, buf.nbytes, buf.size, "|u1",
                  engine.default_stream, None, buf)
    engine.default_stream._submit(req)
    return req


async def _committed(reqs: list[Request]) -> None:
    """Wait for the buffers of a committed object: a cancellation waits until they are
    done and is delivered at the task's next await (Rule 3)."""
    try:
        await settle(reqs)
    except asyncio.CancelledError as exc:
        await settle(reqs, shield=True)
        defer_cancellation(exc)
    for r in reqs:
        if r.exception() is not None:
            raise r.exception()  # type: ignore[misc]
