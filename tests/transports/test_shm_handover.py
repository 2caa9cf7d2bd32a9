"""A world's segment handed over (``Node._offer``) before its maker died is still taken
(``Node._expect``): the maker's death is known from its ``pidfd``, perhaps before the
datagram that carries the segment was read from the socket."""

from __future__ import annotations

import os
import secrets

import pytest

from asynccomm.transports import shm
from asynccomm.transports.shm import Node

pytestmark = pytest.mark.skipif(shm.missing() is not None, reason=str(shm.missing()))


async def test_a_segment_handed_over_before_its_maker_died_is_taken() -> None:
    group = secrets.token_hex(8)
    maker, taker = Node(group, 0, 2), Node(group, 1, 2)
    fd = os.memfd_create("asynccomm-test", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 4096)
        await maker._offer("w1", fd, 1)  # on the taker's socket, not read yet
        taker.dead.add(0)  # then its maker died (as its pidfd says)
        got = await taker._expect("w1", 0)
        try:
            assert os.fstat(got).st_size == 4096
        finally:
            os.close(got)
    finally:
        os.close(fd)
        maker.sock.close()
        taker.sock.close()
