"""asynccomm: asyncio point-to-point communication with HCCL/NCCL streams and MPI matching.

Re-exports only; see the README for a tour and ``help(asynccomm.Communicator)`` for the API.
"""

from __future__ import annotations

from ._collectives.ops import MAX as MAX
from ._collectives.ops import MIN as MIN
from ._collectives.ops import PROD as PROD
from ._collectives.ops import SUM as SUM
from ._collectives.ops import ReduceOp as ReduceOp
from ._comm.batches import RecvOp as RecvOp
from ._comm.batches import SendOp as SendOp
from ._comm.communicator import Communicator as Communicator
from ._comm.mpi_runner import open_mpi_world as open_mpi_world
from ._comm.runner import World as World
from ._comm.runner import launched_by_mpi as launched_by_mpi
from ._comm.runner import mpi_world_size as mpi_world_size
from ._comm.runner import open_world as open_world
from ._comm.runner import run as run
from ._comm.runner import run_async as run_async
from ._engine.request import Request as Request
from ._engine.request import TaskRequest as TaskRequest
from ._engine.request import wait_all as wait_all
from ._engine.request import wait_any as wait_any
from ._engine.stream import Event as Event
from ._engine.stream import Stream as Stream
from ._exceptions import AsyncCommError as AsyncCommError
from ._exceptions import CommBrokenError as CommBrokenError
from ._exceptions import CommClosedError as CommClosedError
from ._exceptions import CommRevokedError as CommRevokedError
from ._exceptions import CommTimeoutError as CommTimeoutError
from ._exceptions import DeadlockError as DeadlockError
from ._exceptions import DTypeMismatchError as DTypeMismatchError
from ._exceptions import MatchError as MatchError
from ._exceptions import OutOfDeviceMemoryError as OutOfDeviceMemoryError
from ._exceptions import TransportError as TransportError
from ._exceptions import TruncationError as TruncationError
from ._types import ANY_SOURCE as ANY_SOURCE
from ._types import ANY_TAG as ANY_TAG
from ._types import EAGER_LIMIT as EAGER_LIMIT
from ._types import TAG_UB as TAG_UB
from ._types import DataType as DataType
from ._types import Status as Status
from ._types import bool_ as bool_
from ._types import complex64 as complex64
from ._types import complex128 as complex128
from ._types import float16 as float16
from ._types import float32 as float32
from ._types import float64 as float64
from ._types import int8 as int8
from ._types import int16 as int16
from ._types import int32 as int32
from ._types import int64 as int64
from ._types import uint8 as uint8
from ._types import uint16 as uint16
from ._types import uint32 as uint32
from ._types import uint64 as uint64
from ._version import __version__ as __version__
from .sim.cluster import Cluster as Cluster
from .sim.device import Device as Device

__all__ = (
    "ANY_SOURCE",
    "ANY_TAG",
    "EAGER_LIMIT",
    "TAG_UB",
    "AsyncCommError",
    "Cluster",
    "CommBrokenError",
    "CommClosedError",
    "CommRevokedError",
    "CommTimeoutError",
    "Communicator",
    "DTypeMismatchError",
    "DataType",
    "DeadlockError",
    "Device",
    "Event",
    "MatchError",
    "OutOfDeviceMemoryError",
    "RecvOp",
    "MAX",
    "MIN",
    "PROD",
    "ReduceOp",
    "Request",
    "SUM",
    "TaskRequest",
    "SendOp",
    "Status",
    "Stream",
    "TransportError",
    "TruncationError",
    "World",
    "bool_",
    "complex64",
    "complex128",
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "launched_by_mpi",
    "mpi_world_size",
    "open_mpi_world",
    "open_world",
    "run",
    "run_async",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "wait_all",
    "wait_any",
)
