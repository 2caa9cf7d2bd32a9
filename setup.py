"""The optional C accelerators of the per-message fast lane (asynccomm/_speedups.c, and
asynccomm/_lane.c: the in-process lane's whole per-message path).

Everything else is in pyproject.toml.  The extensions are optional: where they cannot
be built (no C compiler), the install goes on and asynccomm uses its pure-Python fast lane,
which behaves the same.
"""

import numpy
from setuptools import Extension, setup

SOURCES = {
    "_speedups": ["_speedups.c"],
    "_lane": ["_lane.c", "_lane_config.c", "_lane_flight.c", "_lane_mpi.c",
              "_lane_objects.c", "_lane_recv.c", "_lane_steps.c"],
}

setup(ext_modules=[Extension(f"asynccomm.{name}", [f"asynccomm/{f}" for f in files],
                             depends=["asynccomm/_lane.h", "asynccomm/_judge.h"],
                             include_dirs=[numpy.get_include()],
                             optional=True)
                   for name, files in SOURCES.items()])
