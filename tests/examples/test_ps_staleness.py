"""The SSP gate on its own: who gets fresh parameters when, with no event loop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ps.server import StalenessGate


@pytest.mark.parametrize(("bound", "pushes", "released"), [
    # bound 0: lockstep, nobody moves on before everyone has pushed
    (0, [0, 1], [[], [0, 1]]),
    (0, [1, 0], [[], [0, 1]]),
    # bound 1: one step ahead is fine, two is not
    (1, [0, 0, 1], [[0], [], [0, 1]]),
    # no bound (async): every push is answered at once
    (None, [0, 0, 0, 1], [[0], [0], [0], [1]]),
])
def test_gate_releases(bound: int | None, pushes: list[int],
                       released: list[list[int]]) -> None:
    gate = StalenessGate(workers=2, steps=10, bound=bound)
    assert [gate.push_done(w) for w in pushes] == released


def test_a_last_push_gets_no_reply() -> None:
    gate = StalenessGate(workers=2, steps=1, bound=None)
    assert gate.push_done(0) == [] and gate.push_done(1) == []


@given(workers=st.integers(1, 4), steps=st.integers(1, 6),
       bound=st.sampled_from([None, 0, 1, 2]), data=st.data())
def test_any_schedule_respects_the_bound_and_finishes(workers: int, steps: int,
                                                       bound: int | None,
                                                       data: st.DataObject) -> None:
    gate = StalenessGate(workers, steps, bound)
    running = set(range(workers))  # workers computing a step (they hold fresh parameters)
    while running:
        w = data.draw(st.sampled_from(sorted(running)))
        running.discard(w)
        ready = gate.push_done(w)
        for u in ready:
            assert bound is None or gate.clocks[u] - min(gate.clocks) <= bound
        running.update(ready)
    assert gate.clocks == [steps] * workers  # nobody was left waiting for ever
    assert bound is None or gate.max_gap <= bound
