"""Structured logging with structlog: silent unless the application configured structlog.

The library never calls ``structlog.configure()``.  structlog's built-in defaults print
every event to stdout, which a library must not do, so while structlog is unconfigured the
engines get a logger that drops everything.  Once the application configures structlog
(or a test uses ``structlog.testing.capture_logs``) before opening a world, each engine
gets ``structlog.get_logger("asynccomm")`` bound once with ``rank`` and ``size``.

Event names are dotted and lowercase: ``comm.opened``, ``comm.closed`` (info);
``p2p.send.posted``, ``p2p.recv.posted``, ``p2p.matched``, ``p2p.timeout``,
``chunk.copied`` (debug, one per message or chunk).  Per-message events are built only when
the configured logger would keep debug events (``trace``), so they cost one attribute test
on the hot path otherwise.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

__all__ = ["NullLogger", "engine_logger"]


class NullLogger:
    """Drops every event (used while structlog is unconfigured)."""

    def _drop(self, event: str, *args: Any, **kw: Any) -> None:
        return None

    debug = info = warning = error = exception = _drop

    def bind(self, **kw: Any) -> NullLogger:
        return self


def _debug_enabled(logger: Any) -> bool:
    is_enabled_for = getattr(logger, "is_enabled_for", None)
    if is_enabled_for is None:
        return True
    return bool(is_enabled_for(logging.DEBUG))


def engine_logger(**context: Any) -> tuple[Any, bool]:
    """A logger bound with ``context`` and whether per-message debug events are wanted."""
    if not structlog.is_configured():
        return NullLogger(), False
    logger = structlog.get_logger("asynccomm").bind(**context)
    return logger, _debug_enabled(logger)
