"""The optional C accelerators of the per-message fast lane (asynccomm/_native/_speedups.c,
and asynccomm/_native/_lane.c: the in-process lane's whole per-message path).

Everything else is in pyproject.toml.  The extensions are optional: where they cannot
be built (no C compiler), the install goes on and asynccomm uses its pure-Python fast lane,
which behaves the same.

``ASYNCCOMM_REQUIRE_NATIVE=1`` (CI sets it) makes them required instead, built with
warnings as errors: a C file that does not compile, or compiles with a warning, fails the
install (and ``import asynccomm`` refuses to run without them, see ``_fastlane``).
"""

import os

import numpy
from setuptools import Extension, setup

REQUIRE = os.environ.get("ASYNCCOMM_REQUIRE_NATIVE", "") not in ("", "0")
#: Every warning but the C API's own idioms (unused ``self``, ``PyModuleDef`` initializers,
#: ``PyCFunction`` casts) is an error where the extensions are required.
STRICT = ["-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
          "-Wno-missing-field-initializers", "-Wno-cast-function-type"]

SOURCES = {
    "_speedups": ["_speedups.c"],
    "_lane": ["_lane.c", "_lane_config.c", "_lane_flight.c", "_lane_mpi.c",
              "_lane_objects.c", "_lane_recv.c", "_lane_steps.c"],
    "_shm": ["_shm.c"],  # the shared-memory link's atomic words
}

setup(ext_modules=[Extension(f"asynccomm._native.{name}",
                             [f"asynccomm/_native/{f}" for f in files],
                             depends=["asynccomm/_native/_lane.h",
                                      "asynccomm/_native/_judge.h"],
                             include_dirs=[numpy.get_include()],
                             extra_compile_args=STRICT if REQUIRE else [],
                             optional=not REQUIRE)
                   for name, files in SOURCES.items()])
