"""What a run is: the training configuration, the message tags, and the per-rank logs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .compression import COMPRESSORS
from .data import Dataset, make_blobs
from .model import MLP
from .retry import RetryPolicy

__all__ = ["GRAD_TAG", "LOG_TAG", "MODES", "PARAM_TAG", "SERVER", "Config", "ServerLog",
           "WorkerLog"]

SERVER = 0
"""The server's rank; workers are ranks 1..N."""
GRAD_TAG = 1000
"""A gradient push of layer ``l`` carries tag ``GRAD_TAG + l``."""
PARAM_TAG = 2000
"""The server's parameters of layer ``l`` carry tag ``PARAM_TAG + l``."""
LOG_TAG = 3000
"""A worker's measurements, sent to the server once it is done."""
MODES = ("sync", "async", "ssp")
_DEFAULT_LR = {"sync": 0.1, "async": 0.03, "ssp": 0.03}


@dataclass(frozen=True)
class Config:
    """A training run.  ``lr=None`` takes the mode's default: the synchronous server steps
    with the mean of every worker's gradient, the others with each gradient on its own."""

    mode: str = "sync"
    staleness: int = 2
    workers: int = 4
    compression: str = "none"
    epochs: int = 5
    overlap: bool = True
    seed: int = 0
    batch_size: int = 64
    lr: float | None = None
    momentum: float = 0.9
    hidden: tuple[int, ...] = (256, 256)
    train_samples: int = 24_000
    test_samples: int = 4_000
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    exchange: bool = True
    """False: the compute ceiling: the workers run the same numpy work (forward, backward,
    compression) on the parameters they pulled once, and push and pull nothing; nothing is
    trained."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.compression not in COMPRESSORS:
            raise ValueError(f"compression must be one of {sorted(COMPRESSORS)}, "
                             f"got {self.compression!r}")
        if self.workers < 1 or self.epochs < 1 or self.staleness < 0:
            raise ValueError("workers and epochs must be >= 1 and staleness >= 0")
        if self.train_samples // self.workers < self.batch_size:
            raise ValueError("each worker's shard must hold at least one batch")

    @property
    def world_size(self) -> int:
        return self.workers + 1

    @property
    def learning_rate(self) -> float:
        return _DEFAULT_LR[self.mode] if self.lr is None else self.lr

    @property
    def bound(self) -> int | None:
        """How many steps a worker may run ahead of the slowest; None: no bound."""
        return {"sync": 0, "async": None, "ssp": self.staleness}[self.mode]

    def dataset(self) -> Dataset:
        return make_blobs(self.seed, train=self.train_samples, test=self.test_samples)

    def model(self, data: Dataset) -> MLP:
        return MLP((data.features, *self.hidden, data.classes))

    def steps_per_epoch(self) -> int:
        """Steps of each worker per pass over its shard."""
        return (self.train_samples // self.workers) // self.batch_size


# repr=False: on Python 3.11 asyncio.Runner formats the main task's result (every rank's
# log) twice on the way out; the plain object repr keeps that from formatting arrays.
@dataclass(repr=False)
class WorkerLog:
    """What one worker measured, one column per step (seconds on its own wall clock)."""

    table: np.ndarray
    """Rows: step start, step end, time in communication, training loss."""
    retries: int = 0

    @classmethod
    def empty(cls, steps: int) -> WorkerLog:
        return cls(np.zeros((4, steps)))

    def _row(self, i: int) -> np.ndarray:
        row: np.ndarray = self.table[i]
        return row

    @property
    def start(self) -> np.ndarray:
        return self._row(0)

    @property
    def end(self) -> np.ndarray:
        return self._row(1)

    @property
    def comm_time(self) -> np.ndarray:
        return self._row(2)

    @property
    def loss(self) -> np.ndarray:
        return self._row(3)

    def to_message(self) -> np.ndarray:
        """The log as one float64 message, for the server to gather."""
        return np.append(self.table.ravel(), float(self.retries))

    @classmethod
    def from_message(cls, message: np.ndarray) -> WorkerLog:
        return cls(message[:-1].reshape(4, -1).copy(), int(message[-1]))


@dataclass(repr=False)
class ServerLog:
    """The parameters at the end of each epoch, the largest clock gap the server allowed,
    and every worker's log (by worker index), which each sends when it is done."""

    snapshots: list[list[np.ndarray]] = field(default_factory=list)
    max_gap: int = 0
    workers: dict[int, WorkerLog] = field(default_factory=dict)
