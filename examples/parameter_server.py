"""A parameter server on asynccomm: rank 0 serves, ranks 1..N train an MLP with numpy.

The task is a synthetic 10-class problem (4 Gaussian blobs per class in 32 dimensions,
24,000 training and 4,000 held-out samples); a linear model gets ~70% of it right, the
32-256-256-10 MLP trained here reaches at least 95% held-out accuracy (``TARGET_ACCURACY``)
in every mode and with every compressor on the defaults, typically 98-99%.

Modes: ``sync`` (BSP: the server averages every worker's gradient each step), ``async``
(each gradient is applied as it arrives and only its worker gets fresh parameters) and
``ssp`` (as async, but no worker runs more than ``--staleness`` steps ahead of the slowest).
Gradients are pushed layer by layer as backward produces them and the next parameters are
prefetched (``--no-overlap`` turns both off), optionally compressed with error feedback.

With ``--workload resnet50`` or ``--workload dlrm`` nothing is trained: the ranks run a
real model's per-layer compute (simulated, at the device's FLOP rate) and move gradients of
its real sizes on the cluster model, and the program compares four configurations (no
overlap, per-layer overlap, overlap + 1-bit compression, the same over several servers),
printing a ``result:`` line for each (see ``ps/simulated.py``).

Run: python examples/parameter_server.py [--mode sync|async|ssp] [--staleness S]
     [--workers N] [--compression none|fp16|int8|onebit|topk] [--epochs E]
     [--no-overlap] [--no-exchange] [--loop uvloop|asyncio] [--seed S] [--processes]
     [--cluster none|ascend910|ascend910b|nvlink4|roce100g] [--clock auto|wall|virtual]
 or, one rank per process: mpiexec -n N+1 .venv/bin/python examples/parameter_server.py
 or: python examples/parameter_server.py --workload resnet50|dlrm [--cluster PRESET]
     [--workers N] [--servers S] [--batch-size B] [--steps T]
 or, a worker dying at step STEP (sync mode, in-process, or with --processes a worker's
 process killed; the rest go on):
     python examples/parameter_server.py --kill-worker-at STEP [--kill-worker RANK]
     [--processes]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import asynccomm as ac

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ps import TARGET_ACCURACY, Config, Report, RetryPolicy, train
from ps.compression import COMPRESSORS
from ps.config import MODES
from ps.simulated import Outcome, configs, simulate
from ps.survive import train_surviving
from ps.workloads import WORKLOADS

#: The presets a workload runs on when no --cluster is given: the article's 8-card
#: Ascend 910 servers and its 100G RoCE network.
WORKLOAD_PRESETS = ("ascend910", "roce100g")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, default="sync")
    parser.add_argument("--staleness", type=int, default=2,
                        help="ssp: how many steps a worker may run ahead of the slowest")
    parser.add_argument("--workload", choices=("mlp", *WORKLOADS), default="mlp",
                        help="mlp: train the MLP for real; resnet50, dlrm: a real model's "
                             "sizes and FLOPs on the cluster model, nothing trained")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker ranks, besides the servers (default 4, or N-1 under "
                             "mpiexec -n N; 8 for a workload)")
    parser.add_argument("--servers", type=int, default=4,
                        help="--workload: server ranks of the sharded configuration")
    parser.add_argument("--steps", type=int, default=3,
                        help="--workload: steps to run (the last one is measured)")
    parser.add_argument("--compression", choices=list(COMPRESSORS), default="none")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--no-overlap", action="store_true",
                        help="push after the whole backward pass; pull after the push")
    parser.add_argument("--no-exchange", action="store_true",
                        help="the compute ceiling: the workers run the same numpy work on "
                        "the same ranks and push and pull nothing (nothing is trained)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--processes", action="store_true",
                        help="each rank in a process of its own on this machine "
                        "(backend='processes': shared memory, no MPI)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-samples", type=int, default=24_000)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="per worker (default 64; a workload's own for a workload)")
    parser.add_argument("--lr", type=float, default=None, help="default: by mode")
    parser.add_argument("--cluster", choices=("none", *ac.Cluster.presets()), default="none",
                        help="run on a cluster model: compute and transfers take modelled "
                             "time and the figures are modelled ones")
    parser.add_argument("--clock", choices=("auto", "wall", "virtual"), default="auto",
                        help="auto: virtual with a cluster, wall without")
    parser.add_argument("--kill-worker-at", type=int, default=None, metavar="STEP",
                        help="a worker dies before this step: the server notices, the "
                             "survivors shrink the communicator and train on (sync mode, "
                             "in-process, or with --processes its process is killed; see "
                             "ps/survive.py)")
    parser.add_argument("--kill-worker", type=int, default=1, metavar="RANK",
                        help="--kill-worker-at: the rank of the worker that dies")
    return parser.parse_args(argv)


def world_options(args: argparse.Namespace) -> dict[str, Any]:
    """Everything ``ac.run`` gets besides the world size: the one place to describe where
    the ranks run (a cluster model and its clock join the loop here)."""
    options: dict[str, Any] = {"loop": args.loop}
    if args.processes:
        options["backend"] = "processes"
    if args.cluster != "none":
        options["cluster"] = ac.Cluster.preset(args.cluster)
    if args.clock != "auto":
        options["clock"] = args.clock
    if uses_virtual_clock(args):  # the virtual clock brings its own loop
        del options["loop"]
    return options


def default_workers() -> int:
    """4 workers and a server, or under ``mpiexec -n N`` one rank per process: N - 1."""
    processes = ac.mpi_world_size()
    return 4 if processes is None else max(1, processes - 1)


def uses_virtual_clock(args: argparse.Namespace) -> bool:
    return args.clock == "virtual" or (args.clock == "auto" and args.cluster != "none")


def _retry_notice(attempt: int, exc: ac.CommTimeoutError) -> None:
    print(f"  push timed out (attempt {attempt}), retrying: {exc}")


def print_report(report: Report) -> None:
    cfg = report.config
    model, wire = report.model, report.push_bytes
    print(f"parameter server: {cfg.mode} mode, {cfg.workers} workers + 1 server "
          f"(world size {cfg.world_size}), overlap {'on' if cfg.overlap else 'off'}"
          f"{'' if cfg.exchange else '; compute only: nothing exchanged, nothing trained'}")
    print(f"model {'-'.join(map(str, model.sizes))} ({model.parameters:,} parameters); "
          f"push per worker step: {wire / 1024:,.1f} KiB with {cfg.compression} "
          f"({wire / (4 * model.parameters):.1%} of fp32)")
    print(f"{'epoch':>5}  {'mode':<5}  {'loss':>7}  {'test acc':>8}  {'samples/s':>9}  "
          f"{'comm share':>10}")
    for row in report.rows:
        print(f"{row.epoch:>5}  {cfg.mode:<5}  {row.loss:>7.4f}  {row.test_accuracy:>8.2%}  "
              f"{row.samples_per_s:>9,.0f}  {row.comm_share:>10.1%}")
    print("comm share: time the workers spend posting messages and waiting for them (the "
          "server, the slowest worker) / their step time")
    reached = report.test_accuracy >= TARGET_ACCURACY
    print(f"result: mode={cfg.mode} compression={cfg.compression} "
          f"overlap={'on' if cfg.overlap else 'off'} workers={cfg.workers} "
          f"epochs={cfg.epochs} exchange={'on' if cfg.exchange else 'off'} "
          f"samples_per_s={report.samples_per_s:.0f} test_accuracy={report.test_accuracy:.4f} "
          f"target={TARGET_ACCURACY:.2f} reached={'yes' if reached else 'no'} "
          f"comm_share={report.comm_share:.3f} max_ahead={report.max_gap} "
          f"retries={report.retries} seconds={report.seconds:.1f}")


def run_workload(args: argparse.Namespace) -> list[Outcome]:
    """The four configurations of ``args.workload`` on each preset; print and return them."""
    if args.workers is not None and args.workers < 1 or args.servers < 1 or args.steps < 2:
        raise SystemExit("parameter_server.py: error: --workers and --servers must be >= 1 "
                         "and --steps >= 2")
    workload = WORKLOADS[args.workload]()
    if args.batch_size is not None:
        workload = dataclasses.replace(workload, batch=args.batch_size)
    workers = 8 if args.workers is None else args.workers
    presets = WORKLOAD_PRESETS if args.cluster == "none" else (args.cluster,)
    print(f"parameter server, {workload.title}: {workload.parameters / 1e6:,.1f} M parameters, "
          f"{2 * workload.macs / 1e9:.3g} GFLOP forward per sample; {workers} workers, "
          f"batch {workload.batch} each, synchronous, model time (virtual clock)")
    outcomes = []
    for preset in presets:
        cluster = ac.Cluster.preset(preset)
        print(f"\n{preset}: {'config':<26} {'push/worker':>11} {'pull/worker':>11} "
              f"{'step ms':>9} {'compute ms':>10} {'comm share':>10} {'samples/s':>11}")
        for setup in configs(args.servers):
            out = simulate(workload, cluster, setup, workers=workers, steps=args.steps)
            outcomes.append(out)
            print(f"{'':<{len(preset) + 1}} {setup.name:<26} {out.push_bytes / 1e6:>8.1f} MB "
                  f"{out.pull_bytes / 1e6:>8.1f} MB {out.step_s * 1e3:>9.2f} "
                  f"{out.compute_s * 1e3:>10.2f} {out.comm_share:>10.1%} "
                  f"{out.samples_per_s:>11,.0f}")
    print("\ncomm share: the share of a step the workers' devices wait for communication "
          "(1 - compute / step)")
    for out in outcomes:
        print(out.result_line())
    return outcomes


def run_surviving(cfg: Config, args: argparse.Namespace) -> None:
    """``--kill-worker-at``: train with a worker dying, and say what happened."""
    steps = cfg.epochs * cfg.steps_per_epoch()
    if (args.mode != "sync" or not 1 <= args.kill_worker <= cfg.workers
            or not 0 <= args.kill_worker_at < steps or cfg.workers < 2 or not cfg.exchange):
        raise SystemExit("parameter_server.py: error: --kill-worker-at needs --mode sync, "
                         "the exchange, "
                         f"2 or more workers, 0 <= STEP < {steps} and 1 <= --kill-worker "
                         f"<= {cfg.workers}")
    print(f"parameter server: sync mode, {cfg.workers} workers + 1 server; worker rank "
          f"{args.kill_worker} dies before its step {args.kill_worker_at} of {steps}")
    out = train_surviving(cfg, args.kill_worker, args.kill_worker_at, **world_options(args))
    for event in out.events:
        print(event)
    reached = out.test_accuracy >= TARGET_ACCURACY
    print(f"result: mode=sync workers={cfg.workers} killed={args.kill_worker} "
          f"at_step={args.kill_worker_at} workers_left={len(out.workers_left)} "
          f"steps={out.steps} test_accuracy={out.test_accuracy:.4f} "
          f"target={TARGET_ACCURACY:.2f} reached={'yes' if reached else 'no'}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.workload != "mlp":
        run_workload(args)
        return
    try:
        cfg = Config(mode=args.mode, staleness=args.staleness,
                     workers=default_workers() if args.workers is None else args.workers,
                     compression=args.compression, epochs=args.epochs,
                     overlap=not args.no_overlap, seed=args.seed,
                     train_samples=args.train_samples,
                     batch_size=64 if args.batch_size is None else args.batch_size,
                     lr=args.lr, retry=RetryPolicy(on_retry=_retry_notice),
                     exchange=not args.no_exchange)
    except ValueError as exc:
        raise SystemExit(f"parameter_server.py: error: {exc}") from None
    if args.kill_worker_at is not None:
        run_surviving(cfg, args)
        return
    report = train(cfg, **world_options(args))
    if report is not None:  # None: a worker's process, when each rank has its own
        print_report(report)
        if args.cluster != "none":
            clock = "virtual" if uses_virtual_clock(args) else "wall"
            print(f"modelled communication share on {args.cluster} ({clock} clock): "
                  f"{report.comm_share:.1%} ({report.config.mode} mode, overlap "
                  f"{'on' if report.config.overlap else 'off'}, "
                  f"{report.config.workers} workers, batch {report.config.batch_size})")


if __name__ == "__main__":
    main()
