"""Descriptors: what the core knows about a message, a posted recv and a probe.

A ``Descriptor`` is what matching needs: the envelope (source, tag), a size and a dtype
name, and the posting order (``seq``, owned by the matcher).  A posted recv is a descriptor
whose ``source``/``tag`` may be wildcards, whose ``nbytes`` is its buffer's capacity (-1:
any size) and whose ``dtype`` is its buffer's (None: any).

A ``Message`` is a descriptor on its way or arrived, plus where its payload is (a tagged
payload, ``where``):

- ``AT_SENDER``: in the sender's buffer, in this process (``view``), readable until the
  send completes;
- ``STAGED``: copied into the receiver's staging pool (``view``);
- ``INLINE``: arrived with its header in a transport's buffer (``view``), valid only while
  it is being delivered: consume it or stage it then;
- ``REMOTE``: still at a sender in another process, named there by ``ident``.

The layer above subclasses these (a request doubles as its own descriptor and message, so
a message costs no extra object); the core only reads the fields declared here.
"""

from __future__ import annotations

from typing import Final

__all__ = ["AT_SENDER", "INLINE", "REMOTE", "STAGED", "WHERE_NAMES", "Descriptor", "Message"]

AT_SENDER: Final = 0
STAGED: Final = 1
INLINE: Final = 2
REMOTE: Final = 3
WHERE_NAMES: Final = ("at the sender", "staged", "inline", "remote")


class Descriptor:
    """A message's envelope and size, or a posted recv's or probe's selection.

    Attributes:
        source: the sending rank (a recv: the rank it takes from, or ``ANY_SOURCE``).
        tag: the message's tag (a recv: the tag it takes, or ``ANY_TAG``).
        nbytes: the payload's size (a recv: its buffer's capacity; -1 takes any size).
        count: the number of elements (a recv: its buffer's).
        dtype: the element type's name, e.g. ``"<f4"`` (a recv: None takes any dtype).
        seq: posting order, set by the matcher.
    """

    __slots__ = ("count", "dtype", "nbytes", "seq", "source", "tag")

    def __init__(self, source: int, tag: int, nbytes: int, count: int,
                 dtype: str | None) -> None:
        self.source = source
        self.tag = tag
        self.nbytes = nbytes
        self.count = count
        self.dtype = dtype
        self.seq = -1  # IDLE: in no queue

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(source={self.source}, tag={self.tag}, "
                f"nbytes={self.nbytes}, dtype={self.dtype!r})")


class Message(Descriptor):
    """A message at its destination or on its way: its envelope and its payload.

    Attributes:
        where: ``AT_SENDER``, ``STAGED``, ``INLINE`` or ``REMOTE`` (see the module docs).
        view: the payload's bytes where they are readable in this process, else None (a
            staged payload's are the staging pool's bytearray).
        ident: the message's id at its sender (``REMOTE``), else 0.
        shape: the sender's array shape when it is not 1-D (``(count,)``), else None.
        flow: in a traced world, the message's flow id (``_engine.tracing`` Rule 4), once numbered.
    """

    __slots__ = ("flow", "ident", "shape", "view", "where")

    flow: int | str
    view: memoryview | bytearray | None

    def __init__(self, source: int, tag: int, nbytes: int, count: int, dtype: str | None,
                 where: int, view: memoryview | bytearray | None = None,
                 ident: int = 0) -> None:
        self.source = source  # Descriptor's fields, set here: one call fewer per message
        self.tag = tag
        self.nbytes = nbytes
        self.count = count
        self.dtype = dtype
        self.seq = -1
        self.where = where
        self.view = view
        self.ident = ident
        self.shape: tuple[int, ...] | None = None
