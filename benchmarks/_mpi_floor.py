"""The asyncio floor on MPI: latency (``mpi_p2p.floor_pingpong``) and the ring
(``mpi_ring.floor_ring``)."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from asynccomm.transports._mpi_lib import sched_yield, yield_now

#: Tests per turn of the loop before letting other tasks run.
_BURST = 64


class Floor:
    """A persistent recv into ``buf`` from ``peer`` with ``tag``, polled by a task that
    wakes whoever waits in ``recv()``: the least an asyncio library on mpi4py does per
    message.  With ``share_core`` it gives its core away (``sched_yield``) after each test
    that finds nothing, as a poller must where ranks outnumber cores (the one it waits for
    may be queued behind it)."""

    def __init__(self, comm: Any, buf: Any, peer: int, tag: int, *,
                 share_core: bool = False) -> None:
        self._req = comm.Recv_init(buf, peer, tag)
        self._share_core = share_core
        self._waiter: asyncio.Future[None] | None = None
        self._arrived = 0
        self._stop = False
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Floor:
        self._req.Start()
        self._task = asyncio.get_running_loop().create_task(self._poll())
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None
                        ) -> None:
        self._stop = True
        assert self._task is not None
        await self._task
        self._req.Cancel()
        self._req.Wait()
        self._req.Free()

    async def _poll(self) -> None:
        req = self._req
        share_core = self._share_core
        while not self._stop:
            for _ in range(_BURST):
                if req.Test():
                    req.Start()
                    self._landed()
                    break
                if share_core:
                    sched_yield()
            await yield_now()

    def _landed(self) -> None:
        """A message is in: wake whoever waits, or count it for the next ``recv()``."""
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            waiter.set_result(None)
        else:
            self._arrived += 1

    async def recv(self) -> None:
        """Wait for the next message."""
        if self._arrived:
            self._arrived -= 1
            return
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter


class MatchedFloor(Floor):
    """``Floor`` for a library that matches a large message before it receives it, as
    MPI's rules make asynccomm do: the sender announces the message (a 1-word header with
    ``tag``) and sends its data behind it with ``data_tag``; the task polls a persistent
    recv for the announcement and, once one lands, posts the data's recv into ``buf`` (the
    match costs nothing here: the announcement's tag says whose it is) and polls that,
    waking whoever waits in ``recv()`` when the data is in.  What ``Floor`` saves over it
    is one hop: its recv is posted before the message comes, where a matching library
    learns where the data goes only from the announcement."""

    def __init__(self, comm: Any, buf: Any, peer: int, tag: int, data_tag: int) -> None:
        import numpy as np

        self._header = np.zeros(1, np.int64)
        super().__init__(comm, self._header, peer, tag)
        self._comm, self._buf, self._peer, self._data_tag = comm, buf, peer, data_tag
        self._data: Any = None

    async def _poll(self) -> None:
        req, comm, buf, peer, data_tag = self._req, self._comm, self._buf, self._peer, \
            self._data_tag
        while not self._stop:
            for _ in range(_BURST):
                data = self._data
                if data is None:
                    if not req.Test():
                        continue
                    req.Start()
                    data = self._data = comm.Irecv(buf, peer, data_tag)
                if data.Test():
                    self._data = None
                    self._landed()
                    break
            await yield_now()
