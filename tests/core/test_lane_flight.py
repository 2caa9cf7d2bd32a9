"""The C lane's flight ring and tallies behave as the deque and ``Tally`` they stand in
for (``asynccomm/_lane_flight.c``; ``_flight`` uses them where the lane is built)."""

from __future__ import annotations

import importlib.util
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asynccomm._engine import flight as _flight

BUILT = importlib.util.find_spec("asynccomm._native._lane") is not None
pytestmark = pytest.mark.skipif(not BUILT, reason="the C lane was not built here")

small = st.integers(-(2**40), 2**40)
times = st.floats(allow_nan=False, allow_infinity=False, width=64)
entries = st.tuples(st.integers(0, 3), small, small, st.integers(0, 2**40), small,
                    st.integers(0, 5), times, times, times)


def lane() -> Any:
    from asynccomm._native import _lane

    return _lane


@settings(max_examples=200, deadline=None)
@given(maxlen=st.integers(0, 6), ops=st.lists(st.one_of(entries, st.just("clear")),
                                               max_size=30))
def test_the_ring_keeps_what_a_deque_with_maxlen_keeps(maxlen: int, ops: list[Any]) -> None:
    ring, ref = lane().Ring(maxlen), deque(maxlen=maxlen)
    for op in ops:
        if op == "clear":
            ring.clear()
            ref.clear()
        else:
            ring.append(op)
            ref.append(op)
        assert len(ring) == len(ref)
        assert list(ring) == list(ref)
    assert ring.maxlen == maxlen
    assert all(type(x) is int for e in ring for x in e[:6])
    assert all(type(x) is float for e in ring for x in e[6:])


@pytest.mark.parametrize("bad", [(1, 2, 3), [0] * 9, (0, 0, 0, 0, 0, 0, "t", 0.0, 0.0),
                                 (None, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0)])
def test_the_ring_refuses_what_is_not_an_entry(bad: Any) -> None:
    ring = lane().Ring(4)
    ring.append((0, 1, 2, 3, 4, 5, 0.5, 1.0, 1.5))
    with pytest.raises(TypeError):
        ring.append(bad)
    assert list(ring) == [(0, 1, 2, 3, 4, 5, 0.5, 1.0, 1.5)]  # nothing half-added


def test_a_negative_maxlen_is_refused() -> None:
    with pytest.raises(ValueError, match="maxlen"):
        lane().Ring(-1)


def test_the_tally_counts_as_the_python_one_does() -> None:
    c, py = lane().Tally(), _flight.Tally()
    for t in (c, py):
        t.n += 1
        t.nbytes += 1 << 40
        t.w += 0.25
        t.c += 1
    assert (c.n, c.nbytes, c.w, c.c) == (py.n, py.nbytes, py.w, py.c) == (1, 1 << 40, 0.25, 1.0)
    assert type(c.n) is int and type(c.w) is float
    assert "n=1" in repr(c)
    with pytest.raises(TypeError):
        lane().Tally(1)


def test_the_flight_recorder_uses_them_in_a_world_on_the_lane() -> None:
    native = _flight.FlightRecorder(8, 0.0, lane())
    assert type(native.ring) is lane().Ring
    assert type(native.sends[3]) is type(native.recvs[0]) is lane().Tally
    python = _flight.FlightRecorder(8, 0.0)
    assert type(python.ring) is deque
    assert type(python.sends[3]) is type(python.recvs[0]) is _flight.Tally
