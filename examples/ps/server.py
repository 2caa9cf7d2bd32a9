"""The parameter server (rank 0): receives gradients, steps SGD with momentum, replies.

- ``sync`` (BSP): every step, wait for every worker's gradient of a layer, average them in
  rank order (bit-for-bit reproducible), step that layer, and send it to every worker.
  Layers are handled as they complete, so the top layers are updated and on their way back
  while the workers are still computing the bottom ones.
- ``async``: take gradients in arrival order (``probe(ANY_SOURCE, ANY_TAG)``), step each
  layer the moment its gradient is in, and when a worker's push is complete reply to that
  worker alone with a snapshot of the parameters.
- ``ssp`` (stale synchronous parallel, bound s): as ``async``, but a worker's clock counts
  its completed pushes, and its reply is held back while it is more than s steps ahead of
  the slowest worker, then released as soon as the slowest catches up.
"""

from __future__ import annotations

import numpy as np

import asynccomm as ac

from .compression import from_wire, make_compressor
from .config import GRAD_TAG, LOG_TAG, PARAM_TAG, Config, ServerLog, WorkerLog
from .model import MLP, Params, sgd_momentum

__all__ = ["StalenessGate", "serve"]


async def serve(comm: ac.Communicator, cfg: Config, model: MLP) -> ServerLog:
    """Run the server for ``cfg.mode`` until every worker has pushed its last step."""
    server = _Server(comm, cfg, model)
    await ac.wait_all([req for w in range(cfg.workers) for req in server.reply(w)])
    if not cfg.exchange:  # the compute ceiling: the workers push nothing
        for _ in range(cfg.epochs):
            server.snapshot()
    elif cfg.mode == "sync":
        await _serve_sync(server)
    else:
        await _serve_async(server)
    for w in range(cfg.workers):
        if w not in server.log.workers:
            await _receive_log(server, w)
    return server.log


async def _receive_log(server: _Server, worker: int) -> None:
    steps = server.cfg.epochs * server.cfg.steps_per_epoch()
    message = np.empty(4 * steps + 1)
    await server.comm.recv(message, worker + 1, LOG_TAG)
    server.log.workers[worker] = WorkerLog.from_message(message)


class StalenessGate:
    """Who may have fresh parameters now: a worker's clock counts its completed pushes,
    and a worker more than ``bound`` steps ahead of the slowest waits (``None``: never).
    A worker's last push (clock == ``steps``) needs no reply."""

    def __init__(self, workers: int, steps: int, bound: int | None) -> None:
        self.clocks = [0] * workers
        self.steps, self.bound = steps, bound
        self.held: set[int] = set()
        self.max_gap = 0
        """The furthest ahead of the slowest any worker was released."""

    def push_done(self, worker: int) -> list[int]:
        """Count ``worker``'s push; return the workers to reply to now, in rank order."""
        self.clocks[worker] += 1
        if self.clocks[worker] < self.steps:
            self.held.add(worker)
        slowest = min(self.clocks)
        ready = sorted(w for w in self.held
                       if self.bound is None or self.clocks[w] - slowest <= self.bound)
        self.held.difference_update(ready)
        self.max_gap = max([self.max_gap, *(self.clocks[w] - slowest for w in ready)])
        return ready


class _Server:
    """The parameters, their momentum, one receive buffer per (worker, layer), the log."""

    def __init__(self, comm: ac.Communicator, cfg: Config, model: MLP) -> None:
        self.comm, self.cfg, self.layers = comm, cfg, model.layers
        self.comp = make_compressor(cfg.compression)
        self.params: Params = model.init(cfg.seed)
        self.velocity = [np.zeros_like(p) for p in self.params]
        self.sizes = [p.size for p in self.params]
        self.inbox = [[np.empty(self.comp.wire_bytes(n), np.uint8) for n in self.sizes]
                      for _ in range(cfg.workers)]
        self.log = ServerLog()

    def gradient(self, worker: int, layer: int) -> np.ndarray:
        payload = from_wire(self.comp, self.inbox[worker][layer], self.sizes[layer])
        return self.comp.decompress(payload, self.sizes[layer])

    def mean_gradient(self, layer: int) -> np.ndarray:
        """Every worker's gradient of ``layer``, averaged in rank order (reproducible)."""
        grad = self.gradient(0, layer)
        for w in range(1, self.cfg.workers):
            grad += self.gradient(w, layer)
        grad *= 1 / self.cfg.workers
        return grad

    def step(self, layer: int, grad: np.ndarray) -> None:
        sgd_momentum(self.params[layer], self.velocity[layer], grad, self.cfg.learning_rate,
                     self.cfg.momentum)

    def reply(self, worker: int) -> list[ac.Request]:
        """Send ``worker`` a snapshot of every layer (a copy: the layers keep changing)."""
        return [self.comm.isend(p.copy(), worker + 1, PARAM_TAG + i)
                for i, p in enumerate(self.params)]

    def snapshot(self) -> None:
        self.log.snapshots.append([p.copy() for p in self.params])


async def _serve_sync(server: _Server) -> None:
    comm, cfg, layers = server.comm, server.cfg, server.layers
    steps, workers = cfg.epochs * cfg.steps_per_epoch(), range(cfg.workers)
    replies: list[list[ac.Request]] = [[] for _ in range(layers)]
    for step in range(steps):
        pushes = [[comm.irecv(server.inbox[w][i], w + 1, GRAD_TAG + i) for w in workers]
                  for i in range(layers)]
        for i in reversed(range(layers)):  # the order backward produces them
            await ac.wait_all(pushes[i])
            grad = server.mean_gradient(i)
            await ac.wait_all(replies[i])  # the last step's replies still read params[i]
            server.step(i, grad)
            if step + 1 < steps:
                replies[i] = [comm.isend(server.params[i], w + 1, PARAM_TAG + i)
                              for w in workers]
        if (step + 1) % cfg.steps_per_epoch() == 0:
            server.snapshot()


async def _serve_async(server: _Server) -> None:
    cfg = server.cfg
    steps, per_epoch = cfg.epochs * cfg.steps_per_epoch(), cfg.workers * cfg.steps_per_epoch()
    gate = StalenessGate(cfg.workers, steps, cfg.bound)
    received = [0] * cfg.workers  # layers in of each worker's push in progress
    replies: list[ac.Request] = []
    for done in range(1, cfg.workers * steps + 1):
        worker = await _apply_until_a_push_completes(server, received)
        for w in gate.push_done(worker):
            replies.extend(server.reply(w))
        replies = [r for r in replies if not r.done()]
        if done % per_epoch == 0:
            server.snapshot()
    server.log.max_gap = gate.max_gap
    await ac.wait_all(replies)


async def _apply_until_a_push_completes(server: _Server, received: list[int]) -> int:
    """Take gradients in arrival order, from any worker, and step each layer at once;
    return the worker whose push (every layer) has just completed."""
    while True:
        status = await server.comm.probe(ac.ANY_SOURCE, ac.ANY_TAG)
        w, i = int(status.source) - 1, int(status.tag) - GRAD_TAG
        if status.tag == LOG_TAG:  # a worker that is done, while others still push
            await _receive_log(server, w)
            continue
        await server.comm.recv(server.inbox[w][i], status.source, status.tag)
        server.step(i, server.gradient(w, i))
        received[w] += 1
        if received[w] == server.layers:
            received[w] = 0
            return w
