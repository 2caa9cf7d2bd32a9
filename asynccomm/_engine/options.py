"""World options shared by every backend: defaults, the checks, and ``ASYNCCOMM_TIMEOUT``."""

from __future__ import annotations

import math
import os
from typing import Final

from ..sim.cluster import Cluster

__all__ = ["POOL_BYTES", "check_timeout", "check_world", "clock_mode", "default_timeout",
           "not_async", "seconds_from_env"]

#: Default cap on staged eager messages per rank.
POOL_BYTES: Final = 64 << 20


def check_timeout(timeout: object) -> float | None:
    """A ``timeout=`` argument as seconds (None: no timeout).

    Raises:
        TypeError: not a number.
        ValueError: negative, NaN or infinite.
    """
    if timeout is None:
        return None
    if type(timeout) is bool or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds or None, "
                        f"got {type(timeout).__name__}")
    if not timeout >= 0 or math.isinf(timeout):
        raise ValueError(f"timeout must be a finite number >= 0, got {timeout}")
    return float(timeout)


def default_timeout() -> float | None:
    """The default per-op timeout from ``ASYNCCOMM_TIMEOUT`` (seconds; unset or empty: none).

    Raises:
        ValueError: if the variable is set to something that is not a timeout.
    """
    return seconds_from_env("ASYNCCOMM_TIMEOUT")


def seconds_from_env(name: str) -> float | None:
    """A number of seconds from the environment variable ``name`` (unset or empty: None).

    Raises:
        ValueError: if the variable is set to something that is not a finite number >= 0.
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}={raw!r} must be a finite number of seconds >= 0")
    return value


def clock_mode(cluster: object, clock: object) -> str:
    if clock not in ("auto", "wall", "virtual"):
        raise ValueError(f"clock must be 'auto', 'wall' or 'virtual', got {clock!r}")
    if clock == "auto":
        return "virtual" if cluster is not None else "wall"
    return str(clock)


def check_world(size: object, cluster: object, clock: object, eager_limit: object,
                 pool_bytes: object) -> str:
    """Check the world options; return the clock mode (``"wall"`` or ``"virtual"``)."""
    if type(size) is not int:
        raise TypeError(f"world size must be an int, got {type(size).__name__}")
    if size < 1:
        raise ValueError(f"world size must be >= 1, got {size}")
    if cluster is not None:
        if not isinstance(cluster, Cluster):
            raise TypeError(f"cluster must be an asynccomm.Cluster or None, "
                            f"got {type(cluster).__name__}")
    for name, value in (("eager_limit", eager_limit), ("pool_bytes", pool_bytes)):
        if type(value) is not int:
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value}")
    return clock_mode(cluster, clock)


def not_async(main: object, returned: object) -> TypeError:
    """The error for a ``main`` that is not an async function."""
    name = getattr(main, "__name__", repr(main))
    return TypeError(f"main must be an async function (async def {name}(comm): ...); "
                     f"{name}(comm) returned {type(returned).__name__}, not an awaitable")
