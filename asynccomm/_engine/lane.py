"""The fast lane a world runs: the C lane where it is built, or the Python steps; chosen
per world (``open_world(..., native=)``), carried by its engines and communicators.

Most of a small message's cost in the fast lane went to numpy's Python-level attributes:
judging a buffer (``type``, ``dtype``, ``flags``, ``ndim``, ``nbytes``, ``size``: about
0.5 us a side here) and copying 8 bytes with a slice assignment (about 0.5 us).
``asynccomm._native._lane``, the one C extension (``_native/_lane*.c``), built where a C
compiler is available, does each in well under 0.1 us.  In a Python world (or where it
is not built, or with ``ASYNCCOMM_PURE_PYTHON=1``) the pure-Python versions here are used,
and behave the same:

- ``inspect(buf, writable)``: ``(name, nbytes, count)`` when ``buf`` is an exact, 1-D,
  C-contiguous (and, if asked, writeable) ndarray of a dtype whose name is already known
  (``_buffers._NAMES``); None when it must go the general way.
- ``copy``: ``copy(dst, src, nbytes)`` copies the first ``nbytes`` bytes between two
  buffers (ndarrays or byte buffers); None where there is no accelerator, and the callers
  then use the numpy or memoryview assignment that suits each site.
- ``address(buf)``: the address of a contiguous buffer's first byte, for the check that
  pending recvs never share memory (``_buffers.PendingBuffers``); ``ctypes`` without it.
- ``PendingBuffers``: that check's index itself, in C (``_lane_pending.c``: the same
  interface and answers as the Python class, without its Python calls per recv where
  many recvs are pending in one array).

The same extension takes the fast lane's commonest op: a send or recv (awaited, or
``isend``/``irecv``) of a small 1-D array with an exact peer and tag, on the default
stream; whole in an in-process world, traced or not (there, any message copied inline:
under ``fast.THREAD_COPY_MIN``, a copy of ``fast.TIMED_COPY_MIN`` or more timed as the
Python steps time it; untraced, a rendezvous send no recv is posted for is posted and
announced at its receiver, and the recv that takes it completes it); whole on MPI too
(untraced), where
the MPI link's own steps for it are there as well (``Path``: framing and sending an eager
message, and landing one into the recv posted for it).  ``LANE`` is that module,
configured by ``_comm.native``; None where it is not built, or with
``ASYNCCOMM_PURE_PYTHON=1``.  It returns "not handled" for everything else, and the
Python steps run.  It also gives the flight recorder its ring and tallies
(``_engine.flight``).

A ``Lane`` is one world's choice of all of these (``choose``): ``PYTHON``, or the C lane.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

import numpy as np

from .._buffers import _NAMES, PendingBuffers, PendingIndex
from .._buffers import address as _address
from .request import Wakes

__all__ = ["ACCELERATED", "FAST_LANE", "LANE", "PYTHON", "Lane", "address", "choose", "copy",
           "inspect"]


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
address: Callable[[Any], int] = _address
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
        address = _lane.address
        LANE = _lane

if (LANE is None and os.environ.get("ASYNCCOMM_REQUIRE_NATIVE", "") not in ("", "0")
        and os.environ.get("ASYNCCOMM_PURE_PYTHON", "") in ("", "0")):
    raise ImportError("ASYNCCOMM_REQUIRE_NATIVE is set but asynccomm's C extension "
                      "(_native._lane) is not built: install with a C compiler "
                      "(pip install -e .) and read the build's errors")

#: True when the C accelerator is in use (by the worlds that do not say otherwise).
ACCELERATED: Final = copy is not None
#: Which fast lane runs by default, as the ``comm.opened`` log event says it.
FAST_LANE: Final = "C" if ACCELERATED else "python"


class Lane:
    """One world's fast lane: the C lane's entry points, primitives, flight ring and
    tallies, or the Python steps' (see module docs)."""

    __slots__ = ("address", "copy", "inspect", "module", "name", "pending", "recv", "send",
                 "woken")

    def __init__(self, module: Any, send: Any, recv: Any) -> None:
        native = module is not None
        #: The C lane (``_native._lane``: its ``Ring``, ``Tally``, ``Path``), or None.
        self.module = module
        #: Its ``send`` and ``recv`` entries, configured (``_comm.communicator``), or None.
        self.send = send
        self.recv = recv
        self.inspect: Callable[[Any, bool], tuple[str, int, int] | None] = (
            inspect if native else _inspect)
        self.copy: Callable[[Any, Any, int], None] | None = copy if native else None
        self.address: Callable[[Any], int] = address if native else _address
        #: The index of pending recv buffers, made as ``pending(address)``: the C lane's
        #: ``PendingBuffers`` (``_lane_pending.c``) or its Python twin (``_buffers``).
        self.pending: Callable[[Callable[[Any], int]], PendingIndex] = (
            module.PendingBuffers if native else PendingBuffers)
        #: How many waiting tasks the engine's steps have woken so far (a request's waiter
        #: future set): the C lane's count and the Python steps' (which run beside it).
        self.woken: Callable[[], int] = _woken_both if native else _woken_python
        #: As the ``comm.opened`` log event says it.
        self.name = "C" if native else "python"

    def __repr__(self) -> str:
        return f"<Lane {self.name}>"


def _woken_python() -> int:
    return Wakes.n


def _woken_both() -> int:
    n: int = LANE.woken()  # type: ignore[union-attr]  # (only where it is built)
    return n + Wakes.n


#: The Python steps' lane (``steps``, ``take``, ``traced``; deques and Python tallies).
PYTHON: Final = Lane(None, None, None)


def choose(native: object, send: Any, recv: Any) -> Lane:
    """The lane of a world opened with ``native=``: True the C lane, False the Python
    steps, None the C lane where it is built (``send``, ``recv``: its entries, configured;
    None where it is not built, does not fit, or ``ASYNCCOMM_PURE_PYTHON=1``).

    Raises:
        TypeError: ``native`` is not a bool or None.
        ValueError: ``native=True`` where the C lane is not built (or is switched off).
    """
    if native is not None and type(native) is not bool:
        raise TypeError(f"native must be True, False or None, got {type(native).__name__}")
    if native is False or (native is None and send is None):
        return PYTHON
    if send is None:
        why = ("ASYNCCOMM_PURE_PYTHON is set"
               if os.environ.get("ASYNCCOMM_PURE_PYTHON", "") not in ("", "0")
               else "it is not built here, or does not fit this version")
        raise ValueError(f"native=True asks for asynccomm's C lane, but {why}: install "
                         "with a C compiler (pip install -e .), or pass native=None (the "
                         "C lane where it is built) or native=False (the Python steps)")
    return Lane(LANE, send, recv)
