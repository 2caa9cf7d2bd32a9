"""Rendezvous payloads across processes, moved in chunks: ``Progress``'s mover.

A payload up to ``CHUNK_BYTES`` moves in one MPI ``Isend``/``Irecv``, tracked as it is;
a larger one in chunks of that size, ``MAX_INFLIGHT`` at a time (``_core.chunking``), so
MPI's progress calls copy a bounded amount each while the loop waits for them.  Each
chunk's request is tracked by the progress task (``_track``), which polls without backing
off while any is in flight (``_data``) and starts the next chunk as one completes.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from .._core.chunking import Chunk, ChunkSender

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["CHUNK_BYTES", "MAX_INFLIGHT", "Mover"]

#: Rendezvous data moves in chunks of this size, ``MAX_INFLIGHT`` at a time per transfer.
#: MPICH (ch4, UCX) copies a whole message within one progress call on the receiver (a
#: 16 MiB ``Irecv`` completes in one ``Test`` of about 1.1 ms, as long as a blocking
#: ``Recv``), so the chunk sets the longest the loop is held: while 256 MiB moved, the
#: longest gap was 1.4-1.8 ms with 8 MiB chunks, 2.8-3.1 ms with 16 MiB and 5-6 ms with
#: 32 MiB.  Each chunk is an MPI rendezvous of its own, and cutting costs: a 16 MiB message
#: and its 1-byte ack took ~105 us more than raw mpi4py's as one request, ~130 us in 8 MiB
#: chunks and ~150 us in 4 MiB chunks (medians of paired runs, 2 ranks on one host).  What
#: remained at 16 MiB was not in the chunking or the polling (longer data bursts, or one
#: more poll as a burst ends, changed nothing): it was the announcement and ``CTS`` before
#: MPI's own rendezvous (a 16 MiB message now goes early, ``EARLY_MAX``), and the Python
#: steps between the recv's completion and the ack, which run after the copy has turned
#: the caches over (they take ~2-3x as long after a 16 MiB copy as after a 1 MiB one).
CHUNK_BYTES = 16 << 20
#: (1, 2 and 3 measured alike at 64 MiB, within the noise of this host: 93-98% of raw.)
MAX_INFLIGHT = 2


class Mover:
    """Moves payloads in chunks for ``Progress`` (see module docs), which provides the
    communicator, the count of chunks in flight, request tracking and waking."""

    comm: MPI.Intracomm
    _data: int

    if TYPE_CHECKING:
        def _track(self, req: MPI.Request, cb: Callable[[], None] | None) -> None: ...
        def _wake(self) -> None: ...

    def push(self, view: memoryview, dest: int, tag: int, done: Callable[[], None]) -> None:
        """Send ``view`` to ``dest`` on ``tag`` in chunks; ``done()`` once it is all sent."""
        self._move(view, dest, tag, done, self.comm.Isend)

    def pull(self, view: memoryview, source: int, tag: int, done: Callable[[], None]) -> None:
        """Receive into ``view`` from ``source`` on ``tag`` in chunks; ``done()`` once in.
        One data recv is tested at once: MPICH copies a transfer it has seen announced
        (an early message's) in the first poll of the recv, so the recv completes in the
        call that posted it, not at the task's next poll."""
        self._move(view, source, tag, done, self.comm.Irecv, now=True)

    def adopt(self, req: MPI.Request, done: Callable[[], None]) -> None:
        """Track ``req``, a data request posted already (an early data send, untested
        until now): ``done()`` now if it has completed (its receiver took the data
        already), else once it completes; it counts as one in flight meanwhile."""
        if req.Test():
            done()
            return
        self._data += 1
        self._track(req, partial(self._moved_whole, done))
        self._wake()

    def _move(self, view: memoryview, peer: int, tag: int, done: Callable[[], None],
              start: Callable[..., MPI.Request], *, now: bool = False) -> None:
        n = len(view)
        if n <= CHUNK_BYTES:  # one MPI request (most transfers): no chunk bookkeeping
            req = start(view, peer, tag)
            if now and req.Test():  # (see ``pull``)
                done()
                return
            self._data += 1
            self._track(req, partial(self._moved_whole, done))
            self._wake()
            return
        chunks = ChunkSender(n, chunk_bytes=CHUNK_BYTES, max_inflight=MAX_INFLIGHT)
        self._more(chunks, view, peer, tag, done, start)

    def _moved_whole(self, done: Callable[[], None]) -> None:
        self._data -= 1
        done()

    def _more(self, chunks: ChunkSender, view: memoryview, peer: int, tag: int,
              done: Callable[[], None], start: Callable[..., MPI.Request]) -> None:
        while (chunk := chunks.next_chunk()) is not None:
            req = start(view[chunk.offset:chunk.offset + chunk.nbytes], peer, tag)
            self._data += 1
            self._track(req, partial(self._moved, chunks, chunk, view, peer, tag, done, start))
        self._wake()

    def _moved(self, chunks: ChunkSender, chunk: Chunk, view: memoryview,
               peer: int, tag: int, done: Callable[[], None],
               start: Callable[..., MPI.Request]) -> None:
        self._data -= 1
        chunks.chunk_done(chunk)
        if chunks.done:
            done()
        else:
            self._more(chunks, view, peer, tag, done, start)
