"""A message that reaches a rank after it closed (sent before its sender heard of the
close) is dropped and said so: a ``p2p.dropped`` warning with ``after_close``, on the MPI
link (its Python steps, on a fake communicator) and on a timed in-process link."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import numpy as np
import pytest
import structlog

import asynccomm as ac
from asynccomm._core import wire as w
from asynccomm.sim import DeviceSpec, LinkSpec
from asynccomm.sim.loop import new_virtual_loop
from asynccomm.transports import _mpi_lib
from asynccomm.transports._mpi_progress import Slot
from asynccomm.transports._mpi_transport import MPITransport

#: Every message takes 0.3 s of model time.
SLOW = ac.Cluster(nodes=1, devices_per_node=2, intra=LinkSpec("slow", 1e9, 0.3), inter=None,
                  device=DeviceSpec("dev", 1e12, 1 << 34, 1e12), name="slow")




class _Req:
    done = False


class _Comm:
    def Get_rank(self) -> int:
        return 1

    def Get_size(self) -> int:
        return 2

    def Get_attr(self, key: object) -> int:
        return 32767

    def Recv_init(self, buf: Any, source: int, tag: int) -> _Req:
        return _Req()


class _ClosedEngine:
    rank = 1
    closed = True

    def __init__(self) -> None:
        self.late: list[tuple[int, int, int]] = []

    def dropped_late(self, source: int, tag: int, nbytes: int) -> None:
        self.late.append((source, tag, nbytes))

    def arrived(self, msg: Any) -> None:
        raise AssertionError("a closed rank takes nothing")


def test_an_eager_message_reaching_a_closed_mpi_rank_is_reported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_mpi_lib, "MPI", types.SimpleNamespace(
        Exception=RuntimeError, ANY_SOURCE=-1, TAG_UB=0,
        Request=types.SimpleNamespace(Testsome=lambda reqs: [])))
    link = MPITransport(_Comm(), eager_limit=4096, pools=[1 << 16, 1 << 16])  # type: ignore[arg-type]
    engine = _ClosedEngine()
    link.endpoint = engine  # type: ignore[assignment]
    slot = Slot(link.comm)
    payload = bytes(range(16))
    raw = w.HEADER.pack(w.EAGER, 3, 0, 9, 16, 2, 0, b"<f8") + payload
    slot.buf[:len(raw)] = raw
    link._on_control(slot)
    assert engine.late == [(0, 9, 16)]


def test_a_message_in_flight_to_a_rank_that_closes_is_reported(
        restore_structlog: None) -> None:
    async def main() -> None:
        async with asyncio.timeout(60), ac.open_world(2, SLOW, "virtual") as world:
            c0, c1 = world.comms
            await c0.send(np.zeros(2), 1, tag=5)  # eager: done before it arrives
            await c1.aclose()
            await asyncio.sleep(1.0)  # (model time) it arrives, after the close

    with structlog.testing.capture_logs() as logs:
        with asyncio.Runner(loop_factory=new_virtual_loop) as runner:
            runner.run(main())
    dropped = [e for e in logs if e["event"] == "p2p.dropped"]
    assert dropped == [{"event": "p2p.dropped", "log_level": "warning", "rank": 1,
                        "size": 2, "messages": 1, "nbytes": 16, "communicator": "world",
                        "after_close": True,
                        "by_source_tag": [{"source": 0, "tag": 5, "messages": 1,
                                           "nbytes": 16}]}], logs
