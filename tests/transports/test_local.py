"""The transport contract in-process, at 1, 2 and 4 ranks: on both real loops, on the
virtual clock, and on the cluster model with two presets."""

from __future__ import annotations

import pytest

import asynccomm as ac

from .contract import OPTIONS, PROGRAMS, Program, bounded
from .environments import ENVIRONMENTS


@pytest.mark.parametrize("env", list(ENVIRONMENTS))
@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("program", list(PROGRAMS.values()), ids=list(PROGRAMS))
def test_contract(program: Program, size: int, env: str) -> None:
    options = OPTIONS.get(program.__name__, {})
    results = ac.run(bounded(program), world_size=size, **ENVIRONMENTS[env], **options)
    assert len(results) == size
