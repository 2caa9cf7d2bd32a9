"""The link of a world whose ranks are on several hosts: shared memory to the ranks of this
host, MPI to the others.

The shared-memory link and the MPI link speak the same wire protocol (``_core/wire.py``)
with the same shell (``ShmTransport`` is an ``MPITransport``), so one ``Wire`` keeps the
protocol's state for every peer and only the way out differs: a ``Route`` stands where the
MPI link has its ``Progress`` and sends each control message and each rendezvous payload
on this host's rings (``shm.Channels``, numbered by world rank: a rank of another host has
no ring there) or on MPI (the world's communicator, whose ranks are the world's).  What
arrives on either comes to the same handler, hence to the one endpoint.  The host's ``Node`` polls
the rings (and sees a peer of this host die at once); the MPI progress task polls MPI.  The
world is finished when the wire is (``FIN`` both ways with every rank): then the rings are
released and the MPI communicator freed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .._core.wire import Wire
from . import _mpi_lib as lib
from ._mpi_lib import mpi_errors, translate
from ._mpi_progress import Progress
from ._mpi_transport import MPITransport, OfferBytes, deliver
from ._shm_ring import Segment
from .base import Endpoint
from .shm import Channels, Node, ShmTransport

__all__ = ["HybridTransport", "Route", "open_hybrid"]


class Route:
    """Where each message goes: on this host's rings or on MPI (see module docs).  The
    link calls it as the MPI link calls its ``Progress``, with world ranks."""

    def __init__(self, channels: Channels, mpi: Progress, local: frozenset[int]) -> None:
        self.channels = channels
        self.mpi = mpi
        self.local = local  # the world ranks of this host

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self.mpi.task

    @property
    def closing(self) -> bool:
        return self.mpi.closing

    @closing.setter
    def closing(self, value: bool) -> None:
        self.channels.closing = self.mpi.closing = value

    @property
    def stopped(self) -> bool:
        return self.mpi.stopped

    @stopped.setter
    def stopped(self, value: bool) -> None:
        self.channels.stopped = self.mpi.stopped = value

    def send(self, dest: int, msg: bytes | bytearray) -> None:
        if dest in self.local:
            self.channels.send(dest, msg)
        else:
            self.mpi.send(dest, msg)

    def push(self, view: memoryview, dest: int, tag: int, done: Callable[[], None]) -> None:
        if dest in self.local:
            self.channels.push(view, dest, tag, done)
        else:
            self.mpi.push(view, dest, tag, done)

    def pull(self, view: memoryview, source: int, tag: int, done: Callable[[], None]) -> None:
        if source in self.local:
            self.channels.pull(view, source, tag, done)
        else:
            self.mpi.pull(view, source, tag, done)


class HybridTransport(ShmTransport):
    """One rank's side of the wire protocol, to each peer on the rings of this host or on
    MPI (see module docs).  Made by ``open_hybrid``; the node polls its rings, its MPI
    progress task polls MPI.

    Args:
        node: this process's group of processes on this host.
        segment: the rings of the world's ranks on this host.
        comm: the world's private MPI communicator.
        members: the world rank of each rank of the rings (this rank among them).
        procs: the group rank (in ``node``) of each rank of the rings.
        eager_limit, pools: as ``MPITransport``'s.
    """

    # The MPI link's ways, not the rings': every message goes by the route.  A large one
    # to a peer of this host is offered as on the rings alone (``_send``), and taken by the
    # rings' ``fetch``, which fetches any other as the MPI link does.
    send = MPITransport.send
    send_now = MPITransport.send_now
    #: The world ranks of this host (the rings' peers, which the C lane's MPI side leaves
    #: to them).
    ring_peers: frozenset[int]

    def _send(self, dest: int, msg: bytes | bytearray) -> None:
        """A control message to ``dest``: on the rings as the shared-memory link sends it
        (an ``RTS`` as an offer, its payload copied by the receiver), or on MPI."""
        if dest in self.ring_peers:
            ShmTransport._send(self, dest, msg)
        else:
            MPITransport._send(self, dest, msg)

    def __init__(self, node: Node, segment: Segment, comm: Any,
                 members: list[int], procs: list[int], *, eager_limit: int,
                 pools: list[int]) -> None:
        self.node = node
        self.comm = comm
        self.rank = rank = comm.Get_rank()
        self.size = size = comm.Get_size()
        self.wire = Wire(rank, size, inline_max=eager_limit,
                         credits=[p // size for p in pools], grant=pools[rank] // size)
        self.wire.data_tag_ub = int(comm.Get_attr(lib.MPI.TAG_UB) or 32767)
        self._foreign = lib.MPI.Exception  # type: ignore[assignment]
        self.offer_bytes: OfferBytes = deliver  # the world gives the fast lane's
        self.endpoint: Endpoint
        # The rings by world rank: each rank of this host where the segment has it, and
        # its process; -1 for a rank of another host.
        places, world_procs = [-1] * size, [-1] * size
        for i, (member, proc) in enumerate(zip(members, procs, strict=True)):
            places[member], world_procs[member] = i, proc
        channels = Channels(node, segment, rank, world_procs, self._on_control,
                            self._answered, places=places)
        mpi = Progress(comm, on_control=self._on_control, finished=self.check_finished,
                       failed=self._failed)
        self.ring_peers = frozenset(members)
        self.progress = Route(channels, mpi, self.ring_peers)  # type: ignore[assignment]
        self._sends = {}
        self._early = {}  # (none: ShmTransport.early_max)
        self._announced = {}
        self._broken = None
        self.dump_request = None
        self.on_dump = None
        self._finished: asyncio.Future[None] | None = None
        self.name = ""  # the world's name in the node's group (set by open_hybrid)

    @property
    def before_wait(self) -> Callable[..., None]:  # type: ignore[override]
        """``Link.before_wait``: ``wait_for``, read once per communicator."""
        return self.wait_for

    def wait_for(self, req: Any = None) -> None:
        """Before a task waits for ``req``: an op with a peer on another host has the MPI
        side poll for it (``Progress.wait_here``), any other the node look at the rings
        (``Node.before_wait``: a recv from this host, or from any source)."""
        peer = -1 if req is None else req.peer
        if peer >= 0 and peer not in self.ring_peers:
            self.mpi.wait_here(req)
        else:
            self.node.before_wait(req)

    @property
    def channels(self) -> Channels:
        return self.progress.channels  # type: ignore[attr-defined, no-any-return]

    @property
    def mpi(self) -> Progress:
        """The MPI side's progress (its ``crowded`` is set by the world)."""
        return self.progress.mpi  # type: ignore[attr-defined, no-any-return]

    def accelerate(self, lane: Any) -> None:
        """Run the per-message steps in C on both sides: the rings' as the shared-memory
        link's (``ShmTransport.accelerate``: a send to, and what lands from, a peer of this
        host, an offer's copy included), then MPI's as the MPI link's
        (``MPITransport.accelerate``) for a peer on another host, whose C steps hand a peer
        of this host (``ring_peers``) to the rings'."""
        ShmTransport.accelerate(self, lane)
        self._run_in_c(lane, self.mpi)

    def start(self, endpoint: Endpoint, loop: asyncio.AbstractEventLoop) -> None:
        """Join the node's poll and start the MPI progress task.

        Raises:
            TransportError: MPI failed.
        """
        super().start(endpoint, loop)
        with mpi_errors("posting control recvs", self.rank):
            self.mpi.start(loop, f"asynccomm-hybrid-progress-{self.rank}")

    async def wait_closed(self) -> None:
        """Wait until every rank has closed: the rings released, the communicator freed."""
        await MPITransport.wait_closed(self)
        await super().wait_closed()

    def check_finished(self) -> bool:
        """True once every rank has closed (``FIN`` both ways): the rings are released
        (asked by the node and by the MPI progress task alike)."""
        if self._finished is not None and self._finished.done():
            return True
        return super().check_finished()

    def _failed(self, exc: Exception) -> None:
        if isinstance(exc, self._foreign):
            MPITransport._failed(self, exc)
        else:
            super()._failed(exc)

    def _break(self, err: Any) -> None:
        """Stop both sides and fail everything pending (the node lets go of the rings)."""
        super()._break(err)
        self.node.remove(self)
        if self._finished is not None and not self._finished.done():
            self._finished.set_result(None)

    def close(self, rank: int, reason: str) -> None:
        self.progress.closing = True
        try:
            super().close(rank, reason)
        except lib.MPI.Exception as exc:
            self._break(translate(exc, "close", self.rank))


async def open_hybrid(node: Node, name: str, comm: Any, members: list[int],
                      procs: list[int], *, eager_limit: int,
                      pools: list[int]) -> HybridTransport:
    """This rank's link in the world ``name`` on ``comm`` (collective among the ranks of
    this host, ``members``, whose group ranks in ``node`` are ``procs``)."""
    segment = await node.open_segment(name, procs)
    link = HybridTransport(node, segment, comm, members, procs, eager_limit=eager_limit,
                           pools=pools)
    link.name = name
    return link
