"""The index of pending recv buffers against a brute-force model: a buffer conflicts with a
pending one exactly when their bytes overlap, whatever the order of checks, adds and
removes, with the C accelerator's ``address`` and with ``ctypes``', for the Python class and
its C twin (``_native/_lane_pending.c``)."""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asynccomm._buffers import PendingBuffers
from asynccomm._buffers import address as ctypes_address
from asynccomm._engine import lane

ADDRESSES = [pytest.param(ctypes_address, id="ctypes")]
if lane.address is not ctypes_address:
    ADDRESSES.append(pytest.param(lane.address, id="native"))

NOT_BUILT = pytest.mark.skipif(lane.LANE is None, reason="the C lane is not built here")
C_CLASS = lane.LANE.PendingBuffers if lane.LANE is not None else None
#: The index classes: the Python one, and the C lane's (marked native).
CLASSES = [pytest.param(PendingBuffers, id="python"),
           pytest.param(C_CLASS, id="C", marks=[pytest.mark.native, NOT_BUILT])]

ROWS, WIDTH = 12, 4
# op: (what, array index, first row, rows, request number)
OPS = st.lists(st.tuples(st.sampled_from(["check+add", "add", "remove", "check"]),
                         st.integers(0, 1), st.integers(0, ROWS - 1), st.integers(1, 3),
                         st.integers(0, 9)), max_size=40)


def _bounds(buf: Any) -> tuple[int, int]:
    start = int(buf.__array_interface__["data"][0])
    return start, start + buf.nbytes


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("address", ADDRESSES)
@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_a_buffer_conflicts_exactly_when_it_overlaps_a_pending_one(cls: Any, address: Any,
                                                                   ops: list[Any]) -> None:
    arrays = [np.zeros((ROWS, WIDTH)), np.zeros((ROWS, WIDTH))]
    index = cls(address)
    pending: dict[int, tuple[object, Any]] = {}  # number -> (request, buffer)
    for what, a, first, rows, number in ops:
        buf = arrays[a][first:first + rows].reshape(-1)  # a new view each time, as users make
        lo, hi = _bounds(buf)
        overlapping = [req for req, other in pending.values()
                       if _bounds(other)[0] < hi and lo < _bounds(other)[1]]
        if what == "remove":
            if number in pending:
                index.remove(pending.pop(number)[0])
            continue
        if what in ("check", "check+add"):
            found = index.conflict(buf, buf.nbytes)
            assert (found in overlapping) if overlapping else found is None
        if what in ("add", "check+add") and not overlapping and number not in pending:
            req = object()
            index.add(buf, buf.nbytes, req)
            pending[number] = (req, buf)
        assert len(index) == len(pending)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("address", ADDRESSES)
def test_what_a_check_found_is_used_only_for_the_buffer_it_checked(cls: Any,
                                                                   address: Any) -> None:
    """A check of one buffer, then the add of another of the same owner: the add takes the
    other's own address (not the checked one's)."""
    block = np.zeros((4, 2))
    index = cls(address)
    first, second, third = object(), object(), object()
    index.add(block[0], 16, first)
    assert index.conflict(block[1], 16) is None
    index.add(block[2], 16, second)  # not the checked buffer
    index.add(block[1], 16, third)
    assert index.conflict(block[2], 16) is second
    assert index.conflict(block[1], 16) is third
    assert index.conflict(block[3], 16) is None
    index.remove(second)
    assert index.conflict(block[2], 16) is None


@pytest.mark.native
@NOT_BUILT
def test_the_native_address_is_the_buffers_first_byte() -> None:
    assert lane.LANE is not None
    block = np.zeros((3, 5))
    row = block[2]
    assert lane.LANE.address(row) == ctypes_address(row) == _bounds(row)[0]
    row.flags.writeable = False  # read-only buffers have an address too
    assert lane.LANE.address(row) == _bounds(row)[0]
    with pytest.raises(TypeError):
        lane.LANE.address(object())


@pytest.mark.parametrize("cls", CLASSES)
@settings(max_examples=60, deadline=None)
@given(rows=st.permutations(range(ROWS)), done=st.permutations(range(ROWS)))
def test_rows_added_and_removed_in_any_order_are_found_until_removed(
        cls: Any, rows: list[int], done: list[int]) -> None:
    """Rows of one array (as pre-posted recvs), added in any order (ascending: appends),
    removed in any other (from either end or the middle)."""
    block = np.zeros((ROWS, WIDTH))
    index = cls(lane.address)
    reqs = {r: object() for r in rows}
    for r in rows:
        assert index.conflict(block[r], block[r].nbytes) is None
        index.add(block[r], block[r].nbytes, reqs[r])
    live = set(rows)
    for r in done:
        index.remove(reqs[r])
        live.discard(r)
        for k in range(ROWS):
            assert index.conflict(block[k], block[k].nbytes) is (reqs[k] if k in live else None)
        assert len(index) == len(live)
    assert index.conflict(block.reshape(-1), block.nbytes) is None


@pytest.mark.native
@NOT_BUILT
@pytest.mark.parametrize("address", ADDRESSES)
def test_the_c_class_refuses_a_non_buffer_as_the_python_one_does(address: Any) -> None:
    """Two pending adds of one object that is no buffer: both classes refuse it with a
    TypeError (the Python one once it needs the address, the C one at once), and the C one
    keeps nothing of it."""
    for cls in (PendingBuffers, C_CLASS):
        index, bad = cls(address), object()
        with pytest.raises(TypeError):
            index.add(bad, 8, object())
            index.add(bad, 8, object())
    assert len(index) == 0
    assert index.conflict(bad, 8) is None
    block = np.zeros((2, 2))
    index.add(block[0], 16, first := object())
    assert index.conflict(block[0], 16) is first  # it keeps working
    with pytest.raises(TypeError):
        C_CLASS(42)  # not callable


@pytest.mark.native
@NOT_BUILT
def test_the_c_class_keeps_a_pending_request_alive_until_removed() -> None:
    block = np.zeros((3, 2))
    index = C_CLASS(lane.address)
    req = object()
    before = sys.getrefcount(req)
    index.add(block[0], 16, req)
    index.add(block[1], 16, other := object())
    assert sys.getrefcount(req) == before + 1
    index.remove(req)
    assert sys.getrefcount(req) == before
    index.remove(req)  # no longer pending: nothing
    assert sys.getrefcount(req) == before
    index.add(block[2], 16, req)
    del index  # the index lets its requests go
    gc.collect()
    assert sys.getrefcount(req) == before
    assert sys.getrefcount(other) == before


@pytest.mark.native
@NOT_BUILT
def test_an_index_in_a_cycle_with_its_requests_is_collected() -> None:
    class Req:
        __slots__ = ("__weakref__", "index")

    block = np.zeros((2, 2))
    index, req = C_CLASS(lane.address), Req()
    req.index = index  # as a request reaches its engine, which holds the index
    index.add(block[0], 16, req)
    gone = weakref.ref(req)
    del index, req
    gc.collect()
    assert gone() is None
