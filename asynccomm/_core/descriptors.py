"""Descriptors: what the core knows about a message and about a posted recv or probe.

The core never touches data.  A descriptor carries the envelope (source, tag), the size and
the dtype *name*, plus one opaque ``handle`` slot that belongs to the layer above (the
engine's request, a staging buffer, a remote reference): the core stores it and hands it
back, nothing more.

These are plain slotted classes, not frozen dataclasses: one is built per message on the
hot path, and ``object.__setattr__`` in a frozen ``__init__`` costs more than the matching.
The matcher owns the ``seq`` field (posting order); nothing else writes it.
"""

from __future__ import annotations

__all__ = ["Envelope", "ProbeDescriptor", "RecvDescriptor"]


class Envelope:
    """A message at its destination: arrived whole (eager) or announced (rendezvous).

    Attributes:
        source: the sending rank.
        tag: the message's tag (never a wildcard).
        nbytes: the payload size in bytes.
        count: the number of elements.
        dtype: the element type's name (for example ``"<f4"``).
        handle: opaque to the core: where the payload is, and how to complete the sender.
        seq: posting order, set by the matcher.
    """

    __slots__ = ("count", "dtype", "handle", "nbytes", "seq", "source", "tag")

    def __init__(self, source: int, tag: int, nbytes: int, count: int, dtype: str,
                 handle: object = None) -> None:
        self.source = source
        self.tag = tag
        self.nbytes = nbytes
        self.count = count
        self.dtype = dtype
        self.handle = handle
        self.seq = -1

    def __repr__(self) -> str:
        return (f"Envelope(source={self.source}, tag={self.tag}, nbytes={self.nbytes}, "
                f"dtype={self.dtype!r})")


class RecvDescriptor:
    """A posted recv.

    Attributes:
        source: the rank to receive from, or ``ANY_SOURCE``.
        tag: the tag to receive, or ``ANY_TAG``.
        capacity: the buffer's size in bytes; ``None`` takes a message of any size.
        dtype: the buffer's element type name; ``None`` takes any dtype.
        handle: opaque to the core (the engine's request).
        seq: posting order, set by the matcher.
    """

    __slots__ = ("capacity", "dtype", "handle", "seq", "source", "tag")

    def __init__(self, source: int, tag: int, capacity: int | None, dtype: str | None,
                 handle: object = None) -> None:
        self.source = source
        self.tag = tag
        self.capacity = capacity
        self.dtype = dtype
        self.handle = handle
        self.seq = -1

    def __repr__(self) -> str:
        return (f"RecvDescriptor(source={self.source}, tag={self.tag}, "
                f"capacity={self.capacity}, dtype={self.dtype!r})")


class ProbeDescriptor:
    """A blocking probe: waits for a matching message without receiving it."""

    __slots__ = ("handle", "seq", "source", "tag")

    def __init__(self, source: int, tag: int, handle: object = None) -> None:
        self.source = source
        self.tag = tag
        self.handle = handle
        self.seq = -1

    def __repr__(self) -> str:
        return f"ProbeDescriptor(source={self.source}, tag={self.tag})"
