"""``python -m benchmarks [--quick] [--only ...] [--loops ...] [--out DIR]``: run, print, save.

Exit status: 1 when a target was missed (a full run: ``--quick`` is a smoke run that judges
nothing), 0 when every target was met, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import bandwidth, p2p, waits
from ._common import (
    DEFAULT_OUT,
    LOOPS,
    SECTIONS,
    Check,
    SectionResult,
    Settings,
    environment,
    load_average,
    print_table,
    printed,
    write_json,
)

RUNNERS: dict[str, Callable[[str, Settings], SectionResult]] = {
    "latency": p2p.run_latency,
    "rate": p2p.run_rate,
    "tracing": p2p.run_tracing,
    "bandwidth": bandwidth.run_bandwidth,
    "responsiveness": bandwidth.run_responsiveness,
    "waits": waits.run_waits,
}
TABLES: dict[str, Callable[[dict[str, SectionResult]], None]] = {
    "latency": p2p.table_latency,
    "rate": p2p.table_rate,
    "tracing": p2p.table_tracing,
    "bandwidth": bandwidth.table_bandwidth,
    "responsiveness": bandwidth.table_responsiveness,
    "waits": waits.table_waits,
}


def _choices(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated subset of {','.join(allowed)}, got {text!r}")
        return list(dict.fromkeys(items))
    return parse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="asynccomm benchmarks beside their baselines, against the performance targets.")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes and few iterations (a smoke run, not a measurement)")
    parser.add_argument("--only", type=_choices(SECTIONS), default=list(SECTIONS),
                        metavar=",".join(SECTIONS), help="which benchmarks to run")
    parser.add_argument("--loops", type=_choices(tuple(LOOPS)), default=list(LOOPS),
                        metavar=",".join(LOOPS), help="which event loops to run them on")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="directory for the JSON results (default: benchmarks/results)")
    return parser.parse_args(argv)


def print_summary(checks: list[Check]) -> None:
    rows = [[c.loop, c.what, c.shown, c.target, c.verdict] for c in checks]
    print_table("Summary against the performance targets (parenthesised: the latency target is "
                "set for uvloop; asyncio's is shown, not judged)",
                ["loop", "check", "value", "target", "status"], rows)
    judged = [c for c in checks if c.binding]
    failed = [c for c in judged if not c.passed]
    print(f"\n{len(judged) - len(failed)}/{len(judged)} targets met"
          + (f"; missed: {', '.join(f'{c.loop}: {c.what}' for c in failed)}" if failed else ""))


def _print_load(env: dict[str, Any]) -> None:
    start, end = env["loadavg_1min"], env["loadavg_1min_at_end"]
    if start is None or end is None:
        return
    print(f"load average (1 min): {start:.2f} at start, {end:.2f} at end", end="")
    # The suite itself keeps about one core busy; more than that is someone else's work.
    busy = max(start, end - 1.0)
    print("  -- other work was running, numbers are noisy" if busy > 0.5 else "")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings.make(args.quick)
    started = time.perf_counter()
    stamp = datetime.datetime.now(datetime.UTC)
    env = environment()
    results: dict[str, dict[str, SectionResult]] = {name: {} for name in args.only}
    for name in args.only:
        for loop in args.loops:
            print(f"running {name} on {loop} ...", file=sys.stderr, flush=True)
            results[name][loop] = RUNNERS[name](loop, settings)
    elapsed = time.perf_counter() - started

    env["loadavg_1min_at_end"] = load_average()
    checks = [c for name in args.only for loop in args.loops for c in results[name][loop].checks]
    with printed() as report:
        print(f"asynccomm {env['asynccomm']} benchmarks{' (--quick)' if args.quick else ''}: "
              f"Python {env['python']}, numpy {env['numpy']}, uvloop {env['uvloop']}, "
              f"{env['cpu_count']} cores, {env['platform']}; fast lane: {env['fast_lane']}")
        _print_load(env)
        for name in args.only:
            TABLES[name](results[name])
        print_summary(checks)

    doc = {
        "suite": "p2p",
        "schema": 1,
        "timestamp": stamp.isoformat(timespec="seconds"),
        "quick": args.quick,
        "elapsed_seconds": elapsed,
        "environment": env,
        "loops": list(args.loops),
        "sections": {name: {loop: res.to_json() for loop, res in results[name].items()}
                     for name in args.only},
        "targets_met": sum(c.passed for c in checks if c.binding),
        "targets_judged": sum(c.binding for c in checks),
        "report": report.getvalue(),
    }
    write_json(args.out, "p2p.json", doc, started)
    missed = any(c.binding and not c.passed for c in checks)
    return 1 if missed and not args.quick else 0


if __name__ == "__main__":
    sys.exit(main())
