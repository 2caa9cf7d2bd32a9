"""A parameter server on asynccomm: rank 0 serves, ranks 1..N train an MLP with numpy.

``train(Config(...))`` runs one training job in-process and returns a ``Report``; the
command line is ``examples/parameter_server.py``.  Modules: ``data`` (the task), ``model``
(the MLP), ``compression`` (push-path compressors, error feedback), ``retry`` (timed-out
pushes), ``device`` (per-rank compute off the loop), ``server`` and ``worker``.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np

import asynccomm as ac

from .compression import make_compressor
from .config import LOG_TAG, SERVER, Config, ServerLog, WorkerLog
from .model import MLP
from .retry import PushFailedError, RetryPolicy
from .server import serve
from .worker import work

__all__ = ["TARGET_ACCURACY", "Config", "EpochRow", "PushFailedError", "Report",
           "RetryPolicy", "own_processes", "train"]

TARGET_ACCURACY = 0.95
"""Held-out accuracy every mode and every compressor reaches on the defaults (typically
98-99% after five epochs; a linear model stays near 70%)."""


@dataclass(frozen=True)
class EpochRow:
    epoch: int
    loss: float
    """Mean training loss of the epoch's mini-batches, over every worker."""
    test_accuracy: float
    samples_per_s: float
    comm_share: float
    """Share of the workers' step time spent in communication (posting and waiting)."""


@dataclass(frozen=True)
class Report:
    config: Config
    model: MLP
    rows: list[EpochRow]
    seconds: float
    retries: int
    max_gap: int
    """The furthest any worker was allowed to run ahead of the slowest, in steps."""

    @property
    def test_accuracy(self) -> float:
        return self.rows[-1].test_accuracy

    @property
    def comm_share(self) -> float:
        """Over the whole run: communication wait / step time, every worker."""
        return float(np.mean([r.comm_share for r in self.rows]))

    @property
    def samples_per_s(self) -> float:
        """The median epoch's samples per second, over every worker."""
        return float(np.median([r.samples_per_s for r in self.rows]))

    @property
    def push_bytes(self) -> int:
        """Bytes a worker pushes per step (every layer's compressed gradient)."""
        comp = make_compressor(self.config.compression)
        return sum(comp.wire_bytes(self.model.layer_size(i)) for i in range(self.model.layers))


def own_processes(world: dict[str, Any]) -> bool:
    """Whether ``ac.run(..., **world)`` gives each rank a process of its own
    (``backend="processes"``, or MPI: under ``mpiexec`` unless ``backend="local"``)."""
    backend = world.get("backend")
    if world.get("processes") or backend in ("processes", "mpi"):
        return True
    return backend is None and ac.mpi_world_size() is not None


def train(cfg: Config, inline: bool | None = None, **world: Any) -> Report | None:
    """Run ``cfg`` on ``cfg.workers + 1`` ranks and report on every epoch.

    ``world`` holds the keywords for ``ac.run`` besides the world size (``loop=...``).
    ``inline``: the workers compute on their loop's thread (see ``device``); by default
    where each rank has a process of its own (``own_processes``).  The server gathers the
    workers' measurements, so the report is rank 0's; with one rank per process the other
    processes get None.

    Raises:
        PushFailedError: a worker gave up on a push.
    """
    data = cfg.dataset()
    model = cfg.model(data)
    start = perf_counter()
    if inline is None:
        inline = own_processes(world)
    outcome = ac.run(_Program(cfg, data, model, inline),
                     world_size=cfg.world_size, **world)
    seconds = perf_counter() - start
    # in-process, run() returns every rank's value; one rank per process, its own
    server = outcome[SERVER] if isinstance(outcome, list) else outcome
    if server is None:
        return None
    workers = [server.workers[w] for w in range(cfg.workers)]
    accuracy = [model.evaluate(p, data.test.x, data.test.y)[1] for p in server.snapshots]
    return Report(cfg, model, _rows(cfg, workers, accuracy), seconds,
                  sum(w.retries for w in workers), server.max_gap)


class _Program:
    """Every rank's program: the server's or a worker's part (an object, not a closure, so
    that it travels to the ranks' processes with ``backend="processes"``)."""

    def __init__(self, cfg: Config, data: Any, model: Any, inline: bool = False) -> None:
        self.cfg = cfg
        self.data = data
        self.model = model
        self.inline = inline  # (each rank in a process of its own: compute on its loop)

    async def __call__(self, comm: ac.Communicator) -> ServerLog | None:
        if comm.rank == SERVER:
            return await serve(comm, self.cfg, self.model)
        log = await work(comm, self.cfg, self.data, self.model, self.inline)
        await comm.send(log.to_message(), SERVER, LOG_TAG)
        return None


def _rows(cfg: Config, logs: list[WorkerLog], accuracy: list[float]) -> list[EpochRow]:
    """Per-epoch figures; durations are taken on each worker's own clock."""
    per_epoch = cfg.steps_per_epoch()
    samples = cfg.workers * per_epoch * cfg.batch_size
    rows = []
    for e in range(cfg.epochs):
        part = slice(e * per_epoch, (e + 1) * per_epoch)
        busy = sum(float(np.sum(log.end[part] - log.start[part])) for log in logs)
        comm = sum(float(np.sum(log.comm_time[part])) for log in logs)
        took = max(log.end[part][-1] - (log.end[part.start - 1] if e else log.start[0])
                   for log in logs)
        loss = float(np.mean([log.loss[part] for log in logs]))
        rows.append(EpochRow(e + 1, loss, accuracy[e], samples / took, comm / busy))
    return rows
