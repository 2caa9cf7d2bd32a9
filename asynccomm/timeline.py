"""Draw a trace file as a per-rank Gantt chart (needs matplotlib: the ``plot`` extra).

    python -m asynccomm.timeline run.json -o run.png [--title "..."]

One band of rows per rank: its compute, each stream's transfers (the ``copy`` part of an
op darker than its ``wait``), its modelled links on a cluster world, and a last row,
"hidden", with the time its communication overlapped its compute.  Several traces (for
instance two strategies of one program) can share one picture: ``draw([(label, doc),
...], out)``, one panel each, on one time axis.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .trace import load

__all__ = ["draw", "hidden_intervals", "main"]

_COLORS = {"send": "#4C72B0", "recv": "#55A868", "compute": "#8C8C8C", "link": "#DD8452",
           "probe": "#C44E52", "hidden": "#8172B3"}
_DARK = {"send": "#2A4A7F", "recv": "#2F6B3D"}

Intervals = list[tuple[float, float]]


def _union(intervals: Intervals) -> Intervals:
    out: Intervals = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _intersect(a: Intervals, b: Intervals) -> Intervals:
    out: Intervals = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def hidden_intervals(events: list[dict[str, Any]], pid: int) -> Intervals:
    """Where rank ``pid``'s communication overlapped its compute (µs): its modelled link
    transfers if the trace has them, else its send and recv slices."""
    mine = [e for e in events if e.get("ph") == "X" and e["pid"] == pid]
    links = [e for e in mine if e.get("cat") == "link"]
    comm = links or [e for e in mine if e.get("cat") in ("send", "recv")]
    compute = [e for e in mine if e.get("cat") == "compute"]
    return _intersect(_union([(e["ts"], e["ts"] + e["dur"]) for e in comm]),
                      _union([(e["ts"], e["ts"] + e["dur"]) for e in compute]))


def _rows(doc: dict[str, Any]) -> list[tuple[str, str, Intervals, Intervals]]:
    """(label, category, slices, darker sub-slices) per row, rank by rank."""
    events = doc["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    slices: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            slices[(e["pid"], e["tid"])].append(e)
    rows = []
    for pid in sorted({p for p, _ in slices}):
        for key in sorted(k for k in slices if k[0] == pid):
            ops = [e for e in slices[key] if e.get("cat") != "phase"]
            if not ops:
                continue
            cat = ops[0].get("cat", "send")
            copies = [(e["ts"], e["dur"]) for e in slices[key] if e.get("name") == "copy"]
            rows.append((f"rank {pid} {names.get(key, '')}", cat,
                         [(e["ts"], e["dur"]) for e in ops], copies))
        hidden = hidden_intervals(events, pid)
        if hidden:
            rows.append((f"rank {pid} hidden", "hidden", [(s, e - s) for s, e in hidden], []))
    return rows


def draw(traces: Sequence[tuple[str, dict[str, Any]]], out: str | Path, *,
         title: str | None = None) -> Path:
    """Draw one panel per (label, trace) into ``out`` (PNG, SVG, PDF: by its suffix).

    Raises:
        ImportError: matplotlib is not installed (``pip install 'asynccomm[plot]'``).
    """
    import matplotlib  # noqa: PLC0415  (optional: the plot extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  (after choosing the backend)

    panels = [(label, _rows(doc), doc.get("otherData", {}).get("clock", "wall"))
              for label, doc in traces]
    heights = [max(len(rows), 1) for _, rows, _ in panels]
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False,
                             figsize=(11, 1.2 + 0.32 * sum(heights)),
                             gridspec_kw={"height_ratios": heights})
    for ax, (label, rows, clock) in zip(axes[:, 0], panels, strict=True):
        for y, (_, cat, bars, darker) in enumerate(rows):
            color = _COLORS.get(cat, "#999999")
            ax.broken_barh([(s / 1e3, d / 1e3) for s, d in bars], (y - 0.4, 0.8),
                           facecolors=color, edgecolor="white", linewidth=0.3,
                           hatch="//" if cat == "hidden" else None)
            if darker:
                ax.broken_barh([(s / 1e3, d / 1e3) for s, d in darker], (y - 0.4, 0.8),
                               facecolors=_DARK.get(cat, color), linewidth=0)
        ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_title(label, fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlabel(f"{'model' if clock == 'model' else 'wall'} time (ms)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    target = Path(out)
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asynccomm.timeline",
                                     description="Draw a trace file as a per-rank Gantt chart.")
    parser.add_argument("trace", type=Path, nargs="+", help="trace file(s), one panel each")
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    try:
        out = draw([(str(p), load(p)) for p in args.trace], args.output, title=args.title)
    except ImportError:
        sys.stderr.write("error: the timeline needs matplotlib: pip install 'asynccomm[plot]'\n")
        return 1
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    sys.stdout.write(f"wrote {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
