"""The doorbell of idle ranks that share a host: the ticker dozes on it only when every
parked task is dozable, looks once more after arming it, wakes on a ring, and disarms it as
soon as anything runs.  Which ranks get a bell is decided from what the world gathered."""

from __future__ import annotations

import asyncio
import os
from array import array
from collections.abc import AsyncIterator, Iterator

import pytest

from asynccomm._comm.mpi_runner import _bells
from asynccomm.transports import _ticker
from asynccomm.transports._doorbell import SHM_DIR, Doorbell
from asynccomm.transports._ticker import Ticker

#: Bounds every wait here; the safety tick is set far beyond it, so only a ring can wake.
LIMIT = 5.0

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="no /dev/shm here")


class Idler:
    """Has work once ``mail`` is set."""

    def __init__(self, *, dozable: bool = True, mail: bool = False) -> None:
        self.dozable = dozable
        self.mail = mail
        self.polls = 0

    def poll_idle(self) -> bool:
        self.polls += 1
        return self.mail


@pytest.fixture
def bell(monkeypatch: pytest.MonkeyPatch) -> Iterator[Doorbell]:
    bell = Doorbell()
    monkeypatch.setattr(Doorbell, "_made", True)
    monkeypatch.setattr(Doorbell, "_instance", bell)
    try:
        yield bell
    finally:
        bell.published()
        bell.sock.close()


@pytest.fixture
async def ticker(bell: Doorbell, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Ticker]:
    monkeypatch.setattr(_ticker, "SAFETY_PERIOD", 600.0)  # only a ring wakes a doze
    ticker = Ticker.for_loop(asyncio.get_running_loop())
    if ticker._fd < 0:
        ticker.release()
        pytest.skip("no timerfd here")
    yield ticker
    if ticker._users:
        ticker.release()


async def test_the_loop_that_ticks_first_takes_the_doorbell(ticker: Ticker,
                                                            bell: Doorbell) -> None:
    assert ticker.bell is bell
    assert bell.owner is ticker


async def test_a_ring_wakes_a_dozing_ticker(ticker: Ticker, bell: Doorbell) -> None:
    idler = Idler()
    fut = ticker.park(idler)
    assert ticker._dozing
    assert bell.flag[0] == 1  # armed: senders ring
    assert ticker._spec is ticker._safety
    peer = bell.bell(bell.pid, bell.token)  # the doorbell as another process sees it
    assert peer is not None
    idler.mail = True
    peer.ring()
    assert bell.flag[0] == 0  # the ringer cleared it: nobody rings twice
    async with asyncio.timeout(LIMIT):
        await fut
    ticker.unpark(idler)
    # What the ring woke ran first; the ring itself is read by the loop's next callback.
    assert bell.rings_heard == 0
    await asyncio.sleep(0)  # one turn of the loop
    assert bell.rings_heard == 1
    assert not ticker._dozing
    assert bell.flag[0] == 0


async def test_a_second_ring_before_the_first_is_read_polls_nothing_more(
        ticker: Ticker, bell: Doorbell) -> None:
    """The loop may see the doorbell readable again before its next callback reads the
    datagrams: that poll would find nothing the first did not."""
    idler = Idler()
    fut = ticker.park(idler)
    polls = idler.polls  # (parking polls once, after arming)
    peer = bell.bell(bell.pid, bell.token)
    assert peer is not None
    peer.ring()
    ticker._rung()  # the loop saw the datagram
    assert idler.polls == polls + 1
    ticker._rung()  # and again, before the next callback read it
    assert idler.polls == polls + 1
    assert ticker._settling
    await asyncio.sleep(0)  # one turn of the loop: the settle reads the datagram
    assert bell.rings_heard == 1
    assert ticker._dozing  # nothing woke: back to sleep on the doorbell
    fut.cancel()


async def test_a_message_that_landed_before_arming_is_found_at_once(ticker: Ticker,
                                                                    bell: Doorbell) -> None:
    idler = Idler(mail=True)  # landed before the doorbell was armed: nobody rang
    fut = ticker.park(idler)
    assert fut.done()  # the look after arming found it
    ticker.unpark(idler)
    assert not ticker._dozing
    assert bell.flag[0] == 0


async def test_no_doze_while_a_parked_task_is_not_rung(ticker: Ticker,
                                                       bell: Doorbell) -> None:
    fut = ticker.park(Idler(dozable=False))  # a peer on another host: the tick polls
    try:
        assert not ticker._dozing
        assert bell.flag[0] == 0
        assert ticker._spec is ticker._idle
    finally:
        fut.cancel()


async def test_no_doze_while_another_task_of_the_loop_works(ticker: Ticker,
                                                            bell: Doorbell) -> None:
    loop = asyncio.get_running_loop()
    Ticker.for_loop(loop)  # a second user, not parked: it polls anyway
    try:
        fut = ticker.park(Idler())
        assert not ticker._dozing
        assert bell.flag[0] == 0
        fut.cancel()
    finally:
        ticker.release()


async def test_a_task_woken_otherwise_disarms_the_doorbell(ticker: Ticker,
                                                           bell: Doorbell) -> None:
    idler = Idler()
    fut = ticker.park(idler)
    assert bell.flag[0] == 1
    fut.set_result(None)  # as the task's own send does
    ticker.unpark(idler)
    assert not ticker._dozing
    assert bell.flag[0] == 0  # working now: a ring would be for nothing
    assert ticker._waiters == []


async def test_the_last_release_gives_the_doorbell_back(ticker: Ticker,
                                                        bell: Doorbell) -> None:
    fut = ticker.park(Idler())
    fut.cancel()
    ticker.release()
    assert bell.owner is None
    assert bell.flag[0] == 0
    again = Ticker.for_loop(asyncio.get_running_loop())
    try:
        assert again.bell is bell  # a later loop of the process takes it
    finally:
        again.release()


def test_published_removes_the_name_but_keeps_the_bell(bell: Doorbell) -> None:
    path = bell.path
    assert path is not None and os.path.exists(path)
    peer = bell.bell(bell.pid, bell.token)
    bell.published()
    assert not os.path.exists(path)
    assert peer is not None
    bell.arm()
    assert peer.flag[0] == 1  # what was opened still shares the byte
    bell.disarm()


def test_ringing_a_process_that_is_gone_is_harmless(bell: Doorbell) -> None:
    peer = bell.bell(bell.pid, bell.token)
    assert peer is not None
    peer.address = b"\0asynccomm-bell-nobody"
    peer.flag[0] = 1
    peer.ring()  # no such socket: nothing raised, nobody woken
    assert peer.flag[0] == 0


def test_bells_only_for_ranks_that_share_this_host(bell: Doorbell) -> None:
    here, elsewhere = 7, 8
    every = array("q", [
        0, here, bell.pid, bell.token,  # rank 0: this process
        0, here, bell.pid, bell.token,  # rank 1: on this host (here: the same doorbell)
        0, elsewhere, 4242, 1,  # rank 2: on another host
        0, here, 0, 0,  # rank 3: on this host, without a doorbell
    ])
    bells, opened = _bells(bell, 0, every)
    assert bells[0] is None and bells[2] is None and bells[3] is None
    assert bells[1] is not None
    assert opened
    every[4 * 1 + 3] = bell.token + 1  # a doorbell that cannot be opened
    bells, opened = _bells(bell, 0, every)
    assert bells[1] is None
    assert not opened
    assert _bells(None, 0, every) == ([None] * 4, True)  # no doorbell here: none at all


def test_a_forked_child_has_no_doorbell(bell: Doorbell,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert Doorbell.current() is bell
    monkeypatch.setattr(bell, "pid", bell.pid + 1)  # as a child of this process sees it
    assert Doorbell.current() is None
    assert Doorbell.get() is None
