"""Chunking: cut a transfer into chunks and keep at most ``max_inflight`` of them moving.

How it works
------------
A ``ChunkSender`` hands out ``(index, offset, nbytes)`` chunks in order with
``next_chunk()`` and takes them back with ``chunk_done()``, like aioquic's
``QuicStreamSender.get_frame()`` with h2's flow-control window:

Rule 1: chunks cover ``[0, nbytes)`` exactly once, in order; all but the last have
``chunk_bytes`` bytes.
Rule 2: at most ``max_inflight`` chunks are handed out and not yet done; ``next_chunk()``
returns None while the window is full, and after the last chunk.
Rule 3: chunks may finish in any order; the transfer is done when every chunk is.

A zero-byte transfer has a single empty chunk, so that it still completes through the same
path as any other.  (A transport moves a payload of one chunk without one: the MPI link
tracks its single request directly.)
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Chunk", "ChunkSender"]


class Chunk(NamedTuple):
    index: int  # type: ignore[assignment]  # shadows tuple.index
    offset: int
    nbytes: int


class ChunkSender:
    """Hands out the chunks of one transfer under a credit window (see module docs).

    Raises:
        ValueError: if ``nbytes`` is negative, or ``chunk_bytes`` or ``max_inflight`` < 1.
    """

    def __init__(self, nbytes: int, *, chunk_bytes: int, max_inflight: int) -> None:
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {max_inflight}")
        self.nbytes = nbytes
        self.chunk_bytes = chunk_bytes
        self.max_inflight = max_inflight
        self.total = max(1, -(-nbytes // chunk_bytes))
        self._next = 0
        self._inflight: set[int] = set()
        self._done = 0

    def next_chunk(self) -> Chunk | None:
        """The next chunk to move, or None when the window is full or all were handed out."""
        if self._next >= self.total or len(self._inflight) >= self.max_inflight:
            return None
        index = self._next
        self._next += 1
        self._inflight.add(index)
        offset = index * self.chunk_bytes
        return Chunk(index, offset, min(self.chunk_bytes, self.nbytes - offset))

    def chunk_done(self, chunk: Chunk) -> None:
        """Return a chunk's credit.

        Raises:
            ValueError: if the chunk is not in flight (never handed out, or done twice).
        """
        try:
            self._inflight.remove(chunk.index)
        except KeyError:
            raise ValueError(f"chunk {chunk.index} is not in flight") from None
        self._done += 1

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    @property
    def done(self) -> bool:
        return self._done == self.total
