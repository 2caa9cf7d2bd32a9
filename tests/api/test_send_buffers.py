"""Buffers that are not numpy arrays: typed buffers (``array('d')``, a memoryview of one)
carry their elements' dtype; numpy scalars and other libraries' arrays (``__array__``,
``__dlpack__``) are refused with a hint, before anything is posted, by every op that takes
a buffer.  ``make test`` runs this file on the pure-Python lane too."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from tests.api.test_bad_input import call, check_works, snapshot
from tests.transports.test_mpi import MPIEXEC, _output, mpiexec


class _ArrayLike:
    """Another library's array: numpy can read it, asynccomm is not told how."""

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        return np.arange(3.0)


class _DLPack:
    """An array that only speaks DLPack (a GPU tensor, say)."""

    def __dlpack__(self, stream: Any = None) -> object:
        raise AssertionError("asynccomm must not take it")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


Op = Callable[[ac.Communicator, Any], object]

#: Every way a buffer reaches a rank's ops: (name, call with the buffer, send or recv).
OPS: list[tuple[str, Op, str]] = [
    ("send", lambda c, b: c.send(b, 1), "send"),
    ("isend", lambda c, b: c.isend(b, 1), "send"),
    ("recv", lambda c, b: c.recv(b, 1), "recv"),
    ("irecv", lambda c, b: c.irecv(b, 1), "recv"),
    ("batch-send", lambda c, b: c.batch([ac.SendOp(b, 1), ac.RecvOp(np.zeros(1), 1)]),
     "send"),
    ("batch-recv", lambda c, b: c.batch([ac.SendOp(np.zeros(1), 1), ac.RecvOp(b, 1)]),
     "recv"),
    ("ibatch-send", lambda c, b: c.ibatch([ac.SendOp(b, 1)]), "send"),
    ("sendrecv-send", lambda c, b: c.sendrecv(b, 1, np.zeros(1), 1), "send"),
    ("sendrecv-recv", lambda c, b: c.sendrecv(np.zeros(1), 1, b, 1), "recv"),
]

#: (name, make the buffer, what the message says for a send, for a recv).
REFUSED: list[tuple[str, Callable[[], Any], str, str]] = [
    ("float32", lambda: np.float32(1), r"^send buffer is a numpy scalar \(float32\), which "
     r"would travel as bytes: send np\.asarray\(x\) \(a 0-d array\) or a 1-element array$",
     r"^recv buffer is a numpy scalar \(float32\), which cannot be written"),
    ("int64", lambda: np.int64(7), r"numpy scalar \(int64\)", r"numpy scalar \(int64\)"),
    ("__array__", _ArrayLike, r"^send buffer is a _ArrayLike, not a numpy array: pass "
     r"np\.asarray\(x\) or np\.from_dlpack\(x\)$", r"shares x's memory"),
    ("__dlpack__", _DLPack, r"^send buffer is a _DLPack, not a numpy array: pass "
     r"np\.asarray\(x\) or np\.from_dlpack\(x\)$", r"np\.from_dlpack\(x\)"),
]


@pytest.mark.parametrize(("name", "make", "send_says", "recv_says"), REFUSED,
                         ids=[r[0] for r in REFUSED])
@pytest.mark.parametrize(("op_name", "op", "side"), OPS, ids=[o[0] for o in OPS])
async def test_numpy_scalars_and_foreign_arrays_are_refused(
        name: str, make: Callable[[], Any], send_says: str, recv_says: str, op_name: str,
        op: Op, side: str) -> None:
    async with asyncio.timeout(10), ac.open_world(2) as world:
        c0, _ = world.comms
        before = snapshot(world)
        for _ in range(2):  # the second time too (nothing cached the first)
            with pytest.raises(TypeError, match=send_says if side == "send" else recv_says):
                await call(lambda: op(c0, make()))
        assert snapshot(world) == before, "something was posted before the error"
        await check_works(world)


async def test_a_typed_memoryview_carries_its_dtype() -> None:
    async with asyncio.timeout(10), ac.open_world(2) as world:
        c0, c1 = world.comms
        await c0.send(memoryview(array("d", [1.5, 2.5])), 1, 1)
        got, status = await c1.recv_new(0, 1)
        assert got.dtype == np.float64 and got.tolist() == [1.5, 2.5]
        assert status == ac.Status(0, 1, 16, 2)

        await c0.send(array("i", [7, -8, 9]), 1, 2)  # the array itself, format 'i'
        out = np.zeros(3, np.intc)
        await c1.recv(out, 0, 2)
        assert out.tolist() == [7, -8, 9]

        into = array("d", [0.0, 0.0, 0.0])
        rreq = c1.irecv(memoryview(into), 0, 3)
        sreq = c0.isend(np.array([1.0, 2.0]), 1, 3)
        assert (await rreq).count == 2 and await sreq is None
        assert into.tolist() == [1.0, 2.0, 0.0]

        await c0.batch([ac.SendOp(memoryview(array("f", [0.5])), 1, 4)])
        into32 = array("f", [0.0, 0.0])
        (status,) = await c1.batch([ac.RecvOp(memoryview(into32), 0, 4, count=1)])
        assert status.count == 1 and into32.tolist() == [0.5, 0.0]
        await check_works(world)


async def test_a_typed_memoryview_is_matched_by_its_dtype() -> None:
    async with asyncio.timeout(10), ac.open_world(2) as world:
        c0, c1 = world.comms
        await c0.send(np.arange(2, dtype=np.int32), 1, 5)
        into = array("d", [0.0, 0.0])
        with pytest.raises(ac.DTypeMismatchError):
            await c1.recv(memoryview(into), 0, 5)
        assert into.tolist() == [0.0, 0.0]
        out = np.zeros(2, np.int32)
        await c1.recv(out, 0, 5)  # the message was kept for a recv that fits
        assert out.tolist() == [0, 1]
        await c0.send(memoryview(array("d", [1.0])), 1, 6, count=1, dtype="float64")
        with pytest.raises(TypeError, match="disagrees with the send buffer's dtype float64"):
            c0.isend(memoryview(array("d", [1.0])), 1, 6, dtype=np.uint8)
        await c1.recv(np.zeros(1), 0, 6)
        await check_works(world)


async def test_bytes_still_carry_uint8() -> None:
    async with asyncio.timeout(10), ac.open_world(2) as world:
        c0, c1 = world.comms
        for buf in (b"ab", bytearray(b"ab"), memoryview(b"ab"), array("B", b"ab"),
                    memoryview(b"ab").cast("c")):
            await c0.send(buf, 1, 7)
            got, _ = await c1.recv_new(0, 7)
            assert got.dtype == np.uint8 and got.tobytes() == b"ab"


@pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec is not installed in the venv")
@pytest.mark.skipif(ac.launched_by_mpi(), reason="this test starts mpiexec itself")
def test_typed_and_refused_buffers_on_mpi() -> None:
    proc = mpiexec(2, "-m", "tests.api.mpi_buffers_runner", limit=60)
    assert proc.returncode == 0, _output(proc)
    assert proc.stdout.split() == ["ok", "ok"]
