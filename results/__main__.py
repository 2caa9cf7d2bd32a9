"""``python -m results [--quick] [--out DIR] [--no-plot] [--only NAME ...]``: every
experiment, one after the other, each printing its table and writing its JSON and PNG."""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path

from ._common import DOCS

EXPERIMENTS = ("bandwidth", "async_vs_sync", "parameter_server", "scaling", "chunking",
               "validation")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m results", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    p.add_argument("--out", type=Path, default=DOCS)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--only", nargs="+", choices=EXPERIMENTS, default=list(EXPERIMENTS))
    args = p.parse_args(argv)
    forwarded = [*(["--quick"] if args.quick else []), "--out", str(args.out),
                 *(["--no-plot"] if args.no_plot else [])]
    started = time.perf_counter()
    walls = {}
    for name in args.only:
        print(f"\n{'=' * 20} results.{name} {'=' * 20}\n")
        t = time.perf_counter()
        importlib.import_module(f"results.{name}").main(forwarded)
        walls[name] = time.perf_counter() - t
    print("\n" + ", ".join(f"{n} {w:.1f} s" for n, w in walls.items())
          + f"; all: {time.perf_counter() - started:.1f} s wall")


if __name__ == "__main__":
    main()
