"""The transport contract on the in-process transport, at 2 and 4 ranks, on both loops."""

from __future__ import annotations

import pytest

import asynccomm as ac

from .contract import OPTIONS, PROGRAMS, Program, bounded


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("program", list(PROGRAMS.values()), ids=list(PROGRAMS))
def test_contract(program: Program, size: int, loop: str) -> None:
    options = OPTIONS.get(program.__name__, {})
    results = ac.run(bounded(program), world_size=size, loop=loop, **options)
    assert len(results) == size
