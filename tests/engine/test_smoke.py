from __future__ import annotations

import numpy as np

import asynccomm as ac


async def test_ping_pong_roundtrip() -> None:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        out = np.empty(4, dtype=np.int32)
        req = c1.irecv(out, 0, 7)
        await c0.send(np.arange(4, dtype=np.int32), 1, 7)
        status = await req
        assert status == ac.Status(source=0, tag=7, nbytes=16, count=4)
        np.testing.assert_array_equal(out, np.arange(4))
