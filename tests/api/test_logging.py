"""Structured logging: dotted event names with context when structlog is configured, and
silence when it is not (a library must never print)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import structlog
import structlog.testing

import asynccomm as ac
from asynccomm._engine import lane as _fastlane
from asynccomm._engine import log as _logging

#: Every test here changes structlog's global configuration.
pytestmark = pytest.mark.usefixtures("restore_structlog")


@pytest.fixture
def unconfigured() -> None:
    structlog.reset_defaults()
    assert not structlog.is_configured()


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


PER_MESSAGE = {"p2p.send.posted", "p2p.recv.posted", "p2p.matched", "p2p.timeout",
               "chunk.copied"}


async def test_send_recv_events() -> None:
    with structlog.testing.capture_logs() as logs:
        async with ac.open_world(2) as world:
            c0, c1 = world.comms
            out = np.zeros(4, dtype=np.int64)
            rreq = c1.irecv(out, 0, 7)
            await c0.send(np.arange(4, dtype=np.int64), 1, 7)
            await rreq

    opened = events(logs, "comm.opened")
    closed = events(logs, "comm.closed")
    assert sorted(e["rank"] for e in opened) == [0, 1]
    assert sorted(e["rank"] for e in closed) == [0, 1]
    assert {e["log_level"] for e in opened + closed} == {"info"}
    assert {e["size"] for e in opened + closed} == {2}
    # which fast lane runs: the C accelerator's, or pure Python (no compiler, or asked for)
    assert {e["fast_lane"] for e in opened} == {"C" if _fastlane.ACCELERATED else "python"}

    (recv_posted,) = events(logs, "p2p.recv.posted")
    assert recv_posted["rank"] == 1
    assert recv_posted["peer"] == 0
    assert recv_posted["tag"] == 7

    (send_posted,) = events(logs, "p2p.send.posted")
    assert {k: send_posted[k] for k in ("rank", "peer", "tag", "nbytes")} == {
        "rank": 0, "peer": 1, "tag": 7, "nbytes": 32}

    (matched,) = events(logs, "p2p.matched")
    assert {k: matched[k] for k in ("rank", "peer", "tag", "nbytes")} == {
        "rank": 1, "peer": 0, "tag": 7, "nbytes": 32}

    names = [e["event"] for e in logs]
    assert names.index("p2p.recv.posted") < names.index("p2p.send.posted") \
        < names.index("p2p.matched") < names.index("comm.closed")
    assert names[:2] == ["comm.opened", "comm.opened"]

    for e in logs:
        assert e["event"] == e["event"].lower()
        assert "." in e["event"]
        # Only lifecycle events are info; everything a message does is debug.
        if e["event"] not in {"comm.opened", "comm.closed"}:
            assert e["log_level"] == "debug", e


async def test_timeout_event() -> None:
    with structlog.testing.capture_logs() as logs:
        async with ac.open_world(2) as world:
            c0, _ = world.comms
            with pytest.raises(ac.CommTimeoutError):
                await c0.recv(np.zeros(1), 1, 3, timeout=0)
    (timeout,) = events(logs, "p2p.timeout")
    assert timeout["log_level"] == "debug"
    assert {k: timeout[k] for k in ("rank", "peer", "tag", "timeout")} == {
        "rank": 0, "peer": 1, "tag": 3, "timeout": 0.0}


async def test_chunk_copied_events_cover_a_large_transfer() -> None:
    # Large enough to be copied in chunks on a worker thread; not chunk-aligned.
    n = (8 << 20) + 3  # large enough to be copied on the worker thread
    with structlog.testing.capture_logs() as logs:
        async with ac.open_world(2) as world:
            c0, c1 = world.comms
            data = np.arange(n, dtype=np.uint8)
            out = np.zeros(n, dtype=np.uint8)
            rreq = c1.irecv(out, 0, 1)
            await c0.send(data, 1, 1)
            await rreq
            np.testing.assert_array_equal(out, data)
    chunks = events(logs, "chunk.copied")
    assert chunks, f"no chunk.copied events for a {n} B transfer"
    assert {e["log_level"] for e in chunks} == {"debug"}
    assert sum(e["nbytes"] for e in chunks) == n
    assert sorted(e["offset"] for e in chunks)[0] == 0


async def test_info_level_filter_keeps_lifecycle_events_only() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    with structlog.testing.capture_logs() as logs:
        async with ac.open_world(2) as world:
            c0, c1 = world.comms
            out = np.zeros(2)
            rreq = c1.irecv(out, 0, 1)
            await c0.send(np.ones(2), 1, 1)
            await rreq
    names = [e["event"] for e in logs]
    assert names.count("comm.opened") == 2
    assert names.count("comm.closed") == 2
    assert [e for e in logs if e["log_level"] == "debug" or e["event"] in PER_MESSAGE] == []


def test_engine_logger_unconfigured_is_silent(unconfigured: None) -> None:
    logger, trace = _logging.engine_logger(rank=0, size=2)
    assert trace is False
    logger.info("comm.opened")  # drops it: checked for output in the capsys test below


@pytest.mark.parametrize(("level", "trace"), [(logging.INFO, False), (logging.WARNING, False),
                                              (logging.DEBUG, True)])
def test_engine_logger_trace_follows_the_configured_level(level: int, trace: bool) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))
    _, got = _logging.engine_logger(rank=3, size=4)
    assert got is trace


async def test_silent_when_structlog_is_not_configured(
        unconfigured: None, capsys: pytest.CaptureFixture[str]) -> None:
    # The check can fail: structlog's own defaults print to stdout.
    structlog.get_logger("probe").info("probe.event")
    assert "probe.event" in capsys.readouterr().out
    structlog.reset_defaults()
    assert not structlog.is_configured()

    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        out = np.zeros(8)
        rreq = c1.irecv(out, 0, 1)
        await c0.send(np.ones(8), 1, 1)
        await rreq
        big = np.zeros(100_000)
        rreq = c1.irecv(big, 0, 2)
        await c0.send(np.ones(100_000), 1, 2)
        await rreq
        with pytest.raises(ac.CommTimeoutError):
            await c0.recv(out, 1, 3, timeout=0)
        with pytest.raises(ac.TruncationError):
            await c0.send(np.ones(16), 1, 4)
            await c1.recv(out, 0, 4)
        await c1.recv_new(0, 4)
    assert capsys.readouterr() == ("", "")
