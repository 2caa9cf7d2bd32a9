"""``python -m benchmarks.instructions [--quick] [--out DIR]``: CPU instructions per message.

Timings on a shared machine move with its load; instruction counts do not.  Each case runs
in a child process under ``valgrind --tool=callgrind`` twice, with ``small`` and ``large``
messages; the difference of the two totals over the difference of the counts is the
instructions one message costs (a send and its recv, both sides), start-up and warm-up
cancelled out.  A change to a hot path is judged in one run by this figure, beside the
timings of ``python -m benchmarks``.  Hash seeds are fixed; start-up still varies by about
1% (10-20 million instructions here), so the runs differ by 32,768 messages, which puts
that variation under a few percent of the per-message figure.

Cases (in-process, two ranks, asyncio's loop: valgrind runs every loop alike):

- ``await send / await recv``, 8 B, on the C lane and on the pure-Python lane;
- bursts of 256 isends into recvs pre-posted into the rows of one array (C lane).

Nothing is judged (no target): the figures are for comparing two versions.  Where valgrind
is not installed the page says so.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asynccomm as ac

from . import p2p
from ._common import environment, load_average, print_table, printed, write_json

OUT = Path(__file__).resolve().parent / "results"
CASES = {
    "await send / await recv, 8 B (C lane)": ("pair", {}),
    "await send / await recv, 8 B (pure-Python lane)": ("pair", {"ASYNCCOMM_PURE_PYTHON": "1"}),
    "bursts of 256 into rows of one array (C lane)": ("rows", {}),
}
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


async def _case(case: str, n: int) -> None:
    """The messages of ``case``, timed as ``python -m benchmarks`` times them (its rate
    benchmarks, run here for their instructions)."""
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        if case == "pair":
            await p2p._send_rate(c0, c1, n)
        else:
            await p2p._burst_rate(c0, c1, n, 256, True)


def child(case: str, n: int) -> None:
    """Run ``n`` messages of ``case`` (the process valgrind counts)."""
    asyncio.run(_case(case, n))


def count(case: str, n: int, env: dict[str, str]) -> int:
    """The instructions valgrind counted for a whole child process of ``n`` messages."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
           sys.executable, "-m", "benchmarks.instructions", "--child", case, str(n)]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800,
                         env={**os.environ, "PYTHONHASHSEED": "0", **env},
                         cwd=Path(__file__).resolve().parents[1])
    found = _COLLECTED.findall(run.stderr)
    if run.returncode != 0 or not found:
        raise RuntimeError(f"valgrind failed ({run.returncode}): {run.stderr[-2000:]}")
    return int(found[-1])


def measure(quick: bool) -> list[dict[str, Any]]:
    small, large = (512, 1536) if quick else (1024, 1024 + 32768)
    rows = []
    for name, (case, env) in CASES.items():
        a, b = count(case, small, env), count(case, large, env)
        rows.append({"case": name, "small": small, "large": large, "instructions_small": a,
                     "instructions_large": b, "per_message": (b - a) / (large - small)})
    print_table("Instructions per message (callgrind; a send and its recv, both sides)",
                ["case", "instructions / message"],
                [[r["case"], f"{r['per_message']:,.0f}"] for r in rows])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages (a smoke run)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--child", nargs=2, metavar=("CASE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return 0
    started = time.perf_counter()
    stamp = datetime.datetime.now(datetime.UTC)
    env = environment()
    with printed() as report:
        if shutil.which("valgrind") is None:
            print("valgrind is not installed here: no instruction counts "
                  "(Debian/Ubuntu: apt install valgrind)")
            rows: list[dict[str, Any]] = []
        else:
            rows = measure(args.quick)
    env["loadavg_1min_at_end"] = load_average()
    write_json(args.out, "instructions.json",
               {"suite": "instructions", "timestamp": stamp.isoformat(timespec="seconds"),
                "quick": args.quick, "elapsed_seconds": time.perf_counter() - started,
                "environment": env, "rows": rows, "checks": [], "report": report.getvalue()},
               started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
