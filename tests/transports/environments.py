"""The in-process environments every transport-level test runs in: the in-process transport
on both real loops, on the virtual clock, traced (every op into a trace file, which has a
fast lane of its own), and the cluster model (on the virtual clock) with two presets.
``ac.run(program, world_size=n, **ENVIRONMENTS[name])``.  The property suites run two more
(``PROPERTY_ENVIRONMENTS``): a cluster whose links are first-come first-served, and a
calibrated machine of one core whose ranks' work and messages take turns on it."""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import uvloop

import asynccomm as ac
from asynccomm.sim.calibration import Segment, calibrated_cluster
from asynccomm.sim.host import HostSpec
from asynccomm.sim.loop import new_virtual_loop

T = TypeVar("T")

#: Where the traced environment writes its trace files (each run overwrites the last).  It
#: is made by the first traced run (the trace writer makes its folder), not on import:
#: processes that import this module and end with ``os._exit`` (multiprocessing's spawned
#: ranks) run no ``atexit`` hook, and left a folder each behind.
_TRACES = Path(tempfile.gettempdir()) / f"asynccomm-test-traces-{os.getpid()}"
atexit.register(shutil.rmtree, _TRACES, True)

ENVIRONMENTS: dict[str, dict[str, Any]] = {
    "uvloop": {"loop": "uvloop"},
    "asyncio": {"loop": "asyncio"},
    "virtual": {"clock": "virtual"},
    "traced": {"loop": "uvloop", "trace": str(_TRACES / "run.json")},
    "roce100g": {"cluster": ac.Cluster.preset("roce100g")},
    "ascend910b": {"cluster": ac.Cluster.preset("ascend910b")},
}


def fifo(preset: str) -> ac.Cluster:
    """The cluster ``preset`` with every link first-come first-served
    (``LinkSpec(sharing="fifo")``: one transfer at a time, in the order planned)."""
    cluster = ac.Cluster.preset(preset)
    for field in ("intra", "inter", "cross_group"):
        link = getattr(cluster, field)
        if link is not None:
            setattr(cluster, field, dataclasses.replace(link, sharing="fifo"))
    return cluster


def crowded() -> ac.Cluster:
    """A calibrated machine of one core (as ``python -m asynccomm.calibrate`` makes of
    processes): every rank's collective work (the call, each step's after its wait, the
    switches) queues on the core, and each message holds it while it is copied in
    (``sim/host.py`` Rules 2 and 2d, ``sim/model.py`` Rules 4b-4d)."""
    segments = [Segment(64 << 10, 10e-6, 1 / 5e9), Segment(1 << 30, 40e-6, 1 / 8e9)]
    slower = [Segment(64 << 10, 12e-6, 1 / 3e9), Segment(1 << 30, 50e-6, 1 / 5e9)]
    host = HostSpec(cores=1, call=20e-6, step=10e-6, switch=5e-6,
                    rendezvous_switch=8e-6, copy_bandwidth=10e9, reduce_bandwidth=5e9)
    return calibrated_cluster(segments, name="crowded", ranks=4, host=host, crowded=slower)


#: ``ENVIRONMENTS``, the FIFO links' cluster and a calibrated one-core machine, for the
#: randomized property suites (the presets share their links fairly and cost no CPU, so
#: only these reach the FIFO discipline's code and the ranks' work on their cores).
PROPERTY_ENVIRONMENTS: dict[str, dict[str, Any]] = {
    **ENVIRONMENTS, "roce100g-fifo": {"cluster": fifo("roce100g")},
    "crowded": {"cluster": crowded()}}


def run_world(env: str, size: int, body: Callable[[ac.World], Awaitable[T]],
              **options: Any) -> T:
    """Run ``body(world)`` on a world of ``size`` ranks opened in environment ``env`` (for
    tests that drive several ranks from one task)."""
    settings = dict(PROPERTY_ENVIRONMENTS[env])
    loop = settings.pop("loop", None)
    cluster = settings.get("cluster")
    clock = settings.get("clock", "auto")
    virtual = clock == "virtual" or cluster is not None

    async def main() -> T:
        async with ac.open_world(size, cluster, clock, trace=settings.get("trace"),
                                 **options) as world:
            return await body(world)

    factory = (new_virtual_loop if virtual else
               uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())


def mpi_env(**extra: str) -> dict[str, str]:
    """The environment for an ``mpiexec`` a test starts: not a launcher's (if pytest runs
    under one), without ``ASYNCCOMM_TIMEOUT``, with ``extra`` set."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIR_CVAR_"))}
    env.pop("ASYNCCOMM_TIMEOUT", None)
    env.update(extra)
    return env
