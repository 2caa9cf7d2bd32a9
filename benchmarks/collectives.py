"""``python -m benchmarks.collectives [--quick] [--out DIR]``: collectives on the cluster
model, nccl-tests style.

On the virtual clock with the ascend910b preset (8 NPUs, HCCS full mesh), allreduce and
allgather of float32 from 1 KiB to 64 MiB (nccl-tests sizes: the buffer for allreduce, the
whole gathered array for allgather), with the algorithm the cost model chooses.  Columns:
modelled time (every rank starts at one model instant; the time is the last rank's end),
algbw = size / time, busbw = algbw x 2(p-1)/p (allreduce) or (p-1)/p (allgather), the
closed form of the chosen algorithm and time / closed form, beside the link's line rate.

Targets: the chosen algorithm's modelled time within 1.1x of its closed form, and busbw
never above the line rate.  Exit status 1 when one is missed (``--quick`` judges too).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import asynccomm as ac
from asynccomm._collectives import functions as coll
from asynccomm._collectives.costs import CollectiveCosts
from asynccomm.sim.model import ClusterModel

from ._common import (
    environment,
    load_average,
    print_checks,
    print_table,
    printed,
    size_label,
    write_json,
)

KiB, MiB = 1 << 10, 1 << 20
OUT = Path(__file__).resolve().parent / "results"
PRESET = "ascend910b"
RANKS = 8
RATIO = 1.1
BUS_FACTOR = {"allreduce": lambda p: 2 * (p - 1) / p, "allgather": lambda p: (p - 1) / p}


def world_model(comm: ac.Communicator) -> ClusterModel:
    """The model an in-process cluster world times its messages with."""
    model = comm._engine.link.timing.model  # type: ignore[union-attr]
    assert isinstance(model, ClusterModel)
    return model


async def one(comm: ac.Communicator, collective: str, nbytes: int) -> tuple[float, float]:
    """(start, end) in model seconds of one call of the communicator's method (which asks
    the cluster model for the algorithm itself); every rank starts at the same instant, the
    next whole millisecond after a barrier."""
    p, n = comm.size, nbytes // 4
    await comm.barrier()
    now = comm.model_time()
    await asyncio.sleep(math.floor(now * 1000 + 1) / 1000 - now)
    start = comm.model_time()
    if collective == "allreduce":
        await comm.allreduce(np.ones(n, np.float32))
    else:
        await comm.allgather(np.ones(n // p, np.float32), np.empty((p, n // p), np.float32))
    return start, comm.model_time()


def run(sizes: list[int]) -> list[dict[str, Any]]:
    cluster = ac.Cluster.preset(PRESET)
    plan = [(c, n) for c in ("allreduce", "allgather") for n in sizes]

    async def main(comm: ac.Communicator) -> list[tuple[str, float, float, float]]:
        costs = CollectiveCosts(world_model(comm), range(comm.size))
        choose = costs.chooser()
        out = []
        for collective, nbytes in plan:
            names = [f"{collective}.{a}" for a in coll.algorithms(collective)]
            name = choose(names, nbytes, comm.size)
            start, end = await one(comm, collective, nbytes)
            out.append((name, start, end, costs.cost(name, nbytes)))
        return out

    per_rank = ac.run(main, world_size=RANKS, cluster=cluster)
    line_rate = cluster.intra.bandwidth
    rows = []
    for i, (collective, nbytes) in enumerate(plan):
        name, _, _, form = per_rank[0][i]
        took = max(r[i][2] for r in per_rank) - max(r[i][1] for r in per_rank)
        algbw = nbytes / took
        rows.append({"collective": collective, "nbytes": nbytes, "count": nbytes // 4,
                     "type": "float", "algorithm": name.partition(".")[2], "time_s": took,
                     "algbw": algbw, "busbw": algbw * BUS_FACTOR[collective](RANKS),
                     "closed_form_s": form, "ratio": took / form, "line_rate": line_rate})
    return rows


def judge(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    checks = []
    for r in rows:
        what = f"{r['collective']} {size_label(r['nbytes'])} ({r['algorithm']})"
        checks.append({"what": f"{what} / closed form", "value": f"{r['ratio']:.3f}",
                       "target": f"within {RATIO}x",
                       "passed": 1 / RATIO <= r["ratio"] <= RATIO})
        checks.append({"what": f"{what} busbw", "value": f"{r['busbw'] / 1e9:.2f} GB/s",
                       "target": f"<= {r['line_rate'] / 1e9:.0f} GB/s",
                       "passed": r["busbw"] <= r["line_rate"]})
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.collectives",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes up to 1 MiB")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    top = MiB if args.quick else 64 * MiB
    sizes = [KiB << (2 * k) for k in range(9) if KiB << (2 * k) <= top]
    started = time.perf_counter()
    stamp = datetime.datetime.now(datetime.UTC)
    env = environment()
    rows = run(sizes)
    wall = time.perf_counter() - started
    env["loadavg_1min_at_end"] = load_average()
    checks = judge(rows)
    with printed() as report:
        for collective in ("allreduce", "allgather"):
            print_table(f"{collective}, {RANKS} ranks, {PRESET}, virtual clock (model time)",
                        ["size", "count", "type", "time us", "algbw GB/s", "busbw GB/s",
                         "algorithm", "closed form us", "ratio", "line rate GB/s"],
                        [[size_label(r["nbytes"]), r["count"], r["type"],
                          f"{r['time_s'] * 1e6:.1f}", f"{r['algbw'] / 1e9:.2f}",
                          f"{r['busbw'] / 1e9:.2f}", r["algorithm"],
                          f"{r['closed_form_s'] * 1e6:.1f}", f"{r['ratio']:.3f}",
                          f"{r['line_rate'] / 1e9:.0f}"]
                         for r in rows if r["collective"] == collective])
        print_checks("Targets (collectives)", checks)
    write_json(args.out, "collectives.json",
               {"suite": "collectives", "timestamp": stamp.isoformat(timespec="seconds"),
                "quick": args.quick, "elapsed_seconds": wall, "environment": env,
                "preset": PRESET, "ranks": RANKS, "rows": rows, "checks": checks,
                "wall_s": wall, "report": report.getvalue()}, started)
    return 0 if all(c["passed"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
