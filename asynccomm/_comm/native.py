"""The one place that configures the native lane: what the C lane (``asynccomm._native._lane``)
takes, declared once, as data; the checks of every assumption it makes; and ``configure``.

The lane imports nothing of asynccomm.  It reads and writes ``__slots__`` at their offsets,
calls methods by name, compares with constants and frames the MPI wire's header, all of it
told here, by position: each part below is in the order of the matching table in
``_native/_lane_config.c`` (and ``SLOTS`` in the order of each struct's members in
``_native/_lane.h``).  ``tests/api/test_native_contract.py`` parses the C and checks that
both say the same; ``check`` checks the Python classes against this declaration before the
lane is configured, and refuses (``LaneMismatch``) where one does not fit.

To add a field the lane reads: add it to the class's ``__slots__``, to ``SLOTS`` here and
to the struct in ``_lane.h`` (same place), and run that test (``_native/README.md``).
"""

from __future__ import annotations

import heapq
import os
import re
import struct
import time
import types
import warnings
from asyncio import Future
from asyncio.events import _get_running_loop
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple

from .._buffers import StagingPool
from .._core import wire
from .._core.descriptors import AT_SENDER, STAGED, Message
from .._core.matching import Matcher
from .._core.states import DONE, POSTED, QUEUED, Kind
from .._core.wire import MESSAGE_OVERHEAD, MIN_BUCKET, Wire
from .._deadlines import Deadlines
from .._engine.engine import DeviceEngine
from .._engine.fast import THREAD_COPY_MIN, TIMED_COPY_MIN
from .._engine.flight import FlightRecorder, Tally
from .._engine.lane import LANE
from .._engine.request import Request
from .._engine.stream import Stream
from .._engine.tracing import RankTrace
from .._types import TAG_UB, Status
from ..transports._doorbell import Bell
from ..transports._mpi_progress import Progress, Slot
from ..transports._mpi_transport import MPITransport
from ..transports._shm_ring import Ring
from ..transports.base import Link
from ..transports.shm import Channels, Node, ShmTransport, _Pull

__all__ = ["CLASSES", "ENTRIES", "HEADER_FIELDS", "NAMES", "NUMBERS", "OBJECTS", "SLOTS",
           "STATUS_FIELDS", "LaneMismatch", "check", "configure", "configure_lane", "numbers",
           "spec"]


class LaneMismatch(TypeError):
    """The Python classes (or the wire) do not fit what the C lane assumes."""


# -- the declaration --------------------------------------------------------------------

#: The classes the lane knows, by name (C: ``<name>Type``, ``class_vars``).  The
#: communicator is given by ``configure`` (it imports this module).
CLASSES: Final = ("Request", "Message", "Status", "Stream", "FlightRecorder", "Tally",
                  "Matcher", "StagingPool", "Communicator", "DeviceEngine", "RankTrace",
                  "Deadlines")

#: Per class, the slots the lane reads and writes, in the order of its struct in
#: ``_lane.h`` (a member is the slot's name without its leading ``_``; C: ``layouts``).
#: The Message slots are read on Requests too (a Request is a Message).
SLOTS: Final[Mapping[str, tuple[str, ...]]] = {
    "Message": ("source", "tag", "nbytes", "count", "dtype", "seq", "where", "view", "ident",
                "shape", "flow"),
    "RankTrace": ("ops", "sent", "label", "size"),
    "Request": ("array", "_owner", "kind", "peer", "stream", "timeout", "_record", "t_post",
                "t_match", "_state", "_result", "_exc", "_waiters", "_timer", "_tracked",
                "t_fin", "sseq"),
    "Stream": ("_queue", "_events", "_pending", "_seq", "sid", "_owner", "_queued", "in_order"),
    "FlightRecorder": ("ring", "sends", "recvs"),
    "Tally": ("n", "nbytes", "w", "c"),
    "Matcher": ("_all", "_by_source", "_by_tag", "events", "_matched", "_n_posted", "_n_unexp",
                "_n_wild_posted", "_posted", "_probes", "_seq", "_unexp", "_unexp_bytes",
                "_waited"),
    "StagingPool": ("_acquired", "_cached", "capacity_bytes", "_free", "_in_use", "_peak",
                    "_reused"),
    "Communicator": ("_default_timeout", "_engine", "_loop", "rank", "size"),
    "DeviceEngine": ("closed", "default_stream", "eager_limit", "loop", "fast", "flight",
                     "gone", "_idle", "instant", "link", "matcher", "_n_pending", "now",
                     "peers", "_pending_recvs", "pool", "rank", "_recv_buffers", "traced",
                     "tracer", "deadlines"),
    "Deadlines": ("_time", "_seq", "_heap", "_handle", "_at", "_limit"),
}

#: The lane's entry points and their arguments, in order (C: ``send`` and ``recv`` in
#: ``_lane.c``, their usage strings and ``ENTRY_ARGS``; ``_lane.pyi``): what
#: ``Communicator`` passes them.  ``stream`` and ``timeout`` are the op's own, None where
#: absent (the default stream; the communicator's default timeout).
ENTRIES: Final[Mapping[str, tuple[str, ...]]] = {
    "send": ("comm", "buf", "dst", "tag", "handle", "stream", "timeout"),
    "recv": ("comm", "buf", "src", "tag", "handle", "stream", "timeout"),
}

#: The fields of the ``Status`` tuple the lane builds (C: ``STATUS_FIELDS``, its length).
STATUS_FIELDS: Final = ("source", "tag", "nbytes", "count", "shape")


class Name(NamedTuple):
    """A method or attribute the lane calls or reads by name, and whose it is: a class of
    ours (checked: a method must be callable on it, an attribute a slot, property or field
    of its ``__init__``), or None for another library's (mpi4py's)."""

    name: str
    owner: type | None
    method: bool


def _m(name: str, owner: type | None) -> Name:
    return Name(name, owner, True)


def _a(name: str, owner: type | None) -> Name:
    return Name(name, owner, False)


#: What the lane calls or reads by name (C: ``a_<key>``, ``name_vars``).
NAMES: Final[Mapping[str, Name]] = {
    # the in-process lane
    "untrack": _m("_untrack", DeviceEngine),
    "drain": _m("_drain", DeviceEngine),
    "index_add": _m("_index_add", Matcher),
    "fire_probes": _m("_fire_probes", Matcher),
    "unindex": _m("_unindex", Matcher),
    "first_wait": _m("_first_wait", Matcher),
    "unreachable": _m("_unreachable", DeviceEngine),
    "withdraw": _m("withdraw", DeviceEngine),
    "broken": _m("broken", DeviceEngine),
    "arm_at": _m("_arm_at", Deadlines),
    "compact": _m("_compact", Deadlines),
    "add_buffer": _m("_add_buffer", DeviceEngine),
    "check_recv_buffer": _m("check_recv_buffer", DeviceEngine),
    "append": _m("append", deque),
    "popleft": _m("popleft", deque),
    "done": _m("done", Future),
    "set_result": _m("set_result", Future),
    "send_now": _m("send_now", MPITransport),
    "received": _m("received", Link),
    # the MPI link's steps (``Path``)
    "Isend": _m("Isend", None),
    "comm": _a("comm", Progress),
    "Test": _m("Test", None),
    "Start": _m("Start", None),
    "rotate": _m("rotate", deque),
    "req": _a("req", Slot),
    "buf": _a("buf", Slot),
    "payload": _a("payload", Slot),
    "link_broken": _a("_broken", MPITransport),
    "ctrl": _a("_ctrl", Progress),
    "reap": _m("_reap", Progress),
    "bells": _a("bells", Progress),
    "flag": _a("flag", Bell),
    "ring": _m("ring", Bell),
    "sent": _a("sent", Progress),
    "parked": _a("_parked", Progress),
    "woke": _a("_woke", Progress),
    "stopped": _a("stopped", Progress),
    "failed": _a("_failed", Progress),
    "endpoint": _a("endpoint", MPITransport),
    "closed": _a("closed", DeviceEngine),
    "arrived": _m("arrived", DeviceEngine),
    "consumed": _m("consumed", Wire),
    "send_ctl": _m("_send", MPITransport),
    "slots": _a("_slots", Progress),
    "credit": _a("credit", Wire),
    "owed": _a("_owed", Wire),
    "closed_by": _a("closed_by", Wire),
    "on_control": _m("_on_control", MPITransport),
    "rank": _a("rank", MPITransport),
    "inline_max": _a("inline_max", Wire),
    "return_at": _a("_return_at", Wire),
    # the MPI link's rendezvous steps (``Path``)
    "Irecv": _m("Irecv", None),
    "announced": _a("announced", Wire),
    "unmatched": _a("unmatched", Wire),
    "close_sent": _a("close_sent", Wire),
    "next_data_tag": _m("next_data_tag", Wire),
    "sends": _a("_sends", MPITransport),
    "announced_msgs": _a("_announced", MPITransport),
    "fetch": _m("fetch", MPITransport),
    "fetch_failed": _m("_fetch_failed", MPITransport),
    "engine_sent": _m("sent", DeviceEngine),
    "reqs": _a("_reqs", Progress),
    "cbs": _a("_cbs", Progress),
    "data": _a("_data", Progress),
    "testsome": _a("_testsome", Progress),
    # the MPI link's direct calls (``Path.direct``)
    "addr": _a("addr", Slot),
    "held": _a("_held", Progress),
    # the MPI link's rendezvous send (``Path.send``)
    "next_ident": _a("_next_ident", Wire),
    "send_failed": _m("_send_failed", MPITransport),
    "link_send": _m("send", MPITransport),
    # the shared-memory link's steps (``ShmPath``)
    "ring_pos": _a("_pos", Ring),
    "ring_seen": _a("_seen", Ring),
    "wake": _m("wake", Node),
    "kick": _m("kick", Node),
    "handle": _m("_handle", Channels),
    "poll_rest": _m("_poll_rest", Channels),
    "local": _a("_local", Channels),
    "blocked": _a("_blocked", Channels),
    "reading": _a("_reading", Channels),
    # the shared-memory node's turn (``ShmNode``)
    "closing": _a("closing", Channels),
    "check_finished": _m("check_finished", ShmTransport),
    "send_waiting": _m("_send_waiting", Channels),
    "kicked": _a("_kicked", Node),
    "waiter": _a("_waiter", Node),
    # the shared-memory link's fragments landing (``ShmPath.poll``)
    "pull_view": _a("view", _Pull),
    "pull_off": _a("off", _Pull),
    "pull_done": _a("done", _Pull),
    "copying": _a("copying", Channels),
    # the shared-memory link's offers landing (``ShmPath.poll``)
    "single_copy": _a("single_copy", Node),
    "pids": _a("pids", Node),
    # the in-process lane's posting of a send to another process (``post_remote``)
    "cast": _m("cast", None),
}

#: The MPI wire's header, field by field, as the lane frames and reads it: each field's
#: ``struct`` code, in order (padding aside).  ``wire.HEADER``'s format must have these.
HEADER_FIELDS: Final = (("kind", "B"), ("dlen", "B"), ("src", "i"), ("tag", "i"),
                        ("nbytes", "q"), ("count", "q"), ("ident", "q"), ("dtype", "48s"))

_CODE = re.compile(r"(\d*)([xcbB?hHiIlLqQnNefdspP])")


def header_offsets(fmt: str) -> dict[str, int]:
    """Where each of ``HEADER_FIELDS`` is in a header of format ``fmt`` (a little-endian
    ``struct`` format with no alignment), and its size as ``"size"``.

    Raises:
        LaneMismatch: the format's fields are not ``HEADER_FIELDS``.
    """
    if not fmt.startswith("<"):
        raise LaneMismatch(f"the wire header {fmt!r} is not little-endian and unaligned")
    fields: list[str] = []
    offsets: dict[str, int] = {}
    at = 0
    for count, code in _CODE.findall(fmt[1:]):
        token = f"{count}{code}"
        if code != "x":
            if len(fields) < len(HEADER_FIELDS):
                offsets[HEADER_FIELDS[len(fields)][0]] = at
            fields.append(token if code == "s" else code * int(count or 1))
        at += struct.calcsize("<" + token)
    if tuple(fields) != tuple(code for _, code in HEADER_FIELDS):
        raise LaneMismatch(f"the wire header {fmt!r} has the fields {fields}; the C lane "
                           f"reads {[code for _, code in HEADER_FIELDS]}")
    offsets["size"] = at
    return offsets


#: The numbers the lane takes (C: ``number_vars``): constants, and the wire header's size
#: and field offsets; their values: ``numbers``.
NUMBERS: Final = ("TAG_UB", "MIN_BUCKET", "MESSAGE_OVERHEAD", "TIMED_COPY_MIN",
                  "THREAD_COPY_MIN", "EAGER",
                  "H_SIZE", "H_KIND", "H_DLEN", "H_SRC", "H_TAG", "H_NBYTES", "H_COUNT",
                  "H_DTYPE", "DTYPE_MAX", "RTS", "CTS", "H_IDENT")


def numbers(header: str = wire.HEADER.format) -> dict[str, int]:
    """The values of ``NUMBERS``, in order: the header's from its format ``header``.

    Raises:
        LaneMismatch: the header's fields are not ``HEADER_FIELDS``.
    """
    at = header_offsets(header)
    values = {"TAG_UB": TAG_UB, "MIN_BUCKET": MIN_BUCKET,
              "MESSAGE_OVERHEAD": MESSAGE_OVERHEAD, "TIMED_COPY_MIN": TIMED_COPY_MIN,
              "THREAD_COPY_MIN": THREAD_COPY_MIN,
              "EAGER": wire.EAGER, "RTS": wire.RTS, "CTS": wire.CTS, "H_SIZE": at["size"],
              "DTYPE_MAX": struct.calcsize("<" + HEADER_FIELDS[-1][1])}
    values.update((f"H_{field.upper()}", at[field]) for field, _ in HEADER_FIELDS)
    return {name: values[name] for name in NUMBERS}


#: The objects the lane compares with or calls (C: ``object_vars``).
OBJECTS: Final[Mapping[str, object]] = {
    "get_running_loop": _get_running_loop, "perf_counter": time.perf_counter,
    "deque_type": deque, "heappush": heapq.heappush,
    "K_SEND": Kind.SEND, "K_RECV": Kind.RECV, "S_QUEUED": QUEUED, "S_POSTED": POSTED,
    "S_DONE": DONE, "W_AT_SENDER": AT_SENDER, "W_STAGED": STAGED,
}


# -- the checks -------------------------------------------------------------------------


def _is_field(cls: type, name: str) -> bool:
    """Whether instances of ``cls`` have ``name``: a class attribute (a slot, a property),
    or an attribute one of its own or its bases' methods sets (``self.name = ...``)."""
    if hasattr(cls, name):
        return True
    for klass in cls.__mro__:
        for value in vars(klass).values():
            code = getattr(value, "__code__", None)
            if code is not None and name in code.co_names:
                return True
    return False


def check(classes: Mapping[str, type], header: str = wire.HEADER.format) -> None:
    """Check every assumption the C lane makes of ``classes`` (by name, ``CLASSES``) and
    of the wire header's format.

    Raises:
        LaneMismatch: the first one that does not hold, saying which.
    """
    missing = [name for name in CLASSES if not isinstance(classes.get(name), type)]
    if missing:
        raise LaneMismatch(f"no class given for {missing}")
    if not issubclass(classes["Request"], classes["Message"]):
        raise LaneMismatch("Request must subclass Message (the lane reads a Request's "
                           "Message slots at the Message's offsets)")
    status = classes["Status"]
    if not issubclass(status, tuple) or getattr(status, "_fields", None) != STATUS_FIELDS:
        raise LaneMismatch(f"Status must be a tuple of the fields {STATUS_FIELDS}, as the "
                           f"lane builds it; it has {getattr(status, '_fields', None)}")
    for cls_name, slots in SLOTS.items():
        cls = classes[cls_name]
        for slot in slots:
            if not isinstance(getattr(cls, slot, None), types.MemberDescriptorType):
                raise LaneMismatch(f"{cls.__qualname__}.{slot} is not a slot (the lane "
                                   "reads it at its offset)")
    for key, (name, owner, method) in NAMES.items():
        if owner is None:
            continue
        owner = classes.get(owner.__name__, owner)
        ok = callable(getattr(owner, name, None)) if method else _is_field(owner, name)
        if not ok:
            kind = "method" if method else "attribute"
            raise LaneMismatch(f"{owner.__qualname__} has no {kind} {name!r} (the lane's "
                               f"a_{key})")
    header_offsets(header)


def spec(classes: Mapping[str, type]) -> dict[str, tuple[Any, ...]]:
    """What ``configure`` hands the C lane: each part a tuple, in the order of its table."""
    return {"classes": tuple(classes[name] for name in CLASSES),
            "slots": tuple(SLOTS.values()),
            "objects": tuple(OBJECTS.values()),
            "numbers": tuple(numbers().values()),
            "names": tuple(n.name for n in NAMES.values())}


def _classes(communicator: type) -> dict[str, type]:
    return {"Request": Request, "Message": Message, "Status": Status, "Stream": Stream,
            "FlightRecorder": FlightRecorder, "Tally": Tally, "Matcher": Matcher,
            "StagingPool": StagingPool, "Communicator": communicator,
            "DeviceEngine": DeviceEngine, "RankTrace": RankTrace, "Deadlines": Deadlines}


def configure(lane: Any, communicator: type) -> None:
    """Check the classes (``check``), then tell ``lane`` what it works with.

    Raises:
        LaneMismatch: a class does not fit the declaration.
        TypeError, KeyError, AttributeError: the lane refused it (an extension built from
            other sources than this declaration).
    """
    classes = _classes(communicator)
    check(classes)
    lane.configure(spec(classes))


#: The configured lane (None until ``configure_lane`` configured one): what the MPI world
#: accelerates its link with.
CONFIGURED: Any = None

_Entry = Callable[..., Any]


def configure_lane(communicator: type) -> tuple[_Entry | None, _Entry | None]:
    """The C lane's ``send`` and ``recv`` for ``communicator``'s ops, the lane configured;
    (None, None) where it is not built, or where it does not fit these classes (it says
    so: a warning, or an ImportError under ``ASYNCCOMM_REQUIRE_NATIVE=1``; the Python
    steps run)."""
    global CONFIGURED
    CONFIGURED = None
    if LANE is None:
        return None, None
    try:
        configure(LANE, communicator)
    except (TypeError, KeyError, AttributeError) as exc:  # LaneMismatch is a TypeError
        if os.environ.get("ASYNCCOMM_REQUIRE_NATIVE", "") not in ("", "0"):
            raise ImportError(f"asynccomm's C lane does not fit this version ({exc}) and "
                              "ASYNCCOMM_REQUIRE_NATIVE is set: rebuild it") from exc
        warnings.warn(f"asynccomm's C lane does not fit this version ({exc}); rebuild it "
                      "(pip install -e .), the pure-Python steps run meanwhile",
                      RuntimeWarning, stacklevel=2)
        return None, None
    CONFIGURED = LANE
    return LANE.send, LANE.recv
