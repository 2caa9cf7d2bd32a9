"""The fast lane's per-message primitives: the C accelerator agrees with the pure-Python
versions on every buffer, and the world uses whichever ``ASYNCCOMM_PURE_PYTHON`` asks for.

``make test`` runs this file twice: with the accelerator (when it was built) and with
``ASYNCCOMM_PURE_PYTHON=1``.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asynccomm as ac
from asynccomm._buffers import dtype_name
from asynccomm._engine import lane as _fastlane

BUILT = importlib.util.find_spec("asynccomm._native._lane") is not None
PURE = os.environ.get("ASYNCCOMM_PURE_PYTHON", "") not in ("", "0")
needs_c = pytest.mark.skipif(not BUILT, reason="the C accelerator was not built here")

DTYPES = ["|u1", "|i1", "<i2", "<u4", "<i8", "<f2", "<f4", "<f8", "<c16", "|b1", ">f8", ">i4"]


def test_the_world_uses_what_the_environment_asks_for() -> None:
    assert _fastlane.ACCELERATED is (BUILT and not PURE)
    assert (_fastlane.copy is None) is not _fastlane.ACCELERATED


@st.composite
def buffers(draw: st.DrawFn) -> Any:
    """Buffers of every kind the fast lane is shown: arrays of many dtypes, shapes and
    layouts (some read-only), array subclasses, and plain byte buffers."""
    kind = draw(st.sampled_from(["array", "array", "array", "subclass", "bytes",
                                 "bytearray", "memoryview"]))
    n = draw(st.integers(0, 9))
    if kind == "bytes":
        return bytes(n)
    if kind == "bytearray":
        return bytearray(n)
    if kind == "memoryview":
        return memoryview(bytearray(n))
    dt = np.dtype(draw(st.sampled_from(DTYPES)))
    if draw(st.booleans()):
        dtype_name(dt, "send")  # a dtype seen before: its name is known
    shape = draw(st.sampled_from([(n,), (), (n, 2), (0, 3), (2 * n,)]))
    arr = np.zeros(shape, dtype=dt)
    if shape == (2 * n,) and draw(st.booleans()):
        arr = arr[::2]  # strided: not contiguous
    if draw(st.booleans()):
        arr.flags.writeable = False
    if kind == "subclass":
        arr = arr.view(np.matrix) if arr.ndim == 2 else np.ma.masked_array(arr)
    return arr


def _expected(buf: Any, writable: bool) -> tuple[str, int, int] | None:
    """What the fast lane may take, spelled out."""
    if type(buf) is not np.ndarray or buf.ndim != 1 or not buf.flags.c_contiguous:
        return None
    if writable and not buf.flags.writeable:
        return None
    try:
        name = dtype_name(buf.dtype, "send")
    except TypeError:
        return None
    if np.dtype(name) != buf.dtype:
        return None
    return name, buf.nbytes, buf.size


@settings(max_examples=300, deadline=None)
@given(buffers(), st.booleans())
def test_pure_inspect_takes_exactly_the_fast_lanes_buffers(buf: Any, writable: bool) -> None:
    got = _fastlane._inspect(buf, writable)
    assert got is None or got == _expected(buf, writable)


@needs_c
@settings(max_examples=300, deadline=None)
@given(buffers(), st.booleans())
def test_c_inspect_agrees_with_pure_inspect(buf: Any, writable: bool) -> None:
    from asynccomm._buffers import _NAMES
    from asynccomm._native import _lane

    _lane.set_dtype_names(_NAMES)  # what importing _engine.lane does unless pure Python is asked
    assert _lane.inspect(buf, writable) == _fastlane._inspect(buf, writable)


@needs_c
@settings(max_examples=200, deadline=None)
@given(st.integers(0, 64), st.integers(0, 64), st.data())
def test_c_copy_moves_exactly_the_bytes_asked_for(dlen: int, slen: int,
                                                  data: st.DataObject) -> None:
    from asynccomm._native import _lane

    nbytes = data.draw(st.integers(0, min(dlen, slen)))
    src_kind = data.draw(st.sampled_from(["array", "bytes", "memoryview"]))
    payload = bytes(range(slen))
    src: Any = {"array": np.frombuffer(payload, np.uint8).copy(), "bytes": payload,
                "memoryview": memoryview(bytearray(payload))}[src_kind]
    if data.draw(st.booleans()):
        dst: Any = np.full(dlen, 0xEE, np.uint8)
        out = dst
    else:
        dst = memoryview(bytearray(b"\xee" * dlen))
        out = np.frombuffer(dst, np.uint8)
    _lane.copy(dst, src, nbytes)
    assert bytes(out[:nbytes]) == payload[:nbytes]
    assert bytes(out[nbytes:]) == b"\xee" * (dlen - nbytes)  # nothing past nbytes


@needs_c
def test_c_copy_refuses_what_does_not_fit_and_read_only_targets() -> None:
    from asynccomm._native import _lane

    dst = np.zeros(4, np.uint8)
    with pytest.raises(ValueError, match="copy of 5 bytes"):
        _lane.copy(dst, bytes(8), 5)
    with pytest.raises(ValueError, match="copy of -1 bytes"):
        _lane.copy(dst, bytes(8), -1)
    assert not dst.any()
    ro = np.zeros(4, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(BufferError):
        _lane.copy(ro, bytes(4), 4)
    with pytest.raises(BufferError):
        _lane.copy(bytes(4), bytes(4), 4)  # bytes are immutable


@pytest.mark.parametrize("shape", [(), (0, 3), (2, 0), (3, 4)])
async def test_arrays_of_any_shape_travel_with_and_without_count(shape: tuple[int, ...]) -> None:
    """0-d and empty n-d arrays go the general way, with ``count=`` too."""
    src = (np.arange(int(np.prod(shape)), dtype=np.float32) + 1).reshape(shape)
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        out = np.zeros(shape, np.float32)
        r = c1.irecv(out, 0, 1)
        await c0.send(src, 1, 1)
        assert (await r).count == src.size
        np.testing.assert_array_equal(out, src)
        out2 = np.zeros(shape, np.float32)
        r = c1.irecv(out2, 0, 2, count=src.size)
        await c0.send(src, 1, 2, count=src.size)
        assert (await r).count == src.size
        np.testing.assert_array_equal(out2, src)
