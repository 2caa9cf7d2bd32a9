"""The parameter server's synchronous training with no library at all: what a plain
program of blocking processes gets on this machine, beside which ``benchmarks.ps_ceiling``
sets asynccomm's figures.

Run: ``python -m benchmarks.ps_blocking [--workers N] [--epochs E]``

The same job as ``examples/parameter_server.py`` in its default mode (sync, no
compression, 4 workers and a server, the MLP trained for real): the same data, shards,
batches, kernels and messages, each rank a process of its own (forked), the server joined
to each worker by a Unix socket pair whose buffers hold a whole step's messages. Each
rank waits in the kernel (a blocking ``recv_into``), with no event loop and no polling:

- a worker sends each layer's gradient the moment backward has made it, then takes the
  next parameters layer by layer;
- the server takes a layer's gradient from every worker, in the order backward makes them,
  averages them in rank order, steps that layer and sends it to every worker at once.

It prints the example's ``result:`` line (``samples_per_s`` is the median epoch's samples
per second over every worker, reckoned as the example reckons it; ``comm_share`` the share
of the workers' step time spent waiting for the parameters) and checks that the
model learned (held-out accuracy at least ``TARGET_ACCURACY``), so that the work it times
is the example's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from ps import TARGET_ACCURACY, Config  # noqa: E402
from ps.compression import ErrorFeedback, make_compressor, to_wire  # noqa: E402
from ps.config import WorkerLog  # noqa: E402
from ps.device import limit_blas_threads  # noqa: E402
from ps.server import _Server  # noqa: E402

#: Socket buffers large enough for a whole step's messages either way (no send waits on
#: its receiver's reading).
SOCKET_BUFFER = 4 << 20


def _recv_into(sock: socket.socket, buf: np.ndarray) -> None:
    view = memoryview(buf).cast("B")
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            raise ConnectionError("the peer closed its socket")
        got += n


def _worker(rank: int, cfg: Config, sock: socket.socket, out: Any) -> None:
    limit_blas_threads()  # (one thread a product, as the example's compute stream)
    data = cfg.dataset()
    model = cfg.model(data)
    shard = data.shard(rank - 1, cfg.workers)
    batches = shard.batches(cfg.batch_size, seed=cfg.seed * 7919 + rank)
    sizes = [model.layer_size(i) for i in range(model.layers)]
    feedback = ErrorFeedback(make_compressor(cfg.compression), sizes)
    params = [np.empty(n, np.float32) for n in sizes]
    steps = cfg.epochs * cfg.steps_per_epoch()
    log = WorkerLog.empty(steps)
    for i in reversed(range(model.layers)):
        _recv_into(sock, params[i])
    for step in range(steps):
        start = perf_counter()
        x, y = next(batches)
        loss, backward = model.start_step(params, x, y)
        for layer, grad in backward:
            sock.sendall(to_wire(feedback.compress(layer, grad)))
        waited = perf_counter()
        if step + 1 < steps:
            for i in reversed(range(model.layers)):  # (the order the server steps them)
                _recv_into(sock, params[i])
        end = perf_counter()
        log.table[:, step] = start, end, end - waited, loss
    out.send(log.to_message())
    sock.close()


def _server(cfg: Config, socks: list[socket.socket], out: Any) -> None:
    limit_blas_threads()
    data = cfg.dataset()
    model = cfg.model(data)
    server = _Server(None, cfg, model)  # (its buffers and kernels: no communicator)
    workers = range(cfg.workers)
    for i in reversed(range(model.layers)):
        for w in workers:
            socks[w].sendall(server.params[i])
    steps = cfg.epochs * cfg.steps_per_epoch()
    for step in range(steps):
        for i in reversed(range(model.layers)):  # the order backward makes them
            for w in workers:
                _recv_into(socks[w], server.inbox[w][i])
            server.step(i, server.mean_gradient(i))
            if step + 1 < steps:
                for w in workers:
                    socks[w].sendall(server.params[i])
        if (step + 1) % cfg.steps_per_epoch() == 0:
            server.snapshot()
    out.send([list(snap) for snap in server.log.snapshots])
    for s in socks:
        s.close()


def _rank(target: Any, keep: list[Any], every: list[Any], *args: Any) -> None:
    """Run ``target(*args)`` in a forked rank that holds only its own sockets and pipe
    ends (``keep``) of ``every`` one the parent made: a peer that dies then closes the
    last copy of its end, and whoever waits on it hears of it."""
    for end in every:
        if not any(end is k for k in keep):
            end.close()
    target(*args)


def run(cfg: Config) -> dict[str, float]:
    """Train ``cfg`` (sync) with blocking processes: samples/s (as the example reckons it:
    the median epoch's, over every worker) and the held-out accuracy."""
    ctx = mp.get_context("fork")
    pairs = [socket.socketpair() for _ in range(cfg.workers)]
    for pair in pairs:
        for s in pair:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    pipes = [ctx.Pipe(duplex=False) for _ in range(cfg.workers + 1)]
    every = [end for pair in [*pairs, *pipes] for end in pair]
    server = [a for a, _ in pairs]
    procs = [ctx.Process(target=_rank, args=(_server, [*server, pipes[0][1]], every, cfg,
                                             server, pipes[0][1]))]
    procs += [ctx.Process(target=_rank, args=(_worker, [pairs[w][1], pipes[w + 1][1]], every,
                                              w + 1, cfg, pairs[w][1], pipes[w + 1][1]))
              for w in range(cfg.workers)]
    for p in procs:
        p.start()
    for a, b in pairs:  # (the ranks' own now: a rank that dies closes its end)
        a.close()
        b.close()
    for _, end in pipes:  # (so that a rank that dies without reporting ends the wait)
        end.close()
    snapshots: list[Any] = []
    logs: list[WorkerLog] = []
    try:
        snapshots = pipes[0][0].recv()
        logs = [WorkerLog.from_message(pipes[w + 1][0].recv()) for w in range(cfg.workers)]
    except EOFError:  # (a rank ended without reporting: its exit code says so below)
        pass
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join()
    if any(p.exitcode for p in procs) or len(logs) < cfg.workers:
        raise RuntimeError(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
    per_epoch = cfg.steps_per_epoch()
    samples = cfg.workers * per_epoch * cfg.batch_size
    rates = []
    for e in range(cfg.epochs):
        part = slice(e * per_epoch, (e + 1) * per_epoch)
        took = max(log.end[part][-1] - (log.end[part.start - 1] if e else log.start[0])
                   for log in logs)
        rates.append(samples / took)
    data = cfg.dataset()
    model = cfg.model(data)
    accuracy = model.evaluate(snapshots[-1], data.test.x, data.test.y)[1]
    comm = sum(float(np.sum(log.comm_time)) for log in logs)
    busy = sum(float(np.sum(log.end - log.start)) for log in logs)
    return {"samples_per_s": float(np.median(rates)), "test_accuracy": float(accuracy),
            "comm_share": comm / busy}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ps_blocking",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)
    if args.workers < 1 or args.epochs < 1:
        parser.error("--workers and --epochs must be >= 1")
    cfg = Config(mode="sync", workers=args.workers, epochs=args.epochs)
    got = run(cfg)
    reached = got["test_accuracy"] >= TARGET_ACCURACY
    print(f"result: mode=sync workers={cfg.workers} epochs={cfg.epochs} "
          f"samples_per_s={got['samples_per_s']:.0f} "
          f"test_accuracy={got['test_accuracy']:.4f} target={TARGET_ACCURACY:.2f} "
          f"reached={'yes' if reached else 'no'} comm_share={got['comm_share']:.3f}")
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
