"""Reduction operators for the collectives: ``SUM``, ``PROD``, ``MIN``, ``MAX``.

Each reduces in place with its numpy ufunc (``np.add(a, b, out=a)``), so the result is
numpy's, bit for bit: integers wrap around on overflow, floats follow IEEE (``MIN``/``MAX``
propagate NaN), complex numbers order lexicographically for ``MIN``/``MAX``.  Every dtype the
library carries reduces with every operator, bool included, with numpy's meaning: ``SUM`` is
logical or, ``PROD`` logical and, ``MIN`` and, ``MAX`` or.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

__all__ = ["MAX", "MIN", "PROD", "SUM", "ReduceOp", "reducible", "resolve_op"]

#: dtype kinds an operator can reduce: bool, signed and unsigned ints, floats, complex.
_KINDS = frozenset("biufc")


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


def resolve_op(op: object, where: str) -> ReduceOp:
    """The ``ReduceOp`` that ``op`` names: a ``ReduceOp`` or exactly "sum", "prod", "min" or
    "max".

    Raises:
        TypeError: ``op`` is neither a ReduceOp nor a string.
        ValueError: a string that names no operator.
    """
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        try:
            return ReduceOp(op)
        except ValueError:
            raise ValueError(f"{where}: unknown reduction op {op!r}; use one of "
                             f"{', '.join(repr(o.value) for o in ReduceOp)} or "
                             "asynccomm.SUM/PROD/MIN/MAX") from None
    raise TypeError(f"{where}: op must be a ReduceOp or one of "
                    f"{', '.join(repr(o.value) for o in ReduceOp)}, got {type(op).__name__}")


def reducible(dtype: np.dtype[Any]) -> bool:
    """Whether the operators can reduce arrays of ``dtype``."""
    return dtype.kind in _KINDS
