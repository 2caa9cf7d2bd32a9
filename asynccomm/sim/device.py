"""The (simulated) device a rank runs on: memory with a capacity, and a compute stream.

Every world gives each rank a ``Device``: named after the world (``sim:3``, ``mpi:0``,
``ascend910b:3``), with the compute rate and memory of its cluster preset when there is
one.  ``Device.alloc`` counts buffers against the memory; compute tasks
(``Communicator.compute``) occupy the compute stream one after another (a FIFO resource in
model nanoseconds, like every resource of the cluster model).
"""

from __future__ import annotations

import weakref
from typing import Any, final

import numpy as np

from .._buffers import resolve_dtype
from .._exceptions import OutOfDeviceMemoryError

__all__ = ["Device"]


@final
class Device:
    """The (simulated) device a rank runs on: its name, compute rate and memory.

    Buffers allocated with ``alloc`` count against ``capacity``; they return to it when
    freed with ``free`` or garbage collected.

    Instances are created with the world and cannot be created directly.
    """

    def __init__(self, index: int, name: str, *, flops: float | None = None,
                 capacity: int | None = None) -> None:
        self.index = index
        self.name = name
        #: Compute rate in FLOP/s (None: no model; ``compute(flops=...)`` needs one).
        self.flops = flops
        #: Memory capacity in bytes (None: unlimited).
        self.capacity = capacity
        self._in_use = 0
        self._live: dict[int, weakref.finalize[Any, Any]] = {}
        self._compute_free_at = 0
        #: The factor on its compute times (a fault plan's ``RankFault.slowdown``).
        self.slowdown = 1.0
        #: The rank's pool of collective scratch (``_collectives.scratch``), made on first use.
        self._scratch: Any = None

    def __repr__(self) -> str:
        return f"<Device {self.name} in_use={self._in_use} capacity={self.capacity}>"

    @property
    def in_use(self) -> int:
        """Bytes of device memory held by buffers from ``alloc``."""
        return self._in_use

    def alloc(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray[Any, Any]:
        """A zeroed C-contiguous array in this device's memory.

        Raises:
            OutOfDeviceMemoryError: if it would pass the device's capacity.
            TypeError, ValueError: a bad shape or dtype.
        """
        dt = resolve_dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if self.capacity is not None and self._in_use + nbytes > self.capacity:
            raise OutOfDeviceMemoryError(
                f"{self.name}: allocating {nbytes} B would exceed the device's "
                f"{self.capacity} B ({self._in_use} B in use)", rank=self.index,
                requested=nbytes, in_use=self._in_use, capacity=self.capacity)
        arr = np.zeros(shape, dtype=dt)
        self._in_use += nbytes
        self._live[id(arr)] = weakref.finalize(arr, self._release, id(arr), nbytes)
        return arr

    def free(self, arr: np.ndarray[Any, Any]) -> None:
        """Return an ``alloc`` buffer's memory now (the array must not be used after).

        Raises:
            ValueError: if the array did not come from this device's ``alloc``.
        """
        fin = self._live.get(id(arr))
        if fin is None or not fin.alive:
            raise ValueError(f"the array was not allocated on {self.name} (or was freed)")
        fin()

    def _release(self, key: int, nbytes: int) -> None:
        self._live.pop(key, None)
        self._in_use -= nbytes

    def reserve_compute(self, now: int, duration: int) -> tuple[int, int]:
        """Reserve the compute stream for ``duration`` ns from ``now`` (or when it is next
        free, FIFO); return the task's (start, end) in model ns."""
        start = max(now, self._compute_free_at)
        if self.slowdown != 1.0:
            duration = round(duration * self.slowdown)
        self._compute_free_at = start + duration
        return start, self._compute_free_at
