"""Bad arguments: every rank raises the typed error, prefixed with the collective's name,
before anything is sent; nothing is left pending and the communicator keeps working."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm._collectives import functions as coll
from asynccomm._collectives.ops import MAX, ReduceOp, resolve_op

A = np.arange(4, dtype=np.int32)
Call = Callable[[ac.Communicator], Any]


def _f(dtype: Any = np.int32, shape: tuple[int, ...] = (4,)) -> np.ndarray[Any, Any]:
    return np.zeros(shape, dtype)


def _readonly() -> np.ndarray[Any, Any]:
    a = _f()
    a.flags.writeable = False
    return a


#: (name, call, error type, words the message contains): every rank makes the call.
BAD: list[tuple[str, Call, type[Exception], str]] = [
    ("tag type", lambda c: coll.barrier(c, tag="1"), TypeError, "barrier: tag must be an int"),
    ("tag range", lambda c: coll.barrier(c, tag=-1), ValueError, "barrier: tag=-1"),
    ("tag span", lambda c: coll.allreduce(c, _f(), tag=ac.TAG_UB), ValueError,
     "allreduce: tag="),
    ("timeout", lambda c: coll.barrier(c, tag=0, timeout=-1), ValueError, "timeout"),
    ("choose type", lambda c: coll.barrier(c, tag=0, choose=3), TypeError,
     "barrier: choose must be callable"),
    ("choose answer", lambda c: coll.allreduce(c, _f(), tag=0, choose=lambda n, b, s: "tree"),
     ValueError, "allreduce: choose returned 'tree'"),
    ("op name", lambda c: coll.allreduce(c, _f(), op="add", tag=0), ValueError,
     "allreduce: unknown reduction op 'add'"),
    ("op type", lambda c: coll.reduce(c, _f(), _f(), op=np.add, tag=0), TypeError,
     "reduce: op must be"),
    ("complex max", lambda c: coll.allreduce(c, _f(np.complex128), op="MAX", tag=0),
     TypeError, "allreduce: MAX cannot reduce dtype complex128: complex numbers have no order"),
    ("complex min", lambda c: coll.reduce(c, _f(np.complex64), _f(np.complex64), op=ac.MIN,
                                          tag=0), TypeError, "reduce: MIN cannot reduce"),
    ("complex max rows", lambda c: coll.reduce_scatter(
        c, _f(np.complex64, (c.size, 4)), _f(np.complex64), op="max", tag=0), TypeError,
     "reduce_scatter: MAX cannot reduce dtype complex64"),
    ("not an array", lambda c: coll.allreduce(c, [1, 2], tag=0), TypeError,
     "allreduce: sendbuf must be a numpy array"),
    ("shape", lambda c: coll.allreduce(c, _f(), _f(shape=(3,)), tag=0), ValueError,
     "allreduce: recvbuf shape (3,) does not match sendbuf shape (4,)"),
    ("dtype", lambda c: coll.allreduce(c, _f(), _f(np.float32), tag=0), TypeError,
     "allreduce: recvbuf dtype float32 does not match"),
    ("unreducible", lambda c: coll.allreduce(c, np.zeros(3, "U2"), tag=0), TypeError,
     "allreduce: cannot reduce dtype"),
    ("object dtype", lambda c: coll.bcast(c, np.zeros(3, object), tag=0), TypeError,
     "bcast: "),
    ("read-only", lambda c: coll.allreduce(c, _readonly(), tag=0), ValueError,
     "allreduce: sendbuf is read-only"),
    ("not contiguous", lambda c: coll.bcast(c, np.zeros(8, np.int32)[::2], tag=0), ValueError,
     "bcast: buf must be C-contiguous"),
    ("overlap", lambda c: (lambda b: coll.allreduce(c, b[:4], b[2:6], tag=0))(_f(shape=(8,))),
     ValueError, "allreduce: recvbuf and sendbuf share memory"),
    ("root type", lambda c: coll.bcast(c, _f(), root=1.0, tag=0), TypeError,
     "bcast: root must be an int"),
    ("root range", lambda c: coll.gather(c, _f(), _f(shape=(c.size, 4)), root=c.size, tag=0),
     ValueError, "gather: root="),
    ("allgather rows", lambda c: coll.allgather(c, _f(), _f(shape=(c.size + 1, 4)), tag=0),
     ValueError, "allgather: recvbuf shape"),
    ("reduce_scatter rows",
     lambda c: coll.reduce_scatter(c, _f(shape=(c.size, 3)), _f(), tag=0), ValueError,
     "reduce_scatter: sendbuf shape"),
    ("alltoall rows", lambda c: coll.alltoall(c, _f(shape=(c.size + 1,)),
                                             _f(shape=(c.size + 1,)), tag=0),
     ValueError, "alltoall: sendbuf shape"),
    ("scatter recvbuf", lambda c: coll.scatter(c, _f(shape=(c.size, 4)), None, tag=0),
     TypeError, "scatter: recvbuf must be a numpy array"),
    ("comm", lambda c: coll.barrier(object(), tag=0), TypeError, "barrier: comm must be"),
]


async def _check_clean(world: ac.World) -> None:
    for comm in world.comms:
        stats = comm.statistics()
        assert stats.pending_ops == 0
        assert stats.matcher.posted_recvs == 0 and stats.matcher.unexpected_messages == 0
        assert stats.matcher.matched == 0


@pytest.mark.parametrize("size", [1, 3])
@pytest.mark.parametrize(("name", "bad", "error", "words"), BAD, ids=[b[0] for b in BAD])
async def test_bad_argument_raises_on_every_rank_before_sending(
        name: str, bad: Call, error: type[Exception], words: str, size: int) -> None:
    async with asyncio.timeout(10), ac.open_world(size) as world:
        for comm in world.comms:
            with pytest.raises(error) as info:
                await bad(comm)
            assert words in str(info.value)
            assert str(info.value).split(":")[0] in {
                "barrier", "bcast", "reduce", "allreduce", "allgather", "reduce_scatter",
                "gather", "scatter", "alltoall"} or name == "timeout"
        await _check_clean(world)

        async def good(comm: ac.Communicator) -> np.ndarray[Any, Any]:
            x = np.full(4, comm.rank + 1, np.int64)
            await coll.allreduce(comm, x, tag=0)
            return x

        got = await asyncio.gather(*(good(c) for c in world.comms))
        assert all((g == size * (size + 1) // 2).all() for g in got)


def test_ops_resolve_from_names_and_members() -> None:
    assert resolve_op("max", "x") is MAX is ReduceOp.MAX
    assert [resolve_op(o.value, "x") for o in ReduceOp] == list(ReduceOp)
    assert [resolve_op(n, "x") for n in ("SUM", "Max", "pRoD", "min")] == [
        ReduceOp.SUM, MAX, ReduceOp.PROD, ReduceOp.MIN]
    with pytest.raises(ValueError, match="x: unknown reduction op 'Maximum'"):
        resolve_op("Maximum", "x")
    with pytest.raises(TypeError, match="x: op must be"):
        resolve_op(None, "x")


async def test_op_names_in_any_case_reduce() -> None:
    async with asyncio.timeout(10), ac.open_world(3) as world:
        async def one(comm: ac.Communicator) -> list[float]:
            out = []
            for name in ("MAX", "Min", "SUM"):
                x = np.full(2, comm.rank + 1.0)
                await coll.allreduce(comm, x, op=name, tag=0)
                out.append(float(x[0]))
            z = np.full(2, 1 + 1j * comm.rank)  # SUM and PROD reduce complex numbers
            await coll.allreduce(comm, z, op="SUM", tag=0)
            return [*out, complex(z[0]).imag]

        got = await asyncio.gather(*(one(c) for c in world.comms))
    assert got == [[3.0, 1.0, 6.0, 3.0]] * 3


def test_bool_reduces_with_numpy_meaning() -> None:
    a, b = np.array([True, False, False]), np.array([True, True, False])
    for op, want in [("sum", [1, 1, 0]), ("prod", [1, 0, 0]), ("min", [1, 0, 0]),
                     ("max", [1, 1, 0])]:
        out = a.copy()
        resolve_op(op, "x").combine(out, b, out)
        assert out.tolist() == [bool(w) for w in want]
