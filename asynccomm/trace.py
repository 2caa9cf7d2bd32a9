"""Trace files: load them, and merge the files of an MPI run.

``ac.run(main, ..., trace="run.json")`` (or ``ASYNCCOMM_TRACE=run.json``) writes a Chrome
trace-event file that Perfetto (https://ui.perfetto.dev) and ``chrome://tracing`` open:
one process per rank, one thread per stream (plus compute, and the modelled links on a
cluster world), every op a slice from post to finish with its ``wait`` and ``copy``
phases, and an arrow from each send to the recv that took it.

Under MPI each process writes its own rank's file, ``run.rank<N>.json``; join them with::

    python -m asynccomm.trace merge run.rank*.json -o run.json

which puts every rank on one time axis (each file carries its start's wall-clock epoch)
and pairs the arrows between ranks.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._engine.tracing import paired_flows

__all__ = ["load", "main", "merge"]


def load(path: str | Path) -> dict[str, Any]:
    """A trace file as a dict (``{"traceEvents": [...], ...}``).

    Raises:
        OSError: it cannot be read.
        ValueError: it is not a trace-event JSON object.
    """
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{path}: not a trace-event file (no traceEvents list)")
    return doc


def merge(paths: Sequence[str | Path], out: str | Path) -> Path:
    """Merge the per-rank files of an MPI run into one file at ``out``.

    Raises:
        OSError, ValueError: as ``load``; ValueError also for no files, or files of
            different clocks.
    """
    if not paths:
        raise ValueError("merge needs at least one trace file")
    docs = [load(p) for p in paths]
    clocks = {d.get("otherData", {}).get("clock", "wall") for d in docs}
    if len(clocks) > 1:
        raise ValueError(f"the files mix clocks ({', '.join(sorted(clocks))}): not one run")
    epochs = [float(d.get("otherData", {}).get("epoch", 0.0)) for d in docs]
    first = min(epochs)
    events: list[dict[str, Any]] = []
    ranks: list[int] = []
    for doc, epoch in zip(docs, epochs, strict=True):
        shift = round((epoch - first) * 1e6, 3)
        for e in doc["traceEvents"]:
            if "ts" in e and shift:
                e = {**e, "ts": round(e["ts"] + shift, 3)}
            events.append(e)
        ranks += doc.get("otherData", {}).get("ranks", [])
    target = Path(out)
    target.write_text(json.dumps({
        "traceEvents": paired_flows(events), "displayTimeUnit": "ns",
        "otherData": {"generator": "asynccomm", "clock": clocks.pop(), "epoch": first,
                      "ranks": sorted(ranks)}}, separators=(",", ":")), encoding="utf-8")
    return target


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
