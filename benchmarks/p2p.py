"""Small messages: one-way latency (half a ping-pong), one-way message rate, and what
tracing costs per message.

Baselines, on the same loop in the same run:

- latency: a bare ``asyncio.Future`` hand-off ping-pong between two tasks (a new future
  per hand-off, as any awaitable op needs), the floor for anything built on futures;
- rate: an unbounded ``asyncio.Queue`` between two tasks (``await put`` / ``await get``);
- tracing: the same latency and rate on a world that traces every op (``trace=``), beside
  one that does not, open at the same time.

Repeats alternate baseline and asynccomm so drift in the machine hits both alike; the
reported figure is the median over repeats.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import asynccomm as ac

from ._common import Check, SectionResult, Settings, median, print_table, run_on, size_label

LATENCY_TARGET = 3.0  # one-way latency <= 3x the Future hand-off (goal 2x)
LATENCY_GOAL = 2.0
RATE_TARGET = 200_000.0  # messages/s one way
ROWS_RATIO_TARGET = 1.3  # burst into rows of one array vs into separate arrays
TRACING_TARGET = 2.0  # per message, tracing on / off


# -- latency ------------------------------------------------------------------------------

async def future_pingpong(iters: int) -> float:
    """Seconds per one-way hand-off (half a round trip) between two tasks.

    Each side waits on a future the other resolves, and makes a fresh one once woken (as
    any awaitable op must): the floor for anything built on asyncio futures.
    """
    loop = asyncio.get_running_loop()
    to_a: asyncio.Future[int] = loop.create_future()
    to_b: asyncio.Future[int] = loop.create_future()

    async def ping() -> None:
        nonlocal to_a
        for i in range(iters):
            to_b.set_result(i)
            await to_a
            to_a = loop.create_future()

    async def pong() -> None:
        nonlocal to_b
        for _ in range(iters):
            value = await to_b
            to_b = loop.create_future()
            to_a.set_result(value)

    t0 = time.perf_counter()
    await asyncio.gather(pong(), ping())
    return (time.perf_counter() - t0) / (2 * iters)


#: The timeout of the ping-pong's ops with one (never reached: where an op waits its
#: deadline is pushed on the loop's heap of deadlines, and ended when the op finishes).
OP_TIMEOUT = 60.0


async def comm_pingpong(c0: ac.Communicator, c1: ac.Communicator, nbytes: int,
                         iters: int, variant: str = "") -> float:
    """Seconds per one-way send->recv (half a round trip) between ranks 0 and 1; the ops
    on the default stream, or (``variant``) ``"stream"``: on a stream of each rank's own,
    ``"timeout"``: with a timeout, ``"wildcard"``: each recv from any source with any tag
    (``recv``'s defaults).  Each variant's calls are spelled as a program spells them (no
    ``**options``, whose dict and call cost 0.1-0.2 us a message)."""
    count = max(1, nbytes // 8)
    s0, r0 = np.ones(count, dtype=np.float64), np.empty(count, dtype=np.float64)
    s1, r1 = np.ones(count, dtype=np.float64), np.empty(count, dtype=np.float64)
    if variant == "stream":
        st0, st1 = c0.stream(), c1.stream()

        async def ping() -> None:
            for _ in range(iters):
                await c0.send(s0, 1, 5, stream=st0)
                await c0.recv(r0, 1, 5, stream=st0)

        async def pong() -> None:
            for _ in range(iters):
                await c1.recv(r1, 0, 5, stream=st1)
                await c1.send(s1, 0, 5, stream=st1)
    elif variant == "timeout":
        async def ping() -> None:
            for _ in range(iters):
                await c0.send(s0, 1, 5, timeout=OP_TIMEOUT)
                await c0.recv(r0, 1, 5, timeout=OP_TIMEOUT)

        async def pong() -> None:
            for _ in range(iters):
                await c1.recv(r1, 0, 5, timeout=OP_TIMEOUT)
                await c1.send(s1, 0, 5, timeout=OP_TIMEOUT)
    elif variant == "wildcard":
        async def ping() -> None:
            for _ in range(iters):
                await c0.send(s0, 1, 5)
                await c0.recv(r0)

        async def pong() -> None:
            for _ in range(iters):
                await c1.recv(r1)
                await c1.send(s1, 0, 5)
    else:
        async def ping() -> None:
            for _ in range(iters):
                await c0.send(s0, 1, 5)
                await c0.recv(r0, 1, 5)

        async def pong() -> None:
            for _ in range(iters):
                await c1.recv(r1, 0, 5)
                await c1.send(s1, 0, 5)

    t0 = time.perf_counter()
    await asyncio.gather(pong(), ping())
    return (time.perf_counter() - t0) / (2 * iters)


async def _calls_per_message(c0: ac.Communicator, c1: ac.Communicator, nbytes: int,
                             variant: str = "") -> float:
    """Python-level function calls per one-way message of the ping-pong (cProfile counts
    every call, the library's, asyncio's and numpy's, minus the benchmark's own loop)."""
    iters = 2000
    await comm_pingpong(c0, c1, nbytes, 100, variant)
    profile = cProfile.Profile()
    profile.enable()
    await comm_pingpong(c0, c1, nbytes, iters, variant)
    profile.disable()
    stats = pstats.Stats(profile)
    return float(stats.total_calls) / (2 * iters)  # type: ignore[attr-defined]


async def _latency_main(s: Settings) -> list[dict[str, Any]]:
    rows = []
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        # each size on the default stream, then the smallest on streams, with a timeout,
        # and received by wildcard recvs
        for nbytes, variant in [*((n, "") for n in s.latency_sizes),
                                *((s.latency_sizes[0], v) for v in ("stream", "timeout",
                                                                     "wildcard"))]:
            await future_pingpong(max(100, s.latency_iters // 10))  # warm-up
            await comm_pingpong(c0, c1, nbytes, max(100, s.latency_iters // 10), variant)
            base, ours = [], []
            for _ in range(s.latency_repeats):
                gc.collect()
                base.append(await future_pingpong(s.latency_iters))
                gc.collect()
                ours.append(await comm_pingpong(c0, c1, nbytes, s.latency_iters, variant))
            ours_us, base_us = median(ours) * 1e6, median(base) * 1e6
            calls = await _calls_per_message(c0, c1, nbytes, variant)
            rows.append({
                "nbytes": nbytes, "variant": variant,
                "dtype": "float64", "iterations": s.latency_iters,
                "calls_per_message": calls,
                "repeats": s.latency_repeats, "one_way_us": ours_us,
                "baseline_one_way_us": base_us, "ratio": ours_us / base_us,
                "one_way_us_all": [x * 1e6 for x in ours],
                "baseline_one_way_us_all": [x * 1e6 for x in base],
            })
    return rows


def _latency_label(row: dict[str, Any]) -> str:
    return size_label(row["nbytes"]) + (f", {row['variant']}" if row.get("variant") else "")


def run_latency(loop: str, s: Settings) -> SectionResult:
    rows = run_on(loop, lambda: _latency_main(s))
    checks = [Check(loop, f"latency {_latency_label(r)} / Future hand-off", r["ratio"], "x",
                    f"<= {LATENCY_TARGET:g}x (goal {LATENCY_GOAL:g}x)",
                    r["ratio"] <= LATENCY_TARGET, binding=loop == "uvloop")
              for r in rows]
    return SectionResult(rows, checks)


def table_latency(results: dict[str, SectionResult]) -> None:
    out = []
    for loop, res in results.items():
        for r, c in zip(res.rows, res.checks[:len(res.rows)], strict=True):
            out.append([loop, _latency_label(r), f"{r['one_way_us']:.2f}",
                        f"{r['baseline_one_way_us']:.2f}", f"{r['ratio']:.2f}x",
                        f"{r['calls_per_message']:.0f}", c.target, c.verdict])
    print_table("One-way latency (half a ping-pong, median of repeats; us; calls: Python "
                "function calls per one-way message; stream: each rank's ops on a stream of its "
                "own; timeout: each op with a timeout, a deadline armed for each that waits; "
                "wildcard: each recv from any source with any tag)",
                ["loop", "size", "asynccomm", "Future hand-off", "ratio", "calls", "target",
                 "status"], out)


# -- rate ---------------------------------------------------------------------------------

async def _queue_rate(n: int) -> float:
    """Items/s one way through an unbounded asyncio.Queue between two tasks."""
    q: asyncio.Queue[int] = asyncio.Queue()

    async def producer() -> None:
        for i in range(n):
            await q.put(i)

    async def consumer() -> None:
        for _ in range(n):
            await q.get()

    t0 = time.perf_counter()
    await asyncio.gather(consumer(), producer())
    return n / (time.perf_counter() - t0)


async def _send_rate(c0: ac.Communicator, c1: ac.Communicator, n: int) -> float:
    """Messages/s one way: ``await send`` each on rank 0, ``await recv`` each on rank 1."""
    sbuf, rbuf = np.ones(1, dtype=np.float64), np.empty(1, dtype=np.float64)

    async def sender() -> None:
        for _ in range(n):
            await c0.send(sbuf, 1, 3)

    async def receiver() -> None:
        for _ in range(n):
            await c1.recv(rbuf, 0, 3)

    t0 = time.perf_counter()
    await asyncio.gather(receiver(), sender())
    return n / (time.perf_counter() - t0)


async def _window_rate(c0: ac.Communicator, c1: ac.Communicator, n: int, window: int) -> float:
    """Messages/s one way with windows of ``window`` isends / pre-posted irecvs."""
    sbuf = np.ones(1, dtype=np.float64)
    rbufs = [np.empty(1, dtype=np.float64) for _ in range(window)]
    rounds = max(1, n // window)

    async def sender() -> None:
        for _ in range(rounds):
            await ac.wait_all([c0.isend(sbuf, 1, 4) for _ in range(window)])

    async def receiver() -> None:
        for _ in range(rounds):
            await ac.wait_all([c1.irecv(b, 0, 4) for b in rbufs])

    t0 = time.perf_counter()
    await asyncio.gather(receiver(), sender())
    return rounds * window / (time.perf_counter() - t0)


async def _burst_rate(c0: ac.Communicator, c1: ac.Communicator, n: int, window: int,
                      rows: bool) -> float:
    """Messages/s one way: rank 1 pre-posts ``window`` irecvs, into the rows of one array
    (``rows``: each checked against the pending ones that share its memory) or into
    arrays of their own, then rank 0 bursts ``window`` isends; in rounds."""
    sbuf = np.ones(4, dtype=np.float64)
    if rows:
        block = np.zeros((window, 4))
        rbufs = [block[i] for i in range(window)]
    else:
        rbufs = [np.zeros(4) for _ in range(window)]
    rounds = max(1, n // window)
    t0 = time.perf_counter()
    for _ in range(rounds):
        reqs = [c1.irecv(b, 0, 6) for b in rbufs]  # every recv posted before the burst
        await ac.wait_all([c0.isend(sbuf, 1, 6) for _ in range(window)])
        await ac.wait_all(reqs)
    return rounds * window / (time.perf_counter() - t0)


async def _rate_main(s: Settings) -> list[dict[str, Any]]:
    n, w = s.rate_messages, s.rate_window
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        await _queue_rate(n // 10)  # warm-up
        await _send_rate(c0, c1, n // 10)
        await _window_rate(c0, c1, n // 10, w)
        burst = 16 * w
        await _burst_rate(c0, c1, n // 10, burst, True)
        base, ours, windowed, rows, apart = [], [], [], [], []
        for _ in range(s.rate_repeats):
            gc.collect()
            base.append(await _queue_rate(n))
            gc.collect()
            ours.append(await _send_rate(c0, c1, n))
            gc.collect()
            windowed.append(await _window_rate(c0, c1, n, w))
            gc.collect()
            rows.append(await _burst_rate(c0, c1, n, burst, True))
            gc.collect()
            apart.append(await _burst_rate(c0, c1, n, burst, False))
    b = median(base)
    return [
        {"mode": "await send / await recv", "nbytes": 8, "messages": n,
         "repeats": s.rate_repeats, "rate_per_s": median(ours), "baseline_rate_per_s": b,
         "ratio": median(ours) / b, "rate_per_s_all": ours, "baseline_rate_per_s_all": base},
        {"mode": f"isend/irecv windows of {w}", "nbytes": 8, "messages": n,
         "repeats": s.rate_repeats, "rate_per_s": median(windowed), "baseline_rate_per_s": b,
         "ratio": median(windowed) / b, "rate_per_s_all": windowed,
         "baseline_rate_per_s_all": base},
        {"mode": f"bursts of {burst} into rows of one array", "nbytes": 32, "messages": n,
         "repeats": s.rate_repeats, "rate_per_s": median(rows), "baseline_rate_per_s": b,
         "ratio": median(rows) / b, "rate_per_s_all": rows, "baseline_rate_per_s_all": base,
         "separate_arrays_rate_per_s": median(apart), "separate_arrays_rate_per_s_all": apart,
         "separate_over_rows": median(apart) / median(rows)},
    ]


def run_rate(loop: str, s: Settings) -> SectionResult:
    rows = run_on(loop, lambda: _rate_main(s))
    checks = [Check(loop, f"rate {r['nbytes']} B, {r['mode']}", r["rate_per_s"], "msg/s",
                    f">= {RATE_TARGET:,.0f}/s", r["rate_per_s"] >= RATE_TARGET) for r in rows]
    slower = rows[-1]["separate_over_rows"]
    checks.append(Check(loop, "rows of one array vs separate arrays", slower, "x",
                        f"<= {ROWS_RATIO_TARGET}x", slower <= ROWS_RATIO_TARGET))
    return SectionResult(rows, checks)


def table_rate(results: dict[str, SectionResult]) -> None:
    out = []
    for loop, res in results.items():
        for r, c in zip(res.rows, res.checks[:len(res.rows)], strict=True):
            out.append([loop, r["mode"], f"{r['rate_per_s']:,.0f}",
                        f"{r['baseline_rate_per_s']:,.0f}", f"{r['ratio']:.2f}x", c.target,
                        c.verdict])
        last = res.rows[-1]
        out.append([loop, "  the same into separate arrays",
                    f"{last['separate_arrays_rate_per_s']:,.0f}", "", "",
                    f"rows {last['separate_over_rows']:.2f}x slower",
                    f"{res.checks[-1].target}: {res.checks[-1].verdict}"])
    print_table("One-way message rate, float64 (median of repeats; messages/s)",
                ["loop", "mode", "asynccomm", "asyncio.Queue", "ratio", "target", "status"],
                out)


# -- tracing ------------------------------------------------------------------------------

async def _tracing_main(s: Settings) -> list[dict[str, Any]]:
    """Latency (8 B) and rate with tracing off and on, repeat by repeat, each repeat on a
    world of its own (a traced world keeps every op until it writes its file at close:
    that memory is part of its cost, and must not weigh on the untraced world)."""
    iters, messages = max(100, s.latency_iters // 10), max(1000, s.rate_messages // 10)
    lat: dict[str, list[float]] = {"off": [], "on": []}
    rate: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(s.rate_repeats + 1):  # the first round warms up
            for mode in ("off", "on"):
                trace = str(Path(tmp) / f"bench{i}.json") if mode == "on" else None
                gc.collect()
                async with ac.open_world(2, trace=trace) as world:
                    c0, c1 = world.comms
                    one_way = await comm_pingpong(c0, c1, 8, iters)
                    per_s = await _send_rate(c0, c1, messages)
                if i:
                    lat[mode].append(one_way)
                    rate[mode].append(per_s)
    rows = []
    for what, samples, per_message in (("latency 8 B", lat, True), ("rate 8 B", rate, False)):
        off, on = median(samples["off"]), median(samples["on"])
        rows.append({"what": what, "off": off, "on": on, "repeats": s.rate_repeats,
                     "ratio": on / off if per_message else off / on,
                     "off_all": samples["off"], "on_all": samples["on"]})
    return rows


def run_tracing(loop: str, s: Settings) -> SectionResult:
    rows = run_on(loop, lambda: _tracing_main(s))
    checks = [Check(loop, f"tracing on / off, {r['what']}", r["ratio"], "x",
                    f"<= {TRACING_TARGET:g}x per message", r["ratio"] <= TRACING_TARGET)
              for r in rows]
    return SectionResult(rows, checks)


def table_tracing(results: dict[str, SectionResult]) -> None:
    out = []
    for loop, res in results.items():
        for r, c in zip(res.rows, res.checks[:len(res.rows)], strict=True):
            unit = (lambda v: f"{v * 1e6:.2f} us") if r["what"].startswith("latency") else (
                lambda v: f"{v:,.0f}/s")
            out.append([loop, r["what"], unit(r["off"]), unit(r["on"]), f"{r['ratio']:.2f}x",
                        c.target, c.verdict])
    print_table("Tracing: every op traced (trace=) beside not traced (median of repeats; "
                "ratio: time per message, on / off)",
                ["loop", "measure", "off", "on", "ratio", "target", "status"], out)
