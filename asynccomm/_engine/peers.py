"""A snapshot of a rank's engine (``DeviceEngine.statistics``)."""

from __future__ import annotations

from dataclasses import dataclass

from .._buffers import PoolStatistics
from .._core.matching import MatcherStatistics

__all__ = ["EngineStatistics"]


@dataclass(frozen=True, slots=True)
class EngineStatistics:
    """A snapshot of one rank's engine."""

    pending_ops: int
    """Operations submitted and not finished."""
    active_copies: int
    """Payload copies running on worker threads."""
    streams: int
    """Streams of this rank, the default one included."""
    matcher: MatcherStatistics
    pool: PoolStatistics
