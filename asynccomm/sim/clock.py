"""Model time on top of an event loop's clock.

Model time is integer nanoseconds since the world opened.  On the virtual-time loop one
model nanosecond is one loop nanosecond; on a real loop (``clock="wall"``) model time runs
``time_scale`` times slower than real time, so that modelled microseconds survive event
loops whose timers have millisecond resolution (uvloop's).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

__all__ = ["ModelClock"]


class ModelClock:
    """Converts between model nanoseconds and loop time, and schedules in model time.

    Raises:
        ValueError: if ``time_scale`` is not a finite number > 0.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, *, time_scale: float = 1.0) -> None:
        if not (isinstance(time_scale, int | float) and math.isfinite(time_scale)
                and time_scale > 0):
            raise ValueError(f"time_scale must be a finite number > 0, got {time_scale!r}")
        self.loop = loop
        self.time_scale = float(time_scale)
        self.origin = loop.time()

    def now_ns(self) -> int:
        """The model time now, in integer nanoseconds."""
        return round((self.loop.time() - self.origin) / self.time_scale * 1e9)

    def now(self) -> float:
        """The model time now, in seconds."""
        return self.now_ns() * 1e-9

    def call_at(self, t_ns: int, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        """Call ``callback(*args)`` at model time ``t_ns`` (at once if it has passed)."""
        return self.loop.call_at(self.origin + t_ns / 1e9 * self.time_scale, callback, *args)
