"""Random programs of collectives, splits, dups and objects in which one rank misbehaves:
it cancels a call before it ran or while it runs, comes late past the others' timeouts, or
fails (closes and raises).  The same program runs on every rank, in-process and on MPI.

Invariants, checked on every rank's record (``check``):
- no wrong result reported as success: every call that returned gave exactly the
  expected data (sums, gathered rows, the object sent, a sub-communicator of the right
  members and size);
- every failure is typed (an ``AsyncCommError``; the misbehaving rank's own
  cancellation; its own failure);
- a split or dup made a communicator on every rank, or on none, except on a rank that
  left the call (its timeout, its cancellation) after every rank said it was ready: its
  end of the new communicator is closed (``_forming`` Rule 2);
- an object is received at most once, and never when its send reported failure;
- a collective that raised left every buffer it was given as it was;
- no hang: every call is bounded (``TIMEOUT``), and the whole program by its caller;
- afterwards (when no rank failed) the communicator's next collectives are right on
  every rank.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

import asynccomm as ac

#: Every call's timeout, and how late a late rank comes (seconds; model seconds on the
#: virtual clock).
TIMEOUT = 0.25
LATE = 0.6
STEPS = ("allreduce", "allreduce_big", "bcast", "allgather", "alltoall", "barrier",
         "split", "dup", "objects")
MISDEEDS = ("cancel_before", "cancel_during", "late", "fail")


@dataclass(frozen=True)
class Program:
    size: int
    steps: tuple[str, ...]
    culprit: int  # the rank that misbehaves (or -1: none)
    at: int  # at which step
    misdeed: str


@st.composite
def programs(draw: st.DrawFn, size: int | None = None,
             misdeeds: tuple[str, ...] = MISDEEDS) -> Program:
    """A program for ``size`` ranks (None: 2 to 4)."""
    size = draw(st.integers(2, 4)) if size is None else size
    steps = tuple(draw(st.lists(st.sampled_from(STEPS), min_size=1, max_size=5)))
    if draw(st.integers(0, 4)) == 0:
        return Program(size, steps, -1, -1, "")
    return Program(size, steps, draw(st.integers(0, size - 1)),
                   draw(st.integers(0, len(steps) - 1)), draw(st.sampled_from(misdeeds)))


class Failed(Exception):
    """The misbehaving rank's own failure."""


Record = list[tuple[str, Any]]  # per step: ("ok", what) | ("error", exception)


async def run_rank(comm: ac.Communicator, program: Program) -> Record:
    """This rank's part of ``program``: one entry per step, then ("after", ok)."""
    record: Record = []
    for i, step in enumerate(program.steps):
        misdeed = program.misdeed if (comm.rank, i) == (program.culprit, program.at) else ""
        if misdeed == "fail":
            await comm.aclose()
            raise Failed(f"rank {comm.rank} fails at step {i}")
        if misdeed == "late":
            await asyncio.sleep(LATE)
        try:
            record.append(("ok", await _step(comm, step, i, misdeed)))
        except (ac.AsyncCommError, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError) and not misdeed:
                raise
            record.append(("error", exc))
    if program.misdeed != "fail" or program.culprit < 0:
        record.append(("after", await _after(comm)))
    return record


async def _act(call: Any, misdeed: str, *kept: Any) -> Any:
    """Await the library's ``call`` (already made), or cancel it as ``misdeed`` says; if it
    raises, each of the ``kept`` arrays must be as it was before the call."""
    before = [k.copy() for k in kept]
    try:
        return await _misbehave(call, misdeed)
    except BaseException:
        for k, b in zip(kept, before, strict=True):
            if not (k == b).all():
                raise Unkept(f"a collective that raised changed a buffer: {b} -> {k}") from None
        raise


class Unkept(AssertionError):
    """A collective that raised left a buffer changed."""


async def _misbehave(call: Any, misdeed: str) -> Any:
    if misdeed not in ("cancel_before", "cancel_during"):
        return await call
    task = asyncio.ensure_future(call)
    if misdeed == "cancel_during":
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    task.cancel()
    return await task


async def _step(comm: ac.Communicator, step: str, i: int, misdeed: str) -> Any:
    r, p = comm.rank, comm.size
    if step in ("allreduce", "allreduce_big"):
        x = np.full(5 if step == "allreduce" else 10000, r + 1 + i, np.int64)
        await _act(comm.allreduce(x, timeout=TIMEOUT), misdeed, x)
        return int(x[0]), int(x[-1])
    if step == "bcast":
        b = np.full(3, 100 + i if r == i % p else -1, np.int64)
        await _act(comm.bcast(b, root=i % p, timeout=TIMEOUT), misdeed, b)
        return b.tolist()
    if step == "allgather":
        out = np.full((p, 2), -1, np.int64)
        mine = np.full(2, 10 * r + i, np.int64)
        await _act(comm.allgather(mine, out, timeout=TIMEOUT), misdeed, out, mine)
        return out[:, 0].tolist()
    if step == "alltoall":
        out = np.full((p, 2), -1, np.int64)
        send = np.array([[100 * r + j + i] * 2 for j in range(p)], np.int64)
        await _act(comm.alltoall(send, out, timeout=TIMEOUT), misdeed, out, send)
        return out[:, 0].tolist()
    if step == "barrier":
        await _act(comm.barrier(timeout=TIMEOUT), misdeed)
        return None
    if step in ("split", "dup"):
        sub = await _act(comm.split((r + i) % 2, timeout=TIMEOUT) if step == "split"
                         else comm.dup(timeout=TIMEOUT), misdeed)
        assert sub is not None
        try:
            x = np.full(2, r + 1, np.int64)
            try:
                await sub.allreduce(x, timeout=TIMEOUT)
                total: Any = int(x[0])
            except ac.AsyncCommError as exc:  # a member that left closed its end
                total = exc
            return sub.size, total
        finally:
            await sub.aclose()
    assert step == "objects"
    obj = {"from": r, "step": i, "a": np.arange(20000) + r}  # past the eager limit
    send = comm.isend_obj(obj, (r + 1) % p, tag=i, timeout=TIMEOUT)
    try:
        got, status = await _act(comm.recv_obj((r - 1) % p, tag=i, timeout=TIMEOUT),
                                 misdeed)
        received: Any = (got["from"], got["step"], bool((got["a"] == np.arange(20000)
                                                          + got["from"]).all()))
    except (ac.AsyncCommError, asyncio.CancelledError) as exc:
        received = exc
    try:
        await send
        sent: Any = "sent"
    except ac.AsyncCommError as exc:
        sent = exc
    return sent, received


async def _after(comm: ac.Communicator) -> bool:
    x = np.full(3, comm.rank + 1, np.int64)
    await comm.allreduce(x, timeout=10 * LATE)
    return bool((x == comm.size * (comm.size + 1) // 2).all())


def check(program: Program, records: list[Record | BaseException]) -> None:
    """Every invariant of the module docs over every rank's record (rank order)."""
    p = program.size
    failed = program.misdeed == "fail" and program.culprit >= 0
    for rank, rec in enumerate(records):
        if isinstance(rec, BaseException):
            assert failed and rank == program.culprit and isinstance(rec, Failed), (rank, rec)
            continue
        for i, (kind, what) in enumerate(rec):
            if kind == "after":
                assert what is True, (rank, "the next collective is wrong")
                continue
            culprit_here = (rank, i) == (program.culprit, program.at)
            if kind == "error":
                assert isinstance(what, ac.AsyncCommError) or culprit_here, (rank, i, what)
                continue
            _right(program.steps[i], i, rank, p, what)
    if failed:
        return
    for i, step in enumerate(program.steps):
        if step not in ("split", "dup"):
            continue
        made = [isinstance(rec, list) and rec[i][0] == "ok" for rec in records]
        if any(made):  # then every rank that has none left the call itself (Rule 2 of
            for r, rec in enumerate(records):  # ``_forming``), after every rank was ready
                if not made[r] and (r, i) != (program.culprit, program.at):
                    assert isinstance(rec, list), rec
                    exc = rec[i][1]
                    assert isinstance(exc, ac.CommTimeoutError) and "left the call" in str(
                        exc), (step, i, r, made, exc)


def _right(step: str, i: int, rank: int, p: int, what: Any) -> None:
    """A call that returned gave exactly the expected data."""
    if step in ("allreduce", "allreduce_big"):
        want = sum(r + 1 + i for r in range(p))
        assert what == (want, want), (step, i, rank, what)
    elif step == "bcast":
        assert what == [100 + i] * 3, (step, i, rank, what)
    elif step == "allgather":
        assert what == [10 * r + i for r in range(p)], (step, i, rank, what)
    elif step == "alltoall":
        assert what == [100 * r + rank + i for r in range(p)], (step, i, rank, what)
    elif step in ("split", "dup"):
        size, total = what
        members = ([r for r in range(p) if (r + i) % 2 == (rank + i) % 2] if step == "split"
                   else list(range(p)))
        assert size == len(members), (step, i, rank, what)
        assert isinstance(total, ac.AsyncCommError) or total == sum(m + 1 for m in members), (
            step, i, rank, what)
    elif step == "objects":
        sent, received = what
        if not isinstance(received, BaseException):
            assert received == ((rank - 1) % p, i, True), (step, i, rank, what)


def check_objects(program: Program, records: list[Record | BaseException]) -> None:
    """An object whose send failed was not received (none is received twice: each recv
    takes one, and each step has one sender per receiver)."""
    p = program.size
    for i, step in enumerate(program.steps):
        if step != "objects":
            continue
        for r in range(p):
            src, dst = records[r], records[(r + 1) % p]
            if isinstance(src, BaseException) or isinstance(dst, BaseException):
                continue
            s_kind, s_what = src[i]
            d_kind, d_what = dst[i]
            if s_kind == "ok" and d_kind == "ok":
                sent, _ = s_what
                _, received = d_what
                if isinstance(sent, BaseException):
                    assert isinstance(received, BaseException), (
                        "an object whose send failed was received", i, r, s_what, d_what)
