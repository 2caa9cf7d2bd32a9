"""The parameter server of ``examples/parameter_server.py`` (4 workers and a server, the
MLP trained for real) on each transport, beside its compute ceiling measured in the same
run: the same ranks doing the same numpy work with nothing exchanged (``--no-exchange``).

Run: ``python -m benchmarks.ps_ceiling [--quick] [--repeats R] [--out DIR]``

Each repeat runs, one after the other, the example in-process, with ``--processes`` (one
process per rank, shared memory), under ``mpiexec -n 5`` (each of the three in sync mode,
then in async mode: ``ASYNC``), the same training as a plain
program of 5 blocking processes with no library (``benchmarks.ps_blocking``: socket pairs,
each rank waiting in the kernel), and the two ceilings: in-process and 5 processes
(``--processes --no-exchange``; under ``mpiexec``, and for the plain program, the
compute-only ranks are the same 5 processes doing the same work).  The figure is the
example's own: the median epoch's samples/s over every worker (its ``result:`` line),
median over repeats.  The ranks share the machine's cores: with more ranks than cores,
the ceiling is what the cores give the workers' numpy work, and no transport can go past
it.

No figure here is judged (the exit status is 0 unless a run failed): the ceiling says how
far each transport is from the most any could reach on this machine, the plain program
what synchronous training of these processes gets with no library in the way, and both
whether a target set as a multiple of another transport's figure (``TARGET_OVER_MPI``) can
be met at all.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import environment, load_average, median, print_table, printed, write_json

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "parameter_server.py"
DEFAULT_OUT = ROOT / "benchmarks" / "results"
WORKERS = 4
#: The target set for the parameter server on processes: this many times the MPI figure.
TARGET_OVER_MPI = 2.0

#: How a run is launched: the example, the example under ``mpiexec``, or the plain program.
EXAMPLE, MPIEXEC, PLAIN = "example", "mpiexec", "plain"
#: (key, what it is, its arguments, how it is launched, ceiling of).
#: The example's async mode (``--mode async``: the server answers each worker as its
#: gradient lands, probing for whichever comes first) runs beside its sync mode on each
#: transport, against the same ceiling (the same numpy work).
ASYNC = ("--mode", "async")
RUNS: tuple[tuple[str, str, tuple[str, ...], str, str], ...] = (
    ("in_process", "in-process", (), EXAMPLE, ""),
    ("processes", "processes (shared memory)", ("--processes",), EXAMPLE, ""),
    ("mpi", "mpiexec -n 5", (), MPIEXEC, ""),
    ("plain", "plain blocking processes", (), PLAIN, ""),
    ("in_process_async", "in-process, async", ASYNC, EXAMPLE, ""),
    ("processes_async", "processes (shared memory), async", ("--processes", *ASYNC), EXAMPLE,
     ""),
    ("mpi_async", "mpiexec -n 5, async", ASYNC, MPIEXEC, ""),
    ("ceiling_in_process", "ceiling, in-process", ("--no-exchange",), EXAMPLE,
     "in_process in_process_async"),
    ("ceiling_processes", "ceiling, 5 processes", ("--processes", "--no-exchange"), EXAMPLE,
     "processes mpi plain processes_async mpi_async"),
)


def command(args: Sequence[str], launcher: str) -> list[str]:
    """A run's command line: the example, under ``mpiexec -n WORKERS+1``, or the plain
    program (``launcher``)."""
    if launcher == MPIEXEC:
        mpiexec = Path(sys.executable).parent / "mpiexec"
        return [str(mpiexec), "-n", str(WORKERS + 1), sys.executable, str(SCRIPT), *args]
    if launcher == PLAIN:
        return [sys.executable, "-m", "benchmarks.ps_blocking", "--workers", str(WORKERS),
                *args]
    return [sys.executable, str(SCRIPT), "--workers", str(WORKERS), *args]


def result_fields(stdout: str) -> dict[str, str]:
    """The fields of the example's ``result:`` line."""
    lines = [line for line in stdout.splitlines() if line.startswith("result: ")]
    if len(lines) != 1:
        raise ValueError(f"expected one result line, got {len(lines)}:\n{stdout[-2000:]}")
    return dict(field.split("=", 1) for field in lines[0].removeprefix("result: ").split())


def run_once(args: Sequence[str], launcher: str, epochs: int) -> float:
    """One run's samples/s."""
    proc = subprocess.run(command([*args, "--epochs", str(epochs)], launcher), cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command(args, launcher))} failed:\n"
                           f"{proc.stderr[-2000:]}")
    return float(result_fields(proc.stdout)["samples_per_s"])


def measure(repeats: int, epochs: int) -> dict[str, list[float]]:
    """Every run's samples/s, repeat by repeat (the runs alternate within each repeat)."""
    out: dict[str, list[float]] = {key: [] for key, *_ in RUNS}
    for _ in range(repeats):
        for key, _what, args, launcher, _of in RUNS:
            out[key].append(run_once(args, launcher, epochs))
    return out


def rows(samples: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Per transport: its median samples/s, its ceiling's, and its share of that."""
    ceilings = {of: key for key, _w, _a, _m, ofs in RUNS for of in ofs.split()}
    out = []
    for key, what, _args, _launcher, of in RUNS:
        if of:
            continue
        ceiling = median(samples[ceilings[key]])
        out.append({"key": key, "what": what, "samples_per_s": median(samples[key]),
                    "ceiling": ceiling, "of_ceiling": median(samples[key]) / ceiling})
    return out


def print_report(samples: dict[str, list[float]], env: dict[str, Any], repeats: int,
                 epochs: int, quick: bool) -> None:
    print(f"parameter server, {WORKERS} workers + 1 server, sync (and async where the row "
          f"says so), the MLP trained for real "
          f"({epochs} epochs; median over {repeats} repeats{', --quick' if quick else ''}); "
          f"{env['cpus_usable'] or env['cpu_count']} cores; load average "
          f"{env['loadavg_1min']}")
    table = rows(samples)
    print_table("Samples/s beside the compute ceiling (the same ranks, the same numpy work, "
                "nothing exchanged)",
                ["transport", "samples/s", "ceiling", "of ceiling"],
                [[r["what"], f"{r['samples_per_s']:,.0f}", f"{r['ceiling']:,.0f}",
                  f"{r['of_ceiling']:.1%}"] for r in table])
    by_key = {r["key"]: r for r in table}
    mpi, plain = by_key["mpi"], by_key["plain"]
    need = TARGET_OVER_MPI * mpi["samples_per_s"]
    print(f"\n{TARGET_OVER_MPI:g}x the MPI figure is {need:,.0f} samples/s: "
          f"{need / mpi['ceiling']:.0%} of the 5 processes' compute ceiling "
          f"({mpi['ceiling']:,.0f})"
          + (", out of reach of any transport on this machine." if need > mpi["ceiling"]
             else "."))
    print(f"The plain program of blocking processes (no library) reaches "
          f"{plain['samples_per_s']:,.0f} samples/s"
          + (f": {TARGET_OVER_MPI:g}x the MPI figure is {need / plain['samples_per_s']:.2f}x "
             f"that." if need > plain["samples_per_s"] else ".")
          + f" Shared memory reaches {by_key['processes']['samples_per_s'] / plain['samples_per_s']:.0%}"  # noqa: E501
          f" of it, MPI {mpi['samples_per_s'] / plain['samples_per_s']:.0%}.")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ps_ceiling",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat of 2 epochs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="the directory of the JSON it writes (ps_ceiling.json)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    repeats, epochs = (1, 2) if args.quick else (args.repeats, 5)
    stamp = datetime.datetime.now(datetime.UTC)
    env = environment()
    started = time.perf_counter()
    samples = measure(repeats, epochs)
    env["loadavg_1min_at_end"] = load_average()
    with printed() as report:
        print_report(samples, env, repeats, epochs, args.quick)
    doc = {"suite": "ps_ceiling", "schema": 1,
           "timestamp": stamp.isoformat(timespec="seconds"), "quick": args.quick,
           "repeats": repeats, "epochs": epochs, "workers": WORKERS,
           "elapsed_seconds": time.perf_counter() - started, "environment": env,
           "samples_per_s": samples, "rows": rows(samples), "checks": [],
           "targets_met": 0, "targets_judged": 0, "report": report.getvalue()}
    write_json(args.out, "ps_ceiling.json", doc, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
