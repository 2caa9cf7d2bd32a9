"""How the fault tests run ranks: each rank's program in ``async with comm`` (a rank that
raises closes its communicator as failed, as a crashed process's closes), the whole world
bounded in time (model seconds on the virtual clock, where a hang is a jump to the bound)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asynccomm as ac
from tests.transports.environments import ENVIRONMENTS, run_world

#: In-process on both real loops, the virtual clock, traced (its own fast lane), the model.
ENVS = ["asyncio", "uvloop", "virtual", "traced", "roce100g"]
#: A world's bound: wall seconds, or model seconds on the virtual clock.
LIMIT = 30.0


class Died(Exception):
    """What a rank that fails on purpose raises."""


def virtual(env: str) -> bool:
    settings = ENVIRONMENTS[env]
    return settings.get("clock") == "virtual" or "cluster" in settings


def run_ranks(env: str, size: int, program: Callable[[ac.Communicator], Awaitable[Any]],
              limit: float = LIMIT) -> list[Any]:
    """``program(comm)`` on every rank; a rank's ``Died`` is its result."""

    async def one(comm: ac.Communicator) -> Any:
        try:
            async with comm:
                return await program(comm)
        except Died as exc:
            return exc

    async def body(world: ac.World) -> list[Any]:
        async with asyncio.timeout(limit):
            return list(await asyncio.gather(*(one(c) for c in world.comms)))

    return run_world(env, size, body)


async def outcome(aw: Awaitable[Any]) -> Any:
    """What ``aw`` returned, or the asynccomm error it raised."""
    try:
        return await aw
    except ac.AsyncCommError as exc:
        return exc
