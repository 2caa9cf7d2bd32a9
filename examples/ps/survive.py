"""A synchronous parameter server that survives a worker's death (``--kill-worker-at``).

Every step the server (rank 0) sends the parameters to every worker, each worker pushes
the gradient of a batch of its shard, and the server averages them and steps.  At step
``kill_at`` one worker's program raises (``WorkerKilled``), or, with a process per rank
(``--processes``), its process is killed (``SIGKILL``): the job runs with
``faults="tolerate"``, so the worker has failed instead of ending the run.
Whoever notices first (the server, waiting for its gradient) revokes the communicator,
which stops every rank still waiting in the step; all survivors ``shrink`` to a new
communicator without the dead worker and redo that step there, and training goes on with
the workers left (the dead worker's shard is no longer seen).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Any

import numpy as np

import asynccomm as ac

from .config import Config
from .model import MLP, sgd_momentum

__all__ = ["Survival", "WorkerKilled", "train_surviving"]

SERVER, PARAMS, GRAD = 0, 1, 2


class WorkerKilled(Exception):
    """What the killed worker raises."""


@dataclass
class Survival:
    """What rank 0 saw: the notices it printed, the final test accuracy, who is left."""

    events: list[str]
    test_accuracy: float
    workers_left: list[int]  # original worker ranks still training at the end
    steps: int


def train_surviving(cfg: Config, kill_worker: int, kill_at: int, **world: object) -> Survival:
    """Train ``cfg`` (sync mode) on ``cfg.workers + 1`` ranks (``world``: ``ac.run``'s
    keywords, ``backend="processes"`` among them); worker rank ``kill_worker`` dies before
    its step ``kill_at`` (in a process of its own: killed by ``SIGKILL``)."""
    data = cfg.dataset()
    program = _Surviving(cfg, data, cfg.model(data), kill_worker, kill_at,
                         hard=world.get("backend") == "processes")
    results = ac.run(program, cfg.workers + 1, faults="tolerate", **world)  # type: ignore[arg-type]
    report = results[SERVER]
    if not isinstance(report, Survival):
        raise RuntimeError(f"the server did not finish: {report!r}")
    return report


class _Surviving:
    """Every rank's program (an object, not a closure, so that it travels to other
    processes)."""

    def __init__(self, cfg: Config, data: Any, model: MLP, kill_worker: int, kill_at: int,
                 *, hard: bool) -> None:
        self.cfg, self.data, self.model = cfg, data, model
        self.kill_worker, self.kill_at, self.hard = kill_worker, kill_at, hard

    def die(self, me: int, step: int) -> None:
        if self.hard:  # a crash: no goodbye, its peers see its process end
            os.kill(os.getpid(), signal.SIGKILL)
        raise WorkerKilled(f"worker rank {me} killed before step {step}")

    async def __call__(self, comm: ac.Communicator) -> Survival | None:
        cfg, data, model = self.cfg, self.data, self.model
        steps = cfg.epochs * cfg.steps_per_epoch()
        total = sum(model.layer_size(i) for i in range(model.layers))
        me = comm.rank  # this rank in the first communicator, for the notices
        batches = (None if me == SERVER else
                   data.shard(me - 1, cfg.workers).batches(cfg.batch_size, cfg.seed + me))
        params = model.init(cfg.seed)
        velocity = [np.zeros_like(p) for p in params]
        flat = np.empty(total, np.float32)
        events: list[str] = []
        ranks = list(range(comm.size))  # the first communicator's rank of each rank here
        step = 0
        while step < steps:
            try:
                if me == SERVER:
                    await _serve_step(comm, model, params, velocity, flat, cfg)
                else:
                    if me == self.kill_worker and step == self.kill_at:
                        self.die(me, step)
                    assert batches is not None
                    await _work_step(comm, model, params, flat, next(batches))
                step += 1
            except (ac.CommBrokenError, ac.CommRevokedError) as exc:
                if isinstance(exc, ac.CommBrokenError) and me == SERVER:
                    events.append(f"step {step}: the server lost worker rank "
                                  f"{ranks[exc.peer or 0]} ({exc}); revoking")
                comm.revoke()  # every rank still waiting in this step stops too
                new = await comm.shrink()
                ranks = [ranks[new.parent_rank(r)] for r in range(new.size)]
                comm = new
                if me == SERVER:
                    events.append(f"step {step}: shrank to {comm.size} ranks (server + "
                                  f"workers {', '.join(map(str, ranks[1:]))}); redoing "
                                  "the step and going on")
        if me != SERVER:
            return None
        accuracy = model.evaluate(params, data.test.x, data.test.y)[1]
        return Survival(events, accuracy, ranks[1:], steps)


async def _serve_step(comm: ac.Communicator, model: MLP, params: list[np.ndarray],
                      velocity: list[np.ndarray], flat: np.ndarray, cfg: Config) -> None:
    np.concatenate(params, out=flat)
    await ac.wait_all([comm.isend(flat, w, PARAMS) for w in range(1, comm.size)])
    mean = np.zeros_like(flat)
    grad = np.empty_like(flat)
    for w in range(1, comm.size):  # in rank order: the same sum whatever arrives first
        await comm.recv(grad, w, GRAD)
        mean += grad
    mean /= comm.size - 1
    at = 0
    for i, p in enumerate(params):
        sgd_momentum(p, velocity[i], mean[at:at + p.size], cfg.learning_rate, cfg.momentum)
        at += p.size


async def _work_step(comm: ac.Communicator, model: MLP, params: list[np.ndarray],
                     flat: np.ndarray, batch: tuple[np.ndarray, np.ndarray]) -> None:
    await comm.recv(flat, SERVER, PARAMS)
    at = 0
    for p in params:
        p[...] = flat[at:at + p.size]
        at += p.size
    _, backward = model.start_step(params, *batch)
    grads = dict(backward)
    await comm.send(np.concatenate([grads[i] for i in range(len(params))]), SERVER, GRAD)
