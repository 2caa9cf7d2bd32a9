"""The C lane (``_lane*.c``): what it gives Python.  See README.md here."""

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Path", "PendingBuffers", "Ring", "ShmNode", "ShmPath", "Tally", "Words", "address",
           "charge", "configure", "copy", "inspect", "perf_counter", "readv", "recv", "send",
           "set_dtype_names", "share", "woken"]

# -- the entry points (configured by asynccomm._comm.native) ------------------------------

def configure(spec: dict[str, tuple[Any, ...]], /) -> None:
    """What the lane works with, as ``asynccomm._comm.native.spec`` makes it.

    Raises:
        TypeError: a part is missing, of the wrong length, or a declared slot is not one.
    """

def send(comm: Any, buf: Any, dst: Any, tag: Any, handle: bool, stream: Any, timeout: Any,
         /) -> Any:
    """True, or with ``handle`` the done Request, once the message went the fast lane; the
    posted Request of a send to another process that waits for its recv; False, having
    done nothing, when the Python steps must run.  ``stream``: None (the default stream)
    or the op's Stream; ``timeout``: None (the communicator's default) or the op's."""

def recv(comm: Any, buf: Any, src: Any, tag: Any, handle: bool, stream: Any, timeout: Any,
         /) -> Any:
    """The Status of a message already waiting (with ``handle``, its done Request), else
    the posted Request; None, having done nothing, when the Python steps must run.
    ``stream`` and ``timeout``: as ``send``'s."""

# -- the Python steps' buffer primitives ----------------------------------------------------

def set_dtype_names(names: dict[Any, str], /) -> None:
    """The dtype -> name dict that ``inspect`` and the lane consult."""

def inspect(buf: Any, writable: bool, /) -> tuple[str, int, int] | None:
    """``(name, nbytes, count)`` of an exact 1-D C-contiguous ndarray of a known dtype
    (writeable, if asked); None otherwise."""

def copy(dst: Any, src: Any, nbytes: int, /) -> None:
    """Copy the first ``nbytes`` bytes of ``src`` into ``dst``.

    Raises:
        ValueError: ``nbytes`` does not fit either buffer.
        BufferError: ``dst`` is read-only.
    """

def address(buf: Any, /) -> int:
    """The address of a contiguous buffer's first byte.

    Raises:
        TypeError: ``buf`` is not a buffer.
        BufferError: it is not contiguous.
    """

class PendingBuffers:
    """The buffers of a rank's pending recvs (``_lane_pending.c``): the C twin of
    ``asynccomm._buffers.PendingBuffers``, with the same answers.  ``address`` finds a
    buffer's address (``address`` here or None: the buffer protocol's, without a call).
    It keeps each pending request alive until ``remove``.

    Raises (``conflict``, ``add``):
        TypeError: ``buf`` is not a buffer (``add``: always; ``conflict``: when another
            buffer of its owner is pending).
    """

    def __init__(self, address: Callable[[Any], int] | None = None) -> None: ...
    def __len__(self) -> int: ...
    def conflict(self, buf: Any, nbytes: int, /) -> object | None:
        """The request whose pending buffer overlaps the first ``nbytes`` of ``buf``."""
    def add(self, buf: Any, nbytes: int, req: object, /) -> None:
        """The first ``nbytes`` of ``buf`` are pending, for ``req``."""
    def remove(self, req: object, /) -> None:
        """``req``'s buffer is no longer pending (nothing if it was not)."""

# -- the shared-memory link's (asynccomm.transports._shm_ring, shm) ------------------------

class Words:
    """Sequentially consistent 64-bit accesses to a shared mapping, by byte offset (each
    offset checked: 8-byte aligned, inside the buffer)."""

    def __init__(self, buffer: Any, /) -> None: ...
    def load(self, offset: int, /) -> int: ...
    def store(self, offset: int, value: int, /) -> None: ...
    def cas(self, offset: int, expected: int, new: int, /) -> bool: ...
    def release(self) -> None: ...

def readv(pid: int, into: Any, address: int, /) -> int:
    """Copy ``len(into)`` bytes from process ``pid``'s ``address`` into ``into``; the
    bytes copied.

    Raises:
        OSError: the kernel refuses (``process_vm_readv``).
    """

def share(words: Words, board: int, gen: int, pid: int, local: int, remote: int, nbytes: int,
          piece: int, budget: int, wait_ns: int, write: bool, /) -> bool:
    """Claim pieces of a copy of ``nbytes`` shared by two processes from the board at
    ``board`` (generation ``gen``) and copy them, up to ``budget`` bytes: out of ``local``
    here into ``remote`` in process ``pid`` (``write``), else the other way.  The writer:
    True once no piece is left to claim.  The reader: True once every piece is copied (a
    piece given back is copied by it; it waits up to ``wait_ns`` for the writer's).

    Raises:
        OSError: a copy failed (the writer's piece is given back first).
        ValueError: ``gen`` not in 1..2**32-1, ``nbytes`` or ``piece`` not above 0.
    """

# -- what the tests compare with the Python ----------------------------------------------

def charge(nbytes: int, /) -> int:
    """``wire.charge(nbytes)``, as the lane counts it."""

def perf_counter() -> float:
    """The lane's reading of ``time.perf_counter()``."""

def woken() -> int:
    """How many waiting tasks the lane has woken so far (a request's waiter future set): a
    poll that sees the count move has made a task ready (``Progress.wait_here``)."""

# -- the flight recorder's ring and tallies ------------------------------------------------

Entry = tuple[int, int, int, int, int, int, float, float, float]

class Ring:
    """The last ``maxlen`` flight entries, stored as numbers."""

    def __init__(self, maxlen: int) -> None: ...
    @property
    def maxlen(self) -> int: ...
    def append(self, entry: Entry, /) -> None: ...
    def clear(self) -> None: ...
    def __iter__(self) -> Iterator[Entry]: ...
    def __len__(self) -> int: ...

class Tally:
    """A flight tally: ``n`` and ``nbytes`` (ints), ``w`` and ``c`` (floats)."""

    n: int
    nbytes: int
    w: float
    c: float

# -- the MPI link's per-message steps ------------------------------------------------------

def mpi_calls(library: str, byte: int, /) -> bool:
    """Take ``MPI_Test``, ``MPI_Start``, ``MPI_Isend`` and ``MPI_Irecv`` from the MPI
    library at ``library`` if it is loaded already (its handles C ints; ``byte``:
    ``MPI_BYTE``'s handle, as mpi4py gives it): False, and no direct calls, where it is
    not."""

class Path:
    """``MPITransport``'s per-message steps in C (the lane must be configured); a peer in
    ``link.ring_peers`` (a set, or None) keeps the link's Python ``send_now``, ``send``
    and ``fetch``."""

    def __init__(self, link: Any, progress: Any, wire: Any, fields: dict[str, bytes],
                 names: dict[bytes, str], mpi_exception: type[BaseException], inline: Any,
                 ctrl_slots: int, remote: Any, chunk_bytes: int,
                 active: Any, max_inflight: int = 2) -> None: ...
    def send_now(self, dest: int, tag: int, array: Any, nbytes: int, count: int,
                 dtype: str, /) -> bool: ...
    def land(self) -> bool: ...
    def repost(self) -> None: ...
    def send(self, msg: Any, dest: int, /) -> None: ...
    def fetch(self, msg: Any, rank: int, into: memoryview, ready: Any, /) -> None: ...
    def test(self) -> bool: ...
    def spin(self, until: float, share: Callable[[], None] | None, /) -> bool: ...
    def direct(self, comm: Any, handle: int, from_handle: Callable[[int], Any],
               max_bytes: int, /) -> bool:
        """The control sends on ``comm`` (``handle``: its MPI handle) of at most
        ``max_bytes``, and the data requests, call MPI directly, where ``mpi_calls`` found
        it; a send not complete at once is kept as ``from_handle(handle)``, its buffer in
        ``progress._held``."""

# -- the shared-memory link's per-message steps --------------------------------------------

class ShmPath:
    """``ShmTransport``'s per-message steps in C (the lane must be configured); a rank
    with no ring on the segment (``outs`` None and ``bells`` -1: the hybrid link's peer
    on another host) is left to the link's Python ``send_now``."""

    def __init__(self, link: Any, channels: Any, wire: Any, fields: dict[str, bytes],
                 names: dict[bytes, str], inline: Any, words: Words, view: memoryview,
                 procs: list[int], node: Any, dead: set[int], ctrl: list[Any],
                 bells: list[int], outs: list[tuple[Any, int, int, int, int] | None],
                 ins: list[tuple[int, Any, int, int, int, int]], ring_bytes: int, wrap: int,
                 armed: int) -> None: ...
    def send_now(self, dest: int, tag: int, array: Any, nbytes: int, count: int,
                 dtype: str, /) -> bool: ...
    def put(self, dest: int, raw: bytes, /) -> bool: ...
    def fragments(self, dest: int, view: memoryview, off: int, tag: int, /) -> int: ...
    def fragmenting(self, kind: int, fragment: int, pulls: dict[tuple[int, int], Any],
                    crowded: bool, /) -> None: ...
    def answering(self, kind: int, active: Any, read_chunk: int,
                  take: Callable[..., None], /) -> None: ...
    def poll(self) -> bool: ...

class ShmNode:
    """``transports.shm.Node``'s poll, peek, spin, doorbells and kick in C, over ``paths``
    (the node's own list: one ``ShmPath`` per link)."""

    def __init__(self, paths: list[ShmPath], node: Any) -> None: ...
    def poll(self) -> bool: ...
    def peek(self) -> bool: ...
    def spin(self, burst: int, share: bool, /) -> bool: ...
    def arm(self) -> bool: ...
    def disarm(self) -> None: ...
    def kick(self) -> None: ...
