"""What the algorithms send at each step: the buffers, not only their values."""

from __future__ import annotations

from typing import Any

import numpy as np

from asynccomm._collectives.algorithms import allgather_ring


class Recorded:
    """An exchange that records what each step sends and receives nothing (zeros)."""

    def __init__(self, size: int, rank: int) -> None:
        self.size, self.rank = size, rank
        self.sent: list[np.ndarray[Any, Any]] = []

    async def exchange(self, send: np.ndarray[Any, Any], dst: int, recv: np.ndarray[Any, Any],
                       src: int, offset: int = 0) -> None:
        self.sent.append(send)
        recv[...] = 0


async def test_the_ring_allgather_sends_its_first_block_from_the_callers_array() -> None:
    """Not from the copy of it just written into the output: a rank in another process
    reads a buffer its sender has just written slower (from that core's caches)."""
    mine, out = np.arange(4.0) + 1, np.zeros(12)
    ex = Recorded(3, 1)
    await allgather_ring(ex, mine, out)  # type: ignore[arg-type]
    assert len(ex.sent) == 2
    assert np.shares_memory(ex.sent[0], mine) and not np.shares_memory(ex.sent[0], out)
    assert np.shares_memory(ex.sent[1], out[:4])  # then the block it received
    np.testing.assert_array_equal(out[4:8], mine)  # its own block is in place all the same
