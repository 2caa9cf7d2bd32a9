"""The index of pending recv buffers against a brute-force model: a buffer conflicts with a
pending one exactly when their bytes overlap, whatever the order of checks, adds and
removes, with the C accelerator's ``address`` and with ``ctypes``'."""

from __future__ import annotations

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

ROWS, WIDTH = 12, 4
# op: (what, array index, first row, rows, request number)
OPS = st.lists(st.tuples(st.sampled_from(["check+add", "add", "remove", "check"]),
                         st.integers(0, 1), st.integers(0, ROWS - 1), st.integers(1, 3),
                         st.integers(0, 9)), max_size=40)


def _bounds(buf: Any) -> tuple[int, int]:
    start = int(buf.__array_interface__["data"][0])
    return start, start + buf.nbytes


@pytest.mark.parametrize("address", ADDRESSES)
@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_a_buffer_conflicts_exactly_when_it_overlaps_a_pending_one(address: Any,
                                                                   ops: list[Any]) -> None:
    arrays = [np.zeros((ROWS, WIDTH)), np.zeros((ROWS, WIDTH))]
    index = PendingBuffers(address)
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


@pytest.mark.parametrize("address", ADDRESSES)
def test_what_a_check_found_is_used_only_for_the_buffer_it_checked(address: Any) -> None:
    """A check of one buffer, then the add of another of the same owner: the add takes the
    other's own address (not the checked one's)."""
    block = np.zeros((4, 2))
    index = PendingBuffers(address)
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


def test_the_native_address_is_the_buffers_first_byte() -> None:
    if lane.address is ctypes_address:
        pytest.skip("the C accelerator is not built (the ctypes address is the one in use)")
    block = np.zeros((3, 5))
    row = block[2]
    assert lane.address(row) == ctypes_address(row) == _bounds(row)[0]
    row.flags.writeable = False  # read-only buffers have an address too
    assert lane.address(row) == _bounds(row)[0]
    with pytest.raises(TypeError):
        lane.address(object())
