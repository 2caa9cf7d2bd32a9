"""The protocol's side of one rank (``_comm/agreement.py``) with its link held: messages
are handed to it in the order a test chooses, so interleavings that processes make only
under load happen every time."""

from __future__ import annotations

import asyncio
from array import array
from types import SimpleNamespace
from typing import Any

import pytest

from asynccomm._comm import faults
from asynccomm._comm.agreement import _BODY, _WHAT, DECIDE, Remote


class HeldLink:
    """A link that delivers nothing by itself: what the rank sends is kept, and no peer is
    known closed until the test says so."""

    def __init__(self) -> None:
        self.wire = SimpleNamespace(closed_by={}, close_sent=False)
        self._broken = None
        self.sent: list[tuple[int, bytes]] = []
        self.ft: Remote | None = None
        self.posted = asyncio.Event()

    def _send(self, dest: int, msg: bytes) -> None:
        self.sent.append((dest, msg))
        self.posted.set()


def rank_of(rank: int, size: int) -> tuple[Any, Remote, HeldLink]:
    """A communicator of ``size`` processes as rank ``rank`` sees it, and its protocol."""
    link = HeldLink()
    engine = SimpleNamespace(link=link, private=False, acked=None)
    made: list[Any] = []

    async def child(parent: Any, members: list[int], color: int, key: Any) -> Any:
        made.append(members)
        return SimpleNamespace(members=members)

    comm = SimpleNamespace(rank=rank, size=size, _engine=engine, _check_ready=lambda: None,
                           _loop=asyncio.get_running_loop(), closed=False, made=made,
                           _family=SimpleNamespace(child=child), _adopt=lambda sub: None)
    ft = link.ft = Remote(comm, link)  # type: ignore[arg-type]
    return comm, ft, link


def decide(what: str, k: int, value: int, failed: list[int]) -> bytes:
    return _BODY.pack(DECIDE, _WHAT.index(what), k, value, 0) + array("i", failed).tobytes()


@pytest.mark.parametrize("early", [False, True], ids=["after-join", "before-join"])
@pytest.mark.parametrize("what", ["agree", "shrink"])
async def test_a_decision_that_arrives_before_the_failure_it_names_makes_it_failed_here(
        what: str, early: bool) -> None:
    # Rank 0 saw rank 1 die and decided; rank 2 holds the decision before its own link
    # hears of rank 1's death (another pair of ranks' messages: no order between them).
    comm, ft, link = rank_of(2, 4)
    if early:  # the decision is here before this rank calls
        ft.message(0, decide(what, 0, 6, [1]))
    async with asyncio.timeout(5):
        call = asyncio.ensure_future(faults.agree(comm, 6) if what == "agree"
                                     else faults.shrink(comm))
        if not early:
            await link.posted.wait()  # its contribution, to the coordinator
            assert [dest for dest, _ in link.sent] == [0]
            ft.message(0, decide(what, 0, 6, [1]))
        got = await call
    assert (got == 6) if what == "agree" else (comm.made == [[0, 2, 3]])
    assert faults.acked_failed(comm) == (1,)
    assert faults.failed(comm) == (1,)  # acknowledged, so known failed here
    link.wire.closed_by[1] = "died"  # the link hears of it later: nothing changes
    ft.closed(1)
    assert faults.failed(comm) == faults.acked_failed(comm) == (1,)
    assert faults.ack_failed(comm) == (1,)
