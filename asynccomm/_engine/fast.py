"""What the fast lane (``steps``, ``take``, ``traced``) and the engine's general path
share: the sizes that decide how a payload is copied, a taken message's Status, and a
buffer's bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from .._core.descriptors import Descriptor, Message
from .._types import Status

if TYPE_CHECKING:
    from .request import Request

__all__ = ["LOOP_COPY_MAX", "THREAD_COPY_MIN", "TIMED_COPY_MIN",
           "byte_view", "bytes_of", "new_status", "status_of"]

#: Payloads at least this large are copied on the rank's worker thread; smaller ones are
#: cheaper inline (a 4 MiB copy holds the loop well under a millisecond or two).
THREAD_COPY_MIN = 4 << 20
#: Of a copy on the worker thread, the loop copies the first half itself, up to this many
#: bytes (about a millisecond of the loop's time here), unless the worker is done with the
#: rest first: two cores copy a 16 MiB message nearly twice as fast as one, and the loop
#: is held no longer than by an inline copy of this size: it copies one such share a turn
#: (``DeviceEngine.copy_on_thread``).
LOOP_COPY_MAX = 8 << 20
#: Inline copies at least this large are timed (matched before the copy, finished after
#: it, as on the general path): a clock read costs nothing beside them.
TIMED_COPY_MIN = 64 << 10

#: ``new_status(Status, fields)``: Status(...) goes through NamedTuple's Python-level
#: __new__; this is half the cost, and it runs once per message.
new_status = tuple.__new__


def status_of(msg: Descriptor) -> Status:
    """The Status of a message a recv or probe took (only messages wait unexpected)."""
    shape = cast(Message, msg).shape
    return new_status(Status, (msg.source, msg.tag, msg.nbytes, msg.count,
                               (msg.count,) if shape is None else shape))


def bytes_of(array: Any) -> memoryview:
    """A 1-D array's bytes."""
    mv: memoryview = array.data
    return mv if mv.format == "B" else mv.cast("B")


def byte_view(req: Request) -> memoryview:
    """A request's buffer as bytes, made the first time it is needed."""
    view = req.view
    if view is None:
        view = req.view = bytes_of(req.array)
    return view
