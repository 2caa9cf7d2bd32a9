"""A parameter server for a real model's sizes on the cluster model (``--workload``).

Nothing is trained: every kernel is simulated compute (``comm.compute``) of the model's
FLOPs at the device's rate, and every gradient is a real buffer of its real size (its
contents are never read), pushed when backward has produced its bucket.  What comes out
is model time: the step, the share of it the workers' devices wait for communication,
and samples/s.

The servers (ranks 0..S-1) hold the parameters; the workers (ranks S..S+W-1) train on
``batch`` samples each per step, synchronously (BSP): each server waits for every
worker's share of a bucket, aggregates it, steps it and replies to each worker.

- ``overlap`` off: forward, backward, then every push, then every pull.
- ``overlap`` on: each bucket's pushes are posted the moment backward has produced it
  (with the receives for its new parameters), while the next bucket computes; the next
  step's forward waits, bucket by bucket, only for the parameters it needs.
- ``compression="onebit"``: pushes are 1-bit (scaled sign, with error feedback), and the
  server replies with its update compressed the same way (with its own error feedback), as
  1-bit SGD does.  Embedding rows are pulled as fp32 values: a worker holds no copy of
  the table to apply a compressed update to.
- ``servers`` > 1: the dense parameters are cut into S contiguous ranges (in backward
  order) and the touched embedding rows are spread evenly (by hash): a worker pushes each
  bucket's share to the server that owns it.

Costs besides FLOPs, memory-bound at the device's HBM bandwidth (``HBM``): embedding
gathers (forward) and scatters (backward); 1-bit compression with error feedback (read the
gradient and the residual, write the residual) and applying a compressed update; on a
server, summing the workers' shares, the SGD step with momentum, compressing its reply and
gathering rows to send back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import asynccomm as ac

from .compression import make_compressor
from .workloads import Bucket, Workload

__all__ = ["CONFIGS", "HBM", "Costs", "Outcome", "Piece", "Setup", "configs", "plan", "simulate"]

PUSH_TAG, PULL_TAG = 100, 200
#: Recvs a server keeps posted per bucket (each into its own buffer).
RECV_WINDOW = 16
#: HBM bandwidth (bytes/s) of each preset's device: Ascend 910 1.2 TB/s (Huawei, Hot Chips
#: 2019); Ascend 910B 1.6 TB/s (widely reported); H100 SXM 3.35 TB/s (datasheet).  The
#: roce100g preset's device is an Ascend 910 that stages through host memory.
HBM = {"ascend910": 1.2e12, "npu-host-staged": 1.2e12, "ascend910b": 1.6e12,
       "h100-sxm": 3.35e12}


@dataclass(frozen=True)
class Setup:
    """One configuration of the parameter server."""

    key: str  # one word, for result lines and JSON
    name: str
    overlap: bool
    compression: str
    servers: int


def configs(servers: int) -> tuple[Setup, ...]:
    """The four configurations compared, the last with ``servers`` server ranks."""
    return (Setup("no-overlap", "no overlap", False, "none", 1),
            Setup("overlap", "per-layer overlap", True, "none", 1),
            Setup("overlap-onebit", "overlap + 1-bit", True, "onebit", 1),
            Setup("overlap-onebit-sharded", f"overlap + 1-bit, {servers} servers", True,
                  "onebit", servers))


CONFIGS = configs(4)


@dataclass(frozen=True)
class Piece:
    """What one worker exchanges with one server for one bucket each step."""

    bucket: int
    server: int
    values: int  # numbers in this share of the gradient
    rows: int  # touched rows in it (sparse buckets)
    push_bytes: int
    pull_bytes: int


def plan(buckets: list[Bucket], setup: Setup) -> list[list[Piece]]:
    """Each bucket's pieces (one per server that owns part of it)."""
    comp = make_compressor(setup.compression)
    s = setup.servers
    dense_total = sum(b.params for b in buckets if not b.sparse)
    bounds = [dense_total * i // s for i in range(s + 1)]
    out: list[list[Piece]] = []
    start = 0
    for i, b in enumerate(buckets):
        pieces = []
        if b.sparse:
            for server in range(s):
                rows = b.rows // s + (server < b.rows % s)
                values = rows * b.dim
                # ids of these rows (int32), their gradients, and the next batch's ids
                pieces.append(Piece(i, server, values, rows, 8 * rows + comp.wire_bytes(values),
                                    4 * values))
        else:
            lo, hi = start, start + b.params
            start = hi
            for server in range(s):
                n = min(hi, bounds[server + 1]) - max(lo, bounds[server])
                if n > 0:
                    pieces.append(Piece(i, server, n, 0, comp.wire_bytes(n), comp.wire_bytes(n)))
        out.append(pieces)
    return out


@dataclass(frozen=True)
class Outcome:
    """What a run measured (model time), from the slowest worker."""

    workload: str
    cluster: str
    setup: Setup
    workers: int
    batch: int
    step_s: float
    compute_s: float
    push_bytes: int
    pull_bytes: int

    @property
    def comm_share(self) -> float:
        """The share of a step the worker's device waits for communication."""
        return max(0.0, 1 - self.compute_s / self.step_s)

    @property
    def samples_per_s(self) -> float:
        return self.workers * self.batch / self.step_s

    def result_line(self) -> str:
        return (f"result: workload={self.workload} cluster={self.cluster} "
                f"config={self.setup.key} "
                f"servers={self.setup.servers} workers={self.workers} batch={self.batch} "
                f"step_ms={self.step_s * 1e3:.3f} comm_share={self.comm_share:.3f} "
                f"samples_per_s={self.samples_per_s:.0f}")


class Costs:
    """Seconds of each simulated kernel on one device."""

    def __init__(self, buckets: list[Bucket], pieces: list[list[Piece]], setup: Setup,
                 flops: float, hbm: float, workers: int) -> None:
        lossy = setup.compression != "none"
        self.forward = [b.forward_flops / flops + b.lookup_bytes / hbm for b in buckets]
        self.backward = [b.backward_flops / flops + 2 * b.lookup_bytes / hbm
                         for b in buckets]
        for i, b in enumerate(buckets):
            if lossy:  # error feedback: read gradient and residual, write the residual
                self.backward[i] += 12 * b.values / hbm
                if not b.sparse:  # apply the server's compressed update to the parameters
                    self.forward[i] += 8 * b.values / hbm
        # a server's work on its piece of a bucket, once every worker's share is in
        self.server = {}
        for group in pieces:
            for p in group:
                traffic = workers * (p.push_bytes + 8 * p.values) + 20 * p.values
                traffic += (12 * p.values if lossy and not p.rows
                            else workers * p.pull_bytes if p.rows else 0)
                self.server[(p.bucket, p.server)] = traffic / hbm

    @property
    def step(self) -> float:
        return sum(self.forward) + sum(self.backward)


class _Buffers:
    """Buffers by size: fresh for each caller, or (``shared``) one per size and slot for
    all ranks, which moves the same bytes (their contents are never read) with less
    memory.  A rank's pending recvs each get their own slot: two recvs may not write the
    same memory."""

    def __init__(self, shared: bool) -> None:
        self.shared = shared
        self._cache: dict[tuple[str, int, object], np.ndarray] = {}

    def get(self, kind: str, nbytes: int, slot: object = 0) -> np.ndarray:
        if not self.shared:
            return np.zeros(nbytes, np.uint8)
        key = (kind, nbytes, slot)
        buf = self._cache.get(key)
        if buf is None:
            buf = self._cache[key] = np.zeros(nbytes, np.uint8)
        return buf


def simulate(workload: Workload, cluster: ac.Cluster, setup: Setup, *, workers: int = 8,
             steps: int = 3, byte_scale: int = 1, shared_buffers: bool = False,
             world: dict[str, Any] | None = None) -> Outcome:
    """Run ``steps`` synchronous steps and measure the last one, from the moment a worker
    has every parameter of one step to the same moment a step later (the first step
    starts on an idle network and runs faster than the steady state).

    ``byte_scale`` k divides every buffer by k; ``world`` then holds the matching ``ac.run``
    keywords (a cluster whose bandwidths are divided by k, and the size thresholds).

    Raises:
        ValueError: fewer than 2 steps, or no workers.
    """
    if steps < 2 or workers < 1:
        raise ValueError(f"need steps >= 2 and workers >= 1, got {steps} and {workers}")
    buckets = workload.buckets()
    pieces = plan(buckets, setup)
    device = cluster.device
    costs = Costs(buckets, pieces, setup, device.flops,
                   HBM.get(device.name, 2 * device.copy_bandwidth), workers)
    buffers = _Buffers(shared_buffers)
    size: Callable[[int], int] = lambda n: -(-n // byte_scale)  # noqa: E731
    s = setup.servers

    async def program(comm: ac.Communicator) -> float | None:
        if comm.rank < s:
            await _serve(comm, setup, pieces, costs, buffers, size, steps, workers)
            return None
        return await _work(comm, setup, pieces, costs, buffers, size, steps)

    options = {"cluster": cluster, **(world or {})}
    periods = ac.run(program, s + workers, **options)
    push = sum(p.push_bytes for group in pieces for p in group)
    pull = sum(p.pull_bytes for group in pieces for p in group)
    return Outcome(workload.name, cluster.name, setup, workers, workload.batch,
                   max(p for p in periods if p is not None), costs.step, push, pull)


async def _work(comm: ac.Communicator, setup: Setup, pieces: list[list[Piece]], costs: Costs,
                buffers: _Buffers, size: Callable[[int], int], steps: int) -> float:
    """One worker; returns its steady-state step time (model seconds)."""
    grads = [[buffers.get("push", size(p.push_bytes)) for p in g] for g in pieces]
    params = [[buffers.get("pull", size(p.pull_bytes), (b, j)) for j, p in enumerate(g)]
              for b, g in enumerate(pieces)]
    pulls: dict[int, list[ac.Request]] = {}
    pushes: dict[int, list[ac.Request]] = {}
    arrived = []  # per step: when its last parameters were in

    def pull(b: int) -> list[ac.Request]:
        return [comm.irecv(params[b][j], p.server, PULL_TAG + b)
                for j, p in enumerate(pieces[b])]

    def push(b: int) -> list[ac.Request]:
        return [comm.isend(grads[b][j], p.server, PUSH_TAG + b)
                for j, p in enumerate(pieces[b])]

    for _ in range(steps):
        waited: list[ac.Request] = []
        for b in reversed(range(len(pieces))):  # forward: the first layers' bucket first
            if b in pulls:
                waited += pulls[b]
                await ac.wait_all(pulls.pop(b))
            await comm.compute(seconds=costs.forward[b])
        if waited:
            arrived.append(_last_end(waited))
        for b in range(len(pieces)):  # backward
            await comm.compute(seconds=costs.backward[b])
            if setup.overlap:
                await ac.wait_all(pushes.pop(b, []))  # the last step's: done, frees the buffer
                pulls[b] = pull(b)
                pushes[b] = push(b)
        if not setup.overlap:  # every push, then every pull
            await ac.wait_all([r for b in range(len(pieces)) for r in push(b)])
            reqs = [r for b in range(len(pieces)) for r in pull(b)]
            await ac.wait_all(reqs)
            arrived.append(_last_end(reqs))
    if setup.overlap:
        reqs = [r for b in sorted(pulls) for r in pulls.pop(b)]
        await ac.wait_all(reqs + [r for b in sorted(pushes) for r in pushes.pop(b)])
        arrived.append(_last_end(reqs))
    # the first step's pushes meet an idle network: measure the last, steady one
    return arrived[-1] - arrived[-2]


def _last_end(reqs: list[ac.Request]) -> float:
    return max(r.record.end for r in reqs if r.record is not None)


async def _serve(comm: ac.Communicator, setup: Setup, pieces: list[list[Piece]], costs: Costs,
                 buffers: _Buffers, size: Callable[[int], int], steps: int,
                 workers: int) -> None:
    """One server: per step and bucket, wait for every worker's share, aggregate, reply."""
    s = setup.servers
    mine = [(b, p) for b, group in enumerate(pieces) for p in group if p.server == comm.rank]
    window = min(workers, RECV_WINDOW)
    inbox = {b: [buffers.get("inbox", size(p.push_bytes), (b, i)) for i in range(window)]
             for b, p in mine}
    reply = {b: buffers.get("reply", size(p.pull_bytes)) for b, p in mine}

    async def receive(b: int) -> None:
        """Every worker's share of bucket ``b``, in arrival order, through a window of
        buffers (a server cannot hold every worker's gradient at once)."""
        bufs = list(inbox[b])
        reqs = [comm.irecv(buf, ac.ANY_SOURCE, PUSH_TAG + b) for buf in bufs]
        posted = len(reqs)
        for _ in range(workers):
            i, _status = await ac.wait_any(reqs)
            if posted < workers:  # the buffer is free again: the next worker's share
                reqs[i] = comm.irecv(bufs[i], ac.ANY_SOURCE, PUSH_TAG + b)
                posted += 1
            else:
                del reqs[i], bufs[i]

    pending = {b: asyncio.ensure_future(receive(b)) for b, _ in mine}
    replies: list[ac.Request] = []
    for step in range(steps):
        for b, p in mine:  # backward order: as the pushes come
            await pending[b]
            await comm.compute(seconds=costs.server[(b, p.server)])
            if step + 1 < steps:
                pending[b] = asyncio.ensure_future(receive(b))
            replies += [comm.isend(reply[b], s + w, PULL_TAG + b) for w in range(workers)]
        replies = [r for r in replies if not r.done()]
    await ac.wait_all(replies)
