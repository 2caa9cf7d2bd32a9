"""The collectives: argument checks, the algorithm's choice, and what happens on failure.

How it works
------------
Rule 1 (checks first).  Every argument is checked before anything is sent: a bad one raises
``TypeError`` or ``ValueError`` whose message starts with the collective's name, and the
communicator is left exactly as it was.  Arguments that do not depend on the rank (shapes,
dtypes, op, root, tag) get the same check on every rank, so every rank raises alike.
Rule 2 (tags).  A call uses tags ``tag`` .. ``tag + TAG_SPAN - 1`` (only the first three), so
concurrent collectives on one communicator need tags ``TAG_SPAN`` apart, and point-to-point
traffic of the program must keep out of the span.
Rule 3 (failures).  An error of a point-to-point op leaves the call as that op's own error
(``CommBrokenError``, ``CommTimeoutError``, ``DeadlockError``, ``MatchError``...) with a note
naming the collective, its algorithm, its tags and the rank; before it leaves, every op of
the call still pending is withdrawn (matched transfers finish), and so on cancellation.
Rule 4 (timeout).  ``timeout`` bounds the whole call, not each op, and expires as
``CommTimeoutError``; None means no bound beyond each op's own default.
Rule 5 (choice).  ``choose(names, nbytes, size)`` picks the algorithm (see
``_collectives.costs``); it is asked before anything is sent, and must answer alike on every
rank.
Rule 5b (host work).  ``host(algorithm, nbytes)``, when given, is awaited once the
arguments are checked and the algorithm chosen, before the first message and within the
timeout (a cluster model spends the call's CPU work there, ``sim/host.py``): a call refused
for its arguments spends none, and a timeout bounds it with the rest.  What it returns
(``Steps``, or None) is awaited after each wait of the algorithm: a model spends each
step's work where the step runs.
Rule 6 (outputs are written last).  The algorithm works on scratch arrays of this call's
own; the caller's output buffer is written only once the call has succeeded, in one copy
at its end.  So a call that raises (timeout, cancellation, a failed peer) leaves every
buffer it was given exactly as it was, in place ones included: the input is still there
to retry with.  The price is one extra array of the output's size while the call runs.
The scratch (that array and the algorithm's temporaries) comes from the rank's pool
(``_collectives.scratch``): it goes back there once the call succeeded and its output is
written, so calls back to back reuse warm pages instead of faulting fresh ones in; a call
that raises drops its scratch (an op withdrawn or in flight may yet write into it), and
two calls in flight at once never hold the same array.
Rule 7 (alike on every rank).  Every rank must pass the same collective, algorithm, root
and op, and blocks of the same shape and dtype.  The first four set where in its tag block
the call's messages go (``_signature``), so ranks that differ never pair their messages:
they fail by their timeout (or as a deadlock) instead of computing with each other's
data; a block of another size or dtype fails the recv that meets it with a ``MatchError``
(Rule 3), a shorter one included.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from .._buffers import dtype_name
from .._engine import waits as _waits
from .._engine.options import check_timeout
from .._exceptions import AsyncCommError, CommTimeoutError, MatchError
from .._types import TAG_UB
from .algorithms import ALGORITHMS, P2P, Exchange, Steps
from .costs import Chooser, default_choice
from .ops import reducible, resolve_op
from .scratch import Scratch, scratch_for

__all__ = ["TAG_SPAN", "algorithms", "allgather", "allreduce", "alltoall", "barrier", "bcast",
           "gather", "reduce", "reduce_scatter", "scatter"]

#: Each call may use tags ``tag`` .. ``tag + TAG_SPAN - 1``.
TAG_SPAN = 4096

Array = np.ndarray[Any, Any]
#: Awaited with the qualified algorithm (``"allreduce.ring"``) and the call's bytes (Rule 5b).
HostWork = Callable[[str, int], Awaitable["Steps | None"]]


# -- checks -----------------------------------------------------------------------------------

def _comm(where: str, comm: object) -> P2P:
    for attr in ("isend", "irecv", "rank", "size"):
        if not hasattr(comm, attr):
            raise TypeError(f"{where}: comm must be a Communicator, got {type(comm).__name__}")
    return comm  # type: ignore[return-value]


def _tag(where: str, tag: object) -> int:
    if type(tag) is bool or not isinstance(tag, int | np.integer):
        raise TypeError(f"{where}: tag must be an int, got {type(tag).__name__}")
    t = int(tag)
    if not 0 <= t <= TAG_UB - TAG_SPAN + 1:
        raise ValueError(f"{where}: tag={t} is out of range 0..{TAG_UB - TAG_SPAN + 1} (a "
                         f"collective uses tags tag..tag+{TAG_SPAN - 1})")
    return t


def _root(where: str, root: object, size: int) -> int:
    if type(root) is bool or not isinstance(root, int | np.integer):
        raise TypeError(f"{where}: root must be an int rank, got {type(root).__name__}")
    if not 0 <= int(root) < size:
        raise ValueError(f"{where}: root={root} is out of range for a world of size {size}")
    return int(root)


def _array(where: str, name: str, buf: object, *, writable: bool = False,
           reduce: bool = False) -> Array:
    if type(buf) is not np.ndarray:
        raise TypeError(f"{where}: {name} must be a numpy array, got {type(buf).__name__}")
    try:
        dtype_name(buf.dtype, name)
    except TypeError as exc:
        raise TypeError(f"{where}: {exc}") from None
    if reduce and not reducible(buf.dtype):
        raise TypeError(f"{where}: cannot reduce dtype {buf.dtype}")
    if not buf.flags.c_contiguous:
        raise ValueError(f"{where}: {name} must be C-contiguous" + (
            "" if not writable else ": pass a contiguous buffer, then copy it into this view "
            "(numpy.ascontiguousarray would make a copy, and the result would land there)"))
    if writable and not buf.flags.writeable:
        raise ValueError(f"{where}: {name} is read-only")
    return buf


def _same(where: str, name: str, buf: Array, shape: tuple[int, ...], dtype: np.dtype[Any],
          shape_of: str, dtype_of: str) -> None:
    if buf.shape != shape:
        raise ValueError(f"{where}: {name} shape {buf.shape} does not match {shape_of} {shape}")
    if buf.dtype != dtype:
        raise TypeError(f"{where}: {name} dtype {buf.dtype} does not match {dtype_of}'s "
                        f"{dtype}")


def _apart(where: str, a: Array, a_name: str, b: Array, b_name: str,
           allowed: Array | None = None) -> None:
    """Refuse buffers that share memory, unless ``a`` is exactly ``allowed`` (in place)."""
    if not np.may_share_memory(a, b):  # exact: both are contiguous
        return
    if allowed is not None and _alias(a, allowed):
        return
    raise ValueError(f"{where}: {a_name} and {b_name} share memory"
                     + ("" if allowed is None else
                        f" (in place, {a_name} must be exactly {b_name}'s own block)"))


def _alias(a: Array, b: Array) -> bool:
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.nbytes == b.nbytes and a.dtype == b.dtype)


def _flat(a: Array) -> Array:
    return a.reshape(-1)


def _choose(where: str, choose: object, nbytes: int, size: int) -> str:
    names = list(ALGORITHMS[where])
    if choose is not None and not callable(choose):
        raise TypeError(f"{where}: choose must be callable or None, got {type(choose).__name__}")
    chooser: Chooser = choose if choose is not None else default_choice
    qualified = [f"{where}.{n}" for n in names]
    got = chooser(qualified, nbytes, size)
    if got in qualified:
        return str(got).partition(".")[2]
    if got in names:
        return str(got)
    raise ValueError(f"{where}: choose returned {got!r}, not one of {', '.join(qualified)}")


# -- running ------------------------------------------------------------------------------------

async def _run(where: str, algo: str, comm: P2P, tag: int, timeout: float | None,
               body: Callable[[Exchange], Awaitable[None]], sign: object = None, *,
               host: HostWork | None = None, nbytes: int = 0,
               scratch: Scratch | None = None) -> None:
    """Run ``body`` (Rules 3, 4, 5b and 7); ``sign``: the arguments every rank must pass
    alike that the sizes of its messages do not show (a root, an op)."""
    if host is not None:
        body = _after(lambda: host(f"{where}.{algo}", nbytes), body)
    ex = Exchange(comm, tag + _signature(where, algo, sign), scratch)
    _waits.inside(ex, where, algo, TAG_SPAN)  # named in hang reports and dumps
    note = (f"during {where} ({algo}, tags {tag}..{tag + TAG_SPAN - 1}) on rank {comm.rank} "
            f"of {comm.size}")
    try:
        if timeout is None:
            await _guarded(ex, body)
            return
        async with _waits.armed_timeout(timeout) as cm:  # seen by the deadlock proof
            await _guarded(ex, body)
    except AsyncCommError as exc:
        raise _noted(exc, note, where) from exc.__cause__
    except TimeoutError:
        if timeout is None or not cm.expired():
            raise
        pending = ex.pending_at_withdrawal
        waiting = ", ".join(repr(r) for r in pending) or "nothing"
        err = CommTimeoutError(f"{where}: rank {comm.rank} did not finish within {timeout} s; "
                               f"pending then: {waiting} (withdrawn)", rank=comm.rank,
                               op=where, peer=pending[0].peer if pending else -1, tag=tag,
                               timeout=timeout)
        err.add_note(note)
        raise err from None


def _after(first: Callable[[], Awaitable[Steps | None]],
           body: Callable[[Exchange], Awaitable[None]]) -> Callable[[Exchange], Awaitable[None]]:
    """``body`` with ``first()`` awaited before it, and the steps' work it returns spent
    after each wait (Rule 5b)."""

    async def both(ex: Exchange) -> None:
        ex.steps = await first()
        await body(ex)

    return both


async def _guarded(ex: Exchange, body: Callable[[Exchange], Awaitable[None]]) -> None:
    try:
        await body(ex)
    except BaseException:
        await ex.withdraw()
        raise


def _signature(where: str, algo: str, sign: object) -> int:
    """The call's offset in its tag block (Rule 7): the same on every rank that passed the
    same collective, algorithm, root and op; most likely another where one differs."""
    return 3 * (zlib.crc32(f"{where}|{algo}|{sign}".encode()) % (TAG_SPAN // 3))


def _noted(exc: AsyncCommError, note: str, where: str) -> AsyncCommError:
    """A copy of ``exc`` with the note (one error object may reach several ranks)."""
    err = copy.copy(exc)
    err.__traceback__ = exc.__traceback__
    err.add_note(note)
    if isinstance(exc, MatchError):
        err.add_note(f"hint: every rank must pass {where} buffers of the same shape and dtype "
                     "(and the same root and op); a rank's buffers differ from its peer's")
    return err


# -- the collectives -----------------------------------------------------------------------------

async def barrier(comm: Any, *, tag: int, timeout: float | None = None,
                  choose: Chooser | None = None,
                  host: HostWork | None = None) -> None:
    """Return once every rank has entered the barrier (dissemination: ceil(log2 p) steps).

    Raises:
        TypeError, ValueError: bad arguments (nothing is sent).
        AsyncCommError: a point-to-point op failed (Rule 3); ``CommTimeoutError`` when
            ``timeout`` expired.
    """
    c, t = _comm("barrier", comm), _tag("barrier", tag)
    limit = check_timeout(timeout)
    algo = _choose("barrier", choose, 0, c.size)
    await _run("barrier", algo, c, t, limit, ALGORITHMS["barrier"][algo], host=host)


async def bcast(comm: Any, buf: Any, root: int = 0, *, tag: int, timeout: float | None = None,
                choose: Chooser | None = None,
                host: HostWork | None = None) -> None:
    """Copy ``buf`` of ``root`` into ``buf`` of every rank (binomial tree).

    Raises:
        TypeError, ValueError, AsyncCommError: as ``barrier``.
    """
    c, t = _comm("bcast", comm), _tag("bcast", tag)
    r = _root("bcast", root, c.size)
    b = _array("bcast", "buf", buf, writable=c.rank != r)
    limit = check_timeout(timeout)
    algo = _choose("bcast", choose, b.nbytes, c.size)
    sc = scratch_for(c, b.nbytes)
    work = b if c.rank == r else sc.empty_like(b)  # (Rule 6)

    async def body(ex: Exchange) -> None:
        await ALGORITHMS["bcast"][algo](ex, _flat(work), r)

    await _run("bcast", algo, c, t, limit, body, r, host=host, nbytes=b.nbytes, scratch=sc)
    if work is not b:
        b[...] = work
    sc.done()


async def reduce(comm: Any, sendbuf: Any, recvbuf: Any, op: Any = "sum", root: int = 0, *,
                 tag: int, timeout: float | None = None,
                 choose: Chooser | None = None,
                 host: HostWork | None = None) -> None:
    """Reduce every rank's ``sendbuf`` with ``op`` into ``recvbuf`` of ``root`` (binomial
    tree); ``recvbuf`` is used at the root only (elsewhere it may be None), and may be
    ``sendbuf`` itself there (in place).

    Raises:
        TypeError, ValueError, AsyncCommError: as ``barrier``.
    """
    c, t = _comm("reduce", comm), _tag("reduce", tag)
    o = resolve_op(op, "reduce", sendbuf)
    r = _root("reduce", root, c.size)
    s = _array("reduce", "sendbuf", sendbuf, reduce=True)
    out: Array | None = None
    if c.rank == r:
        out = _array("reduce", "recvbuf", recvbuf, writable=True)
        _same("reduce", "recvbuf", out, s.shape, s.dtype, "sendbuf shape", "sendbuf")
        if out is not s:
            _apart("reduce", out, "recvbuf", s, "sendbuf")
    limit = check_timeout(timeout)
    algo = _choose("reduce", choose, s.nbytes, c.size)

    sc = scratch_for(c, s.nbytes)
    acc = sc.copy(s)  # (Rule 6)

    async def body(ex: Exchange) -> None:
        await ALGORITHMS["reduce"][algo](ex, acc, o, r)

    await _run("reduce", algo, c, t, limit, body, (r, o), host=host, nbytes=s.nbytes,
               scratch=sc)
    if out is not None:
        _flat(out)[...] = acc
    sc.done()


async def allreduce(comm: Any, sendbuf: Any, recvbuf: Any = None, op: Any = "sum", *,
                    tag: int, timeout: float | None = None,
                    choose: Chooser | None = None,
                    host: HostWork | None = None) -> None:
    """Reduce every rank's ``sendbuf`` with ``op`` into every rank's ``recvbuf`` (None, or
    ``sendbuf`` itself: in place).  Every rank gets the same bits.

    Raises:
        TypeError, ValueError, AsyncCommError: as ``barrier``.
    """
    c, t = _comm("allreduce", comm), _tag("allreduce", tag)
    o = resolve_op(op, "allreduce", sendbuf)
    s = _array("allreduce", "sendbuf", sendbuf, reduce=True, writable=recvbuf is None)
    out = s
    if recvbuf is not None and recvbuf is not s:
        out = _array("allreduce", "recvbuf", recvbuf, writable=True)
        _same("allreduce", "recvbuf", out, s.shape, s.dtype, "sendbuf shape", "sendbuf")
        _apart("allreduce", out, "recvbuf", s, "sendbuf")
    elif recvbuf is s:
        _array("allreduce", "recvbuf", s, writable=True)
    limit = check_timeout(timeout)
    algo = _choose("allreduce", choose, s.nbytes, c.size)

    sc = scratch_for(c, s.nbytes)
    work = sc.copy(s)  # (Rule 6)

    async def body(ex: Exchange) -> None:
        await ALGORITHMS["allreduce"][algo](ex, work, o)

    await _run("allreduce", algo, c, t, limit, body, o, host=host, nbytes=s.nbytes,
               scratch=sc)
    _flat(out)[...] = work
    sc.done()


def _rows(where: str, big: Array, big_name: str, small: Array, small_name: str,
          size: int) -> None:
    _same(where, big_name, big, (size, *small.shape), small.dtype,
          f"(size, *{small_name}.shape) =", small_name)


async def allgather(comm: Any, sendbuf: Any, recvbuf: Any, *, tag: int,
                    timeout: float | None = None, choose: Chooser | None = None,
                    host: HostWork | None = None) -> None:
    """Gather every rank's ``sendbuf`` into row i of every rank's ``recvbuf`` (shape
    ``(size, *sendbuf.shape)``); ``sendbuf`` may be ``recvbuf[rank]`` (in place).

    Raises:
        TypeError, ValueError, AsyncCommError: as ``barrier``.
    """
    c, t = _comm("allgather", comm), _tag("allgather", tag)
    s = _array("allgather", "sendbuf", sendbuf)
    out = _array("allgather", "recvbuf", recvbuf, writable=True)
    _rows("allgather", out, "recvbuf", s, "sendbuf", c.size)
    _apart("allgather", s, "sendbuf", out, "recvbuf", allowed=out[c.rank, ...])
    limit = check_timeout(timeout)
    algo = _choose("allgather", choose, out.nbytes, c.size)
    sc = scratch_for(c, out.nbytes)
    work = sc.empty_like(out)  # (Rule 6)
    await _run("allgather", algo, c, t, limit,
               lambda ex: ALGORITHMS["allgather"][algo](ex, _flat(s), _flat(work)),
               host=host, nbytes=out.nbytes, scratch=sc)
    out[...] = work
    sc.done()


async def reduce_scatter(comm: Any, sendbuf: Any, recvbuf: Any, op: Any = "sum", *, tag: int,
                         timeout: float | None = None,
                         choose: Chooser | None = None,
                         host: HostWork | None = None) -> None:
    """Reduce every rank's ``sendbuf`` (shape ``(size, *recvbuf.shape)``) with ``op`` and
    leave row i of the result in rank i's ``recvbuf``.

    Raises:
        TypeError, ValueError, AsyncCommError: as ``barrier``.
    """
    c, t = _comm("reduce_scatter", comm), _tag("reduce_scatter", tag)
    o = resolve_op(op, "reduce_scatter", sendbuf)
    s = _array("reduce_scatter", "sendbuf", sendbuf, reduce=True)
    out = _array("reduce_scatter", "recvbuf", recvbuf, writable=True)
    _rows("reduce_scatter", s, "sendbuf", out, "recvbuf", c.size)
    _apart("reduce_scatter", out, "recvbuf", s, "sendbuf", allowed=s[c.rank, ...])
    limit = check_timeout(timeout)
    algo = _choose("reduce_scatter", choose, s.nbytes, c.size)
    sc = scratch_for(c, s.nbytes)
    work = sc.empty_like(out)  # (Rule 6)
    await _run("reduce_scatter", algo, c, t, limit,
               lambda ex: ALGORITHMS["reduce_scatter"][algo](ex, _flat(s), _flat(work), o), o,
               host=host, nbytes=s.nbytes, scratch=sc)
    out[...] = work
    sc.done()


async def gather(comm: Any, sendbuf: Any, recvbuf: Any, root: int = 0, *, tag: int,
                 timeout: float | None = None, choose: Chooser | None = None,
                 host: HostWork | None = None) -> None:
    """Gather every rank's ``sendbuf`` into row i of ``recvbuf`` (shape
    ``(size, *sendbuf.shape)``) of ``root``; ``recvbuf`` is used at the root only.

    Raises:
        TypeError, ValueError, AsyncCommError: as ``barrier``.
    """
    c, t = _comm("gather", comm), _tag("gather", tag)
    r = _root("gather", root, c.size)
    s = _array("gather", "sendbuf", sendbuf)
    out: Array | None = None
    if c.rank == r:
        out = _array("gather", "recvbuf", recvbuf, writable=True)
        _rows("gather", out, "recvbuf", s, "sendbuf", c.size)
        _apart("gather", s, "sendbuf", out, "recvbuf", allowed=out[r, ...])
    limit = check_timeout(timeout)
    algo = _choose("gather", choose, s.nbytes * c.size, c.size)
    sc = scratch_for(c, s.nbytes * c.size)
    work = None if out is None else sc.empty_like(out)  # (Rule 6)
    await _run("gather", algo, c, t, limit, lambda ex: ALGORITHMS["gather"][algo](
        ex, _flat(s), None if work is None else _flat(work), r), r,
        host=host, nbytes=s.nbytes * c.size, scratch=sc)
    if out is not None:
        out[...] = work
    sc.done()


async def scatter(comm: Any, sendbuf: Any, recvbuf: Any, root: int = 0, *, tag: int,
                  timeout: float | None = None, choose: Chooser | None = None,
                  host: HostWork | None = None) -> None:
    """Send row i of ``sendbuf`` (shape ``(size, *recvbuf.shape)``) of ``root`` to rank i's
    ``recvbuf``; ``sendbuf`` is used at the root only.

    Raises:
        TypeError, ValueError, AsyncCommError: as ``barrier``.
    """
    c, t = _comm("scatter", comm), _tag("scatter", tag)
    r = _root("scatter", root, c.size)
    out = _array("scatter", "recvbuf", recvbuf, writable=True)
    s: Array | None = None
    if c.rank == r:
        s = _array("scatter", "sendbuf", sendbuf)
        _rows("scatter", s, "sendbuf", out, "recvbuf", c.size)
        _apart("scatter", out, "recvbuf", s, "sendbuf", allowed=s[r, ...])
    limit = check_timeout(timeout)
    algo = _choose("scatter", choose, out.nbytes * c.size, c.size)
    sc = scratch_for(c, out.nbytes * c.size)
    work = sc.empty_like(out)  # (Rule 6)
    await _run("scatter", algo, c, t, limit, lambda ex: ALGORITHMS["scatter"][algo](
        ex, None if s is None else _flat(s), _flat(work), r), r,
        host=host, nbytes=out.nbytes * c.size, scratch=sc)
    out[...] = work
    sc.done()


async def alltoall(comm: Any, sendbuf: Any, recvbuf: Any, *, tag: int,
                   timeout: float | None = None, choose: Chooser | None = None,
                   host: HostWork | None = None) -> None:
    """Send row j of rank i's ``sendbuf`` to row i of rank j's ``recvbuf`` (both of shape
    ``(size, ...)``, alike).

    Raises:
        TypeError, ValueError, AsyncCommError: as ``barrier``.
    """
    c, t = _comm("alltoall", comm), _tag("alltoall", tag)
    s = _array("alltoall", "sendbuf", sendbuf)
    out = _array("alltoall", "recvbuf", recvbuf, writable=True)
    if s.ndim == 0 or s.shape[0] != c.size:
        raise ValueError(f"alltoall: sendbuf shape {s.shape} must start with the world size "
                         f"{c.size}")
    _same("alltoall", "recvbuf", out, s.shape, s.dtype, "sendbuf shape", "sendbuf")
    _apart("alltoall", out, "recvbuf", s, "sendbuf")
    limit = check_timeout(timeout)
    algo = _choose("alltoall", choose, s.nbytes, c.size)
    sc = scratch_for(c, s.nbytes)
    work = sc.empty_like(out)  # (Rule 6)
    await _run("alltoall", algo, c, t, limit,
               lambda ex: ALGORITHMS["alltoall"][algo](ex, _flat(s), _flat(work)),
               host=host, nbytes=s.nbytes, scratch=sc)
    out[...] = work
    sc.done()


def algorithms(collective: str) -> Sequence[str]:
    """The algorithm names of ``collective`` (short form)."""
    return tuple(ALGORITHMS[collective])

