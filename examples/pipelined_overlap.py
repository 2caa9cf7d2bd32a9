"""Push a large model's gradients to a peer, layer by layer, on a modelled cluster.

Rank 0 runs the backward pass of an L-layer model (simulated compute on its device) and
sends each layer's gradient to rank 1. Three ways to do it, on the virtual clock:

  serial, store-and-forward   backward everything, then send each layer in one piece
  serial, pipelined           the same, but each send is cut into chunks that flow
                              through copy -> link -> copy at once
  overlapped, pipelined       send layer k (isend on a stream) while layer k-1 computes

Run: python examples/pipelined_overlap.py [--preset roce100g] [--layers 8] [--layer-mb 64]
     [--plot [timeline.png]]

--plot traces the first and the last way (trace=...) and draws both runs' timelines, one
above the other on one model-time axis (python -m asynccomm.timeline; needs matplotlib).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import asynccomm as ac
from asynccomm.sim import Pipelined, StoreAndForward, Strategy, format_table

STRATEGIES: dict[str, tuple[Strategy, bool]] = {
    "serial, store-and-forward": (StoreAndForward(), False),
    "serial, pipelined": (Pipelined(), False),
    "overlapped, pipelined": (Pipelined(), True),
}


def make_program(layers: int, layer_bytes: int, compute_s: float, overlap: bool) -> Any:
    async def program(comm: ac.Communicator) -> tuple[float, ac.sim.RankSummary]:
        grads = [np.full(layer_bytes, k, np.uint8) for k in range(layers)]
        if comm.rank == 0:
            stream = comm.stream()
            pending = []
            for k in reversed(range(layers)):  # backward: last layer first
                await comm.compute(seconds=compute_s)
                if overlap:
                    pending.append(comm.isend(grads[k], 1, tag=k, stream=stream))
            if overlap:
                await ac.wait_all(pending)
            else:
                for k in reversed(range(layers)):
                    await comm.send(grads[k], 1, tag=k)
        else:
            out = np.empty(layer_bytes, np.uint8)
            for k in reversed(range(layers)):
                await comm.recv(out, 0, tag=k)
                assert out[0] == k and out[-1] == k
        return comm.model_time(), comm.summary()

    return program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="roce100g", choices=ac.Cluster.presets())
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--layer-mb", type=int, default=64)
    parser.add_argument("--compute-ms", type=float, default=None,
                        help="backward time per layer (default: about one layer's transfer)")
    parser.add_argument("--plot", nargs="?", const="pipelined_overlap.png", default=None,
                        metavar="PNG", help="draw the timelines of store-and-forward and of "
                        "overlapped pipelining (default file: pipelined_overlap.png)")
    args = parser.parse_args()
    if ac.launched_by_mpi():
        sys.exit("pipelined_overlap.py runs on the in-process cluster model only: start it "
                 "with python, not under mpiexec")
    cluster = ac.Cluster.preset(args.preset)
    layer_bytes = args.layer_mb << 20
    link = cluster.fit(2).link(0, 1)
    compute_s = (args.compute_ms / 1e3 if args.compute_ms is not None
                 else layer_bytes / link.bandwidth)
    print(f"{args.layers} layers x {args.layer_mb} MiB to a peer over {link.name} "
          f"({link.bandwidth / 1e9:.1f} GB/s line rate), backward {compute_s * 1e3:.2f} ms "
          "per layer\n")
    times: dict[str, float] = {}
    last = None
    for name, (strategy, overlap) in STRATEGIES.items():
        program = make_program(args.layers, layer_bytes, compute_s, overlap)
        results = ac.run(program, 2, cluster=cluster, strategy=strategy)
        times[name] = max(t for t, _ in results)
        last = [s for _, s in results]
    base = times["serial, store-and-forward"]
    print(f"{'strategy':<28} {'step (ms)':>10} {'speed-up':>9}")
    for name, t in times.items():
        print(f"{name:<28} {t * 1e3:>10.2f} {base / t:>8.2f}x")
    compute_total = args.layers * compute_s
    print(f"\ncompute alone: {compute_total * 1e3:.2f} ms; "
          f"the overlapped step is {times['overlapped, pipelined'] / compute_total:.2f}x it")
    print("\ntimeline of the overlapped run (model seconds):")
    assert last is not None
    print(format_table(last))
    if args.plot:
        plot(args.plot, args.layers, layer_bytes, compute_s, cluster)


def plot(out: str, layers: int, layer_bytes: int, compute_s: float,
         cluster: ac.Cluster) -> None:
    """Trace store-and-forward and overlapped pipelining, and draw both timelines."""
    from asynccomm.timeline import draw
    from asynccomm.trace import load

    traces = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("serial, store-and-forward", "overlapped, pipelined"):
            strategy, overlap = STRATEGIES[name]
            path = Path(tmp) / f"{name.replace(', ', '-')}.json"
            ac.run(make_program(layers, layer_bytes, compute_s, overlap), 2, cluster=cluster,
                   strategy=strategy, trace=path)
            traces.append((name, load(path)))
    draw(traces, out, title=f"{layers} layers x {layer_bytes >> 20} MiB, rank 0 -> rank 1")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
