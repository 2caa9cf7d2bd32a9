"""What every experiment shares: output files, tables, pictures, progress, timing.

Pictures need the ``plot`` extra (matplotlib, tqdm); without it the tables and JSON are
still written and the picture is skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"

KB, MB, GB = 1e3, 1e6, 1e9  # decimal units, as the article's tables use
MiB = 1 << 20


def examples_on_path() -> None:
    """Make ``examples/`` importable (the parameter server package ``ps``, the ring)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The options every experiment takes: ``--quick``, ``--out``, ``--no-plot``."""
    first = (doc or "").strip().split("\n\n")[0]
    p = argparse.ArgumentParser(prog=f"python -m results.{prog}", description=first)
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run in seconds")
    p.add_argument("--out", type=Path, default=DOCS, help="where the JSON and PNG go")
    p.add_argument("--no-plot", action="store_true", help="tables and JSON only")
    return p


def format_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A plain-text table: a title, right-aligned columns, a rule under the headers."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([title, *lines])


def size_label(nbytes: float) -> str:
    """1 MB, 16 MB, 1 GB: decimal when exact, else binary (1 MiB)."""
    for unit, scale in (("GB", GB), ("MB", MB), ("kB", KB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes / scale:g} {unit}"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:g} B"


def progress(items: Iterable[T], desc: str, total: int | None = None) -> Iterator[T]:
    """``items`` with a progress bar on a terminal (tqdm, from the ``plot`` extra)."""
    try:
        from tqdm import tqdm
    except ImportError:
        yield from items
        return
    # disable=None: no bar when stderr is not a terminal (CI, tests, a pipe)
    yield from tqdm(items, desc=desc, total=total, disable=None, leave=False)


def timed(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
    """``fn(*args, **kwargs)`` and the wall seconds it took."""
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - started


def write_json(out: Path, name: str, data: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return path


#: The fields that hold wall times.  They change from run to run while everything else
#: (model time) does not, so ``<name>.json`` (tracked) goes without them and they go to
#: ``<name>.walls.json`` (ignored by git): ``make results`` twice leaves the tree clean.
WALL_KEYS = frozenset({"wall_s", "wall_seconds"})


def split_walls(data: Any, where: str = "") -> tuple[Any, dict[str, float]]:
    """``data`` without its ``WALL_KEYS`` fields (a copy), and those fields by path
    (``series.single[0].wall_s``)."""
    walls: dict[str, float] = {}
    if isinstance(data, dict):
        kept = {}
        for key, value in data.items():
            path = f"{where}.{key}" if where else str(key)
            if key in WALL_KEYS:
                walls[path] = value
                continue
            kept[key], inner = split_walls(value, path)
            walls.update(inner)
        return kept, walls
    if isinstance(data, list):
        items = []
        for i, value in enumerate(data):
            item, inner = split_walls(value, f"{where}[{i}]")
            items.append(item)
            walls.update(inner)
        return items, walls
    return data, walls


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or None without the extra."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "font.size": 9,
                         "axes.grid": True, "grid.alpha": 0.3})
    return plt


def save_figure(fig: Any, out: Path, name: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fig.savefig(path)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def finish(args: argparse.Namespace, name: str, data: dict[str, Any],
           draw: Callable[[Any, dict[str, Any]], Any], started: float) -> None:
    """Write the JSON (its wall times apart: ``split_walls``), draw and write the picture
    (unless ``--no-plot`` or no matplotlib), and say where they went and how long it all
    took."""
    data["wall_seconds"] = round(time.perf_counter() - started, 2)
    tracked, walls = split_walls(data)
    written = [write_json(args.out, name, tracked),
               write_json(args.out, f"{name}.walls", walls)]
    plt = None if args.no_plot else pyplot()
    if plt is not None:
        written.append(save_figure(draw(plt, data), args.out, name))
    elif not args.no_plot:
        print("(no picture: install the plot extra, pip install -e '.[plot]')")
    print(f"\nwrote {', '.join(str(p) for p in written)} "
          f"({time.perf_counter() - started:.1f} s wall)")
