"""The fast lane's per-message primitives, from the optional C accelerator.

Most of a small message's cost in the fast lane went to numpy's Python-level attributes:
judging a buffer (``type``, ``dtype``, ``flags``, ``ndim``, ``nbytes``, ``size``: about
0.5 us a side here) and copying 8 bytes with a slice assignment (about 0.5 us).
``asynccomm._native._lane``, the one C extension (``_native/_lane*.c``), built where a C
compiler is available, does each in well under 0.1 us.  Where it is not built (or
``ASYNCCOMM_PURE_PYTHON=1``), the pure-Python versions here are used, and behave the same:

- ``inspect(buf, writable)``: ``(name, nbytes, count)`` when ``buf`` is an exact, 1-D,
  C-contiguous (and, if asked, writeable) ndarray of a dtype whose name is already known
  (``_buffers._NAMES``); None when it must go the general way.
- ``copy``: ``copy(dst, src, nbytes)`` copies the first ``nbytes`` bytes between two
  buffers (ndarrays or byte buffers); None where there is no accelerator, and the callers
  then use the numpy or memoryview assignment that suits each site.

The same extension takes the fast lane's commonest op: a send or recv (awaited, or
``isend``/``irecv``) of a small 1-D array with an exact peer and tag, on the default
stream; whole in an in-process world, traced or not; whole on MPI too (untraced), where
the MPI link's own steps for it are there as well (``Path``: framing and sending an eager
message, and landing one into the recv posted for it).  ``LANE`` is that module,
configured by ``_comm.native``; None where it is not built, or with
``ASYNCCOMM_PURE_PYTHON=1``.  It returns "not handled" for everything else, and the
Python steps run.  It also gives the flight recorder its ring and tallies
(``_engine.flight``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

import numpy as np

from .._buffers import _NAMES

__all__ = ["ACCELERATED", "FAST_LANE", "LANE", "copy", "inspect"]


def _inspect(buf: Any, writable: bool) -> tuple[str, int, int] | None:
    if type(buf) is not np.ndarray or buf.ndim != 1:
        return None
    name = _NAMES.get(buf.dtype)
    if name is None:
        return None
    flags = buf.flags
    if not flags.c_contiguous or (writable and not flags.writeable):
        return None
    return name, buf.nbytes, buf.size


inspect: Callable[[Any, bool], tuple[str, int, int] | None] = _inspect
copy: Callable[[Any, Any, int], None] | None = None
LANE: ModuleType | None = None

if os.environ.get("ASYNCCOMM_PURE_PYTHON", "") in ("", "0"):
    try:
        from .._native import _lane
    except ImportError:  # not built: the pure-Python fast lane
        pass
    else:
        _lane.set_dtype_names(_NAMES)
        inspect = _lane.inspect
        copy = _lane.copy
        LANE = _lane

if (LANE is None and os.environ.get("ASYNCCOMM_REQUIRE_NATIVE", "") not in ("", "0")
        and os.environ.get("ASYNCCOMM_PURE_PYTHON", "") in ("", "0")):
    raise ImportError("ASYNCCOMM_REQUIRE_NATIVE is set but asynccomm's C extension "
                      "(_native._lane) is not built: install with a C compiler "
                      "(pip install -e .) and read the build's errors")

#: True when the C accelerator is in use.
ACCELERATED: Final = copy is not None
#: Which fast lane runs, as the ``comm.opened`` log event says it.
FAST_LANE: Final = "C" if ACCELERATED else "python"
