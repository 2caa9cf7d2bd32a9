"""A worker (ranks 1..N): computes gradients on its shard, pushes them, pulls parameters.

With overlap (the default) each layer's gradient is compressed and posted with ``isend``
on a push stream the moment backward has produced it, while the rank's compute stream
goes on with the next layer; and the next step's parameters are prefetched: their
``irecv`` is posted into a second set of buffers before the step's compute begins.
Without overlap the same messages go out after the whole backward pass, and the
parameters are received after the push.

With ``cfg.exchange`` off the worker only computes: the same kernels every step on the
parameters it pulled once, no push and no pull (the ceiling communication can approach).

``comm_time`` is the wall time the worker spends in communication: posting messages,
waiting for pushes to complete and parameters to arrive, retry back-off; the rest of a
step is its compute (and waiting for a core to compute on).

In a world with a cluster model (``comm.device.flops`` is set) every kernel also occupies
the rank's modelled device for its FLOP count (``comm.compute``), and steps and
communication are timed on the loop's clock, model time: the figures are then the
modelled ones (on the virtual clock the numpy work on the thread takes no model time).
The order keeps the overlap real in model time: layer k's gradient is posted before the
modelled compute of layer k-1 is issued.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from time import perf_counter

import numpy as np

import asynccomm as ac

from .compression import ErrorFeedback, make_compressor, to_wire
from .config import GRAD_TAG, PARAM_TAG, SERVER, Config, WorkerLog
from .data import Dataset
from .device import ComputeStream
from .model import MLP, Params
from .retry import push

__all__ = ["work"]

Backward = Iterator[tuple[int, np.ndarray]]


class _Step:
    """One training step's kernels: ``forward``, then one ``next_push`` per layer."""

    def __init__(self, model: MLP, params: Params, x: np.ndarray, y: np.ndarray,
                 feedback: ErrorFeedback) -> None:
        self.model, self.params, self.x, self.y, self.feedback = model, params, x, y, feedback
        self.backward: Backward = iter(())

    def forward(self) -> float:
        loss, self.backward = self.model.start_step(self.params, self.x, self.y)
        return loss

    def next_push(self) -> tuple[int, np.ndarray]:
        """The next layer's gradient, compressed and laid out as one message."""
        layer, grad = next(self.backward)
        return layer, to_wire(self.feedback.compress(layer, grad))


class _Stopwatch:
    """Adds up the time spent inside ``with`` blocks on ``clock``; ``lap()`` returns it
    and restarts."""

    def __init__(self, clock: Callable[[], float] = perf_counter) -> None:
        self.clock = clock
        self.total = 0.0
        self._since = 0.0

    def __enter__(self) -> None:
        self._since = self.clock()

    def __exit__(self, *exc: object) -> None:
        self.total += self.clock() - self._since

    def lap(self) -> float:
        total, self.total = self.total, 0.0
        return total


async def work(comm: ac.Communicator, cfg: Config, data: Dataset, model: MLP,
               inline: bool = False) -> WorkerLog:
    """Train on shard ``comm.rank - 1`` for ``cfg.epochs`` passes; return the measurements.
    ``inline``: the rank has a process of its own, and computes on its loop's thread
    (``ComputeStream``).

    Raises:
        PushFailedError: a push timed out ``cfg.retry.max_attempts`` times.
    """
    worker = _Worker(comm, cfg, data, model)
    await ac.wait_all(worker.pull(worker.params))
    with ComputeStream(f"rank-{comm.rank}", inline) as device:
        for step in range(cfg.epochs * cfg.steps_per_epoch()):
            await worker.step(device, step)
    return worker.log


_Sent = list[tuple[int, np.ndarray, ac.Request | None]]


class _Worker:
    def __init__(self, comm: ac.Communicator, cfg: Config, data: Dataset, model: MLP) -> None:
        self.comm, self.cfg, self.model = comm, cfg, model
        shard = data.shard(comm.rank - 1, cfg.workers)
        self.batches = shard.batches(cfg.batch_size, seed=cfg.seed * 7919 + comm.rank)
        self.steps = cfg.epochs * cfg.steps_per_epoch()
        sizes = [model.layer_size(i) for i in range(model.layers)]
        self.feedback = ErrorFeedback(make_compressor(cfg.compression), sizes)
        self.params = [np.empty(n, np.float32) for n in sizes]
        self.spare = [np.empty(n, np.float32) for n in sizes]  # where prefetches land
        self.pushes = comm.stream()
        # with a cluster model, model time (the loop's clock); otherwise wall time
        self.modelled = comm.device.flops is not None
        self.now = asyncio.get_running_loop().time if self.modelled else perf_counter
        self.timer = _Stopwatch(self.now)
        self.log = WorkerLog.empty(self.steps)

    def pull(self, params: Params) -> list[ac.Request]:
        return [self.comm.irecv(p, SERVER, PARAM_TAG + i) for i, p in enumerate(params)]

    async def step(self, device: ComputeStream, step: int) -> None:
        start, last = self.now(), step + 1 == self.steps
        with self.timer:
            prefetch = (self.pull(self.spare) if self.cfg.overlap and self.cfg.exchange
                        and not last else [])
        kernels = _Step(self.model, self.params, *next(self.batches), self.feedback)
        loss = device.submit(kernels.forward)
        if self.modelled:
            await self.comm.compute(flops=self.model.forward_flops(len(kernels.y)))
        sent = await self._backward(device, kernels)
        if self.cfg.exchange:
            with self.timer:
                await self._push(sent)
                if prefetch:
                    await ac.wait_all(prefetch)
                    self.params, self.spare = self.spare, self.params
                elif not last:
                    await ac.wait_all(self.pull(self.params))
        self.log.table[:, step] = start, self.now(), self.timer.lap(), loss.result()

    async def _backward(self, device: ComputeStream, kernels: _Step) -> _Sent:
        """Queue every layer's backward kernel; with overlap, post each gradient as it is
        ready, while the next layer computes (modelled: layer k's isend is posted before
        layer k-1's ``comm.compute`` is issued).  Inline, each kernel runs once the layer
        before it is posted."""
        sent: _Sent = []
        batch = len(kernels.y)
        queued = ([] if device.inline
                  else [device.submit(kernels.next_push) for _ in range(self.model.layers)])
        for layer in reversed(range(self.model.layers)):
            if self.modelled:
                await self.comm.compute(flops=self.model.backward_flops(layer, batch))
            got, wire = await (queued.pop(0) if queued else device.submit(kernels.next_push))
            assert got == layer, (got, layer)
            req = None
            if self.cfg.overlap and self.cfg.exchange:
                with self.timer:
                    req = self.comm.isend(wire, SERVER, GRAD_TAG + layer, stream=self.pushes,
                                          timeout=self.cfg.retry.timeout)
            sent.append((layer, wire, req))
        return sent

    async def _push(self, sent: _Sent) -> None:
        """Complete every push (sending those not posted yet), retrying timed-out ones."""
        for layer, wire, req in sent:
            attempts = await push(self.comm, wire, SERVER, GRAD_TAG + layer, self.cfg.retry,
                                  stream=self.pushes, first=req)
            self.log.retries += attempts - 1
