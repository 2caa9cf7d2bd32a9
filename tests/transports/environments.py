"""The in-process environments every transport-level test runs in: the in-process transport
on both real loops, on the virtual clock, and the cluster model (on the virtual clock) with
two presets.  ``ac.run(program, world_size=n, **ENVIRONMENTS[name])``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import uvloop

import asynccomm as ac
from asynccomm.sim.loop import new_virtual_loop

T = TypeVar("T")

ENVIRONMENTS: dict[str, dict[str, Any]] = {
    "uvloop": {"loop": "uvloop"},
    "asyncio": {"loop": "asyncio"},
    "virtual": {"clock": "virtual"},
    "roce100g": {"cluster": ac.Cluster.preset("roce100g")},
    "ascend910b": {"cluster": ac.Cluster.preset("ascend910b")},
}


def run_world(env: str, size: int, body: Callable[[ac.World], Awaitable[T]],
              **options: Any) -> T:
    """Run ``body(world)`` on a world of ``size`` ranks opened in environment ``env`` (for
    tests that drive several ranks from one task)."""
    settings = dict(ENVIRONMENTS[env])
    loop = settings.pop("loop", None)
    cluster = settings.get("cluster")
    clock = settings.get("clock", "auto")
    virtual = clock == "virtual" or cluster is not None

    async def main() -> T:
        async with ac.open_world(size, cluster, clock, **options) as world:
            return await body(world)

    factory = (new_virtual_loop if virtual else
               uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())
