"""Trace files: load them, and merge the files of an MPI run.

``ac.run(main, ..., trace="run.json")`` (or ``ASYNCCOMM_TRACE=run.json``) writes a Chrome
trace-event file that Perfetto (https://ui.perfetto.dev) and ``chrome://tracing`` open:
one process per rank, one thread per stream (plus compute, and the modelled links on a
cluster world), every op a slice from post to finish with its ``wait`` and ``copy``
phases, and an arrow from each send to the recv that took it.

Under MPI each process writes its own rank's file, ``run.rank<N>.json``; join them with::

    python -m asynccomm.trace merge run.rank*.json -o run.json

which puts every rank on one time axis (each file carries its start's wall-clock epoch)
and pairs the arrows between ranks.  With processes (``ac.run(main, n, processes=True,
trace="run.json")``) the parent does this once every rank has ended (also when one failed):
``run.json`` is the merged file, and the ranks' files are removed (kept if the merge fails).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ._engine.tracing import load, merge

__all__ = ["load", "main", "merge"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asynccomm.trace",
                                     description="Work with asynccomm trace files.")
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="merge the run.rank<N>.json files of an MPI run")
    m.add_argument("files", nargs="+", type=Path)
    m.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        out = merge(args.files, args.output)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    sys.stdout.write(f"wrote {out} ({len(args.files)} ranks)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
