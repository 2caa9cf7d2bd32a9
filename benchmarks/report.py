"""``python -m benchmarks.report [--results DIR] [--out FILE]``: the performance page.

Assembles ``docs/performance.md`` from the JSON the benchmarks wrote (``make bench`` runs
every benchmark, then this): the date, the machine, and for each benchmark its tables as it
printed them, every figure beside its baseline measured in the same run, with PASS or FAIL
against its targets.  Nothing is measured here.

Exit status: 0 when every benchmark's results are there and each met its targets; 1 when one
is missing or missed a target (the page is written all the same); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asynccomm.calibrate import CROSS_CPU_BYTES

from . import mpi_p2p, mpi_ring, shm_p2p
from ._common import Check, cpu_model

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_OUT = ROOT / "docs" / "performance.md"
MPIEXEC = ".venv/bin/mpiexec"


@dataclass(frozen=True)
class Suite:
    """One benchmark run of ``make bench``: the JSON it writes, and what it compares."""

    kind: str
    """Which benchmark wrote it (the ``suite`` its JSON names)."""
    file: str
    title: str
    command: str
    compares: str


SUITES: tuple[Suite, ...] = (
    Suite("p2p", "p2p.json", "In-process point-to-point", "python -m benchmarks",
          "asynccomm between two ranks of one process, on uvloop and on asyncio, each figure "
          "beside its baseline on the same loop in the same run: a bare `asyncio.Future` "
          "hand-off between two tasks (latency), an `asyncio.Queue` (message rate), "
          "`np.copyto` of the same size (bandwidth), the same program untraced (tracing), "
          "a ticker task's turns (responsiveness), awaiting one by one (`wait_all`)."),
    Suite("instructions", "instructions.json", "Instructions per message",
          "python -m benchmarks.instructions",
          "CPU instructions per message counted by valgrind's callgrind (a send and its recv, "
          "both sides; the difference of two runs of different lengths): a figure this "
          "machine's load does not move, to compare two versions of a hot path. No target."),
    Suite("cluster", "cluster.json", "Cluster model", "python -m benchmarks.cluster",
          "modelled point-to-point bandwidth, store-and-forward beside pipelined and the "
          "link's line rate; a step of transfer and compute, one after the other and "
          "together; a ring exchange of 64 to 1024 ranks on the virtual clock, with the wall "
          "time it took per message."),
    Suite("collectives", "collectives.json", "Collectives on the cluster model",
          "python -m benchmarks.collectives",
          "allreduce and allgather on 8 modelled ascend910b devices, nccl-tests style: each "
          "modelled time beside the α–β closed form of the algorithm the cost model chose, "
          "and the bus bandwidth beside the line rate (model time: the same on any machine)."),
    Suite("mpi_p2p", "mpi_p2p.json", "MPI, two processes",
          f"{MPIEXEC} -n 2 python -m benchmarks.mpi_p2p",
          "asynccomm on MPI beside raw mpi4py `Send`/`Recv` and the asyncio floor (a task "
          "polling one persistent recv and waking a future: the least an asyncio library on "
          "mpi4py can do), alternating repeat by repeat in the same processes."),
    *(Suite("mpi_ring", f"mpi_ring_n{n}.json", f"MPI ring, {n} processes",
            f"{MPIEXEC} -n {n} python -m benchmarks.mpi_ring",
            f"a ring `sendrecv` on {n} processes beside raw mpi4py `Sendrecv` and the asyncio "
            "floor, alternating repeat by repeat; idle ranks' CPU time and wake-up time. The "
            "ring's target is set for more ranks than cores, and only shown elsewhere.")
      for n in (2, 3, 4)),
    *(Suite("shm_p2p", f"shm_p2p_n{n}.json", f"Processes on shared memory, {n} processes",
            f"{MPIEXEC} -n {n} python -m benchmarks.shm_p2p",
            "asynccomm's shared-memory link (`backend=\"processes\"`, no MPI underneath) "
            "beside raw mpi4py and the asyncio floor on mpi4py in the same processes, "
            "alternating repeat by repeat: latency and bandwidth at 2 processes, the 8 KiB "
            "ring (its target set for more ranks than cores), idle ranks' CPU and wake-up "
            "time.")
      for n in (2, 3, 4)),
    Suite("hybrid", "hybrid.json", "Several hosts: the hybrid link, 4 processes as 2 hosts",
          f"{MPIEXEC} -n 4 python -m benchmarks.hybrid",
          "the link of a world on several hosts (`ASYNCCOMM_TEST_HOSTS=a,a,b,b`: shared "
          "memory to the peer of a rank's host, MPI to the others), two pairs ping-ponging "
          "at once within each host and across, beside raw mpi4py between the same ranks, "
          "alternating repeat by repeat. On one machine the messages between hosts travel "
          "through MPICH's shared memory too: the link's own steps, not a network. No "
          "target."),
    Suite("ps_ceiling", "ps_ceiling.json", "Parameter server beside its compute ceiling",
          "python -m benchmarks.ps_ceiling",
          "the parameter-server example (4 workers and a server, the MLP trained for real) "
          "in-process, one process per rank on shared memory and under `mpiexec -n 5`, each "
          "beside the compute ceiling measured in the same run: the same ranks doing the "
          "same numpy work with nothing exchanged; and a plain program of blocking processes "
          "(no library: socket pairs, each rank waiting in the kernel) training the same "
          "way. No target."),
)


@dataclass(frozen=True)
class Verdict:
    """One target, as the page shows it."""

    what: str
    value: str
    target: str
    passed: bool
    binding: bool

    @property
    def status(self) -> str:
        word = "PASS" if self.passed else "FAIL"
        return word if self.binding else f"({word.lower()})"


def _p2p(doc: dict[str, Any]) -> list[Verdict]:
    out = []
    for loops in doc["sections"].values():
        for checks in (res["checks"] for res in loops.values()):
            for raw in checks:
                c = Check(**raw)
                out.append(Verdict(f"{c.loop}: {c.what}", c.shown, c.target, c.passed,
                                   c.binding))
    return out


def _shown_already(doc: dict[str, Any]) -> list[Verdict]:
    return [Verdict(c["what"], str(c["value"]), c["target"], c["passed"],
                    c.get("binding", True)) for c in doc["checks"]]


def _formatted(shown: Callable[[dict[str, Any]], str]) -> Callable[[dict[str, Any]],
                                                                  list[Verdict]]:
    def verdicts(doc: dict[str, Any]) -> list[Verdict]:
        return [Verdict(c["what"], shown(c), c["target"], c["passed"], c.get("binding", True))
                for c in doc["checks"]]
    return verdicts


#: How each suite's checks are read (by the ``suite`` its JSON names).
VERDICTS: dict[str, Callable[[dict[str, Any]], list[Verdict]]] = {
    "p2p": _p2p,
    "instructions": _shown_already,
    "cluster": _shown_already,
    "collectives": _shown_already,
    "mpi_p2p": _formatted(mpi_p2p._value),
    "mpi_ring": _formatted(mpi_ring._value),
    "shm_p2p": _formatted(shm_p2p._value),
    "ps_ceiling": _shown_already,
    "hybrid": _shown_already,
}


@dataclass
class Loaded:
    """A suite and what its JSON says (``doc`` None: no JSON, or one that cannot be read)."""

    suite: Suite
    doc: dict[str, Any] | None
    problem: str = ""

    def verdicts(self) -> list[Verdict]:
        return [] if self.doc is None else VERDICTS[self.suite.kind](self.doc)

    @property
    def judged(self) -> bool:
        """False for a smoke run (``--quick``), whose figures are not a measurement."""
        return self.doc is not None and not self.doc.get("quick")

    @property
    def ok(self) -> bool:
        """Its results are there, and met every target (a smoke run judges none)."""
        if self.doc is None:
            return False
        return not self.judged or all(v.passed for v in self.verdicts() if v.binding)


def load(results: Path, suite: Suite) -> Loaded:
    """The suite's JSON under ``results``; a missing or unreadable one is said, not raised."""
    path = results / suite.file
    if not path.is_file():
        return Loaded(suite, None, f"no `{suite.file}`: the benchmark did not finish")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        Loaded(suite, doc).verdicts()
    except (ValueError, KeyError, TypeError) as exc:
        return Loaded(suite, None, f"`{suite.file}` cannot be read ({type(exc).__name__}: {exc})")
    state = results / f"cpu_state_{Path(suite.file).stem}.json"  # ``benchmarks.cpu_state``
    if state.is_file():
        try:
            doc["cross_cpu_s"] = json.loads(state.read_text(encoding="utf-8"))["cross_cpu_s"]
        except (ValueError, KeyError, TypeError):
            pass  # (the state is an aside: its figures stand without it)
    return Loaded(suite, doc)


# -- the page --------------------------------------------------------------------------------


def _env(loaded: Sequence[Loaded]) -> dict[str, Any]:
    """Every suite's environment merged (the first to say a thing wins)."""
    env: dict[str, Any] = {}
    for item in loaded:
        for key, value in (item.doc or {}).get("environment", {}).items():
            env.setdefault(key, value)
    return env


def machine(loaded: Sequence[Loaded]) -> list[str]:
    """The lines that say where and with what the figures were measured."""
    env = _env(loaded)
    cores = env.get("cpus_usable") or env.get("cpu_count") or os.cpu_count()
    versions = [f"{name}{' '.join(str(env[key]).split())}" for name, key in
                (("Python ", "python"), ("numpy ", "numpy"), ("uvloop ", "uvloop"),
                 ("mpi4py ", "mpi4py"), ("", "mpi"), ("asynccomm ", "asynccomm"))
                if env.get(key)]  # the MPI library names itself
    lines = [f"- **Machine:** {cores} cores (`nproc`), {env.get('cpu_model') or cpu_model()}; "
             f"{env.get('platform', 'platform unknown')}",
             f"- **Software:** {', '.join(versions) or 'unknown'}",
             f"- **Fast lane:** {env.get('fast_lane', 'unknown')}"]
    return lines


def _load(doc: dict[str, Any]) -> str:
    env = doc.get("environment", {})
    start, end = env.get("loadavg_1min"), env.get("loadavg_1min_at_end")
    load = ("" if start is None or end is None else
            f"; load average {start:.2f} at start, {end:.2f} at end")
    took = doc.get("cross_cpu_s")
    if isinstance(took, int | float) and took > 0:
        load += (f"; just before it, {CROSS_CPU_BYTES >> 10} KiB one CPU had just written was "
                 f"copied out on another at {CROSS_CPU_BYTES / took / 1e9:.1f} GB/s "
                 f"(`benchmarks.cpu_state`: "
                 f"about 10 where the host runs the CPUs on cores of their own, 27-28 where "
                 f"on hardware threads of one core, and messages of a few KiB or more "
                 f"between processes are faster)")
    return load


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def summary(loaded: Sequence[Loaded]) -> list[str]:
    lines = ["| benchmark | command | targets met | result |", "|---|---|---|---|"]
    for item in loaded:
        if item.doc is None:
            lines.append(f"| {item.suite.title} | `{item.suite.command}` | - | "
                         f"no result: {_cell(item.problem)} |")
            continue
        judged = [v for v in item.verdicts() if v.binding]
        met = sum(v.passed for v in judged)
        word = ("PASS" if met == len(judged) else "FAIL") if item.judged else \
            "not judged (`--quick`: a smoke run)"
        lines.append(f"| [{item.suite.title}](#{_anchor(item.suite.title)}) | "
                     f"`{item.suite.command}` | {met}/{len(judged)} | {word} |")
    return lines


def _anchor(title: str) -> str:
    """The anchor GitHub gives a heading."""
    kept = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def missed(loaded: Sequence[Loaded]) -> list[str]:
    rows = [(item.suite.title, v) for item in loaded if item.judged for v in item.verdicts()
            if v.binding and not v.passed]
    if not rows:
        return []
    return ["", "Targets missed:", "", "| benchmark | check | value | target |",
            "|---|---|---|---|",
            *(f"| {title} | {_cell(v.what)} | {_cell(v.value)} | {_cell(v.target)} |"
              for title, v in rows)]


def section(item: Loaded) -> list[str]:
    lines = ["", f"## {item.suite.title}", "", f"`{item.suite.command}`: {item.suite.compares}",
             ""]
    if item.doc is None:
        return [*lines, f"No result: {item.problem}."]
    doc = item.doc
    elapsed = doc.get("elapsed_seconds")
    took = f", took {elapsed:.0f} s" if isinstance(elapsed, int | float) else ""
    lines.append(f"Run {doc.get('timestamp', 'at an unknown time')}{took}{_load(doc)}."
                 + (" A smoke run (`--quick`): not a measurement." if doc.get("quick") else ""))
    text = doc.get("report", "").strip("\n")
    if text:
        return [*lines, "", "```text", text, "```"]
    lines += ["", "(This JSON holds no printed tables: run the benchmark again.) Its targets:",
              "", "| check | value | target | status |", "|---|---|---|---|"]
    return lines + [f"| {_cell(v.what)} | {_cell(v.value)} | {_cell(v.target)} | {v.status} |"
                    for v in item.verdicts()]


def when(loaded: Sequence[Loaded], now: datetime.datetime) -> str:
    """When the runs were, from their timestamps (``now`` where none says)."""
    stamps = sorted(datetime.datetime.fromisoformat(item.doc["timestamp"])
                    for item in loaded if item.doc is not None and item.doc.get("timestamp"))
    first, last = (stamps[0], stamps[-1]) if stamps else (now, now)
    if first.date() == last.date():
        return f"{first:%Y-%m-%d} (runs started {first:%H:%M} to {last:%H:%M} UTC)"
    return f"{first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC"


def page(loaded: Sequence[Loaded], now: datetime.datetime) -> str:
    met = sum(item.ok for item in loaded)
    lines = [
        "# Performance",
        "",
        f"Measured on {when(loaded, now)} by `make bench`, "
        "which runs every benchmark, then `python -m benchmarks.report` to write this page "
        "from the JSON they leave in `benchmarks/results/`. Do not edit it by hand: run "
        "`make bench` again (see [development](development.md)).",
        "",
        *machine(loaded),
        "",
        "Every figure is a median over repeats and stands beside its baseline measured in the "
        "same run, on the same loop or in the same processes; the ratios are what the targets "
        "judge. The machine may be shared with other work (each run gives its load average), "
        "so absolute times move from run to run more than the ratios do. PASS and FAIL are "
        "against the project's performance targets; a verdict in parentheses is shown, not "
        "judged (its target is set for another loop or another process count).",
        "",
        f"## Summary: {met} of {len(loaded)} benchmarks met every target",
        "",
        *summary(loaded),
        *missed(loaded),
    ]
    for item in loaded:
        lines += section(item)
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                        help="where the benchmarks wrote their JSON (default: benchmarks/results)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="the page to write (default: docs/performance.md)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    loaded = [load(args.results, suite) for suite in SUITES]
    now = datetime.datetime.now(datetime.UTC)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page(loaded, now), encoding="utf-8")
    bad = [item for item in loaded if not item.ok]
    print(f"wrote {args.out}: {len(loaded) - len(bad)}/{len(loaded)} benchmarks met every target"
          + (f"; not: {', '.join(item.suite.title for item in bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
