"""What every benchmark shares: loops, settings, statistics, checks, tables, memory probes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import importlib.metadata
import io
import json
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import uvloop

import asynccomm
from asynccomm._engine.lane import ACCELERATED
from asynccomm.calibrate import touched
from asynccomm.transports._mpi_progress import SPIN

T = TypeVar("T")

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

DEFAULT_OUT = Path(__file__).resolve().parent / "results"

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}
SECTIONS = ("latency", "rate", "tracing", "bandwidth", "responsiveness", "waits")
#: No benchmark on one loop takes nearly this long (they take seconds to tens of seconds).
SECTION_LIMIT_S = 600.0


@dataclass(frozen=True)
class Settings:
    """How much work each benchmark does (``--quick`` shrinks everything)."""

    quick: bool
    latency_sizes: tuple[int, ...]
    latency_iters: int
    latency_repeats: int
    rate_messages: int
    rate_window: int
    rate_repeats: int
    bandwidth_sizes: tuple[int, ...]
    memory_sizes: tuple[int, ...]
    responsiveness_size: int
    responsiveness_repeats: int
    waits_requests: tuple[int, ...]
    waits_repeats: int

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(quick=True, latency_sizes=(8, 1 * KiB), latency_iters=500,
                       latency_repeats=3, rate_messages=2_000, rate_window=64, rate_repeats=3,
                       bandwidth_sizes=(4 * KiB, 1 * MiB, 16 * MiB), memory_sizes=(16 * MiB,),
                       responsiveness_size=16 * MiB, responsiveness_repeats=1,
                       waits_requests=(2_000,), waits_repeats=1)
        return cls(quick=False, latency_sizes=(8, 64, 1 * KiB), latency_iters=20_000,
                   latency_repeats=7, rate_messages=100_000, rate_window=64, rate_repeats=5,
                   bandwidth_sizes=(4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB,
                                    1 * GiB),
                   memory_sizes=(256 * MiB, 1 * GiB), responsiveness_size=1 * GiB,
                   responsiveness_repeats=3, waits_requests=(2_500, 20_000), waits_repeats=3)

    def bandwidth_plan(self, nbytes: int) -> tuple[int, int]:
        """(repeats, iterations per repeat) for one bandwidth size: about 64 MiB moved per
        repeat for small sizes, fewer repeats for the big ones."""
        if self.quick:
            return 3, max(1, min(200, 16 * MiB // nbytes))
        repeats = 7 if nbytes <= 16 * MiB else 5 if nbytes <= 64 * MiB else 3
        return repeats, max(1, min(2000, 64 * MiB // nbytes))


@dataclass
class Check:
    """One performance target, judged on one loop."""

    loop: str
    what: str
    value: float
    unit: str
    target: str
    passed: bool
    binding: bool = True
    """False where the target is set for another loop: shown, not judged."""

    @property
    def verdict(self) -> str:
        word = "PASS" if self.passed else "FAIL"
        return word if self.binding else f"({word.lower()})"

    @property
    def shown(self) -> str:
        """The value with its unit, as the tables print it."""
        if self.unit == "x":
            return f"{self.value:.2f}x"
        if self.unit in ("of copyto", "of the thread's copyto", "of message"):
            return f"{self.value:.1%} {self.unit}"
        if self.unit == "msg/s":
            return f"{self.value:,.0f} msg/s"
        return f"{self.value:.2f} {self.unit}"


@dataclass
class SectionResult:
    """One benchmark on one loop: JSON rows and the checks they fed."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "checks": [asdict(c) for c in self.checks]}


def run_on(loop_name: str, main: Callable[[], Coroutine[Any, Any, T]], *,
           limit: float = SECTION_LIMIT_S) -> T:
    """Run ``main()`` in a fresh event loop of the named kind (through asyncio.Runner).

    A hang (a lost wake-up in the library, say) would stall ``make bench`` silently, so past
    ``limit`` seconds every thread's stack is dumped to stderr and the process exits.
    """
    faulthandler.dump_traceback_later(limit, exit=True)
    try:
        with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
            return runner.run(main())
    finally:
        faulthandler.cancel_dump_traceback_later()


async def quiet() -> None:
    """Let asynccomm's progress task go idle before a floor runs (on MPI; a
    shared-memory link's poll spins less long: ``transports.shm.SPIN``).  After its last activity
    it polls back to back for ``SPIN`` (a 10 us burst each turn of the loop), and its last
    activity may come only as the loop runs again after raw mpi4py blocked it (a control
    message, returned credit, landed meanwhile): a floor measured then shares its loop with
    those bursts (~260 of them in an 8 B floor repeat).  Measured so, the 8 B floor was ~16%
    slower (~2.95 us, not ~2.5) and the 1 MiB one fell to ~72% of raw mpi4py, under
    asynccomm's ~84%, where measured alone it reaches ~95%."""
    await asyncio.sleep(2 * SPIN)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else 0.0


def fill_array(nbytes: int, value: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A uint8 array with every page touched (so page faults stay out of the timings)."""
    return touched(nbytes, np.uint8, value)


def datagram_socket(*, blocking: bool = False) -> socket.socket:
    """A Unix datagram socket, close-on-exec, non-blocking unless ``blocking``: the bare
    floors' doorbells and acknowledgements, bound to a ``bench_address``."""
    flags = socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | (0 if blocking else socket.SOCK_NONBLOCK)
    return socket.socket(socket.AF_UNIX, flags)


def bench_address(name: str) -> bytes:
    """The abstract Unix socket address ``name`` (no file: it goes with its socket)."""
    return f"\0asynccomm-bench-{name}".encode()


def size_label(nbytes: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


# -- memory -------------------------------------------------------------------------------

def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def rss_probe_available() -> bool:
    """True where the peak RSS can be reset (Linux ``/proc/self/clear_refs``)."""
    try:
        reset_peak_rss()
        _status_kib("VmHWM")
    except OSError:
        return False
    return True


def reset_peak_rss() -> None:
    """Reset VmHWM (the process's peak resident set) to the current resident set."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rss_bytes() -> int:
    return _status_kib("VmRSS") * KiB


def peak_rss_bytes() -> int:
    return _status_kib("VmHWM") * KiB


# -- environment and tables ---------------------------------------------------------------

def environment() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "numpy": np.__version__,
        "uvloop": importlib.metadata.version("uvloop"),
        "asynccomm": asynccomm.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_1min": load_average(),
        "fast_lane": "C accelerator" if ACCELERATED else "pure Python",
    }


def cpu_model() -> str:
    """The processor's name (``model name`` of ``/proc/cpuinfo``, else what ``platform``
    knows, else "unknown")."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mpi_environment() -> dict[str, Any]:
    """``environment()`` with the MPI library's and mpi4py's versions."""
    import mpi4py
    from mpi4py import MPI

    env = environment()
    env["mpi"] = MPI.Get_library_version().splitlines()[0].strip()
    env["mpi4py"] = mpi4py.__version__
    return env


def write_json(out: Path, name: str, doc: Any, started: float) -> Path:
    """Write ``doc`` to ``out/name`` (the folder made if need be) and say so, with the
    seconds since ``started`` (a ``time.perf_counter()`` reading)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {path} in {time.perf_counter() - started:.1f} s")
    return path


class _Tee(io.TextIOBase):
    """Writes go to ``out`` and are kept as well."""

    def __init__(self, out: Any) -> None:
        super().__init__()
        self.out = out
        self.kept = io.StringIO()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.out.write(text)
        return self.kept.write(text)

    def flush(self) -> None:
        self.out.flush()


@contextlib.contextmanager
def printed() -> Iterator[io.StringIO]:
    """Within the block, what is printed to stdout still goes there and is also kept in the
    ``StringIO`` yielded: a benchmark's tables go into its JSON (``report``) as printed, and
    ``python -m benchmarks.report`` puts them on the performance page."""
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield tee.kept


def print_checks(title: str, checks: Sequence[dict[str, Any]]) -> None:
    """The targets table of checks whose ``value`` is already text, and how many passed."""
    print_table(title, ["check", "value", "target", "status"],
                [[c["what"], c["value"], c["target"], "PASS" if c["passed"] else "FAIL"]
                 for c in checks])
    print(f"\n{sum(c['passed'] for c in checks)}/{len(checks)} targets met")


def load_average() -> float | None:
    """The 1-minute load average (other work on the machine makes every number noisy)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a plain-text table: first column left-aligned, the others right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:],
                                                                          strict=True)]
        return "  ".join(parts).rstrip()

    print(f"\n{title}")
    print(line(cells[0]))
    print("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        print(line(row))


def launched_args(module: str, doc: str | None, quick: str, written: str,
                  argv: Sequence[str] | None,
                  flags: Sequence[tuple[str, str]] = ()) -> argparse.Namespace:
    """The options of a benchmark started under ``mpiexec`` (``python -m benchmarks.<module>``):
    ``--quick`` (``quick`` says what it cuts), ``--loop``, ``--out`` (the directory of the
    JSON it writes, named ``written``), and the module's own on/off ``flags`` (name, help)."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{module}",
                                     description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--quick", action="store_true",
                        help=f"{quick} (a smoke run, not a measurement)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"directory for {written} (default: benchmarks/results)")
    for name, text in flags:
        parser.add_argument(name, action="store_true", help=text)
    return parser.parse_args(argv)
