"""``python -m benchmarks.cluster [--quick] [--out DIR]``: the cluster model's numbers.

1. Modelled P2P bandwidth at 1 MB, 16 MB, 128 MB and 1 GB, store-and-forward beside
   pipelined, on roce100g (a balanced three-stage path), on ascend910b's HCCS inside a
   server and its 200G RoCE between servers, with each link's line rate beside it (the
   published's 35.4 GB/s over 100G RoCE is above that link's 12.5 GB/s line rate: the
   model never goes above the line rate).
2. A step of transfer plus compute, issued one after the other and together.
3. Scale: a ring exchange over 64 to 1024 ranks on the virtual clock, with the wall time it
   took, wall time per message and the memory each size needed.

Every simulation's wall time is printed beside its model time.  Exit status: 1 when a
target was missed (a full run; ``--quick`` judges nothing), else 0.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np

import asynccomm as ac
from asynccomm.sim import Cluster, Pipelined, StoreAndForward, Strategy

from ._common import (
    environment,
    load_average,
    peak_rss_bytes,
    print_checks,
    print_table,
    printed,
    reset_peak_rss,
    rss_bytes,
    rss_probe_available,
    size_label,
    write_json,
)

#: Targets: pipelining on a three-stage path at >= 128 MB; overlap of a step.
PIPELINE_SPEEDUP = 2.8
PIPELINE_OF_SLOWEST = 0.95
PIPELINE_MIN = 128 * (1 << 20)
#: The engine's wall cost per message may not grow with the rank count beyond this factor
#: (largest ring over smallest).
SCALE_GROWTH = 2.0

MB = 1 << 20
OUT = Path(__file__).resolve().parent / "results"
PATHS = {  # name: (preset, world size, src, dst)
    "roce100g": ("roce100g", 2, 0, 1),
    "ascend910b HCCS": ("ascend910b", 2, 0, 1),
    "ascend910b RoCE": ("ascend910b", 16, 0, 8),
}


def simulate(main: Callable[[ac.Communicator], Coroutine[Any, Any, Any]], size: int,
             cluster: Cluster, strategy: Strategy | None = None) -> tuple[list[Any], float]:
    t = time.perf_counter()
    results = ac.run(main, size, cluster=cluster, strategy=strategy)
    return results, time.perf_counter() - t


def p2p_time(cluster: Cluster, size: int, src: int, dst: int, nbytes: int,
             strategy: Strategy) -> tuple[float, float]:
    """Model seconds of one transfer with its recv pre-posted, and the wall time taken."""

    async def main(comm: ac.Communicator) -> float:
        loop = asyncio.get_running_loop()
        if comm.rank == dst:
            req = comm.irecv(np.empty(nbytes, np.uint8), src)
            await req
            assert req.record is not None
            return req.record.duration
        if comm.rank == src:
            await comm.send(np.zeros(nbytes, np.uint8), dst)
        return loop.time()

    results, wall = simulate(main, size, cluster, strategy)
    return results[dst], wall


def bandwidth_section(sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for name, (preset, size, src, dst) in PATHS.items():
        cluster = Cluster.preset(preset)
        line = cluster.fit(size).link(src, dst)
        for nbytes in sizes:
            saf, wall_a = p2p_time(cluster, size, src, dst, nbytes, StoreAndForward())
            pipe, wall_b = p2p_time(cluster, size, src, dst, nbytes, Pipelined())
            slowest = min(line.effective_bandwidth, cluster.device.copy_bandwidth)
            rows.append({"path": name, "link": line.name, "nbytes": nbytes,
                         "line_rate": line.bandwidth, "slowest_stage": slowest,
                         "saf_bw": nbytes / saf, "pipe_bw": nbytes / pipe,
                         "speedup": saf / pipe, "wall_s": wall_a + wall_b})
    print_table("Modelled P2P bandwidth (GB/s = 1e9 B/s), recv pre-posted",
                ["path", "size", "line rate", "store-and-forward", "pipelined", "speed-up",
                 "of line rate", "wall s"],
                [[r["path"], size_label(r["nbytes"]), f"{r['line_rate'] / 1e9:.1f}",
                  f"{r['saf_bw'] / 1e9:.2f}", f"{r['pipe_bw'] / 1e9:.2f}",
                  f"{r['speedup']:.2f}x", f"{r['pipe_bw'] / r['line_rate']:.0%}",
                  f"{r['wall_s']:.2f}"] for r in rows])
    return rows


def overlap_section(nbytes: int) -> dict[str, Any]:
    cluster = Cluster.preset("roce100g")
    comm_s, _ = p2p_time(cluster, 2, 0, 1, nbytes, Pipelined())
    compute_s = comm_s  # the hardest case for overlap: equal halves

    def program(together: bool) -> Callable[[ac.Communicator], Coroutine[Any, Any, float]]:
        async def main(comm: ac.Communicator) -> float:
            if comm.rank == 0:
                if together:
                    req = comm.isend(np.zeros(nbytes, np.uint8), 1)
                    await comm.compute(seconds=compute_s)
                    await req
                else:
                    await comm.compute(seconds=compute_s)
                    await comm.send(np.zeros(nbytes, np.uint8), 1)
            else:
                await comm.recv(np.empty(nbytes, np.uint8), 0)
            return asyncio.get_running_loop().time()
        return main

    (serial, _), wall_a = simulate(program(False), 2, cluster, Pipelined())
    (together, _), wall_b = simulate(program(True), 2, cluster, Pipelined())
    chunk = Pipelined().choose(nbytes, cluster.fit(2).link(0, 1), cluster.device, 2).chunk_bytes
    bound = 1.05 * max(comm_s, compute_s) + chunk / cluster.fit(2).link(0, 1).bandwidth
    row = {"nbytes": nbytes, "comm_s": comm_s, "compute_s": compute_s, "serial_s": serial,
           "overlapped_s": together, "bound_s": bound, "wall_s": wall_a + wall_b,
           "passed": together <= bound}
    print_table("A step of transfer + compute on roce100g (model ms)",
                ["size", "comm", "compute", "one after the other", "together",
                 "target: <= 1.05 max + chunk", "status", "wall s"],
                [[size_label(nbytes), f"{comm_s * 1e3:.2f}", f"{compute_s * 1e3:.2f}",
                  f"{serial * 1e3:.2f}", f"{together * 1e3:.2f}", f"{bound * 1e3:.2f}",
                  "PASS" if together <= bound else "FAIL", f"{row['wall_s']:.2f}"]])
    return row


def ring_section(sizes: list[int], nbytes: int, steps: int) -> list[dict[str, Any]]:
    async def main(comm: ac.Communicator) -> tuple[float, float, float]:
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        out = np.empty(nbytes, np.uint8)
        block = np.full(nbytes, comm.rank % 251, np.uint8)
        started = time.perf_counter()
        for _ in range(steps):
            await comm.compute(seconds=1e-3)
            await comm.sendrecv(block, right, out, left)
            block, out = out, block
        return asyncio.get_running_loop().time(), started, time.perf_counter()

    rows = []
    probe = rss_probe_available()
    for size in sizes:
        if probe:
            reset_peak_rss()
            before = rss_bytes()
        results, wall = simulate(main, size, Cluster.preset("ascend910b"))
        steps_wall = max(r[2] for r in results) - min(r[1] for r in results)
        messages = size * steps
        rows.append({"ranks": size, "steps": steps, "nbytes": nbytes,
                     "model_s": max(r[0] for r in results), "wall_s": wall,
                     "steps_wall_s": steps_wall,
                     "wall_us_per_message": steps_wall / messages * 1e6,
                     "rss_rise_mb": (peak_rss_bytes() - before) / (1 << 20) if probe else None})
    print_table(f"Ring exchange on ascend910b, {steps} steps of 1 ms compute + "
                f"{size_label(nbytes)} sendrecv, virtual clock (wall: whole run, with the "
                "world's set-up and teardown; per message: the steps alone; memory: the rise "
                "of the peak resident set during that run)",
                ["ranks", "model ms", "wall s", "steps wall s", "wall us / message",
                 "memory MB"],
                [[r["ranks"], f"{r['model_s'] * 1e3:.2f}", f"{r['wall_s']:.2f}",
                  f"{r['steps_wall_s']:.2f}", f"{r['wall_us_per_message']:.1f}",
                  "n/a" if r["rss_rise_mb"] is None else f"{r['rss_rise_mb']:.0f}"]
                 for r in rows])
    return rows


def judge(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets this benchmark measures, each with its value and verdict."""
    out = [{"what": f"{r['path']} {size_label(r['nbytes'])} under the line rate",
            "value": f"{r['pipe_bw'] / 1e9:.2f} GB/s",
            "target": f"<= {r['line_rate'] / 1e9:.1f} GB/s", "passed": False}
           for r in result["bandwidth"] if r["pipe_bw"] > r["line_rate"]]
    big = [r for r in result["bandwidth"] if r["path"] == "roce100g"
           and r["nbytes"] >= PIPELINE_MIN]
    for r in big:
        out.append({"what": f"pipelined / store-and-forward, roce100g {size_label(r['nbytes'])}",
                    "value": f"{r['speedup']:.2f}x", "target": f">= {PIPELINE_SPEEDUP}x",
                    "passed": r["speedup"] >= PIPELINE_SPEEDUP})
        of = r["pipe_bw"] / r["slowest_stage"]
        out.append({"what": f"pipelined / slowest stage, roce100g {size_label(r['nbytes'])}",
                    "value": f"{of:.1%}", "target": f">= {PIPELINE_OF_SLOWEST:.0%}",
                    "passed": of >= PIPELINE_OF_SLOWEST})
    ov = result["overlap"]
    out.append({"what": f"comm + compute together, {size_label(ov['nbytes'])}",
                "value": f"{ov['overlapped_s'] * 1e3:.2f} ms",
                "target": f"<= {ov['bound_s'] * 1e3:.2f} ms", "passed": ov["passed"]})
    ring = result["ring"]
    growth = ring[-1]["wall_us_per_message"] / ring[0]["wall_us_per_message"]
    out.append({"what": f"wall per message, {ring[-1]['ranks']} vs {ring[0]['ranks']} ranks",
                "value": f"{growth:.2f}x", "target": f"<= {SCALE_GROWTH}x",
                "passed": growth <= SCALE_GROWTH})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    sizes = [MB, 16 * MB] if args.quick else [MB, 16 * MB, 128 * MB, 1024 * MB]
    started = time.perf_counter()
    stamp = datetime.datetime.now(datetime.UTC)
    env = environment()
    with printed() as report:
        result: dict[str, Any] = {
            "bandwidth": bandwidth_section(sizes),
            "overlap": overlap_section(16 * MB if args.quick else 128 * MB),
            "ring": ring_section([8, 32] if args.quick else [64, 256, 1024], 64 << 10,
                                 2 if args.quick else 4),
        }
        checks = judge(result)
        print_checks("Targets (cluster model)", checks)
    env["loadavg_1min_at_end"] = load_average()
    result.update({"suite": "cluster", "timestamp": stamp.isoformat(timespec="seconds"),
                   "quick": args.quick, "elapsed_seconds": time.perf_counter() - started,
                   "environment": env, "checks": checks, "report": report.getvalue()})
    write_json(args.out, "cluster.json", result, started)
    return 1 if not args.quick and not all(c["passed"] for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
