"""Pushes that time out are retried with exponential back-off.

A timed-out send is withdrawn atomically (nothing of it reached the server), so sending it
again can neither lose nor duplicate a gradient: retrying needs no sequence numbers and no
de-duplication on the server.  Pushes of at most the eager limit are staged at the server
at once and never time out; larger ones wait for the server's recv, and that wait is what
``timeout`` bounds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asynccomm as ac

__all__ = ["PushFailedError", "RetryPolicy", "push"]


class PushFailedError(TimeoutError):
    """A worker gave up on a push: every attempt timed out.  Carries ``rank``, ``server``,
    ``tag`` and ``attempts``."""

    def __init__(self, rank: int, server: int, tag: int, attempts: int,
                 policy: RetryPolicy) -> None:
        self.rank, self.server, self.tag, self.attempts = rank, server, tag, attempts
        super().__init__(
            f"worker rank {rank} gave up pushing to server rank {server} (tag {tag}) after "
            f"{attempts} attempts: each timed out after {policy.timeout:g} s, with back-off "
            f"from {policy.base:g} s doubling up to {policy.cap:g} s; is the server alive "
            "and receiving?")


@dataclass(frozen=True)
class RetryPolicy:
    """Per-attempt ``timeout``; back-off ``base * factor**(attempt - 1)`` capped at ``cap``."""

    timeout: float = 5.0
    base: float = 0.01
    factor: float = 2.0
    cap: float = 0.5
    max_attempts: int = 5
    on_retry: Callable[[int, ac.CommTimeoutError], None] | None = None
    """Called as ``on_retry(attempt, error)`` after each timed-out attempt but the last."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.timeout <= 0 or self.base < 0 or self.factor < 1:
            raise ValueError(f"bad retry policy {self}")

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return float(min(self.cap, self.base * self.factor ** (attempt - 1)))


async def push(comm: ac.Communicator, buf: Any, server: int, tag: int, policy: RetryPolicy,
               *, stream: ac.Stream | None = None, first: ac.Request | None = None) -> int:
    """Send ``buf`` to ``server``, retrying timed-out attempts; return the attempts used.

    ``first`` is an attempt already in flight (an ``isend`` posted with ``policy.timeout``).

    Raises:
        PushFailedError: every one of ``policy.max_attempts`` attempts timed out.
        ac.AsyncCommError: any other communication error, at once (not retried).
    """
    for attempt in range(1, policy.max_attempts + 1):
        try:
            if first is not None and attempt == 1:
                await first
            else:
                await comm.send(buf, server, tag, stream=stream, timeout=policy.timeout)
            return attempt
        except ac.CommTimeoutError as exc:
            if attempt == policy.max_attempts:
                raise PushFailedError(comm.rank, server, tag, attempt, policy) from exc
            if policy.on_retry is not None:
                policy.on_retry(attempt, exc)
            await asyncio.sleep(policy.backoff(attempt))
    raise AssertionError("unreachable")
