"""Several cases in one ``mpiexec`` job, one after another in the same processes: each
costs its own job's start-up (mpiexec, Python, numpy, mpi4py) otherwise.

Under the launcher, ``run_sections`` runs each case and tags every line it prints with its
name (``NAME| ...``), then one line ``NAME| PASS`` or ``NAME| FAIL ...`` after its
traceback, on every rank.  The test that started the job reads its own case's lines with
``section``: a case that failed fails its own test, and a job that crashed or hung fails
every test of it, each with the whole output.  Only cases that end normally and leave
nothing behind belong here (each opens and closes its own world); one that must fail,
abort or kill its process runs in a job of its own.

``mpiexec -n N python -m tests.mpi_sections "MODULE [ARG ...]" ...`` runs the ``main`` of
each module (with the arguments, if any) as a case named by its whole spec.
"""

from __future__ import annotations

import importlib
import io
import shlex
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence

#: The line each process prints after its last case (with the number that failed).
DONE = "sections done: "


class _Tagged(io.TextIOBase):
    """A text stream that writes each whole line to ``out`` behind ``tag``."""

    def __init__(self, out: io.TextIOBase, tag: str) -> None:
        self.out, self.tag, self.partial = out, tag, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.partial = (self.partial + text).split("\n")
        for line in lines:
            self.out.write(f"{self.tag}{line}\n")
        self.out.flush()
        return len(text)

    def close_line(self) -> None:
        if self.partial:
            self.write("\n")


def run_sections(cases: Sequence[tuple[str, Callable[[], int | None]]]) -> int:
    """Run each ``(name, case)`` in turn, its output tagged; 0 if every case returned 0
    (or None) without raising."""
    out = sys.stdout
    failed = 0
    for name, case in cases:
        tagged = _Tagged(out, f"{name}| ")  # type: ignore[arg-type]
        sys.stdout = tagged
        try:
            code = case()
        except Exception as exc:
            tagged.close_line()
            traceback.print_exception(exc, file=tagged)
            verdict = f"FAIL {type(exc).__name__}"
        else:
            tagged.close_line()
            verdict = "PASS" if not code else f"FAIL exit {code}"
        finally:
            sys.stdout = out
        failed += verdict != "PASS"
        out.write(f"{name}| {verdict}\n")
        out.flush()
    out.write(f"{DONE}{failed} failed\n")
    out.flush()
    return 1 if failed else 0


def section(job: subprocess.CompletedProcess[str], name: str,
            ranks: int) -> subprocess.CompletedProcess[str]:
    """Case ``name``'s lines of a job of ``ranks`` processes (its tag taken off), as if it
    had run alone: exit 0 if it passed on every rank of a job that ended well (every
    process went through all its cases, and exited 0 unless a case failed), else 1;
    stderr is the whole job's output."""
    tag = f"{name}| "
    lines = [line[len(tag):] for line in job.stdout.splitlines() if line.startswith(tag)]
    ends = [line[len(DONE):] for line in job.stdout.splitlines() if line.startswith(DONE)]
    ended = len(ends) == ranks and (job.returncode == 0 or ends != ["0 failed"] * ranks)
    passed = ended and lines.count("PASS") == ranks
    whole = f"(the job of several cases) exit {job.returncode}\n--- stdout\n{job.stdout}\n" \
            f"--- stderr\n{job.stderr}"
    return subprocess.CompletedProcess(
        job.args, 0 if passed else 1,
        "".join(f"{line}\n" for line in lines if line != "PASS"), whole)


def _runner(spec: str) -> Callable[[], int | None]:
    module, *args = shlex.split(spec)
    main = importlib.import_module(module).main
    return (lambda: main(args)) if args else main


if __name__ == "__main__":
    sys.exit(run_sections([(spec, _runner(spec)) for spec in sys.argv[1:]]))
