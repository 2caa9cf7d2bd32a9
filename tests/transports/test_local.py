"""The transport contract in-process, at 1, 2 and 4 ranks: on both real loops, on the
virtual clock, and on the cluster model with two presets."""

from __future__ import annotations

import pytest

import asynccomm as ac

from .contract import OPTIONS, PROGRAMS, Program, bounded
from .environments import ENVIRONMENTS

#: Programs that only ranks 0 and 1 take part in, with no wildcard that the others' close
#: could end: at 4 ranks they run as at 2, so they run at 1 and 2.
PAIRS = {"large_transfers"}
CASES = [pytest.param(program, size, id=f"{name}-{size}")
         for name, program in PROGRAMS.items()
         for size in ((1, 2) if name in PAIRS else (1, 2, 4))]


@pytest.mark.parametrize("env", list(ENVIRONMENTS))
@pytest.mark.parametrize(("program", "size"), CASES)
def test_contract(program: Program, size: int, env: str) -> None:
    options = OPTIONS.get(program.__name__, {})
    results = ac.run(bounded(program), world_size=size, **ENVIRONMENTS[env], **options)
    assert len(results) == size
