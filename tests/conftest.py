"""Shared test configuration: every async test runs on asyncio (debug mode) and on uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping

import pytest
import structlog
import uvloop


def _debug_asyncio_loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    return loop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": _debug_asyncio_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture
def restore_structlog() -> Iterator[None]:
    """``capture_logs`` (and any test that configures structlog) leaves it *configured* on
    exit: put back what was there, so that other tests see the same world."""
    was_configured = structlog.is_configured()
    saved = structlog.get_config()
    saved["processors"] = list(saved["processors"])
    try:
        yield
    finally:
        structlog.reset_defaults()
        if was_configured:
            structlog.configure(**saved)
