"""Typed buffers and refused buffers on MPI, under ``mpiexec -n 2`` (run by
tests/api/test_send_buffers.py): a typed memoryview carries its dtype across processes, a
numpy scalar is refused before anything is posted, and the communicator then works."""

from __future__ import annotations

import asyncio
import sys
from array import array

import numpy as np

import asynccomm as ac


async def main(comm: ac.Communicator) -> str:
    async with asyncio.timeout(30):
        peer = 1 - comm.rank
        try:
            await comm.send(np.float32(1), peer, 1)
        except TypeError as exc:
            assert "numpy scalar" in str(exc), exc
        else:
            raise AssertionError("a numpy scalar was sent")
        assert comm.statistics().pending_ops == 0
        big = array("d", range(10_000))  # past the eager limit: rendezvous
        for values in (array("d", [1.5, 2.5]), big):
            if comm.rank == 0:
                await comm.send(memoryview(values), 1, 2)
            else:
                got, status = await comm.recv_new(0, 2)
                assert got.dtype == np.float64 and got.tolist() == values.tolist(), got
                assert status.count == len(values)
        into = array("d", [0.0, 0.0])
        if comm.rank == 0:
            await comm.send(np.array([3.0, 4.0]), 1, 3)
        else:
            await comm.recv(memoryview(into), 0, 3)
            assert into.tolist() == [3.0, 4.0]
        return "ok"


if __name__ == "__main__":
    sys.stdout.write(f"{ac.run(main)}\n")
