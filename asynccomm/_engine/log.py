"""Structured logging with structlog: silent unless the application configured structlog,
or ``ASYNCCOMM_DEBUG`` asks for it.

The library never calls ``structlog.configure()``.  structlog's built-in defaults print
every event to stdout, which a library must not do, so while structlog is unconfigured the
engines get a logger that drops everything.  Once the application configures structlog
(or a test uses ``structlog.testing.capture_logs``) before opening a world, each engine
gets ``structlog.get_logger("asynccomm")`` bound once with ``rank`` and ``size``.

``ASYNCCOMM_DEBUG=info`` or ``=debug`` (like ``NCCL_DEBUG``; ``1``, ``true``, ``yes``,
``on`` mean ``info``) gives the engines a logger of
their own, still without configuring structlog: human-readable lines on stderr with
microsecond timestamps and the rank, at that level and above (with an application's own
configuration as well, the switch wins for asynccomm's events).

Event names are dotted and lowercase: ``comm.opened``, ``comm.closed`` (info);
``p2p.send.posted``, ``p2p.recv.posted``, ``p2p.matched``, ``p2p.timeout``,
``chunk.copied``, ``p2p.done`` (debug, one per message or chunk; ``p2p.done`` carries the
op's outcome and its ``wait_us``, ``copy_us`` and ``total_us``); ``comm.hang`` (warning,
from the hang watchdog), ``p2p.timeout.flight`` (info: the rank's flight record when an op
timed out).  Per-message events are built only when
the configured logger would keep debug events (``trace``), so they cost one attribute test
on the hot path otherwise.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog

__all__ = ["NullLogger", "debug_level", "dropped", "engine_logger", "op_finished"]

_LEVELS = {"info": logging.INFO, "debug": logging.DEBUG}


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


#: Values that switch ``ASYNCCOMM_DEBUG`` on at ``info`` (a flag set as shells and CI do)
#: and values that leave it off.
_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"", "0", "false", "no", "off", "none"})


def debug_level() -> int | None:
    """The level ``ASYNCCOMM_DEBUG`` asks for, or None (unset, empty, or off): ``info`` or
    ``debug`` by name, ``1``/``true``/``yes``/``on`` mean ``info``, ``0``/``false``/``no``/
    ``off``/``none`` mean off.

    Raises:
        ValueError: the variable names no level.
    """
    raw = os.environ.get("ASYNCCOMM_DEBUG", "").strip().lower()
    if raw in _OFF:
        return None
    level = logging.INFO if raw in _ON else _LEVELS.get(raw)
    if level is None:
        raise ValueError(f"ASYNCCOMM_DEBUG={raw!r} must be 'info' or 'debug' (or 1/true/yes/"
                         "on for info; 0/false/no/off to leave it off)")
    return level


def _stderr_logger(level: int) -> Any:
    """structlog to stderr, human-readable, with microsecond timestamps, configured here
    and not globally."""
    return structlog.wrap_logger(
        structlog.PrintLogger(sys.stderr),
        processors=[structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="%H:%M:%S.%f", utc=False),
                    structlog.dev.ConsoleRenderer(colors=False)],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_name="asynccomm")


def engine_logger(**context: Any) -> tuple[Any, bool]:
    """A logger bound with ``context`` and whether per-message debug events are wanted."""
    level = debug_level()
    if level is not None:
        return _stderr_logger(level).bind(**context), level <= logging.DEBUG
    if not structlog.is_configured():
        return NullLogger(), False
    logger = structlog.get_logger("asynccomm").bind(**context)
    return logger, _debug_enabled(logger)


def op_finished(log: Any, entry: tuple[Any, ...]) -> None:
    """The ``p2p.done`` debug event of a flight-recorder entry (kind and outcome in words),
    with its durations."""
    kind, peer, tag, nbytes, sid, how, t_post, t_match, t_fin = entry
    post = t_post if t_post >= 0 else t_fin  # negative: unknown (it finished as posted)
    match = t_match if t_match >= 0 else post
    log.debug("p2p.done", op=kind, peer=peer, tag=tag, nbytes=nbytes, stream=sid,
              outcome=how, wait_us=round((match - post) * 1e6, 3),
              copy_us=round((t_fin - match) * 1e6, 3), total_us=round((t_fin - post) * 1e6, 3))


def dropped(log: Any, messages: list[tuple[int, int, int]], communicator: str, *,
            late: bool = False) -> None:
    """The ``p2p.dropped`` warning of a rank that closed with ``messages`` (source, tag,
    bytes) that no recv took, counted by source and tag; ``late``: they arrived after the
    close (sent before their sender heard of it)."""
    tally: dict[tuple[int, int], list[int]] = {}
    for source, tag, nbytes in messages:
        counts = tally.setdefault((source, tag), [0, 0])
        counts[0] += 1
        counts[1] += nbytes
    log.warning("p2p.dropped", messages=sum(n for n, _ in tally.values()),
                nbytes=sum(b for _, b in tally.values()),
                by_source_tag=[{"source": src, "tag": tag, "messages": n, "nbytes": b}
                               for (src, tag), (n, b) in sorted(tally.items())],
                communicator=communicator, **({"after_close": True} if late else {}))
