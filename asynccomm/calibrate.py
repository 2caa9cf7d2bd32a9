"""``python -m asynccomm.calibrate``: calibrate the cluster model from a real transport.

Measures one-way message times on this machine (half a ping-pong round trip between two
ranks, the median of ``--repeats`` runs) for sizes from 8 B to 64 MiB on a real transport:
``local`` (in-process ranks on one event loop, no model) or ``mpi`` (two processes; started
under ``mpiexec`` itself when not already under a launcher).  It fits a piecewise
alpha-beta model with break points found from the data (``asynccomm.sim.calibration``,
as SMPI does) and writes a preset that ``Cluster.load`` reads::

    python -m asynccomm.calibrate --transport local --out local.json
    world = await ac.open_cluster_world(4, ac.Cluster.load("local.json"))

In-process ranks share one CPU, so its preset puts every transfer of the node on one
shared resource (``Cluster(shared_intra=True)``); MPI ranks are processes of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import Communicator, launched_by_mpi, run
from .sim.calibration import Segment, calibrated_cluster, fit_segments, predict

__all__ = ["SIZES", "TRANSPORTS", "calibrate", "measure_pingpong", "pingpong", "preset"]

TRANSPORTS = ("local", "mpi")
#: 8 B to 64 MiB, every power of two.
SIZES = tuple(8 << i for i in range(24))
#: Wall seconds one repeat of one size should take, about (more iterations for small ones).
BUDGET = 0.03
#: The fit's limits (``fit_segments``): enough segments for an eager/rendezvous break and
#: the caches' steps in a memory copy's rate.
MAX_SEGMENTS = 6
MIN_POINTS = 2


async def pingpong(comm: Communicator, sizes: Sequence[int], repeats: int,
                   budget: float = BUDGET) -> dict[int, float]:
    """Ranks 0 and 1 bounce a message of each size; return (on rank 0; others get {})
    the median over ``repeats`` of the one-way seconds, half a round trip.  Other ranks
    only wait.  The repeats go round every size in turn, so a burst of load from elsewhere
    on the machine spoils one sample of many sizes, not every sample of one."""
    if comm.rank > 1:
        return {}
    peer = 1 - comm.rank
    buf = np.zeros(max(sizes), np.uint8)

    async def bounce(nbytes: int, iters: int) -> float:
        view = buf[:nbytes]
        t0 = time.perf_counter()
        for _ in range(iters):
            if comm.rank == 0:
                await comm.send(view, peer)
                await comm.recv(view, peer)
            else:
                await comm.recv(view, peer)
                await comm.send(view, peer)
        return time.perf_counter() - t0

    # A warm-up round sizes each size's iterations (rank 0's choice, so both agree).
    iters = np.array([max(1, min(2000, int(budget / max(await bounce(n, 1), 1e-7))))
                      for n in sizes], np.int64)
    if comm.rank == 0:
        await comm.send(iters, peer)
    else:
        await comm.recv(iters, peer)
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n, k in zip(sizes, iters.tolist(), strict=True):
            samples[n].append(await bounce(n, k) / k / 2)
    return {n: statistics.median(s) for n, s in samples.items()} if comm.rank == 0 else {}


def measure_pingpong(transport: str, sizes: Sequence[int] = SIZES,
                     repeats: int = 7) -> dict[int, float]:
    """One-way seconds per size on ``transport`` (see the module docs).

    Raises:
        ValueError: an unknown transport.
        RuntimeError: MPI asked for, and no ``mpiexec`` (or the run failed).
    """
    if transport == "local":
        points: dict[int, float] = run(lambda comm: pingpong(comm, sizes, repeats), 2,
                                       backend="local")[0]
        return points
    if transport != "mpi":
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    if launched_by_mpi():
        mine: dict[int, float] = run(lambda comm: pingpong(comm, sizes, repeats), backend="mpi")
        return mine
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "points.json"
        mpi_run(["-m", "asynccomm.calibrate", "--transport", "mpi", "--points", str(path),
                 "--sizes", *map(str, sizes), "--repeats", str(repeats)], 2)
        return {int(k): float(v) for k, v in json.loads(path.read_text()).items()}


def mpiexec() -> str | None:
    """The ``mpiexec`` beside this Python, or on the PATH; None if there is none."""
    here = Path(sys.executable).with_name("mpiexec")
    return str(here) if here.exists() else shutil.which("mpiexec")


def mpi_run(args: Sequence[str], ranks: int, timeout: float = 300) -> None:
    """Run ``python args...`` under ``mpiexec -n ranks``.

    Raises:
        RuntimeError: no ``mpiexec``, or the run failed.
    """
    exe = mpiexec()
    if exe is None:
        raise RuntimeError("no mpiexec: install an MPI library (the 'mpi' extra)")
    done = subprocess.run([exe, "-n", str(ranks), sys.executable, *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONHASHSEED": "0"})
    if done.returncode:
        raise RuntimeError(f"mpiexec -n {ranks} failed ({done.returncode}):\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def preset(transport: str, points: dict[int, float], segments: list[Segment],
           ranks: int = 8) -> dict[str, Any]:
    """The preset document: the cluster (``Cluster.load`` reads it) and how it was made."""
    cluster = calibrated_cluster(segments, name=f"calibrated-{transport}", ranks=ranks,
                                 shared=transport == "local")
    return {"cluster": cluster.to_dict(),
            "calibration": {
                "transport": transport, "host": os.uname().nodename,
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "points": {str(n): t for n, t in sorted(points.items())},
                "segments": [{"up_to": s.up_to, "alpha": s.alpha, "beta": s.beta}
                             for s in segments]}}


def calibrate(transport: str, sizes: Sequence[int] = SIZES,
              repeats: int = 7) -> dict[str, Any]:
    """Measure, fit and return the preset document (see the module docs)."""
    points = measure_pingpong(transport, sizes, repeats)
    return preset(transport, points, fit_segments(list(points.items()),
                                                  max_segments=MAX_SEGMENTS,
                                                  min_points=MIN_POINTS))


def _report(doc: dict[str, Any]) -> str:
    cal = doc["calibration"]
    segs = [Segment(s["up_to"], s["alpha"], s["beta"]) for s in cal["segments"]]
    lines = [f"{cal['transport']}: {len(segs)} segment(s)"]
    lines += [f"  up to {s.up_to:>9} B: alpha {s.alpha * 1e6:8.2f} us, "
              f"bandwidth {s.bandwidth / 1e9:8.3f} GB/s" for s in segs]
    lines.append(f"  {'bytes':>9}  {'measured us':>12}  {'fitted us':>10}  error")
    for n, t in cal["points"].items():
        fit = predict(segs, int(n))
        lines.append(f"  {n:>9}  {t * 1e6:12.2f}  {fit * 1e6:10.2f}  {fit / t - 1:+.1%}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m asynccomm.calibrate",
                                description=__doc__.splitlines()[0])
    p.add_argument("--transport", choices=TRANSPORTS, default="local")
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES),
                   help="message sizes in bytes (default: 8 B to 64 MiB)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path, help="the preset file (default: calibrated-<transport>"
                   ".json here)")
    p.add_argument("--points", type=Path, help=argparse.SUPPRESS)  # an MPI run's rank 0
    args = p.parse_args(argv)
    if args.repeats < 1 or any(n < 1 for n in args.sizes):
        p.error("--repeats and every size must be >= 1")
    if args.points is not None:  # measuring for a parent process, under mpiexec
        points = measure_pingpong(args.transport, sorted(set(args.sizes)), args.repeats)
        if points:
            args.points.write_text(json.dumps(points))
        return 0
    doc = calibrate(args.transport, sorted(set(args.sizes)), args.repeats)
    out = args.out or Path(f"calibrated-{args.transport}.json")
    out.write_text(json.dumps(doc, indent=2) + "\n")
    sys.stdout.write(f"{_report(doc)}\nwrote {out}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
