"""The optional C accelerator of the per-message fast lane (asynccomm/_speedups.c).

Everything else is in pyproject.toml.  The extension is optional: where it cannot be
built (no C compiler), the install goes on and asynccomm uses its pure-Python fast lane,
which behaves the same.
"""

import numpy
from setuptools import Extension, setup

setup(ext_modules=[Extension("asynccomm._speedups", ["asynccomm/_speedups.c"],
                             include_dirs=[numpy.get_include()], optional=True)])
