"""Data-parallel training: every rank trains a replica, gradients meet in an all-reduce.

Each rank holds the same MLP (same seed) and trains it on its own shard of the data set of
``examples/ps`` (10 classes, 32 features).  After every step the replicas must agree on the
summed gradient; there is no server: ``comm.allreduce`` sums each gradient over the ranks
(a ring for large buffers, recursive doubling for small ones), every rank getting the same
bits.

Gradients are all-reduced bucket by bucket (a bucket is a layer) as backward produces
them, while the rank's compute stream goes on with the next layer (``--no-overlap``: after
the whole backward pass).  The replicas stay bit-for-bit identical (checked with
``comm.gather``), and the model reaches at least 95% held-out accuracy
(``TARGET_ACCURACY``) in three epochs on four ranks.

Run: python examples/training_loop.py [--ranks N] [--epochs E] [--no-overlap]
     [--loop uvloop|asyncio] [--seed S]
 or, one rank per process: mpiexec -n N .venv/bin/python examples/training_loop.py
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

import asynccomm as ac

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ps.data import Dataset, make_blobs
from ps.device import ComputeStream
from ps.model import MLP, Params, sgd_momentum

TARGET_ACCURACY = 0.95


async def allreduce_after(comm: ac.Communicator, buf: np.ndarray,
                          after: asyncio.Task[None] | None) -> None:
    """Sum ``buf`` over every rank, in place, once ``after`` (the bucket before) is done:
    every rank all-reduces the same buckets in the same order."""
    if after is not None:
        await after
    await comm.allreduce(buf)


@dataclass(frozen=True)
class Config:
    ranks: int = 4
    epochs: int = 3
    overlap: bool = True
    seed: int = 0
    batch_size: int = 64
    lr: float = 0.1
    momentum: float = 0.9
    hidden: tuple[int, ...] = (256, 256)
    train_samples: int = 24_000

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.epochs < 1:
            raise ValueError("ranks and epochs must be >= 1")
        if self.train_samples // self.ranks < self.batch_size:
            raise ValueError("each rank's shard must hold at least one batch")

    def steps_per_epoch(self) -> int:
        return (self.train_samples // self.ranks) // self.batch_size


@dataclass(repr=False)  # as ps/config.py's logs: asyncio formats results on exit
class ReplicaLog:
    params: Params
    table: np.ndarray
    """Rows: training loss, step time, time waiting for the all-reduce; a column a step."""
    snapshots: list[Params] = field(default_factory=list)


async def replica(comm: ac.Communicator, cfg: Config, data: Dataset, model: MLP) -> ReplicaLog:
    """Train this rank's replica on its shard; return its parameters and measurements."""
    batches = data.shard(comm.rank, comm.size).batches(cfg.batch_size, cfg.seed + comm.rank)
    steps = cfg.epochs * cfg.steps_per_epoch()
    log = ReplicaLog(model.init(cfg.seed), np.zeros((3, steps)))
    velocity = [np.zeros_like(p) for p in log.params]
    lr = cfg.lr / comm.size  # the all-reduce sums; the step uses the mean
    with ComputeStream(f"rank-{comm.rank}") as device:
        for step in range(steps):
            start = perf_counter()
            loss, grads, waited = await _gradients(device, comm, model, log.params,
                                                   next(batches), cfg.overlap)
            await device.run(_update, log.params, velocity, grads, lr, cfg.momentum)
            log.table[:, step] = loss, perf_counter() - start, waited
            if comm.rank == 0 and (step + 1) % cfg.steps_per_epoch() == 0:
                log.snapshots.append([p.copy() for p in log.params])
    return log


async def _gradients(device: ComputeStream, comm: ac.Communicator, model: MLP, params: Params,
                     batch: tuple[np.ndarray, np.ndarray],
                     overlap: bool) -> tuple[float, Params, float]:
    """The batch's loss, the gradients summed over every replica, and the time spent
    waiting for the all-reduce once backward was done."""
    loss, backward = await device.run(model.start_step, params, *batch)
    # queue the whole backward pass: the compute thread runs it back to back
    layers = [device.submit(next, backward) for _ in range(model.layers)]
    grads: Params = [np.empty(0)] * model.layers
    async with asyncio.TaskGroup() as group:
        last: asyncio.Task[None] | None = None
        for done in layers:
            layer, grads[layer] = await done
            if overlap:
                last = group.create_task(allreduce_after(comm, grads[layer], last))
        for layer in () if overlap else reversed(range(model.layers)):
            last = group.create_task(allreduce_after(comm, grads[layer], last))
        waited = perf_counter()
    return loss, grads, perf_counter() - waited


def _update(params: Params, velocity: Params, grads: Params, lr: float, momentum: float) -> None:
    for p, v, g in zip(params, velocity, grads, strict=True):
        sgd_momentum(p, v, g, lr, momentum)


async def gather(comm: ac.Communicator, log: ReplicaLog) -> tuple[list[np.ndarray], bool] | None:
    """On rank 0: every rank's table, and whether every replica's parameters are exactly
    rank 0's.  Other ranks get None."""
    root = comm.rank == 0
    tables = np.empty((comm.size, *log.table.shape)) if root else None
    await comm.gather(log.table, tables)
    identical = True
    for p in log.params:
        theirs = np.empty((comm.size, *p.shape), p.dtype) if root else None
        await comm.gather(p, theirs)
        identical = identical and (theirs is None or all(np.array_equal(t, p) for t in theirs))
    return (list(tables), identical) if tables is not None else None


@dataclass(frozen=True)
class Result:
    rows: list[tuple[int, float, float, float]]
    """Per epoch: (epoch, mean training loss, test accuracy, communication share)."""
    replicas_identical: bool
    seconds: float

    @property
    def test_accuracy(self) -> float:
        return self.rows[-1][2]


def train(cfg: Config, **world: Any) -> Result | None:
    """Train ``cfg.ranks`` replicas; ``world`` goes to ``ac.run`` (``loop=``).  The result
    is rank 0's; with one rank per process the other processes get None."""
    data = make_blobs(cfg.seed, train=cfg.train_samples)
    model = MLP((data.features, *cfg.hidden, data.classes))

    async def program(comm: ac.Communicator) -> tuple[ReplicaLog, list[np.ndarray], bool] | None:
        log = await replica(comm, cfg, data, model)
        gathered = await gather(comm, log)
        return None if gathered is None else (log, *gathered)

    start = perf_counter()
    outcome = ac.run(program, world_size=cfg.ranks, **world)
    seconds = perf_counter() - start
    # in-process, run() returns every rank's value; one rank per process, its own
    mine = outcome if ac.launched_by_mpi() and "backend" not in world else outcome[0]
    if mine is None:
        return None
    log, tables, identical = mine
    per_epoch, rows = cfg.steps_per_epoch(), []
    for e, snapshot in enumerate(log.snapshots):
        part = np.concatenate([t[:, e * per_epoch:(e + 1) * per_epoch] for t in tables], axis=1)
        accuracy = model.evaluate(snapshot, data.test.x, data.test.y)[1]
        rows.append((e + 1, float(part[0].mean()), accuracy, part[2].sum() / part[1].sum()))
    return Result(rows, identical, seconds)


def world_options(args: argparse.Namespace) -> dict[str, Any]:
    """Everything ``ac.run`` gets besides the world size: where and how the ranks run."""
    return {"loop": args.loop}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=None,
                        help="replicas (default 4, or N under mpiexec -n N)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--no-overlap", action="store_true")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-samples", type=int, default=24_000)
    args = parser.parse_args(argv)
    ranks = args.ranks if args.ranks is not None else ac.mpi_world_size() or 4
    cfg = Config(ranks=ranks, epochs=args.epochs, overlap=not args.no_overlap,
                 seed=args.seed, train_samples=args.train_samples)
    result = train(cfg, **world_options(args))
    if result is None:  # not rank 0, when each rank has a process of its own
        return
    print(f"all-reduce: {cfg.ranks} replicas, overlap {'on' if cfg.overlap else 'off'}")
    print(f"{'epoch':>5}  {'loss':>7}  {'test acc':>8}  {'comm share':>10}")
    for epoch, loss, accuracy, share in result.rows:
        print(f"{epoch:>5}  {loss:>7.4f}  {accuracy:>8.2%}  {share:>10.1%}")
    reached = result.test_accuracy >= TARGET_ACCURACY
    share = float(np.mean([row[3] for row in result.rows]))
    print(f"result: ranks={cfg.ranks} epochs={cfg.epochs} "
          f"overlap={'on' if cfg.overlap else 'off'} "
          f"test_accuracy={result.test_accuracy:.4f} target={TARGET_ACCURACY:.2f} "
          f"reached={'yes' if reached else 'no'} "
          f"replicas_identical={'yes' if result.replicas_identical else 'no'} "
          f"comm_share={share:.3f} seconds={result.seconds:.1f}")


if __name__ == "__main__":
    main()
