"""Constants and small value types shared by every layer (stdlib only)."""

from __future__ import annotations

import enum
from typing import Final, NamedTuple

__all__ = [
    "ANY_SOURCE",
    "ANY_TAG",
    "EAGER_LIMIT",
    "TAG_UB",
    "DataType",
    "Status",
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
    "uint8",
    "uint16",
    "uint32",
    "uint64",
]

#: Wildcard source for ``recv``/``probe``: match a message from any rank.
ANY_SOURCE: Final = -1
#: Wildcard tag for ``recv``/``probe``: match a message with any tag.
ANY_TAG: Final = -1
#: Largest valid tag (inclusive); tags are 0..TAG_UB, as MPI guarantees at least 32767.
TAG_UB: Final = 2**31 - 1
#: Default eager limit in bytes (inclusive): larger messages use rendezvous.
EAGER_LIMIT: Final = 65_536


class _StatusFields(NamedTuple):
    source: int
    tag: int
    nbytes: int
    count: int  # type: ignore[assignment]  # the MPI name; shadows tuple.count
    shape: tuple[int, ...]


class Status(_StatusFields):
    """What a completed recv (or a probe) found.

    Attributes:
        source: the sending rank.
        tag: the message's tag.
        nbytes: the message's size in bytes.
        count: the number of elements of the message's dtype.
        shape: the shape of the array the sender sent: ``(count,)`` for a 1-D array,
            bytes, or a send given ``count=``.  ``Status(source, tag, nbytes, count)``
            means that flat shape.
    """

    __slots__ = ()

    def __new__(cls, source: int, tag: int, nbytes: int, count: int,
                shape: tuple[int, ...] | None = None) -> Status:
        return tuple.__new__(cls, (source, tag, nbytes, count,
                                   (count,) if shape is None else tuple(shape)))


class DataType(enum.Enum):
    """Element types of the HCCL form ``send(buf, dst, count=n, dtype=ac.float32)``.

    The value is the numpy type name; ``dtype=`` also takes anything ``numpy.dtype`` takes.
    """

    BOOL = "bool"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    FLOAT16 = "float16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    COMPLEX64 = "complex64"
    COMPLEX128 = "complex128"


bool_: Final = DataType.BOOL
int8: Final = DataType.INT8
int16: Final = DataType.INT16
int32: Final = DataType.INT32
int64: Final = DataType.INT64
uint8: Final = DataType.UINT8
uint16: Final = DataType.UINT16
uint32: Final = DataType.UINT32
uint64: Final = DataType.UINT64
float16: Final = DataType.FLOAT16
float32: Final = DataType.FLOAT32
float64: Final = DataType.FLOAT64
complex64: Final = DataType.COMPLEX64
complex128: Final = DataType.COMPLEX128
