"""The CPU a rank's own work runs on: what a collective costs beyond its messages.

How it works
------------
A link's calibrated segments time the messages (a ping-pong holds the per-message work of
both sides), but a collective call does more on each rank: argument checks and setting up
the call, Python per step of its algorithm, copies (the scratch arrays a call works on and
the output written at its end, ``_collectives.functions`` Rule 6) and the reductions.
``HostSpec`` holds those rates and ``collective_seconds`` turns a call into CPU seconds;
the cluster world charges them on the rank's core before the call's first message.

Rule 1 (the call).  A call of ``nbytes`` (nccl-tests' convention: the whole buffer) on
``p`` ranks costs ``call + steps * step + copied / copy_bandwidth + reduced /
reduce_bandwidth`` seconds, where ``steps``, ``copied`` and ``reduced`` bytes are those of
the algorithm the collective runs by default at that size (``WORK``); one rank costs
``call`` only.
Rule 2 (cores).  The ranks share ``cores`` cores (0: a core per rank): rank ``r`` runs on
core ``r % cores``, and its CPU work queues on that core first come, first served, so two
ranks on one core take twice as long for their work as one.
Rule 3 (off by default).  ``HostSpec()`` costs nothing: presets of published hardware time
messages only; ``python -m asynccomm.calibrate`` measures these rates on this machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["WORK", "HostSpec", "collective_seconds", "work_of"]

#: (steps, bytes copied, bytes reduced) of a collective call of n bytes on p > 1 ranks.
Work = Callable[[int, int], tuple[int, float, float]]


def _ring_allreduce(n: int, p: int) -> tuple[int, float, float]:
    # a scratch copy of the input and the output written at the end; p-1 reductions of n/p
    return 2 * (p - 1), 2.0 * n, n * (p - 1) / p


def _ring(n: int, p: int) -> tuple[int, float, float]:
    # allgather ring / alltoall pairwise: its own block in place, the output at the end
    return p - 1, n / p + n, 0.0


def _reduce_scatter(n: int, p: int) -> tuple[int, float, float]:
    return p - 1, n + n / p, n * (p - 1) / p


def _tree(n: int, p: int) -> tuple[int, float, float]:
    return math.ceil(math.log2(p)), float(n), 0.0


def _tree_reduce(n: int, p: int) -> tuple[int, float, float]:
    return math.ceil(math.log2(p)), 2.0 * n, float(n)


WORK: dict[str, Work] = {
    "allreduce": _ring_allreduce, "allgather": _ring, "alltoall": _ring,
    "reduce_scatter": _reduce_scatter, "bcast": _tree, "gather": _tree, "scatter": _tree,
    "reduce": _tree_reduce, "barrier": lambda n, p: (math.ceil(math.log2(p)), 0.0, 0.0),
}


def _rate(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"HostSpec {field} must be a number, got {type(value).__name__}")
    if not value > 0:
        raise ValueError(f"HostSpec {field} must be > 0 bytes/s, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class HostSpec:
    """The CPU work of a collective call (see module docs); times in seconds, rates in
    bytes/s (``math.inf``: free).

    Raises:
        TypeError: a field of the wrong type.
        ValueError: ``cores`` < 0, a negative or non-finite time, a rate <= 0.
    """

    cores: int = 0  # ranks share this many cores (0: a core per rank)
    call: float = 0.0  # seconds per collective call
    step: float = 0.0  # seconds per step of its algorithm
    copy_bandwidth: float = math.inf  # bytes/s of the call's copies
    reduce_bandwidth: float = math.inf  # bytes/s of its reductions

    def __post_init__(self) -> None:
        if isinstance(self.cores, bool) or not isinstance(self.cores, int):
            raise TypeError(f"HostSpec cores must be an int, got {type(self.cores).__name__}")
        if self.cores < 0:
            raise ValueError(f"HostSpec cores must be >= 0, got {self.cores}")
        for field in ("call", "step"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"HostSpec {field} must be a number, got {type(value).__name__}")
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"HostSpec {field} must be a finite number >= 0 seconds, "
                                 f"got {value!r}")
        _rate("copy_bandwidth", self.copy_bandwidth)
        _rate("reduce_bandwidth", self.reduce_bandwidth)

    @property
    def free(self) -> bool:
        """True when a call costs nothing (Rule 3)."""
        return (self.call == self.step == 0 and math.isinf(self.copy_bandwidth)
                and math.isinf(self.reduce_bandwidth))

    def core(self, rank: int) -> int:
        """The core ``rank`` runs on (Rule 2)."""
        return rank % self.cores if self.cores else rank

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (infinite rates as None)."""
        return {"cores": self.cores, "call": self.call, "step": self.step,
                "copy_bandwidth": None if math.isinf(self.copy_bandwidth)
                else self.copy_bandwidth,
                "reduce_bandwidth": None if math.isinf(self.reduce_bandwidth)
                else self.reduce_bandwidth}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> HostSpec:
        """As ``to_dict`` writes (None rates are infinite).

        Raises:
            TypeError, ValueError: as the constructor; an unknown field.
        """
        fields = dict(doc)
        for rate in ("copy_bandwidth", "reduce_bandwidth"):
            if fields.get(rate, 0) is None:
                fields[rate] = math.inf
        return cls(**fields)


def work_of(name: str, nbytes: int, p: int) -> tuple[int, float, float]:
    """(steps, bytes copied, bytes reduced) of a call of collective ``name`` (Rule 1); an
    unknown name counts as one step that copies its buffer."""
    if p <= 1:
        return 0, 0.0, 0.0
    work = WORK.get(name)
    return work(nbytes, p) if work is not None else (1, float(nbytes), 0.0)


def collective_seconds(host: HostSpec, name: str, nbytes: int, p: int) -> float:
    """CPU seconds of one call of collective ``name`` of ``nbytes`` on ``p`` ranks."""
    steps, copied, reduced = work_of(name, nbytes, p)
    return host.call + steps * host.step + copied / host.copy_bandwidth \
        + reduced / host.reduce_bandwidth
