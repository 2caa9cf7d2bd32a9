"""The optional C accelerator of the per-message fast lane: one extension,
``asynccomm._native._lane``, built from asynccomm/_native/_lane*.c.

Everything else is in pyproject.toml.  The extension is optional: where it cannot be
built (no C compiler), the install goes on and asynccomm uses its pure-Python fast lane,
which behaves the same.

``ASYNCCOMM_REQUIRE_NATIVE=1`` (CI sets it) makes it required instead, built with
warnings as errors: a C file that does not compile, or compiles with a warning, fails the
install (and ``import asynccomm`` refuses to run without it, see ``_engine/lane.py``).
"""

import os
import sys

import numpy
from setuptools import Extension, setup

REQUIRE = os.environ.get("ASYNCCOMM_REQUIRE_NATIVE", "") not in ("", "0")
#: Every warning but the C API's own idioms (unused ``self``, ``PyModuleDef`` initializers,
#: ``PyCFunction`` casts) is an error where the extension is required.
STRICT = ["-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
          "-Wno-missing-field-initializers", "-Wno-cast-function-type"]

SOURCES = ["_lane.c", "_lane_buffers.c", "_lane_config.c", "_lane_flight.c", "_lane_mpi.c",
           "_lane_node.c", "_lane_objects.c", "_lane_pending.c", "_lane_recv.c",
           "_lane_shm.c", "_lane_shmpath.c", "_lane_steps.c"]

setup(ext_modules=[Extension("asynccomm._native._lane",
                             [f"asynccomm/_native/{f}" for f in SOURCES],
                             depends=["asynccomm/_native/_lane.h",
                                      "asynccomm/_native/_judge.h"],
                             include_dirs=[numpy.get_include()],
                             extra_compile_args=STRICT if REQUIRE else [],
                             libraries=["dl"] if sys.platform.startswith("linux") else [],
                             optional=not REQUIRE)])
