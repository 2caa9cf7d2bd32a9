"""Page faults per call of repeated 4 MiB collectives on 2 in-process ranks.

Run: ``python -m tests.collectives.scratch_runner ENV`` (an environment of
``tests/transports/environments.py``).  For each collective: two calls to warm up, then four
counted (``ru_minflt``), on input and output buffers made and written beforehand; every
result checked exactly.  Prints one JSON line: the faults per counted call, by collective.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys

import numpy as np

import asynccomm as ac

from ..transports.environments import run_world
from .cases import LIMIT
from .test_scratch import COLLECTIVES, LARGE, _call, _case, _outputs

CALLS = 4


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def faults_per_call(env: str, name: str) -> float:
    async def body(world: ac.World) -> float:
        cases = [_case(name, 2, c.rank, LARGE // 2) for c in world.comms]
        outs = [[_outputs(name, c, shape, want) for _ in range(CALLS + 2)]
                for c, (_, shape, want, _) in zip(world.comms, cases, strict=True)]

        async def rank(comm: ac.Communicator, which: range) -> None:
            send, _, _, root = cases[comm.rank]
            for i in which:
                await _call(comm, name, send, outs[comm.rank][i], root)

        async with asyncio.timeout(LIMIT):
            await asyncio.gather(*(rank(c, range(2)) for c in world.comms))  # warm-up
            before = _faults()
            await asyncio.gather(*(rank(c, range(2, CALLS + 2)) for c in world.comms))
            after = _faults()
        for comm, (_, _, want, _) in zip(world.comms, cases, strict=True):
            for out in outs[comm.rank]:
                assert out is None or np.array_equal(out, want), (name, comm.rank)
        return (after - before) / CALLS

    return run_world(env, 2, body)


def main() -> None:
    env = sys.argv[1]
    sys.stdout.write(json.dumps({name: faults_per_call(env, name) for name in COLLECTIVES}) + "\n")


if __name__ == "__main__":
    main()
