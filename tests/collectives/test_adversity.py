"""Random programs above point-to-point (collectives, split, dup, objects) in which one rank
misbehaves, on every in-process environment (see ``adversity`` for the invariants).
``ASYNCCOMM_STRESS_EXAMPLES`` runs many more (``make test-stress``)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import asynccomm as ac

from ..transports.environments import run_world
from .adversity import Program, check, check_objects, programs, run_rank

#: Examples per environment: the real-time loops pay real seconds for timeouts.
EXAMPLES = {"virtual": 40, "ascend910b": 15, "roce100g-fifo": 10, "crowded": 15, "uvloop": 6,
            "asyncio": 6}
STRESS = int(os.environ.get("ASYNCCOMM_STRESS_EXAMPLES", "0"))


def run_program(env: str, program: Program) -> list[Any]:
    async def body(world: ac.World) -> list[Any]:
        async with asyncio.timeout(60):  # no hang: far above what any program needs
            return await asyncio.gather(*(run_rank(c, program) for c in world.comms),
                                        return_exceptions=True)

    return run_world(env, program.size, body)


@pytest.mark.parametrize("env", sorted(EXAMPLES))
def test_no_wrong_result_no_hang_when_one_rank_misbehaves(env: str) -> None:
    @settings(max_examples=STRESS or EXAMPLES[env], derandomize=not STRESS, database=None,
              deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(program=programs())
    def one(program: Program) -> None:
        records = run_program(env, program)
        check(program, records)
        check_objects(program, records)

    one()
