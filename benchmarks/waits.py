"""Waiting on many requests: ``wait_all`` over N pending recvs whose messages arrive one
loop turn apart, beside awaiting the same requests one by one (the baseline).  Each
completion must cost O(1) in ``wait_all``, so the two stay within a small factor however
large N is."""

from __future__ import annotations

import asyncio
import functools
import time

import numpy as np

import asynccomm as ac

from ._common import Check, SectionResult, Settings, median, print_table, run_on

RATIO_TARGET = 3.0  # wait_all within this factor of awaiting one by one


async def _one_run(n: int, use_wait_all: bool) -> float:
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        outs = np.zeros((n, 1), np.int64)
        reqs = [c1.irecv(outs[i], 0, 1) for i in range(n)]
        one = np.ones(1, np.int64)

        async def trickle() -> None:
            for _ in range(n):
                c0.isend(one, 1, 1)
                await asyncio.sleep(0)  # completions one loop turn apart

        sender = asyncio.ensure_future(trickle())
        t0 = time.perf_counter()
        if use_wait_all:
            await ac.wait_all(reqs)
        else:
            for req in reqs:
                await req
        elapsed = time.perf_counter() - t0
        await sender
        assert int(outs.sum()) == n
        return elapsed


def run_waits(loop: str, settings: Settings) -> SectionResult:
    result = SectionResult()
    for n in settings.waits_requests:
        pairs = [(run_on(loop, functools.partial(_one_run, n, False)),
                  run_on(loop, functools.partial(_one_run, n, True)))
                 for _ in range(settings.waits_repeats)]
        one_by_one = median([a for a, _ in pairs])
        wait_all = median([b for _, b in pairs])
        result.rows.append({"requests": n, "one_by_one_s": one_by_one, "wait_all_s": wait_all,
                            "ratio": wait_all / one_by_one})
    last = result.rows[-1]
    result.checks.append(Check(loop, f"wait_all over {last['requests']:,} requests vs one by one",
                               last["ratio"], "x", f"<= {RATIO_TARGET:g}x",
                               last["ratio"] <= RATIO_TARGET))
    return result


def table_waits(results: dict[str, SectionResult]) -> None:
    rows = [[loop, f"{r['requests']:,}", f"{r['one_by_one_s'] * 1e3:.1f} ms",
             f"{r['wait_all_s'] * 1e3:.1f} ms", f"{r['ratio']:.2f}x"]
            for loop, res in results.items() for r in res.rows]
    print_table("wait_all over N requests completing one loop turn apart (medians)",
                ["loop", "requests", "awaited one by one", "wait_all", "ratio"], rows)
