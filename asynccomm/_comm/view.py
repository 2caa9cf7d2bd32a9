"""What the communicator's helper modules use of it, and how a world makes communicators.

``Communicator`` (``_comm.communicator``) holds every public method; the collectives,
``sendrecv``/``batch``, ``split``/``dup`` and the object methods hand off to free functions
(``collective_api``, ``batches``, ``groups``, ``forming``, ``objects``).  Those name the
communicator by the protocol here, ``CommView``, not by its class, so that they never
import the module that imports them, not even for the type checker; mypy checks the real
class against the protocol wherever it passes itself.  A world's ``Family`` (``runner``,
``mpi_runner``) makes the communicators of a new group.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from .._buffers import BufferView
from .._collectives.costs import Chooser
from .._core.states import Kind
from .._engine.engine import DeviceEngine
from .._engine.request import Request
from .._engine.stream import Stream
from ..sim.device import Device

__all__ = ["CommView", "Family"]


class Family(Protocol):
    """How a world makes new communicators for a group of a parent's ranks."""

    async def child(self, parent: CommView, members: list[int] | None, color: int,
                    key: tuple[Any, ...]) -> CommView | None:
        """The new communicator of this rank: ``members`` are parent ranks in new-rank
        order (None: this rank joins none, but must still take part).  ``key`` names the
        group the same way on every member rank; ``color`` is the same for all members."""
        ...

    def forfeit(self, parent: CommView, key: tuple[Any, ...]) -> None:
        """``parent``'s rank will not join the group ``key`` after all: it could not hear
        whether the group is made (``_comm.forming``, Rule 2)."""
        ...

    def open_private(self, comm: CommView) -> None:
        """Give ``comm`` (and, where the world can, its group) a private context now, for
        a world that makes them on first use; others make them with the communicator."""
        ...


class CommView(Protocol):
    """The part of a ``Communicator`` its helper modules use (see the class for each)."""

    rank: int
    size: int
    device: Device
    _engine: DeviceEngine
    _loop: asyncio.AbstractEventLoop
    _default_timeout: float | None
    _family: Family
    _obj_seq: int
    _chooser: Chooser | None

    @property
    def closed(self) -> bool: ...

    def isend(self, buf: Any, dst: int, tag: int = 0, *, stream: Stream | None = None,
              timeout: float | None = None, count: int | None = None,
              dtype: Any = None) -> Request: ...

    def irecv(self, buf: Any, src: int = ..., tag: int = ..., *,
              stream: Stream | None = None, timeout: float | None = None,
              count: int | None = None, dtype: Any = None) -> Request: ...

    async def aclose(self) -> None: ...

    def _check_ready(self) -> None: ...

    def _check_rank(self, peer: object, what: str, *, wildcard: bool) -> int: ...

    def _check_tag(self, tag: object, *, wildcard: bool) -> int: ...

    def _timeout(self, timeout: object) -> float | None: ...

    def _make(self, kind: Kind, buf: BufferView | None, peer: object, tag: object,
              stream: object, timeout: object) -> Request: ...

    def _next_seq(self) -> int: ...

    def _next_tags(self) -> int: ...

    def _left_block(self, tag: int) -> None: ...

    def _private(self) -> CommView: ...

    def _adopt(self, sub: CommView) -> None: ...

    def _linger(self, task: asyncio.Future[Any]) -> None: ...
