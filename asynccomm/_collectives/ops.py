"""Reduction operators for the collectives: ``SUM``, ``PROD``, ``MIN``, ``MAX``.

Each reduces in place with its numpy ufunc (``np.add(a, b, out=a)``), so the result is
numpy's, bit for bit: integers wrap around on overflow, floats follow IEEE (``MIN``/``MAX``
propagate NaN).  Every dtype the library carries reduces with ``SUM`` and ``PROD``, bool
included, with numpy's meaning (``SUM`` is logical or, ``PROD`` logical and, ``MIN`` and,
``MAX`` or); ``MIN`` and ``MAX`` refuse complex numbers, which have no order (numpy's
lexicographic one is not the one MPI or NCCL would give, they refuse them too).
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

__all__ = ["MAX", "MIN", "PROD", "SUM", "ReduceOp", "reducible", "resolve_op"]

#: dtype kinds an operator can reduce: bool, signed and unsigned ints, floats, complex.
_KINDS = frozenset("biufc")
#: those with an order (``MIN``/``MAX``): all but complex.
_ORDERED = frozenset("biuf")


class ReduceOp(enum.Enum):
    """A reduction operator; its value is its name as a string (``ReduceOp("sum")``)."""

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"

    @property
    def ufunc(self) -> np.ufunc:
        """The numpy ufunc that combines two operands."""
        return _UFUNCS[self]

    def combine(self, first: np.ndarray[Any, Any], second: np.ndarray[Any, Any],
                out: np.ndarray[Any, Any]) -> None:
        """``out = first (op) second`` elementwise; ``out`` may be either operand."""
        _UFUNCS[self](first, second, out=out)

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"


_UFUNCS: dict[ReduceOp, np.ufunc] = {
    ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply,
    ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum,
}

SUM = ReduceOp.SUM
PROD = ReduceOp.PROD
MIN = ReduceOp.MIN
MAX = ReduceOp.MAX


def resolve_op(op: object, where: str, sendbuf: object = None) -> ReduceOp:
    """The ``ReduceOp`` that ``op`` names: a ``ReduceOp`` or its name, in any case ("sum",
    "SUM", "Max"), checked against ``sendbuf``'s dtype when it is a numpy array (every rank
    gives the same dtype, so every rank refuses alike, before anything is sent).

    Raises:
        TypeError: ``op`` is neither a ReduceOp nor a string, or it is ``MIN``/``MAX`` and
            ``sendbuf`` holds complex numbers (they have no order).
        ValueError: a string that names no operator.
    """
    if isinstance(op, ReduceOp):
        resolved = op
    elif isinstance(op, str):
        try:
            resolved = ReduceOp(op.lower())
        except ValueError:
            raise ValueError(f"{where}: unknown reduction op {op!r}; use one of "
                             f"{', '.join(repr(o.value) for o in ReduceOp)} or "
                             "asynccomm.SUM/PROD/MIN/MAX") from None
    else:
        raise TypeError(f"{where}: op must be a ReduceOp or one of "
                        f"{', '.join(repr(o.value) for o in ReduceOp)}, got "
                        f"{type(op).__name__}")
    # only the order is checked here: a dtype no op reduces is refused with the buffer
    if (isinstance(sendbuf, np.ndarray) and sendbuf.dtype.kind == "c"
            and not reducible(sendbuf.dtype, resolved)):
        raise TypeError(f"{where}: {resolved.name} cannot reduce dtype {sendbuf.dtype}: "
                        "complex numbers have no order (compare a real array: np.abs(x) or "
                        "x.real)")
    return resolved


def reducible(dtype: np.dtype[Any], op: ReduceOp | None = None) -> bool:
    """Whether ``op`` (None: some operator) can reduce arrays of ``dtype``."""
    if op in (ReduceOp.MIN, ReduceOp.MAX):
        return dtype.kind in _ORDERED
    return dtype.kind in _KINDS
