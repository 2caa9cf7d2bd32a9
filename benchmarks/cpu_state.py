"""``python -m benchmarks.cpu_state NAME [--results DIR]``: the machine's CPU state now.

``make bench`` runs it before each benchmark of processes (MPI and shared memory), which
the state moves: on a virtual machine whose host places its two CPUs now on two cores, now
on two hardware threads of one, a message between processes of a few kilobytes or more
takes up to 1.7 times as long in the first state as in the second
(``asynccomm.calibrate.cross_cpu``).  It writes ``cpu_state_NAME.json`` beside the
benchmarks' JSON: the seconds to copy out on one CPU 64 KiB another has just written
(``cross_cpu_s``, null where the probe cannot run), which ``benchmarks.report`` prints
beside the benchmark ``NAME`` (its JSON's name without ``.json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from asynccomm.calibrate import CROSS_CPU_BYTES, cross_cpu

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_state",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("name", help="the benchmark this state is taken before (its JSON's "
                        "name without .json)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    took = cross_cpu()
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"cpu_state_{args.name}.json"
    path.write_text(json.dumps({"name": args.name, "cross_cpu_s": took, "timestamp":
                                datetime.datetime.now(datetime.UTC).isoformat()}) + "\n",
                    encoding="utf-8")
    kib = CROSS_CPU_BYTES >> 10
    print(f"{args.name}: " + ("no cross-CPU probe here" if took is None else
                              f"{kib} KiB just written on another CPU copied out in "
                              f"{took * 1e6:.2f} us ({CROSS_CPU_BYTES / took / 1e9:.1f} GB/s)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
