"""ASYNCCOMM_DEBUG: human-readable events on stderr without configuring structlog."""

from __future__ import annotations

import re

import numpy as np
import pytest
import structlog

import asynccomm as ac


async def _one_message(comm: ac.Communicator) -> None:
    buf = np.zeros(4)
    if comm.rank == 0:
        await comm.send(buf, 1, tag=3)
    else:
        await comm.recv(buf, 0, tag=3)


def test_debug_prints_every_op_with_its_duration(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ASYNCCOMM_DEBUG", "debug")
    ac.run(_one_message, 2)
    err = capsys.readouterr().err
    done = [line for line in err.splitlines() if "p2p.done" in line]
    assert len(done) == 2, err
    assert all(re.match(r"\d\d:\d\d:\d\d\.\d{6} ", line) for line in done)  # microseconds
    assert any("op=recv" in line and "rank=1" in line and "total_us=" in line
               for line in done)
    assert "comm.opened" in err and "p2p.recv.posted" in err
    assert not structlog.is_configured()  # the application's structlog is left alone


def test_info_shows_lifecycle_events_only(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ASYNCCOMM_DEBUG", "info")
    ac.run(_one_message, 2)
    err = capsys.readouterr().err
    assert "comm.opened" in err and "comm.closed" in err and "p2p.done" not in err


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_a_flag_value_means_info(monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str], value: str) -> None:
    monkeypatch.setenv("ASYNCCOMM_DEBUG", value)
    ac.run(_one_message, 2)
    err = capsys.readouterr().err
    assert "comm.opened" in err and "p2p.done" not in err


@pytest.mark.parametrize("value", ["0", "false", "no", "off", ""])
def test_an_off_value_is_silent(monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str], value: str) -> None:
    monkeypatch.setenv("ASYNCCOMM_DEBUG", value)
    ac.run(_one_message, 2)
    assert "comm.opened" not in capsys.readouterr().err


@pytest.mark.parametrize("value", ["loud", "2", "verbose"])
def test_a_bad_debug_level_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ASYNCCOMM_DEBUG", value)
    with pytest.raises(ValueError, match="ASYNCCOMM_DEBUG=.*'info' or 'debug'.*1/true"):
        ac.run(_one_message, 2)


def test_a_timeout_logs_every_ranks_flight_record(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ASYNCCOMM_DEBUG", "info")

    async def main(comm: ac.Communicator) -> None:
        if comm.rank == 0:
            with pytest.raises(ac.CommTimeoutError):
                await comm.recv(np.zeros(1), 1, tag=4, timeout=1.0)
        else:
            await comm.compute(seconds=2.0)

    ac.run(main, 2, clock="virtual")
    err = capsys.readouterr().err
    assert "p2p.timeout.flight" in err and "pending  recv src=1 tag=4" in err
    assert "rank 1: 1 pending op(s)" in err  # the other rank's record too
