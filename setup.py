"""The optional C accelerators of the per-message fast lane (asynccomm/_speedups.c, and
asynccomm/_lane.c: the in-process lane's whole per-message path).

Everything else is in pyproject.toml.  The extensions are optional: where they cannot
be built (no C compiler), the install goes on and asynccomm uses its pure-Python fast lane,
which behaves the same.
"""

import numpy
from setuptools import Extension, setup

setup(ext_modules=[Extension(f"asynccomm.{name}", [f"asynccomm/{name}.c"],
                             include_dirs=[numpy.get_include()], optional=True)
                   for name in ("_speedups", "_lane")])
