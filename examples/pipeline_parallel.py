"""Pipeline parallelism (GPipe and 1F1B) inside data-parallel replicas.

The world is a grid: ``--replicas R`` copies of a model cut into ``--stages P`` stages, one
rank per (replica, stage), world rank ``replica * P + stage``.  Two splits of the world give
each rank its two groups::

    stage_comm = await comm.split(color=replica, key=stage)   # the pipeline (P ranks)
    dp_comm    = await comm.split(color=stage, key=replica)   # the stage's replicas (R ranks)

The model is an MLP (32 features, ``--layers-per-stage`` ReLU layers of ``--width`` per
stage, 10 classes), trained on the synthetic task of ``examples/ps``.  Each step a replica's
batch is cut into ``--microbatches M`` micro-batches.  Activations go forward from stage to
stage and gradients backward with ``isend``/``irecv`` on ``stage_comm`` (sends on two
streams, one per direction, receives posted one operation ahead), so a stage's transfers
overlap its compute.  Two schedules order a stage's forward (F) and backward (B) passes:

  gpipe   every F, then every B: a stage holds all M micro-batches' activations at once.
  1f1b    P - 1 - stage warm-up Fs, then one F and one B in turn, then the remaining Bs
          (PipeDream-flush): a stage holds at most P - stage micro-batches' activations.

After the last backward, each stage sums its gradient over the replicas with
``dp_comm.allreduce`` (every replica gets the same bits) and takes an SGD step.

The bubble.  For a stage, over one step's pipelined part (from the first operation any
stage of the pipeline starts to the end of the last backward of any of them: the window
W), ``bubble = 1 - busy / W``, where ``busy`` is the time the stage's device spent in its
M forward and M backward passes.  The result line gives its mean over every rank and step.
When every stage takes F per forward and B per backward, and transfers take no time, both
schedules have W = (M + P - 1)(F + B) and busy = M(F + B), so the bubble is
(P - 1) / (M + P - 1): the closed form printed beside it.

On a cluster model (``--cluster``, the default, virtual clock) every layer's kernel occupies
the rank's modelled device for ``--layer-gflops`` GFLOP forward and twice that backward
(``comm.compute(flops=...)``; 206 GFLOP is a transformer layer of hidden size 8192 on 128
tokens, about 0.66 ms on an Ascend 910B), while numpy still computes the small MLP's
numbers (on the loop, costing no model time): the small model stands in for a large one's
numerics, the device is charged for the large one's compute.  The activations that travel
are the small MLP's (16 KiB per micro-batch by default): 4.6 microseconds per hop over
HCCS against milliseconds of compute, which is the closed form's assumption; busy and W are
model time.  Those microseconds are why the measured bubble sits a little above the closed
form: GPipe has 2(P - 1) hops on its critical path, 1F1B about one more per micro-batch, as
its turns from forward to backward wait on a neighbour (at P = 4: +0.2% and +0.5% of the
closed form at M = 8, +0.2% and +1.9% at M = 32).

With ``--wall`` (the default under mpiexec) the MLP's matrix products run on a thread per
rank (numpy releases the GIL) and everything is wall time.  The same numbers come out (the
losses are those of the modelled run, bit for bit), but its kernels take microseconds, so
messaging and the ranks' sharing of this machine's cores make most of the measured bubble:
it says more about the host than about the schedule.

Run: python examples/pipeline_parallel.py [--schedule gpipe|1f1b] [--stages P]
     [--replicas R] [--microbatches M] [--cluster PRESET | --wall] [--loop uvloop|asyncio]
 or, one rank per process (wall clock only): mpiexec -n N .venv/bin/python
     examples/pipeline_parallel.py [--stages P] [--replicas R]
     (P x R must be N; by default they fit N: P the largest divisor of N up to 4)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import numpy as np

import asynccomm as ac

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ps.data import make_blobs
from ps.device import ComputeStream, limit_blas_threads
from ps.model import softmax_cross_entropy

T = TypeVar("T")
SCHEDULES = ("gpipe", "1f1b")
#: The grid in one process: 4 stages x 2 replicas.
STAGES, REPLICAS = 4, 2
Op = tuple[str, int]
"""A stage's operation: ("F", micro-batch) or ("B", micro-batch)."""


def schedule(kind: str, stage: int, stages: int, microbatches: int) -> list[Op]:
    """The order in which ``stage`` runs its forward and backward passes.

    Raises:
        ValueError: an unknown ``kind``.
    """
    m = microbatches
    if kind == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if kind == "1f1b":
        warmup = min(stages - stage - 1, m)
        ops = [("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [("F", warmup + i), ("B", i)]
        return ops + [("B", i) for i in range(m - warmup, m)]
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}")


def peak_in_flight(ops: list[Op]) -> int:
    """The most micro-batches whose activations a stage holds at once (forward done,
    backward not yet)."""
    held = peak = 0
    for kind, _ in ops:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def closed_form(stages: int, microbatches: int) -> float:
    """The bubble of GPipe and 1F1B with equal stages and free transfers."""
    return (stages - 1) / (microbatches + stages - 1)


@dataclass(frozen=True)
class Config:
    schedule: str = "1f1b"
    stages: int = 4
    replicas: int = 2
    microbatches: int = 8
    micro_batch: int = 32
    """Samples per micro-batch."""
    width: int = 128
    layers_per_stage: int = 2
    steps: int = 10
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    train_samples: int = 16_384
    layer_gflops: float = 206.0
    """On a cluster model: the modelled forward GFLOP of one layer on one micro-batch."""

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if min(self.stages, self.replicas, self.microbatches, self.micro_batch, self.width,
               self.layers_per_stage, self.steps) < 1:
            raise ValueError("stages, replicas, microbatches, sizes and steps must be >= 1")
        if self.train_samples // self.replicas < self.microbatches * self.micro_batch:
            raise ValueError("each replica's shard must hold at least one step's batch")

    @property
    def ranks(self) -> int:
        return self.stages * self.replicas

    def sizes(self, features: int, classes: int) -> tuple[int, ...]:
        """Every layer's width, inputs first and classes last."""
        hidden = self.stages * self.layers_per_stage - 1
        return (features, *([self.width] * hidden), classes)


class Stage:
    """One stage's layers of the MLP: parameters, and one flat gradient buffer (the unit
    of the data-parallel all-reduce) that backward passes accumulate into."""

    def __init__(self, sizes: tuple[int, ...], first: int, last: int, seed: int) -> None:
        self.first_layer, self.final = first, last == len(sizes) - 1
        shapes = [(sizes[i], sizes[i + 1]) for i in range(first, last)]
        count = sum(i * o + o for i, o in shapes)
        self.flat_params = np.zeros(count, np.float32)
        self.flat_grad = np.zeros(count, np.float32)
        self.velocity = np.zeros(count, np.float32)
        self.params: list[tuple[np.ndarray, np.ndarray]] = []
        self.grads: list[tuple[np.ndarray, np.ndarray]] = []
        at = 0
        for layer, (i, o) in zip(range(first, last), shapes, strict=True):
            w, b = self._views(self.flat_params, at, i, o)
            # seeded by the layer: every replica starts alike, however the model is cut
            rng = np.random.default_rng([seed, layer])
            scale = np.sqrt(2 / i) if layer < len(sizes) - 2 else 0.1 / np.sqrt(i)
            w[...] = rng.standard_normal((i, o), dtype=np.float32) * scale
            self.params.append((w, b))
            self.grads.append(self._views(self.flat_grad, at, i, o))
            at += i * o + o

    @staticmethod
    def _views(flat: np.ndarray, at: int, i: int, o: int) -> tuple[np.ndarray, np.ndarray]:
        return flat[at:at + i * o].reshape(i, o), flat[at + i * o:at + i * o + o]

    def forward(self, x: np.ndarray) -> list[np.ndarray]:
        """Every layer's input, then the stage's output (logits on the final stage)."""
        acts = [x]
        for n, (w, b) in enumerate(self.params):
            z = acts[-1] @ w
            z += b
            if not (self.final and n == len(self.params) - 1):
                np.maximum(z, 0, out=z)
            acts.append(z)
        return acts

    def backward(self, acts: list[np.ndarray], delta: np.ndarray) -> np.ndarray | None:
        """Accumulate the gradients of one micro-batch; return the error for the stage
        before (None on the first stage).  Its input came out of a ReLU, so the error is
        masked here by that ReLU's derivative."""
        for n in reversed(range(len(self.params))):
            gw, gb = self.grads[n]
            gw += acts[n].T @ delta
            gb += delta.sum(axis=0)
            if n > 0 or self.first_layer > 0:
                delta = (delta @ self.params[n][0].T) * (acts[n] > 0)
        return delta if self.first_layer > 0 else None

    def sgd(self, lr: float, momentum: float) -> None:
        self.velocity *= momentum
        self.velocity += self.flat_grad
        self.flat_params -= lr * self.velocity
        self.flat_grad[...] = 0


def _timed(fn: Callable[..., T], *args: Any) -> tuple[T, float]:
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


class Rank:
    """One rank's part of the training: its stage, its two groups and its timings."""

    def __init__(self, comm: ac.Communicator, stage_comm: ac.Communicator,
                 dp_comm: ac.Communicator, cfg: Config, stage: Stage,
                 device: ComputeStream | None) -> None:
        self.comm, self.stage_comm, self.dp_comm, self.cfg = comm, stage_comm, dp_comm, cfg
        self.stage, self.device = stage, device
        self.index = stage_comm.rank
        self.first, self.last = self.index == 0, self.index == cfg.stages - 1
        self.ops = schedule(cfg.schedule, self.index, cfg.stages, cfg.microbatches)
        self.fwd_stream, self.bwd_stream = stage_comm.stream(), stage_comm.stream()
        self.gflops = cfg.layer_gflops * cfg.layers_per_stage
        self.busy = 0.0
        self.last_grad = np.empty(0, np.float32)

    def now(self) -> float:
        """Model time on a cluster; otherwise this host's monotonic clock (shared by the
        processes of one host, so windows can be compared across them)."""
        return self.comm.model_time() if self.device is None else time.monotonic()

    async def kernel(self, fn: Callable[..., T], *args: Any, gflops: float) -> T:
        """Run one pass and add its duration to ``busy``: on the cluster model the numbers
        come from numpy at once and the device is charged ``gflops``; on the wall clock
        the numpy code runs on the rank's thread."""
        if self.device is None:
            result = fn(*args)
            start = self.now()
            await self.comm.compute(flops=gflops * 1e9)
            self.busy += self.now() - start
            return result
        result, seconds = await self.device.run(_timed, fn, *args)
        self.busy += seconds
        return result

    def _post(self, op: Op, recvs: dict[Op, tuple[ac.Request, np.ndarray]]) -> None:
        """Post the receive ``op`` needs (activations from the stage before for an F,
        the error from the stage after for a B), unless it needs none or it is posted."""
        kind, mb = op
        if op in recvs or (kind == "F" and self.first) or (kind == "B" and self.last):
            return
        buf = np.empty((self.cfg.micro_batch, self.cfg.width), np.float32)
        peer = self.index - 1 if kind == "F" else self.index + 1
        recvs[op] = self.stage_comm.irecv(buf, peer, tag=2 * mb + (kind == "B")), buf

    async def step(self, xs: list[np.ndarray], ys: list[np.ndarray]) -> tuple[float, float]:
        """One step: the pipelined passes, the all-reduce and the update.  Returns the
        stage's bubble and the loss (the mean over the replica's micro-batches on the
        final stage, NaN elsewhere)."""
        await self.stage_comm.barrier()
        self.busy, start = 0.0, self.now()
        state = _StepState(xs, ys)
        for k, (kind, mb) in enumerate(self.ops):
            for op in self.ops[k:k + 2]:  # this op's receive, and the next one's
                self._post(op, state.recvs)
            await (self._forward_pass(state, mb) if kind == "F"
                   else self._backward_pass(state, mb))
        end = self.now()
        await ac.wait_all(state.sends)
        window = np.array([-start, end])  # the pipeline's first start and last end
        await self.stage_comm.allreduce(window, op=ac.MAX)
        bubble = 1 - self.busy / float(window[0] + window[1])
        await self.dp_comm.allreduce(self.stage.flat_grad)
        self.stage.flat_grad /= self.cfg.replicas
        self.last_grad = self.stage.flat_grad.copy()
        self.stage.sgd(self.cfg.lr, self.cfg.momentum)
        return bubble, float(np.mean(state.losses)) if state.losses else float("nan")

    async def _forward_pass(self, state: _StepState, mb: int) -> None:
        x = state.xs[mb] if self.first else await state.received(("F", mb))
        acts = await self.kernel(self._forward, x, state, mb, gflops=self.gflops)
        state.held[mb] = acts
        if not self.last:  # acts[-1] is not touched again until the send is done
            state.sends.append(self.stage_comm.isend(acts[-1], self.index + 1, tag=2 * mb,
                                                     stream=self.fwd_stream))

    async def _backward_pass(self, state: _StepState, mb: int) -> None:
        dy = state.errors.pop(mb) if self.last else await state.received(("B", mb))
        dx = await self.kernel(self.stage.backward, state.held.pop(mb), dy,
                               gflops=2 * self.gflops)
        if dx is not None:
            state.sends.append(self.stage_comm.isend(dx, self.index - 1, tag=2 * mb + 1,
                                                     stream=self.bwd_stream))

    def _forward(self, x: np.ndarray, state: _StepState, mb: int) -> list[np.ndarray]:
        acts = self.stage.forward(x)
        if self.last:  # the loss is the mean over the step's micro-batches
            loss, dlogits = softmax_cross_entropy(acts[-1], state.ys[mb])
            dlogits /= self.cfg.microbatches
            state.errors[mb] = dlogits
            state.losses.append(loss)
        return acts


@dataclass
class _StepState:
    """What one step's passes leave for the passes after them."""

    xs: list[np.ndarray]
    ys: list[np.ndarray]
    recvs: dict[Op, tuple[ac.Request, np.ndarray]] = field(default_factory=dict)
    sends: list[ac.Request] = field(default_factory=list)
    held: dict[int, list[np.ndarray]] = field(default_factory=dict)
    """Per micro-batch between its forward and its backward: every layer's input."""
    errors: dict[int, np.ndarray] = field(default_factory=dict)
    """On the final stage: the loss's gradient w.r.t. each micro-batch's logits."""
    losses: list[float] = field(default_factory=list)

    async def received(self, op: Op) -> np.ndarray:
        req, buf = self.recvs.pop(op)
        await req
        return buf


@dataclass(frozen=True)
class Report:
    config: Config
    clock: str
    bubble: float
    """Mean over every rank and step."""
    bubbles: np.ndarray
    """Per world rank, the mean over steps."""
    peak_in_flight: list[int]
    """Per stage."""
    losses: list[float]
    """Per step, replica 0's."""
    replicas_identical: bool
    seconds: float

    @property
    def closed_form(self) -> float:
        return closed_form(self.config.stages, self.config.microbatches)


STATS = 4
"""Per rank: mean bubble, peak in flight, replicas identical, stage; then a loss a step."""


async def train_rank(comm: ac.Communicator, cfg: Config,
                     wall: bool) -> tuple[np.ndarray | None, np.ndarray]:
    """Run this rank's steps.  Returns every rank's statistics (see ``STATS``) on world
    rank 0, None elsewhere; and this rank's gradient of the last step, all-reduced."""
    if comm.size != cfg.ranks:
        raise ValueError(f"{cfg.stages} stages x {cfg.replicas} replicas need {cfg.ranks} "
                         f"ranks, the world has {comm.size}")
    replica, index = divmod(comm.rank, cfg.stages)
    stage_comm = await comm.split(color=replica, key=index)
    dp_comm = await comm.split(color=index, key=replica)
    assert stage_comm is not None and dp_comm is not None
    limit_blas_threads()  # small products: BLAS threads would only fight over the cores
    data = make_blobs(cfg.seed, train=cfg.train_samples)
    layers = cfg.layers_per_stage
    stage = Stage(cfg.sizes(data.features, data.classes), index * layers,
                  (index + 1) * layers, cfg.seed)
    batches = data.shard(replica, cfg.replicas).batches(cfg.microbatches * cfg.micro_batch,
                                                        cfg.seed + replica)
    device = ComputeStream(f"rank-{comm.rank}") if wall else None
    rank = Rank(comm, stage_comm, dp_comm, cfg, stage, device)
    try:
        results = [await rank.step(*_micro_batches(next(batches), cfg.microbatches))
                   for _ in range(cfg.steps)]
    finally:
        if device is not None:
            device.close()
    identical = await _replicas_identical(dp_comm, stage.flat_params)
    bubbles, losses = zip(*results, strict=True)
    row = np.array([np.mean(bubbles), peak_in_flight(rank.ops), identical, index, *losses])
    table = np.empty((comm.size, row.size)) if comm.rank == 0 else None
    await comm.gather(row, table)
    return table, rank.last_grad


def _micro_batches(batch: tuple[np.ndarray, np.ndarray],
                   m: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    x, y = batch
    return list(np.split(x, m)), list(np.split(y, m))


async def _replicas_identical(dp_comm: ac.Communicator, params: np.ndarray) -> bool:
    """Whether every replica of this stage holds exactly the same parameters."""
    every = np.empty((dp_comm.size, *params.shape), params.dtype)
    await dp_comm.allgather(params, every)
    return all(np.array_equal(p, params) for p in every)


def train(cfg: Config, *, wall: bool = False, **world: Any) -> Report | None:
    """Train ``cfg`` on ``cfg.ranks`` ranks; ``world`` goes to ``ac.run`` (``cluster=``,
    ``loop=``).  One rank per process (MPI), only world rank 0 gets the report."""
    start = time.perf_counter()

    async def program(comm: ac.Communicator) -> np.ndarray | None:
        return (await train_rank(comm, cfg, wall))[0]

    outcome = ac.run(program, world_size=cfg.ranks, **world)
    under_mpi = ac.launched_by_mpi() and world.get("backend") != "local"
    table = outcome if under_mpi else outcome[0]
    if table is None:
        return None
    peaks = [int(table[table[:, 3] == s, 1].max()) for s in range(cfg.stages)]
    losses = [float(v) for v in table[cfg.stages - 1, STATS:]]  # replica 0's final stage
    return Report(cfg, "wall" if wall else "virtual", float(table[:, 0].mean()), table[:, 0],
                  peaks, losses, bool(table[:, 2].all()), time.perf_counter() - start)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    parser.add_argument("--stages", type=int, default=None,
                        help=f"default {STAGES}, or under mpiexec -n N the largest divisor of "
                             f"N up to {STAGES} (N / replicas with --replicas)")
    parser.add_argument("--replicas", type=int, default=None,
                        help=f"default {REPLICAS}, or N / stages under mpiexec -n N")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=32, help="samples per micro-batch")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers-per-stage", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--layer-gflops", type=float, default=206.0,
                        help="on a cluster model: forward GFLOP of a layer on a micro-batch")
    parser.add_argument("--seed", type=int, default=0)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--cluster", choices=ac.Cluster.presets(), default=None,
                       help="the cluster model, on the virtual clock (default ascend910b; "
                            "in-process only)")
    where.add_argument("--wall", action="store_true",
                       help="numpy compute on the wall clock (the default under mpiexec)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="the event loop on the wall clock")
    return parser.parse_args(argv)


def config(args: argparse.Namespace) -> Config:
    """The configuration the flags ask for (the replicas follow an MPI launcher's size).

    Raises:
        SystemExit: flags that do not fit together or with the launcher.
    """
    processes = ac.mpi_world_size()
    if processes is not None and args.cluster is not None:
        _exit("cluster models run in-process only: under mpiexec use --wall (the default "
              "there), or start it with python")
    stages, replicas = args.stages, args.replicas
    if processes is None:
        stages, replicas = stages or STAGES, replicas or REPLICAS
    elif stages is None and replicas is None:  # the grid that fits the launcher
        stages = max(d for d in range(1, STAGES + 1) if processes % d == 0)
        replicas = processes // stages
    elif replicas is None:
        replicas = processes // max(stages, 1)
    elif stages is None:
        stages = processes // max(replicas, 1)
    if processes is not None and processes != stages * replicas:
        asked = " ".join(f"--{flag} {value}" for flag, value in
                         (("stages", args.stages), ("replicas", args.replicas))
                         if value is not None)
        _exit(f"{asked} does not fit the {processes} processes mpiexec started: pass "
              f"--stages P and --replicas R with P x R = {processes}, or leave them out "
              "(they then fit it)")
    try:
        return Config(schedule=args.schedule, stages=stages, replicas=replicas,
                      microbatches=args.microbatches, micro_batch=args.micro_batch,
                      width=args.width, layers_per_stage=args.layers_per_stage,
                      steps=args.steps, seed=args.seed, layer_gflops=args.layer_gflops)
    except ValueError as exc:
        _exit(f"error: {exc}")


def _exit(message: str) -> NoReturn:
    """Stop with ``message``, said once: by world rank 0 alone under an MPI launcher (every
    process reaches the same verdict; the others stop silently, with the same status).

    Raises:
        SystemExit: always.
    """
    rank = next((os.environ[v] for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
                 if v in os.environ), "0")
    if rank != "0":
        raise SystemExit(1)
    raise SystemExit(f"pipeline_parallel.py: {message}")


def world_options(args: argparse.Namespace) -> dict[str, Any]:
    """What ``ac.run`` gets besides the world size, and whether compute is on the wall."""
    if args.wall or ac.launched_by_mpi():
        return {"wall": True, "loop": args.loop}
    return {"cluster": ac.Cluster.preset(args.cluster or "ascend910b")}


def print_report(report: Report, cluster: ac.Cluster | None) -> None:
    cfg = report.config
    sizes = cfg.sizes(32, 10)
    print(f"pipeline parallel: {cfg.schedule}, {cfg.stages} stages x {cfg.replicas} replicas "
          f"({cfg.ranks} ranks), {cfg.microbatches} micro-batches of {cfg.micro_batch} "
          f"samples")
    print(f"model {sizes[0]}-{cfg.width}x{len(sizes) - 2}-{sizes[-1]}, "
          f"{cfg.layers_per_stage} layers per stage; activations "
          f"{cfg.micro_batch * cfg.width * 4 / 1024:.0f} KiB per micro-batch and hop")
    if cluster is not None:
        layer_ms = cfg.layer_gflops * 1e9 / cluster.device.flops * 1e3
        print(f"on {cluster.name} (virtual clock): a layer takes {layer_ms:.3f} ms forward "
              f"({cfg.layer_gflops:g} GFLOP per micro-batch), {2 * layer_ms:.3f} ms backward")
    else:
        print("numpy on a thread per rank, wall clock")
    print(f"{'step':>4}  {'loss':>7}")
    for n, loss in enumerate(report.losses, 1):
        print(f"{n:>4}  {loss:>7.4f}")
    per_stage = [float(np.mean(report.bubbles[s::cfg.stages])) for s in range(cfg.stages)]
    print(f"bubble per stage: {' '.join(f'{b:.4f}' for b in per_stage)} "
          f"(closed form (P-1)/(M+P-1) = {report.closed_form:.4f})")
    print(f"peak in-flight activations per stage: {' '.join(map(str, report.peak_in_flight))} "
          f"(GPipe holds {cfg.microbatches}, 1F1B at most {min(cfg.stages, cfg.microbatches)})")
    print(f"result: schedule={cfg.schedule} stages={cfg.stages} replicas={cfg.replicas} "
          f"microbatches={cfg.microbatches} clock={report.clock} bubble={report.bubble:.4f} "
          f"closed_form={report.closed_form:.4f} "
          f"peak_in_flight={max(report.peak_in_flight)} "
          f"loss_first={report.losses[0]:.4f} loss_last={report.losses[-1]:.4f} "
          f"replicas_identical={'yes' if report.replicas_identical else 'no'} "
          f"seconds={report.seconds:.1f}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cfg = config(args)
    options = world_options(args)
    report = train(cfg, **options)
    if report is not None:  # None: not world rank 0, one rank per process
        print_report(report, options.get("cluster"))


if __name__ == "__main__":
    main()
