"""Shared test configuration: every async test runs on asyncio (debug mode) and on uvloop."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterator, Mapping

import pytest
import structlog
import uvloop

from . import mpich_segments

# One BLAS thread per process (read as numpy loads, here and in every process a test
# starts): the examples' training in several processes at once, on a machine of few
# cores, otherwise keeps more BLAS threads spinning than there are cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# A run started in the background of a script (``make test &``, nohup) ignores Ctrl-C, and
# so would every process a test starts (an ignored signal stays ignored across exec, and
# Python then installs no KeyboardInterrupt handler): the tests that interrupt a process
# they started would wait for it in vain.  Their processes get Python's default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


_SEGMENTS = pytest.StashKey[list[set[str]]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Note MPICH's segments in ``/dev/shm`` and its launcher's topology files (in the
    process that runs the session, not in a pytest-xdist worker's): see
    ``pytest_sessionfinish``."""
    if not hasattr(session.config, "workerinput"):
        session.config.stash[_SEGMENTS] = [mpich_segments.segments(folder, prefix)
                                           for folder, prefix in mpich_segments.KINDS]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the files MPICH left behind from the jobs that the MPI failure cases end on
    purpose (``tests/mpich_segments.py``), once every worker is done."""
    before = session.config.stash.get(_SEGMENTS, None)
    if before is not None:
        for names, (folder, prefix) in zip(before, mpich_segments.KINDS, strict=True):
            mpich_segments.remove_orphans(names, folder=folder, prefix=prefix)


def _debug_asyncio_loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    return loop


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The thousands of random fault plans run only when asked (``make test-fault-plans``
    sets ``ASYNCCOMM_FAULT_PLANS``): deselected, not skipped, elsewhere."""
    if os.environ.get("ASYNCCOMM_FAULT_PLANS"):
        return
    long = [item for item in items if item.get_closest_marker("fault_plans") is not None]
    if long:
        config.hook.pytest_deselected(items=long)
        items[:] = [item for item in items if item.get_closest_marker("fault_plans") is None]


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
