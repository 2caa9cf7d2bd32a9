"""Helpers for tests of programs written with asynccomm."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["posted"]

T = TypeVar("T")


async def posted(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Run ``coro`` (say ``comm.recv(...)``) in a task and return the task once the
    coroutine has run up to its first wait, so its operation is posted: no sleeps, no
    polling.  Cancel or await the task as any other.
    """
    running = asyncio.Event()

    async def body() -> T:
        running.set()  # wakes the caller only after this step ends, at the first wait
        return await coro

    task = asyncio.ensure_future(body())
    await running.wait()
    return task
